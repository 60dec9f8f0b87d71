//! Several flows sharing one bottleneck (BBR's fairness, Jain's index).
//!
//! Every flow has its own [`Tuning`] (so `bbr`, `cubic` and `aimd` can
//! compete), its own sender and receiver, and its own return path (a copy
//! of the `rev` spec, seeded apart: ACKs do not compete). Their datagrams
//! all enter the one forward path, so they interleave in the same netem
//! stages and share its rate and its `limit` queue. Flows may start late.
//!
//! Goodput is measured per flow over a window (by default from the last
//! flow's start to the end of the run), from the bytes each receiver has
//! acknowledged, and summed up by Jain's fairness index
//! J = (Σx)² / (n Σx²) (Jain, Chiu & Hawe 1984: 1 when all are equal, 1/n
//! when one flow has everything) and by the utilisation of the bottleneck
//! (the goodputs' sum over the forward path's slowest `rate`; headers
//! count against it, so 1472-byte datagrams top out at 0.98).

use std::fmt;
use std::time::Duration;

use super::{RunEnd, SimConfig, SimError, Simulation};
use crate::netem::{NetemSpec, NetemStats};
use crate::proto::{Observer, Time, Tuning};
use crate::report::summary::Summary;

/// One flow of a shared-bottleneck run.
#[derive(Debug, Clone)]
pub struct FlowConfig {
    /// This flow's knobs (its own controller, recovery, windows).
    pub tuning: Tuning,
    /// Bytes to send; `None`: pattern data until the run ends (a flow
    /// without `maxtime` or `maxpkts` is given `maxtime` = the rest of
    /// the run).
    pub bytes: Option<u64>,
    /// When it starts, in virtual time from the start of the run.
    pub start: Duration,
    /// Flows with the same group are the streams of one transfer coupled
    /// as one flow (src/proto/congestion/coupled.rs): each is told its
    /// group's deliveries and uses an equal share, among the group's
    /// flows still sending, of what its controller allows. `None`: a
    /// flow on its own.
    pub group: Option<usize>,
}

impl FlowConfig {
    /// A flow of unlimited data starting at 0.
    pub fn new(tuning: Tuning) -> FlowConfig {
        FlowConfig {
            tuning,
            bytes: None,
            start: Duration::ZERO,
            group: None,
        }
    }

    /// The same flow, starting at `start`.
    pub fn starting_at(self, start: Duration) -> FlowConfig {
        FlowConfig { start, ..self }
    }
}

/// A run of several flows over one forward path.
#[derive(Debug, Clone)]
pub struct FlowsConfig {
    /// The flows, each with its own sender, receiver and return path.
    pub flows: Vec<FlowConfig>,
    /// The shared forward (data) path: the bottleneck.
    pub fwd: NetemSpec,
    /// Every flow's return (ACK) path; each flow has its own.
    pub rev: NetemSpec,
    /// Seeds every path's randomness and the flows' connection ids: the
    /// same seed gives the same run.
    pub seed: u64,
    /// The run stops at this virtual time (earlier if every flow ends).
    pub duration: Duration,
    /// Goodput is measured from here to `duration`; `None`: from the last
    /// flow's start.
    pub measure_from: Option<Duration>,
    /// Record the packet trace (passed to the observer, by flow).
    pub trace: bool,
    /// Check every sender's invariants after every step (slow; for tests).
    pub check_invariants: bool,
}

impl FlowsConfig {
    /// `flows` over `fwd` (shared) and `rev` (each its own) for `duration`
    /// of virtual time, measured from the last flow's start, without
    /// trace or invariant checks.
    pub fn new(
        flows: Vec<FlowConfig>,
        fwd: NetemSpec,
        rev: NetemSpec,
        duration: Duration,
        seed: u64,
    ) -> FlowsConfig {
        FlowsConfig {
            flows,
            fwd,
            rev,
            seed,
            duration,
            measure_from: None,
            trace: false,
            check_invariants: false,
        }
    }

    /// The measurement window, `(from, to)`.
    pub fn window(&self) -> (Duration, Duration) {
        let last_start = self.flows.iter().map(|f| f.start).max();
        let from = self
            .measure_from
            .or(last_start)
            .unwrap_or_default()
            .min(self.duration);
        (from, self.duration)
    }
}

/// One flow's part of a run.
#[derive(Debug, Clone)]
pub struct FlowResult {
    /// How this flow ended (`TimeLimit` for one still sending at the end).
    pub outcome: RunEnd,
    /// Its own summary, as a single-flow run prints it (the forward path's
    /// counts are the whole bottleneck's).
    pub summary: Summary,
    /// When it started, in virtual time from the start of the run.
    pub start: Duration,
    /// Payload bytes acknowledged within the window.
    pub window_bytes: u64,
    /// `window_bytes` over the window, in bits per second.
    pub goodput_bps: f64,
    /// Its datagrams the shared forward path dropped, randomly or at the
    /// queue's `limit`, over the whole run.
    pub fwd_dropped: u64,
}

/// What flows sharing a bottleneck did, each and together.
#[derive(Debug, Clone)]
pub struct FlowsResult {
    /// Each flow's part, in the order of [`FlowsConfig::flows`].
    pub flows: Vec<FlowResult>,
    /// The measurement window, `(from, to)`.
    pub window: (Duration, Duration),
    /// Virtual time when the run stopped.
    pub end: Time,
    /// The forward path's slowest `rate`, in bits per second, if it has one.
    pub bottleneck_bps: Option<u64>,
    /// What the shared forward path did with every flow's datagrams.
    pub fwd_stats: NetemStats,
}

impl FlowsResult {
    /// Each flow's goodput over the window, in bits per second.
    pub(crate) fn goodputs(&self) -> Vec<f64> {
        self.flows.iter().map(|f| f.goodput_bps).collect()
    }

    /// Jain's fairness index of the flows' goodputs over the window.
    pub fn jain(&self) -> f64 {
        jain_index(&self.goodputs())
    }

    /// The flows' goodput together over the bottleneck's rate; `None`
    /// when the forward path has no `rate`.
    pub fn utilisation(&self) -> Option<f64> {
        let total: f64 = self.goodputs().iter().sum();
        self.bottleneck_bps.map(|r| total / r as f64)
    }

    /// Flow `i`'s share of the goodput over the window, 0–1.
    pub fn share(&self, i: usize) -> f64 {
        let total: f64 = self.goodputs().iter().sum();
        if total > 0.0 {
            self.flows[i].goodput_bps / total
        } else {
            0.0
        }
    }
}

/// Jain's fairness index (Σx)² / (n Σx²): 1 when every x is equal, 1/n
/// when one has everything; 1 for no flows or all zero.
pub(crate) fn jain_index(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let squares: f64 = xs.iter().map(|x| x * x).sum();
    if squares == 0.0 {
        1.0
    } else {
        sum * sum / (xs.len() as f64 * squares)
    }
}

/// One line per flow (its resends, how many of them the receiver already
/// had, and how many of its datagrams the path dropped), then the index
/// and the utilisation:
///
/// ```text
/// flow 1 bbr start 0 s: 28.79 Mbit/s (30.4 %), 71983909 bytes in 0–20 s, 487 retransmissions (0 arrived twice) of 509 dropped, 0 timeouts, stopped: simulation time limit reached
/// flow 2 bbr start 0 s: 35.66 Mbit/s (37.6 %), 89154011 bytes in 0–20 s, 498 retransmissions (0 arrived twice) of 506 dropped, 0 timeouts, stopped: simulation time limit reached
/// flow 3 cubic start 0 s: 30.30 Mbit/s (32.0 %), 75738874 bytes in 0–20 s, 589 retransmissions (0 arrived twice) of 590 dropped, 0 timeouts, stopped: simulation time limit reached
/// jain 0.9914 utilisation 0.948 of 100 Mbit/s; bottleneck dropped 1605 of 167462 datagrams
/// ```
impl fmt::Display for FlowsResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (from, to) = self.window;
        for (i, flow) in self.flows.iter().enumerate() {
            writeln!(
                f,
                "flow {} {} start {} s: {:.2} Mbit/s ({:.1} %), {} bytes in {}–{} s, {} retransmissions ({} arrived twice) of {} dropped, {} timeouts, {}",
                i + 1,
                flow.summary.tuning.cc.name(),
                flow.start.as_secs_f64(),
                flow.goodput_bps / 1e6,
                self.share(i) * 100.0,
                flow.window_bytes,
                from.as_secs_f64(),
                to.as_secs_f64(),
                flow.summary.rxmts,
                flow.summary.receiver.map_or(0, |r| r.duplicates),
                flow.fwd_dropped,
                flow.summary.timeouts,
                flow.summary.status,
            )?;
        }
        write!(f, "jain {:.4}", self.jain())?;
        match (self.utilisation(), self.bottleneck_bps) {
            (Some(u), Some(r)) => write!(f, " utilisation {:.3} of {} Mbit/s", u, r as f64 / 1e6)?,
            _ => write!(f, " (no rate on the forward path: no utilisation)")?,
        }
        writeln!(
            f,
            "; bottleneck dropped {} of {} datagrams",
            self.fwd_stats.dropped(),
            self.fwd_stats.offered
        )
    }
}

/// Runs the flows of `config` over its shared forward path, reporting each
/// flow's events and trace to `observer` with its number (from 0; their
/// times count from the flow's start, as a sender's always do).
pub fn run_flows(
    config: &FlowsConfig,
    observer: &mut dyn Observer,
) -> Result<FlowsResult, SimError> {
    let flows: Vec<FlowConfig> = config
        .flows
        .iter()
        .map(|f| {
            let mut f = f.clone();
            let t = &mut f.tuning;
            if f.bytes.is_none() && t.maxtime.is_zero() && t.maxpkts == 0 {
                // Past the end of the run: the time limit stops it.
                t.maxtime = config.duration.saturating_sub(f.start) + Duration::from_secs(1);
            }
            f
        })
        .collect();
    let Some(first) = flows.first() else {
        return Ok(FlowsResult {
            flows: Vec::new(),
            window: config.window(),
            end: Time::ZERO,
            bottleneck_bps: bottleneck(&config.fwd),
            fwd_stats: NetemStats::default(),
        });
    };
    let mut sim = SimConfig::new(
        first.tuning.clone(),
        config.fwd.clone(),
        config.rev.clone(),
        first.bytes,
        config.seed,
    );
    sim.trace = config.trace;
    sim.check_invariants = config.check_invariants;
    sim.time_limit = config.duration;
    let mut sim = Simulation::with_flows(sim, &flows)?;
    let window = config.window();
    sim.marks = vec![(Time::ZERO + window.0, None), (Time::ZERO + window.1, None)];
    let run = sim.run_all(observer)?;
    let secs = window.1.saturating_sub(window.0).as_secs_f64();
    let (from, to) = (sim.marks[0].1.clone(), sim.marks[1].1.clone());
    let (from, to) = (from.unwrap_or_default(), to.unwrap_or_default());
    let results = (0..sim.flows.len())
        .map(|i| {
            let outcome = sim.flow_outcome(i, run);
            let summary = sim.flow_summary(i, outcome);
            let at = |marks: &[u64]| marks.get(i).copied().unwrap_or(0);
            let bytes = at(&to).saturating_sub(at(&from));
            FlowResult {
                fwd_dropped: sim.fwd_dropped(i),
                outcome,
                summary,
                start: flows[i].start,
                window_bytes: bytes,
                goodput_bps: if secs > 0.0 {
                    bytes as f64 * 8.0 / secs
                } else {
                    0.0
                },
            }
        })
        .collect();
    Ok(FlowsResult {
        flows: results,
        window,
        end: sim.now,
        bottleneck_bps: bottleneck(&config.fwd),
        fwd_stats: sim.fwd.stats(),
    })
}

/// The slowest `rate` of a path, in bits per second.
pub(super) fn bottleneck(spec: &NetemSpec) -> Option<u64> {
    spec.stages
        .iter()
        .filter_map(|s| s.rate)
        .map(|r| r.bits)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_of_equal_and_of_one_taking_all() {
        assert_eq!(jain_index(&[5.0, 5.0]), 1.0);
        assert_eq!(jain_index(&[10.0, 0.0]), 0.5);
        assert!((jain_index(&[3.0, 1.0]) - 0.8).abs() < 1e-12);
        assert_eq!(jain_index(&[]), 1.0);
    }
}
