"""The Training contract on a real anvil through chain.training: beacons, draws, digests, the vote quorum, slashing."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from chain.devnet import dev_account
from chain.errors import ContractReverted
from chain.training import compute_verdict_digest
from node.protocol.hashing import keccak256
from node.protocol.ledger import TrainingReason, compute_audit_draw, compute_run_id
from node.protocol.lsh import is_audited
from node.training.onchain import ChainAudits, get_audited_steps, submit_audit_vote

RATE = 10**18  # every step drawn: the test needs a drawn step, whatever the block hash


def mine(w3, n):
    for _ in range(n):
        w3.provider.make_request("evm_mine", [])


def test_beacons_come_from_the_block_after_the_previous_anchor(net):
    node, w3, training, _, prover, _ = net
    run = keccak256(b"run-beacon")
    receipt = training.register_run(prover, run, keccak256(b"nonce-beacon"), b"\x01" * 32, b"\x02" * 32, 0, RATE, 5,
                                    10**18)
    run = compute_run_id(prover.address, run)  # the id binds the prover
    with pytest.raises(ContractReverted) as e:
        training.beacon(run, 0)
    assert e.value.error == "DrawNotReady"
    mine(w3, 2)  # readable from the block after the beacon's source block
    audits = ChainAudits(rpc_url=node.url, contract=training.address, prover_key=bytes(prover.key), run_id=run,
                         final_step=10, anchor_every=5, draw_timeout_s=5.0)
    b0 = audits.get_beacon(0)
    assert b0 == bytes(w3.eth.get_block(receipt["blockNumber"] + 1)["hash"])
    anchored = training.anchor(prover, run, 5, keccak256(b"h5"))
    assert training.get_anchor(run, 0).beacon == b0  # stored with the anchor
    with pytest.raises(ContractReverted):
        training.beacon(run, 1)  # not before the block after the anchor: the prover cannot know window 1 yet
    mine(w3, 2)
    assert audits.get_beacon(1) == bytes(w3.eth.get_block(anchored["blockNumber"] + 1)["hash"])


def test_one_validator_cannot_settle_two_do_and_the_cheater_is_slashed(net):
    _, w3, training, validators, prover, treasury = net
    run, nonce = keccak256(b"run-a"), keccak256(b"nonce-a")
    training.register_run(prover, run, nonce, b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 2 * 10**18)
    run = compute_run_id(prover.address, run)  # the id binds the prover
    with pytest.raises(ContractReverted) as e:
        training.register_run(prover, keccak256(b"run-b"), nonce, b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 2 * 10**18)
    assert e.value.error == "NonceReplayed"
    mine(w3, 2)
    head = keccak256(b"head-5")
    receipt = training.anchor(prover, run, 5, head)
    assert receipt["gasUsed"] < 200_000
    with pytest.raises(ContractReverted) as e:
        training.audit_seed(run, 0)
    assert e.value.error == "DrawNotReady"
    mine(w3, 2)
    seed = training.audit_seed(run, 0)
    assert seed == bytes(w3.eth.get_block(receipt["blockNumber"] + 1)["hash"])
    steps = get_audited_steps(training, run, 0)
    assert steps == [t for t in range(6) if is_audited(compute_audit_draw(seed, run, t), RATE)] == list(range(6))
    step = 3
    digest = compute_verdict_digest(int(w3.eth.chain_id), training.address, run, step, head, False, 709)
    assert digest == training.verdict_digest(run, step, head, False, 709)
    bad = int(TrainingReason.RECOMPUTE_MISMATCH)
    assert submit_audit_vote(training, validators[0], run, 0, step, False, bad) == "counted"
    assert submit_audit_vote(training, validators[0], run, 0, step, False, bad) == "skipped"  # counted once
    assert not training.get_run(run).slashed and training.audit_result(run, step) == 0  # one of three: nothing
    assert training.has_voted(run, step, validators[0].address)
    assert submit_audit_vote(training, validators[1], run, 0, step, False, bad) == "settled"
    assert submit_audit_vote(training, validators[2], run, 0, step, True, 0) == "already-settled"
    rec = training.get_run(run)
    assert rec.slashed and rec.bond == 0 and training.audit_result(run, step) == 2
    assert training.credits(treasury.address) == 2 * 10**18
    with pytest.raises(ContractReverted) as e:
        training.anchor(prover, run, 10, keccak256(b"head-10"))
    assert e.value.error == "NotRunning"


def test_the_run_id_binds_the_prover_and_matches_the_protocol(net):
    """Issue 31, finding 6 on anvil: Training.runIdOf is node.protocol.ledger.compute_run_id, and a prover's copied
    registration (same spec hash, same nonce) neither takes its run id nor burns its nonce."""
    _, _, training, _, prover, _ = net
    thief = dev_account(8)
    spec, nonce = keccak256(b"spec-copied"), keccak256(b"nonce-copied")
    assert training.run_id_of(prover.address, spec) == compute_run_id(prover.address, spec)
    training.register_run(thief, spec, nonce, b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 10**18)  # mined first
    training.register_run(prover, spec, nonce, b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 10**18)
    assert training.get_run(compute_run_id(prover.address, spec)).prover == prover.address
    assert training.get_run(compute_run_id(thief.address, spec)).prover == thief.address


def test_a_non_validator_vote_is_refused(net):
    _, w3, training, _, prover, _ = net
    run = keccak256(b"run-c")
    training.register_run(prover, run, keccak256(b"nonce-c"), b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 10**18)
    run = compute_run_id(prover.address, run)  # the id binds the prover
    mine(w3, 2)
    training.anchor(prover, run, 5, keccak256(b"h"))
    mine(w3, 2)
    with pytest.raises(ContractReverted) as e:
        submit_audit_vote(training, dev_account(7), run, 0, 1, False, 709)
    assert e.value.error == "NotAValidator"


def test_a_vote_is_recorded_before_it_is_signed_and_a_changed_mind_is_refused(net, tmp_path):
    from node.store.leveldb import ConflictingVerdict, Store

    _, w3, training, validators, prover, _ = net
    run = keccak256(b"run-protect")
    training.register_run(prover, run, keccak256(b"nonce-protect"), b"\x01" * 32, b"\x02" * 32, 0, RATE, 5, 10**18)
    run = compute_run_id(prover.address, run)  # the id binds the prover
    mine(w3, 2)
    training.anchor(prover, run, 5, keccak256(b"head-protect"))
    mine(w3, 2)
    bad = int(TrainingReason.RECOMPUTE_MISMATCH)
    with Store(tmp_path / "protection", int(w3.eth.chain_id), training.address) as store:
        assert submit_audit_vote(training, validators[0], run, 0, 2, False, bad, store) == "counted"
        assert [(v.valid, v.reason) for v in store.verdicts()] == [(False, bad)], "recorded, synced, before signing"
        with pytest.raises(ConflictingVerdict):  # a restarted auditor that now finds the step valid signs nothing
            submit_audit_vote(training, validators[0], run, 0, 2, True, 0, store)
    assert training.audit_result(run, 2) == 0 and not training.has_voted(run, 2, validators[1].address)


QUIET = 10**17  # the protocol's lowest rate (MIN_AUDIT_RATE_WAD, 0.1): few steps drawn


def anchored_quiet_run(w3, training, prover, name: bytes, last_step: int = 5):
    """Register a run at the lowest rate and anchor its first window, again under a fresh run id until its draw
    picked none of the window's steps (so that every step can be requested); return (run id, head, anchor block)."""
    for attempt in range(30):  # P(no draw among 6 steps) = 0.9⁶ = 0.53 per attempt
        tag = name + b"-%d" % attempt
        run, head = keccak256(b"run-" + tag), keccak256(b"head-" + tag)
        training.register_run(prover, run, keccak256(b"nonce-" + tag), b"\x01" * 32, b"\x02" * 32, 0, QUIET, 5,
                              10**18)
        run = compute_run_id(prover.address, run)  # the id binds the prover
        mine(w3, 2)
        receipt = training.anchor(prover, run, last_step, head)
        mine(w3, 2)
        if not any(training.is_audited(run, 0, t) for t in range(last_step + 1)):
            return run, head, int(receipt["blockNumber"])
    raise AssertionError("no draw-free window in 30 runs")


def test_a_run_below_the_protocols_audit_rate_is_refused(net):
    _, _, training, _, prover, _ = net
    assert training.min_audit_rate_wad() == QUIET
    with pytest.raises(ContractReverted) as e:  # its spec said 0.4; the prover registered 1e-18
        training.register_run(prover, keccak256(b"run-rare"), keccak256(b"nonce-rare"), b"\x01" * 32, b"\x02" * 32,
                              0, 1, 5, 10**18)
    assert e.value.error == "AuditRateTooLow"


def test_a_validator_requests_an_undrawn_step_and_the_prover_reads_it_at_its_next_anchor(net):
    node, w3, training, validators, prover, _ = net
    run, _, _ = anchored_quiet_run(w3, training, prover, b"request")
    assert not training.is_audit_due(run, 0, 2)
    with pytest.raises(ContractReverted) as e:
        training.request_audit(dev_account(7), run, 0, 2)
    assert e.value.error == "NotAValidator"
    receipt = training.request_audit(validators[0], run, 0, 2)
    gas = int(receipt["gasUsed"])
    print(f"requestAudit gas {gas}")  # reported in docs/training.md
    assert gas < 100_000
    assert training.is_audit_due(run, 0, 2) and training.requested_at(run, 2) == receipt["blockNumber"]
    [request] = training.get_audit_requests(run, 0)
    assert (request.index, request.step, request.requester) == (0, 2, validators[0].address)
    with pytest.raises(ContractReverted) as e:
        training.request_audit(validators[1], run, 0, 2)
    assert e.value.error == "AlreadyDue"
    audits = ChainAudits(rpc_url=node.url, contract=training.address, prover_key=bytes(prover.key), run_id=run,
                         final_step=10, anchor_every=5, draw_timeout_s=5.0)
    with ThreadPoolExecutor(1) as pool:  # on_anchor waits for the draw: mine the blocks it waits for
        served = pool.submit(audits.on_anchor, 6, 10, keccak256(b"head-10"))
        while not served.done():
            time.sleep(0.2)
            mine(w3, 1)
    drawn = [t for t in range(6, 11) if training.is_audited(run, 1, t)]
    assert served.result() == sorted([2, *drawn]), "served with the next window's draw"
    with pytest.raises(ContractReverted) as e:  # past the prover's K = 2m buffer
        training.request_audit(validators[1], run, 0, 3)
    assert e.value.error == "NotRunning"  # on_anchor finished the run after its last window


def test_requests_per_anchor_are_capped_per_validator_and_end_at_the_next_anchor(net):
    _, w3, training, validators, prover, _ = net
    run, _, _ = anchored_quiet_run(w3, training, prover, b"cap")
    cap = training.max_requests()
    for i in range(cap):  # one validator (a colluder) spends its whole quota
        training.request_audit(validators[0], run, 0, i)
    with pytest.raises(ContractReverted) as e:
        training.request_audit(validators[0], run, 0, cap)
    assert e.value.error == "RequestsExhausted" and training.request_count(run, 0, validators[0].address) == cap
    training.request_audit(validators[1], run, 0, cap)  # the others keep theirs (issue 30, finding 7)
    assert training.request_count(run, 0, validators[1].address) == 1
    training.anchor(prover, run, 10, keccak256(b"cap-10"))
    mine(w3, 2)
    with pytest.raises(ContractReverted) as e:
        training.request_audit(validators[0], run, 0, 5)
    assert e.value.error == "PastRequestHorizon"
