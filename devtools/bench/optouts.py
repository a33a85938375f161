"""The worker's memory per opt-out: ``python -m devtools.bench.optouts [--people 1000000]``.

Fills a :class:`streams.optouts.OptOuts` with ``--people`` distinct recipients spread over
``--instances`` instances, as the controls reader does, and prints the bytes Python
allocated for it (``tracemalloc``), per opt-out, and the time one lookup takes. No broker,
no database: the list is the worker's only per-opt-out cost (the topic lives in Kafka).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from collections.abc import Sequence

from streams.optouts import OptOuts


def measure(people: int, instances: int) -> dict[str, float]:
    recipients = [f"55{11 + i % 80}9{i:08d}" for i in range(people)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    optouts = OptOuts()
    for n, person in enumerate(recipients):
        optouts.add(f"instance-{n % instances}", person)
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    started = time.perf_counter()
    probes = min(people, 100_000)
    for n in range(probes):
        optouts.opted_out(f"instance-{n % instances}", recipients[n])
    lookup_ns = (time.perf_counter() - started) / probes * 1e9
    total = after - before
    return {
        "people": float(len(optouts)),
        "bytes": float(total),
        "bytes_per_optout": total / max(1, len(optouts)),
        "lookup_ns": lookup_ns,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--people", type=int, default=1_000_000)
    parser.add_argument("--instances", type=int, default=10)
    args = parser.parse_args(argv)
    figures = measure(args.people, args.instances)
    print(
        f"{figures['people']:.0f} opt-outs over {args.instances} instances: "
        f"{figures['bytes'] / 2**20:.1f} MiB, {figures['bytes_per_optout']:.0f} B each; "
        f"lookup {figures['lookup_ns']:.0f} ns"
    )


if __name__ == "__main__":
    main()
