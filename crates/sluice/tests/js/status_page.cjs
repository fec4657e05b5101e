// The status page in a real browser (Debian's chromium, driven by playwright-core), for
// crates/sluice/tests/status_page.rs. Prints one JSON line of findings; exits non-zero with the
// reason when a check fails.
//
// node status_page.cjs ADMIN_URL TOKEN MAIN_URL ANVIL_A_URL ANVIL_B_URL ANVIL_B_PID SCREENSHOT
"use strict";
const { chromium } = require("playwright-core");

const [admin, token, main, anvilA, anvilB, pidB, screenshot] = process.argv.slice(2);
const findings = {};

function fail(why) {
  console.error(`status page: ${why}`);
  console.log(JSON.stringify(findings));
  process.exit(1);
}

async function blockNumber(url) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_blockNumber", params: [] }),
  });
  return Number(BigInt((await r.json()).result));
}

const rowHead = (page, name) => page.locator(`tr[data-member="${name}"] td[data-head]`).textContent();
const numberIn = (text) => Number(String(text).replace(/[^0-9]/g, ""));

async function main_() {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
      "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    const requests = [];
    page.on("request", (r) => requests.push(r.url()));
    // Without the token: refused (in a page of its own, whose console is not the one checked).
    const stranger = await browser.newPage();
    stranger.on("request", (r) => requests.push(r.url()));
    const refused = await stranger.goto(`${admin}/`);
    findings.without_token = refused.status();
    if (refused.status() !== 401) fail(`the admin page without the token answered ${refused.status()}`);
    await stranger.close();

    // From here on the page must run clean: no script error, no policy violation.
    const violations = [];
    page.on("console", (m) => { if (m.type() === "error") violations.push(m.text()); });
    page.on("pageerror", (e) => violations.push(String(e)));
    page.on("response", (r) => { if (r.status() >= 400) violations.push(`${r.status()} for ${r.url()}`); });

    // With it: the cookie, then the page at /.
    const opened = await page.goto(`${admin}/?token=${encodeURIComponent(token)}`);
    findings.with_token = opened.status();
    if (opened.status() !== 200 || !page.url().endsWith("/") || page.url().includes("token=")) {
      fail(`the admin page with the token: ${opened.status()} at ${page.url()}`);
    }
    await page.waitForSelector('tr[data-member="alpha"]', { timeout: 10000 });
    await page.waitForSelector('tr[data-member="beta"]', { timeout: 10000 });

    // Each member's head is its node's.
    for (const [name, url] of [["alpha", anvilA], ["beta", anvilB]]) {
      const want = await blockNumber(url);
      const deadline = Date.now() + 10000;
      let shown;
      while (Date.now() < deadline) {
        shown = numberIn(await rowHead(page, name));
        if (shown === want) break;
        await page.waitForTimeout(100);
      }
      findings[`head_${name}`] = { shown, node: want };
      if (shown !== want) fail(`${name}'s row shows head ${shown}, its node is at ${want}`);
    }

    // The request-rate chart moves while the load runs.
    const rate = async () => numberIn(await page.locator('[data-fact="rate"]').first().textContent());
    const points = async () => page.locator("svg.chart polyline").first().getAttribute("points");
    let deadline = Date.now() + 15000;
    while (Date.now() < deadline && !((await rate()) > 0)) await page.waitForTimeout(200);
    findings.rate_under_load = await rate();
    if (!(findings.rate_under_load > 0)) fail("the request rate stayed at 0 under load");
    const before = await points();
    await page.waitForTimeout(2500);
    const after = await points();
    findings.chart_points = (after || "").split(" ").length;
    if (before === after) fail("the request-rate chart did not move");

    // A member that dies turns red within two seconds.
    process.kill(Number(pidB), "SIGKILL");
    const killed = Date.now();
    // When /status itself shows it (to tell sluice's detection from the page's drawing).
    (async () => {
      while (Date.now() - killed < 10000) {
        const r = await fetch(`${admin}/status`, { headers: { authorization: `Bearer ${token}` } });
        const beta = (await r.json()).upstreams.find((u) => u.name === "beta");
        if (beta && beta.circuit !== "closed") {
          findings.status_open_after_ms = Date.now() - killed;
          return;
        }
        await new Promise((ok) => setTimeout(ok, 50));
      }
    })().catch(() => {});
    await page.waitForSelector('tr[data-member="beta"]:not([data-circuit="closed"])', { timeout: 10000 })
      .catch(() => fail("beta's row never showed an open circuit"));
    findings.red_after_ms = Date.now() - killed;
    const state = await page.locator('tr[data-member="beta"] [data-state]').textContent();
    findings.beta_state = state;
    if (!/down/.test(state)) fail(`beta's state reads ${state}`);
    if (findings.red_after_ms > 2000) fail(`beta turned red after ${findings.red_after_ms} ms`);
    const alphaState = await page.locator('tr[data-member="alpha"] [data-state]').textContent();
    if (alphaState !== "up") fail(`alpha reads ${alphaState}`);

    if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });

    // The main listener serves the page to a loopback client, without a token.
    const second = await browser.newPage();
    second.on("request", (r) => requests.push(r.url()));
    const mainPage = await second.goto(`${main}/`);
    findings.main_listener = mainPage.status();
    await second.waitForSelector('tr[data-member="alpha"]', { timeout: 10000 });

    // Nothing left loopback, and the page broke none of its own policy.
    const elsewhere = requests.filter((u) => !/^http:\/\/127\.0\.0\.1:\d+\//.test(u));
    findings.requests = requests.length;
    if (elsewhere.length) fail(`requests left loopback: ${elsewhere.join(", ")}`);
    if (violations.length) fail(`console errors: ${violations.join(" | ")}`);
  } finally {
    await browser.close();
  }
  console.log(JSON.stringify(findings));
}

main_().catch((e) => fail(e && e.stack ? e.stack : String(e)));
