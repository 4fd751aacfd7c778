"""The map of ring's code in docs/ARCHITECTURE.md, generated from the code.

``python -m tests.codemap`` prints it; ``--write docs/ARCHITECTURE.md`` puts it
between the ``codemap`` markers there, and tests/test_codemap.py fails while
the committed map differs from the code's. A unit is a package under ``ring/``
(``ring/cluster``), a module directly under it (``ring/broker.py``) or
``sparkio``; an arrow A --> B says some module of A imports one of B (at its
top, in a function, or for type checking only). The units every layer
imports (``FOUNDATIONS``: limits, errors, clock) get no arrows, or the picture
would be nothing but theirs; the text after it says who uses them. Each
module is listed with the first sentence of its docstring, and marked
``awaits`` when it imports asyncio, aiohttp or a network library: the
drivers, which wait on the event loop or the network. The unmarked ones
never do; most do no I/O at all.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ring", "sparkio")
FOUNDATIONS = ("limits", "errors", "clock")
NETWORK = ("asyncio", "aiohttp", "socket", "http", "urllib", "uvloop", "httptools", "ssl", "websockets")
START, END = "<!-- codemap:start -->\n", "<!-- codemap:end -->"


def _modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module of ring and sparkio, in path order."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def unit_of(module: str) -> str:
    """``ring.cluster.node`` -> ``cluster``; ``ring.broker`` -> ``broker``; ``sparkio.x`` -> ``sparkio``."""
    parts = module.split(".")
    if parts[0] == "sparkio":
        return "sparkio"
    return parts[1] if len(parts) > 1 else "ring"


def _parse(path: Path) -> ast.AST:
    """``ast.parse`` of a file. CPython 3.11 before 3.11.8 keeps the AST converter's recursion depth in
    state shared by the interpreter's threads, so a parse that overlaps another thread's can fail with
    a spurious SystemError ("AST constructor recursion depth mismatch", python/cpython#106905); the
    same parse again succeeds."""
    source = path.read_text()
    for _ in range(2):
        try:
            return ast.parse(source, str(path))
        except SystemError:
            pass
    return ast.parse(source, str(path))


def _imports(module: str, path: Path) -> set[str]:
    """Every module name ``module`` imports, relative imports resolved."""
    tree = _parse(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _summary(path: Path) -> str:
    """The first sentence of the module's docstring (its first paragraph, up to a full stop)."""
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    paragraph = " ".join(doc.strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.!?])\s", paragraph, maxsplit=1)[0].replace("|", "/")


def graph() -> tuple[dict[str, set[str]], dict[str, list[tuple[str, str, bool]]]]:
    """Arrows between units, and per unit its modules: (module, first docstring line, imports the network)."""
    modules = _modules()
    known = {name for name, _ in modules}
    arrows: dict[str, set[str]] = defaultdict(set)
    listed: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for name, path in modules:
        imported = _imports(name, path)
        unit = unit_of(name)
        for other in imported:
            if other in known or other.rpartition(".")[0] in known:
                target = unit_of(other if other in known else other.rpartition(".")[0])
                if target != unit:
                    arrows[unit].add(target)
        network = any(i.split(".")[0] in NETWORK for i in imported)
        listed[unit].append((name, _summary(path), network))
    return arrows, listed


def render() -> str:
    arrows, listed = graph()
    units = sorted(listed, key=lambda u: (u == "sparkio", u))
    lines = ["```mermaid", "flowchart LR"]
    for unit in units:
        if unit not in FOUNDATIONS and unit != "ring":
            lines.append(f"  {unit}")
    for unit in units:
        for target in sorted(arrows.get(unit, ())):
            if target not in FOUNDATIONS and target != "ring" and unit not in FOUNDATIONS:
                lines.append(f"  {unit} --> {target}")
    lines += ["```", ""]
    for foundation in FOUNDATIONS:
        users = sorted(u for u in units if foundation in arrows.get(u, ()))
        lines.append(f"`ring/{foundation}.py` is imported by {len(users)} units: {', '.join(users)}.")
    lines += ["", "| unit | module | awaits | what it is |", "|---|---|---|---|"]
    for unit in units:
        for name, first, network in listed[unit]:
            path = name.replace(".", "/") + ("/__init__.py" if (ROOT / name.replace(".", "/")).is_dir() else ".py")
            lines.append(f"| {unit} | `{path}` | {'awaits' if network else ''} | {first} |")
    return "\n".join(lines) + "\n"


def write(path: Path) -> None:
    text = path.read_text()
    head, found, rest = text.partition(START)
    assert found and END in rest, f"{path} has no {START.strip()} ... {END} markers"
    path.write_text(head + START + render() + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"] and len(sys.argv) == 3:
        write(Path(sys.argv[2]))
    elif len(sys.argv) == 1:
        print(render(), end="")
    else:
        sys.exit("usage: python -m tests.codemap [--write docs/ARCHITECTURE.md]")
