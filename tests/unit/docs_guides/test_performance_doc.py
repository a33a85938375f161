"""docs/performance.md is rendered from a ``make bench`` results file.

The results document is built here the way ``devtools.bench.runner.main`` writes it (each
:class:`Figure` as a dict with its broker and verdict), so a change of that shape breaks these
tests rather than the lead's next render.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from devtools.bench.runner import Sizes, reduced
from devtools.bench.support import Figure
from devtools.docs import performance_doc as pd

ROOT = Path(__file__).resolve().parents[3]

FULL = Sizes(
    relay_rows=200_000,
    relay_latency_s=20.0,
    rate=500.0,
    worker_messages=20_000,
    memory_jobs=100_000,
    fifty=True,
    baseline=True,
    e2e_seconds=30.0,
)


def results(started_at: str = "2026-12-04T06:01:02+00:00", **extra: Any) -> dict[str, Any]:
    """A two-broker result as ``make bench`` writes it."""
    kafka = [
        Figure(
            "relay",
            "relay rows/s, 200,000 pre-filled rows",
            "30,602",
            "pg_recvlogical 128,616",
            ">= 60,000",
            False,
        ),
        Figure("relay", "relay peak RSS", "61 MiB", "", "<= 150 MB", True),
        Figure("worker", "worker RSS after 100,000 jobs", "152 MiB", "", "<= 300 MB", True),
        Figure(
            "e2e", "commit -> gateway p50/p99", "9 ms / 40 ms", "hops a|b", "p99 <= 50 ms", True
        ),
    ]
    tansu = [
        Figure(
            "relay",
            "relay rows/s, 100,000 pre-filled rows",
            "24,000",
            "pg_recvlogical 84,899",
            ">= 60,000",
            False,
        ),
        Figure("relay", "relay peak RSS", "59 MiB", "", "<= 150 MB", True),
        Figure(
            "e2e", "commit -> gateway p50/p99", "8 ms / 60 ms", "hops a|b", "p99 <= 50 ms", False
        ),
    ]
    columns = {"kafka": kafka, "tansu": tansu}
    sizes = {"kafka": FULL, "tansu": reduced(FULL)}
    document: dict[str, Any] = {
        "started_at": started_at,
        "elapsed_s": 930.0,
        "commit": "abc1234",
        "machine": {"cpus": "x86_64", "python": "3.11.7"},
        "args": {"only": None, "results_dir": "bench/results"},
        "brokers": {
            b: {
                "label": "Apache Kafka 4.4.0" if b == "kafka" else "Tansu",
                "sizes": dataclasses.asdict(sizes[b]),
                "section_s": {"relay": 125.4, "e2e": 60.2},
            }
            for b in columns
        },
        "errors": [],
        "figures": [
            {**dataclasses.asdict(f), "broker": b, "verdict": f.verdict or None}
            for b, figures in columns.items()
            for f in figures
        ],
    }
    document.update(extra)
    return document


DOC = f"""# Performance

Intro kept by hand.

{pd.BEGIN}
old text
{pd.END}

## Earlier runs

### 2026-12-01: by hand

Kept.
"""


def rows(block: str) -> list[list[str]]:
    """The table's cells, header and separator left out."""
    lines = [line for line in block.splitlines() if line.startswith("| ")][1:]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


def test_a_run_renders_as_the_table_make_bench_prints() -> None:
    block = pd.render_block(results(), "bench/results/20261204T060102Z.json")
    assert block.startswith(pd.BEGIN) and block.endswith(pd.END)
    assert "## The last `make bench` run: 2026-12-04 06:01 UTC" in block
    assert (
        "Rendered from `bench/results/20261204T060102Z.json`: commit `abc1234`, 15.5 min" in block
    )
    table = rows(block)
    # The brokers' relay rows pair although their sizes differ; the other broker's comparison
    # says what it ran.
    assert table[0][:7] == [
        "relay",
        "relay rows/s, 200,000 pre-filled rows",
        ">= 60,000",
        "30,602",
        "MISS",
        "24,000",
        "MISS",
    ]
    assert (
        "Tansu (ran: relay rows/s, 100,000 pre-filled rows): pg_recvlogical 84,899" in table[0][7]
    )
    # A figure only the first broker measured shows "-" for the other.
    memory = next(r for r in table if r[1] == "worker RSS after 100,000 jobs")
    assert memory[3:7] == ["152 MiB", "PASS", "-", ""]
    # One comparison when both say the same; a literal "|" stays inside its cell.
    e2e = next(r for r in table if r[0] == "e2e")
    assert e2e[3:8] == ["9 ms / 40 ms", "PASS", "8 ms / 60 ms", "MISS", "hops a\\|b"]
    assert "- Tansu: relay rows 100,000, latency run 10 s" in block
    assert "(relay 125 s, e2e 60 s)" in block


def test_a_note_and_failed_sections_are_shown() -> None:
    document = results(note="Transcribed by hand.", errors=["worker on Tansu: RuntimeError('x')"])
    block = pd.render_block(document, "bench/results/x.json")
    assert "\nTranscribed by hand.\n" in block
    assert "Sections that failed in this run:\n\n- worker on Tansu: RuntimeError('x')" in block


def test_a_date_alone_is_shown_as_a_date() -> None:
    block = pd.render_block(results(started_at="2026-12-02"), "bench/history/x.json")
    assert "## The last `make bench` run: 2026-12-02\n" in block


def test_splice_replaces_the_block_and_keeps_the_rest() -> None:
    first = pd.render_block(results(), "bench/results/a.json")
    once = pd.splice(DOC, first)
    assert "old text" not in once.split("## Earlier runs")[0]
    assert once.startswith("# Performance\n\nIntro kept by hand.\n\n" + first)
    assert once.endswith("### 2026-12-01: by hand\n\nKept.\n")
    # The same run again changes nothing.
    assert pd.splice(once, first) == once


def test_a_newer_run_moves_the_last_one_to_earlier_runs() -> None:
    first = pd.render_block(results(), "bench/results/a.json")
    second = pd.render_block(
        results(started_at="2026-12-05T01:00:00+00:00"), "bench/results/b.json"
    )
    updated = pd.splice(pd.splice(DOC, first), second)
    current, earlier = updated.split("## Earlier runs\n")
    assert "Rendered from `bench/results/b.json`" in current
    assert "bench/results/a.json" not in current
    assert earlier.index("### `make bench` run: 2026-12-04 06:01 UTC") < earlier.index(
        "### 2026-12-01: by hand"
    )
    assert "Rendered from `bench/results/a.json`" in earlier
    assert pd.BEGIN not in earlier and pd.END not in earlier


def test_a_document_without_markers_is_refused() -> None:
    with pytest.raises(pd.ResultsError, match="no generated block"):
        pd.splice("# Performance\n", pd.render_block(results(), "x.json"))


def test_the_command_writes_checks_and_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tmp_path / "performance.md"
    doc.write_text(DOC)
    result = tmp_path / "20261204T060102Z.json"
    result.write_bytes(orjson.dumps(results()))
    assert pd.main([str(result), "--doc", str(doc), "--check"]) == 1
    assert "is stale" in capsys.readouterr().err
    assert pd.main([str(result), "--doc", str(doc)]) == 0
    assert "Rendered from `bench/results/20261204T060102Z.json`" in doc.read_text()
    assert pd.main([str(result), "--doc", str(doc), "--check"]) == 0
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert pd.main([str(broken), "--doc", str(doc)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_the_committed_page_is_what_its_source_renders() -> None:
    """docs/performance.md names the results file it was rendered from. A file kept in the
    repository (bench/history/) must render exactly the committed block; a local run's file
    (bench/results/, not committed) must at least be named as one."""
    page = (ROOT / "docs" / "performance.md").read_text()
    sources = re.findall(r"^Rendered from `([^`]+)`", page.split(pd.END)[0], re.M)
    assert len(sources) == 1, sources
    source = ROOT / sources[0]
    if not source.exists():
        assert re.fullmatch(r"bench/results/[\w.-]+\.json", sources[0]), sources[0]
        return
    rendered = pd.splice(page, pd.render_block(pd.load(source), sources[0]))
    assert rendered == page, f"stale: run python -m devtools.docs.performance_doc {sources[0]}"
