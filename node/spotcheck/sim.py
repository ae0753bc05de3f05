"""The simulated cluster: register devices, start worker processes, the pinger and a CPU hog, verify.

Processes come from a forkserver that has imported torch and transformers once, so ten devices start
in seconds rather than a minute. The run is written to a workload record; the verifier then reads it
back (it never uses the in-memory logs) and decides each device's windows.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from eth_account import Account
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from node.spotcheck.device import Behaviour, DeviceConfig, DeviceLog, run_device
from node.spotcheck.errors import InvalidSpotParams
from node.spotcheck.feasibility import FeasibilityInputs, compute_feasibility_margins, compute_max_late, is_sound
from node.spotcheck.pinger import ExchangeRecord, MeterSample, PingerConfig, run_pinger
from node.spotcheck.record import DeviceRun, process_write_device, read_device_run
from node.spotcheck.stuffing import StuffingParams, compute_block_on_demand, compute_cone_costs, compute_stuffing
from node.spotcheck.throughput import ModelShape, compute_meter_seconds, compute_step_flops
from node.spotcheck.verify import (
    DeviceDeclaration,
    SpotcheckPolicy,
    WindowMeasurement,
    WindowVerdict,
    check_exchanges,
    decide_window,
    measure_window,
    split_windows,
)
from node.spotcheck.workload import MODEL_NAME, SMOL_NAME
from node.workload.store import WorkloadRecord

if TYPE_CHECKING:  # web3 and the chain client only when a run goes on chain
    from node.spotcheck.devnet import OperatorOutcome, SpotDevnet

log = logging.getLogger(__name__)

OnEvent = Callable[[str, dict[str, Any]], None]


class SimDeviceSpec(BaseModel):
    """One device of the simulated cluster and how it behaves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_id: str
    behaviour: Behaviour = "honest"
    evict_fraction: float = Field(0.0, ge=0, le=1)
    far_delay_ms: float = Field(0.0, ge=0)
    stale_every: int = Field(0, ge=0)
    gaps_fraction: float = Field(0.0, ge=0, lt=1)
    declared_fraction: float = Field(1.0, gt=0, le=1)
    gc_pressure: bool = False
    model: str = MODEL_NAME  # the declared workload's model
    state_tokens: int | None = Field(None, ge=2, le=512)  # None: the cluster's default window
    step_interval_ms: float | None = Field(None, ge=0)  # None: the cluster's default pace

    @property
    def cheats(self) -> bool:
        """Check whether this device does undeclared work (anything but honest)."""
        return self.behaviour != "honest"


def get_default_roster(far_delay_ms: float = 1500.0) -> tuple[SimDeviceSpec, ...]:
    """Return three honest devices (two under forced GC) and one device per attack of issue 18."""
    return (
        SimDeviceSpec(device_id="honest-0", gc_pressure=True),
        SimDeviceSpec(device_id="honest-1"),
        SimDeviceSpec(device_id="honest-2", gc_pressure=True),
        SimDeviceSpec(device_id="evict-1pct", behaviour="evict", evict_fraction=0.01),
        SimDeviceSpec(device_id="evict-10pct", behaviour="evict", evict_fraction=0.10),
        SimDeviceSpec(device_id="evict-50pct", behaviour="evict", evict_fraction=0.50),
        SimDeviceSpec(device_id="far-state", behaviour="far_state", far_delay_ms=far_delay_ms),
        SimDeviceSpec(device_id="recompute", behaviour="recompute"),
        SimDeviceSpec(device_id="stale-copy", behaviour="stale", stale_every=8),
        SimDeviceSpec(device_id="capacity-liar", behaviour="liar", declared_fraction=0.5),
        SimDeviceSpec(device_id="gaps", behaviour="gaps", gaps_fraction=0.9),
        SimDeviceSpec(device_id="smol-honest", model=SMOL_NAME, state_tokens=16),
    )


@dataclass(frozen=True)
class SimKeys:
    """The run's keys: the verifiers (whose challenges devices answer) and one operator per device."""

    verifiers: tuple[LocalAccount, ...]
    operators: dict[str, LocalAccount]

    def get_verifier_addresses(self) -> tuple[str, ...]:
        """Return the verifiers' addresses: every device's allow-list."""
        return tuple(v.address for v in self.verifiers)


def make_keys(devices: tuple[SimDeviceSpec, ...], n_verifiers: int = 3) -> SimKeys:
    """Return fresh random keys for the verifiers and one operator per device (a run without a chain)."""
    return SimKeys(tuple(Account.create() for _ in range(n_verifiers)),
                   {d.device_id: Account.create() for d in devices})


class SimConfig(BaseModel):
    """Everything a simulation run needs; the defaults are the measured sound parameters on this machine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: tuple[SimDeviceSpec, ...] = Field(default_factory=get_default_roster)
    arena_mib: int = Field(64, ge=1, le=4096)
    block_bytes: int = 16384
    layers: int = 8
    state_tokens: int = 32
    step_interval_ms: float = 0.0  # flat out: an honest device's declared work fills its capacity
    run_s: float = Field(40.0, gt=0)
    window_s: float = Field(20.0, gt=0)
    rate_hz: float = Field(2.0, gt=0)
    labels_share: float = 0.5
    labels_count: int = 64
    x_ms: float = 500.0
    # honest answers over X, measured on this machine under load (docs/spotcheck.md: 6 of 2,994 at load ≥ 22),
    # and the false-alarm probability per honest window we accept: a window fails on lateness alone only when
    # it holds more late answers than that rate explains (one late answer slashed honest operators at max_late 0)
    honest_late_rate: float = Field(0.002, ge=0, lt=1)
    false_alarm_target: float = Field(1e-6, gt=0, lt=1)
    min_undeclared_bytes: int = 1 << 20  # no model worth hiding fits in 1 MiB (tiny-llama alone is 26 MB)
    # the declared-throughput check (docs/spotcheck.md, "Declared throughput"): the catalogue's peak FLOP/s of
    # the sim's device kind per device second (a CPU second of the device's process: the sim's devices share
    # cores); the share of it each declared model reaches there, honest and flat out (median of 48 tiny-llama
    # and 12 SmolLM2 windows: 3.06 and 17.06 GFLOP per CPU second); the least utilisation a window may show: the
    # worst honest window (0.70 of the median, tiny-llama) over the same 1.5 margin X keeps over honest latency
    compute_flops: float = 50e9
    achieved_share: dict[str, float] = Field(default_factory=lambda: {MODEL_NAME: 0.0612, SMOL_NAME: 0.341})
    min_utilisation: float = Field(0.46, ge=0, le=1)
    audit_steps: int = Field(16, ge=0)  # declared steps per window whose token the verifier replays
    timeout_ms: float = 10_000.0
    cpu_hog: bool = True
    workload_nice: int = Field(10, ge=0, le=19)  # 0 and 5 ms: the answer path as it was before issue 31
    switch_interval_ms: float = Field(0.5, gt=0, le=100)
    start_timeout_s: float = 300.0

    @property
    def kind(self) -> str:
        """Return the device kind of this cluster's accelerators (the verifier's catalog key)."""
        return f"sim-accel-{self.arena_mib}mib"

    def get_catalog(self) -> dict[str, int]:
        """Return the verifier's trusted catalog: kind → proximal memory Y in bytes."""
        return {self.kind: self.arena_mib << 20}

    def get_flops_catalog(self) -> dict[str, float]:
        """Return the verifier's trusted catalog of compute: kind → peak FLOP/s per device second."""
        return {self.kind: self.compute_flops}

    def get_policy(self) -> SpotcheckPolicy:
        """Return the verifier's thresholds for this run."""
        expected = max(1, round(self.rate_hz * self.window_s))
        return SpotcheckPolicy(x_ms=self.x_ms,
                               max_late=compute_max_late(expected, self.honest_late_rate, self.false_alarm_target),
                               honest_late_rate=self.honest_late_rate, false_alarm_target=self.false_alarm_target,
                               state_tolerance_quanta=0, capacity_slack_bytes=self.block_bytes, min_challenges=1,
                               min_utilisation=self.min_utilisation)


@dataclass(frozen=True)
class DeviceResult:
    """One device's outcome: its windows' measurements and verdicts, and what it cost to run."""

    device_id: str
    behaviour: str
    cheats: bool
    fill_s: float
    steps: int
    step_ms_median: float  # the declared workload's step time on the device (its own clock)
    gc_pauses_ms: tuple[float, ...]
    measurements: tuple[WindowMeasurement, ...]
    verdicts: tuple[WindowVerdict, ...]

    @property
    def flagged(self) -> bool:
        """Check whether any window failed."""
        return any(not v.passed for v in self.verdicts)


@dataclass(frozen=True)
class SimResult:
    """The whole run: per-device results, the record it was written to, and whether the run is a success."""

    run_id: str
    record_path: str
    devices: tuple[DeviceResult, ...]
    config: dict[str, Any]
    feasibility: dict[str, Any]
    elapsed_s: float
    chain: tuple[OperatorOutcome, ...] | None = None  # with a chain: what it did to each device's operator

    @property
    def chain_ok(self) -> bool | None:
        """Check that exactly the cheaters' operators were slashed on chain (None without a chain)."""
        from node.spotcheck.devnet import is_chain_ok

        return None if self.chain is None else is_chain_ok(self.chain, {d.device_id: d.cheats for d in self.devices})

    @property
    def ok(self) -> bool:
        """Check that every cheater was flagged and no honest device was (and, with a chain, slashed or not)."""
        return all(d.flagged == d.cheats for d in self.devices) and self.chain_ok is not False


def run_cpu_hog(stop_at: float) -> None:
    """Burn one core until the monotonic time stop_at (other load on an honest machine)."""
    x = 0
    while time.monotonic() < stop_at:
        for _ in range(100_000):
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def get_context() -> Any:
    """Return a forkserver context that preloads the device module (torch, transformers) once."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["node.spotcheck.device"])
    return ctx


def _device_config(config: SimConfig, spec: SimDeviceSpec, socket_dir: Path, index: int, run_id: str,
                   keys: SimKeys) -> DeviceConfig:
    arena = config.arena_mib << 20
    return DeviceConfig(device_id=spec.device_id, socket_path=str(socket_dir / f"{index}.sock"), run_id=run_id,
                        operator_key=SecretStr(bytes(keys.operators[spec.device_id].key).hex()),
                        verifiers=keys.get_verifier_addresses(), arena_bytes=arena,
                        declared_bytes=int(arena * spec.declared_fraction), stuffing_seed=secrets.token_hex(32),
                        model=spec.model, prompt_seed=index, state_tokens=spec.state_tokens or config.state_tokens,
                        block_bytes=config.block_bytes, layers=config.layers, behaviour=spec.behaviour,
                        evict_fraction=spec.evict_fraction, far_delay_ms=spec.far_delay_ms,
                        stale_every=spec.stale_every, gaps_fraction=spec.gaps_fraction, gc_pressure=spec.gc_pressure,
                        workload_nice=config.workload_nice, switch_interval_ms=config.switch_interval_ms,
                        step_interval_ms=(config.step_interval_ms if spec.step_interval_ms is None
                                          else spec.step_interval_ms))


def _wait_ready(pipes: list[Connection], configs: list[DeviceConfig], timeout_s: float, on_event: OnEvent) -> None:
    deadline = time.monotonic() + timeout_s
    for pipe, dc in zip(pipes, configs, strict=True):
        if not pipe.poll(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"device {dc.device_id} did not get ready in {timeout_s} s")
        _, info = pipe.recv()
        on_event("ready", {"device_id": dc.device_id, **info})


def new_run_id() -> str:
    """Return a fresh run id: UTC time and 6 random hex digits."""
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


@dataclass(frozen=True)
class ClusterRun:
    """What a cluster run hands back: device configs and logs, the pinger's exchanges and CPU meter readings."""

    configs: list[DeviceConfig]
    logs: list[DeviceLog]
    records: list[ExchangeRecord]
    meter: list[MeterSample]


def run_cluster(config: SimConfig, on_event: OnEvent, run_id: str | None = None, keys: SimKeys | None = None
                ) -> ClusterRun:
    """Start devices, hog and pinger (for the first verifier); run; stop all; return what each recorded."""
    ctx = get_context()
    run_id = run_id or new_run_id()
    keys = keys or make_keys(config.devices)
    socket_dir = Path(tempfile.mkdtemp(prefix="vsc-", dir="/tmp"))  # AF_UNIX paths must stay short
    configs = [_device_config(config, spec, socket_dir, i, run_id, keys) for i, spec in enumerate(config.devices)]
    procs: list[Any] = []
    pipes: list[Connection] = []
    try:
        for dc in configs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=run_device, args=(dc, child), name=f"device-{dc.device_id}")
            proc.start()
            procs.append(proc)
            pipes.append(parent)
        _wait_ready(pipes, configs, config.start_timeout_s, on_event)
        if config.cpu_hog:
            hog = ctx.Process(target=run_cpu_hog, args=(time.monotonic() + config.run_s + 5,), name="cpu-hog")
            hog.start()
            procs.append(hog)
        parent, child = ctx.Pipe()
        targets = tuple((dc.device_id, dc.socket_path, keys.operators[dc.device_id].address) for dc in configs)
        pinger_config = PingerConfig(targets=targets, run_id=run_id,
                                     verifier_key=SecretStr(bytes(keys.verifiers[0].key).hex()),
                                     rate_hz=config.rate_hz, labels_share=config.labels_share,
                                     labels_count=config.labels_count, timeout_ms=config.timeout_ms,
                                     run_s=config.run_s,
                                     meters=tuple((dc.device_id, p.pid) for dc, p in zip(configs, procs, strict=False)))
        pinger = ctx.Process(target=run_pinger, args=(pinger_config, child), name="pinger")
        pinger.start()
        procs.append(pinger)
        while True:
            kind, payload = parent.recv()
            if kind == "done":
                records = [ExchangeRecord(**r) for r in payload["exchanges"]]
                meter = [MeterSample(**m) for m in payload["meter"]]
                break
            on_event(kind, payload)
        logs = []
        for pipe in pipes:
            pipe.send("stop")
        for pipe in pipes:
            _, device_log = pipe.recv()
            logs.append(device_log)
        return ClusterRun(configs, logs, records, meter)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        shutil.rmtree(socket_dir, ignore_errors=True)


def write_run(record_path: Path, run_id: str, config: SimConfig, cluster: ClusterRun, keys: SimKeys) -> None:
    """Write every device's run into the workload record."""
    far_delay_ms = max((spec.far_delay_ms for spec in config.devices), default=0.0)  # the machine's far tier
    records = cluster.records
    with WorkloadRecord.open(record_path) as record:
        for dc, device_log in zip(cluster.configs, cluster.logs, strict=True):
            params = StuffingParams(n_blocks=device_log.n_blocks, block_bytes=dc.block_bytes, layers=dc.layers,
                                    parents=dc.parents)
            mine = tuple(r for r in records if r.device_id == dc.device_id)
            process_write_device(record, run_id, DeviceRun(
                device_id=dc.device_id, kind=config.kind, declared_bytes=dc.declared_bytes,
                stuffing_seed=bytes.fromhex(dc.stuffing_seed), stuffing=params, state_tokens=dc.state_tokens,
                model=dc.model, far_delay_ms=far_delay_ms, operator=keys.operators[dc.device_id].address,
                log=device_log, exchanges=mine, compute_flops=config.compute_flops, sampling_seed=dc.prompt_seed,
                meter=tuple(m for m in cluster.meter if m.device_id == dc.device_id)))


def verify_device(record: WorkloadRecord, run_id: str, spec: SimDeviceSpec, operator: str, config: SimConfig,
                  models: dict[str, Any]) -> tuple[tuple[WindowMeasurement, ...], tuple[WindowVerdict, ...]]:
    """Verify one device from the record alone: recompute its stuffing and its answered states, decide windows.

    The verifier's own inputs are the run config (the device's declared model, its operator) and its catalog;
    everything else is read from the record and recomputed.
    """
    from node.spotcheck.workload import WorkloadReplayer, get_weights_digest  # torch only where states are replayed

    run = read_device_run(record, run_id, spec.device_id, config.get_catalog(), operator, config.get_flops_catalog())
    check_exchanges([run.declaration], run.exchanges)
    if run.model != spec.model or run.weights_digest != get_weights_digest(models[spec.model]):
        raise InvalidSpotParams(f"ran {run.model} {run.weights_digest[:16]}, not the declared {spec.model}",
                                device=spec.device_id)
    declaration = replace(run.declaration, step_flops=compute_step_flops(get_model_shape(models[spec.model]),
                                                                         run.state_tokens),
                          achieved_share=config.achieved_share.get(spec.model, 1.0))
    blocks = np.empty((run.declaration.stuffing.n_blocks, run.declaration.stuffing.words), dtype=np.uint64)
    compute_stuffing(run.declaration.stuffing_seed, run.declaration.stuffing, blocks)
    replayer = WorkloadReplayer(models[spec.model], run.tokens, run.state_tokens, run.sampling_seed)
    draw = np.random.default_rng(secrets.randbits(128))  # the verifier's audit draw, after the record is complete
    start = min((e.sent_ns for e in run.exchanges), default=0)
    window_ns = int(config.window_s * 1e9)
    windows = split_windows(run.exchanges, start, window_ns)
    end = max([e.received_ns or e.sent_ns for e in run.exchanges] + [t for t, _ in run.meter[-1:]], default=start)
    measured = []
    for w, exchanges in sorted(windows.items()):
        bounds = (start + w * window_ns, max(start + w * window_ns + 1, min(start + (w + 1) * window_ns, end)))
        inside = [s.step for s in run.steps if bounds[0] <= s.end_ns < bounds[1]]
        audited: list[int] = ([int(s) for s in draw.choice(inside, min(len(inside), config.audit_steps),
                                                           replace=False)] if inside else [])
        measured.append(measure_window(declaration, w, run.steps, exchanges, blocks, replayer.recompute_state,
                                       bounds_ns=bounds, device_s=compute_meter_seconds(run.meter, *bounds),
                                       audited=audited, check_token=replayer.check_token))
    policy = config.get_policy()
    return tuple(measured), tuple(decide_window(m, policy) for m in measured)


def get_model_shape(model: Any) -> ModelShape:
    """Return the cost-relevant shape of the verifier's own copy of a declared model."""
    c = model.config
    return ModelShape(layers=int(c.num_hidden_layers), hidden=int(c.hidden_size),
                      intermediate=int(c.intermediate_size), heads=int(c.num_attention_heads),
                      kv_heads=int(c.num_key_value_heads or c.num_attention_heads), vocab=int(c.vocab_size))


def load_models(config: SimConfig) -> dict[str, Any]:
    """Return the verifier's copy of every model the devices declare (one load per model)."""
    from node.spotcheck.workload import build_model

    return {name: build_model(name) for name in sorted({d.model for d in config.devices})}


def verify_run(record_path: Path, run_id: str, config: SimConfig, operators: dict[str, str],
               logs: list[DeviceLog], models: dict[str, Any], on_event: OnEvent) -> list[DeviceResult]:
    """Verify every device of a run from the record (one verifier's independent decisions)."""
    results = []
    with WorkloadRecord.open(record_path, readonly=True) as record:
        for spec, device_log in zip(config.devices, logs, strict=True):
            measured, verdicts = verify_device(record, run_id, spec, operators[spec.device_id], config, models)
            results.append(DeviceResult(device_id=spec.device_id, behaviour=spec.behaviour, cheats=spec.cheats,
                                        fill_s=device_log.fill_s, steps=len(device_log.steps),
                                        step_ms_median=float(np.median([(e - b) / 1e6 for _, b, e in device_log.steps]
                                                                       or [0.0])),
                                        gc_pauses_ms=tuple(device_log.gc_pauses_ms), measurements=measured,
                                        verdicts=verdicts))
            on_event("verdict", {"device_id": spec.device_id, "failures": sorted(
                {f for v in verdicts for f in v.failures}), "windows": len(verdicts)})
    return results


def run_votes(devnet: SpotDevnet, config: SimConfig, record_path: Path, run_id: str, operators: dict[str, str],
              logs: list[DeviceLog], models: dict[str, Any], first: list[DeviceResult], out_dir: Path,
              on_event: OnEvent) -> None:
    """Let every validator decide from the record (the first one's decisions are `first`) and submit its votes."""
    from node.spotcheck.devnet import DeviceVotes, process_votes

    for i, validator in enumerate(devnet.validators):
        on_event("phase", {"text": f"validator {i} decides every window from the record and votes on chain"})
        mine = first if i == 0 else verify_run(record_path, run_id, config, operators, logs, models,
                                              lambda kind, payload: None)
        decisions = [DeviceVotes(d.device_id, d.measurements, d.verdicts) for d in mine]
        sent = process_votes(devnet, validator, decisions, config.get_policy(), run_id,
                             out_dir / "validators" / run_id / validator.address)
        log.info("validator %s sent %d votes", validator.address, sent)


def run_sim(config: SimConfig, out_dir: Path, on_event: OnEvent, chain: bool = False) -> SimResult:
    """Run the whole simulation, write the record under out_dir, verify from it, return the result.

    With chain, anvil runs the hub and SpotCheck: the devices' operators are bonded and open the run, three
    validators each verify the record and vote, and the result holds what the chain did to each operator.
    """
    started = time.monotonic()
    run_id = new_run_id()
    if not chain:
        return _run_sim(config, out_dir, on_event, run_id, make_keys(config.devices), None, started)
    from node.spotcheck.devnet import open_devnet

    on_event("phase", {"text": "starting anvil: the hub, SpotCheck, 3 validators, one operator per device"})
    out_dir.mkdir(parents=True, exist_ok=True)
    with open_devnet([d.device_id for d in config.devices], out_dir / f"anvil-{run_id}.log") as devnet:
        return _run_sim(config, out_dir, on_event, run_id, SimKeys(devnet.validators, dict(devnet.operators)),
                        devnet, started)


def _run_sim(config: SimConfig, out_dir: Path, on_event: OnEvent, run_id: str, keys: SimKeys,
             devnet: SpotDevnet | None, started: float) -> SimResult:
    stakes: dict[str, int] = {}
    if devnet is not None:
        from node.spotcheck.devnet import process_open_runs

        stakes = process_open_runs(devnet, run_id)
    on_event("phase", {"text": f"starting {len(config.devices)} devices (fill {config.arena_mib} MiB each)"})
    cluster = run_cluster(config, on_event, run_id, keys)
    logs = cluster.logs
    record_path = out_dir / "records" / run_id
    on_event("phase", {"text": f"writing the workload record {record_path}"})
    write_run(record_path, run_id, config, cluster, keys)
    on_event("phase", {"text": "verifying every device from the record"})
    operators = {d: str(a.address) for d, a in keys.operators.items()}
    models = load_models(config)
    results = verify_run(record_path, run_id, config, operators, logs, models, on_event)
    on_event("phase", {"text": "measuring Z on an honest device's stuffing"})
    with WorkloadRecord.open(record_path, readonly=True) as record:
        feasibility = get_feasibility(record, run_id, config, results, operators)
    outcomes = None
    if devnet is not None:
        from node.spotcheck.devnet import get_outcomes

        run_votes(devnet, config, record_path, run_id, operators, logs, models, results, out_dir, on_event)
        outcomes = get_outcomes(devnet, run_id, stakes, {d.device_id: d.verdicts for d in results})
    return SimResult(run_id=run_id, record_path=str(record_path), devices=tuple(results),
                     config=config.model_dump(mode="json"), feasibility=feasibility,
                     elapsed_s=time.monotonic() - started, chain=outcomes)


def measure_z(declaration: DeviceDeclaration) -> float:
    """Return the seconds to recompute the kept block with the smallest cone (its predecessor kept)."""
    seed, params = declaration.stuffing_seed, declaration.stuffing
    index = int(compute_cone_costs(seed, params).argmin())
    previous = None
    if index:
        previous = np.empty((params.n_blocks, params.words), dtype=np.uint64)
        compute_stuffing(seed, params, previous)
        previous = previous[index - 1].copy()
    t0 = time.perf_counter()
    compute_block_on_demand(seed, params, index, previous)
    return time.perf_counter() - t0


def get_feasibility(record: WorkloadRecord, run_id: str, config: SimConfig, results: list[DeviceResult],
                    operators: dict[str, str]) -> dict[str, Any]:
    """Return the measured (X, Y, Z) inputs, their margins and whether they are sound on this machine."""
    honest = [d for d in results if not d.cheats]
    if not honest:
        return {}
    first = honest[0].device_id
    declaration = read_device_run(record, run_id, first, config.get_catalog(), operators[first]).declaration
    latencies = [x for d in honest for m in d.measurements for x in m.latencies_ms]
    far = max((d.far_delay_ms for d in config.devices), default=0.0)
    inputs = FeasibilityInputs(x_s=config.x_ms / 1e3, y_bytes=declaration.catalog_bytes,
                               z_min_s=measure_z(declaration), honest_latency_max_s=max(latencies, default=0) / 1e3,
                               far_extra_s=far / 1e3,
                               free_bytes=declaration.catalog_bytes - declaration.accounted_bytes,
                               min_undeclared_bytes=config.min_undeclared_bytes)
    margins = compute_feasibility_margins(inputs)
    utilisation = [m.utilisation for d in honest for m in d.measurements]
    throughput = {"honest_utilisation_min": min(utilisation, default=0.0),
                  "honest_utilisation_max": max(utilisation, default=0.0), "min_utilisation": config.min_utilisation,
                  "margin": (min(utilisation, default=0.0) / config.min_utilisation if config.min_utilisation
                             else float("inf"))}
    return {"inputs": asdict(inputs), "margins": asdict(margins), "sound": is_sound(margins), "throughput": throughput}


def get_result_json(result: SimResult) -> dict[str, Any]:
    """Return the result as JSON-able data (per device: verdicts, latency summary, counters)."""
    devices = []
    for d in result.devices:
        latencies = [x for m in d.measurements for x in m.latencies_ms]
        devices.append({
            "device_id": d.device_id, "behaviour": d.behaviour, "cheats": d.cheats, "flagged": d.flagged,
            "fill_s": d.fill_s, "steps": d.steps, "step_ms_median": d.step_ms_median,
            "gc_pause_ms_max": max(d.gc_pauses_ms, default=0.0),
            "latency_ms": {"n": len(latencies), "p50": float(np.percentile(latencies, 50)) if latencies else None,
                           "p99": float(np.percentile(latencies, 99)) if latencies else None,
                           "max": max(latencies, default=None)},
            "windows": [{**asdict(v), **{k: getattr(m, k) for k in (
                "challenges", "state_challenges", "labels_challenges", "missing", "errors", "unsigned", "wrong_labels",
                "stale_state", "unknown_step", "declared_steps", "device_s", "audited_steps", "fabricated_steps")},
                "utilisation": m.utilisation, "max_state_quanta": max(m.state_quanta, default=0)}
                for m, v in zip(d.measurements, d.verdicts, strict=True)],
        })
    chain = None if result.chain is None else {"ok": result.chain_ok, "operators": [
        {**asdict(o), "slashed": o.slashed} for o in result.chain]}
    return {"run_id": result.run_id, "ok": result.ok, "elapsed_s": result.elapsed_s, "record": result.record_path,
            "config": result.config, "feasibility": result.feasibility, "devices": devices, "chain": chain}
