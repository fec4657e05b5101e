// The dapp flow with viem, as a user writes it: three sendTransaction calls in a row (each a
// contract creation whose constructor emits one log), waitForTransactionReceipt for the last,
// then getLogs from block 0 to 'latest'; every log of the three must be there.
// Usage: node viem_flow.cjs RPC_URL PRIVATE_KEY INIT_CODE ROUNDS   (NODE_PATH: where viem is)
const { createPublicClient, createWalletClient, defineChain, http } = require('viem');
const { privateKeyToAccount } = require('viem/accounts');

const [url, key, initCode, rounds] = process.argv.slice(2);

async function main() {
  const transport = http(url, { retryCount: 0 });
  const probe = createPublicClient({ transport });
  const chain = defineChain({
    id: await probe.getChainId(),
    name: 'devnet',
    nativeCurrency: { name: 'Ether', symbol: 'ETH', decimals: 18 },
    rpcUrls: { default: { http: [url] } },
  });
  // A short polling interval, as a dapp on a fast devnet sets it.
  const client = createPublicClient({ chain, transport, pollingInterval: 50 });
  const wallet = createWalletClient({ chain, transport, account: privateKeyToAccount(key) });
  for (let round = 0; round < Number(rounds); round++) {
    const hashes = [];
    for (let i = 0; i < 3; i++) {
      hashes.push(await wallet.sendTransaction({ data: initCode }));
    }
    const receipts = [];
    for (const hash of hashes) {
      receipts.push(await client.waitForTransactionReceipt({ hash, pollingInterval: 50, timeout: 20_000 }));
    }
    const logs = await client.getLogs({ fromBlock: 0n, toBlock: 'latest' });
    const found = receipts.filter((r) =>
      logs.some((log) => log.address.toLowerCase() === r.contractAddress.toLowerCase()),
    ).length;
    console.log(`round ${round}: found ${found} of 3`);
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
