"""The ``ring`` command: ``serve`` runs a broker, ``bench`` and ``demo`` try one out;
the client subcommands (topics, produce, consume, groups, cluster) are ``ring.commands``.

Every ``serve`` flag can also come from the environment (``RING_NAME``,
``RING_DATA_DIR``, ``RING_LISTEN``, ``RING_FSYNC``, ``RING_AUTO_CREATE``,
``RING_LOG_LEVEL``, ``RING_LOG_FORMAT``, and for the cluster ``RING_PEER_LISTEN``, ``RING_SEEDS``,
``RING_CLUSTER_SECRET``, ``RING_TOKEN``, ``RING_ADVERTISE``, ``RING_DOWN_GRACE_S``,
``RING_REPAIR_INTERVAL_S``, ``RING_RETENTION_INTERVAL_S``, ``RING_RANGE_INTERVAL_S``, ``RING_DISK_FREE_MIN_BYTES``,
``RING_MAX_CLOCK_OFFSET``, ``RING_LOOP_LAG_MS_MAX``, ``RING_REQUESTS_RUNNING_MAX``, and for security
``RING_TLS_CERT``, ``RING_TLS_KEY``, ``RING_PEER_CA``, ``RING_AUTH_TOKENS``, and for
PolarStreams' API ``RING_POLARSTREAMS``, ``RING_POLARSTREAMS_PORTS``); a flag on the
command line wins. Prefer the environment for the secret: a command line is
visible to every user of the machine. ``--tls-cert``/``--tls-key`` serve
both ports over TLS, ``--peer-ca`` makes brokers authenticate each other
with certificates (mutual TLS), ``--auth-tokens FILE`` requires client
tokens (docs/SECURITY.md). ``--polarstreams`` also serves PolarStreams' REST API
on its three ports (``ring.http_api.polar_api``): discovery on 9250, producer
on 9251, consumer on 9252 unless ``--polarstreams-ports`` says otherwise; ring's
own client API then defaults to port 9256 (and its peer port to 9257), out of
their way.

A broker is a cluster of one unless ``--seeds`` names other brokers' peer
addresses (its own may be among them). The ordinal suffix of its name
(``ring-0``, ``ring-1`` ...) gives its ring token unless ``--token`` is set;
a name without one and no ``--token`` is refused at start. The peer port
(default: the client port + 1) refuses every request without the cluster
secret. A stopped broker is reported down by the others about 4-13 s after
it stopped (phi accrual, threshold 8, 1 s gossip), up again within a gossip
round or two of its return.

SIGHUP reads the ``--auth-tokens`` file again: its tokens, grants and quotas
apply to the requests that arrive next (a file that cannot be read or parsed
is logged and the old tokens stay).

SIGTERM or SIGINT stops a broker cleanly: it hands every partition it leads
to a caught-up follower (``STOP_HANDOVER_MS_MAX`` at most, still serving),
stops accepting, gives requests in flight ``SHUTDOWN_GRACE_S`` to finish,
closes every log (leaving the clean-shutdown marker) and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

from ring import __version__, limits, logging_setup

log = logging.getLogger("ring")

ENV_PREFIX = "RING_"
_FALSE = ("0", "false", "no", "off")
LISTEN_DEFAULT = "127.0.0.1:9250"
LISTEN_DEFAULT_POLARSTREAMS = "127.0.0.1:9256"  # 9250-9255 are PolarStreams' ports (9253-9255 its own internal ones)


def _env(name: str, default: str) -> str:
    return os.environ.get(ENV_PREFIX + name, default)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"--listen must be HOST:PORT, not {text!r}")
    return (host.strip("[]") or "127.0.0.1"), int(port)


def parse_seeds(text: str) -> tuple[str, ...]:
    seeds = tuple(s.strip() for s in text.split(",") if s.strip())
    for seed in seeds:
        host, sep, port = seed.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise argparse.ArgumentTypeError(f"--seeds must be HOST:PEERPORT,..., not {seed!r}")
    return seeds


def parse_token(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--token must be an integer, not {text!r}") from None
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError("--token must be a signed 64-bit integer")
    return value


def parse_duration_ms(text: str) -> float:
    """``500ms``, ``2s``, ``1.5s`` or a bare number of milliseconds."""
    t = text.strip().lower()
    scale = 1000.0 if t.endswith("s") and not t.endswith("ms") else 1.0
    number = t[:-2] if t.endswith("ms") else t[:-1] if t.endswith("s") else t
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a duration like 500ms or 2s, not {text!r}") from None
    if not 0 < value < 1e12:
        raise argparse.ArgumentTypeError(f"a duration must be positive, not {text!r}")
    return value


def parse_label(text: str) -> str:
    """A host or zone name: 1 to 64 printable ASCII characters, no spaces."""
    if not text or len(text) > 64 or not all(33 <= ord(c) < 127 for c in text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a host or zone name (1-64 printable characters, "
                                         "no spaces)")
    return text


def parse_members(text: str) -> int:
    """``auto`` (one per core this process may run on) or a count from 1 to MEMBERS_PER_HOST_MAX."""
    if text.strip().lower() == "auto":
        return max(1, len(os.sched_getaffinity(0)))
    if not text.strip().isdigit() or not 1 <= int(text) <= limits.MEMBERS_PER_HOST_MAX:
        raise argparse.ArgumentTypeError(f"--members must be auto or 1..{limits.MEMBERS_PER_HOST_MAX}, not {text!r}")
    return int(text)


def parse_fsync(text: str):
    from ring.log.fsync import FsyncPolicy

    try:
        return FsyncPolicy.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run a broker", description="Run a broker in the foreground.")
    p.add_argument("--name", default=_env("NAME", "ring-0"), help="broker name (env RING_NAME; default ring-0)")
    p.add_argument("--data-dir", type=Path, default=None,
                   help="data directory (env RING_DATA_DIR; default ./var/<name>)")
    p.add_argument("--listen", type=parse_listen, default=_env("LISTEN", "") or None,
                   help="HOST:PORT of the client API; port 0 picks a free one (env RING_LISTEN; default "
                        f"{LISTEN_DEFAULT}, or {LISTEN_DEFAULT_POLARSTREAMS} with --polarstreams)")
    p.add_argument("--fsync", type=parse_fsync, default=_env("FSYNC", f"interval:{limits.FSYNC_INTERVAL_MS_DEFAULT}"),
                   help="always | interval[:MS] | never (env RING_FSYNC; default interval:1000)")
    p.add_argument("--no-auto-create", dest="auto_create", action="store_false",
                   default=_env("AUTO_CREATE", "true").strip().lower() not in _FALSE,
                   help="refuse produce to unknown topics (env RING_AUTO_CREATE=false)")
    p.add_argument("--log-level", type=str.lower, default=_env("LOG_LEVEL", "info"),
                   choices=["debug", "info", "warning", "error"], help="(env RING_LOG_LEVEL; default info)")
    logging_setup.add_arguments(p)  # --log-format text|json (env RING_LOG_FORMAT)
    _cluster_arguments(p)
    _interval_arguments(p)
    _security_arguments(p)
    _polarstreams_arguments(p)
    _kafka_arguments(p)
    p.set_defaults(func=_cmd_serve)


def _kafka_arguments(p: argparse.ArgumentParser) -> None:
    """Kafka's binary protocol on one more port (ring.kafka_api, docs/KAFKA.md); off unless given."""
    p.add_argument("--kafka-listen", type=parse_listen, default=_env("KAFKA_LISTEN", "") or None,
                   help="HOST:PORT of a Kafka protocol listener; port 0 picks a free one (env RING_KAFKA_LISTEN; "
                        "default none: no Kafka listener). With --auth-tokens its clients authenticate with SASL "
                        "PLAIN (user name: the token's name, password: the token); with --tls-cert it speaks TLS")
    p.add_argument("--kafka-advertise", type=parse_listen, default=_env("KAFKA_ADVERTISE", "") or None,
                   help="HOST:PORT Kafka clients reach the Kafka listener at, named in Metadata; default the "
                        "--kafka-listen address (env RING_KAFKA_ADVERTISE)")


def _cluster_arguments(p: argparse.ArgumentParser) -> None:
    """How a broker finds and is found by its peers."""
    p.add_argument("--peer-listen", type=parse_listen, default=_env("PEER_LISTEN", "") or None,
                   help="HOST:PORT of the peer API (gossip, replication); default the client host and port + 1 "
                        "(env RING_PEER_LISTEN)")
    p.add_argument("--seeds", type=parse_seeds, default=_env("SEEDS", ""),
                   help="HOST:PEERPORT,... of brokers to join through (env RING_SEEDS; none: a cluster of one)")
    p.add_argument("--cluster-secret", default=_env("CLUSTER_SECRET", "") or None,
                   help="shared secret every peer request must carry (env RING_CLUSTER_SECRET, preferred)")
    p.add_argument("--token", type=parse_token, default=_env("TOKEN", "") or None,
                   help="ring token (signed 64-bit); default from the name's ordinal suffix (env RING_TOKEN)")
    p.add_argument("--advertise", default=_env("ADVERTISE", "") or None,
                   help="host other brokers and clients reach this broker at; default the listen host "
                        "(env RING_ADVERTISE)")
    p.add_argument("--host", dest="host_label", type=parse_label, default=_env("HOST", "") or None,
                   help="the failure domain this broker runs on: no two replicas of a partition share one while "
                        "there are enough hosts (env RING_HOST; default the machine's hostname)")
    p.add_argument("--members", type=parse_members, default=_env("MEMBERS", "1"),
                   help="N | auto: run N brokers (members) on this host, one per core with auto, each its own "
                        "process, data directory and ports, all accepting on the --listen port too (env "
                        "RING_MEMBERS; default 1). See docs/OPERATIONS.md")
    p.add_argument("--member-ports", type=int, default=int(_env("MEMBER_PORTS", "0") or 0),
                   help="with --members: member i listens for clients on BASE+2i and for peers on BASE+2i+1 "
                        "(env RING_MEMBER_PORTS; default the --listen port + 10)")
    p.add_argument("--shared-port", type=int, default=None, help=argparse.SUPPRESS)  # set by --members
    p.add_argument("--zone", type=parse_label, default=_env("ZONE", "") or None,
                   help="the zone (rack, availability zone) of this broker's host: replicas go to distinct zones "
                        "while there are enough zones (env RING_ZONE; default none)")


def _interval_arguments(p: argparse.ArgumentParser) -> None:
    """How often background work runs, and the bounds past which a broker holds back."""
    p.add_argument("--down-grace-s", type=float,
                   default=float(_env("DOWN_GRACE_S", str(limits.DOWN_GRACE_S_DEFAULT))),
                   help="a broker down this long is taken off the ring and its partitions re-replicated "
                        "(env RING_DOWN_GRACE_S; default 300)")
    p.add_argument("--auto-partitions-grace-s", type=float,
                   default=float(_env("AUTO_PARTITIONS_GRACE_S", str(limits.AUTO_PARTITIONS_GRACE_MS / 1000))),
                   help="an auto topic grows once a consumer group has had more members than it has partitions "
                        "this long (env RING_AUTO_PARTITIONS_GRACE_S; default 60)")
    p.add_argument("--repair-interval-s", type=float,
                   default=float(_env("REPAIR_INTERVAL_S", str(limits.REPAIR_INTERVAL_S_DEFAULT))),
                   help="anti-entropy: compare replicas' committed segments this often (env RING_REPAIR_INTERVAL_S; "
                        "default 60)")
    p.add_argument("--retention-interval-s", type=float,
                   default=float(_env("RETENTION_INTERVAL_S", str(limits.RETENTION_CHECK_INTERVAL_MS / 1000))),
                   help="a partition's leader applies retention this often; followers follow its log start "
                        "(env RING_RETENTION_INTERVAL_S; default 30)")
    p.add_argument("--range-interval-s", type=float,
                   default=float(_env("RANGE_INTERVAL_S", str(limits.RANGE_INTERVAL_S_DEFAULT))),
                   help="a partition's leader cuts, copies and trims its ranges this often, for topics with "
                        "local_retention_bytes set (env RING_RANGE_INTERVAL_S; default 1)")
    p.add_argument("--disk-free-min-bytes", type=int,
                   default=int(_env("DISK_FREE_MIN_BYTES", str(limits.DISK_FREE_BYTES_MIN_DEFAULT))),
                   help="below this much free disk the broker takes no new range (appends go on) "
                        f"(env RING_DISK_FREE_MIN_BYTES; default {limits.DISK_FREE_BYTES_MIN_DEFAULT})")
    p.add_argument("--loop-lag-ms-max", type=int, default=int(_env("LOOP_LAG_MS_MAX", str(limits.LOOP_LAG_MS_MAX))),
                   help="refuse new produces, fetches and group polls (429) while the event loop runs this late "
                        f"(env RING_LOOP_LAG_MS_MAX; default {limits.LOOP_LAG_MS_MAX}; docs/OPERATIONS.md)")
    p.add_argument("--requests-running-max", type=int,
                   default=int(_env("REQUESTS_RUNNING_MAX", str(limits.REQUESTS_RUNNING_MAX))),
                   help="refuse new produces, fetches and group polls (429) while this many run "
                        f"(env RING_REQUESTS_RUNNING_MAX; default {limits.REQUESTS_RUNNING_MAX}; docs/OPERATIONS.md)")
    p.add_argument("--max-clock-offset", type=parse_duration_ms,
                   default=_env("MAX_CLOCK_OFFSET", f"{limits.CLOCK_OFFSET_MS_MAX_DEFAULT}ms"),
                   help="beyond this offset from most peers' clocks a broker stops leading partitions, stamping "
                        "records and applying time-based retention; it warns beyond half of it "
                        f"(env RING_MAX_CLOCK_OFFSET; default {limits.CLOCK_OFFSET_MS_MAX_DEFAULT}ms)")


def _security_arguments(p: argparse.ArgumentParser) -> None:
    """TLS on both ports and client tokens (docs/SECURITY.md)."""
    p.add_argument("--tls-cert", type=Path, default=_env("TLS_CERT", "") or None,
                   help="PEM certificate (chain) both ports serve TLS with; plaintext without it (env RING_TLS_CERT)")
    p.add_argument("--tls-key", type=Path, default=_env("TLS_KEY", "") or None,
                   help="PEM private key of --tls-cert (env RING_TLS_KEY)")
    p.add_argument("--peer-ca", type=Path, default=_env("PEER_CA", "") or None,
                   help="PEM CA that signed every broker's --tls-cert: the peer port requires a certificate "
                        "it signed, and brokers check each other against it (env RING_PEER_CA)")
    p.add_argument("--auth-tokens", type=Path, default=_env("AUTH_TOKENS", "") or None,
                   help="file of client token digests and their permissions; clients then need "
                        "'Authorization: Bearer TOKEN' (env RING_AUTH_TOKENS; docs/SECURITY.md)")


def _polarstreams_arguments(p: argparse.ArgumentParser) -> None:
    """PolarStreams' REST API beside ring's (docs/POLARSTREAMS.md)."""
    p.add_argument("--polarstreams", action="store_true",
                   default=_env("POLARSTREAMS", "false").strip().lower() not in (*_FALSE, ""),
                   help="also serve PolarStreams' REST API, on its discovery, producer and consumer ports at the "
                        "listen host; ring's client API then defaults to port 9256 and its peer port to 9257 "
                        "(env RING_POLARSTREAMS=true)")
    p.add_argument("--polarstreams-ports", default=_env("POLARSTREAMS_PORTS", "9250,9251,9252"),
                   metavar="DISCOVERY,PRODUCER,CONSUMER",
                   help="PolarStreams' ports, the same on every broker (env RING_POLARSTREAMS_PORTS; "
                        "default 9250,9251,9252)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ring", description="A distributed, replicated event log over HTTP.")
    parser.add_argument("--version", action="version", version=f"ring {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    bench = sub.add_parser("bench", help="benchmark a local broker (ring bench --help)", add_help=False)
    bench.set_defaults(func=_cmd_bench)
    demo = sub.add_parser("demo", help="start a broker, produce a clickstream, read it back")
    demo.set_defaults(func=_cmd_demo)
    from ring import commands  # topics, produce, consume, groups, cluster

    commands.register(sub)
    return parser


def _cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    from ring import bench

    return bench.main(rest)


def _cmd_demo(args: argparse.Namespace, rest: list[str]) -> int:
    from ring import demo

    return demo.main()


def listen_address(args: argparse.Namespace) -> tuple[str, int]:
    """--listen (or RING_LISTEN), else the default: 9250, or 9256 with --polarstreams (PolarStreams' ports
    9250-9252 are then its discovery, producer and consumer ports)."""
    listen = args.listen or (LISTEN_DEFAULT_POLARSTREAMS if args.polarstreams else LISTEN_DEFAULT)
    return parse_listen(listen) if isinstance(listen, str) else listen


def _cmd_serve(args: argparse.Namespace, rest: list[str]) -> int:
    if rest:
        print(f"ring serve: unknown arguments {' '.join(rest)}", file=sys.stderr)
        return 2
    if args.members > 1 and args.kafka_listen:
        print("ring serve: --kafka-listen is for one broker a process, not --members yet", file=sys.stderr)
        return 2
    if args.members > 1:
        from ring.commands.members import run_members

        args.listen = args.listen or parse_listen(LISTEN_DEFAULT)
        return run_members(args)
    _catch_early_signals()
    try:
        polar = _parse_serve_arguments(args)
        from ring.tls import TlsConfig

        tls = TlsConfig(args.tls_cert, args.tls_key, args.peer_ca)
        tls.check()
        tokens = _load_tokens(args.auth_tokens)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        print(f"ring serve: {exc}", file=sys.stderr)
        return 2
    config = _broker_config(args, tls)
    from ring.cluster.node import token_of

    try:
        token_of(config)
    except ValueError as exc:
        print(f"ring serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:
        uvloop = None
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop if uvloop else None)
    with runner:
        return runner.run(serve(config, access_log=args.log_level == "debug", tokens=tokens, polar=polar,
                                bounds=(args.loop_lag_ms_max, args.requests_running_max),
                                tokens_path=args.auth_tokens, kafka=(args.kafka_listen, args.kafka_advertise)))


def _parse_serve_arguments(args: argparse.Namespace):
    """Parse the values that came through the environment (argparse types only parse flags) and
    configure logging; PolarStreams' ports (``polar_api.Ports``) with --polarstreams, else None.
    ArgumentTypeError or ValueError for a value that does not parse or a port taken twice."""
    args.listen = listen_address(args)
    if isinstance(args.fsync, str):
        args.fsync = parse_fsync(args.fsync)
    for name, parse in (("peer_listen", parse_listen), ("seeds", parse_seeds), ("token", parse_token),
                        ("max_clock_offset", parse_duration_ms)):
        if isinstance(getattr(args, name), str):
            setattr(args, name, parse(getattr(args, name)))
    if args.loop_lag_ms_max <= 0 or args.requests_running_max <= 0:
        raise ValueError("--loop-lag-ms-max and --requests-running-max must be above 0")
    for name in ("kafka_listen", "kafka_advertise"):
        if isinstance(getattr(args, name), str):
            setattr(args, name, parse_listen(getattr(args, name)))
    if args.kafka_advertise is not None and args.kafka_listen is None:
        raise ValueError("--kafka-advertise needs --kafka-listen")
    polar = None
    if args.polarstreams:
        from ring.http_api.polar_api import Ports

        polar = Ports.parse(args.polarstreams_ports)
        taken = {args.listen[1], args.peer_listen[1] if args.peer_listen else args.listen[1] + 1} & set(polar)
        if taken - {0}:
            raise ValueError(f"port {min(taken - {0})} is both one of ring's (--listen, --peer-listen) and one of "
                             f"--polarstreams-ports {args.polarstreams_ports}")
    logging_setup.configure(args.log_level, args.log_format)
    return polar


def _broker_config(args: argparse.Namespace, tls):
    from ring.config import BrokerConfig

    host, port = args.listen
    peer_host, peer_port = args.peer_listen or (host, None)  # None: the client port + 1
    return BrokerConfig(tls=tls, name=args.name, data_dir=args.data_dir or Path(_env("DATA_DIR", f"./var/{args.name}")),
                        host=host, port=port, fsync=args.fsync, auto_create=args.auto_create, peer_host=peer_host,
                        peer_port=peer_port, seeds=args.seeds, cluster_secret=args.cluster_secret,
                        token=args.token, advertise=args.advertise, host_label=args.host_label, zone=args.zone,
                        shared_port=args.shared_port,
                        down_grace_s=args.down_grace_s,
                        repair_interval_s=args.repair_interval_s,
                        auto_partitions_grace_s=args.auto_partitions_grace_s,
                        retention_interval_s=args.retention_interval_s, max_clock_offset_ms=args.max_clock_offset,
                        range_interval_s=args.range_interval_s, disk_free_min_bytes=args.disk_free_min_bytes)


def _load_tokens(path: Path | None):
    """The --auth-tokens file as a ``ring.auth.TokenTable``; None without one. ValueError if unusable."""
    if path is None:
        return None
    from ring.auth import TokenTable

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read --auth-tokens {path}: {exc}") from None
    table = TokenTable.parse(text, str(path))
    if not len(table):
        raise ValueError(f"--auth-tokens {path} holds no token: every client request would be refused")
    return table


async def serve(config, access_log: bool = False, tokens=None, polar=None, bounds=None, tokens_path=None,
                clock=None, rng=None, kafka=(None, None)) -> int:
    """Run one broker until SIGTERM/SIGINT; returns the exit code. ``polar``: PolarStreams' ports
    (``polar_api.Ports``) to serve its API on too; ``bounds``: the admission's (loop lag ms, requests
    running); ``tokens_path``: the file ``tokens`` came from, read again on SIGHUP; ``clock`` and
    ``rng``: the broker's clock and random source (default the system clock and an unseeded one; the
    simulation passes its virtual clock and a seeded source); ``kafka``: the (HOST, PORT) of a Kafka
    listener and the one it is advertised at (None, None: no listener)."""
    import random

    from ring.clock import SystemClock
    from ring.cluster.node import ClusterBroker
    from ring.errors import RingError, UnsupportedFormat
    from ring.http_api.app import make_app
    from ring.http_api.peer import make_peer_app
    from ring.http_api.server import PeerServer, Server

    broker = ClusterBroker(config, clock or SystemClock(), rng or random.Random())
    # Both ports listen before the broker opens (port 0 picks one, and gossip
    # must advertise the real one); until it has joined, clients get 503.
    default_peer = config.peer_port is None
    peer_port = (config.port + 1 if config.port else 0) if default_peer else config.peer_port
    peer_server = PeerServer(make_peer_app(broker, config.cluster_secret), config.peer_host, peer_port,
                         access_log=access_log, ssl_context=config.tls.peer_port_context(),
                         connections_max=limits.PEER_CONNECTIONS_OPEN_MAX)
    app = make_app(broker, tokens)
    if bounds is not None:
        app.admission.lag_ms_max, app.admission.running_max = bounds
    server = Server(app, config.host, config.port, access_log=access_log,
                    ssl_context=config.tls.client_port_context())
    server.shared_port = config.shared_port
    listeners = None
    if polar is not None:
        from ring.http_api.groups_api import GROUPS_KEY
        from ring.http_api.polar_api import Listeners

        listeners = Listeners(broker, app[GROUPS_KEY], config.host, polar, tokens, access_log)
    if tokens is None:
        log.info("no --auth-tokens: every client request is let in")
    else:
        log.info("client authentication on: %d tokens", len(tokens))
    started = await _listen(config, peer_server, server, listeners, polar, default_peer)
    if started is None:
        return 1
    kafka_addr = None
    if kafka[0] is not None:
        from ring.kafka_api.server import KafkaListener

        from ring.http_api.groups_api import GROUPS_KEY

        kafka_listener = KafkaListener(broker, *kafka[0], groups=app[GROUPS_KEY], tokens=tokens,
                                       ssl_context=config.tls.client_port_context(),
                                       admission=app.admission)
        try:
            await kafka_listener.start()
        except OSError as exc:
            log.error("cannot listen for Kafka clients on %s:%d: %s", *kafka[0], exc)
            for s in started:
                await s.stop()
            return 1
        started.insert(0, kafka_listener)
        host, port = kafka[1] or (kafka[0][0], kafka_listener.port)
        kafka_addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    broker.bind(server.port, peer_server.port, kafka_addr)
    stop = _stop_on_signals()  # a SIGTERM while starting stops the broker cleanly once it has started
    try:
        broker.open()
    except (RingError, OSError) as exc:
        log.error("cannot open data directory %s: %s", config.data_dir, exc)
        for s in started:
            await s.stop()
        return 2 if isinstance(exc, UnsupportedFormat) else 1  # (2: the release, not the disk, is wrong)
    await broker.start()
    from ring.commands.callcount import install_if_asked

    install_if_asked(asyncio.get_running_loop())  # (off unless ``ring bench --cases cpu`` asks)
    # What startup built (modules, routes, open logs) lives as long as the process: out of the cyclic
    # collector's way, whose full passes would otherwise walk all of it, stalling every request ~25 ms.
    gc.freeze()
    if tokens is not None and tokens_path is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, _reload_tokens, tokens_path, tokens,
                                                      app.admission)
    polar_urls = f"; PolarStreams {' '.join(listeners.urls)}" if listeners is not None else ""
    kafka_url = f"; Kafka {kafka_addr}" if kafka_addr is not None else ""
    print(f"{config.name} listening on {server.url} (peer {peer_server.url}{polar_urls}{kafka_url})", flush=True)
    await stop.wait()
    log.info("%s shutting down", config.name)
    await broker.hand_over()  # (controlled shutdown: still serving, so what moved is forwarded)
    broker.begin_shutdown()
    for s in started:
        await s.stop()
    await broker.close()
    log.info("%s stopped cleanly", config.name)
    return 0


_early_stop: list[int] = []  # signals that came before the event loop's handlers were installed


def _catch_early_signals() -> None:
    """From the start of ``ring serve``: a SIGTERM or SIGINT before the broker's loop runs is kept, and
    stops it cleanly once it has started (a supervisor may stop a member that is still starting)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: _early_stop.append(signum))


def _reload_tokens(path: Path, tokens, admission) -> None:
    """SIGHUP: the tokens file again, into the table every guard holds; the old one stays if it is unusable."""
    try:
        fresh = _load_tokens(path)
    except ValueError as exc:
        log.error("kept the client tokens: %s", exc)
        return
    tokens.replace(fresh)
    admission.reloaded(tokens.names())
    log.info("client tokens reloaded from %s: %d tokens", path, len(tokens))


def _stop_on_signals() -> asyncio.Event:
    """An event SIGTERM and SIGINT set from now on (set already if one came since ``_catch_early_signals``)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if _early_stop:
        stop.set()
    return stop


async def _listen(config, peer_server, server, listeners, polar, default_peer: bool):
    """Start every server (peer port first); the ones started, or None (all stopped again) when one
    cannot listen. A broker alone whose default peer port is taken takes any free one."""
    peer_port = peer_server.port
    for srv in (peer_server, server):
        try:
            await srv.start()
        except OSError as exc:
            if srv is peer_server and default_peer and not config.seeds and not config.cluster_secret:
                # A broker alone refuses every peer request anyway: any free port will do.
                log.warning("peer port %d is taken; a broker alone takes any free one", peer_port)
                await srv.stop()
                srv.port = 0
                await srv.start()
                continue
            log.error("cannot listen on %s:%d: %s", srv.host, srv.port, exc)
            await peer_server.stop()
            return None
    started = [s for s in (listeners, server, peer_server) if s is not None]
    if listeners is not None:
        try:
            await listeners.start()
        except OSError as exc:
            log.error("cannot listen on PolarStreams' ports %s at %s: %s", ",".join(map(str, polar)), config.host, exc)
            for s in started[1:]:
                await s.stop()
            return None
    return started


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    args.serve_argv = argv  # (``serve --members`` starts each member with the same flags and its own)
    return args.func(args, rest)


if __name__ == "__main__":
    sys.exit(main())
