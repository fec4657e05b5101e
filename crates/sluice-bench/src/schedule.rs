//! When each request should be sent, for the open (rate) models. Pure.
//!
//! Latency in these models is measured from the *intended* send time, so a target that stalls
//! cannot hide the stall by slowing the generator down (coordinated omission, as in wrk2).

use std::time::Duration;

/// A load model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Model {
    /// A fixed number of workers, each sending its next request when the last one is answered
    /// (closed model, like ab or wrk).
    Concurrency(usize),
    /// A constant arrival rate, requests per second (open model).
    Rate(f64),
    /// A rate rising linearly from `from` to `to` over the whole duration (ddosify's
    /// incremental mode).
    Ramp {
        /// Starting rate, requests per second.
        from: f64,
        /// Final rate, requests per second.
        to: f64,
    },
}

impl Model {
    /// Checks the numbers before any load starts.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Model::Concurrency(0) => Err("concurrency must be at least 1".into()),
            Model::Rate(r) if !(r > 0.0 && r.is_finite()) => Err(format!("rate must be positive, got {r}")),
            Model::Ramp { from, to } if !(from >= 0.0 && to > 0.0 && from.is_finite() && to.is_finite()) => {
                Err(format!("ramp rates must be non-negative and end above zero, got {from} → {to}"))
            }
            _ => Ok(()),
        }
    }

    /// The offset from the start at which request `i` (0-based) is due, or `None` once past
    /// `duration`. `None` always for the closed model.
    pub fn intended_offset(&self, i: u64, duration: Duration) -> Option<Duration> {
        let d = duration.as_secs_f64();
        let i = i as f64;
        let t = match *self {
            Model::Concurrency(_) => return None,
            Model::Rate(r) => i / r,
            Model::Ramp { from, to } => {
                // Requests sent by time t: N(t) = from·t + (to − from)·t² / (2d). Solve N(t) = i.
                let a = (to - from) / (2.0 * d);
                if a.abs() < 1e-12 {
                    i / from
                } else {
                    (-from + (from * from + 4.0 * a * i).sqrt()) / (2.0 * a)
                }
            }
        };
        (t.is_finite() && t < d).then(|| Duration::from_secs_f64(t))
    }

    /// Requests the model sends in `duration` (open models).
    pub fn expected_requests(&self, duration: Duration) -> Option<u64> {
        let d = duration.as_secs_f64();
        match *self {
            Model::Concurrency(_) => None,
            Model::Rate(r) => Some((r * d).ceil() as u64),
            Model::Ramp { from, to } => Some(((from + to) / 2.0 * d).ceil() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_rate_spaces_requests_evenly() {
        let m = Model::Rate(100.0);
        let d = Duration::from_secs(1);
        assert_eq!(m.intended_offset(0, d), Some(Duration::ZERO));
        assert_eq!(m.intended_offset(50, d), Some(Duration::from_millis(500)));
        assert_eq!(m.intended_offset(100, d), None);
        assert_eq!(m.expected_requests(d), Some(100));
    }

    #[test]
    fn a_ramp_sends_the_area_under_its_line() {
        let m = Model::Ramp { from: 0.0, to: 1000.0 };
        let d = Duration::from_secs(10);
        // 5,000 requests in all; a quarter of them by half time.
        let sent_by =
            |t: f64| (0..6000).filter(|&i| m.intended_offset(i, d).is_some_and(|o| o.as_secs_f64() < t)).count();
        assert!((sent_by(10.0) as i64 - 5000).abs() <= 1, "{}", sent_by(10.0));
        assert!((sent_by(5.0) as i64 - 1250).abs() <= 1, "{}", sent_by(5.0));
        assert_eq!(m.expected_requests(d), Some(5000));
        let flat = Model::Ramp { from: 10.0, to: 10.0 };
        assert_eq!(flat.intended_offset(5, d), Some(Duration::from_millis(500)));
    }

    #[test]
    fn bad_numbers_are_refused() {
        assert!(Model::Concurrency(0).validate().is_err());
        assert!(Model::Rate(0.0).validate().is_err());
        assert!(Model::Rate(f64::NAN).validate().is_err());
        assert!(Model::Ramp { from: -1.0, to: 5.0 }.validate().is_err());
        assert!(Model::Ramp { from: 0.0, to: 5.0 }.validate().is_ok());
    }
}
