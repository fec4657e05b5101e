// Compiles the test contracts with solc-js and prints {"Name": "runtime bytecode hex"}.
// Usage: node compile.js SOLC_PACKAGE_DIR FILE.sol...
const path = require('path');
const fs = require('fs');
const solc = require(path.resolve(process.argv[2]));
const sources = {};
for (const file of process.argv.slice(3)) {
  sources[path.basename(file)] = { content: fs.readFileSync(file, 'utf8') };
}
const input = {
  language: 'Solidity',
  sources,
  settings: { optimizer: { enabled: true, runs: 200 }, outputSelection: { '*': { '*': ['evm.deployedBytecode.object'] } } },
};
const output = JSON.parse(solc.compile(JSON.stringify(input)));
const errors = (output.errors || []).filter((e) => e.severity === 'error');
if (errors.length) {
  console.error(errors.map((e) => e.formattedMessage).join('\n'));
  process.exit(1);
}
const out = {};
for (const file of Object.keys(output.contracts)) {
  for (const [name, c] of Object.entries(output.contracts[file])) {
    out[name] = c.evm.deployedBytecode.object;
  }
}
console.log(JSON.stringify(out));
