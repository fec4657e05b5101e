//! Rendering the benchmark report: Markdown tables and SVG plots.

use std::fmt::Write;
use std::path::Path;

use plotters::prelude::*;

use crate::stats::{ratio, sustained, Summary};

/// One measured case: the same load against a reference (the node directly, or a bare
/// baseline) and through sluice.
pub struct Row {
    /// What varies in this row (e.g. `c=64`).
    pub case: String,
    /// Against the reference.
    pub direct: Summary,
    /// Through sluice.
    pub sluice: Summary,
}

/// A scenario: a table of rows with the command that reproduces it.
pub struct Section {
    /// Heading.
    pub title: String,
    /// What it measures and how to read it.
    pub note: String,
    /// The `sluice bench rpc` command for one row, with placeholders named.
    pub command: String,
    /// What sluice is compared with (`anvil`, `bare forwarder`, …): the table's first columns.
    pub reference: String,
    /// The rows.
    pub rows: Vec<Row>,
}

/// The Markdown for one section.
pub fn section_markdown(s: &Section) -> String {
    let mut out = format!("## {}\n\n{}\n\nCommand (one row): `{}`\n\n", s.title, s.note, s.command);
    let r = &s.reference;
    let _ = writeln!(
        out,
        "| case | {r} req/s | sluice req/s | ratio | {r} p50 / p90 / p99 µs | sluice p50 / p90 / p99 µs | errors {r} / sluice | generator CPU cores, {r} / sluice | generator saturated |"
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---|\n");
    let cores = |s: &Summary| s.generator.cpu_cores.map_or("-".to_owned(), |c| format!("{c:.2}"));
    for r in &s.rows {
        let (d, v) = (&r.direct.latency_us, &r.sluice.latency_us);
        let saturated = r.direct.generator.saturated || r.sluice.generator.saturated;
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {} | {} / {} / {} | {} / {} / {} | {} / {} | {} / {} | {} |",
            r.case,
            r.direct.req_per_sec,
            r.sluice.req_per_sec,
            ratio(r.sluice.req_per_sec, r.direct.req_per_sec),
            d.p50,
            d.p90,
            d.p99,
            v.p50,
            v.p90,
            v.p99,
            r.direct.requests - r.direct.ok,
            r.sluice.requests - r.sluice.ok,
            cores(&r.direct),
            cores(&r.sluice),
            if saturated { "yes" } else { "no" }
        );
    }
    out.push('\n');
    out
}

/// The ramp's table: for each target the highest rate it sustained before its first second
/// with a failure or a p99 over `p99_bound_us`, and the ratio of the two.
pub fn ramp_markdown(row: &Row, p99_bound_us: u64) -> String {
    let (d, v) = (sustained(&row.direct.series, p99_bound_us), sustained(&row.sluice.series, p99_bound_us));
    let limit = |s: &crate::stats::Sustained| match &s.limit {
        Some((second, why)) => format!("second {second}: {why}"),
        None => "none: the ramp ended first".to_owned(),
    };
    let mut out = String::from(
        "| target | highest sustained ok/s | limit reached | ok / requests in the run | generator CPU cores |\n|---|---:|---|---:|---:|\n",
    );
    for (name, s, summary) in [("anvil", &d, &row.direct), ("sluice", &v, &row.sluice)] {
        let cores = summary.generator.cpu_cores.map_or("-".to_owned(), |c| format!("{c:.2}"));
        let _ =
            writeln!(out, "| {name} | {} | {} | {} / {} | {cores} |", s.rate, limit(s), summary.ok, summary.requests);
    }
    let _ = writeln!(
        out,
        "\nsluice / anvil, highest sustained: **{}**{}.\n",
        ratio(v.rate as f64, d.rate as f64),
        match (d.limit.is_some(), v.limit.is_some()) {
            (true, true) => "",
            (true, false) => " (sluice reached no limit: a lower bound)",
            (false, true) => " (anvil reached no limit: an upper bound)",
            (false, false) => " (neither reached a limit: the ramp was not high enough to tell)",
        }
    );
    out
}

/// Added latency per percentile (sluice minus direct), for pass-through rows.
pub fn overhead_markdown(rows: &[Row]) -> String {
    let mut out = String::from("| case | p50 added µs | p90 added µs | p99 added µs |\n|---|---:|---:|---:|\n");
    for r in rows {
        let (d, v) = (&r.direct.latency_us, &r.sluice.latency_us);
        let diff = |a: u64, b: u64| a as i64 - b as i64;
        let _ =
            writeln!(out, "| {} | {} | {} | {} |", r.case, diff(v.p50, d.p50), diff(v.p90, d.p90), diff(v.p99, d.p99));
    }
    out.push('\n');
    out
}

/// Grouped bars: p50 and p99 (log scale, µs) for direct and sluice, one group per row.
pub fn latency_svg(rows: &[(String, &Row)], path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let max = rows.iter().map(|(_, r)| r.direct.latency_us.p99.max(r.sluice.latency_us.p99)).max().unwrap_or(1).max(10);
    let n = rows.len().max(1);
    let mut chart = ChartBuilder::on(&root)
        .caption("latency p50 (light) and p99 (dark), µs, log scale: direct (red) vs sluice (blue)", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(120)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, (1f64..(max as f64 * 2.0)).log_scale())?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|x| rows.get(x.floor() as usize).map(|(l, _)| l.clone()).unwrap_or_default())
        .x_label_style(("sans-serif", 11).into_font().transform(FontTransform::Rotate90))
        .draw()?;
    for (i, (_, row)) in rows.iter().enumerate() {
        let x = i as f64;
        let bars = [
            (x + 0.10, row.direct.latency_us.p50, RED.mix(0.4)),
            (x + 0.28, row.direct.latency_us.p99, RED.mix(0.9)),
            (x + 0.52, row.sluice.latency_us.p50, BLUE.mix(0.4)),
            (x + 0.70, row.sluice.latency_us.p99, BLUE.mix(0.9)),
        ];
        chart.draw_series(
            bars.iter()
                .map(|&(x0, v, color)| Rectangle::new([(x0, 1.0), (x0 + 0.16, v.max(1) as f64)], color.filled())),
        )?;
    }
    root.present()?;
    Ok(())
}

/// Successful requests per second over the run, direct vs sluice (for the ramp).
pub fn series_svg(direct: &Summary, sluice: &Summary, title: &str, path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (960, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let seconds = direct.series.len().max(sluice.series.len()).max(1) as f64;
    let max = direct.series.iter().chain(&sluice.series).map(|s| s.ok).max().unwrap_or(1).max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..max * 1.1)?;
    chart.configure_mesh().x_desc("second").y_desc("ok requests / s").draw()?;
    for (summary, color, label) in [(direct, RED, "direct"), (sluice, BLUE, "sluice")] {
        chart
            .draw_series(LineSeries::new(
                summary.series.iter().map(|s| (s.second as f64, s.ok as f64)),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE.mix(0.8)).draw()?;
    root.present()?;
    Ok(())
}
