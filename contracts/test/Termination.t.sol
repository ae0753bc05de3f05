// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Protocol} from "../src/Protocol.sol";
import {ProtocolViews} from "../src/ProtocolViews.sol";

/// @dev The termination rule's fraud proof (docs/security.md rule 3, issue 15 finding 6): empty, truncated, over-long
///      outputs and outputs that go on after a stop token are slashable from the header and one leaf.
contract TerminationTest is Fixture {
    /// @dev A canonical header (node.protocol.artifact.encode_header) with a 3-token prompt.
    function header(uint256 outputLength) internal view returns (bytes memory h) {
        h = abi.encodePacked(MODEL, uint32(0x3f800000), uint32(0x3f800000), uint32(0), uint32(params().maxTokens));
        h = abi.encodePacked(h, uint32(5), Protocol.computeRunSeed(USER_SEED, hub.nextInferenceId() + 1), uint32(3));
        h = abi.encodePacked(h, uint32(11), uint32(12), uint32(13), uint32(outputLength));
    }

    function leaf(uint32 i, uint32 chosen) internal pure returns (bytes memory out) {
        out = abi.encodePacked(i, chosen);
        for (uint32 j; j < 5; ++j) {
            out = abi.encodePacked(out, j == 0 ? chosen : 20 + j, uint32(j == 0 ? 2 ** 31 : 2 ** 28), uint32(0xbf800000));
        }
    }

    function leafHash(bytes memory l) internal pure returns (bytes32) {
        return keccak256(bytes.concat(keccak256(l)));
    }

    /// @dev Commit a two-leaf artifact choosing (first, last) under a header saying `outputLength`.
    function commitTwo(uint32 first, uint32 last, uint256 outputLength)
        internal
        returns (uint256 id, bytes memory h, bytes memory l0, bytes memory l1, bytes32 root)
    {
        h = header(outputLength);
        (l0, l1) = (leaf(0, first), leaf(1, last));
        (bytes32 a, bytes32 b) = (leafHash(l0), leafHash(l1));
        bytes32 positionsRoot = a < b ? keccak256(abi.encode(a, b)) : keccak256(abi.encode(b, a));
        root = Protocol.computeArtifactRoot(keccak256(h), positionsRoot);
        id = request();
        commit(id, root);
    }

    function proofOf(bytes memory sibling) internal pure returns (bytes32[] memory p) {
        p = new bytes32[](1);
        p[0] = leafHash(sibling);
    }

    function assertConvicted(uint256 id, uint16 reason) internal view {
        assertEq(uint8(statusOf(id)), uint8(Verinfer.Status.Fraud), "fraud");
        assertEq(stakeOf(op), 0, "slashed");
        assertTrue(isJailed(op), "jailed");
        assertEq(hub.credits(REQUESTER), FEE + BOND, "requester refunded");
        reason; // the FraudProven event carries it; the pure rule is checked against the vectors
        assertSolvent();
    }

    function test_aTruncatedOutputIsFraud() public {
        (uint256 id, bytes memory h, bytes memory l0, bytes memory l1, bytes32 root) = commitTwo(30, 31, 2);
        hub.proveTermination(id, commitment(root), h, bytes32(0), l1, proofOf(l0));
        assertConvicted(id, Protocol.NOT_TERMINATED);
    }

    function test_anOutputThatGoesOnAfterAStopTokenIsFraud() public {
        (uint256 id, bytes memory h, bytes memory l0, bytes memory l1, bytes32 root) = commitTwo(STOP, STOP, 2);
        hub.proveTermination(id, commitment(root), h, bytes32(0), l0, proofOf(l1));
        assertConvicted(id, Protocol.TOKENS_AFTER_STOP);
    }

    function test_anEmptyOutputIsFraud() public {
        bytes memory h = header(0);
        bytes32 root = Protocol.computeArtifactRoot(keccak256(h), bytes32(0));
        uint256 id = request();
        commit(id, root);
        hub.proveTermination(id, commitment(root), h, bytes32(0), "", new bytes32[](0));
        assertConvicted(id, Protocol.NOT_TERMINATED);
    }

    function test_anOverLongOutputIsFraud() public {
        (uint256 id, bytes memory h,,, bytes32 root) = commitTwo(30, STOP, params().maxTokens + 1);
        bytes memory l0 = leaf(0, 30);
        bytes memory l1 = leaf(1, STOP);
        (bytes32 a, bytes32 b) = (leafHash(l0), leafHash(l1));
        bytes32 positionsRoot = a < b ? keccak256(abi.encode(a, b)) : keccak256(abi.encode(b, a));
        hub.proveTermination(id, commitment(root), h, positionsRoot, "", new bytes32[](0));
        assertConvicted(id, Protocol.OUTPUT_TOO_LONG);
    }

    function test_anHonestStopIsNotFraud() public {
        (uint256 id, bytes memory h, bytes memory l0, bytes memory l1, bytes32 root) = commitTwo(30, STOP, 2);
        Verinfer.Commitment memory c = commitment(root);
        bytes32[] memory p1 = proofOf(l0);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotFraud.selector, 1));
        hub.proveTermination(id, c, h, bytes32(0), l1, p1);
        bytes32[] memory p0 = proofOf(l1);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotFraud.selector, 0));
        hub.proveTermination(id, c, h, bytes32(0), l0, p0);
        assertEq(stakeOf(op), 10 ether, "honest operator untouched");
    }

    function test_reachingMaxTokensNeedsNoStopToken() public {
        Verinfer.Params memory p = params();
        p.maxTokens = 2;
        bytes memory h = abi.encodePacked(MODEL, uint32(0x3f800000), uint32(0x3f800000), uint32(0), uint32(2));
        h = abi.encodePacked(h, uint32(5), Protocol.computeRunSeed(USER_SEED, hub.nextInferenceId() + 1), uint32(0));
        h = abi.encodePacked(h, uint32(2));
        (bytes memory l0, bytes memory l1) = (leaf(0, 30), leaf(1, 31));
        (bytes32 a, bytes32 b) = (leafHash(l0), leafHash(l1));
        bytes32 root = Protocol.computeArtifactRoot(keccak256(h), a < b ? keccak256(abi.encode(a, b)) : keccak256(abi.encode(b, a)));
        vm.prank(REQUESTER);
        uint256 id = hub.requestInference{value: FEE + BOND}(op, MODEL, keccak256("prompt"), USER_SEED, p);
        commit(id, root);
        Verinfer.Commitment memory c = commitment(root);
        bytes32[] memory p1 = proofOf(l0);
        vm.expectRevert(abi.encodeWithSelector(Verinfer.NotFraud.selector, 1));
        hub.proveTermination(id, c, h, bytes32(0), l1, p1);
    }

    function test_aLeafOrHeaderNotInTheCommitmentIsRejected() public {
        (uint256 id, bytes memory h, bytes memory l0,, bytes32 root) = commitTwo(30, 31, 2);
        Verinfer.Commitment memory c = commitment(root);
        bytes memory forged = leaf(1, 32);
        bytes32[] memory p = proofOf(l0);
        vm.expectRevert(Verinfer.ArtifactRootMismatch.selector);
        hub.proveTermination(id, c, h, bytes32(0), forged, p);
        bytes memory shortHeader = header(1);
        vm.expectRevert(Verinfer.ArtifactRootMismatch.selector);
        hub.proveTermination(id, c, shortHeader, bytes32(0), leaf(1, 31), p);
    }

    function test_headerLengthIsChecked() public {
        ProtocolViews views = new ProtocolViews();
        vm.expectRevert(abi.encodeWithSelector(Protocol.HeaderLength.selector, 10));
        views.decodeHeaderOutputLength(new bytes(10));
        assertEq(views.decodeHeaderOutputLength(header(7)), 7, "output length is the last uint32");
    }
}
