"""Stage 1, the sequence check (docs/protocol.md): artifact + RNG only, exact integer arithmetic.

The per-position rules are ``node.protocol.sequence.find_position_violation`` applied to every
position at once with numpy; the first failing position (and the first rule it breaks) is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from node.protocol.artifact import ArtifactHeader, Positions, compute_artifact_root, compute_output_hash
from node.protocol.errors import Reason
from node.protocol.sampler import WEIGHT_MAX, WEIGHT_ONE, tail_exhaustion_floor
from node.protocol.seed import compute_sampler_uniforms, run_seed
from node.protocol.sequence import find_length_violation


@dataclass(frozen=True)
class OnchainInference:
    """What the chain says about one inference: the request, the model's registry entry, the commit."""

    inference_id: int
    user_seed: int
    model_id: bytes
    temperature_bits: int
    top_p_bits: int
    top_k: int
    max_tokens: int
    k: int
    vocab_size: int
    output_hash: bytes
    artifact_root: bytes
    # The registered model's stop tokens (the termination rule); required: an empty set rejects every
    # output shorter than max_tokens.
    stop_token_ids: frozenset[int]
    # The validator's own tokenisation of the request bound by promptHash; None to skip.
    prompt_token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class SequenceCheckResult:
    """Outcome of stage 1: the first failure's reason and position (None for header failures)."""

    reason: Reason
    position: int | None
    positions_checked: int

    @property
    def valid(self) -> bool:
        """Check whether every rule held."""
        return self.reason is Reason.OK


def find_header_violation(header: ArtifactHeader, positions: Positions, onchain: OnchainInference) -> Reason:
    """Return the first header or commitment rule the artifact breaks, or Reason.OK."""
    if header.run_seed != run_seed(onchain.user_seed, onchain.inference_id):
        return Reason.SEED_MISMATCH
    if header.model_id != onchain.model_id:
        return Reason.MODEL_MISMATCH
    declared = (header.temperature_bits, header.top_p_bits, header.top_k, header.max_tokens)
    if declared != (onchain.temperature_bits, onchain.top_p_bits, onchain.top_k, onchain.max_tokens):
        return Reason.PARAMS_MISMATCH
    if onchain.prompt_token_ids is not None and header.prompt_token_ids != onchain.prompt_token_ids:
        return Reason.PROMPT_MISMATCH
    if header.k != onchain.k or positions.k != onchain.k:
        return Reason.K_MISMATCH
    if header.output_length != len(positions):
        return Reason.OUTPUT_LENGTH_MISMATCH
    if header.output_length > header.max_tokens:
        return Reason.OUTPUT_TOO_LONG
    if compute_output_hash(positions.chosen) != onchain.output_hash:
        return Reason.OUTPUT_HASH_MISMATCH
    if compute_artifact_root(header, positions) != onchain.artifact_root:
        return Reason.ARTIFACT_ROOT_MISMATCH
    return Reason.OK


def compute_position_violations(v: np.ndarray, positions: Positions, vocab_size: int) -> np.ndarray:
    """Return a (rules × N) boolean matrix: rule r broken at position i, rules in spec order."""
    ids = positions.token_ids.astype(np.int64)
    w = positions.weights.astype(np.int64)
    chosen = positions.chosen.astype(np.int64)
    v = v.astype(np.int64)
    sorted_ids = np.sort(ids, axis=1)
    cumulative = np.cumsum(w, axis=1)
    inside = v[:, None] < cumulative
    in_candidates = inside.any(axis=1)
    expected = ids[np.arange(ids.shape[0]), np.argmax(inside, axis=1)]
    tail_ok = ~(ids == chosen[:, None]).any(axis=1) | (
        (chosen == ids[:, 0]) & (v >= tail_exhaustion_floor(vocab_size)))
    return np.stack([
        ((ids < 0) | (ids >= vocab_size)).any(axis=1),
        (sorted_ids[:, 1:] == sorted_ids[:, :-1]).any(axis=1),
        ((w < 0) | (w > WEIGHT_MAX)).any(axis=1),
        (w[:, 1:] > w[:, :-1]).any(axis=1),
        cumulative[:, -1] > WEIGHT_ONE,
        (chosen < 0) | (chosen >= vocab_size),
        in_candidates & (chosen != expected),
        ~in_candidates & ~tail_ok,
    ])


POSITION_RULES = (
    Reason.CANDIDATE_ID_OUT_OF_RANGE,
    Reason.DUPLICATE_TOKEN_ID,
    Reason.WEIGHT_OUT_OF_RANGE,
    Reason.WEIGHTS_NOT_SORTED,
    Reason.WEIGHT_SUM_OVERFLOW,
    Reason.CHOSEN_OUT_OF_RANGE,
    Reason.CHOSEN_MISMATCH,
    Reason.TAIL_TOKEN_IN_CANDIDATES,
)


def check_positions(seed: bytes, positions: Positions, vocab_size: int) -> SequenceCheckResult:
    """Return the first position (and rule) that the sampler replay under seed rejects."""
    n = len(positions)
    if n == 0:
        return SequenceCheckResult(Reason.OK, None, 0)
    violations = compute_position_violations(compute_sampler_uniforms(seed, n), positions, vocab_size)
    failing = np.flatnonzero(violations.any(axis=0))
    if failing.size == 0:
        return SequenceCheckResult(Reason.OK, None, n)
    position = int(failing[0])
    rule = int(np.argmax(violations[:, position]))
    return SequenceCheckResult(POSITION_RULES[rule], position, position)


def find_termination_position(positions: Positions, max_tokens: int,
                              stop_token_ids: frozenset[int]) -> tuple[Reason, int | None]:
    """Return the first position (and reason) where the output breaks the termination rule, or (OK, None)."""
    n = len(positions)
    length = find_length_violation(n, max_tokens)
    if length is not Reason.OK:
        return length, None  # header level: over-long, or empty
    is_stop = np.isin(positions.chosen.astype(np.int64), np.fromiter(stop_token_ids, dtype=np.int64))
    early = np.flatnonzero(is_stop[:-1])
    if early.size:
        return Reason.TOKENS_AFTER_STOP, int(early[0])
    if n < max_tokens and not is_stop[-1]:
        return Reason.NOT_TERMINATED, n - 1
    return Reason.OK, None


def sequence_check(header: ArtifactHeader, positions: Positions, onchain: OnchainInference) -> SequenceCheckResult:
    """Run stage 1: header and commitments, every position against v_i, then the termination rule.

    The first failing position is reported; at one position the sampler's rule comes first.
    """
    reason = find_header_violation(header, positions, onchain)
    if reason is not Reason.OK:
        return SequenceCheckResult(reason, None, 0)
    result = check_positions(header.run_seed, positions, onchain.vocab_size)
    end, at = find_termination_position(positions, header.max_tokens, onchain.stop_token_ids)
    if end is Reason.OK or (not result.valid and result.position is not None and at is not None
                            and result.position <= at):
        return result
    if at is None:
        return SequenceCheckResult(end, None, 0)
    return SequenceCheckResult(end, at, at)
