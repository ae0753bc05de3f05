"""The validator daemon's MoE duty service: judge the duties the ExpertDuty module draws for this validator.

  events   confirmed ExpertDuty logs (chain.events): an opened inference (`DutiesAssigned`) is a durable learn
           job ("moe-learn"); its duties drawn for this validator (the lazy draws from every validator, one
           `dutiesOf` view) become durable duty jobs ("moe-job")
  judge    still open and still ours on chain? → fetch the duty's slice from the operator (node.moe.wire; HTTP,
           retried) → rebuilt into the module's moeRoot → the duty's check (node.moe.config.DutyValidator, in a
           worker thread; a drawn duty whose tensors this validator did not preload is loaded from the model
           folder first: the draw does not ask what a validator holds) → a reason code
  sign     slashing protection (one decision per inference and duty, synced) → EIP-712 ExpertVerdict →
           `submitExpertVerdicts` through the daemon's journaled TxManager (one nonce sequence per key)

  open     (with the model's hub id) a confirmed `InferenceCommitted` of the MoE model, checked, with this
           validator on its hub committee and not yet opened → the operator's opening (`GET {executer}/v1/moe/{id}`)
           rebuilt locally into the hub's commitment → `assignDuties` (journaled); another member's earlier open
           (AlreadyAssigned) ends the job. Never sent for an opening that does not rebuild the commitment.

  vote     (committee members, as the open) once every duty has settled, this validator's hub verdict on the
           inference. The module slashes no one; a failed duty is evidence that each committee member re-judges
           itself (its own decision on that duty, recorded like an expert verdict) before voting: invalid with
           the reason of a failure it confirms, valid if every duty passed or it finds every failed one sound. So
           one duty's judges never decide alone: the hub committee's quorum does, and the hub's rule slashes.
           An opening the operator never served is voted invalid DUTY_DATA_UNAVAILABLE; an inference the module
           could not open (`Uncoverable`: fewer validators with settled stake than a duty needs) gets no vote.
           With a dense check (`dense`, node.moe.dense: the whole model loaded, set by the daemon from its model
           slot) the served tokens are also checked as a dense model's once the inference is opened: stage 1 and
           stage 2 on one prefill of the claimed MoE model. Its failure is the hub verdict, invalid whatever the
           duties say (issue 30: the duties judge a trace recorded after decoding, not the served tokens).
           Recorded in the node's slashing-protection store (one hub verdict per inference, shared with the dense
           daemon), then signed and submitted (`submitVerdicts`).

An operator that does not serve a duty's slice within the retries is judged DUTY_DATA_UNAVAILABLE, as a dense
payload that never arrives is judged unavailable: withholding is not a way out of a check. A slice that does not
rebuild into the committed root counts as not served. Whatever goes wrong in one job (the operator's bytes, the
RPC) postpones or ends that job only; ConflictingVerdict (a second, different decision) stops the node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from eth_account.signers.local import LocalAccount
from prometheus_client import CollectorRegistry, Counter
from pydantic import ValidationError as PydanticValidationError
from web3 import Web3

from chain.contracts import Commitment, Hub, Status, Vote
from chain.eip712 import Verdict, sign_verdict
from chain.errors import ChainError, ContractReverted
from chain.events import ChainEvent, EventStream, Reorg
from chain.moe import DutyResult, ExpertDutyClient, Opened, decode_module_revert, sign_expert_vote
from chain.txmanager import TxManager
from node.errors import FatalError, InvalidInput, Reason, RecoverableError
from node.moe.config import DutyValidator
from node.moe.dense import MoeDenseCheck, MoeDenseVerdict
from node.moe.serve import MoeOpeningWire
from node.moe.wire import DutySlice, MoeShape, compute_max_slice_size, decode_duty_slice
from node.protocol.artifact import compute_output_hash
from node.protocol.hashing import keccak256
from node.protocol.moe import (
    SHARED,
    ExpertKey,
    InvalidMoe,
    MoeReason,
    compute_moe_fingerprint_hash,
    compute_opened_moe_root,
    parse_duty_key,
)
from node.store.leveldb import ConflictingVerdict, ExpertVerdictRecord, Store, VerdictRecord
from node.validator.config import MoeServiceConfig
from node.validator.httpread import read_capped
from node.validator.tasks import wait_stop_or_failure

log = logging.getLogger(__name__)
TRANSIENT = (RecoverableError, ChainError, aiohttp.ClientError, TimeoutError, OSError)
JOB, DONE = "moe-job", "moe-done"
OPEN = "moe-open"  # a committed inference of the model this validator may open on the module
LEARN = "moe-learn"  # an opened inference whose draws this validator has not read yet
OPEN_DONE, LEARN_DONE = "moe-open-done", "moe-learn-done"
VOTE, VOTE_DONE = "moe-vote", "moe-vote-done"  # an inference this committee member votes on at the hub
NO_URL = "no executer URL"  # our configuration's gap: never evidence against the operator
# reverts after which no retry can succeed: the job ends (the duty is past its window or not ours to judge)
FINAL_REVERTS = frozenset({"CheckWindowOver", "NotAssignedTo", "DutyNotAssigned", "NotChecked"})
FINAL_OPEN_REVERTS = frozenset({"AlreadyAssigned", "CheckWindowOver", "NotChecked", "CommitmentMismatch",
                                "UnknownShape", "Uncoverable"})


@dataclass(frozen=True)
class DutyJob:
    """One duty this validator was drawn for."""

    inference_id: int
    duty: int

    @property
    def key(self) -> int:
        """Return the job's store key (fits the store's 32-byte keys for any uint256 id)."""
        return int.from_bytes(keccak256(self.inference_id.to_bytes(32, "big") + self.duty.to_bytes(4, "big")), "big")


class MoeDutyService:
    """Judges, signs and submits this validator's MoE duties (one asyncio service of the daemon)."""

    def __init__(self, config: MoeServiceConfig, account: LocalAccount, hub: Hub, module: ExpertDutyClient,
                 store: Store, checker: DutyValidator, shape: MoeShape, executers: dict[str, str], txm: TxManager,
                 confirmations: int = 2, poll_interval: float = 1.0, fetch_timeout: float = 10.0,
                 registry: CollectorRegistry | None = None, recent_blocks_guard: int = 64,
                 model_id: bytes | None = None, verdict_ttl: int = 3600) -> None:
        """`model_id`: the MoE model's hub id, whose committed inferences this validator opens when it sits on their
        hub committee (None: it never opens; someone else must)."""
        self.config = config
        self.model_id = model_id
        self.verdict_ttl = verdict_ttl
        self.account = account
        self.hub = hub
        self.module = module
        self.store = store
        self.checker = checker
        self.shape = shape
        self.executers = {Web3.to_checksum_address(k): v.rstrip("/") for k, v in executers.items()}
        self.txm = txm
        self.poll_interval = poll_interval
        self.fetch_timeout = fetch_timeout
        self.recent_blocks_guard = recent_blocks_guard
        self.stream = EventStream(hub.w3, module.contract, store.cursor("moe-duties"), start_block=config.start_block,
                                  confirmations=confirmations)
        self.queue: asyncio.Queue[DutyJob] = asyncio.Queue()
        self.commits = EventStream(hub.w3, hub.contract, store.cursor("moe-commits"), start_block=config.start_block,
                                   confirmations=confirmations)
        self.opens: asyncio.Queue[int] = asyncio.Queue()
        self.learns: asyncio.Queue[int] = asyncio.Queue()
        self.votes: asyncio.Queue[int] = asyncio.Queue()
        self.hub_votes: list[tuple[int, bool, int]] = []  # (inference id, valid, reason) voted at the hub
        self.opened_by_us: list[int] = []  # inference ids this validator opened: for tests and logs
        self._attempts: dict[int, int] = {}
        self._check_window: int | None = None
        registry = registry or CollectorRegistry()
        self.decided = Counter("verinfer_moe_duties_total", "MoE duty verdicts signed", ["result"], registry=registry)
        self.errors = Counter("verinfer_moe_job_errors_total", "Errors that postponed or ended an MoE duty job",
                              ["error"], registry=registry)
        self.done: list[tuple[int, str, int]] = []  # (inference id, duty, reason) signed: for tests and logs
        # The hub committee's dense check of the served tokens (stage 1 + stage 2; node.moe.dense), set by the
        # composition root where this validator loads the whole MoE model; its verdicts by inference id.
        self.dense: MoeDenseCheck | None = None
        self.dense_required = False  # the model has a dense profile but this node has no check: never vote valid
        self.dense_verdicts: dict[int, MoeDenseVerdict] = {}

    # ---- events -----------------------------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse to start while another instance signs expert verdicts with this key (recent ones unrecorded)."""
        head = int(self.hub.w3.eth.block_number)
        mine = self.module.get_events("ExpertVerdictRecorded", max(head - self.recent_blocks_guard, 0), head,
                                      argument_filters={"validator": self.account.address})
        unknown = [(int(e["args"]["inferenceId"]), int(e["args"]["duty"])) for e in mine
                   if self.store.get_expert_verdict(int(e["args"]["inferenceId"]), int(e["args"]["duty"])) is None]
        if unknown:
            raise FatalError(f"{self.account.address} sent expert verdicts this store did not record ({unknown[:5]}): "
                             "another instance is live", Reason.CONFLICTING_VERDICT)

    async def run(self, stop: asyncio.Event) -> None:
        """Watch the module and judge this validator's duties until `stop` is set."""
        await asyncio.to_thread(self.preflight)
        for _, value in self.store.records(JOB):
            self.queue.put_nowait(DutyJob(int(value["inference_id"]), int(value["duty"])))
        for _, value in self.store.records(OPEN):
            self.opens.put_nowait(int(value["inference_id"]))
        for _, value in self.store.records(LEARN):
            self.learns.put_nowait(int(value["inference_id"]))
        for _, value in self.store.records(VOTE):
            self.votes.put_nowait(int(value["inference_id"]))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.fetch_timeout)) as session:
            tasks = [asyncio.create_task(self.stream.run(self._on_events, self.poll_interval, stop=stop),
                                         name="moe-events"),
                     asyncio.create_task(self._judge_loop(session, stop), name="moe-judge"),
                     asyncio.create_task(self._learn_loop(stop), name="moe-learn")]
            if self.model_id is not None:
                tasks += [asyncio.create_task(self.commits.run(self._on_commits, self.poll_interval, stop=stop),
                                              name="moe-commits"),
                          asyncio.create_task(self._open_loop(session, stop), name="moe-open"),
                          asyncio.create_task(self._vote_loop(session, stop), name="moe-vote")]
            try:
                await wait_stop_or_failure(tasks, stop)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _on_events(self, events: list[ChainEvent], reorg: Reorg | None) -> None:
        """Record a learn job for every opened inference (synced before the cursor moves on)."""
        if reorg is not None:  # a job of a dropped block is looked at again; the chain says whether it stands
            log.warning("reorg under the MoE duties", extra={"ancestor": reorg.ancestor, "depth": reorg.depth})
        for event in events:
            if event.name != "DutiesAssigned":
                continue
            iid = int(event.args["inferenceId"])
            key = _learn_key(iid)
            if self._record_job(LEARN, LEARN_DONE, key, {"inference_id": iid}):
                self.learns.put_nowait(iid)

    async def _learn_loop(self, stop: asyncio.Event) -> None:
        """Turn each opened inference into this validator's duty jobs (its lazy draws, read in one view call)."""
        attempts: dict[int, int] = {}
        while not stop.is_set():
            iid = await self.learns.get()
            try:
                mine = await asyncio.to_thread(self.module.duties_of, iid, self.account.address)
            except TRANSIENT as exc:
                n = attempts[iid] = attempts.get(iid, 0) + 1
                self.errors.labels(f"learn:{type(exc).__name__}").inc()
                if n < self.config.attempts:
                    asyncio.get_running_loop().call_later(min(0.5 * 2**n, 30.0), self.learns.put_nowait, iid)
                    continue
                log.warning("MoE draws of %d not read: %s", iid, exc)
                mine = []
            attempts.pop(iid, None)
            for duty in mine:
                job = DutyJob(iid, duty)
                if self._record_job(JOB, DONE, job.key, asdict(job)):
                    self.queue.put_nowait(job)
            self._end_job(LEARN, LEARN_DONE, _learn_key(iid), {"duties": len(mine)})

    async def _on_commits(self, events: list[ChainEvent], reorg: Reorg | None) -> None:
        """Record an open job for every committed inference (its model is checked when the job runs)."""
        for event in events:
            if event.name != "InferenceCommitted":
                continue
            iid = int(event.args["inferenceId"])
            key = _open_key(iid)
            if self._record_job(OPEN, OPEN_DONE, key, {
                    "inference_id": iid, "output_hash": Web3.to_hex(event.args["outputHash"]),
                    "artifact_root": Web3.to_hex(event.args["artifactRoot"]),
                    "fingerprint_hash": Web3.to_hex(event.args["fingerprintHash"])}):
                self.opens.put_nowait(iid)

    # ---- opening ----------------------------------------------------------------------------------

    async def _open_loop(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        """Open queued inferences on the module; a transient failure retries later, a final one ends the job."""
        attempts: dict[int, int] = {}
        while not stop.is_set():
            iid = await self.opens.get()
            try:
                why = await self.open_one(session, iid)
            except (*TRANSIENT, InvalidInput, ValueError) as exc:
                final = isinstance(exc, ContractReverted) and exc.error in FINAL_OPEN_REVERTS
                n = attempts[iid] = attempts.get(iid, 0) + 1  # any other revert (a race lost) is looked at again
                self.errors.labels(f"open:{type(exc).__name__}").inc()
                log.info("MoE open postponed: %s", exc, extra={"inference_id": iid, "attempt": n})
                if not final and n < self.config.attempts:
                    asyncio.get_running_loop().call_later(min(0.5 * 2**n, 30.0), self.opens.put_nowait, iid)
                    continue
                why = exc.error if isinstance(exc, ContractReverted) and final else "given up"
            attempts.pop(iid, None)
            self._end_job(OPEN, OPEN_DONE, _open_key(iid), {"why": why})
            log.info("MoE open job ended: %s", why, extra={"inference_id": iid})

    async def open_one(self, session: aiohttp.ClientSession, iid: int) -> str:
        """Open one committed inference on the module if it is ours to open; return why the job ends."""
        inf = await asyncio.to_thread(self.hub.get_inference, iid)
        if inf.model_id != self.model_id:
            return "another model"
        if await asyncio.to_thread(self._is_past_window, inf.commit_block):
            return "CheckWindowOver"
        if int(await asyncio.to_thread(lambda: self.hub.w3.eth.block_number)) <= inf.commit_block + 1:
            raise RecoverableError(f"inference {iid}: its selection seed is not mined yet", Reason.CHAIN_UNAVAILABLE)
        checked, committee = await asyncio.to_thread(self.hub.selection_of, iid)
        if not checked:
            return "not checked"
        if self.account.address not in committee:  # its committee opens and votes: a bounded set of senders
            return "not on its committee"
        job = self.store.get_record(OPEN, _open_key(iid))
        if job is not None and self._record_job(VOTE, VOTE_DONE, _open_key(iid), job):
            self.votes.put_nowait(iid)  # the hub verdict follows the duties (vote loop)
        if (await asyncio.to_thread(self.module.opened, iid)).commit_block != 0:
            return "opened"
        url = self.executers.get(Web3.to_checksum_address(inf.operator))
        if url is None:  # our configuration's gap: we neither open nor vote the operator's data unavailable
            return NO_URL
        async with session.get(f"{url}/v1/moe/{iid}") as response:
            if response.status != 200:
                raise ValueError(f"opening of {iid}: http {response.status}")
            raw = await read_capped(response, 64 * self.shape.layers * self.shape.experts + 4096)
        try:
            opening = MoeOpeningWire.model_validate_json(bytes(raw)).opening()
            moe_root = compute_opened_moe_root(self.shape.layers, self.shape.experts, opening.router_root,
                                               opening.counts, opening.expert_roots)
        except (InvalidMoe, PydanticValidationError) as exc:
            raise ValueError(f"opening of {iid} is malformed: {exc}") from exc
        bound = compute_moe_fingerprint_hash(opening.fingerprint_hash, moe_root)
        if keccak256(opening.output_hash + opening.artifact_root + bound) != inf.commitment:
            raise ValueError(f"opening of {iid} does not rebuild the hub's commitment")  # never paid for
        fn = self.module.contract.functions.assignDuties(iid, opening.as_tuple())
        try:
            entry = await asyncio.to_thread(lambda: self.txm.send(fn, purpose=f"assign duties {iid}"))
        except ContractReverted as exc:  # the module's own errors (Uncoverable, AlreadyAssigned) by name
            raise decode_module_revert(exc) from exc
        await asyncio.to_thread(self.txm.confirm, entry["nonce"])
        self.opened_by_us.append(iid)
        log.info("MoE inference opened on the module", extra={"inference_id": iid})
        return "opened by us"

    # ---- the hub verdict ---------------------------------------------------------------------------

    async def _vote_loop(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        """Vote at the hub on queued inferences once their duties settle; a pending one is looked at again."""
        while not stop.is_set():
            iid = await self.votes.get()
            try:
                await self.rejudge_failed(session, iid)
                dense = await self._dense_verdict(iid)
                why = await asyncio.to_thread(self.vote_one, iid, dense)
            except (ConflictingVerdict, FatalError):
                raise
            except ContractReverted as exc:  # the hub refused it (settled, window over, voted): nothing to retry
                why = exc.error
            except (*TRANSIENT, InvalidInput, ValueError) as exc:
                self.errors.labels(f"vote:{type(exc).__name__}").inc()
                log.info("MoE hub vote postponed: %s", exc, extra={"inference_id": iid})
                why = None
            if why is None:  # duties still open: look again soon
                asyncio.get_running_loop().call_later(max(5 * self.poll_interval, 0.5), self.votes.put_nowait, iid)
                continue
            self._end_job(VOTE, VOTE_DONE, _open_key(iid), {"why": why})
            log.info("MoE hub vote job ended: %s", why, extra={"inference_id": iid})

    async def _dense_verdict(self, iid: int) -> MoeDenseVerdict | None:
        """Return the dense check's verdict on an opened inference (run once; None without a check or an opening)."""
        if self.dense is None:
            return None
        if iid not in self.dense_verdicts:
            opened = await asyncio.to_thread(self.module.opened, iid)
            if opened.commit_block == 0:
                return None
            self.dense_verdicts[iid] = await self.dense(iid, opened.moe_root)
        return self.dense_verdicts[iid]

    def vote_one(self, iid: int, dense: MoeDenseVerdict | None = None) -> str | None:
        """Vote at the hub on one inference if its duties (or the dense check) decided it; return why the job ends
        (None: not yet). A failed dense check is the verdict whatever the duties say; with a dense check configured
        (self.dense), no inference is voted valid before it passed."""
        inf = self.hub.get_inference(iid)
        if inf.status is not Status.COMMITTED:
            return "settled"
        if self._is_past_window(inf.commit_block):
            return "CheckWindowOver"
        if self.hub.has_voted(iid, self.account.address):
            return "voted"
        opened = self.module.opened(iid)
        if dense is not None and not dense.valid:  # the served tokens fail stage 1 or stage 2 (issue 30)
            valid, reason = False, dense.reason
        elif opened.commit_block == 0:
            ended = self.store.get_record(OPEN_DONE, _open_key(iid))
            if ended is not None and ended["why"] == "Uncoverable":
                return "uncoverable"  # too few settled validators to draw any duty: no evidence either way, no vote
            if ended is None or ended["why"] != "given up":
                return None if ended is None or ended["why"] in ("opened", "opened by us") else f"unopened: {ended}"
            valid, reason = False, int(MoeReason.DUTY_DATA_UNAVAILABLE)  # the operator never served its opening
        else:
            decided = self._duties_verdict(iid, opened)
            if decided is None:
                return None
            valid, reason = decided
        if valid and dense is None and self.dense is not None:
            return None  # the dense check has not run yet: never valid on the duties alone
        if valid and dense is None and self.dense_required:
            return "abstained: no dense check"  # the served tokens unchecked here: no valid vote from the duties alone
        job = self.store.get_record(VOTE, _open_key(iid))
        if job is None:
            return "no job"
        commitment = Commitment(*(bytes.fromhex(job[k][2:]) for k in ("output_hash", "artifact_root",
                                                                      "fingerprint_hash")))
        scores = keccak256(json.dumps({"moe": iid, "valid": valid, "reason": reason,
                                       "dense": None if dense is None else dense.scores_digest.hex()}).encode())
        stored = self.store.record_verdict(VerdictRecord(iid, job["artifact_root"], valid, reason, Web3.to_hex(scores),
                                                         int(time.time()) + self.verdict_ttl))  # synced before signing
        verdict = Verdict(iid, bytes.fromhex(stored.artifact_root[2:]), stored.valid, stored.reason,
                          bytes.fromhex(stored.scores_digest[2:]), stored.deadline)
        signature = sign_verdict(self.account, verdict, self.hub.chain_id(), self.hub.address)
        vote = Vote(verdict.valid, verdict.reason, verdict.scores_digest, verdict.deadline, signature)
        fn = self.hub.contract.functions.submitVerdicts(iid, commitment.as_tuple(), [vote.as_tuple()])
        entry = self.txm.send(fn, purpose=f"verdicts {iid}")
        self.txm.confirm(entry["nonce"])
        self.hub_votes.append((iid, stored.valid, stored.reason))
        log.info("MoE hub verdict submitted", extra={"inference_id": iid, "valid": stored.valid,
                                                      "reason": stored.reason})
        return "voted"

    def _failed_duties(self, iid: int, commit_block: int) -> tuple[set[int], list[int]]:
        """Return (every settled duty, the failed ones in settling order): one log query (each settles once)."""
        settled = self.module.get_events("DutySettled", commit_block, argument_filters={"inferenceId": iid})
        return {int(e["args"]["duty"]) for e in settled}, [int(e["args"]["duty"]) for e in settled
                                                            if not e["args"]["valid"]]

    def _duties_verdict(self, iid: int, opened: Opened) -> tuple[bool, int] | None:
        """Return this member's (valid, reason) from the settled duties and its own re-judging (None: not yet)."""
        settled, failed = self._failed_duties(iid, opened.commit_block)
        own = [self.store.get_expert_verdict(iid, duty) for duty in failed]
        if any(record is None for record in own):
            return None  # a failed duty this member has not re-judged yet (rejudge_failed runs before each look)
        confirmed = [r for r in own if r is not None and not r.valid]
        if confirmed:
            return False, confirmed[0].reason
        if len(settled) < opened.duties:
            return None
        return True, 0  # every duty passed, or every failure it re-judged was unfounded

    async def rejudge_failed(self, session: aiohttp.ClientSession, iid: int) -> None:
        """Judge each failed duty of an inference itself (once, recorded like an expert verdict) before voting."""
        opened = await asyncio.to_thread(self.module.opened, iid)
        if opened.commit_block == 0:
            return
        _, failed = await asyncio.to_thread(self._failed_duties, iid, opened.commit_block)
        for duty in failed:
            if self.store.get_expert_verdict(iid, duty) is not None:
                continue  # drawn for it (its signed decision stands) or re-judged before
            key = parse_duty_key(duty)
            reason = await self._decide(session, iid, key, opened.moe_root)
            scores = keccak256(json.dumps({"duty": str(key), "reason": int(reason), "rejudged": True}).encode())
            self.store.record_expert_verdict(ExpertVerdictRecord(iid, duty, Web3.to_hex(opened.moe_root),
                                                                 reason is MoeReason.OK, int(reason),
                                                                 Web3.to_hex(scores)))
            log.info("failed MoE duty re-judged", extra={"inference_id": iid, "duty": str(key),
                                                          "reason": int(reason)})

    # ---- judging ----------------------------------------------------------------------------------

    async def _judge_loop(self, session: aiohttp.ClientSession, stop: asyncio.Event) -> None:
        """Judge queued duties; the verdicts of one inference's duties go out in one transaction."""
        while not stop.is_set():
            jobs = [await self.queue.get()]
            while not self.queue.empty():
                jobs.append(self.queue.get_nowait())
            by_inference: dict[int, list[DutyJob]] = {}
            for job in jobs:
                by_inference.setdefault(job.inference_id, []).append(job)
            for group in by_inference.values():
                decided: list[tuple[DutyJob, ExpertVerdictRecord]] = []
                for job in dict.fromkeys(group):
                    record = await self._attempt(self.judge(session, job), job)
                    if record is not None:
                        decided.append((job, record))
                if decided:
                    done = await self._attempt(asyncio.to_thread(self._sign_and_submit, [r for _, r in decided]),
                                               *(j for j, _ in decided))
                    if done is not None:
                        for job, _ in decided:
                            self._finish(job, "submitted")

    async def _attempt(self, work: Any, *jobs: DutyJob) -> Any:
        """Return `work`'s result; on an error postpone its jobs (given up after `attempts`), fatal errors raise."""
        try:
            return await work
        except (ConflictingVerdict, FatalError):
            raise
        except Exception as exc:  # these jobs only
            self.errors.labels(type(exc).__name__).inc()
            if isinstance(exc, ContractReverted) and exc.error in FINAL_REVERTS:
                log.warning("MoE duty ended: %s", exc, extra={"jobs": len(jobs)})
                for job in jobs:
                    self._finish(job, exc.error)
                return None
            for job in jobs:
                n = self._attempts[job.key] = self._attempts.get(job.key, 0) + 1
                log.warning("MoE duty postponed: %s", exc, extra={"inference_id": job.inference_id,
                                                                 "duty": job.duty, "attempt": n})
                if n >= self.config.attempts:
                    self._finish(job, "given up")
                else:
                    asyncio.get_running_loop().call_later(min(0.5 * 2**n, 30.0), self.queue.put_nowait, job)
            return None

    async def judge(self, session: aiohttp.ClientSession, job: DutyJob) -> ExpertVerdictRecord | None:
        """Return the verdict to sign on one duty (None, and the job ended, if it is no longer open or ours)."""
        iid, key = job.inference_id, parse_duty_key(job.duty)
        opened = await asyncio.to_thread(self.module.opened, iid)
        if opened.commit_block == 0:
            raise RecoverableError(f"inference {iid} is not opened on the module yet", Reason.CHAIN_UNAVAILABLE)
        result = await asyncio.to_thread(self.module.duty_result, iid, job.duty)
        assigned = await asyncio.to_thread(self.module.assigned_to, iid, job.duty)
        if result is not DutyResult.OPEN or self.account.address not in assigned:
            self._finish(job, "settled" if result is not DutyResult.OPEN else "not ours")
            return None
        if await asyncio.to_thread(self._is_past_window, opened.commit_block):  # no vote can land: spare the work
            self._finish(job, "CheckWindowOver")
            return None
        record = self.store.get_expert_verdict(iid, job.duty)  # decided before a restart: the same again
        if record is None:
            reason = await self._decide(session, iid, key, opened.moe_root)
            scores = keccak256(json.dumps({"duty": str(key), "reason": int(reason)}).encode())
            record = ExpertVerdictRecord(iid, job.duty, Web3.to_hex(opened.moe_root), reason is MoeReason.OK,
                                         int(reason), Web3.to_hex(scores))
        return record

    def _is_past_window(self, commit_block: int) -> bool:
        """Check whether the hub's check window of a commit at `commit_block` has ended (blocking RPC)."""
        if self._check_window is None:
            self._check_window = int(self.hub.call("checkWindow"))
        return int(self.hub.w3.eth.block_number) > commit_block + self._check_window

    async def _decide(self, session: aiohttp.ClientSession, iid: int, key: ExpertKey, moe_root: bytes) -> MoeReason:
        """Return the duty's decision: its slice fetched and checked, or DUTY_DATA_UNAVAILABLE after the retries."""
        inference = await asyncio.to_thread(self.hub.get_inference, iid)
        url = self.executers.get(Web3.to_checksum_address(inference.operator))
        if url is None:  # our configuration's gap, not evidence against the operator: no vote
            raise RecoverableError(f"no executer URL configured for operator {inference.operator}",
                                   Reason.CHAIN_UNAVAILABLE)
        piece: DutySlice | None = None
        for attempt in range(self.config.fetch_retries):
            try:
                piece = await self._fetch(session, f"{url}/v1/moe/{iid}/{key}", key, moe_root, inference.commitment)
                break
            except (InvalidInput, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.errors.labels(f"fetch:{type(exc).__name__}").inc()
                log.info("MoE slice not served: %s", exc, extra={"inference_id": iid, "duty": str(key)})
                await asyncio.sleep(min(0.2 * 2**attempt, 5.0))
        if piece is None:
            return MoeReason.DUTY_DATA_UNAVAILABLE
        try:
            return await asyncio.to_thread(self._check, piece)
        except InvalidMoe as exc:  # committed data that cannot be checked (non-finite rows, …) is the operator's
            return exc.moe_reason

    def _check(self, piece: DutySlice) -> MoeReason:
        """Check one slice, loading its duty's tensors first if this validator did not preload them (blocking)."""
        if not self.checker.holds(piece.key):
            self.checker.load(piece.key)
        return self.checker.check_slice(piece)

    async def _fetch(self, session: aiohttp.ClientSession, url: str, key: ExpertKey, moe_root: bytes,
                     commitment: bytes) -> DutySlice:
        """Return the slice at `url` once it opens `moe_root` (and, for the link, the hub's commitment)."""
        async with session.get(url) as response:
            if response.status != 200:
                raise ValueError(f"http {response.status}")
            raw = await read_capped(response, compute_max_slice_size(self.shape, key))
        piece = await asyncio.to_thread(decode_duty_slice, bytes(raw), key, moe_root, self.shape)
        if key.expert == SHARED:  # the link walks these tokens: they must be the committed output
            bound = keccak256(compute_output_hash(piece.output_ids) + piece.artifact_root +
                              compute_moe_fingerprint_hash(piece.fingerprint_hash, moe_root))
            if bound != commitment:
                raise InvalidMoe("the link slice's tokens are not the committed output", MoeReason.MOE_MALFORMED)
        return piece

    # ---- signing ----------------------------------------------------------------------------------

    def _sign_and_submit(self, records: list[ExpertVerdictRecord]) -> bool:
        """Record each decision (synced), sign them, send them in one journaled transaction and confirm it."""
        stored = [self.store.record_expert_verdict(r) for r in records]  # before any signature exists
        chain_id = self.hub.chain_id()
        votes = [sign_expert_vote(self.account, chain_id, self.module.address, s.inference_id, s.duty,
                                  bytes.fromhex(s.moe_root[2:]), s.valid, s.reason, bytes.fromhex(s.scores_digest[2:]))
                 for s in stored]
        iid = stored[0].inference_id
        fn = self.module.contract.functions.submitExpertVerdicts(iid, [v.as_tuple() for v in votes])
        try:
            entry = self.txm.send(fn, purpose=f"expert verdicts {iid}")
        except ContractReverted as exc:  # the module's own errors (NotAssignedTo, DutyNotAssigned) by name
            raise decode_module_revert(exc) from exc
        self.txm.confirm(entry["nonce"])
        for s in stored:
            self.decided.labels("valid" if s.valid else "invalid").inc()
            self.done.append((iid, str(parse_duty_key(s.duty)), s.reason))
        log.info("expert verdicts submitted", extra={"inference_id": iid, "duties": len(stored),
                                                     "invalid": sum(not s.valid for s in stored)})
        return True

    def _record_job(self, kind: str, done: str, key: int, value: dict[str, Any]) -> bool:
        """Record a durable job unless it is pending or ended already; return whether it is new."""
        if self.store.get_record(kind, key) is not None or self.store.get_record(done, key) is not None:
            return False
        self.store.put_record(kind, key, value)
        return True

    def _end_job(self, kind: str, done: str, key: int, outcome: dict[str, Any]) -> None:
        """Record how a job ended (synced), then drop it from the pending ones."""
        self.store.put_record(done, key, {**outcome, "at": int(time.time())})
        self.store.delete_record(kind, key)

    def _finish(self, job: DutyJob, why: str) -> None:
        self._end_job(JOB, DONE, job.key, {"why": why})
        self._attempts.pop(job.key, None)


def _learn_key(inference_id: int) -> int:
    """Return a learn job's store key (apart from every other job's)."""
    return int.from_bytes(keccak256(b"learn" + inference_id.to_bytes(32, "big")), "big")


def _open_key(inference_id: int) -> int:
    """Return an open job's store key (apart from every duty job's)."""
    return int.from_bytes(keccak256(b"open" + inference_id.to_bytes(32, "big")), "big")


def compute_shape(config: dict[str, Any]) -> MoeShape:
    """Return an MoE model's shape from its config.json."""
    return MoeShape(int(config["num_hidden_layers"]), int(config["num_local_experts"]),
                    int(config["num_experts_per_tok"]), int(config["hidden_size"]))


__all__ = ["DutyJob", "MoeDutyService", "compute_shape"]
