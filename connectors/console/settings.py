"""Settings of ``zapstream console`` (``ZAPSTREAM_CONSOLE_*``), read once in ``main()``.

The tokens setting maps each operator's token to a name and a role. A key is either the
token itself (at least :data:`MIN_TOKEN_CHARS` characters) or its SHA-256,
``sha256:<64 hex digits>`` (``printf %s "$TOKEN" | sha256sum``), so the console's settings
need not hold the token at all. Either way the console keeps only the digests once the
setting is read (:func:`parse_tokens`), and compares a presented token's digest with them.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import re

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import PostgresSettings, SettingsBase

__all__ = ["MIN_TOKEN_CHARS", "ConsoleSettings", "Operator", "Role", "parse_tokens", "token_digest"]

MIN_TOKEN_CHARS = 32
"""A token shorter than this is refused at start: tokens are random secrets, not passwords
(``python -c 'import secrets; print(secrets.token_urlsafe(32))'`` makes one of 43)."""

_HASHED = re.compile(r"sha256:([0-9a-f]{64})", re.IGNORECASE)


def token_digest(token: str) -> bytes:
    """The SHA-256 of a token's UTF-8 bytes: what the console keeps and compares."""
    return hashlib.sha256(token.encode()).digest()


class Role(enum.StrEnum):
    """What an operator may do: look (viewer), act on jobs (operator), also read texts (admin)."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def can_act(self) -> bool:
        return self is not Role.VIEWER

    @property
    def sees_text(self) -> bool:
        return self is Role.ADMIN


@dataclasses.dataclass(frozen=True, slots=True)
class Operator:
    """Who holds a token: the name recorded with their commands, and their role."""

    name: str
    role: Role


def _digest_of_key(key: object, where: str) -> bytes:
    """A key of the tokens setting as a digest: ``sha256:<hex>`` as given, a token hashed."""
    if not isinstance(key, str):
        raise ValueError(f"{where}: a token must be a string")
    hashed = _HASHED.fullmatch(key)
    if hashed is not None:
        return bytes.fromhex(hashed.group(1))
    if key.lower().startswith("sha256:"):
        raise ValueError(f"{where}: a hashed token is sha256: and 64 hexadecimal digits")
    if len(key) < MIN_TOKEN_CHARS or not key.isascii() or not key.isprintable():
        raise ValueError(
            f"{where}: a token must be at least {MIN_TOKEN_CHARS} printable ASCII characters "
            "(or sha256:<hex> of one)"
        )
    return token_digest(key)


def parse_tokens(raw: str) -> dict[bytes, Operator]:
    """``{"<token>": {"operator": "alice", "role": "viewer"}}`` as a digest -> operator map.

    A key is a token or ``sha256:<hex>`` of one (:func:`token_digest`). Errors never quote
    the JSON: it holds the tokens.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError('must be a JSON object {"<token>": {"operator": ..., "role": ...}}')
    tokens: dict[bytes, Operator] = {}
    for number, (key, entry) in enumerate(data.items(), start=1):
        where = f"entry {number}"
        digest = _digest_of_key(key, where)
        if digest in tokens:
            raise ValueError(f"{where}: the same token as another entry")
        if not isinstance(entry, dict):
            raise ValueError(f'{where}: must be {{"operator": ..., "role": ...}}')
        name = entry.get("operator")
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}: operator (a name) is required")
        try:
            role = Role(str(entry.get("role", "")).lower())
        except ValueError:
            roles = ", ".join(r.value for r in Role)
            raise ValueError(f"{where} ({name.strip()}): role must be one of {roles}") from None
        tokens[digest] = Operator(name=name.strip(), role=role)
    return tokens


class ConsoleSettings(SettingsBase):
    """``zapstream console``: the operators' web console (``ZAPSTREAM_CONSOLE_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_CONSOLE_", extra="ignore")

    tokens: SecretStr = SecretStr("")
    """JSON ``{"<token>": {"operator": "alice", "role": "viewer|operator|admin"}}``; required.
    A token has at least 32 characters; a key ``sha256:<64 hex digits>`` is the SHA-256 of a
    token instead, so the setting need not hold the token itself."""
    port: int = Field(default=6070, ge=0, le=65535)
    """Port of the console's web server."""
    bind_local: bool = True
    """Listen on 127.0.0.1 only; false listens on every interface (behind a TLS proxy)."""
    lag_url: str = ""
    """The lag monitor's metrics URL (``http://127.0.0.1:6068/metrics``); empty: not shown."""
    page_size: int = Field(default=50, ge=1, le=500)
    """Jobs per page of the job list."""
    bulk_limit: int = Field(default=1000, ge=1)
    """A bulk cancel or reprocess acts on at most this many jobs, oldest first."""
    session_idle_s: float = Field(default=1800.0, gt=0)
    """A login session unused for this long is over: the operator logs in again."""
    session_max_s: float = Field(default=43200.0, gt=0)
    """A login session is over this long after the login, used or not."""
    secure_cookie: bool | None = None
    """Send the session cookie as ``__Host-zapstream_session`` with ``Secure`` (browsers
    then send it over HTTPS only). Unset: yes unless ``ZAPSTREAM_CONSOLE_BIND_LOCAL`` (local
    use over plain HTTP, where browsers refuse a Secure cookie); set false for a console
    reached over plain HTTP on 127.0.0.1 otherwise (a container's published port)."""
    metrics_port: int = Field(default=0, ge=0, le=65535)
    """Prometheus metrics (failed logins) at ``http://HOST:PORT/metrics``; 0: not served."""
    metrics_bind_local: bool = True
    """Serve metrics on 127.0.0.1 only; false binds 0.0.0.0."""

    postgres: PostgresSettings = Field(default_factory=PostgresSettings)

    @field_validator("tokens")
    @classmethod
    def _valid_tokens(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("is required: no operator could log in")
        parse_tokens(value.get_secret_value())
        return value

    @field_validator("lag_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http(s) URL, e.g. http://127.0.0.1:6068/metrics")
        return value

    @property
    def cookie_secure(self) -> bool:
        """Whether the session cookie is ``__Host-`` and ``Secure`` (see ``secure_cookie``)."""
        return not self.bind_local if self.secure_cookie is None else self.secure_cookie

    def operators(self) -> dict[bytes, Operator]:
        """Token digest (:func:`token_digest`) -> operator."""
        return parse_tokens(self.tokens.get_secret_value())
