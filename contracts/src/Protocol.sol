// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// @title verinfer protocol v1, the parts the chain computes (docs/protocol.md)
/// @notice Mirrors node/protocol (seed.py, sequence.py, reputation.py, artifact.py) bit for bit;
///         tests/vectors/protocol_v1.json pins both sides.
library Protocol {
    uint256 internal constant WAD = 1e18;
    uint256 internal constant P_MIN = 1e12; // 1e-6
    uint256 internal constant P_MAX = WAD - 1e6; // 1 - 1e-12
    uint256 internal constant PRIOR = 1e16; // 1 %
    uint256 internal constant WEIGHT_ONE = 2 ** 32;
    uint256 internal constant WEIGHT_MAX = 2 ** 32 - 1;
    uint256 internal constant LEAF_HEAD = 8; // uint32 i ‖ uint32 chosen
    uint256 internal constant CANDIDATE_SIZE = 12; // uint32 token_id ‖ uint32 weight ‖ float32 raw_logprob

    // Stage-1 per-position reason codes (node/protocol/errors.py, 4xx).
    uint16 internal constant OK = 0;
    uint16 internal constant CANDIDATE_ID_OUT_OF_RANGE = 400;
    uint16 internal constant DUPLICATE_TOKEN_ID = 401;
    uint16 internal constant WEIGHT_OUT_OF_RANGE = 402;
    uint16 internal constant WEIGHTS_NOT_SORTED = 403;
    uint16 internal constant WEIGHT_SUM_OVERFLOW = 404;
    uint16 internal constant CHOSEN_OUT_OF_RANGE = 405;
    uint16 internal constant CHOSEN_MISMATCH = 406;
    uint16 internal constant TAIL_TOKEN_IN_CANDIDATES = 407;
    // Termination rule (docs/security.md rule 3): 305 is a header code, 408/409 per position.
    uint16 internal constant OUTPUT_TOO_LONG = 305;
    uint16 internal constant NOT_TERMINATED = 408;
    uint16 internal constant TOKENS_AFTER_STOP = 409;
    uint256 internal constant HEADER_HEAD = 88; // model id ‖ 5 × uint32 ‖ run_seed ‖ uint32 prompt length

    error LeafLength(uint256 length, uint256 k);
    error HeaderLength(uint256 length);

    /// @notice run_seed = sha256(uint64(user_seed) ‖ uint256(inference_id)).
    function computeRunSeed(uint64 userSeed, uint256 inferenceId) internal pure returns (bytes32) {
        return sha256(abi.encodePacked(userSeed, inferenceId));
    }

    /// @notice v_i = uint64(sha256(run_seed ‖ uint32(i))[0:8]) >> 32.
    function computeSamplerUniform(bytes32 runSeed, uint32 i) internal pure returns (uint256) {
        return uint256(sha256(abi.encodePacked(runSeed, i))) >> 224;
    }

    /// @notice OpenZeppelin-compatible leaf: keccak256(keccak256(encoded_leaf)).
    function computeLeafHash(bytes calldata leaf) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(leaf)));
    }

    /// @notice artifactRoot = keccak256(keccak256(header) ‖ positionsRoot).
    function computeArtifactRoot(bytes32 headerHash, bytes32 positionsRoot) internal pure returns (bytes32) {
        return keccak256(abi.encodePacked(headerHash, positionsRoot));
    }

    /// @notice The commitment the contract stores for (outputHash, artifactRoot, fingerprintHash).
    function computeCommitment(bytes32 outputHash, bytes32 artifactRoot, bytes32 fingerprintHash)
        internal
        pure
        returns (bytes32)
    {
        return keccak256(abi.encode(outputHash, artifactRoot, fingerprintHash));
    }

    /// @notice The least v for which an honest tail walk can run out (then the top token is chosen).
    function tailExhaustionFloor(uint256 vocabSize) internal pure returns (uint256) {
        return WEIGHT_ONE - vocabSize - 1;
    }

    /// @notice Position index of an encoded leaf.
    function decodeLeafPosition(bytes calldata leaf) internal pure returns (uint32) {
        return uint32(bytes4(leaf[0:4]));
    }

    /// @notice Chosen token of an encoded leaf.
    function decodeLeafChosen(bytes calldata leaf) internal pure returns (uint32) {
        return uint32(bytes4(leaf[4:8]));
    }

    /// @notice Candidate j (token id, weight) of an encoded leaf.
    function decodeCandidate(bytes calldata leaf, uint256 j) internal pure returns (uint256 token, uint256 weight) {
        uint256 at = LEAF_HEAD + j * CANDIDATE_SIZE;
        token = uint32(bytes4(leaf[at:at + 4]));
        weight = uint32(bytes4(leaf[at + 4:at + 8]));
    }

    /// @notice The first stage-1 rule a leaf breaks for sampler uniform v, or OK (sequence.py).
    function findPositionViolation(bytes calldata leaf, uint256 k, uint256 v, uint256 vocabSize)
        internal
        pure
        returns (uint16)
    {
        if (leaf.length != LEAF_HEAD + k * CANDIDATE_SIZE) revert LeafLength(leaf.length, k);
        uint256[] memory tokens = new uint256[](k);
        uint256[] memory weights = new uint256[](k);
        for (uint256 j; j < k; ++j) {
            (tokens[j], weights[j]) = decodeCandidate(leaf, j);
            if (tokens[j] >= vocabSize) return CANDIDATE_ID_OUT_OF_RANGE;
        }
        for (uint256 a; a < k; ++a) {
            for (uint256 b = a + 1; b < k; ++b) {
                if (tokens[a] == tokens[b]) return DUPLICATE_TOKEN_ID;
            }
        }
        // uint32 weights are always <= WEIGHT_MAX: WEIGHT_OUT_OF_RANGE cannot occur in this encoding.
        uint256 sum = 0;
        for (uint256 j; j < k; ++j) {
            if (j > 0 && weights[j - 1] < weights[j]) return WEIGHTS_NOT_SORTED;
            sum += weights[j];
        }
        if (sum > WEIGHT_ONE) return WEIGHT_SUM_OVERFLOW;
        uint32 chosen = decodeLeafChosen(leaf);
        if (chosen >= vocabSize) return CHOSEN_OUT_OF_RANGE;
        uint256 cumulative = 0;
        bool inCandidates = false;
        for (uint256 j; j < k; ++j) {
            cumulative += weights[j];
            if (v < cumulative) return chosen == tokens[j] ? OK : CHOSEN_MISMATCH;
            if (tokens[j] == chosen) inCandidates = true;
        }
        if (!inCandidates) return OK; // a tail token; its weight is for stage 2 to judge
        if (k > 0 && chosen == tokens[0] && v >= tailExhaustionFloor(vocabSize)) return OK;
        return TAIL_TOKEN_IN_CANDIDATES;
    }

    /// @notice output_length of a canonical artifact header (its last uint32); reverts on a malformed length.
    function decodeHeaderOutputLength(bytes calldata header) internal pure returns (uint256) {
        if (header.length < HEADER_HEAD + 4) revert HeaderLength(header.length);
        uint256 promptLength = uint32(bytes4(header[HEADER_HEAD - 4:HEADER_HEAD]));
        if (header.length != HEADER_HEAD + 4 * promptLength + 4) revert HeaderLength(header.length);
        return uint32(bytes4(header[header.length - 4:]));
    }

    /// @notice The length part of the termination rule: over-long, or empty although max_tokens allowed a token.
    function findLengthViolation(uint256 outputLength, uint256 maxTokens) internal pure returns (uint16) {
        if (outputLength > maxTokens) return OUTPUT_TOO_LONG;
        if (outputLength == 0 && maxTokens > 0) return NOT_TERMINATED;
        return OK;
    }

    /// @notice The termination rule at one position: only the last may hold a stop token, and it must when the
    ///         output is shorter than max_tokens (sequence.find_termination_violation).
    function findTerminationViolation(uint256 position, bool chosenIsStop, uint256 outputLength, uint256 maxTokens)
        internal
        pure
        returns (uint16)
    {
        if (outputLength > maxTokens) return OUTPUT_TOO_LONG;
        if (position >= outputLength) return OK; // not a position of this output: nothing to judge here
        if (position + 1 < outputLength) return chosenIsStop ? TOKENS_AFTER_STOP : OK;
        return outputLength < maxTokens && !chosenIsStop ? NOT_TERMINATED : OK;
    }

    /// @notice P clamped to [1e-6, 1 - 1e-12] in 1e18 fixed point.
    function clampProbability(uint256 p) internal pure returns (uint256) {
        return p < P_MIN ? P_MIN : (p > P_MAX ? P_MAX : p);
    }

    /// @notice The spoofer probability after one verdict, exactly as reputation.compute_posterior_wad.
    function computePosterior(uint256 p, uint256 alpha, uint256 beta, bool valid) internal pure returns (uint256) {
        uint256 num;
        uint256 den;
        if (valid) {
            num = p * beta;
            den = num + (WAD - p) * (WAD - alpha);
        } else {
            num = p * (WAD - beta);
            den = num + (WAD - p) * alpha;
        }
        return clampProbability(den == 0 ? p : num * WAD / den);
    }
}
