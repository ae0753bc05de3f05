// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {MerkleProof} from "@openzeppelin/contracts/utils/cryptography/MerkleProof.sol";
import {Protocol} from "./Protocol.sol";

/// @title The chain's protocol functions as views, for cross-language tests and clients
/// @notice A separate stateless contract (the hub itself must stay under EIP-170's 24,576 bytes); it runs the
///         very library code the hub's fraud proofs run.
contract ProtocolViews {
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

    /// @notice The termination rule for one leaf (DESIGN.md §5), as proveTermination applies it.
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

    /// @notice A positions root from a leaf and its proof, as the fraud proof computes it.
    function computePositionsRoot(bytes calldata leaf, bytes32[] calldata proof) external pure returns (bytes32) {
        return MerkleProof.processProofCalldata(proof, Protocol.computeLeafHash(leaf));
    }
}
