"""The MoE devnet end to end on the tiny random Mixtral: duties drawn on anvil, the int8-expert operator slashed
by the hub committee's verdict on its failed duty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from node.devnet.moe import MoeDevnetOptions, compute_holdings, run_moe_devnet
from node.protocol.moe import ROUTER, SHARED, ExpertKey


def test_every_duty_of_the_tiny_moe_has_two_holders_among_four_validators() -> None:
    held = [compute_holdings(i, 2, 4) for i in range(4)]
    for key in [ExpertKey(L, e) for L in range(2) for e in range(4)] + [ExpertKey(1, ROUTER), ExpertKey(0, SHARED)]:
        assert sum(key in h for h in held) >= 2, key


@pytest.mark.e2e
def test_the_int8_expert_operator_is_slashed_by_the_hub_committee_and_the_honest_one_is_paid(tmp_path: Path) -> None:
    options = MoeDevnetOptions(model="tiny-moe", validators=5, rounds=2, tokens=8, cheat_expert="layer1.e1",
                               out=tmp_path)
    with (tmp_path / "console.txt").open("w") as lines:
        code = run_moe_devnet(options, Console(file=lines, width=200))
    record = json.loads((tmp_path / "devnet-moe.json").read_text())
    assert record["problems"] == [], record["events"]
    assert code == 0
    by_operator: dict[str, list[dict[str, object]]] = {}
    for r in record["inferences"]:
        by_operator.setdefault(str(r["operator"]), []).append(r)
    assert len(by_operator["honest"]) == 2 and all(r["failed"] == {} for r in by_operator["honest"])
    assert all(r["hub_status"] == "valid" for r in by_operator["honest"])
    cheat = by_operator["int8-expert"]
    assert len(cheat) == 1, "jailed after its first inference: no second request"
    assert cheat[0]["failed"] == {"layer1.e1": 903} and int(str(cheat[0]["slashed_wei"])) > 0
    assert cheat[0]["hub_status"] == "invalid"


@pytest.mark.e2e
# ≈ 6 min: a slow campaign; the cheat itself is caught in CI by tests/node/moe/test_moe_decode_only.py and
# test_dense_vote.py
@pytest.mark.slow
def test_the_decode_only_cheater_passes_every_duty_and_is_slashed_by_the_hub_committees_dense_check(
        tmp_path: Path) -> None:
    """Issue 30: tokens from the dense parent, traced by the real SmolLM2 MoE: every duty passes, the hub committee's
    dense check (stage 1 + stage 2 on the served tokens) votes each inference invalid until the hub slashes and jails
    the operator; the honest operator stays in good standing and paid. Before the fix it was voted valid and paid."""
    options = MoeDevnetOptions(model="smollm2-moe-4x135m", validators=4, rounds=2, tokens=16,
                               operators=("honest", "decode-only"), out=tmp_path)
    with (tmp_path / "console.txt").open("w") as lines:
        code = run_moe_devnet(options, Console(file=lines, width=200))
    record = json.loads((tmp_path / "devnet-moe.json").read_text())
    assert record["problems"] == [], record["events"]
    assert code == 0
    honest = [r for r in record["inferences"] if r["operator"] == "honest"]
    cheat = [r for r in record["inferences"] if r["operator"] == "decode-only"]
    assert honest and all(r["failed"] == {} and r["hub_status"] == "valid" for r in honest)
    assert cheat and all(r["failed"] == {} for r in cheat), "every duty passes: they judge the real model's trace"
    assert all(r["hub_status"] == "invalid" and 0 not in r["hub_votes"] for r in cheat)
    assert int(str(cheat[-1]["slashed_wei"])) > 0  # the hub's posterior crossed the threshold: slashed and jailed
