import pytest

from node.errors import Reason
from node.protocol.sampler import WEIGHT_ONE, tail_exhaustion_floor
from node.protocol.sequence import find_length_violation, find_position_violation, find_termination_violation

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
