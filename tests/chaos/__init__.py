"""Faults against real brokers, with a checker: ``make chaos`` and the short runs in ``make test``.

A run (``harness.run``) starts three real brokers (``cluster.py``) placed by
a network (``network.py``), creates a topic, runs producers of unique values
and consumers (``workload.py``) while a scenario (``scenarios.py``) injects
faults (``faults.py``: SIGKILL, SIGSTOP, partitions, power loss with a torn
tail, bit flips), heals everything, drains every broker and replica, and
hands the ``History`` (``history.py``) to the pure checker (``checker.py``).
Partitions are iptables rules between per-broker network namespaces
(``netns.py``) where the machine allows it, else a fault-injecting TCP proxy
between brokers on loopback (``proxy.py``). ``python -m tests.chaos`` runs
the scenarios and writes the table in docs/RELIABILITY.md (``report.py``).
"""
