"""The generated references in ``docs/reference/`` match the code, and say what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devtools.docs import reference_docs
from devtools.docs.reference_docs import COMMAND, OUT_DIR, REFERENCES


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    """Each reference rendered once for the tests that only read it."""
    return {name: render() for name, render in REFERENCES.items()}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_committed_reference_is_fresh(name: str, rendered: dict[str, str]) -> None:
    path = OUT_DIR / name
    assert path.exists(), f"{path} is missing: run {COMMAND}"
    assert path.read_text(encoding="utf-8") == rendered[name], (
        f"docs/reference/{name} is stale: run {COMMAND} and commit the result"
    )


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_each_file_says_how_to_regenerate_it_and_nothing_of_this_machine(
    name: str, rendered: dict[str, str]
) -> None:
    text = rendered[name]
    assert COMMAND in text.splitlines()[2]
    assert str(reference_docs.ROOT) not in text
    assert REFERENCES[name]() == text  # deterministic


def test_check_names_a_stale_file_and_writing_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    references = {"a.md": lambda: "a\n", "b.md": lambda: "b\n"}
    monkeypatch.setattr(reference_docs, "REFERENCES", references)
    assert reference_docs.main(["--check", "--out", str(tmp_path)]) == 1  # missing
    assert reference_docs.main(["--out", str(tmp_path)]) == 0
    assert (tmp_path / "b.md").read_text(encoding="utf-8") == "b\n"
    assert reference_docs.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "b.md").write_text("# hand-edited\n", encoding="utf-8")
    capsys.readouterr()
    assert reference_docs.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"b.md is stale: run {COMMAND}" in err and "a.md" not in err


def test_settings_name_every_variable_some_setting_reads(rendered: dict[str, str]) -> None:
    from pydantic_settings import BaseSettings

    from connectors.startup import NOT_SETTINGS, env_names, settings_classes

    text = rendered["settings.md"]
    for cls in settings_classes():
        for field_name, field in cls.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
                continue  # a nested block: documented in its own section
            assert f"`{env_names(cls, field_name)[0]}`" in text
    assert all(name in text for name in NOT_SETTINGS)


def test_settings_show_types_bounds_defaults_and_docstrings(rendered: dict[str, str]) -> None:
    text = rendered["settings.md"]
    row = next(line for line in text.splitlines() if "`ZAPSTREAM_KAFKA_PARTITIONS`" in line)
    assert row.startswith("| `ZAPSTREAM_KAFKA_PARTITIONS` | int, >= 1 | `12` | Partitions of")
    gateway = next(line for line in text.splitlines() if line.startswith("| `ZAPSTREAM_GATEWAY` "))
    assert "one of `stackzap`, `zapapi`, `meta`" in gateway
    assert "`STACKZAP_API_KEY`" in text  # an alias without our prefix, as users set it


def test_settings_never_show_a_secrets_default(rendered: dict[str, str]) -> None:
    from streams.kernel.settings import PostgresSettings

    text = rendered["settings.md"]
    default_url = PostgresSettings.model_fields["url"].default.get_secret_value()
    assert default_url not in text
    secret_rows = [
        line for line in text.splitlines() if re.match(r"\| `[A-Z_]+` \| secret \|", line)
    ]
    assert len(secret_rows) >= 8
    assert all("| secret, not shown |" in line for line in secret_rows)


def test_cli_lists_every_command_and_option(rendered: dict[str, str]) -> None:
    text = rendered["cli.md"]
    for command in ("relay", "jobs reprocess", "db migrate", "console"):
        assert f"## `zapstream {command}`" in text
    assert "| `--older-than OLDER_THAN` | only jobs created before now minus this" in text
    assert "| `--batch BATCH` | jobs per transaction; default `5000` |" in text


def test_metrics_list_name_type_labels_and_who_exposes_them(rendered: dict[str, str]) -> None:
    text = rendered["metrics.md"]
    lines = text.splitlines()

    def row(name: str) -> str:
        return next(line for line in lines if line.startswith(f"| `{name}` |"))

    assert row("zapstream_relay_acked_total").startswith(
        "| `zapstream_relay_acked_total` | counter | — | relay | Records Kafka acknowledged"
    )
    assert "| histogram | `instance`, `priority` | worker |" in row(
        "zapstream_commit_to_gateway_seconds"
    )
    assert "| gauge | `group` | worker, lag-monitor |" in row("kafka_consumergroup_group_max_lag")
    assert "| sink |" in row("zapstream_sink_batches_total")


@pytest.mark.parametrize(
    "module",
    [
        "connectors.cdc.metrics",
        "connectors.sink.metrics",
        "streams.metrics",
        "streams.lag_monitor",
        "streams.kernel.kafka_outage",
    ],
)
def test_metrics_read_from_the_source_are_the_collectors_python_builds(module: str) -> None:
    """The generator reads collectors from the source; what it reads is what importing
    the module registers (name with ``_total``, type, help, labels), no more, no less."""
    import importlib

    from prometheus_client.metrics import MetricWrapperBase

    read = {
        (e.name, e.kind, e.help, e.labels)
        for e in reference_docs.collect_metrics()
        if e.module == module
    }
    live = set()
    for value in vars(importlib.import_module(module)).values():
        if isinstance(value, MetricWrapperBase):
            kind = value._type
            name = value._name + ("_total" if kind == "counter" else "")
            live.add((name, kind, value._documentation, tuple(value._labelnames)))
    assert read == live
    assert live


def test_metrics_refuse_a_collector_whose_name_is_not_a_literal(tmp_path: Path) -> None:
    import ast

    call = ast.parse('Counter(PREFIX + "_x", "help")').body[0].value  # type: ignore[attr-defined]
    with pytest.raises(LookupError, match="must be literals"):
        reference_docs._metric_entry(call, "counter", "streams.example")


def test_topics_list_configs_keys_and_record_fields(rendered: dict[str, str]) -> None:
    text = rendered["topics.md"]
    assert (
        "| `zapstream.state` | N | `cleanup.policy=compact`, `min.compaction.lag.ms=3600000` | "
        "[`job_state_key`](#job_state_key) | [StatusChanged](#statuschanged) |"
    ) in text
    assert "| `zapstream.controls` | 1 | `cleanup.policy=compact` |" in text
    assert "- `zapstream-lsn` (HEADER_LSN)" in text
    assert "| `command` | `str` | required | `cancel` or `reprocess` (`Command`). |" in text
    assert "| `gateway_job_id` | `str \\| None` | `null` |" in text


def test_topics_refuse_a_record_no_topic_carries(monkeypatch: pytest.MonkeyPatch) -> None:
    table = {k: v for k, v in reference_docs.TOPIC_RECORDS.items() if k != "DEAD"}
    monkeypatch.setattr(reference_docs, "TOPIC_RECORDS", {**table, "DEAD": ()})
    with pytest.raises(LookupError, match="JobDead"):
        reference_docs.render_topics()


def test_settings_refuse_a_settings_class_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    deployables = tuple(d for d in reference_docs.DEPLOYABLE_SETTINGS if d[2] != "SinkSettings")
    monkeypatch.setattr(reference_docs, "DEPLOYABLE_SETTINGS", deployables)
    with pytest.raises(LookupError, match="SinkSettings"):
        reference_docs.render_settings()
