"""The validator daemon: one composition root, one asyncio service per duty.

  (libp2p) the node's host serves the payloads it cached to other committee members
  events   confirmed contract logs (chain.events) → requests and commitments remembered, a durable
           job per commit; the event cursor is persisted only after the poll's jobs are
  verify   still open? am I in the committee? → fetch the payload (libp2p first, HTTP fallback) →
           hash checks against the commitment → stage 1 → stage 2 (the engine in a worker thread)
  sign     fraud proof (a stage-1 failure is proven on chain from its leaf) → slashing protection
           record (synced) → EIP-712 signature → our vote stored, gossiped
  submit   the signed votes known for an inference (ours and gossiped, in the store) that are not yet
           recorded on chain go out in one journaled transaction, retried with back-off until the
           inference settles or its check window closes
  gossip   gossiped votes: parsed and signature-checked in the libp2p host (no RPC), then checked
           against the committee and our own record of the commitment here
  http     /metrics (Prometheus) and /health (typed: may it sign, does its RPC answer, does its event
           cursor keep up; node.validator.health)

A job lives in the store (job/pending → job/verified with its verdict record → job/submitted) from
its commit event until its vote is recorded on chain or the inference settles or leaves its window,
so a crash at any point loses no check; nothing is signed before its record is stored, nothing is
sent before its bytes are journaled, and no verdict differs from the one recorded. Whatever goes
wrong in one job (a peer's bytes, a bug, an RPC error) ends or postpones that job only; a FatalError
(conflicting verdict, deep reorg, store trouble) stops the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from eth_account.signers.local import LocalAccount
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from web3 import Web3

from chain.contracts import Commitment, Hub, Status, Vote, params_from_event
from chain.eip712 import Verdict, sign_verdict
from chain.errors import ChainError, ContractReverted
from chain.events import ChainEvent, CursorStore, EventStream, Reorg
from chain.txmanager import TxFailed, TxManager
from node.checks.decision import Stage2Thresholds
from node.checks.projection import ProjectionThresholds
from node.checks.stock_decision import StockThresholds
from node.engines.base import Engine, Prefill, prefill_many
from node.engines.models import ModelFiles
from node.engines.tokenizer import ModelTokenizer
from node.errors import FatalError, InvalidInput, Reason, RecoverableError
from node.executer.api import InferencePayload, StockPayload, decode_inference_payload, decode_stock_payload
from node.protocol.hashing import keccak256
from node.protocol.projection import KIND_PROJECTION
from node.protocol.stock import is_stock_commitment
from node.store.leveldb import ConflictingVerdict, Store, VerdictRecord
from node.validator.batching import PrefillBatcher
from node.validator.config import ValidatorConfig
from node.validator.fraud import TERMINATION_REASONS, FraudProof, build_fraud_proof
from node.validator.gossip import InvalidGossip, decode_gossip_vote, decode_vote_message, encode_vote_message
from node.validator.health import HealthLimits, HealthMonitor, HealthReport, HealthStatus, decide_health
from node.validator.httpread import read_capped
from node.validator.jobs import Ballot, Job, vote_from_json, vote_to_json
from node.validator.stock import find_stock_payload_mismatch, verify_stock_payload
from node.validator.tasks import wait_stop_or_failure
from node.validator.verify import (
    NO_BLOCK_HASH,
    ChainFacts,
    PreparedCheck,
    VerificationReport,
    find_payload_mismatch,
    finish_verification,
    prepare_verification,
)

if TYPE_CHECKING:  # libp2p is the optional `p2p` extra: imported only when the node starts a host
    from node.p2p.host import P2PHost
    from node.validator.moe import MoeDutyService

log = logging.getLogger(__name__)
MAX_PAYLOAD = 32 * 2**20
MAX_GOSSIP_QUEUE = 4096  # votes waiting for the asyncio side; more are dropped (and counted)
GOSSIP_RETRIES = 20  # a vote whose committee or commitment the chain cannot tell yet is looked at again
# Failures a later retry can cure: the chain, a peer or the network. Anything else is a bug or a
# hostile input that slipped through: retried `check_attempts` times, then the job is given up.
TRANSIENT = (RecoverableError, ChainError, aiohttp.ClientError, TimeoutError, OSError)
# One place to ask for a payload: its name, the fetch, what to do with a bad answer, whether it is the operator's own.
Source = tuple[str, Callable[[], Awaitable[bytes]], Callable[[], None], bool]


@dataclass
class ModelSlot:
    """One served model: its files, tokenizer, engine and calibrated thresholds (one user at a time)."""

    files: ModelFiles
    tokenizer: ModelTokenizer
    engine: Engine
    thresholds: Stage2Thresholds | None  # None for a stock-sampler model, which `stock` judges instead
    lock: threading.Lock = field(default_factory=threading.Lock)
    projection: ProjectionThresholds | None = None  # kind-1 fingerprints: the profile's [projection]
    projection_engine: Engine | None = None  # kind-1: the model at its registered dtype, recording the layers
    batcher: PrefillBatcher | None = None  # created by the daemon, in its event loop
    stock: StockThresholds | None = None  # a stock-sampler model (docs/protocol.md §13): its payload has no artifact

    def __post_init__(self) -> None:
        if (self.stock is None) == (self.thresholds is None):
            raise FatalError(f"{self.files.spec.name}: a model slot has either stage-2 or stock thresholds",
                             Reason.UNKNOWN_SAMPLER)


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
        self.job_errors = Counter("verinfer_job_errors_total", "Errors that postponed or ended one job",
                                  ["stage", "error"], registry=self.registry)
        self.jobs_given_up = Counter("verinfer_jobs_given_up_total", "Jobs ended without a verdict", ["error"],
                                     registry=self.registry)
        self.gossip_rejected = Counter("verinfer_gossip_rejected_total", "Gossiped votes dropped", ["reason"],
                                       registry=self.registry)
        self.submissions = Counter("verinfer_submissions_total", "Vote submissions", ["result"],
                                   registry=self.registry)
        self.prefill_batch = Histogram("verinfer_prefill_batch_size", "Inferences per batched validation prefill",
                                       buckets=(1, 2, 4, 8, 16, 32), registry=self.registry)
        self.verify_seconds = Histogram("verinfer_verify_seconds", "Stage 1 + stage 2 time per inference",
                                        registry=self.registry)
        self.healthy = Gauge("verinfer_healthy", "1 while the node may sign", registry=self.registry)
        self.queue = Gauge("verinfer_queue_depth", "Work waiting", ["queue"], registry=self.registry)


class DeferredCursor:
    """A CursorStore that persists only when told: once the events of a poll are recorded (finding 7).

    chain.events saves its cursor inside poll(), before the handler has run; through this wrapper the
    stream works on the in-memory position and the durable one moves after the jobs are stored.
    """

    def __init__(self, durable: CursorStore) -> None:
        self.durable = durable
        self.blocks = durable.load()

    def load(self) -> list[tuple[int, str]]:
        """Return the position the stream works from."""
        return list(self.blocks)

    def save(self, blocks: list[tuple[int, str]]) -> None:
        """Remember the stream's new position (not yet durable)."""
        self.blocks = list(blocks)

    def commit(self) -> None:
        """Persist the position: every event before it is recorded."""
        self.durable.save(self.blocks)

    def rollback(self) -> None:
        """Go back to the durable position (the events after it are handed out again)."""
        self.blocks = self.durable.load()


class RecordedEventStream(EventStream):
    """An EventStream whose durable cursor moves only after its handler recorded the events."""

    @property
    def deferred(self) -> DeferredCursor:
        """Return the stream's deferred cursor."""
        assert isinstance(self.cursor, DeferredCursor)
        return self.cursor

    def poll(self) -> tuple[list[ChainEvent], Reorg | None]:
        """Return the next confirmed logs; an empty poll persists its position, a failed one is undone."""
        try:
            events, reorg = super().poll()
        except BaseException:  # a poll that failed half-way handed out nothing: start over from the durable cursor
            self.rewind()
            raise
        if not events and reorg is None:
            self.deferred.commit()
        return events, reorg

    def rewind(self) -> None:
        """Forget what was handed out since the durable cursor (it is handed out again)."""
        self.deferred.rollback()
        self._seen.clear()


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
        self.stream = RecordedEventStream(hub.w3, hub.contract, DeferredCursor(store.cursor("events")),
                                          start_block=config.start_block, confirmations=config.confirmations,
                                          safety_window=config.safety_window)
        self.jobs: asyncio.Queue[int] = asyncio.Queue()  # inference ids of pending jobs (the store holds them)
        self.verdicts: asyncio.Queue[int] = asyncio.Queue()  # inference ids of verified jobs
        self.healthy = True
        rpc_url = getattr(hub.w3.provider, "endpoint_uri", None) or config.rpc_url
        self.health = HealthMonitor(str(rpc_url), config.health_rpc_timeout, self._read_cursor)
        self.p2p: P2PHost | None = None  # started by run() when config.p2p_listen is set
        self.gossip: asyncio.Queue[tuple[bytes, int]] = asyncio.Queue()
        # filled by the asyncio side, read (never written) by the libp2p validation threads
        self._committees: dict[int, list[str]] = {}
        self._commitments: dict[int, Commitment] = {}
        self._ballots: dict[int, Ballot] = {}
        self._attempts: dict[int, int] = {}
        self._unavailable: dict[int, int] = {}  # rounds a payload was asked for and not served, per inference
        self._check_window: int | None = None
        self._submit_wake = asyncio.Event()
        self._failure: BaseException | None = None  # a fatal error in a submission task, raised by the service
        self._submits: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.done: list[tuple[int, bool, int]] = []  # (inference id, valid, reason) signed, for tests and logs
        self.moe: MoeDutyService | None = None  # the MoE duty service (config [moe]), set by the composition root

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

    def load_jobs(self) -> None:
        """Queue the jobs and votes the store holds from before a restart."""
        now = time.monotonic()
        for iid, entry in self.store.jobs("submitted"):
            if not self.store.votes(iid):  # stopped between the state change and the vote (cannot happen today)
                self.store.move_job(iid, "verified", entry)
        for iid, _ in self.store.jobs("pending"):
            self.jobs.put_nowait(iid)
        for iid, _ in self.store.jobs("verified"):
            self.verdicts.put_nowait(iid)
        for iid in self.store.voted_inferences():
            votes = {signer: vote_from_json(v) for signer, v in self.store.votes(iid).items()}
            self._ballots[iid] = Ballot(votes, now - self.config.submit_grace, now)
        log.info("jobs loaded", extra={"pending": self.jobs.qsize(), "verified": self.verdicts.qsize(),
                                       "ballots": len(self._ballots)})

    # ---- services -------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run every duty until `stop` is set; a fatal error stops them all."""
        self._loop = asyncio.get_running_loop()
        self._submit_wake = asyncio.Event()
        self.preflight()
        self.load_jobs()
        await self.health.probe()  # /health answers from its first request on
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
                 *(asyncio.create_task(self._verify_loop(stop), name=f"verify-{i}")
                   for i in range(self.config.verify_batch)),
                 asyncio.create_task(self._sign_loop(stop), name="sign"),
                 asyncio.create_task(self._submit_loop(stop), name="submit"),
                 asyncio.create_task(self._gossip_loop(stop), name="gossip"),
                 asyncio.create_task(self.health.run(stop, self.config.health_interval), name="health")]
        if self.moe is not None:
            self._wire_moe_dense_check()
            tasks.append(asyncio.create_task(self.moe.run(stop), name="moe-duties"))
        try:
            await wait_stop_or_failure(tasks, stop)
        finally:
            stop.set()
            for task in [*tasks, *self._submits]:
                task.cancel()
            await asyncio.gather(*tasks, *self._submits, return_exceptions=True)
            await runner.cleanup()
            if self.p2p is not None:
                await asyncio.to_thread(self.p2p.stop)

    def _wire_moe_dense_check(self) -> None:
        """Give the MoE duty service the dense check of its model's served tokens where this node loads that model.

        Issue 30: an MoE inference's hub verdict is this check (stage 1 + stage 2 on one prefill of the MoE model,
        node.moe.dense) and the duties together; the dense path below leaves MoE models to the MoE service, so one
        hub verdict per inference is recorded. A node without the model's slot never votes valid (only invalid on a
        failed duty) while the model has a dense profile.
        """
        from node.moe.dense import dense_check_of, has_dense_profile

        assert self.moe is not None
        slot = self.models.get(self.moe.model_id) if self.moe.model_id is not None else None
        if slot is not None and slot.thresholds is not None and self.moe.dense is None:
            self.moe.dense = dense_check_of(slot, self.hub, self.config.executers, self.config.fetch_timeout,
                                            self.config.fetch_retries)
        elif self.moe.dense is None and has_dense_profile(self.moe.config.model):
            log.warning("the MoE model is not among this node's models: its served tokens go unchecked here, so "
                        "this node never votes its inferences valid", extra={"model": self.moe.config.model})
            self.moe.dense_required = True

    # ---- events ---------------------------------------------------------------------------------

    async def _on_events(self, events: list[ChainEvent], reorg: Reorg | None) -> None:
        """Record a poll's events (requests, commitments, jobs), then move the durable cursor past them."""
        try:
            new, settled = self._record_events(events, reorg)
        except BaseException:
            self.stream.rewind()  # nothing of this poll counts as handled: it is handed out again
            raise
        self.stream.deferred.commit()
        for iid in new:
            self.jobs.put_nowait(iid)
        for iid in settled:
            self._forget(iid, "settled")
        self.metrics.queue.labels("verify").set(self.jobs.qsize())

    def _record_events(self, events: list[ChainEvent], reorg: Reorg | None) -> tuple[list[int], list[int]]:
        if reorg is not None:
            log.warning("chain reorganised", extra={"ancestor": reorg.ancestor, "depth": reorg.depth})
        new, settled = [], []
        for e in events:
            self.metrics.events.labels(e.name).inc()
            args = e.args
            if e.name == "InferenceRequested":
                p = params_from_event(args["params"])
                self.store.put_record("request", int(args["inferenceId"]), {
                    "user_seed": int(args["userSeed"]), "model_id": Web3.to_hex(args["modelId"]),
                    "prompt_hash": Web3.to_hex(args["promptHash"]), "operator": str(args["operator"]),
                    "params": [p.temperature_bits, p.top_p_bits, p.top_k, p.max_tokens], "block": e.block_number})
            elif e.name == "InferenceCommitted":
                iid = int(args["inferenceId"])
                commitment = Commitment(bytes(args["outputHash"]), bytes(args["artifactRoot"]),
                                        bytes(args["fingerprintHash"]))
                self._remember_commitment(iid, commitment)
                job = self._job(iid, args)
                if job is not None and self.store.add_job(iid, {"job": job.to_json()}):
                    new.append(iid)
            elif e.name == "InferenceSettled":
                settled.append(int(args["inferenceId"]))
        return new, settled

    def _job(self, inference_id: int, args: dict[str, Any]) -> Job | None:
        request = self.store.get_record("request", inference_id)
        if request is None:
            self.metrics.skipped.labels("request-not-seen").inc()
            return None
        t, p, k, m = request["params"]
        facts = ChainFacts(inference_id, request["user_seed"], bytes.fromhex(request["model_id"][2:]), t, p, k, m,
                           bytes.fromhex(request["prompt_hash"][2:]), bytes(args["outputHash"]),
                           bytes(args["artifactRoot"]), bytes(args["fingerprintHash"]),
                           self._projection_block_hash(request))
        return Job(facts, request["operator"])

    def _projection_block_hash(self, request: dict[str, Any]) -> bytes:
        """Return the hash of the block after the request's (kind-1 projection seeds), for a model that accepts kind 1.

        The commit that triggers the job is confirmed and mined after the request, so that block exists.
        """
        slot = self.models.get(bytes.fromhex(request["model_id"][2:]))
        if slot is None or KIND_PROJECTION not in slot.files.spec.fingerprint_kinds or "block" not in request:
            return NO_BLOCK_HASH
        return bytes(self.hub.w3.eth.get_block(int(request["block"]) + 1)["hash"])

    def _remember_commitment(self, inference_id: int, commitment: Commitment) -> None:
        """Keep our own record of an inference's commitment (the only one a submission uses)."""
        self.store.put_record("commit", inference_id, {k: v.hex() for k, v in asdict(commitment).items()})
        self._commitments[inference_id] = commitment

    def _get_commitment(self, inference_id: int) -> Commitment | None:
        """Return our own record of an inference's commitment."""
        if inference_id not in self._commitments:
            record = self.store.get_record("commit", inference_id)
            if record is None:
                return None
            self._commitments[inference_id] = Commitment(*(bytes.fromhex(record[k]) for k in
                                                           ("output_hash", "artifact_root", "fingerprint_hash")))
        return self._commitments[inference_id]

    def _forget(self, inference_id: int, why: str) -> None:
        """End an inference's job and votes: settled, out of its window, or nothing for us to do."""
        self.store.forget_inference(inference_id)
        self._ballots.pop(inference_id, None)
        self._attempts.pop(inference_id, None)
        self._unavailable.pop(inference_id, None)
        log.debug("inference done", extra={"inference_id": inference_id, "why": why})

    # ---- verify -----------------------------------------------------------------------------------

    async def _verify_loop(self, stop: asyncio.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.fetch_timeout)) as session:
            while not stop.is_set():
                iid = await self.jobs.get()
                self.metrics.queue.labels("verify").set(self.jobs.qsize())
                entry = self.store.get_job(iid)
                if entry is None or entry[0] != "pending":
                    continue
                job = Job.from_json(entry[1]["job"])
                try:
                    checked = await self._check(session, job)
                except FatalError:
                    raise
                except Exception as exc:  # one job's trouble ends or postpones that job only
                    self._on_check_error(job, exc)
                    continue
                if checked is not None:
                    record, fraud = checked
                    self.store.move_job(iid, "verified", {"job": job.to_json(), "record": asdict(record),
                                                          "fraud": fraud.to_json() if fraud else None})
                    self._attempts.pop(iid, None)
                    self.verdicts.put_nowait(iid)

    def _on_check_error(self, job: Job, exc: Exception) -> None:
        """Log and count a failed check; retry it later, or give it up after `check_attempts` if it is no
        transient failure (we never sign a verdict on a check that did not run to its end)."""
        iid = job.facts.inference_id
        kind = type(exc).__name__
        self.metrics.job_errors.labels("check", kind).inc()
        attempts = self._attempts[iid] = self._attempts.get(iid, 0) + 1
        transient = isinstance(exc, TRANSIENT)
        if not transient and attempts >= self.config.check_attempts:
            log.error("check given up", exc_info=exc,
                      extra={"inference_id": iid, "error": f"{kind}: {exc}", "attempts": attempts})
            self.metrics.jobs_given_up.labels(kind).inc()
            self._forget(iid, "given up")
            return
        delay = self._backoff(attempts)
        log.warning("check failed, retrying", exc_info=None if transient else exc,
                    extra={"inference_id": iid, "error": f"{kind}: {exc}", "in_s": delay})
        self._later(delay, self.jobs, iid)

    def _backoff(self, attempts: int) -> float:
        return float(min(self.config.poll_interval * 2 ** min(attempts, 16), self.config.retry_max_delay))

    def _later(self, delay: float, queue: asyncio.Queue[int], inference_id: int) -> None:
        asyncio.get_running_loop().call_later(delay, queue.put_nowait, inference_id)

    def _get_check_window(self) -> int:
        if self._check_window is None:
            self._check_window = int(self.hub.call("checkWindow"))
        return self._check_window

    def _is_open(self, inference_id: int) -> bool:
        """Check whether an inference still waits for verdicts (committed, inside its check window)."""
        inf = self.hub.get_inference(inference_id)
        return inf.status is Status.COMMITTED and \
            int(self.hub.w3.eth.block_number) <= inf.commit_block + self._get_check_window()

    def _get_window_left(self, inference_id: int) -> int:
        """Return the blocks left in an inference's check window."""
        inf = self.hub.get_inference(inference_id)
        return inf.commit_block + self._get_check_window() - int(self.hub.w3.eth.block_number)

    def _retry_unavailable(self, inference_id: int, left: int) -> None:
        """Ask again for a payload nobody served yet (an executer restarting, a network cut) while the window
        leaves more than `unavailable_margin_blocks` blocks; the vote says PAYLOAD_UNAVAILABLE only after that."""
        rounds = self._unavailable[inference_id] = self._unavailable.get(inference_id, 0) + 1
        delay = min(0.5 * 2 ** min(rounds, 8), self.config.unavailable_retry_delay)
        self.metrics.skipped.labels("payload-not-yet-available").inc()
        log.info("payload not available yet; asking again", extra={"inference_id": inference_id, "blocks_left": left,
                                                                    "round": rounds, "in_s": delay})
        self._later(delay, self.jobs, inference_id)

    async def _check(self, session: aiohttp.ClientSession,
                     job: Job) -> tuple[VerdictRecord, FraudProof | None] | None:
        """Return the verdict record (and fraud proof) of a job, or None when there is nothing (yet) to sign."""
        facts = job.facts
        iid = facts.inference_id
        if not await asyncio.to_thread(self._is_open, iid):
            self.metrics.skipped.labels("settled-or-closed").inc()
            self._forget(iid, "settled or out of its window")
            return None
        try:
            checked, committee = await asyncio.to_thread(self.hub.selection_of, iid)
        except ContractReverted as exc:
            if exc.error == "SelectionNotReady":  # the seed block is not mined yet: look again shortly
                self._later(self.config.poll_interval, self.jobs, iid)
                return None
            self.metrics.skipped.labels(exc.error).inc()
            self._forget(iid, exc.error)
            return None
        self._committees[iid] = committee if checked else []
        why = "not-checked" if not checked else "not-in-committee" if self.account.address not in committee \
            else "model-not-served" if facts.model_id not in self.models \
            else "moe-model" if self.models[facts.model_id].files.spec.is_moe else None  # the MoE service votes
        if why is not None:
            self.metrics.skipped.labels(why).inc()
            self._forget(iid, why)
            return None
        slot = self.models[facts.model_id]
        if slot.stock is not None and not is_stock_commitment(facts.artifact_root, facts.fingerprint_hash):
            # a stock-sampler model's commitment is fixed (§13.1): no payload can match another, none is fetched
            payload, reason, unavailable = None, Reason.ARTIFACT_ROOT_MISMATCH, b"ARTIFACT_ROOT_MISMATCH"
        else:
            left = await asyncio.to_thread(self._get_window_left, iid)
            last_try = left <= self.config.unavailable_margin_blocks
            payload, reason = await self._fetch(session, job, slot.stock is not None, last_try)
            unavailable = b"payload-unavailable"
            if reason is Reason.PAYLOAD_UNAVAILABLE and not last_try:
                self._retry_unavailable(iid, left)
                return None
            self._unavailable.pop(iid, None)
        started = time.perf_counter()
        fraud = None
        if payload is None:
            valid, scores = False, keccak256(unavailable)
        elif isinstance(payload, StockPayload):
            report = await asyncio.to_thread(self._verify_stock_locked, slot, payload, facts)
            reason, valid = report.reason, report.valid
            scores = report.decision.scores_digest if report.decision else keccak256(reason.name.encode())
        else:
            report = await self._verify(slot, payload, facts)
            reason = report.reason
            valid = report.valid
            scores = report.decision.scores_digest if report.decision else keccak256(reason.name.encode())
            stage1 = report.stage1
            if stage1 is not None and not stage1.valid and (stage1.position is not None
                                                            or stage1.reason in TERMINATION_REASONS):
                fraud = self._build_fraud_proof(iid, payload, stage1.position, stage1.reason)
        self.metrics.verify_seconds.observe(time.perf_counter() - started)
        return VerdictRecord(iid, Web3.to_hex(facts.artifact_root), valid, int(reason), Web3.to_hex(scores),
                             int(self.clock()) + self.config.verdict_ttl), fraud

    def _build_fraud_proof(self, inference_id: int, payload: InferencePayload, position: int | None,
                           reason: Reason) -> FraudProof | None:
        """Return the fraud proof of a stage-1 failure; if it cannot be built, the invalid verdict still stands."""
        try:
            return build_fraud_proof(payload, position, reason)
        except FatalError:
            raise
        except Exception as exc:
            self.metrics.job_errors.labels("fraud-proof", type(exc).__name__).inc()
            log.warning("fraud proof not built", exc_info=exc, extra={"inference_id": inference_id})
            return None

    async def _verify(self, slot: ModelSlot, payload: InferencePayload, facts: ChainFacts) -> VerificationReport:
        """Return a payload's report: stage 1 and stage 2 in worker threads, the prefill through the batcher."""
        check = await asyncio.to_thread(prepare_verification, payload, slot.files, slot.tokenizer, facts)
        if isinstance(check, VerificationReport):
            return check
        prefill = await self._get_batcher(slot).prefill(check.prompt_ids, check.output_ids)
        return await asyncio.to_thread(self._finish_locked, slot, check, prefill)

    def _verify_stock_locked(self, slot: ModelSlot, payload: StockPayload, facts: ChainFacts) -> VerificationReport:
        """A stock-sampler payload's report: its own prefill, under the model's lock (no batching: one a time)."""
        assert slot.stock is not None
        with slot.lock:
            return verify_stock_payload(payload, slot.files, slot.tokenizer, slot.engine, slot.stock, facts)

    def _finish_locked(self, slot: ModelSlot, check: PreparedCheck, prefill: Prefill) -> VerificationReport:
        """Stage 2 and the decision; a kind-1 check runs its own prefill on the projection engine, so under the lock."""
        assert slot.thresholds is not None  # a stock slot never prepares a canonical check
        if slot.projection_engine is None:
            return finish_verification(check, prefill, slot.thresholds, slot.files, slot.engine, True,
                                       slot.projection)
        with slot.lock:
            return finish_verification(check, prefill, slot.thresholds, slot.files, slot.engine, True,
                                       slot.projection, slot.projection_engine)

    def _get_batcher(self, slot: ModelSlot) -> PrefillBatcher:
        """Return the model's prefill batcher (one pass at a time on its engine)."""
        if slot.batcher is None:
            def run(items: list[tuple[Sequence[int], Sequence[int]]]) -> list[Prefill]:
                with slot.lock:
                    return prefill_many(slot.engine, items)

            slot.batcher = PrefillBatcher(run, self.config.verify_batch, self.config.batch_wait,
                                          self.metrics.prefill_batch.observe)
        return slot.batcher

    async def _fetch(self, session: aiohttp.ClientSession, job: Job, stock: bool = False,
                     last_try: bool = True) -> tuple[InferencePayload | StockPayload | None, Reason]:
        """Return the committed payload (cache, then libp2p peers, then HTTP), or None and why.

        Whatever a source answers is checked against the on-chain commitment before it is cached;
        a libp2p peer that answers something else is scored down (and dropped under the floor). A
        stock-sampler model's payload is a StockPayload, checked against the stock commitment.
        Only the operator's own endpoints give evidence: bytes from them that do not parse or do not
        match the commitment are the reason; when no source served anything (unreachable, unknown id,
        another peer's garbage) the reason is PAYLOAD_UNAVAILABLE. `last_try`: all `fetch_retries`
        rounds with back-off; otherwise one round (the job is asked again later, within its window).
        """
        facts = job.facts
        commitment = keccak256(facts.artifact_root + facts.output_hash + facts.fingerprint_hash)

        def decode(raw: bytes) -> tuple[InferencePayload | StockPayload, Reason]:
            if stock:
                stock_payload = decode_stock_payload(raw)
                return stock_payload, find_stock_payload_mismatch(stock_payload, facts)
            payload = decode_inference_payload(raw)
            return payload, find_payload_mismatch(payload, facts)

        def is_committed(raw: bytes) -> bool:
            try:
                return decode(raw)[1] is Reason.OK
            except Exception:  # whatever is wrong with a cached entry, it is refetched
                return False

        cached = self.store.get_payload(commitment, is_committed)
        if cached is not None:
            return decode(cached)[0], Reason.OK
        sources = self._sources(session, job)
        if not sources:
            self.metrics.fetch_failures.labels("no-endpoint").inc()
        evidence: Reason | None = None  # what the operator's own endpoints served against the commitment
        rounds = self.config.fetch_retries if last_try else 1
        for attempt in range(rounds):
            for name, fetch, on_bad, own in sources:
                try:
                    raw = await fetch()
                    payload, reason = decode(raw)
                except FatalError:
                    raise
                except Exception as exc:  # unreachable, garbage, hostile: this source, this attempt only
                    why = exc.reason.name if isinstance(exc, InvalidInput) else type(exc).__name__
                    self.metrics.fetch_failures.labels(f"{name}:{why}").inc()
                    log.info("payload fetch failed", extra={"inference_id": facts.inference_id, "source": name,
                                                            "error": f"{type(exc).__name__}: {exc}"})
                    if isinstance(exc, InvalidInput):
                        on_bad()
                        evidence = exc.reason if own else evidence
                    continue
                if reason is Reason.OK:
                    self.metrics.fetched.labels(name).inc()
                    self.store.put_payload(commitment, raw)
                    self.store.put_record("payload", facts.inference_id, {"commitment": commitment.hex()})
                    return payload, reason
                self.metrics.fetch_failures.labels(f"{name}:{reason.name}").inc()
                on_bad()
                evidence = reason if own else evidence
            if evidence is not None:  # the operator served bytes that contradict its commitment: judged now
                return None, evidence
            if attempt + 1 < rounds:
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        return None, Reason.PAYLOAD_UNAVAILABLE

    def _sources(self, session: aiohttp.ClientSession, job: Job) -> list[Source]:
        """Return where to ask for a payload, in order: the operator's libp2p peer, other peers, its HTTP URL
        (each with whether it is the operator's own endpoint)."""
        iid = job.facts.inference_id
        out: list[Source] = []
        if self.p2p is not None:
            operator_addr = self.config.peers.get(job.operator)
            addrs = ([operator_addr] if operator_addr else []) + [a for k, a in self.config.peers.items()
                                                                   if k != job.operator]
            p2p = self.p2p

            def peer(addr: str) -> Source:
                async def fetch() -> bytes:
                    return await p2p.fetch_payload(addr, iid)

                def bad() -> None:
                    p2p.score_down(addr)

                return "libp2p", fetch, bad, addr == operator_addr

            out.extend(peer(addr) for addr in addrs)
        url = self.config.executers.get(job.operator)
        if url is not None:
            async def http() -> bytes:
                async with session.get(f"{url}/v1/payloads/{iid}") as response:
                    if response.status != 200:
                        raise ValueError(f"http {response.status}")
                    return await read_capped(response, MAX_PAYLOAD)

            out.append(("http", http, lambda: None, True))
        return out

    def _serve_payload(self, inference_id: int) -> bytes | None:
        """Return a cached, committed payload for another node (called from the libp2p thread)."""
        record = self.store.get_record("payload", inference_id)
        if record is None:
            return None
        return self.store.get_payload(bytes.fromhex(record["commitment"]), lambda raw: True)

    # ---- sign -------------------------------------------------------------------------------------

    async def _sign_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            iid = await self.verdicts.get()
            entry = self.store.get_job(iid)
            if entry is None or entry[0] != "verified":
                continue
            job, record = Job.from_json(entry[1]["job"]), VerdictRecord(**entry[1]["record"])
            fraud = FraudProof.from_json(entry[1]["fraud"]) if entry[1].get("fraud") else None
            if fraud is not None:  # certain and slashing at once: first, and whatever becomes of the vote
                try:
                    await asyncio.to_thread(self._prove_fraud, job, fraud)
                except FatalError:
                    raise
                except Exception as exc:
                    self.metrics.job_errors.labels("fraud-proof", type(exc).__name__).inc()
                    log.warning("fraud proof failed: %s", exc, extra={"inference_id": iid})
            try:
                vote = await asyncio.to_thread(self._sign_verdict, job, record)
            except ConflictingVerdict:
                self.healthy = False
                self.metrics.healthy.set(0)
                raise
            except FatalError:
                raise
            except Exception as exc:  # e.g. the store or the signer hiccuped: the same record again later
                self.metrics.job_errors.labels("sign", type(exc).__name__).inc()
                log.warning("signing failed, retrying", exc_info=exc, extra={"inference_id": iid})
                self._later(self._backoff(1), self.verdicts, iid)
                continue
            self._add_vote(iid, self.account.address, vote)
            self.store.move_job(iid, "submitted", {"job": job.to_json(), "record": asdict(record)})
            await self._publish_vote(job, vote)

    def _sign_verdict(self, job: Job, record: VerdictRecord) -> Vote:
        """Record the verdict (slashing protection, synced), then sign it; return the vote."""
        if not self.healthy or not self.stream.healthy:
            raise FatalError("not healthy: refusing to sign", Reason.DEEP_REORG)
        stored = self.store.record_verdict(record)  # synced before the signature exists
        verdict = Verdict(stored.inference_id, bytes.fromhex(stored.artifact_root[2:]), stored.valid, stored.reason,
                          bytes.fromhex(stored.scores_digest[2:]), stored.deadline)
        signature = sign_verdict(self.account, verdict, self.config.chain_id, self.hub.address)
        self.metrics.verdicts.labels(str(verdict.valid).lower()).inc()
        self.done.append((job.facts.inference_id, verdict.valid, verdict.reason))
        return Vote(verdict.valid, verdict.reason, verdict.scores_digest, verdict.deadline, signature)

    async def _publish_vote(self, job: Job, vote: Vote) -> None:
        """Gossip our vote (a quorum goes on chain in one transaction); if that fails, the submitter
        still sends it after the grace period."""
        if self.p2p is None or self.p2p.topic is None:
            return
        iid = job.facts.inference_id
        try:
            await asyncio.to_thread(self.p2p.publish_blocking, encode_vote_message(iid, job.commitment(), vote))
            log.info("verdict gossiped", extra={"inference_id": iid, "valid": vote.valid})
        except Exception as exc:
            self.metrics.job_errors.labels("gossip", type(exc).__name__).inc()
            log.warning("verdict not gossiped: %s", exc, extra={"inference_id": iid})

    # ---- votes and their submission -----------------------------------------------------------------

    def _add_vote(self, inference_id: int, signer: str, vote: Vote) -> None:
        """Keep a signed vote (synced) and have the submitter look at its inference now."""
        now = time.monotonic()
        if self.store.put_vote(inference_id, signer, vote_to_json(vote)) or inference_id not in self._ballots:
            ballot = self._ballots.setdefault(inference_id, Ballot({}, now, now))
            ballot.votes[signer] = vote
            ballot.due = now
            self._submit_wake.set()

    async def _submit_loop(self, stop: asyncio.Event) -> None:
        """Start a submission round for every inference whose votes are due (one round per inference at once)."""
        while not stop.is_set():
            if self._failure is not None:
                raise self._failure
            now = time.monotonic()
            for iid, ballot in list(self._ballots.items()):
                if not ballot.running and ballot.due <= now:
                    ballot.running = True
                    task = asyncio.create_task(self._submit_round(iid, ballot), name=f"submit {iid}")
                    self._submits.add(task)
                    task.add_done_callback(self._submits.discard)
            self._submit_wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._submit_wake.wait(), timeout=self.config.poll_interval)

    async def _submit_round(self, inference_id: int, ballot: Ballot) -> None:
        """Submit the votes of one inference not yet recorded on chain; on failure, back off and retry."""
        known = frozenset(ballot.votes)
        try:
            outcome, missing = await asyncio.to_thread(self._submit_missing, inference_id, dict(ballot.votes),
                                                       ballot.first_seen)
        except FatalError as exc:
            self._failure = exc
            self._submit_wake.set()
            return
        except Exception as exc:  # reverted, RPC down, not mined in time: the same votes again, later
            ballot.attempts += 1
            ballot.due = time.monotonic() + self._backoff(ballot.attempts)
            self.metrics.submissions.labels("failed").inc()
            self.metrics.job_errors.labels("submit", type(exc).__name__).inc()
            log.warning("votes not submitted, retrying", extra={"inference_id": inference_id, "in_s":
                                                                ballot.due - time.monotonic(),
                                                                "error": f"{type(exc).__name__}: {exc}"})
            return
        finally:
            ballot.running = False
        now = time.monotonic()
        if outcome in ("settled", "closed"):
            self._forget(inference_id, outcome)
        elif outcome == "recorded":  # every vote we know is on chain; a new one brings the ballot back
            if self._ballots.get(inference_id) is ballot and frozenset(ballot.votes) == known:
                self._ballots.pop(inference_id, None)
        elif outcome == "waiting":
            ballot.due = min(ballot.first_seen + self.config.submit_grace, now + 2 * self.config.poll_interval)
        else:  # sent: look again soon; the same votes still missing then count as a failed attempt
            ballot.attempts = ballot.attempts + 1 if missing == ballot.last_missing else 0
            ballot.last_missing = missing
            ballot.due = now + (self._backoff(ballot.attempts) if ballot.attempts else self.config.poll_interval)
            self.metrics.submissions.labels("sent").inc()

    def _submit_missing(self, inference_id: int, votes: dict[str, Vote],
                        first_seen: float) -> tuple[str, frozenset[str]]:
        """Send the known votes the chain has not recorded; return what happened and which votes were missing.

        With gossip, the first committee member (by address) submits as soon as the votes it knows can
        complete a quorum; every other node waits `submit_grace` first (liveness without duplicate
        transactions). Without gossip each node submits its own vote at once.
        """
        block = self.hub.w3.eth.get_block("latest")
        inf = self.hub.get_inference(inference_id)
        if inf.status is not Status.COMMITTED:
            return "settled", frozenset()
        if int(block["number"]) > inf.commit_block + self._get_check_window():
            return "closed", frozenset()
        open_votes = {s: v for s, v in votes.items() if v.deadline >= int(block["timestamp"])}
        missing = {s: v for s, v in open_votes.items() if not self.hub.has_voted(inference_id, s)}
        me = self.account.address
        if me in votes and me not in missing:
            entry = self.store.get_job(inference_id)
            if entry is not None and entry[0] == "submitted":  # our vote is on chain: this job is done
                self.store.finish_job(inference_id)
        if not missing:
            return "recorded", frozenset()
        committee = self._committee(inference_id)
        quorum = len(committee) // 2 + 1
        onchain = {True: inf.valid_votes, False: inf.invalid_votes}
        reachable = any(onchain[side] + sum(v.valid is side for v in missing.values()) >= quorum
                        for side in (True, False))
        first = bool(committee) and sorted(committee, key=str.lower)[0] == me
        gossip = self.p2p is not None and self.p2p.topic is not None
        if gossip and not (first and reachable) and time.monotonic() - first_seen < self.config.submit_grace:
            return "waiting", frozenset(missing)
        commitment = self._get_commitment(inference_id)
        if commitment is None:  # votes are only kept once their commitment is known: cannot happen
            raise RecoverableError(f"no commitment recorded for inference {inference_id}", Reason.CHAIN_UNAVAILABLE)
        self._submit_votes(inference_id, commitment, list(missing.values()))
        return "sent", frozenset(missing)

    def _submit_votes(self, inference_id: int, commitment: Commitment, votes: list[Vote]) -> None:
        """Send signed votes in one journaled transaction and confirm it (a failure raises: retried later)."""
        fn = self.hub.contract.functions.submitVerdicts(inference_id, commitment.as_tuple(),
                                                        [v.as_tuple() for v in votes])
        entry = self.txm.send(fn, purpose=f"verdicts {inference_id}")
        self.txm.confirm(entry["nonce"])
        log.info("verdicts submitted", extra={"inference_id": inference_id, "votes": len(votes)})

    def _committee(self, inference_id: int) -> list[str]:
        """Return an inference's committee (cached: it is fixed once the seed block exists); blocking RPC."""
        if inference_id not in self._committees:
            checked, committee = self.hub.selection_of(inference_id)
            self._committees[inference_id] = committee if checked else []
        return self._committees[inference_id]

    # ---- verdict gossip ---------------------------------------------------------------------------

    def _validate_gossip(self, data: bytes) -> bool:
        """Check a gossiped vote for relaying (libp2p worker thread: no RPC, no disk): well formed, signed,
        and, where this node already knows them, by a committee member and for the committed outputs.

        A vote for an inference whose committee we do not know yet is accepted: our event stream
        lags the chain by its confirmations, and rejecting would lose (and stop relaying) honest
        votes; the asyncio side checks it against the chain before it counts.
        """
        try:
            message = decode_gossip_vote(data)
            signer = message.recover_signer(self.config.chain_id, self.hub.address)
        except InvalidGossip as exc:
            self.metrics.gossip_rejected.labels(exc.reason.name).inc()
            return False
        committee = self._committees.get(message.id)
        if committee is not None and signer not in committee:
            self.metrics.gossip_rejected.labels("not-in-committee").inc()
            return False
        commitment = self._commitments.get(message.id)
        if commitment is not None and commitment != message.commitment():
            self.metrics.gossip_rejected.labels("commitment-mismatch").inc()
            return False
        return True

    def _on_gossip(self, data: bytes) -> None:
        """Hand a relayed vote to the asyncio side (libp2p worker thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._enqueue_gossip, data, 0)

    def _enqueue_gossip(self, data: bytes, attempt: int) -> None:
        if self.gossip.qsize() >= MAX_GOSSIP_QUEUE:
            self.metrics.gossip_rejected.labels("queue-full").inc()
            return
        self.gossip.put_nowait((data, attempt))

    async def _gossip_loop(self, stop: asyncio.Event) -> None:
        """Check each gossiped vote against the chain and our records; keep the good ones for submission."""
        while not stop.is_set():
            data, attempt = await self.gossip.get()
            try:
                await self._on_gossip_vote(data)
            except FatalError:
                raise
            except InvalidGossip as exc:
                self.metrics.gossip_rejected.labels(exc.reason.name).inc()
            except Exception as exc:  # the chain cannot tell yet (seed block, RPC): look again shortly
                if attempt + 1 >= GOSSIP_RETRIES:
                    self.metrics.gossip_rejected.labels(type(exc).__name__).inc()
                    log.info("gossiped vote dropped: %s", exc)
                    continue
                loop = asyncio.get_running_loop()
                loop.call_later(self._backoff(attempt), self._enqueue_gossip, data, attempt + 1)

    async def _on_gossip_vote(self, data: bytes) -> None:
        """Keep a gossiped vote if it is signed by a member of its committee for the committed outputs."""
        message = decode_gossip_vote(data)
        iid = message.id
        signer = message.recover_signer(self.config.chain_id, self.hub.address)
        committee = await asyncio.to_thread(self._committee, iid)
        if signer not in committee:
            self.metrics.gossip_rejected.labels("not-in-committee").inc()
            return
        claimed = message.commitment()
        commitment = self._get_commitment(iid)
        if commitment is None:  # our stream has not confirmed the commit yet: the chain's commitment decides
            inf = await asyncio.to_thread(self.hub.get_inference, iid)
            if inf.commitment == keccak256(claimed.output_hash + claimed.artifact_root + claimed.fingerprint_hash):
                self._remember_commitment(iid, claimed)
                commitment = claimed
        if commitment != claimed:  # the unsigned fields are forged (or another inference's): never submitted
            self.metrics.gossip_rejected.labels("commitment-mismatch").inc()
            log.info("gossiped vote with a wrong commitment dropped", extra={"inference_id": iid, "signer": signer})
            return
        self._add_vote(iid, signer, message.vote())

    def _prove_fraud(self, job: Job, fraud: FraudProof) -> None:
        facts = job.facts
        if fraud.is_termination:
            fn = self.hub.contract.functions.proveTermination(
                facts.inference_id, job.commitment().as_tuple(), fraud.header, fraud.positions_root or b"\x00" * 32,
                fraud.leaf, fraud.proof)
        else:
            fn = self.hub.contract.functions.proveFraud(facts.inference_id, job.commitment().as_tuple(),
                                                        fraud.header_hash, fraud.leaf, fraud.proof)
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

    def _read_cursor(self) -> int:
        """Return the last block the event stream recorded (its start block before the first)."""
        blocks = self.store.cursor("events").load()
        return blocks[-1][0] if blocks else self.config.start_block

    def get_health(self) -> HealthReport:
        """Return the node's health: signing allowed, RPC answering, event cursor keeping up with the head."""
        c = self.config
        limits = HealthLimits(c.health_rpc_grace, c.health_max_lag_blocks, c.health_stall_seconds, c.confirmations)
        facts = self.health.facts(self.healthy and self.stream.healthy)
        status = decide_health(facts, limits)
        self.metrics.healthy.set(1 if status is HealthStatus.OK else 0)
        return HealthReport(status=status, healthy=status is HealthStatus.OK, address=self.account.address,
                            queue=self.jobs.qsize(), cursor=facts.cursor, head=facts.head,
                            rpc_age_s=None if facts.last_rpc_ok is None else round(facts.now - facts.last_rpc_ok, 3))

    async def _start_http(self) -> web.AppRunner:
        async def metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry), content_type="text/plain")

        async def health(_: web.Request) -> web.Response:
            report = self.get_health()
            return web.json_response(report.model_dump(mode="json"), status=200 if report.healthy else 503)

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics), web.get("/health", health)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, self.config.metrics_host, self.config.metrics_port)
        await site.start()
        return runner


__all__ = [
    "TERMINATION_REASONS",
    "Ballot",
    "DeferredCursor",
    "FraudProof",
    "Job",
    "Metrics",
    "ModelSlot",
    "RecordedEventStream",
    "ValidatorNode",
    "build_fraud_proof",
    "decode_vote_message",
    "encode_vote_message",
]
