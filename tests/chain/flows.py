"""Inference flows shared by the eth-tester and anvil tests: artifacts from node.protocol, verdicts signed in Python."""

from __future__ import annotations

import time

from chain.contracts import Commitment, Params, Vote
from chain.eip712 import Verdict, sign_verdict
from node.executer.synthetic import SyntheticRequest, make_onchain, make_synthetic_artifact
from node.protocol.artifact import Artifact, compute_output_hash, make_positions
from node.protocol.hashing import keccak256
from node.protocol.sampler import SamplingParams
from tests.chain.conftest import MODEL_ID, VOCAB, K, Net

USER_SEED = 1234
FEE = 10**17


def honest_artifact(inference_id: int, length: int = 8) -> tuple[SyntheticRequest, Artifact]:
    """Return the request and the artifact an honest executer records for it."""
    params = SamplingParams(0.7, 1.0, 0, length)  # the synthetic model has no stop token: it runs to max_tokens
    request = SyntheticRequest(inference_id=inference_id, user_seed=USER_SEED, params=params,
                               model_id=MODEL_ID, k=K, vocab_size=VOCAB, output_length=length)
    return request, make_synthetic_artifact(request, logits_seed=inference_id)


def forge_position(artifact: Artifact, i: int) -> Artifact:
    """Return the artifact with position i's chosen token replaced by another candidate."""
    p = artifact.positions
    chosen = p.chosen.copy()
    candidates = [int(t) for t in p.token_ids[i] if int(t) != int(chosen[i])]
    chosen[i] = candidates[0]
    return Artifact(artifact.header, make_positions(chosen, p.token_ids, p.weights, p.raw_logprobs))


def commitment_of(artifact: Artifact) -> Commitment:
    """Return the on-chain commitment of an artifact."""
    return Commitment(compute_output_hash(artifact.positions.chosen), artifact.root, keccak256(b"fingerprints"))


def request_and_commit(net: Net, artifact_for: object = honest_artifact) -> tuple[int, Artifact, Commitment]:
    """Request an inference from the net's operator and commit the artifact `artifact_for(id)` gives."""
    inference_id = net.hub.call("nextInferenceId") + 1
    _, artifact = artifact_for(inference_id)  # type: ignore[operator]
    h = artifact.header
    got = net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"prompt"), USER_SEED,
                                    Params(h.temperature_bits, h.top_p_bits, h.top_k, h.max_tokens), FEE)
    assert got == inference_id
    c = commitment_of(artifact)
    net.hub.commit_inference(net.operator, inference_id, c)
    net.mine(2)
    return inference_id, artifact, c


def signed_votes(net: Net, inference_id: int, artifact_root: bytes, valid: bool,
                 count: int | None = None) -> list[Vote]:
    """Return verdicts signed in Python by the committee members (a quorum unless count is given)."""
    _, committee = net.hub.selection_of(inference_id)
    by_address = {v.address: v for v in net.validators}
    members = [by_address[a] for a in committee]
    chain_id = net.hub.chain_id()
    votes = []
    for account in members[: count if count is not None else len(members) // 2 + 1]:
        scores = keccak256(account.address.encode())
        verdict = Verdict(inference_id, artifact_root, valid, 0 if valid else 504, scores, int(time.time()) + 3600)
        signature = sign_verdict(account, verdict, chain_id, net.hub.address)
        votes.append(Vote(valid, verdict.reason, scores, verdict.deadline, signature))
    return votes


def stage1_failure_position(request: SyntheticRequest, artifact: Artifact) -> int | None:
    """Return the first position node.checks.stage1 rejects, or None."""
    from node.checks.stage1 import sequence_check

    result = sequence_check(artifact.header, artifact.positions, make_onchain(request, artifact))
    return None if result.valid else result.position


def stage1_result(request: SyntheticRequest, artifact: Artifact,
                  stop_token_ids: tuple[int, ...] = ()) -> tuple[object, int | None]:
    """Return (reason, position) of node.checks.stage1 for an artifact of a model with these stop tokens."""
    from dataclasses import replace

    from node.checks.stage1 import sequence_check

    onchain = replace(make_onchain(request, artifact), stop_token_ids=frozenset(stop_token_ids))
    result = sequence_check(artifact.header, artifact.positions, onchain)
    return result.reason, result.position
