// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Staking} from "../src/Staking.sol";
import {Verinfer} from "../src/Verinfer.sol";

contract StakingTest is Fixture {
    address internal constant NEW = address(0xCAFE);

    function test_bondAndTopUp() public {
        bondAs(NEW, Staking.Role.Operator, 1 ether);
        bondAs(NEW, Staking.Role.Operator, 2 ether);
        assertEq(stakeOf(NEW), 3 ether, "stake");
        assertEq(spoofP(NEW), 1e16, "prior");
        assertSolvent();
    }

    function test_bondRevertsForRoleNone() public {
        vm.deal(NEW, 1 ether);
        vm.prank(NEW);
        vm.expectRevert(abi.encodeWithSelector(Staking.WrongRole.selector, NEW, Staking.Role.None));
        hub.bond{value: 1 ether}(Staking.Role.None);
    }

    function test_bondRevertsForAnotherRole() public {
        vm.deal(op, 1 ether);
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Staking.WrongRole.selector, op, Staking.Role.Operator));
        hub.bond{value: 1 ether}(Staking.Role.Validator);
    }

    function test_bondRevertsBelowMinimum() public {
        vm.deal(NEW, 1 ether);
        vm.prank(NEW);
        vm.expectRevert(abi.encodeWithSelector(Staking.StakeTooLow.selector, 0.5 ether, 1 ether));
        hub.bond{value: 0.5 ether}(Staking.Role.Validator);
    }

    function test_bondRevertsOnOverflow() public {
        vm.deal(NEW, 2 ** 96);
        vm.prank(NEW);
        vm.expectRevert(Staking.StakeOverflow.selector);
        hub.bond{value: 2 ** 96}(Staking.Role.Operator);
    }

    function test_bondRevertsWhileUnbonding() public {
        vm.prank(op);
        hub.requestUnbond();
        vm.deal(op, 1 ether);
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Staking.Unbonding.selector, op));
        hub.bond{value: 1 ether}(Staking.Role.Operator);
    }

    function test_validatorSetIsBounded() public {
        for (uint256 i = hub.validatorCount(); i < hub.MAX_VALIDATORS(); ++i) {
            bondAs(address(uint160(0x10000 + i)), Staking.Role.Validator, 1 ether);
        }
        vm.deal(NEW, 1 ether);
        vm.prank(NEW);
        vm.expectRevert(Staking.TooManyValidators.selector);
        hub.bond{value: 1 ether}(Staking.Role.Validator);
    }

    /// @dev Issue 31 finding 3: 61 sybils bonded, unbonded and withdrew everything (gas only), and every later
    ///      validator reverted TooManyValidators for good. A withdrawn validator's slot is now reused.
    function test_slotsOfWithdrawnValidatorsAreReusedSoTheSetCannotBeClosed() public {
        uint256 first = hub.validatorCount();
        for (uint256 i = first; i < hub.MAX_VALIDATORS(); ++i) {
            address sybil = address(uint160(0x10000 + i));
            bondAs(sybil, Staking.Role.Validator, 1 ether);
            vm.prank(sybil);
            hub.requestUnbond();
        }
        vm.roll(vm.getBlockNumber() + 601);
        for (uint256 i = first; i < hub.MAX_VALIDATORS(); ++i) {
            vm.prank(address(uint160(0x10000 + i)));
            hub.withdraw();
        }
        assertEq(hub.eligibleCountAt(vm.getBlockNumber()), 3, "only the three honest validators are eligible");
        bondAs(NEW, Staking.Role.Validator, 1000 ether);
        assertEq(hub.validatorCount(), hub.MAX_VALIDATORS(), "no new slot: a freed one");
        address holder = hub.validators(hub.MAX_VALIDATORS() - 1);
        assertEq(holder, NEW, "the newcomer holds the last freed slot");
        assertEq(hub.eligibleCountAt(vm.getBlockNumber()), 4, "and counts");
        // a withdrawn sybil cannot come back into its old slot (its record stays unbonding), nor vote
        vm.deal(address(uint160(0x10000 + first)), 1 ether);
        vm.prank(address(uint160(0x10000 + first)));
        vm.expectRevert(abi.encodeWithSelector(Staking.Unbonding.selector, address(uint160(0x10000 + first))));
        hub.bond{value: 1 ether}(Staking.Role.Validator);
        assertSolvent();
    }

    /// @dev Issue 31 finding 3: once the set fell below minCommittee, garbage commits finalised unchecked and were
    ///      paid. An inference whose commit saw fewer than minCommittee eligible validators is refunded instead.
    function test_anInferenceThatCouldNotGetAFullCommitteeIsRefundedNotPaid() public {
        vm.prank(vals[0]);
        hub.requestUnbond(); // two eligible validators left, minCommittee is 3
        vm.roll(vm.getBlockNumber() + 1);
        uint256 id = committed(keccak256("garbage"));
        (bool checked,) = hub.selectionOf(id);
        assertTrue(!checked, "no committee can be drawn");
        uint256 opBefore = hub.credits(op);
        vm.roll(vm.getBlockNumber() + 101);
        hub.finalize(id);
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Uncheckable), "uncheckable");
        assertEq(hub.credits(op), opBefore, "the operator is not paid for an unjudged commit");
        assertEq(hub.credits(REQUESTER), FEE + BOND, "fee and bond back to the requester");
        assertSolvent();
    }

    function test_requestUnbondRevertsForStrangersAndTwice() public {
        vm.prank(NEW);
        vm.expectRevert(abi.encodeWithSelector(Staking.WrongRole.selector, NEW, Staking.Role.None));
        hub.requestUnbond();
        vm.prank(op);
        hub.requestUnbond();
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Staking.Unbonding.selector, op));
        hub.requestUnbond();
    }

    function test_withdrawAfterTheDelayOnly() public {
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Staking.NotUnbonding.selector, op));
        hub.withdraw();
        vm.prank(op);
        hub.requestUnbond();
        uint256 at = vm.getBlockNumber() + hub.unbondingDelay();
        vm.roll(at - 1);
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Staking.UnbondingNotOver.selector, at));
        hub.withdraw();
        vm.roll(at);
        uint256 before = op.balance;
        vm.prank(op);
        hub.withdraw();
        assertEq(op.balance - before, 10 ether, "whole stake back");
        assertEq(stakeOf(op), 0, "stake gone");
        assertSolvent();
    }

    function test_withdrawRevertsWithOpenInferences() public {
        request();
        vm.prank(op);
        hub.requestUnbond();
        vm.roll(vm.getBlockNumber() + hub.unbondingDelay());
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Staking.OpenInferences.selector, 1));
        hub.withdraw();
    }

    function test_unbondingStakeStaysSlashable() public {
        bytes32 root = keccak256("root");
        uint256 id = committed(root);
        vm.prank(op);
        hub.requestUnbond();
        uint256[] memory keys = committeeKeys(id);
        uint256 p = spoofP(op);
        for (uint256 j; j < keys.length / 2 + 1; ++j) {
            hub.submitVerdicts(id, commitment(root), votes1(vote(keys[j], id, root, false)));
        }
        assertTrue(spoofP(op) > p, "an unbonding operator still gets verdicts");
    }

    function test_claimPaysCreditsOnce() public {
        vm.prank(NEW);
        vm.expectRevert(Staking.NothingToClaim.selector);
        hub.claim();
        uint256 id = request();
        vm.roll(vm.getBlockNumber() + 21);
        hub.expire(id);
        uint256 before = REQUESTER.balance;
        vm.prank(REQUESTER);
        hub.claim();
        assertEq(REQUESTER.balance - before, FEE + BOND, "fee + bond (never accepted: no penalty)");
        vm.prank(REQUESTER);
        vm.expectRevert(Staking.NothingToClaim.selector);
        hub.claim();
        assertSolvent();
    }

    function testFuzz_bondKeepsTheBooks(uint96 a, uint96 b) public {
        a = uint96(bound(a, 1 ether, 1000 ether));
        b = uint96(bound(b, 0, 1000 ether));
        bondAs(NEW, Staking.Role.Validator, a);
        bondAs(NEW, Staking.Role.Validator, b);
        assertEq(stakeOf(NEW), uint256(a) + b, "stake");
        assertSolvent();
    }
}
