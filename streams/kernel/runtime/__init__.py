"""The service runtime every zapstream deployable runs on.

One way each: :class:`~streams.kernel.runtime.service.Service` (lifecycle with an explicit
state), :func:`~streams.kernel.runtime.run.run_until_signalled` (SIGTERM/SIGINT, bounded drain,
one closing line, exit 2 for a refused start), :class:`~streams.kernel.runtime.periodic.Periodic`
(timers), :class:`~streams.kernel.runtime.backoff.Backoff`,
:class:`~streams.kernel.runtime.outage.OutageLog` and
:class:`~streams.kernel.runtime.health.HealthEndpoint` (``/metrics``, ``/healthz``, ``/readyz``).
"""
