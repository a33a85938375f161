"""``make bench --profile``: py-spy's raw stacks become self time per function and package."""

from __future__ import annotations

import stat
from pathlib import Path

from devtools.bench.profile import aggregate_raw, find_py_spy, package_of

# py-spy's raw format: "root;...;leaf count", paths shortened past site-packages/stdlib.
LOOP = (
    "<module> (zapstream.py:8);run (asyncio/runners.py:190);_run_once (asyncio/base_events.py:1922)"
)
RAW = "\n".join(
    [
        f"{LOOP};handle (streams/worker.py:120);loads (orjson/__init__.py:1) 30",
        f"{LOOP};handle (streams/worker.py:121);loads (orjson/__init__.py:1) 10",
        f"{LOOP} 25",
        f"{LOOP};handle (streams/worker.py:130) 20",
        "<module> (zapstream.py:8);run (asyncio/runners.py:190);select (selectors.py:468) 10",
        "<module> (zapstream.py:8);<native> 5",
        " 7",
    ]
)


def test_self_time_goes_to_the_leaf_frame_merged_over_lines() -> None:
    profile = aggregate_raw(RAW)

    assert profile.samples == 100  # the empty stack (unreadable samples) counts nowhere
    assert profile.functions == [
        ("loads (orjson/__init__.py)", 40),
        ("_run_once (asyncio/base_events.py)", 25),
        ("handle (streams/worker.py)", 20),
        ("select (selectors.py)", 10),
        ("<native>", 5),
    ]
    assert profile.packages == [
        ("orjson", 40),
        ("asyncio", 25),
        ("streams", 20),
        ("selectors", 10),
        ("other", 5),
    ]


def test_the_text_lists_the_top_functions_and_every_package_share() -> None:
    text = aggregate_raw(RAW).render(top=2)

    lines = text.splitlines()
    assert lines[0] == "100 samples; self time, top 2 functions:"
    assert lines[1].split() == ["40.0%", "40", "loads", "(orjson/__init__.py)"]
    assert lines[2].split()[-2:] == ["_run_once", "(asyncio/base_events.py)"]
    assert lines[3] == "self time per package:"
    assert [line.split()[-1] for line in lines[4:]] == [
        "orjson",
        "asyncio",
        "streams",
        "selectors",
        "other",
    ]


def test_no_samples_says_so() -> None:
    assert aggregate_raw("").render() == "no samples (the process was idle or gone)"


def test_a_package_is_the_first_path_component() -> None:
    assert package_of("faust/agents/agent.py") == "faust"
    assert package_of("typing.py") == "typing"


def test_py_spy_is_found_by_its_path_or_not_at_all(tmp_path: Path) -> None:
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)

    assert find_py_spy(str(exe)) == str(exe)
    assert find_py_spy(str(tmp_path / "missing")) is None
