"""Imports point one way (docs/architecture.md): protocol ← checks ← executer/validator; chain knows nothing of node."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# node.protocol is pure: these are the only modules it may import.
PROTOCOL_ALLOWED = {"__future__", "base64", "binascii", "blake3", "collections", "dataclasses", "enum", "functools", "hashlib",
                    "itertools", "json", "math", "struct", "typing", "numpy", "sha3", "zstandard"}
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
