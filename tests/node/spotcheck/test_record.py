"""A run written to a real workload record (plyvel + safetensors) reads back into the verifier's inputs."""

import numpy as np
import pytest

from node.spotcheck.device import DeviceLog
from node.spotcheck.errors import SpotCode, UnknownDevice
from node.spotcheck.pinger import ExchangeRecord
from node.spotcheck.record import DeviceRun, process_write_device, read_device_run
from node.spotcheck.stuffing import StuffingParams
from node.spotcheck.wire import Answer
from node.workload.store import WorkloadRecord

PARAMS = StuffingParams(n_blocks=16, block_bytes=128, layers=2)
VERIFIER = "0x" + "12" * 20
OPERATOR = "0x" + "34" * 20
SIG = "ef" * 65


def make_run() -> DeviceRun:
    log = DeviceLog(device_id="dev", n_blocks=16, state_bytes=64, fill_s=0.5, weights_digest="ab" * 32,
                    steps=[(0, 100, 200), (1, 300, 400)], tokens=[5, 6, 7], answered_states={
                        1: np.ones((2, 8), dtype=np.float32)})
    state = Answer(device_id="dev", seq=1, nonce="11" * 32, kind="state", step=1, sketch=tuple(range(64)))
    labels = Answer(device_id="dev", seq=2, nonce="22" * 32, kind="labels", digest="33" * 32)
    signed = (VERIFIER, SIG)
    exchanges = (
        ExchangeRecord("dev", 1, "state", "11" * 32, 0, 1001, *signed, 450, 470,
                       state.model_dump_json(exclude_none=True), None),
        ExchangeRecord("dev", 2, "labels", "22" * 32, 8, 1002, *signed, 500, 530,
                       labels.model_dump_json(exclude_none=True), None),
        ExchangeRecord("dev", 3, "labels", "44" * 32, 8, 1003, *signed, 600, 610, None, SpotCode.REPLAYED_NONCE.value),
        ExchangeRecord("dev", 4, "state", "55" * 32, 0, 1004, *signed, 700, None, None, None),
    )
    return DeviceRun("dev", "sim-1", 2048 + 64, b"\x09" * 32, PARAMS, 2, "tiny-llama", 300.0, OPERATOR, log,
                     exchanges)


def test_a_run_round_trips_through_the_record(tmp_path):
    run = make_run()
    with WorkloadRecord.open(tmp_path / "rec") as record:
        trace_id = process_write_device(record, "r1", run)
    with WorkloadRecord.open(tmp_path / "rec", readonly=True) as record:
        back = read_device_run(record, "r1", "dev", {"sim-1": 4096}, OPERATOR)
        states = [r for r in record.tensor_refs() if r.role == "state"]
        assert [s.event_id for s in states] == ["step/1"] and states[0].trace_id == trace_id
        assert {d.device_id for d in record.devices()} == {"dev", "pinger"}
    assert back.declaration.stuffing == PARAMS and back.declaration.stuffing_seed == b"\x09" * 32
    assert back.declaration.catalog_bytes == 4096 and back.declaration.declared_bytes == 2048 + 64
    assert back.declaration.operator == OPERATOR and back.declaration.run_id == "r1"
    assert [(s.step, s.start_ns, s.end_ns) for s in back.steps] == run.log.steps
    assert back.tokens.tolist() == [5, 6, 7] and back.state_tokens == 2
    by_seq = {e.seq: e for e in back.exchanges}
    assert by_seq[1].answer is not None and by_seq[1].answer.sketch == tuple(range(64))
    assert by_seq[1].received_ns == 470 and by_seq[2].answer.digest == "33" * 32
    assert (by_seq[2].issued_ms, by_seq[2].verifier) == (1002, VERIFIER)
    assert by_seq[3].answer is None and by_seq[3].error is SpotCode.REPLAYED_NONCE
    assert by_seq[4].received_ns is None and by_seq[4].answer is None and by_seq[4].error is None


def test_a_kind_outside_the_verifiers_catalog_is_refused(tmp_path):
    with WorkloadRecord.open(tmp_path / "rec") as record:
        process_write_device(record, "r1", make_run())
        with pytest.raises(UnknownDevice):
            read_device_run(record, "r1", "dev", {"other-kind": 4096}, OPERATOR)
