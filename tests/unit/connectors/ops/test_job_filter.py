"""The one job filter (``jobs list``, bulk reprocess, the console) becomes SQL and parameters,
checked without a database."""

from __future__ import annotations

import datetime as dt

import pytest

from connectors.ops.actions import BULK_TARGETS, Action
from connectors.ops.job_filter import JobFilter
from connectors.ops.jobs_sql import PageOfJobs, page_query

T0 = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC)
BULK_CANCELLABLE = BULK_TARGETS[Action.CANCEL]


def _where(job_filter: JobFilter) -> tuple[str, list[object]]:
    clause, params = job_filter.where()
    return clause.as_string(None), params


def test_an_empty_filter_matches_every_job() -> None:
    assert _where(JobFilter()) == ("", [])


def test_every_field_is_a_parameter_in_order() -> None:
    clause, params = _where(
        JobFilter(
            statuses=["PENDING"],
            instance="shop-1",
            priority="marketing",
            purpose="promo",
            since=T0,
            until=T0 + dt.timedelta(hours=1),
            search="order-42",
        )
    )
    assert clause == (
        ' WHERE status = ANY(%s) AND "instance_id" = %s AND "priority" = %s AND "purpose" = %s'
        " AND created_at >= %s AND created_at < %s AND idempotency_key = %s"
    )
    assert params == [
        ["PENDING"],
        "shop-1",
        "marketing",
        "promo",
        T0,
        T0 + dt.timedelta(hours=1),
        "order-42",
    ]


def test_a_number_searches_the_id_and_the_key() -> None:
    assert _where(JobFilter(search=" 42 ")) == (
        " WHERE (id = %s OR idempotency_key = %s)",
        [42, "42"],
    )


def test_a_number_too_long_for_an_id_only_searches_keys() -> None:
    digits = "9" * 25
    assert _where(JobFilter(search=digits)) == (" WHERE idempotency_key = %s", [digits])


def test_a_value_never_lands_in_the_sql_text() -> None:
    clause, params = _where(JobFilter(instance="x'; DROP TABLE outbox_jobs; --"))
    assert "DROP" not in clause and params == ["x'; DROP TABLE outbox_jobs; --"]


def test_the_page_query_is_one_statement_with_the_filter_twice_then_limit_and_offset() -> None:
    query, params = page_query(JobFilter(instance="shop-1"), page=3, page_size=20)
    text = query.as_string(None)
    assert text.count("SELECT") == 3  # outer, count, page: one round trip
    assert text.count('"instance_id" = %s') == 2
    assert "LIMIT %s OFFSET %s" in text and "count(*)" in text
    assert params == ["shop-1", "shop-1", 20, 40]


def test_the_first_page_has_no_offset() -> None:
    _, params = page_query(JobFilter(), page=1, page_size=50)
    assert params == [50, 0]


@pytest.mark.parametrize(("page", "size"), [(0, 50), (1, 0), (-1, 10)])
def test_a_page_or_size_below_one_is_refused(page: int, size: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        page_query(JobFilter(), page=page, page_size=size)


@pytest.mark.parametrize(("total", "size", "pages"), [(0, 50, 1), (50, 50, 1), (51, 50, 2)])
def test_pages_round_up_and_an_empty_result_is_one_page(total: int, size: int, pages: int) -> None:
    assert PageOfJobs(jobs=[], total=total, page=1, page_size=size).pages == pages


def test_a_bulk_action_keeps_only_the_states_it_may_act_on() -> None:
    narrowed = JobFilter(statuses=["PENDING", "ACCEPTED"], instance="i").with_statuses(
        BULK_CANCELLABLE
    )
    assert list(narrowed.statuses) == ["PENDING"] and narrowed.instance == "i"
    assert sorted(JobFilter().with_statuses(BULK_CANCELLABLE).statuses) == [
        "PENDING",
        "RETRY_WAIT",
        "SCHEDULED",
    ]


def test_a_bulk_action_on_states_it_may_not_act_on_matches_nothing() -> None:
    narrowed = JobFilter(statuses=["ACCEPTED"]).with_statuses(BULK_CANCELLABLE)
    assert list(narrowed.statuses) == ["-none-"]


def test_the_cli_filter_builds_its_where_clause() -> None:
    # `jobs list` and a bulk `jobs reprocess` pass statuses, instance, since, until in order.
    where, params = JobFilter(["DEAD"], "shop", T0, None).where()
    assert "status = ANY" in repr(where) and "instance_id" in repr(where)
    assert params == [["DEAD"], "shop", T0]
    assert JobFilter().where()[1] == []
