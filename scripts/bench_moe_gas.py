"""Gas of the ExpertDuty module per MoE inference on a real anvil node: the open and every judge's verdicts.

The shape of the SmolLM2 MoE devnet (30 layers x 4 experts, every expert routed: 120 experts + 30 routers + the link
= 151 duties), five validators with unequal stakes (3-7 ETH, as the devnet bonds them), `--per-duty` judges drawn
per duty from all of them. Leaves are synthetic (the module only hashes the per-expert counts and roots), every
judge votes valid on each of its duties in one transaction per validator, as the duty service does. Prints a table
and writes JSON (default bench-results/bench_moe_gas.json).
Usage: python scripts/bench_moe_gas.py [--per-duty 3] [--inferences 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from chain.contracts import Commitment, HubConfig, ModelState, Params, Role
from chain.deploy import deploy
from chain.devnet import Anvil, dev_account
from chain.moe import WEIGHT_DELAY, MoeOpening, deploy_expert_duty, sign_expert_vote
from node.devnet.moe import anvil_mine
from node.protocol.hashing import keccak256
from node.protocol.moe import compute_moe_fingerprint_hash, compute_opened_moe_root

LAYERS, EXPERTS, VOCAB = 30, 4, 49152
MODEL_ID = keccak256(b"bench-moe-gas")


def measure(per_duty: int, inferences: int) -> dict[str, Any]:
    """Return the open's and the verdicts' gas of each inference."""
    rows = []
    with Anvil(accounts=10) as anvil:
        w3 = anvil.web3()
        admin, treasury, requester, operator, *vals = (dev_account(i) for i in range(10))
        hub, _ = deploy(w3, admin, HubConfig(treasury=treasury.address, committee_size=3, min_committee=3))
        hub.register_model(admin, MODEL_ID, 5, VOCAB, 10**12, 10**16, 10**18, keccak256(b"p"), (2,), 10**15)
        hub.advance_model_to(admin, MODEL_ID, ModelState.PUNITIVE)
        hub.bond(operator, Role.OPERATOR, 10 * 10**18)
        for i, v in enumerate(vals[:5]):
            hub.bond(v, Role.VALIDATOR, (3 + i) * 10**18)
        ed = deploy_expert_duty(w3, admin, hub, per_duty)
        ed.set_shape(admin, MODEL_ID, LAYERS, EXPERTS)
        anvil_mine(w3, WEIGHT_DELAY + 1)
        chain_id = int(w3.eth.chain_id)
        for n in range(inferences):
            counts = tuple(3 + (k + n) % 7 for k in range(LAYERS * EXPERTS))
            roots = tuple(keccak256(b"expert" + bytes([n]) + k.to_bytes(2, "big")) for k in range(len(counts)))
            router_root, dense_fp = keccak256(b"router" + bytes([n])), keccak256(b"fp" + bytes([n]))
            moe_root = compute_opened_moe_root(LAYERS, EXPERTS, router_root, counts, roots)
            output_hash, artifact_root = keccak256(b"out" + bytes([n])), keccak256(b"art" + bytes([n]))
            iid = hub.request_inference(requester, operator.address, MODEL_ID, keccak256(b"prompt"), 7,
                                        Params(0x3F800000, 0x3F800000, 0, 16), 10**16)
            hub.commit_inference(operator, iid, Commitment(output_hash, artifact_root,
                                                           compute_moe_fingerprint_hash(dense_fp, moe_root)))
            anvil_mine(w3, 2)  # the selection seed's block
            opening = MoeOpening(output_hash, artifact_root, dense_fp, router_root, counts, roots)
            open_gas = int(ed.assign_duties(requester, iid, opening)["gasUsed"])
            verdict_gas, votes = [], 0
            for v in vals[:5]:
                mine = ed.duties_of(iid, v.address)
                if not mine:
                    continue
                signed = [sign_expert_vote(v, chain_id, ed.address, iid, d, moe_root, True, 0, bytes(32)) for d in mine]
                verdict_gas.append(int(ed.submit_verdicts(requester, iid, signed)["gasUsed"]))
                votes += len(signed)
            rows.append({"inference": iid, "duties": ed.opened(iid).duties, "votes": votes, "open_gas": open_gas,
                         "verdict_gas": sum(verdict_gas), "verdict_txs": verdict_gas})
    return {"per_duty": per_duty, "validators": 5, "layers": LAYERS, "experts": EXPERTS, "rows": rows}


def main() -> None:
    """Measure, print a table, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-duty", type=int, default=3)
    parser.add_argument("--inferences", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench-results/bench_moe_gas.json"))
    args = parser.parse_args()
    result = measure(args.per_duty, args.inferences)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"| inference | duties | votes | open (assignDuties) | all submitExpertVerdicts | total |  (per duty: "
          f"{args.per_duty}, 5 validators)")
    print("|---|---:|---:|---:|---:|---:|")
    for r in result["rows"]:
        print(f"| #{r['inference']} | {r['duties']} | {r['votes']} | {r['open_gas']:,} | {r['verdict_gas']:,} | "
              f"{r['open_gas'] + r['verdict_gas']:,} |")


if __name__ == "__main__":
    main()
