"""Who is asking: a token from ``Authorization: Bearer`` or the login form, checked here.

Pure functions, so the decision is unit-tested without a server. The console keeps only
the tokens' SHA-256 digests (:func:`connectors.console.settings.parse_tokens`); a
presented token is hashed and compared with every digest in constant time, and is
never logged. A request without a known token is nobody (the app answers 401), and only
operators and admins may act on jobs. A browser holds a session id, not the token
(:mod:`connectors.console.sessions`).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from connectors.console.settings import Operator, token_digest

__all__ = ["authenticate", "bearer_token", "cookie_name"]


def cookie_name(secure: bool) -> str:
    """The session cookie's name: ``__Host-`` prefixed when it is ``Secure``.

    Browsers accept a ``__Host-`` cookie only with ``Secure``, ``Path=/`` and no
    ``Domain``: it cannot be set by a sibling host or over plain HTTP. A console bound
    to 127.0.0.1 for local use over plain HTTP cannot have a Secure cookie at all
    (browsers refuse one from ``http://``), so its cookie has the plain name.
    """
    return "__Host-zapstream_session" if secure else "zapstream_session"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(operators: Mapping[bytes, Operator], presented: str | None) -> Operator | None:
    """The operator holding ``presented`` (a token), or None.

    ``operators`` maps token digests to operators. Every digest is compared, in
    constant time, so the answer's timing does not tell which entry matched.
    """
    if not presented or not presented.isascii():
        # Tokens are ASCII; a header aiohttp could not decode (surrogates) is nobody's.
        return None
    given = token_digest(presented)
    found: Operator | None = None
    for digest, operator in operators.items():
        if hmac.compare_digest(digest, given):
            found = operator
    return found
