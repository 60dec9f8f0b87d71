//! A virtual-time simulator: a sender and a receiver over two one-way paths,
//! each a [`crate::netem`] model; or several such flows whose datagrams
//! share one forward path (one bottleneck queue), each with its own return
//! path ([`run_flows`]).
//!
//! Events are processed one at a time in time order (ties: forward packet,
//! return packets, sender timers, receiver timers, flows starting,
//! applications producing data, each by flow number), and after each one
//! every flow's endpoints are drained. With the same seed, tuning and link
//! specs a run is identical, trace included, on every machine.

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

mod flows;
// Public to atou's own tests through `atou::internals::sim::pair`: the
// taps, stop conditions and session applications a `Pair` takes there.
pub(crate) mod pair;
// The papers' measurements, for atou's own tests and examples
// (`atou::internals::sim::scenarios`).
pub(crate) mod scenarios;

use std::time::Duration;

use thiserror::Error;

use crate::netem::{mix_seed, Datagram, Netem, NetemSpec};

use crate::proto::tuning::TuningError;
use crate::proto::wire::ACK_MAX_LEN;
use crate::proto::{
    Observer, PathMemory, PatternSource, PatternVerifier, Receiver, ReceiverConfig, Sender,
    SenderState, Time, Tuning,
};
use crate::report::summary::{SimReport, Summary};

pub use flows::{run_flows, FlowConfig, FlowResult, FlowsConfig, FlowsResult};
pub use pair::{Pair, PairConfig, PairError, PairResult};

/// One simulated run of bare streams: tuning, paths and seed. Built with
/// [`SimConfig::new`] and its setters.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub(crate) tuning: Tuning,
    pub(crate) fwd: NetemSpec,
    pub(crate) rev: NetemSpec,
    /// Bytes to transfer; `None` runs until `maxtime`/`maxpkts`.
    pub(crate) bytes: Option<u64>,
    pub(crate) seed: u64,
    pub(crate) trace: bool,
    pub(crate) check_invariants: bool,
    pub(crate) time_limit: Duration,
    pub(crate) fwd_stall: Option<(Duration, Duration)>,
    pub(crate) source_bps: Option<u64>,
    pub(crate) path_memory: Option<PathMemory>,
}

impl SimConfig {
    /// `bytes` (`None`: until the tuning's `maxtime`/`maxpkts`) sent with
    /// `tuning` over `fwd`, acknowledged over `rev`, every random draw
    /// from `seed`; untraced, unchecked, for at most 30 days of virtual
    /// time, with no stall, every byte ready from the start and nothing
    /// learnt before.
    pub fn new(
        tuning: Tuning,
        fwd: NetemSpec,
        rev: NetemSpec,
        bytes: Option<u64>,
        seed: u64,
    ) -> Self {
        SimConfig {
            tuning,
            fwd,
            rev,
            bytes,
            seed,
            trace: false,
            check_invariants: false,
            time_limit: Duration::from_secs(30 * 86_400),
            fwd_stall: None,
            source_bps: None,
            path_memory: None,
        }
    }

    /// Record the packet trace (passed to the observer). Default: `false`.
    #[must_use]
    pub fn trace(mut self, trace: bool) -> Self {
        self.trace = trace;
        self
    }

    /// Check the sender's invariants after every step (slow): what atou's
    /// own tests ask. Default: `false`.
    #[cfg(any(feature = "internals", fuzzing))]
    #[must_use]
    pub fn check_invariants(mut self, check: bool) -> Self {
        self.check_invariants = check;
        self
    }

    /// Stop after this much virtual time whatever happens. Default: 30 days.
    #[must_use]
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }

    /// A link-layer stall on the forward path, `(start, length)` from time
    /// zero: what would come out of it meanwhile is held and released, in
    /// order, when the stall ends (Sarolahti & Kuznetsov §6's three-second
    /// delay, link retransmissions holding frames in a receive buffer).
    /// Default: `None`.
    #[must_use]
    pub fn fwd_stall(mut self, stall: Option<(Duration, Duration)>) -> Self {
        self.fwd_stall = stall;
        self
    }

    /// The application produces the stream at this many bits of payload
    /// per second (a sender waiting on disk reads): whenever the path is
    /// faster the sender is application-limited. For every flow of the
    /// run. Default: `None`, every byte is ready from the start.
    #[must_use]
    pub fn source_bps(mut self, bits_per_sec: Option<u64>) -> Self {
        self.source_bps = bits_per_sec;
        self
    }

    /// What an earlier run learnt about the path ([`SimResult`]'s
    /// `summary.path_memory`): every flow starts from it, as a transfer to
    /// a destination in the path cache does. Default: `None`.
    #[must_use]
    pub fn path_memory(mut self, memory: Option<PathMemory>) -> Self {
        self.path_memory = memory;
        self
    }
}

/// Why a simulated run could not start or was stopped.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SimError {
    /// A flow's tuning is inconsistent.
    #[error("bad tuning: {0}")]
    Tuning(#[from] TuningError),
    /// With `check_invariants`: the sender's state broke one of its
    /// invariants (a bug in atou, not in the path).
    #[error("sender invariant broken at {time:?}: {what}")]
    Invariant {
        /// The virtual time of the step that broke it.
        time: Time,
        /// Which invariant, with the values that broke it.
        what: String,
    },
    /// A scenario run through [`Pair`] could not be set up or never
    /// completed its handshake.
    #[error("client and server: {0}")]
    Pair(String),
}

/// How a simulated run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunEnd {
    /// Everything sent was acknowledged.
    Finished,
    /// The sender gave up (`maxidle`).
    Failed,
    /// Nothing left to happen but the sender is not done: a bug.
    Stalled,
    /// `time_limit` reached.
    TimeLimit,
}

/// What a simulated run did: its events, trace and how it ended.
#[derive(Debug, Clone)]
pub struct SimResult {
    /// How the run ended.
    pub outcome: RunEnd,
    /// atou's end-of-run summary of the sender, receiver and paths, as
    /// `atou sim` prints it.
    pub summary: Summary,
    /// Virtual time when the run stopped.
    pub end: Time,
}

impl SimResult {
    /// Finished, and the receiver got exactly the bytes sent, in order.
    #[cfg(any(feature = "internals", fuzzing))]
    pub fn delivered_intact(&self, bytes: u64) -> bool {
        let sim = self.summary.sim.as_ref().expect("simulated");
        self.outcome == RunEnd::Finished && sim.first_error.is_none() && sim.verified_bytes == bytes
    }
}

/// A datagram on a path with what the far end needs to know of it: the
/// flow it belongs to on the shared forward path, the source address it
/// arrives from on a [`Pair`]'s.
#[derive(Clone)]
struct Tagged<T: Clone> {
    tag: T,
    bytes: Vec<u8>,
}

impl<T: Clone> Datagram for Tagged<T> {
    fn wire_len(&self) -> usize {
        self.bytes.len()
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

/// One connection: its two endpoints and its own return path.
struct Flow {
    tuning: Tuning,
    sender: Sender,
    receiver: Receiver,
    rev: Netem<Vec<u8>>,
    verifier: PatternVerifier,
    start: Time,
    /// Its start time has come: its endpoints are driven.
    started: bool,
    /// The application's rate, bits per second ([`SimConfig::source_bps`]).
    source_bps: Option<u64>,
    /// Bytes the application has produced so far.
    fed: u64,
    /// Its datagrams the forward path delivered (to its receiver).
    fwd_arrived: u64,
    /// The coupled group it belongs to ([`FlowConfig::group`]).
    group: Option<usize>,
}

impl Flow {
    /// Flow `index` of a run seeded with `seed`: flow 0 draws the
    /// connection id and the return path's seed a single-flow run always
    /// drew, so that run is unchanged.
    fn new(index: usize, config: &SimConfig, flow: &FlowConfig) -> Result<Flow, SimError> {
        let (seed, rev, source_bps) = (config.seed, &config.rev, config.source_bps);
        let (tuning, bytes, start) = (&flow.tuning, flow.bytes, flow.start);
        let stream = 3 * index as u64;
        let conn_id = mix_seed(seed, stream);
        let start = Time::ZERO + start;
        let mut sender = Sender::new(tuning, conn_id, bytes, start)?;
        if let Some(memory) = &config.path_memory {
            sender = sender.with_path_memory(memory);
        }
        if config.trace {
            sender.enable_trace();
        }
        if source_bps.is_some() {
            // Nothing is ready until the application has produced it.
            sender.set_available(start, 0);
        }
        Ok(Flow {
            tuning: tuning.clone(),
            sender,
            receiver: Receiver::new(ReceiverConfig::from_tuning(tuning), conn_id),
            rev: Netem::new(rev.clone(), mix_seed(seed, stream + 2)),
            verifier: PatternVerifier::default(),
            start,
            started: start == Time::ZERO,
            source_bps,
            fed: 0,
            fwd_arrived: 0,
            group: flow.group,
        })
    }

    /// Hands the sender what the application has produced by `now`.
    fn feed(&mut self, now: Time) {
        let Some(bps) = self.source_bps.filter(|&b| b > 0) else {
            return;
        };
        let nanos = now.saturating_since(self.start).as_nanos();
        let bytes = u64::try_from(nanos * u128::from(bps) / 8_000_000_000).unwrap_or(u64::MAX);
        if bytes > self.fed {
            self.fed = bytes;
            self.sender.set_available(now, bytes);
        }
    }

    /// When the application will have produced one more datagram's
    /// payload: the sender may be waiting for it.
    fn next_feed(&self) -> Option<Time> {
        let bps = self.source_bps.filter(|&b| b > 0)?;
        let want = self.fed + self.tuning.payload_size() as u64;
        let nanos = (u128::from(want) * 8_000_000_000).div_ceil(u128::from(bps));
        Some(self.start + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)))
    }
}

/// What the run does next.
#[derive(Debug, Clone, Copy)]
enum Step {
    Fwd,
    Rev(usize),
    Sender(usize),
    Receiver(usize),
    Start(usize),
    /// The application produces more data for flow `i`.
    Feed(usize),
}

/// A run: one flow ([`Simulation::new`]) or several sharing the forward
/// path ([`run_flows`]).
pub struct Simulation {
    config: SimConfig,
    flows: Vec<Flow>,
    /// The forward path, shared: every flow's datagrams queue in it.
    fwd: Netem<Tagged<usize>>,
    now: Time,
    buf: Vec<u8>,
    /// Instants at which every flow's acknowledged bytes are recorded
    /// (those of a flow not yet started count as 0).
    marks: Vec<(Time, Option<Vec<u64>>)>,
}

impl Simulation {
    /// One flow as `config` describes it, at virtual time zero; fails on
    /// an inconsistent tuning.
    pub fn new(config: SimConfig) -> Result<Simulation, SimError> {
        let only = FlowConfig {
            tuning: config.tuning.clone(),
            bytes: config.bytes,
            start: Duration::ZERO,
            group: None,
        };
        Simulation::with_flows(config, &[only])
    }

    /// `flows` over `config.fwd`, each with its own copy of `config.rev`;
    /// `config.tuning` and `config.bytes` are not used.
    fn with_flows(config: SimConfig, flows: &[FlowConfig]) -> Result<Simulation, SimError> {
        let flows = flows
            .iter()
            .enumerate()
            .map(|(i, f)| Flow::new(i, &config, f))
            .collect::<Result<Vec<_>, _>>()?;
        let mss = flows
            .iter()
            .map(|f| f.tuning.mss as usize)
            .max()
            .unwrap_or(0);
        Ok(Simulation {
            fwd: Netem::new(config.fwd.clone(), mix_seed(config.seed, 1)),
            buf: vec![0; mss.max(ACK_MAX_LEN)],
            config,
            flows,
            now: Time::ZERO,
            marks: Vec::new(),
        })
    }

    /// Runs to the end, reporting to `observer`.
    pub fn run(mut self, observer: &mut dyn Observer) -> Result<SimResult, SimError> {
        let outcome = self.run_all(observer)?;
        let outcome = self.flow_outcome(0, outcome);
        let summary = self.flow_summary(0, outcome);
        Ok(SimResult {
            outcome,
            summary,
            end: self.now,
        })
    }

    /// Runs until every flow has finished or failed, nothing is left to
    /// happen (`Stalled`) or the time limit; returns which of the three.
    fn run_all(&mut self, observer: &mut dyn Observer) -> Result<RunEnd, SimError> {
        let outcome = loop {
            self.pump(observer)?;
            if self
                .flows
                .iter()
                .all(|f| f.sender.state() != SenderState::Sending)
            {
                break RunEnd::Finished;
            }
            let Some((next, step)) = self.next_step() else {
                break RunEnd::Stalled;
            };
            self.take_marks(Some(next));
            if next.saturating_since(Time::ZERO) > self.config.time_limit {
                break RunEnd::TimeLimit;
            }
            self.now = self.now.max(next);
            let now = self.now;
            match step {
                Step::Fwd => {
                    if let Some(p) = self.fwd.poll(now) {
                        let f = &mut self.flows[p.tag];
                        f.fwd_arrived += 1;
                        // Undecodable or foreign datagrams are counted by the receiver.
                        let _ = f.receiver.handle_datagram(now, &p.bytes);
                    }
                }
                Step::Rev(i) => {
                    self.couple(i);
                    let f = &mut self.flows[i];
                    if let Some(p) = f.rev.poll(now) {
                        let _ = f.sender.handle_datagram(now, &p);
                    }
                }
                Step::Sender(i) => {
                    self.couple(i);
                    self.flows[i].sender.handle_timeout(now);
                }
                Step::Receiver(i) => self.flows[i].receiver.handle_timeout(now),
                Step::Start(i) => self.flows[i].started = true,
                Step::Feed(i) => self.flows[i].feed(now),
            }
        };
        self.pump(observer)?;
        self.take_marks(None);
        Ok(outcome)
    }

    /// The earliest thing due; at equal times, in this order: the forward
    /// path, the return paths, the senders' timers, the receivers' timers,
    /// flows starting, applications producing data (each by flow number).
    fn next_step(&self) -> Option<(Time, Step)> {
        let mut best: Option<(Time, Step)> = None;
        let mut consider = |at: Option<Time>, step: Step| {
            if let Some(at) = at {
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, step));
                }
            }
        };
        consider(
            self.fwd.next_release().map(|t| self.after_stall(t)),
            Step::Fwd,
        );
        let started = || self.flows.iter().enumerate().filter(|(_, f)| f.started);
        for (i, f) in started() {
            consider(f.rev.next_release(), Step::Rev(i));
        }
        for (i, f) in started() {
            consider(f.sender.poll_timeout(), Step::Sender(i));
        }
        for (i, f) in started() {
            consider(f.receiver.poll_timeout(), Step::Receiver(i));
        }
        for (i, f) in self.flows.iter().enumerate().filter(|(_, f)| !f.started) {
            consider(Some(f.start), Step::Start(i));
        }
        for (i, f) in started() {
            if f.sender.state() == SenderState::Sending {
                consider(f.next_feed(), Step::Feed(i));
            }
        }
        best
    }

    /// Tells flow `i`, if it is one of a coupled group's, what the others
    /// of its group have delivered and its share: an equal part among
    /// the group's started flows still sending.
    fn couple(&mut self, i: usize) {
        let Some(group) = self.flows[i].group else {
            return;
        };
        let (mut others, mut sending) = (0, 0);
        for (j, f) in self.flows.iter().enumerate() {
            if f.group != Some(group) || !f.started {
                continue;
            }
            if j != i {
                others += f.sender.delivered();
            }
            if f.sender.state() == SenderState::Sending {
                sending += 1;
            }
        }
        let share = 1.0 / f64::from(sending.max(1));
        // Past the seeds any flow draws (3 per flow).
        let seed = mix_seed(self.config.seed, u64::MAX - group as u64);
        self.flows[i].sender.set_group(others, share, seed);
    }

    /// Records every flow's acknowledged bytes at the marks before `next`
    /// (all of them when the run is over): nothing changes between events.
    fn take_marks(&mut self, next: Option<Time>) {
        for (at, taken) in &mut self.marks {
            if taken.is_none() && next.is_none_or(|n| *at < n) {
                *taken = Some(
                    self.flows
                        .iter()
                        .map(|f| if f.started { f.sender.good_bytes() } else { 0 })
                        .collect(),
                );
            }
        }
    }

    /// When a forward release at `t` happens, given the stall.
    fn after_stall(&self, t: Time) -> Time {
        match self.config.fwd_stall {
            Some((start, len)) => {
                let (from, until) = (Time::ZERO + start, Time::ZERO + start + len);
                if t >= from && t < until {
                    until
                } else {
                    t
                }
            }
            None => t,
        }
    }

    /// Drains every started flow's endpoints at the current instant, flow
    /// by flow.
    fn pump(&mut self, observer: &mut dyn Observer) -> Result<(), SimError> {
        let now = self.now;
        let mut source = PatternSource;
        let many = self.flows.len() > 1;
        for i in 0..self.flows.len() {
            if !self.flows[i].started {
                continue;
            }
            self.couple(i);
            let f = &mut self.flows[i];
            f.feed(now);
            while let Some(n) = f.sender.poll_transmit(now, &mut self.buf, &mut source) {
                let bytes = self.buf[..n].to_vec();
                self.fwd.enqueue(now, Tagged { tag: i, bytes });
            }
            while let Some((seg, data)) = f.receiver.read() {
                f.verifier
                    .check(seg * f.tuning.payload_size() as u64, &data);
            }
            while let Some(n) = f.receiver.poll_transmit(now, &mut self.buf) {
                f.rev.enqueue(now, self.buf[..n].to_vec());
            }
            while let Some(e) = f.sender.poll_event() {
                observer.on_flow_event(i, &e);
            }
            while let Some(r) = f.sender.poll_trace() {
                observer.on_flow_trace(i, &r);
            }
            if self.config.check_invariants {
                f.sender
                    .check_invariants()
                    .map_err(|what| SimError::Invariant {
                        time: now,
                        what: if many {
                            format!("flow {i}: {what}")
                        } else {
                            what.to_string()
                        },
                    })?;
            }
        }
        Ok(())
    }

    /// Flow `i`'s own outcome, given how the run ended.
    fn flow_outcome(&self, i: usize, run: RunEnd) -> RunEnd {
        match self.flows[i].sender.state() {
            SenderState::Finished => RunEnd::Finished,
            SenderState::Failed | SenderState::Stalled => RunEnd::Failed,
            SenderState::Sending => run,
        }
    }

    /// Flow `i`'s datagrams the shared forward path dropped (lost or
    /// over its `limit`): those it was offered less those it delivered
    /// and those it still holds. Copies made by `duplicate` count as
    /// delivered, so on a path that duplicates this is too low.
    fn fwd_dropped(&self, i: usize) -> u64 {
        let f = &self.flows[i];
        let held = self.fwd.held().filter(|p| p.tag == i).count() as u64;
        f.sender
            .stats()
            .pkts_out
            .saturating_sub(f.fwd_arrived + held)
    }

    fn flow_summary(&mut self, i: usize, outcome: RunEnd) -> Summary {
        let now = self.now;
        let fwd_stats = self.fwd.stats();
        let f = &mut self.flows[i];
        let status = match outcome {
            RunEnd::Finished => "finished".to_string(),
            RunEnd::Failed if f.sender.state() == SenderState::Stalled => format!(
                "failed: acks for {} s that delivered nothing (stall)",
                f.tuning.stall.as_secs_f64()
            ),
            RunEnd::Failed => format!(
                "failed: no ACK for {} s (maxidle)",
                f.tuning.maxidle.as_secs_f64()
            ),
            RunEnd::Stalled => "stalled: nothing left to happen (a bug)".to_string(),
            RunEnd::TimeLimit => "stopped: simulation time limit reached".to_string(),
        };
        let snapshot = f.sender.snapshot(now);
        let mut summary = Summary::new(
            "sim => sim".to_string(),
            status,
            &f.tuning,
            f.sender.stats(),
            &snapshot,
        );
        summary.receiver = Some(*f.receiver.stats());
        summary.sim = Some(SimReport {
            seed: self.config.seed,
            fwd: self.config.fwd.to_string(),
            rev: self.config.rev.to_string(),
            fwd_stats,
            rev_stats: f.rev.stats(),
            verified_bytes: f.verifier.next_offset,
            first_error: f.verifier.first_error,
        });
        summary
    }
}
