"""Attacks and faults on a running validator daemon (anvil, the tiny model, real LevelDB and libp2p):
issue 15, findings 3 (retried submissions), 4 (one job's failure ends that job only), 7 (no check
lost on a crash) and 9 (gossip cannot poison the quorum submission)."""

from __future__ import annotations

import asyncio

from chain.contracts import Commitment, Status, Vote
from chain.eip712 import Verdict, sign_verdict
from chain.errors import ChainUnavailable
from node.errors import FatalError, Reason
from tests.node.validator.harness import finish, harness, run, start


class SimulatedCrash(FatalError):
    """Stands for kill -9 at one step: the node stops there, with nothing written after it."""





def sample(h, name: str, labels: dict[str, str]) -> float:
    return h.node.metrics.registry.get_sample_value(name, labels) or 0.0


def recorded(h, iid: int) -> list[dict]:
    logs = h.hub.contract.events.VerdictRecorded().get_logs(from_block=0, argument_filters={"inferenceId": iid})
    return [dict(e["args"]) for e in logs]


MALFORMED = {
    "messages-not-objects": lambda p: {**p, "request": {**p["request"], "messages": ["x"]}},
    "wrong-type": lambda p: {**p, "user_seed": 5},
    "huge-number": lambda p: {**p, "inference_id": "9" * 200},
    "missing-field": lambda p: {k: v for k, v in p.items() if k != "artifact"},
    "not-an-object": lambda p: ["x"],
    "nested-garbage": lambda p: {**p, "verification_proofs": [[[[{"x": 1e308}]]]]},
}


def test_malformed_payloads_and_a_crashing_check_end_one_job_only(tiny, tmp_path) -> None:
    """Finding 4: a peer's payload of any shape, or a check that blows up, never stops the daemon."""

    async def scenario() -> None:
        async with harness(tiny, tmp_path, check_attempts=2) as h:
            stop, task = await start(h)
            for name, change in MALFORMED.items():
                h.tamper["payload"] = change
                iid = await h.infer(f"Malformed {name}.")
                assert await h.settled(iid) is Status.INVALID, name  # unavailable after the retries: invalid
            h.tamper["payload"] = None
            slot = h.node.models[h.model_id]
            real = slot.engine

            class Exploding:  # the check itself raises something nobody foresaw (a bug, a hostile input)
                def __getattr__(self, name):
                    return getattr(real, name)

                def prefill(self, *args, **kwargs):
                    raise RuntimeError("boom")

            slot.engine = Exploding()
            bad = await h.infer("Explode.")
            for _ in range(100):
                if sample(h, "verinfer_jobs_given_up_total", {"error": "RuntimeError"}):
                    break
                await asyncio.sleep(0.1)
            assert sample(h, "verinfer_job_errors_total", {"stage": "check", "error": "RuntimeError"}) == 2.0
            assert sample(h, "verinfer_jobs_given_up_total", {"error": "RuntimeError"}) == 1.0
            assert h.store.get_verdict(bad) is None  # nothing signed on a check that did not finish
            slot.engine = real
            good = await h.infer("Count to three.")
            assert await h.settled(good) is Status.VALID  # the daemon went on
            assert not task.done()
            await finish(stop, task)

    run(scenario())


def test_a_failed_submission_is_retried_until_it_lands(tiny, tmp_path) -> None:
    """Finding 3: a submission that fails (RPC error, revert) is retried with back-off, not dropped."""

    async def scenario() -> None:
        async with harness(tiny, tmp_path) as h:
            send = h.node.txm.send
            failures = []

            def flaky(fn, value=0, purpose=""):
                if purpose.startswith("verdicts") and len(failures) < 2:
                    failures.append(purpose)
                    raise ChainUnavailable("connection reset")
                return send(fn, value, purpose)

            h.node.txm.send = flaky
            stop, task = await start(h)
            iid = await h.infer()
            assert await h.settled(iid) is Status.VALID
            assert len(failures) == 2
            assert sample(h, "verinfer_submissions_total", {"result": "failed"}) == 2.0
            assert len(recorded(h, iid)) == 1
            await finish(stop, task)

    run(scenario())


def test_a_forged_commitment_in_gossip_cannot_poison_the_quorum(tiny, tmp_path) -> None:
    """Finding 9 (and 3): a committee member gossips a validly signed vote whose unsigned output_hash is
    forged; the vote is dropped and counted, the quorum still goes on chain with the committed outputs;
    a vote already recorded by someone else is not sent again."""
    from node.p2p.host import P2PHost

    async def scenario() -> None:
        async with harness(tiny, tmp_path, committee=2, submit_grace=60.0) as h:
            member = h.others[0]  # dev account 5: after ours by address, so our node is the first submitter
            assert sorted([h.node.account.address, member.address], key=str.lower)[0] == h.node.account.address
            stop, task = await start(h)
            while h.node.p2p is None or not h.node.p2p.addrs:
                await asyncio.sleep(0.1)
            addr = h.node.p2p.addrs[0]
            addr = addr if "/p2p/" in addr else f"{addr}/p2p/{h.node.p2p.peer_id}"
            topic = f"verinfer/31337/{h.hub.address.lower()}/verdicts"
            with P2PHost(tmp_path / "member.key", topic=topic, validate=lambda _: True) as peer:
                await asyncio.to_thread(peer.connect_blocking, addr)
                iid = await h.infer()
                while h.store.get_verdict(iid) is None:  # our node has checked, signed and gossiped its vote
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)
                inf = h.hub.get_inference(iid)
                root = h.artifact_root(iid)
                verdict = Verdict(iid, root, True, 0, b"\x07" * 32, 2**40)
                vote = Vote(True, 0, b"\x07" * 32, 2**40, sign_verdict(member, verdict, 31337, h.hub.address))
                forged = Commitment(b"\x66" * 32, root, b"\x66" * 32)
                for _ in range(30):  # until the mesh carried it to our node
                    await asyncio.to_thread(peer.publish_blocking, encode(iid, forged, vote))
                    await asyncio.sleep(0.2)
                    if sample(h, "verinfer_gossip_rejected_total", {"reason": "commitment-mismatch"}):
                        break
                assert sample(h, "verinfer_gossip_rejected_total", {"reason": "commitment-mismatch"}) >= 1
                assert h.hub.get_inference(iid).status is Status.COMMITTED
                real = h.hub.contract.events.InferenceCommitted().get_logs(
                    from_block=0, argument_filters={"inferenceId": iid})[0]["args"]
                honest = Commitment(bytes(real["outputHash"]), root, bytes(real["fingerprintHash"]))
                await asyncio.to_thread(h.hub.submit_verdicts, h.requester, iid, honest, [vote])  # anyone may
                assert h.hub.has_voted(iid, member.address) and inf.status is Status.COMMITTED
                for _ in range(30):
                    await asyncio.to_thread(peer.publish_blocking, encode(iid, honest, vote))
                    if h.hub.get_inference(iid).status is not Status.COMMITTED:
                        break
                    await asyncio.sleep(0.3)
                assert await h.settled(iid) is Status.VALID
            votes = recorded(h, iid)
            assert sorted(v["validator"] for v in votes) == sorted([h.node.account.address, member.address])
            skipped = h.hub.contract.events.VoteSkipped().get_logs(from_block=0)
            assert skipped == []  # only the vote still missing was sent
            await finish(stop, task)

    run(scenario())


def encode(iid: int, commitment: Commitment, vote: Vote) -> bytes:
    from node.validator.gossip import encode_vote_message

    return encode_vote_message(iid, commitment, vote)


CRASH_POINTS = ("after events fetched", "after job recorded", "after verify", "after record_verdict",
                "after send")


def crash_at(h, point: str) -> None:
    """Make the node stop (as if killed) at one step of handling the next inference."""
    node, store = h.node, h.store

    def once(original, before: bool):
        fired = []

        def wrapper(*args, **kwargs):
            if before and not fired:
                fired.append(1)
                raise SimulatedCrash(point, Reason.OK)
            result = original(*args, **kwargs)
            if not before and not fired and (point != "after send" or kwargs.get("purpose", "").startswith("verd")):
                fired.append(1)
                raise SimulatedCrash(point, Reason.OK)
            return result
        return wrapper

    if point == "after events fetched":
        original = node._on_events

        async def on_events(events, reorg):
            if any(e.name == "InferenceCommitted" for e in events):
                raise SimulatedCrash(point, Reason.OK)
            await original(events, reorg)

        node._on_events = on_events
    elif point == "after job recorded":
        async def check(session, job):
            raise SimulatedCrash(point, Reason.OK)

        node._check = check
    elif point == "after verify":
        store.record_verdict = once(store.record_verdict, before=True)
    elif point == "after record_verdict":
        store.record_verdict = once(store.record_verdict, before=False)
    elif point == "after send":
        node.txm.send = once(node.txm.send, before=False)


def test_a_crash_at_any_step_loses_no_check_and_never_signs_twice_differently(tiny, tmp_path) -> None:
    """Finding 7: the node is stopped at each step of one check and restarted on the same store; every
    check completes exactly once (one recorded vote), with the verdict first recorded."""

    async def scenario() -> None:
        async with harness(tiny, tmp_path, gossip=False) as h:
            for n, point in enumerate(CRASH_POINTS):
                crash_at(h, point)
                stop, task = await start(h)
                iid = await h.infer(f"Crash {n}.")
                done, _ = await asyncio.wait([task], timeout=60)
                assert done and isinstance(task.exception(), SimulatedCrash), (point, task)
                before = h.store.get_verdict(iid)
                h.restart()
                if point == "after record_verdict":
                    assert before is not None
                stop, task = await start(h)
                assert await h.settled(iid) is Status.VALID, point
                votes = recorded(h, iid)
                assert len(votes) == 1, (point, votes)
                after = h.store.get_verdict(iid)
                assert after is not None and (before is None or after == before), point
                assert bytes(votes[0]["scoresDigest"]) == bytes.fromhex(after.scores_digest[2:])
                for _ in range(100):  # the job ends once its vote is seen on chain (or the settlement event)
                    if h.store.get_job(iid) is None:
                        break
                    await asyncio.sleep(0.1)
                assert h.store.get_job(iid) is None, point
                await finish(stop, task)

    run(scenario())
