"""Every Faust, mode and aiokafka internal the worker touches, and nothing else.

Private attributes and hooks of faust-streaming, mode-streaming and aiokafka are
used here only, each with a comment naming the version it was checked against
(:data:`streams.faust_adapter.hooks.CHECKED_AGAINST`) and a unit test that fails
when an upgrade breaks it (``tests/unit/streams/faust_adapter/``). The rest of
``streams/`` uses public Faust API and the functions of this package.
"""
