// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Base} from "./Base.sol";
import {Protocol} from "../src/Protocol.sol";
import {ProtocolViews} from "../src/ProtocolViews.sol";

/// @dev Exposes the library's calldata functions.
contract ProtocolHarness {
    function violation(bytes calldata leaf, uint256 k, uint256 v, uint256 vocab) external pure returns (uint16) {
        return Protocol.findPositionViolation(leaf, k, v, vocab);
    }
}

/// @dev The library against the golden vectors that pin node/protocol (tests/vectors/protocol_v1.json).
contract ProtocolTest is Base {
    ProtocolHarness internal h = new ProtocolHarness();
    string internal json = vm.readFile("../tests/vectors/protocol_v1.json");

    function key(string memory section, uint256 i, string memory field) internal pure returns (string memory) {
        return string.concat(".", section, "[", _str(i), "].", field);
    }

    function _str(uint256 i) internal pure returns (string memory) {
        return vm.toString(i);
    }

    function count(string memory path) internal view returns (uint256 n) {
        while (vm.keyExistsJson(json, string.concat(path, "[", _str(n), "]"))) ++n;
    }

    function test_runSeedAndUniformsMatchVectors() public view {
        for (uint256 i; i < count(".seed"); ++i) {
            uint64 userSeed = uint64(vm.parseJsonUint(json, key("seed", i, "user_seed")));
            uint256 id = vm.parseJsonUint(json, key("seed", i, "inference_id"));
            bytes32 seed = Protocol.computeRunSeed(userSeed, id);
            assertEq(seed, vm.parseJsonBytes32(json, key("seed", i, "run_seed")), "run_seed");
            for (uint256 j; j < count(key("seed", i, "uniforms")); ++j) {
                string memory at = string.concat(key("seed", i, "uniforms"), "[", _str(j), "]");
                uint32 pos = uint32(vm.parseJsonUint(json, string.concat(at, ".i")));
                assertEq(Protocol.computeSamplerUniform(seed, pos), vm.parseJsonUint(json, string.concat(at, ".v")), "v_i");
            }
        }
    }

    function test_posteriorMatchesVectorsStepByStep() public view {
        for (uint256 i; i < count(".reputation"); ++i) {
            uint256 alpha = vm.parseJsonUint(json, key("reputation", i, "alpha"));
            uint256 beta = vm.parseJsonUint(json, key("reputation", i, "beta"));
            uint256 p = vm.parseJsonUint(json, key("reputation", i, "prior"));
            for (uint256 j; j < count(key("reputation", i, "steps")); ++j) {
                string memory at = string.concat(key("reputation", i, "steps"), "[", _str(j), "]");
                p = Protocol.computePosterior(p, alpha, beta, vm.parseJsonBool(json, string.concat(at, ".valid")));
                assertEq(p, vm.parseJsonUint(json, string.concat(at, ".p")), "posterior");
            }
        }
    }

    function test_positionRuleMatchesVectors() public view {
        uint256 n = count(".position_rule");
        assertGe(n, 10, "vectors present");
        for (uint256 i; i < n; ++i) {
            uint256[] memory tokens = vm.parseJsonUintArray(json, key("position_rule", i, "token_ids"));
            uint256[] memory weights = vm.parseJsonUintArray(json, key("position_rule", i, "weights"));
            bytes memory leaf = abi.encodePacked(uint32(i), uint32(vm.parseJsonUint(json, key("position_rule", i, "chosen"))));
            for (uint256 j; j < tokens.length; ++j) {
                leaf = abi.encodePacked(leaf, uint32(tokens[j]), uint32(weights[j]), uint32(0));
            }
            uint16 got = h.violation(
                leaf,
                tokens.length,
                vm.parseJsonUint(json, key("position_rule", i, "v")),
                vm.parseJsonUint(json, key("position_rule", i, "vocab_size"))
            );
            assertEq(got, vm.parseJsonUint(json, key("position_rule", i, "reason")), "reason");
        }
    }

    function test_terminationRuleMatchesVectors() public {
        ProtocolViews views = new ProtocolViews();
        uint256 n = count(".termination");
        assertGe(n, 10, "vectors present");
        for (uint256 i; i < n; ++i) {
            uint16 got = views.findTerminationViolation(
                vm.parseJsonUint(json, key("termination", i, "position")),
                vm.parseJsonBool(json, key("termination", i, "chosen_is_stop")),
                vm.parseJsonUint(json, key("termination", i, "output_length")),
                vm.parseJsonUint(json, key("termination", i, "max_tokens"))
            );
            assertEq(got, vm.parseJsonUint(json, key("termination", i, "reason")), "termination reason");
        }
        n = count(".termination_length");
        assertGe(n, 4, "length vectors present");
        for (uint256 i; i < n; ++i) {
            uint16 got = views.findLengthViolation(
                vm.parseJsonUint(json, key("termination_length", i, "output_length")),
                vm.parseJsonUint(json, key("termination_length", i, "max_tokens"))
            );
            assertEq(got, vm.parseJsonUint(json, key("termination_length", i, "reason")), "length reason");
        }
    }

    function test_artifactRootMatchesVector() public view {
        bytes32[] memory leaves = vm.parseJsonBytes32Array(json, ".artifact[0].leaf_hashes");
        bytes32[] memory proof = vm.parseJsonBytes32Array(json, ".artifact[0].proofs[0]");
        bytes32 node = leaves[0];
        for (uint256 i; i < proof.length; ++i) {
            node = node < proof[i] ? keccak256(abi.encode(node, proof[i])) : keccak256(abi.encode(proof[i], node));
        }
        assertEq(node, vm.parseJsonBytes32(json, ".artifact[0].positions_root"), "positions root");
        bytes32 root = Protocol.computeArtifactRoot(vm.parseJsonBytes32(json, ".artifact[0].header_hash"), node);
        assertEq(root, vm.parseJsonBytes32(json, ".artifact[0].artifact_root"), "artifact root");
    }

    function testFuzz_posteriorStaysInBounds(uint256 p, uint256 alpha, uint256 beta, bool valid) public pure {
        p = bound(p, Protocol.P_MIN, Protocol.P_MAX);
        alpha = bound(alpha, 1, 1e18 - 1);
        beta = bound(beta, 0, 1e18 - 1);
        uint256 q = Protocol.computePosterior(p, alpha, beta, valid);
        assertGe(q, Protocol.P_MIN, "lower clamp");
        assertLe(q, Protocol.P_MAX, "upper clamp");
        if (!valid && beta <= 1e18 - alpha) assertGe(q, p, "an invalid verdict never lowers P when 1-beta >= alpha");
    }

    function testFuzz_anHonestWalkAlwaysPasses(uint256 v, uint32 w0, uint32 w1, uint32 w2) public view {
        v = bound(v, 0, 2 ** 32 - 1);
        uint256[3] memory w = [uint256(w0), w1, w2];
        // sort descending and cap the sum at 2^32
        for (uint256 a; a < 3; ++a) {
            for (uint256 b = a + 1; b < 3; ++b) {
                if (w[b] > w[a]) (w[a], w[b]) = (w[b], w[a]);
            }
        }
        vm.assume(w[0] + w[1] + w[2] <= 2 ** 32);
        uint256[3] memory tokens = [uint256(3), 11, 7];
        uint256 chosen = 20; // a tail token unless the walk stops inside the candidates
        uint256 cumulative;
        for (uint256 j; j < 3; ++j) {
            cumulative += w[j];
            if (v < cumulative) {
                chosen = tokens[j];
                break;
            }
        }
        bytes memory leaf = abi.encodePacked(uint32(0), uint32(chosen));
        for (uint256 j; j < 3; ++j) {
            leaf = abi.encodePacked(leaf, uint32(tokens[j]), uint32(w[j]), uint32(0));
        }
        assertEq(h.violation(leaf, 3, v, 64), 0, "honest leaf");
    }

    function test_revertsOnAWrongLeafLength() public {
        vm.expectRevert(abi.encodeWithSelector(Protocol.LeafLength.selector, 20, 2));
        h.violation(new bytes(20), 2, 0, 64);
    }
}
