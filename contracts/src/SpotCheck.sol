// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {EIP712} from "@openzeppelin/contracts/utils/cryptography/EIP712.sol";
import {StakeQuorum, IValidatorSet} from "./StakeQuorum.sol";

/// @notice The hub as seen from a module: an operator's stake record and the module's slashing entry.
interface IOperatorHub is IValidatorSet {
    function stakers(address who)
        external
        view
        returns (uint96 stake, uint64 spoofP, uint32 bondBlock, uint32 unbondBlock, uint16 open, uint8 role, bool jailed);
    function slashForModule(address operator, bytes32 cause) external returns (uint256);
}

/// @title Memory spot-check windows: an operator opens a run, the hub's validators vote on each device window,
///        and a window failed by a supermajority slashes and jails the operator on the hub, once per run.
/// @dev Its own EIP-712 domain, so a window verdict can never pass for an inference verdict. Runs are keyed by
///      (operator, runId): nobody can open, and so squat, another operator's run. Weights are the hub's settled
///      weights (StakeQuorum) at the end of the block before the opening: stake bonded after it, or less than
///      weightDelay blocks before it, cannot vote on the run nor count in its reference total.
contract SpotCheck is EIP712, StakeQuorum {
    uint8 private constant OPERATOR = 1; // Staking.Role.Operator
    bytes32 public constant VERDICT_TYPEHASH = keccak256(
        "WindowVerdict(address operator,bytes32 runId,bytes32 windowId,bytes32 measurementRoot,bool valid,uint16 reason,bytes32 policyDigest)"
    );

    struct Run {
        uint64 openBlock;
        bool slashed;
    }

    struct Vote {
        bool valid;
        uint16 reason;
        bytes32 measurementRoot;
        bytes32 policyDigest;
        bytes signature;
    }

    /// @notice operator → run id → run
    mapping(address => mapping(bytes32 => Run)) public runs;
    /// @notice 0 open, 1 passed, 2 failed — per (operator, run, window)
    mapping(bytes32 => uint8) public results;

    event RunOpened(address indexed operator, bytes32 indexed runId, uint256 weightBlock);
    event WindowSettled(address indexed operator, bytes32 indexed runId, bytes32 indexed windowId, bool valid, uint16 reason);
    event OperatorSlashed(address indexed operator, bytes32 indexed runId, bytes32 windowId, uint256 amount);

    error NotAnOperator(address who);
    error RunExists(bytes32 runId);
    error NoSuchRun(address operator, bytes32 runId);
    error AlreadySettled(bytes32 windowId);

    constructor(IOperatorHub hub_, uint256 minSigners_, uint256 weightDelay_)
        EIP712("verinfer-spotcheck", "1")
        StakeQuorum(hub_, minSigners_, weightDelay_)
    {}

    /// @notice Open a spot-check run for the sender, a bonded operator; its weight block is the block before.
    function openRun(bytes32 runId) external {
        // the stake, reputation and counters are not needed to open a run
        // slither-disable-next-line unused-return
        (,,, uint32 unbondBlock,, uint8 role, bool jailed) = IOperatorHub(address(hub)).stakers(msg.sender);
        if (role != OPERATOR || unbondBlock != 0 || jailed) revert NotAnOperator(msg.sender);
        if (runs[msg.sender][runId].openBlock != 0) revert RunExists(runId);
        runs[msg.sender][runId] = Run({openBlock: uint64(block.number), slashed: false});
        emit RunOpened(msg.sender, runId, block.number - 1);
    }

    /// @notice The EIP-712 digest a validator signs for a window verdict.
    function verdictDigest(
        address operator,
        bytes32 runId,
        bytes32 windowId,
        bytes32 measurementRoot,
        bool valid,
        uint16 reason,
        bytes32 policyDigest
    ) public view returns (bytes32) {
        return _hashTypedDataV4(
            keccak256(abi.encode(VERDICT_TYPEHASH, operator, runId, windowId, measurementRoot, valid, reason, policyDigest))
        );
    }

    /// @notice The key of one window's tally and result.
    function windowKey(address operator, bytes32 runId, bytes32 windowId) public pure returns (bytes32) {
        return keccak256(abi.encode(operator, runId, windowId));
    }

    /// @notice Count validators' signed votes on a window (anyone may relay; a counted vote is skipped). A
    ///         supermajority settles it; a failed window slashes and jails the operator on the hub, once per run.
    function submitVotes(address operator, bytes32 runId, bytes32 windowId, Vote[] calldata votes) external {
        Run storage r = runs[operator][runId];
        if (r.openBlock == 0) revert NoSuchRun(operator, runId);
        bytes32 key = windowKey(operator, runId, windowId);
        if (results[key] != 0) revert AlreadySettled(windowId);
        for (uint256 v; v < votes.length; ++v) {
            Vote calldata vote = votes[v];
            bytes32 digest = verdictDigest(
                operator, runId, windowId, vote.measurementRoot, vote.valid, vote.reason, vote.policyDigest
            );
            uint8 result = _countVote(key, digest, vote.valid, vote.reason, vote.signature, uint256(r.openBlock) - 1);
            if (result != 0) {
                results[key] = result;
                emit WindowSettled(operator, runId, windowId, result == 1, vote.reason);
                if (result == 2 && !r.slashed) {
                    r.slashed = true;
                    uint256 amount = IOperatorHub(address(hub)).slashForModule(operator, windowId);
                    emit OperatorSlashed(operator, runId, windowId, amount);
                }
                return;
            }
        }
    }

    /// @notice A window's result: 0 open, 1 passed, 2 failed.
    function windowResult(address operator, bytes32 runId, bytes32 windowId) external view returns (uint8) {
        return results[windowKey(operator, runId, windowId)];
    }

    /// @notice Whether `validator`'s vote on a window is counted.
    function hasVoted(address operator, bytes32 runId, bytes32 windowId, address validator) external view returns (bool) {
        return isCounted(windowKey(operator, runId, windowId), validator);
    }
}
