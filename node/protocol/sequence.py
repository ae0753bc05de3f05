"""The stage-1 rule for one position (DESIGN.md §2), as the contract's fraud proof applies it.

This is the executable spec: one leaf, one uniform, scalar integer arithmetic. ``node.checks.stage1``
applies the same rules to a whole artifact at once, and tests hold the two to the same answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from node.protocol.errors import Reason
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
