//! A virtual-time simulator: a sender and a receiver over two one-way paths,
//! each a [`crate::netem`] model.
//!
//! Events are processed one at a time in time order (ties: forward packet,
//! return packet, sender timer, receiver timer), and after each one both
//! endpoints are drained. With the same seed, tuning and link specs a run
//! is identical, trace included, on every machine.

pub mod scenarios;

use std::time::Duration;

use thiserror::Error;

use crate::netem::{mix_seed, Netem, NetemSpec};

use crate::proto::tuning::TuningError;
use crate::proto::wire::ACK_MAX_LEN;
use crate::proto::{
    PatternSource, PatternVerifier, Receiver, ReceiverConfig, Sender, SenderState, Time,
    TimedEvent, TraceRecord, Tuning,
};
use crate::summary::{SimReport, Summary};

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub tuning: Tuning,
    pub fwd: NetemSpec,
    pub rev: NetemSpec,
    /// Bytes to transfer; `None` runs until `maxtime`/`maxpkts`.
    pub bytes: Option<u64>,
    pub seed: u64,
    /// Record the packet trace (passed to the observer).
    pub trace: bool,
    /// Check the sender's invariants after every step (slow; for tests).
    pub check_invariants: bool,
    /// Stop after this much virtual time whatever happens.
    pub time_limit: Duration,
    /// A link-layer stall on the forward path, `(start, length)`: what
    /// would come out of it meanwhile is held and released, in order, when
    /// the stall ends (Sarolahti & Kuznetsov §6's three-second delay, link
    /// retransmissions holding frames in a receive buffer).
    pub fwd_stall: Option<(Duration, Duration)>,
}

impl SimConfig {
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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SimError {
    #[error("bad tuning: {0}")]
    Tuning(#[from] TuningError),
    #[error("sender invariant broken at {time:?}: {what}")]
    Invariant { time: Time, what: String },
}

/// Receives what happens during a run.
pub trait Observer {
    fn on_event(&mut self, _event: &TimedEvent) {}
    fn on_trace(&mut self, _record: &TraceRecord) {}
}

/// Ignores everything.
impl Observer for () {}

/// Keeps everything, for tests.
#[derive(Debug, Default)]
pub struct Recorder {
    pub events: Vec<TimedEvent>,
    pub trace: Vec<TraceRecord>,
}

impl Observer for Recorder {
    fn on_event(&mut self, event: &TimedEvent) {
        self.events.push(event.clone());
    }
    fn on_trace(&mut self, record: &TraceRecord) {
        self.trace.push(*record);
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything sent was acknowledged.
    Finished,
    /// The sender gave up (`maxidle`).
    Failed,
    /// Nothing left to happen but the sender is not done: a bug.
    Stalled,
    /// `time_limit` reached.
    TimeLimit,
}

#[derive(Debug, Clone)]
pub struct SimResult {
    pub outcome: Outcome,
    pub summary: Summary,
    /// Virtual time when the run stopped.
    pub end: Time,
}

impl SimResult {
    /// Finished, and the receiver got exactly the bytes sent, in order.
    pub fn delivered_intact(&self, bytes: u64) -> bool {
        let sim = self.summary.sim.as_ref().expect("simulated");
        self.outcome == Outcome::Finished
            && sim.first_error.is_none()
            && sim.verified_bytes == bytes
    }
}

pub struct Simulation {
    config: SimConfig,
    sender: Sender,
    receiver: Receiver,
    fwd: Netem<Vec<u8>>,
    rev: Netem<Vec<u8>>,
    verifier: PatternVerifier,
    now: Time,
    buf: Vec<u8>,
}

impl Simulation {
    pub fn new(config: SimConfig) -> Result<Simulation, SimError> {
        let conn_id = mix_seed(config.seed, 0);
        let mut sender = Sender::new(&config.tuning, conn_id, config.bytes, Time::ZERO)?;
        if config.trace {
            sender.enable_trace();
        }
        let receiver = Receiver::new(ReceiverConfig::from_tuning(&config.tuning), conn_id);
        Ok(Simulation {
            fwd: Netem::new(config.fwd.clone(), mix_seed(config.seed, 1)),
            rev: Netem::new(config.rev.clone(), mix_seed(config.seed, 2)),
            buf: vec![0; (config.tuning.mss as usize).max(ACK_MAX_LEN)],
            config,
            sender,
            receiver,
            verifier: PatternVerifier::default(),
            now: Time::ZERO,
        })
    }

    /// Runs to the end, reporting to `observer`.
    pub fn run(mut self, observer: &mut dyn Observer) -> Result<SimResult, SimError> {
        let outcome = loop {
            self.pump(observer)?;
            match self.sender.state() {
                SenderState::Finished => break Outcome::Finished,
                SenderState::Failed => break Outcome::Failed,
                SenderState::Sending => {}
            }
            let fwd_at = self.fwd.next_release().map(|t| self.after_stall(t));
            let rev_at = self.rev.next_release();
            let snd_at = self.sender.poll_timeout();
            let rcv_at = self.receiver.poll_timeout();
            let Some(next) = [fwd_at, rev_at, snd_at, rcv_at].into_iter().flatten().min() else {
                break Outcome::Stalled;
            };
            if next.saturating_since(Time::ZERO) > self.config.time_limit {
                break Outcome::TimeLimit;
            }
            self.now = self.now.max(next);
            let now = self.now;
            if fwd_at == Some(next) {
                if let Some(p) = self.fwd.poll(now) {
                    // Undecodable or foreign datagrams are counted by the receiver.
                    let _ = self.receiver.handle_datagram(now, &p);
                }
            } else if rev_at == Some(next) {
                if let Some(p) = self.rev.poll(now) {
                    let _ = self.sender.handle_datagram(now, &p);
                }
            } else if snd_at == Some(next) {
                self.sender.handle_timeout(now);
            } else {
                self.receiver.handle_timeout(now);
            }
        };
        self.pump(observer)?;
        Ok(self.finish(outcome))
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

    /// Drains both endpoints at the current instant.
    fn pump(&mut self, observer: &mut dyn Observer) -> Result<(), SimError> {
        let now = self.now;
        let mut source = PatternSource;
        while let Some(n) = self.sender.poll_transmit(now, &mut self.buf, &mut source) {
            self.fwd.enqueue(now, self.buf[..n].to_vec());
        }
        while let Some((offset, data)) = self.receiver.read() {
            self.verifier.check(offset, &data);
        }
        while let Some(n) = self.receiver.poll_transmit(now, &mut self.buf) {
            self.rev.enqueue(now, self.buf[..n].to_vec());
        }
        while let Some(e) = self.sender.poll_event() {
            observer.on_event(&e);
        }
        while let Some(r) = self.sender.poll_trace() {
            observer.on_trace(&r);
        }
        if self.config.check_invariants {
            self.sender
                .check_invariants()
                .map_err(|what| SimError::Invariant { time: now, what })?;
        }
        Ok(())
    }

    fn finish(mut self, outcome: Outcome) -> SimResult {
        let status = match outcome {
            Outcome::Finished => "finished".to_string(),
            Outcome::Failed => format!(
                "failed: no ACK for {} s (maxidle)",
                self.config.tuning.maxidle.as_secs_f64()
            ),
            Outcome::Stalled => "stalled: nothing left to happen (a bug)".to_string(),
            Outcome::TimeLimit => "stopped: simulation time limit reached".to_string(),
        };
        let snapshot = self.sender.snapshot(self.now);
        let mut summary = Summary::new(
            "sim => sim".to_string(),
            status,
            &self.config.tuning,
            self.sender.stats(),
            &snapshot,
        );
        summary.receiver = Some(*self.receiver.stats());
        summary.sim = Some(SimReport {
            seed: self.config.seed,
            fwd: self.config.fwd.to_string(),
            rev: self.config.rev.to_string(),
            fwd_stats: self.fwd.stats(),
            rev_stats: self.rev.stats(),
            verified_bytes: self.verifier.next_offset,
            first_error: self.verifier.first_error,
        });
        SimResult {
            outcome,
            summary,
            end: self.now,
        }
    }
}

/// Convenience: one run with no observer.
pub fn run(config: SimConfig) -> Result<SimResult, SimError> {
    Simulation::new(config)?.run(&mut ())
}
