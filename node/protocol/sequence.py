"""The stage-1 rule for one position (docs/protocol.md), as the contract's fraud proof applies it.

This is the executable spec: one leaf, one uniform, scalar integer arithmetic. ``node.checks.stage1``
applies the same rules to a whole artifact at once, and tests hold the two to the same answers.
"""

from __future__ import annotations

import struct
from collections.abc import Collection, Sequence
from itertools import pairwise

from node.protocol.artifact import leaf_size
from node.protocol.errors import InvalidArtifact, Reason
from node.protocol.sampler import WEIGHT_MAX, WEIGHT_ONE, tail_exhaustion_floor


def find_position_violation(v: int, chosen: int, token_ids: Sequence[int], weights: Sequence[int],
                            vocab_size: int) -> Reason:
    """Return the first stage-1 rule a leaf breaks for sampler uniform v, or Reason.OK."""
    if any(not 0 <= t < vocab_size for t in token_ids):
        return Reason.CANDIDATE_ID_OUT_OF_RANGE
    if len(set(token_ids)) != len(token_ids):
        return Reason.DUPLICATE_TOKEN_ID
    if any(not 0 <= w <= WEIGHT_MAX for w in weights):
        return Reason.WEIGHT_OUT_OF_RANGE
    if any(a < b for a, b in pairwise(weights)):
        return Reason.WEIGHTS_NOT_SORTED
    if sum(weights) > WEIGHT_ONE:
        return Reason.WEIGHT_SUM_OVERFLOW
    if not 0 <= chosen < vocab_size:
        return Reason.CHOSEN_OUT_OF_RANGE
    cumulative = 0
    for token, weight in zip(token_ids, weights, strict=True):
        cumulative += weight
        if v < cumulative:
            return Reason.OK if chosen == token else Reason.CHOSEN_MISMATCH
    if chosen not in token_ids:
        return Reason.OK  # a tail token; its weight is for stage 2 to judge
    if chosen == token_ids[0] and v >= tail_exhaustion_floor(vocab_size):
        return Reason.OK  # the tail walk ran out: only possible this close to 2^32
    return Reason.TAIL_TOKEN_IN_CANDIDATES


def find_length_violation(output_length: int, max_tokens: int) -> Reason:
    """Return the length part of the termination rule: over-long, or empty though a token was allowed."""
    if output_length > max_tokens:
        return Reason.OUTPUT_TOO_LONG
    if output_length == 0 and max_tokens > 0:
        return Reason.NOT_TERMINATED  # an honest "empty" answer is the one-token output [stop]
    return Reason.OK


def find_termination_violation(position: int, chosen_is_stop: bool, output_length: int, max_tokens: int) -> Reason:
    """Return the termination rule a leaf at `position` breaks (docs/security.md rule 3), or Reason.OK.

    Only the last position may hold a stop token, and it must when the output is shorter than
    max_tokens: the sampler chose the stop there like any other token. The contract's
    proveTermination applies exactly this to one committed leaf.
    """
    if output_length > max_tokens:
        return Reason.OUTPUT_TOO_LONG
    if position >= output_length:
        return Reason.OK  # not a position of this output: nothing to judge here
    if position + 1 < output_length:
        return Reason.TOKENS_AFTER_STOP if chosen_is_stop else Reason.OK
    return Reason.NOT_TERMINATED if output_length < max_tokens and not chosen_is_stop else Reason.OK


def find_leaf_termination_violation(leaf: bytes, k: int, output_length: int, max_tokens: int,
                                    stop_token_ids: Collection[int]) -> tuple[int | None, Reason]:
    """Return the position judged and the termination rule broken there, as proveTermination reads its input.

    An empty `leaf` is the header-level proof (position None): the empty or over-long output. Otherwise
    the leaf names its own position and chosen token (its first 8 bytes) and is judged alone.
    """
    if not leaf:
        return None, find_length_violation(output_length, max_tokens)
    if len(leaf) != leaf_size(k):
        raise InvalidArtifact(f"a leaf of K={k} has {leaf_size(k)} bytes, not {len(leaf)}",
                              Reason.TRUNCATED if len(leaf) < leaf_size(k) else Reason.TRAILING_BYTES)
    position, chosen = struct.unpack_from(">II", leaf)
    return position, find_termination_violation(position, chosen in stop_token_ids, output_length, max_tokens)
