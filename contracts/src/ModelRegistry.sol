// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title Registered models and their calibrated parameters, with the phased rollout
/// @notice Registered: inferences run, nothing is checked. Measuring: checks run and verdicts are
///         recorded, reputation does not move. Verifying: reputation moves, nobody is slashed.
///         Punitive: past the slash threshold an operator is slashed and jailed.
abstract contract ModelRegistry is AccessControl {
    bytes32 public constant GOVERNOR_ROLE = keccak256("GOVERNOR_ROLE");
    /// @notice Contracts beside the hub allowed to slash an operator (Verinfer.slashForModule).
    bytes32 public constant MODULE_ROLE = keccak256("MODULE_ROLE");

    enum ModelState {
        None,
        Registered,
        Measuring,
        Verifying,
        Punitive
    }

    struct Model {
        uint64 alpha; // calibrated false-positive rate, 1e18
        uint64 beta; // P(valid verdict | spoofer), 1e18
        uint64 minCheckRate; // 1e18
        uint32 vocabSize;
        uint8 k;
        ModelState state;
        bytes32 profileHash; // keccak256 of the calibrated profile file
        uint96 minFee; // wei: a request pays at least this (every check has a price for whoever asks for it)
    }

    uint256 public constant MAX_STOP_TOKENS = 8;

    mapping(bytes32 => Model) public models;
    /// @dev The model's stop tokens (docs/security.md rule 3: the termination rule); fixed at registration, as the vocabulary is.
    mapping(bytes32 => uint32[]) internal stopTokens;

    event ModelRegistered(bytes32 indexed modelId, uint256 k, uint256 vocabSize, bytes32 profileHash);
    event ModelParamsSet(bytes32 indexed modelId, uint256 alpha, uint256 beta, uint256 minCheckRate);
    event ModelStateSet(bytes32 indexed modelId, ModelState state);
    event ModelFeeSet(bytes32 indexed modelId, uint256 minFee);

    error UnknownModel(bytes32 modelId);
    error ModelExists(bytes32 modelId);
    error BadModelParams();
    error BadStateTransition(ModelState from, ModelState to);

    /// @notice Register a model id with its profile's K, vocabulary, rates, profile hash, minimum fee and stop tokens.
    function registerModel(
        bytes32 modelId,
        uint8 k,
        uint32 vocabSize,
        uint64 alpha,
        uint64 beta,
        uint64 minCheckRate,
        bytes32 profileHash,
        uint96 minFee,
        uint32[] calldata stops
    ) external onlyRole(GOVERNOR_ROLE) {
        if (models[modelId].state != ModelState.None) revert ModelExists(modelId);
        if (k == 0 || k > 64 || vocabSize < k || vocabSize > 2 ** 24) revert BadModelParams();
        if (stops.length == 0 || stops.length > MAX_STOP_TOKENS) revert BadModelParams();
        for (uint256 i; i < stops.length; ++i) {
            if (stops[i] >= vocabSize) revert BadModelParams();
        }
        _requireRates(alpha, beta, minCheckRate);
        models[modelId] = Model(alpha, beta, minCheckRate, vocabSize, k, ModelState.Registered, profileHash, minFee);
        stopTokens[modelId] = stops;
        emit ModelRegistered(modelId, k, vocabSize, profileHash);
        emit ModelParamsSet(modelId, alpha, beta, minCheckRate);
        emit ModelFeeSet(modelId, minFee);
    }

    /// @notice Set the least fee a request for this model must pay.
    function setMinFee(bytes32 modelId, uint96 minFee) external onlyRole(GOVERNOR_ROLE) {
        _model(modelId).minFee = minFee;
        emit ModelFeeSet(modelId, minFee);
    }

    /// @notice The model's stop tokens.
    function stopTokensOf(bytes32 modelId) external view returns (uint32[] memory) {
        return stopTokens[modelId];
    }

    /// @notice Whether `token` is one of the model's stop tokens.
    function isStopToken(bytes32 modelId, uint256 token) public view returns (bool) {
        uint32[] storage stops = stopTokens[modelId];
        for (uint256 i; i < stops.length; ++i) {
            if (stops[i] == token) return true;
        }
        return false;
    }

    /// @notice Update a model's calibrated rates (a new calibration) and profile hash.
    function setModelParams(bytes32 modelId, uint64 alpha, uint64 beta, uint64 minCheckRate, bytes32 profileHash)
        external
        onlyRole(GOVERNOR_ROLE)
    {
        Model storage m = _model(modelId);
        _requireRates(alpha, beta, minCheckRate);
        (m.alpha, m.beta, m.minCheckRate, m.profileHash) = (alpha, beta, minCheckRate, profileHash);
        emit ModelParamsSet(modelId, alpha, beta, minCheckRate);
    }

    /// @notice Move a model one phase forward or back (never to None).
    function setModelState(bytes32 modelId, ModelState state) external onlyRole(GOVERNOR_ROLE) {
        Model storage m = _model(modelId);
        uint8 from = uint8(m.state);
        uint8 to = uint8(state);
        if (to == 0 || (to != from + 1 && to + 1 != from)) revert BadStateTransition(m.state, state);
        m.state = state;
        emit ModelStateSet(modelId, state);
    }

    function _model(bytes32 modelId) internal view returns (Model storage m) {
        m = models[modelId];
        if (m.state == ModelState.None) revert UnknownModel(modelId);
    }

    function _requireRates(uint64 alpha, uint64 beta, uint64 minCheckRate) private pure {
        // alpha in (0, 1): alpha = 0 makes one invalid verdict certain proof, alpha = 1 makes verdicts meaningless
        if (alpha == 0 || alpha >= 1e18 || beta >= 1e18 || minCheckRate > 1e18) revert BadModelParams();
    }
}
