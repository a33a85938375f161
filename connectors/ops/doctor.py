"""``zapstream doctor``: is everything in place for the pipeline to run?

One line per check, ``OK``/``FAIL``/``SKIP`` with what was found and, on failure,
the remedy (the setting or command to fix it):

- PostgreSQL reachable (``ZAPSTREAM_DATABASE_URL``), ``wal_level=logical``,
  migrations applied (shipped files against ``schema_migrations``);
- the role it connects as, against its component's group role
  (:mod:`connectors.outbox.roles`; ``--component``, else the one ``zapstream_*`` group
  it is a member of): one FAIL line per privilege beyond what the component needs
  (SUPERUSER, REPLICATION outside the relay, ownership of the schema or the tables,
  writes it never does) and per privilege missing, each naming what to run
  (:mod:`connectors.ops.privileges`);
- the relay's publication and slot: exist, plugin ``pgoutput``, active or not,
  lag in bytes (``pg_current_wal_lsn() - confirmed_flush_lsn``); on a standby the slot
  line is a SKIP, the failover line judges the copy there;
- failover (:mod:`connectors.ops.failover_checks`): on every host of the DSN, the settings
  PostgreSQL 17+ needs to keep the relay's slot on a standby across a promotion;
- Kafka reachable (``ZAPSTREAM_KAFKA_BROKERS``), every topic with the partition
  count ``ZAPSTREAM_KAFKA_PARTITIONS`` says (read without creating anything);
- the gateway: base URL, route and credentials, with one harmless request
  (StackZap: one listing page, which must parse; ZAP API: an empty send body, where a
  400/422 proves the route and a 404 a wrong ``ZAP_API_URL``; Meta: the phone
  number's node). A FAIL names the setting to fix.

Every check is bounded by ``timeout_s``. Exit code 0 if nothing failed, 1 otherwise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg

from connectors.cdc.provisioning import COMMANDS_TABLE, OUTBOX_TABLE, WAL_LEVEL_HINT
from connectors.cdc.settings import RelaySettings
from connectors.ops.check_result import CheckResult, Status
from connectors.ops.failover_checks import failover_checks
from connectors.ops.privileges import infer_component, read_role_facts, role_problems
from connectors.outbox.migrate import shipped_migrations
from connectors.outbox.roles import COMPONENTS
from connectors.startup import error_detail
from streams.kernel.settings import GatewayKind, GatewaySettings
from streams.kernel.topics_check import (
    KafkaSecurityRefused,
    all_topic_specs,
    partition_counts,
    topic_problems,
)

MIGRATE_HINT = "run `zapstream db migrate`"


def _ok(check: str, detail: str) -> CheckResult:
    return CheckResult(check, Status.OK, detail)


def _fail(check: str, detail: str, remedy: str) -> CheckResult:
    return CheckResult(check, Status.FAIL, detail, remedy)


def _skip(check: str, detail: str) -> CheckResult:
    return CheckResult(check, Status.SKIP, detail)


async def _bounded(
    check: str, timeout_s: float, run: Callable[[], Awaitable[list[CheckResult]]]
) -> list[CheckResult]:
    try:
        return await asyncio.wait_for(run(), timeout_s)
    except TimeoutError:
        return [_fail(check, f"no answer within {timeout_s:g} s", "check the host and port")]
    except psycopg.Error as exc:  # e.g. a role that may not read pg_replication_slots
        return [_fail(check, f"query failed: {error_detail(exc)}", "see the PostgreSQL log")]


# --- PostgreSQL ------------------------------------------------------------------------------


async def _postgres_checks(
    relay: RelaySettings, timeout_s: float, component: str | None = None
) -> list[CheckResult]:
    names = ("wal_level", "migrations", "publication", "slot", "role", "failover")
    try:
        conn = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(
                relay.postgres.dsn, autocommit=True, connect_timeout=max(1, round(timeout_s))
            ),
            timeout_s,
        )
    except (psycopg.Error, OSError, TimeoutError) as exc:
        detail = error_detail(exc) if not isinstance(exc, TimeoutError) else "no answer"
        return [
            _fail("postgres", f"cannot connect: {detail}", "check ZAPSTREAM_DATABASE_URL"),
            *(_skip(name, "PostgreSQL unreachable") for name in names),
        ]
    async with conn:
        version = await _scalar(conn, "SHOW server_version")
        standby = bool(await _scalar(conn, "SELECT pg_is_in_recovery()"))
        role = ", a standby in recovery" if standby else ""
        results = [_ok("postgres", f"reachable (PostgreSQL {version}{role})")]
        for check in (_wal_level, _migrations, _publication):
            results.extend(
                await _bounded(check.__name__.strip("_"), timeout_s, _bind(check, conn, relay))
            )
        if standby:
            # The relay streams from the primary; the copy of its slot here is the
            # failover line's to judge (pg_current_wal_lsn() fails during recovery).
            results.append(
                _skip("slot", f"{relay.slot}: this server is a standby, see the failover line")
            )
        else:
            results.extend(await _bounded("slot", timeout_s, _bind(_slot, conn, relay)))
        results.extend(await _bounded("role", timeout_s, lambda: _role_checks(conn, component)))
    # Every host of the DSN, each on a connection of its own (a multi-host DSN reaches
    # only the primary above).
    results.extend(
        await _bounded("failover", timeout_s * 2, lambda: failover_checks(relay, timeout_s))
    )
    return results


async def _role_checks(
    conn: psycopg.AsyncConnection[Any], component: str | None
) -> list[CheckResult]:
    """The connected role against its component's needs: one FAIL per problem."""
    facts = await read_role_facts(conn)
    chosen = component or infer_component(facts)
    if chosen is None:
        # First: a superuser counts as a member of every role (pg_has_role).
        if facts.superuser or facts.owns:
            return [
                _skip(
                    "role",
                    f"{facts.user} owns the outbox (right for `zapstream db migrate` only); "
                    "check a component's own role with its ZAPSTREAM_DATABASE_URL and "
                    f"--component ({'|'.join(COMPONENTS)})",
                )
            ]
        if len(facts.groups) > 1:
            return [
                _fail(
                    "role",
                    f"{facts.user} is a member of {', '.join(facts.groups)}",
                    "give each component a login role of its own, a member of one group role",
                )
            ]
        return [
            _fail(
                "role",
                f"{facts.user} is a member of no zapstream_* group role",
                "GRANT zapstream_<component> TO " + facts.user + " (or pass --component)",
            )
        ]
    problems = role_problems(facts, chosen)
    if not problems:
        return [
            _ok("role", f"{facts.user} as the {chosen}: exactly what zapstream_{chosen} grants")
        ]
    return [_fail("role", p.detail, p.remedy) for p in problems]


def _bind(
    check: Callable[[psycopg.AsyncConnection[Any], RelaySettings], Awaitable[list[CheckResult]]],
    conn: psycopg.AsyncConnection[Any],
    relay: RelaySettings,
) -> Callable[[], Awaitable[list[CheckResult]]]:
    return lambda: check(conn, relay)


async def _scalar(conn: psycopg.AsyncConnection[Any], query: str, *params: object) -> Any:
    cur = await conn.execute(query, params or None)
    row = await cur.fetchone()
    return row[0] if row else None


async def _wal_level(conn: psycopg.AsyncConnection[Any], relay: RelaySettings) -> list[CheckResult]:
    level = await _scalar(conn, "SHOW wal_level")
    if level == "logical":
        return [_ok("wal_level", "logical")]
    return [_fail("wal_level", f"wal_level is {level!r}, not 'logical'", WAL_LEVEL_HINT)]


async def _migrations(
    conn: psycopg.AsyncConnection[Any], relay: RelaySettings
) -> list[CheckResult]:
    shipped = shipped_migrations()
    recorded: dict[int, str] = {}
    if await _scalar(conn, "SELECT to_regclass('schema_migrations') IS NOT NULL"):
        cur = await conn.execute("SELECT version, checksum FROM schema_migrations")
        recorded = {int(v): str(c) for v, c in await cur.fetchall()}
    missing = [f"{m.version:04d}_{m.name}" for m in shipped if m.version not in recorded]
    changed = [
        f"{m.version:04d}_{m.name}"
        for m in shipped
        if m.version in recorded and recorded[m.version] != m.checksum
    ]
    if missing:
        return [_fail("migrations", f"not applied: {', '.join(missing)}", MIGRATE_HINT)]
    if changed:
        return [
            _fail(
                "migrations",
                f"changed after they were applied: {', '.join(changed)}",
                "install the zapstream version that applied them; edit schemas with new files",
            )
        ]
    return [_ok("migrations", f"all {len(shipped)} applied")]


async def _publication(
    conn: psycopg.AsyncConnection[Any], relay: RelaySettings
) -> list[CheckResult]:
    name = relay.publication
    cur = await conn.execute("SELECT pubinsert FROM pg_publication WHERE pubname = %s", (name,))
    row = await cur.fetchone()
    if row is None:
        return [
            _fail(
                "publication",
                f"{name} does not exist",
                "run `zapstream db migrate` (or start `zapstream relay`) to create it",
            )
        ]
    cur = await conn.execute(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1", (name,)
    )
    tables = [str(t) for (t,) in await cur.fetchall()]
    if not row[0]:
        return [
            _fail(
                "publication",
                f"{name} does not publish inserts",
                f"DROP PUBLICATION {name}; then run `zapstream db migrate`",
            )
        ]
    missing = [t for t in (OUTBOX_TABLE, COMMANDS_TABLE) if t not in tables]
    if missing:
        return [
            _fail(
                "publication",
                f"{name} does not publish {', '.join(missing)}",
                "run `zapstream db migrate` (or start `zapstream relay`) to add it",
            )
        ]
    return [_ok("publication", f"{name} publishes {', '.join(tables)}")]


# Lag: WAL written since the relay's last confirmation; retained: WAL the slot keeps
# on disk (from restart_lsn), what fills the disk while no relay streams.
SLOT_QUERY = """
    SELECT plugin, slot_type, database, active, active_pid,
           pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
           pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint
    FROM pg_replication_slots WHERE slot_name = %s
"""


@dataclasses.dataclass(frozen=True, slots=True)
class SlotState:
    """A replication slot as ``pg_replication_slots`` shows it (``doctor``, ``status``)."""

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    active: bool
    active_pid: int | None
    lag_bytes: int | None
    """WAL written since the slot's confirmed flush position (None before the first one)."""
    retained_bytes: int | None
    """WAL the slot keeps from its ``restart_lsn``."""


async def read_slot(conn: psycopg.AsyncConnection[Any], name: str) -> SlotState | None:
    """The slot called ``name``, or None when it does not exist."""
    cur = await conn.execute(SLOT_QUERY, (name,))
    row = await cur.fetchone()
    if row is None:
        return None
    plugin, slot_type, database, active, pid, lag, retained = row
    return SlotState(
        name,
        plugin,
        str(slot_type),
        database,
        bool(active),
        None if pid is None else int(pid),
        None if lag is None else int(lag),
        None if retained is None else int(retained),
    )


async def _slot(conn: psycopg.AsyncConnection[Any], relay: RelaySettings) -> list[CheckResult]:
    name = relay.slot
    slot = await read_slot(conn, name)
    if slot is None:
        return [
            _fail(
                "slot",
                f"replication slot {name} does not exist",
                "run `zapstream db migrate` (or start `zapstream relay`) to create it",
            )
        ]
    plugin, slot_type, database, active, lag = (
        slot.plugin,
        slot.slot_type,
        slot.database,
        slot.active,
        slot.lag_bytes,
    )
    if slot_type != "logical" or plugin != "pgoutput":
        return [
            _fail(
                "slot",
                f"{name} is a {slot_type} slot with plugin {plugin!r}, not pgoutput",
                f"drop it (SELECT pg_drop_replication_slot('{name}')) or set ZAPSTREAM_RELAY_SLOT",
            )
        ]
    current_db = await _scalar(conn, "SELECT current_database()")
    if database != current_db:
        return [
            _fail(
                "slot",
                f"{name} belongs to database {database!r}, not {current_db!r}",
                "set ZAPSTREAM_RELAY_SLOT to a slot name of its own",
            )
        ]
    state = "active (a relay is streaming)" if active else "inactive (no relay streaming)"
    lag_text = f"lag {int(lag)} bytes" if lag is not None else "lag unknown"
    return [_ok("slot", f"{name} pgoutput, {state}, {lag_text}")]


# --- Kafka -----------------------------------------------------------------------------------


async def _kafka_checks(relay: RelaySettings, timeout_s: float) -> list[CheckResult]:
    from aiokafka.errors import KafkaError

    kafka = relay.kafka
    try:
        counts = await asyncio.wait_for(partition_counts(kafka), timeout_s)
    except KafkaSecurityRefused as exc:
        problem, _, remedy = str(exc).partition("): ")
        return [_fail("kafka", f"{problem})", remedy), _skip("topics", "Kafka refused us")]
    except (KafkaError, OSError, TimeoutError) as exc:
        detail = error_detail(exc) if not isinstance(exc, TimeoutError) else "no answer"
        return [
            _fail(
                "kafka", f"cannot reach {kafka.brokers}: {detail}", "check ZAPSTREAM_KAFKA_BROKERS"
            ),
            _skip("topics", "Kafka unreachable"),
        ]
    results = [_ok("kafka", f"reachable at {kafka.brokers}")]
    specs = all_topic_specs(kafka)
    problems = topic_problems(counts, specs)
    if not problems:
        prefix = kafka.topic_prefix
        named = f" named {prefix}zapstream.*" if prefix else ""
        results.append(
            _ok(
                "topics",
                f"{len(specs)} topics{named}, partitions as "
                f"ZAPSTREAM_KAFKA_PARTITIONS={kafka.partitions}",
            )
        )
    for problem in problems:
        detail, _, remedy = problem.partition(": ")
        results.append(_fail("topics", detail, remedy))
    return results


# --- the gateway -----------------------------------------------------------------------------


DOCTOR_INSTANCE = "zapstream-doctor"
"""The instance asked about without ``--instance``: tells the route and the key, not an instance."""


async def _gateway_checks(
    gateway: GatewaySettings, timeout_s: float, instance_id: str
) -> list[CheckResult]:
    """One harmless request (the client's ``probe_configuration``): StackZap lists one job
    (and the listing must parse), the ZAP API is sent an empty body (a 400/422 proves the
    route, a 404 a wrong base URL), Meta reads the phone number's node."""
    from connectors.gateways.factory import build_gateway
    from connectors.gateways.http_client import HttpGatewayClient
    from streams.kernel.errors import (
        GatewayError,
        GatewayMisconfigured,
        InstanceUnavailableError,
        ListingUnreadable,
    )

    client = build_gateway(gateway)
    assert isinstance(client, HttpGatewayClient)
    where = f"{client.name} at {_url_of(gateway)}"
    url_setting, key_setting = client.url_setting, client.credential_setting
    placeholder = instance_id == DOCTOR_INSTANCE
    try:
        await client.start()
        try:
            detail = await asyncio.wait_for(client.probe_configuration(instance_id), timeout_s)
        finally:
            await client.stop()
    except TimeoutError:
        return [
            _fail("gateway", f"{where}: no answer within {timeout_s:g} s", f"check {url_setting}")
        ]
    except GatewayMisconfigured as exc:
        return [
            _fail(
                "gateway",
                f"{where} has no such route (HTTP {exc.status_code}): {error_detail(exc)}",
                f"check {url_setting}: the API's root, without /v1 or a path",
            )
        ]
    except InstanceUnavailableError as exc:
        if exc.status_code in (401, 403) or "credentials" in str(exc):
            return [
                _fail(
                    "gateway",
                    f"{where} rejected the credentials ({exc.status_code})",
                    f"check {key_setting}",
                )
            ]
        if placeholder and "unknown" in str(exc):
            return [
                _ok(
                    "gateway",
                    f"{where}: route and credentials answer (instance {instance_id} is unknown, "
                    "as it should be; pass --instance to check one of yours)",
                )
            ]
        return [
            _fail(
                "gateway",
                f"{where}: instance {instance_id} unavailable: {error_detail(exc)}",
                "check the instance id, or its session at the gateway",
            )
        ]
    except ListingUnreadable as exc:
        return [
            _fail(
                "gateway",
                f"{where}: the job listing is unreadable: {error_detail(exc)}",
                "set ZAPSTREAM_STACKZAP_LISTING_FIELDS to the names the gateway uses",
            )
        ]
    except GatewayError as exc:
        remedy = f"check {url_setting}" if exc.status_code is None else "see the gateway's status"
        return [_fail("gateway", f"{where}: {error_detail(exc)}", remedy)]
    return [_ok("gateway", f"{where}: {detail}")]


def _url_of(gateway: GatewaySettings) -> str:
    """The configured base URL, scheme://host:port only (a URL may carry userinfo)."""
    import yarl

    raw = {
        GatewayKind.STACKZAP: gateway.stackzap_api_url,
        GatewayKind.ZAPAPI: gateway.zap_api_url,
        GatewayKind.META: gateway.meta_graph_url,
    }[gateway.kind]
    url = yarl.URL(raw)
    path = url.path if url.path not in ("", "/") else ""
    return f"{url.scheme}://{url.host}:{url.port}{path}"


# --- running and printing --------------------------------------------------------------------


async def run_doctor(
    relay: RelaySettings,
    gateway: GatewaySettings,
    *,
    timeout_s: float = 5.0,
    instance_id: str = DOCTOR_INSTANCE,
    component: str | None = None,
) -> list[CheckResult]:
    """Run every check (PostgreSQL, Kafka, gateway concurrently), each bounded by ``timeout_s``.

    ``component``: check the role as this component's (default: the one whose
    ``zapstream_*`` group role it is a member of).
    """
    # PostgreSQL runs up to six groups of queries in sequence, each bounded, then the
    # failover check (up to two bounds); the whole group gets room.
    pg, kafka, gw = await asyncio.gather(
        _bounded("postgres", timeout_s * 9, lambda: _postgres_checks(relay, timeout_s, component)),
        _bounded("kafka", timeout_s * 2, lambda: _kafka_checks(relay, timeout_s)),
        _bounded(
            "gateway", timeout_s * 2, lambda: _gateway_checks(gateway, timeout_s, instance_id)
        ),
    )
    return [*pg, *kafka, *gw]


def print_report(results: list[CheckResult], *, as_json: bool = False) -> int:
    """Print one line per check (or one JSON object); return the exit code (0 all OK, 1 else)."""
    failed = any(r.status is Status.FAIL for r in results)
    if as_json:
        payload = {
            "ok": not failed,
            "checks": [
                {"check": r.check, "status": r.status.value, "detail": r.detail, "remedy": r.remedy}
                for r in results
            ],
        }
        print(json.dumps(payload))
    else:
        for result in results:
            print(result.line())
        print("zapstream doctor: " + ("some checks FAILED" if failed else "all checks OK"))
    sys.stdout.flush()
    return 1 if failed else 0
