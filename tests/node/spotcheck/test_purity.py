"""The spot-check modules that decide (stuffing, answers, wire, feasibility, throughput, verify) do no I/O."""

from pathlib import Path

import pytest

from tests.test_layering import IO_MODULES, imports_of

ROOT = Path(__file__).resolve().parents[3]
PURE = ("errors", "stuffing", "answers", "wire", "auth", "feasibility", "throughput", "verify")
ALLOWED_NODE = ("node.protocol", "node.spotcheck.errors", "node.spotcheck.stuffing", "node.spotcheck.answers",
                "node.spotcheck.wire", "node.spotcheck.auth", "node.spotcheck.feasibility", "node.spotcheck.throughput")


@pytest.mark.parametrize("name", PURE)
def test_pure_spotcheck_modules_import_no_io_and_no_adapter(name):
    for imported in imports_of(ROOT / "node" / "spotcheck" / f"{name}.py"):
        top = imported.split(".")[0]
        assert top not in IO_MODULES, f"{name} imports {imported}"
        if top == "node":
            assert imported.startswith(ALLOWED_NODE), f"{name} imports {imported}"


def test_the_check_sees_an_adapter_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import socket\nfrom node.spotcheck.device import SimDevice\n")
    names = imports_of(bad)
    assert "socket" in names and not all(n.startswith(ALLOWED_NODE) for n in names if n.startswith("node"))
