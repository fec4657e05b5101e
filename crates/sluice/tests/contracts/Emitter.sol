// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;

/// Emits logs shaped by its arguments, for the subscription filter tests: log i carries
/// i % 5 topics, topic j being `alphabet[(i + j + salt) % 4]`, and `i` as its data.
contract Emitter {
    function fire(uint256 count, uint256 salt, bytes32[4] calldata alphabet) external {
        for (uint256 i = 0; i < count; i++) {
            bytes32 t0 = alphabet[(i + salt) % 4];
            bytes32 t1 = alphabet[(i + 1 + salt) % 4];
            bytes32 t2 = alphabet[(i + 2 + salt) % 4];
            bytes32 t3 = alphabet[(i + 3 + salt) % 4];
            uint256 k = i % 5;
            assembly {
                mstore(0, i)
                switch k
                case 0 { log0(0, 32) }
                case 1 { log1(0, 32, t0) }
                case 2 { log2(0, 32, t0, t1) }
                case 3 { log3(0, 32, t0, t1, t2) }
                default { log4(0, 32, t0, t1, t2, t3) }
            }
        }
    }
}
