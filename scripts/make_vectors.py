"""Write the protocol v1 golden vectors (tests/vectors/protocol_v1.json).

The file pins node.protocol to the bit; the Solidity tests read the same file. Regenerate only
for a deliberate protocol change: `python scripts/make_vectors.py`, then review the diff.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from node.executer.synthetic import SyntheticRequest, make_synthetic_artifact
from node.protocol.artifact import (
    compute_leaf_proof,
    compute_output_hash,
    compute_positions_root,
    encode_artifact_wire,
    encode_columns,
    encode_columns_v3,
    encode_header,
    encode_leaves,
    leaf_size,
)
from node.protocol.hashing import keccak256
from node.protocol.merkle import compute_merkle_proof, compute_merkle_root
from node.protocol.reputation import PRIOR_WAD, compute_posterior_wad
from node.protocol.sampler import SamplingParams, float32_bits, sample_position
from node.protocol.seed import position_uniform, run_seed, sampler_uniform
from node.protocol.sequence import (
    find_leaf_termination_violation,
    find_length_violation,
    find_position_violation,
    find_termination_violation,
)

VECTORS_PATH = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "protocol_v1.json"


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


def seed_vectors() -> list[dict[str, Any]]:
    """Return run_seed and position uniform cases, edges included."""
    cases = [(0, 0), (42, 7), (2**64 - 1, 2**256 - 1), (123456789, 2**128 + 5)]
    out = []
    for user_seed, inference_id in cases:
        seed = run_seed(user_seed, inference_id)
        uniforms = [{"i": i, "u": str(position_uniform(seed, i)), "v": sampler_uniform(position_uniform(seed, i))}
                    for i in (0, 1, 2, 255, 2**32 - 1)]
        out.append({"user_seed": str(user_seed), "inference_id": str(inference_id), "run_seed": _hex(seed),
                    "uniforms": uniforms})
    return out


def sampler_vectors() -> list[dict[str, Any]]:
    """Return sampler cases over small fixed logits, covering greedy, top-k, top-p and ties."""
    logits_sets = [
        [np.log(0.5), np.log(0.25), np.log(0.25), -30.0, -30.0, -31.0],
        [2.0, 1.0, 0.5, 0.5, -1.0, 3.0, 0.0, -2.0],
    ]
    params_sets = [SamplingParams(1.0), SamplingParams(0.0), SamplingParams(0.7, 0.9), SamplingParams(1.0, 1.0, 3),
                   SamplingParams(1.5, 0.6, 4)]
    out = []
    for logits in logits_sets:
        row = np.array(logits, dtype=np.float32)
        for params in params_sets:
            for v in (0, 2**31 - 1, 2**31, 3 * 2**30, 2**32 - 1):
                s = sample_position(row, params, 5, v)
                out.append({
                    "logits_f32_bits": [float32_bits(x) for x in row],
                    "temperature_bits": params.temperature_bits, "top_p_bits": params.top_p_bits,
                    "top_k": params.top_k, "k": 5, "v": v, "chosen": s.chosen, "token_ids": list(s.token_ids),
                    "weights": [str(w) for w in s.weights],
                    "raw_logprob_f32_bits": [float32_bits(x) for x in s.raw_logprobs],
                })
    return out


def artifact_vectors() -> list[dict[str, Any]]:
    """Return small honest artifacts with every encoding, hash and a proof per leaf."""
    out = []
    for n, params in ((3, SamplingParams(1.0, 1.0, 0, 8)), (5, SamplingParams(0.7, 0.9, 40, 5))):
        req = SyntheticRequest(inference_id=9, user_seed=77, params=params, output_length=n, vocab_size=64)
        art = make_synthetic_artifact(req, logits_seed=5)
        size = leaf_size(art.header.k)
        leaves = encode_leaves(art.positions)
        out.append({
            "user_seed": str(req.user_seed), "inference_id": str(req.inference_id), "vocab_size": req.vocab_size,
            "header": _hex(encode_header(art.header)),
            "header_hash": _hex(keccak256(encode_header(art.header))),
            "leaves": [_hex(leaves[j:j + size]) for j in range(0, len(leaves), size)],
            "leaf_hashes": [_hex(h) for h in art.leaf_hashes],
            "proofs": [[_hex(p) for p in compute_leaf_proof(art, i)] for i in range(n)],
            "positions_root": _hex(compute_positions_root(art.positions)),
            "artifact_root": _hex(art.root),
            "output_hash": _hex(compute_output_hash(art.positions.chosen)),
            "wire": _hex(encode_artifact_wire(art, version=2)),
            "columns": _hex(encode_columns(art)),  # wire v2's content before zstd (the layout, pinned)
            "wire_v3": _hex(encode_artifact_wire(art, version=3)),
            "columns_v3": _hex(encode_columns_v3(art)),  # wire v3's content before zstd (the layout, pinned)
        })
    return out


def merkle_vectors() -> list[dict[str, Any]]:
    """Return trees of 1 to 9 leaves (odd carries included) with all proofs."""
    out = []
    for n in range(1, 10):
        leaves = [keccak256(bytes([j])) for j in range(n)]
        out.append({"leaves": [_hex(x) for x in leaves], "root": _hex(compute_merkle_root(leaves)),
                    "proofs": [[_hex(p) for p in compute_merkle_proof(leaves, i)] for i in range(n)]})
    return out


def reputation_vectors() -> list[dict[str, Any]]:
    """Return verdict sequences with the 1e18 fixed-point P after each step."""
    out = []
    for alpha, beta, verdicts in ((10**16, 0, [False] * 4), (10**16, 10**17, [False, True, True, False, True]),
                                  (5 * 10**16, 3 * 10**17, [True] * 6), (0, 0, [False, True])):
        p = PRIOR_WAD
        steps = []
        for valid in verdicts:
            p = compute_posterior_wad(p, alpha, beta, valid)
            steps.append({"valid": valid, "p": str(p)})
        out.append({"alpha": str(alpha), "beta": str(beta), "prior": str(PRIOR_WAD), "steps": steps})
    return out


def position_rule_vectors() -> list[dict[str, Any]]:
    """Return single-leaf stage-1 cases (the fraud proof's rule), one per reason and edge."""
    w = [2**31, 2**30, 2**29, 0, 0]
    ids = [5, 9, 2, 7, 1]
    cases = [
        (0, 5, ids, w), (2**31, 9, ids, w), (2**31 - 1, 9, ids, w), (2**32 - 2**29 - 1, 2, ids, w),
        (2**32 - 2**29, 3, ids, w), (2**32 - 2**29, 5, ids, w), (2**32 - 1, 5, ids, w),
        (0, 5, [5, 9, 2, 7, 64], w), (0, 5, [5, 9, 5, 7, 1], w), (0, 5, ids, [2**30, 2**31, 0, 0, 0]),
        (0, 5, ids, [2**32 - 1, 2, 0, 0, 0]), (0, 64, ids, w), (2**31, 5, ids, w),
    ]
    return [{"v": v, "chosen": c, "token_ids": i, "weights": [str(x) for x in ww], "vocab_size": 64,
             "reason": int(find_position_violation(v, c, i, ww, 64))} for v, c, i, ww in cases]


def termination_vectors() -> list[dict[str, Any]]:
    """Return termination-rule cases for one leaf (docs/security.md rule 3), as proveTermination applies them."""
    cases = [(3, True, 4, 8), (3, False, 4, 8), (3, False, 4, 4), (3, True, 4, 4), (1, True, 4, 8), (1, True, 4, 4),
             (1, False, 4, 8), (7, False, 4, 8), (0, True, 9, 8), (0, False, 1, 1), (0, False, 1, 2), (0, True, 1, 2)]
    return [{"position": p, "chosen_is_stop": stop, "output_length": n, "max_tokens": m,
             "reason": int(find_termination_violation(p, stop, n, m))} for p, stop, n, m in cases]


def length_vectors() -> list[dict[str, Any]]:
    """Return the header-level part of the termination rule: empty and over-long outputs."""
    return [{"output_length": n, "max_tokens": m, "reason": int(find_length_violation(n, m))}
            for n, m in ((0, 8), (0, 0), (9, 8), (8, 8), (1, 8))]


# (name, output_length N, max_tokens M, stop tokens, leaf position or None for the header-level proof).
# Stop tokens are named by role: "last"/"at1" = the token the artifact chose there, "never" = one it never chose.
TERMINATION_CASES: tuple[tuple[str, int, int, tuple[str, ...], int | None], ...] = (
    ("honest stop at the end", 4, 8, ("last",), 3),
    ("honest stop, the second of two stop tokens", 4, 8, ("never", "last"), 3),
    ("truncated: shorter than max_tokens, last is no stop", 4, 8, ("never",), 3),
    ("max_tokens reached: may end on anything", 4, 4, ("never",), 3),
    ("max_tokens reached on a stop token", 4, 4, ("last",), 3),
    ("generation went on after a stop", 4, 8, ("at1",), 1),
    ("generation went on after a stop, max_tokens reached", 4, 4, ("at1",), 1),
    ("an inner leaf without a stop proves nothing", 4, 8, ("never",), 1),
    ("the one-token answer [stop] (the valid empty answer)", 1, 8, ("last",), 0),
    ("one token, no stop, shorter than max_tokens", 1, 8, ("never",), 0),
    ("over-long, shown by a leaf", 5, 4, ("last",), 0),
    ("empty output", 0, 8, ("never",), None),
    ("empty output where max_tokens is 0", 0, 0, ("never",), None),
    ("over-long, header level", 5, 4, ("never",), None),
    ("honest stop, header level proves nothing", 4, 8, ("last",), None),
)


def termination_leaf_vectors() -> list[dict[str, Any]]:
    """Return proveTermination inputs over real committed artifacts: header, leaf, proof, stop tokens, reason."""
    out = []
    for name, n, m, roles, position in TERMINATION_CASES:
        req = SyntheticRequest(inference_id=31, user_seed=13, params=SamplingParams(1.0, 1.0, 0, m), output_length=n)
        art = make_synthetic_artifact(req, logits_seed=3)
        chosen = [int(t) for t in art.positions.chosen]
        by_role = {"never": next(t for t in range(req.vocab_size) if t not in chosen)}
        if n:
            by_role["last"] = chosen[-1]
        if n > 1:
            by_role["at1"] = chosen[1]
        stops = sorted({by_role[r] for r in roles})
        leaf = b"" if position is None else encode_leaves(art.positions)[position * leaf_size(req.k):
                                                                          (position + 1) * leaf_size(req.k)]
        proof = [] if position is None else compute_leaf_proof(art, position)
        judged, reason = find_leaf_termination_violation(leaf, req.k, n, m, stops)
        out.append({
            "name": name, "k": req.k, "output_length": n, "max_tokens": m, "stop_token_ids": stops,
            "header": _hex(encode_header(art.header)), "positions_root": _hex(compute_positions_root(art.positions)),
            "artifact_root": _hex(art.root), "leaf": _hex(leaf), "proof": [_hex(x) for x in proof],
            "position": judged, "reason": int(reason),
        })
    return out


def build_vectors() -> dict[str, Any]:
    """Return every golden vector of protocol v1."""
    return {
        "version": 1,
        "seed": seed_vectors(),
        "sampler": sampler_vectors(),
        "merkle": merkle_vectors(),
        "artifact": artifact_vectors(),
        "reputation": reputation_vectors(),
        "position_rule": position_rule_vectors(),
        "termination": termination_vectors(),
        "termination_length": length_vectors(),
        "termination_leaf": termination_leaf_vectors(),
    }


def main() -> int:
    """Write the vectors file."""
    VECTORS_PATH.parent.mkdir(parents=True, exist_ok=True)
    VECTORS_PATH.write_text(json.dumps(build_vectors(), indent=1) + "\n")
    sys.stdout.write(f"wrote {VECTORS_PATH}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
