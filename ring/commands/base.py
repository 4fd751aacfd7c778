"""What every client subcommand shares: connection options, exit codes, error
reporting, and output for people (aligned tables) or machines (``--json``).

Each subcommand is a function ``(ctx, args) -> int`` wrapped by ``command``,
which turns failures into exit codes the shell can test: 0 done, 1 the API
refused (its JSON error's message goes to stderr), 2 bad usage (as argparse
itself exits), 3 no broker could be reached, 130 interrupted (143 on
SIGTERM, after the same orderly ending as Ctrl-C). A broken pipe
(``ring consume t | head``) ends the command quietly with 0: the reader
wanted no more. ``--brokers`` (``RING_BROKERS``) lists any brokers of the
cluster; ``--token`` (``RING_CLIENT_TOKEN``) is sent as ``Authorization: Bearer``;
``--ca-file`` (``RING_CA_FILE``) checks ``https://`` brokers against a private CA.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import orjson

from ring import errors

EXIT_OK = 0
EXIT_API = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it
EXIT_TERMINATED = 143  # 128 + SIGTERM

BROKERS_ENV = "RING_BROKERS"
TOKEN_ENV = "RING_CLIENT_TOKEN"  # RING_TOKEN is the broker's ring position (ring serve --token)
CA_FILE_ENV = "RING_CA_FILE"
BROKERS_DEFAULT = "http://127.0.0.1:9250"

# The client library's messages read "GET /v1/topics/x: 404 unknown topic 'x'";
# a person at a shell wants the broker's own message.
_PREFIXED = re.compile(r"^.*?: (\d{3}) ?(.*)$", re.DOTALL)


class UsageError(Exception):
    """The command line is wrong (exit 2): said before anything is sent."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an exception so a command ends as on Ctrl-C: the
    producer flushes, a group member commits what it printed and leaves."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


class Unreachable(errors.Unavailable):
    """No broker answered at all (exit 3)."""

    code = "unreachable"


def common_options() -> argparse.ArgumentParser:
    """Options every client subcommand takes, at any level (``ring topics --json list``
    or ``ring topics list --json``): SUPPRESS keeps a lower level from erasing a higher one."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("connection and output")
    g.add_argument("--brokers", metavar="URLS", default=argparse.SUPPRESS,
                   help=f"comma-separated broker URLs, any of the cluster (env {BROKERS_ENV}; "
                        f"default {BROKERS_DEFAULT})")
    g.add_argument("--token", metavar="TOKEN", default=argparse.SUPPRESS,
                   help=f"client token, sent as 'Authorization: Bearer TOKEN' (env {TOKEN_ENV})")
    g.add_argument("--ca-file", metavar="PEM", default=argparse.SUPPRESS,
                   help=f"CA certificate that https:// brokers are checked against (env {CA_FILE_ENV}; "
                        "default the system's CAs)")
    g.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="machine output: JSON on stdout (records as NDJSON), errors as JSON on stderr")
    return p


COMMON = common_options()


@dataclass
class Context:
    prog: str  # "ring topics create", for messages
    brokers: list[str]
    token: str | None
    json: bool
    ca_file: str | None = None
    stdout: Any = field(default_factory=lambda: sys.stdout)
    stderr: Any = field(default_factory=lambda: sys.stderr)

    @classmethod
    def from_args(cls, args: argparse.Namespace, prog: str) -> Context:
        from ring.client.topology import parse_brokers

        raw = getattr(args, "brokers", None) or os.environ.get(BROKERS_ENV) or BROKERS_DEFAULT
        try:
            brokers = parse_brokers(raw)
        except errors.BadRequest as exc:
            raise UsageError(f"--brokers: {exc.message}") from None
        token = getattr(args, "token", None) or os.environ.get(TOKEN_ENV) or None
        ca_file = getattr(args, "ca_file", None) or os.environ.get(CA_FILE_ENV) or None
        if ca_file is not None and not os.path.isfile(ca_file):
            raise UsageError(f"--ca-file: no such file {ca_file!r}")
        return cls(prog, brokers, token, bool(getattr(args, "json", False)), ca_file)

    # --- talking to brokers -------------------------------------------------------------

    def api(self, timeout_s: float | None = None, retry_timeout_s: float | None = None):
        """Blocking JSON calls with failover (``ring.commands.api.Api``)."""
        from ring.commands.api import Api

        return Api(self.brokers, self.token, timeout_s=timeout_s, ca_file=self.ca_file,
                   retry_timeout_s=retry_timeout_s)

    def reachable(self) -> None:
        """Fail fast with exit 3 when no broker answers, instead of after the client's retries."""
        if self.api().probe() is None:
            raise Unreachable(f"cannot reach any broker: {', '.join(self.brokers)}")

    def client_options(self, **options: Any) -> dict[str, Any]:
        return {"token": self.token, "ca_file": self.ca_file, **options}

    def client(self, **options: Any):
        """A sync ``ring.client.Client`` with the command's token and CA (use it in ``with``)."""
        from ring.client import Client

        self.reachable()
        return Client(self.brokers, **self.client_options(**options))

    # --- output ----------------------------------------------------------------------------

    def emit(self, doc: Any) -> None:
        """One JSON document on stdout: indented for a terminal, one line for a pipe."""
        opt = orjson.OPT_INDENT_2 if self.stdout.isatty() else 0
        self.stdout.write(orjson.dumps(doc, option=opt | orjson.OPT_NON_STR_KEYS).decode() + "\n")

    def say(self, text: str) -> None:
        self.stdout.write(text + "\n")

    def note(self, text: str) -> None:
        """A remark for the person, never for a pipe reading stdout."""
        self.stderr.write(text + "\n")


def quote(name: str) -> str:
    """A name as one URL path segment."""
    return urllib.parse.quote(name, safe="")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Aligned columns, numbers to the right; empty cells as '-'."""
    cells = [[("-" if v is None or v == "" else str(v)) for v in row] for row in rows]
    numeric = [all(_is_number(r[i]) for r in cells) and any(r[i] != "-" for r in cells)
               for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(r) for r in cells)])


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-|-?\d+(\.\d+)?", text))


# --- running a subcommand -------------------------------------------------------------------


def error_message(exc: errors.RingError) -> str:
    match = _PREFIXED.match(exc.message)
    if match and str(exc.extra.get("status", "")) == match.group(1) and match.group(2):
        return match.group(2)
    return exc.message


def report(ctx: Context, exc: errors.RingError) -> None:
    message = error_message(exc)
    if ctx.json:
        doc = {"error": exc.code, "message": message,
               **{k: v for k, v in exc.extra.items() if isinstance(v, (str, int, float, bool, type(None)))}}
        ctx.stderr.write(orjson.dumps(doc).decode() + "\n")
    else:
        ctx.stderr.write(f"{ctx.prog}: {message}\n")


def command(handler: Callable[[Context, argparse.Namespace], int]) -> Callable[[argparse.Namespace, list[str]], int]:
    """The ``func`` argparse calls: parse leftovers, run, map failures to exit codes."""

    def run(args: argparse.Namespace, rest: list[str]) -> int:
        parser: argparse.ArgumentParser = args._parser
        prog = parser.prog
        try:
            if rest:
                raise UsageError(f"unrecognized arguments: {' '.join(rest)}")
            ctx = Context.from_args(args, prog)
        except UsageError as exc:
            parser.print_usage(sys.stderr)
            sys.stderr.write(f"{prog}: error: {exc}\n")
            return EXIT_USAGE
        # The client library warns through logging; a command shows warnings only, tersely.
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.WARNING, format=f"{prog}: %(message)s", stream=sys.stderr)
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _on_sigterm) if main else None
        try:
            return handler(ctx, args)
        except UsageError as exc:
            parser.print_usage(sys.stderr)
            sys.stderr.write(f"{prog}: error: {exc}\n")
            return EXIT_USAGE
        except Unreachable as exc:
            report(ctx, exc)
            return EXIT_UNREACHABLE
        except errors.RingError as exc:
            report(ctx, exc)
            if _is_connection_failure(exc) and ctx.api().probe() is None:
                return EXIT_UNREACHABLE
            return EXIT_API
        except Terminated:
            return EXIT_TERMINATED
        except KeyboardInterrupt:
            ctx.stderr.write("\n")
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            # Whoever read stdout has gone: stop quietly, and keep Python from
            # complaining about the unflushable stdout at exit.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_OK
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)

    return run


def _is_connection_failure(exc: errors.RingError) -> bool:
    from ring.client.transport import BrokersUnavailable, BrokerUnreachable

    return isinstance(exc, (BrokersUnavailable, BrokerUnreachable))


def add_command(sub: argparse._SubParsersAction, name: str, handler: Callable, **kw: Any) -> argparse.ArgumentParser:
    """A leaf subcommand with the common options, run through ``command``."""
    p = sub.add_parser(name, parents=[COMMON], **kw)
    p.set_defaults(func=command(handler), _parser=p)
    return p


def add_group(sub: argparse._SubParsersAction, name: str, **kw: Any) -> argparse._SubParsersAction:
    """A command with its own subcommands (``ring topics create``)."""
    p = sub.add_parser(name, parents=[COMMON], **kw)
    return p.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
