"""Imports point one way (docs/architecture.md): protocol ← checks ← executer/validator; chain knows nothing of node."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# node.protocol is pure: these are the only modules it may import.
PROTOCOL_ALLOWED = {"__future__", "base64", "binascii", "blake3", "collections", "dataclasses", "enum", "functools",
                    "hashlib", "itertools", "json", "math", "struct", "typing", "numpy", "sha3", "zstandard"}
# I/O, clocks, randomness and heavy adapters that pure code must never touch.
IO_MODULES = {"os", "io", "sys", "socket", "asyncio", "time", "datetime", "random", "subprocess", "pathlib",
              "logging", "threading", "multiprocessing", "shutil", "tempfile", "requests", "aiohttp", "web3",
              "plyvel", "libp2p", "trio", "torch", "transformers", "vllm", "urllib", "http", "secrets", "uuid"}


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import; use absolute imports so layering is checkable")
            names.add(node.module or "")
    return names


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", files("node/protocol"), ids=str)
def test_protocol_imports_only_itself_and_pure_libraries(path):
    for name in imports_of(path):
        top = name.split(".")[0]
        if top == "node":
            assert name.startswith("node.protocol"), f"{path} imports {name}"
        else:
            assert top in PROTOCOL_ALLOWED, f"{path} imports {name}, not on the pure-protocol list"


@pytest.mark.parametrize("path", files("node/checks"), ids=str)
def test_checks_use_protocol_only_and_no_io(path):
    for name in imports_of(path):
        top = name.split(".")[0]
        if top == "node":
            assert name.startswith(("node.protocol", "node.checks", "node.errors", "node.engines.base")), name
        else:
            assert top not in IO_MODULES, f"{path} imports {name}"


@pytest.mark.parametrize("path", files("chain"), ids=str)
def test_chain_imports_nothing_from_node(path):
    assert not any(n == "node" or n.startswith("node.") for n in imports_of(path)), path


@pytest.mark.parametrize("path", files("node"), ids=str)
def test_library_code_does_not_print(path):
    if path.name == "cli.py":
        return
    calls = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "print"]
    assert not calls, f"{path} prints; use logging"


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom node.validator import x\n")
    assert imports_of(bad) == {"socket", "node.validator"}


PRODUCTION = ("node/protocol", "node/checks", "node/engines", "node/executer", "node/validator", "node/store",
              "node/p2p")


@pytest.mark.parametrize("path", [p for package in PRODUCTION for p in files(package)], ids=str)
def test_production_code_never_imports_the_demo_or_the_cheaters(path):
    # the cheating engines (node.calibrate) and the devnet exist to attack and exercise the node, never to run in it
    assert not any(n.startswith(("node.devnet", "node.calibrate", "node.moe.attacks", "node.moe.calibration"))
                   for n in imports_of(path)), path


# ---- the floor map (docs/architecture.md; issue 33) -------------------------------------------------------------
# Imports point down or stay on their floor. A room is a package (or a top-level module) of node/ or chain.
FLOORS = {"node.protocol": 0, "node.errors": 1, "node.keys": 1, "node.logs": 1, "chain": 2,
          "node.engines": 3, "node.store": 3, "node.p2p": 3, "node.checks": 3, "node.profiles": 3,
          "node.executer": 4, "node.validator": 4, "node.moe": 4, "node.training": 4, "node.spotcheck": 4,
          "node.workload": 4, "node.selfcheck": 4, "node.devnet": 5, "node.calibrate": 5, "node.cli": 6}
# Arrows that still point up, by importing module → room: each is to be removed, and this list may only shrink.
KNOWN_UPWARD: set[tuple[str, str]] = set()  # none left (the MoE builder is named in config/models.toml)
# Rooms that import each other (directly or around a circle), as sets: each is to be broken; may only shrink.
KNOWN_CIRCLES = [
    {"node.executer", "node.moe", "node.validator", "node.workload"},
]


def room_of(module: str) -> str | None:
    """Return the room a dotted module belongs to (None: not ours)."""
    if module.startswith("node.cli"):
        return "node.cli"
    for room in sorted(FLOORS, key=len, reverse=True):
        if module == room or module.startswith(room + "."):
            return room
    return None


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_edges(paths: list[Path]) -> set[tuple[str, str]]:
    """Return (importing module, imported room) for every import between two different rooms."""
    edges = set()
    for path in paths:
        source = module_of(path)
        for name in imports_of(path):
            room = room_of(name)
            if room is not None and room != room_of(source):
                edges.add((source, room))
    return edges


def upward(edges: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return {(m, r) for m, r in edges if FLOORS[r] > FLOORS[room_of(m) or r]}


def circles(edges: set[tuple[str, str]]) -> list[set[str]]:
    """Return the strongly connected groups of rooms (more than one room each)."""
    graph: dict[str, set[str]] = {room: set() for room in FLOORS}
    for m, r in edges:
        graph[room_of(m) or r].add(r)
    reach = {room: set(graph[room]) for room in graph}
    for _ in FLOORS:  # transitive closure (few rooms)
        for room in reach:
            reach[room] |= set().union(*(reach[r] for r in reach[room]))
    groups = {frozenset({a} | {b for b in reach[a] if a in reach[b]}) for a in graph}
    return sorted((set(g) for g in groups if len(g) > 1), key=sorted)


EDGES = import_edges([p for base in ("node", "chain") for p in files(base) if room_of(module_of(p))])


def test_every_module_has_a_floor():
    assert not [p for base in ("node", "chain") for p in files(base) if room_of(module_of(p)) is None
                and module_of(p) != "node"]


def test_no_import_points_up_but_the_known_ones():
    assert upward(EDGES) == KNOWN_UPWARD, "a new upward import (or a known one removed: shrink KNOWN_UPWARD)"


def test_no_circle_but_the_known_ones():
    assert circles(EDGES) == sorted(KNOWN_CIRCLES, key=sorted), "a new circle (or one broken: shrink KNOWN_CIRCLES)"


def test_the_floor_checker_sees_a_planted_upward_import_and_circle(tmp_path):
    planted = ROOT / "node" / "protocol" / "_planted_for_test.py"
    planted.write_text("from node.validator import daemon\n")
    try:
        edges = import_edges([planted]) | {("node.validator.daemon", "node.protocol")}
        assert ("node.protocol._planted_for_test", "node.validator") in upward(edges)
        assert {"node.protocol", "node.validator"} in circles(edges)
    finally:
        planted.unlink()


def test_no_file_refers_to_a_file_outside_the_repository():
    """The spec lives in the repository (docs/): no code, contract, test, script or doc cites the shared design file."""
    roots = ["node", "chain", "contracts/src", "contracts/test", "tests", "scripts", "docs", ".ci"]
    paths = [p for r in roots for p in (ROOT / r).rglob("*") if p.is_file() and p.suffix in
             {".py", ".sol", ".md", ".toml", ".sh", ""} and p != Path(__file__).resolve()]
    paths += [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "Dockerfile"]
    cited = [str(p.relative_to(ROOT)) for p in paths
             if any(s in p.read_text(errors="replace") for s in ("DESIGN.md", "DESIGN §", "../shared"))]
    assert not cited, cited
