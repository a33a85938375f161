"""Configuration and start-up failures as one line that names the variable or the command.

The composition root (:func:`connectors.cli.main`) turns what escapes a command
into one line on stderr and exit code 2 instead of a traceback (a deployable's
service refusing to start, :class:`~streams.kernel.failures.StartRefused`, is said by
:func:`streams.kernel.runtime.run.run_until_signalled` the same way):

- a pydantic ``ValidationError`` from a settings class: each error names the
  environment variable, not the Python field (``ZAPSTREAM_KAFKA_PARTITIONS: must
  be >= 1 (got '0')``);
- a ``ZAPSTREAM_*`` variable no settings class reads (a typo would otherwise be
  silently ignored): named, with the closest known name;
- any permanent :class:`~streams.kernel.errors.Failure` (a
  :class:`~streams.kernel.failures.StartRefused`: topics that do not match, ...);
- a connection error nobody handled: names ``ZAPSTREAM_DATABASE_URL`` or
  ``ZAPSTREAM_KAFKA_BROKERS``, never the DSN's password.

The known variables are derived from the settings classes themselves (every
subclass of :class:`streams.kernel.settings.SettingsBase` in :data:`SETTINGS_MODULES`),
so a new field is known as soon as it exists.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from streams.kernel.errors import Failure
from streams.kernel.failures import StartRefused

ENV_PREFIX = "ZAPSTREAM_"

SETTINGS_MODULES = (
    "streams.kernel.settings",
    "streams.worker_settings",
    "connectors.cdc.settings",
    "connectors.sink.settings",
    "connectors.webhook.settings",
    "connectors.ops.status_settings",
    "connectors.console.settings",
)
"""Modules holding settings classes; every ``SettingsBase`` subclass they define counts."""

NOT_SETTINGS = frozenset({"ZAPSTREAM_SECRETS_DIR", "ZAPSTREAM_ALLOW_DEMO_SECRETS"})
"""``ZAPSTREAM_*`` variables read outside the settings classes (allow-list)."""

_SENSITIVE = ("KEY", "TOKEN", "SECRET", "PASSWORD", "DATABASE_URL")


def settings_classes() -> list[type[Any]]:
    """Every settings class, found by walking ``SettingsBase`` subclasses."""
    for name in SETTINGS_MODULES:
        importlib.import_module(name)
    from streams.kernel.settings import SettingsBase

    found: list[type[Any]] = []
    pending: list[type[Any]] = [SettingsBase]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                pending.append(sub)
    return found


def _is_settings_block(annotation: object) -> bool:
    from pydantic_settings import BaseSettings

    return isinstance(annotation, type) and issubclass(annotation, BaseSettings)


def env_names(cls: type[Any], field_name: str) -> list[str]:
    """The environment variables that set ``cls.field_name``, the preferred one first."""
    from pydantic import AliasChoices

    field = cls.model_fields[field_name]
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        names = [c for c in alias.choices if isinstance(c, str) and c != field_name]
        if names:
            return [n.upper() for n in names]
    elif isinstance(alias, str):
        return [alias.upper()]
    prefix = str(cls.model_config.get("env_prefix", ""))
    return [(prefix + field_name).upper()]


def known_env_names(classes: Iterable[type[Any]] | None = None) -> frozenset[str]:
    """Every ``ZAPSTREAM_*`` variable some settings class reads, plus :data:`NOT_SETTINGS`."""
    names = set(NOT_SETTINGS)
    for cls in settings_classes() if classes is None else classes:
        for field_name in cls.model_fields:
            names.update(n for n in env_names(cls, field_name) if n.startswith(ENV_PREFIX))
    return frozenset(names)


def unknown_env_lines(environ: Mapping[str, str], known: frozenset[str] | None = None) -> list[str]:
    """One line per ``ZAPSTREAM_*`` variable in ``environ`` that nothing reads."""
    known = known if known is not None else known_env_names()
    lines = []
    for name in sorted(environ):
        upper = name.upper()  # pydantic-settings matches names case-insensitively
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        lines.append(f"{name}: unknown variable, no zapstream setting reads it{hint}")
    return lines


# --- validation errors ---------------------------------------------------------------------

_BOUNDS = {
    "greater_than_equal": ("ge", ">="),
    "greater_than": ("gt", ">"),
    "less_than_equal": ("le", "<="),
    "less_than": ("lt", "<"),
}


def _message(error: Mapping[str, Any]) -> str:
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    if kind in _BOUNDS and _BOUNDS[kind][0] in ctx:
        key, op = _BOUNDS[kind]
        bound = ctx[key]
        if isinstance(bound, float) and bound.is_integer():
            bound = int(bound)
        return f"must be {op} {bound}"
    if kind == "missing":
        return "is required"
    msg = str(error.get("msg", "invalid value"))
    for prefix, replacement in (("Input should be ", "must be "), ("Value error, ", "")):
        if msg.startswith(prefix):
            msg = replacement + msg[len(prefix) :]
    return msg


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_secret(cls: type[Any] | None, field_name: str | None, env: str) -> bool:
    from pydantic import SecretStr

    if any(word in env for word in _SENSITIVE):
        return True
    if cls is not None and field_name in cls.model_fields:
        return cls.model_fields[field_name].annotation is SecretStr
    return False


def _field_of(cls: type[Any], loc0: str) -> str | None:
    if loc0 in cls.model_fields:
        return loc0
    for field_name in cls.model_fields:
        if loc0.upper() in env_names(cls, field_name):
            return str(field_name)
    return None


def render_validation_error(exc: Any, classes: Iterable[type[Any]] | None = None) -> list[str]:
    """One line per error of a pydantic ``ValidationError``, naming the environment variable.

    ``exc.title`` is the settings class that failed (a nested block such as
    ``KafkaSettings`` fails on its own, built from its own prefix).
    """
    by_name = {c.__name__: c for c in (settings_classes() if classes is None else classes)}
    cls = by_name.get(str(exc.title))
    if cls is None:
        return []  # not a settings class: a bug elsewhere, keep its traceback
    lines = []
    for error in exc.errors():
        loc = [str(part) for part in error.get("loc", ())]
        if not loc and error.get("type") == "value_error":
            # A check across fields (``model_validator``): its message names the
            # variables; its input is every field, secrets included, so never shown.
            lines.append(_message(error))
            continue
        field_name = _field_of(cls, loc[0]) if loc else None
        if field_name is not None:
            env = env_names(cls, field_name)[0]
        elif loc:
            env = loc[0].upper() if loc[0].upper().startswith(ENV_PREFIX) else loc[0]
        else:
            env = str(exc.title)
        where = env + "".join(f"[{part}]" for part in loc[1:])
        line = f"{where}: {_message(error)}"
        if "input" in error and not _is_secret(cls, field_name, env):
            line += f" (got {_shown(error['input'])})"
        lines.append(line)
    return lines


_SETTINGS_ERROR = re.compile(r'error parsing value for field "(?P<field>[^"]+)"')


def render_settings_error(
    exc: BaseException,
    environ: Mapping[str, str],
    classes: Iterable[type[Any]] | None = None,
) -> str:
    """A pydantic-settings ``SettingsError`` (a value that is not valid JSON) as one line."""
    match = _SETTINGS_ERROR.search(str(exc))
    if match is None:
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    field_name = match["field"]
    present = {k.upper() for k in environ}
    candidates = [
        env
        for cls in (settings_classes() if classes is None else classes)
        if field_name in cls.model_fields
        for env in env_names(cls, field_name)
    ]
    set_now = [env for env in candidates if env in present]
    env = (set_now or candidates or [field_name])[0]
    return f"{env}: not valid JSON (lists and maps are JSON, e.g. [1, 5, 30])"


# --- connection errors ---------------------------------------------------------------------

# Up to the last "@" of the URL: a password may hold "@" itself. With or without "//"
# after the scheme (a malformed URL is quoted whole in libpq's refusal).
_DSN_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*:?//[^:/@\s'\"]*:)[^\s'\"]*@", re.IGNORECASE)
_BOOTSTRAP_HOST = re.compile(r"\('([^']+)', (\d+)")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def mask_secrets(text: str) -> str:
    """``postgresql://user:secret@host`` -> ``postgresql://user:***@host`` (also ``password=``)."""
    return _KV_PASSWORD.sub(r"\1***", _DSN_PASSWORD.sub(r"\1***@", text))


class MaskingFormatter(logging.Formatter):
    """Every log line with its passwords masked (:func:`mask_secrets`), tracebacks included:
    a library's message or exception may quote a connection string whole."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


_MASKING_FACTORY = "_zapstream_masks_secrets"


def mask_every_log_record() -> None:
    """Mask passwords (:func:`mask_secrets`) in every log record created from now on, by any
    logger and for any handler: Faust's and the libraries' handlers have formatters of their
    own, which :class:`MaskingFormatter` does not reach. Idempotent.

    The message is formatted when the record is made (only records a logger lets through
    are made) and so is an exception's traceback; a message whose arguments do not format
    is left to logging's own error report.
    """
    previous = logging.getLogRecordFactory()
    if getattr(previous, _MASKING_FACTORY, False):
        return

    def masking_factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - logging reports it when the record is emitted
            return record
        masked = mask_secrets(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[0] is not None:
            record.exc_text = mask_secrets(_PLAIN.formatException(record.exc_info))
        return record

    setattr(masking_factory, _MASKING_FACTORY, True)
    logging.setLogRecordFactory(masking_factory)


_PLAIN = logging.Formatter()


def _one_line(text: str) -> str:
    parts = [p.strip() for p in text.splitlines() if p.strip()]
    return mask_secrets("; ".join(parts)) if parts else ""


def error_detail(exc: BaseException) -> str:
    """``exc`` as one masked line; a Kafka bootstrap failure as the hosts it tried."""
    text = str(exc)
    hosts = [f"{host}:{port}" for host, port in _BOOTSTRAP_HOST.findall(text)]
    if hosts and "bootstrap" in text.lower():
        return f"unable to bootstrap from {', '.join(hosts)}"
    return _one_line(text) or type(exc).__name__


def describe_connection_failure(exc: BaseException) -> str | None:
    """One line for a PostgreSQL/Kafka connection error nobody handled, else None."""
    try:
        import psycopg
    except ModuleNotFoundError:  # pragma: no cover - psycopg is a base dependency
        psycopg = None  # type: ignore[assignment]
    if psycopg is not None and isinstance(exc, psycopg.Error):
        return f"PostgreSQL (ZAPSTREAM_DATABASE_URL): {error_detail(exc)}"
    try:
        from aiokafka.errors import KafkaConnectionError
    except ModuleNotFoundError:
        return None
    if isinstance(exc, KafkaConnectionError):
        return f"cannot reach Kafka (ZAPSTREAM_KAFKA_BROKERS): {error_detail(exc)}"
    return None


# --- what escapes a command ----------------------------------------------------------------


def refuse_unknown_variables(environ: Mapping[str, str]) -> None:
    """A misspelt ``ZAPSTREAM_*`` variable would be silently ignored: refuse to run instead."""
    try:
        import pydantic_settings  # noqa: F401
    except ModuleNotFoundError:
        return  # base install: no settings classes, nothing reads ZAPSTREAM_* but the DSN
    lines = unknown_env_lines(environ)
    if lines:
        raise StartRefused("; ".join(lines))


def startup_failure_lines(exc: Exception, environ: Mapping[str, str]) -> list[str]:
    """``exc`` as the lines to print (each after ``zapstream: ``), or [] for a bug."""
    if isinstance(exc, Failure):
        return [] if exc.retriable else [str(exc)]
    try:
        from pydantic import ValidationError
        from pydantic_settings import SettingsError
    except ModuleNotFoundError:
        pass
    else:
        if isinstance(exc, ValidationError):
            return render_validation_error(exc)
        if isinstance(exc, SettingsError):
            return [render_settings_error(exc, environ)]
    line = describe_connection_failure(exc)
    return [line] if line is not None else []
