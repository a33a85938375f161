"""`zapstream doctor`'s failover line on a real PostgreSQL 18 primary and streaming standby.

One primary (the outbox migrated, the relay's slot created with ``failover`` as the relay
does on 17+) and one standby cloned with ``pg_basebackup`` (:mod:`devtools.stack.postgres_standby`),
shared by the module; each test sets the settings it needs with ALTER SYSTEM and a reload
(none is passed on the command line, which would win over ALTER SYSTEM). The doctor runs as
the operator runs it, ``python -m connectors.cli doctor``; Kafka and the gateway point at
closed ports (their lines FAIL, and are not what these tests read).

Needs PostgreSQL 17+ (``DEVSTACK_POSTGRES=18``, phase 3 of ``make test``); on older
servers the module is skipped with the reason.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest

from connectors.cdc.provisioning import COMMANDS_TABLE, OUTBOX_TABLE
from connectors.cdc.settings import RelaySettings
from connectors.outbox.migrate import migrate
from devtools.stack.devstack import PostgresCluster, find_free_port
from devtools.stack.postgres_binaries import postgres_bin_dir, postgres_major
from devtools.stack.postgres_standby import PHYSICAL_SLOT, StandbyCluster, failover_dsn
from tests.integration.support import wait_until, zapstream

pytestmark = pytest.mark.integration

DB = "doctor_failover"
SLOT = "doctor_failover_slot"
PUBLICATION = RelaySettings.model_fields["publication"].default
PG_CHECKS = ("postgres", "wal_level", "migrations", "publication", "slot", "role", "failover")


@dataclass
class Nodes:
    primary: PostgresCluster
    standby: StandbyCluster


@pytest.fixture(scope="module")
def nodes() -> Iterator[Nodes]:
    major = postgres_major(postgres_bin_dir())
    if major < 17:
        pytest.skip(
            f"failover slots need PostgreSQL 17+, this run has {major} "
            "(make test runs this module on 18: DEVSTACK_POSTGRES=18)"
        )
    with PostgresCluster() as primary:
        dsn = primary.create_database(DB)
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            # As `zapstream db migrate` and the relay create them (failover => true on 17+).
            conn.execute(
                f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {OUTBOX_TABLE}, {COMMANDS_TABLE} "
                "WITH (publish = 'insert')"
            )
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)",
                (SLOT,),
            )
        with StandbyCluster(primary, dbname=DB, settings={"hot_standby_feedback": "on"}) as standby:
            yield Nodes(primary, standby)


def _set(cluster: PostgresCluster, name: str, value: str | None) -> None:
    """ALTER SYSTEM SET (or RESET) and reload; wait until new sessions see it."""
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        if value is None:
            conn.execute(f"ALTER SYSTEM RESET {name}")
        else:
            conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")

    def shown() -> str:
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            row = conn.execute(f"SHOW {name}").fetchone()
            return str(row[0]) if row else ""

    wait_until(lambda: shown() == (value or ""), 10, f"{name} = {value!r} after a reload")


def _doctor(dsn: str) -> tuple[int, list[str]]:
    """Run the CLI; return its exit code and its PostgreSQL lines."""
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("ZAPSTREAM_")}
    env |= {
        "ZAPSTREAM_DATABASE_URL": dsn,
        "ZAPSTREAM_RELAY_SLOT": SLOT,
        "ZAPSTREAM_KAFKA_BROKERS": f"127.0.0.1:{find_free_port()}",
        "ZAPSTREAM_GATEWAY": "stackzap",
        "STACKZAP_API_URL": f"http://127.0.0.1:{find_free_port()}",
        "STACKZAP_API_KEY": "doctor-failover",
    }
    code, out, _ = zapstream(["doctor", "--timeout-s", "3"], env)
    return code, [line for line in out.splitlines() if line[5:].split(":")[0] in PG_CHECKS]


def _slot_on(standby: StandbyCluster) -> tuple[bool, bool] | None:
    """(synced, temporary) of the relay's slot on the standby, None while it is not there."""
    with psycopg.connect(standby.dsn(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced, temporary FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone()
    return None if row is None else (bool(row[0]), bool(row[1]))


def _configure(nodes: Nodes, *, standby_slots: str | None, sync: bool) -> None:
    _set(nodes.primary, "synchronized_standby_slots", standby_slots)
    _set(nodes.standby, "sync_replication_slots", "on" if sync else "off")


def test_a_standby_without_sync_replication_slots_fails_one_line_naming_it(
    nodes: Nodes,
) -> None:
    _configure(nodes, standby_slots=PHYSICAL_SLOT, sync=False)
    code, lines = _doctor(nodes.standby.dsn(DB))
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 1
    assert len(failed) == 1, lines
    assert failed[0].startswith(f"FAIL failover: 127.0.0.1:{nodes.standby.port} (standby): ")
    assert "sync_replication_slots is off" in failed[0]
    assert "-> ALTER SYSTEM SET sync_replication_slots = on" in failed[0]
    # The standby's other lines are not misleading FAILs: the slot is the failover line's.
    assert any(line.startswith("SKIP slot: ") for line in lines), lines


def test_both_nodes_pass_once_configured_and_the_slot_synchronised(nodes: Nodes) -> None:
    _configure(nodes, standby_slots=PHYSICAL_SLOT, sync=True)
    # The slot predates the standby's base backup: its copy stays temporary (PostgreSQL
    # will not sync a slot needing WAL the standby lacks) until the slot advances, which
    # the relay does by streaming. The doctor says so.
    wait_until(lambda: _slot_on(nodes.standby) is not None, 30, f"{SLOT} copied as temporary")
    assert _slot_on(nodes.standby) == (True, True)
    _, lines = _doctor(nodes.standby.dsn(DB))
    [failed] = [line for line in lines if line.startswith("FAIL")]
    assert f"the copy of slot {SLOT} is not sync-ready yet (temporary)" in failed

    def advanced_and_synced() -> bool:
        with psycopg.connect(nodes.primary.dsn(DB), autocommit=True) as conn:
            conn.execute("SELECT pg_log_standby_snapshot()")
            conn.execute("SELECT pg_replication_slot_advance(%s, pg_current_wal_lsn())", (SLOT,))
        return _slot_on(nodes.standby) == (True, False)

    wait_until(advanced_and_synced, 30, f"{SLOT} synchronised to the standby")
    code, lines = _doctor(failover_dsn(DB, nodes.primary, nodes.standby))
    failover = [line for line in lines if line.split()[1] == "failover:"]
    assert failover == [
        f"OK   failover: 127.0.0.1:{nodes.primary.port} (primary): slot {SLOT} has failover on; "
        f"synchronized_standby_slots = {PHYSICAL_SLOT} names every streaming standby's slot",
        f"OK   failover: 127.0.0.1:{nodes.standby.port} (standby): sync_replication_slots and "
        f"hot_standby_feedback on, primary_slot_name {PHYSICAL_SLOT}, slot {SLOT} synchronised",
    ]
    assert not [line for line in lines if line.startswith("FAIL")], lines


def test_a_primary_without_synchronized_standby_slots_names_it(nodes: Nodes) -> None:
    _configure(nodes, standby_slots=None, sync=True)
    code, lines = _doctor(nodes.primary.dsn(DB))
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 1
    assert len(failed) == 1, lines
    assert f"synchronized_standby_slots does not name {PHYSICAL_SLOT}" in failed[0]
    assert f"-> ALTER SYSTEM SET synchronized_standby_slots = '{PHYSICAL_SLOT}'" in failed[0]


def test_an_unreachable_host_is_one_line_with_host_and_port_only(nodes: Nodes) -> None:
    _configure(nodes, standby_slots=PHYSICAL_SLOT, sync=True)
    gone = find_free_port()
    dsn = (
        f"postgresql://postgres:s3cret@127.0.0.1:{nodes.primary.port},127.0.0.1:{gone}/{DB}"
        "?target_session_attrs=read-write"
    )
    started = time.monotonic()
    code, lines = _doctor(dsn)
    print(f"doctor took {time.monotonic() - started:.1f} s")
    failed = [line for line in lines if line.startswith("FAIL")]
    assert code == 1
    assert len(failed) == 1, lines
    assert failed[0].startswith(f"FAIL failover: 127.0.0.1:{gone}: cannot connect")
    assert "cannot connect" in failed[0] and "s3cret" not in "\n".join(lines)
