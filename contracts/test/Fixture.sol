// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Base} from "./Base.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Staking} from "../src/Staking.sol";
import {ModelRegistry} from "../src/ModelRegistry.sol";
import {Protocol} from "../src/Protocol.sol";

/// @dev A deployed hub with one punitive model (K = 5, vocab 64, always checked), one operator and three validators.
abstract contract Fixture is Base {
    Verinfer internal hub;
    address internal constant TREASURY = address(0x7EA5);
    address internal constant REQUESTER = address(0xBEEF);
    bytes32 internal constant MODEL = keccak256("verinfer-test-model");
    uint256 internal constant OP_KEY = 0xA11CE;
    uint256[3] internal VAL_KEYS = [uint256(0xB0B1), 0xB0B2, 0xB0B3];
    address internal op;
    address[3] internal vals;
    uint64 internal constant USER_SEED = 77;
    uint256 internal constant FEE = 1 ether;
    uint256 internal constant BOND = 0.2 ether;
    uint256 internal constant MIN_FEE = 0.01 ether;
    uint32 internal constant STOP = 2; // the test model's stop token

    function config() internal pure virtual returns (Verinfer.Config memory) {
        return Verinfer.Config({
            minOperatorStake: 1 ether,
            minValidatorStake: 1 ether,
            unbondingDelay: 600,
            treasury: TREASURY,
            commitWindow: 20,
            checkWindow: 100,
            fraudWindow: 300,
            committeeSize: 3,
            slashThreshold: 0.99e18,
            slashBps: 5000,
            slashValidatorShareBps: 2000,
            fraudSlashBps: 10_000,
            proverRewardBps: 1000,
            validatorFeeBps: 1000,
            timeoutSlashBps: 100,
            requestBond: uint96(BOND),
            minCommittee: 3
        });
    }

    function validatorCount() internal pure virtual returns (uint256) {
        return 3;
    }

    function setUp() public virtual {
        vm.roll(100);
        vm.warp(1_700_000_000);
        hub = new Verinfer(config());
        hub.registerModel(MODEL, 5, 64, 1e16, 0, 1e18, keccak256("profile"), uint96(MIN_FEE), stops());
        hub.setModelState(MODEL, ModelRegistry.ModelState.Measuring);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Verifying);
        hub.setModelState(MODEL, ModelRegistry.ModelState.Punitive);
        op = vm.addr(OP_KEY);
        bondAs(op, Staking.Role.Operator, 10 ether);
        for (uint256 i; i < validatorCount(); ++i) {
            vals[i] = vm.addr(VAL_KEYS[i]);
            bondAs(vals[i], Staking.Role.Validator, 5 ether);
        }
        vm.deal(REQUESTER, 100 ether);
        vm.roll(101);
    }

    function bondAs(address who, Staking.Role role, uint256 amount) internal {
        vm.deal(who, who.balance + amount);
        vm.prank(who);
        hub.bond{value: amount}(role);
    }

    function params() internal pure returns (Verinfer.Params memory) {
        return Verinfer.Params({temperatureBits: 0x3f800000, topPBits: 0x3f800000, topK: 0, maxTokens: 64});
    }

    function stops() internal pure returns (uint32[] memory out) {
        out = new uint32[](1);
        out[0] = STOP;
    }

    function request() internal returns (uint256 id) {
        vm.prank(REQUESTER);
        id = hub.requestInference{value: FEE + BOND}(op, MODEL, keccak256("prompt"), USER_SEED, params());
    }

    function accept(uint256 id) internal {
        vm.prank(op);
        hub.acceptInference(id);
    }

    function commitment(bytes32 artifactRoot) internal pure returns (Verinfer.Commitment memory) {
        return Verinfer.Commitment(keccak256("output"), artifactRoot, keccak256("fingerprints"));
    }

    function commit(uint256 id, bytes32 artifactRoot) internal {
        Verinfer.Commitment memory c = commitment(artifactRoot);
        vm.prank(op);
        hub.commitInference(id, c.outputHash, c.artifactRoot, c.fingerprintHash);
    }

    /// @dev Request + commit, then move past the selection block.
    function committed(bytes32 artifactRoot) internal returns (uint256 id) {
        id = request();
        commit(id, artifactRoot);
        vm.roll(vm.getBlockNumber() + 2);
    }

    function vote(uint256 key, uint256 id, bytes32 root, bool valid) internal view returns (Verinfer.Vote memory) {
        uint16 reason = valid ? 0 : 504;
        bytes32 scores = keccak256(abi.encode("scores", key));
        uint64 deadline = uint64(block.timestamp + 3600);
        bytes32 digest = hub.verdictDigest(id, root, valid, reason, scores, deadline);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, digest);
        return Verinfer.Vote(valid, reason, scores, deadline, abi.encodePacked(r, s, v));
    }

    function votes1(Verinfer.Vote memory a) internal pure returns (Verinfer.Vote[] memory out) {
        out = new Verinfer.Vote[](1);
        out[0] = a;
    }

    /// @dev Keys of the committee members of an inference, in committee order.
    function committeeKeys(uint256 id) internal view returns (uint256[] memory keys) {
        (, address[] memory committee) = hub.selectionOf(id);
        keys = new uint256[](committee.length);
        for (uint256 j; j < committee.length; ++j) {
            for (uint256 i; i < validatorCount(); ++i) {
                if (vals[i] == committee[j]) keys[j] = VAL_KEYS[i];
            }
        }
    }

    function spoofP(address who) internal view returns (uint256 p) {
        (, p,,,,,) = hub.stakers(who);
    }

    function stakeOf(address who) internal view returns (uint256 s) {
        (s,,,,,,) = hub.stakers(who);
    }

    function isJailed(address who) internal view returns (bool jailed) {
        (,,,,,, jailed) = hub.stakers(who);
    }

    function statusOf(uint256 id) internal view returns (Verinfer.Status status) {
        status = hub.getInference(id).status;
    }

    function assertSolvent() internal view {
        assertEq(address(hub).balance, hub.totalStaked() + hub.totalCredits() + hub.totalEscrow(), "balance = stakes + credits + escrow");
    }
}
