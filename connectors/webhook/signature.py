"""The callback signature: ``X-Zap-Signature: sha256=<hex HMAC-SHA256(secret, raw body)>``.

Shared by the intake, which verifies it, and by anything that signs callbacks
(the gateway simulator, tests). Pure: standard library only.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_PREFIX = "sha256="


def sign(secret: str, body: bytes) -> str:
    """The ``X-Zap-Signature`` value for ``body``: ``sha256=<hex HMAC-SHA256(secret, body)>``."""
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def verify_signature(secret: str, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the signature of ``body`` under ``secret``.

    An empty secret verifies nothing: an unconfigured intake must not accept
    callbacks anyone could sign. The comparison is constant-time.
    """
    if not secret or header is None:
        return False
    return hmac.compare_digest(header.strip().encode(), sign(secret, body).encode())
