"""Issue 30, finding 2, at the hub: the MoE duty service's hub vote follows the dense check of the served tokens.

On a real anvil with the tiny Mixtral (tests/node/validator/test_moe_service.py's network): every duty of the
inference passes, and the committee's hub vote is invalid when the dense check (stage 1 + stage 2 on the served
tokens, node.moe.dense) fails — before the fix the committee voted such an inference valid from its duties alone.
The dense check here is a stand-in that returns a fixed verdict: the real one (its stage 1, stage 2 and the payload's
binding to the commitment) runs on the real SmolLM2 MoE in test_moe_decode_only.py and in the MoE devnet.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from chain.contracts import Status
from chain.moe import DutyResult
from node.errors import Reason
from node.moe.dense import MoeDenseVerdict
from node.protocol.hashing import keccak256
from node.protocol.moe import ExpertKey, compute_duty_key
from node.validator.moe import VOTE_DONE, _open_key
from tests.chain.conftest import MODEL_ID, Net
from tests.node.validator import test_moe_service as service_tests
from tests.node.validator.test_moe_service import _close, _network, _run, _serve

net = service_tests.net  # that module's fixtures: an anvil with the hub, the tiny Mixtral
tiny = service_tests.tiny


class StandInDense:
    """A dense check that returns one verdict and records what it was asked."""

    def __init__(self, verdict: MoeDenseVerdict) -> None:
        self.verdict = verdict
        self.calls: list[tuple[int, bytes]] = []

    async def __call__(self, inference_id: int, moe_root: bytes) -> MoeDenseVerdict:
        self.calls.append((inference_id, moe_root))
        return self.verdict


def _committee_votes(net: Net, tiny: tuple[Path, Any], tmp: Path, verdict: MoeDenseVerdict | None,
                     required: bool = False) -> tuple[Any, list[Any], list[StandInDense]]:
    """Run the services until every hub committee member's vote job has ended (voted, abstained or settled)."""
    opened, services, _, port = _network(net, tiny, tmp, assign=False, model_id=MODEL_ID)
    checks = []
    for s in services:
        if verdict is not None:
            checks.append(StandInDense(verdict))
            s.dense = checks[-1]  # type: ignore[assignment]
        s.dense_required = required
    key = _open_key(opened.iid)
    net.mine(1)
    _, committee = net.hub.selection_of(opened.iid)
    members = [s for s in services if s.account.address in committee]

    def ended() -> int:
        return sum(s.store.get_record(VOTE_DONE, key) is not None for s in members)

    try:
        asyncio.run(_run(net, services, _serve(opened), len(members), port, count=ended))
    finally:
        _close(services)
    return opened, services, checks


def test_a_failed_dense_check_makes_the_hub_verdict_invalid_though_every_duty_passes(
        net: Net, tiny: tuple[Path, Any], tmp_path: Path) -> None:
    failed = MoeDenseVerdict(False, int(Reason.LOGPROB_DISTANCE), keccak256(b"scores"))
    opened, services, checks = _committee_votes(net, tiny, tmp_path, failed)
    assert all(opened.ed.duty_result(opened.iid, d) is DutyResult.PASSED
               for d in {compute_duty_key(ExpertKey.parse(duty)) for s in services for _, duty, _ in s.done})
    votes = [(valid, reason) for s in services for _, valid, reason in s.hub_votes]
    assert votes and set(votes) == {(False, int(Reason.LOGPROB_DISTANCE))}
    assert net.hub.get_inference(opened.iid).status is Status.INVALID
    moe_root = opened.served.commitment.root()
    assert all(call == (opened.iid, moe_root) for check in checks for call in check.calls)  # the opened root


def test_a_passed_dense_check_leaves_the_verdict_to_the_duties(net: Net, tiny: tuple[Path, Any],
                                                                tmp_path: Path) -> None:
    passed = MoeDenseVerdict(True, 0, keccak256(b"scores"))
    opened, services, checks = _committee_votes(net, tiny, tmp_path, passed)
    assert net.hub.get_inference(opened.iid).status is Status.VALID
    assert all(valid for s in services for _, valid, _ in s.hub_votes) and any(check.calls for check in checks)


def test_a_member_that_must_check_the_served_tokens_but_cannot_never_votes_valid(
        net: Net, tiny: tuple[Path, Any], tmp_path: Path) -> None:
    opened, services, _ = _committee_votes(net, tiny, tmp_path, None, required=True)
    assert not any(s.hub_votes for s in services)  # the duties all passed; without the dense check: no valid vote
    assert net.hub.get_inference(opened.iid).status is Status.COMMITTED
    assert any(s.done for s in services)  # the duties were judged meanwhile
