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
    uint256 public bonded; // ghost: Σ wei ever bonded (fixture bonds included by the test)
    uint256 public withdrawn; // ghost: Σ stake ever withdrawn
    bool internal noted;
    address[2] internal newcomers = [address(0xAA01), address(0xAA02)];

    constructor(Verinfer hub_, uint256 opKey_, uint256[3] memory valKeys_, bytes32 model_, address requester_) {
        (hub, opKey, valKeys, model, requester) = (hub_, opKey_, valKeys_, model_, requester_);
        op = vm.addr(opKey_);
    }

    function request(uint96 fee) external {
        fee = uint96(bound(fee, 0, 5 ether)) + uint96(hub.requestBond());
        vm.deal(requester, requester.balance + fee);
        vm.prank(requester);
        try hub.requestInference{value: fee}(
            op, model, bytes32(uint256(fee)), 1, Verinfer.Params(0x3f800000, 0x3f800000, 0, 64)
        ) {} catch {}
    }

    function accept(uint256 pick) external {
        vm.prank(op);
        try hub.acceptInference(_pick(pick)) {} catch {}
    }

    /// @dev Validators (the fixture's and newcomers) bond, top up and unbond at any time, after commits too.
    function bondValidator(uint8 who, uint96 amount) external {
        address v = _validator(who);
        uint256 value = bound(amount, 0, 1000 ether);
        vm.deal(v, v.balance + value);
        vm.prank(v);
        try hub.bond{value: value}(Staking.Role.Validator) {
            bonded += value;
        } catch {}
    }

    function unbondValidator(uint8 who) external {
        address v = _validator(who);
        vm.prank(v);
        try hub.requestUnbond() {} catch {}
        (uint256 stake,,,,,,) = hub.stakers(v);
        vm.prank(v);
        try hub.withdraw() {
            withdrawn += stake;
        } catch {}
    }

    function commit(uint256 pick) external {
        uint256 id = _pick(pick);
        vm.prank(op);
        try hub.commitInference(id, keccak256("o"), bytes32(id), keccak256("f")) {} catch {}
    }

    function roll(uint8 blocks) external {
        vm.roll(vm.getBlockNumber() + bound(blocks, 1, 60));
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
        (uint256 stake,,,,,,) = hub.stakers(op);
        vm.prank(op);
        try hub.withdraw() {
            withdrawn += stake;
        } catch {}
    }

    /// @dev Once, from setUp (later fuzzer calls do nothing).
    function noteFixtureBonds(uint256 amount) external {
        if (noted) return;
        noted = true;
        bonded += amount;
    }

    function _validator(uint8 who) internal view returns (address) {
        uint256 i = who % 5;
        return i < 3 ? vm.addr(valKeys[i]) : newcomers[i - 3];
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
        handler.noteFixtureBonds(hub.totalStaked());
    }

    function targetContracts() public view returns (address[] memory out) {
        out = new address[](1);
        out[0] = address(handler);
    }

    function invariant_balanceIsStakesPlusCreditsPlusEscrow() public view {
        assertSolvent();
    }

    /// @dev Credit slots are stored plus one once opened: that marker never counts as money.
    function invariant_creditsSumToTotal() public view {
        address[9] memory all = [op, REQUESTER, TREASURY, vals[0], vals[1], vals[2], address(0xAA01), address(0xAA02),
            vm.addr(0xBAD)]; // the attacker validator of the honest-operator suite
        uint256 sum;
        for (uint256 i; i < all.length; ++i) {
            sum += hub.credits(all[i]);
        }
        assertEq(sum, hub.totalCredits(), "sum of credits");
    }

    function invariant_stakesSumToTotal() public view {
        uint256 sum = stakeOf(op) + stakeOf(address(0xAA01)) + stakeOf(address(0xAA02));
        for (uint256 i; i < 3; ++i) {
            sum += stakeOf(vals[i]);
        }
        assertEq(sum, hub.totalStaked(), "sum of stakes");
    }

    /// @dev Stake is conserved: every wei bonded is still staked, was slashed, or was withdrawn.
    function invariant_stakeIsConserved() public view {
        assertEq(handler.bonded(), hub.totalStaked() + hub.totalSlashed() + handler.withdrawn(),
            "bonded = held + slashed + withdrawn");
    }

    /// @dev Whatever validators did after a commit, a checked inference's committee has the minimum size.
    function invariant_noCommitteeBelowTheMinimum() public view {
        for (uint256 id = 1; id <= hub.nextInferenceId(); ++id) {
            try hub.selectionOf(id) returns (bool checked, address[] memory committee) {
                if (checked) assertGe(committee.length, hub.minCommittee(), "committee >= minimum");
                else assertEq(committee.length, 0, "no committee when not checked");
            } catch {}
        }
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
            bool paidOut = inf.status >= Verinfer.Status.Valid && inf.status <= Verinfer.Status.Unchecked;
            if (paidOut || inf.status == Verinfer.Status.Uncheckable) ++settled;
        }
        assertEq(settled, handler.settlements(), "each settled inference paid out exactly once");
    }
}

/// @dev An honest operator that accepts and commits every request at once, three honest validators that vote
///      valid, and an attacker validator that bonds, tops up and unbonds at will and always votes invalid.
contract HonestOperatorHandler is Base {
    Verinfer internal immutable hub;
    address internal immutable op;
    uint256[3] internal honestKeys;
    uint256 internal constant ATTACKER_KEY = 0xBAD;
    bytes32 internal immutable model;
    address internal immutable requester;

    constructor(Verinfer hub_, address op_, uint256[3] memory honestKeys_, bytes32 model_, address requester_) {
        (hub, op, honestKeys, model, requester) = (hub_, op_, honestKeys_, model_, requester_);
    }

    function requestAndCommit(uint96 fee) external {
        uint256 value = bound(fee, 0.01 ether, 5 ether) + hub.requestBond();
        vm.deal(requester, requester.balance + value);
        vm.prank(requester);
        uint256 id = hub.requestInference{value: value}(op, model, bytes32(uint256(fee)), 1,
            Verinfer.Params(0x3f800000, 0x3f800000, 0, 64));
        vm.startPrank(op);
        hub.acceptInference(id);
        hub.commitInference(id, keccak256("o"), bytes32(id), keccak256("f"));
        vm.stopPrank();
    }

    function attackerBonds(uint96 amount) external {
        address a = vm.addr(ATTACKER_KEY);
        uint256 value = bound(amount, 1 ether, 1e24);
        vm.deal(a, a.balance + value);
        vm.prank(a);
        try hub.bond{value: value}(Staking.Role.Validator) {} catch {}
    }

    function attackerUnbonds() external {
        vm.prank(vm.addr(ATTACKER_KEY));
        try hub.requestUnbond() {} catch {}
    }

    function roll(uint8 blocks) external {
        vm.roll(vm.getBlockNumber() + bound(blocks, 1, 40));
    }

    /// @dev Votes on a committed inference: the attacker invalid, an honest member valid.
    function vote(uint256 pick, uint8 who) external {
        uint256 n = hub.nextInferenceId();
        if (n == 0) return;
        uint256 id = 1 + pick % n;
        bool attacker = who % 4 == 3;
        uint256 key = attacker ? ATTACKER_KEY : honestKeys[who % 4];
        uint64 deadline = uint64(block.timestamp + 60);
        bytes32 digest = hub.verdictDigest(id, bytes32(id), !attacker, attacker ? 504 : 0, 0, deadline);
        (uint8 v, bytes32 r, bytes32 s) = vm.sign(key, digest);
        Verinfer.Vote[] memory votes = new Verinfer.Vote[](1);
        votes[0] = Verinfer.Vote(!attacker, attacker ? 504 : 0, 0, deadline, abi.encodePacked(r, s, v));
        try hub.submitVerdicts(id, Verinfer.Commitment(keccak256("o"), bytes32(id), keccak256("f")), votes) {} catch {}
    }

    function finalize(uint256 pick) external {
        uint256 n = hub.nextInferenceId();
        if (n != 0) try hub.finalize(1 + pick % n) {} catch {}
    }
}

contract HonestOperatorInvariantTest is Fixture {
    HonestOperatorHandler internal handler;

    function setUp() public override {
        super.setUp();
        handler = new HonestOperatorHandler(hub, op, VAL_KEYS, MODEL, REQUESTER);
    }

    function targetContracts() public view returns (address[] memory out) {
        out = new address[](1);
        out[0] = address(handler);
    }

    /// @dev An honest operator answering in time is never slashed, whatever validators bond or unbond after its commit.
    function invariant_anHonestOperatorIsNeverSlashed() public view {
        assertEq(stakeOf(op), 10 ether, "stake intact");
        assertTrue(!isJailed(op), "not jailed");
        assertEq(hub.totalSlashed(), 0, "nothing slashed");
    }
}
