"""``zapstream``: the command line, and the composition root.

Settings are read here, once, and passed down; concrete gateway clients, the
state sink and the relay are built here and handed to the parts that use them.

    zapstream db migrate          apply the outbox schema, the group roles' grants, the slot
    zapstream db roles [--print]  one group role per component (or print its SQL for a DBA)
    zapstream topics ensure       create every Kafka topic with explicit partitions
    zapstream relay               stream outbox inserts into Kafka (CDC)
    zapstream outbox restream     re-publish PENDING jobs the relay never streamed
    zapstream outbox prune        keep old settled jobs as audit stubs (retention)
    zapstream worker              the Faust dispatcher: sends through the gateway
    zapstream sink                job states from Kafka back into PostgreSQL
    zapstream webhook             gateway status callbacks (receipts), HMAC-signed
    zapstream lag-monitor         consumer lag of the worker's and sink's groups, on /metrics
    zapstream jobs list|show|cancel|reprocess   operators: see, cancel and re-send jobs
    zapstream instances|campaigns pause|resume|list   operators: hold and release sending
    zapstream doctor [--json]     check database, role, slot, Kafka, topics and gateway
    zapstream status [--json]     every hop on one screen (exit 0 healthy, 1 attention)
    zapstream console             operators' web console: jobs, history, cancel/reprocess, lag

Every deployable (relay, sink, webhook, lag monitor, console) is a
:class:`~streams.kernel.runtime.service.Service` run by
:func:`~streams.kernel.runtime.run.run_until_signalled`: SIGTERM/SIGINT drains it
within a bound and it ends with one closing summary line. A configuration error (an
invalid value, a misspelt ``ZAPSTREAM_*`` variable, a topic with the wrong partition
count, a connection that cannot be made, any permanent
:class:`~streams.kernel.errors.Failure` at start) is one line on stderr naming the
variable or command to fix, and exit code 2.

Every command imports what it needs when it runs: the base install (what an
application needs to enqueue) has no Faust, Kafka or HTTP client, and a service
command run there says which extra to install instead of failing on an import.
The gateway simulator and the local pipeline are development tools that live in
the repository, not in the package (``python -m devtools.simulator.gateway_sim``,
``make dev``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from connectors.console.cli import add_console_parser
from connectors.ops.controls_cli import add_controls_parser
from connectors.ops.jobs_cli import add_jobs_parser
from connectors.ops.optouts_cli import add_optouts_parser
from connectors.ops.status import add_status_parser
from connectors.outbox.roles import COMPONENTS

if TYPE_CHECKING:
    from streams.kernel.settings import KafkaSettings

log = logging.getLogger("zapstream")

SERVICE_EXTRA_HINT = "pip install 'zapstream[service]'"
_OWN_PACKAGES = frozenset({"streams", "connectors"})


def _configure_logging(level: str) -> None:
    from connectors.startup import MaskingFormatter, mask_every_log_record

    mask_every_log_record()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    for noisy in ("aiokafka", "kafka", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("asyncio").addFilter(_orphaned_connection_errors)


def _orphaned_connection_errors(record: logging.LogRecord) -> bool:
    """Keep asyncio's "exception was never retrieved" tracebacks of a dropped connection
    out of the output (debug only): a client library (aiokafka closing a connection the
    broker reset) leaves such a future behind, and the edge that used the connection has
    already classified the failure and said it in one line."""
    exc = record.exc_info[1] if record.exc_info else None
    if "never retrieved" in str(record.msg) and isinstance(exc, OSError | EOFError):
        log.debug("a dropped connection's unread error: %r", exc)
        return False
    return True


def _cmd_migrate(args: argparse.Namespace) -> int:
    from connectors.outbox.migrate import migrate
    from streams.kernel.settings import PostgresSettings

    dsn = PostgresSettings().dsn
    applied = migrate(dsn)
    print(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    if not args.no_roles:
        _apply_roles(dsn)
    if args.no_slot:
        return 0
    return _ensure_slot(dsn, args)


def _apply_roles(dsn: str) -> None:
    from connectors.outbox.roles import apply_roles

    result = apply_roles(dsn)
    created = f" (created {', '.join(result.created)})" if result.created else ""
    print(f"group roles granted: {', '.join(result.granted) or 'none'}{created}")
    if result.missing:
        log.warning(
            "group roles %s do not exist and this role may not create them (no CREATEROLE): "
            "have a DBA run `zapstream db roles --print`, then run `zapstream db migrate` again",
            ", ".join(result.missing),
        )


def _cmd_roles(args: argparse.Namespace) -> int:
    from connectors.outbox.roles import roles_sql
    from streams.kernel.settings import PostgresSettings

    if args.print:
        sys.stdout.write(roles_sql())
        return 0
    _apply_roles(PostgresSettings().dsn)
    return 0


def _ensure_slot(dsn: str, args: argparse.Namespace) -> int:
    """Create the publication and the relay's slot now, so every row from here on is kept."""
    from connectors.cdc.provisioning import ProvisioningError, ensure_replication
    from connectors.cdc.settings import RelaySettings

    relay = RelaySettings()
    slot, publication = args.slot or relay.slot, args.publication or relay.publication
    from streams.kernel.failures import StartRefused

    try:
        ensure_replication(dsn, slot=slot, publication=publication, failover=relay.slot_failover)
    except ProvisioningError as exc:
        raise StartRefused(f"cannot create the replication slot: {exc}") from exc
    print(f"publication {publication} and replication slot {slot} (pgoutput) ready")
    return 0


def _cmd_restream(args: argparse.Namespace) -> int:
    from connectors.cdc.restream import restream
    from connectors.ops.durations import parse_duration
    from streams.kernel.failures import StartRefused
    from streams.kernel.settings import PostgresSettings

    try:
        older_than = parse_duration(args.older_than)
    except ValueError as exc:
        raise StartRefused(f"--older-than: {exc}") from exc
    result = restream(
        PostgresSettings().dsn,
        older_than=older_than,
        reason=args.reason,
        actor=args.by,
        dry_run=args.dry_run,
        limit=args.limit,
    )
    span = f" (jobs {result.first_job_id}..{result.last_job_id})" if result.pending else ""
    if args.dry_run:
        would = "would be restreamed"
        print(f"{result.pending} PENDING jobs older than {args.older_than} {would}{span}")
    else:
        print(f"restreamed {result.replayed} PENDING jobs older than {args.older_than}{span}")
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    from connectors.ops.durations import parse_duration
    from connectors.outbox.retention import prune
    from streams.kernel.failures import StartRefused
    from streams.kernel.settings import PostgresSettings

    try:
        result = prune(
            PostgresSettings().dsn,
            older_than=parse_duration(args.older_than),
            dry_run=args.dry_run,
            batch=args.batch,
        )
    except ValueError as exc:  # a bad duration, or a RetentionError
        raise StartRefused(f"outbox prune: {exc}") from exc
    kept = ", ".join(f"{status} {n}" for status, n in result.unresolved.items())
    if args.dry_run:
        print(f"{result.jobs} settled jobs older than {args.older_than} would be pruned")
    else:
        print(
            f"pruned {result.jobs} settled jobs older than {args.older_than}"
            f" ({result.events_deleted} earlier state changes deleted)"
        )
    if kept:
        print(f"kept for an operator's decision (never pruned): {kept}")
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    from connectors.ops.topics import ensure_topics
    from streams.kernel.settings import KafkaSettings

    created = asyncio.run(ensure_topics(KafkaSettings()))
    print(f"topics created: {', '.join(created) or 'none (all exist)'}")
    return 0


def _require_topics(kafka: KafkaSettings, deployable: str) -> None:
    """Refuse to start on missing or auto-created topics (raises a one-line StartRefused)."""
    from streams.kernel.topics_check import deployable_topic_specs, require_topics

    asyncio.run(require_topics(kafka, deployable_topic_specs(deployable, kafka), deployable))


def _cmd_doctor(args: argparse.Namespace) -> int:
    from connectors.cdc.settings import RelaySettings
    from connectors.ops.doctor import print_report, run_doctor
    from streams.kernel.settings import GatewaySettings

    results = asyncio.run(
        run_doctor(
            RelaySettings(),
            GatewaySettings(),
            timeout_s=args.timeout_s,
            instance_id=args.instance,
            component=args.component,
        )
    )
    return print_report(results, as_json=args.json)


def _cmd_relay(args: argparse.Namespace) -> int:
    from connectors.cdc.relay import OutboxRelay
    from connectors.cdc.settings import RelaySettings
    from streams.kernel.runtime.run import run_until_signalled

    settings = RelaySettings()
    _require_topics(settings.kafka, "relay")
    # Everything imported and built so far lives as long as the process: out of the
    # collector's sight, so the full collections that the relay's in-flight records
    # (up to max_in_flight rows' objects) trigger do not walk every module and class too.
    gc.freeze()
    # The relay drains for up to drain_timeout_s and then confirms what Kafka acknowledged:
    # the runtime's bound leaves it the time to, or a restart replays more.
    return run_until_signalled(lambda: OutboxRelay(settings), drain_s=settings.drain_timeout_s + 5)


def _cmd_worker(args: argparse.Namespace) -> int:
    import faust

    from connectors.gateways.factory import build_gateway
    from connectors.sink.job_history import PostgresJobHistory
    from streams.kernel.attempt_reference import load_reference_key
    from streams.worker import build_worker_app
    from streams.worker_settings import WorkerSettings

    settings = WorkerSettings()
    references = load_reference_key(settings.gateway.reference_key.get_secret_value())
    _require_topics(settings.kafka, "worker")
    app, _ = build_worker_app(
        settings,
        build_gateway(settings.gateway),
        history=PostgresJobHistory(settings.postgres),
        references=references,
    )
    worker = faust.Worker(app, loglevel=args.log_level, quiet=True)
    worker.execute_from_commandline()
    return 0


def _cmd_sink(args: argparse.Namespace) -> int:
    from connectors.sink.settings import SinkSettings
    from connectors.sink.state_sink import StateSink
    from streams.kernel.runtime.run import run_until_signalled

    settings = SinkSettings()
    _require_topics(settings.kafka, "sink")
    return run_until_signalled(lambda: StateSink(settings))


def _cmd_webhook(args: argparse.Namespace) -> int:
    from connectors.webhook.intake import WebhookIntake
    from connectors.webhook.settings import WebhookSettings
    from streams.kernel.attempt_reference import load_reference_key
    from streams.kernel.runtime.run import run_until_signalled

    settings = WebhookSettings()
    # Refused before Kafka is asked anything: a configuration fault is one line, exit 2.
    load_reference_key(settings.gateway.reference_key.get_secret_value())
    _require_topics(settings.kafka, "webhook")
    return run_until_signalled(lambda: WebhookIntake(settings))


def _cmd_lag_monitor(args: argparse.Namespace) -> int:
    from streams.kernel.runtime.health import HealthEndpoint
    from streams.kernel.runtime.run import run_until_signalled
    from streams.kernel.settings import LagMonitorSettings
    from streams.lag_monitor import LagMonitor

    settings = LagMonitorSettings()
    # Groups and topics as named on the cluster (ZAPSTREAM_KAFKA_TOPIC_PREFIX before each).
    groups = settings.watched()

    def build() -> LagMonitor:
        health = HealthEndpoint(
            settings.metrics_port,
            bind_local=settings.metrics_bind_local,
            name="lag monitor",
            port_setting="ZAPSTREAM_LAG_METRICS_PORT",
            may_switch_off=False,  # metrics are the lag monitor's only output
        )
        return LagMonitor(
            settings.kafka,
            groups,
            interval_s=settings.interval_s,
            read_timeout_s=settings.read_timeout_s,
            health=health,
        )

    return run_until_signalled(build)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zapstream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    migrate_parser = db_sub.add_parser(
        "migrate", help="apply migrations; create the publication and replication slot"
    )
    migrate_parser.add_argument(
        "--slot", help="replication slot to create (default: ZAPSTREAM_RELAY_SLOT)"
    )
    migrate_parser.add_argument(
        "--publication", help="publication to create (default: ZAPSTREAM_RELAY_PUBLICATION)"
    )
    migrate_parser.add_argument(
        "--no-slot", action="store_true", help="only apply migrations (the relay creates both)"
    )
    migrate_parser.add_argument(
        "--no-roles",
        action="store_true",
        help="leave the zapstream_* group roles and their grants alone (a DBA applies "
        "`zapstream db roles --print`)",
    )
    migrate_parser.set_defaults(func=_cmd_migrate)
    roles_parser = db_sub.add_parser(
        "roles",
        help="create the zapstream_* group roles (one per component) and grant each what it needs",
    )
    roles_parser.add_argument(
        "--print",
        action="store_true",
        help="print the idempotent SQL instead of running it (for a DBA; connects nowhere)",
    )
    roles_parser.set_defaults(func=_cmd_roles)

    outbox = sub.add_parser("outbox", help="outbox maintenance")
    outbox_sub = outbox.add_subparsers(dest="outbox_command", required=True)
    restream_parser = outbox_sub.add_parser(
        "restream",
        help="re-publish PENDING jobs the relay never streamed (through CDC); the relay "
        "restreams a lost or recreated slot's gap by itself, so this is for a schema before "
        "migration 0011 or a slot recreated by hand",
    )
    restream_parser.add_argument(
        "--older-than", required=True, help="only jobs created before now minus this (e.g. 10m)"
    )
    restream_parser.add_argument("--dry-run", action="store_true", help="only count them")
    restream_parser.add_argument("--limit", type=int, default=None, help="at most this many")
    restream_parser.add_argument("--reason", default="restream: PENDING and never streamed")
    restream_parser.add_argument("--by", default="operator", help="who asks (recorded)")
    restream_parser.set_defaults(func=_cmd_restream)
    prune_parser = outbox_sub.add_parser(
        "prune",
        help="keep old settled jobs as audit stubs: message and recipient removed, last state kept",
    )
    prune_parser.add_argument(
        "--older-than", required=True, help="jobs last changed before now minus this (>= 7d)"
    )
    prune_parser.add_argument("--dry-run", action="store_true", help="only count them")
    prune_parser.add_argument("--batch", type=int, default=5000, help="jobs per transaction")
    prune_parser.set_defaults(func=_cmd_prune)

    topics = sub.add_parser("topics", help="Kafka topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    topics_sub.add_parser("ensure", help="create missing topics").set_defaults(func=_cmd_topics)

    sub.add_parser("relay", help="run the CDC relay").set_defaults(func=_cmd_relay)
    sub.add_parser("worker", help="run the stream worker").set_defaults(func=_cmd_worker)
    doctor = sub.add_parser("doctor", help="check PostgreSQL, Kafka, topics and the gateway")
    doctor.add_argument("--json", action="store_true", help="one JSON object on stdout")
    doctor.add_argument("--timeout-s", type=float, default=5.0, help="bound of each check")
    doctor.add_argument(
        "--instance", default="zapstream-doctor", help="gateway instance whose queue is listed"
    )
    doctor.add_argument(
        "--component",
        choices=COMPONENTS,
        help="check the database role as this component's (default: its zapstream_* group)",
    )
    doctor.set_defaults(func=_cmd_doctor)
    sub.add_parser("sink", help="write job states back into PostgreSQL").set_defaults(
        func=_cmd_sink
    )
    sub.add_parser("webhook", help="receive gateway status callbacks").set_defaults(
        func=_cmd_webhook
    )
    sub.add_parser(
        "lag-monitor", help="export consumer lag (records, seconds) from outside the groups"
    ).set_defaults(func=_cmd_lag_monitor)
    add_jobs_parser(sub)
    add_controls_parser(sub)
    add_optouts_parser(sub)
    add_status_parser(sub)
    add_console_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    from connectors.demo_secrets import refuse_demo_secrets
    from connectors.startup import refuse_unknown_variables, startup_failure_lines

    try:
        refuse_unknown_variables(os.environ)
        refuse_demo_secrets(os.environ)
        return int(args.func(args))
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] in _OWN_PACKAGES:
            raise
        print(
            f"zapstream: `zapstream {args.command}` needs {exc.name!r}, which the base install "
            f"does not include: {SERVICE_EXTRA_HINT}",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:
        # Configuration and start-up failures: one line naming the variable or command.
        lines = startup_failure_lines(exc, os.environ)
        if not lines:
            raise
        for line in lines:
            print(f"zapstream: {line}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
