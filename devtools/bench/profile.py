"""``make bench --profile``: where a busy worker's time goes, sampled by py-spy.

A MISS says a figure is off; the profile says which code to read first. py-spy is
not a project dependency (it attaches to a running process from outside, with
ptrace): :func:`find_py_spy` looks for it on PATH or takes ``--py-spy PATH``, and a
run without it says so in one line and goes on.

The recording is py-spy's raw format, the collapsed stacks flame graphs are made
from: one line per distinct stack, ``root;...;leaf count``, each frame
``function (path/file.py:line)`` with the path already shortened to what follows
``site-packages/`` or the standard library's directory. :func:`aggregate_raw`
counts self time (the leaf frame) per function and per top-level package; it is
done here rather than with py-spy's ``top`` so the text can go into the results JSON.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TextIO

PROFILE_S = 15
"""How long one recording samples: longer than the worker sections' busy spans."""
RATE_HZ = 200
TOP = 15

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]+):\d+\)$")


@dataclasses.dataclass(frozen=True, slots=True)
class Profile:
    """Self-time samples of one recording: per function and per package."""

    samples: int
    functions: list[tuple[str, int]]
    """(``function (file)``, samples), most first."""
    packages: list[tuple[str, int]]
    """(top-level package or module, samples), most first."""

    def render(self, top: int = TOP) -> str:
        """The top ``top`` functions by self time and every package's share, as text."""
        if not self.samples:
            return "no samples (the process was idle or gone)"
        lines = [f"{self.samples:,} samples; self time, top {top} functions:"]
        lines += [f"  {n / self.samples:6.1%}  {n:>6,}  {name}" for name, n in self.functions[:top]]
        lines.append("self time per package:")
        lines += [f"  {n / self.samples:6.1%}  {n:>6,}  {name}" for name, n in self.packages]
        return "\n".join(lines)


def package_of(file: str) -> str:
    """The top-level package of a py-spy frame's file: ``faust/agents/agent.py`` is
    ``faust``, ``streams/worker.py`` ``streams``, a top-level ``typing.py`` ``typing``."""
    head = file.split("/", 1)[0]
    return head[:-3] if head.endswith(".py") else head


def aggregate_raw(text: str) -> Profile:
    """Self time per function and per package from py-spy's raw (collapsed) output.

    A line whose stack is empty (py-spy could not read the stack) counts nowhere;
    a leaf frame without a file (a native or thread frame) counts as ``other``.
    """
    functions: collections.Counter[str] = collections.Counter()
    packages: collections.Counter[str] = collections.Counter()
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack.strip() or not count.isdigit():
            continue
        leaf = stack.rsplit(";", 1)[-1]
        match = _FRAME.match(leaf)
        if match is None:
            functions[leaf] += int(count)
            packages["other"] += int(count)
            continue
        functions[f"{match['function']} ({match['file']})"] += int(count)
        packages[package_of(match["file"])] += int(count)
    return Profile(
        samples=sum(functions.values()),
        functions=functions.most_common(),
        packages=packages.most_common(),
    )


def find_py_spy(explicit: str | None = None) -> str | None:
    """``explicit`` if it is an executable, else ``py-spy`` on PATH, else None."""
    if explicit:
        return shutil.which(explicit)
    return shutil.which("py-spy")


class Profiler:
    """Records one process at a time with py-spy, in the background.

    :meth:`attach` starts ``py-spy record`` (non-blocking: the process is never paused,
    but py-spy's own sampling takes CPU beside it, so a profiled run's figures are a
    little lower); :meth:`collect` waits for it (it stops after :data:`PROFILE_S` or when
    the process exits) and returns the text. Each text is also kept in :attr:`texts`,
    under the label it was attached with, for the results JSON.
    """

    def __init__(self, py_spy: str, *, out: TextIO, seconds: int = PROFILE_S) -> None:
        self.py_spy = py_spy
        self.out = out
        self.seconds = seconds
        self.texts: dict[str, str] = {}
        self._dir = Path(tempfile.mkdtemp(prefix="zapstream-profile-"))
        self._running: tuple[str, subprocess.Popen[bytes], Path] | None = None

    def attach(self, label: str, pid: int) -> None:
        """Start recording ``pid``; one recording at a time (a second attach is ignored)."""
        if self._running is not None:
            return
        path = self._dir / f"{len(self.texts)}.raw"
        command = [
            self.py_spy,
            "record",
            "--format",
            "raw",
            "--nonblocking",
            "-r",
            str(RATE_HZ),
            "-d",
            str(self.seconds),
            "-p",
            str(pid),
            "-o",
            str(path),
        ]
        print(f"bench: profile: py-spy on {label} (pid {pid}, {self.seconds} s)", file=self.out)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._running = (label, process, path)

    def collect(self) -> str | None:
        """The running recording's text once py-spy finished (None if none was attached)."""
        if self._running is None:
            return None
        label, process, path = self._running
        self._running = None
        _, stderr = process.communicate(timeout=self.seconds + 60)
        if process.returncode != 0 or not path.exists():
            text = (
                f"py-spy failed (exit {process.returncode}): "
                + stderr.decode(errors="replace").strip().replace("\n", " ")[-300:]
            )
        else:
            text = aggregate_raw(path.read_text()).render()
        self.texts[label] = text
        return text
