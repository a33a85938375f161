"""``zapstream console``: wire the web console into the command line.

::

    zapstream console        serve the operators' console (ZAPSTREAM_CONSOLE_*)
"""

from __future__ import annotations

import argparse
import asyncio
import sys

__all__ = ["add_console_parser"]


def _cmd_console(args: argparse.Namespace) -> int:
    from connectors.console.app import serve
    from connectors.console.settings import ConsoleSettings

    settings = ConsoleSettings()
    try:
        asyncio.run(serve(settings))
    except OSError as exc:
        print(
            f"zapstream: console cannot listen on port {settings.port} ({exc.strerror}): "
            "set ZAPSTREAM_CONSOLE_PORT to a free port",
            file=sys.stderr,
        )
        return 2
    return 0


def add_console_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``console``; it sets ``func(args) -> exit code``."""
    subparsers.add_parser(
        "console", help="the operators' web console: jobs, history, cancel/reprocess, lag"
    ).set_defaults(func=_cmd_console)
