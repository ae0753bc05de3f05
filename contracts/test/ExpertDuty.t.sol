// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Protocol} from "../src/Protocol.sol";
import {ExpertDuty} from "../src/ExpertDuty.sol";
import {ModelRegistry} from "../src/ModelRegistry.sol";

/// @dev Expert duties on a 2-layer, 2-expert MoE shape of the fixture's model; three validators (5 ether each),
///      two drawn per duty. vals[0] holds the whole model, vals[1] layer 0's experts and every router, vals[2]
///      layer 1's experts, every router and the link.
contract ExpertDutyTest is Fixture {
    ExpertDuty internal ed;
    uint16 internal constant LAYERS = 2;
    uint16 internal constant EXPERTS = 2;
    bytes32 internal constant ROUTER_ROOT = keccak256("router-root");
    bytes32 internal constant DENSE_FP = keccak256("fingerprints");

    function setUp() public override {
        super.setUp();
        ed = new ExpertDuty(hub, 2);
        hub.grantRole(hub.MODULE_ROLE(), address(ed));
        ed.setShape(MODEL, LAYERS, EXPERTS);
        uint32[] memory none = new uint32[](0);
        vm.prank(vals[0]);
        ed.declareHoldings(MODEL, true, none);
        uint32[] memory first = new uint32[](4);
        (first[0], first[1], first[2], first[3]) = (key(0, 0), key(0, 1), key(0, 0xFFFF), key(1, 0xFFFF));
        vm.prank(vals[1]);
        ed.declareHoldings(MODEL, false, first);
        uint32[] memory two = new uint32[](5);
        (two[0], two[1], two[2], two[3], two[4]) = (key(1, 0), key(1, 1), key(0, 0xFFFF), key(1, 0xFFFF), key(0, 0xFFFE));
        vm.prank(vals[2]);
        ed.declareHoldings(MODEL, false, two);
        vm.roll(vm.getBlockNumber() + 1);
    }

    function key(uint16 layer, uint16 expert) internal pure returns (uint32) {
        return (uint32(layer) << 16) | expert;
    }

    /// @dev Expert (0, 1) never routed; the others with leaves.
    function opening() internal pure returns (ExpertDuty.MoeOpening memory o) {
        o.outputHash = keccak256("output");
        o.artifactRoot = keccak256("artifact");
        o.fingerprintHash = DENSE_FP;
        o.routerRoot = ROUTER_ROOT;
        o.counts = new uint32[](4);
        o.expertRoots = new bytes32[](4);
        (o.counts[0], o.counts[1], o.counts[2], o.counts[3]) = (3, 0, 2, 1);
        (o.expertRoots[0], o.expertRoots[2], o.expertRoots[3]) = (keccak256("e00"), keccak256("e10"), keccak256("e11"));
    }

    function moeRootOf(ExpertDuty.MoeOpening memory o) internal view returns (bytes32) {
        bytes32 experts = ed.computeExpertsRoot(ExpertDuty.Shape(LAYERS, EXPERTS), o.counts, o.expertRoots);
        return keccak256(abi.encodePacked(o.routerRoot, experts));
    }

    /// @dev Request and commit with the MoE root bound into the fingerprint hash, then pass the selection block.
    function committedMoe(ExpertDuty.MoeOpening memory o) internal returns (uint256 id) {
        id = request();
        bytes32 fp = keccak256(abi.encodePacked(o.fingerprintHash, moeRootOf(o)));
        vm.prank(op);
        hub.commitInference(id, o.outputHash, o.artifactRoot, fp);
        vm.roll(vm.getBlockNumber() + 2);
    }

    function keyOf(address who) internal view returns (uint256) {
        for (uint256 i; i < 3; ++i) {
            if (vals[i] == who) return VAL_KEYS[i];
        }
        revert("not a validator");
    }

    function expertVote(uint256 signerKey, uint256 id, uint32 duty, bool valid) internal view returns (ExpertDuty.ExpertVote memory) {
        (bytes32 moeRoot,,,,,) = ed.opened(id);
        uint16 reason = valid ? 0 : 903;
        bytes32 scores = keccak256(abi.encode("scores", signerKey, duty));
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(signerKey, ed.verdictDigest(id, duty, moeRoot, valid, reason, scores));
        return ExpertDuty.ExpertVote(duty, valid, reason, scores, abi.encodePacked(r, s, v));
    }

    function one(ExpertDuty.ExpertVote memory a) internal pure returns (ExpertDuty.ExpertVote[] memory out) {
        out = new ExpertDuty.ExpertVote[](1);
        out[0] = a;
    }

    function test_theDrawCoversEveryUsedDutyWithItsHoldersOnly() public {
        uint256 id = committedMoe(opening());
        ed.assignDuties(id, opening());
        (bytes32 moeRoot,, uint32 commitBlock, uint16 duties, uint16 uncovered, bool slashed) = ed.opened(id);
        assertEq(moeRoot, moeRootOf(opening()), "moeRoot stored");
        assertEq(commitBlock, hub.getInference(id).commitBlock, "commit block");
        assertEq(duties, 6, "3 routed experts, 2 routers, the link");
        assertEq(uncovered, 0, "every duty has two holders");
        assertTrue(!slashed, "nothing slashed");
        assertEq(ed.assignedTo(id, key(0, 1)).length, 0, "an expert never routed has no duty");
        uint32[6] memory used = [key(0, 0), key(1, 0), key(1, 1), key(0, 0xFFFF), key(1, 0xFFFF), key(0, 0xFFFE)];
        for (uint256 k; k < used.length; ++k) {
            address[] memory a = ed.assignedTo(id, used[k]);
            assertEq(a.length, 2, "two per duty");
            assertTrue(a[0] != a[1], "distinct");
            for (uint256 j; j < 2; ++j) {
                assertTrue(ed.holdsAt(MODEL, a[j], used[k], commitBlock), "drawn among its holders");
            }
        }
        // exactly two hold layer 0's expert 0 (vals 0 and 1) and the link (vals 0 and 2): both are drawn
        address[] memory e00 = ed.assignedTo(id, key(0, 0));
        assertTrue(e00[0] != vals[2] && e00[1] != vals[2], "vals[2] does not hold layer0.e0");
        ExpertDuty.MoeOpening memory o = opening();
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.AlreadyAssigned.selector, id));
        ed.assignDuties(id, o);
    }

    function test_theOpeningMustBeWhatTheOperatorCommitted() public {
        uint256 id = committedMoe(opening());
        ExpertDuty.MoeOpening memory o = opening();
        o.counts[1] = 0;
        o.counts[3] = 0; // hiding a routed expert changes expertsRoot
        vm.expectRevert(ExpertDuty.CommitmentMismatch.selector);
        ed.assignDuties(id, o);
        o = opening();
        o.routerRoot = keccak256("another router");
        vm.expectRevert(ExpertDuty.CommitmentMismatch.selector);
        ed.assignDuties(id, o);
        o = opening();
        o.counts = new uint32[](3);
        vm.expectRevert(ExpertDuty.BadOpening.selector);
        ed.assignDuties(id, o);
        // a dense commitment (moeRoot not bound in) opens nothing
        uint256 dense = committed(keccak256("artifact"));
        o = opening();
        vm.expectRevert(ExpertDuty.CommitmentMismatch.selector);
        ed.assignDuties(dense, o);
    }

    function test_onlyAssignedValidatorsJudgeAndAFailedDutySlashesTheOperatorOnce() public {
        uint256 id = committedMoe(opening());
        ed.assignDuties(id, opening());
        uint32 duty = key(1, 1); // held by vals 0 and 2 only
        address[] memory a = ed.assignedTo(id, duty);
        ExpertDuty.ExpertVote[] memory outsider = one(expertVote(VAL_KEYS[1], id, duty, false));
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.NotAssignedTo.selector, duty, vals[1]));
        ed.submitExpertVerdicts(id, outsider);
        ExpertDuty.ExpertVote[] memory unassigned = one(expertVote(VAL_KEYS[0], id, key(0, 1), false));
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.DutyNotAssigned.selector, id, key(0, 1)));
        ed.submitExpertVerdicts(id, unassigned);
        // an inference verdict of the hub's domain over the same fields is not an expert verdict
        (bytes32 moeRoot,,,,,) = ed.opened(id);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(VAL_KEYS[0], hub.verdictDigest(id, moeRoot, false, 903, bytes32(0), 0));
        ExpertDuty.ExpertVote[] memory crossDomain = one(ExpertDuty.ExpertVote(duty, false, 903, bytes32(0), abi.encodePacked(r, s, v)));
        vm.expectRevert();
        ed.submitExpertVerdicts(id, crossDomain);

        uint256 before = stakeOf(op);
        uint256 treasuryBefore = hub.credits(TREASURY);
        ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[0]), id, duty, false)));
        (,,, uint8 open) = ed.duties(id, duty);
        assertEq(open, 0, "one of two assigned is no verdict");
        assertEq(stakeOf(op), before, "nothing slashed yet");
        ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[0]), id, duty, false))); // a relayed repeat is skipped
        ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[1]), id, duty, false)));
        (,,, uint8 failed) = ed.duties(id, duty);
        assertEq(failed, 2, "both assigned holders failed it");
        assertEq(stakeOf(op), before / 2, "the hub's slashBps");
        assertEq(hub.credits(TREASURY) - treasuryBefore, before / 2, "to the treasury");
        assertEq(spoofP(op), Protocol.P_MAX, "reputation at its worst");
        assertTrue(isJailed(op), "jailed");
        (,,,,, bool slashed) = ed.opened(id);
        assertTrue(slashed, "recorded");
        // a second failed duty of the same inference settles but slashes no more
        uint32 link = key(0, 0xFFFE);
        address[] memory l = ed.assignedTo(id, link);
        ExpertDuty.ExpertVote[] memory both = new ExpertDuty.ExpertVote[](2);
        (both[0], both[1]) = (expertVote(keyOf(l[0]), id, link, false), expertVote(keyOf(l[1]), id, link, false));
        ed.submitExpertVerdicts(id, both);
        (,,, uint8 linkResult) = ed.duties(id, link);
        assertEq(linkResult, 2, "failed");
        assertEq(stakeOf(op), before / 2, "once per inference");
    }

    function test_drawsAreLazyFixedAtTheCommitAndStoredByTheFirstVerdict() public {
        uint256 id = committedMoe(opening());
        ed.assignDuties(id, opening());
        uint32[] memory drawable = ed.drawableDuties(id);
        assertEq(drawable.length, 6, "the used and covered duties, in holdings-bit order");
        assertEq(drawable[0], key(0, 0), "expert (0, 0) first; (0, 1) was never routed");
        assertEq(drawable[5], key(0, 0xFFFE), "the link last");
        uint32 duty = key(1, 1); // held by vals 0 and 2 at the commit
        address[] memory before = ed.assignedTo(id, duty);
        (uint64 stored,,,) = ed.duties(id, duty);
        assertEq(stored, 0, "nothing stored at the open");
        // after the open vals[2] drops every holding: the draw still reads the holdings in force at the commit
        uint32[] memory none = new uint32[](0);
        vm.prank(vals[2]);
        ed.declareHoldings(MODEL, false, none);
        vm.roll(vm.getBlockNumber() + 1);
        address[] memory later = ed.assignedTo(id, duty);
        assertEq(later.length, 2, "still two");
        assertEq(later[0], before[0], "the same draw");
        assertEq(later[1], before[1], "the same draw");
        ed.submitExpertVerdicts(id, one(expertVote(keyOf(before[0]), id, duty, true)));
        (stored,,,) = ed.duties(id, duty);
        assertTrue(stored != 0, "the first counted verdict stores the draw");
        for (uint256 v; v < 3; ++v) { // each validator's duties in one call: exactly the draws naming it
            uint32[] memory mine = ed.dutiesOf(id, vals[v]);
            uint256 named = 0;
            for (uint256 k; k < drawable.length; ++k) {
                address[] memory a = ed.assignedTo(id, drawable[k]);
                if (a[0] == vals[v] || a[1] == vals[v]) {
                    assertEq(mine[named++], drawable[k], "in bit order");
                }
            }
            assertEq(mine.length, named, "no other duty");
        }
        assertEq(ed.dutiesOf(id, address(0xBEEF)).length, 0, "not a validator at the commit");
        address[] memory after_ = ed.assignedTo(id, duty);
        assertEq(after_[0], before[0], "stored as drawn");
        assertEq(after_[1], before[1], "stored as drawn");
        ExpertDuty.ExpertVote[] memory unrouted = one(expertVote(VAL_KEYS[0], id, key(0, 1), true));
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.DutyNotAssigned.selector, id, key(0, 1)));
        ed.submitExpertVerdicts(id, unrouted); // never routed: never drawable
    }

    function test_aPassedDutyCostsNothingAndASplitOneStaysOpen() public {
        uint256 id = committedMoe(opening());
        ed.assignDuties(id, opening());
        uint32 duty = key(0, 0xFFFF);
        address[] memory a = ed.assignedTo(id, duty);
        ExpertDuty.ExpertVote[] memory split = new ExpertDuty.ExpertVote[](2);
        (split[0], split[1]) = (expertVote(keyOf(a[0]), id, duty, true), expertVote(keyOf(a[1]), id, duty, false));
        uint256 before = stakeOf(op);
        ed.submitExpertVerdicts(id, split);
        (,,, uint8 result) = ed.duties(id, duty);
        assertEq(result, 0, "1 of 2 each way: no majority");
        uint32 other = key(1, 0xFFFF);
        address[] memory b = ed.assignedTo(id, other);
        ExpertDuty.ExpertVote[] memory pass = new ExpertDuty.ExpertVote[](2);
        (pass[0], pass[1]) = (expertVote(keyOf(b[0]), id, other, true), expertVote(keyOf(b[1]), id, other, true));
        ed.submitExpertVerdicts(id, pass);
        (,,, uint8 passed) = ed.duties(id, other);
        assertEq(passed, 1, "passed");
        assertEq(stakeOf(op), before, "stake intact");
        assertTrue(!isJailed(op), "free");
    }

    function test_holdingsDeclaredAfterTheCommitDoNotCountAndAnUnheldDutyStaysUncovered() public {
        uint256 id = request();
        ExpertDuty.MoeOpening memory o = opening();
        bytes32 fp = keccak256(abi.encodePacked(o.fingerprintHash, moeRootOf(o)));
        vm.prank(op);
        hub.commitInference(id, o.outputHash, o.artifactRoot, fp);
        // in the commit's block vals[1] claims layer 1's experts and vals[2] drops everything: neither counts here
        uint32[] memory none = new uint32[](0);
        uint32[] memory claim = new uint32[](5);
        (claim[0], claim[1], claim[2], claim[3], claim[4]) = (key(0, 0), key(1, 0), key(1, 1), key(0, 0xFFFF), key(1, 0xFFFF));
        vm.prank(vals[1]);
        ed.declareHoldings(MODEL, false, claim);
        vm.prank(vals[2]);
        ed.declareHoldings(MODEL, false, none);
        vm.roll(vm.getBlockNumber() + 2);
        uint32 commitBlock = hub.getInference(id).commitBlock;
        assertTrue(!ed.holdsAt(MODEL, vals[1], key(1, 1), commitBlock), "a later claim does not count");
        assertTrue(ed.holdsAt(MODEL, vals[2], key(1, 1), commitBlock), "a later drop does not either");
        assertTrue(ed.holdsAt(MODEL, vals[1], key(1, 1), commitBlock + 1), "it counts for later commits");
        ed.assignDuties(id, o);
        (,,, uint16 duties, uint16 uncovered,) = ed.opened(id);
        assertEq(duties, 6, "six duties");
        assertEq(uncovered, 0, "all covered by the holdings at the commit");

        // a later inference: every expert and router now held by vals 0 and 1, the link by vals 0 alone: uncovered
        uint256 later = committedMoe(opening());
        ed.assignDuties(later, opening());
        (,,,, uint16 uncoveredLater,) = ed.opened(later);
        assertEq(uncoveredLater, 1, "the link has one holder of the two needed");
        assertEq(ed.assignedTo(later, key(0, 0xFFFE)).length, 0, "never a smaller committee");
        assertEq(ed.assignedTo(later, key(1, 1)).length, 2, "the rest is still drawn");
    }

    function cycleKey(uint256 v) internal pure returns (uint32) {
        return (uint32(v % 2) << 16) | uint32(v / 2 % 2); // (0,0) (1,0) (0,1) (1,1) (0,0) (1,0)
    }

    function test_holdingsAtFindsTheDeclarationInForceAtEachCommit() public {
        uint32[] memory only = new uint32[](1);
        uint256[] memory blocks = new uint256[](6);
        for (uint256 v; v < 6; ++v) {
            only[0] = cycleKey(v);
            vm.prank(vals[1]);
            ed.declareHoldings(MODEL, false, only);
            blocks[v] = vm.getBlockNumber();
            vm.roll(vm.getBlockNumber() + 1 + v);
        }
        assertEq(ed.declarations(MODEL, vals[1]), 7, "setUp's and six more");
        for (uint256 v; v < 6; ++v) {
            assertTrue(ed.holdsAt(MODEL, vals[1], cycleKey(v), blocks[v] + 1), "in force from the next block");
            if (v < 5) assertTrue(!ed.holdsAt(MODEL, vals[1], cycleKey(v + 1), blocks[v] + 1), "the next not yet");
        }
        assertTrue(ed.holdsAt(MODEL, vals[1], key(0, 0xFFFF), blocks[0]), "setUp's declaration before the first");
        assertTrue(!ed.holdsAt(MODEL, vals[1], key(0, 0xFFFF), blocks[0] + 1), "replaced after it");
        assertTrue(!ed.holdsAt(MODEL, vals[0], key(0, 0), 1), "nothing declared that early");
    }

    function test_windowsShapesAndParams() public {
        uint256 id = committedMoe(opening());
        vm.roll(vm.getBlockNumber() + 100);
        ExpertDuty.MoeOpening memory o = opening();
        vm.expectRevert();
        ed.assignDuties(id, o);
        vm.prank(vals[0]);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.NotGovernor.selector, vals[0]));
        ed.setShape(keccak256("other"), 2, 2);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.ShapeExists.selector, MODEL));
        ed.setShape(MODEL, 2, 2);
        vm.expectRevert(ExpertDuty.BadParams.selector);
        new ExpertDuty(hub, 1); // never one judge
        uint32[] memory bad = new uint32[](1);
        bad[0] = key(2, 0);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.BadDuty.selector, key(2, 0)));
        ed.declareHoldings(MODEL, false, bad);
        assertEq(ed.dutyBit(MODEL, key(1, 1)), 3, "experts first");
        assertEq(ed.dutyBit(MODEL, key(1, 0xFFFF)), 5, "then routers");
        assertEq(ed.dutyBit(MODEL, key(0, 0xFFFE)), 6, "then the link");
    }

    function test_aVerdictAfterTheCheckWindowIsRefusedAndNonPunitiveModelsAreNotSlashed() public {
        uint256 id = committedMoe(opening());
        ed.assignDuties(id, opening());
        uint32 duty = key(1, 1);
        address[] memory a = ed.assignedTo(id, duty);
        ExpertDuty.ExpertVote[] memory late = one(expertVote(keyOf(a[0]), id, duty, false));
        uint256 endsAt = uint256(hub.getInference(id).commitBlock) + 100;
        vm.roll(endsAt + 1);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.CheckWindowOver.selector, endsAt));
        ed.submitExpertVerdicts(id, late);

        // a model still measuring: a failed duty is recorded, nobody is slashed
        bytes32 m2 = keccak256("measuring-model");
        hub.registerModel(m2, 5, 64, 1e16, 0, 1e18, keccak256("p2"), uint96(MIN_FEE), stops());
        hub.setModelState(m2, ModelRegistry.ModelState.Measuring);
        ed.setShape(m2, LAYERS, EXPERTS);
        uint32[] memory none = new uint32[](0);
        for (uint256 i; i < 3; ++i) {
            vm.prank(vals[i]);
            ed.declareHoldings(m2, true, none);
        }
        vm.roll(vm.getBlockNumber() + 1);
        vm.prank(REQUESTER);
        uint256 id2 = hub.requestInference{value: FEE + BOND}(op, m2, keccak256("prompt"), USER_SEED, params());
        ExpertDuty.MoeOpening memory o = opening();
        bytes32 fp = keccak256(abi.encodePacked(o.fingerprintHash, moeRootOf(o)));
        vm.prank(op);
        hub.commitInference(id2, o.outputHash, o.artifactRoot, fp);
        vm.roll(vm.getBlockNumber() + 2);
        ed.assignDuties(id2, o);
        address[] memory b = ed.assignedTo(id2, duty);
        ExpertDuty.ExpertVote[] memory both = new ExpertDuty.ExpertVote[](2);
        (both[0], both[1]) = (expertVote(keyOf(b[0]), id2, duty, false), expertVote(keyOf(b[1]), id2, duty, false));
        uint256 before = stakeOf(op);
        ed.submitExpertVerdicts(id2, both);
        (,,, uint8 result) = ed.duties(id2, duty);
        assertEq(result, 2, "failed");
        assertEq(stakeOf(op), before, "not punitive: nobody slashed");
        assertTrue(!isJailed(op), "free");
    }
}
