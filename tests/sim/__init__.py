"""A seeded, replayable simulation of a ring cluster: real replica cores and logs, simulated time and network.

``network.py`` is the world (one clock, one event queue, a lossy network of
requests and ordered replication links), ``broker.py`` a broker made of
ring's own decision code and partition logs (``links.py`` its replication
links, ``disk.py`` its fsyncs and repair), ``run.py`` one run of a seed
checked by the chaos checker. ``tests/test_sim.py`` runs many seeds; a
failing seed replays exactly with ``RING_SIM_SEED=N``.
"""
