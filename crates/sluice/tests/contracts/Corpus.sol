// SPDX-License-Identifier: MIT OR Apache-2.0
pragma solidity ^0.8.20;

/// What the aggregation tests call: answers of every shape, reverts of every kind.
contract Corpus {
    error Refused(uint256 code, string why);

    function echo(uint256 x) external pure returns (uint256) {
        return x * 2;
    }

    function text(uint256 n) external pure returns (string memory out) {
        out = "";
        for (uint256 i = 0; i < n; i++) {
            out = string.concat(out, "sluice ");
        }
    }

    function number() external view returns (uint256) {
        return block.number;
    }

    function balance(address who) external view returns (uint256) {
        return who.balance;
    }

    function failWithString(uint256 x) external pure returns (uint256) {
        require(x > 1000000, "corpus refuses small numbers");
        return x;
    }

    function failWithCustom(uint256 x) external pure returns (uint256) {
        revert Refused(x, "custom");
    }

    function failWithPanic(uint256 x) external pure returns (uint256) {
        uint256 zero = x - x;
        return x / zero;
    }

    function failBare() external pure {
        revert();
    }

    /// Burns gas in proportion to `rounds`, without touching memory: heavy enough to run out
    /// of gas inside an aggregate.
    function burn(uint256 rounds) external pure returns (uint256 x) {
        unchecked {
            for (uint256 i = 0; i < rounds; i++) {
                x = x * 6364136223846793005 + i;
            }
        }
    }
}
