"""`verinfer training devnet`: anvil, the hub and Training contracts, an honest and a cheating gloo job, an auditor.

The auditor is its own process (`verinfer training audit`-equivalent, started with the same Python);
the two provers run one after the other as real torch.distributed jobs (2 workers + shadow) that
anchor on chain. Everything lands in one folder: the runs' ledgers and responses, the auditor's
journal, a JSON summary, and a plot of audits and bonds over time. Success (exit 0) means: the
cheater's bond was slashed and the honest run's was not.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3

from chain.contracts import HubConfig, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account, find_free_port
from chain.errors import ContractReverted
from chain.training import TrainingContract, TrainingDeployConfig
from node.training.corpus import load_corpus
from node.training.job import Cheat, JobPlan, remove_job_outputs, run_job
from node.training.onchain import ChainAudits
from node.training.spec import RunSpec

log = logging.getLogger(__name__)
BOND = 2 * 10**18
VALIDATOR_STAKE = 5 * 10**18


@dataclass(frozen=True)
class DevnetRun:
    """One prover of the devnet: its declaration, key, verifier beacon and cheats."""

    name: str
    spec: RunSpec
    account: LocalAccount
    beacon: bytes
    cheats: tuple[Cheat, ...]


def make_runs(steps: int, anchor_every: int, audit_rate: float) -> list[DevnetRun]:
    """Return the honest run and the cheating run (undeclared data in every step after the first window)."""
    def spec(data_seed: int) -> RunSpec:
        return RunSpec(steps=steps, anchor_every=anchor_every, audit_rate=audit_rate, data_seed=data_seed,
                       lsh_nonce=secrets.token_hex(32), response_deadline_s=60.0)

    cheats = tuple(Cheat("undeclared-batch", t) for t in range(anchor_every + 1, steps + 1))
    return [DevnetRun("honest", spec(1), dev_account(3), secrets.token_bytes(32), ()),
            DevnetRun("cheater", spec(2), dev_account(4), secrets.token_bytes(32), cheats)]


def deploy_devnet(w3: Web3) -> tuple[TrainingContract, str, LocalAccount]:
    """Deploy the hub and Training, bond the auditor as a validator; return (training, treasury, auditor)."""
    admin, treasury, auditor = dev_account(0), dev_account(1), dev_account(2)
    hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address))
    hub.bond(auditor, Role.VALIDATOR, VALIDATOR_STAKE)
    training, _ = TrainingContract.deploy(w3, admin, TrainingDeployConfig(
        hub=hub.address, treasury=treasury.address, min_bond=10**18, min_verdict_weight=10**18, verdict_window=200))
    return training, treasury.address, auditor


def register(training: TrainingContract, run: DevnetRun) -> None:
    """Register a run on chain with its data root, procedure hash and bond."""
    corpus = load_corpus(run.spec.corpus_files, run.spec.seq_len)
    training.register_run(run.account, run.spec.spec_hash(), bytes.fromhex(run.spec.lsh_nonce), corpus.data_root,
                          run.spec.procedure_hash(), 0, int(run.spec.audit_rate * 10**18), run.spec.anchor_every, BOND)


def check_nonce_replay(training: TrainingContract, run: DevnetRun) -> str:
    """Try to register another run with a used nonce; return the contract's error name (NonceReplayed)."""
    other = run.spec.model_copy(update={"data_seed": 99})
    try:
        training.register_run(run.account, other.spec_hash(), bytes.fromhex(run.spec.lsh_nonce), b"\x00" * 32,
                              b"\x00" * 32, 0, 10**17, 5, BOND)
    except ContractReverted as e:
        return e.error
    return "accepted"


def start_auditor(out: Path, anvil: Anvil, training: TrainingContract, auditor: LocalAccount,
                  runs: list[DevnetRun], timeout_s: float) -> subprocess.Popen[bytes]:
    """Start the auditor in its own process (the CLI's `audit` command)."""
    config = {"rpc": anvil.url, "contract": training.address, "timeout_s": timeout_s,
              "journal": str(out / "audits.jsonl"),
              "runs": [{"dir": str(out / r.name), "prover": r.account.address, "beacon": r.beacon.hex(),
                        "spec": r.spec.model_dump(mode="json")} for r in runs]}
    (out / "auditor.json").write_text(json.dumps(config, indent=1))
    cmd = [sys.executable, "-c", "from node.cli_training import training_app; training_app()", "audit",
           "--config", str(out / "auditor.json")]
    env = {**os.environ, "VERINFER_PRIVATE_KEY": auditor.key.hex()}  # anvil's public dev key
    return subprocess.Popen(cmd, stdout=(out / "auditor.log").open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, env=env)


def run_prover(out: Path, anvil: Anvil, training: TrainingContract, run: DevnetRun) -> None:
    """Run one prover's gloo job, anchoring on chain."""
    folder = out / run.name
    remove_job_outputs(folder)
    audits = ChainAudits(rpc_url=anvil.url, contract=training.address, prover_key=bytes(run.account.key),
                         run_id=run.spec.spec_hash(), final_step=run.spec.steps, anchor_every=run.spec.anchor_every)
    run_job(JobPlan(spec=run.spec, out_dir=folder, beacon=run.beacon, prover_key=bytes(run.account.key),
                    audits=audits, port=find_free_port(), cheats=run.cheats))


def run_provers(out: Path, anvil: Anvil, training: TrainingContract, runs: list[DevnetRun]) -> None:
    """Run the provers one after the other; a prover stopped by the chain (slashed) ends only its own run."""
    for run in runs:
        try:
            run_prover(out, anvil, training, run)
        except Exception:  # a slashed prover's next anchor reverts and its job ends; the next prover still runs
            log.warning("prover %s stopped", run.name, exc_info=True)


def get_chain_state(training: TrainingContract, runs: list[DevnetRun], treasury: str) -> dict[str, Any]:
    """Return each run's on-chain record and settled audits."""
    out: dict[str, Any] = {"treasury_credits": training.credits(treasury), "runs": {}}
    settled = training.get_events("AuditSettled", 0)
    for run in runs:
        rec = training.get_run(run.spec.spec_hash())
        audits = [{"step": int(e["args"]["step"]), "valid": bool(e["args"]["valid"]),
                   "reason": int(e["args"]["reason"]), "block": int(e["blockNumber"])}
                  for e in settled if bytes(e["args"]["runId"]) == run.spec.spec_hash()]
        out["runs"][run.name] = {"run_id": run.spec.spec_hash().hex(), "bond": rec.bond, "slashed": rec.slashed,
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
    for name in ("honest", "cheater"):
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


def record_devnet(out: Path, runs: list[DevnetRun]) -> list[str]:
    """Record both runs (graphs, traces, audited data) into out/record; return the trace ids."""
    from node.training.model import get_run_param_count
    from node.training.record import record_run
    from node.workload.store import WorkloadRecord

    lines = (out / "audits.jsonl").read_text().splitlines() if (out / "audits.jsonl").exists() else []
    audits = [json.loads(line) for line in lines]
    trace_ids = []
    with WorkloadRecord.open(out / "record") as rec:
        for run in runs:
            mine = [a for a in audits if a["run"] == run.spec.spec_hash().hex()]
            trace_ids.append(record_run(rec, run.spec, out / run.name, get_run_param_count(run.spec), mine))
    return trace_ids


def run_devnet(out: Path, steps: int, anchor_every: int, audit_rate: float, timeout_s: float,
               on_state: Any = None) -> dict[str, Any]:
    """Run the whole devnet and return its summary (`ok` is the exit criterion)."""
    out.mkdir(parents=True, exist_ok=True)
    runs = make_runs(steps, anchor_every, audit_rate)
    state_log: list[dict[str, Any]] = []
    with Anvil(block_time=1, log_path=out / "anvil.log") as anvil:
        w3 = anvil.web3()
        training, treasury, auditor_account = deploy_devnet(w3)
        for run in runs:
            register(training, run)
        replay = check_nonce_replay(training, runs[0])
        auditor = start_auditor(out, anvil, training, auditor_account, runs, timeout_s)
        provers = threading.Thread(target=run_provers, args=(out, anvil, training, runs), daemon=True)
        started = time.time()
        provers.start()
        try:
            while auditor.poll() is None and time.time() - started < timeout_s:
                state = {"t": time.time(), **get_chain_state(training, runs, treasury)}
                state_log.append(state)
                if on_state is not None:
                    on_state(state)
                time.sleep(2.0)
        finally:
            if auditor.poll() is None:
                auditor.terminate()
            auditor.wait(timeout=30)
        provers.join(timeout=60)
        final = {"t": time.time(), **get_chain_state(training, runs, treasury)}
        state_log.append(final)
        gas = get_anchor_gas(training)
    write_plot(state_log, out / "devnet.png")
    trace_ids = record_devnet(out, runs)
    honest, cheater = final["runs"]["honest"], final["runs"]["cheater"]
    summary = {"ok": bool(cheater["slashed"] and not honest["slashed"] and honest["bond"] == BOND),
               "nonce_replay": replay, "auditor_exit": auditor.returncode, "final": final, "anchor_gas": gas,
               "gas_per_anchored_step": (sum(g["gas"] for g in gas) / max(1, sum(g["steps"] for g in gas))),
               "record": {"path": str(out / "record"), "traces": trace_ids},
               "specs": {r.name: r.spec.model_dump(mode="json") for r in runs},
               "cheats": {r.name: [c.__dict__ for c in r.cheats] for r in runs}}
    (out / "devnet.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
