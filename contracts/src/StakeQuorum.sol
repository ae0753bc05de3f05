// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

/// @notice The hub's validator set, read, never written: weights by block (Staking.weightAt) and the slots.
interface IValidatorSet {
    function weightAt(address who, uint256 blockNumber) external view returns (uint256);
    function validatorCount() external view returns (uint256);
    function validators(uint256 index) external view returns (address);
    function unbondingDelay() external view returns (uint256);
}

/// @notice The settled-weight rule every stake-weighted module applies (one copy: StakeQuorum and ExpertDuty).
library SettledWeight {
    /// @notice `who`'s weight at the end of block `blockNumber` as far as it already stood `delay` blocks before:
    ///         min(weightAt(b − delay), weightAt(b)); 0 for b < delay.
    function at(IValidatorSet hub, address who, uint256 blockNumber, uint256 delay) internal view returns (uint256) {
        if (blockNumber < delay) return 0;
        uint256 earlier = hub.weightAt(who, blockNumber - delay);
        uint256 current = hub.weightAt(who, blockNumber);
        return earlier < current ? earlier : current;
    }
}

/// @title Signed votes of the hub's validators, tallied by stake until one side holds a supermajority
/// @notice Shared by the modules beside the hub (training audits, spot-check windows): a verdict there
///         settles only when one side holds ≥ 2/3 of the settled weight of every validator eligible at a block
///         fixed before the votes (the anchor, the run's opening) and ≥ `minSigners` distinct signers, with at
///         least MIN_ELIGIBLE eligible validators — never one judge (docs/security.md).
///         Settled weight: a validator's weight counts at block b only as far as it was already there
///         `weightDelay` blocks earlier (min of the two). The accused chooses b (it opens the run, sends the
///         anchor), so without the delay a friend's stake bonded one block before b inflated the reference
///         total and made the supermajority unreachable; now any stake in the total was bonded before the
///         accused could know it would need it, and stays locked for the hub's unbonding delay after.
/// @dev Votes are idempotent (a signer counted once per key; later and post-settlement votes are skipped),
///      so anyone may relay any validator's signed vote, in any batch.
abstract contract StakeQuorum {
    uint256 public constant MIN_ELIGIBLE = 3;

    struct Tally {
        uint128 validWeight;
        uint128 invalidWeight;
        uint128 total; // eligible weight at the tally's block, fixed by the first vote
        uint16 validCount;
        uint16 invalidCount;
        uint8 result; // 0 open, 1 valid, 2 invalid
    }

    IValidatorSet public immutable hub;
    uint256 public immutable minSigners;
    /// @notice Blocks a validator's stake must have stood before the reference block to count (≥ 1).
    uint256 public immutable weightDelay;

    mapping(bytes32 => Tally) internal tallies;
    mapping(bytes32 => mapping(address => bool)) internal counted;

    event VoteCounted(bytes32 indexed key, address indexed signer, bool valid, uint16 reason, uint256 weight);
    event VoteSkipped(bytes32 indexed key, address indexed signer);

    error TooFewValidators(uint256 eligible, uint256 minimum);
    error NotAValidator(address signer);
    error BadQuorumParams();
    error ReferenceExpired(uint256 atBlock, uint256 lastBlock);

    constructor(IValidatorSet hub_, uint256 minSigners_, uint256 weightDelay_) {
        if (minSigners_ < 2 || address(hub_) == address(0) || weightDelay_ == 0) revert BadQuorumParams();
        hub = hub_;
        minSigners = minSigners_;
        weightDelay = weightDelay_;
    }

    /// @notice `who`'s weight at the end of block `blockNumber` as far as it already stood `weightDelay` blocks
    ///         before: min(weightAt(b − weightDelay), weightAt(b)); 0 for b < weightDelay.
    function settledWeightAt(address who, uint256 blockNumber) public view returns (uint256) {
        return SettledWeight.at(hub, who, blockNumber, weightDelay);
    }

    /// @notice Σ settled weight and number of the validators eligible at the end of block `blockNumber`.
    function eligibleAt(uint256 blockNumber) public view returns (uint256 total, uint256 eligible) {
        uint256 n = hub.validatorCount();
        for (uint256 i; i < n; ++i) {
            uint256 w = settledWeightAt(hub.validators(i), blockNumber);
            if (w != 0) {
                total += w;
                ++eligible;
            }
        }
    }

    /// @notice Whether `validator`'s vote under `key` is counted.
    function isCounted(bytes32 key, address validator) public view returns (bool) {
        return counted[key][validator];
    }

    /// @dev Count one signed vote on `key` with weights at `atBlock`; returns the tally's result afterwards.
    function _countVote(bytes32 key, bytes32 digest, bool valid, uint16 reason, bytes calldata signature, uint256 atBlock)
        internal
        returns (uint8)
    {
        address signer = ECDSA.recover(digest, signature); // rejects high-s and malformed signatures
        // Votes count only while no validator eligible at `atBlock` can have withdrawn (and so freed its hub slot
        // for another): the reference set is then exactly the one the accused committed before.
        uint256 lastBlock = atBlock + hub.unbondingDelay();
        if (block.number > lastBlock) revert ReferenceExpired(atBlock, lastBlock);
        Tally storage t = tallies[key];
        if (t.result != 0 || counted[key][signer]) {
            emit VoteSkipped(key, signer);
            return t.result;
        }
        uint256 weight = settledWeightAt(signer, atBlock);
        if (weight == 0) revert NotAValidator(signer);
        if (t.total == 0) {
            (uint256 total, uint256 eligible) = eligibleAt(atBlock);
            if (eligible < MIN_ELIGIBLE) revert TooFewValidators(eligible, MIN_ELIGIBLE);
            t.total = uint128(total);
        }
        counted[key][signer] = true;
        emit VoteCounted(key, signer, valid, reason, weight);
        if (valid) {
            t.validWeight += uint128(weight);
            t.validCount += 1;
            if (_isSupermajority(t.validWeight, t.validCount, t.total)) t.result = 1;
        } else {
            t.invalidWeight += uint128(weight);
            t.invalidCount += 1;
            if (_isSupermajority(t.invalidWeight, t.invalidCount, t.total)) t.result = 2;
        }
        return t.result;
    }

    function _isSupermajority(uint256 weight, uint256 count, uint256 total) private view returns (bool) {
        return count >= minSigners && weight * 3 >= total * 2;
    }
}
