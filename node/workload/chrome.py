"""Chrome trace-event export (the JSON object format that chrome://tracing and Perfetto open).

One process per host, one thread per device; every event is a complete event (``ph: "X"``) with
microsecond ``ts``/``dur`` (Chrome's unit; fractional, so nanoseconds survive) and its kind as the
category. Metadata events name the processes and threads.
"""

from __future__ import annotations

from typing import Any

from node.workload.model import Device, Trace


def compute_chrome_trace(trace: Trace, devices: list[Device]) -> dict[str, Any]:
    """Return the trace as a Chrome trace-event JSON object."""
    by_id = {d.device_id: d for d in devices}
    hosts = sorted({by_id[e.device_id].host if e.device_id in by_id else e.device_id for e in trace.events})
    pid = {host: i + 1 for i, host in enumerate(hosts)}
    device_ids = sorted({e.device_id for e in trace.events})
    tid = {device_id: i + 1 for i, device_id in enumerate(device_ids)}
    events: list[dict[str, Any]] = []
    for host in hosts:
        events.append({"ph": "M", "name": "process_name", "pid": pid[host], "tid": 0, "args": {"name": host}})
    for device_id in device_ids:
        host = by_id[device_id].host if device_id in by_id else device_id
        kind = by_id[device_id].kind if device_id in by_id else "device"
        events.append({"ph": "M", "name": "thread_name", "pid": pid[host], "tid": tid[device_id],
                       "args": {"name": f"{device_id} ({kind})"}})
    for e in sorted(trace.events, key=lambda e: (e.start_ns, e.event_id)):
        host = by_id[e.device_id].host if e.device_id in by_id else e.device_id
        args = {"event_id": e.event_id, "op_ids": list(e.op_ids), **dict(e.attrs)}
        events.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": pid[host], "tid": tid[e.device_id],
                       "ts": e.start_ns / 1000.0, "dur": (e.end_ns - e.start_ns) / 1000.0, "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"trace_id": trace.trace_id, "graph_id": trace.graph_id, "workload": trace.workload}}
