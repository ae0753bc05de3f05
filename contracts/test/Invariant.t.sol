// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Base} from "./Base.sol";
import {Fixture} from "./Fixture.sol";
import {Verinfer} from "../src/Verinfer.sol";
import {Staking} from "../src/Staking.sol";
import {Protocol} from "../src/Protocol.sol";

/// @dev Random but well-formed traffic: requests, commits, verdicts, expiries, finalisations, claims, unbonding.
contract Handler is Base {
    Verinfer internal immutable hub;
    address internal immutable op;
    address internal immutable requester;
    uint256 internal immutable opKey;
    uint256[3] internal valKeys;
    bytes32 internal immutable model;
    uint256 public settlements;

    constructor(Verinfer hub_, uint256 opKey_, uint256[3] memory valKeys_, bytes32 model_, address requester_) {
        (hub, opKey, valKeys, model, requester) = (hub_, opKey_, valKeys_, model_, requester_);
        op = vm.addr(opKey_);
    }

    function request(uint96 fee) external {
        fee = uint96(bound(fee, 0, 5 ether));
        vm.deal(requester, requester.balance + fee);
        vm.prank(requester);
        try hub.requestInference{value: fee}(
            op, model, bytes32(uint256(fee)), 1, Verinfer.Params(0x3f800000, 0x3f800000, 0, 64)
        ) {} catch {}
    }

    function commit(uint256 pick) external {
        uint256 id = _pick(pick);
        vm.prank(op);
        try hub.commitInference(id, keccak256("o"), bytes32(id), keccak256("f")) {} catch {}
    }

    function roll(uint8 blocks) external {
        vm.roll(block.number + bound(blocks, 1, 60));
    }

    function voteAs(uint256 pick, uint8 who, bool valid) external {
        uint256 id = _pick(pick);
        uint256 key = valKeys[who % 3];
        uint64 deadline = uint64(block.timestamp + 60);
        bytes32 digest = hub.verdictDigest(id, bytes32(id), valid, valid ? 0 : 504, 0, deadline);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, digest);
        Verinfer.Vote[] memory votes = new Verinfer.Vote[](1);
        votes[0] = Verinfer.Vote(valid, valid ? 0 : 504, 0, deadline, abi.encodePacked(r, s, v));
        Verinfer.Status before = hub.getInference(id).status;
        try hub.submitVerdicts(id, Verinfer.Commitment(keccak256("o"), bytes32(id), keccak256("f")), votes) {
            if (hub.getInference(id).status != before) ++settlements;
        } catch {}
    }

    function finalize(uint256 pick) external {
        try hub.finalize(_pick(pick)) {
            ++settlements;
        } catch {}
    }

    function expire(uint256 pick) external {
        try hub.expire(_pick(pick)) {} catch {}
    }

    function claim(uint8 who) external {
        address[5] memory all = [op, requester, vm.addr(valKeys[0]), vm.addr(valKeys[1]), vm.addr(valKeys[2])];
        vm.prank(all[who % 5]);
        try hub.claim() {} catch {}
    }

    function unbondAndWithdraw() external {
        vm.prank(op);
        try hub.requestUnbond() {} catch {}
        vm.prank(op);
        try hub.withdraw() {} catch {}
    }

    function _pick(uint256 pick) internal view returns (uint256) {
        uint256 n = hub.nextInferenceId();
        return n == 0 ? 1 : 1 + pick % n;
    }
}

contract InvariantTest is Fixture {
    Handler internal handler;

    function setUp() public override {
        super.setUp();
        handler = new Handler(hub, OP_KEY, VAL_KEYS, MODEL, REQUESTER);
    }

    function targetContracts() public view returns (address[] memory out) {
        out = new address[](1);
        out[0] = address(handler);
    }

    function invariant_balanceIsStakesPlusCreditsPlusEscrow() public view {
        assertSolvent();
    }

    function invariant_stakesSumToTotal() public view {
        uint256 sum = stakeOf(op);
        for (uint256 i; i < 3; ++i) {
            sum += stakeOf(vals[i]);
        }
        assertEq(sum, hub.totalStaked(), "sum of stakes");
    }

    function invariant_spoofProbabilityInBounds() public view {
        assertGe(spoofP(op), Protocol.P_MIN, "P >= 1e-6");
        assertLe(spoofP(op), Protocol.P_MAX, "P <= 1 - 1e-12");
    }

    function invariant_oneVotePerValidatorAndOneSettlementPerInference() public view {
        uint256 settled;
        for (uint256 id = 1; id <= hub.nextInferenceId(); ++id) {
            Verinfer.Inference memory inf = hub.getInference(id);
            uint256 bits;
            for (uint64 v = inf.voted; v != 0; v >>= 1) {
                bits += v & 1;
            }
            assertEq(inf.validVotes + inf.invalidVotes, bits, "votes = distinct voters");
            assertEq(inf.votedInvalid & ~inf.voted, 0, "invalid voters are voters");
            if (inf.status >= Verinfer.Status.Valid && inf.status <= Verinfer.Status.Unchecked) ++settled;
        }
        assertEq(settled, handler.settlements(), "each settled inference paid out exactly once");
    }
}
