"""``ring bench``: ring's three-broker cluster against NATS JetStream and
RabbitMQ streams on this machine, plus ceilings, the single-broker part and
the hostile-input part.

``main(argv)`` is what ``ring bench`` runs (``ring.bench.run``); the parts:
``cases`` (what runs, in which order), ``loadgen`` and ``gen_*`` (the load
generator processes), ``system``/``peer_*`` (starting and stopping the
clusters), ``procs`` (CPU and RSS from /proc), ``stats`` and ``report``
(medians, ratios, the table), ``render`` (the Markdown section), ``ceilings``,
``profile``, ``single`` and ``hostile``.
"""

from ring.bench.run import main

__all__ = ["main"]
