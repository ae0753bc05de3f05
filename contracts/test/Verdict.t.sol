// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {ModelRegistry} from "../src/ModelRegistry.sol";
import {Protocol} from "../src/Protocol.sol";
import {ECDSA} from "@openzeppelin/contracts/utils/cryptography/ECDSA.sol";

contract VerdictTest is Fixture {
    bytes32 internal constant ROOT = keccak256("root");

    function quorumVotes(uint256 id, bool valid) internal view returns (Verinfer.Vote[] memory out) {
        uint256[] memory keys = committeeKeys(id);
        out = new Verinfer.Vote[](keys.length / 2 + 1);
        for (uint256 j; j < out.length; ++j) {
            out[j] = vote(keys[j], id, ROOT, valid);
        }
    }

    function test_aValidQuorumPaysTheOperatorAndValidators() public {
        uint256 id = committed(ROOT);
        Verinfer.Vote[] memory votes = quorumVotes(id, true);
        hub.submitVerdicts(id, commitment(ROOT), votes);
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Valid), "valid");
        uint256 share = FEE / 10 / 3;
        assertEq(hub.credits(op), FEE - share * votes.length, "operator fee");
        assertEq(spoofP(op), Protocol.computePosterior(1e16, 1e16, 0, true), "P after a valid verdict");
        assertEq(hub.totalEscrow(), 0, "escrow released");
        assertSolvent();
    }

    function test_anInvalidQuorumRefundsAndRaisesP() public {
        uint256 id = committed(ROOT);
        hub.submitVerdicts(id, commitment(ROOT), quorumVotes(id, false));
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Invalid), "invalid");
        assertEq(spoofP(op), 502_512_562_814_070_351, "1 % -> 50.25 % (the seeds' table)");
        assertGe(hub.credits(REQUESTER), FEE * 9 / 10 - 1, "requester refunded");
        assertSolvent();
    }

    function test_repeatedInvalidVerdictsSlashAndJail() public {
        uint256[2] memory table = [uint256(502_512_562_814_070_351), 990_197_049_212_793_345];
        for (uint256 i; i < 2; ++i) {
            uint256 id = committed(keccak256(abi.encode(i)));
            bytes32 root = keccak256(abi.encode(i));
            uint256[] memory keys = committeeKeys(id);
            Verinfer.Vote[] memory votes = new Verinfer.Vote[](keys.length / 2 + 1);
            for (uint256 j; j < votes.length; ++j) {
                votes[j] = vote(keys[j], id, root, false);
            }
            hub.submitVerdicts(id, commitment(root), votes);
            assertEq(spoofP(op), table[i], "posterior follows the table");
            if (i == 0) assertTrue(!isJailed(op), "not yet");
        }
        assertTrue(isJailed(op), "jailed once P >= 99 % (the second invalid verdict)");
        assertEq(stakeOf(op), 5 ether, "half the stake slashed once");
        assertGe(hub.credits(TREASURY), 4 ether, "treasury share");
        vm.expectRevert(abi.encodeWithSelector(Verinfer.OperatorUnavailable.selector, op));
        hub.requestInference(op, MODEL, 0, 1, params());
        assertSolvent();
    }

    function test_verifyingModelsMovePButNeverSlash() public {
        hub.setModelState(MODEL, ModelRegistry.ModelState.Verifying);
        for (uint256 i; i < 3; ++i) {
            uint256 id = committed(ROOT);
            hub.submitVerdicts(id, commitment(ROOT), quorumVotes(id, false));
        }
        assertTrue(spoofP(op) > 0.99e18, "P moved");
        assertEq(stakeOf(op), 10 ether, "no slashing before punitive");
        assertTrue(!isJailed(op), "not jailed");
    }

    function test_measuringModelsRecordVerdictsOnly() public {
        hub.setModelState(MODEL, ModelRegistry.ModelState.Verifying);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Measuring);
        uint256 id = committed(ROOT);
        hub.submitVerdicts(id, commitment(ROOT), quorumVotes(id, false));
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Invalid), "recorded");
        assertEq(spoofP(op), 1e16, "P unchanged while measuring");
    }

    function test_aValidatorsSecondVoteIsSkipped() public {
        uint256 id = committed(ROOT);
        uint256[] memory keys = committeeKeys(id);
        hub.submitVerdicts(id, commitment(ROOT), votes1(vote(keys[0], id, ROOT, true)));
        assertTrue(hub.hasVoted(id, vm.addr(keys[0])), "recorded");
        hub.submitVerdicts(id, commitment(ROOT), votes1(vote(keys[0], id, ROOT, false))); // skipped, not fatal
        Verinfer.Inference memory inf = hub.getInference(id);
        assertEq(inf.validVotes, 1, "first vote counted");
        assertEq(inf.invalidVotes, 0, "second vote not counted");
        assertEq(uint8(inf.status), uint8(Verinfer.Status.Committed), "no quorum yet");
    }

    function test_strangersAndOtherInferencesAreRejected() public {
        uint256 id = committed(ROOT);
        Verinfer.Vote[] memory stranger = votes1(vote(OP_KEY, id, ROOT, true));
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotInCommittee.selector, op));
        hub.submitVerdicts(id, commitment(ROOT), stranger);
        // a verdict signed for inference id + 1 recovers to some other address: not a member
        uint256 key = committeeKeys(id)[0];
        Verinfer.Vote[] memory other = votes1(vote(key, id + 1, ROOT, true));
        vm.expectRevert();
        hub.submitVerdicts(id, commitment(ROOT), other);
        // a different artifact root does not match the commitment
        Verinfer.Vote[] memory wrongRoot = votes1(vote(key, id, keccak256("other"), true));
        vm.expectRevert(Verinfer.CommitmentMismatch.selector);
        hub.submitVerdicts(id, commitment(keccak256("other")), wrongRoot);
    }

    function test_aVerdictForAnotherContractOrChainIsRejected() public {
        uint256 id = committed(ROOT);
        uint256 key = committeeKeys(id)[0];
        Verinfer other = new Verinfer(config());
        Verinfer.Vote memory v = vote(key, id, ROOT, true);
        bytes32 foreign = other.verdictDigest(id, ROOT, true, 0, v.scoresDigest, v.deadline);
        (uint8 pv, bytes32 r, bytes32 s) = vm.sign(key, foreign);
        v.signature = abi.encodePacked(r, s, pv);
        vm.expectRevert(); // recovers to a non-member
        hub.submitVerdicts(id, commitment(ROOT), votes1(v));
    }

    function test_highSSignaturesAreRejected() public {
        uint256 id = committed(ROOT);
        uint256 key = committeeKeys(id)[0];
        Verinfer.Vote memory v = vote(key, id, ROOT, true);
        (bytes32 r, bytes32 s, uint8 pv) = split(v.signature);
        uint256 n = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141;
        v.signature = abi.encodePacked(r, bytes32(n - uint256(s)), pv == 27 ? uint8(28) : uint8(27));
        vm.expectRevert(abi.encodeWithSelector(ECDSA.ECDSAInvalidSignatureS.selector, bytes32(n - uint256(s))));
        hub.submitVerdicts(id, commitment(ROOT), votes1(v));
    }

    function split(bytes memory sig) internal pure returns (bytes32 r, bytes32 s, uint8 v) {
        assembly ("memory-safe") {
            r := mload(add(sig, 32))
            s := mload(add(sig, 64))
            v := byte(0, mload(add(sig, 96)))
        }
    }

    function test_expiredVerdictsAndClosedWindowsRevert() public {
        uint256 id = committed(ROOT);
        uint256 key = committeeKeys(id)[0];
        Verinfer.Vote memory v = vote(key, id, ROOT, true);
        vm.warp(v.deadline + 1);
        hub.submitVerdicts(id, commitment(ROOT), votes1(v)); // skipped: past its deadline
        assertTrue(!hub.hasVoted(id, vm.addr(key)), "an expired vote is not counted");
        vm.expectRevert(Verinfer.NoVotes.selector);
        hub.submitVerdicts(id, commitment(ROOT), new Verinfer.Vote[](0));
        vm.roll(vm.getBlockNumber() + 100);
        Verinfer.Vote[] memory late = votes1(vote(key, id, ROOT, true));
        uint256 endedAt = hub.getInference(id).commitBlock + hub.checkWindow();
        vm.expectRevert(abi.encodeWithSelector(Verinfer.CheckWindowOver.selector, endedAt));
        hub.submitVerdicts(id, commitment(ROOT), late);
    }

    function test_uncheckedInferencesRevertAndFinalizeAfterTheWindow() public {
        hub.setModelParams(MODEL, 1e16, 0, 0, 0); // check rate = P = 1 %
        uint256 id;
        bool checked = true;
        for (uint256 i; checked; ++i) {
            id = committed(keccak256(abi.encode(i)));
            (checked,) = hub.selectionOf(id);
        }
        bytes32 root = keccak256(abi.encode(id - 1));
        Verinfer.Vote[] memory v = votes1(vote(VAL_KEYS[0], id, root, true));
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotChecked.selector, id));
        hub.submitVerdicts(id, commitment(root), v);
        uint256 endsAt = hub.getInference(id).commitBlock + hub.checkWindow();
        vm.expectRevert(abi.encodeWithSelector(Verinfer.CheckWindowOpen.selector, endsAt));
        hub.finalize(id);
        vm.roll(endsAt + 1);
        uint256 before = hub.credits(op);
        hub.finalize(id);
        assertEq(hub.credits(op) - before, FEE, "whole fee to the operator");
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Unchecked), "unchecked");
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, id, Verinfer.Status.Unchecked));
        hub.finalize(id);
        assertSolvent();
    }

    function test_settledInferencesTakeNoMoreVotes() public {
        uint256 id = committed(ROOT);
        hub.submitVerdicts(id, commitment(ROOT), quorumVotes(id, true));
        uint256[] memory keys = committeeKeys(id);
        Verinfer.Vote[] memory late = votes1(vote(keys[keys.length - 1], id, ROOT, true));
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, id, Verinfer.Status.Valid));
        hub.submitVerdicts(id, commitment(ROOT), late);
    }

    function testFuzz_reputationMatchesTheLibraryOverVerdictSequences(uint256 pattern) public {
        hub.setModelState(MODEL, ModelRegistry.ModelState.Verifying); // no jail, so every verdict counts
        uint256 p = 1e16;
        for (uint256 i; i < 6; ++i) {
            bool valid = (pattern >> i) & 1 == 1;
            uint256 id = committed(ROOT);
            Verinfer.Vote[] memory votes = quorumVotes(id, valid);
            hub.submitVerdicts(id, commitment(ROOT), votes);
            p = Protocol.computePosterior(p, 1e16, 0, valid);
            assertEq(spoofP(op), p, "on-chain P = library P");
        }
        assertSolvent();
    }
}
