import json

import pytest

from node.spotcheck.errors import MalformedMessage, OversizedMessage, SpotCode
from node.spotcheck.wire import (
    MAX_FRAME,
    Answer,
    Challenge,
    ErrorReply,
    FrameDecoder,
    encode_frame,
    encode_raw_frame,
    parse_message,
)

NONCE = "ab" * 32
VERIFIER = "0x" + "12" * 20
SIG = "ef" * 65
SIGNED = {"issued_ms": 1_700_000_000_000, "verifier": VERIFIER}
GOOD = {"type": "challenge", "v": 1, "device_id": "d-0", "seq": 3, "nonce": NONCE, "kind": "labels", "count": 8,
        **SIGNED, "signature": SIG}


@pytest.mark.parametrize("message", [
    Challenge(device_id="d-0", seq=3, nonce=NONCE, kind="labels", count=8, **SIGNED, signature=SIG),
    Challenge(device_id="d-0", seq=4, nonce=NONCE, kind="state", count=0, **SIGNED),
    Answer(device_id="d-0", seq=3, nonce=NONCE, kind="labels", digest="cd" * 32, signature=SIG),
    Answer(device_id="d-0", seq=4, nonce=NONCE, kind="state", step=17, sketch=tuple(range(-(1 << 31), 64 - (1 << 31))),
           signature=SIG),
    ErrorReply(device_id="d-0", seq=5, code=SpotCode.REPLAYED_NONCE, message="seen"),
])
def test_every_message_round_trips_through_a_frame(message):
    frame = encode_frame(message)
    [body] = FrameDecoder().feed(frame)
    assert parse_message(body) == message


@pytest.mark.parametrize("change", [
    {"seq": "3"}, {"seq": -1}, {"nonce": "AB" * 32}, {"nonce": "ab" * 31}, {"kind": "weights"}, {"count": 0},
    {"count": 257}, {"device_id": "bad id"}, {"device_id": ""}, {"extra": 1}, {"v": 2}, {"type": "nope"},
    {"issued_ms": -1}, {"issued_ms": "1"}, {"verifier": "0x12"}, {"verifier": None}, {"signature": "ef" * 64},
    {"signature": "EF" * 65},
])
def test_malformed_challenges_are_typed_errors(change):
    with pytest.raises(MalformedMessage) as info:
        parse_message(json.dumps({**GOOD, **change}).encode())
    assert info.value.code is SpotCode.MALFORMED


@pytest.mark.parametrize("body", [b"", b"\xff\xfe", b"[]", b"null", b"{",
                                  json.dumps({**GOOD, "kind": "state"}).encode()])
def test_garbage_is_a_typed_error(body):
    with pytest.raises(MalformedMessage):
        parse_message(body)


@pytest.mark.parametrize("fields", [
    {"kind": "state", "step": 1, "sketch": [1] * 63}, {"kind": "state", "sketch": [1] * 64},
    {"kind": "state", "step": 1, "sketch": [1 << 31] + [0] * 63}, {"kind": "labels"},
    {"kind": "labels", "digest": "cd" * 32, "step": 1},
])
def test_answers_must_fit_their_kind(fields):
    with pytest.raises(MalformedMessage):
        parse_message(json.dumps({"type": "answer", "v": 1, "device_id": "d", "seq": 1, "nonce": NONCE,
                                  **fields}).encode())


def test_an_oversized_frame_is_reported_once_and_skipped_without_buffering():
    decoder = FrameDecoder()
    big = encode_raw_frame(b"x" * (MAX_FRAME + 1))
    good = encode_frame(Challenge(device_id="d", seq=1, nonce=NONCE, kind="state", count=0, **SIGNED))
    out = []
    for i in range(0, len(big), 1000):
        out += decoder.feed(big[i:i + 1000])
        assert len(decoder._buffer) <= 1000
    out += decoder.feed(good)
    assert isinstance(out[0], OversizedMessage) and len(out) == 2 and parse_message(out[1]).seq == 1
    with pytest.raises(OversizedMessage):
        parse_message(b"x" * (MAX_FRAME + 1))


def test_the_largest_signed_answer_fits_a_frame():
    answer = Answer(device_id="d" * 64, seq=(1 << 62) - 1, nonce=NONCE, kind="state", step=(1 << 62) - 1,
                    sketch=(-(1 << 31),) * 64, signature=SIG)
    assert len(encode_frame(answer)) <= MAX_FRAME


def test_frames_split_anywhere_reassemble():
    frames = b"".join(encode_frame(Challenge(device_id="d", seq=i, nonce=NONCE, kind="state", count=0, **SIGNED))
                      for i in range(5))
    decoder = FrameDecoder()
    bodies = [b for k in range(len(frames)) for b in decoder.feed(frames[k:k + 1])]
    assert [parse_message(b).seq for b in bodies] == list(range(5))
