"""role_problems: what a role holds beyond, or lacks of, its component's needs (pure)."""

from __future__ import annotations

import dataclasses

from connectors.ops.privileges import Privilege, RoleFacts, needed, role_problems
from connectors.outbox.roles import component_role

COLUMNS = {
    "outbox_jobs": (
        "id", "instance_id", "payload", "status", "attempts", "max_attempts", "next_retry_at",
        "last_error", "idempotency_key", "created_at", "sent_at", "conversation_key",
        "priority", "purpose", "expires_at", "gateway_job_id", "state_version", "updated_at",
    ),
    "schema_migrations": ("version", "name", "checksum", "applied_at"),
}  # fmt: skip


def facts(component: str, **changes: object) -> RoleFacts:
    """A role holding exactly what ``component`` needs, then ``changes``."""
    base = RoleFacts(
        user="zs_x",
        superuser=False,
        replication=component_role(component).replication,
        createrole=False,
        createdb=False,
        bypassrls=False,
        owns=(),
        schema_create=False,
        groups=(f"zapstream_{component}",),
        columns=COLUMNS,
        held=needed(component_role(component), COLUMNS),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def lines(f: RoleFacts, component: str) -> list[str]:
    return [f"{p.detail} -> {p.remedy}" for p in role_problems(f, component)]


def test_exactly_what_the_component_needs_is_no_problem() -> None:
    for component in ("relay", "webhook", "sink", "console", "app", "prune", "operator"):
        assert lines(facts(component), component) == [], component


def test_a_superuser_is_one_line_naming_the_group_role() -> None:
    found = lines(facts("webhook", superuser=True), "webhook")
    assert found == [
        "zs_x is a SUPERUSER; the webhook needs only zapstream_webhook -> connect as a login "
        "role without SUPERUSER: CREATE ROLE <name> LOGIN IN ROLE zapstream_webhook"
    ]


def test_replication_outside_the_relay_and_missing_on_the_relay() -> None:
    assert lines(facts("console", replication=True), "console") == [
        "zs_x has REPLICATION, which only the relay needs -> ALTER ROLE zs_x NOREPLICATION"
    ]
    (missing,) = lines(facts("relay", replication=False), "relay")
    assert missing.startswith("zs_x lacks REPLICATION") and "ALTER ROLE zs_x REPLICATION" in missing


def test_an_owner_is_told_ownership_belongs_to_migrate() -> None:
    (found,) = lines(facts("sink", owns=("schema public", "outbox_jobs")), "sink")
    assert "owns schema public, outbox_jobs" in found
    assert "CREATE ROLE <name> LOGIN IN ROLE zapstream_sink" in found


def test_a_write_the_component_never_does_names_the_revoke() -> None:
    extra: set[Privilege] = {("outbox_jobs", "UPDATE", c) for c in COLUMNS["outbox_jobs"]}
    held = facts("webhook").held | extra
    assert lines(facts("webhook", held=frozenset(held)), "webhook") == [
        "zs_x may UPDATE on outbox_jobs, a write the webhook never does -> REVOKE UPDATE ON "
        "outbox_jobs FROM zs_x (or from the role or PUBLIC it holds it through)"
    ]


def test_reading_the_payload_is_too_much_for_the_webhook_column_by_column() -> None:
    held = facts("webhook").held | {("outbox_jobs", "SELECT", "payload")}
    (found,) = lines(facts("webhook", held=frozenset(held)), "webhook")
    assert found.startswith("zs_x may SELECT (payload) on outbox_jobs, a read the webhook never")


def test_a_missing_column_names_the_grant() -> None:
    held = facts("webhook").held - {("outbox_jobs", "SELECT", "gateway_job_id")}
    assert lines(facts("webhook", held=frozenset(held)), "webhook") == [
        "zs_x may not SELECT (gateway_job_id) on outbox_jobs, which the webhook needs -> run "
        "`zapstream db migrate` (it grants zapstream_webhook) and GRANT zapstream_webhook TO zs_x"
    ]


def test_other_attributes_and_schema_create_are_reported() -> None:
    found = lines(facts("worker", createrole=True, createdb=True, schema_create=True), "worker")
    assert [f.split(" -> ")[1] for f in found] == [
        "ALTER ROLE zs_x NOCREATEROLE",
        "ALTER ROLE zs_x NOCREATEDB",
        "REVOKE CREATE ON SCHEMA <schema> FROM PUBLIC (and from the role granting it)",
    ]
