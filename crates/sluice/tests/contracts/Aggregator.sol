// SPDX-License-Identifier: MIT OR Apache-2.0
pragma solidity ^0.8.20;

/// A Multicall3-compatible `aggregate3`, written for sluice's tests and placed at Multicall3's
/// canonical address with `anvil_setCode`: the same function, selector and semantics.
contract Aggregator {
    struct Call3 {
        address target;
        bool allowFailure;
        bytes callData;
    }

    struct Result {
        bool success;
        bytes returnData;
    }

    function aggregate3(Call3[] calldata calls) external payable returns (Result[] memory returnData) {
        uint256 length = calls.length;
        returnData = new Result[](length);
        for (uint256 i = 0; i < length; i++) {
            Call3 calldata one = calls[i];
            (bool success, bytes memory data) = one.target.call(one.callData);
            require(success || one.allowFailure, "Multicall3: call failed");
            returnData[i] = Result(success, data);
        }
    }
}
