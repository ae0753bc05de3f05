// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Staking} from "../src/Staking.sol";
import {ExpertDuty} from "../src/ExpertDuty.sol";

/// @dev The state snapshots forge provides (Base's Vm interface does not list them).
interface VmSnapshots {
    function snapshotState() external returns (uint256);
    function revertToState(uint256 snapshotId) external returns (bool);
}

/// @dev Expert duties on a 2-layer, 2-expert MoE shape of the fixture's model; five validators (the fixture's three
///      and two more, 5 ether each), three drawn per duty from all of them, stake settled WEIGHT_DELAY blocks before
///      the commit.
contract ExpertDutyTest is Fixture {
    ExpertDuty internal ed;
    VmSnapshots internal constant snaps = VmSnapshots(address(uint160(uint256(keccak256("hevm cheat code")))));
    uint16 internal constant LAYERS = 2;
    uint16 internal constant EXPERTS = 2;
    uint256 internal constant PER_DUTY = 3;
    uint256 internal constant WEIGHT_DELAY = 5;
    bytes32 internal constant ROUTER_ROOT = keccak256("router-root");
    bytes32 internal constant DENSE_FP = keccak256("fingerprints");
    uint256[4] internal EXTRA_KEYS = [uint256(0xB0B4), 0xB0B5, 0x5B1, 0x5B2]; // two more validators, two sybils
    uint32 internal constant RARE = (uint32(1) << 16) | 1; // expert (1, 1)

    function setUp() public override {
        super.setUp();
        ed = deployModule();
        ed.setShape(MODEL, LAYERS, EXPERTS);
        for (uint256 i; i < 2; ++i) {
            bondAs(vm.addr(EXTRA_KEYS[i]), Staking.Role.Validator, 5 ether);
        }
        vm.roll(vm.getBlockNumber() + WEIGHT_DELAY + 1); // every stake settled
    }

    function deployModule() internal returns (ExpertDuty) {
        return new ExpertDuty(hub, PER_DUTY, WEIGHT_DELAY);
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

    function usedDuties() internal pure returns (uint32[6] memory) {
        return [key(0, 0), key(1, 0), key(1, 1), key(0, 0xFFFF), key(1, 0xFFFF), key(0, 0xFFFE)];
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

    function opened(uint256 id) internal returns (uint256) {
        ed.assignDuties(id, opening());
        return id;
    }

    function keyOf(address who) internal view returns (uint256) {
        for (uint256 i; i < 3; ++i) {
            if (vals[i] == who) return VAL_KEYS[i];
        }
        for (uint256 i; i < EXTRA_KEYS.length; ++i) {
            if (vm.addr(EXTRA_KEYS[i]) == who) return EXTRA_KEYS[i];
        }
        revert("not a validator");
    }

    function moeRootStored(uint256 id) internal view returns (bytes32 moeRoot) {
        (moeRoot,,,,) = ed.opened(id);
    }

    function failedDuties(uint256 id) internal view returns (uint256 failed) {
        (,,,, failed) = ed.opened(id);
    }

    function resultOf(uint256 id, uint32 duty) internal view returns (uint8 result) {
        (,,, result) = ed.duties(id, duty);
    }

    function expertVote(uint256 signerKey, uint256 id, uint32 duty, bool valid)
        internal
        view
        returns (ExpertDuty.ExpertVote memory)
    {
        uint16 reason = valid ? 0 : 903;
        bytes32 scores = keccak256(abi.encode("scores", signerKey, duty));
        (uint8 v, bytes32 r, bytes32 s) =
            vm.sign(signerKey, ed.verdictDigest(id, duty, moeRootStored(id), valid, reason, scores));
        return ExpertDuty.ExpertVote(duty, valid, reason, scores, abi.encodePacked(r, s, v));
    }

    function one(ExpertDuty.ExpertVote memory a) internal pure returns (ExpertDuty.ExpertVote[] memory out) {
        out = new ExpertDuty.ExpertVote[](1);
        out[0] = a;
    }

    function isJudge(address[] memory judges, address who) internal pure returns (bool) {
        for (uint256 j; j < judges.length; ++j) {
            if (judges[j] == who) return true;
        }
        return false;
    }

    function test_everyUsedDutyGetsThreeDistinctJudgesFromAllValidators() public {
        uint256 id = opened(committedMoe(opening()));
        (bytes32 moeRoot,, uint32 commitBlock, uint16 duties, uint16 failed) = ed.opened(id);
        assertEq(moeRoot, moeRootOf(opening()), "moeRoot stored");
        assertEq(commitBlock, hub.getInference(id).commitBlock, "commit block");
        assertEq(duties, 6, "3 routed experts, 2 routers, the link");
        assertEq(failed, 0, "nothing failed");
        assertEq(ed.assignedTo(id, key(0, 1)).length, 0, "an expert never routed has no duty");
        uint32[6] memory used = usedDuties();
        for (uint256 k; k < used.length; ++k) {
            address[] memory a = ed.assignedTo(id, used[k]);
            assertEq(a.length, PER_DUTY, "three per duty");
            assertTrue(a[0] != a[1] && a[1] != a[2] && a[0] != a[2], "distinct");
            for (uint256 j; j < a.length; ++j) {
                assertTrue(ed.settledWeightAt(a[j], commitBlock - 1) > 0, "drawn among the settled validators");
            }
        }
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

    /// @dev Finding 4 of issue 30, performed: two 1-ETH sybils declare only a rare expert, which no one else declares,
    ///      and vote every duty they can invalid. Before: they were its only judges and their two votes slashed the
    ///      operator 10 → 5 ETH and jailed it. Now declarations narrow nothing (the rare duty's judges are drawn
    ///      from every validator) and no duty verdict slashes: the operator keeps its stake.
    function test_sybilsDeclaringARareExpertAreNotItsOnlyJudgesAndCannotSlash() public {
        address[2] memory sybils = [vm.addr(EXTRA_KEYS[2]), vm.addr(EXTRA_KEYS[3])];
        uint32[] memory rare = new uint32[](1);
        rare[0] = RARE;
        uint32[] memory others = new uint32[](3);
        (others[0], others[1], others[2]) = (key(0, 0), key(1, 0), key(0, 0xFFFE));
        for (uint256 i; i < 2; ++i) {
            bondAs(sybils[i], Staking.Role.Validator, 1 ether);
            vm.prank(sybils[i]);
            ed.declareHoldings(MODEL, false, rare);
        }
        for (uint256 i; i < 3; ++i) { // the honest declare every used duty but the rare expert
            vm.prank(vals[i]);
            ed.declareHoldings(MODEL, false, others);
        }
        vm.roll(vm.getBlockNumber() + WEIGHT_DELAY + 1);
        uint256 before = stakeOf(op);
        uint256 honestJudges = 0;
        for (uint256 n; n < 4; ++n) {
            uint256 id = opened(committedMoe(opening()));
            address[] memory judges = ed.assignedTo(id, RARE);
            assertEq(judges.length, PER_DUTY, "the rare expert is judged by a full committee");
            for (uint256 j; j < judges.length; ++j) {
                if (judges[j] != sybils[0] && judges[j] != sybils[1]) ++honestJudges;
            }
            // the sybils vote invalid on every duty they were drawn for, the rare one included
            for (uint256 i; i < 2; ++i) {
                uint32[] memory theirs = ed.dutiesOf(id, sybils[i]);
                for (uint256 k; k < theirs.length; ++k) {
                    ed.submitExpertVerdicts(id, one(expertVote(EXTRA_KEYS[2 + i], id, theirs[k], false)));
                }
            }
            vm.roll(vm.getBlockNumber() + 1);
        }
        assertGe(honestJudges, 4 * (PER_DUTY - 2), "at least one honest judge on the rare duty each time");
        assertEq(stakeOf(op), before, "no duty verdict slashes");
        assertTrue(!isJailed(op), "free");
    }

    function test_aSingleJudgeNeverSettlesADuty() public {
        uint256 id = opened(committedMoe(opening()));
        uint32[6] memory used = usedDuties();
        for (uint256 k; k < used.length; ++k) {
            address[] memory a = ed.assignedTo(id, used[k]);
            ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[0]), id, used[k], false)));
            ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[0]), id, used[k], false))); // a relayed repeat: skipped
            assertEq(resultOf(id, used[k]), 0, "one judge of three decides nothing");
        }
        assertEq(failedDuties(id), 0, "no duty failed");
    }

    function test_aFailedDutyIsEvidenceForTheHubCommitteeAndSlashesNoOne() public {
        uint256 id = opened(committedMoe(opening()));
        uint32 duty = RARE;
        address[] memory a = ed.assignedTo(id, duty);
        uint256 before = stakeOf(op);
        ExpertDuty.ExpertVote[] memory two = new ExpertDuty.ExpertVote[](2);
        (two[0], two[1]) = (expertVote(keyOf(a[0]), id, duty, false), expertVote(keyOf(a[1]), id, duty, false));
        ed.submitExpertVerdicts(id, two);
        assertEq(resultOf(id, duty), 2, "a majority of its three judges failed it");
        assertEq(failedDuties(id), 1, "counted for the hub committee");
        assertEq(stakeOf(op), before, "the module slashes no one");
        assertTrue(!isJailed(op), "free");
        ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[2]), id, duty, true))); // after settling: skipped
        assertEq(resultOf(id, duty), 2, "settled once");
        // a passed duty: a majority valid
        uint32 other = key(1, 0xFFFF);
        address[] memory b = ed.assignedTo(id, other);
        (two[0], two[1]) = (expertVote(keyOf(b[0]), id, other, true), expertVote(keyOf(b[1]), id, other, true));
        ed.submitExpertVerdicts(id, two);
        assertEq(resultOf(id, other), 1, "passed");
        // only the hub committee's quorum verdict settles the inference (and there the hub's rule slashes)
        (, address[] memory committee) = hub.selectionOf(id);
        uint256[2] memory keys = [keyOf(committee[0]), keyOf(committee[1])];
        Verinfer.Commitment memory c = Verinfer.Commitment(
            keccak256("output"), keccak256("artifact"), keccak256(abi.encodePacked(DENSE_FP, moeRootOf(opening())))
        );
        hub.submitVerdicts(id, c, votes1(vote(keys[0], id, c.artifactRoot, false)));
        assertTrue(statusOf(id) == Verinfer.Status.Committed, "one committee member settles nothing");
        hub.submitVerdicts(id, c, votes1(vote(keys[1], id, c.artifactRoot, false)));
        assertTrue(statusOf(id) == Verinfer.Status.Invalid, "the committee's quorum settles it");
    }

    function test_onlyDrawnJudgesVoteAndOnlyOnUsedDuties() public {
        uint256 id = opened(committedMoe(opening()));
        uint32 duty = key(1, 1);
        address[] memory a = ed.assignedTo(id, duty);
        address outsider;
        for (uint256 i; i < 3; ++i) {
            if (!isJudge(a, vals[i])) outsider = vals[i];
        }
        if (outsider == address(0)) {
            for (uint256 i; i < 2; ++i) {
                if (!isJudge(a, vm.addr(EXTRA_KEYS[i]))) outsider = vm.addr(EXTRA_KEYS[i]);
            }
        }
        ExpertDuty.ExpertVote[] memory notDrawn = one(expertVote(keyOf(outsider), id, duty, false));
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.NotAssignedTo.selector, duty, outsider));
        ed.submitExpertVerdicts(id, notDrawn);
        ExpertDuty.ExpertVote[] memory unrouted = one(expertVote(VAL_KEYS[0], id, key(0, 1), false));
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.DutyNotAssigned.selector, id, key(0, 1)));
        ed.submitExpertVerdicts(id, unrouted);
        // an inference verdict of the hub's domain over the same fields is not an expert verdict
        (uint8 v, bytes32 r, bytes32 s) =
            vm.sign(keyOf(a[0]), hub.verdictDigest(id, moeRootStored(id), false, 903, bytes32(0), 0));
        ExpertDuty.ExpertVote[] memory crossDomain =
            one(ExpertDuty.ExpertVote(duty, false, 903, bytes32(0), abi.encodePacked(r, s, v)));
        vm.expectRevert();
        ed.submitExpertVerdicts(id, crossDomain);
    }

    function test_drawsAreLazyFixedAtTheCommitAndStoredByTheFirstVerdict() public {
        uint256 id = opened(committedMoe(opening()));
        uint32[] memory drawable = ed.drawableDuties(id);
        assertEq(drawable.length, 6, "the used duties, in duty-bit order");
        assertEq(drawable[0], key(0, 0), "expert (0, 0) first; (0, 1) was never routed");
        assertEq(drawable[5], key(0, 0xFFFE), "the link last");
        uint32 duty = key(1, 1);
        address[] memory before = ed.assignedTo(id, duty);
        (uint64 stored,,,) = ed.duties(id, duty);
        assertEq(stored, 0, "nothing stored at the open");
        // after the open: a big new validator bonds, an old one tops up and one declares holdings; nothing moves
        bondAs(vm.addr(EXTRA_KEYS[2]), Staking.Role.Validator, 50 ether);
        bondAs(vals[0], Staking.Role.Validator, 50 ether);
        uint32[] memory none = new uint32[](0);
        vm.prank(vals[2]);
        ed.declareHoldings(MODEL, true, none);
        vm.roll(vm.getBlockNumber() + WEIGHT_DELAY + 1);
        address[] memory later = ed.assignedTo(id, duty);
        for (uint256 j; j < PER_DUTY; ++j) {
            assertEq(later[j], before[j], "the same draw");
        }
        ed.submitExpertVerdicts(id, one(expertVote(keyOf(before[0]), id, duty, true)));
        (stored,,,) = ed.duties(id, duty);
        assertTrue(stored != 0, "the first counted verdict stores the draw");
        address[5] memory everyone = [vals[0], vals[1], vals[2], vm.addr(EXTRA_KEYS[0]), vm.addr(EXTRA_KEYS[1])];
        for (uint256 v; v < everyone.length; ++v) { // each validator's duties in one call: exactly its draws
            uint32[] memory mine = ed.dutiesOf(id, everyone[v]);
            uint256 named = 0;
            for (uint256 k; k < drawable.length; ++k) {
                if (isJudge(ed.assignedTo(id, drawable[k]), everyone[v])) {
                    assertEq(mine[named++], drawable[k], "in bit order");
                }
            }
            assertEq(mine.length, named, "no other duty");
        }
        assertEq(ed.dutiesOf(id, vm.addr(EXTRA_KEYS[2])).length, 0, "bonded after the commit: drawn for nothing");
        assertEq(ed.dutiesOf(id, address(0xBEEF)).length, 0, "not a validator at the commit");
    }

    function test_stakeBondedWithinTheDelayIsNeverDrawn() public {
        address whale = vm.addr(EXTRA_KEYS[2]);
        uint256 id = request();
        bondAs(whale, Staking.Role.Validator, 1000 ether); // WEIGHT_DELAY - 1 blocks before the commit: not settled
        vm.roll(vm.getBlockNumber() + WEIGHT_DELAY - 1);
        ExpertDuty.MoeOpening memory o = opening();
        bytes32 fp = keccak256(abi.encodePacked(o.fingerprintHash, moeRootOf(o))); // before the prank: a call
        vm.prank(op);
        hub.commitInference(id, o.outputHash, o.artifactRoot, fp);
        vm.roll(vm.getBlockNumber() + 2);
        uint256 commitBlock = hub.getInference(id).commitBlock;
        assertTrue(hub.weightAt(whale, commitBlock - 1) > 0, "the hub counts it at the commit");
        assertEq(ed.settledWeightAt(whale, commitBlock - 1), 0, "not settled");
        opened(id);
        assertEq(ed.dutiesOf(id, whale).length, 0, "99.7 % of the stake, drawn for nothing");
        ExpertDuty.ExpertVote[] memory its = one(expertVote(EXTRA_KEYS[2], id, RARE, false));
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.NotAssignedTo.selector, RARE, whale));
        ed.submitExpertVerdicts(id, its);
    }

    /// @dev Invariant of docs/security.md rule 9: no draw depends on stake added after commit − weightDelay — a newcomer's bond or
    ///      an old validator's top-up in the last `weightDelay` blocks leaves every draw as it was without it.
    function testFuzz_noDrawDependsOnStakeAddedWithinTheDelay(uint96 amount, uint8 offset, uint8 who) public {
        amount = uint96(bound(amount, 1 ether, 10_000 ether));
        uint256 lead = bound(offset, 1, WEIGHT_DELAY); // bonded `lead` blocks before the commit's block
        address[4] memory adders = [vm.addr(EXTRA_KEYS[2]), vals[0], vals[2], vm.addr(EXTRA_KEYS[1])];
        address adder = adders[who % 4];
        uint256 id = request();
        uint256 commitAt = vm.getBlockNumber() + WEIGHT_DELAY + 1;
        uint256 snapshot = snaps.snapshotState();
        address[][6] memory want = drawsCommittedAt(id, commitAt, address(0), 0, 0);
        snaps.revertToState(snapshot);
        address[][6] memory got = drawsCommittedAt(id, commitAt, adder, amount, lead);
        for (uint256 k; k < 6; ++k) {
            for (uint256 j; j < PER_DUTY; ++j) {
                assertEq(got[k][j], want[k][j], "the same judges");
            }
        }
    }

    /// @dev Commit `id` at block `commitAt` (`adder` bonding `amount` `lead` blocks before it), open it, read every draw.
    function drawsCommittedAt(uint256 id, uint256 commitAt, address adder, uint256 amount, uint256 lead)
        internal
        returns (address[][6] memory draws)
    {
        if (adder != address(0)) {
            vm.roll(commitAt - lead);
            bondAs(adder, Staking.Role.Validator, amount);
        }
        vm.roll(commitAt);
        ExpertDuty.MoeOpening memory o = opening();
        bytes32 fp = keccak256(abi.encodePacked(o.fingerprintHash, moeRootOf(o))); // before the prank: a call
        vm.prank(op);
        hub.commitInference(id, o.outputHash, o.artifactRoot, fp);
        vm.roll(commitAt + 2);
        opened(id);
        uint32[6] memory used = usedDuties();
        for (uint256 k; k < 6; ++k) {
            draws[k] = ed.assignedTo(id, used[k]);
        }
    }

    /// @dev Invariant: no single judge settles a duty or moves the operator's stake, whatever it votes on whichever
    ///      duties it was drawn for; and no number of duty judges slashes (only the hub committee's quorum can).
    function testFuzz_noSingleJudgeSettlesAndNoDutyVerdictSlashes(uint8 who, uint8 mask, bool valid) public {
        uint256 id = opened(committedMoe(opening()));
        address[5] memory everyone = [vals[0], vals[1], vals[2], vm.addr(EXTRA_KEYS[0]), vm.addr(EXTRA_KEYS[1])];
        address judge = everyone[who % 5];
        uint32[] memory mine = ed.dutiesOf(id, judge);
        uint256 before = stakeOf(op);
        for (uint256 k; k < mine.length; ++k) {
            if ((mask >> (k % 8)) & 1 == 0) continue;
            ed.submitExpertVerdicts(id, one(expertVote(keyOf(judge), id, mine[k], valid)));
            assertEq(resultOf(id, mine[k]), 0, "one judge settles nothing");
        }
        // every drawn judge of every duty votes invalid: duties fail, still nobody is slashed by the module
        uint32[6] memory used = usedDuties();
        for (uint256 k; k < used.length; ++k) {
            address[] memory a = ed.assignedTo(id, used[k]);
            for (uint256 j; j < a.length; ++j) {
                ed.submitExpertVerdicts(id, one(expertVote(keyOf(a[j]), id, used[k], false)));
            }
        }
        assertEq(stakeOf(op), before, "no duty verdict slashes");
        assertTrue(!isJailed(op), "free");
        assertTrue(statusOf(id) == Verinfer.Status.Committed, "the hub committee has not spoken");
    }

    function test_fewerEligibleThanPerDutyMakesTheOpenRevert() public {
        uint256 id = committedMoe(opening());
        // five settled validators: a module drawing six per duty cannot cover any duty
        ExpertDuty six = new ExpertDuty(hub, 6, WEIGHT_DELAY);
        six.setShape(MODEL, LAYERS, EXPERTS);
        ExpertDuty.MoeOpening memory o = opening();
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.Uncoverable.selector, id, 5));
        six.assignDuties(id, o);
        // a delay longer than any validator has been bonded: nobody is settled
        ExpertDuty late = new ExpertDuty(hub, PER_DUTY, 1000);
        late.setShape(MODEL, LAYERS, EXPERTS);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.Uncoverable.selector, id, 0));
        late.assignDuties(id, o);
        assertEq(late.settledWeightAt(vals[0], 10), 0, "before the delay: nothing settled");
        (,, uint32 commitBlock,,) = six.opened(id);
        assertEq(commitBlock, 0, "not opened: the inference carries no duty verdict");
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
        new ExpertDuty(hub, 1, WEIGHT_DELAY); // never one judge
        vm.expectRevert(ExpertDuty.BadParams.selector);
        new ExpertDuty(hub, PER_DUTY, 0); // stake must be settled before the commit
        uint32[] memory bad = new uint32[](1);
        bad[0] = key(2, 0);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.BadDuty.selector, key(2, 0)));
        ed.declareHoldings(MODEL, false, bad);
        assertEq(ed.dutyBit(MODEL, key(1, 1)), 3, "experts first");
        assertEq(ed.dutyBit(MODEL, key(1, 0xFFFF)), 5, "then routers");
        assertEq(ed.dutyBit(MODEL, key(0, 0xFFFE)), 6, "then the link");
    }

    function test_aVerdictAfterTheCheckWindowIsRefused() public {
        uint256 id = opened(committedMoe(opening()));
        uint32 duty = key(1, 1);
        address[] memory a = ed.assignedTo(id, duty);
        ExpertDuty.ExpertVote[] memory late = one(expertVote(keyOf(a[0]), id, duty, false));
        uint256 endsAt = uint256(hub.getInference(id).commitBlock) + 100;
        vm.roll(endsAt + 1);
        vm.expectRevert(abi.encodeWithSelector(ExpertDuty.CheckWindowOver.selector, endsAt));
        ed.submitExpertVerdicts(id, late);
    }
}
