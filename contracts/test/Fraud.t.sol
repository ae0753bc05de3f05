// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Protocol} from "../src/Protocol.sol";

/// @dev A two-leaf artifact (K = 5) whose leaf 1 is honest for the inference's real v_1 or forged.
contract FraudTest is Fixture {
    bytes32 internal constant HEADER_HASH = keccak256("header");
    uint32[5] internal TOKENS = [uint32(5), 9, 2, 7, 1];
    uint32[5] internal WEIGHTS = [uint32(2 ** 31), 2 ** 30, 2 ** 29, 0, 0];

    function honestChoice(uint256 v) internal view returns (uint32) {
        uint256 cumulative;
        for (uint256 j; j < 5; ++j) {
            cumulative += WEIGHTS[j];
            if (v < cumulative) return TOKENS[j];
        }
        return 40; // a tail token
    }

    function leaf(uint32 i, uint32 chosen) internal view returns (bytes memory out) {
        out = abi.encodePacked(i, chosen);
        for (uint256 j; j < 5; ++j) {
            out = abi.encodePacked(out, TOKENS[j], WEIGHTS[j], uint32(0xbf800000));
        }
    }

    function leafHash(bytes memory l) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(l)));
    }

    /// @dev Commit an artifact whose leaf 1 chooses `forged ? a wrong token : the honest one`.
    function commitArtifact(bool forged) internal returns (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) {
        id = hub.nextInferenceId() + 1;
        uint256 v1 = Protocol.computeSamplerUniform(Protocol.computeRunSeed(USER_SEED, id), 1);
        uint32 honest = honestChoice(v1);
        l1 = leaf(1, forged ? (honest == 5 ? 9 : 5) : honest);
        bytes32 h0 = leafHash(leaf(0, 5));
        bytes32 h1 = leafHash(l1);
        bytes32 positionsRoot = h0 < h1 ? keccak256(abi.encode(h0, h1)) : keccak256(abi.encode(h1, h0));
        root = Protocol.computeArtifactRoot(HEADER_HASH, positionsRoot);
        proof = new bytes32[](1);
        proof[0] = h0;
        assertEq(request(), id, "id");
        commit(id, root);
    }

    function test_aForgedLeafSlashesJailsAndRewardsTheProver() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(true);
        address prover = address(0xF00D);
        vm.prank(prover);
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Fraud), "fraud");
        assertEq(stakeOf(op), 0, "whole stake slashed");
        assertEq(hub.credits(prover), 1 ether, "10 % of 10 ether to the prover");
        assertEq(hub.credits(TREASURY), 9 ether, "the rest to the treasury");
        assertEq(hub.credits(REQUESTER), FEE + BOND, "fee and bond refunded");
        assertTrue(isJailed(op), "jailed");
        assertEq(spoofP(op), Protocol.P_MAX, "P at its maximum");
        assertSolvent();
    }

    function test_anHonestLeafCannotBeProvenFraudulent() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(false);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotFraud.selector, 1));
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
    }

    function test_aLeafNotInTheArtifactIsRejected() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(false);
        l1[7] = bytes1(uint8(l1[7]) ^ 1); // another chosen token: a different leaf
        vm.expectRevert(Verinfer.ArtifactRootMismatch.selector);
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
        vm.expectRevert(Verinfer.CommitmentMismatch.selector);
        hub.proveFraud(id, commitment(keccak256("x")), HEADER_HASH, l1, proof);
    }

    function test_fraudProofsCloseWithTheWindowAndCountOnce() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(true);
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, id, Verinfer.Status.Fraud));
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.WrongStatus.selector, 99, Verinfer.Status.None));
        hub.proveFraud(99, commitment(root), HEADER_HASH, l1, proof);
    }

    function test_fraudWindowEnds() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(true);
        vm.roll(vm.getBlockNumber() + 301);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.FraudWindowOver.selector, vm.getBlockNumber() - 1));
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
    }

    function test_fraudAfterAValidVerdictStillSlashes() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(true);
        vm.roll(vm.getBlockNumber() + 2);
        uint256[] memory keys = committeeKeys(id);
        Verinfer.Vote[] memory votes = new Verinfer.Vote[](keys.length / 2 + 1);
        for (uint256 j; j < votes.length; ++j) {
            votes[j] = vote(keys[j], id, root, true);
        }
        hub.submitVerdicts(id, commitment(root), votes);
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
        assertEq(stakeOf(op), 0, "slashed after the fact");
        assertSolvent();
    }

    /// @dev Issue 30 finding 6: a validator that signs `valid` without checking (copying a gossiped verdict) used
    ///      to keep its stake and its pay whatever the truth. A fraud proof now contradicts every recorded valid
    ///      verdict: each of those signers is slashed (fraudSlashBps) and jailed; an invalid voter and a member
    ///      who did not vote keep everything.
    function test_aFraudProofSlashesTheValidatorsWhoCalledTheForgeryValid() public {
        (uint256 id, bytes memory l1, bytes32[] memory proof, bytes32 root) = commitArtifact(true);
        vm.roll(vm.getBlockNumber() + 2);
        uint256[] memory keys = committeeKeys(id);
        hub.submitVerdicts(id, commitment(root), votes1(vote(keys[0], id, root, true))); // the copier
        hub.submitVerdicts(id, commitment(root), votes1(vote(keys[1], id, root, false))); // the checker
        address copier = vm.addr(keys[0]);
        address checker = vm.addr(keys[1]);
        address silent = vm.addr(keys[2]);
        uint256 checkerStake = stakeOf(checker);
        address prover = address(0xF00D);
        vm.prank(prover);
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
        assertEq(stakeOf(copier), 0, "the valid verdict over a provable forgery costs its signer's stake");
        assertTrue(isJailed(copier), "and jails it: no more committees");
        assertEq(stakeOf(checker), checkerStake, "the invalid voter keeps its stake");
        assertTrue(!isJailed(checker) && !isJailed(silent), "nobody else jailed");
        assertEq(hub.credits(prover), 1 ether + 0.5 ether, "10 % of the operator's and of the copier's stake");
        assertSolvent();
    }

    function testFuzz_onlyWrongChoicesAreProvable(uint32 chosen) public {
        chosen = uint32(bound(chosen, 0, 63));
        uint256 id = hub.nextInferenceId() + 1;
        uint256 v1 = Protocol.computeSamplerUniform(Protocol.computeRunSeed(USER_SEED, id), 1);
        bytes memory l1 = leaf(1, chosen);
        bytes32 h0 = leafHash(leaf(0, 5));
        bytes32 h1 = leafHash(l1);
        bytes32 root = Protocol.computeArtifactRoot(
            HEADER_HASH, h0 < h1 ? keccak256(abi.encode(h0, h1)) : keccak256(abi.encode(h1, h0))
        );
        bytes32[] memory proof = new bytes32[](1);
        proof[0] = h0;
        request();
        commit(id, root);
        uint32 honest = honestChoice(v1);
        bool isTail = chosen != 5 && chosen != 9 && chosen != 2 && chosen != 7 && chosen != 1;
        bool honestLeaf = honest == 40 ? isTail : chosen == honest;
        if (honestLeaf) vm.expectRevert(abi.encodeWithSelector(Verinfer.NotFraud.selector, 1));
        hub.proveFraud(id, commitment(root), HEADER_HASH, l1, proof);
    }
}
