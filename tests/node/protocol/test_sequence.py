import struct

import pytest

from node.errors import InvalidArtifact, Reason
from node.protocol.artifact import leaf_size
from node.protocol.sampler import WEIGHT_ONE, tail_exhaustion_floor
from node.protocol.sequence import (
    find_leaf_termination_violation,
    find_length_violation,
    find_position_violation,
    find_termination_violation,
)

IDS = [5, 9, 2, 7, 1]
W = [2**31, 2**30, 2**29, 0, 0]  # W_K = 2^32 - 2^29
VOCAB = 64


@pytest.mark.parametrize("v,chosen,expected", [
    (0, 5, Reason.OK),
    (2**31 - 1, 5, Reason.OK),
    (2**31, 9, Reason.OK),  # v = W_1 falls in the second interval
    (2**31, 5, Reason.CHOSEN_MISMATCH),
    (2**32 - 2**29 - 1, 2, Reason.OK),
    (2**32 - 2**29, 3, Reason.OK),  # v >= W_K: a tail token outside the candidates
    (2**32 - 2**29, 9, Reason.TAIL_TOKEN_IN_CANDIDATES),
    (2**32 - 2**29, 5, Reason.TAIL_TOKEN_IN_CANDIDATES),  # too far from 2^32 for the tail to run out
    (tail_exhaustion_floor(VOCAB), 5, Reason.OK),  # the tail ran out: top token
    (tail_exhaustion_floor(VOCAB) - 1, 5, Reason.TAIL_TOKEN_IN_CANDIDATES),
    (0, 64, Reason.CHOSEN_OUT_OF_RANGE),
    (0, -1, Reason.CHOSEN_OUT_OF_RANGE),
])
def test_chosen_token_rules(v, chosen, expected):
    assert find_position_violation(v, chosen, IDS, W, VOCAB) is expected


@pytest.mark.parametrize("ids,weights,expected", [
    ([5, 9, 2, 7, 64], W, Reason.CANDIDATE_ID_OUT_OF_RANGE),
    ([5, 9, 2, 7, -1], W, Reason.CANDIDATE_ID_OUT_OF_RANGE),
    ([5, 9, 5, 7, 1], W, Reason.DUPLICATE_TOKEN_ID),
    (IDS, [2**32, 0, 0, 0, 0], Reason.WEIGHT_OUT_OF_RANGE),
    (IDS, [2**30, 2**31, 0, 0, 0], Reason.WEIGHTS_NOT_SORTED),
    (IDS, [2**31, 2**31, 1, 0, 0], Reason.WEIGHT_SUM_OVERFLOW),
    (IDS, [2**31, 2**31, 0, 0, 0], Reason.OK),  # exactly 2^32 is allowed
])
def test_leaf_structure_rules(ids, weights, expected):
    assert sum(weights) <= WEIGHT_ONE or expected is not Reason.OK
    assert find_position_violation(0, ids[0], ids, weights, VOCAB) is expected


@pytest.mark.parametrize("position,is_stop,n,m,want", [
    (3, True, 4, 8, Reason.OK),                   # an honest stop at the end
    (3, False, 4, 8, Reason.NOT_TERMINATED),      # truncated: shorter than max_tokens, no stop
    (3, False, 4, 4, Reason.OK),                  # max_tokens reached: may end on anything
    (3, True, 4, 4, Reason.OK),
    (1, True, 4, 8, Reason.TOKENS_AFTER_STOP),    # generation went on after a stop
    (1, True, 4, 4, Reason.TOKENS_AFTER_STOP),
    (1, False, 4, 8, Reason.OK),
    (7, False, 4, 8, Reason.OK),                  # not a position of this output
    (0, True, 9, 8, Reason.OUTPUT_TOO_LONG),
])
def test_the_termination_rule_per_leaf(position, is_stop, n, m, want):
    assert find_termination_violation(position, is_stop, n, m) is want


def test_the_length_rule():
    assert find_length_violation(0, 8) is Reason.NOT_TERMINATED  # empty: the honest empty answer is [stop]
    assert find_length_violation(0, 0) is Reason.OK
    assert find_length_violation(9, 8) is Reason.OUTPUT_TOO_LONG
    assert find_length_violation(8, 8) is Reason.OK


def _leaf(position: int, chosen: int, k: int = 5) -> bytes:
    return struct.pack(">II", position, chosen) + bytes(12 * k)


@pytest.mark.parametrize("leaf,n,m,want", [
    (_leaf(3, 2), 4, 8, (3, Reason.OK)),                         # ends on the stop token 2
    (_leaf(3, 106), 4, 8, (3, Reason.OK)),                       # ... or on the second one
    (_leaf(3, 7), 4, 8, (3, Reason.NOT_TERMINATED)),             # truncated
    (_leaf(3, 7), 4, 4, (3, Reason.OK)),                         # max_tokens reached
    (_leaf(1, 2), 4, 4, (1, Reason.TOKENS_AFTER_STOP)),          # went on after the stop
    (_leaf(0, 2), 1, 8, (0, Reason.OK)),                         # [stop]: the valid "empty" answer
    (_leaf(2**32 - 1, 2), 4, 8, (2**32 - 1, Reason.OK)),         # names no position of this output
    (b"", 0, 8, (None, Reason.NOT_TERMINATED)),                  # empty output, header level
    (b"", 9, 8, (None, Reason.OUTPUT_TOO_LONG)),
    (b"", 4, 8, (None, Reason.OK)),                              # the header alone proves no truncation
])
def test_the_termination_rule_as_the_fraud_proof_reads_a_leaf(leaf, n, m, want):
    assert find_leaf_termination_violation(leaf, 5, n, m, frozenset({2, 106})) == want


def test_a_leaf_of_the_wrong_length_is_a_typed_error():
    with pytest.raises(InvalidArtifact) as short:
        find_leaf_termination_violation(_leaf(0, 2)[:-1], 5, 1, 8, {2})
    with pytest.raises(InvalidArtifact) as long:
        find_leaf_termination_violation(_leaf(0, 2) + b"\0", 5, 1, 8, {2})
    assert (short.value.reason, long.value.reason) == (Reason.TRUNCATED, Reason.TRAILING_BYTES)
    assert len(_leaf(0, 2)) == leaf_size(5)
