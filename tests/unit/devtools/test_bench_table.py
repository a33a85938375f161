"""``make bench``'s table: one column per broker, figures paired across brokers."""

from __future__ import annotations

from devtools.bench.librdkafka import librdkafka_figures
from devtools.bench.runner import Sizes, reduced, render, side_by_side
from devtools.bench.support import Figure


def _relay(rows: int, value: str, comparison: str, passed: bool) -> Figure:
    return Figure(
        "relay",
        f"relay rows/s, {rows:,} pre-filled rows until slot confirmed",
        value,
        comparison,
        ">= 60,000",
        passed,
    )


def test_figures_pair_across_brokers_although_their_sizes_differ() -> None:
    kafka = [_relay(200_000, "57,000", "pg_recvlogical 180,000", False)]
    tansu = [_relay(100_000, "61,000", "pg_recvlogical 175,000", True)]

    rows = side_by_side({"kafka": kafka, "tansu": tansu})

    assert rows == [{"kafka": kafka[0], "tansu": tansu[0]}]
    table = render({"kafka": kafka, "tansu": tansu}).splitlines()
    header, _rule, first, second = table
    assert header.startswith("section | figure")
    assert "Apache Kafka" in header and "Tansu" in header
    assert header.index("Apache Kafka") < header.index("Tansu")
    cells = [c.strip() for c in first.split("|")]
    assert cells[:7] == [
        "relay",
        "relay rows/s, 200,000 pre-filled rows until slot confirmed",
        ">= 60,000",
        "57,000",
        "MISS",
        "61,000",
        "PASS",
    ]
    assert cells[7] == "Kafka: pg_recvlogical 180,000"
    # The other broker's comparison on a line of its own, saying what that run was.
    assert second.split("|")[-1].strip() == (
        "Tansu (ran: relay rows/s, 100,000 pre-filled rows until slot confirmed): "
        "pg_recvlogical 175,000"
    )
    assert not second.split("|")[1].strip()


def test_one_comparison_when_both_runs_say_the_same() -> None:
    kafka = [Figure("worker", "worker RSS after 20,000 jobs", "120 MiB", "", "<= 300 MB", True)]
    tansu = [Figure("worker", "worker RSS after 20,000 jobs", "118 MiB", "", "<= 300 MB", True)]

    lines = render({"kafka": kafka, "tansu": tansu}).splitlines()

    assert len(lines) == 3  # header, rule, one row
    assert "120 MiB" in lines[2] and "118 MiB" in lines[2]


def test_a_figure_one_broker_lacks_shows_a_dash_in_its_place() -> None:
    common = Figure("relay", "relay CPU per row", "14 us")
    only_kafka = Figure("relay", "worker RSS after 100,000 jobs (dedup horizon 20 s)", "160 MiB")
    extra = Figure("relay", "transactional relay rows/s", "40,000")
    kafka = [common, only_kafka]
    tansu = [common, extra]

    rows = side_by_side({"kafka": kafka, "tansu": tansu})

    # Tansu's extra figure comes right after the row before it on Tansu.
    assert rows == [
        {"kafka": common, "tansu": common},
        {"tansu": extra},
        {"kafka": only_kafka},
    ]
    lines = render({"kafka": kafka, "tansu": tansu}).splitlines()
    cells = [c.strip() for c in lines[3].split("|")]
    assert cells[3:7] == ["-", "", "40,000", ""]


def test_figures_with_the_same_text_but_numbers_pair_in_order() -> None:
    def scaling(n: int, value: str) -> Figure:
        return Figure("scaling", f"{n} workers, gateway 0 ms, 20,000 intents", value)

    kafka = [scaling(1, "k1"), scaling(2, "k2")]
    tansu = [scaling(1, "t1"), scaling(2, "t2")]

    rows = side_by_side({"kafka": kafka, "tansu": tansu})

    assert [(r["kafka"].value, r["tansu"].value) for r in rows] == [("k1", "t1"), ("k2", "t2")]


def test_sections_stay_together_when_a_later_broker_has_more() -> None:
    kafka = [Figure("relay", "relay CPU per row", "14 us"), Figure("e2e", "p99", "1")]
    tansu = [Figure("relay", "relay peak RSS (VmHWM)", "60 MiB"), Figure("e2e", "p99", "2")]

    rows = side_by_side({"kafka": kafka, "tansu": tansu})

    assert [next(iter(r.values())).what for r in rows] == [
        "relay CPU per row",
        "relay peak RSS (VmHWM)",
        "p99",
    ]


def test_reduced_sizes_halve_the_relay_and_skip_the_memory_run() -> None:
    full = Sizes(
        relay_rows=200_000,
        relay_latency_s=20.0,
        rate=500.0,
        worker_messages=20_000,
        memory_jobs=100_000,
        fifty=True,
        baseline=True,
        e2e_seconds=30.0,
    )

    second = reduced(full)

    assert (second.relay_rows, second.relay_latency_s, second.memory_jobs) == (100_000, 10.0, 0)
    assert (second.worker_messages, second.e2e_seconds, second.rate) == (20_000, 30.0, 500.0)
    assert "no memory run" in second.describe(["worker"])


def test_each_relay_variant_gets_its_fraction_of_librdkafka() -> None:
    lib = {
        "rows": 200_000,
        "rows_s": 100_000.0,
        "idempotence": True,
        "confluent_kafka": "2.16.1",
        "librdkafka": "2.16.0",
        "load_s": 3.0,
        "value_bytes_mean": 440.0,
        "cpu_us_row": 6.0,
    }

    figures = librdkafka_figures(lib, {"relay": 57_000.0, "transactional relay": 40_000.0})

    assert [f.what for f in figures] == [
        "librdkafka producer rows/s, the same 200,000 rows (acks=all, idempotent)",
        "relay / librdkafka producer",
        "transactional relay / librdkafka producer",
    ]
    assert [f.value for f in figures[1:]] == ["0.57", "0.40"]
