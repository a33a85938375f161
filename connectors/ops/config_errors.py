"""The configuration-error helpers, for the operator tools (``doctor``, ``status``) and devtools.

They live in :mod:`connectors.startup`, where the deployables (which import nothing from
``connectors/ops/``) find them; this module re-exports them under their old name.
"""

from __future__ import annotations

from connectors.startup import (
    ENV_PREFIX,
    NOT_SETTINGS,
    SETTINGS_MODULES,
    describe_connection_failure,
    env_names,
    error_detail,
    known_env_names,
    mask_secrets,
    render_settings_error,
    render_validation_error,
    settings_classes,
    unknown_env_lines,
)

__all__ = [
    "ENV_PREFIX",
    "NOT_SETTINGS",
    "SETTINGS_MODULES",
    "describe_connection_failure",
    "env_names",
    "error_detail",
    "known_env_names",
    "mask_secrets",
    "render_settings_error",
    "render_validation_error",
    "settings_classes",
    "unknown_env_lines",
]
