"""PostgreSQL and Kafka failures classified once, into the kernel's vocabulary.

Every edge (the relay, the state sink, the webhook, the worker's history lookups, the
operator tools) classifies what its dependencies raise with these rules, so PostgreSQL and
Kafka mean the same thing everywhere; each edge may add its own hints (what *its* operator
must do). A classified failure is a :class:`~streams.kernel.errors.Failure`:

- **transient** (``retriable``): the server is away or busy: SQLSTATE classes 08
  (connection exception), 40 (serialization failure, deadlock), 53 (insufficient
  resources), 57 (operator intervention: 57P01 admin shutdown, 57P03 cannot connect now)
  and 58; libpq's connection failures, which carry no SQLSTATE (connection refused, host
  unreachable, server closed the connection, timeout); aiokafka's errors, a broker that
  cannot be reached, a timeout (:func:`is_transient`). Waited out with
  :class:`~streams.kernel.runtime.backoff.Backoff` for as long as it lasts, logged once when
  it starts and once when it ends (:class:`~streams.kernel.runtime.outage.OutageLog`).
- **permanent**: a retry fails the same way: class 28 (authentication), 3D000 (no such
  database), 42P01 (no outbox tables), whatever else the caller's hints name; a TLS
  handshake the client refuses, a SASL login the broker refuses, or a request its ACLs
  refuse (topic, group, cluster, transactional id: :func:`classify_kafka_security`). One
  line for the operator, naming the setting or the
  command; a deployable that meets one at start raises :class:`StartRefused` (exit 2).

libpq reports a failed connection with a message and no SQLSTATE, so
:func:`classify_postgres` reads the message for the few permanent cases.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping

from streams.kernel.errors import Failure

DATABASE_SETTING = "ZAPSTREAM_DATABASE_URL"
MIGRATE = "run `zapstream db migrate`"

TRANSIENT_SQLSTATE_CLASSES = frozenset(("08", "40", "53", "57", "58"))
"""Connection exception, transaction rollback, insufficient resources, operator intervention,
system error: a later attempt may succeed."""

PERMANENT_SQLSTATES: Mapping[str, str] = {
    "28": f"authentication failed: check the user and password in {DATABASE_SETTING}",
    "3D000": f"the database does not exist: check the database name in {DATABASE_SETTING}",
    "42P01": f"the outbox tables do not exist: {MIGRATE}",
}
"""SQLSTATE (a class of two characters, or a full code) -> what the operator must do."""

# libpq's connection failures: a message, no SQLSTATE. Checked in order; "DSN" is ours.
PERMANENT_MESSAGES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"password authentication failed|authentication failed", re.I), "28"),
    (re.compile(r"no pg_hba\.conf entry", re.I), "28"),
    (re.compile(r"role \S+ does not exist", re.I), "28"),
    (re.compile(r"password is required|no password supplied", re.I), "28"),
    (re.compile(r'database "[^"]*" does not exist', re.I), "3D000"),
    (re.compile(r"invalid (dsn|connection option|integer value)|invalid URI", re.I), "DSN"),
)
_DSN_HINT = f"the connection string is invalid: check {DATABASE_SETTING}"


KAFKA_TLS_HINT = (
    "check ZAPSTREAM_KAFKA_SSL_CAFILE (the CA that signed the brokers' certificates; "
    "unset: the system's trust store) and ZAPSTREAM_KAFKA_BROKERS (a host name the "
    "certificate names)"
)
KAFKA_TLS_HANDSHAKE_HINT = (
    "check ZAPSTREAM_KAFKA_SECURITY_PROTOCOL (does this listener use TLS?) and "
    "ZAPSTREAM_KAFKA_SSL_CERTFILE/_KEYFILE (a client certificate the brokers accept)"
)
KAFKA_SASL_HINT = (
    "check ZAPSTREAM_KAFKA_SASL_USERNAME and ZAPSTREAM_KAFKA_SASL_PASSWORD "
    "(and ZAPSTREAM_KAFKA_SASL_MECHANISM)"
)
KAFKA_ACL_HINT = (
    "check ZAPSTREAM_KAFKA_SASL_USERNAME (each component has a Kafka user of its own) and "
    "grant that user its component's ACLs (docs/guides/security.md)"
)
KAFKA_MECHANISM_HINT = (
    "set ZAPSTREAM_KAFKA_SASL_MECHANISM to one the brokers enable (PLAIN, SCRAM-SHA-256, "
    "SCRAM-SHA-512)"
)


def classify_kafka_security(exc: BaseException) -> str | None:
    """One line for a TLS, SASL or ACL failure no retry will fix; None for anything else.

    Permanent: the broker's certificate does not verify, the TLS handshake is refused
    (an alert, a listener that does not speak TLS), the broker refuses the SASL login
    or the mechanism, or its ACLs refuse the user a topic, a group, a transactional id
    or the cluster (:func:`is_kafka_authorization_error`). A connection closed
    mid-handshake (EOF, reset) is not: the broker may be restarting.
    """
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError

    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or "certificate verify failed"
        return f"Kafka's TLS certificate was not accepted ({reason}): {KAFKA_TLS_HINT}"
    if isinstance(exc, ssl.SSLError) and not isinstance(
        exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError
    ):
        reason = getattr(exc, "reason", None) or one_line(str(exc))
        return f"TLS handshake with Kafka failed ({reason}): {KAFKA_TLS_HANDSHAKE_HINT}"
    if isinstance(exc, SaslAuthenticationFailed):
        return f"Kafka refused the SASL login ({one_line(str(exc))}): {KAFKA_SASL_HINT}"
    if isinstance(exc, UnsupportedSaslMechanismError):
        return f"Kafka does not enable this SASL mechanism ({one_line(str(exc))}): " + (
            KAFKA_MECHANISM_HINT
        )
    if is_kafka_authorization_error(exc):
        what = _AUTHORIZATION_WHAT.get(type(exc).__name__, "this")
        detail = one_line(str(exc)) or type(exc).__name__
        return f"Kafka's ACLs refuse {what} to this user ({detail}): {KAFKA_ACL_HINT}"
    return None


_AUTHORIZATION_WHAT = {
    "TopicAuthorizationFailedError": "a topic",
    "GroupAuthorizationFailedError": "a consumer group",
    "ClusterAuthorizationFailedError": "a cluster operation",
    "TransactionalIdAuthorizationFailed": "a transactional id",
}


def is_kafka_authorization_error(exc: BaseException) -> bool:
    """The broker's ACLs refused the request (topic, group, cluster or transactional id):
    it will refuse it again until an operator grants the ACL. aiokafka marks these errors
    not ``retriable``, but Kafka errors are otherwise transient."""
    from aiokafka.errors import (
        ClusterAuthorizationFailedError,
        GroupAuthorizationFailedError,
        TopicAuthorizationFailedError,
        TransactionalIdAuthorizationFailed,
    )

    return isinstance(
        exc,
        TopicAuthorizationFailedError
        | GroupAuthorizationFailedError
        | ClusterAuthorizationFailedError
        | TransactionalIdAuthorizationFailed,
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


def classify_postgres(
    sqlstate: str | None,
    message: str,
    *,
    hints: Mapping[str, str] = PERMANENT_SQLSTATES,
    messages: tuple[tuple[re.Pattern[str], str], ...] = PERMANENT_MESSAGES,
) -> Failure:
    """Transient or permanent, from the SQLSTATE and (without one) libpq's message.

    ``hints`` and ``messages`` let an edge name its own permanent cases (the relay
    adds replication privilege and ``wal_level``); any other server error (syntax,
    constraint, ...) is permanent with no hint: it will recur.
    """
    detail = one_line(message)
    code = sqlstate
    if code is None:
        for pattern, found in messages:
            if pattern.search(detail):
                code = found
                break
    if code == "DSN":
        return _postgres(detail, False, code, _DSN_HINT)
    if code is None:
        # No SQLSTATE and no known permanent message: the connection failed (refused,
        # unreachable, closed, timed out, name not resolved); the server may come back.
        return _postgres(detail, True, None, None)
    hint = hints.get(code) or hints.get(code[:2])
    if hint is not None:
        return _postgres(detail, False, code, hint)
    return _postgres(detail, code[:2] in TRANSIENT_SQLSTATE_CLASSES, code, None)


class StartRefused(Failure):
    """A deployable cannot start as configured: one line naming the fix, exit status 2."""

    retriable = False
    dependency = "config"


def is_transient(exc: BaseException) -> bool:
    """A dependency away or slow (Kafka, the network, a timeout): a later attempt may succeed.

    A classified :class:`Failure` says so itself; anything else is a bug.
    """
    if isinstance(exc, Failure):
        return exc.retriable
    from aiokafka.errors import KafkaError, SaslAuthenticationFailed

    if is_kafka_authorization_error(exc) or isinstance(exc, SaslAuthenticationFailed):
        return False  # refused by the broker's users or ACLs: the same again until fixed
    return isinstance(exc, KafkaError | OSError | TimeoutError)


def classify_kafka(exc: BaseException) -> Failure:
    """A Kafka client's failure: permanent for TLS/SASL/ACL refusals, transient for the rest
    of aiokafka's errors and the network; a bug (anything else) is permanent without a hint."""
    problem = classify_kafka_security(exc)
    if problem is not None:
        return Failure(problem, dependency="kafka", retriable=False)
    return Failure(
        one_line(str(exc)) or type(exc).__name__, dependency="kafka", retriable=is_transient(exc)
    )


def _postgres(detail: str, retriable: bool, code: str | None, hint: str | None) -> Failure:
    return Failure(detail, dependency="postgres", retriable=retriable, hint=hint, code=code)
