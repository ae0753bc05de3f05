"""The devnet's verdict on a run, its record and plot, and the validator config it writes."""

import json
import tomllib
from pathlib import Path

import pytest

from chain.devnet import dev_account
from node.devnet.network import (
    OPERATOR_KINDS,
    OPERATOR_STAKE,
    DevnetOptions,
    InferenceRecord,
    NetworkState,
    OperatorView,
    write_validator_config,
)
from node.devnet.report import HONEST_KINDS, judge_outcome, plot_spoofer_probability, render_state, write_run_record
from node.validator.config import load_config


def _state(honest_status: str = "VALID", honest_p: float = 1e-6, cheaters_jailed: bool = True) -> NetworkState:
    state = NetworkState(DevnetOptions())
    for i, kind in enumerate(OPERATOR_KINDS):
        honest = kind in HONEST_KINDS  # the honest operator and the one restarted mid-run
        state.operators.append(OperatorView(
            kind, dev_account(2 + i).address, stake=OPERATOR_STAKE if honest or not cheaters_jailed
            else OPERATOR_STAKE // 2, spoof_p=honest_p if honest else (0.997 if cheaters_jailed else 0.6),
            jailed=not honest and cheaters_jailed))
        status = honest_status if honest else "INVALID"
        state.inferences.append(InferenceRecord(i + 1, kind, 0, "Hi!", 0.7, 1.0, 0.0, 1.0, 2.0, status))
        state.timeline.append((float(i), {k: 0.01 for k in OPERATOR_KINDS}))
    return state


def test_a_run_where_the_network_did_its_job_has_no_problems():
    assert judge_outcome(_state()) == []


@pytest.mark.parametrize("state, says", [
    (_state(honest_status="INVALID"), "honest inferences not judged valid"),
    (_state(honest_p=0.5), "honest operator not in good standing"),
    (_state(cheaters_jailed=False), "int8 was not slashed"),
])
def test_each_way_the_network_can_fail_is_reported(state, says):
    assert any(says in p for p in judge_outcome(state)), judge_outcome(state)


def test_an_unanswered_honest_request_is_not_held_against_it_but_no_judged_one_is():
    state = _state()
    state.inferences[0].error, state.inferences[0].status = "commit too late", "REQUESTED"
    assert judge_outcome(state) == ["no honest inference was judged"]


def test_record_and_plot_are_written(tmp_path: Path):
    state = _state()
    record = json.loads(write_run_record(state, [], tmp_path / "devnet.json").read_text())
    assert record["ok"] and [o["kind"] for o in record["operators"]] == list(OPERATOR_KINDS)
    ops = record["operators"]  # honest, restarted (honest too), int8, ...
    assert ops[2]["invalid"] == 1 and ops[1]["valid"] == 1 and ops[0]["valid"] == 1
    assert record["latency_s"]["answer_to_verdict_mean"] == 1.0
    png = plot_spoofer_probability(state, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    render_state(state)  # renders without a chain


def test_the_validator_config_is_one_the_validator_accepts(tmp_path: Path):
    account = dev_account(6)
    path = write_validator_config(tmp_path / "v0", 0, account, "http://127.0.0.1:1", "0x" + "11" * 20, 3,
                                  "smollm2-135m-instruct", {"0xabc": "http://127.0.0.1:2"},
                                  {"0xabc": "/ip4/127.0.0.1/tcp/3/p2p/x"}, 4, 5)
    config = load_config(path)
    assert config.start_block == 3 and config.metrics_port == 5 and config.executers == {"0xabc": "http://127.0.0.1:2"}
    assert config.password_file is not None and (config.password_file.stat().st_mode & 0o777) == 0o600
    assert tomllib.loads(path.read_text())["p2p_listen"] == "/ip4/127.0.0.1/tcp/4"
    from node.keys import read_password, unlock_keystore

    assert unlock_keystore(config.keystore, read_password(config.password_file)).address == account.address
