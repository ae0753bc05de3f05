// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Staking} from "../src/Staking.sol";
import {Training} from "../src/Training.sol";
import {StakeQuorum, IValidatorSet} from "../src/StakeQuorum.sol";

/// @dev Training runs against the hub's validator weights (three validators of 5 ether each).
contract TrainingTest is Fixture {
    Training internal tr;
    uint256 internal constant PROVER_KEY = 0xC0FFEE;
    address internal prover;
    bytes32 internal constant RUN_SPEC = keccak256("run-1"); // the run's spec hash
    bytes32 internal RUN; // its id: runIdOf(prover, RUN_SPEC)
    bytes32 internal constant NONCE = keccak256("nonce-1");
    uint64 internal constant RATE = 0.5e18;
    uint256 internal constant MAX_REQUESTS = 2;
    bytes32 internal constant QUIET_SPEC = keccak256("run-quiet"); // a run at the protocol's lowest rate (few draws)
    bytes32 internal QUIET;
    bytes32 internal constant QUIET_HEAD = keccak256("q5"); // the quiet run's ledger head at its step-5 anchor

    function setUp() public override {
        super.setUp();
        tr = new Training(IValidatorSet(address(hub)), TREASURY, 1 ether, 2, 100, MAX_REQUESTS, 4);
        vm.roll(vm.getBlockNumber() + 4); // the validators' stake (bonded at 100) has settled (weightDelay)
        prover = vm.addr(PROVER_KEY);
        (RUN, QUIET) = (tr.runIdOf(prover, RUN_SPEC), tr.runIdOf(prover, QUIET_SPEC));
        vm.deal(prover, 10 ether);
        vm.prank(prover);
        tr.registerRun{value: 2 ether}(RUN_SPEC, NONCE, keccak256("data"), keccak256("proc"), 0, RATE, 5);
    }

    function anchorNext(uint64 lastStep, bytes32 head) internal returns (uint256 index) {
        return anchorOf(RUN, lastStep, head);
    }

    function anchorOf(bytes32 runId, uint64 lastStep, bytes32 head) internal returns (uint256 index) {
        (,,,,,,, uint32 n,,,,) = tr.runs(runId);
        index = n;
        vm.roll(vm.getBlockNumber() + 2); // the window's beacon is the hash of a block already mined
        vm.prank(prover);
        tr.anchor(runId, lastStep, head);
    }

    function sig(uint256 key, uint64 step, bytes32 head, bool valid, uint16 reason) internal view returns (bytes memory) {
        return sigOf(RUN, key, step, head, valid, reason);
    }

    function sigOf(bytes32 runId, uint256 key, uint64 step, bytes32 head, bool valid, uint16 reason)
        internal
        view
        returns (bytes memory)
    {
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, tr.verdictDigest(runId, step, head, valid, reason));
        return abi.encodePacked(r, s, v);
    }

    function vote(uint256 key, uint64 step, bytes32 head, bool valid, uint16 reason)
        internal
        view
        returns (Training.Vote memory)
    {
        return Training.Vote({valid: valid, reason: reason, signature: sig(key, step, head, valid, reason)});
    }

    /// @dev The votes of the first `n` fixture validators (5 ether each of 15: two are a supermajority).
    function votes(uint256 n, uint64 step, bytes32 head, bool valid, uint16 reason)
        internal
        view
        returns (Training.Vote[] memory out)
    {
        return votesOf(RUN, n, step, head, valid, reason);
    }

    /// @dev The votes of the first `n` fixture validators on a step of run `runId`.
    function votesOf(bytes32 runId, uint256 n, uint64 step, bytes32 head, bool valid, uint16 reason)
        internal
        view
        returns (Training.Vote[] memory out)
    {
        out = new Training.Vote[](n);
        for (uint256 i; i < n; ++i) {
            out[i] = Training.Vote({valid: valid, reason: reason, signature: sigOf(runId, VAL_KEYS[i], step, head, valid, reason)});
        }
    }

    function firstAudited(uint256 index, uint64 from, uint64 to) internal view returns (uint64) {
        for (uint64 t = from; t <= to; ++t) {
            if (tr.isAudited(RUN, index, t)) return t;
        }
        revert("no audited step");
    }

    /// @dev The `nth` step of anchor `index`'s window (0..5) of run `runId` that its draw did not pick.
    function undrawn(bytes32 runId, uint256 index, uint256 nth) internal view returns (uint64) {
        (uint64 first, uint64 last,,,) = tr.anchors(runId, index);
        for (uint64 t = first; t <= last; ++t) {
            if (tr.isAudited(runId, index, t)) continue;
            if (nth == 0) return t;
            --nth;
        }
        revert("not enough undrawn steps");
    }

    /// @dev Issue 30, finding 3: a prover registering its own run at 1e-18 (its spec says 0.4) is never audited.
    function test_registerRefusesAnAuditRateBelowTheProtocolMinimum() public {
        vm.deal(address(this), 10 ether);
        uint64 floor = tr.MIN_AUDIT_RATE_WAD();
        assertEq(uint256(floor), 0.1e18, "documented floor");
        vm.expectRevert(abi.encodeWithSelector(Training.AuditRateTooLow.selector, uint64(1), floor));
        tr.registerRun{value: 2 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 0, 1, 5);
        vm.expectRevert(abi.encodeWithSelector(Training.AuditRateTooLow.selector, floor - 1, floor));
        tr.registerRun{value: 2 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 0, floor - 1, 5);
        vm.expectRevert(Training.BadParams.selector);
        tr.registerRun{value: 2 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 0, uint64(1e18 + 1), 5);
        tr.registerRun{value: 2 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 0, floor, 5);
        (,,,, uint64 rate,,,,,,,) = tr.runs(tr.runIdOf(address(this), keccak256("run-2")));
        assertEq(uint256(rate), uint256(floor), "the floor itself is accepted");
    }

    function test_registerRefusesAReplayedNonceALowBondAndBadParams() public {
        vm.deal(address(this), 10 ether);
        vm.startPrank(prover);
        vm.expectRevert(abi.encodeWithSelector(Training.NonceReplayed.selector, NONCE));
        tr.registerRun{value: 2 ether}(keccak256("run-2"), NONCE, 0, 0, 0, RATE, 5);
        vm.expectRevert(abi.encodeWithSelector(Training.BondTooLow.selector, 0.5 ether, 1 ether));
        tr.registerRun{value: 0.5 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 0, RATE, 5);
        vm.expectRevert(Training.BadParams.selector);
        tr.registerRun{value: 2 ether}(keccak256("run-2"), keccak256("n2"), 0, 0, 1, RATE, 5);
        vm.expectRevert(abi.encodeWithSelector(Training.RunExists.selector, RUN));
        tr.registerRun{value: 2 ether}(RUN_SPEC, keccak256("n3"), 0, 0, 0, RATE, 5);
        vm.stopPrank();
    }

    /// @dev Issue 31, finding 6: a front-runner copies a prover's pending registration (same spec hash, same nonce,
    ///      a higher gas price). Before the fix it took the run id and burnt the nonce: the prover's own
    ///      registration reverted RunExists / NonceReplayed. Now the copy is the front-runner's own run under another
    ///      id, and the prover's registration goes through with its nonce.
    function test_aCopiedRegistrationNeitherTakesTheRunIdNorBurnsTheNonce() public {
        address victim = vm.addr(0xB0B);
        address thief = vm.addr(0x7AF);
        vm.deal(victim, 10 ether);
        vm.deal(thief, 10 ether);
        bytes32 spec = keccak256("victim-spec");
        bytes32 nonce = keccak256("victim-nonce");
        vm.prank(thief); // mined first
        bytes32 stolen = tr.registerRun{value: 2 ether}(spec, nonce, keccak256("data"), keccak256("proc"), 0, RATE, 5);
        vm.prank(victim);
        bytes32 id = tr.registerRun{value: 2 ether}(spec, nonce, keccak256("data"), keccak256("proc"), 0, RATE, 5);
        assertTrue(id != stolen, "ids bind the prover");
        assertEq(id, tr.runIdOf(victim, spec), "the documented id");
        (address owner,,,,,,,,,,,) = tr.runs(id);
        assertEq(owner, victim, "the victim owns its run");
        (owner,,,,,,,,,,,) = tr.runs(stolen);
        assertEq(owner, thief, "the copy is the thief's own run (its bond, its audits)");
        assertTrue(tr.nonceUsed(keccak256(abi.encode(victim, nonce))), "the victim's nonce is spent by the victim");
    }

    function test_anchorsAreBatchedWindowsByTheProverOnly() public {
        vm.expectRevert(abi.encodeWithSelector(Training.NotProver.selector, address(this)));
        tr.anchor(RUN, 5, keccak256("h5"));
        vm.prank(prover);
        vm.expectRevert(abi.encodeWithSelector(Training.BadWindow.selector, 0, 6));
        tr.anchor(RUN, 6, keccak256("h6"));
        anchorNext(5, keccak256("h5"));
        anchorNext(10, keccak256("h10"));
        (uint64 first, uint64 last,, bytes32 head,) = tr.anchors(RUN, 1);
        assertEq(first, 6, "second window starts after the first");
        assertEq(last, 10, "m steps");
        assertEq(head, keccak256("h10"), "head");
    }

    function test_auditDrawNeedsTheBlockAfterTheAnchor() public {
        uint256 index = anchorNext(5, keccak256("h5"));
        vm.expectRevert(abi.encodeWithSelector(Training.DrawNotReady.selector, block.number + 2));
        tr.isAudited(RUN, index, 1);
        vm.roll(vm.getBlockNumber() + 2);
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
        vm.roll(vm.getBlockNumber() + 2);
        uint64 step = firstAudited(index, 0, 5);
        tr.submitVotes(RUN, index, step, votes(2, step, head, false, 709));
        assertEq(tr.auditResult(RUN, step), 2, "failed");
        assertEq(tr.credits(TREASURY), 2 ether, "bond to the treasury");
        (, uint96 bond,,,,,,,,, bool slashed,) = tr.runs(RUN);
        assertEq(uint256(bond), 0, "bond gone");
        assertTrue(slashed, "slashed");
        vm.prank(prover);
        vm.expectRevert(abi.encodeWithSelector(Training.NotRunning.selector, RUN));
        tr.anchor(RUN, 10, keccak256("h10"));
        Training.Vote[] memory again = votes(3, step, head, true, 0);
        vm.expectRevert(abi.encodeWithSelector(Training.AlreadySettled.selector, RUN, step));
        tr.submitVotes(RUN, index, step, again);
    }

    function test_aValidVerdictKeepsTheBondAndItIsReturnedAfterTheWindow() public {
        bytes32 head = keccak256("h3");
        uint256 index = anchorNext(3, head); // a short first window ends the run
        vm.roll(vm.getBlockNumber() + 2);
        uint64 step = firstAudited(index, 0, 3);
        tr.submitVotes(RUN, index, step, votes(2, step, head, true, 0));
        assertEq(tr.auditResult(RUN, step), 1, "passed");
        vm.prank(prover);
        vm.expectRevert();
        tr.withdrawBond(RUN);
        vm.roll(vm.getBlockNumber() + 200);
        uint256 before = prover.balance;
        vm.prank(prover);
        tr.withdrawBond(RUN);
        assertEq(prover.balance - before, 2 ether, "bond back");
    }

    function test_oneValidatorCannotSettleAndVotesAreIdempotent() public {
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        vm.roll(vm.getBlockNumber() + 2);
        uint64 step = firstAudited(index, 0, 5);
        Training.Vote[] memory one = votes(1, step, head, false, 709);
        tr.submitVotes(RUN, index, step, one);
        assertEq(tr.auditResult(RUN, step), 0, "one of three validators is no verdict");
        assertTrue(tr.hasVoted(RUN, step, vals[0]), "counted");
        tr.submitVotes(RUN, index, step, one); // the same vote again is skipped, not counted twice
        assertEq(tr.auditResult(RUN, step), 0, "a repeated vote does not reach the quorum");
        (, uint96 bond,,,,,,,,,,) = tr.runs(RUN);
        assertEq(uint256(bond), 2 ether, "bond intact");
        // a second validator voting valid splits the committee: still no verdict (5 + 5 of 15 each way needs 10)
        Training.Vote[] memory other = new Training.Vote[](1);
        other[0] = vote(VAL_KEYS[1], step, head, true, 0);
        tr.submitVotes(RUN, index, step, other);
        assertEq(tr.auditResult(RUN, step), 0, "5 against 5: open");
        other[0] = vote(VAL_KEYS[2], step, head, false, 709);
        tr.submitVotes(RUN, index, step, other);
        assertEq(tr.auditResult(RUN, step), 2, "10 of 15 invalid settles");
    }

    function test_votesNeedValidatorsAndAnAuditedStep() public {
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        vm.roll(vm.getBlockNumber() + 2);
        uint64 step = firstAudited(index, 0, 5);
        Training.Vote[] memory outsider = new Training.Vote[](1);
        outsider[0] = vote(PROVER_KEY, step, head, false, 709);
        vm.expectRevert(abi.encodeWithSelector(StakeQuorum.NotAValidator.selector, prover));
        tr.submitVotes(RUN, index, step, outsider);
        // a signature over another head or outcome recovers another signer: not a validator
        Training.Vote[] memory wrong = votes(2, step, keccak256("other"), false, 709);
        vm.expectRevert();
        tr.submitVotes(RUN, index, step, wrong);
        for (uint64 t; t <= 5; ++t) {
            if (!tr.isAudited(RUN, index, t)) {
                Training.Vote[] memory unaudited = votes(2, t, head, false, 709);
                vm.expectRevert(abi.encodeWithSelector(Training.NotAudited.selector, RUN, t));
                tr.submitVotes(RUN, index, t, unaudited);
                break;
            }
        }
    }

    function test_stakeBondedAfterTheAnchorDoesNotCount() public {
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        uint256 lateKey = 0xD00D;
        bondAs(vm.addr(lateKey), Staking.Role.Validator, 50 ether);
        vm.roll(vm.getBlockNumber() + 2);
        uint64 step = firstAudited(index, 0, 5);
        Training.Vote[] memory late = new Training.Vote[](1);
        late[0] = vote(lateKey, step, head, false, 709);
        vm.expectRevert(abi.encodeWithSelector(StakeQuorum.NotAValidator.selector, vm.addr(lateKey)));
        tr.submitVotes(RUN, index, step, late);
    }

    function test_fewerThanThreeEligibleValidatorsSettleNothing() public {
        vm.prank(vals[2]);
        hub.requestUnbond();
        vm.roll(vm.getBlockNumber() + 1);
        bytes32 head = keccak256("h5");
        uint256 index = anchorNext(5, head);
        vm.roll(vm.getBlockNumber() + 2);
        uint64 step = firstAudited(index, 0, 5);
        Training.Vote[] memory two = votes(2, step, head, false, 709);
        vm.expectRevert(abi.encodeWithSelector(StakeQuorum.TooFewValidators.selector, 2, 3));
        tr.submitVotes(RUN, index, step, two);
    }

    function test_namedPositionsBeaconIsTheBlockAfterThePreviousAnchor() public {
        (,,,,,,,,,,, uint64 registered) = tr.runs(RUN);
        vm.expectRevert(abi.encodeWithSelector(Training.DrawNotReady.selector, uint256(registered) + 2));
        tr.beacon(RUN, 0);
        vm.roll(vm.getBlockNumber() + 2);
        bytes32 b0 = tr.beacon(RUN, 0);
        assertEq(b0, blockhash(uint256(registered) + 1), "window 0: the block after the registration");
        uint256 index = anchorNext(5, keccak256("h5"));
        (,,,, bytes32 stored) = tr.anchors(RUN, index);
        assertEq(stored, b0, "stored at the anchor");
        (,, uint64 anchorBlock,,) = tr.anchors(RUN, index);
        vm.expectRevert(abi.encodeWithSelector(Training.DrawNotReady.selector, uint256(anchorBlock) + 2));
        tr.beacon(RUN, 1);
        vm.roll(vm.getBlockNumber() + 2);
        bytes32 b1 = tr.beacon(RUN, 1);
        assertEq(b1, blockhash(uint256(anchorBlock) + 1), "window 1: the block after anchor 0");
        vm.expectRevert(abi.encodeWithSelector(Training.BadWindow.selector, 0, 0));
        tr.beacon(RUN, 2);
        // a long window: fix the beacon before blockhash forgets it
        tr.fixBeacon(RUN);
        vm.roll(vm.getBlockNumber() + 300);
        assertEq(tr.beacon(RUN, 1), b1, "fixed beacon survives 256 blocks");
        anchorNext(10, keccak256("h10"));
        (,,,, bytes32 stored1) = tr.anchors(RUN, 1);
        assertEq(stored1, b1, "anchor keeps the fixed beacon");
    }

    function test_anAnchorWithAnExpiredUnfixedBeaconReverts() public {
        anchorNext(5, keccak256("h5"));
        vm.roll(vm.getBlockNumber() + 300);
        vm.prank(prover);
        vm.expectRevert();
        tr.anchor(RUN, 10, keccak256("h10"));
    }

    // ---- requested audits (requestAudit) --------------------------------------------------------------

    function registerQuiet() internal {
        uint64 floor = tr.MIN_AUDIT_RATE_WAD(); // read before the prank: the call would consume it
        vm.prank(prover);
        tr.registerRun{value: 2 ether}(QUIET_SPEC, keccak256("nonce-quiet"), keccak256("data"), keccak256("proc"), 0, floor, 5);
    }

    /// @dev The quiet run registered and anchored at step 5 with head QUIET_HEAD; returns the anchor's index.
    function anchoredQuiet() internal returns (uint256) {
        registerQuiet();
        return anchorOf(QUIET, 5, QUIET_HEAD);
    }

    function request(address who, bytes32 run, uint256 index, uint64 step) internal {
        vm.prank(who);
        tr.requestAudit(run, index, step);
    }

    function test_onlyAValidatorWeightedAtTheAnchorMayRequest() public {
        uint256 lateKey = 0xD00D;
        uint256 index = anchoredQuiet();
        bondAs(vm.addr(lateKey), Staking.Role.Validator, 50 ether); // after the anchor: no weight at its block − 1
        vm.roll(vm.getBlockNumber() + 2);
        (uint64 a, uint64 b) = (undrawn(QUIET, index, 0), undrawn(QUIET, index, 1));
        vm.expectRevert(abi.encodeWithSelector(StakeQuorum.NotAValidator.selector, prover));
        request(prover, QUIET, index, a);
        vm.expectRevert(abi.encodeWithSelector(StakeQuorum.NotAValidator.selector, vm.addr(lateKey)));
        request(vm.addr(lateKey), QUIET, index, a);
        request(vals[0], QUIET, index, a);
        assertEq(uint256(tr.requestedAt(QUIET, a)), block.number, "the request block is stored");
        assertTrue(tr.isAuditDue(QUIET, index, a) && !tr.isAudited(QUIET, index, a), "due, not drawn");
        assertTrue(!tr.isAuditDue(QUIET, index, b), "another step is not");
    }

    function test_requestsAreCappedPerValidatorAndPerAnchor() public {
        uint256 index = anchoredQuiet();
        vm.roll(vm.getBlockNumber() + 2);
        request(vals[0], QUIET, index, undrawn(QUIET, index, 0));
        request(vals[0], QUIET, index, undrawn(QUIET, index, 1));
        assertEq(tr.requestCount(QUIET, index, vals[0]), MAX_REQUESTS, "two requests");
        uint64 third = undrawn(QUIET, index, 2);
        vm.expectRevert(abi.encodeWithSelector(Training.RequestsExhausted.selector, index, MAX_REQUESTS));
        request(vals[0], QUIET, index, third);
        // the cap is per anchor: the next window has its own
        uint256 next = anchorOf(QUIET, 10, keccak256("q10"));
        vm.roll(vm.getBlockNumber() + 2);
        request(vals[0], QUIET, next, undrawn(QUIET, next, 0));
        assertEq(tr.requestCount(QUIET, next, vals[0]), 1, "own count");
    }

    /// @dev Issue 30, finding 7: a colluding validator spends the anchor's requests on honest steps so that the
    ///      step the prover forged can never be requested. Each validator now has its own quota.
    function test_oneValidatorCannotExhaustTheOthersRequests() public {
        uint256 index = anchoredQuiet();
        vm.roll(vm.getBlockNumber() + 2);
        for (uint256 i; i < MAX_REQUESTS; ++i) {
            request(vals[2], QUIET, index, undrawn(QUIET, index, i)); // the colluder, on honest steps
        }
        uint64 forged = undrawn(QUIET, index, MAX_REQUESTS);
        request(vals[0], QUIET, index, forged); // an honest validator still requests the forged step
        assertTrue(tr.isAuditDue(QUIET, index, forged), "the forged step is due");
        assertEq(tr.requestCount(QUIET, index, vals[0]), 1, "its own quota");
        tr.submitVotes(QUIET, index, forged, votesOf(QUIET, 2, forged, QUIET_HEAD, false, 709));
        (,,,,,,,,,, bool slashed,) = tr.runs(QUIET);
        assertTrue(slashed, "and its audit slashes the forger");
    }

    function test_aRequestNeedsTheDrawAndEndsAtTheNextAnchorOrTheRunsEnd() public {
        uint256 index = anchoredQuiet();
        vm.expectRevert(abi.encodeWithSelector(Training.DrawNotReady.selector, block.number + 2));
        request(vals[0], QUIET, index, 1);
        vm.roll(vm.getBlockNumber() + 2);
        vm.expectRevert(abi.encodeWithSelector(Training.BadWindow.selector, 0, 5));
        request(vals[0], QUIET, index, 6);
        vm.expectRevert(abi.encodeWithSelector(Training.PastRequestHorizon.selector, index + 1, 1));
        request(vals[0], QUIET, index + 1, 6);
        uint256 next = anchorOf(QUIET, 10, keccak256("q10"));
        vm.roll(vm.getBlockNumber() + 2);
        // window 0's states past Z(e−m) leave the prover's K = 2m buffer once it trains past anchor 1
        vm.expectRevert(abi.encodeWithSelector(Training.PastRequestHorizon.selector, index, 2));
        request(vals[0], QUIET, index, 1);
        vm.prank(prover);
        tr.finish(QUIET);
        vm.expectRevert(abi.encodeWithSelector(Training.NotRunning.selector, QUIET));
        request(vals[0], QUIET, next, 7);
    }

    function test_aDrawnOrAlreadyRequestedStepCannotBeRequested() public {
        uint256 index = anchorNext(5, keccak256("h5"));
        vm.roll(vm.getBlockNumber() + 2);
        uint64 drawn = firstAudited(index, 0, 5);
        vm.expectRevert(abi.encodeWithSelector(Training.AlreadyDue.selector, RUN, drawn));
        request(vals[0], RUN, index, drawn);
        for (uint64 t; t <= 5; ++t) {
            if (tr.isAudited(RUN, index, t)) continue;
            request(vals[0], RUN, index, t);
            vm.expectRevert(abi.encodeWithSelector(Training.AlreadyDue.selector, RUN, t));
            request(vals[1], RUN, index, t);
            assertEq(tr.requestCount(RUN, index, vals[0]), 1, "counted once");
            assertEq(tr.requestCount(RUN, index, vals[1]), 0, "the duplicate is not counted");
            return;
        }
    }

    function test_aRequestedStepSettledInvalidForfeitsTheBond() public {
        uint256 index = anchoredQuiet();
        vm.roll(vm.getBlockNumber() + 2);
        uint64 t = undrawn(QUIET, index, 0);
        Training.Vote[] memory early = votesOf(QUIET, 2, t, QUIET_HEAD, false, 709);
        vm.expectRevert(abi.encodeWithSelector(Training.NotAudited.selector, QUIET, t));
        tr.submitVotes(QUIET, index, t, early); // not due before the request
        request(vals[0], QUIET, index, t);
        tr.submitVotes(QUIET, index, t, votesOf(QUIET, 1, t, QUIET_HEAD, false, 709));
        assertEq(tr.auditResult(QUIET, t), 0, "the requester alone settles nothing");
        tr.submitVotes(QUIET, index, t, votesOf(QUIET, 2, t, QUIET_HEAD, false, 709));
        assertEq(tr.auditResult(QUIET, t), 2, "failed");
        (, uint96 bond,,,,,,,,, bool slashed,) = tr.runs(QUIET);
        assertTrue(slashed && bond == 0, "slashed");
        assertEq(tr.credits(TREASURY), 2 ether, "bond to the treasury");
    }

    function test_aRequestedStepSettledValidKeepsTheBond() public {
        uint256 index = anchoredQuiet();
        vm.roll(vm.getBlockNumber() + 2);
        uint64 t = undrawn(QUIET, index, 0);
        request(vals[0], QUIET, index, t);
        tr.submitVotes(QUIET, index, t, votesOf(QUIET, 2, t, QUIET_HEAD, true, 0));
        assertEq(tr.auditResult(QUIET, t), 1, "passed");
        (, uint96 bond,,,,,,,,, bool slashed,) = tr.runs(QUIET);
        assertTrue(!slashed && bond == 2 ether, "bond kept");
    }

    function test_lateOnARequestedStepSlashes() public {
        uint256 index = anchoredQuiet();
        vm.roll(vm.getBlockNumber() + 2);
        uint64 t = undrawn(QUIET, index, 0);
        request(vals[1], QUIET, index, t);
        vm.roll(vm.getBlockNumber() + 20); // the prover never served it
        tr.submitVotes(QUIET, index, t, votesOf(QUIET, 2, t, QUIET_HEAD, false, tr.LATE_RESPONSE()));
        assertEq(tr.auditResult(QUIET, t), 2, "late is a failed audit");
        (,,,,,,,,,, bool slashed,) = tr.runs(QUIET);
        assertTrue(slashed, "slashed");
    }

    function test_aRequestedStepsVerdictWindowCountsFromTheRequest() public {
        uint256 index = anchoredQuiet();
        (,, uint64 anchorBlock,,) = tr.anchors(QUIET, index);
        vm.roll(uint256(anchorBlock) + 90);
        uint64 t = undrawn(QUIET, index, 0);
        request(vals[0], QUIET, index, t);
        uint256 deadline = block.number + 100;
        assertEq(tr.verdictDeadline(QUIET, index, t), deadline, "request block + verdictWindow");
        vm.roll(uint256(anchorBlock) + 1 + 100 + 1); // a drawn step's window would be over
        tr.submitVotes(QUIET, index, t, votesOf(QUIET, 1, t, QUIET_HEAD, false, 712));
        vm.roll(deadline + 1);
        Training.Vote[] memory late = votesOf(QUIET, 2, t, QUIET_HEAD, false, 712);
        vm.expectRevert(abi.encodeWithSelector(Training.DrawExpired.selector, deadline));
        tr.submitVotes(QUIET, index, t, late);
        assertEq(tr.auditResult(QUIET, t), 0, "unsettled after its window");
    }
}
