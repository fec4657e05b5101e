#!/usr/bin/env python3
"""Writes deploy/grafana/sluice.json, the Grafana dashboard for sluice.

Edit the panels here, then run `python3 deploy/grafana/generate.py`. The test
`crates/sluice/tests/prometheus.rs` runs every query of the JSON against a real Prometheus
scraping a sluice under load, and fails on a query that returns nothing.
"""
import json
import pathlib

NET = 'network=~"$network"'
RATE = "$__rate_interval"

# (row title, [(panel title, unit, [(expr, legend)])]); heavy queries read recording rules
# from deploy/prometheus/sluice.rules.yml.
ROWS = [
    ("Traffic", [
        ("Calls per second by outcome", "reqps", [
            (f'sum by (outcome) (network_outcome:sluice_requests:rate5m{{{NET}}})', "{{outcome}}")]),
        ("Calls per second by method (top 10)", "reqps", [
            (f'topk(10, sum by (method) (rate(sluice_requests_total{{{NET}}}[{RATE}])))', "{{method}}")]),
        ("Errors by reason", "reqps", [
            (f'sum by (outcome) (rate(sluice_requests_total{{{NET}, outcome!="ok"}}[{RATE}]))', "{{outcome}}")]),
        ("Failed share (sluice or its nodes)", "percentunit", [
            (f'network:sluice_requests_failed:ratio_rate5m{{{NET}}}', "{{network}}")]),
        ("Latency (all networks)", "s", [
            ('transport:sluice_request_duration_seconds:p50_rate5m', "p50 {{transport}}"),
            ('transport:sluice_request_duration_seconds:p90_rate5m', "p90 {{transport}}"),
            ('transport:sluice_request_duration_seconds:p99_rate5m', "p99 {{transport}}")]),
        ("Bodies in flight, WebSocket sessions", "short", [
            ('sum by (transport) (sluice_requests_in_flight)', "in flight {{transport}}"),
            ('sum(sluice_websocket_sessions)', "WebSocket sessions")]),
    ]),
    ("Cache", [
        ("Cache hit ratio by method", "percentunit", [
            (f'network_method:sluice_served_cached:ratio_rate5m{{{NET}}}', "{{network}} {{method}}")]),
        ("Answers by source", "reqps", [
            (f'sum by (source) (rate(sluice_served_total{{{NET}}}[{RATE}]))', "{{source}}")]),
        ("Cache lookups", "reqps", [
            (f'sum by (tier) (rate(sluice_cache_hits_total{{{NET}}}[{RATE}]))', "hit {{tier}}"),
            (f'sum(rate(sluice_cache_misses_total{{{NET}}}[{RATE}]))', "miss")]),
        ("Coalescing and calls saved", "reqps", [
            (f'sum(rate(sluice_cache_coalesced_total{{{NET}}}[{RATE}]))', "joined an identical call in flight"),
            (f'sum(rate(sluice_cache_upstream_calls_saved_total{{{NET}}}[{RATE}]))', "upstream calls saved")]),
        ("Cache memory", "bytes", [
            (f'sum by (network) (sluice_cache_bytes{{{NET}}})', "{{network}}")]),
    ]),
    ("Upstreams", [
        ("Upstream calls by member and outcome", "reqps", [
            (f'sum by (upstream, outcome) (network_upstream_outcome:sluice_upstream_calls:rate5m{{{NET}}}) > 0',
             "{{upstream}} {{outcome}}")]),
        ("Upstream p99 latency", "s", [
            (f'network_upstream:sluice_upstream_call_duration_seconds:p99_rate5m{{{NET}}}', "{{upstream}}")]),
        ("Score (higher is preferred)", "short", [
            (f'sluice_upstream_score{{{NET}}}', "{{upstream}}")]),
        ("Head and lag", "short", [
            (f'sluice_upstream_lag_blocks{{{NET}}}', "lag {{upstream}}"),
            (f'sluice_chain_head{{{NET}}}', "followed head {{network}}")]),
        ("Circuit open", "short", [
            (f'sluice_upstream_circuit_open{{{NET}}}', "{{upstream}}")]),
        ("Budget left", "short", [
            (f'sluice_upstream_budget_left{{{NET}}}', "{{upstream}} {{budget}}")]),
        ("Retries and hedges", "reqps", [
            (f'sum(rate(sluice_pool_retries_total[{RATE}]))', "retries"),
            (f'sum(rate(sluice_pool_hedges_total[{RATE}]))', "hedges"),
            (f'sum(rate(sluice_pool_hedge_wins_total[{RATE}]))', "hedge wins")]),
    ]),
    ("Upstream economy", [
        ("Calls a provider meters, by origin (internal: sluice's own)", "reqps", [
            (f'sum by (upstream, origin) (rate(sluice_upstream_metered_calls_total{{{NET}}}[{RATE}]))',
             "{{upstream}} {{origin}}")]),
        ("Multicall3 aggregation: calls by outcome", "reqps", [
            (f'sum by (outcome) (rate(sluice_aggregate_calls_total{{{NET}}}[{RATE}]))', "{{outcome}}")]),
        ("Aggregates sent", "reqps", [
            (f'sum by (network) (rate(sluice_aggregate_batches_total{{{NET}}}[{RATE}]))', "{{network}}")]),
        ("Rate in force (configured, or cut after 429s)", "reqps", [
            (f'sluice_upstream_rate_limit{{{NET}}}', "{{upstream}}")]),
        ("Rate-limit answers (429) by member", "reqps", [
            (f'sum by (upstream) (rate(sluice_upstream_rate_limited_total{{{NET}}}[{RATE}]))', "{{upstream}}")]),
    ]),
    ("Mempool", [
        ("Pending and queued", "short", [
            (f'sum by (network) (sluice_mempool_pending{{{NET}}})', "pending {{network}}"),
            (f'sum by (network) (sluice_mempool_queued{{{NET}}})', "queued {{network}}")]),
        ("Intake", "ops", [
            (f'sum(rate(sluice_mempool_accepted_total{{{NET}}}[{RATE}]))', "accepted"),
            (f'sum by (reason) (rate(sluice_mempool_refused_total{{{NET}}}[{RATE}]))', "refused: {{reason}}")]),
        ("Relayed and journal errors", "ops", [
            (f'sum by (kind) (rate(sluice_mempool_relayed_total{{{NET}}}[{RATE}]))', "relayed {{kind}}"),
            (f'sum(increase(sluice_mempool_journal_errors_total{{{NET}}}[{RATE}]))', "journal errors")]),
    ]),
    ("QUIC ingress", [
        ("Streams by client class and outcome", "ops", [
            (f'sum by (identity, outcome) (rate(sluice_ingress_streams_total[{RATE}])) > 0', "{{identity}} {{outcome}}")]),
        ("Measured RTT and stream credit", "short", [
            ('sluice_ingress_rtt_seconds', "RTT (s) {{identity}}"),
            ('sluice_ingress_credit_streams', "credit {{identity}}")]),
        ("Connections", "short", [
            ('sum(sluice_ingress_connections)', "open")]),
    ]),
    ("Access", [
        ("Calls by tier", "reqps", [
            (f'sum by (tier) (rate(sluice_access_calls_total[{RATE}]))', "{{tier}}")]),
        ("Compute units by tier", "short", [
            (f'sum by (tier) (rate(sluice_access_units_total[{RATE}]))', "{{tier}}")]),
        ("Refused callers", "reqps", [
            (f'sum by (tier, why) (rate(sluice_access_refused_total[{RATE}]))', "{{tier}} {{why}}")]),
    ]),
    ("Peer mesh", [
        ("Connected peers", "short", [
            ('sum(sluice_mesh_peers_connected)', "peers")]),
        ("Messages by outcome", "ops", [
            (f'sum by (outcome) (rate(sluice_mesh_messages_total[{RATE}]))', "{{outcome}}")]),
        ("Sends and failures", "ops", [
            (f'sum(rate(sluice_mesh_sends_total[{RATE}]))', "sends"),
            (f'sum(rate(sluice_mesh_send_failures_total[{RATE}]))', "send failures"),
            (f'sum(rate(sluice_mesh_inbound_failures_total[{RATE}]))', "inbound failures"),
            (f'sum(increase(sluice_mesh_bans_total[{RATE}]))', "bans")]),
    ]),
]


def dashboard():
    panels, y, next_id = [], 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": next_id, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}})
        next_id += 1
        y += 1
        for i, (name, unit, queries) in enumerate(row):
            panels.append({
                "type": "timeseries",
                "title": name,
                "id": next_id,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": (i % 3) * 8, "y": y + (i // 3) * 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi"}},
                "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend}
                            for k, (expr, legend) in enumerate(queries)],
            })
            next_id += 1
        y += ((len(row) + 2) // 3) * 8
    return {
        "title": "sluice",
        "uid": "sluice",
        "description": "sluice: traffic, cache, upstreams, mempool, QUIC ingress and peer mesh. "
                       "Generated by deploy/grafana/generate.py; needs deploy/prometheus/sluice.rules.yml.",
        "tags": ["sluice", "ethereum", "json-rpc"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus"},
            {"name": "network", "label": "Network", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(sluice_requests_total, network)", "refId": "network"},
             "definition": "label_values(sluice_requests_total, network)",
             "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
             "current": {"text": "All", "value": "$__all"}},
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


if __name__ == "__main__":
    out = pathlib.Path(__file__).with_name("sluice.json")
    out.write_text(json.dumps(dashboard(), indent=2) + "\n")
    print(f"wrote {out}")
