// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Staking} from "../src/Staking.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {ModelRegistry} from "../src/ModelRegistry.sol";

contract InferenceTest is Fixture {
    function test_requestEscrowsTheFee() public {
        uint256 id = request();
        assertEq(id, 1, "first id");
        assertEq(hub.totalEscrow(), FEE + BOND, "escrow: fee and bond");
        assertEq(hub.getInference(id).fee, FEE, "fee");
        assertEq(hub.getInference(id).bond, BOND, "bond");
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Requested), "status");
        assertSolvent();
    }

    function test_constructorRefusesInconsistentConfigs() public {
        Verinfer.Config memory c = config();
        c.checkWindow = 255; // block hashes last 256 blocks: selection must be readable for the whole window
        vm.expectRevert(Verinfer.BadConfig.selector);
        new Verinfer(c);
        c = config();
        c.unbondingDelay = c.commitWindow + c.fraudWindow; // stake could leave before a fraud proof
        vm.expectRevert(Verinfer.BadConfig.selector);
        new Verinfer(c);
        c = config();
        c.treasury = address(0);
        vm.expectRevert(Verinfer.BadConfig.selector);
        new Verinfer(c);
        c = config();
        c.committeeSize = 17;
        vm.expectRevert(Verinfer.BadConfig.selector);
        new Verinfer(c);
        c = config();
        c.slashBps = 10_001;
        vm.expectRevert(Verinfer.BadConfig.selector);
        new Verinfer(c);
    }

    function test_requestRevertsForAFeeAboveUint96() public {
        uint256 fee = uint256(type(uint96).max) + 1 + BOND;
        vm.deal(REQUESTER, fee);
        vm.prank(REQUESTER);
        vm.expectRevert(Verinfer.FeeTooLarge.selector);
        hub.requestInference{value: fee}(op, MODEL, 0, 1, params());
    }

    function test_requestRevertsForAnUnknownModel() public {
        bytes32 unknown = keccak256("nope");
        vm.expectRevert(abi.encodeWithSelector(Verinfer.ModelInactive.selector, unknown));
        hub.requestInference(op, unknown, 0, 1, params());
    }

    function test_requestRevertsForNonOperatorsUnbondingOrJailed() public {
        vm.expectRevert(abi.encodeWithSelector(Verinfer.OperatorUnavailable.selector, vals[0]));
        hub.requestInference(vals[0], MODEL, 0, 1, params());
        vm.prank(op);
        hub.requestUnbond();
        vm.expectRevert(abi.encodeWithSelector(Verinfer.OperatorUnavailable.selector, op));
        hub.requestInference(op, MODEL, 0, 1, params());
    }

    function test_commitByTheOperatorBeforeTheDeadline() public {
        uint256 id = request();
        commit(id, keccak256("root"));
        Verinfer.Inference memory inf = hub.getInference(id);
        bytes32 want = keccak256(abi.encode(keccak256("output"), keccak256("root"), keccak256("fingerprints")));
        assertEq(inf.commitment, want, "commitment");
        assertEq(inf.commitBlock, vm.getBlockNumber(), "commit block");
    }

    function test_commitReverts() public {
        uint256 id = request();
        vm.prank(REQUESTER);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotOperator.selector, REQUESTER));
        hub.commitInference(id, bytes32(0), bytes32(0), bytes32(0));
        vm.roll(vm.getBlockNumber() + 21);
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.CommitTooLate.selector, vm.getBlockNumber() - 1));
        hub.commitInference(id, bytes32(0), bytes32(0), bytes32(0));
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, 99, Verinfer.Status.None));
        hub.commitInference(99, bytes32(0), bytes32(0), bytes32(0));
    }

    function test_commitRevertsTwice() public {
        uint256 id = request();
        commit(id, keccak256("root"));
        vm.prank(op);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, id, Verinfer.Status.Committed));
        hub.commitInference(id, bytes32(0), bytes32(0), bytes32(0));
    }

    function test_expireRefundsAndPenalisesAnAcceptedRequest() public {
        uint256 id = request();
        accept(id);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.CommitNotExpired.selector, vm.getBlockNumber() + 20));
        hub.expire(id);
        vm.roll(vm.getBlockNumber() + 21);
        hub.expire(id);
        assertEq(hub.credits(REQUESTER), FEE + BOND + 0.1 ether, "refund + bond + penalty (1 % of 10 ether)");
        assertEq(stakeOf(op), 9.9 ether, "operator penalised");
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, id, Verinfer.Status.Expired));
        hub.expire(id);
        assertSolvent();
    }

    function test_selectionIsFixedOnlyAfterTheCommit() public {
        uint256 id = request();
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, id, Verinfer.Status.Requested));
        hub.selectionOf(id);
        commit(id, keccak256("root"));
        vm.roll(vm.getBlockNumber() + 1);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.SelectionNotReady.selector, vm.getBlockNumber() + 1));
        hub.selectionOf(id);
        vm.roll(vm.getBlockNumber() + 1);
        (bool checked, address[] memory committee) = hub.selectionOf(id);
        assertTrue(checked, "min check rate 1 checks everything");
        assertGe(committee.length, 1, "a committee");
        assertLe(committee.length, 3, "at most committeeSize members");
        vm.roll(vm.getBlockNumber() + 300);
        vm.expectRevert();
        hub.selectionOf(id);
    }

    function test_registeredModelsAreNeverChecked() public {
        hub.setModelState(MODEL, ModelRegistry.ModelState.Verifying);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Measuring);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Registered);
        uint256 id = committed(keccak256("root"));
        (bool checked,) = hub.selectionOf(id);
        assertTrue(!checked, "registered: no checks");
    }

    function testFuzz_checkRateFollowsMinRate(uint64 rate, uint256 salt) public {
        rate = uint64(bound(rate, 0, 1e18));
        hub.setModelParams(MODEL, 1e16, 0, rate, 0);
        uint256 checked;
        uint256 n = 40;
        for (uint256 i; i < n; ++i) {
            uint256 id = request();
            commit(id, keccak256(abi.encode(salt, i)));
            vm.roll(vm.getBlockNumber() + 2);
            (bool c,) = hub.selectionOf(id);
            if (c) ++checked;
        }
        uint256 p = rate > 1e16 ? rate : 1e16; // max(min rate, prior P)
        if (p == 1e18) assertEq(checked, n, "always");
        // loose binomial bounds: 40 draws, ±5 sigma
        uint256 mean = n * p / 1e18;
        uint256 sd = sqrt(n * p / 1e18 * (1e18 - p) / 1e18) + 1;
        assertLe(checked, mean + 5 * sd, "not too many");
        if (mean > 5 * sd) assertGe(checked, mean - 5 * sd, "not too few");
    }

    function sqrt(uint256 x) internal pure returns (uint256 y) {
        y = x;
        uint256 z = (x + 1) / 2;
        while (z < y) (y, z) = (z, (x / z + z) / 2);
    }

    function test_committeesAreStakeWeighted() public {
        // validator 0 holds 97 % of the stake: it should be in (nearly) every committee
        bondAs(vals[0], Staking.Role.Validator, 320 ether);
        vm.roll(vm.getBlockNumber() + 1);
        uint256 hits;
        for (uint256 i; i < 30; ++i) {
            uint256 id = committed(keccak256(abi.encode(i)));
            (, address[] memory committee) = hub.selectionOf(id);
            for (uint256 j; j < committee.length; ++j) {
                if (committee[j] == vals[0]) ++hits;
            }
        }
        assertEq(hits, 30, "heavy validator always drawn (P(miss) = 0.03^3 per inference)");
    }

    function test_validatorsBondedAfterTheCommitAreNotEligible() public {
        uint256 id = request();
        commit(id, keccak256("root"));
        address late = address(0x1A7E);
        bondAs(late, Staking.Role.Validator, 1000 ether);
        vm.roll(vm.getBlockNumber() + 2);
        (, address[] memory committee) = hub.selectionOf(id);
        for (uint256 j; j < committee.length; ++j) {
            assertTrue(committee[j] != late, "late validator excluded");
        }
    }
}
