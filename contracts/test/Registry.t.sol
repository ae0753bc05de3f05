// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.28;

import {Fixture} from "./Fixture.sol";
import {ModelRegistry} from "../src/ModelRegistry.sol";
import {IAccessControl} from "@openzeppelin/contracts/access/IAccessControl.sol";

contract RegistryTest is Fixture {
    bytes32 internal constant OTHER = keccak256("other");

    function test_registerStoresTheProfile() public {
        hub.registerModel(OTHER, 8, 262_144, 2e15, 1e17, 5e16, keccak256("p"), 0, stops());
        (uint64 alpha, uint64 beta, uint64 rate, uint32 vocab, uint8 k, ModelRegistry.ModelState state, bytes32 ph,) =
            hub.models(OTHER);
        assertEq(alpha, 2e15, "alpha");
        assertEq(beta, 1e17, "beta");
        assertEq(rate, 5e16, "rate");
        assertEq(vocab, 262_144, "vocab");
        assertEq(k, 8, "k");
        assertEq(uint8(state), uint8(ModelRegistry.ModelState.Registered), "state");
        assertEq(ph, keccak256("p"), "profile hash");
    }

    function test_registerRevertsForStrangers() public {
        bytes32 role = hub.GOVERNOR_ROLE();
        vm.prank(REQUESTER);
        vm.expectRevert(
            abi.encodeWithSelector(IAccessControl.AccessControlUnauthorizedAccount.selector, REQUESTER, role)
        );
        hub.registerModel(OTHER, 5, 64, 1e16, 0, 1e16, 0, 0, stops());
    }

    function test_registerRevertsTwice() public {
        vm.expectRevert(abi.encodeWithSelector(ModelRegistry.ModelExists.selector, MODEL));
        hub.registerModel(MODEL, 5, 64, 1e16, 0, 1e16, 0, 0, stops());
    }

    function test_registerRevertsOnBadParams() public {
        vm.expectRevert(ModelRegistry.BadModelParams.selector);
        hub.registerModel(OTHER, 0, 64, 1e16, 0, 1e16, 0, 0, stops()); // K = 0
        vm.expectRevert(ModelRegistry.BadModelParams.selector);
        hub.registerModel(OTHER, 65, 1000, 1e16, 0, 1e16, 0, 0, stops()); // K > 64
        vm.expectRevert(ModelRegistry.BadModelParams.selector);
        hub.registerModel(OTHER, 5, 4, 1e16, 0, 1e16, 0, 0, stops()); // vocab < K
        vm.expectRevert(ModelRegistry.BadModelParams.selector);
        hub.registerModel(OTHER, 5, 64, 0, 0, 1e16, 0, 0, stops()); // alpha = 0
        vm.expectRevert(ModelRegistry.BadModelParams.selector);
        hub.registerModel(OTHER, 5, 64, 1e16, 1e18, 1e16, 0, 0, stops()); // beta = 1
        vm.expectRevert(ModelRegistry.BadModelParams.selector);
        hub.registerModel(OTHER, 5, 64, 1e16, 0, 1e18 + 1, 0, 0, stops()); // rate > 1
    }

    function test_statesMoveOneStepAtATime() public {
        hub.registerModel(OTHER, 5, 64, 1e16, 0, 1e16, 0, 0, stops());
        vm.expectRevert(
            abi.encodeWithSelector(
                ModelRegistry.BadStateTransition.selector,
                ModelRegistry.ModelState.Registered,
                ModelRegistry.ModelState.Verifying
            )
        );
        hub.setModelState(OTHER, ModelRegistry.ModelState.Verifying);
        vm.expectRevert(
            abi.encodeWithSelector(
                ModelRegistry.BadStateTransition.selector,
                ModelRegistry.ModelState.Registered,
                ModelRegistry.ModelState.None
            )
        );
        hub.setModelState(OTHER, ModelRegistry.ModelState.None);
        hub.setModelState(OTHER, ModelRegistry.ModelState.Measuring);
        hub.setModelState(OTHER, ModelRegistry.ModelState.Registered); // one step back is allowed
    }

    function test_unknownModelsRevert() public {
        vm.expectRevert(abi.encodeWithSelector(ModelRegistry.UnknownModel.selector, OTHER));
        hub.setModelState(OTHER, ModelRegistry.ModelState.Measuring);
        vm.expectRevert(abi.encodeWithSelector(ModelRegistry.UnknownModel.selector, OTHER));
        hub.setModelParams(OTHER, 1e16, 0, 1e16, 0);
    }

    function test_setParamsUpdatesRates() public {
        hub.setModelParams(MODEL, 3e15, 2e16, 1e17, keccak256("v2"));
        (uint64 alpha,, uint64 rate,,,, bytes32 ph,) = hub.models(MODEL);
        assertEq(alpha, 3e15, "alpha");
        assertEq(rate, 1e17, "rate");
        assertEq(ph, keccak256("v2"), "profile hash");
    }
}
