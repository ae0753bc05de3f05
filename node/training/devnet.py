"""`verinfer training devnet`: anvil, the hub and Training contracts, an honest and a cheating gloo job, an auditor.

Three validators are bonded on the hub, and each runs its own auditor process (`verinfer training
audit`, its own key, its own recomputation, its own vote): the contract settles an audit only on a
supermajority (≥ 2/3 of the weight, ≥ 2 signers), so no single validator can slash. The two provers
run one after the other as real torch.distributed jobs (2 workers + shadow) that anchor on chain and
read each window's beacon from it. Everything lands in one folder: the runs' ledgers and responses,
the auditors' journals, a JSON summary, and a plot of audits and bonds over time. Two cheaters: one trains
on undeclared data, the hidden-state cheater (issue 30) does too but restores the named positions, logs the
declared batch's sketches and serves the honest state to an audit of its cheated step (only the state root
catches it). Success (exit 0) means: both cheaters' bonds were slashed and the honest run's was not.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.types import RPCEndpoint

from chain.contracts import WEIGHT_DELAY, HubConfig, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account, find_free_port
from chain.errors import ContractReverted
from chain.training import TrainingContract, TrainingDeployConfig
from node.training.corpus import load_corpus
from node.training.job import Cheat, JobPlan, remove_job_outputs, run_job
from node.training.onchain import ChainAudits
from node.training.spec import RunSpec, compute_keep_checkpoints, get_shape

log = logging.getLogger(__name__)
BOND = 2 * 10**18
ZERO_ADDRESS = "0x0000000000000000000000000000000000000000"
VALIDATOR_STAKE = 5 * 10**18
AUDITOR_ACCOUNTS = (2, 5, 6)  # three validators of equal stake: two votes settle an audit


@dataclass(frozen=True)
class DevnetRun:
    """One prover of the devnet: its declaration, key and cheats."""

    name: str
    spec: RunSpec
    account: LocalAccount
    cheats: tuple[Cheat, ...]


@dataclass(frozen=True)
class DevnetPlan:
    """What a devnet trains: the model shape and the run parameters (`get_devnet_plan` gives each shape's demo)."""

    shape: str = "tiny"
    steps: int = 20
    anchor_every: int = 5
    audit_rate: float = 0.4
    seq_len: int = 32
    batch_per_worker: int = 2

    @property
    def keep_checkpoints(self) -> int:
        """Return K derived from m (on-chain audits and an off-chain request within the next window)."""
        return compute_keep_checkpoints(self.anchor_every)


# the SmolLM2-shaped demo: 64 tokens per worker-step (a step takes seconds on a CPU, not minutes), m = 1 so that
# the shadow keeps K = 2 states of 1.08 GB each; 10 steps put 9 cheating steps (2..10) under audit at p = 0.4:
# P(at least one drawn) = 1 − 0.6⁹ = 0.990
DEVNET_PLANS = {"tiny": DevnetPlan(), "smollm2": DevnetPlan(shape="smollm2", steps=10, anchor_every=1)}


def get_devnet_plan(shape: str, steps: int | None = None, anchor_every: int | None = None,
                    audit_rate: float | None = None) -> DevnetPlan:
    """Return a shape's demo plan with any parameter overridden (UnknownShape for a name outside SHAPES)."""
    get_shape(shape)
    base = DEVNET_PLANS[shape]
    return DevnetPlan(shape=shape, steps=base.steps if steps is None else steps,
                      anchor_every=base.anchor_every if anchor_every is None else anchor_every,
                      audit_rate=base.audit_rate if audit_rate is None else audit_rate,
                      seq_len=base.seq_len, batch_per_worker=base.batch_per_worker)


def compute_catch_probability(plan: DevnetPlan) -> float:
    """Return the probability that at least one of the cheater's steps (anchor_every+1..steps) is drawn.

    A drawn step's audit is interrupted only by a newer drawn step within k, and the newest drawn cheating step
    is never interrupted by another, so the cheater is audited in full iff any cheating step is drawn."""
    cheating = max(0, plan.steps - plan.anchor_every)
    return 1.0 - (1.0 - plan.audit_rate) ** cheating


CHEATERS = ("cheater", "hidden-state")


def make_runs(plan: DevnetPlan) -> list[DevnetRun]:
    """Return the honest run and the cheating runs (undeclared data in every step after the first window; the
    hidden-state cheater with the named positions restored and the honest state served to its step's audit)."""
    steps, anchor_every = plan.steps, plan.anchor_every

    def spec(data_seed: int, prover: LocalAccount) -> RunSpec:
        return RunSpec(prover=prover.address, shape=get_shape(plan.shape), steps=steps, anchor_every=anchor_every,
                       audit_rate=plan.audit_rate, data_seed=data_seed, seq_len=plan.seq_len,
                       batch_per_worker=plan.batch_per_worker, keep_checkpoints=plan.keep_checkpoints,
                       lsh_nonce=secrets.token_hex(32), response_deadline_s=60.0)

    cheating = range(anchor_every + 1, steps + 1)
    return [DevnetRun("honest", spec(1, dev_account(3)), dev_account(3), ()),
            DevnetRun("cheater", spec(2, dev_account(4)), dev_account(4),
                      tuple(Cheat("undeclared-batch", t) for t in cheating)),
            DevnetRun("hidden-state", spec(3, dev_account(7)), dev_account(7),
                      tuple(Cheat("swap", t) for t in cheating))]


def deploy_devnet(w3: Web3) -> tuple[TrainingContract, str, list[LocalAccount]]:
    """Deploy the hub and Training, bond three validators; return (training, treasury, auditors)."""
    admin, treasury = dev_account(0), dev_account(1)
    auditors = [dev_account(i) for i in AUDITOR_ACCOUNTS]
    hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
    for auditor in auditors:
        hub.bond(auditor, Role.VALIDATOR, VALIDATOR_STAKE)
    training, _ = TrainingContract.deploy(w3, admin, TrainingDeployConfig(
        hub=hub.address, treasury=treasury.address, min_bond=10**18, min_signers=2, verdict_window=250))
    for _ in range(WEIGHT_DELAY):  # the auditors' stake settles before any anchor (StakeQuorum.weightDelay)
        w3.provider.make_request(RPCEndpoint("evm_mine"), [])
    return training, treasury.address, auditors


def register(training: TrainingContract, run: DevnetRun) -> None:
    """Register a run on chain with its data root, procedure hash and bond."""
    corpus = load_corpus(run.spec.corpus_files, run.spec.seq_len)
    training.register_run(run.account, run.spec.spec_hash(), bytes.fromhex(run.spec.lsh_nonce), corpus.data_root,
                          run.spec.procedure_hash(), 0, run.spec.audit_rate_wad, run.spec.anchor_every, BOND)


def check_nonce_replay(training: TrainingContract, run: DevnetRun) -> str:
    """Try to register another run with a used nonce; return the contract's error name (NonceReplayed)."""
    other = run.spec.model_copy(update={"data_seed": 99})
    try:
        training.register_run(run.account, other.spec_hash(), bytes.fromhex(run.spec.lsh_nonce), b"\x00" * 32,
                              b"\x00" * 32, 0, 10**17, 5, BOND)
    except ContractReverted as e:
        return e.error
    return "accepted"


def start_auditor(out: Path, name: str, anvil: Anvil, training: TrainingContract, auditor: LocalAccount,
                  runs: list[DevnetRun], timeout_s: float, k: int) -> subprocess.Popen[bytes]:
    """Start one validator's auditor in its own process (the CLI's `audit` command) with its own key."""
    config = {"rpc": anvil.url, "contract": training.address, "timeout_s": timeout_s, "k": k,
              "journal": str(out / f"audits-{name}.jsonl"), "spool": str(out / f"spool-{name}"),
              "recompute_lock": str(out / "recompute.lock"),  # one machine: one recomputation at a time
              "runs": [{"dir": str(out / r.name), "prover": r.account.address, "spec": r.spec.model_dump(mode="json")}
                       for r in runs]}
    (out / f"{name}.json").write_text(json.dumps(config, indent=1))
    cmd = [sys.executable, "-c", "from node.cli_training import training_app; training_app()", "audit",
           "--config", str(out / f"{name}.json")]
    env = {**os.environ, "VERINFER_PRIVATE_KEY": auditor.key.hex()}  # anvil's public dev key
    return subprocess.Popen(cmd, stdout=(out / f"{name}.log").open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)


def run_prover(out: Path, anvil: Anvil, training: TrainingContract, run: DevnetRun) -> None:
    """Run one prover's gloo job, anchoring on chain."""
    folder = out / run.name
    remove_job_outputs(folder)
    audits = ChainAudits(rpc_url=anvil.url, contract=training.address, prover_key=bytes(run.account.key),
                         run_id=run.spec.run_id(), final_step=run.spec.steps, anchor_every=run.spec.anchor_every)
    run_job(JobPlan(spec=run.spec, out_dir=folder, prover_key=bytes(run.account.key),
                    audits=audits, port=find_free_port(), cheats=run.cheats))


def run_provers(out: Path, anvil: Anvil, training: TrainingContract, runs: list[DevnetRun]) -> None:
    """Run the provers one after the other, each registered just before its job (window 0's beacon is the block
    after the registration and must be read within 256 blocks: a SmolLM2-shaped run takes longer than that);
    a prover stopped by the chain (slashed) ends only its own run."""
    for run in runs:
        try:
            if training.get_run(run.spec.run_id()).prover == ZERO_ADDRESS:
                register(training, run)
            run_prover(out, anvil, training, run)
        except Exception:  # a slashed prover's next anchor reverts and its job ends; the next prover still runs
            log.warning("prover %s stopped", run.name, exc_info=True)


def get_chain_state(training: TrainingContract, runs: list[DevnetRun], treasury: str) -> dict[str, Any]:
    """Return each run's on-chain record and settled audits."""
    out: dict[str, Any] = {"treasury_credits": training.credits(treasury), "runs": {}}
    settled = training.get_events("AuditSettled", 0)
    for run in runs:
        rec = training.get_run(run.spec.run_id())
        audits = [{"step": int(e["args"]["step"]), "valid": bool(e["args"]["valid"]),
                   "reason": int(e["args"]["reason"]), "block": int(e["blockNumber"])}
                  for e in settled if bytes(e["args"]["runId"]) == run.spec.run_id()]
        out["runs"][run.name] = {"run_id": run.spec.run_id().hex(), "bond": rec.bond, "slashed": rec.slashed,
                                 "anchors": rec.anchors, "last_step": rec.last_step, "audits": audits}
    return out


def get_anchor_gas(training: TrainingContract) -> list[dict[str, int]]:
    """Return gas used by each anchor transaction and the steps it covered."""
    rows = []
    for e in training.get_events("Anchored", 0):
        receipt = training.w3.eth.get_transaction_receipt(e["transactionHash"])
        steps = int(e["args"]["lastStep"]) - int(e["args"]["firstStep"]) + 1
        rows.append({"gas": int(receipt["gasUsed"]), "steps": steps, "block": int(e["blockNumber"])})
    return rows


def write_plot(state_log: list[dict[str, Any]], path: Path) -> None:
    """Plot bonds and settled audits over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    t0 = state_log[0]["t"] if state_log else 0.0
    for name in (state_log[0]["runs"] if state_log else ()):
        ts = [s["t"] - t0 for s in state_log]
        ax1.plot(ts, [s["runs"][name]["bond"] / 1e18 for s in state_log], label=name)
        ax2.plot(ts, [len(s["runs"][name]["audits"]) for s in state_log], label=f"{name} audits")
        ax2.plot(ts, [sum(not a["valid"] for a in s["runs"][name]["audits"]) for s in state_log], "--",
                 label=f"{name} failed")
    ax1.set_ylabel("bond (ETH)")
    ax2.set_ylabel("settled audits")
    ax2.set_xlabel("seconds")
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def read_verdicts(journal: Path) -> list[dict[str, Any]]:
    """Return one auditor's verdict records (not interruptions or trajectory notes), the last per run and step."""
    lines = journal.read_text().splitlines() if journal.exists() else []
    records = [json.loads(line) for line in lines]
    latest = {(r["run"], r["step"]): r for r in records if "valid" in r}
    return list(latest.values())


def record_devnet(out: Path, runs: list[DevnetRun]) -> list[str]:
    """Record both runs (graphs, traces, audited data) into out/record from the first auditor's journal."""
    from node.training.model import get_run_param_count
    from node.training.record import record_run
    from node.workload.store import WorkloadRecord

    audits = read_verdicts(out / "audits-auditor-0.jsonl")
    trace_ids = []
    with WorkloadRecord.open(out / "record") as rec:
        for run in runs:
            mine = [a for a in audits if a["run"] == run.spec.run_id().hex()]
            trace_ids.append(record_run(rec, run.spec, out / run.name, get_run_param_count(run.spec), mine))
    return trace_ids


def get_votes(training: TrainingContract) -> dict[str, dict[str, int]]:
    """Return per validator the votes the contract counted, valid and invalid."""
    out: dict[str, dict[str, int]] = {}
    for e in training.get_events("VoteCounted", 0):
        mine = out.setdefault(str(e["args"]["signer"]), {"valid": 0, "invalid": 0})
        mine["valid" if e["args"]["valid"] else "invalid"] += 1
    return out


def get_journal_summary(out: Path, names: list[str]) -> dict[str, Any]:
    """Return per auditor: verdicts journaled, interrupted audits, off-chain audits, trajectory raises, audits it
    requested on chain and verdicts on requested steps."""
    summary: dict[str, Any] = {}
    for name in names:
        path = out / f"audits-{name}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        summary[name] = {"verdicts": sum("valid" in r and not r.get("offchain") for r in records),
                         "offchain_verdicts": sum(bool(r.get("offchain")) for r in records),
                         "interrupted": sum(bool(r.get("interrupted")) for r in records),
                         "onchain_requests": sum(r.get("outcome") == "requested" for r in records),
                         "requested_verdicts": sum("valid" in r and bool(r.get("requested")) for r in records),
                         "trajectory_raises": sum(bool(r.get("trajectory")) for r in records)}
    return summary


class MemorySampler:
    """Samples the resident memory of this process and all its descendants (every `period_s`) in a thread."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.period_s = period_s
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="memory-sampler")
        self.started = time.time()
        self.peak_bytes = 0
        self.peak_at_s = 0.0
        self.peak_parts: dict[str, int] = {}
        self.peak_pss_bytes = 0  # the proportional set size: shared library pages counted once across processes
        self.role_max: dict[str, int] = {}  # the largest single process of each role over the run
        self.timeline: list[tuple[float, int]] = []

    def __enter__(self) -> MemorySampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        self.thread.join(timeout=5)

    def sample(self) -> None:
        """Take one sample: the sum of RSS over the process tree, and per role at a new peak."""
        import psutil

        me = psutil.Process()
        parts: dict[str, int] = {}
        pss = 0
        procs = [me, *me.children(recursive=True)]
        services = set()
        for proc in procs:
            try:
                if get_process_role(proc.cmdline(), proc.pid == me.pid) == "auditor-service":
                    services.add(proc.pid)
            except psutil.Error:
                continue
        for proc in procs:
            try:
                info = proc.memory_full_info()
                role = get_process_role(proc.cmdline(), proc.pid == me.pid)
                if role == "job-rank-or-audit-child":  # an auditor's recomputation child, or a rank of the gloo job
                    role = "auditor-child" if proc.ppid() in services else "job-rank"
            except psutil.Error:  # ended between the listing and the read
                continue
            self.role_max[role] = max(self.role_max.get(role, 0), info.rss)
            parts[role] = parts.get(role, 0) + info.rss
            pss += getattr(info, "pss", info.rss)
        self.peak_pss_bytes = max(self.peak_pss_bytes, pss)
        total = sum(parts.values())
        now = time.time() - self.started
        self.timeline.append((round(now, 2), total))
        if total > self.peak_bytes:
            self.peak_bytes, self.peak_at_s, self.peak_parts = total, now, parts

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            self.sample()
            self.stop_event.wait(self.period_s)

    def summary(self) -> dict[str, Any]:
        """Return the peak (bytes, when, per role) and a timeline thinned to ≤ 300 points."""
        step = max(1, len(self.timeline) // 300)
        return {"peak_rss_bytes": self.peak_bytes, "peak_rss_gb": round(self.peak_bytes / 1e9, 2),
                "peak_pss_gb": round(self.peak_pss_bytes / 1e9, 2),
                "peak_at_s": round(self.peak_at_s, 1), "peak_by_role_gb": {
                    k: round(v / 1e9, 2) for k, v in sorted(self.peak_parts.items())},
                "largest_process_by_role_gb": {k: round(v / 1e9, 2) for k, v in sorted(self.role_max.items())},
                "samples": len(self.timeline), "period_s": self.period_s, "timeline": self.timeline[::step]}


def get_process_role(cmdline: list[str], is_root: bool) -> str:
    """Return a devnet process's role from its command line (the sampler's breakdown)."""
    text = " ".join(cmdline)
    if is_root:
        return "devnet"
    if "anvil" in text:
        return "anvil"
    if "training_app" in text and "audit" in text:
        return "auditor-service"
    if "spawn_main" in text or "multiprocessing" in text:
        return "job-rank-or-audit-child"
    return "other"


def get_step_times(out: Path, runs: list[DevnetRun]) -> dict[str, dict[str, float]]:
    """Return per run the median and largest step wall-clock (seconds, from steps.jsonl)."""
    import statistics

    result = {}
    for run in runs:
        path = out / run.name / "steps.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        secs = [(r["end_ns"] - r["start_ns"]) / 1e9 for r in rows]
        if secs:
            result[run.name] = {"steps": len(secs), "median_s": round(statistics.median(secs), 2),
                                "max_s": round(max(secs), 2)}
    return result


def run_devnet(out: Path, plan: DevnetPlan, timeout_s: float, k: int = 1, on_state: Any = None) -> dict[str, Any]:
    """Run the whole devnet and return its summary (`ok` is the exit criterion)."""
    started_all = time.time()
    with MemorySampler() as memory:
        summary = _run_devnet(out, plan, timeout_s, k, on_state)
    summary["memory"] = memory.summary()
    summary["wall_s"] = round(time.time() - started_all, 1)
    (out / "devnet.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _run_devnet(out: Path, plan: DevnetPlan, timeout_s: float, k: int, on_state: Any) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("spool-*"):
        shutil.rmtree(old, ignore_errors=True)
    runs = make_runs(plan)
    state_log: list[dict[str, Any]] = []
    names = [f"auditor-{i}" for i in range(len(AUDITOR_ACCOUNTS))]
    with Anvil(block_time=1, log_path=out / "anvil.log") as anvil:
        w3 = anvil.web3()
        training, treasury, auditor_accounts = deploy_devnet(w3)
        register(training, runs[0])  # the others register when their job starts (run_provers)
        replay = check_nonce_replay(training, runs[0])
        auditors = [start_auditor(out, name, anvil, training, account, runs, timeout_s, k)
                    for name, account in zip(names, auditor_accounts, strict=True)]
        provers = threading.Thread(target=run_provers, args=(out, anvil, training, runs), daemon=True)
        started = time.time()
        provers.start()
        try:
            while any(a.poll() is None for a in auditors) and time.time() - started < timeout_s:
                state = {"t": time.time(), **get_chain_state(training, runs, treasury)}
                state_log.append(state)
                if on_state is not None:
                    on_state(state)
                time.sleep(2.0)
        finally:
            for auditor in auditors:
                if auditor.poll() is None:
                    auditor.terminate()
                auditor.wait(timeout=30)
        provers.join(timeout=60)
        final = {"t": time.time(), **get_chain_state(training, runs, treasury)}
        state_log.append(final)
        gas = get_anchor_gas(training)
        votes = get_votes(training)
    write_plot(state_log, out / "devnet.png")
    trace_ids = record_devnet(out, runs)
    honest = final["runs"]["honest"]
    cheaters = [final["runs"][name] for name in CHEATERS]
    summary = {"ok": bool(all(c["slashed"] for c in cheaters) and not honest["slashed"] and honest["bond"] == BOND),
               "nonce_replay": replay, "auditor_exit": [a.returncode for a in auditors], "final": final,
               "votes": votes, "auditors": {n: a.address for n, a in zip(names, auditor_accounts, strict=True)},
               "journals": get_journal_summary(out, names), "anchor_gas": gas, "k": k,
               "gas_per_anchored_step": (sum(g["gas"] for g in gas) / max(1, sum(g["steps"] for g in gas))),
               "record": {"path": str(out / "record"), "traces": trace_ids},
               "specs": {r.name: r.spec.model_dump(mode="json") for r in runs},
               "plan": {**plan.__dict__, "keep_checkpoints": plan.keep_checkpoints,
                        "catch_probability": round(compute_catch_probability(plan), 4)},
               "step_times": get_step_times(out, runs),
               "cheats": {r.name: [c.__dict__ for c in r.cheats] for r in runs}}
    return summary
