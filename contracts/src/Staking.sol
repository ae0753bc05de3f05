// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {Checkpoints} from "@openzeppelin/contracts/utils/structs/Checkpoints.sol";

/// @title Native-ETH stake for operators and validators, with pull payments
/// @notice Unbonding takes `unbondingDelay` blocks, longer than the commit + check + fraud windows,
///         and stake stays slashable until it is withdrawn.
/// @dev Every change to a validator's committee weight (stake while eligible, else 0) is checkpointed
///      by block number, so a committee is drawn from the weights as they stood before the commit:
///      bonding, topping up or unbonding after a commit cannot change that inference's draw.
abstract contract Staking is ReentrancyGuard {
    using Checkpoints for Checkpoints.Trace208;

    enum Role {
        None,
        Operator,
        Validator
    }

    struct Staker {
        uint96 stake;
        uint64 spoofP; // operators: spoofer probability, 1e18 fixed point
        uint32 bondBlock;
        uint32 unbondBlock; // 0 while bonded
        uint16 open; // operators: inferences accepted and not yet settled
        Role role;
        bool jailed;
    }

    uint256 public constant MAX_VALIDATORS = 64;

    uint256 public immutable minOperatorStake;
    uint256 public immutable minValidatorStake;
    uint256 public immutable unbondingDelay;

    mapping(address => Staker) public stakers;
    /// @notice Validator slots; a slot's index is its vote-bitmap bit. A slot is freed when its validator's stake
    ///         leaves (`withdraw`) and the next new validator takes it: nobody can close the set by bonding and
    ///         leaving (issue 31). Reuse is safe because withdrawal waits `unbondingDelay` blocks, longer than the
    ///         commit + fraud windows, and the weight is 0 from the unbonding on: no inference still in a window
    ///         can have drawn or recorded the slot's previous holder.
    address[] public validators;
    mapping(address => uint256) internal validatorSlot; // index + 1 in `validators`, 0 for none
    mapping(address => Checkpoints.Trace208) internal weightHistory; // committee weight by block number
    uint256[] internal freeSlots; // indexes of slots whose validator withdrew, taken by the next new validator
    Checkpoints.Trace208 internal eligibleHistory; // number of validators with weight > 0, by block number
    /// @dev Withdrawable fees, rewards and refunds plus one: a slot is opened (set to 1) by whoever joins —
    ///      a staker at its bond, a requester at its request, the treasury at deployment — so the first
    ///      credit a verdict pays never writes a fresh storage slot (20k gas) inside a validator's submission.
    mapping(address => uint256) internal creditSlots;
    address public immutable treasury;

    /// @notice Σ stakes; with Σ credits and escrowed fees it is the contract's whole balance.
    uint256 public totalStaked;
    /// @dev Σ credits plus one, set to 1 at deployment (like `creditSlots`): the deployment's first credit then
    ///      writes a warm slot instead of opening a fresh one (20k gas) inside a validator's submission.
    uint256 internal totalCreditsSlot;
    /// @notice Σ of every amount ever slashed: Σ bonded = totalStaked + totalSlashed + Σ withdrawn.
    uint256 public totalSlashed;

    event Bonded(address indexed who, Role role, uint256 amount, uint256 stake);
    event UnbondRequested(address indexed who, uint256 withdrawableAt);
    event Withdrawn(address indexed who, uint256 amount);
    event Slashed(address indexed who, uint256 amount, bytes32 cause);
    event Jailed(address indexed who);
    event Credited(address indexed who, uint256 amount);
    event Claimed(address indexed who, uint256 amount);

    error WrongRole(address who, Role has);
    error StakeTooLow(uint256 stake, uint256 minimum);
    error StakeOverflow();
    error Unbonding(address who);
    error NotUnbonding(address who);
    error UnbondingNotOver(uint256 withdrawableAt);
    error OpenInferences(uint256 open);
    error TooManyValidators();
    error NothingToClaim();

    constructor(uint256 minOperatorStake_, uint256 minValidatorStake_, uint256 unbondingDelay_, address treasury_) {
        minOperatorStake = minOperatorStake_;
        minValidatorStake = minValidatorStake_;
        unbondingDelay = unbondingDelay_;
        treasury = treasury_;
        totalCreditsSlot = 1;
        _openCredits(treasury_);
    }

    /// @notice Bond (or top up) native ETH as an operator or a validator.
    function bond(Role role) external payable {
        Staker storage s = stakers[msg.sender];
        if (role == Role.None || (s.role != Role.None && s.role != role)) revert WrongRole(msg.sender, s.role);
        if (s.unbondBlock != 0) revert Unbonding(msg.sender);
        uint256 stake = s.stake + msg.value;
        if (stake > type(uint96).max) revert StakeOverflow();
        uint256 minimum = role == Role.Operator ? minOperatorStake : minValidatorStake;
        if (stake < minimum) revert StakeTooLow(stake, minimum);
        if (s.role == Role.None) {
            if (role == Role.Validator) _takeSlot(msg.sender);
            s.role = role;
            s.spoofP = uint64(_prior());
            s.bondBlock = uint32(block.number);
            _openCredits(msg.sender);
        }
        s.stake = uint96(stake);
        totalStaked += msg.value;
        _checkpointWeight(msg.sender);
        emit Bonded(msg.sender, role, msg.value, stake);
    }

    /// @notice Start unbonding: no new work from now on; stake stays slashable until withdrawn.
    function requestUnbond() external {
        Staker storage s = stakers[msg.sender];
        if (s.role == Role.None) revert WrongRole(msg.sender, s.role);
        if (s.unbondBlock != 0) revert Unbonding(msg.sender);
        s.unbondBlock = uint32(block.number);
        _checkpointWeight(msg.sender);
        emit UnbondRequested(msg.sender, block.number + unbondingDelay);
    }

    /// @notice Withdraw the whole remaining stake once the unbonding delay has passed.
    function withdraw() external nonReentrant {
        Staker storage s = stakers[msg.sender];
        if (s.unbondBlock == 0) revert NotUnbonding(msg.sender);
        if (block.number < s.unbondBlock + unbondingDelay) revert UnbondingNotOver(s.unbondBlock + unbondingDelay);
        if (s.open != 0) revert OpenInferences(s.open);
        uint256 amount = s.stake;
        s.stake = 0;
        totalStaked -= amount;
        uint256 slot = validatorSlot[msg.sender];
        if (slot != 0) {
            validatorSlot[msg.sender] = 0;
            freeSlots.push(slot - 1);
        }
        emit Withdrawn(msg.sender, amount);
        Address.sendValue(payable(msg.sender), amount);
    }

    /// @notice Withdraw accumulated fees, rewards and refunds.
    function claim() external nonReentrant {
        uint256 amount = credits(msg.sender);
        if (amount == 0) revert NothingToClaim();
        creditSlots[msg.sender] = 1; // stays open: the next credit is as cheap
        totalCreditsSlot -= amount;
        emit Claimed(msg.sender, amount);
        Address.sendValue(payable(msg.sender), amount);
    }

    /// @notice Number of validator slots (taken or free: a free slot holds its last validator, weight 0).
    function validatorCount() external view returns (uint256) {
        return validators.length;
    }

    /// @notice Number of validators with committee weight at the end of block `blockNumber`.
    function eligibleCountAt(uint256 blockNumber) public view returns (uint256) {
        return eligibleHistory.upperLookup(uint48(blockNumber));
    }

    /// @dev Give a new validator a freed slot, or a new one below MAX_VALIDATORS.
    function _takeSlot(address who) private {
        uint256 free = freeSlots.length;
        uint256 index;
        if (free != 0) {
            index = freeSlots[free - 1];
            freeSlots.pop();
            validators[index] = who;
        } else {
            if (validators.length >= MAX_VALIDATORS) revert TooManyValidators();
            index = validators.length;
            validators.push(who);
        }
        validatorSlot[who] = index + 1;
    }

    function _prior() internal pure virtual returns (uint256);

    /// @notice Σ credits: what every account can withdraw with `claim`.
    function totalCredits() public view returns (uint256) {
        return totalCreditsSlot - 1;
    }

    /// @notice Fees, rewards and refunds `who` can withdraw with `claim`.
    function credits(address who) public view returns (uint256) {
        uint256 slot = creditSlots[who];
        return slot == 0 ? 0 : slot - 1;
    }

    /// @dev Open `who`'s credit slot (paid by the caller who joins), so later credits cost a warm write.
    function _openCredits(address who) internal {
        if (creditSlots[who] == 0) creditSlots[who] = 1;
    }

    function _credit(address who, uint256 amount) internal {
        if (amount == 0) return;
        uint256 slot = creditSlots[who];
        creditSlots[who] = (slot == 0 ? 1 : slot) + amount;
        totalCreditsSlot += amount;
        emit Credited(who, amount);
    }

    /// @dev Move `bps` of a staker's stake out of the stake, at most `cap`; returns the amount taken.
    function _slash(address who, uint256 bps, uint256 cap, bytes32 cause) internal returns (uint256 amount) {
        Staker storage s = stakers[who];
        amount = uint256(s.stake) * bps / 10_000;
        if (amount > cap) amount = cap;
        s.stake -= uint96(amount);
        totalStaked -= amount;
        totalSlashed += amount;
        _checkpointWeight(who);
        emit Slashed(who, amount, cause);
    }

    function _jail(address who) internal {
        Staker storage s = stakers[who];
        if (!s.jailed) {
            s.jailed = true;
            _checkpointWeight(who);
            emit Jailed(who);
        }
    }

    /// @dev A validator's committee weight now: its stake while bonded, above the minimum and not jailed.
    function _currentWeight(Staker storage s) internal view returns (uint256) {
        bool eligible = s.role == Role.Validator && s.stake >= minValidatorStake && s.unbondBlock == 0 && !s.jailed;
        return eligible ? s.stake : 0;
    }

    /// @dev Record a validator's weight from this block on (operators have no history).
    function _checkpointWeight(address who) internal {
        Staker storage s = stakers[who];
        if (s.role != Role.Validator) return;
        uint256 weight = _currentWeight(s);
        // the history is read by block number: push's returned previous and new values are the ones compared here
        // slither-disable-next-line unused-return
        (uint256 before,) = weightHistory[who].push(uint48(block.number), uint208(weight));
        // a weight of exactly 0 is what "not eligible" means (_currentWeight), not a balance an attacker can nudge
        // slither-disable-next-line incorrect-equality
        if ((before == 0) != (weight == 0)) {
            uint256 count = eligibleHistory.latest();
            // slither-disable-next-line unused-return
            eligibleHistory.push(uint48(block.number), uint208(weight == 0 ? count - 1 : count + 1));
        }
    }

    /// @notice A validator's committee weight as it stood at the end of block `blockNumber`.
    function weightAt(address who, uint256 blockNumber) public view returns (uint256) {
        return weightHistory[who].upperLookup(uint48(blockNumber));
    }
}
