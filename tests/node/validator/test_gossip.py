"""The verdict gossip message: one declared model, round trip, typed rejections (fuzzed), and a
libp2p-side validation that needs no RPC (issue 15, finding 9)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chain.contracts import Commitment, Hub, Vote
from chain.devnet import dev_account
from chain.eip712 import Verdict, sign_verdict
from node.store.leveldb import Store
from node.validator.config import ValidatorConfig
from node.validator.daemon import ValidatorNode
from node.validator.gossip import (
    MAX_GOSSIP_BYTES,
    GossipVote,
    InvalidGossip,
    decode_gossip_vote,
    decode_vote_message,
    encode_vote_message,
)

CONTRACT = "0x5FbDB2315678afecb367f032d93F642f64180aa3"
C = Commitment(b"\x01" * 32, b"\x02" * 32, b"\x03" * 32)
V = Vote(False, 504, b"\x04" * 32, 2**40, b"\x05" * 65)
GOOD = json.loads(encode_vote_message(9, C, V))


def signed(account, iid: int = 9, commitment: Commitment = C, valid: bool = True) -> bytes:
    verdict = Verdict(iid, commitment.artifact_root, valid, 0, b"\x04" * 32, 2**40)
    vote = Vote(valid, 0, b"\x04" * 32, 2**40, sign_verdict(account, verdict, 31337, CONTRACT))
    return encode_vote_message(iid, commitment, vote)


def test_the_message_round_trips_and_recovers_its_signer() -> None:
    assert decode_vote_message(encode_vote_message(9, C, V)) == (9, C, V)
    message = decode_gossip_vote(signed(dev_account(3)))
    assert GossipVote.model_validate_json(message.encode()) == message
    assert message.recover_signer(31337, CONTRACT) == dev_account(3).address
    assert message.recover_signer(1, CONTRACT) != dev_account(3).address  # the domain is signed


@pytest.mark.parametrize("broken", [
    {**GOOD, "signature": "0x00"}, {**GOOD, "artifact_root": "0x1234"}, {**GOOD, "valid": "yes"},
    {**GOOD, "valid": 1}, {**GOOD, "reason": 2**16}, {**GOOD, "reason": "0"}, {**GOOD, "deadline": -1},
    {**GOOD, "deadline": 2**64}, {**GOOD, "deadline": 1.5}, {**GOOD, "inference_id": 9},
    {**GOOD, "inference_id": "09"}, {**GOOD, "inference_id": str(2**256)}, {**GOOD, "inference_id": "9" * 400},
    {**GOOD, "extra": 1}, {k: v for k, v in GOOD.items() if k != "deadline"}, ["x"], "x", None, 1, [],
])
def test_malformed_messages_are_typed_rejections(broken: object) -> None:
    with pytest.raises(InvalidGossip):
        decode_gossip_vote(json.dumps(broken).encode())


def test_oversized_and_non_json_messages_are_typed_rejections() -> None:
    for data in (b"", b"\xff\xfe", b"{" * 10_000, b" " * (MAX_GOSSIP_BYTES + 1), b'{"a":' * 200 + b"1" + b"}" * 200):
        with pytest.raises(InvalidGossip):
            decode_gossip_vote(data)


def test_a_signature_that_does_not_recover_is_a_typed_rejection() -> None:
    for sig in ("0x" + "00" * 65, "0x" + "ff" * 65, "0x" + "11" * 64 + "05"):
        with pytest.raises(InvalidGossip):
            decode_gossip_vote(json.dumps({**GOOD, "signature": sig}).encode()).recover_signer(31337, CONTRACT)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                           max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=MAX_GOSSIP_BYTES + 8))
def test_no_bytes_crash_the_parser(data: bytes) -> None:
    try:
        decode_gossip_vote(data)
    except InvalidGossip:
        pass


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(sorted(GOOD)), json_values, max_size=len(GOOD)))
def test_no_field_values_crash_the_parser_or_the_signature_check(overrides: dict) -> None:
    try:
        message = decode_gossip_vote(json.dumps({**GOOD, **overrides}).encode())
    except InvalidGossip:
        return
    try:
        message.recover_signer(31337, CONTRACT)
    except InvalidGossip:
        pass


def test_gossip_validation_makes_no_rpc_and_uses_only_what_the_node_knows(tmp_path: Path) -> None:
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider("http://127.0.0.1:9", request_kwargs={"timeout": 5}))  # nothing listens there
    config = ValidatorConfig(chain_id=31337, contract=CONTRACT, keystore=Path("unused"))
    with Store(tmp_path, 31337, CONTRACT) as store:
        node = ValidatorNode(config, dev_account(3), Hub(w3, CONTRACT), store, {})
        member, outsider = dev_account(5), dev_account(6)
        started = time.perf_counter()
        assert node._validate_gossip(signed(member))  # committee unknown yet: the asyncio side decides
        assert not node._validate_gossip(b'["x"]')
        node._committees[9] = [dev_account(3).address, member.address]
        assert node._validate_gossip(signed(member))
        assert not node._validate_gossip(signed(outsider))  # not a member
        node._commitments[9] = C
        forged = Commitment(b"\x66" * 32, C.artifact_root, C.fingerprint_hash)  # artifact root signed, rest not
        assert not node._validate_gossip(signed(member, commitment=forged))
        assert node._validate_gossip(signed(member))
        assert time.perf_counter() - started < 2.0
        text = node.metrics.registry.get_sample_value
        assert text("verinfer_gossip_rejected_total", {"reason": "commitment-mismatch"}) == 1.0
        assert text("verinfer_gossip_rejected_total", {"reason": "not-in-committee"}) == 1.0
