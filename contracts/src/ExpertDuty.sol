// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";
import {IValidatorSet, SettledWeight} from "./StakeQuorum.sol";
import {Verinfer} from "./Verinfer.sol";

/// @title Expert duties of a checked MoE inference (docs/moe.md): every duty an inference used is judged by its own
///        committee, drawn stake-weighted from every validator whose stake was settled before the commit.
/// @notice The operator binds its MoE commitment into the hub's: the fingerprint hash it commits is
///         keccak256(fingerprintHash ‖ moeRoot), moeRoot = keccak256(routerRoot ‖ expertsRoot) over one summary
///         leaf per expert (node/protocol/moe.py). Anyone opens it here (`assignDuties`) with the per-expert
///         counts and roots; the duties are every expert with a leaf, every layer's router and the link. Each
///         gets `perDuty` distinct validators drawn from ALL validators with settled weight at the commit (no one
///         chooses the duties it judges: declared holdings are an operational hint and narrow nothing), and a
///         majority of them settles it. The module slashes no one: a settled duty is evidence for the hub
///         committee, whose members re-judge a failed duty themselves and vote at the hub, where a quorum of the
///         committee settles the inference and the hub's own rule slashes (never one judge, never one duty's
///         judges alone). Draws are lazy: the open verifies the opening, fixes the randomness and stores which
///         duties are used (one bit each); a duty's draw is a view (`assignedTo`) and is stored by its first
///         counted verdict, so the open costs O(experts) hashing and one storage word per 256 duties.
/// @dev Everything a draw reads is fixed at the commit: settled weights at b = commitBlock - 1, i.e.
///      min(hub.weightAt(v, b - weightDelay), hub.weightAt(v, b)) (0 for b < weightDelay): stake bonded or added
///      within `weightDelay` blocks of the commit counts for nothing; randomness from the hub's selection seed (the
///      block after the commit). Draw j of duty (L, e): keccak256(randomness ‖ uint16 L ‖ uint16 e ‖ uint32 j) mod
///      the remaining settled weight over the eligible validators in ascending address order, without replacement
///      (node.protocol.moe.compute_expert_assignment, pinned by a golden vector). Fewer than `perDuty` eligible
///      validators: every duty would be uncovered, so the open reverts (`Uncoverable`) and the inference carries
///      no duty verdict at all, never a smaller committee.
contract ExpertDuty is EIP712 {
    uint16 public constant ROUTER = 0xFFFF; // a layer's router duty
    uint16 public constant SHARED = 0xFFFE; // the link duty (layer 0): shared layers, routers, head
    uint256 public constant MAX_VALIDATORS = 64; // Staking.MAX_VALIDATORS: an assignment is a slot bitmap
    bytes32 public constant VERDICT_TYPEHASH = keccak256(
        "ExpertVerdict(uint256 inferenceId,uint32 duty,bytes32 moeRoot,bool valid,uint16 reason,bytes32 scoresDigest)"
    );

    struct Shape {
        uint16 layers;
        uint16 experts;
    }

    /// @notice What the operator committed besides the hub's three roots: the router root and, per expert of the
    ///         model in order (layer-major), its leaf count and expert root.
    struct MoeOpening {
        bytes32 outputHash;
        bytes32 artifactRoot;
        bytes32 fingerprintHash; // the dense fingerprint hash, before moeRoot is bound in
        bytes32 routerRoot;
        uint32[] counts;
        bytes32[] expertRoots;
    }

    struct Opened {
        bytes32 moeRoot;
        bytes32 modelId;
        uint32 commitBlock;
        uint16 duties;
        uint16 failed; // duties settled failed: evidence for the hub committee, which re-judges them
    }

    struct Duty {
        uint64 assigned; // hub validator slots
        uint64 validVotes;
        uint64 invalidVotes;
        uint8 result; // 0 open, 1 passed, 2 failed
    }

    struct ExpertVote {
        uint32 duty;
        bool valid;
        uint16 reason;
        bytes32 scoresDigest;
        bytes signature;
    }

    /// @dev One validator eligible at the commit, as the draw sees it.
    struct Judge {
        address who;
        uint256 weight; // settled weight
        uint256 slot;
    }

    Verinfer public immutable hub;
    uint256 public immutable perDuty;
    /// @notice Blocks a validator's stake must have stood before the commit to count in a draw (>= 1).
    uint256 public immutable weightDelay;

    mapping(bytes32 => Shape) public shapes;
    mapping(uint256 => Opened) public opened;
    mapping(uint256 => mapping(uint32 => Duty)) public duties;
    /// @dev inference → used duties, one bit per duty bit (`dutyBit`)
    mapping(uint256 => uint256[]) internal drawable;
    /// @dev inference → the draws' randomness, fixed at the open (the hub's seed is readable 256 blocks only)
    mapping(uint256 => bytes32) internal randomnessOf;

    event ModelShapeSet(bytes32 indexed modelId, uint256 layers, uint256 experts);
    event HoldingsDeclared(bytes32 indexed modelId, address indexed validator, bool wholeModel, uint32[] keys);
    event DutiesAssigned(uint256 indexed inferenceId, bytes32 moeRoot, uint256 duties, uint256 eligible);
    event ExpertVerdictRecorded(
        uint256 indexed inferenceId, uint32 indexed duty, address indexed validator, bool valid, uint16 reason
    );
    event ExpertVoteSkipped(uint256 indexed inferenceId, uint32 indexed duty, address indexed validator);
    event DutySettled(uint256 indexed inferenceId, uint32 indexed duty, bool valid, uint16 reason);

    error BadParams();
    error NotGovernor(address who);
    error ShapeExists(bytes32 modelId);
    error UnknownShape(bytes32 modelId);
    error BadDuty(uint32 duty);
    error BadOpening();
    error CommitmentMismatch();
    error NotChecked(uint256 inferenceId);
    error AlreadyAssigned(uint256 inferenceId);
    error Uncoverable(uint256 inferenceId, uint256 eligible);
    error NotAssigned(uint256 inferenceId);
    error CheckWindowOver(uint256 endedAt);
    error DutyNotAssigned(uint256 inferenceId, uint32 duty);
    error NotAssignedTo(uint32 duty, address signer);

    constructor(Verinfer hub_, uint256 perDuty_, uint256 weightDelay_) EIP712("verinfer-experts", "1") {
        // never one judge (docs/security.md rule 9): a duty settles by a majority (perDuty / 2 + 1 >= 2) of its drawn judges
        if (address(hub_) == address(0) || perDuty_ < 2 || perDuty_ > 16 || weightDelay_ == 0) revert BadParams();
        hub = hub_;
        perDuty = perDuty_;
        weightDelay = weightDelay_;
    }

    // ---- models and holdings --------------------------------------------------------------------

    /// @notice Set an MoE model's shape (the hub's governors; once: duty bitmaps are over it).
    function setShape(bytes32 modelId, uint16 layers, uint16 experts) external {
        if (!hub.hasRole(hub.GOVERNOR_ROLE(), msg.sender)) revert NotGovernor(msg.sender);
        if (shapes[modelId].layers != 0) revert ShapeExists(modelId);
        if (layers == 0 || experts < 2 || experts >= SHARED) revert BadParams();
        shapes[modelId] = Shape(layers, experts);
        emit ModelShapeSet(modelId, layers, experts);
    }

    /// @notice The duty key of expert `expert` of layer `layer` (ROUTER: the layer's router; SHARED, layer 0: link).
    function dutyKey(uint16 layer, uint16 expert) public pure returns (uint32) {
        return (uint32(layer) << 16) | expert;
    }

    /// @notice A duty's bit in a duty bitmap: experts layer-major, then one router per layer, then the link.
    function dutyBit(bytes32 modelId, uint32 duty) public view returns (uint256) {
        Shape memory s = _shape(modelId);
        uint256 layer = duty >> 16;
        uint256 expert = duty & 0xFFFF;
        if (expert == SHARED && layer == 0) return uint256(s.layers) * (uint256(s.experts) + 1);
        if (layer >= s.layers) revert BadDuty(duty);
        if (expert == ROUTER) return uint256(s.layers) * s.experts + layer;
        if (expert >= s.experts) revert BadDuty(duty);
        return layer * s.experts + expert;
    }

    /// @notice Announce the duties the sender keeps loaded (an operational hint for peers, stored nowhere): draws
    ///         never read it, so declaring or not declaring an expert changes who judges it in no way.
    function declareHoldings(bytes32 modelId, bool wholeModel, uint32[] calldata keys) external {
        _shape(modelId);
        for (uint256 k; k < keys.length; ++k) {
            dutyBit(modelId, keys[k]); // canonical keys only
        }
        emit HoldingsDeclared(modelId, msg.sender, wholeModel, keys);
    }

    /// @notice `who`'s weight at the end of block `blockNumber` as far as it already stood `weightDelay` blocks
    ///         before: min(weightAt(b - weightDelay), weightAt(b)); 0 for b < weightDelay.
    function settledWeightAt(address who, uint256 blockNumber) public view returns (uint256) {
        return SettledWeight.at(IValidatorSet(address(hub)), who, blockNumber, weightDelay);
    }

    // ---- assignment -----------------------------------------------------------------------------

    /// @notice Open a checked inference's MoE commitment and fix the draws of every duty it needs (anyone may, once,
    ///         in the check window; fewer than `perDuty` eligible validators: `Uncoverable`).
    function assignDuties(uint256 id, MoeOpening calldata o) external {
        if (opened[id].commitBlock != 0) revert AlreadyAssigned(id);
        Verinfer.Inference memory inf = hub.getInference(id);
        Shape memory s = _shape(inf.modelId);
        uint256 nexperts = uint256(s.layers) * s.experts;
        if (o.counts.length != nexperts || o.expertRoots.length != nexperts) revert BadOpening();
        bytes32 moeRoot = keccak256(abi.encodePacked(o.routerRoot, computeExpertsRoot(s, o.counts, o.expertRoots)));
        bytes32 fpHash = keccak256(abi.encodePacked(o.fingerprintHash, moeRoot));
        if (inf.commitBlock == 0 || keccak256(abi.encode(o.outputHash, o.artifactRoot, fpHash)) != inf.commitment) {
            revert CommitmentMismatch();
        }
        _requireWindow(inf.commitBlock);
        // the committee it returns is the hub's dense check; only whether the inference is checked matters here
        // slither-disable-next-line unused-return
        (bool checked,) = hub.selectionOf(id);
        if (!checked) revert NotChecked(id);
        uint256 eligible = _judgesAt(uint256(inf.commitBlock) - 1).length;
        if (eligible < perDuty) revert Uncoverable(id, eligible);
        uint256 nbits = nexperts + s.layers + 1;
        uint256[] memory bits = new uint256[]((nbits + 255) / 256);
        uint256 total = 0;
        for (uint256 k; k < nbits; ++k) {
            if (k < nexperts && o.counts[k] == 0) continue; // never routed: nothing to judge
            ++total;
            bits[k >> 8] |= 1 << (k & 0xFF);
        }
        drawable[id] = bits;
        randomnessOf[id] = keccak256(abi.encodePacked(hub.selectionSeed(id), "experts"));
        opened[id] = Opened({
            moeRoot: moeRoot, modelId: inf.modelId, commitBlock: inf.commitBlock, duties: uint16(total), failed: 0
        });
        emit DutiesAssigned(id, moeRoot, total, eligible);
    }

    /// @notice The duties of an opened inference (every used one is drawn), in duty-bit order.
    function drawableDuties(uint256 id) external view returns (uint32[] memory out) {
        Opened storage op = opened[id];
        if (op.commitBlock == 0) return out;
        Shape memory s = _shape(op.modelId);
        uint256[] storage bits = drawable[id];
        uint256 nbits = uint256(s.layers) * (uint256(s.experts) + 1) + 1;
        uint32[] memory all = new uint32[](nbits);
        uint256 n = 0;
        for (uint256 k; k < nbits; ++k) {
            if (bits[k >> 8] & (1 << (k & 0xFF)) != 0) all[n++] = _dutyOfBit(s, k);
        }
        out = new uint32[](n);
        for (uint256 i; i < n; ++i) {
            out[i] = all[i];
        }
    }

    /// @notice expertsRoot over one summary leaf `uint16 L ‖ uint16 e ‖ uint32 count ‖ bytes32 root` per expert.
    function computeExpertsRoot(Shape memory s, uint32[] calldata counts, bytes32[] calldata roots)
        public
        pure
        returns (bytes32)
    {
        uint256 n = counts.length;
        if (n == 0) return bytes32(0);
        bytes32[] memory layer = new bytes32[](n);
        for (uint256 k; k < n; ++k) {
            bytes memory leaf =
                abi.encodePacked(uint16(k / s.experts), uint16(k % s.experts), counts[k], roots[k]);
            layer[k] = keccak256(bytes.concat(keccak256(leaf)));
        }
        while (n > 1) {
            uint256 half = n / 2;
            for (uint256 i; i < half; ++i) {
                (bytes32 a, bytes32 b) = (layer[2 * i], layer[2 * i + 1]);
                layer[i] = a <= b ? keccak256(abi.encodePacked(a, b)) : keccak256(abi.encodePacked(b, a));
            }
            if (n % 2 == 1) layer[half] = layer[n - 1]; // an odd last node is carried up
            n = half + n % 2;
        }
        return layer[0];
    }

    /// @dev The duty key of duty bit `k` (the inverse of `dutyBit`).
    function _dutyOfBit(Shape memory s, uint256 k) private pure returns (uint32) {
        uint256 nexperts = uint256(s.layers) * s.experts;
        if (k < nexperts) return dutyKey(uint16(k / s.experts), uint16(k % s.experts));
        return k < nexperts + s.layers ? dutyKey(uint16(k - nexperts), ROUTER) : dutyKey(0, SHARED);
    }

    /// @dev The slot bitmap of the `perDuty` judges drawn for one duty from every eligible validator.
    function _draw(uint32 duty, bytes32 randomness, Judge[] memory judges) private view returns (uint64 assigned) {
        uint256 n = judges.length;
        bool[] memory taken = new bool[](n);
        uint256 remaining = 0;
        for (uint256 i; i < n; ++i) {
            remaining += judges[i].weight;
        }
        for (uint256 j; j < perDuty; ++j) {
            // randomness from the block after the commit, as the hub's committee (documented on the hub)
            // slither-disable-next-line weak-prng
            uint256 u = uint256(keccak256(abi.encodePacked(randomness, uint32(duty), uint32(j)))) % remaining;
            uint256 i;
            while (taken[i] || u >= judges[i].weight) {
                if (!taken[i]) u -= judges[i].weight;
                ++i;
            }
            taken[i] = true;
            remaining -= judges[i].weight;
            assigned |= uint64(1) << uint64(judges[i].slot);
        }
    }

    /// @dev A duty's assigned slots: stored by its first counted verdict, else drawn now (0: not a used duty).
    function _assigned(uint256 id, Opened storage op, uint32 duty, Judge[] memory judges)
        private
        view
        returns (uint64)
    {
        uint64 stored = duties[id][duty].assigned;
        if (stored != 0) return stored;
        uint256 bit = dutyBit(op.modelId, duty);
        uint256[] storage bits = drawable[id];
        if (bits.length == 0 || bits[bit >> 8] & (1 << (bit & 0xFF)) == 0) return 0;
        return _draw(duty, randomnessOf[id], judges);
    }

    /// @dev The validators with settled weight at the end of `atBlock`, in ascending address order.
    function _judgesAt(uint256 atBlock) private view returns (Judge[] memory out) {
        uint256 n = hub.validatorCount();
        Judge[] memory all = new Judge[](n);
        uint256 m = 0;
        for (uint256 i; i < n; ++i) {
            address who = hub.validators(i);
            uint256 w = settledWeightAt(who, atBlock);
            if (w == 0) continue;
            uint256 at = m++;
            while (at > 0 && all[at - 1].who > who) {
                all[at] = all[at - 1];
                --at;
            }
            all[at] = Judge(who, w, i);
        }
        out = new Judge[](m);
        for (uint256 i; i < m; ++i) {
            out[i] = all[i];
        }
    }

    // ---- verdicts -------------------------------------------------------------------------------

    /// @notice The EIP-712 digest an assigned validator signs for its verdict on one duty.
    function verdictDigest(uint256 id, uint32 duty, bytes32 moeRoot, bool valid, uint16 reason, bytes32 scoresDigest)
        public
        view
        returns (bytes32)
    {
        return _hashTypedDataV4(
            keccak256(abi.encode(VERDICT_TYPEHASH, id, duty, moeRoot, valid, reason, scoresDigest))
        );
    }

    /// @notice Count assigned validators' signed verdicts (anyone may relay; counted ones and votes on settled duties
    ///         are skipped). A majority of a duty's assigned validators settles it; nobody is slashed here: a failed
    ///         duty is evidence the hub committee re-judges before its quorum verdict at the hub.
    function submitExpertVerdicts(uint256 id, ExpertVote[] calldata votes) external {
        Opened storage op = opened[id];
        if (op.commitBlock == 0) revert NotAssigned(id);
        _requireWindow(op.commitBlock);
        _storeDraws(id, op, votes); // every draw this call needs, read once from the stake at the commit
        for (uint256 v; v < votes.length; ++v) {
            ExpertVote calldata vote = votes[v];
            Duty storage d = duties[id][vote.duty];
            bytes32 digest =
                verdictDigest(id, vote.duty, op.moeRoot, vote.valid, vote.reason, vote.scoresDigest);
            address signer = ECDSA.recover(digest, vote.signature); // rejects high-s and malformed signatures
            uint64 bit = _assignedBit(d.assigned, vote.duty, signer);
            if (d.result != 0 || (d.validVotes | d.invalidVotes) & bit != 0) {
                emit ExpertVoteSkipped(id, vote.duty, signer);
                continue;
            }
            emit ExpertVerdictRecorded(id, vote.duty, signer, vote.valid, vote.reason);
            _count(id, op, d, vote, bit);
        }
    }

    /// @dev Store the draw of every voted duty not drawn yet (the stake snapshot at the commit read once).
    function _storeDraws(uint256 id, Opened storage op, ExpertVote[] calldata votes) private {
        Judge[] memory judges = new Judge[](0);
        bool loaded = false;
        for (uint256 v; v < votes.length; ++v) {
            Duty storage d = duties[id][votes[v].duty];
            if (d.assigned != 0) continue;
            if (!loaded) {
                judges = _judgesAt(uint256(op.commitBlock) - 1);
                loaded = true;
            }
            uint64 drawn = _assigned(id, op, votes[v].duty, judges);
            if (drawn == 0) revert DutyNotAssigned(id, votes[v].duty);
            d.assigned = drawn; // the draw, stored once: later votes and views read it
        }
    }

    /// @dev Count one assigned judge's vote; a majority of the duty's distinct judges settles it.
    function _count(uint256 id, Opened storage op, Duty storage d, ExpertVote calldata vote, uint64 bit) private {
        uint256 quorum = perDuty / 2 + 1;
        if (vote.valid) {
            d.validVotes |= bit;
            if (_popcount(d.validVotes) >= quorum) d.result = 1;
        } else {
            d.invalidVotes |= bit;
            if (_popcount(d.invalidVotes) >= quorum) d.result = 2;
        }
        if (d.result == 0) return;
        if (d.result == 2) ++op.failed;
        emit DutySettled(id, vote.duty, d.result == 1, vote.reason);
    }

    /// @dev The signer's slot bit among a duty's assigned validators; reverts if it is not one of them.
    function _assignedBit(uint64 assigned, uint32 duty, address signer) private view returns (uint64) {
        for (uint256 i; assigned >> i != 0; ++i) {
            if ((assigned >> i) & 1 != 0 && hub.validators(i) == signer) return uint64(1) << uint64(i);
        }
        revert NotAssignedTo(duty, signer);
    }

    /// @notice The drawable duties of an inference whose draw includes `who` (one call for a validator's duties).
    function dutiesOf(uint256 id, address who) external view returns (uint32[] memory out) {
        Opened storage op = opened[id];
        if (op.commitBlock == 0) return out;
        Shape memory s = _shape(op.modelId);
        Judge[] memory judges = _judgesAt(uint256(op.commitBlock) - 1);
        uint256 slot = type(uint256).max;
        for (uint256 i; i < judges.length; ++i) {
            if (judges[i].who == who) slot = judges[i].slot;
        }
        if (slot == type(uint256).max) return out; // no settled weight at the commit: drawn for nothing
        uint256 nbits = uint256(s.layers) * (uint256(s.experts) + 1) + 1;
        uint32[] memory all = new uint32[](nbits);
        uint256 n = 0;
        for (uint256 k; k < nbits; ++k) {
            uint32 duty = _dutyOfBit(s, k);
            if ((_assigned(id, op, duty, judges) >> slot) & 1 != 0) all[n++] = duty;
        }
        out = new uint32[](n);
        for (uint256 i; i < n; ++i) {
            out[i] = all[i];
        }
    }

    /// @notice A duty's assigned validators (hub addresses), in slot order (none: not a drawable duty).
    function assignedTo(uint256 id, uint32 duty) external view returns (address[] memory out) {
        Opened storage op = opened[id];
        if (op.commitBlock == 0) return out;
        uint64 assigned = duties[id][duty].assigned;
        if (assigned == 0) assigned = _assigned(id, op, duty, _judgesAt(uint256(op.commitBlock) - 1));
        out = new address[](_popcount(assigned));
        uint256 j = 0;
        for (uint256 i; assigned >> i != 0; ++i) {
            if ((assigned >> i) & 1 != 0) out[j++] = hub.validators(i);
        }
    }

    function _requireWindow(uint256 commitBlock) private view {
        uint256 endsAt = commitBlock + hub.checkWindow();
        if (block.number > endsAt) revert CheckWindowOver(endsAt);
    }

    function _shape(bytes32 modelId) private view returns (Shape memory s) {
        s = shapes[modelId];
        if (s.layers == 0) revert UnknownShape(modelId);
    }

    function _popcount(uint64 x) private pure returns (uint256 n) {
        for (; x != 0; x &= x - 1) {
            ++n;
        }
    }
}
