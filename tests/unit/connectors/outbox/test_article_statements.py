"""Migration 0009 (the outbox article's UPDATEs) agrees with the state machine and the grants.

Its trigger is PL/pgSQL, so it cannot import :mod:`streams.kernel.state_machine`: the
status lists it holds are checked here against the Python ones (the behaviour itself is
tested on PostgreSQL in tests/integration/test_commands.py).
"""

from __future__ import annotations

import re
from importlib import resources

from connectors.outbox.roles import COMPONENT_ROLES
from streams.kernel.contract import JobStatus
from streams.kernel.state_machine import ALLOWED, REPROCESSABLE, SETTLED

MIGRATION = "0009_article_statements.sql"


def _sql() -> str:
    return (resources.files("connectors.outbox.migrations") / MIGRATION).read_text("utf-8")


def _array(name: str) -> set[str]:
    match = re.search(rf"{name}\b[^:]*:= ARRAY\[(.*?)\]", _sql(), re.S)
    assert match is not None, name
    return set(re.findall(r"'([A-Z_]+)'", match.group(1)))


def test_the_triggers_status_lists_are_the_state_machines() -> None:
    assert _array("v_settled") == set(SETTLED)
    # SCHEDULED (migration 0008) has its own trigger: 0009's lets a state it does not list
    # through, and 0008's refuses any status write of a SCHEDULED job but its release.
    assert _array("v_unsettled") == set(ALLOWED) - set(SETTLED) - {JobStatus.SCHEDULED}
    reprocessable = re.search(r"old_job\.status = ANY \(ARRAY\[(.*?)\]\)", _sql())
    assert reprocessable is not None
    assert set(re.findall(r"'([A-Z_]+)'", reprocessable.group(1))) == set(REPROCESSABLE)


def test_only_the_sink_may_write_state_version_which_tells_its_writes_apart() -> None:
    # The trigger takes a status write that leaves state_version alone for an
    # application's: that holds only while no other component may UPDATE it.
    writers = {
        spec.component
        for spec in COMPONENT_ROLES
        for grant in spec.grants
        if grant.privilege == "UPDATE"
        and grant.relation == "outbox_jobs"
        and (not grant.columns or "state_version" in grant.columns)
    }
    assert writers == {"sink"}
