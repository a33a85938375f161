"""``zapstream console``: wire the web console into the command line.

::

    zapstream console        serve the operators' console (ZAPSTREAM_CONSOLE_*)
"""

from __future__ import annotations

import argparse

__all__ = ["add_console_parser"]


def _cmd_console(args: argparse.Namespace) -> int:
    from connectors.console.app import ConsoleServer
    from connectors.console.settings import ConsoleSettings
    from streams.kernel.runtime.run import run_until_signalled

    settings = ConsoleSettings()
    return run_until_signalled(lambda: ConsoleServer(settings))


def add_console_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``console``; it sets ``func(args) -> exit code``."""
    subparsers.add_parser(
        "console", help="the operators' web console: jobs, history, cancel/reprocess, lag"
    ).set_defaults(func=_cmd_console)
