"""The workload record's data model, trace export and device registry do no I/O, like node/protocol."""

from pathlib import Path

import pytest

from tests.test_layering import IO_MODULES, imports_of

ROOT = Path(__file__).resolve().parents[3]
PURE = ("model", "chrome", "devices", "errors", "graph_keys")
ALLOWED_NODE = ("node.errors", "node.protocol", "node.workload.model", "node.workload.errors")


@pytest.mark.parametrize("name", PURE)
def test_pure_workload_modules_import_no_io_and_no_adapter(name):
    for imported in imports_of(ROOT / "node" / "workload" / f"{name}.py"):
        top = imported.split(".")[0]
        assert top not in IO_MODULES | {"iree", "torch_mlir", "safetensors"}, f"{name} imports {imported}"
        if top == "node":
            assert imported.startswith(ALLOWED_NODE), f"{name} imports {imported}"
