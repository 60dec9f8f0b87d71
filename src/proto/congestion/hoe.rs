//! Hoe's start-up estimate of ssthresh (Hoe 1996, §3.1): the bandwidth
//! that closely spaced ACKs reveal, times the round-trip time, so that
//! slow start hands over to congestion avoidance before it overruns a
//! small bottleneck queue instead of at an arbitrary initial threshold.
//!
//! "Data packets, which are sent closely spaced, arrive at the receiver at
//! the rate of the bottleneck link bandwidth"; with the ACKs spaced the
//! same way, a least-squares fit of data acknowledged against arrival
//! time over three ACKs gives that rate. Hoe times the SYN for the RTT;
//! atou has no SYN, so the least RTT sample so far stands in (the first
//! segments meet an empty queue, as the SYN does). ssthresh is at least
//! four segments, "so that there would be enough time to get the three
//! ACKs needed for the estimation".

use std::time::Duration;

use super::AckEvent;
use crate::proto::time::Time;

/// ACKs in one fit (Hoe §3.1: "three closely-spaced ACK's").
const POINTS: usize = 3;
/// The least ssthresh the estimate gives, in segments (Hoe §3.1).
pub(super) const MIN_SSTHRESH: u64 = 4;

/// Collects the first closely spaced ACKs of a connection and, once, gives
/// the ssthresh they imply.
#[derive(Debug, Clone, Default)]
pub(super) struct StartupEstimate {
    /// (arrival, segments delivered so far) of the current run of closely
    /// spaced ACKs.
    points: Vec<(Time, u64)>,
    min_rtt: Option<Duration>,
    done: bool,
}

impl StartupEstimate {
    /// Feeds one ACK; returns the estimated ssthresh, in segments, on the
    /// ACK that completes the fit, and `None` before and after.
    pub(super) fn on_ack(&mut self, ack: &AckEvent) -> Option<u64> {
        if self.done {
            return None;
        }
        if let Some(rtt) = ack.rtt {
            self.min_rtt = Some(self.min_rtt.map_or(rtt, |m| m.min(rtt)));
        }
        let rtt = self.min_rtt?;
        if ack.newly_delivered == 0 {
            return None;
        }
        // ACKs of one flight arrive at the bottleneck's spacing; the gap
        // between flights is most of a round trip and says nothing of the
        // rate, so a gap of over a quarter RTT starts a new run.
        if self
            .points
            .last()
            .is_some_and(|&(t, _)| ack.now.saturating_since(t) > rtt / 4)
        {
            self.points.clear();
        }
        self.points.push((ack.now, ack.delivered));
        if self.points.len() < POINTS {
            return None;
        }
        let per_sec = slope(&self.points)?;
        self.done = true;
        let estimate = (per_sec * rtt.as_secs_f64()).round() as u64;
        Some(estimate.max(MIN_SSTHRESH))
    }
}

/// Least-squares slope of segments against seconds; `None` when the
/// points share one instant.
fn slope(points: &[(Time, u64)]) -> Option<f64> {
    let t0 = points[0].0;
    let xs: Vec<f64> = points
        .iter()
        .map(|&(t, _)| t.saturating_since(t0).as_secs_f64())
        .collect();
    let ys: Vec<f64> = points.iter().map(|&(_, d)| d as f64).collect();
    let n = xs.len() as f64;
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
    let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(ms: f64, delivered: u64, rtt_ms: Option<u64>) -> AckEvent {
        AckEvent {
            delivered,
            rtt: rtt_ms.map(Duration::from_millis),
            srtt: Duration::from_millis(100),
            ..AckEvent::of_one_segment(Time::ZERO + Duration::from_secs_f64(ms / 1000.0))
        }
    }

    /// One segment every 5 ms (200 per second) and a 100 ms RTT: a BDP of
    /// 20 segments. The lone first ACK, a round trip before the next
    /// flight's, is not part of the fit.
    #[test]
    fn three_closely_spaced_acks_give_rate_times_rtt() {
        let mut e = StartupEstimate::default();
        assert_eq!(e.on_ack(&ack(100.0, 1, Some(100))), None);
        assert_eq!(e.on_ack(&ack(200.0, 2, Some(100))), None);
        assert_eq!(e.on_ack(&ack(205.0, 3, Some(100))), None);
        assert_eq!(e.on_ack(&ack(210.0, 4, Some(100))), Some(20));
        assert_eq!(e.on_ack(&ack(215.0, 5, Some(100))), None, "once");
    }

    /// A gap of over a quarter RTT (the next flight) starts the fit
    /// again; with one segment per ACK that also keeps every estimate at
    /// four segments or more, Hoe's floor.
    #[test]
    fn a_gap_starts_the_fit_again() {
        let mut e = StartupEstimate::default();
        e.on_ack(&ack(100.0, 1, Some(100)));
        e.on_ack(&ack(110.0, 2, None));
        assert_eq!(e.on_ack(&ack(140.0, 3, None)), None, "30 ms > 25 ms");
        e.on_ack(&ack(142.0, 4, None));
        // 0.5 segments per ms, 100 ms.
        assert_eq!(e.on_ack(&ack(144.0, 5, None)), Some(50));
    }
}
