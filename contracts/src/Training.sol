// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {StakeQuorum, IValidatorSet} from "./StakeQuorum.sol";

/// @title Training runs: a bonded prover anchors its ledger heads, randomness after each anchor draws audits,
///        validators' EIP-712 verdicts settle them, and a failed or missed audit forfeits the run's bond.
/// @dev The ledger head h(t) chains every earlier step, so one anchor every m steps commits them all.
///      Audits of an anchor's steps are drawn from blockhash(anchorBlock + 1): fixed only after the anchor.
///      The weight positions I(t) named in window w derive from `beacon(runId, w)`: the hash of the block after
///      the previous anchor (after the registration for w = 0), so the prover learns them only then.
///      A verdict needs a supermajority of the hub's validator weight at the anchor block (StakeQuorum: stake
///      bonded later cannot join, one validator cannot slash); a missed deadline is a verdict too (reason
///      LATE_RESPONSE, 712), voted by the validators who saw it.
///      A validator may also request an audit of an undrawn step (`requestAudit`, when its trajectory checks
///      raise the run's rate): the step is then due like a drawn one and settled by the same supermajority.
contract Training is EIP712, ReentrancyGuard, StakeQuorum {
    uint256 public constant WAD = 1e18;
    /// @notice The protocol's lowest audit rate p (0.1): a run registered below it is refused (`AuditRateTooLow`).
    ///         The prover registers its own run, so without a floor it would declare 1e-18 and never be drawn;
    ///         with p ≥ 0.1 a cheat in c steps escapes the draw with probability ≤ 0.9^c. The run's own declared
    ///         rate (its spec, committed by procedureHash) must equal the registered one: auditors refuse a run
    ///         whose registration differs from its spec (node/training/service.py).
    uint64 public constant MIN_AUDIT_RATE_WAD = 0.1e18;
    uint16 public constant LATE_RESPONSE = 712;
    bytes32 public constant VERDICT_TYPEHASH =
        keccak256("AuditVerdict(bytes32 runId,uint64 step,bytes32 anchorHead,bool valid,uint16 reason)");

    struct Run {
        address prover;
        uint96 bond;
        bytes32 dataRoot;
        bytes32 procedureHash; // optimiser, schedule, batch layout (node/training/spec.py)
        uint64 auditRateWad;
        uint64 lastStep; // last anchored step
        uint32 anchorEvery; // m
        uint32 anchors;
        uint32 finishedBlock; // 0 while running
        uint8 initStrategy;
        bool slashed;
        uint64 registeredBlock;
    }

    struct Anchor {
        uint64 firstStep;
        uint64 lastStep;
        uint64 blockNumber;
        bytes32 head;
        bytes32 beacon; // the randomness the window's named positions I(t) derive from
    }

    struct Vote {
        bool valid;
        uint16 reason;
        bytes signature;
    }

    address public immutable treasury;
    uint256 public immutable minBond;
    uint256 public immutable verdictWindow; // blocks after an anchor's draw block in which its verdicts settle
    /// @notice Requested audits per anchor and per validator (`requestAudit`): each validator has its own quota, so
    ///         one (colluding) validator cannot use up the requests of the others. A deployment constant, not a run
    ///         parameter: the prover registers its own runs and would declare 0. It bounds what validators can make
    ///         any prover serve: ≤ min(window steps, maxRequests × the validators weighted at the anchor)
    ///         responses per window (each two states Z(t−1), Z(t)), which an honest prover budgets for when it bonds.
    uint256 public immutable maxRequests;
    uint8 public constant INIT_STRATEGIES = 1; // 0: normal(0, 0.02) matrices, unit norms

    mapping(bytes32 => Run) public runs;
    mapping(bytes32 => mapping(uint256 => Anchor)) public anchors; // run → anchor index → anchor
    mapping(bytes32 => bool) public nonceUsed; // keccak256(abi.encode(prover, nonce)) → used
    /// @notice 0 unsettled, 1 passed, 2 failed — per run and step
    mapping(bytes32 => mapping(uint64 => uint8)) public auditResult;
    mapping(address => uint256) public credits;
    /// @notice A beacon fixed before its window is anchored (`fixBeacon`), so a long window outlives blockhash's 256 blocks.
    mapping(bytes32 => bytes32) public pendingBeacon;
    /// @notice The block a validator requested the audit of a step in (0: not requested) — per run and step.
    mapping(bytes32 => mapping(uint64 => uint64)) public requestedAt;
    /// @notice Requests made on an anchor's window — per run, anchor index and requesting validator (≤ maxRequests).
    mapping(bytes32 => mapping(uint256 => mapping(address => uint256))) public requestCount;

    event RunRegistered(bytes32 indexed runId, address indexed prover, uint256 bond, uint64 auditRateWad);
    event Anchored(bytes32 indexed runId, uint256 indexed index, uint64 firstStep, uint64 lastStep, bytes32 head);
    event AuditSettled(bytes32 indexed runId, uint64 indexed step, bool valid, uint16 reason, uint256 weight);
    event RunSlashed(bytes32 indexed runId, uint64 step, uint16 reason, uint256 amount);
    event RunFinished(bytes32 indexed runId, uint64 lastStep);
    event BondReturned(bytes32 indexed runId, uint256 amount);
    event BeaconFixed(bytes32 indexed runId, uint256 indexed index, bytes32 beacon);
    event AuditRequested(bytes32 indexed runId, uint256 indexed index, uint64 step, address indexed requester);

    error BondTooLow(uint256 bond, uint256 minimum);
    error RunExists(bytes32 runId);
    error NonceReplayed(bytes32 nonce);
    error BadParams();
    error NotProver(address who);
    error NotRunning(bytes32 runId);
    error BadWindow(uint64 firstStep, uint64 lastStep);
    error DrawNotReady(uint256 readyAt);
    error DrawExpired(uint256 expiredAt);
    error NotAudited(bytes32 runId, uint64 step);
    error AlreadySettled(bytes32 runId, uint64 step);
    error TooEarly(uint256 readyAt);
    error NothingToClaim();
    error AlreadyDue(bytes32 runId, uint64 step);
    error RequestsExhausted(uint256 index, uint256 maximum);
    error PastRequestHorizon(uint256 index, uint256 anchors);
    error AuditRateTooLow(uint64 auditRateWad, uint64 minimum);

    constructor(
        IValidatorSet hub_,
        address treasury_,
        uint256 minBond_,
        uint256 minSigners_,
        uint256 verdictWindow_,
        uint256 maxRequests_,
        uint256 weightDelay_
    ) EIP712("verinfer-training", "1") StakeQuorum(hub_, minSigners_, weightDelay_) {
        if (verdictWindow_ == 0 || verdictWindow_ > 250 || treasury_ == address(0)) revert BadParams();
        treasury = treasury_;
        minBond = minBond_;
        verdictWindow = verdictWindow_;
        maxRequests = maxRequests_;
    }

    /// @notice The id of a run: it binds the prover, so no one can take another prover's run id (issue 31, finding 6).
    function runIdOf(address prover, bytes32 specHash) public pure returns (bytes32) {
        return keccak256(abi.encode(prover, specHash));
    }

    /// @notice Register the sender's run of `specHash` with its bond; its id is `runIdOf(sender, specHash)`. `nonce` is
    ///         the verifier's fresh LSH nonce: one run per nonce and prover (a nonce seen in the mempool cannot be
    ///         burnt by someone else's registration).
    function registerRun(
        bytes32 specHash,
        bytes32 nonce,
        bytes32 dataRoot,
        bytes32 procedureHash,
        uint8 initStrategy,
        uint64 auditRateWad,
        uint32 anchorEvery
    ) external payable returns (bytes32 runId) {
        if (msg.value < minBond) revert BondTooLow(msg.value, minBond);
        if (msg.value > type(uint96).max) revert BadParams();
        runId = runIdOf(msg.sender, specHash);
        if (runs[runId].prover != address(0)) revert RunExists(runId);
        bytes32 nonceKey = keccak256(abi.encode(msg.sender, nonce));
        if (nonceUsed[nonceKey]) revert NonceReplayed(nonce);
        if (initStrategy >= INIT_STRATEGIES || auditRateWad > WAD || anchorEvery == 0) revert BadParams();
        if (auditRateWad < MIN_AUDIT_RATE_WAD) revert AuditRateTooLow(auditRateWad, MIN_AUDIT_RATE_WAD);
        nonceUsed[nonceKey] = true;
        runs[runId] = Run({
            prover: msg.sender,
            bond: uint96(msg.value),
            dataRoot: dataRoot,
            procedureHash: procedureHash,
            auditRateWad: auditRateWad,
            lastStep: 0,
            anchorEvery: anchorEvery,
            anchors: 0,
            finishedBlock: 0,
            initStrategy: initStrategy,
            slashed: false,
            registeredBlock: uint64(block.number)
        });
        emit RunRegistered(runId, msg.sender, msg.value, auditRateWad);
    }

    /// @notice Anchor the ledger head after `lastStep`: the first anchor covers steps 0..m (step 0 is the
    ///         initialisation), each later one the next m steps; a last, shorter window is allowed once.
    function anchor(bytes32 runId, uint64 lastStep, bytes32 head) external {
        Run storage r = _running(runId);
        if (msg.sender != r.prover) revert NotProver(msg.sender);
        uint64 first = r.anchors == 0 ? 0 : r.lastStep + 1;
        uint64 full = r.anchors == 0 ? r.anchorEvery : r.lastStep + r.anchorEvery;
        if (lastStep < first || lastStep > full) revert BadWindow(first, lastStep);
        uint256 index = r.anchors;
        bytes32 b = beacon(runId, index);
        delete pendingBeacon[runId];
        anchors[runId][index] =
            Anchor({firstStep: first, lastStep: lastStep, blockNumber: uint64(block.number), head: head, beacon: b});
        r.anchors = uint32(index + 1);
        r.lastStep = lastStep;
        if (lastStep < full) r.finishedBlock = uint32(block.number); // a short window ends the run
        emit Anchored(runId, index, first, lastStep, head);
        if (r.finishedBlock != 0) emit RunFinished(runId, lastStep);
    }

    /// @notice End a run whose last window was full.
    function finish(bytes32 runId) external {
        Run storage r = _running(runId);
        if (msg.sender != r.prover) revert NotProver(msg.sender);
        r.finishedBlock = uint32(block.number);
        emit RunFinished(runId, r.lastStep);
    }

    /// @notice The randomness of window `index`'s named positions: stored once anchored (or fixed); for the next
    ///         window, the hash of the block after the previous anchor (after the registration for window 0).
    function beacon(bytes32 runId, uint256 index) public view returns (bytes32) {
        Run storage r = runs[runId];
        if (r.prover == address(0) || index > r.anchors) revert BadWindow(0, 0);
        if (index < r.anchors) return anchors[runId][index].beacon;
        bytes32 pending = pendingBeacon[runId];
        if (pending != bytes32(0)) return pending;
        uint256 source = (index == 0 ? uint256(r.registeredBlock) : uint256(anchors[runId][index - 1].blockNumber)) + 1;
        if (block.number <= source) revert DrawNotReady(source + 1);
        if (block.number > source + 256) revert DrawExpired(source + 256);
        return blockhash(source);
    }

    /// @notice Store the next window's beacon while its block hash is readable (anyone may; the prover does
    ///         when a window may take longer than 256 blocks).
    function fixBeacon(bytes32 runId) external {
        Run storage r = _running(runId);
        bytes32 b = beacon(runId, r.anchors);
        pendingBeacon[runId] = b;
        emit BeaconFixed(runId, r.anchors, b);
    }

    /// @notice The randomness of an anchor's audits: the hash of the block after it (known only then).
    function auditSeed(bytes32 runId, uint256 index) public view returns (bytes32) {
        Anchor storage a = anchors[runId][index];
        if (a.blockNumber == 0) revert BadWindow(0, 0);
        uint256 source = uint256(a.blockNumber) + 1;
        if (block.number <= source) revert DrawNotReady(source + 1);
        if (block.number > source + 256) revert DrawExpired(source + 256);
        return blockhash(source);
    }

    /// @notice Whether step `step` of anchor `index` is audited: keccak256(seed ‖ runId ‖ uint256 step) mod 1e18 < p.
    function isAudited(bytes32 runId, uint256 index, uint64 step) public view returns (bool) {
        Anchor storage a = anchors[runId][index];
        if (step < a.firstStep || step > a.lastStep) return false;
        bytes32 draw = keccak256(abi.encodePacked(auditSeed(runId, index), runId, uint256(step)));
        // Accepted weak-prng: a block hash fixed after the anchor, as the inference committee's seed.
        // slither-disable-next-line weak-prng
        return uint256(draw) % WAD < runs[runId].auditRateWad;
    }

    /// @notice Request the audit of an undrawn step of anchor `index`'s window (a validator's raised rate).
    /// @dev Who: a hub validator with weight at the anchor's block − 1, the weights its votes count with — stake
    ///      bonded after the anchor cannot request. A request makes nobody a judge: the step is then due like a
    ///      drawn one (`isAuditDue`) and settles only on the same supermajority of votes, so an honest prover who
    ///      serves it loses nothing; one who does not is voted LATE_RESPONSE as for a drawn audit.
    ///      When: once the anchor's draw is ready (a drawn step cannot be requested, nor a step twice), and only
    ///      while `index` is the run's newest anchor and the run neither finished nor slashed. The prover reads
    ///      a window's requests once it has anchored the next window (they are final then: later ones revert)
    ///      and serves them before training on; its rolling buffer of K = 2m states
    ///      (spec.py `compute_keep_checkpoints`) still holds Z(e−m), the oldest state the window ending at e
    ///      needs, exactly until then. A request after the next anchor could not be served from K = 2m, and
    ///      a finished run's prover has stopped: both revert (PastRequestHorizon / NotRunning). The last window
    ///      is therefore covered by its draw only.
    ///      How many: at most `maxRequests` per anchor for each validator (RequestsExhausted beyond): a validator
    ///      cannot spend another's quota, so one colluder exhausting its own on honest steps leaves every other
    ///      validator free to request the forged one.
    ///      Its verdict window counts from the request block; it closes before the bond can be withdrawn
    ///      (a request precedes the run's end, and withdrawal waits verdictWindow + 2 blocks after it).
    function requestAudit(bytes32 runId, uint256 index, uint64 step) external {
        Run storage r = _running(runId);
        if (index + 1 != r.anchors) revert PastRequestHorizon(index, r.anchors);
        Anchor storage a = anchors[runId][index];
        if (settledWeightAt(msg.sender, uint256(a.blockNumber) - 1) == 0) revert NotAValidator(msg.sender);
        if (step < a.firstStep || step > a.lastStep) revert BadWindow(a.firstStep, a.lastStep);
        if (requestedAt[runId][step] != 0 || isAudited(runId, index, step)) revert AlreadyDue(runId, step);
        uint256 n = requestCount[runId][index][msg.sender];
        if (n >= maxRequests) revert RequestsExhausted(index, maxRequests);
        requestCount[runId][index][msg.sender] = n + 1;
        requestedAt[runId][step] = uint64(block.number);
        emit AuditRequested(runId, index, step, msg.sender);
    }

    /// @notice Whether step `step` of anchor `index` must be audited: drawn (`isAudited`) or requested.
    function isAuditDue(bytes32 runId, uint256 index, uint64 step) public view returns (bool) {
        Anchor storage a = anchors[runId][index];
        if (step < a.firstStep || step > a.lastStep) return false;
        return requestedAt[runId][step] != 0 || isAudited(runId, index, step);
    }

    /// @notice The last block in which votes on a due step settle: verdictWindow blocks after its anchor's draw
    ///         block, or after its request block for a requested step.
    function verdictDeadline(bytes32 runId, uint256 index, uint64 step) public view returns (uint256) {
        uint64 requested = requestedAt[runId][step];
        if (requested != 0) return uint256(requested) + verdictWindow;
        return uint256(anchors[runId][index].blockNumber) + 1 + verdictWindow;
    }

    /// @notice The EIP-712 digest a validator signs for an audit verdict.
    function verdictDigest(bytes32 runId, uint64 step, bytes32 anchorHead, bool valid, uint16 reason)
        public
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(keccak256(abi.encode(VERDICT_TYPEHASH, runId, step, anchorHead, valid, reason)));
    }

    /// @notice Count validators' signed votes on a due step, drawn or requested (anyone may relay them; a vote
    ///         counted already is skipped). Weights are the hub's at the end of the block before the anchor; a supermajority
    ///         settles the audit, and an invalid result forfeits the whole bond.
    function submitVotes(bytes32 runId, uint256 index, uint64 step, Vote[] calldata votes) external nonReentrant {
        Anchor storage a = anchors[runId][index];
        if (!isAuditDue(runId, index, step)) revert NotAudited(runId, step);
        uint256 deadline = verdictDeadline(runId, index, step);
        if (block.number > deadline) revert DrawExpired(deadline);
        if (auditResult[runId][step] != 0) revert AlreadySettled(runId, step);
        bytes32 key = _auditKey(runId, step);
        uint8 result;
        for (uint256 v; v < votes.length; ++v) {
            Vote calldata vote = votes[v];
            bytes32 digest = verdictDigest(runId, step, a.head, vote.valid, vote.reason);
            result = _countVote(key, digest, vote.valid, vote.reason, vote.signature, uint256(a.blockNumber) - 1);
            if (result != 0) {
                _settle(runId, step, key, vote.reason, result == 1);
                return;
            }
        }
    }

    /// @notice Whether `validator`'s vote on the audit of `step` is counted.
    function hasVoted(bytes32 runId, uint64 step, address validator) external view returns (bool) {
        return isCounted(_auditKey(runId, step), validator);
    }

    function _auditKey(bytes32 runId, uint64 step) private pure returns (bytes32) {
        return keccak256(abi.encode(runId, step));
    }

    function _settle(bytes32 runId, uint64 step, bytes32 key, uint16 reason, bool valid) private {
        Run storage r = runs[runId];
        auditResult[runId][step] = valid ? 1 : 2;
        Tally storage t = tallies[key];
        emit AuditSettled(runId, step, valid, reason, valid ? t.validWeight : t.invalidWeight);
        if (!valid && !r.slashed) {
            uint256 amount = r.bond;
            r.slashed = true;
            r.bond = 0;
            credits[treasury] += amount;
            emit RunSlashed(runId, step, reason, amount);
        }
    }

    /// @notice Return a finished, unslashed run's bond once every anchor's verdict window has passed.
    function withdrawBond(bytes32 runId) external nonReentrant {
        Run storage r = runs[runId];
        if (msg.sender != r.prover) revert NotProver(msg.sender);
        if (r.finishedBlock == 0) revert NotRunning(runId);
        uint256 readyAt = uint256(r.finishedBlock) + 2 + verdictWindow;
        if (block.number <= readyAt) revert TooEarly(readyAt + 1);
        uint256 amount = r.bond;
        if (amount == 0) revert NothingToClaim();
        r.bond = 0;
        emit BondReturned(runId, amount);
        Address.sendValue(payable(msg.sender), amount);
    }

    /// @notice Withdraw credits (the treasury's forfeited bonds).
    function claim() external nonReentrant {
        uint256 amount = credits[msg.sender];
        if (amount == 0) revert NothingToClaim();
        credits[msg.sender] = 0;
        Address.sendValue(payable(msg.sender), amount);
    }

    function _running(bytes32 runId) private view returns (Run storage r) {
        r = runs[runId];
        if (r.prover == address(0) || r.finishedBlock != 0 || r.slashed) revert NotRunning(runId);
    }
}
