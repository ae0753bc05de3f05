"""The payload protocol's wire messages: round trips, and the strict request parser (finding 5 of issue 15)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.errors import InvalidInput, Reason
from node.p2p.wire import (
    FOUND,
    MAX_PAYLOAD,
    MAX_REQUEST,
    NOT_FOUND,
    PayloadRequest,
    decode_answer_header,
    decode_payload_request,
    encode_answer,
    encode_payload_request,
)


@given(st.integers(0, 2**256 - 1))
@settings(max_examples=200, deadline=None)
def test_a_request_round_trips_for_every_uint256(inference_id: int) -> None:
    wire = encode_payload_request(PayloadRequest(inference_id=inference_id))
    assert int.from_bytes(wire[:4], "big") == len(wire) - 4 <= MAX_REQUEST
    assert decode_payload_request(wire[4:]).inference_id == inference_id


@given(st.binary(max_size=90) | st.text(max_size=90).map(str.encode))
@settings(max_examples=300, deadline=None)
def test_any_body_is_either_rejected_typed_or_the_one_canonical_spelling_of_its_id(body: bytes) -> None:
    try:
        request = decode_payload_request(body)
    except InvalidInput:
        return
    assert str(request.inference_id).encode() == body  # one id, one spelling: no sign, space, "_" or "٧"


@pytest.mark.parametrize(("body", "reason"), [
    (b"-1", Reason.WIRE_MALFORMED),
    (b"+7", Reason.WIRE_MALFORMED),
    (b" 7", Reason.WIRE_MALFORMED),
    (b"7\n", Reason.WIRE_MALFORMED),
    (b"1_0", Reason.WIRE_MALFORMED),
    ("٧".encode(), Reason.WIRE_MALFORMED),  # int() reads Arabic-Indic seven as 7
    (b"\xff", Reason.WIRE_MALFORMED),
    (b"07", Reason.NON_CANONICAL),
    (b"", Reason.TRUNCATED),
    (str(2**256).encode(), Reason.OUT_OF_RANGE),  # 78 digits, one past the largest uint256
    (b"9" * 78, Reason.OUT_OF_RANGE),
    (str(10**100).encode(), Reason.WIRE_TOO_LARGE),
    (b"1" * (MAX_REQUEST + 1), Reason.WIRE_TOO_LARGE),
])
def test_bad_requests_are_typed_rejections(body: bytes, reason: Reason) -> None:
    with pytest.raises(InvalidInput) as caught:
        decode_payload_request(body)
    assert caught.value.reason is reason


def test_the_largest_uint256_and_zero_are_valid() -> None:
    assert decode_payload_request(str(2**256 - 1).encode()).inference_id == 2**256 - 1
    assert decode_payload_request(b"0").inference_id == 0


def test_a_request_model_refuses_ids_that_are_not_uint256() -> None:
    for bad in (-1, 2**256):
        with pytest.raises(ValueError):
            PayloadRequest(inference_id=bad)


def test_answers_round_trip_and_broken_headers_are_typed() -> None:
    found = encode_answer(b"{}")
    assert decode_answer_header(found[:5]) == (FOUND, 2) and found[5:] == b"{}"
    assert decode_answer_header(encode_answer(None)) == (NOT_FOUND, 0)
    for header, reason in [(bytes([7, 0, 0, 0, 0]), Reason.WIRE_MALFORMED),
                           (bytes([FOUND]) + (MAX_PAYLOAD + 1).to_bytes(4, "big"), Reason.WIRE_TOO_LARGE),
                           (bytes([NOT_FOUND, 0, 0, 0, 1]), Reason.NON_CANONICAL),
                           (b"\x00", Reason.TRUNCATED)]:
        with pytest.raises(InvalidInput) as caught:
            decode_answer_header(header)
        assert caught.value.reason is reason
    with pytest.raises(InvalidInput):
        encode_answer(b"x" * (MAX_PAYLOAD + 1))
