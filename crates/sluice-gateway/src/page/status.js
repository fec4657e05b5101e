"use strict";
// The status page's script: reads the live stream (/status/live: what /status shows and the
// /metrics families the page draws, once a second) and draws it. No library; nothing is
// fetched from anywhere but this page's own origin.
(() => {
  const CHART_SECONDS = 300;
  const LATENCY_SECONDS = 10;
  const NOT_FAILED = new Set(["ok", "rpc_error"]);
  const CACHED = new Set(["cache-memory", "cache-redis", "coalesced"]);
  const snapshots = []; // the snapshots of the last LATENCY_SECONDS: {at, samples}
  const charts = new Map(); // network id -> {at, points: [{ok, failed}] one a second, oldest first}
  let lastAt = 0;

  // --- reading -------------------------------------------------------------------------------

  /** Prometheus text lines -> [{name, labels, value}]. */
  function parseMetrics(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      const m = /^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, "$1");
      samples.push({ name: m[1], labels, value: Number(m[3]) });
    }
    return samples;
  }

  function sum(samples, name, keep) {
    let total = 0;
    for (const s of samples) if (s.name === name && (!keep || keep(s.labels)) && Number.isFinite(s.value)) total += s.value;
    return total;
  }

  /** Per second between two snapshots (a counter that went back, a restart, counts as 0). */
  function rate(newer, older, name, keep) {
    if (!newer || !older || newer.at <= older.at) return null;
    const d = sum(newer.samples, name, keep) - sum(older.samples, name, keep);
    return Math.max(0, d) / ((newer.at - older.at) / 1000);
  }

  /** A latency percentile (seconds) from histogram bucket deltas between two snapshots. */
  function percentile(newer, older, q) {
    if (!newer || !older) return null;
    const buckets = new Map();
    const add = (snap, sign) => {
      for (const s of snap.samples) {
        if (s.name !== "sluice_request_duration_seconds_bucket") continue;
        const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
        buckets.set(le, (buckets.get(le) || 0) + sign * s.value);
      }
    };
    add(newer, 1);
    add(older, -1);
    const bounds = [...buckets.keys()].sort((a, b) => a - b);
    const total = buckets.get(Infinity) || 0;
    if (total <= 0) return null;
    let below = 0;
    let lower = 0;
    for (const le of bounds) {
      const count = buckets.get(le);
      if (count >= q * total) {
        if (le === Infinity) return lower;
        // Linear within the bucket, as Prometheus' histogram_quantile does.
        return lower + (le - lower) * ((q * total - below) / Math.max(count - below, 1e-9));
      }
      below = count;
      lower = le;
    }
    return lower;
  }

  /** The networks of a /status document: named ones, or the single implicit one. */
  function networksOf(status) {
    if (status.networks) return Object.entries(status.networks).map(([id, s]) => ({ id, s }));
    return [{ id: "default", s: status }];
  }

  // --- drawing -------------------------------------------------------------------------------

  function el(tag, attrs, ...children) {
    const ns = ["svg", "polyline"].includes(tag) ? "http://www.w3.org/2000/svg" : null;
    const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== undefined && v !== null) e.setAttribute(k, String(v));
    for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
    return e;
  }

  const dash = "–";
  const num = (v) => (v === null || v === undefined ? dash : Number(v).toLocaleString("en-US"));
  const perSecond = (v) => (v === null || v === undefined ? dash : v < 10 ? v.toFixed(1) : Math.round(v).toLocaleString("en-US"));
  const ms = (seconds) => (seconds === null ? dash : seconds < 0.001 ? `${(seconds * 1e6).toFixed(0)} µs` : `${(seconds * 1000).toFixed(1)} ms`);
  const bytes = (b) => (b === null || b === undefined ? dash : b >= 1 << 20 ? `${(b / (1 << 20)).toFixed(1)} MiB` : `${(b / 1024).toFixed(0)} KiB`);

  function facts(pairs) {
    return el("dl", { class: "facts" }, ...pairs.map(([k, v, id]) => el("div", {}, el("dt", {}, k), el("dd", id ? { "data-fact": id } : {}, v))));
  }

  /** A member's state in words (colour is only a second signal). */
  function memberState(m) {
    if (m.circuit && m.circuit !== "closed") return ["down", `down (circuit ${m.circuit}${m.last_error ? `, ${m.last_error}` : ""})`];
    if (m.last_error) return ["down", `failing (${m.last_error})`];
    if (m.cordoned) return ["warn", "cordoned"];
    if (m.lag !== null && m.lag !== undefined && m.lag > 2) return ["warn", `behind by ${m.lag}`];
    return ["up", "up"];
  }

  function membersTable(id, members, now, before) {
    const head = ["Member", "State", "Head", "Lag", "Score", "Circuit", "Budget left", "Quota left", "Lowest state", "Lowest block", "Calls/s", "Failed/s", "Dissents", "Cordoned"];
    const rows = members.map((m) => {
      const mine = (l) => l.network === id && l.upstream === m.name;
      const calls = rate(now, before, "sluice_upstream_calls_total", mine);
      const failed = rate(now, before, "sluice_upstream_calls_total", (l) => mine(l) && !NOT_FAILED.has(l.outcome));
      const [cls, words] = memberState(m);
      return el("tr", { class: cls === "down" ? "down" : null, "data-member": m.name, "data-circuit": m.circuit },
        el("th", { scope: "row" }, m.name),
        el("td", {}, el("span", { class: `state ${cls}`, "data-state": cls }, words)),
        el("td", { "data-head": "" }, num(m.head)),
        el("td", {}, num(m.lag)),
        el("td", {}, num(m.score)),
        el("td", {}, m.circuit || dash),
        el("td", {}, m.rate_left === null || m.rate_left === undefined ? "unlimited" : num(Math.floor(m.rate_left))),
        el("td", {}, m.daily_quota_left === null || m.daily_quota_left === undefined ? "unlimited" : num(m.daily_quota_left)),
        el("td", {}, num(m.lowest_state)),
        el("td", {}, num(m.lowest_block)),
        el("td", {}, perSecond(calls)),
        el("td", {}, perSecond(failed)),
        el("td", {}, num(m.dissents)),
        el("td", {}, m.cordoned ? `yes (${m.cordons})` : `no${m.cordons ? ` (${m.cordons} before)` : ""}`));
    });
    return el("div", { class: "scroll" }, el("table", {},
      el("caption", { class: "visually-hidden" }, `Members of ${id}`),
      el("thead", {}, el("tr", {}, ...head.map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, ...rows)));
  }

  function chart(id, series) {
    const max = Math.max(1, ...series.map((p) => p.ok + p.failed));
    // The last minute at first, growing to five as the page stays open.
    const span = Math.max(60, series.length);
    const points = (pick) => series.map((p, i) => `${span - series.length + i},${(100 - (pick(p) / max) * 95).toFixed(1)}`).join(" ");
    const last = series.length ? series[series.length - 1] : { ok: 0, failed: 0 };
    return el("figure", {},
      el("svg", { class: "chart", viewBox: `0 0 ${span - 1} 100`, preserveAspectRatio: "none", role: "img", "aria-label": `Requests per second on ${id}, last five minutes`, "data-chart": id, "data-points": series.length },
        el("polyline", { points: points((p) => p.ok + p.failed) }),
        el("polyline", { class: "errors", points: points((p) => p.failed) })),
      el("figcaption", {}, `Requests/s, last ${span >= CHART_SECONDS ? "5 min" : `${Math.round(span / 60)} min`} (top of chart: ${perSecond(max)}/s; now ${perSecond(last.ok + last.failed)}/s, failed ${perSecond(last.failed)}/s)`));
  }

  function kv(title, object) {
    const scalars = Object.entries(object || {}).filter(([, v]) => v === null || typeof v !== "object");
    const nested = Object.entries(object || {}).filter(([, v]) => v !== null && typeof v === "object");
    return el("div", {}, el("h3", {}, title),
      facts([...scalars.map(([k, v]) => [k.replace(/_/g, " "), v === null ? dash : typeof v === "number" ? num(v) : String(v)]),
        ...nested.map(([k, v]) => [k.replace(/_/g, " "), Array.isArray(v) ? `${v.length}` : Object.entries(v).map(([a, b]) => `${a}: ${typeof b === "object" ? JSON.stringify(b) : b}`).join(", ") || dash])]));
  }

  function drawNetwork(net, now, before, window) {
    const { id, s } = net;
    const mine = (l) => l.network === id;
    const requests = rate(now, before, "sluice_requests_total", mine);
    const failed = rate(now, before, "sluice_requests_total", (l) => mine(l) && !NOT_FAILED.has(l.outcome));
    const served = rate(now, window, "sluice_served_total", mine);
    const cached = rate(now, window, "sluice_served_total", (l) => mine(l) && CACHED.has(l.source));
    const intake = rate(now, before, "sluice_mempool_accepted_total", mine);
    const cacheBytes = now.samples.find((x) => x.name === "sluice_cache_bytes" && x.labels.network === id);
    const chain = s.chain || {};
    // Snapshots come once a second and sooner on a change: the chart takes one point a second.
    const drawn = charts.get(id) || { at: 0, points: [] };
    if (requests !== null && now.at - drawn.at >= 950) {
      drawn.points.push({ ok: Math.max(0, requests - (failed || 0)), failed: failed || 0 });
      while (drawn.points.length > CHART_SECONDS) drawn.points.shift();
      drawn.at = now.at;
      charts.set(id, drawn);
    }
    const series = drawn.points;
    const section = el("section", { "aria-labelledby": `net-${id}`, "data-network": id });
    section.append(
      el("h2", { id: `net-${id}` }, id === "default" ? "Network" : `Network ${id}`, s.chain_id ? ` (chain ${s.chain_id})` : ""),
      facts([
        ["Served head", num(chain.head ?? s.best_head), "head"],
        ["Safe", num(chain.safe)],
        ["Finalized", num(chain.finalized)],
        ["Requests/s", perSecond(requests), "rate"],
        ["Failed/s", perSecond(failed)],
        ["p50 latency", ms(percentile(now, window, 0.5))],
        ["p99 latency", ms(percentile(now, window, 0.99))],
        ["Cache hits", served ? `${Math.round((100 * cached) / served)} %` : dash],
        ["Cache memory", bytes(cacheBytes ? cacheBytes.value : null)],
        ...(s.mempool ? [["Mempool pending", num(s.mempool.pending)], ["Mempool queued", num(s.mempool.queued)], ["Intake/s", perSecond(intake)]] : []),
      ]),
      chart(id, series),
      el("h3", {}, "Members"),
      membersTable(id, s.upstreams || [], now, before));
    if (s.ingress) section.append(kv("QUIC ingress", s.ingress));
    return section;
  }

  function drawProcess(status, now) {
    const gauge = (name) => sum(now.samples, name);
    const body = el("div", {},
      facts([
        ["WebSocket clients", num(gauge("sluice_websocket_sessions")), "ws"],
        ["Log subscriptions (filters)", num(gauge("sluice_subscription_log_filters"))],
        ["Upstream sockets", num(gauge("sluice_upstream_sockets"))],
      ]));
    if (status.mesh) body.append(kv("Peer mesh", status.mesh));
    document.getElementById("process-body").replaceChildren(body);
    document.getElementById("process").hidden = false;
  }

  function draw(doc) {
    const snap = { at: doc.at, samples: parseMetrics(doc.metrics || "") };
    snapshots.push(snap);
    while (snapshots.length > 2 && snap.at - snapshots[1].at >= LATENCY_SECONDS * 1000) snapshots.shift();
    // Rates over about the last second: the newest snapshot at least 0.9 s older than this one.
    let before = null;
    for (const older of snapshots) if (snap.at - older.at >= 900) before = older;
    const window = snapshots.length > 1 ? snapshots[0] : null;
    const main = document.getElementById("networks");
    main.replaceChildren(...networksOf(doc.status).map((n) => drawNetwork(n, snap, before, window)));
    main.setAttribute("aria-busy", "false");
    drawProcess(doc.status, snap);
  }

  // --- the live stream ---------------------------------------------------------------------

  const conn = document.getElementById("conn");
  const say = (state, words) => {
    conn.dataset.state = state;
    conn.textContent = words;
  };
  const source = new EventSource("status/live");
  source.addEventListener("status", (e) => {
    lastAt = Date.now();
    try {
      draw(JSON.parse(e.data));
      say("live", `live · ${new Date().toLocaleTimeString()}`);
    } catch (err) {
      say("lost", `cannot read the status stream: ${err}`);
    }
  });
  source.onerror = () => say("lost", "connection lost, retrying…");
  setInterval(() => {
    if (lastAt && Date.now() - lastAt > 3000) say("lost", `no update for ${Math.round((Date.now() - lastAt) / 1000)} s`);
  }, 1000);
})();
