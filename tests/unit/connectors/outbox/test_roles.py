"""The group roles' definition and the SQL a DBA is given (no database: the integration
test tests/integration/test_database_roles.py runs it on PostgreSQL)."""

from __future__ import annotations

import re

import pytest

from connectors.outbox.roles import (
    COMPONENT_ROLES,
    COMPONENTS,
    FUNCTIONS,
    RELEASE_FUNCTION,
    SEQUENCES,
    TABLES,
    component_role,
    grant_sql,
    roles_sql,
)


def test_one_nologin_group_role_per_component_and_only_the_relay_replicates() -> None:
    assert COMPONENTS == (
        "relay", "worker", "sink", "webhook", "console", "operator", "app", "prune",
    )  # fmt: skip
    script = roles_sql()
    for spec in COMPONENT_ROLES:
        assert f"CREATE ROLE {spec.role} NOLOGIN;" in script
        assert "LOGIN " not in create_lines(script, spec.role)
    assert [s.component for s in COMPONENT_ROLES if s.replication] == ["relay"]
    assert "LOGIN REPLICATION IN ROLE zapstream_relay" in script
    assert script.startswith("--") and "BEGIN;" in script and script.rstrip().endswith("COMMIT;")


def create_lines(script: str, role: str) -> str:
    return "\n".join(line for line in script.splitlines() if f"CREATE ROLE {role}" in line)


def test_each_apply_resets_the_roles_privileges_before_granting() -> None:
    statements = grant_sql(component_role("webhook"))
    revoke = statements.index(f"REVOKE ALL ON {', '.join(TABLES)} FROM zapstream_webhook;")
    grants = [i for i, s in enumerate(statements) if s.startswith("GRANT SELECT")]
    assert grants and min(grants) > revoke


def test_the_webhook_reads_five_columns_of_outbox_jobs_and_writes_nothing() -> None:
    statements = [s for s in grant_sql(component_role("webhook")) if s.startswith("GRANT ")]
    table_grants = [s for s in statements if " ON outbox_jobs " in s]
    assert table_grants == [
        "GRANT SELECT (id, idempotency_key, instance_id, conversation_key, gateway_job_id) "
        "ON outbox_jobs TO zapstream_webhook;"
    ]
    assert not any(re.match(r"GRANT (INSERT|UPDATE|DELETE)", s) for s in statements)


@pytest.mark.parametrize("component", ["relay", "worker", "sink", "webhook", "prune"])
def test_components_that_never_show_a_message_cannot_select_the_whole_job(
    component: str,
) -> None:
    for grant in component_role(component).grants:
        if grant.relation == "outbox_jobs" and grant.privilege == "SELECT":
            assert grant.columns, component
            assert component == "prune" or "payload" not in grant.columns, component


def test_every_grant_names_a_known_relation_and_inserts_draw_their_own_sequence() -> None:
    for spec in COMPONENT_ROLES:
        for grant in spec.grants:
            assert grant.relation in (*TABLES, *FUNCTIONS), (spec.component, grant)
            if grant.privilege == "INSERT":
                assert f"{grant.relation}_id_seq" in spec.sequences, (spec.component, grant)
        assert set(spec.sequences) <= set(SEQUENCES), spec.component
        writes = {g for g in spec.grants if g.privilege != "SELECT"}
        if spec.component in ("relay", "worker", "webhook"):
            # The relay's exceptions: SECURITY DEFINER functions (its scheduled release,
            # its slot's record and the restream of a slot gap).
            relay_functions = {("EXECUTE", f) for f in FUNCTIONS}
            assert {(g.privilege, g.relation) for g in writes} <= relay_functions, spec.component
            assert ("EXECUTE", RELEASE_FUNCTION) in relay_functions
            assert spec.component == "relay" or not writes, spec.component


def test_an_unknown_component_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="relay, worker"):
        component_role("lag-monitor")
