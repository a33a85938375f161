"""The failover check's decisions: one node's facts in, the doctor's lines out; DSN splitting."""

from __future__ import annotations

import dataclasses

from connectors.ops.check_result import Status
from connectors.ops.failover_checks import (
    NodeFacts,
    RelaySlot,
    listed_slots,
    node_conninfos,
    node_results,
)

SLOT = "zapstream_outbox"
SYNCED = RelaySlot(failover=True, synced=True, temporary=False)
PRIMARY = NodeFacts(
    "db1:5432",
    180001,
    in_recovery=False,
    relay_slot=RelaySlot(failover=True, synced=False, temporary=False),
    synchronized_standby_slots="standby_a",
    physical_slots=(("standby_a", True),),
    physical_walsenders=1,
)
STANDBY = NodeFacts(
    "db2:5432",
    180001,
    in_recovery=True,
    relay_slot=SYNCED,
    sync_replication_slots=True,
    hot_standby_feedback=True,
    primary_slot_name="standby_a",
    primary_conninfo="host=db1 user=replicator dbname=app",
)


def lines(facts: NodeFacts, *, slot_failover: bool = True) -> list[str]:
    return [r.line() for r in node_results(facts, slot=SLOT, slot_failover=slot_failover)]


def test_a_configured_primary_and_standby_are_one_ok_line_each() -> None:
    assert lines(PRIMARY) == [
        "OK   failover: db1:5432 (primary): slot zapstream_outbox has failover on; "
        "synchronized_standby_slots = standby_a names every streaming standby's slot"
    ]
    assert lines(STANDBY) == [
        "OK   failover: db2:5432 (standby): sync_replication_slots and hot_standby_feedback on, "
        "primary_slot_name standby_a, slot zapstream_outbox synchronised"
    ]


def test_a_standby_missing_sync_replication_slots_is_exactly_one_line_naming_it() -> None:
    # Its copy of the slot is gone too (nothing syncs it): that is the same cause, not a
    # second line.
    facts = dataclasses.replace(STANDBY, sync_replication_slots=False, relay_slot=None)
    assert lines(facts) == [
        "FAIL failover: db2:5432 (standby): sync_replication_slots is off, so the relay's slot "
        "zapstream_outbox is not copied here and a promotion of this standby loses it -> "
        "ALTER SYSTEM SET sync_replication_slots = on; SELECT pg_reload_conf() (on the standby)"
    ]


def test_each_missing_standby_setting_is_a_line_of_its_own() -> None:
    facts = dataclasses.replace(
        STANDBY,
        hot_standby_feedback=False,
        primary_slot_name="",
        primary_conninfo="host=db1 user=replicator",
        relay_slot=None,
    )
    found = lines(facts)
    assert [line.split(": ")[2].split()[0] for line in found] == [
        "hot_standby_feedback",
        "primary_slot_name",
        "primary_conninfo",
    ]
    assert all(line.startswith("FAIL failover: db2:5432 (standby): ") for line in found)
    assert "add dbname=<the outbox's database> to primary_conninfo" in found[2]


def test_an_unreadable_primary_conninfo_is_said_not_failed() -> None:
    [result] = node_results(
        dataclasses.replace(STANDBY, primary_conninfo=None), slot=SLOT, slot_failover=True
    )
    assert result.status is Status.OK
    assert "primary_conninfo unreadable for this role" in result.detail


def test_the_copy_of_the_slot_on_a_standby() -> None:
    [missing] = lines(dataclasses.replace(STANDBY, relay_slot=None))
    assert "the relay's slot zapstream_outbox is not synchronised here yet" in missing
    assert "restart `zapstream relay`" in missing
    own = RelaySlot(failover=False, synced=False, temporary=False)
    [local] = lines(dataclasses.replace(STANDBY, relay_slot=own))
    assert "synced = false" in local and "pg_drop_replication_slot('zapstream_outbox')" in local
    early = RelaySlot(failover=True, synced=True, temporary=True)
    [temporary] = lines(dataclasses.replace(STANDBY, relay_slot=early))
    assert "not sync-ready yet (temporary)" in temporary


def test_a_slot_without_failover_names_the_setting_and_the_restart() -> None:
    off = RelaySlot(failover=False, synced=False, temporary=False)
    [line] = lines(dataclasses.replace(PRIMARY, relay_slot=off))
    assert line.startswith("FAIL failover: db1:5432 (primary): slot zapstream_outbox has failover")
    assert "restart `zapstream relay`" in line and "ZAPSTREAM_RELAY_SLOT_FAILOVER=true" in line


def test_a_streaming_standby_missing_from_synchronized_standby_slots() -> None:
    facts = dataclasses.replace(
        PRIMARY,
        synchronized_standby_slots="standby_a",
        physical_slots=(("standby_a", True), ("standby_b", True), ("old", False)),
        physical_walsenders=2,
    )
    [line] = lines(facts)
    assert "synchronized_standby_slots does not name standby_b" in line
    assert line.endswith(
        "-> ALTER SYSTEM SET synchronized_standby_slots = 'standby_a, standby_b'; "
        "SELECT pg_reload_conf()"
    )


def test_synchronized_standby_slots_naming_no_slot_stalls_decoding() -> None:
    facts = dataclasses.replace(PRIMARY, synchronized_standby_slots='standby_a, "gone"')
    [line] = lines(facts)
    assert "synchronized_standby_slots names gone, which is no physical slot here" in line


def test_a_standby_streaming_without_a_physical_slot() -> None:
    [line] = lines(dataclasses.replace(PRIMARY, physical_walsenders=2))
    assert "1 standby connection(s) stream without a physical slot" in line
    assert "primary_slot_name" in line


def test_a_primary_without_standby_is_a_skip() -> None:
    facts = dataclasses.replace(
        PRIMARY, synchronized_standby_slots="", physical_slots=(), physical_walsenders=0
    )
    [result] = node_results(facts, slot=SLOT, slot_failover=True)
    assert result.status is Status.SKIP
    assert "no standby streams from it" in result.detail


def test_before_17_and_with_failover_off_one_skip_line_says_the_relay_restreams() -> None:
    for facts, setting in (
        (NodeFacts("db1:5432", 160004, in_recovery=False), True),
        (NodeFacts("db2:5432", 150014, in_recovery=True), True),
        (PRIMARY, False),
    ):
        [result] = node_results(facts, slot=SLOT, slot_failover=setting)
        assert result.status is Status.SKIP
        assert "the relay" in result.detail and "restreams the PENDING jobs itself" in result.detail
    [old] = lines(NodeFacts("db1:5432", 160004, in_recovery=False))
    assert "PostgreSQL 16" in old and "failover slots need 17+" in old


def test_listed_slots_reads_the_settings_list() -> None:
    assert listed_slots("") == []
    assert listed_slots(' a ,"b",c') == ["a", "b", "c"]


def test_a_multi_host_dsn_is_split_into_one_conninfo_per_host() -> None:
    nodes = node_conninfos(
        "postgresql://relay:s3cret@db1:5432,db2:5433/app?target_session_attrs=read-write"
    )
    assert [where for where, _ in nodes] == ["db1:5432", "db2:5433"]
    for (_, conninfo), (host, port) in zip(nodes, [("db1", "5432"), ("db2", "5433")], strict=True):
        assert f"host={host} " in conninfo + " " and f"port={port}" in conninfo
        assert "target_session_attrs=any" in conninfo and "dbname=app" in conninfo
    # One port for every host (libpq's rule), a default port, and a single host.
    assert [w for w, _ in node_conninfos("host=a,b port=6432")] == ["a:6432", "b:6432"]
    assert [w for w, _ in node_conninfos("postgresql://u@a,b:6432/app")] == ["a:5432", "b:6432"]
    assert [w for w, _ in node_conninfos("postgresql://u@a/app")] == ["a:5432"]
