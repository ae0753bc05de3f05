// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";

/// @notice The validator weights of the verinfer hub (Staking.weightAt), read, never written.
interface IStakeWeights {
    function weightAt(address who, uint256 blockNumber) external view returns (uint256);
}

/// @title Training runs: a bonded prover anchors its ledger heads, randomness after each anchor draws audits,
///        validators' EIP-712 verdicts settle them, and a failed or missed audit forfeits the run's bond.
/// @dev The ledger head h(t) chains every earlier step, so one anchor every m steps commits them all.
///      Audits of an anchor's steps are drawn from blockhash(anchorBlock + 1): fixed only after the anchor.
///      A verdict counts the signers' hub weights at the anchor block (stake bonded later cannot join);
///      a missed deadline is a verdict too (reason LATE_RESPONSE, 712), signed by the validators who saw it.
contract Training is EIP712, ReentrancyGuard {
    uint256 public constant WAD = 1e18;
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
    }

    struct Anchor {
        uint64 firstStep;
        uint64 lastStep;
        uint64 blockNumber;
        bytes32 head;
    }

    IStakeWeights public immutable hub;
    address public immutable treasury;
    uint256 public immutable minBond;
    uint256 public immutable minVerdictWeight; // Σ signer weight a verdict needs
    uint256 public immutable verdictWindow; // blocks after an anchor's draw block in which its verdicts settle
    uint8 public constant INIT_STRATEGIES = 1; // 0: normal(0, 0.02) matrices, unit norms

    mapping(bytes32 => Run) public runs;
    mapping(bytes32 => mapping(uint256 => Anchor)) public anchors; // run → anchor index → anchor
    mapping(bytes32 => bool) public nonceUsed;
    /// @notice 0 unsettled, 1 passed, 2 failed — per run and step
    mapping(bytes32 => mapping(uint64 => uint8)) public auditResult;
    mapping(address => uint256) public credits;

    event RunRegistered(bytes32 indexed runId, address indexed prover, uint256 bond, uint64 auditRateWad);
    event Anchored(bytes32 indexed runId, uint256 indexed index, uint64 firstStep, uint64 lastStep, bytes32 head);
    event AuditSettled(bytes32 indexed runId, uint64 indexed step, bool valid, uint16 reason, uint256 weight);
    event RunSlashed(bytes32 indexed runId, uint64 step, uint16 reason, uint256 amount);
    event RunFinished(bytes32 indexed runId, uint64 lastStep);
    event BondReturned(bytes32 indexed runId, uint256 amount);

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
    error SignersNotSorted();
    error NotAValidator(address signer);
    error WeightTooLow(uint256 weight, uint256 minimum);
    error TooEarly(uint256 readyAt);
    error NothingToClaim();

    constructor(IStakeWeights hub_, address treasury_, uint256 minBond_, uint256 minVerdictWeight_, uint256 verdictWindow_)
        EIP712("verinfer-training", "1")
    {
        if (verdictWindow_ == 0 || verdictWindow_ > 250 || minVerdictWeight_ == 0 || treasury_ == address(0)) {
            revert BadParams();
        }
        hub = hub_;
        treasury = treasury_;
        minBond = minBond_;
        minVerdictWeight = minVerdictWeight_;
        verdictWindow = verdictWindow_;
    }

    /// @notice Register a run with its bond. `nonce` is the verifier's fresh LSH nonce: one run per nonce.
    function registerRun(
        bytes32 runId,
        bytes32 nonce,
        bytes32 dataRoot,
        bytes32 procedureHash,
        uint8 initStrategy,
        uint64 auditRateWad,
        uint32 anchorEvery
    ) external payable {
        if (msg.value < minBond) revert BondTooLow(msg.value, minBond);
        if (msg.value > type(uint96).max) revert BadParams();
        if (runs[runId].prover != address(0)) revert RunExists(runId);
        if (nonceUsed[nonce]) revert NonceReplayed(nonce);
        if (initStrategy >= INIT_STRATEGIES || auditRateWad == 0 || auditRateWad > WAD || anchorEvery == 0) {
            revert BadParams();
        }
        nonceUsed[nonce] = true;
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
            slashed: false
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
        anchors[runId][index] =
            Anchor({firstStep: first, lastStep: lastStep, blockNumber: uint64(block.number), head: head});
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

    /// @notice The EIP-712 digest a validator signs for an audit verdict.
    function verdictDigest(bytes32 runId, uint64 step, bytes32 anchorHead, bool valid, uint16 reason)
        public
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(keccak256(abi.encode(VERDICT_TYPEHASH, runId, step, anchorHead, valid, reason)));
    }

    /// @notice Settle an audited step with validators' signatures (ascending signer addresses, no repeats).
    ///         Weights are the hub's at the anchor block. An invalid verdict forfeits the whole bond.
    function submitVerdict(
        bytes32 runId,
        uint256 index,
        uint64 step,
        bool valid,
        uint16 reason,
        bytes[] calldata signatures
    ) external nonReentrant {
        Run storage r = runs[runId];
        Anchor storage a = anchors[runId][index];
        if (!isAudited(runId, index, step)) revert NotAudited(runId, step);
        if (block.number > uint256(a.blockNumber) + 1 + verdictWindow) revert DrawExpired(a.blockNumber + 1 + verdictWindow);
        if (auditResult[runId][step] != 0) revert AlreadySettled(runId, step);
        uint256 weight = _countWeight(verdictDigest(runId, step, a.head, valid, reason), signatures, a.blockNumber);
        if (weight < minVerdictWeight) revert WeightTooLow(weight, minVerdictWeight);
        auditResult[runId][step] = valid ? 1 : 2;
        emit AuditSettled(runId, step, valid, reason, weight);
        if (!valid && !r.slashed) {
            uint256 amount = r.bond;
            r.slashed = true;
            r.bond = 0;
            credits[treasury] += amount;
            emit RunSlashed(runId, step, reason, amount);
        }
    }

    function _countWeight(bytes32 digest, bytes[] calldata signatures, uint64 atBlock) private view returns (uint256 total) {
        address last = address(0); // signers strictly ascending: no signature counts twice
        for (uint256 i; i < signatures.length; ++i) {
            address signer = ECDSA.recover(digest, signatures[i]);
            if (signer <= last) revert SignersNotSorted();
            last = signer;
            uint256 w = hub.weightAt(signer, atBlock - 1); // as the hub: weights at the end of the block before
            if (w == 0) revert NotAValidator(signer);
            total += w;
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
