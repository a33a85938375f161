"""``zapstream``: the command line, and the composition root.

Settings are read here, once, and passed down; concrete gateway clients, the
state sink and the relay are built here and handed to the parts that use them.

    zapstream db migrate          apply the outbox schema
    zapstream topics ensure       create every Kafka topic with explicit partitions
    zapstream relay               stream outbox inserts into Kafka (CDC)
    zapstream worker              the Faust dispatcher: sends through the gateway
    zapstream sink                job states from Kafka back into PostgreSQL
    zapstream webhook             gateway status callbacks (receipts), HMAC-signed
    zapstream jobs list|cancel|reprocess   operators: see, cancel and re-send jobs

Every command imports what it needs when it runs: the base install (what an
application needs to enqueue) has no Faust, Kafka or HTTP client, and a service
command run there says which extra to install instead of failing on an import.
The gateway simulator and the local pipeline are development tools that live in
the repository, not in the package (``python -m devtools.gateway_sim``,
``make dev``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from connectors.ops.jobs_cli import add_jobs_parser

log = logging.getLogger("zapstream")

SERVICE_EXTRA_HINT = "pip install 'zapstream[service]'"
_OWN_PACKAGES = frozenset({"streams", "connectors"})


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("aiokafka", "kafka", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _cmd_migrate(args: argparse.Namespace) -> int:
    from connectors.outbox.migrate import migrate
    from streams.settings import PostgresSettings

    applied = migrate(PostgresSettings().dsn)
    print(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    from connectors.ops.topics import ensure_topics
    from streams.settings import KafkaSettings

    created = asyncio.run(ensure_topics(KafkaSettings()))
    print(f"topics created: {', '.join(created) or 'none (all exist)'}")
    return 0


def _cmd_relay(args: argparse.Namespace) -> int:
    from connectors.cdc.relay import OutboxRelay
    from connectors.cdc.settings import RelaySettings

    settings = RelaySettings()

    async def run() -> None:
        relay = OutboxRelay(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, relay.request_stop)
        async with relay:
            await relay.run()

    asyncio.run(run())
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    import faust

    from connectors.gateways.factory import build_gateway
    from streams.worker import build_worker_app
    from streams.worker_settings import WorkerSettings

    settings = WorkerSettings()
    app, _ = build_worker_app(settings, build_gateway(settings.gateway))
    worker = faust.Worker(app, loglevel=args.log_level, quiet=True)
    worker.execute_from_commandline()
    return 0


def _cmd_sink(args: argparse.Namespace) -> int:
    from connectors.sink.settings import SinkSettings
    from connectors.sink.state_sink import StateSink

    settings = SinkSettings()

    async def run() -> None:
        sink = StateSink(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, sink.request_stop)
        async with sink:
            await sink.run()

    asyncio.run(run())
    return 0


def _cmd_webhook(args: argparse.Namespace) -> int:
    from connectors.webhook.intake import serve
    from connectors.webhook.settings import WebhookSettings

    asyncio.run(serve(WebhookSettings()))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zapstream", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)

    db = sub.add_parser("db", help="database schema")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    db_sub.add_parser("migrate", help="apply migrations").set_defaults(func=_cmd_migrate)

    topics = sub.add_parser("topics", help="Kafka topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    topics_sub.add_parser("ensure", help="create missing topics").set_defaults(func=_cmd_topics)

    sub.add_parser("relay", help="run the CDC relay").set_defaults(func=_cmd_relay)
    sub.add_parser("worker", help="run the stream worker").set_defaults(func=_cmd_worker)
    sub.add_parser("sink", help="write job states back into PostgreSQL").set_defaults(
        func=_cmd_sink
    )
    sub.add_parser("webhook", help="receive gateway status callbacks").set_defaults(
        func=_cmd_webhook
    )
    add_jobs_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    try:
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


if __name__ == "__main__":
    sys.exit(main())
