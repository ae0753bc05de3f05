"""Gas per contract call on a real anvil node: a table and JSON (default bench-results/bench_gas.json).

Every number is a receipt's gasUsed (21,000 intrinsic gas included). Storage makes the first write
of a slot dearer than later ones (20k vs 2.9k), so calls whose cost depends on it are measured
twice: "first" (the deployment's first inference: the accounts' first credits; every credit slot and the
contract-wide credit total are opened — set to 1 — at deployment, bond or request, so a verdict writes no
fresh slot) and "steady" (the accounts already hold credits, the common case for a running operator or
validator); "new accounts" is a newly bonded operator and validator on a running deployment.
Usage: python scripts/bench_gas.py [--tokens 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from chain.contracts import Commitment, Hub, HubConfig, ModelState, Role, Vote
from chain.devnet import Anvil, dev_account
from chain.eip712 import Verdict, sign_verdict
from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.protocol.artifact import (
    Artifact,
    compute_leaf_proof,
    compute_output_hash,
    encode_header,
    encode_leaf,
    make_positions,
)
from node.protocol.hashing import keccak256
from node.protocol.sampler import SamplingParams

TARGETS = {"commitInference": 80_000, "submitVerdicts (1 signature": 120_000, "proveFraud": 150_000}  # by prefix
MODEL = b"\x11" * 32
SEED = 99


class Bench:
    """A deployed hub with `validators` validators and committee size `committee`."""

    def __init__(self, anvil: Anvil, validators: int, committee: int) -> None:
        accounts = [dev_account(i) for i in range(4 + validators)]
        self.admin, self.op, self.requester, treasury, *self.vals = accounts
        self.spare = [dev_account(i) for i in range(4 + validators, 6 + validators)]  # bonded later: new accounts
        self.w3 = anvil.web3()
        config = HubConfig(treasury=treasury.address, committee_size=committee, min_committee=min(3, committee))
        self.hub, receipt = Hub.deploy(self.w3, self.admin, config)
        self.deploy_gas = int(receipt["gasUsed"])
        self.hub.register_model(self.admin, MODEL, 5, 49_152, 10**16, 0, 10**18, b"\x22" * 32, (2,), 10**15)
        self.hub.advance_model_to(self.admin, MODEL, ModelState.VERIFYING)
        self.bond_gas = int(self.hub.bond(self.op, Role.OPERATOR, 10 * 10**18)["gasUsed"])
        for v in self.vals:
            self.hub.bond(v, Role.VALIDATOR, 5 * 10**18)
        self.mine(1)

    def mine(self, n: int) -> None:
        for _ in range(n):
            self.w3.provider.make_request("evm_mine", [])  # type: ignore[arg-type]

    def artifact(self, inference_id: int, tokens: int, forge_at: int | None = None) -> Artifact:
        request = SyntheticRequest(inference_id=inference_id, user_seed=SEED, params=SamplingParams(0.7, 1.0, 0, 4096),
                                   model_id=MODEL, vocab_size=49_152, output_length=tokens)
        art = make_synthetic_artifact(request, inference_id)
        if forge_at is None:
            return art
        p = art.positions
        chosen = p.chosen.copy()
        chosen[forge_at] = next(int(t) for t in p.token_ids[forge_at] if int(t) != int(chosen[forge_at]))
        return Artifact(art.header, make_positions(chosen, p.token_ids, p.weights, p.raw_logprobs))

    def request_commit(self, tokens: int,
                       forge_at: int | None = None) -> tuple[int, Artifact, Commitment, dict[str, int]]:
        inference_id = self.hub.call("nextInferenceId") + 1
        art = self.artifact(inference_id, tokens, forge_at)
        h = art.header
        receipt = self.hub.transact(self.requester, "requestInference", self.op.address, MODEL, keccak256(b"p"), SEED,
                                    (h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens), value=10**17)
        c = Commitment(compute_output_hash(art.positions.chosen), art.root, keccak256(b"fp"))
        commit = self.hub.commit_inference(self.op, inference_id, c)
        self.mine(2)
        return inference_id, art, c, {"requestInference": int(receipt["gasUsed"]),
                                      "commitInference": int(commit["gasUsed"])}

    def votes(self, inference_id: int, root: bytes, n: int) -> list[Vote]:
        _, committee = self.hub.selection_of(inference_id)
        by_address = {v.address: v for v in self.vals}
        out = []
        for address in committee[:n]:
            verdict = Verdict(inference_id, root, True, 0, keccak256(address.encode()), int(time.time()) + 3600)
            out.append(Vote(True, 0, verdict.scores_digest, verdict.deadline,
                            sign_verdict(by_address[address], verdict, self.hub.chain_id(), self.hub.address)))
        return out


def measure(tokens: int) -> dict[str, Any]:
    """Return gas per call."""
    gas: dict[str, Any] = {}
    with Anvil() as anvil:
        one = Bench(anvil, validators=1, committee=1)
        gas["deploy"] = one.deploy_gas
        gas["bond (first)"] = one.bond_gas
        for label in ("first", "steady"):
            inference_id, art, c, calls = one.request_commit(tokens)
            gas[f"requestInference ({label})"] = calls["requestInference"]
            gas[f"commitInference ({label})"] = calls["commitInference"]
            receipt = one.hub.submit_verdicts(one.requester, inference_id, c, one.votes(inference_id, art.root, 1))
            gas[f"submitVerdicts (1 signature, {label})"] = int(receipt["gasUsed"])
        inference_id, art, c, _ = one.request_commit(tokens, forge_at=tokens // 2)
        receipt = one.hub.prove_fraud(one.requester, inference_id, c, keccak256(encode_header(art.header)),
                                      encode_leaf(art.positions, tokens // 2), compute_leaf_proof(art, tokens // 2))
        gas[f"proveFraud ({tokens} leaves, proof depth {len(compute_leaf_proof(art, tokens // 2))})"] = int(
            receipt["gasUsed"])
        gas["requestUnbond"] = int(one.hub.request_unbond(one.vals[0])["gasUsed"])
        one.mine(600)
        gas["withdraw"] = int(one.hub.withdraw(one.vals[0])["gasUsed"])
        # a newly bonded operator and validator (the old validator is gone: the new one is the committee)
        new_op, new_val = one.spare
        one.hub.bond(new_op, Role.OPERATOR, 10 * 10**18)
        one.hub.bond(new_val, Role.VALIDATOR, 5 * 10**18)
        one.op, one.vals = new_op, [new_val]
        one.mine(1)
        inference_id, art, c, _ = one.request_commit(tokens)
        receipt = one.hub.submit_verdicts(one.requester, inference_id, c, one.votes(inference_id, art.root, 1))
        gas["submitVerdicts (1 signature, new accounts)"] = int(receipt["gasUsed"])
    for size in (3, 5):
        with Anvil(accounts=6 + size) as anvil:
            bench = Bench(anvil, validators=size, committee=size)
            for label in ("first", "steady"):
                inference_id, art, c, _ = bench.request_commit(tokens)
                assert len(bench.hub.selection_of(inference_id)[1]) == size  # without replacement: all drawn
                receipt = bench.hub.submit_verdicts(bench.requester, inference_id, c,
                                                    bench.votes(inference_id, art.root, size))
                gas[f"submitVerdicts ({size} signatures, {label})"] = int(receipt["gasUsed"])
            gas[f"submitVerdicts per validator, quorum of {size} (steady)"] = round(
                gas[f"submitVerdicts ({size} signatures, steady)"] / size)
            if size == 3:  # a forgery called valid by the whole committee: the proof slashes and jails all three
                inference_id, art, c, _ = bench.request_commit(tokens, forge_at=tokens // 2)
                bench.hub.submit_verdicts(bench.requester, inference_id, c, bench.votes(inference_id, art.root, size))
                proof = compute_leaf_proof(art, tokens // 2)
                receipt = bench.hub.prove_fraud(bench.requester, inference_id, c, keccak256(encode_header(art.header)),
                                                encode_leaf(art.positions, tokens // 2), proof)
                gas["a fraud proof after 3 valid verdicts (operator + 3 validators slashed)"] = int(receipt["gasUsed"])
    return gas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=256, help="artifact length (sets the fraud proof's depth)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_gas.json"))
    args = parser.parse_args()
    gas = measure(args.tokens)
    table = Table(title="gas per call (anvil, solc 0.8.28, optimizer 200 runs, via-IR, cancun)")
    table.add_column("call")
    table.add_column("gas", justify="right")
    table.add_column("target", justify="right")
    for name, value in gas.items():
        target = next((t for key, t in TARGETS.items() if name.startswith(key)), None)
        mark = "" if target is None else f"≤ {target:,} {'ok' if value <= target else 'OVER'}"
        table.add_row(name, f"{value:,}", mark)
    Console().print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "gas", "tokens": args.tokens, "machine": platform.machine(),
                                    "gas": gas, "targets": TARGETS}, indent=2) + "\n")


if __name__ == "__main__":
    main()
