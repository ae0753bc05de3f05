"""Spot-check runs in the workload record: devices, links, one trace per device, its data (the adapter).

Per device the trace holds a ``commitment`` event naming the stuffing (its parameters and the seed's
tensor), the workload (model and tokens' tensor), then every ``step`` event and a ``challenge`` /
``response`` pair per exchange; the answered states are tensors tied to their response events. The
verifier reads a run back with ``read_device_run`` and trusts nothing in it but what it recomputes:
Y comes from the verifier's own catalog, latencies from the pinger's events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from node.spotcheck.device import DeviceLog
from node.spotcheck.errors import MalformedMessage, SpotCode, UnknownDevice
from node.spotcheck.pinger import ExchangeRecord, MeterSample
from node.spotcheck.stuffing import StuffingParams
from node.spotcheck.verify import DeviceDeclaration, Exchange, StepRecord
from node.spotcheck.wire import Answer, parse_message
from node.workload.model import Device, Link, MemoryTier, Trace, TraceEvent
from node.workload.store import WorkloadRecord

PINGER_ID = "pinger"


@dataclass(frozen=True)
class DeviceRun:
    """One device's part of a run, as the sim hands it to the record."""

    device_id: str
    kind: str
    declared_bytes: int
    stuffing_seed: bytes
    stuffing: StuffingParams
    state_tokens: int
    model: str
    far_delay_ms: float
    operator: str
    log: DeviceLog
    exchanges: tuple[ExchangeRecord, ...]
    compute_flops: float = 0.0  # what the device registers as its compute (the verifier checks it)
    sampling_seed: int = 0  # the workload's sampling seed: step s's token is drawn with (seed, s)
    meter: tuple[MeterSample, ...] = ()  # the pinger's reading of the device's CPU time


@dataclass(frozen=True)
class RecordedDeviceRun:
    """What the verifier reads back: declaration, steps, exchanges and the workload's tokens."""

    declaration: DeviceDeclaration
    steps: tuple[StepRecord, ...]
    exchanges: tuple[Exchange, ...]
    tokens: np.ndarray
    state_tokens: int
    model: str
    weights_digest: str
    meter: tuple[tuple[int, int], ...] = ()  # (pinger time, device CPU time) in ns, in time order
    sampling_seed: int = 0


def get_trace_id(run_id: str, device_id: str) -> str:
    """Return the trace id of one device in one run."""
    return f"spotcheck/{run_id}/{device_id}"


def _median_latency_ns(exchanges: Sequence[ExchangeRecord]) -> int:
    lat = [r.received_ns - r.sent_ns for r in exchanges if r.received_ns is not None]
    return int(np.median(lat)) if lat else 0


def process_write_device(record: WorkloadRecord, run_id: str, run: DeviceRun) -> str:
    """Register the device and its link to the pinger, store its data and its trace; return the trace id."""
    tiers = (MemoryTier("proximal", run.declared_bytes, 0),
             MemoryTier("far", run.declared_bytes, int(run.far_delay_ms * 1e6)))
    record.put_device(Device(run.device_id, "localhost", run.kind, run.declared_bytes, run.compute_flops, tiers))
    record.put_device(Device(PINGER_ID, "localhost", "process", 0))
    record.put_link(Link(PINGER_ID, run.device_id, _median_latency_ns(run.exchanges), 1e9))
    trace_id = get_trace_id(run_id, run.device_id)
    seed_ref = record.put_tensor(np.frombuffer(run.stuffing_seed, dtype=np.uint8), role="rng_seed",
                                 name=f"{run.device_id}/stuffing_seed", event_id="stuffing", trace_id=trace_id)
    tokens_ref = record.put_tensor(np.asarray(run.log.tokens, dtype=np.int64), role="input",
                                   name=f"{run.device_id}/tokens", event_id="stuffing", trace_id=trace_id)
    first = min([s[1] for s in run.log.steps] + [r.sent_ns for r in run.exchanges] or [0])
    p = run.stuffing
    events = [TraceEvent("stuffing", "commitment", "stuffing", run.device_id, first, first, (), (
        ("n_blocks", str(p.n_blocks)), ("block_bytes", str(p.block_bytes)), ("layers", str(p.layers)),
        ("parents", str(p.parents)), ("seed", seed_ref.sha256), ("tokens", tokens_ref.sha256),
        ("state_tokens", str(run.state_tokens)), ("state_bytes", str(run.log.state_bytes)),
        ("model", run.model), ("weights", run.log.weights_digest), ("fill_s", f"{run.log.fill_s:.6f}"),
        ("operator", run.operator), ("sampling_seed", str(run.sampling_seed))))]
    events += [TraceEvent(f"step/{s}", "step", "decode", run.device_id, start, end) for s, start, end in run.log.steps]
    for r in run.exchanges:
        events.append(TraceEvent(f"challenge/{r.seq}", "challenge", r.kind, run.device_id, r.sent_ns, r.sent_ns, (),
                                 (("seq", str(r.seq)), ("nonce", r.nonce), ("count", str(r.count)),
                                  ("issued_ms", str(r.issued_ms)), ("verifier", r.verifier),
                                  ("signature", r.signature))))
        if r.received_ns is not None:
            attrs = (("answer", r.answer_json),) if r.answer_json else (("error", r.error or ""),)
            events.append(TraceEvent(f"response/{r.seq}", "response", r.kind, run.device_id, r.sent_ns,
                                     r.received_ns, (), attrs))
        elif r.error:
            events.append(TraceEvent(f"response/{r.seq}", "response", r.kind, run.device_id, r.sent_ns, r.sent_ns,
                                     (), (("error", r.error), ("missing", "1"))))
    # a meter reading ties the pinger's clock to the device's CPU time ("sync": the record has no meter kind)
    events += [TraceEvent(f"meter/{i}", "sync", "cpu_meter", run.device_id, m.t_ns, m.t_ns, (),
                          (("cpu_ns", str(m.cpu_ns)),))
               for i, m in enumerate(run.meter)]
    for step, state in sorted(run.log.answered_states.items()):
        record.put_tensor(state, role="state", name=f"{run.device_id}/state/{step}", event_id=f"step/{step}",
                          trace_id=trace_id)
    record.put_trace(Trace(trace_id, f"{run.model}:{run.log.weights_digest[:16]}", "spotcheck", tuple(events)))
    return trace_id


def _parse_answer(device_id: str, raw: str) -> Answer:
    message = parse_message(raw.encode())
    if not isinstance(message, Answer):
        raise MalformedMessage("a response event holds no answer", device=device_id)
    return message


def read_device_run(record: WorkloadRecord, run_id: str, device_id: str, catalog: dict[str, int], operator: str,
                    flops_catalog: dict[str, float] | None = None) -> RecordedDeviceRun:
    """Read one device's run back, with Y (and peak FLOP/s) from the verifier's catalog, the operator from its own."""
    device = record.get_device(device_id)
    if device.kind not in catalog:
        raise UnknownDevice(f"kind {device.kind!r} is not in the verifier's catalog", device=device_id)
    trace = record.get_trace(get_trace_id(run_id, device_id))
    attrs = dict(trace.event("stuffing").attrs)
    params = StuffingParams(n_blocks=int(attrs["n_blocks"]), block_bytes=int(attrs["block_bytes"]),
                            layers=int(attrs["layers"]), parents=int(attrs["parents"]))
    seed = record.get_tensor(attrs["seed"]).tobytes()
    tokens = record.get_tensor(attrs["tokens"])
    declaration = DeviceDeclaration(device_id=device_id, kind=device.kind, declared_bytes=device.memory_bytes,
                                    catalog_bytes=catalog[device.kind], state_bytes=int(attrs["state_bytes"]),
                                    stuffing=params, stuffing_seed=seed, run_id=run_id, operator=operator,
                                    registry_flops=device.compute_flops,
                                    catalog_flops=(flops_catalog or {}).get(device.kind, 0.0))
    steps = tuple(StepRecord(int(e.event_id.split("/")[1]), e.start_ns, e.end_ns)
                  for e in trace.events if e.kind == "step")
    responses = {e.event_id.split("/")[1]: e for e in trace.events if e.kind == "response"}
    exchanges = []
    for e in trace.events:
        if e.kind != "challenge":
            continue
        a = dict(e.attrs)
        response = responses.get(a["seq"])
        r_attrs = dict(response.attrs) if response is not None else {}
        answer = _parse_answer(device_id, r_attrs["answer"]) if "answer" in r_attrs else None
        error = SpotCode(r_attrs["error"]) if r_attrs.get("error") else None
        received = response.end_ns if response is not None and "missing" not in r_attrs else None
        exchanges.append(Exchange(device_id=device_id, seq=int(a["seq"]), kind=e.name, nonce=bytes.fromhex(a["nonce"]),
                                  count=int(a["count"]), issued_ms=int(a["issued_ms"]), verifier=a["verifier"],
                                  sent_ns=e.start_ns, received_ns=received,
                                  answer=answer, error=error))
    return RecordedDeviceRun(declaration=declaration, steps=steps, exchanges=tuple(exchanges), tokens=tokens,
                             state_tokens=int(attrs["state_tokens"]), model=attrs["model"],
                             weights_digest=attrs["weights"], sampling_seed=int(attrs.get("sampling_seed", "0")),
                             meter=tuple(sorted((e.start_ns, int(dict(e.attrs)["cpu_ns"]))
                                                for e in trace.events if e.kind == "sync" and e.name == "cpu_meter")))
