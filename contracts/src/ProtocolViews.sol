// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {Protocol} from "./Protocol.sol";

/// @title The chain's protocol functions as views, for cross-language tests and clients
/// @notice A separate stateless contract (the hub itself must stay under EIP-170's 24,576 bytes); it runs the
///         very library code the hub's fraud proofs run.
contract ProtocolViews {
    /// @notice The hub's `Verinfer.Inference`, field for field (`status` is the `Verinfer.Status` enum as uint8).
    struct InferenceRecord {
        address requester;
        uint64 userSeed;
        uint32 commitDeadline;
        address operator;
        uint96 fee;
        bytes32 modelId;
        bytes32 commitment;
        uint32 commitBlock;
        uint8 status;
        uint8 validVotes;
        uint8 invalidVotes;
        uint64 voted;
        uint64 votedInvalid;
        uint96 bond;
        uint64 checkRate;
        uint32 maxTokens;
        bool accepted;
    }

    /// @notice Decode an inference record from its six storage words (Solidity's packing: the first member of a slot
    ///         in its lowest-order bytes; the layout is Verinfer.Inference's, slot by slot).
    function decodeInference(bytes32[6] calldata w) external pure returns (InferenceRecord memory r) {
        uint256 s0 = uint256(w[0]);
        uint256 s1 = uint256(w[1]);
        uint256 s4 = uint256(w[4]);
        uint256 s5 = uint256(w[5]);
        r.requester = address(uint160(s0));
        r.userSeed = uint64(s0 >> 160);
        r.commitDeadline = uint32(s0 >> 224);
        r.operator = address(uint160(s1));
        r.fee = uint96(s1 >> 160);
        r.modelId = w[2];
        r.commitment = w[3];
        r.commitBlock = uint32(s4);
        r.status = uint8(s4 >> 32);
        r.validVotes = uint8(s4 >> 40);
        r.invalidVotes = uint8(s4 >> 48);
        r.voted = uint64(s4 >> 56);
        r.votedInvalid = uint64(s4 >> 120);
        r.bond = uint96(s5);
        r.checkRate = uint64(s5 >> 96);
        r.maxTokens = uint32(s5 >> 160);
        r.accepted = uint8(s5 >> 192) != 0;
    }

    /// @notice run_seed for a user seed and inference id.
    function computeRunSeed(uint64 userSeed, uint256 id) external pure returns (bytes32) {
        return Protocol.computeRunSeed(userSeed, id);
    }

    /// @notice v_i for a run seed and position.
    function computeSamplerUniform(bytes32 runSeed, uint32 i) external pure returns (uint256) {
        return Protocol.computeSamplerUniform(runSeed, i);
    }

    /// @notice The Bayes update of the spoofer probability.
    function computePosterior(uint256 p, uint256 alpha, uint256 beta, bool valid) external pure returns (uint256) {
        return Protocol.computePosterior(p, alpha, beta, valid);
    }

    /// @notice The stage-1 rule for one leaf.
    function findPositionViolation(bytes calldata leaf, uint256 k, uint256 v, uint256 vocabSize)
        external
        pure
        returns (uint16)
    {
        return Protocol.findPositionViolation(leaf, k, v, vocabSize);
    }

    /// @notice The termination rule for one leaf (docs/security.md rule 3), as proveTermination applies it.
    function findTerminationViolation(uint256 position, bool chosenIsStop, uint256 outputLength, uint256 maxTokens)
        external
        pure
        returns (uint16)
    {
        return Protocol.findTerminationViolation(position, chosenIsStop, outputLength, maxTokens);
    }

    /// @notice The length part of the termination rule (empty or over-long output).
    function findLengthViolation(uint256 outputLength, uint256 maxTokens) external pure returns (uint16) {
        return Protocol.findLengthViolation(outputLength, maxTokens);
    }

    /// @notice The output length of an encoded artifact header.
    function decodeHeaderOutputLength(bytes calldata header) external pure returns (uint256) {
        return Protocol.decodeHeaderOutputLength(header);
    }

    /// @notice The hub's fraud-proof arithmetic (it runs here to keep the hub's runtime under EIP-170): whether the
    ///         leaf and proof rebuild `artifactRoot` with `headerHash`, the leaf's position, and the stage-1 rule it
    ///         breaks for the inference's v_i (Protocol.OK: none).
    function findForgery(
        bytes32 artifactRoot,
        bytes32 headerHash,
        bytes calldata leaf,
        bytes32[] calldata proof,
        uint256 k,
        uint256 vocabSize,
        uint64 userSeed,
        uint256 id
    ) external pure returns (bool inArtifact, uint32 position, uint16 reason) {
        bytes32 positionsRoot = MerkleProof.processProofCalldata(proof, Protocol.computeLeafHash(leaf));
        if (Protocol.computeArtifactRoot(headerHash, positionsRoot) != artifactRoot) return (false, 0, 0);
        position = Protocol.decodeLeafPosition(leaf);
        uint256 v = Protocol.computeSamplerUniform(Protocol.computeRunSeed(userSeed, id), position);
        return (true, position, Protocol.findPositionViolation(leaf, k, v, vocabSize));
    }

    /// @notice A positions root from a leaf and its proof, as the fraud proof computes it.
    function computePositionsRoot(bytes calldata leaf, bytes32[] calldata proof) external pure returns (bytes32) {
        return MerkleProof.processProofCalldata(proof, Protocol.computeLeafHash(leaf));
    }
}
