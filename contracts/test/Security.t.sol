// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Staking} from "../src/Staking.sol";
import {ModelRegistry} from "../src/ModelRegistry.sol";

/// @dev Exposes the committee draw to fuzz it directly.
contract DrawHarness is Verinfer {
    constructor(Config memory c) Verinfer(c) {}

    function draw(bytes32 seed, uint256 commitBlock) external view returns (uint256[] memory) {
        return _drawCommittee(seed, commitBlock);
    }
}

/// @dev Issue 15's attacks on the contract, each performed against the fixed contract.
contract SecurityTest is Fixture {
    bytes32 internal constant ROOT = keccak256("artifact");
    uint256 internal constant ATTACKER_KEY = 0xBAD;

    function isMember(address[] memory committee, address who) internal pure returns (bool) {
        for (uint256 j; j < committee.length; ++j) {
            if (committee[j] == who) return true;
        }
        return false;
    }

    function assertSameCommittee(address[] memory a, address[] memory b) internal pure {
        assertEq(a.length, b.length, "committee size unchanged");
        for (uint256 j; j < a.length; ++j) {
            assertEq(a[j], b[j], "committee member unchanged");
        }
    }

    // ---- finding 1: a validator chose its own committee by topping up after the seed was public ----

    /// @dev The reported attack: after the seed is known the attacker bonds 1000 ether more (to become the only
    ///      member of a with-replacement draw) and votes the honest operator invalid, twice. Now the committee
    ///      is fixed at the commit and has three members, so its lone vote never settles anything.
    function test_topUpAfterTheCommitCannotChooseTheCommittee() public {
        address attacker = vm.addr(ATTACKER_KEY);
        bondAs(attacker, Staking.Role.Validator, 1 ether);
        vm.roll(vm.getBlockNumber() + 1);
        for (uint256 round; round < 4; ++round) {
            uint256 id = committed(ROOT);
            (bool checked, address[] memory before) = hub.selectionOf(id);
            assertTrue(checked, "always checked (min rate 100 %)");
            bondAs(attacker, Staking.Role.Validator, 1000 ether);
            (, address[] memory afterwards) = hub.selectionOf(id);
            assertSameCommittee(before, afterwards);
            assertEq(afterwards.length, 3, "three members");
            if (isMember(afterwards, attacker)) {
                hub.submitVerdicts(id, commitment(ROOT), votes1(vote(ATTACKER_KEY, id, ROOT, false)));
                assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Committed), "one invalid vote is no quorum");
            }
        }
        assertEq(stakeOf(op), 10 ether, "honest operator not slashed");
        assertTrue(!isJailed(op), "honest operator not jailed");
    }

    /// @dev Bonding, topping up, unbonding and new validators after the commit never change a drawn committee.
    function testFuzz_committeeDependsOnlyOnStateBeforeTheCommit(uint96[3] memory before, uint96[3] memory later, uint8 unbond)
        public
    {
        address[3] memory extra = [vm.addr(0xE1), vm.addr(0xE2), vm.addr(0xE3)];
        for (uint256 i; i < 2; ++i) {
            bondAs(extra[i], Staking.Role.Validator, bound(before[i], 1 ether, 1e24));
        }
        vm.roll(vm.getBlockNumber() + 1);
        uint256 id = committed(ROOT);
        (bool checked, address[] memory drawn) = hub.selectionOf(id);
        assertTrue(checked, "checked");
        assertEq(drawn.length, 3, "full committee");
        for (uint256 i; i < 3; ++i) {
            bondAs(i < 2 ? extra[i] : vals[i], Staking.Role.Validator, bound(later[i], 0, 1e27));
        }
        bondAs(extra[2], Staking.Role.Validator, 1e27); // a newcomer after the commit
        vm.prank(vals[unbond % 3]);
        hub.requestUnbond();
        vm.roll(vm.getBlockNumber() + 3);
        (bool checkedLater, address[] memory again) = hub.selectionOf(id);
        assertTrue(checkedLater, "still checked");
        assertSameCommittee(drawn, again);
    }

    /// @dev Any seed and any stakes: min(committeeSize, eligible) distinct members, every one eligible.
    function testFuzz_drawIsDistinctAndFull(bytes32 seed, uint96[5] memory stakes, uint8 eligibleMask) public {
        DrawHarness h = new DrawHarness(config());
        uint256 eligible;
        for (uint256 i; i < 5; ++i) {
            address who = vm.addr(0xC0 + i);
            vm.deal(who, 1e27);
            vm.prank(who);
            h.bond{value: bound(stakes[i], 1 ether, 1e26)}(Staking.Role.Validator);
            if (eligibleMask & (1 << i) == 0) {
                vm.prank(who);
                h.requestUnbond();
            } else {
                ++eligible;
            }
        }
        vm.roll(vm.getBlockNumber() + 1);
        uint256[] memory members = h.draw(seed, vm.getBlockNumber());
        assertEq(members.length, eligible < 3 ? eligible : 3, "min(size, eligible) members");
        for (uint256 a; a < members.length; ++a) {
            assertTrue(eligibleMask & (1 << members[a]) != 0, "only eligible validators");
            for (uint256 b = a + 1; b < members.length; ++b) {
                assertTrue(members[a] != members[b], "distinct");
            }
        }
    }

    /// @dev With 3 equal validators about 1 draw in 9 used to be a one-member committee; now never.
    function test_noCheckRestsOnOneJudge() public {
        for (uint256 i; i < 60; ++i) {
            uint256 id = committed(ROOT);
            (, address[] memory committee) = hub.selectionOf(id);
            assertEq(committee.length, 3, "every committee has the minimum size");
        }
    }

    /// @dev Fewer eligible validators than the minimum at the commit: not checkable, and it stays so.
    function test_tooFewValidatorsAtTheCommitMeansNotCheckable() public {
        vm.prank(vals[0]);
        hub.requestUnbond();
        vm.roll(vm.getBlockNumber() + 1);
        uint256 id = committed(ROOT);
        (bool checked, address[] memory committee) = hub.selectionOf(id);
        assertTrue(!checked, "not checkable with 2 validators");
        assertEq(committee.length, 0, "no committee");
        bondAs(vm.addr(ATTACKER_KEY), Staking.Role.Validator, 100 ether); // a third one after the commit
        vm.roll(vm.getBlockNumber() + 1);
        (checked,) = hub.selectionOf(id);
        assertTrue(!checked, "a validator bonding after the commit does not make it checkable");
        Verinfer.Vote[] memory lone = votes1(vote(VAL_KEYS[1], id, ROOT, false));
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotChecked.selector, id));
        hub.submitVerdicts(id, commitment(ROOT), lone);
    }

    /// @dev The check decision uses P as it stood at the commit, not at submission.
    function test_checkRateIsFixedAtTheCommit() public {
        uint256 id = committed(ROOT);
        assertEq(hub.getInference(id).checkRate, 1e18, "max(minCheckRate = 100 %, P)");
        hub.setModelState(MODEL, ModelRegistry.ModelState.Verifying);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Measuring);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Registered);
        (bool checked,) = hub.selectionOf(id);
        assertTrue(checked, "a later phase change does not uncheck a committed inference");
    }

    // ---- finding 2: free requests + expire drained an operator's stake ----

    function test_requestsBelowTheMinimumFeePlusBondRevert() public {
        vm.prank(REQUESTER);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.FeeTooLow.selector, 0, BOND + MIN_FEE));
        hub.requestInference(op, MODEL, 0, 1, params());
        vm.prank(REQUESTER);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.FeeTooLow.selector, BOND, BOND + MIN_FEE));
        hub.requestInference{value: BOND}(op, MODEL, 0, 1, params());
    }

    /// @dev The reported drain: many cheap requests, all expired. An operator that never accepted them loses nothing.
    function test_manyUnacceptedRequestsCannotDrainAnOperator() public {
        uint256[] memory ids = new uint256[](40);
        for (uint256 i; i < ids.length; ++i) {
            vm.prank(REQUESTER);
            ids[i] = hub.requestInference{value: MIN_FEE + BOND}(op, MODEL, bytes32(i), 1, params());
        }
        vm.roll(vm.getBlockNumber() + 21);
        for (uint256 i; i < ids.length; ++i) {
            hub.expire(ids[i]);
        }
        assertEq(stakeOf(op), 10 ether, "operator stake intact");
        assertEq(hub.credits(REQUESTER), 40 * (MIN_FEE + BOND), "requester refunded, no profit");
        assertSolvent();
    }

    function test_onlyTheOperatorAcceptsOnceBeforeTheDeadline() public {
        uint256 id = request();
        vm.prank(REQUESTER);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotOperator.selector, REQUESTER));
        hub.acceptInference(id);
        accept(id);
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.AlreadyAccepted.selector, id));
        hub.acceptInference(id);
        uint256 late = request();
        vm.roll(vm.getBlockNumber() + 21);
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.CommitTooLate.selector, vm.getBlockNumber() - 1));
        hub.acceptInference(late);
    }

    // ---- finding 3: one already-recorded vote reverted the whole quorum batch ----

    /// @dev Someone submits a gossiped vote first; the quorum batch that repeats it still records the rest and settles.
    function test_aBatchRepeatingARecordedVoteStillSettles() public {
        uint256 id = committed(ROOT);
        uint256[] memory keys = committeeKeys(id);
        Verinfer.Vote memory first = vote(keys[0], id, ROOT, false);
        hub.submitVerdicts(id, commitment(ROOT), votes1(first));
        Verinfer.Vote[] memory batch = new Verinfer.Vote[](2);
        (batch[0], batch[1]) = (first, vote(keys[1], id, ROOT, false));
        hub.submitVerdicts(id, commitment(ROOT), batch);
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Invalid), "settled by the quorum");
        assertEq(hub.getInference(id).invalidVotes, 2, "each vote counted once");
        assertTrue(hub.hasVoted(id, vm.addr(keys[1])) && !hub.hasVoted(id, vm.addr(keys[2])), "hasVoted");
        assertSolvent();
    }
}

/// @dev An accepted request that times out costs the operator at most the requester's bond.
contract CappedTimeoutPenaltyTest is Fixture {
    function config() internal pure override returns (Verinfer.Config memory c) {
        c = super.config();
        c.timeoutSlashBps = 5000; // half the stake: far above the bond
    }

    function test_anAcceptedTimeoutIsPenalisedNeverAboveTheBond() public {
        uint256 id = request();
        accept(id);
        vm.roll(vm.getBlockNumber() + 21);
        hub.expire(id);
        assertEq(stakeOf(op), 10 ether - BOND, "penalty capped by the bond");
        assertEq(hub.credits(REQUESTER), FEE + BOND + BOND, "refund + bond + penalty");
        assertSolvent();
    }
}
