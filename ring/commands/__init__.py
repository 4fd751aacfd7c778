"""The client subcommands of ``ring``: ``topics``, ``produce``, ``consume``,
``groups`` and ``cluster`` (``ring.cli`` registers them beside ``serve``),
and ``members``, which runs ``ring serve --members N``'s brokers.

They follow shell habits: records in on stdin and out on stdout, one per
line; people get sentences and aligned tables, ``--json`` gives machines
the API's documents (records as NDJSON); messages and progress go to
stderr; exit codes say what happened (0 done, 1 the API refused, 2 bad
usage, 3 no broker reachable). Each module is one command; ``base`` holds
what they share. Modules import the client lazily, so ``ring serve`` and
``ring --help`` do not pay for it.
"""

from __future__ import annotations

import argparse

from ring.commands import cluster, consume, groups, produce, topics


def register(sub: argparse._SubParsersAction) -> None:
    """Add every client subcommand to the ``ring`` parser's subcommands."""
    topics.register(sub)
    produce.register(sub)
    consume.register(sub)
    groups.register(sub)
    cluster.register(sub)
