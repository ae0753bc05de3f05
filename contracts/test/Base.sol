// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

/// @dev The forge cheatcodes these tests use (forge provides them at this address; forge-std is not
///      vendored: its npm copy is an unofficial 2022 snapshot and the machine has no git access).
interface Vm {
    function prank(address sender) external;
    function startPrank(address sender) external;
    function stopPrank() external;
    function deal(address account, uint256 newBalance) external;
    function roll(uint256 newHeight) external;
    function getBlockNumber() external view returns (uint256);
    function warp(uint256 newTimestamp) external;
    function expectRevert(bytes calldata revertData) external;
    function expectRevert(bytes4 revertData) external;
    function expectRevert() external;
    function sign(uint256 privateKey, bytes32 digest) external pure returns (uint8 v, bytes32 r, bytes32 s);
    function addr(uint256 privateKey) external pure returns (address);
    function assume(bool condition) external pure;
    function readFile(string calldata path) external view returns (string memory);
    function parseJsonUint(string calldata json, string calldata key) external pure returns (uint256);
    function parseJsonBytes32(string calldata json, string calldata key) external pure returns (bytes32);
    function parseJsonBool(string calldata json, string calldata key) external pure returns (bool);
    function parseJsonBytes(string calldata json, string calldata key) external pure returns (bytes memory);
    function parseJsonUintArray(string calldata json, string calldata key) external pure returns (uint256[] memory);
    function parseJsonBytes32Array(string calldata json, string calldata key)
        external
        pure
        returns (bytes32[] memory);
    function toString(uint256 value) external pure returns (string memory);
    function keyExistsJson(string calldata json, string calldata key) external view returns (bool);
}

/// @dev Assertions that revert with both values, and a uniform `bound` for fuzz inputs.
abstract contract Base {
    Vm internal constant vm = Vm(address(uint160(uint256(keccak256("hevm cheat code")))));

    error AssertionFailed(string what, uint256 got, uint256 want);

    function assertEq(uint256 got, uint256 want, string memory what) internal pure {
        if (got != want) revert AssertionFailed(what, got, want);
    }

    function assertEq(bytes32 got, bytes32 want, string memory what) internal pure {
        if (got != want) revert AssertionFailed(what, uint256(got), uint256(want));
    }

    function assertEq(address got, address want, string memory what) internal pure {
        if (got != want) revert AssertionFailed(what, uint160(got), uint160(want));
    }

    function assertTrue(bool ok, string memory what) internal pure {
        if (!ok) revert AssertionFailed(what, 0, 1);
    }

    function assertLe(uint256 got, uint256 most, string memory what) internal pure {
        if (got > most) revert AssertionFailed(what, got, most);
    }

    function assertGe(uint256 got, uint256 least, string memory what) internal pure {
        if (got < least) revert AssertionFailed(what, got, least);
    }

    function bound(uint256 x, uint256 lo, uint256 hi) internal pure returns (uint256) {
        return lo + x % (hi - lo + 1);
    }
}
