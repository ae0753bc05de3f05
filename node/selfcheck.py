"""Protocol self-check: an honest artifact and forged copies through stage 1 (`verinfer protocol demo`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from node.checks.stage1 import OnchainInference, SequenceCheckResult, sequence_check
from node.errors import Reason
from node.executer.synthetic import SyntheticRequest, make_onchain, make_synthetic_artifact
from node.protocol.artifact import Artifact, encode_artifact_wire, make_positions
from node.protocol.sampler import SamplingParams
from node.protocol.seed import compute_sampler_uniforms, run_seed


@dataclass(frozen=True)
class SelfCheckCase:
    """One artifact run through stage 1, with what the protocol says must happen."""

    name: str
    expected: Reason
    result: SequenceCheckResult

    @property
    def ok(self) -> bool:
        """Check whether stage 1 returned the expected reason."""
        return self.result.reason is self.expected


@dataclass(frozen=True)
class SelfCheckReport:
    """The honest artifact's facts and every case's outcome."""

    run_seed: bytes
    artifact_root: bytes
    output_length: int
    wire_bytes: int
    cases: list[SelfCheckCase]

    @property
    def ok(self) -> bool:
        """Check whether every case behaved as the protocol requires."""
        return all(case.ok for case in self.cases)


def _replace_columns(art: Artifact, **columns: np.ndarray) -> Artifact:
    p = art.positions
    cols = {n: np.array(getattr(p, n)) for n in ("chosen", "token_ids", "weights", "raw_logprobs")}
    cols.update(columns)
    return Artifact(art.header, make_positions(**cols))


def _first_inside(art: Artifact) -> int:
    v = compute_sampler_uniforms(art.header.run_seed, len(art.positions)).astype(np.int64)
    return int(np.flatnonzero(v < art.positions.weights.sum(axis=1))[0])


def forge_other_candidate(art: Artifact) -> Artifact:
    """Return art with the chosen token replaced by another candidate where v lies inside the candidates."""
    i = _first_inside(art)
    chosen = np.array(art.positions.chosen)
    ids = art.positions.token_ids[i]
    chosen[i] = ids[1] if chosen[i] == ids[0] else ids[0]
    return _replace_columns(art, chosen=chosen)


def forge_reordered_weights(art: Artifact) -> Artifact:
    """Return art with the first two candidates of one position swapped."""
    i = _first_inside(art)
    ids, w = np.array(art.positions.token_ids), np.array(art.positions.weights)
    ids[i, [0, 1]], w[i, [0, 1]] = ids[i, [1, 0]], w[i, [1, 0]]
    return _replace_columns(art, token_ids=ids, weights=w)


def _case(name: str, expected: Reason, art: Artifact, onchain: OnchainInference) -> SelfCheckCase:
    return SelfCheckCase(name, expected, sequence_check(art.header, art.positions, onchain))


def run_protocol_selfcheck(user_seed: int = 42, inference_id: int = 7, output_length: int = 64,
                           vocab_size: int = 49_152, logits_seed: int = 0) -> SelfCheckReport:
    """Return the report for one honest artifact and a forged copy per stage-1 rule family."""
    req = SyntheticRequest(inference_id, user_seed, SamplingParams(0.8, 0.95, 0, output_length), vocab_size=vocab_size,
                           output_length=output_length)
    art = make_synthetic_artifact(req, logits_seed)
    onchain = make_onchain(req, art)
    recommit: Callable[[Artifact], OnchainInference] = lambda forged: make_onchain(req, forged)  # noqa: E731
    other_seed = make_synthetic_artifact(dataclasses.replace(req, user_seed=user_seed + 1), logits_seed)
    replayed = Artifact(art.header, other_seed.positions)
    hotter = make_synthetic_artifact(dataclasses.replace(req, params=SamplingParams(1.2, 0.95, 0, output_length)),
                                     logits_seed)
    forged_choice = forge_other_candidate(art)
    reordered = forge_reordered_weights(art)
    cases = [
        _case("honest", Reason.OK, art, onchain),
        _case("artifact changed after commit", Reason.OUTPUT_HASH_MISMATCH, forged_choice, onchain),
        _case("another candidate chosen (recommitted)", Reason.CHOSEN_MISMATCH, forged_choice, recommit(forged_choice)),
        _case("candidates reordered (recommitted)", Reason.WEIGHTS_NOT_SORTED, reordered, recommit(reordered)),
        _case("sampled with another seed", Reason.CHOSEN_MISMATCH, replayed, recommit(replayed)),
        _case("other temperature than requested", Reason.PARAMS_MISMATCH, hotter, onchain),
    ]
    return SelfCheckReport(run_seed(user_seed, inference_id), art.root, output_length,
                           len(encode_artifact_wire(art)), cases)
