"""Chrome trace-event export."""

from __future__ import annotations

import json

from node.workload.chrome import compute_chrome_trace
from node.workload.model import Device, Link, Trace, TraceEvent


def test_chrome_trace_has_complete_events_in_microseconds(devices: tuple[list[Device], list[Link]]) -> None:
    events = (TraceEvent("e1", "op", "matmul", "h0/gpu0", 1_500, 4_000, ("op0",)),
              TraceEvent("e0", "collective", "all_reduce", "h1", 1_000, 2_000, attrs=(("bytes", "64"),)))
    out = compute_chrome_trace(Trace("t", "g", "training", events), devices[0])
    json.dumps(out)  # serialisable
    xs = [e for e in out["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in xs] == ["all_reduce", "matmul"]
    assert xs[1]["ts"] == 1.5 and xs[1]["dur"] == 2.5 and xs[1]["cat"] == "op"
    assert xs[0]["args"]["bytes"] == "64"
    names = {e["args"]["name"] for e in out["traceEvents"] if e["ph"] == "M"}
    assert {"h0", "h1", "h0/gpu0 (gpu)"} <= names
    assert xs[0]["pid"] != xs[1]["pid"]  # two hosts, two processes
