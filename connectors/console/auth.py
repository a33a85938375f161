"""Who is asking: a token from the ``Authorization: Bearer`` header or the login cookie.

Pure functions, so the decision is unit-tested without a server. Tokens are
compared in constant time and never logged; a request without a known token is
nobody (the app answers 401), and only operators and admins may act on jobs.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from connectors.console.settings import Operator

__all__ = ["COOKIE", "authenticate", "bearer_token"]

COOKIE = "zapstream_console"
"""The HttpOnly cookie the login form sets; it holds the operator's token."""


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def authenticate(
    operators: Mapping[str, Operator], *, authorization: str | None, cookie: str | None
) -> Operator | None:
    """The operator holding the request's token (the header wins over the cookie), or None.

    Every known token is compared, in constant time, so the answer's timing does
    not tell how much of a token was right.
    """
    presented = bearer_token(authorization)
    if presented is None:
        presented = cookie
    if not presented or not presented.isascii():
        # Tokens are ASCII; a header aiohttp could not decode (surrogates) is nobody's.
        return None
    found: Operator | None = None
    given = presented.encode()
    for token, operator in operators.items():
        if hmac.compare_digest(token.encode(), given):
            found = operator
    return found
