"""The node core: one broker's protocol orchestration as a synchronous state machine (``core.py``).

See ``core.py`` for the theory of operation and ``ready.py`` for what goes in
and comes out. Nothing in this package awaits, opens a socket, reads a clock
or draws a random number: time and the seeded random source are arguments,
so the simulation (tests/sim) runs this very code under a simulated network,
disk and clock.
"""
