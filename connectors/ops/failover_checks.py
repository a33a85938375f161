"""``zapstream doctor``'s ``failover`` check: can a standby take over with the relay's slot?

PostgreSQL 17+ copies a logical slot created with ``failover`` to standbys that run the
slot synchronisation worker, so after a promotion the relay resumes from the copy with
nothing lost or sent twice. That needs settings on both nodes, and a forgotten one fails
silently until the day of the failover. So the doctor connects to every host of
``ZAPSTREAM_DATABASE_URL`` (a multi-host DSN lists the primary and its standbys; each is
reached with ``target_session_attrs=any``) and checks, per node:

- primary: the relay's slot has ``failover`` on (the relay turns it on at start when
  ``ZAPSTREAM_RELAY_SLOT_FAILOVER`` is true); ``synchronized_standby_slots`` names the
  physical slot of every streaming standby (without it the relay can confirm changes a
  standby has not received: a promotion then loses rows Kafka already has, and the
  synchronised slot would be ahead of the new primary's WAL);
- standby: ``sync_replication_slots``, ``hot_standby_feedback``, ``primary_slot_name`` and a
  ``dbname`` in ``primary_conninfo`` (what the synchronisation worker needs), then the
  relay's slot there, synchronised (``synced``) and persistent (not ``temporary``).

PostgreSQL 15/16 keep logical slots on the primary only: one SKIP line says the relay
restreams the PENDING jobs itself after a promotion (docs/guides/deployment.md).

The decision (:func:`node_results`) is pure, facts in and lines out; reading the facts is
:func:`read_node_facts`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from connectors.cdc.settings import RelaySettings
from connectors.ops.check_result import CheckResult, Status
from connectors.startup import error_detail

CHECK = "failover"
FAILOVER_SLOTS_VERSION_NUM = 170000
"""``server_version_num`` from which logical slots can be synchronised to standbys."""
RELOAD = "SELECT pg_reload_conf()"


@dataclasses.dataclass(frozen=True, slots=True)
class RelaySlot:
    """The relay's logical slot on one node (PostgreSQL 17+ columns of pg_replication_slots)."""

    failover: bool
    synced: bool
    temporary: bool


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the failover check needs to know about one node of the DSN."""

    where: str
    """host:port, as the DSN names it (never the user or password)."""
    version_num: int
    in_recovery: bool
    relay_slot: RelaySlot | None = None
    # Primary side.
    synchronized_standby_slots: str = ""
    physical_slots: tuple[tuple[str, bool], ...] = ()
    """(name, active) of every physical slot."""
    physical_walsenders: int = 0
    """Walsenders that serve no logical slot: streaming standbys (and base backups)."""
    # Standby side.
    sync_replication_slots: bool = False
    hot_standby_feedback: bool = False
    primary_slot_name: str = ""
    primary_conninfo: str | None = None
    """None when the role may not read it (superuser or pg_read_all_settings only)."""


def _fail(detail: str, remedy: str) -> CheckResult:
    return CheckResult(CHECK, Status.FAIL, detail, remedy)


def _ok(detail: str) -> CheckResult:
    return CheckResult(CHECK, Status.OK, detail)


def _skip(detail: str) -> CheckResult:
    return CheckResult(CHECK, Status.SKIP, detail)


def node_results(facts: NodeFacts, *, slot: str, slot_failover: bool) -> list[CheckResult]:
    """The lines for one node: one OK/SKIP line, or one FAIL line per problem."""
    role = "standby" if facts.in_recovery else "primary"
    where = f"{facts.where} ({role})"
    if facts.version_num < FAILOVER_SLOTS_VERSION_NUM:
        major = facts.version_num // 10000
        return [
            _skip(
                f"{where}: PostgreSQL {major} keeps logical slots on the primary only "
                "(failover slots need 17+); after a promotion the relay finds its slot "
                "missing and restreams the PENDING jobs itself"
            )
        ]
    if not slot_failover:
        return [
            _skip(
                f"{where}: ZAPSTREAM_RELAY_SLOT_FAILOVER=false, so standbys keep no copy of "
                f"{slot}; after a promotion the relay restreams the PENDING jobs itself"
            )
        ]
    if facts.in_recovery:
        return _standby_results(facts, where, slot)
    return _primary_results(facts, where, slot)


def listed_slots(value: str) -> list[str]:
    """The slot names of a ``synchronized_standby_slots`` value (``a, "b"``)."""
    return [name.strip().strip('"') for name in value.split(",") if name.strip()]


def _primary_results(facts: NodeFacts, where: str, slot: str) -> list[CheckResult]:
    results = []
    if facts.relay_slot is not None and not facts.relay_slot.failover:
        results.append(
            _fail(
                f"{where}: slot {slot} has failover off, so no standby keeps a copy of it",
                "restart `zapstream relay`: with ZAPSTREAM_RELAY_SLOT_FAILOVER=true (the "
                "default) it turns failover on at start",
            )
        )
    streaming = [name for name, active in facts.physical_slots if active]
    existing = {name for name, _ in facts.physical_slots}
    listed = listed_slots(facts.synchronized_standby_slots)
    missing = [name for name in streaming if name not in listed]
    if missing:
        wanted = ", ".join(dict.fromkeys([*(n for n in listed if n in existing), *missing]))
        results.append(
            _fail(
                f"{where}: synchronized_standby_slots does not name {', '.join(missing)}, the "
                "physical slot of a streaming standby: the relay can confirm changes that "
                "standby has not received, and a promotion loses rows Kafka already has",
                f"ALTER SYSTEM SET synchronized_standby_slots = '{wanted}'; {RELOAD}",
            )
        )
    unknown = [name for name in listed if name not in existing]
    if unknown:
        results.append(
            _fail(
                f"{where}: synchronized_standby_slots names {', '.join(unknown)}, which is no "
                "physical slot here: logical decoding waits for it and the relay stalls",
                "remove it from synchronized_standby_slots (ALTER SYSTEM SET ...; "
                f"{RELOAD}), or create the slot its standby streams from",
            )
        )
    slotless = facts.physical_walsenders - len(streaming)
    if slotless > 0:
        results.append(
            _fail(
                f"{where}: {slotless} standby connection(s) stream without a physical slot, "
                "so the relay's slot cannot wait for them",
                "on that standby set primary_slot_name to a physical slot "
                "(pg_create_physical_replication_slot on the primary), and name it in "
                "synchronized_standby_slots",
            )
        )
    if results:
        return results
    slot_text = (
        f"slot {slot} has failover on"
        if facts.relay_slot is not None
        else f"slot {slot} not here yet (see the slot line)"
    )
    if not streaming:
        return [
            _skip(
                f"{where}: {slot_text}; no standby streams from it (no active physical slot), "
                "nothing to fail over to"
            )
        ]
    return [
        _ok(
            f"{where}: {slot_text}; synchronized_standby_slots = {', '.join(listed)} names "
            "every streaming standby's slot"
        )
    ]


def _standby_results(facts: NodeFacts, where: str, slot: str) -> list[CheckResult]:
    results = []
    on_standby = f"; {RELOAD} (on the standby)"
    if not facts.sync_replication_slots:
        results.append(
            _fail(
                f"{where}: sync_replication_slots is off, so the relay's slot {slot} is not "
                "copied here and a promotion of this standby loses it",
                f"ALTER SYSTEM SET sync_replication_slots = on{on_standby}",
            )
        )
    if not facts.hot_standby_feedback:
        results.append(
            _fail(
                f"{where}: hot_standby_feedback is off: the primary may remove catalog rows "
                "the copy of the slot needs, which invalidates it",
                f"ALTER SYSTEM SET hot_standby_feedback = on{on_standby}",
            )
        )
    if not facts.primary_slot_name:
        results.append(
            _fail(
                f"{where}: primary_slot_name is empty: slots are synchronised only to a "
                "standby that streams from a physical slot",
                "create one on the primary (SELECT pg_create_physical_replication_slot('...')), "
                f"ALTER SYSTEM SET primary_slot_name = '...'{on_standby}, and name it in the "
                "primary's synchronized_standby_slots",
            )
        )
    dbname = _conninfo_dbname(facts.primary_conninfo)
    if facts.primary_conninfo is not None and not dbname:
        results.append(
            _fail(
                f"{where}: primary_conninfo has no dbname: the slot synchronisation worker "
                "connects to a database of the primary",
                f"add dbname=<the outbox's database> to primary_conninfo{on_standby}",
            )
        )
    if results:
        return results  # the slot cannot be synchronised before these are fixed
    unread = (
        "; primary_conninfo unreadable for this role (superuser or pg_read_all_settings "
        "only), its dbname not checked"
        if facts.primary_conninfo is None
        else ""
    )
    copy = facts.relay_slot
    if copy is None:
        return [
            _fail(
                f"{where}: the relay's slot {slot} is not synchronised here yet",
                "check that it has failover on at the primary (restart `zapstream relay`), "
                "then the standby's log for slot synchronisation errors",
            )
        ]
    if not copy.synced:
        return [
            _fail(
                f"{where}: slot {slot} here was created on the standby (synced = false), it "
                "is not the primary's copy",
                f"drop it on the standby (SELECT pg_drop_replication_slot('{slot}')) so the "
                "synchronisation worker copies the primary's",
            )
        ]
    if copy.temporary:
        return [
            _fail(
                f"{where}: the copy of slot {slot} is not sync-ready yet (temporary): a "
                "promotion now would lose it",
                "let the relay stream (it advances the slot past what this standby has "
                "received) and run `zapstream doctor` again",
            )
        ]
    return [
        _ok(
            f"{where}: sync_replication_slots and hot_standby_feedback on, primary_slot_name "
            f"{facts.primary_slot_name}, slot {slot} synchronised{unread}"
        )
    ]


def _conninfo_dbname(conninfo: str | None) -> str:
    if not conninfo:
        return ""
    try:
        return str(conninfo_to_dict(conninfo).get("dbname") or "")
    except psycopg.ProgrammingError:
        return ""


# --- the nodes of the DSN and their facts ----------------------------------------------------


def node_conninfos(dsn: str) -> list[tuple[str, str]]:
    """(host:port, conninfo reaching only that host with ``target_session_attrs=any``) for
    each host of a (multi-host) libpq DSN."""
    params = conninfo_to_dict(dsn)
    hosts = str(params.get("host") or "").split(",")
    ports = str(params.get("port") or "").split(",")
    if len(ports) == 1:
        ports = ports * len(hosts)
    addrs = str(params["hostaddr"]).split(",") if params.get("hostaddr") else [""] * len(hosts)
    nodes = []
    for host, port, addr in zip(hosts, ports, addrs, strict=False):
        where = f"{host or addr or 'localhost'}:{port or '5432'}"
        one = {k: v for k, v in params.items() if k not in ("host", "port", "hostaddr")}
        one |= {k: v for k, v in (("host", host), ("port", port), ("hostaddr", addr)) if v}
        one["target_session_attrs"] = "any"
        nodes.append((where, make_conninfo("", **one)))
    return nodes


_SETTINGS = (
    "synchronized_standby_slots",
    "sync_replication_slots",
    "hot_standby_feedback",
    "primary_slot_name",
    "primary_conninfo",
)
_PHYSICAL_WALSENDERS = """
    SELECT count(*) FROM pg_stat_replication r
    WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s
                      WHERE s.active_pid = r.pid AND s.slot_type = 'logical')
"""


async def read_node_facts(conn: psycopg.AsyncConnection[Any], where: str, slot: str) -> NodeFacts:
    """What :func:`node_results` decides on, read from one node."""
    cur = await conn.execute(
        "SELECT current_setting('server_version_num')::int, pg_is_in_recovery()"
    )
    version_num, in_recovery = await cur.fetchone() or (0, False)
    if version_num < FAILOVER_SLOTS_VERSION_NUM:
        return NodeFacts(where, version_num, bool(in_recovery))
    # pg_settings hides what the role may not read (primary_conninfo): no row, None.
    cur = await conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", (list(_SETTINGS),)
    )
    settings = {str(name): str(value) for name, value in await cur.fetchall()}
    cur = await conn.execute(
        "SELECT failover, synced, temporary FROM pg_replication_slots "
        "WHERE slot_name = %s AND slot_type = 'logical'",
        (slot,),
    )
    row = await cur.fetchone()
    relay_slot = None if row is None else RelaySlot(*(bool(v) for v in row))
    cur = await conn.execute(
        "SELECT slot_name, active FROM pg_replication_slots WHERE slot_type = 'physical' "
        "ORDER BY slot_name"
    )
    physical = tuple((str(name), bool(active)) for name, active in await cur.fetchall())
    cur = await conn.execute(_PHYSICAL_WALSENDERS)
    (walsenders,) = await cur.fetchone() or (0,)
    return NodeFacts(
        where,
        version_num,
        bool(in_recovery),
        relay_slot,
        synchronized_standby_slots=settings.get("synchronized_standby_slots", ""),
        physical_slots=physical,
        physical_walsenders=int(walsenders),
        sync_replication_slots=settings.get("sync_replication_slots") == "on",
        hot_standby_feedback=settings.get("hot_standby_feedback") == "on",
        primary_slot_name=settings.get("primary_slot_name", ""),
        primary_conninfo=settings.get("primary_conninfo"),
    )


async def _check_node(
    where: str, conninfo: str, relay: RelaySettings, timeout_s: float
) -> list[CheckResult]:
    try:
        conn = await asyncio.wait_for(
            psycopg.AsyncConnection.connect(
                conninfo, autocommit=True, connect_timeout=max(1, round(timeout_s))
            ),
            timeout_s,
        )
    except (psycopg.Error, OSError, TimeoutError) as exc:
        detail = error_detail(exc) if not isinstance(exc, TimeoutError) else "no answer"
        return [
            _fail(
                f"{where}: cannot connect: {detail}",
                "start that server, or remove it from ZAPSTREAM_DATABASE_URL",
            )
        ]
    async with conn:
        try:
            facts = await asyncio.wait_for(read_node_facts(conn, where, relay.slot), timeout_s)
        except TimeoutError:
            return [_fail(f"{where}: no answer within {timeout_s:g} s", "check that server")]
        except psycopg.Error as exc:
            return [_fail(f"{where}: query failed: {error_detail(exc)}", "see the PostgreSQL log")]
    return node_results(facts, slot=relay.slot, slot_failover=relay.slot_failover)


async def failover_checks(relay: RelaySettings, timeout_s: float) -> list[CheckResult]:
    """The ``failover`` lines of every host of ``ZAPSTREAM_DATABASE_URL``, in its order."""
    nodes = node_conninfos(relay.postgres.dsn)
    per_node = await asyncio.gather(
        *(_check_node(where, conninfo, relay, timeout_s) for where, conninfo in nodes)
    )
    return [result for results in per_node for result in results]
