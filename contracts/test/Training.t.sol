// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Staking} from "../src/Staking.sol";
import {Training, IStakeWeights} from "../src/Training.sol";

/// @dev Training runs against the hub's validator weights (three validators of 5 ether each).
contract TrainingTest is Fixture {
    Training internal tr;
    uint256 internal constant PROVER_KEY = 0xC0FFEE;
    address internal prover;
    bytes32 internal constant RUN = keccak256("run-1");
    bytes32 internal constant NONCE = keccak256("nonce-1");
    uint64 internal constant RATE = 0.5e18;

    function setUp() public override {
        super.setUp();
        tr = new Training(IStakeWeights(address(hub)), TREASURY, 1 ether, 6 ether, 100);
        prover = vm.addr(PROVER_KEY);
        vm.deal(prover, 10 ether);
        vm.prank(prover);
        tr.registerRun{value: 2 ether}(RUN, NONCE, keccak256("data"), keccak256("proc"), 0, RATE, 5);
    }

    function anchorNext(uint64 lastStep, bytes32 head) internal returns (uint256 index) {
        (,,,,,,, uint32 n,,,) = tr.runs(RUN);
        index = n;
        vm.prank(prover);
        tr.anchor(RUN, lastStep, head);
    }

    function sig(uint256 key, uint64 step, bytes32 head, bool valid, uint16 reason) internal view returns (bytes memory) {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, tr.verdictDigest(RUN, step, head, valid, reason));
        return abi.encodePacked(r, s, v);
    }

    /// @dev Two signatures (10 ether ≥ 6 ether) sorted by signer address.
    function sigs2(uint64 step, bytes32 head, bool valid, uint16 reason) internal view returns (bytes[] memory out) {
        out = new bytes[](2);
        (uint256 a, uint256 b) = vals[0] < vals[1] ? (VAL_KEYS[0], VAL_KEYS[1]) : (VAL_KEYS[1], VAL_KEYS[0]);
        out[0] = sig(a, step, head, valid, reason);
        out[1] = sig(b, step, head, valid, reason);
    }

    function firstAudited(uint256 index, uint64 from, uint64 to) internal view returns (uint64) {
        for (uint64 t = from; t <= to; ++t) {
            if (tr.isAudited(RUN, index, t)) return t;
        }
        revert("no audited step");
    }

    function test_registerRefusesAReplayedNonceALowBondAndBadParams() public {
        vm.deal(address(this), 10 ether);
        vm.expectRevert(abi.encodeWithSelector(Training.NonceReplayed.selector, NONCE));
        tr.registerRun{value: 2 ether}(keccak256("run-2"), NONCE, 0, 0, 0, RATE, 5);
        vm.expectRevert(abi.encodeWithSelector(Training.BondTooLow.selector, 0.5 ether, 1 ether));
        tr.registerRun{value: 0.5 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 0, RATE, 5);
        vm.expectRevert(Training.BadParams.selector);
        tr.registerRun{value: 2 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 1, RATE, 5);
        vm.expectRevert(abi.encodeWithSelector(Training.RunExists.selector, RUN));
        tr.registerRun{value: 2 ether}(RUN, keccak256("n3"), 0, 0, 0, RATE, 5);
    }

    function test_anchorsAreBatchedWindowsByTheProverOnly() public {
        vm.expectRevert(abi.encodeWithSelector(Training.NotProver.selector, address(this)));
        tr.anchor(RUN, 5, keccak256("h5"));
        vm.prank(prover);
        vm.expectRevert(abi.encodeWithSelector(Training.BadWindow.selector, 0, 6));
        tr.anchor(RUN, 6, keccak256("h6"));
        anchorNext(5, keccak256("h5"));
        vm.roll(block.number + 1);
        anchorNext(10, keccak256("h10"));
        (uint64 first, uint64 last,, bytes32 head) = tr.anchors(RUN, 1);
        assertEq(first, 6, "second window starts after the first");
        assertEq(last, 10, "m steps");
        assertEq(head, keccak256("h10"), "head");
    }

    function test_auditDrawNeedsTheBlockAfterTheAnchor() public {
        uint256 index = anchorNext(5, keccak256("h5"));
        vm.expectRevert(abi.encodeWithSelector(Training.DrawNotReady.selector, block.number + 2));
        tr.isAudited(RUN, index, 1);
        vm.roll(block.number + 2);
        bytes32 seed = tr.auditSeed(RUN, index);
        assertEq(seed, blockhash(block.number - 1), "seed is the hash of the block after the anchor");
        uint256 audited;
        for (uint64 t; t <= 5; ++t) {
            bool want = uint256(keccak256(abi.encodePacked(seed, RUN, uint256(t)))) % 1e18 < RATE;
            assertTrue(tr.isAudited(RUN, index, t) == want, "draw rule");
            if (want) audited++;
        }
        assertTrue(!tr.isAudited(RUN, index, 6), "outside the window");
    }

    function test_anInvalidVerdictForfeitsTheBondToTheTreasury() public {
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        vm.roll(block.number + 2);
        uint64 step = firstAudited(index, 0, 5);
        tr.submitVerdict(RUN, index, step, false, 709, sigs2(step, head, false, 709));
        assertEq(tr.auditResult(RUN, step), 2, "failed");
        assertEq(tr.credits(TREASURY), 2 ether, "bond to the treasury");
        (, uint96 bond,,,,,,,,, bool slashed) = tr.runs(RUN);
        assertEq(uint256(bond), 0, "bond gone");
        assertTrue(slashed, "slashed");
        vm.prank(prover);
        vm.expectRevert(abi.encodeWithSelector(Training.NotRunning.selector, RUN));
        tr.anchor(RUN, 10, keccak256("h10"));
        bytes[] memory again = sigs2(step, head, true, 0);
        vm.expectRevert(abi.encodeWithSelector(Training.AlreadySettled.selector, RUN, step));
        tr.submitVerdict(RUN, index, step, true, 0, again);
    }

    function test_aValidVerdictKeepsTheBondAndItIsReturnedAfterTheWindow() public {
        bytes32 head = keccak256("h3");
        uint256 index = anchorNext(3, head); // a short first window ends the run
        vm.roll(block.number + 2);
        uint64 step = firstAudited(index, 0, 3);
        tr.submitVerdict(RUN, index, step, true, 0, sigs2(step, head, true, 0));
        assertEq(tr.auditResult(RUN, step), 1, "passed");
        vm.prank(prover);
        vm.expectRevert();
        tr.withdrawBond(RUN);
        vm.roll(block.number + 200);
        uint256 before = prover.balance;
        vm.prank(prover);
        tr.withdrawBond(RUN);
        assertEq(prover.balance - before, 2 ether, "bond back");
    }

    function test_verdictsNeedWeightSortedSignersAndAnAuditedStep() public {
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        vm.roll(block.number + 2);
        uint64 step = firstAudited(index, 0, 5);
        bytes[] memory one = new bytes[](1);
        one[0] = sig(VAL_KEYS[0], step, head, false, 709);
        vm.expectRevert(abi.encodeWithSelector(Training.WeightTooLow.selector, 5 ether, 6 ether));
        tr.submitVerdict(RUN, index, step, false, 709, one);
        bytes[] memory twice = new bytes[](2);
        twice[0] = one[0];
        twice[1] = one[0];
        vm.expectRevert(Training.SignersNotSorted.selector);
        tr.submitVerdict(RUN, index, step, false, 709, twice);
        bytes[] memory outsider = sigs2(step, head, false, 709);
        outsider[1] = sig(PROVER_KEY, step, head, false, 709);
        vm.expectRevert();
        tr.submitVerdict(RUN, index, step, false, 709, outsider);
        // a signature over another head or outcome recovers another signer: not a validator
        bytes[] memory wrong = sigs2(step, keccak256("other"), false, 709);
        vm.expectRevert();
        tr.submitVerdict(RUN, index, step, false, 709, wrong);
    }

    function test_stakeBondedAfterTheAnchorDoesNotCount() public {
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        uint256 lateKey = 0xD00D;
        bondAs(vm.addr(lateKey), Staking.Role.Validator, 50 ether);
        vm.roll(block.number + 2);
        uint64 step = firstAudited(index, 0, 5);
        bytes[] memory late = new bytes[](1);
        late[0] = sig(lateKey, step, head, false, 709);
        vm.expectRevert(abi.encodeWithSelector(Training.NotAValidator.selector, vm.addr(lateKey)));
        tr.submitVerdict(RUN, index, step, false, 709, late);
    }
}
