// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {Protocol} from "./Protocol.sol";
import {ProtocolViews} from "./ProtocolViews.sol";
import {Staking} from "./Staking.sol";
import {ModelRegistry} from "./ModelRegistry.sol";

/// @title verinfer: inference commitments, committee verdicts, Bayesian reputation, slashing, fraud proofs
/// @notice One inference's life (docs/protocol.md §10): request → commit → selection (fixed by a block hash
///         that did not exist at commit time) → EIP-712 verdicts from the committee until a quorum
///         decides, or the check window ends → fees. A stage-1 forgery can be proven by anyone from
///         one Merkle leaf until the fraud window ends.
/// @dev Randomness: blockhash(commitBlock + 1) mixed with the id. The operator cannot know it when
///      committing, but the proposer of that block can withhold it (one re-roll at the cost of a
///      block reward), and it is readable for 256 blocks only (checkWindow is capped below that).
///      A VRF or beacon output (e.g. drand, RANDAO of a later epoch via EIP-4788) would replace
///      `selectionSeed` without touching the rest.
contract Verinfer is Staking, ModelRegistry, EIP712 {
    enum Status {
        None,
        Requested,
        Committed,
        Valid,
        Invalid,
        Unchecked,
        Expired,
        Fraud,
        Uncheckable // fewer than minCommittee validators were eligible at the commit: fee and bond refunded
    }

    struct Inference {
        address requester; // slot 0
        uint64 userSeed;
        uint32 commitDeadline;
        address operator; // slot 1
        uint96 fee;
        bytes32 modelId; // slot 2
        bytes32 commitment; // slot 3: Protocol.computeCommitment(outputHash, artifactRoot, fingerprintHash)
        uint32 commitBlock; // slot 4
        Status status;
        uint8 validVotes;
        uint8 invalidVotes;
        uint64 voted; // bit = validator index
        uint64 votedInvalid;
        uint96 bond; // slot 5: the requester's bond, returned at settlement or expiry
        uint64 checkRate; // 1e18: max(minCheckRate, P) as it stood at the commit (0: model not measured then)
        uint32 maxTokens; // the request's max_tokens, for the termination rule
        bool accepted; // the operator acknowledged receiving the prompt: only then does a timeout cost it stake
    }

    struct Params {
        uint32 temperatureBits;
        uint32 topPBits;
        uint32 topK;
        uint32 maxTokens;
    }

    struct Commitment {
        bytes32 outputHash;
        bytes32 artifactRoot;
        bytes32 fingerprintHash;
    }

    /// @notice One committee member's signed verdict (the signed fields besides id and root).
    struct Vote {
        bool valid;
        uint16 reason;
        bytes32 scoresDigest;
        uint64 deadline;
        bytes signature;
    }

    struct Config {
        uint256 minOperatorStake;
        uint256 minValidatorStake;
        uint256 unbondingDelay; // blocks
        address treasury;
        uint32 commitWindow; // blocks after the request
        uint32 checkWindow; // blocks after the commit for verdicts (< 255)
        uint32 fraudWindow; // blocks after the commit for fraud proofs
        uint8 committeeSize; // stake-weighted draws (distinct members form the committee)
        uint64 slashThreshold; // 1e18
        uint16 slashBps; // of stake, at the threshold (punitive models only)
        uint16 slashValidatorShareBps; // of the slashed amount, to the validators who voted invalid
        uint16 fraudSlashBps; // of stake, on a proven forgery
        uint16 proverRewardBps; // of the slashed amount, to the prover
        uint16 validatorFeeBps; // of the fee, to the committee
        uint16 timeoutSlashBps; // of stake, to the requester, when an accepted request was never committed
        uint96 requestBond; // wei a requester locks per request besides the fee; caps the timeout penalty
        uint8 minCommittee; // fewer eligible validators at the commit: the inference is not checkable
    }

    bytes32 public constant VERDICT_TYPEHASH = keccak256(
        "Verdict(uint256 inferenceId,bytes32 artifactRoot,bool valid,uint16 reason,bytes32 scoresDigest,uint64 deadline)"
    );
    uint256 public constant MAX_COMMITTEE = 16;

    uint32 public immutable commitWindow;
    uint32 public immutable checkWindow;
    uint32 public immutable fraudWindow;
    uint8 public immutable committeeSize;
    uint64 public immutable slashThreshold;
    uint16 public immutable slashBps;
    uint16 public immutable slashValidatorShareBps;
    uint16 public immutable fraudSlashBps;
    uint16 public immutable proverRewardBps;
    uint16 public immutable validatorFeeBps;
    uint16 public immutable timeoutSlashBps;
    uint96 public immutable requestBond;
    uint8 public immutable minCommittee;
    /// @notice The protocol's leaf, Merkle and header code, deployed by the constructor (keeps the hub under
    ///         EIP-170's size limit; the same code clients and cross-language tests call).
    ProtocolViews public immutable protocolViews;

    uint256 public nextInferenceId;
    mapping(uint256 => Inference) internal inferences;
    /// @notice Fees held for inferences not yet settled.
    uint256 public totalEscrow;

    event InferenceRequested(
        uint256 indexed inferenceId,
        address indexed requester,
        address indexed operator,
        bytes32 modelId,
        bytes32 promptHash,
        uint64 userSeed,
        Params params,
        uint256 fee,
        uint256 bond
    );
    event InferenceAccepted(uint256 indexed inferenceId, address indexed operator);
    event InferenceCommitted(
        uint256 indexed inferenceId,
        address indexed operator,
        bytes32 outputHash,
        bytes32 artifactRoot,
        bytes32 fingerprintHash
    );
    event VerdictRecorded(
        uint256 indexed inferenceId, address indexed validator, bool valid, uint16 reason, bytes32 scoresDigest
    );
    /// @notice A vote in a batch that was not counted: already recorded (1) or past its deadline (2).
    event VoteSkipped(uint256 indexed inferenceId, address indexed validator, uint8 why);
    event InferenceSettled(uint256 indexed inferenceId, Status status, uint256 spoofP);
    event InferenceExpired(uint256 indexed inferenceId, uint256 penalty);
    event FraudProven(uint256 indexed inferenceId, address indexed prover, uint32 position, uint16 reason);

    error BadConfig();
    error NotOperator(address who);
    error OperatorUnavailable(address operator);
    error ModelInactive(bytes32 modelId);
    error FeeTooLarge();
    error FeeTooLow(uint256 paid, uint256 minimum);
    error AlreadyAccepted(uint256 inferenceId);
    error BadHeader(uint256 length);
    error LeafRequired();
    error WrongStatus(uint256 inferenceId, Status status);
    error CommitTooLate(uint256 deadline);
    error CommitNotExpired(uint256 deadline);
    error ZeroCommitment();
    error CommitmentMismatch();
    error SelectionNotReady(uint256 readyAt);
    error CheckWindowOver(uint256 endedAt);
    error CheckWindowOpen(uint256 endsAt);
    error FraudWindowOver(uint256 endedAt);
    error NotChecked(uint256 inferenceId);
    error NoVotes();
    error VerdictExpired(uint64 deadline);
    error NotInCommittee(address signer);
    error AlreadyVoted(address signer);
    error ArtifactRootMismatch();
    error NotFraud(uint256 position);

    constructor(Config memory c)
        Staking(c.minOperatorStake, c.minValidatorStake, c.unbondingDelay, c.treasury)
        EIP712("verinfer", "1")
    {
        if (
            c.treasury == address(0) || c.commitWindow == 0 || c.checkWindow == 0 || c.checkWindow >= 255
                || c.fraudWindow < c.checkWindow || c.committeeSize == 0 || c.committeeSize > MAX_COMMITTEE
                || c.unbondingDelay <= uint256(c.commitWindow) + c.fraudWindow + 1 || c.slashThreshold > 1e18
                || c.slashBps > 10_000 || c.slashValidatorShareBps > 10_000 || c.fraudSlashBps > 10_000
                || c.proverRewardBps > 10_000 || c.validatorFeeBps > 10_000 || c.timeoutSlashBps > 10_000
                || c.minCommittee == 0 || c.minCommittee > c.committeeSize
        ) revert BadConfig();
        commitWindow = c.commitWindow;
        checkWindow = c.checkWindow;
        fraudWindow = c.fraudWindow;
        committeeSize = c.committeeSize;
        slashThreshold = c.slashThreshold;
        slashBps = c.slashBps;
        slashValidatorShareBps = c.slashValidatorShareBps;
        fraudSlashBps = c.fraudSlashBps;
        proverRewardBps = c.proverRewardBps;
        validatorFeeBps = c.validatorFeeBps;
        timeoutSlashBps = c.timeoutSlashBps;
        requestBond = c.requestBond;
        minCommittee = c.minCommittee;
        protocolViews = new ProtocolViews();
        _grantRole(DEFAULT_ADMIN_ROLE, msg.sender);
        _grantRole(GOVERNOR_ROLE, msg.sender);
    }

    // ---- requests and commitments ---------------------------------------------------------------

    /// @notice Ask `operator` to run `modelId` on the prompt behind `promptHash`; msg.value is the fee plus
    ///         `requestBond` (the bond comes back at settlement or expiry).
    function requestInference(address operator, bytes32 modelId, bytes32 promptHash, uint64 userSeed, Params calldata p)
        external
        payable
        returns (uint256 id)
    {
        Model storage m = models[modelId];
        if (m.state == ModelState.None) revert ModelInactive(modelId);
        Staker storage s = stakers[operator];
        if (s.role != Role.Operator || s.jailed || s.unbondBlock != 0 || s.stake < minOperatorStake) {
            revert OperatorUnavailable(operator);
        }
        uint256 deposit = requestBond;
        if (msg.value < deposit + m.minFee) revert FeeTooLow(msg.value, deposit + m.minFee);
        uint256 fee = msg.value - deposit;
        if (fee > type(uint96).max) revert FeeTooLarge();
        id = ++nextInferenceId;
        Inference storage inf = inferences[id];
        (inf.requester, inf.userSeed, inf.commitDeadline) = (msg.sender, userSeed, uint32(block.number + commitWindow));
        (inf.operator, inf.fee, inf.modelId, inf.status) = (operator, uint96(fee), modelId, Status.Requested);
        (inf.bond, inf.maxTokens) = (uint96(deposit), p.maxTokens);
        s.open += 1;
        totalEscrow += msg.value;
        _openCredits(msg.sender); // the bond comes back as a credit: the requester opens its slot, not a validator
        emit InferenceRequested(id, msg.sender, operator, modelId, promptHash, userSeed, p, fee, deposit);
    }

    /// @notice The operator acknowledges that it received the prompt: from now on a missed deadline costs it stake.
    function acceptInference(uint256 id) external {
        Inference storage inf = inferences[id];
        if (inf.status != Status.Requested) revert WrongStatus(id, inf.status);
        if (msg.sender != inf.operator) revert NotOperator(msg.sender);
        if (block.number > inf.commitDeadline) revert CommitTooLate(inf.commitDeadline);
        if (inf.accepted) revert AlreadyAccepted(id);
        inf.accepted = true;
        emit InferenceAccepted(id, msg.sender);
    }

    /// @notice The assigned operator commits the output, artifact root and fingerprint hash.
    function commitInference(uint256 id, bytes32 outputHash, bytes32 artifactRoot, bytes32 fingerprintHash) external {
        Inference storage inf = inferences[id];
        if (inf.status != Status.Requested) revert WrongStatus(id, inf.status);
        if (msg.sender != inf.operator) revert NotOperator(msg.sender);
        if (block.number > inf.commitDeadline) revert CommitTooLate(inf.commitDeadline);
        bytes32 commitment = Protocol.computeCommitment(outputHash, artifactRoot, fingerprintHash);
        if (commitment == 0) revert ZeroCommitment();
        (inf.commitment, inf.commitBlock, inf.status) = (commitment, uint32(block.number), Status.Committed);
        inf.checkRate = uint64(_checkRateNow(inf));
        emit InferenceCommitted(id, msg.sender, outputHash, artifactRoot, fingerprintHash);
    }

    /// @notice After a missed commit deadline: refund fee and bond; an operator that had accepted the request
    ///         also pays the requester `timeoutSlashBps` of its stake, never more than the requester's bond.
    function expire(uint256 id) external {
        Inference storage inf = inferences[id];
        if (inf.status != Status.Requested) revert WrongStatus(id, inf.status);
        if (block.number <= inf.commitDeadline) revert CommitNotExpired(inf.commitDeadline);
        inf.status = Status.Expired;
        stakers[inf.operator].open -= 1;
        uint256 refund = uint256(inf.fee) + inf.bond;
        totalEscrow -= refund;
        uint256 penalty = inf.accepted ? _slash(inf.operator, timeoutSlashBps, inf.bond, bytes32(id)) : 0;
        _credit(inf.requester, refund + penalty);
        emit InferenceExpired(id, penalty);
    }

    // ---- selection ------------------------------------------------------------------------------

    /// @notice The randomness that fixes whether an inference is checked and by whom.
    function selectionSeed(uint256 id) public view returns (bytes32) {
        Inference storage inf = inferences[id];
        if (inf.commitBlock == 0) revert WrongStatus(id, inf.status);
        uint256 source = uint256(inf.commitBlock) + 1;
        if (block.number <= source) revert SelectionNotReady(source + 1);
        if (block.number > source + 256) revert CheckWindowOver(source + 256);
        return keccak256(abi.encode(blockhash(source), id));
    }

    /// @notice Whether the inference is checked and its committee. Everything here is fixed at the commit:
    ///         the check rate max(minCheckRate, P) snapshotted then, the validators' weights as they stood at
    ///         the end of the block before it, and the seed from the block after it. Fewer than
    ///         `minCommittee` eligible validators then: not checkable (never a single judge by chance).
    function selectionOf(uint256 id) public view returns (bool checked, address[] memory committee) {
        Inference storage inf = inferences[id];
        bytes32 seed = selectionSeed(id);
        // Accepted slither weak-prng: the seed is a block hash fixed after the commit; its limits and
        // the VRF/beacon replacement are documented on the contract and in docs/contracts.md.
        // slither-disable-next-line weak-prng
        if (uint256(keccak256(abi.encode(seed, "check"))) % Protocol.WAD >= inf.checkRate) return (false, committee);
        uint256[] memory members = _drawCommittee(seed, inf.commitBlock);
        if (members.length < minCommittee) return (false, committee);
        committee = new address[](members.length);
        for (uint256 j; j < members.length; ++j) {
            committee[j] = validators[members[j]];
        }
        return (true, committee);
    }

    /// @dev The probability that an inference committed now is checked (0 while its model is not measured).
    function _checkRateNow(Inference storage inf) private view returns (uint256) {
        Model storage m = models[inf.modelId];
        if (m.state < ModelState.Measuring) return 0;
        return _max(m.minCheckRate, stakers[inf.operator].spoofP);
    }

    /// @dev Stake-weighted draws without replacement among the validators eligible at the end of block
    ///      commitBlock - 1: min(committeeSize, eligible) distinct indexes.
    function _drawCommittee(bytes32 seed, uint256 commitBlock) internal view returns (uint256[] memory members) {
        uint256 n = validators.length;
        uint256[] memory weight = new uint256[](n);
        uint256 total = 0;
        uint256 eligible = 0;
        for (uint256 i; i < n; ++i) {
            uint256 w = weightAt(validators[i], commitBlock - 1);
            if (w != 0) {
                weight[i] = w;
                total += w;
                ++eligible;
            }
        }
        uint256 size = eligible < committeeSize ? eligible : committeeSize;
        members = new uint256[](size);
        for (uint256 j; j < size; ++j) {
            // same seed as above: accepted, documented
            // slither-disable-next-line weak-prng
            uint256 r = uint256(keccak256(abi.encode(seed, j))) % total;
            uint256 i;
            while (r >= weight[i]) {
                r -= weight[i];
                ++i;
            }
            members[j] = i;
            total -= weight[i];
            weight[i] = 0;
        }
    }

    // ---- verdicts -------------------------------------------------------------------------------

    /// @notice EIP-712 digest a validator signs for a verdict (docs/protocol.md).
    function verdictDigest(
        uint256 id,
        bytes32 artifactRoot,
        bool valid,
        uint16 reason,
        bytes32 scoresDigest,
        uint64 deadline
    ) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(abi.encode(VERDICT_TYPEHASH, id, artifactRoot, valid, reason, scoresDigest, deadline))
        );
    }

    /// @notice Submit committee members' signed verdicts (anyone may); a quorum settles the inference.
    function submitVerdicts(uint256 id, Commitment calldata c, Vote[] calldata votes) external {
        Inference storage inf = inferences[id];
        if (inf.status != Status.Committed) revert WrongStatus(id, inf.status);
        if (Protocol.computeCommitment(c.outputHash, c.artifactRoot, c.fingerprintHash) != inf.commitment) {
            revert CommitmentMismatch();
        }
        if (block.number > uint256(inf.commitBlock) + checkWindow) revert CheckWindowOver(inf.commitBlock + checkWindow);
        if (votes.length == 0) revert NoVotes();
        (bool checked, address[] memory committee) = selectionOf(id);
        if (!checked) revert NotChecked(id);
        uint256 share = _voteShare(inf.fee);
        for (uint256 v; v < votes.length; ++v) {
            _recordVote(id, inf, c.artifactRoot, votes[v], committee, share);
        }
        // a batch whose every vote was skipped still succeeds: submission is idempotent
        uint256 quorum = committee.length / 2 + 1;
        if (inf.validVotes >= quorum) _settle(id, inf, true);
        else if (inf.invalidVotes >= quorum) _settle(id, inf, false);
    }

    function _recordVote(
        uint256 id,
        Inference storage inf,
        bytes32 artifactRoot,
        Vote calldata vote,
        address[] memory committee,
        uint256 share
    ) private {
        bytes32 digest = verdictDigest(id, artifactRoot, vote.valid, vote.reason, vote.scoresDigest, vote.deadline);
        address signer = ECDSA.recover(digest, vote.signature); // rejects high-s and malformed signatures
        uint256 index = _committeeIndex(committee, signer);
        uint64 bit = uint64(1) << uint64(index);
        if (inf.voted & bit != 0) {
            emit VoteSkipped(id, signer, 1); // recorded already (e.g. someone submitted the gossiped vote first)
            return;
        }
        if (vote.deadline < block.timestamp) {
            emit VoteSkipped(id, signer, 2);
            return;
        }
        inf.voted |= bit;
        if (vote.valid) {
            inf.validVotes += 1;
        } else {
            inf.invalidVotes += 1;
            inf.votedInvalid |= bit;
        }
        totalEscrow -= share;
        _credit(signer, share);
        emit VerdictRecorded(id, signer, vote.valid, vote.reason, vote.scoresDigest);
    }

    function _committeeIndex(address[] memory committee, address signer) private view returns (uint256) {
        for (uint256 j; j < committee.length; ++j) {
            if (committee[j] == signer) return validatorSlot[signer] - 1;
        }
        revert NotInCommittee(signer);
    }

    /// @notice Whether `validator`'s vote on an inference is recorded.
    function hasVoted(uint256 id, address validator) external view returns (bool) {
        uint256 slot = validatorSlot[validator];
        return slot != 0 && inferences[id].voted & (uint64(1) << uint64(slot - 1)) != 0;
    }

    /// @notice Settle an inference whose check window ended without a quorum (or that was not checked). One
    ///         that could never have had a full committee (fewer than minCommittee validators eligible at the
    ///         commit, while its model is checked) is neither paid as checked nor paid unjudged: the requester
    ///         gets fee and bond back (Uncheckable).
    function finalize(uint256 id) external {
        Inference storage inf = inferences[id];
        if (inf.status != Status.Committed) revert WrongStatus(id, inf.status);
        uint256 endsAt = uint256(inf.commitBlock) + checkWindow;
        if (block.number <= endsAt) revert CheckWindowOpen(endsAt);
        bool uncheckable = inf.checkRate != 0 && eligibleCountAt(uint256(inf.commitBlock) - 1) < minCommittee;
        inf.status = uncheckable ? Status.Uncheckable : Status.Unchecked;
        _pay(inf, uncheckable ? inf.requester : inf.operator);
        emit InferenceSettled(id, inf.status, stakers[inf.operator].spoofP);
    }

    function _settle(uint256 id, Inference storage inf, bool valid) private {
        inf.status = valid ? Status.Valid : Status.Invalid;
        Model storage m = models[inf.modelId];
        Staker storage op = stakers[inf.operator];
        if (m.state >= ModelState.Verifying) {
            uint256 p = Protocol.computePosterior(op.spoofP, m.alpha, m.beta, valid);
            op.spoofP = uint64(p);
            if (!valid && m.state == ModelState.Punitive && p >= slashThreshold && !op.jailed) {
                uint256 amount = _slash(inf.operator, slashBps, type(uint256).max, bytes32(id));
                _splitSlash(amount, inf.votedInvalid, inf.invalidVotes);
                _jail(inf.operator);
            }
        }
        _pay(inf, valid ? inf.operator : inf.requester);
        emit InferenceSettled(id, inf.status, op.spoofP);
    }

    /// @dev Release the escrowed fee: validator shares already paid per vote, the rest to `to`, unpaid shares too;
    ///      the bond back to the requester.
    function _pay(Inference storage inf, address to) private {
        uint256 fee = inf.fee;
        uint256 paid = _voteShare(fee) * (inf.validVotes + inf.invalidVotes);
        stakers[inf.operator].open -= 1;
        totalEscrow -= fee - paid + inf.bond;
        _credit(to, fee - paid);
        _credit(inf.requester, inf.bond);
    }

    /// @dev One committee member's fee share, paid per vote; rounding remainders go to whoever gets the fee.
    function _voteShare(uint256 fee) private view returns (uint256) {
        return fee * validatorFeeBps / 10_000 / committeeSize;
    }

    /// @dev Equal shares to the invalid voters; the treasury gets the rest, rounding remainder included.
    function _splitSlash(uint256 amount, uint64 voters, uint256 count) private {
        uint256 each = count == 0 ? 0 : amount * slashValidatorShareBps / 10_000 / count;
        for (uint256 i; voters != 0; ++i) {
            if (voters & 1 != 0) _credit(validators[i], each);
            voters >>= 1;
        }
        // intended rounding, each * count <= the validators' share:
        // slither-disable-next-line divide-before-multiply
        _credit(treasury, amount - each * count);
    }

    // ---- fraud proofs ---------------------------------------------------------------------------

    /// @notice Prove that one committed artifact leaf breaks the stage-1 rule for its position.
    function proveFraud(
        uint256 id,
        Commitment calldata c,
        bytes32 headerHash,
        bytes calldata leaf,
        bytes32[] calldata proof
    ) external nonReentrant {
        Inference storage inf = inferences[id];
        Status status = _requireProvable(id, inf, c);
        (uint32 position, uint16 reason) = _findForgery(id, inf, c.artifactRoot, headerHash, leaf, proof);
        _convict(id, inf, status, position, reason);
    }

    /// @notice Prove that a committed output breaks the termination rule (docs/security.md rule 3): shorter than
    ///         max_tokens without ending on a stop token (the empty output too), longer than max_tokens, or
    ///         going on after a stop token. With `leaf` empty it is a header-level proof over `positionsRoot`;
    ///         otherwise `leaf` is the committed leaf of the position it names, with its Merkle proof.
    function proveTermination(
        uint256 id,
        Commitment calldata c,
        bytes calldata header,
        bytes32 positionsRoot,
        bytes calldata leaf,
        bytes32[] calldata proof
    ) external nonReentrant {
        Inference storage inf = inferences[id];
        Status status = _requireProvable(id, inf, c);
        if (leaf.length != 0) positionsRoot = protocolViews.computePositionsRoot(leaf, proof);
        if (Protocol.computeArtifactRoot(keccak256(header), positionsRoot) != c.artifactRoot) {
            revert ArtifactRootMismatch();
        }
        uint256 outputLength = protocolViews.decodeHeaderOutputLength(header);
        uint32 position = 0;
        uint16 reason;
        if (leaf.length == 0) {
            reason = Protocol.findLengthViolation(outputLength, inf.maxTokens);
        } else {
            Model storage m = models[inf.modelId];
            if (leaf.length != Protocol.LEAF_HEAD + uint256(m.k) * Protocol.CANDIDATE_SIZE) {
                revert Protocol.LeafLength(leaf.length, m.k);
            }
            position = Protocol.decodeLeafPosition(leaf);
            bool isStop = isStopToken(inf.modelId, Protocol.decodeLeafChosen(leaf));
            reason = Protocol.findTerminationViolation(position, isStop, outputLength, inf.maxTokens);
        }
        if (reason == Protocol.OK) revert NotFraud(position);
        _convict(id, inf, status, position, reason);
    }

    /// @dev The inference's status if a fraud proof may still be made against this commitment; reverts otherwise.
    function _requireProvable(uint256 id, Inference storage inf, Commitment calldata c) private view returns (Status) {
        Status status = inf.status;
        if (status < Status.Committed || status == Status.Expired || status == Status.Fraud) {
            revert WrongStatus(id, status);
        }
        if (block.number > uint256(inf.commitBlock) + fraudWindow) revert FraudWindowOver(inf.commitBlock + fraudWindow);
        if (Protocol.computeCommitment(c.outputHash, c.artifactRoot, c.fingerprintHash) != inf.commitment) {
            revert CommitmentMismatch();
        }
        return status;
    }

    /// @dev A proven forgery: the requester gets its fee back (if not settled yet), the operator is slashed and jailed,
    ///      and so is every committee member whose recorded verdict called the artifact valid: stage 1 is exact and
    ///      checks every position, so a validator that ran it never signs valid over a provable forgery. A verdict
    ///      copied from gossip instead of checked carries that liability (docs/security.md, judges accountable).
    function _convict(uint256 id, Inference storage inf, Status status, uint32 position, uint16 reason) private {
        inf.status = Status.Fraud;
        if (status == Status.Committed) _pay(inf, inf.requester);
        _punishForgery(id, inf.operator);
        uint64 contradicted = inf.voted & ~inf.votedInvalid;
        for (uint256 i; contradicted != 0; ++i) {
            if (contradicted & 1 != 0) _punishForgery(id, validators[i]);
            contradicted >>= 1;
        }
        emit FraudProven(id, msg.sender, position, reason);
    }

    /// @dev The leaf's position and the stage-1 rule it breaks; reverts if it is not in the artifact or breaks none.
    function _findForgery(
        uint256 id,
        Inference storage inf,
        bytes32 artifactRoot,
        bytes32 headerHash,
        bytes calldata leaf,
        bytes32[] calldata proof
    ) private view returns (uint32 position, uint16 reason) {
        Model storage m = models[inf.modelId];
        bool inArtifact;
        // the arithmetic runs in ProtocolViews (the same library code): the hub's runtime stays under EIP-170
        (inArtifact, position, reason) =
            protocolViews.findForgery(artifactRoot, headerHash, leaf, proof, m.k, m.vocabSize, inf.userSeed, id);
        if (!inArtifact) revert ArtifactRootMismatch();
        if (reason == Protocol.OK) revert NotFraud(position);
    }

    /// @dev Slash `who` by fraudSlashBps (the prover's reward, the rest to the treasury), P = P_MAX, jail.
    function _punishForgery(uint256 id, address who) private {
        uint256 amount = _slash(who, fraudSlashBps, type(uint256).max, bytes32(id));
        uint256 reward = amount * proverRewardBps / 10_000;
        _credit(msg.sender, reward);
        _credit(treasury, amount - reward);
        stakers[who].spoofP = uint64(Protocol.P_MAX);
        _jail(who);
    }

    // ---- modules ---------------------------------------------------------------------------------

    /// @notice A module beside the hub (spot-check windows) punishes an operator its validator supermajority
    ///         found failing: the hub's slash (slashBps) to the treasury, P = P_MAX, jailed. Modules are granted
    ///         MODULE_ROLE by the admin.
    function slashForModule(address operator, bytes32 cause) external onlyRole(MODULE_ROLE) returns (uint256 amount) {
        if (stakers[operator].role != Role.Operator) revert NotOperator(operator);
        amount = _slash(operator, slashBps, type(uint256).max, cause);
        _credit(treasury, amount);
        stakers[operator].spoofP = uint64(Protocol.P_MAX);
        _jail(operator);
    }

    /// @notice An inference's stored record.
    /// @dev Decoded by ProtocolViews from the record's six storage words and returned as its ABI bytes unchanged:
    ///      the compiler's own encoder for this 17-field struct cost 850 bytes of the hub's EIP-170 budget.
    function getInference(uint256 id) external view returns (Inference memory) {
        Inference storage inf = inferences[id];
        bytes32[6] memory words;
        assembly ("memory-safe") {
            let slot := inf.slot
            for { let i := 0 } lt(i, 6) { i := add(i, 1) } { mstore(add(words, mul(i, 32)), sload(add(slot, i))) }
        }
        bytes memory input = abi.encodeCall(ProtocolViews.decodeInference, (words));
        address views = address(protocolViews);
        assembly {
            let ok := staticcall(gas(), views, add(input, 32), mload(input), 0, 0)
            returndatacopy(0, 0, returndatasize())
            if iszero(ok) { revert(0, returndatasize()) }
            return(0, returndatasize())
        }
    }

    function _prior() internal pure override returns (uint256) {
        return Protocol.PRIOR;
    }

    function _max(uint256 a, uint256 b) private pure returns (uint256) {
        return a > b ? a : b;
    }
}
