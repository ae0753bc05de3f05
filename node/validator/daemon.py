"""The validator daemon: one composition root, one asyncio service per duty.

  (libp2p) the node's host serves the payloads it cached to other committee members
  events   confirmed contract logs (chain.events) → requests remembered, commits queued
  verify   am I in the committee → fetch the payload (libp2p first, HTTP fallback) → hash checks
           against the commitment → stage 1 → stage 2 (the engine in a worker thread, so the loop stays responsive)
  submit   slashing protection record (synced) → EIP-712 signature → journaled transaction → confirm;
           a stage-1 failure is also proven on chain from its leaf (fraud proof: slashes at once)
  http     /metrics (Prometheus) and /health
Nothing is signed before its record is stored, and nothing is sent before its bytes are journaled.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from eth_account.signers.local import LocalAccount
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from web3 import Web3

from chain.contracts import Commitment, Hub, Status, Vote, params_from_event
from chain.eip712 import Verdict, recover_verdict_signer, sign_verdict
from chain.errors import ChainError, ContractReverted
from chain.events import ChainEvent, EventStream, Reorg
from chain.txmanager import TxFailed, TxManager
from node.checks.decision import Stage2Thresholds
from node.engines.base import Engine
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import FatalError, Reason, RecoverableError
from node.executer.api import InferencePayload
from node.protocol.artifact import compute_leaf_proof, encode_header, encode_leaf
from node.protocol.hashing import keccak256
from node.store.leveldb import ConflictingVerdict, Store, VerdictRecord
from node.validator.config import ValidatorConfig
from node.validator.verify import ChainFacts, decode_payload_artifact, find_payload_mismatch, verify_payload

if TYPE_CHECKING:  # libp2p is the optional `p2p` extra: imported only when the node starts a host
    from node.p2p.host import P2PHost

log = logging.getLogger(__name__)
MAX_PAYLOAD = 32 * 2**20


@dataclass
class ModelSlot:
    """One served model: its files, tokenizer, engine and calibrated thresholds (one user at a time)."""

    files: ModelFiles
    tokenizer: ModelTokenizer
    engine: Engine
    thresholds: Stage2Thresholds
    lock: threading.Lock = field(default_factory=threading.Lock)


class Metrics:
    """The daemon's Prometheus metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.events = Counter("verinfer_events_total", "Confirmed contract events handled", ["event"],
                              registry=self.registry)
        self.verdicts = Counter("verinfer_verdicts_total", "Verdicts signed", ["valid"], registry=self.registry)
        self.skipped = Counter("verinfer_skipped_total", "Committed inferences not ours to check", ["why"],
                               registry=self.registry)
        self.fetched = Counter("verinfer_payload_fetched_total", "Committed payloads fetched", ["source"],
                               registry=self.registry)
        self.fetch_failures = Counter("verinfer_payload_rejected_total", "Payloads rejected or unavailable",
                                      ["reason"], registry=self.registry)
        self.verify_seconds = Histogram("verinfer_verify_seconds", "Stage 1 + stage 2 time per inference",
                                        registry=self.registry)
        self.healthy = Gauge("verinfer_healthy", "1 while the node may sign", registry=self.registry)
        self.queue = Gauge("verinfer_queue_depth", "Work waiting", ["queue"], registry=self.registry)


@dataclass(frozen=True)
class FraudProof:
    """One artifact leaf that breaks the stage-1 rule, with what the contract needs to check it."""

    header_hash: bytes
    leaf: bytes
    proof: list[bytes]
    position: int


@dataclass(frozen=True)
class Job:
    """A committed inference to check."""

    facts: ChainFacts
    operator: str


class ValidatorNode:
    """The composition root of `verinfer validator run`."""

    def __init__(self, config: ValidatorConfig, account: LocalAccount, hub: Hub, store: Store,
                 models: dict[bytes, ModelSlot], clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.account = account
        self.hub = hub
        self.store = store
        self.models = models
        self.clock = clock
        self.metrics = Metrics()
        self.txm = TxManager(hub.w3, account, store, confirmations=1)
        self.stream = EventStream(hub.w3, hub.contract, store.cursor("events"), start_block=config.start_block,
                                  confirmations=config.confirmations, safety_window=config.safety_window)
        self.jobs: asyncio.Queue[Job] = asyncio.Queue()
        self.verdicts: asyncio.Queue[tuple[Job, VerdictRecord, FraudProof | None]] = asyncio.Queue()
        self.healthy = True
        self.p2p: P2PHost | None = None  # started by run() when config.p2p_listen is set
        self.gossip: asyncio.Queue[bytes] = asyncio.Queue()
        self._committees: dict[int, list[str]] = {}
        self._submits: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.done: list[tuple[int, bool, int]] = []  # (inference id, valid, reason) submitted, for tests and logs

    # ---- start-up checks ------------------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse to start on the wrong chain or contract, or while another instance signs with this key."""
        chain_id = int(self.hub.w3.eth.chain_id)
        if chain_id != self.config.chain_id:
            raise FatalError(f"RPC is chain {chain_id}, config says {self.config.chain_id}", Reason.STORE_MISMATCH)
        if not self.hub.w3.eth.get_code(self.hub.address):
            raise FatalError(f"no contract at {self.hub.address}", Reason.STORE_MISMATCH)
        head = int(self.hub.w3.eth.block_number)
        since = max(head - self.config.recent_blocks_guard, 0)
        mine = self.hub.contract.events.VerdictRecorded().get_logs(
            from_block=since, to_block=head, argument_filters={"validator": self.account.address})
        unknown = [int(e["args"]["inferenceId"]) for e in mine
                   if self.store.get_verdict(int(e["args"]["inferenceId"])) is None]
        if unknown:
            raise FatalError(f"{self.account.address} sent verdicts this store did not record ({unknown[:5]}): "
                             "another instance is live", Reason.CONFLICTING_VERDICT)
        self.txm.resume()  # journaled transactions from before a restart: the same bytes again

    # ---- services -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run every duty until `stop` is set; a fatal error stops them all."""
        self._loop = asyncio.get_running_loop()
        self.preflight()
        self.metrics.healthy.set(1)
        if self.config.p2p_listen:
            from node.p2p.host import P2PHost

            topic = f"verinfer/{self.config.chain_id}/{self.hub.address.lower()}/verdicts" if self.config.gossip \
                else None
            self.p2p = P2PHost(self.config.p2p_key or self.config.data_dir / "peer.key", self._serve_payload,
                               self.config.p2p_listen, timeout=self.config.fetch_timeout, topic=topic,
                               validate=self._validate_gossip, on_message=self._on_gossip)
            await asyncio.to_thread(self.p2p.start)
            for addr in self.config.peers.values():
                await asyncio.to_thread(self.p2p.connect_blocking, addr)
            log.info("libp2p listening", extra={"addrs": self.p2p.addrs, "peer_id": self.p2p.peer_id})
        runner = await self._start_http()
        tasks = [asyncio.create_task(self.stream.run(self._on_events, self.config.poll_interval, self.config.ws_url,
                                                     stop), name="events"),
                 asyncio.create_task(self._verify_loop(stop), name="verify"),
                 asyncio.create_task(self._submit_loop(stop), name="submit"),
                 asyncio.create_task(self._quorum_loop(stop), name="quorum")]
        try:
            done, _ = await asyncio.wait([*tasks, asyncio.create_task(stop.wait())],
                                         return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runner.cleanup()
            if self.p2p is not None:
                await asyncio.to_thread(self.p2p.stop)

    async def _on_events(self, events: list[ChainEvent], reorg: Reorg | None) -> None:
        if reorg is not None:
            log.warning("chain reorganised", extra={"ancestor": reorg.ancestor, "depth": reorg.depth})
        for e in events:
            self.metrics.events.labels(e.name).inc()
            args = e.args
            if e.name == "InferenceRequested":
                p = params_from_event(args["params"])
                self.store.put_record("request", int(args["inferenceId"]), {
                    "user_seed": int(args["userSeed"]), "model_id": Web3.to_hex(args["modelId"]),
                    "prompt_hash": Web3.to_hex(args["promptHash"]), "operator": str(args["operator"]),
                    "params": [p.temperature_bits, p.top_p_bits, p.top_k, p.max_tokens]})
            elif e.name == "InferenceCommitted":
                job = self._job(int(args["inferenceId"]), args)
                if job is not None:
                    await self.jobs.put(job)
        self.metrics.queue.labels("verify").set(self.jobs.qsize())

    def _job(self, inference_id: int, args: dict[str, Any]) -> Job | None:
        request = self.store.get_record("request", inference_id)
        if request is None:
            self.metrics.skipped.labels("request-not-seen").inc()
            return None
        t, p, k, m = request["params"]
        facts = ChainFacts(inference_id, request["user_seed"], bytes.fromhex(request["model_id"][2:]), t, p, k, m,
                           bytes.fromhex(request["prompt_hash"][2:]), bytes(args["outputHash"]),
                           bytes(args["artifactRoot"]), bytes(args["fingerprintHash"]))
        return Job(facts, request["operator"])

    async def _verify_loop(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.fetch_timeout)) as session:
            while not stop.is_set():
                job = await self.jobs.get()
                try:
                    checked = await self._check(session, job)
                except RecoverableError as exc:
                    log.warning("check postponed", extra={"inference_id": job.facts.inference_id, "error": str(exc)})
                    continue
                if checked is not None:
                    await self.verdicts.put((job, *checked))

    async def _check(self, session: aiohttp.ClientSession,
                     job: Job) -> tuple[VerdictRecord, FraudProof | None] | None:
        facts = job.facts
        try:
            checked, committee = await asyncio.to_thread(self.hub.selection_of, facts.inference_id)
        except ContractReverted as exc:
            if exc.error == "SelectionNotReady":  # the seed block is not mined yet: look again shortly
                asyncio.get_running_loop().call_later(self.config.poll_interval, self.jobs.put_nowait, job)
                return None
            self.metrics.skipped.labels(exc.error).inc()
            log.info("no selection", extra={"inference_id": facts.inference_id, "error": str(exc)})
            return None
        except ChainError as exc:
            self.metrics.skipped.labels("selection-unavailable").inc()
            log.info("no selection", extra={"inference_id": facts.inference_id, "error": str(exc)})
            return None
        if not checked or self.account.address not in committee:
            self.metrics.skipped.labels("not-in-committee" if checked else "not-checked").inc()
            return None
        slot = self.models.get(facts.model_id)
        if slot is None:
            self.metrics.skipped.labels("model-not-served").inc()
            return None
        payload, reason = await self._fetch(session, job)
        started = time.perf_counter()
        fraud = None
        if payload is None:
            valid, scores = False, keccak256(b"payload-unavailable")
        else:
            report = await asyncio.to_thread(self._verify_locked, slot, payload, facts)
            reason = report.reason
            valid = report.valid
            scores = report.decision.scores_digest if report.decision else keccak256(reason.name.encode())
            if report.stage1 is not None and report.stage1.position is not None and not report.stage1.valid:
                fraud = build_fraud_proof(payload, report.stage1.position)
        self.metrics.verify_seconds.observe(time.perf_counter() - started)
        record = VerdictRecord(facts.inference_id, Web3.to_hex(facts.artifact_root), valid, int(reason),
                               Web3.to_hex(scores), int(self.clock()) + self.config.verdict_ttl)
        return record, fraud

    def _verify_locked(self, slot: ModelSlot, payload: InferencePayload, facts: ChainFacts) -> Any:
        with slot.lock:
            return verify_payload(payload, slot.files, slot.tokenizer, slot.engine, slot.thresholds, facts,
                                  decision_only=True)

    async def _fetch(self, session: aiohttp.ClientSession, job: Job) -> tuple[InferencePayload | None, Reason]:
        """Return the committed payload (cache, then libp2p peers, then HTTP), or None and why after the retries.

        Whatever a source answers is checked against the on-chain commitment before it is cached;
        a libp2p peer that answers something else is scored down (and dropped under the floor).
        """
        facts = job.facts
        commitment = keccak256(facts.artifact_root + facts.output_hash + facts.fingerprint_hash)

        def is_committed(raw: bytes) -> bool:
            try:
                return find_payload_mismatch(InferencePayload.model_validate_json(raw), facts) is Reason.OK
            except ValueError:
                return False

        cached = self.store.get_payload(commitment, is_committed)
        if cached is not None:
            return InferencePayload.model_validate_json(cached), Reason.OK
        sources = self._sources(session, job)
        if not sources:
            self.metrics.fetch_failures.labels("no-endpoint").inc()
        reason = Reason.ARTIFACT_ROOT_MISMATCH
        for attempt in range(self.config.fetch_retries):
            for name, fetch, on_bad in sources:
                try:
                    raw = await fetch()
                    payload = InferencePayload.model_validate_json(raw)
                    reason = find_payload_mismatch(payload, facts)
                except (RecoverableError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    self.metrics.fetch_failures.labels(f"{name}:{type(exc).__name__}").inc()
                    continue
                if reason is Reason.OK:
                    self.metrics.fetched.labels(name).inc()
                    self.store.put_payload(commitment, raw)
                    self.store.put_record("payload", facts.inference_id, {"commitment": commitment.hex()})
                    return payload, reason
                self.metrics.fetch_failures.labels(f"{name}:{reason.name}").inc()
                on_bad()
            await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        return None, reason

    def _sources(self, session: aiohttp.ClientSession,
                 job: Job) -> list[tuple[str, Callable[[], Awaitable[bytes]], Callable[[], None]]]:
        """Return where to ask for a payload, in order: the operator's libp2p peer, other peers, its HTTP URL."""
        iid = job.facts.inference_id
        out: list[tuple[str, Callable[[], Awaitable[bytes]], Callable[[], None]]] = []
        if self.p2p is not None:
            operator_addr = self.config.peers.get(job.operator)
            addrs = ([operator_addr] if operator_addr else []) + [a for k, a in self.config.peers.items()
                                                                   if k != job.operator]
            p2p = self.p2p

            def peer(addr: str) -> tuple[str, Callable[[], Awaitable[bytes]], Callable[[], None]]:
                async def fetch() -> bytes:
                    return await p2p.fetch_payload(addr, iid)

                def bad() -> None:
                    p2p.score_down(addr)

                return "libp2p", fetch, bad

            out.extend(peer(addr) for addr in addrs)
        url = self.config.executers.get(job.operator)
        if url is not None:
            async def http() -> bytes:
                async with session.get(f"{url}/v1/payloads/{iid}") as response:
                    raw = await response.content.read(MAX_PAYLOAD + 1)
                    if response.status != 200 or len(raw) > MAX_PAYLOAD:
                        raise ValueError(f"http {response.status}, {len(raw)} bytes")
                    return bytes(raw)

            out.append(("http", http, lambda: None))
        return out

    def _serve_payload(self, inference_id: int) -> bytes | None:
        """Return a cached, committed payload for another node (called from the libp2p thread)."""
        record = self.store.get_record("payload", inference_id)
        if record is None:
            return None
        return self.store.get_payload(bytes.fromhex(record["commitment"]), lambda raw: True)

    async def _submit_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            job, record, fraud = await self.verdicts.get()
            if fraud is not None:  # certain and slashing at once: first, and whatever becomes of the vote
                try:
                    await asyncio.to_thread(self._prove_fraud, job, fraud)
                except ChainError as exc:
                    log.warning("fraud proof failed: %s", exc, extra={"inference_id": record.inference_id})
            try:
                await asyncio.to_thread(self._sign_and_submit, job, record)
            except ConflictingVerdict:
                self.healthy = False
                self.metrics.healthy.set(0)
                raise
            except ContractReverted as exc:  # decided already, window over, not a member any more
                log.info("verdict not taken", extra={"inference_id": record.inference_id, "error": exc.error})
            except ChainError as exc:
                log.warning("verdict submission failed: %s", exc,
                            extra={"inference_id": record.inference_id, "error": str(exc)})

    def _sign_and_submit(self, job: Job, record: VerdictRecord) -> None:
        if not self.healthy or not self.stream.healthy:
            raise FatalError("not healthy: refusing to sign", Reason.DEEP_REORG)
        stored = self.store.record_verdict(record)  # synced before the signature exists
        verdict = Verdict(stored.inference_id, bytes.fromhex(stored.artifact_root[2:]), stored.valid, stored.reason,
                          bytes.fromhex(stored.scores_digest[2:]), stored.deadline)
        signature = sign_verdict(self.account, verdict, self.config.chain_id, self.hub.address)
        vote = Vote(verdict.valid, verdict.reason, verdict.scores_digest, verdict.deadline, signature)
        facts = job.facts
        commitment = Commitment(facts.output_hash, facts.artifact_root, facts.fingerprint_hash)
        self.metrics.verdicts.labels(str(verdict.valid).lower()).inc()
        self.done.append((facts.inference_id, verdict.valid, verdict.reason))
        if self.p2p is not None and self.p2p.topic is not None:  # gossip: a quorum is submitted in one tx
            message = encode_vote_message(facts.inference_id, commitment, vote)
            self.p2p.publish_blocking(message)
            self._on_gossip(message)  # our own vote counts towards the quorum we may submit
            log.info("verdict gossiped", extra={"inference_id": facts.inference_id, "valid": verdict.valid})
            return
        self._submit_votes(facts.inference_id, commitment, [vote])

    def _submit_votes(self, inference_id: int, commitment: Commitment, votes: list[Vote]) -> None:
        """Send signed votes in one journaled transaction and confirm it."""
        fn = self.hub.contract.functions.submitVerdicts(inference_id, commitment.as_tuple(),
                                                        [v.as_tuple() for v in votes])
        for attempt in range(3):  # a vote mined after the state moved can fail; the same signed votes again
            entry = self.txm.send(fn, purpose=f"verdicts {inference_id}")
            try:
                self.txm.confirm(entry["nonce"])
                break
            except TxFailed:
                if attempt == 2 or self.hub.get_inference(inference_id).status is not Status.COMMITTED:
                    raise
        log.info("verdicts submitted", extra={"inference_id": inference_id, "votes": len(votes)})

    # ---- verdict gossip and the quorum submitter ------------------------------------------------

    def _committee(self, inference_id: int) -> list[str]:
        """Return an inference's committee (cached: it is fixed once the seed block exists)."""
        if inference_id not in self._committees:
            checked, committee = self.hub.selection_of(inference_id)
            self._committees[inference_id] = committee if checked else []
        return self._committees[inference_id]

    def _validate_gossip(self, data: bytes) -> bool:
        """Check a gossiped vote: well formed, signed by a member of that inference's committee."""
        inference_id, _, vote = decode_vote_message(data)
        verdict = Verdict(inference_id, bytes.fromhex(json.loads(data)["artifact_root"][2:]), vote.valid,
                          vote.reason, vote.scores_digest, vote.deadline)
        signer = recover_verdict_signer(verdict, vote.signature, self.config.chain_id, self.hub.address)
        return signer in self._committee(inference_id)

    def _on_gossip(self, data: bytes) -> None:
        """Hand a valid vote to the quorum loop (called from the libp2p thread or our own)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.gossip.put_nowait, data)

    async def _quorum_loop(self, stop: asyncio.Event) -> None:
        """Collect gossiped votes; at a quorum the first committee member (by address) submits them once;
        the others wait a grace period and submit only if nothing landed (liveness)."""
        votes: dict[int, dict[str, Vote]] = {}
        commitments: dict[int, Commitment] = {}
        pending: set[int] = set()
        while not stop.is_set():
            data = await self.gossip.get()
            try:
                inference_id, commitment, vote = decode_vote_message(data)
                artifact_root = bytes.fromhex(json.loads(data)["artifact_root"][2:])
                verdict = Verdict(inference_id, artifact_root, vote.valid, vote.reason, vote.scores_digest,
                                  vote.deadline)
                signer = recover_verdict_signer(verdict, vote.signature, self.config.chain_id, self.hub.address)
                committee = await asyncio.to_thread(self._committee, inference_id)
            except (ValueError, KeyError, ChainError) as exc:
                log.info("gossiped vote ignored: %s", exc)
                continue
            if signer not in committee:
                continue
            votes.setdefault(inference_id, {})[signer] = vote
            commitments[inference_id] = commitment
            quorum = len(committee) // 2 + 1
            for side in (True, False):
                agreeing = [v for v in votes[inference_id].values() if v.valid is side]
                if len(agreeing) >= quorum and inference_id not in pending:
                    pending.add(inference_id)
                    first = sorted(committee, key=str.lower)[0] == self.account.address
                    task = asyncio.create_task(self._submit_quorum(
                        inference_id, commitments[inference_id], agreeing, 0.0 if first else self.config.submit_grace))
                    self._submits.add(task)
                    task.add_done_callback(self._submits.discard)

    async def _submit_quorum(self, inference_id: int, commitment: Commitment, votes: list[Vote],
                             delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            status = (await asyncio.to_thread(self.hub.get_inference, inference_id)).status
            if status is Status.COMMITTED:
                await asyncio.to_thread(self._submit_votes, inference_id, commitment, votes)
        except ChainError as exc:  # another submitter won the race, or the window closed
            log.info("quorum not submitted", extra={"inference_id": inference_id, "error": str(exc)})

    def _prove_fraud(self, job: Job, fraud: FraudProof) -> None:
        facts = job.facts
        commitment = Commitment(facts.output_hash, facts.artifact_root, facts.fingerprint_hash)
        fn = self.hub.contract.functions.proveFraud(facts.inference_id, commitment.as_tuple(), fraud.header_hash,
                                                    fraud.leaf, fraud.proof)
        try:
            fn.estimate_gas({"from": self.account.address})  # someone may have proven it already
        except Exception as exc:  # a revert here means there is nothing (left) to prove
            log.info("fraud proof not needed", extra={"inference_id": facts.inference_id, "error": str(exc)})
            return
        entry = self.txm.send(fn, purpose=f"fraud proof {facts.inference_id}")
        try:
            self.txm.confirm(entry["nonce"])
        except TxFailed:
            if self.hub.get_inference(facts.inference_id).status is Status.FRAUD:  # another prover was first
                log.info("fraud already proven by another prover", extra={"inference_id": facts.inference_id})
                return
            raise
        log.warning("fraud proven: inference %d, position %d", facts.inference_id, fraud.position)

    # ---- http -----------------------------------------------------------------------------------

    async def _start_http(self) -> web.AppRunner:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

        async def health(_: web.Request) -> web.Response:
            ok = self.healthy and self.stream.healthy
            blocks = self.store.cursor("events").load()
            body = {"healthy": ok, "address": self.account.address, "queue": self.jobs.qsize(),
                    "cursor": blocks[-1][0] if blocks else None}
            return web.json_response(body, status=200 if ok else 503)

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics), web.get("/health", health)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, self.config.metrics_host, self.config.metrics_port)
        await site.start()
        return runner


def encode_vote_message(inference_id: int, commitment: Commitment, vote: Vote) -> bytes:
    """Return the gossip message of one signed vote (with the commitment a submitter needs)."""
    return json.dumps({"inference_id": str(inference_id), "artifact_root": "0x" + commitment.artifact_root.hex(),
                       "output_hash": "0x" + commitment.output_hash.hex(),
                       "fingerprint_hash": "0x" + commitment.fingerprint_hash.hex(), "valid": vote.valid,
                       "reason": vote.reason, "scores_digest": "0x" + vote.scores_digest.hex(),
                       "deadline": vote.deadline, "signature": "0x" + vote.signature.hex()}).encode()


def decode_vote_message(data: bytes) -> tuple[int, Commitment, Vote]:
    """Return (inference id, commitment, vote) of a gossip message, or raise ValueError/KeyError."""
    m = json.loads(data)

    def b32(key: str) -> bytes:
        raw = bytes.fromhex(str(m[key]).removeprefix("0x"))
        if len(raw) != 32:
            raise ValueError(f"{key} is not 32 bytes")
        return raw

    signature = bytes.fromhex(str(m["signature"]).removeprefix("0x"))
    if len(signature) != 65 or not isinstance(m["valid"], bool):
        raise ValueError("malformed vote")
    return (int(m["inference_id"]), Commitment(b32("output_hash"), b32("artifact_root"), b32("fingerprint_hash")),
            Vote(m["valid"], int(m["reason"]), b32("scores_digest"), int(m["deadline"]), signature))


def build_fraud_proof(payload: InferencePayload, position: int) -> FraudProof:
    """Return the fraud proof of the leaf at `position` of a payload's artifact."""
    art = decode_payload_artifact(payload)
    return FraudProof(keccak256(encode_header(art.header)), encode_leaf(art.positions, position),
                      compute_leaf_proof(art, position), position)


__all__ = ["FraudProof", "Job", "Metrics", "ModelSlot", "ValidatorNode"]
