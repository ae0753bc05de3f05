import hashlib

import numpy as np
import pytest
from eth_account import Account

from node.spotcheck.answers import compute_challenge_indices, compute_labels_digest, compute_state_answer
from node.spotcheck.auth import compute_challenge_digest, sign_answer
from node.spotcheck.errors import ReplayedNonce, SpotCode, UnknownDevice
from node.spotcheck.stuffing import StuffingParams, compute_stuffing
from node.spotcheck.verify import (
    DeviceDeclaration,
    Exchange,
    SpotcheckPolicy,
    StepRecord,
    check_exchanges,
    decide_window,
    measure_window,
    split_windows,
)
from node.spotcheck.wire import Answer

PARAMS = StuffingParams(n_blocks=32, block_bytes=128, layers=2)
SEED = b"\x07" * 32
MS = 1_000_000
POLICY = SpotcheckPolicy(x_ms=50, capacity_slack_bytes=128)
OPERATOR = Account.from_key(b"\x05" * 32)
VERIFIER = "0x" + "12" * 20
RUN = "run-1"
DECL = DeviceDeclaration("dev", "sim", declared_bytes=4096 + 1024, catalog_bytes=4096 + 1024, state_bytes=1024,
                         stuffing=PARAMS, stuffing_seed=SEED, run_id=RUN, operator=OPERATOR.address)


def state_of(step: int) -> np.ndarray:
    return np.random.default_rng(step).standard_normal((4, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def blocks() -> np.ndarray:
    out = np.empty((PARAMS.n_blocks, PARAMS.words), dtype=np.uint64)
    compute_stuffing(SEED, PARAMS, out)
    return out


STEPS = [StepRecord(s, s * 100 * MS, s * 100 * MS + 10 * MS) for s in range(10)]  # step s done at s·100 + 10 ms


def nonce(i: int) -> bytes:
    return hashlib.sha256(i.to_bytes(4, "big")).digest()


def signed(ex: Exchange, answer: Answer, signer=OPERATOR, run_id: str = RUN) -> Exchange:
    """Return the exchange with the answer signed by `signer` for the exchange's challenge in `run_id`."""
    digest = compute_challenge_digest(ex.get_challenge(), run_id)
    return Exchange(ex.device_id, ex.seq, ex.kind, ex.nonce, ex.count, ex.issued_ms, ex.verifier, ex.sent_ns,
                    ex.received_ns, sign_answer(signer, digest, answer))


def labels_exchange(i: int, blocks: np.ndarray, sent_ms: float, latency_ms: float = 5, tamper: bool = False
                    ) -> Exchange:
    n = nonce(i)
    view = blocks.copy()
    if tamper:
        view[:] = 0
    digest = compute_labels_digest(n, compute_challenge_indices(n, PARAMS.n_blocks, 8), view)
    answer = Answer(device_id="dev", seq=i, nonce=n.hex(), kind="labels", digest=digest)
    ex = Exchange("dev", i, "labels", n, 8, 1000 + i, VERIFIER, int(sent_ms * MS), int((sent_ms + latency_ms) * MS),
                  None)
    return signed(ex, answer)


def state_exchange(i: int, sent_ms: float, step: int, state_step: int | None = None, latency_ms: float = 5
                   ) -> Exchange:
    n = nonce(i)
    sketch = compute_state_answer(state_of(step if state_step is None else state_step), n)
    answer = Answer(device_id="dev", seq=i, nonce=n.hex(), kind="state", step=step, sketch=sketch)
    ex = Exchange("dev", i, "state", n, 0, 1000 + i, VERIFIER, int(sent_ms * MS), int((sent_ms + latency_ms) * MS),
                  None)
    return signed(ex, answer)


def verdict(exchanges, blocks, decl=DECL):
    m = measure_window(decl, 0, STEPS, exchanges, blocks, lambda s: state_of(s) if 0 <= s < 10 else None)
    return m, decide_window(m, POLICY)


def test_an_honest_window_passes(blocks):
    ex = [labels_exchange(1, blocks, 50), state_exchange(2, 215, step=2), labels_exchange(3, blocks, 400)]
    m, v = verdict(ex, blocks)
    assert v.passed, v.failures
    assert m.state_quanta == (0,) and m.latencies_ms == (5.0, 5.0, 5.0)


def test_a_wrong_label_fails(blocks):
    _, v = verdict([labels_exchange(1, blocks, 50, tamper=True)], blocks)
    assert v.failures == ("wrong_labels",)


def test_a_late_answer_fails(blocks):
    _, v = verdict([labels_exchange(1, blocks, 50, latency_ms=51)], blocks)
    assert v.failures == ("late",)


def test_a_stale_copy_claiming_the_current_step_fails_on_the_sketch(blocks):
    _, v = verdict([state_exchange(1, 515, step=5, state_step=1)], blocks)
    assert v.failures == ("wrong_state",)


def test_answering_an_older_step_honestly_is_stale(blocks):
    _, v = verdict([state_exchange(1, 515, step=3)], blocks)
    assert v.failures == ("stale_state",)


def test_a_step_finished_after_the_answer_or_never_recorded_is_unknown(blocks):
    # step 5 completes at 510 ms; an answer received at 505 ms cannot be its state
    _, v = verdict([state_exchange(1, 500, step=5)], blocks)
    assert v.failures == ("unknown_step",)
    _, v = verdict([state_exchange(1, 2000, step=42)], blocks)
    assert "unknown_step" in v.failures


def test_a_step_that_ends_between_send_and_answer_is_fine(blocks):
    # sent at 505 ms (step 4 newest), step 5 ends at 510 ms, the answer at 515 ms names step 5
    _, v = verdict([state_exchange(1, 505, step=5, latency_ms=10)], blocks)
    assert v.passed, v.failures


def test_missing_and_refused_answers_fail(blocks):
    ex = Exchange("dev", 1, "labels", nonce(1), 8, 1001, VERIFIER, 50 * MS, None, None, SpotCode.MALFORMED)
    m, v = verdict([ex], blocks)
    assert v.failures == ("missing",) and m.errors == 1


@pytest.mark.parametrize("how", ["another key", "another run", "another challenge", "unsigned"])
def test_an_answer_not_signed_by_the_operator_for_this_challenge_counts_as_missing(blocks, how):
    honest = labels_exchange(1, blocks, 50)
    answer = honest.answer.model_copy(update={"signature": None})
    if how == "another key":
        forged = signed(honest, answer, signer=Account.from_key(b"\x06" * 32))
    elif how == "another run":
        forged = signed(honest, answer, run_id="run-2")
    elif how == "another challenge":  # the same answer bytes, signed for seq 2, replayed as seq 1's answer
        other = signed(labels_exchange(2, blocks, 60), answer)
        forged = Exchange(*(getattr(honest, f) for f in ("device_id", "seq", "kind", "nonce", "count", "issued_ms",
                                                          "verifier", "sent_ns", "received_ns")), other.answer)
    else:
        forged = Exchange(*(getattr(honest, f) for f in ("device_id", "seq", "kind", "nonce", "count", "issued_ms",
                                                          "verifier", "sent_ns", "received_ns")), answer)
    m, v = verdict([forged], blocks)
    assert v.failures == ("missing",) and m.unsigned == 1 and m.wrong_labels == 0
    assert verdict([honest], blocks)[1].passed


def test_capacity_below_the_catalog_fails(blocks):
    liar = DeviceDeclaration("dev", "sim", declared_bytes=2048, catalog_bytes=DECL.catalog_bytes, state_bytes=1024,
                             stuffing=StuffingParams(n_blocks=8, block_bytes=128, layers=2), stuffing_seed=SEED,
                             run_id=RUN, operator=OPERATOR.address)
    _, v = verdict([], blocks, decl=liar)
    assert set(v.failures) == {"capacity", "too_few_challenges"}


def test_the_log_checks_refuse_unknown_devices_and_replayed_nonces(blocks):
    a, b = labels_exchange(1, blocks, 50), labels_exchange(1, blocks, 60)
    with pytest.raises(ReplayedNonce):
        check_exchanges([DECL], [a, b])
    with pytest.raises(UnknownDevice):
        check_exchanges([], [a])


def test_windows_split_by_send_time(blocks):
    ex = [labels_exchange(i, blocks, ms) for i, ms in enumerate((10, 900, 1100, 2500))]
    windows = split_windows(ex, 0, 1000 * MS)
    assert {k: len(v) for k, v in windows.items()} == {0: 2, 1: 1, 2: 1}


def test_the_late_allowance_follows_the_challenges_a_window_actually_held():
    """A slow device lowers its own challenge count: 3 late answers of 4 passed an allowance of 4 sized for the 40
    challenges a window is expected to hold (the sim's recompute cheater, seen passing in a CI rehearsal)."""
    from node.spotcheck.verify import SpotcheckPolicy, WindowMeasurement, decide_window

    m = WindowMeasurement(device_id="d", window=0, challenges=4, state_challenges=3, labels_challenges=1, missing=0,
                          errors=0, unsigned=0, wrong_labels=0, stale_state=0, unknown_step=0,
                          latencies_ms=(5000.0, 5000.0, 5000.0, 10.0), state_quanta=(0, 0, 0), declared_bytes=1,
                          catalog_bytes=1, accounted_bytes=1)
    fixed = SpotcheckPolicy(x_ms=500.0, max_late=4, capacity_slack_bytes=0)
    assert decide_window(m, fixed).passed  # the expected-count allowance alone
    scaled = fixed.model_copy(update={"honest_late_rate": 0.002})
    assert decide_window(m, scaled).failures == ("late",)  # 3 late of 4 is not what a 0.2 % late rate explains
    honest = WindowMeasurement(**{**m.__dict__, "challenges": 40, "latencies_ms": (5000.0,) + (10.0,) * 39})
    assert decide_window(honest, scaled).passed  # one late answer of 40 stays allowed
