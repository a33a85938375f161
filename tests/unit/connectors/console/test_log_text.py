"""Values in the console's log lines cannot forge lines or drive a terminal."""

from __future__ import annotations

from connectors.console.log_text import loggable


def test_control_characters_become_visible_escapes() -> None:
    value = "/jobs\n2026 INFO forged\r\x1b]0;owned\x07\u2028\udcff\\x0a"
    shown = loggable(value)
    assert shown == "/jobs\\x0a2026 INFO forged\\x0d\\x1b]0;owned\\x07\\u2028\\udcff\\\\x0a"
    assert shown.isprintable()


def test_a_long_value_is_cut() -> None:
    assert loggable("a" * 1000, limit=10) == "aaaaaaa..."
    assert loggable("plain /jobs/1") == "plain /jobs/1"
