"""Every `zapstream ...` command the documentation shows exists.

A command in a code span or block of README.md or docs/ (``zapstream jobs reprocess ...``,
``zapstream instances pause shop-1 ...``) must start with a command the CLI has, and a word
after a command that has subcommands must be one of them: a renamed or removed command breaks
this test before a reader types it. (The deployment guide's own test also runs each command's
``--help``.)
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from connectors.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
# `kubectl -n zapstream ...` names a namespace, not the command.
_COMMAND = re.compile(r"(?<![\w./$-])(?<!-n )zapstream ((?:[a-z][a-z-]*)(?: [a-z][a-z-]*)?)")
_COMMENT = re.compile(r"\s#.*$", re.M)


def _tree() -> dict[tuple[str, ...], set[str]]:
    """Each command path and the subcommands under it (``()`` is the top level)."""
    tree: dict[tuple[str, ...], set[str]] = {}

    def walk(parser: argparse.ArgumentParser, prefix: tuple[str, ...]) -> None:
        tree.setdefault(prefix, set())
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    tree[prefix].add(name)
                    walk(sub, (*prefix, name))

    walk(build_parser(), ())
    return tree


TREE = _tree()
SHOWN = sorted(
    {
        (page.relative_to(ROOT).as_posix(), match.group(1))
        for page in PAGES
        for code in _CODE.findall(page.read_text())
        for match in _COMMAND.finditer(_COMMENT.sub("", code))
    }
)


def test_the_docs_show_commands() -> None:
    assert len(SHOWN) > 30, SHOWN


@pytest.mark.parametrize(("page", "words"), SHOWN, ids=[f"{p}: {w}" for p, w in SHOWN])
def test_each_shown_command_exists(page: str, words: str) -> None:
    first, _, second = words.partition(" ")
    assert first in TREE[()], f"{page}: `zapstream {first}` is not a command"
    if TREE[(first,)] and second:
        assert second in TREE[(first,)], f"{page}: `zapstream {first} {second}` is not a command"
