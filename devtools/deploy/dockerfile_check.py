"""A small reader of the ``Dockerfile``'s stages, for the checks hadolint does not make.

hadolint lints each instruction; the deployment tests also need to know, per build target,
which user it finally runs as (``USER`` is inherited through ``FROM <stage>``), what its
entrypoint is, and which ``pip install`` lines use ``constraints.txt``. Pure: text in,
stages out.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"


@dataclasses.dataclass
class Stage:
    """One ``FROM ... AS name`` stage: its base and its instructions (keyword, arguments)."""

    name: str
    base: str
    instructions: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction; continuations joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if full:
            keyword, _, args = full.partition(" ")
            found.append((keyword.upper(), " ".join(args.split())))
    return found


def stages(text: str) -> list[Stage]:
    """The stages in file order (the last one is what ``docker build`` builds by default)."""
    found: list[Stage] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(found))
            found.append(Stage(name=name, base=words[0]))
        elif found:
            found[-1].instructions.append((keyword, args))
    return found


def _by_name(all_stages: list[Stage]) -> dict[str, Stage]:
    return {stage.name: stage for stage in all_stages}


def _chain(all_stages: list[Stage], target: str) -> list[Stage]:
    """``target`` and the stages it is built FROM, nearest first."""
    named = _by_name(all_stages)
    chain = [named[target]]
    while chain[-1].base in named:
        chain.append(named[chain[-1].base])
    return chain


def effective(all_stages: list[Stage], target: str, keyword: str) -> str | None:
    """The last ``keyword`` (USER, ENTRYPOINT, ...) in force in ``target``, inherited or not."""
    for stage in _chain(all_stages, target):
        values = stage.all(keyword)
        if values:
            return values[-1]
    return None


def runs_as_root(user: str | None) -> bool:
    """No USER, or one that is root by name or by id (``0``, ``root``, ``0:0``, ``root:x``)."""
    if user is None:
        return True
    name = user.split(":", 1)[0].strip()
    return name in {"", "0", "root"}


def exec_form(args: str | None) -> list[str] | None:
    """An ``ENTRYPOINT``/``CMD`` in exec (JSON) form as a list; None for shell form."""
    if args is None:
        return None
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    return [str(v) for v in value] if isinstance(value, list) else None


def pip_installs(stage: Stage) -> list[list[str]]:
    """The words of every ``pip install`` command in a stage's ``RUN`` lines."""
    found = []
    for run in stage.all("RUN"):
        for command in run.replace("&&", ";").split(";"):
            words = shlex.split(command)
            for i, word in enumerate(words[:-1]):
                if word.endswith("pip") and words[i + 1] == "install":
                    found.append(words[i:])
                    break
    return found
