"""The replay decision cannot be fooled by NaN or inf: properties over the tolerance decision and real replays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from typer.testing import CliRunner

from node.cli_workload import workload_app
from node.workload.graph import build_graph
from node.workload.model import Device, Graph, Trace, TraceEvent
from node.workload.replay import (
    DEFAULT_TOLERANCES,
    ReplayMismatch,
    ReplayResult,
    compare_output,
    decide_replay,
    is_replay_match,
    replay_arrays,
)
from node.workload.store import WorkloadRecord

NONFINITE = (np.nan, np.inf, -np.inf)
FINITE = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False, width=32)
ANY_FLOAT = st.floats(width=32)  # NaN and ±inf included


def decide(claimed: np.ndarray, replayed: np.ndarray, dtype: str = "float32") -> ReplayMismatch:
    comparison = compare_output("out", dtype, claimed, replayed)
    return decide_replay(ReplayResult("g", False, 0.0, 0.0, (comparison,), ())).reason


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 40), elements=ANY_FLOAT))
def test_identical_outputs_match_even_with_nan_and_inf(values: np.ndarray) -> None:
    assert decide(values, values.copy()) is ReplayMismatch.OK


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 40), elements=FINITE), st.data())
def test_a_nonfinite_value_where_the_other_side_differs_is_a_mismatch(values: np.ndarray, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, values.size - 1))
    bad = data.draw(st.sampled_from(NONFINITE))
    other = data.draw(st.sampled_from([v for v in NONFINITE if not (np.isnan(v) and np.isnan(bad)) and v != bad]
                                      + [float(values[i])]))
    claimed, replayed = values.copy(), values.copy()
    claimed[i], replayed[i] = bad, other
    assert decide(claimed, replayed) is ReplayMismatch.NON_FINITE
    assert decide(replayed, claimed) is ReplayMismatch.NON_FINITE  # either side


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 40), elements=FINITE), st.sampled_from(NONFINITE),
       st.integers(0, 2))
def test_all_nonfinite_claims_never_match_a_finite_replay(values: np.ndarray, bad: float, how: int) -> None:
    """All NaN, all inf, or one NaN among wrong values: every one a mismatch with its own reason."""
    claimed = np.full_like(values, bad) if how < 2 else (values + 1000.0).astype(np.float32)
    if how == 2:
        claimed[0] = bad
    assert decide(claimed, values) is ReplayMismatch.NON_FINITE
    assert decide(values, claimed) is ReplayMismatch.NON_FINITE


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 40), elements=FINITE), st.data())
def test_the_tolerance_decides_finite_values(values: np.ndarray, data: st.DataObject) -> None:
    atol, rtol = DEFAULT_TOLERANCES["float32"]
    i = data.draw(st.integers(0, values.size - 1))
    moved = values.astype(np.float64)
    scale = max(atol, rtol * abs(float(values[i])))
    moved[i] += data.draw(st.sampled_from([-1, 1])) * scale * data.draw(st.floats(0.0, 0.5))
    assert decide(values, moved.astype(np.float32)) is ReplayMismatch.OK
    far = values.astype(np.float64)
    far[i] += 4 * scale + 1.0
    assert decide(values, far.astype(np.float32)) is ReplayMismatch.OUT_OF_TOLERANCE


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.int64, st.integers(1, 20), elements=st.integers(2**53, 2**62)), st.data())
def test_integers_are_exact_beyond_float64(values: np.ndarray, data: st.DataObject) -> None:
    i = data.draw(st.integers(0, values.size - 1))
    other = values.copy()
    other[i] += 1  # lost in a float64 comparison
    assert decide(values, values.copy(), "int64") is ReplayMismatch.OK
    assert decide(values, other, "int64") is ReplayMismatch.NOT_EXACT


def test_shape_and_empty_results() -> None:
    assert decide(np.zeros(3, np.float32), np.zeros(4, np.float32)) is ReplayMismatch.SHAPE
    assert decide_replay(ReplayResult("g", False, 0, 0, (), ("out",))).reason is ReplayMismatch.NO_OUTPUTS


POWER_MLIR = """module {
  func.func @main(%arg0: tensor<6xf32>, %arg1: tensor<6xf32>) -> tensor<6xf32> {
    %0 = stablehlo.power %arg0, %arg1 : tensor<6xf32>
    return %0 : tensor<6xf32>
  }
}
"""


@pytest.fixture(scope="module")
def power_graph() -> Graph:
    """The mechanism of the all-NaN layer slice: IREE's power with a runtime exponent (RMSNorm's x²)."""
    return build_graph(POWER_MLIR, kind="logical", name="power", input_names=["x", "exponent"],
                       input_roles=["activation", "input"], output_names=["y"])


def test_a_real_all_nan_replay_is_a_mismatch(power_graph: Graph) -> None:
    x = np.array([-3.0, -1.5, -0.25, -2.0, -7.0, -0.5], np.float32)
    exponent = np.full(6, 2.0, np.float32)
    honest = x.astype(np.float64) ** 2  # what torch/numpy compute
    result = replay_arrays(power_graph, {"x": x, "exponent": exponent}, {"y": honest.astype(np.float32)})
    # IREE computes pow(x, y) as exp(y·log x): NaN for a negative base with a runtime exponent
    replayed_nan = result.outputs[0].nonfinite_mismatches
    assert replayed_nan == 6, result  # the real all-NaN replay ...
    assert decide_replay(result).reason is ReplayMismatch.NON_FINITE and not is_replay_match(result)
    # ... and an all-NaN claim against that all-NaN replay matches (same value in the same place)
    assert is_replay_match(replay_arrays(power_graph, {"x": x, "exponent": exponent},
                                         {"y": np.full(6, np.nan, np.float32)}))


@pytest.mark.parametrize("claim", ["nan", "inf", "one-nan-among-wrong"])
def test_replay_cli_refuses_a_nonfinite_claim(tmp_path: Path, claim: str) -> None:
    from tests.node.workload.conftest import ADD_MLIR

    graph = build_graph(ADD_MLIR, kind="logical", name="add-mul", input_names=["x", "w"],
                        input_roles=["input", "weight"], output_names=["y"])
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.full((2, 3), 0.5, np.float32)
    y = {"nan": np.full((2, 3), np.nan, np.float32), "inf": np.full((2, 3), np.inf, np.float32),
         "one-nan-among-wrong": (x + w) * w + 100.0}[claim].astype(np.float32)
    if claim == "one-nan-among-wrong":
        y[0, 0] = np.nan
    path = tmp_path / "rec"
    with WorkloadRecord.open(path) as rec:
        rec.put_device(Device("cpu0", "h", "cpu", 2**30))
        rec.put_graph(graph)
        for name, value, role in (("x", x, "input"), ("w", w, "weight"), ("y", y, "output")):
            rec.put_tensor(value, role=role, name=name, trace_id="t0")
        rec.put_trace(Trace("t0", graph.graph_id, "inference", (TraceEvent("e0", "step", "s", "cpu0", 0, 1),)))
    runner = CliRunner()
    out = runner.invoke(workload_app, ["bind", graph.graph_id, "--trace", "t0", "--record", str(path)])
    assert out.exit_code == 0, out.output
    out = runner.invoke(workload_app, ["replay", graph.graph_id, "--record", str(path), "--json"])
    assert out.exit_code == 1, out.output
    assert json.loads(out.output)["reason"] == "NON_FINITE"
