"""``zapstream``: the command line, and the composition root.

Settings are read here, once, and passed down; concrete gateway clients, the
state sink and the relay are built here and handed to the parts that use them.

    zapstream db migrate          apply the outbox schema
    zapstream topics ensure       create every Kafka topic with explicit partitions
    zapstream relay               stream outbox inserts into Kafka (CDC)
    zapstream worker              the Faust dispatcher and the state sink
    zapstream jobs list|cancel|reprocess   operators: see, cancel and re-send jobs
    zapstream webhook             gateway status callbacks (receipts), HMAC-signed
    zapstream gateway-sim         the gateway simulator (StackZap + ZAP API)
    zapstream dev                 the whole pipeline on throwaway processes, with a demo batch
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence

from connectors.jobs_cli import add_jobs_parser

log = logging.getLogger("zapstream")


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("aiokafka", "kafka", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _cmd_migrate(args: argparse.Namespace) -> int:
    from connectors.migrate import migrate
    from streams.settings import PostgresSettings

    applied = migrate(PostgresSettings().dsn)
    print(f"migrations applied: {', '.join(applied) or 'none (up to date)'}")
    return 0


def _cmd_topics(args: argparse.Namespace) -> int:
    from connectors.topic_admin import ensure_topics
    from streams.settings import KafkaSettings

    created = asyncio.run(ensure_topics(KafkaSettings()))
    print(f"topics created: {', '.join(created) or 'none (all exist)'}")
    return 0


def _cmd_relay(args: argparse.Namespace) -> int:
    from connectors.relay import OutboxRelay
    from streams.settings import RelaySettings

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
    from connectors.state_sink import StateSink
    from streams.settings import WorkerSettings
    from streams.worker import build_worker_app

    settings = WorkerSettings()
    gateway = build_gateway(settings.gateway)
    sink = StateSink(
        settings.kafka,
        settings.postgres.dsn,
        batch_max=settings.state_sink_batch,
        poll_timeout_s=settings.state_sink_within_s,
    )
    app, _ = build_worker_app(settings, gateway, resources=[sink])
    sink.on_failure = lambda exc: asyncio.ensure_future(app.crash(exc))
    worker = faust.Worker(app, loglevel=args.log_level, quiet=True)
    worker.execute_from_commandline()
    return 0


def _cmd_webhook(args: argparse.Namespace) -> int:
    from connectors.webhook import serve
    from streams.settings import WebhookSettings

    asyncio.run(serve(WebhookSettings()))
    return 0


def _cmd_gateway_sim(args: argparse.Namespace) -> int:
    from connectors.gateway_sim import main as sim_main

    sim_main(args.sim_args)
    return 0


def _cmd_dev(args: argparse.Namespace) -> int:
    from connectors.dev_runner import main as dev_main

    return dev_main(args.dev_args)


def main(argv: Sequence[str] | None = None) -> int:
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
    add_jobs_parser(sub)
    sub.add_parser("webhook", help="receive gateway status callbacks").set_defaults(
        func=_cmd_webhook
    )
    sub.add_parser("worker", help="run the stream worker").set_defaults(func=_cmd_worker)

    # These two parse their own options (see their --help).
    sim = sub.add_parser("gateway-sim", help="run the gateway simulator", add_help=False)
    sim.set_defaults(func=_cmd_gateway_sim, passthrough="sim_args")
    dev = sub.add_parser("dev", help="run the whole pipeline locally", add_help=False)
    dev.set_defaults(func=_cmd_dev, passthrough="dev_args")

    args, extra = parser.parse_known_args(argv)
    passthrough = getattr(args, "passthrough", None)
    if passthrough:
        setattr(args, passthrough, extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    _configure_logging(args.log_level)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
