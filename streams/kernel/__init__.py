"""The kernel: what the worker (``streams/``) and the edges (``connectors/``) share.

The wire contract, the shared settings blocks, the error tree, the ports, the job state
machine, the Kafka client helpers and the service runtime. Only this package crosses
between ``connectors/`` and ``streams/``; it imports neither of them.
"""
