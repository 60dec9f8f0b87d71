//! What a connection learnt about its path, kept for the next connection
//! to the same destination: Linux's destination cache (Sarolahti &
//! Kuznetsov §3, its last paragraph: the slow-start threshold and the RTO
//! estimator's variables of a finished connection seed the next one to the
//! same address; §5 relates it to RFC 2140). Linux keeps it today in
//! `net/ipv4/tcp_metrics.c`, whose rules this follows.
//!
//! A saved value is a hint, never a measurement: each user bounds it and
//! keeps probing (`Sender::with_path_memory`). Only values here; where they
//! are kept, and for how long, is the caller's (`src/config/path_cache.rs`): no
//! clock, no file.

use std::time::Duration;

use super::stream::sender::SenderSnapshot;

/// The longest round trip a hint may claim: longer than any path atou is
/// used on (a geostationary hop is 0.6 s), short of `max_rto`.
pub const MAX_HINT_RTT: Duration = Duration::from_secs(30);
/// The highest bandwidth a hint may claim: 10 Tbit/s.
pub const MAX_HINT_BPS: u64 = 10_000_000_000_000;
/// The largest slow-start threshold a hint may claim: 1 TiB.
pub const MAX_HINT_SSTHRESH_BYTES: u64 = 1 << 40;

/// The datagram sizes a hint may claim: from the base every path carries
/// (RFC 8899's BASE_PLPMTU) to the largest UDP payload IPv4 allows.
pub const MIN_HINT_DATAGRAM: u32 = super::pmtu::BASE_PAYLOAD_V4;
pub const MAX_HINT_DATAGRAM: u32 = 65_507;

/// A path's metrics at the end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMemory {
    /// Smoothed RTT and its variation (RFC 6298 §2).
    pub srtt: Duration,
    pub rttvar: Duration,
    /// The slow-start threshold, in bytes (windows are in segments, and
    /// the next connection's segments may differ); `None`: no reduction
    /// happened, or the controller keeps none (BBR).
    pub ssthresh_bytes: Option<u64>,
    /// A model-based controller's bottleneck bandwidth, bits per second,
    /// and minimum RTT (BBR's BBR.max_bw and BBR.min_rtt).
    pub btl_bw_bps: Option<u64>,
    pub min_rtt: Option<Duration>,
    /// The largest UDP payload a path-MTU search saw acked on the path
    /// (`crate::proto::pmtu`), for the next transfer to use without one.
    pub datagram_size: Option<u32>,
    /// The connection ended before its model saw the path full (a
    /// transfer too small to leave Startup): `btl_bw_bps` is what it
    /// reached, not what the path carries. Never saved: see
    /// [`PathMemory::over`].
    pub btl_bw_is_lower_bound: bool,
}

impl PathMemory {
    /// What a sender's snapshot tells the next connection; `None` before
    /// the first RTT sample. The slow-start threshold is saved as Linux's
    /// `tcp_update_metrics` saves it: at least half the last window, so
    /// that a connection that ended well above its last reduction does
    /// not hand the next one a threshold it had long outgrown.
    pub fn from_snapshot(s: &SenderSnapshot, mss: u32) -> Option<PathMemory> {
        if s.srtt.is_zero() {
            return None;
        }
        let ssthresh = (s.ssthresh != u64::MAX).then(|| s.ssthresh.max(s.cwnd / 2));
        let model = s.cc.filter(|cc| cc.bw_bps > 0 && !cc.min_rtt.is_zero());
        PathMemory {
            srtt: s.srtt,
            rttvar: s.rttvar,
            ssthresh_bytes: ssthresh.map(|segs| segs.saturating_mul(u64::from(mss))),
            btl_bw_bps: model.map(|cc| cc.bw_bps),
            min_rtt: model.map(|cc| cc.min_rtt),
            // A connection's size is the caller's to vouch for.
            datagram_size: None,
            btl_bw_is_lower_bound: model.is_some_and(|cc| !cc.filled_pipe),
        }
        .checked()
    }

    /// This memory, to be saved over `older` (the entry for the same
    /// destination, if a fresh one is there). A bandwidth that is only a
    /// lower bound does not replace a larger one: a 54 KB file never
    /// leaves Startup, and saving the rate its one flight reached would
    /// start the next large transfer from a small jump. Its minimum RTT
    /// still counts (the smaller of the two). A connection with no model
    /// at all (too short for a rate sample, or not bbr) keeps the old one
    /// as it is. A bandwidth from a connection that filled the pipe
    /// replaces the old one, larger or smaller: the path may have slowed.
    pub fn over(self, older: Option<&PathMemory>) -> PathMemory {
        let older_model = older.and_then(|o| Some((o.btl_bw_bps?, o.min_rtt?)));
        let model = match (self.btl_bw_bps.zip(self.min_rtt), older_model) {
            (None, Some(old)) => old,
            (Some((bw, rtt)), Some((old_bw, old_rtt)))
                if self.btl_bw_is_lower_bound && old_bw > bw =>
            {
                (old_bw, rtt.min(old_rtt))
            }
            _ => return self,
        };
        PathMemory {
            btl_bw_bps: Some(model.0),
            min_rtt: Some(model.1),
            btl_bw_is_lower_bound: false,
            ..self
        }
    }

    /// The memory if every value is one a path can have, else `None`: what
    /// comes back from a file is untrusted input. A model (bandwidth and
    /// minimum RTT) counts only whole.
    pub fn checked(self) -> Option<PathMemory> {
        let rtt_ok = |d: Duration| !d.is_zero() && d <= MAX_HINT_RTT;
        if !rtt_ok(self.srtt) || self.rttvar > MAX_HINT_RTT {
            return None;
        }
        if self
            .ssthresh_bytes
            .is_some_and(|b| b == 0 || b > MAX_HINT_SSTHRESH_BYTES)
        {
            return None;
        }
        if self
            .datagram_size
            .is_some_and(|d| !(MIN_HINT_DATAGRAM..=MAX_HINT_DATAGRAM).contains(&d))
        {
            return None;
        }
        match (self.btl_bw_bps, self.min_rtt) {
            (None, None) => {}
            (Some(bw), Some(rtt)) if bw > 0 && bw <= MAX_HINT_BPS && rtt_ok(rtt) => {}
            _ => return None,
        }
        Some(self)
    }

    /// The bandwidth-delay product the model saw, in segments of `mss`
    /// bytes; `None` without a model.
    pub fn bdp_segments(&self, mss: u32) -> Option<u64> {
        let (bw, rtt) = (self.btl_bw_bps?, self.min_rtt?);
        let bytes = bw as f64 / 8.0 * rtt.as_secs_f64();
        Some((bytes / f64::from(mss.max(1))) as u64)
    }

    /// The slow-start threshold in segments of `mss` bytes, at least two.
    pub fn ssthresh_segments(&self, mss: u32) -> Option<u64> {
        self.ssthresh_bytes
            .map(|b| (b / u64::from(mss.max(1))).max(2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> PathMemory {
        PathMemory {
            srtt: Duration::from_millis(100),
            rttvar: Duration::from_millis(5),
            ssthresh_bytes: Some(1_000_000),
            btl_bw_bps: Some(100_000_000),
            min_rtt: Some(Duration::from_millis(100)),
            datagram_size: Some(1472),
            btl_bw_is_lower_bound: false,
        }
    }

    /// A small transfer's bandwidth (a lower bound) keeps a larger one
    /// saved before, with the smaller minimum RTT; a full one replaces
    /// it, a lower bound is saved where nothing larger is known, and a
    /// connection without a model keeps the old one.
    #[test]
    fn a_lower_bound_never_lowers_a_saved_bandwidth() {
        let small = PathMemory {
            btl_bw_bps: Some(23_000_000),
            min_rtt: Some(Duration::from_millis(99)),
            srtt: Duration::from_millis(110),
            btl_bw_is_lower_bound: true,
            ..memory()
        };
        let kept = small.over(Some(&memory()));
        assert_eq!(kept.btl_bw_bps, Some(100_000_000));
        assert_eq!(kept.min_rtt, Some(Duration::from_millis(99)));
        // The rest is the newer connection's.
        assert_eq!(kept.srtt, Duration::from_millis(110));
        assert_eq!(small.over(None), small);
        let slower = PathMemory {
            btl_bw_is_lower_bound: false,
            ..small
        };
        assert_eq!(slower.over(Some(&memory())), slower);
        let faster_bound = PathMemory {
            btl_bw_bps: Some(200_000_000),
            ..small
        };
        assert_eq!(faster_bound.over(Some(&memory())), faster_bound);
        let no_model = PathMemory {
            btl_bw_bps: None,
            min_rtt: None,
            btl_bw_is_lower_bound: false,
            ..small
        };
        let kept = no_model.over(Some(&memory()));
        assert_eq!(
            (kept.btl_bw_bps, kept.min_rtt),
            (memory().btl_bw_bps, memory().min_rtt)
        );
        assert_eq!(no_model.over(None), no_model);
    }

    #[test]
    fn plausible_values_pass_and_implausible_ones_do_not() {
        assert_eq!(memory().checked(), Some(memory()));
        let bad = [
            PathMemory {
                srtt: Duration::ZERO,
                ..memory()
            },
            PathMemory {
                srtt: Duration::from_secs(3600),
                ..memory()
            },
            PathMemory {
                rttvar: Duration::from_secs(3600),
                ..memory()
            },
            PathMemory {
                ssthresh_bytes: Some(0),
                ..memory()
            },
            PathMemory {
                btl_bw_bps: Some(u64::MAX),
                ..memory()
            },
            PathMemory {
                min_rtt: None,
                ..memory()
            },
            PathMemory {
                min_rtt: Some(Duration::ZERO),
                ..memory()
            },
            PathMemory {
                datagram_size: Some(1199),
                ..memory()
            },
            PathMemory {
                datagram_size: Some(65_508),
                ..memory()
            },
        ];
        for m in bad {
            assert_eq!(m.checked(), None, "{m:?}");
        }
    }

    #[test]
    fn a_100_mbit_100_ms_path_holds_851_segments_of_1468_bytes() {
        // 100e6 / 8 * 0.1 = 1.25 MB.
        assert_eq!(memory().bdp_segments(1468), Some(851));
        assert_eq!(memory().ssthresh_segments(1000), Some(1000));
    }
}
