//! Statistics: latency histograms (HDR, microseconds), errors by reason, a per-second series,
//! and the generator's own cost. Pure.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Collects one run's outcomes.
pub struct Recorder {
    latency: Histogram<u64>,
    ok_latency: Histogram<u64>,
    send_lag: Histogram<u64>,
    seconds: Vec<Second>,
    errors: BTreeMap<String, u64>,
    ok: u64,
}

struct Second {
    ok: u64,
    errors: u64,
    latency: Histogram<u64>,
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 10 min, 3 significant digits.
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            latency: histogram(),
            ok_latency: histogram(),
            send_lag: histogram(),
            seconds: Vec::new(),
            errors: BTreeMap::new(),
            ok: 0,
        }
    }
}

impl Recorder {
    /// Records one request: when it completed (offset from the start), its latency, and its
    /// error reason if it failed. Failed requests count in the latency too (a timeout took time).
    pub fn record(&mut self, completed_at: Duration, latency: Duration, error: Option<String>) {
        let micros = (latency.as_micros() as u64).clamp(1, 600_000_000);
        self.latency.saturating_record(micros);
        let index = completed_at.as_secs() as usize;
        while self.seconds.len() <= index {
            self.seconds.push(Second { ok: 0, errors: 0, latency: histogram() });
        }
        let second = &mut self.seconds[index];
        second.latency.saturating_record(micros);
        match error {
            None => {
                self.ok += 1;
                self.ok_latency.saturating_record(micros);
                second.ok += 1;
            }
            Some(reason) => {
                *self.errors.entry(reason).or_default() += 1;
                second.errors += 1;
            }
        }
    }

    /// Records how late the generator sent a request compared with its schedule (open models).
    pub fn record_send_lag(&mut self, lag: Duration) {
        self.send_lag.saturating_record((lag.as_micros() as u64).clamp(1, 600_000_000));
    }

    /// Adds another recorder's outcomes (for alternating rounds against one target).
    pub fn merge(&mut self, other: &Recorder, offset: Duration) {
        let _ = self.latency.add(&other.latency);
        let _ = self.ok_latency.add(&other.ok_latency);
        let _ = self.send_lag.add(&other.send_lag);
        self.ok += other.ok;
        for (reason, n) in &other.errors {
            *self.errors.entry(reason.clone()).or_default() += n;
        }
        let base = offset.as_secs() as usize;
        for (i, s) in other.seconds.iter().enumerate() {
            while self.seconds.len() <= base + i {
                self.seconds.push(Second { ok: 0, errors: 0, latency: histogram() });
            }
            let mine = &mut self.seconds[base + i];
            mine.ok += s.ok;
            mine.errors += s.errors;
            let _ = mine.latency.add(&s.latency);
        }
    }

    /// The summary, given the measured wall time and the generator's CPU time.
    pub fn summarize(&self, target: &str, model: String, wall: Duration, cpu: Option<Duration>) -> Summary {
        let total = self.ok + self.errors.values().sum::<u64>();
        let secs = wall.as_secs_f64().max(1e-9);
        let h = &self.latency;
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f64;
        let cpu_cores = cpu.map(|c| c.as_secs_f64() / secs);
        let send_lag_p99_us = (!self.send_lag.is_empty()).then(|| self.send_lag.value_at_quantile(0.99));
        Summary {
            target: target.to_owned(),
            model,
            requests: total,
            ok: self.ok,
            errors: self.errors.clone(),
            seconds: secs,
            req_per_sec: total as f64 / secs,
            req_per_min: total as f64 / secs * 60.0,
            latency_us: Percentiles::of(h),
            ok_latency_us: Percentiles::of(&self.ok_latency),
            series: self
                .seconds
                .iter()
                .enumerate()
                .map(|(i, s)| SecondSummary {
                    second: i as u64,
                    ok: s.ok,
                    errors: s.errors,
                    p50_us: s.latency.value_at_quantile(0.5),
                    p99_us: s.latency.value_at_quantile(0.99),
                })
                .collect(),
            generator: Generator {
                cpu_cores,
                send_lag_p99_us,
                // Saturated: it used nearly all cores, or it sent well behind its schedule.
                saturated: cpu_cores.is_some_and(|c| c > 0.9 * cores) || send_lag_p99_us.is_some_and(|l| l > 5_000),
            },
        }
    }
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        Percentiles {
            min: h.min(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Latency percentiles, microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Percentiles {
    /// Smallest.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct SecondSummary {
    /// Seconds since the start.
    pub second: u64,
    /// Successful requests completed in it.
    pub ok: u64,
    /// Failed requests completed in it.
    pub errors: u64,
    /// Median latency in it, µs.
    pub p50_us: u64,
    /// 99th percentile latency in it, µs.
    pub p99_us: u64,
}

/// The generator's own cost, to tell when it, not the target, was the limit.
#[derive(Debug, Clone, Serialize)]
pub struct Generator {
    /// CPU used, in cores (CPU time / wall time), where measurable.
    pub cpu_cores: Option<f64>,
    /// How late requests left compared with the schedule (open models), p99 µs.
    pub send_lag_p99_us: Option<u64>,
    /// True when the generator itself was likely the bottleneck.
    pub saturated: bool,
}

/// One run's results (`--json` prints this).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The URL.
    pub target: String,
    /// The load model, described.
    pub model: String,
    /// Requests completed.
    pub requests: u64,
    /// Successful requests.
    pub ok: u64,
    /// Failures by reason (`timeout`, `unreachable`, `http 503`, `rpc -32000`, …).
    pub errors: BTreeMap<String, u64>,
    /// Wall time, seconds.
    pub seconds: f64,
    /// Throughput.
    pub req_per_sec: f64,
    /// Throughput per minute (as the ddosify report states it).
    pub req_per_min: f64,
    /// Latency percentiles, all requests (failures took time too).
    pub latency_us: Percentiles,
    /// Latency percentiles of the successful requests alone (what admitted callers saw).
    pub ok_latency_us: Percentiles,
    /// Per-second series.
    pub series: Vec<SecondSummary>,
    /// The generator's own cost.
    pub generator: Generator,
}

impl Summary {
    /// A human summary.
    pub fn human(&self) -> String {
        let l = &self.latency_us;
        let mut out = format!(
            "target   {}\nmodel    {}\nrequests {} in {:.1} s: {:.0} req/s ({:.0} req/min), {} ok, {} failed\n\
             latency  min {} · p50 {} · p90 {} · p99 {} · p99.9 {} · max {}\n",
            self.target,
            self.model,
            self.requests,
            self.seconds,
            self.req_per_sec,
            self.req_per_min,
            self.ok,
            self.requests - self.ok,
            us(l.min),
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p999),
            us(l.max)
        );
        for (reason, n) in &self.errors {
            out.push_str(&format!("error    {n} × {reason}\n"));
        }
        let g = &self.generator;
        out.push_str(&format!(
            "generator cpu {} cores{}{}\n",
            g.cpu_cores.map_or("?".into(), |c| format!("{c:.2}")),
            g.send_lag_p99_us.map_or(String::new(), |l| format!(", send lag p99 {}", us(l))),
            if g.saturated { ", SATURATED: the generator may be the limit" } else { "" }
        ));
        out
    }
}

/// `a / b` to two decimals, or `-` when `b` is zero.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".into()
    }
}

/// Formats microseconds for people.
pub fn us(v: u64) -> String {
    match v {
        0..=999 => format!("{v} µs"),
        1_000..=999_999 => format!("{:.2} ms", v as f64 / 1e3),
        _ => format!("{:.2} s", v as f64 / 1e6),
    }
}

/// This process's CPU time so far (user + system), from /proc.
pub fn process_cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10)) // USER_HZ is 100 on Linux
}

/// This process's CPU time so far per thread name (each thread's CPU clock; threads of one
/// name summed, a trailing `-N` index dropped so that a group of numbered threads adds up).
/// Threads that ended are not counted: read it while the threads of interest run.
pub fn thread_cpu_times() -> Option<std::collections::BTreeMap<String, Duration>> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let Ok(task) = task else { continue };
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let (Some((head, after_name)), Some(open)) = (stat.rsplit_once(')'), stat.find('(')) else { continue };
        let name = head.get(open + 1..).unwrap_or_default();
        // Linux keeps 15 bytes of a name, so `mempool-verify-0` reads `mempool-verify-`.
        let group = name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches('-');
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let (Some(Ok(user)), Some(Ok(system))) =
            (fields.get(11).map(|f| f.parse::<u64>()), fields.get(12).map(|f| f.parse::<u64>()))
        else {
            continue;
        };
        // The thread's own CPU clock, in ns; /proc's ticks (10 ms) only where it cannot be read.
        let tid = task.file_name().to_str().and_then(|t| t.parse::<i32>().ok());
        let spent = tid.and_then(thread_cpu_clock).unwrap_or(Duration::from_millis((user + system) * 10));
        *out.entry(group.to_owned()).or_insert(Duration::ZERO) += spent;
    }
    Some(out)
}

/// The calling thread's CPU time so far (its own CPU clock, ns resolution): what a thread
/// that ends before it could be read by [`thread_cpu_times`] measures itself with.
pub fn current_thread_cpu_time() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes only the timespec it is given.
        let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0;
        ok.then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// CPU time of thread `tid` of this process, from its scheduler clock (ns resolution). Linux
/// names a thread's CPU clock by its id: `(!tid << 3) | CPUCLOCK_PERTHREAD | CPUCLOCK_SCHED`.
fn thread_cpu_clock(tid: i32) -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let clock = ((!tid) << 3) | 4 | 2;
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes only the timespec it is given; an unknown clock (the
        // thread ended) is an error return, not undefined behaviour.
        let ok = unsafe { libc::clock_gettime(clock as libc::clockid_t, &mut ts) } == 0;
        ok.then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = tid;
        None
    }
}

/// What a ramp sustained: the best second's successful requests before the first second that
/// failed a request or had a p99 over the bound (the ramp's own average would only echo the
/// offered rate).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sustained {
    /// Successful requests in the best second before the limit (or in the whole run).
    pub rate: u64,
    /// The second the limit was reached and why, or `None` when the ramp ended first.
    pub limit: Option<(u64, String)>,
}

/// The highest rate sustained over `series` with a per-second p99 at most `p99_bound_us`.
pub fn sustained(series: &[SecondSummary], p99_bound_us: u64) -> Sustained {
    let mut best = 0;
    for s in series {
        let why = if s.errors > 0 {
            Some(format!("{} failed", s.errors))
        } else if s.p99_us > p99_bound_us {
            Some(format!("p99 {} ms", s.p99_us / 1000))
        } else {
            None
        };
        if let Some(why) = why {
            return Sustained { rate: best, limit: Some((s.second, why)) };
        }
        best = best.max(s.ok);
    }
    Sustained { rate: best, limit: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_series_and_errors() {
        let mut r = Recorder::default();
        for i in 0..100u64 {
            let error = (i % 10 == 0).then(|| "timeout".to_owned());
            r.record(Duration::from_millis(i * 20), Duration::from_millis(i + 1), error);
        }
        let s = r.summarize("t", "m".into(), Duration::from_secs(2), None);
        assert_eq!((s.requests, s.ok, s.errors["timeout"]), (100, 90, 10));
        assert!((49_000..=51_100).contains(&s.latency_us.p50), "{}", s.latency_us.p50);
        assert!((99_000..=100_100).contains(&s.latency_us.max));
        assert_eq!(s.series.len(), 2);
        assert_eq!(s.series[0].ok + s.series[0].errors, 50);
        assert!((s.req_per_sec - 50.0).abs() < 1e-9);
        assert!(s.human().contains("10 × timeout"));
    }

    #[test]
    fn merging_adds_up() {
        let mut a = Recorder::default();
        let mut b = Recorder::default();
        a.record(Duration::ZERO, Duration::from_millis(1), None);
        b.record(Duration::ZERO, Duration::from_millis(3), Some("rpc -32000".into()));
        a.merge(&b, Duration::from_secs(1));
        let s = a.summarize("t", "m".into(), Duration::from_secs(2), None);
        assert_eq!((s.requests, s.series.len(), s.errors["rpc -32000"]), (2, 2, 1));
    }

    #[test]
    fn a_ramp_sustains_until_its_first_failing_second() {
        let second =
            |i: u64, ok: u64, errors: u64, p99_us: u64| SecondSummary { second: i, ok, errors, p50_us: 1, p99_us };
        let rising: Vec<_> = (0..5).map(|i| second(i, 100 * (i + 1), 0, 1_000)).collect();
        assert_eq!(sustained(&rising, 50_000), Sustained { rate: 500, limit: None });
        let mut slow = rising.clone();
        slow[3].p99_us = 80_000;
        assert_eq!(sustained(&slow, 50_000), Sustained { rate: 300, limit: Some((3, "p99 80 ms".into())) });
        let mut failing = rising;
        failing[2].errors = 7;
        // A better second after the limit does not count.
        assert_eq!(sustained(&failing, 50_000), Sustained { rate: 200, limit: Some((2, "7 failed".into())) });
    }

    #[test]
    fn cpu_time_is_readable() {
        assert!(process_cpu_time().is_some());
    }

    #[test]
    fn thread_cpu_is_grouped_by_name() {
        let worker = std::thread::Builder::new()
            .name("spin-7".into())
            .spawn(|| {
                let started = std::time::Instant::now();
                let mut x = 0u64;
                while started.elapsed() < Duration::from_millis(150) {
                    x = x.wrapping_mul(31).wrapping_add(1);
                }
                let times = thread_cpu_times().expect("readable");
                std::hint::black_box(x);
                times
            })
            .expect("thread");
        let times = worker.join().expect("joined");
        // The numbered thread is counted under its stem, with the CPU it spent.
        assert!(times.get("spin").is_some_and(|t| *t >= Duration::from_millis(50)), "{times:?}");
        assert!(!times.contains_key("spin-7"));
    }
}
