"""Settings of ``zapstream console`` (``ZAPSTREAM_CONSOLE_*``), read once in ``main()``."""

from __future__ import annotations

import dataclasses
import enum
import json

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from streams.kernel.settings import PostgresSettings, SettingsBase

__all__ = ["ConsoleSettings", "Operator", "Role", "parse_tokens"]


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


def parse_tokens(raw: str) -> dict[str, Operator]:
    """``{"<token>": {"operator": "alice", "role": "viewer"}}`` as a token -> operator map.

    Errors never quote the JSON: it holds the tokens.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError('must be a JSON object {"<token>": {"operator": ..., "role": ...}}')
    tokens: dict[str, Operator] = {}
    for number, (token, entry) in enumerate(data.items(), start=1):
        where = f"entry {number}"
        if not isinstance(token, str) or len(token) < 16:
            raise ValueError(f"{where}: a token must be at least 16 characters")
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
        tokens[token] = Operator(name=name.strip(), role=role)
    return tokens


class ConsoleSettings(SettingsBase):
    """``zapstream console``: the operators' web console (``ZAPSTREAM_CONSOLE_*``)."""

    model_config = SettingsConfigDict(env_prefix="ZAPSTREAM_CONSOLE_", extra="ignore")

    tokens: SecretStr = SecretStr("")
    """JSON ``{"<token>": {"operator": "alice", "role": "viewer|operator|admin"}}``; required."""
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

    def operators(self) -> dict[str, Operator]:
        """Token -> operator."""
        return parse_tokens(self.tokens.get_secret_value())
