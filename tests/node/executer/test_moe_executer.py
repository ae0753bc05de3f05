"""The executer serving an MoE model (tiny random Mixtral): what it commits opens on a real ExpertDuty module.

The executer generates over its OpenAI API, binds moeRoot into the fingerprint hash it reports, and serves the
opening and every duty's slice; the hub commitment of those values is opened on anvil with the opening fetched
over HTTP, and each duty's slice passes a validator holding the whole model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from chain.contracts import Commitment, Params
from chain.devnet import Anvil, dev_account
from chain.errors import ContractReverted
from chain.moe import deploy_expert_duty
from node.executer.bootstrap import ExecuterSettings, load_executer
from node.executer.server import create_app
from node.moe.config import DutyValidator, MoeDutiesConfig
from node.moe.serve import MoeOpeningWire
from node.moe.validate import MoeLimits
from node.moe.wire import decode_duty_slice
from node.protocol.fingerprint import compute_fingerprint_hash, decode_fingerprint_base64
from node.protocol.hashing import keccak256
from node.protocol.moe import ROUTER, SHARED, ExpertKey, MoeReason, compute_moe_fingerprint_hash
from node.validator.moe import compute_shape
from tests.chain.conftest import MODEL_ID, build_net
from tests.chain.flows import FEE, USER_SEED
from tests.node.executer.conftest import RunningServer

MESSAGES = [{"role": "user", "content": "Name three rivers."}]
LIMITS = MoeLimits(1e-4, 0, 1e-4, 1e-4)


@pytest.fixture(scope="module")
def moe_server() -> Iterator[Any]:
    torch.set_num_threads(1)
    service, _, profile = load_executer(ExecuterSettings("tiny-moe"))
    assert profile is None and service.moe is not None  # no dense stage-2 profile: served, not a verifier
    with RunningServer(service, create_app(service, "none", False)) as server:
        yield server, service


def _chat(url: str, iid: int) -> dict[str, Any]:
    body = {"model": "tiny-moe", "messages": MESSAGES, "max_tokens": 10, "seed": 7, "temperature": 0.9,
            "inference_id": iid}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_committed_fingerprint_hash_binds_the_served_opening(moe_server):
    server, service = moe_server
    r = _chat(server.url, 41)
    info = r["verinfer"]
    proofs = decode_fingerprint_base64(r["choices"][0]["message"]["verification_proofs"])
    opening = MoeOpeningWire.model_validate_json(httpx.get(f"{server.url}/v1/moe/41").content).opening()
    assert opening.fingerprint_hash == compute_fingerprint_hash(proofs)  # the dense proofs' hash, then bound
    moe_root = service.moe.slices.get(41).commitment.root()
    assert info["fingerprint_hash"] == "0x" + compute_moe_fingerprint_hash(opening.fingerprint_hash, moe_root).hex()
    assert "0x" + opening.output_hash.hex() == info["output_hash"]
    assert "0x" + opening.artifact_root.hex() == info["artifact_root"]
    assert sum(opening.counts) == 2 * 2 * (len(service.moe.slices.get(41).prompt_ids) + r["usage"][
        "completion_tokens"] - 1)  # top-2 over 2 layers at every fed position


def test_unknown_or_malformed_requests_get_typed_answers(moe_server):
    server, _ = moe_server
    assert httpx.get(f"{server.url}/v1/moe/999999").status_code == 404
    assert httpx.get(f"{server.url}/v1/moe/999999/layer0.e1").status_code == 404
    assert httpx.get(f"{server.url}/v1/moe/0x12").status_code == 400
    _chat(server.url, 42)
    assert httpx.get(f"{server.url}/v1/moe/42/layer7.e1").status_code == 400  # not a duty of this model
    served = _chat(server.url, 43)["choices"][0]["message"]
    verify = {"model": "tiny-moe", "messages": [*MESSAGES, {"role": "assistant", "content": served["content"]}],
              "max_tokens": 0, "verification_proof_to_validate": served["verification_proofs"]}
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=verify, timeout=60)
    assert answer.status_code == 400 and "no calibrated profile" in answer.text


def test_the_opening_fetched_over_http_opens_the_hub_commitment_and_every_slice_passes(moe_server):
    server, service = moe_server
    model = service.engine.model
    shape = compute_shape(model.config.to_dict())
    with Anvil() as anvil:
        net = build_net(anvil.web3(), [dev_account(i) for i in range(7)])
        ed = deploy_expert_duty(net.w3, net.admin, net.hub, per_duty=2)
        ed.set_shape(net.admin, MODEL_ID, shape.layers, shape.experts)
        for v in net.validators:
            ed.declare_holdings(v, MODEL_ID, None)
        net.mine(1)
        iid = net.hub.call("nextInferenceId") + 1
        net.hub.request_inference(net.requester, net.operator.address, MODEL_ID, keccak256(b"prompt"), USER_SEED,
                                  Params(0, 0, 0, 10), FEE)
        info = _chat(server.url, iid)["verinfer"]
        net.hub.commit_inference(net.operator, iid, Commitment(*(bytes.fromhex(info[k][2:]) for k in (
            "output_hash", "artifact_root", "fingerprint_hash"))))
        net.mine(2)
        opening = MoeOpeningWire.model_validate_json(httpx.get(f"{server.url}/v1/moe/{iid}").content).opening()
        forged = dataclasses.replace(opening, counts=(opening.counts[0] + 1, *opening.counts[1:]))
        with pytest.raises(ContractReverted) as info_:
            ed.assign_duties(net.requester, iid, forged)
        assert info_.value.error == "CommitmentMismatch"
        ed.assign_duties(net.requester, iid, opening)
        moe_root = ed.opened(iid).moe_root
        assert moe_root == service.moe.slices.get(iid).commitment.root()
    keys = [ExpertKey(L, e) for L in range(shape.layers) for e in range(shape.experts) if opening.counts[
        L * shape.experts + e]] + [ExpertKey(L, ROUTER) for L in range(shape.layers)] + [ExpertKey(0, SHARED)]
    checker = DutyValidator(service.files.path, MoeDutiesConfig(experts=tuple(str(k) for k in keys)), LIMITS)
    for key in keys:
        raw = httpx.get(f"{server.url}/v1/moe/{iid}/{key}").content
        assert checker.check_slice(decode_duty_slice(raw, key, moe_root, shape)) is MoeReason.OK, key
