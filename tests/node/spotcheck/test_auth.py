"""Signed challenges and answers: who may challenge, who answered, and what a signature cannot be reused for."""

import pytest
from eth_account import Account

from node.spotcheck.auth import (
    SECP256K1_HALF_N,
    compute_answer_digest,
    compute_challenge_digest,
    is_answer_signed_by,
    recover_signer,
    sign_answer,
    sign_challenge,
    verify_challenge,
)
from node.spotcheck.errors import BadSignature, InvalidSpotParams, SpotCode, UnknownVerifier
from node.spotcheck.wire import Answer, Challenge

VERIFIER = Account.from_key(b"\x01" * 32)
STRANGER = Account.from_key(b"\x02" * 32)
OPERATOR = Account.from_key(b"\x03" * 32)
ALLOWED = frozenset({VERIFIER.address})
NONCE = "ab" * 32


def challenge(**change) -> Challenge:
    base = Challenge(device_id="dev", seq=7, nonce=NONCE, kind="labels", count=16, issued_ms=1_700_000_000_000,
                     verifier=VERIFIER.address)
    return base.model_copy(update=change)


def test_a_signed_challenge_verifies_and_its_digest_binds_every_field():
    signed = sign_challenge(VERIFIER, challenge(), "run")
    digest = verify_challenge(signed, "run", ALLOWED)
    assert digest == compute_challenge_digest(challenge(), "run")
    changes = [{"device_id": "dev2"}, {"seq": 8}, {"nonce": "cd" * 32}, {"kind": "state", "count": 0},
               {"count": 17}, {"issued_ms": 1_700_000_000_001}]
    digests = {compute_challenge_digest(challenge(**c), "run") for c in changes} | {
        compute_challenge_digest(challenge(), "run2"), compute_challenge_digest(challenge(verifier=STRANGER.address),
                                                                                "run")}
    assert len(digests) == len(changes) + 2 and digest not in digests


@pytest.mark.parametrize("change", [{"seq": 8}, {"nonce": "cd" * 32}, {"count": 64}, {"issued_ms": 1},
                                    {"device_id": "dev2"}])
def test_a_challenge_changed_after_signing_is_a_bad_signature(change):
    tampered = sign_challenge(VERIFIER, challenge(), "run").model_copy(update=change)
    with pytest.raises(BadSignature) as info:
        verify_challenge(tampered, "run", ALLOWED)
    assert info.value.code is SpotCode.BAD_SIGNATURE


def test_a_challenge_for_another_run_or_unsigned_is_a_bad_signature():
    with pytest.raises(BadSignature):
        verify_challenge(sign_challenge(VERIFIER, challenge(), "run-a"), "run-b", ALLOWED)
    with pytest.raises(BadSignature):
        verify_challenge(challenge(), "run", ALLOWED)


def test_a_stranger_is_an_unknown_verifier_even_if_it_names_itself_or_an_allowed_one():
    with pytest.raises(UnknownVerifier) as info:
        verify_challenge(sign_challenge(STRANGER, challenge(), "run"), "run", ALLOWED)
    assert info.value.code is SpotCode.UNKNOWN_VERIFIER and info.value.device == "dev"
    claims_allowed = sign_challenge(STRANGER, challenge(), "run").model_copy(update={"verifier": VERIFIER.address})
    with pytest.raises(BadSignature):
        verify_challenge(claims_allowed, "run", ALLOWED)


def test_high_s_and_malformed_signatures_are_refused():
    digest = compute_challenge_digest(challenge(), "run")
    good = sign_challenge(VERIFIER, challenge(), "run").signature
    raw = bytes.fromhex(good)
    s = int.from_bytes(raw[32:64], "big")
    n = 2 * SECP256K1_HALF_N + 1
    flipped = raw[:32] + (n - s).to_bytes(32, "big") + bytes([55 - raw[64] if raw[64] in (27, 28) else raw[64] ^ 1])
    assert recover_signer(digest, good) == VERIFIER.address
    for bad in (flipped.hex(), "zz" * 65, "00" * 65, good[:-2]):
        with pytest.raises(BadSignature):
            recover_signer(digest, bad)
    with pytest.raises(InvalidSpotParams):
        verify_challenge(challenge(verifier="0x1234"), "run", ALLOWED)


def test_an_answer_is_bound_to_its_operator_and_to_exactly_one_challenge():
    digest = verify_challenge(sign_challenge(VERIFIER, challenge(), "run"), "run", ALLOWED)
    answer = sign_answer(OPERATOR, digest, Answer(device_id="dev", seq=7, nonce=NONCE, kind="labels",
                                                  digest="cd" * 32))
    assert is_answer_signed_by(answer, digest, OPERATOR.address)
    assert not is_answer_signed_by(answer, digest, STRANGER.address)
    other = compute_challenge_digest(challenge(seq=8), "run")
    assert not is_answer_signed_by(answer, other, OPERATOR.address)  # replayed for another challenge
    changed = answer.model_copy(update={"digest": "ce" * 32})
    assert not is_answer_signed_by(changed, digest, OPERATOR.address)
    assert not is_answer_signed_by(answer.model_copy(update={"signature": None}), digest, OPERATOR.address)
    state = Answer(device_id="dev", seq=7, nonce=NONCE, kind="state", step=3, sketch=tuple(range(64)))
    assert compute_answer_digest(digest, state) != compute_answer_digest(
        digest, state.model_copy(update={"step": 4}))
    assert compute_answer_digest(digest, state) != compute_answer_digest(
        digest, state.model_copy(update={"sketch": (1, *range(1, 64))}))
