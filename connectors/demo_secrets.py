"""Refuse to run with the public demo secrets of ``.env.example``.

``docker compose up`` with ``cp .env.example .env`` starts zapstream with values anyone
can read in the repository: the console's admin token, the webhook's HMAC secret, the
gateway key, the database passwords. Every one of them contains :data:`DEMO_MARKER`.
A zapstream command whose environment, or secrets directory (``ZAPSTREAM_SECRETS_DIR``),
holds such a value under a secret's name refuses to start, in one line naming the
variable (never the value), exit 2, unless :data:`ALLOW_VARIABLE` is ``1``: what a local
demo sets explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from streams.kernel.failures import StartRefused

DEMO_MARKER = "change-me"
"""In every secret value of ``.env.example`` (tests/unit/deploy checks it)."""
ALLOW_VARIABLE = "ZAPSTREAM_ALLOW_DEMO_SECRETS"
SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "DATABASE_URL")
"""A variable whose name holds one of these carries a secret."""
_MAX_FILE_BYTES = 64 * 1024


def _is_secret_name(name: str) -> bool:
    upper = name.upper()
    return upper != ALLOW_VARIABLE and any(part in upper for part in SECRET_NAME_PARTS)


def demo_secret_names(environ: Mapping[str, str]) -> list[str]:
    """The secrets (variables, then files of ``ZAPSTREAM_SECRETS_DIR``) holding a demo value."""
    found = [n for n, v in environ.items() if _is_secret_name(n) and DEMO_MARKER in v]
    directory = environ.get("ZAPSTREAM_SECRETS_DIR", "")
    if directory and Path(directory).is_dir():
        for path in sorted(Path(directory).iterdir()):
            if not _is_secret_name(path.name) or not path.is_file() or path.name in found:
                continue
            try:
                with path.open("rb") as f:
                    value = f.read(_MAX_FILE_BYTES).decode("utf-8", "replace")
            except OSError:
                continue  # the settings classes report an unreadable secret themselves
            if DEMO_MARKER in value:
                found.append(path.name)
    return sorted(found)


def refuse_demo_secrets(environ: Mapping[str, str]) -> None:
    """Raise :class:`StartRefused` (exit 2) on a demo secret, unless explicitly allowed."""
    if environ.get(ALLOW_VARIABLE, "").strip().lower() in ("1", "true", "yes"):
        return
    names = demo_secret_names(environ)
    if names:
        raise StartRefused(
            f"{', '.join(names)} hold{'s' if len(names) == 1 else ''} a public demo value "
            f"from .env.example: replace {'it' if len(names) == 1 else 'them'} with your own "
            f"secret, or set {ALLOW_VARIABLE}=1 for a local demo only"
        )
