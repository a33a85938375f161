"""docker-compose.yml is a valid compose file whose names all point somewhere, offline.

Two layers, each shown to fail on a broken copy: the compose specification's JSON schema
(check-jsonschema's vendored ``compose-spec``: field names and types) and
:mod:`devtools.deploy.compose_check` (cross-references the schema cannot see: secrets, configs,
``depends_on``, zapstream commands and variables, Prometheus targets). Prometheus's own
configuration is checked by promtool, and the demo secrets in ``.env.example`` by what the
services do with them. No Docker engine is needed.
"""

from __future__ import annotations

import copy
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.console.settings import parse_tokens
from devtools.deploy import compose_check as cc
from devtools.deploy import monitoring_check as mc
from tests.unit.deploy.deployables import settings_of

ROOT = cc.ROOT
ENV_EXAMPLE = ROOT / ".env.example"
ZAPSTREAM_SERVICES = {
    "migrate", "topics", "relay", "relay-standby", "worker-1", "worker-2", "sink", "webhook",
    "lag-monitor", "console",
}  # fmt: skip


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return cc.load()


@pytest.fixture(scope="module")
def known() -> frozenset[str]:
    return cc.known_variables()


def _check_jsonschema(tool: Callable[[str], str], *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _unknown_field(c: dict[str, Any]) -> None:
    c["services"]["relay"]["healthcheck_url"] = "http://127.0.0.1:6069/healthz"


def _ports_not_a_list(c: dict[str, Any]) -> None:
    c["services"]["webhook"]["ports"] = "8090:8090"


def _condition_typo(c: dict[str, Any]) -> None:
    c["services"]["sink"]["depends_on"]["migrate"]["condition"] = "service_complete_successfully"


def _secret_unknown_field(c: dict[str, Any]) -> None:
    c["secrets"]["STACKZAP_API_KEY"] = {"env": "STACKZAP_API_KEY"}


SCHEMA_BREAKERS = [_unknown_field, _ports_not_a_list, _condition_typo, _secret_unknown_field]
SCHEMA_ERRORS: dict[Callable[[dict[str, Any]], None], str] = {
    _unknown_field: "$.services.relay: Unevaluated properties are not allowed ('healthcheck_url'",
    _ports_not_a_list: "$.services.webhook.ports: '8090:8090' is not of type 'array'",
    _condition_typo: "$.services.sink.depends_on: {'migrate': {'condition': "
    "'service_complete_successfully'}",
    _secret_unknown_field: "$.secrets.STACKZAP_API_KEY: 'env' does not match",
}
"""What check-jsonschema says about each broken copy (its output is read, not just its code)."""


@pytest.fixture(scope="module")
def schema_run(
    deploy_tool: Callable[[str], str],
    compose: dict[str, Any],
    tmp_path_factory: pytest.TempPathFactory,
) -> str:
    """One check-jsonschema run over the real file, an unchanged dump and each broken copy
    (one process: it takes about a second to start). Its output names each failing file."""
    tmp = tmp_path_factory.mktemp("compose")
    files = [cc.COMPOSE]
    for breaker in [None, *SCHEMA_BREAKERS]:
        broken = copy.deepcopy(compose)
        if breaker is not None:
            breaker(broken)
        path = tmp / f"{breaker.__name__ if breaker else 'unchanged'}.yml"
        path.write_text(yaml.safe_dump(broken, sort_keys=False))
        files.append(path)
    result = _check_jsonschema(deploy_tool, *files)
    assert result.returncode != 0, "the broken copies passed the schema"
    return result.stdout + result.stderr


def test_the_compose_file_matches_the_compose_specification(schema_run: str) -> None:
    assert "docker-compose.yml" not in schema_run, schema_run
    # The dump the broken copies are made from is itself valid: only the breakage fails.
    assert "unchanged.yml" not in schema_run, schema_run


@pytest.mark.parametrize("breaker", SCHEMA_BREAKERS, ids=lambda b: b.__name__.strip("_"))
def test_the_schema_refuses_a_broken_copy(
    schema_run: str, breaker: Callable[[dict[str, Any]], None]
) -> None:
    assert f"{breaker.__name__}.yml::{SCHEMA_ERRORS[breaker]}" in schema_run, schema_run


def test_every_cross_reference_holds(compose: dict[str, Any], known: frozenset[str]) -> None:
    assert cc.problems(compose, known=known) == []


def _break(compose: dict[str, Any], edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    broken = copy.deepcopy(compose)
    edit(broken)
    return broken


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = c
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        *parents, last = path.split("/")
        node = c
        for key in parents:
            node = node[key]
        del node[last]

    return edit


BROKEN = [
    ("a secret defined nowhere", _drop("secrets/STACKZAP_API_KEY"),
     "worker-1: secrets 'STACKZAP_API_KEY' is not defined"),
    ("a config defined nowhere", _drop("configs/zapstream-alerts"),
     "prometheus: configs 'zapstream-alerts' is not defined"),
    ("a config file that does not exist", _set("configs/zapstream-dashboard/file", "k8s/nope.json"),
     "configs.zapstream-dashboard: file k8s/nope.json does not exist"),
    ("depends_on a service that does not exist",
     _set("services/sink/depends_on/migrations", {"condition": "service_started"}),
     "sink: depends_on 'migrations'"),
    ("a command zapstream does not have", _set("services/sink/command", ["state-sink"]),
     "sink: `zapstream state-sink` is no zapstream command"),
    ("a subcommand missing", _set("services/topics/command", ["topics"]),
     "topics: `zapstream topics` is no zapstream command"),
    ("a misspelt variable", _set("services/relay/environment/ZAPSTREAM_RELAY_MAX_INFLIGHT", "5"),
     "relay: ZAPSTREAM_RELAY_MAX_INFLIGHT is read by no zapstream setting"),
    ("a secret file named after no variable",
     _set("services/relay/secrets", [{"source": "ZAPSTREAM_DATABASE_URL", "target": "dsn"}]),
     "relay: secret file dsn is named after no zapstream setting"),
    ("an entrypoint replacing zapstream", _set("services/sink/entrypoint", ["python"]),
     "sink: a zapstream service keeps the image's entrypoint"),
    ("metrics bound to 127.0.0.1",
     _drop("services/sink/environment/ZAPSTREAM_SINK_METRICS_BIND_LOCAL"),
     "sink: ZAPSTREAM_SINK_METRICS_BIND_LOCAL is not false"),
    ("a scraped port the service does not serve",
     _set("services/sink/environment/ZAPSTREAM_SINK_METRICS_PORT", "7067"),
     "prometheus: target sink:6067: sink serves /metrics on 7067"),
    ("a target naming no service",
     _set("configs/prometheus-config/content",
          "scrape_configs:\n  - job_name: x\n    static_configs:\n      - targets: [sinc:6067]\n"),
     "prometheus: target sinc:6067 names no service"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "edit", "expected"), BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_reference_is_named(
    compose: dict[str, Any],
    known: frozenset[str],
    what: str,
    edit: Callable[[dict[str, Any]], None],
    expected: str,
) -> None:
    found = cc.problems(_break(compose, edit), known=known)
    assert any(line.startswith(expected) for line in found), found


def test_an_unscraped_metrics_port_is_named(compose: dict[str, Any], known: frozenset[str]) -> None:
    content = compose["configs"]["prometheus-config"]["content"].replace('"lag-monitor:6068"', "")
    found = cc.problems(
        _break(compose, _set("configs/prometheus-config/content", content)), known=known
    )
    assert "prometheus: lag-monitor serves /metrics on 6068 but is not scraped" in found


def test_the_services_the_issue_asks_for(compose: dict[str, Any]) -> None:
    services = cc.services(compose)
    assert {name for name, svc in services.items() if cc.is_zapstream(svc)} == ZAPSTREAM_SERVICES
    commands = {name: cc.command(services[name]) for name in ZAPSTREAM_SERVICES}
    assert commands["migrate"] == ["db", "migrate"]
    assert commands["topics"] == ["topics", "ensure"]
    assert commands["relay"] == commands["relay-standby"] == ["relay"]
    assert commands["worker-1"] == commands["worker-2"] == ["worker"]
    for name in ZAPSTREAM_SERVICES - {"migrate", "topics"}:
        depends = services[name]["depends_on"]
        assert any(
            dep in {"migrate", "topics"} and spec["condition"] == "service_completed_successfully"
            for dep, spec in depends.items()
        ), name
        assert services[name]["healthcheck"]["test"][:2] == ["CMD", "python"], name
        assert services[name]["restart"] == "unless-stopped", name
    for name in ("migrate", "topics"):
        assert services[name]["restart"] == "no"

    postgres = services["postgres"]
    assert "wal_level=logical" in postgres["command"]
    assert postgres["healthcheck"]["test"][1] == "pg_isready"
    kafka = services["kafka"]
    assert kafka["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert "healthcheck" in kafka
    assert cc.environment(services["worker-1"])["ZAPSTREAM_KAFKA_BROKERS"] == "kafka:9092"


def test_every_image_is_pinned(compose: dict[str, Any]) -> None:
    for name, svc in cc.services(compose).items():
        image = svc["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, (name, image)
    images = {svc["image"].split(":")[0] for svc in cc.services(compose).values()}
    assert {"postgres", "apache/kafka", "prom/prometheus", "grafana/grafana"} <= images


def test_the_health_checks_ask_the_port_each_service_serves(compose: dict[str, Any]) -> None:
    for name, svc in cc.services(compose).items():
        if not cc.is_zapstream(svc) or name in {"migrate", "topics"}:
            continue
        env = cc.environment(svc)
        probe = " ".join(svc["healthcheck"]["test"])
        port = re.search(r"http://127\.0\.0\.1:(\d+)/", probe)
        assert port is not None, name
        assert port.group(1) in env.values() or int(port.group(1)) == cc.metrics_port(svc), name


def test_prometheus_accepts_its_configuration(compose: dict[str, Any], tmp_path: Path) -> None:
    """promtool checks the inline prometheus.yml, with the alert rules it loads."""
    config = yaml.safe_load(compose["configs"]["prometheus-config"]["content"])
    mounted = {
        item["target"]: compose["configs"][item["source"]]
        for item in compose["services"]["prometheus"]["configs"]
    }
    local_rules = []
    for rule_file in config["rule_files"]:
        assert rule_file in mounted, rule_file
        local_rules.append(str(ROOT / mounted[rule_file]["file"]))
    config["rule_files"] = local_rules
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [mc.promtool(), "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_grafana_provisions_the_dashboard_and_the_datasource(compose: dict[str, Any]) -> None:
    configs = compose["configs"]
    mounted = {i["target"]: i["source"] for i in compose["services"]["grafana"]["configs"]}
    dashboard_target = next(t for t, s in mounted.items() if s == "zapstream-dashboard")
    assert configs["zapstream-dashboard"]["file"] == "k8s/monitoring/zapstream-dashboard.json"
    providers = yaml.safe_load(configs["grafana-dashboards"]["content"])["providers"]
    assert any(Path(dashboard_target).parent == Path(p["options"]["path"]) for p in providers), (
        providers
    )
    datasources = yaml.safe_load(configs["grafana-datasources"]["content"])["datasources"]
    assert [d["type"] for d in datasources] == ["prometheus"]
    assert datasources[0]["url"] == "http://prometheus:9090" and datasources[0]["isDefault"]
    assert compose["configs"]["zapstream-alerts"]["file"] == "k8s/monitoring/zapstream-alerts.yml"


def _dotenv(path: Path) -> dict[str, str]:
    """The subset of compose's .env syntax .env.example uses: KEY=value, 'literal', ${VAR}."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, raw
        if value.startswith("'") and value.endswith("'"):
            values[key] = value[1:-1]
        else:
            values[key] = re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], value)
    return values


def test_the_demo_secrets_fit_together(compose: dict[str, Any]) -> None:
    """.env.example defines every secret's variable with an obvious demo value (one zapstream
    refuses without ZAPSTREAM_ALLOW_DEMO_SECRETS=1), the migrate DSN names the superuser of
    the PostgreSQL the compose file starts, and each component's DSN the login role its init
    script creates with that component's password."""
    from connectors.demo_secrets import DEMO_MARKER

    env = _dotenv(ENV_EXAMPLE)
    for name, spec in compose["secrets"].items():
        assert "environment" in spec, name  # never a file: no secret value in the repository
        assert spec["environment"] in env, name
        assert "demo" in env[spec["environment"]], name
        assert DEMO_MARKER in env[spec["environment"]], name
    postgres = compose["services"]["postgres"]["environment"]
    assert env["MIGRATE_DATABASE_URL"] == (
        f"postgresql://{postgres['POSTGRES_USER']}:{env['POSTGRES_PASSWORD']}"
        f"@postgres:5432/{postgres['POSTGRES_DB']}"
    )
    assert postgres["POSTGRES_PASSWORD_FILE"] == "/run/secrets/POSTGRES_PASSWORD"
    script = compose["configs"]["postgres-login-roles"]["content"]
    mounted = {s["source"] for s in compose["services"]["postgres"]["secrets"]}
    for component in DATABASE_LOGINS:
        upper = component.upper()
        assert env[f"{upper}_DATABASE_URL"] == (
            f"postgresql://{component}:{env[f'{upper}_DB_PASSWORD']}@postgres:5432/"
            f"{postgres['POSTGRES_DB']}"
        )
        assert f"{upper}_DB_PASSWORD" in mounted
        attributes = "REPLICATION" if component == "relay" else "NOREPLICATION"
        assert f"{component}:{attributes}" in script
    assert "IN ROLE %I" in script and "'zapstream_' || :'component'" in script
    assert parse_tokens(env["ZAPSTREAM_CONSOLE_TOKENS"])
    assert ".env" in (ROOT / ".gitignore").read_text().splitlines()


DATABASE_LOGINS = {
    "relay": ("relay", "relay-standby"),
    "worker": ("worker-1", "worker-2"),
    "sink": ("sink",),
    "webhook": ("webhook",),
    "console": ("console",),
}
"""Each component's compose login role and the services that connect as it."""


def _dsn_source(svc: dict[str, Any]) -> str | None:
    return next(
        (src for src, name in cc.mounts(svc, "secrets") if name == "ZAPSTREAM_DATABASE_URL"),
        None,
    )


def test_each_workload_gets_its_own_database_login(compose: dict[str, Any]) -> None:
    """One DSN secret per component: no service mounts another component's login, and only
    `migrate` (the schema owner) gets the superuser's."""
    services = compose["services"]
    sources = {name: _dsn_source(services[name]) for name in ZAPSTREAM_SERVICES}
    assert sources["migrate"] == "MIGRATE_DATABASE_URL"
    for component, names in DATABASE_LOGINS.items():
        for name in names:
            assert sources[name] == f"{component.upper()}_DATABASE_URL", name
    assert sources["lag-monitor"] is None and sources["topics"] is None
    from connectors.outbox.roles import COMPONENTS

    assert set(DATABASE_LOGINS) <= set(COMPONENTS)


def test_the_compose_demo_refuses_its_public_secrets_unless_allowed(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    """Each zapstream service started with .env.example's values exits 2 in one line naming
    the secret (never its value) unless ZAPSTREAM_ALLOW_DEMO_SECRETS=1."""
    from connectors.demo_secrets import ALLOW_VARIABLE, refuse_demo_secrets
    from streams.kernel.failures import StartRefused

    demo = _dotenv(ENV_EXAMPLE)
    for service in ("console", "webhook", "relay", "migrate"):
        svc = compose["services"][service]
        secrets_dir = tmp_path / service
        secrets_dir.mkdir()
        for source, filename in cc.mounts(svc, "secrets"):
            (secrets_dir / filename).write_text(demo[compose["secrets"][source]["environment"]])
        env = {**cc.environment(svc), "ZAPSTREAM_SECRETS_DIR": str(secrets_dir)}
        assert env[ALLOW_VARIABLE] == "${ZAPSTREAM_ALLOW_DEMO_SECRETS:-0}"  # off by default
        env[ALLOW_VARIABLE] = "0"
        with pytest.raises(StartRefused) as refused:
            refuse_demo_secrets(env)
        line = str(refused.value)
        assert "ZAPSTREAM_DATABASE_URL" in line and f"{ALLOW_VARIABLE}=1" in line, line
        assert "\n" not in line and "change-me" not in line, line
        refuse_demo_secrets({**env, ALLOW_VARIABLE: "1"})


def test_the_simulator_and_its_clients_share_key_and_secret(compose: dict[str, Any]) -> None:
    services = compose["services"]
    sim = services["gateway-sim"]
    script = sim["entrypoint"][-1]
    sim_secrets = {s["source"] for s in sim["secrets"]}
    assert '--api-key "$$(cat /run/secrets/STACKZAP_API_KEY)"' in script
    assert '--callback-secret "$$(cat /run/secrets/ZAPSTREAM_WEBHOOK_SECRET)"' in script
    assert {"STACKZAP_API_KEY", "ZAPSTREAM_WEBHOOK_SECRET"} <= sim_secrets
    port = re.search(r"--port (\d+)", script)
    assert port is not None
    for worker in ("worker-1", "worker-2"):
        env = cc.environment(services[worker])
        assert env["STACKZAP_API_URL"] == f"http://gateway-sim:{port.group(1)}"
        assert "STACKZAP_API_KEY" in {s["source"] for s in services[worker]["secrets"]}
    webhook = cc.environment(services["webhook"])
    assert (
        f"--callback-url http://webhook:{webhook['ZAPSTREAM_WEBHOOK_PORT']}/v1/webhooks/stackzap"
        in script
    )
    assert "ZAPSTREAM_WEBHOOK_SECRET" in {s["source"] for s in services["webhook"]["secrets"]}


def test_the_metrics_port_defaults_match_the_settings() -> None:
    from connectors.cdc.settings import RelaySettings
    from connectors.sink.settings import SinkSettings
    from streams.kernel.settings import LagMonitorSettings
    from streams.worker_settings import WorkerSettings

    fields = {
        "relay": RelaySettings.model_fields["metrics_port"],
        "worker": WorkerSettings.model_fields["web_port"],
        "sink": SinkSettings.model_fields["metrics_port"],
        "lag-monitor": LagMonitorSettings.model_fields["metrics_port"],
    }
    for command, field in fields.items():
        assert cc.METRICS_PORTS[command][1] == field.default, command


@pytest.mark.parametrize("service", sorted(ZAPSTREAM_SERVICES))
def test_each_service_starts_from_its_environment_and_secret_files(
    compose: dict[str, Any], service: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variables compose sets and the files it mounts in /run/secrets (here a temp dir
    holding .env.example's values) give valid settings, and no variable is refused."""
    from connectors.startup import unknown_env_lines

    svc = compose["services"][service]
    demo = _dotenv(ENV_EXAMPLE)
    for name in list(os.environ):
        if name.startswith(("ZAPSTREAM_", "STACKZAP_", "ZAP_", "META_")):
            monkeypatch.delenv(name)
    env = cc.environment(svc)
    assert env["ZAPSTREAM_SECRETS_DIR"] == "/run/secrets"
    env["ZAPSTREAM_SECRETS_DIR"] = str(tmp_path)
    for source, filename in cc.mounts(svc, "secrets"):
        (tmp_path / filename).write_text(demo[compose["secrets"][source]["environment"]])
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert unknown_env_lines(env) == []

    settings = settings_of(cc.command(svc))
    source = _dsn_source(svc)
    dsn = demo[compose["secrets"][source]["environment"]] if source else None
    if cc.command(svc) == ["db", "migrate"]:
        assert settings[0].url.get_secret_value() == dsn
    for block in ("postgres",):
        if hasattr(settings, block):
            assert getattr(settings, block).url.get_secret_value() == dsn, service
    if hasattr(settings, "kafka"):
        assert settings.kafka.brokers == "kafka:9092"
    if service.startswith("worker"):
        assert settings.gateway.stackzap_api_key.get_secret_value() == demo["STACKZAP_API_KEY"]
        assert settings.gateway.stackzap_api_url == "http://gateway-sim:8088"
        assert not settings.web_bind_local
    if service == "webhook":
        assert settings.secret.get_secret_value() == demo["ZAPSTREAM_WEBHOOK_SECRET"]
        assert settings.host == "0.0.0.0"
    if service == "console":
        assert settings.operators() and not settings.bind_local
