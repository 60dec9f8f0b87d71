//! The sending side of a connection, driven from outside.
//!
//! Feed it with [`Sender::handle_datagram`] (ACKs) and
//! [`Sender::handle_timeout`]; then drain, in this order,
//! [`Sender::poll_transmit`] until it returns `None`, [`Sender::poll_event`]
//! and [`Sender::poll_trace`]; then sleep until [`Sender::poll_timeout`].
//! Time is always an argument: the sender never reads a clock, never
//! touches a socket, and is therefore exactly reproducible.
//!
//! Segments are numbered from 0. Segment `n` carries stream bytes from
//! `n * payload_size`. cwnd and ssthresh are in segments.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::proto::congestion::{
    self, AckEvent, CcReport, CongestionEvent, Controller, Coupled, DeliveryRate, Pacer,
    RecoveryStep,
};
use crate::proto::events::{
    AckRecord, Event, RecoveryTrigger, Retransmission, StateRecord, TimedEvent, TraceRecord,
};
use crate::proto::loss::{
    self, AckSummary, DupEvidence, Forced, LossRecovery, LossState, Phase, TimerContext,
    TimerVerdict, Verdict,
};
use crate::proto::path_memory::PathMemory;
use crate::proto::payload::PayloadSource;
use crate::proto::stream::rtt::RttEstimator;
use crate::proto::stream::scoreboard::{Scoreboard, ScoreboardInvariant};
use crate::proto::time::{wire_elapsed, Time};
use crate::proto::tuning::{CcKind, RecoveryKind};
use crate::proto::tuning::{DropList, Tuning, TuningError};
use crate::proto::wire::{Ack, DataFlags, DataHeader, Packet, SackBlock, DATA_HEADER_LEN};
use crate::proto::InputError;

use thiserror::Error;

/// An invariant of the [`Sender`] found broken: a bug, reported by
/// [`Sender::check_invariants`] to the simulator, tests and fuzzers.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SenderInvariant {
    #[error(transparent)]
    Scoreboard(#[from] ScoreboardInvariant),
    #[error("snd_una {una} <= snd_nxt {nxt} <= snd_max {max} fails")]
    SequenceOrder { una: u64, nxt: u64, max: u64 },
    #[error("cwnd below one segment")]
    NoWindow,
    #[error("{outstanding} segments outstanding, rcvwin {rcvwin}")]
    OverReceiveWindow { outstanding: u64, rcvwin: u32 },
    #[error("{0} transmissions outside the window")]
    SentOutsideWindow(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderState {
    Sending,
    /// Everything sent was acknowledged and nothing is left to send.
    Finished,
    /// No ACK for `maxidle`.
    Failed,
    /// ACKs came for `stall`, from the first that delivered nothing,
    /// and no byte was delivered.
    Stalled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// Retransmission timeout.
    Rto,
    /// `maxidle` without an ACK.
    Idle,
    /// `stall` since the first ACK that delivered nothing.
    Stall,
    /// Zero-window probe.
    Persist,
    /// The pacer lets the next datagram go.
    Pacing,
    /// The loss-recovery variant's own timer (RACK's reordering timer,
    /// TLP's probe timeout).
    Recovery,
}

/// In the order they are handled when several expire at once: a probe
/// timeout capped at the RTO goes first and defers it (RFC 8985 §7.3).
const TIMERS: [Timer; 6] = [
    Timer::Recovery,
    Timer::Rto,
    Timer::Idle,
    Timer::Stall,
    Timer::Persist,
    Timer::Pacing,
];

/// Counters that the summary reports with atou's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Datagrams handed to the network, retransmissions and scripted drops included.
    pub pkts_out: u64,
    /// Bytes of those datagrams.
    pub bytes_out: u64,
    /// Datagrams received from the peer, undecodable ones included.
    pub pkts_in: u64,
    /// Segments retransmitted, for any reason.
    pub rxmts: u64,
    /// Transmissions dropped by the droplist.
    pub dropped: u64,
    /// Fast retransmits (recovery entries).
    pub dup3s: u64,
    /// Retransmissions during recovery after the fast retransmit.
    pub packs: u64,
    /// Retransmission timeouts (RFC 6298 §5).
    pub timeouts: u64,
    /// Duplicate ACKs.
    pub dups: u64,
    /// ACKs below snd_una or for data never sent (atou's badack): counted, and
    /// nothing else.
    pub badacks: u64,
    /// Datagrams that failed to decode or belonged to another connection.
    pub bad_packets: u64,
    /// ACKs carrying a D-SACK block: a segment arrived twice.
    pub dsacks: u64,
    /// Retransmissions a D-SACK proved unnecessary (RFC 3708 §3: the
    /// segment had arrived before): a D-SACK block's segments that were
    /// resent, one per resend, so neither a peer nor a network that
    /// duplicates datagrams can claim more than was resent, or a resend
    /// of a segment it was not. A lost ACK loses its D-SACK.
    pub spurious_rxmts: u64,
    /// Times the receiver reneged on a SACK (a cumulative ACK stopped at a
    /// segment it had SACKed); SACK information was discarded.
    pub reneges: u64,
    /// Most segments one ACK acknowledged.
    pub maxack: u64,
    /// Most segments sent in response to one event.
    pub maxburst: u64,
    /// Tail loss probes sent (RFC 8985 §7).
    pub tlps: u64,
    /// Reductions undone as spurious (Sarolahti §6).
    pub undos: u64,
    /// Window reductions for local congestion (CWR: the socket refused
    /// datagrams with ENOBUFS), without a retransmission.
    pub cwrs: u64,
    /// The largest reordering seen, in segments (the loss state's metric).
    pub reordering: u64,
    /// The duplicate threshold at the end (raised by `reordering adaptive`).
    pub dup_thresh: u64,
    /// Payload bytes acknowledged.
    pub good_bytes: u64,
}

/// Window values and RTT figures at one instant, for summaries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SenderSnapshot {
    /// The oldest unacknowledged sequence number, in segments (RFC 793).
    pub snd_una: u64,
    /// The next segment to send.
    pub snd_nxt: u64,
    /// The highest segment sent, plus one.
    pub snd_max: u64,
    /// The congestion window, in segments.
    pub cwnd: u64,
    /// The slow-start threshold, in segments.
    pub ssthresh: u64,
    /// The retransmission timeout (RFC 6298).
    pub rto: Duration,
    /// The smoothed RTT (RFC 6298).
    pub srtt: Duration,
    /// The RTT variation (RFC 6298).
    pub rttvar: Duration,
    /// The least RTT sampled.
    pub minrtt: Duration,
    /// The greatest RTT sampled.
    pub maxrtt: Duration,
    /// The mean of the RTT samples.
    pub avgrtt: Duration,
    /// Payload bytes acknowledged.
    pub good_bytes: u64,
    /// From creation to the last ACK (or now, while running).
    pub elapsed: Duration,
    /// The rate the sender paces at in bytes per second (the
    /// controller's, capped at `bwlimit`); `None` unpaced.
    pub pacing_rate: Option<u64>,
    /// A model-based controller's state and estimates.
    pub cc: Option<CcReport>,
}

/// A fast recovery or timeout whose reduction may yet be undone
/// (Sarolahti §6, Linux's undo_marker and undo_retrans).
#[derive(Debug, Clone, Copy)]
struct UndoEpisode {
    /// snd_una and snd_max when it began: the D-SACKs that count lie between.
    una: u64,
    max: u64,
    /// Retransmissions sent during it, and those D-SACKs proved unnecessary.
    retransmitted: u64,
    dsacked: u64,
    /// When its first retransmission left, and which segment it was
    /// (Linux's retrans_stamp): the earliest retransmission in flight.
    first_retx: Option<(Time, u64)>,
    /// Eifel looks only at the ACK that first covers that segment.
    eifel_checked: bool,
    /// A fast recovery's reach when it began: the highest SACKed segment
    /// less snd_una. If its retransmissions prove unnecessary, the hole was
    /// late, not lost, by at least that many segments. `None` for a
    /// timeout, whose go-back-N resends what had arrived.
    displacement: Option<u64>,
}

/// How a fast recovery begins.
#[derive(Debug, Clone, Copy)]
enum Entry {
    /// Fast retransmit: snd_una is marked lost and goes out now; with
    /// `lost_below`, every un-SACKed segment below it is marked lost too.
    FastRetransmit { lost_below: Option<u64> },
    /// On the losses the variant has already marked (RACK): they go out as
    /// pipe allows, lowest first, the lowest at once.
    Marked,
}

#[derive(Debug)]
pub struct Sender {
    conn_id: u64,
    tuning: Tuning,
    droplist: DropList,
    /// What is known of every segment in flight.
    sb: Scoreboard,
    /// What is lost and what to resend.
    loss: LossState,
    recovery: Box<dyn LossRecovery>,
    /// How much may be in flight: this stream's share of its group's
    /// controller (all of it for a stream alone).
    cc: Coupled,
    /// Told its group's news ([`Sender::set_group`]): a coupled stream.
    grouped: bool,
    /// Delivery-rate sampling for the controller.
    rate: DeliveryRate,
    /// Spreads transmissions at the controller's pacing rate, if it has one.
    pacer: Pacer,
    /// The controller report last logged as an event.
    cc_logged: Option<CcReport>,
    /// The last reduction, while it may be undone (`undo`).
    undo: Option<UndoEpisode>,
    /// Resends no D-SACK has yet proved unnecessary, by segment
    /// ([`Sender::take_proven_resends`]); forgotten two windows below
    /// snd_una.
    unproven_resends: BTreeMap<u64, u32>,
    stats: SenderStats,
    events: VecDeque<TimedEvent>,
    /// The latest time the sender was given.
    now: Time,
    /// When the connection started: event and trace times count from it.
    start: Time,
    recovery_started: Time,
    rtt: RttEstimator,
    timers: [Option<Time>; TIMERS.len()],
    payload_size: u64,
    stream_len: Option<u64>,
    /// Segments in the stream, when its length is known.
    total_segments: Option<u64>,
    /// Stop sending new data at this time (`maxtime`).
    send_deadline: Option<Time>,
    /// Stream bytes the application has ready to send; `None`: all of them.
    available: Option<u64>,
    /// Nothing in flight and the next segment not ready: the peer has
    /// nothing to answer, so its silence does not count towards maxidle.
    app_limited: bool,
    /// A local-congestion reduction waits until snd_una passes this.
    cwr_until: u64,
    /// `cum_ack + window` of the latest ACK: new data must stay below it.
    peer_right_edge: u64,
    last_ack_at: Time,
    /// The first ACK since the last byte delivered (acked or SACKed) that
    /// delivered nothing: from then the peer is known alive and taking
    /// nothing, which `stall` bounds. `None` while bytes flow, and while
    /// the peer is silent (a silent peer is `maxidle`'s).
    answered_without_delivery: Option<Time>,
    /// Segments sent since the last ACK or timer.
    burst: u64,
    state: SenderState,
    finished_at: Option<Time>,
    persist_probe: bool,
    trace: Option<VecDeque<TraceRecord>>,
    /// Transmissions the window did not permit (counted in debug builds);
    /// must stay zero.
    window_violations: u64,
}

impl Sender {
    /// A sender of `stream_len` bytes (or, with `None`, of pattern data
    /// until `maxtime` or `maxpkts` ends it).
    pub fn new(
        tuning: &Tuning,
        conn_id: u64,
        stream_len: Option<u64>,
        now: Time,
    ) -> Result<Sender, TuningError> {
        tuning.validate()?;
        if stream_len.is_none() && tuning.maxtime.is_zero() && tuning.maxpkts == 0 {
            return Err(TuningError {
                key: "maxtime".into(),
                message: "an unlimited stream needs maxtime or maxpkts to end it".into(),
            });
        }
        let payload_size = tuning.payload_size() as u64;
        let mut s = Sender {
            conn_id,
            tuning: tuning.clone(),
            droplist: tuning.droplist.clone(),
            sb: Scoreboard::default(),
            loss: LossState::new(tuning),
            recovery: loss::for_kind(tuning),
            cc: Coupled::new(congestion::build(tuning, conn_id)),
            grouped: false,
            rate: DeliveryRate::default(),
            pacer: Pacer::new(u64::from(tuning.mss), now),
            cc_logged: None,
            undo: None,
            unproven_resends: BTreeMap::new(),
            stats: SenderStats {
                dup_thresh: u64::from(tuning.dup_thresh),
                ..SenderStats::default()
            },
            events: VecDeque::new(),
            now,
            start: now,
            recovery_started: now,
            rtt: RttEstimator::new(tuning),
            timers: [None; TIMERS.len()],
            payload_size,
            stream_len,
            total_segments: stream_len.map(|n| n.div_ceil(payload_size)),
            send_deadline: (!tuning.maxtime.is_zero()).then(|| now + tuning.maxtime),
            // Until the peer speaks, assume the buffer we asked it for.
            available: None,
            app_limited: false,
            cwr_until: 0,
            peer_right_edge: u64::from(tuning.rcvsegs),
            last_ack_at: now,
            answered_without_delivery: None,
            burst: 0,
            state: SenderState::Sending,
            finished_at: None,
            persist_probe: false,
            trace: None,
            window_violations: 0,
        };
        s.arm_idle();
        s.update_state(now);
        Ok(s)
    }

    /// Starts from what a previous connection to the same destination
    /// learnt ([`PathMemory`]): the RTO before the first sample, and what
    /// the controller takes of it. Before anything is sent.
    pub fn with_path_memory(mut self, memory: &PathMemory) -> Sender {
        if self.tuning.timeout.is_zero() {
            self.rtt.seed(memory.srtt, memory.rttvar);
        }
        self.cc.use_path_memory(memory);
        self
    }

    /// What this connection learnt about its path, for the next one to
    /// the same destination; `None` before the first RTT sample.
    pub fn path_memory(&mut self, now: Time) -> Option<PathMemory> {
        let snapshot = self.snapshot(now);
        PathMemory::from_snapshot(&snapshot, self.tuning.mss)
    }

    /// Limits new data to the stream's first `bytes`, for an application
    /// that produces the stream as it goes (a file read ahead by other
    /// threads). Only ever raised; call [`Sender::poll_transmit`] after.
    pub fn set_available(&mut self, now: Time, bytes: u64) {
        self.advance(now);
        self.available = Some(self.available.map_or(bytes, |a| a.max(bytes)));
        self.update_state(now);
    }

    /// The current retransmission timeout.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// Whether all of segment `seg` is available to send.
    fn data_ready(&self, seg: u64) -> bool {
        let Some(available) = self.available else {
            return true;
        };
        let end = (seg + 1).saturating_mul(self.payload_size);
        let end = self.stream_len.map_or(end, |len| end.min(len));
        end <= available
    }

    /// Records atou's packet trace, drained with [`Sender::poll_trace`].
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(VecDeque::new);
    }

    pub fn state(&self) -> SenderState {
        self.state
    }

    pub fn stats(&self) -> &SenderStats {
        &self.stats
    }

    pub fn phase(&self) -> Phase {
        self.loss.phase
    }

    pub fn snapshot(&mut self, now: Time) -> SenderSnapshot {
        let end = self.finished_at.unwrap_or(now);
        SenderSnapshot {
            snd_una: self.sb.una(),
            snd_nxt: self.loss.snd_nxt(&mut self.sb),
            snd_max: self.sb.max(),
            cwnd: self.cc.window(),
            ssthresh: self.ssthresh(),
            rto: self.rtt.rto(),
            srtt: self.rtt.srtt(),
            rttvar: self.rtt.rttvar(),
            minrtt: self.rtt.min(),
            maxrtt: self.rtt.max(),
            avgrtt: self.rtt.avg(),
            good_bytes: self.good_bytes(),
            elapsed: end.saturating_since(self.start),
            pacing_rate: self.pacing_rate(),
            cc: self.cc.report(),
        }
    }

    /// The rate the pacer releases datagrams at, bytes per second: the
    /// controller's pacing rate, capped by `bwlimit`; with `bwlimit` and a
    /// controller that does not pace (aimd), the cap alone, so that the
    /// pacer is a token bucket at it (its depth: a millisecond's worth,
    /// two datagrams at least). The cap is on payload, what the
    /// application sends, as rsync's is on what it writes to its socket:
    /// the pacer counts whole datagrams, so it runs at the cap times
    /// datagram / payload. Rounded down: never above the cap.
    pub fn pacing_rate(&self) -> Option<u64> {
        let cap = (self.tuning.bwlimit > 0).then(|| {
            let wire = u128::from(self.tuning.bwlimit / 8) * u128::from(self.tuning.mss)
                / u128::from(self.payload_size.max(1));
            u64::try_from(wire).unwrap_or(u64::MAX).max(1)
        });
        match (self.cc.pacing_rate(), cap) {
            (Some(rate), Some(cap)) => Some(rate.min(cap)),
            (rate, cap) => rate.or(cap),
        }
    }

    /// Payload bytes the receiver has acknowledged.
    pub fn good_bytes(&self) -> u64 {
        let bytes = self.sb.una().saturating_mul(self.payload_size);
        self.stream_len.map_or(bytes, |len| bytes.min(len))
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.iter().flatten().min().copied()
    }

    /// Whether a timer that an arriving ACK may cancel or move (every
    /// timer but the pacer's) is due at `now`: the I/O loop reads the
    /// socket before handling one of these, and only these, so that a
    /// pacer release costs no extra read.
    pub(crate) fn ack_timer_due(&self, now: Time) -> bool {
        TIMERS
            .iter()
            .filter(|&&t| t != Timer::Pacing)
            .any(|&t| self.timer(t).is_some_and(|at| at <= now))
    }

    pub fn poll_event(&mut self) -> Option<TimedEvent> {
        self.events.pop_front()
    }

    pub fn poll_trace(&mut self) -> Option<TraceRecord> {
        self.trace.as_mut()?.pop_front()
    }

    fn emit(&mut self, event: Event) {
        self.events.push_back(TimedEvent {
            time: self.now.saturating_since(self.start),
            event,
        });
    }

    /// The controller's ssthresh for reports; `inf` for one that has none.
    fn ssthresh(&self) -> u64 {
        self.cc.ssthresh().unwrap_or(u64::MAX)
    }

    fn advance(&mut self, now: Time) {
        // Time never runs backwards inside the sender, whatever the caller does.
        self.now = self.now.max(now);
    }

    fn since_start(&self) -> Duration {
        self.now.saturating_since(self.start)
    }

    fn set_timer(&mut self, t: Timer, at: Option<Time>) {
        self.timers[t as usize] = at;
    }

    fn timer(&self, t: Timer) -> Option<Time> {
        self.timers[t as usize]
    }

    fn arm_rto(&mut self) {
        let at = self.rtt.deadline(self.now, self.rtt.rto());
        self.set_timer(Timer::Rto, Some(at));
    }

    fn arm_idle(&mut self) {
        let at = (!self.tuning.maxidle.is_zero()).then(|| self.last_ack_at + self.tuning.maxidle);
        self.set_timer(Timer::Idle, at);
    }

    /// `maxidle` ends a sender the peer stopped answering; acks that come
    /// but deliver nothing (a path that drops only the data's size, a peer
    /// whose window never opens) hold it off for ever, so a second
    /// deadline counts from the first such ack after the last byte
    /// delivered. Not from the last byte itself: then a silent spell of
    /// `stall` (acks lost while the RTO backs off) would end a sender that
    /// `maxidle` still allows.
    fn arm_stall(&mut self) {
        let at = self
            .answered_without_delivery
            .filter(|_| !self.tuning.stall.is_zero())
            .map(|since| since + self.tuning.stall);
        self.set_timer(Timer::Stall, at);
    }

    /// Handles one datagram from the peer.
    pub fn handle_datagram(&mut self, now: Time, datagram: &[u8]) -> Result<(), InputError> {
        let result = match Packet::decode(datagram) {
            Err(e) => Err(InputError::Wire(e)),
            Ok(Packet::Ack(ack)) => return self.handle_ack(now, &ack),
            Ok(other) => Err(InputError::Unexpected(other.kind_name())),
        };
        self.advance(now);
        self.stats.pkts_in += 1;
        self.stats.bad_packets += 1;
        result
    }

    /// Handles one decoded ACK.
    pub fn handle_ack(&mut self, now: Time, ack: &Ack) -> Result<(), InputError> {
        self.advance(now);
        self.stats.pkts_in += 1;
        if ack.conn_id != self.conn_id {
            self.stats.bad_packets += 1;
            return Err(InputError::WrongConnection {
                expected: self.conn_id,
                got: ack.conn_id,
            });
        }
        self.on_ack(ack);
        Ok(())
    }

    /// One valid ACK, in steps: classify it, apply its SACK blocks,
    /// account what it newly acknowledges, take the loss-recovery step,
    /// tell the controller, and trace it.
    fn on_ack(&mut self, ack: &Ack) {
        if self.state != SenderState::Sending {
            return;
        }
        self.burst = 0;
        let prior_una = self.sb.una();
        if self.reject_bad_ack(ack) {
            return;
        }
        self.last_ack_at = self.now;
        self.arm_idle();
        let rtt = self.take_rtt_sample(ack.echo_timestamp);
        let window_changed = self.note_peer_window(ack);

        self.sb.clear_deliveries();
        let fack_before = self.sb.highest_sacked();
        let newly_sacked = self.process_sack_blocks(ack);
        let (newly_acked, newly_delivered) = self.account_new_data(ack.cum_ack, fack_before);
        if newly_acked > 0 || newly_sacked > 0 {
            self.answered_without_delivery = None;
            self.arm_stall();
        } else if self.answered_without_delivery.is_none() {
            self.answered_without_delivery = Some(self.now);
            self.arm_stall();
        }
        let is_dupack = self.classify_duplicate(
            &DupEvidence {
                newly_sacked,
                window_changed,
                dsack: ack.dsack.is_some(),
            },
            newly_acked,
        );
        self.check_undo(ack, prior_una);
        if self.loss.phase == Phase::Loss && self.loss.recovery_point_acked(&self.sb) {
            self.loss.phase = Phase::Open;
        }

        let summary = AckSummary {
            newly_acked,
            newly_sacked,
            is_dupack,
            now: self.now,
            echo: ack.echo_timestamp,
            dsack: ack.dsack,
            srtt: self.rtt.srtt(),
            min_rtt: self.rtt.min(),
        };
        let lost_before = self.sb.lost_total();
        let step = self.recovery_step(&summary);
        self.cc.on_ack(&AckEvent {
            now: self.now,
            newly_acked,
            newly_delivered,
            newly_lost: self.sb.lost_total() - lost_before,
            delivered: self.rate.group_delivered(),
            sent: self.stats.pkts_out,
            is_dupack,
            recovery: step,
            flight: self.sb.flight(),
            pipe: self.sb.pipe(),
            rtt,
            srtt: self.rtt.srtt(),
            snd_una: self.sb.una(),
            snd_max: self.sb.max(),
            app_limited: self.rate.is_send_limited(),
            rate: self.rate.sample(self.sb.lost_total(), self.rtt.min()),
        });
        if self.recovery.take_probe_loss() {
            // RFC 8985 §7.4: the probe repaired a loss; one reduction.
            self.cc.on_congestion_event(&CongestionEvent {
                flight: self.sb.flight(),
                pipe: self.sb.pipe(),
                sent: self.stats.pkts_out,
            });
            self.cc.on_recovery_end(self.now);
        }
        self.loss.settle(&self.sb);
        self.note_controller();
        self.arm_recovery_timer(newly_acked > 0);
        self.trace_ack(ack, rtt);
        self.update_state(self.now);
    }

    /// atou's badack: an ACK older than one already processed, or one for
    /// data never sent. Counted and reported, and nothing else.
    fn reject_bad_ack(&mut self, ack: &Ack) -> bool {
        let (una, max) = (self.sb.una(), self.sb.max());
        if (una..=max).contains(&ack.cum_ack) {
            return false;
        }
        self.stats.badacks += 1;
        let snd_nxt = self.loss.snd_nxt(&mut self.sb);
        self.emit(Event::BadAck {
            ack: ack.cum_ack,
            snd_max: max,
            snd_nxt,
            snd_una: una,
        });
        true
    }

    /// The RTT the echoed timestamp measures, fed to the estimator; `None`
    /// for an echo from the future or from before we started: not ours.
    fn take_rtt_sample(&mut self, echo: u32) -> Option<Duration> {
        let rtt = wire_elapsed(self.now.wire_micros(), echo);
        if rtt > self.since_start() {
            return None;
        }
        self.rtt.on_sample(self.now, rtt);
        Some(rtt)
    }

    /// Takes the peer's window edge from the ACK; whether it moved.
    fn note_peer_window(&mut self, ack: &Ack) -> bool {
        let right_edge = ack.cum_ack.saturating_add(u64::from(ack.window));
        let changed = right_edge != self.peer_right_edge;
        self.peer_right_edge = right_edge;
        changed
    }

    /// Applies the ACK's SACK blocks, if the variant uses them, and counts
    /// a D-SACK; returns the segments newly SACKed.
    fn process_sack_blocks(&mut self, ack: &Ack) -> u64 {
        let mut newly_sacked = 0;
        if self.recovery.kind().uses_sack() {
            for block in ack.sack_blocks() {
                newly_sacked += self.sb.apply_sack(*block);
            }
        }
        if let Some(dsack) = ack.dsack {
            self.stats.dsacks += 1;
            self.take_proven_resends(dsack);
        }
        newly_sacked
    }

    /// RFC 3708 §3, as Linux counts `undo_retrans` (a D-SACK proves a
    /// retransmission unnecessary only for a segment that was
    /// retransmitted): each segment of the D-SACK block with a resend not
    /// yet proven counts one, for the spurious count and for the undo
    /// episode it lies in. A copy the network made of a segment sent once
    /// proves nothing (a path that duplicates datagrams, `--no-auth`
    /// without the replay window), nor does a peer's D-SACK for what was
    /// never resent.
    fn take_proven_resends(&mut self, dsack: SackBlock) {
        let segs: Vec<u64> = self
            .unproven_resends
            .range(dsack.start..dsack.end)
            .map(|(&seg, _)| seg)
            .collect();
        for seg in segs {
            if let Some(left) = self.unproven_resends.get_mut(&seg) {
                *left -= 1;
                if *left == 0 {
                    self.unproven_resends.remove(&seg);
                }
            }
            self.stats.spurious_rxmts += 1;
            if let Some(ep) = &mut self.undo {
                if (ep.una..ep.max).contains(&seg) {
                    ep.dsacked += 1;
                }
            }
        }
    }

    /// Forgets resends two windows below snd_una: their D-SACKs, if any,
    /// would have come by now (cwnd never exceeds `rcvwin`), and the
    /// record stays bounded.
    fn forget_old_resends(&mut self) {
        let keep_from = self
            .sb
            .una()
            .saturating_sub(2 * u64::from(self.tuning.rcvwin));
        while let Some(entry) = self.unproven_resends.first_entry() {
            if *entry.key() >= keep_from {
                break;
            }
            entry.remove();
        }
    }

    /// Moves snd_una to `cum_ack` and hands the deliveries to the rate
    /// sampler; returns the segments newly acknowledged and newly
    /// delivered (SACKed or acknowledged). `fack_before` is the highest
    /// SACKed segment before this ACK's blocks.
    fn account_new_data(&mut self, cum_ack: u64, fack_before: Option<u64>) -> (u64, u64) {
        let newly_acked = self.sb.ack_through(cum_ack);
        if newly_acked > 0 {
            self.forget_old_resends();
        }
        self.measure_reordering(fack_before);
        let mut newly_delivered = 0;
        for stamp in self.sb.take_delivered() {
            self.rate.on_delivered(self.now, &stamp);
            newly_delivered += 1;
        }
        // RFC 2018 §8: a cumulative ACK that stops at a segment the receiver
        // SACKed means it threw SACKed data away; trust no SACK until new
        // ones arrive.
        if self.sb.is_sacked(self.sb.una()) {
            self.sb.clear_sacks();
            self.stats.reneges += 1;
        }
        // A retransmission queued for a segment this ACK covers is moot.
        if let Some(forced) = self.loss.force_retransmit {
            let seg = forced.seg();
            if seg < self.sb.una() || self.sb.is_sacked(seg) {
                self.loss.force_retransmit = None;
            }
        }
        self.stats.maxack = self.stats.maxack.max(newly_acked);
        (newly_acked, newly_delivered)
    }

    /// Whether the ACK is a duplicate, as the variant judges one; restarts
    /// the RTO when new data was acknowledged, counts the duplicate when
    /// not.
    fn classify_duplicate(&mut self, evidence: &DupEvidence, newly_acked: u64) -> bool {
        let outstanding = self.sb.outstanding();
        let is_dupack = newly_acked == 0 && outstanding > 0 && self.recovery.is_duplicate(evidence);
        if newly_acked > 0 {
            self.loss.dupacks = 0;
            self.rtt.reset_backoff();
            // RFC 6298 §5.3 and §5.2.
            if outstanding > 0 {
                self.arm_rto();
            } else {
                self.set_timer(Timer::Rto, None);
            }
        }
        if is_dupack {
            self.loss.dupacks += 1;
            self.stats.dups += 1;
        }
        is_dupack
    }

    /// Asks the loss-recovery variant what the ACK means for fast recovery
    /// and enters or leaves it; what happened, for the controller.
    fn recovery_step(&mut self, summary: &AckSummary) -> RecoveryStep {
        let was_in_recovery = self.loss.phase == Phase::Recovery;
        match self.recovery.on_ack(&mut self.sb, &mut self.loss, summary) {
            Verdict::Enter {
                trigger,
                lost_below,
            } => {
                self.enter_recovery(trigger, Entry::FastRetransmit { lost_below });
                RecoveryStep::Entered
            }
            Verdict::EnterMarked { trigger } => {
                self.enter_recovery(trigger, Entry::Marked);
                RecoveryStep::Entered
            }
            Verdict::Leave
                if self.recovery.kind() == RecoveryKind::Rack && self.sb.lost_pending() > 0 =>
            {
                // Segments sent after the recovery began and marked lost by
                // the ACK that ended it: a new episode (RFC 8985 §6.2 marks
                // them; Linux's tcp_fastretrans_alert enters recovery again
                // when lost_out is not zero). Left alone they would wait,
                // marked lost and never resent, for the RTO.
                self.leave_recovery();
                self.enter_recovery(RecoveryTrigger::Rack, Entry::Marked);
                RecoveryStep::Entered
            }
            Verdict::Leave => {
                self.leave_recovery();
                RecoveryStep::Left
            }
            Verdict::Continue if was_in_recovery => RecoveryStep::During,
            Verdict::Continue | Verdict::Stay => RecoveryStep::Outside,
        }
    }

    /// For `atou plot`: what the ACK held and the sender's state after it,
    /// before the ACK's own line (events.rs says why).
    fn trace_ack(&mut self, ack: &Ack, rtt: Option<Duration>) {
        let time = self.since_start();
        let state = self.trace.is_some().then(|| self.state_record(time));
        let (Some(trace), Some(state)) = (self.trace.as_mut(), state) else {
            return;
        };
        for b in ack.sack_blocks() {
            trace.push_back(TraceRecord::Sack {
                time,
                start: b.start,
                end: b.end,
            });
        }
        trace.push_back(state);
        trace.push_back(TraceRecord::Ack(AckRecord {
            time,
            ack: ack.cum_ack,
            rtt: rtt.unwrap_or(Duration::ZERO),
            cwnd: self.cc.window(),
            ssthresh: self.cc.ssthresh().unwrap_or(u64::MAX),
        }));
    }

    /// The trace's `state` line: RTT estimate, RTO, the peer's window edge
    /// and the controller's rates.
    fn state_record(&self, time: Duration) -> TraceRecord {
        TraceRecord::State(StateRecord {
            time,
            srtt: self.rtt.srtt(),
            rto: self.rtt.rto(),
            right_edge: self.peer_right_edge,
            pacing_bps: self.cc.pacing_rate().map(|r| r.saturating_mul(8)),
            bw_bps: self.cc.report().map(|r| r.bw_bps),
        })
    }

    /// `--events` for a model-based controller: a new state, a new minimum
    /// RTT, or a bandwidth estimate a quarter off the one last logged.
    fn note_controller(&mut self) {
        let Some(r) = self.cc.report() else { return };
        let changed = self.cc_logged.is_none_or(|l| {
            l.state != r.state
                || l.min_rtt != r.min_rtt
                || r.bw_bps.abs_diff(l.bw_bps) as f64 >= 0.25 * l.bw_bps as f64
        });
        if !changed {
            return;
        }
        self.cc_logged = Some(r);
        let event = Event::Controller {
            controller: self.cc.kind().name(),
            state: r.state,
            bw_bps: r.bw_bps,
            min_rtt: r.min_rtt,
            cwnd: self.cc.window(),
            pacing_bps: self.cc.pacing_rate().unwrap_or(0).saturating_mul(8),
        };
        self.emit(event);
    }

    /// Enters fast recovery: the controller reduces its window from the
    /// FlightSize before the losses, and the first retransmission goes out
    /// whatever pipe says (RFC 5681 §3.2 step 2; PRR's at-least-one,
    /// RFC 6937).
    fn enter_recovery(&mut self, trigger: RecoveryTrigger, entry: Entry) {
        let una = self.sb.una();
        let cwnd = self.cc.window();
        let (seg, flight) = match entry {
            Entry::FastRetransmit { .. } => (una, self.sb.flight()),
            Entry::Marked => {
                // Set before the 3duprxmit line, which so reports this
                // episode's recover; a fast retransmit's line comes before
                // `LossState::enter_recovery` moves it, and reports the last.
                self.loss.recover = self.sb.max();
                let seg = self.sb.next_lost_pending().unwrap_or(una);
                // FlightSize before the losses were taken out of it.
                (seg, self.sb.flight() + self.sb.lost_pending())
            }
        };
        self.emit(Event::FastRetransmit(Retransmission {
            seg,
            snd_nxt: self.sb.max(),
            snd_max: self.sb.max(),
            cwnd,
            ssthresh: self.ssthresh(),
            recover: self.loss.recover,
        }));
        self.begin_undo_episode(false);
        match entry {
            Entry::FastRetransmit { lost_below } => {
                self.loss.enter_recovery(&mut self.sb, lost_below);
            }
            Entry::Marked => {
                self.loss.phase = Phase::Recovery;
                self.loss.force_retransmit =
                    self.sb.next_lost_pending().map(Forced::FastRetransmit);
            }
        }
        self.cc.on_congestion_event(&CongestionEvent {
            flight,
            pipe: self.sb.pipe(),
            sent: self.stats.pkts_out,
        });
        self.recovery_started = self.now;
        self.stats.dup3s += 1;
        let event = Event::EnterRecovery {
            trigger,
            snd_una: una,
            recover: self.loss.recover,
            cwnd,
            ssthresh: self.ssthresh(),
        };
        self.emit(event);
    }

    /// Starts an undo episode when a reduction begins (a fast recovery,
    /// or a `timeout`); a repeated timeout of the same data continues the
    /// one under way. The episode is kept with undo off too: it is how
    /// D-SACKs and timestamps measure reordering.
    fn begin_undo_episode(&mut self, timeout: bool) {
        let repeated = timeout && self.loss.phase == Phase::Loss;
        if repeated && self.undo.is_some() {
            return;
        }
        let displacement = match timeout {
            true => None,
            false => self.sb.highest_sacked().map(|fack| fack - self.sb.una()),
        };
        // Retransmissions of an earlier episode still in flight belong to
        // this one too (Linux's tcp_init_undo): D-SACKs must cover them,
        // and Eifel's reference is the earliest of them, or, if that is
        // unknown, Eifel stays out of it.
        let in_flight = self.sb.retransmissions_in_flight();
        let carried = self
            .undo
            .and_then(|e| e.first_retx)
            .filter(|_| in_flight > 0);
        self.undo = Some(UndoEpisode {
            una: self.sb.una(),
            max: self.sb.max(),
            retransmitted: in_flight,
            dsacked: 0,
            first_retx: carried,
            eifel_checked: in_flight > 0 && carried.is_none(),
            displacement,
        });
    }

    /// Sarolahti §6: the reduction was spurious if the ACK that first
    /// covers the episode's first retransmission, when that segment was
    /// snd_una, echoes a timestamp older than the retransmission, so the
    /// original arrived (Eifel); or if D-SACKs (RFC 2883) report every
    /// retransmission of the episode a duplicate. `prior_una` is snd_una
    /// before this ACK.
    fn check_undo(&mut self, ack: &Ack, prior_una: u64) {
        let Some(mut ep) = self.undo else { return };
        let mut how = None;
        if let (Some((sent, seg)), false) = (ep.first_retx, ep.eifel_checked) {
            if ack.cum_ack > seg {
                ep.eifel_checked = true;
                let echo_older = (sent.wire_micros().wrapping_sub(ack.echo_timestamp) as i32) > 0;
                if prior_una == seg && echo_older && self.loss.phase != Phase::Open {
                    how = Some("timestamp");
                }
            }
        }
        if ack.dsack.is_some() && ep.retransmitted > 0 && ep.dsacked >= ep.retransmitted {
            how = how.or(Some("dsack"));
        }
        self.undo = Some(ep);
        if let Some(how) = how {
            // Sarolahti §5 (Linux's tcp_try_undo_partial): the hole was
            // filled by the delayed original, so the path reorders.
            if let Some(d) = ep.displacement {
                self.note_reordering(d);
            }
            if self.tuning.undo {
                self.undo_reduction(how);
            } else {
                self.undo = None;
            }
        }
    }

    /// Reverts a spurious reduction: the controller goes back to its
    /// window, segments marked lost and not yet resent are in flight again,
    /// and the sender leaves recovery or timeout repair to go on with new
    /// data (Sarolahti §6).
    fn undo_reduction(&mut self, how: &'static str) {
        self.undo = None;
        self.stats.undos += 1;
        self.cc.undo(self.now);
        self.sb.clear_pending_losses();
        if matches!(self.loss.phase, Phase::Recovery | Phase::Loss) {
            self.loss.phase = Phase::Open;
            self.loss.dupacks = 0;
        }
        self.loss.force_retransmit = None;
        let event = Event::Undo {
            how,
            snd_una: self.sb.una(),
            cwnd: self.cc.window(),
            ssthresh: self.ssthresh(),
        };
        self.emit(event);
    }

    /// Asks the loss-recovery variant to arm its timer; `restart` after new
    /// data went out or the cumulative ACK advanced (RFC 8985 §7.2).
    fn arm_recovery_timer(&mut self, restart: bool) {
        let ctx = TimerContext {
            now: self.now,
            srtt: self.rtt.srtt(),
            rto_at: self.timer(Timer::Rto),
            max_ack_delay: self.tuning.delack,
            restart,
        };
        self.recovery.arm(&ctx, &self.sb, &self.loss);
        let at = self.recovery.deadline();
        self.set_timer(Timer::Recovery, at);
    }

    /// The variant's timer fired: it may mark losses, or ask for a probe.
    fn on_recovery_timer(&mut self) {
        let new_data = self.may_send_new();
        let now = self.now;
        match self
            .recovery
            .on_deadline(now, &mut self.sb, &mut self.loss, new_data)
        {
            TimerVerdict::Nothing | TimerVerdict::Lost => {}
            TimerVerdict::Enter(trigger) => self.enter_recovery(trigger, Entry::Marked),
            TimerVerdict::Probe(seg) => {
                self.stats.tlps += 1;
                self.loss.force_retransmit = Some(Forced::Probe(seg));
                let event = Event::LossProbe {
                    seg,
                    snd_max: self.sb.max(),
                    retransmission: seg < self.sb.max(),
                };
                self.emit(event);
                // RFC 8985 §7.3: the RTO timer, not the probe timer, runs
                // after a probe.
                self.arm_rto();
            }
        }
        let at = self.recovery.deadline();
        self.set_timer(Timer::Recovery, at);
    }

    /// Ends fast recovery; the controller sets the window it goes on with.
    fn leave_recovery(&mut self) {
        self.loss.phase = Phase::Open;
        self.cc.on_recovery_end(self.now);
        let event = Event::LeaveRecovery {
            snd_una: self.sb.una(),
            cwnd: self.cc.window(),
            ssthresh: self.ssthresh(),
            duration: self.now.saturating_since(self.recovery_started),
        };
        self.emit(event);
    }

    /// Handles expired timers.
    pub fn handle_timeout(&mut self, now: Time) {
        self.advance(now);
        if self.state != SenderState::Sending {
            return;
        }
        for t in TIMERS {
            if self.timer(t).is_some_and(|at| at <= now) {
                self.set_timer(t, None);
                self.burst = 0;
                match t {
                    Timer::Rto => self.on_rto(),
                    Timer::Idle => {
                        self.state = SenderState::Failed;
                        let idle = now.saturating_since(self.last_ack_at);
                        self.emit(Event::Idle { idle });
                        self.timers = [None; TIMERS.len()];
                        return;
                    }
                    Timer::Stall => {
                        self.state = SenderState::Stalled;
                        self.timers = [None; TIMERS.len()];
                        return;
                    }
                    Timer::Persist => self.persist_probe = true,
                    Timer::Recovery => self.on_recovery_timer(),
                    // poll_transmit, called next, sends what the pacer allows.
                    Timer::Pacing => {}
                }
            }
        }
        self.update_state(now);
    }

    fn on_rto(&mut self) {
        if self.sb.outstanding() == 0 {
            return;
        }
        self.stats.timeouts += 1;
        let first = self.rtt.backoff() == 0;
        self.begin_undo_episode(true);
        self.cc.on_rto(self.now, self.sb.flight(), first);
        self.note_controller();
        self.loss.on_rto(&mut self.sb);
        self.recovery.on_rto();
        self.set_timer(Timer::Recovery, None);
        let event = Event::TimeoutRetransmit {
            seg: self.sb.una(),
            snd_nxt: self.sb.una(),
            snd_max: self.sb.max(),
            cwnd: self.cc.window(),
            ssthresh: self.ssthresh(),
        };
        self.emit(event);
        // RFC 6298 §5.5–5.6.
        self.rtt.back_off();
        self.arm_rto();
        // The backed-off RTO, which the next ACK resets before its own line.
        let state = self
            .trace
            .is_some()
            .then(|| self.state_record(self.since_start()));
        if let (Some(trace), Some(state)) = (self.trace.as_mut(), state) {
            trace.push_back(state);
        }
    }

    fn more_data(&self, seg: u64) -> bool {
        self.total_segments.is_none_or(|n| seg < n)
            && (self.tuning.maxpkts == 0 || seg < self.tuning.maxpkts)
            && self.send_deadline.is_none_or(|d| self.now < d)
    }

    fn limited_transmit_allowance(&self) -> u64 {
        if self.tuning.limited_transmit && self.loss.phase == Phase::Disorder {
            // RFC 3042 sends on the first two duplicates; with a larger
            // dup_thresh, on each one below it (Sarolahti §5).
            u64::from(self.loss.dupacks).min(self.loss.dup_thresh.saturating_sub(1))
        } else {
            0
        }
    }

    /// The window rule: what counts as in the network, and how much may
    /// be. During recovery and timeout repair RFC 6675 pipe counts against
    /// cwnd; otherwise FlightSize, with limited transmit's allowance.
    /// With RACK and a controller other than the papers' AIMD, pipe in
    /// every phase, as Linux counts in flight (`tcp_packets_in_flight`):
    /// RACK leaves a hole unmarked for its reordering window (RFC 8985
    /// §6.2, a quarter of the minimum RTT), and FlightSize, which counts
    /// the SACKed segments above the hole, stopped a sender whose window
    /// was full for that long at every loss (18 ms gaps at 100 Mbit/s and
    /// 100 ms, 1 % loss, on the bridge). AIMD keeps the FlightSize rule
    /// the papers' models assume (Mathis's C, tests/papers.rs).
    fn window_use(&self) -> (u64, u64) {
        let cwnd = self.cc.window();
        if self.tuning.recovery == RecoveryKind::Rack && self.tuning.cc != CcKind::Aimd {
            return (self.sb.pipe(), cwnd);
        }
        match self.loss.phase {
            Phase::Recovery | Phase::Loss => (self.sb.pipe(), cwnd),
            Phase::Open | Phase::Disorder => {
                (self.sb.flight(), cwnd + self.limited_transmit_allowance())
            }
        }
    }

    fn window_open(&self) -> bool {
        let (used, allowed) = self.window_use();
        used < allowed
    }

    fn may_send_new(&self) -> bool {
        let seg = self.sb.max();
        self.more_data(seg)
            && self.data_ready(seg)
            && seg < self.sb.una() + u64::from(self.tuning.rcvwin)
            && (seg < self.peer_right_edge || self.persist_probe)
    }

    /// Chooses the next segment to send, and whether it was forced.
    fn next_segment(&mut self) -> Option<(u64, Option<Forced>)> {
        if let Some(forced) = self.loss.force_retransmit.take() {
            let seg = forced.seg();
            debug_assert!(seg >= self.sb.una() && !self.sb.is_sacked(seg));
            return Some((seg, Some(forced)));
        }
        if !self.window_open() {
            return None;
        }
        if matches!(self.loss.phase, Phase::Recovery | Phase::Loss) {
            if let Some(seg) = self.sb.next_lost_pending() {
                return Some((seg, None));
            }
        }
        if self.may_send_new() {
            return Some((self.sb.max(), None));
        }
        if self.more_data(self.sb.max()) {
            return None;
        }
        self.recovery
            .tail_retransmission(&self.sb, &self.loss)
            .map(|seg| (seg, None))
    }

    /// Writes the next datagram to send into `buf` (at least `mss` bytes)
    /// and returns its length; `None` when nothing may be sent now.
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
    ) -> Option<usize> {
        self.advance(now);
        loop {
            if self.state != SenderState::Sending {
                return None;
            }
            if self.tuning.burst_limit > 0 && self.burst >= u64::from(self.tuning.burst_limit) {
                return None;
            }
            let pacing = self.pacing_rate();
            if let Some(rate) = pacing {
                let at = self.pacer.earliest(now, rate);
                if at > now {
                    // Wake when the pacer allows, if anything is waiting.
                    let waiting = self.loss.force_retransmit.is_some() || self.window_open();
                    self.set_timer(Timer::Pacing, waiting.then_some(at));
                    self.pacer.wait_until(waiting.then_some(at));
                    return None;
                }
                self.set_timer(Timer::Pacing, None);
                self.pacer.wait_until(None);
            }
            let Some((seg, forced)) = self.next_segment() else {
                self.note_app_limited();
                return None;
            };
            let is_new = seg == self.sb.max();
            let outstanding = self.sb.outstanding();
            if is_new {
                self.persist_probe = false;
                self.sb.on_send_new();
            } else {
                self.record_retransmission(seg, forced);
            }
            let stamp = self
                .rate
                .on_sent(now, outstanding, self.sb.pipe(), self.sb.lost_total());
            self.sb.stamp(seg, stamp);
            // Test bookkeeping: the property tests assert it stays zero.
            if cfg!(debug_assertions) && forced.is_none() && !self.sent_within_window(is_new) {
                self.window_violations += 1;
            }
            self.burst += 1;
            self.stats.maxburst = self.stats.maxburst.max(self.burst);
            self.stats.pkts_out += 1;
            if let Some(trace) = self.trace.as_mut() {
                trace.push_back(TraceRecord::Xmt {
                    time: now.saturating_since(self.start),
                    seg,
                });
            }
            // RFC 6298 §5.1; and a forced retransmission, or any of
            // snd_una, restarts the timer so it is not pre-empted by a
            // timeout armed a round trip earlier (Linux, Sarolahti §4.1;
            // RFC 6582 §3.2 step 5; Linux's tcp_xmit_retransmit_queue
            // re-arms it for the head, which RACK resends when its
            // retransmission is lost, RFC 8985 §6.2).
            let head_again = !is_new && seg == self.sb.una();
            if self.timer(Timer::Rto).is_none() || forced.is_some() || head_again {
                self.arm_rto();
            }
            self.set_timer(Timer::Persist, None);
            if is_new {
                self.arm_recovery_timer(true);
            }
            if self.droplist.consume(seg) {
                // Scripted loss: sent as far as the protocol knows, but it
                // never reaches the wire.
                self.stats.dropped += 1;
                if let Some(rate) = pacing {
                    self.pacer.on_sent(now, rate, u64::from(self.tuning.mss));
                }
                continue;
            }
            let len = self.write_segment(seg, !is_new, buf, source);
            if let Some(rate) = pacing {
                self.pacer.on_sent(now, rate, len as u64);
            }
            self.stats.bytes_out += len as u64;
            return Some(len);
        }
    }

    /// DRE "Detecting application-limited phases": the window has room and
    /// nothing lost awaits a resend, yet nothing may go out. Waiting for
    /// the application's data, what is delivered meanwhile says nothing of
    /// the path's capacity; waiting for the receiver's window with data to
    /// send, it does (Linux's tcp_rate_check_app_limited), and only cwnd
    /// validation hears of it (`DeliveryRate::on_window_limited`).
    fn note_app_limited(&mut self) {
        if self.window_open() && self.sb.lost_pending() == 0 && !self.may_send_new() {
            let seg = self.sb.max();
            if self.more_data(seg) && self.data_ready(seg) {
                self.rate.on_window_limited(self.sb.pipe());
            } else {
                self.rate.on_app_limited(self.sb.pipe());
            }
        }
    }

    /// Another connection of the same transfer, over the same path, has
    /// sent its last byte: the controller may claim its share now rather
    /// than at its next probe (`Controller::on_sibling_done`).
    ///
    /// A coupled stream ([`Sender::set_group`]) ignores it: its share
    /// grows instead, and its model is already the group's.
    pub fn on_sibling_done(&mut self, now: Time) {
        self.advance(now);
        if !self.grouped {
            self.cc.on_sibling_done(now);
        }
    }

    /// This stream is one of a transfer's streams coupled as one flow
    /// (src/proto/congestion/coupled.rs): the other streams of its group
    /// have delivered `others_delivered` segments so far (the sum of
    /// their [`Sender::delivered`]), and it is to use `share` of what the
    /// group's controller allows, in (0, 1]: the group's flows over its
    /// streams still sending. Call before each event, as the group
    /// changes; a controller that does not couple ignores it.
    ///
    /// At the first call the controller draws its random choices (BBR's
    /// probe timing) from `seed` from then on, the same for every stream
    /// of the group, so that they probe together, as one flow would:
    /// streams probing each at its own time probed the group's bandwidth
    /// with a fraction of one flow's probe each, and N = 2, 4, 8 coupled
    /// streams started beside one BBR flow got 0.38-0.45 of the path
    /// (simulator, seeds 1-4), 0.40-0.55 with one seed (tests/fairness.rs).
    pub fn set_group(&mut self, others_delivered: u64, share: f64, seed: u64) {
        if self.cc.couples() {
            if !self.grouped {
                self.cc.reseed(seed);
            }
            self.grouped = true;
            self.rate.set_group_others(others_delivered);
            self.cc.set_share(share);
        }
    }

    /// Segments this stream has delivered (first SACKed or cumulatively
    /// acknowledged), for its group's count ([`Sender::set_group`]).
    pub fn delivered(&self) -> u64 {
        self.rate.delivered()
    }

    /// Sarolahti & Kuznetsov §3, the CWR state (Linux's tcp_enter_cwr on
    /// a local device queue overflow): the driver's socket refused
    /// datagrams (ENOBUFS), so the window comes down as for a congestion
    /// signal, with nothing to retransmit but what the driver dropped
    /// (those are lost, and loss recovery repairs them). Once per window:
    /// a refusal of data sent before the last reduction's window is
    /// acknowledged changes nothing. Outside fast recovery and timeouts,
    /// which reduce anyway.
    pub fn on_local_congestion(&mut self, now: Time) {
        self.advance(now);
        let open = matches!(self.loss.phase, Phase::Open | Phase::Disorder);
        if !open || self.sb.una() < self.cwr_until {
            return;
        }
        self.cwr_until = self.sb.max();
        self.stats.cwrs += 1;
        self.cc.on_congestion_event(&CongestionEvent {
            flight: self.sb.flight(),
            pipe: self.sb.pipe(),
            sent: self.stats.pkts_out,
        });
        self.cc.on_recovery_end(now);
        self.note_controller();
    }

    /// Sarolahti & Kuznetsov §5: reordering is measured as how far below
    /// the highest segment SACKed before this ACK an original, never
    /// resent, was delivered: it was late, not lost. D-SACKs count only
    /// through a fast recovery found unnecessary ([`Self::check_undo`]),
    /// never one by one: a timeout resends what had arrived, and its
    /// D-SACKs, 1387 segments below the highest SACK on a 1 %-loss path
    /// with no reordering at all, raised dup_thresh to 300.
    fn measure_reordering(&mut self, fack_before: Option<u64>) {
        let Some(fack) = fack_before else {
            return;
        };
        let late = self
            .sb
            .deliveries()
            .iter()
            .filter(|d| !d.retransmitted && d.seg < fack)
            .map(|d| fack - d.seg)
            .max();
        if let Some(d) = late {
            self.note_reordering(d);
        }
    }

    /// A hole was late by `displacement` segments: the loss state adapts
    /// (`LossState::note_reordering`) and the report follows it.
    fn note_reordering(&mut self, displacement: u64) {
        self.loss.note_reordering(displacement);
        self.stats.reordering = self.loss.reordering;
        self.stats.dup_thresh = self.loss.dup_thresh;
    }

    fn record_retransmission(&mut self, seg: u64, forced: Option<Forced>) {
        self.sb.on_retransmit(seg);
        self.stats.rxmts += 1;
        *self.unproven_resends.entry(seg).or_default() += 1;
        if let Some(ep) = &mut self.undo {
            ep.retransmitted += 1;
            ep.first_retx.get_or_insert((self.now, seg));
        }
        let is_fast_retransmit = matches!(forced, Some(Forced::FastRetransmit(_)));
        if self.loss.phase == Phase::Recovery && !is_fast_retransmit {
            self.stats.packs += 1;
            let event = Event::RecoveryRetransmit {
                retransmission: Retransmission {
                    seg,
                    snd_nxt: self.loss.snd_nxt(&mut self.sb),
                    snd_max: self.sb.max(),
                    cwnd: self.cc.window(),
                    ssthresh: self.ssthresh(),
                    recover: self.loss.recover,
                },
                snd_una: self.sb.una(),
            };
            self.emit(event);
        }
    }

    /// Re-checks, after the fact, that an unforced transmission fitted the
    /// windows: the property tests assert no violation is ever counted.
    fn sent_within_window(&self, is_new: bool) -> bool {
        let (used, allowed) = self.window_use();
        let cwnd_ok = used <= allowed;
        let rcvwin_ok = self.sb.outstanding() <= u64::from(self.tuning.rcvwin);
        let peer_ok = !is_new || self.sb.max() <= self.peer_right_edge + 1;
        cwnd_ok && rcvwin_ok && peer_ok
    }

    fn write_segment(
        &self,
        seg: u64,
        retransmission: bool,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
    ) -> usize {
        let offset = seg * self.payload_size;
        let len = match self.stream_len {
            Some(total) => self.payload_size.min(total - offset),
            None => self.payload_size,
        } as usize;
        let header = DataHeader {
            conn_id: self.conn_id,
            seg,
            timestamp: self.now.wire_micros(),
            flags: DataFlags {
                fin: self.stream_len == Some(offset + len as u64),
                retransmission,
            },
        };
        let n = header
            .emit(buf)
            .expect("poll_transmit needs a buffer of at least mss bytes");
        debug_assert_eq!(n, DATA_HEADER_LEN);
        source.read_at(offset, &mut buf[n..n + len]);
        n + len
    }

    fn update_state(&mut self, now: Time) {
        if self.state != SenderState::Sending {
            return;
        }
        if self.sb.outstanding() == 0 && !self.more_data(self.sb.max()) {
            self.state = SenderState::Finished;
            self.finished_at = Some(now);
            self.timers = [None; TIMERS.len()];
            return;
        }
        if self.sb.outstanding() == 0 && !self.data_ready(self.sb.max()) {
            self.app_limited = true;
            self.set_timer(Timer::Idle, None);
            self.set_timer(Timer::Stall, None);
            self.set_timer(Timer::Persist, None);
            return;
        }
        if self.app_limited {
            // The peer's silence counts again from now.
            self.app_limited = false;
            self.last_ack_at = self.last_ack_at.max(now);
            self.arm_idle();
            self.answered_without_delivery = None;
            self.arm_stall();
        }
        // Persist: nothing in flight, data to send, but the peer's window is
        // shut. Probe after an RTO so a lost window update cannot deadlock.
        let blocked =
            self.sb.outstanding() == 0 && !self.may_send_new() && self.more_data(self.sb.max());
        if blocked && self.timer(Timer::Persist).is_none() && !self.persist_probe {
            let at = self.rtt.deadline(now, self.rtt.rto());
            self.set_timer(Timer::Persist, Some(at));
        }
    }

    /// Checks the sender's invariants; O(window), for tests.
    pub fn check_invariants(&mut self) -> Result<(), SenderInvariant> {
        self.sb.check_invariants()?;
        let (una, max) = (self.sb.una(), self.sb.max());
        let nxt = self.loss.snd_nxt(&mut self.sb);
        if !(una <= nxt && nxt <= max) {
            return Err(SenderInvariant::SequenceOrder { una, nxt, max });
        }
        if self.cc.window() < 1 {
            return Err(SenderInvariant::NoWindow);
        }
        if max - una > u64::from(self.tuning.rcvwin) {
            return Err(SenderInvariant::OverReceiveWindow {
                outstanding: max - una,
                rcvwin: self.tuning.rcvwin,
            });
        }
        if self.window_violations > 0 {
            return Err(SenderInvariant::SentOutsideWindow(self.window_violations));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! Scripted at packet level: feed ACKs, assert what is sent next. A
    //! ten-byte payload keeps every segment visible.
    use super::*;
    use crate::proto::payload::PatternSource;
    use crate::proto::tuning::{RecoveryKind, ReorderingKind};
    use crate::proto::wire::SackBlock;

    const PAYLOAD: u32 = 10;
    const CONN: u64 = 7;

    fn tuning(kind: RecoveryKind) -> Tuning {
        Tuning {
            mss: DATA_HEADER_LEN as u32 + PAYLOAD,
            recovery: kind,
            initsegs: 4,
            rcvwin: 100,
            rcvsegs: 100,
            ..Tuning::default()
        }
    }

    fn sender(t: Tuning) -> Sender {
        Sender::new(&t, CONN, Some(u64::from(PAYLOAD) * 1000), Time::ZERO).unwrap()
    }

    fn at(ms: u64) -> Time {
        Time::from_nanos(ms * 1_000_000)
    }

    /// Everything the sender sends now, as segment numbers.
    #[track_caller]
    fn send(s: &mut Sender, now: Time) -> Vec<u64> {
        let mut buf = vec![0u8; 2048];
        let mut segs = Vec::new();
        while let Some(n) = s.poll_transmit(now, &mut buf, &mut PatternSource) {
            match Packet::decode(&buf[..n]).unwrap() {
                Packet::Data(d) => segs.push(d.header.seg),
                other => panic!("{} packet from a sender", other.kind_name()),
            }
        }
        s.check_invariants().unwrap();
        segs
    }

    #[derive(Clone, Copy)]
    struct AckSpec<'a> {
        cum: u64,
        sack: &'a [(u64, u64)],
        dsack: Option<(u64, u64)>,
        window: u32,
    }

    const ACK: AckSpec<'static> = AckSpec {
        cum: 0,
        sack: &[],
        dsack: None,
        window: 100,
    };

    #[track_caller]
    fn ack(s: &mut Sender, now: Time, spec: AckSpec<'_>) {
        let mut a = Ack::new(
            CONN,
            now.wire_micros().wrapping_sub(50_000),
            spec.cum,
            spec.window,
        );
        for &(start, end) in spec.sack {
            assert!(a.push_sack(SackBlock::new(start, end).unwrap()));
        }
        a.dsack = spec.dsack.and_then(|(x, y)| SackBlock::new(x, y));
        let mut buf = [0u8; 128];
        let n = a.emit(&mut buf).unwrap();
        s.handle_datagram(now, &buf[..n]).unwrap();
    }

    /// An ACK of every segment below `cum` that SACKs `blocks`, in the
    /// order given (the newest first, as a receiver sends them).
    #[track_caller]
    fn ack_with_sacks(s: &mut Sender, now: Time, cum: u64, blocks: &[(u64, u64)]) {
        ack(
            s,
            now,
            AckSpec {
                cum,
                sack: blocks,
                ..ACK
            },
        );
    }

    fn events(s: &mut Sender) -> Vec<String> {
        std::iter::from_fn(|| s.poll_event())
            .map(|e| e.event.to_string())
            .collect()
    }

    /// Sends the initial window, grows it to `segments` in flight by slow
    /// start, and returns the next segment number.
    fn fill(s: &mut Sender, segments: u64) -> u64 {
        let mut sent = send(s, at(0)).len() as u64;
        let mut acked = 0;
        while sent < segments {
            acked += 1;
            ack(s, at(acked), AckSpec { cum: acked, ..ACK });
            sent += send(s, at(acked)).len() as u64;
        }
        sent
    }

    /// A transmission outside the window is reported as that broken
    /// invariant, in the words the simulator prints.
    #[test]
    fn a_broken_invariant_is_named() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        s.window_violations = 2;
        let broken = s.check_invariants().unwrap_err();
        assert_eq!(broken, SenderInvariant::SentOutsideWindow(2));
        assert_eq!(broken.to_string(), "2 transmissions outside the window");
        s.window_violations = 0;
        assert_eq!(s.check_invariants(), Ok(()));
    }

    #[test]
    fn initial_window_is_initsegs_times_vmss() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        assert_eq!(send(&mut s, at(0)), vec![0, 1, 2, 3]);
        let mut s = sender(Tuning {
            vmss: 3,
            ..tuning(RecoveryKind::Sack)
        });
        assert_eq!(send(&mut s, at(0)).len(), 12);
    }

    /// Sarolahti §3, CWR: a refused send halves the window (aimd) without
    /// a retransmission, once per window: a second refusal before the
    /// window sent at the first is acknowledged changes nothing.
    #[test]
    fn local_congestion_reduces_the_window_once_per_window() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        for cum in 1..=4 {
            ack(&mut s, at(100), AckSpec { cum, ..ACK });
        }
        send(&mut s, at(100));
        let before = s.cc.window();
        assert_eq!(before, 8);
        s.on_local_congestion(at(101));
        let flight = 8;
        assert_eq!(
            s.cc.window(),
            flight / 2,
            "halved from the window in flight"
        );
        assert_eq!((s.stats().cwrs, s.stats().rxmts), (1, 0));
        s.on_local_congestion(at(102));
        assert_eq!(
            (s.cc.window(), s.stats().cwrs),
            (flight / 2, 1),
            "once per window"
        );
        // Everything sent before the reduction acknowledged: it may again.
        ack(&mut s, at(200), AckSpec { cum: 12, ..ACK });
        s.on_local_congestion(at(201));
        assert_eq!(s.stats().cwrs, 2);
    }

    #[test]
    fn slow_start_releases_two_per_ack_of_one() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        ack(&mut s, at(100), AckSpec { cum: 1, ..ACK });
        assert_eq!(send(&mut s, at(100)), vec![4, 5]);
        // An ACK of two segments (delayed ACK) releases four: RFC 3465 L = 2.
        ack(&mut s, at(101), AckSpec { cum: 3, ..ACK });
        assert_eq!(send(&mut s, at(101)), vec![6, 7, 8, 9]);
    }

    /// RFC 3042, then RFC 5681 §3.2: new data on the first two duplicates,
    /// the fast retransmit on the third.
    #[test]
    fn limited_transmit_then_fast_retransmit_on_the_third_duplicate() {
        for kind in [RecoveryKind::Reno, RecoveryKind::NewReno] {
            let mut s = sender(tuning(kind));
            let next = fill(&mut s, 10);
            let una = s.snapshot(at(10)).snd_una;
            for (i, expect) in [vec![next], vec![next + 1], vec![una]]
                .into_iter()
                .enumerate()
            {
                ack(&mut s, at(20 + i as u64), AckSpec { cum: una, ..ACK });
                assert_eq!(
                    send(&mut s, at(20 + i as u64)),
                    expect,
                    "{kind}, duplicate {}",
                    i + 1
                );
            }
            let ev = events(&mut s);
            assert!(
                ev[0].starts_with(&format!("3duprxmit pkt {una} ")),
                "{ev:?}"
            );
            assert_eq!(s.stats().dup3s, 1);
        }
        let mut s = sender(Tuning {
            limited_transmit: false,
            ..tuning(RecoveryKind::NewReno)
        });
        fill(&mut s, 10);
        let una = s.snapshot(at(10)).snd_una;
        ack(&mut s, at(20), AckSpec { cum: una, ..ACK });
        assert!(send(&mut s, at(20)).is_empty());
    }

    /// Hoe §3.2, RFC 6582: a partial ACK retransmits the next hole at once
    /// and recovery goes on; Reno leaves recovery on it instead.
    #[test]
    fn newreno_retransmits_on_a_partial_ack_reno_does_not() {
        for (kind, expect_retransmit) in
            [(RecoveryKind::NewReno, true), (RecoveryKind::Reno, false)]
        {
            let mut s = sender(tuning(kind));
            fill(&mut s, 12);
            // Segments 6 and 8 lost; 7, 9, 10, 11 arrive.
            for t in 20..24 {
                ack(&mut s, at(t), AckSpec { cum: 6, ..ACK });
            }
            let sent = send(&mut s, at(23));
            assert_eq!(sent[0], 6, "{kind}: fast retransmit");
            ack(&mut s, at(30), AckSpec { cum: 8, ..ACK });
            let sent = send(&mut s, at(30));
            assert_eq!(
                sent.first() == Some(&8),
                expect_retransmit,
                "{kind}: {sent:?}"
            );
            assert_eq!(s.phase() == Phase::Recovery, expect_retransmit, "{kind}");
        }
    }

    /// RFC 6298 §5, RFC 5681 §3.1: a timeout resends snd_una with a
    /// one-segment window and halves ssthresh; then, for NewReno, duplicate
    /// ACKs for data sent before it do not start a fast retransmit
    /// (Hoe §3.2 (v)); Reno has no such memory.
    #[test]
    fn after_a_timeout_newreno_ignores_duplicates_reno_does_not() {
        for (kind, fast_retransmits) in [(RecoveryKind::NewReno, 0), (RecoveryKind::Reno, 1)] {
            let mut s = sender(tuning(kind));
            fill(&mut s, 12); // 4..=11 outstanding
            let rto_at = s.poll_timeout().unwrap();
            s.handle_timeout(rto_at);
            assert_eq!(
                send(&mut s, rto_at),
                vec![4],
                "{kind}: go-back-N from snd_una"
            );
            let snap = s.snapshot(rto_at);
            assert_eq!(
                (snap.cwnd, snap.ssthresh),
                (1, 4),
                "{kind}: half of 8 in flight"
            );
            assert_eq!(s.phase(), Phase::Loss);
            // Original segments still in flight arrive above a hole.
            let t = rto_at + Duration::from_millis(1);
            for _ in 0..4 {
                ack(&mut s, t, AckSpec { cum: 4, ..ACK });
            }
            send(&mut s, t);
            assert_eq!(s.stats().dup3s, fast_retransmits, "{kind}");
        }
    }

    /// RFC 6675: entering recovery on three SACKs drops cwnd to ssthresh
    /// and sends only while pipe < cwnd; every hole below the third-highest
    /// SACK is retransmitted, lowest first.
    #[test]
    fn sack_recovery_follows_pipe_and_nextseg() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        fill(&mut s, 16); // 6..=15 outstanding, cwnd 10
                          // 6 and 8 lost; 7, 9, 10 SACKed.
        ack_with_sacks(&mut s, at(20), 6, &[(7, 8)]);
        ack_with_sacks(&mut s, at(21), 6, &[(9, 10), (7, 8)]);
        ack_with_sacks(&mut s, at(22), 6, &[(9, 11), (7, 8)]);
        assert_eq!(send(&mut s, at(22)), vec![6], "the fast retransmit");
        let snap = s.snapshot(at(22));
        assert_eq!((snap.cwnd, snap.ssthresh), (5, 5));
        // pipe = 10 outstanding - 3 SACKed - 1 lost (6) + 1 resent = 7 > 5.
        assert!(send(&mut s, at(22)).is_empty());
        // Now 7 SACKed, so 8 has three above it and is lost too:
        // pipe = 10 - 7 - 2 + 1 = 2, room for three.
        ack_with_sacks(&mut s, at(23), 6, &[(9, 15), (7, 8)]);
        assert_eq!(
            send(&mut s, at(23)),
            vec![8, 16, 17],
            "NextSeg rules 1 then 2"
        );
    }

    /// A sender with undo on whose fast recovery (6..=15 outstanding,
    /// cwnd 10, 7..=10 SACKed) has just resent 6.
    fn resent_6_in_fast_recovery() -> Sender {
        let mut s = sender(Tuning {
            undo: true,
            ..tuning(RecoveryKind::Sack)
        });
        fill(&mut s, 16); // 6..=15 outstanding, cwnd 10
        for (t, top) in [(20, 8), (21, 10), (22, 11)] {
            ack_with_sacks(&mut s, at(t), 6, &[(7, top)]);
        }
        assert_eq!(send(&mut s, at(22)), vec![6]);
        s
    }

    /// Sarolahti §6, RFC 2883: a fast retransmit whose segment was only
    /// reordered. The first ACK after it echoes the retransmission, so the
    /// timestamps cannot tell; the D-SACK for the retransmission, the only
    /// one of the episode, proves it spurious and the window before the
    /// recovery comes back.
    #[test]
    fn a_dsack_for_every_retransmission_undoes_the_reduction() {
        let mut s = resent_6_in_fast_recovery();
        let snap = s.snapshot(at(22));
        assert_eq!((snap.cwnd, snap.ssthresh), (5, 5));
        ack(&mut s, at(100), AckSpec { cum: 16, ..ACK });
        send(&mut s, at(100));
        assert_eq!(s.stats().undos, 0, "the ACK echoes the retransmission");
        ack(
            &mut s,
            at(101),
            AckSpec {
                cum: 16,
                dsack: Some((6, 7)),
                ..ACK
            },
        );
        assert_eq!(s.stats().undos, 1);
        assert_eq!(s.stats().spurious_rxmts, 1);
        let snap = s.snapshot(at(101));
        assert_eq!((snap.cwnd, snap.ssthresh), (10, u64::MAX));
        assert!(events(&mut s)
            .iter()
            .any(|e| e.starts_with("undo dsack una 16 cwnd 10")));
    }

    /// RFC 3708 §3 counts a D-SACK as a spurious retransmission; a peer's
    /// D-SACKs prove no more than the sender resent, nor anything above
    /// what it sent.
    #[test]
    fn dsacks_count_spurious_retransmissions_up_to_those_sent() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        fill(&mut s, 16); // 6..=15 outstanding
        let dsack = |s: &mut Sender, t, block| {
            let spec = AckSpec {
                cum: 6,
                dsack: Some(block),
                ..ACK
            };
            ack(s, at(t), spec);
        };
        dsack(&mut s, 20, (0, 4));
        assert_eq!(s.stats().spurious_rxmts, 0, "nothing was resent");
        for (t, top) in [(21, 8), (22, 10), (23, 11)] {
            ack_with_sacks(&mut s, at(t), 6, &[(7, top)]);
        }
        assert_eq!(send(&mut s, at(23)), vec![6]);
        assert_eq!(s.stats().rxmts, 1);
        dsack(&mut s, 24, (16, 17));
        assert_eq!(s.stats().spurious_rxmts, 0, "16 was never sent");
        dsack(&mut s, 25, (6, 7));
        dsack(&mut s, 26, (6, 7));
        dsack(&mut s, 27, (0, 5));
        assert_eq!(s.stats().spurious_rxmts, 1, "one resend, one proof");
        assert_eq!(s.stats().dsacks, 5);
    }

    /// A copy the network made proves nothing (Linux counts a D-SACK
    /// against `undo_retrans` only for a retransmitted segment): in a
    /// fast recovery that resent 6, a D-SACK for 9, sent once and
    /// duplicated on the path, is neither a spurious resend nor grounds to
    /// undo; the D-SACK for 6 then is both.
    #[test]
    fn a_dsack_for_a_segment_sent_once_proves_nothing() {
        let mut s = resent_6_in_fast_recovery();
        ack(&mut s, at(100), AckSpec { cum: 16, ..ACK });
        send(&mut s, at(100));
        let dsack = |s: &mut Sender, t, block| {
            let spec = AckSpec {
                cum: 16,
                dsack: Some(block),
                ..ACK
            };
            ack(s, at(t), spec);
        };
        dsack(&mut s, 101, (9, 10));
        assert_eq!(s.stats().undos, 0, "9 was sent once");
        assert_eq!(s.stats().spurious_rxmts, 0);
        dsack(&mut s, 102, (6, 7));
        assert_eq!(s.stats().undos, 1);
        assert_eq!(s.stats().spurious_rxmts, 1);
    }

    /// Sarolahti §5 (Linux's tcp_try_undo_partial): the D-SACK that proves
    /// a fast retransmit unnecessary also measures the reordering. The
    /// hole at 6 was late by the 3 segments SACKed above it when recovery
    /// began, so dup_thresh becomes 4, with undo off as well, and FACK
    /// stops marking by distance.
    #[test]
    fn a_fast_retransmit_found_unnecessary_by_dsack_raises_dup_thresh() {
        for undo in [false, true] {
            let mut s = sender(Tuning {
                undo,
                reordering: ReorderingKind::Adaptive,
                ..tuning(RecoveryKind::Sack)
            });
            fill(&mut s, 16);
            for (t, top) in [(20, 8), (21, 10), (22, 11)] {
                let sack = &[(7, top)];
                ack(
                    &mut s,
                    at(t),
                    AckSpec {
                        cum: 6,
                        sack,
                        ..ACK
                    },
                );
            }
            assert_eq!(send(&mut s, at(22)), vec![6]);
            // The original of 6 fills the hole; its retransmission, a
            // duplicate, comes back as a D-SACK.
            // The ACK echoes the retransmission, so Eifel cannot tell.
            ack(&mut s, at(100), AckSpec { cum: 16, ..ACK });
            assert_eq!(s.stats().dup_thresh, 3, "no SACK below snd.fack");
            let dsack = Some((6, 7));
            ack(
                &mut s,
                at(101),
                AckSpec {
                    cum: 16,
                    dsack,
                    ..ACK
                },
            );
            assert_eq!((s.stats().reordering, s.stats().dup_thresh), (3, 4));
            assert!(s.loss.fack_off());
            assert_eq!(s.stats().undos, u64::from(undo));
        }
    }

    /// A timeout's go-back-N resends segments that had arrived; their
    /// D-SACKs say nothing of reordering.
    #[test]
    fn dsacks_after_a_timeout_leave_dup_thresh_alone() {
        let mut s = sender(Tuning {
            undo: true,
            reordering: ReorderingKind::Adaptive,
            ..tuning(RecoveryKind::Sack)
        });
        fill(&mut s, 16);
        let sack = &[(7, 11)];
        ack(
            &mut s,
            at(20),
            AckSpec {
                cum: 6,
                sack,
                ..ACK
            },
        );
        let rto_at = s.poll_timeout().unwrap();
        s.handle_timeout(rto_at);
        assert_eq!(s.stats().timeouts, 1);
        let resent = send(&mut s, rto_at);
        assert_eq!(resent.first(), Some(&6));
        let later = rto_at + Duration::from_millis(10);
        let dsack = Some((6, 7));
        ack(
            &mut s,
            later,
            AckSpec {
                cum: 16,
                dsack,
                ..ACK
            },
        );
        assert_eq!(s.stats().undos, 1, "the timeout was spurious");
        assert_eq!((s.stats().reordering, s.stats().dup_thresh), (0, 3));
    }

    /// FACK: every un-SACKed segment below the highest SACK is lost once
    /// recovery starts, which it does as soon as that SACK is more than
    /// dup_thresh beyond snd_una.
    #[test]
    fn fack_starts_on_distance_and_marks_all_holes() {
        let mut s = sender(tuning(RecoveryKind::Fack));
        fill(&mut s, 16);
        // 6, 7, 8 lost; one SACK for 9 and 10 puts snd.fack at 11 > 6 + 3.
        ack_with_sacks(&mut s, at(20), 6, &[(9, 11)]);
        assert_eq!(s.phase(), Phase::Recovery);
        assert_eq!(s.stats().dups, 1);
        let sent = send(&mut s, at(20));
        assert_eq!(sent.first(), Some(&6));
        ack_with_sacks(&mut s, at(21), 6, &[(9, 15)]);
        ack_with_sacks(&mut s, at(22), 6, &[(9, 19)]);
        assert_eq!(send(&mut s, at(22))[..2], [7, 8]);
    }

    /// RFC 2018 §8: SACKs are advisory. A receiver that SACKs a segment and
    /// then stops its cumulative ACK there has reneged: the sender forgets
    /// its SACKs and fast-retransmits the first unacknowledged segment.
    #[test]
    fn a_reneging_receiver_makes_the_sender_forget_its_sacks() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        ack_with_sacks(&mut s, at(1), 0, &[(2, 4)]);
        ack(&mut s, at(2), AckSpec { cum: 2, ..ACK });
        assert_eq!(s.stats().reneges, 1);
        assert_eq!(send(&mut s, at(2)), vec![4, 5, 6, 7]);
        // Three duplicates with new SACKs: limited transmit twice, then the
        // fast retransmit of segment 2, which was SACKed and then reneged.
        let mut sent = Vec::new();
        for t in 3..6 {
            ack_with_sacks(&mut s, at(t), 2, &[(3, t + 1)]);
            sent.push(send(&mut s, at(t)));
        }
        assert_eq!(sent, vec![vec![8], vec![9], vec![2]]);
    }

    /// RFC 8985 §6.2–6.3: a segment is lost once one sent after it is
    /// delivered and an RTT and the reordering window (min_rtt / 4, with
    /// fewer than dup_thresh SACKed) have passed since it left; the RACK
    /// timer finds it without another ACK. Its retransmission is judged the
    /// same way, by its own send time: lost again and resent, no timeout.
    #[test]
    fn rack_marks_by_time_and_finds_a_lost_retransmission() {
        let mut s = sender(tuning(RecoveryKind::Rack));
        // 6..=15 outstanding; 6 and 7 left at 2 ms.
        assert_eq!(fill(&mut s, 16), 16);
        // 7 arrives, 6 does not: 6 is not lost yet (reordering window).
        ack_with_sacks(&mut s, at(60), 6, &[(7, 8)]);
        assert_eq!(s.phase(), Phase::Disorder);
        let sent = send(&mut s, at(60));
        assert!(!sent.contains(&6), "{sent:?}");
        // The RACK timer: 7 took 58 ms; with min_rtt 50 ms the window is
        // 12.5 ms, so 6 is lost at 2 + 58 + 12.5 ms.
        let due = s.poll_timeout().unwrap();
        assert_eq!(due, Time::from_nanos(72_500_000));
        s.handle_timeout(due);
        assert_eq!(s.phase(), Phase::Recovery);
        assert_eq!(send(&mut s, due).first(), Some(&6), "fast retransmit");
        // The retransmission is lost. What was sent before it arrives...
        ack_with_sacks(&mut s, at(100), 6, &[(7, 16)]);
        let later = send(&mut s, at(100));
        assert!(!later.is_empty() && !later.contains(&6), "{later:?}");
        // ...then what was sent after it, 60 ms later: 6's retransmission,
        // sent 87.5 ms ago, is lost too and goes out again.
        let top = s.snapshot(at(160)).snd_max;
        ack_with_sacks(&mut s, at(160), 6, &[(7, top)]);
        assert_eq!(send(&mut s, at(160)).first(), Some(&6));
        assert_eq!(s.stats().timeouts, 0);
        assert_eq!(s.stats().dup3s, 1, "one recovery");
    }

    /// RFC 8985 §7: a lost last segment, with nothing SACKed, draws a tail
    /// loss probe two SRTTs after the last ACK, before the RTO; the probe
    /// resends the highest segment, and its ACK ends the transfer.
    #[test]
    fn tlp_probes_a_lost_tail_before_the_rto() {
        let t = tuning(RecoveryKind::Rack);
        let mut s = Sender::new(&t, CONN, Some(u64::from(PAYLOAD) * 6), Time::ZERO).unwrap();
        assert_eq!(send(&mut s, at(0)), vec![0, 1, 2, 3]);
        ack(&mut s, at(50), AckSpec { cum: 4, ..ACK });
        assert_eq!(send(&mut s, at(50)), vec![4, 5]);
        // 5 is lost: only 4 is acknowledged.
        ack(&mut s, at(100), AckSpec { cum: 5, ..ACK });
        assert!(send(&mut s, at(100)).is_empty());
        let due = s.poll_timeout().unwrap();
        assert_eq!(due, at(200), "PTO = 2 x SRTT (50 ms) after the ACK");
        assert!(due < at(100) + s.rto(), "before the RTO");
        s.handle_timeout(due);
        assert_eq!(send(&mut s, due), vec![5]);
        assert_eq!(s.stats().tlps, 1);
        assert!(events(&mut s).iter().any(|e| e == "tlp pkt 5 max 6 rxmt"));
        ack(
            &mut s,
            due + Duration::from_millis(50),
            AckSpec { cum: 6, ..ACK },
        );
        assert_eq!(s.state(), SenderState::Finished);
        assert_eq!(s.stats().timeouts, 0);
    }

    #[test]
    fn bad_acks_are_counted_and_change_nothing() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        fill(&mut s, 8);
        let before = s.snapshot(at(10));
        ack(&mut s, at(10), AckSpec { cum: 1, ..ACK });
        ack(&mut s, at(10), AckSpec { cum: 999, ..ACK });
        assert_eq!(s.stats().badacks, 2);
        assert_eq!(s.snapshot(at(10)), before);
        let ev = events(&mut s);
        assert!(ev.iter().all(|e| e.starts_with("badack ")), "{ev:?}");
        assert!(s.handle_datagram(at(10), b"\x00junk").is_err());
        assert_eq!(s.stats().bad_packets, 1);
    }

    #[test]
    fn burst_limit_caps_sends_per_event() {
        let mut s = sender(Tuning {
            burst_limit: 2,
            initsegs: 10,
            ..tuning(RecoveryKind::Sack)
        });
        assert_eq!(send(&mut s, at(0)), vec![0, 1]);
        ack(&mut s, at(1), AckSpec { cum: 2, ..ACK });
        assert_eq!(send(&mut s, at(1)), vec![2, 3]);
        assert_eq!(s.stats().maxburst, 2);
    }

    #[test]
    fn droplist_drops_first_transmissions_only() {
        let mut s = sender(Tuning {
            droplist: "1,2".parse().unwrap(),
            ..tuning(RecoveryKind::Sack)
        });
        assert_eq!(send(&mut s, at(0)), vec![0, 3]);
        assert_eq!(s.stats().dropped, 2);
        assert_eq!(s.stats().pkts_out, 4);
    }

    /// A zero window stops new data; a probe goes out after an RTO so a
    /// lost window update cannot deadlock the transfer.
    #[test]
    fn zero_window_is_probed() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        ack(
            &mut s,
            at(10),
            AckSpec {
                cum: 4,
                window: 0,
                ..ACK
            },
        );
        assert!(send(&mut s, at(10)).is_empty());
        let probe_at = s.poll_timeout().unwrap();
        assert!(probe_at > at(10));
        s.handle_timeout(probe_at);
        assert_eq!(send(&mut s, probe_at), vec![4]);
        ack(
            &mut s,
            probe_at,
            AckSpec {
                cum: 5,
                window: 50,
                ..ACK
            },
        );
        assert!(!send(&mut s, probe_at).is_empty());
    }

    #[test]
    fn maxtime_ends_an_unlimited_stream() {
        let t = Tuning {
            maxtime: Duration::from_millis(50),
            ..tuning(RecoveryKind::Sack)
        };
        let mut s = Sender::new(&t, CONN, None, Time::ZERO).unwrap();
        assert_eq!(send(&mut s, at(0)).len(), 4);
        ack(&mut s, at(60), AckSpec { cum: 4, ..ACK });
        assert!(send(&mut s, at(60)).is_empty());
        assert_eq!(s.state(), SenderState::Finished);
        assert!(Sender::new(&tuning(RecoveryKind::Sack), CONN, None, Time::ZERO).is_err());
    }

    #[test]
    fn nothing_to_send_finishes_at_once() {
        let s = Sender::new(&tuning(RecoveryKind::Sack), CONN, Some(0), Time::ZERO).unwrap();
        assert_eq!(s.state(), SenderState::Finished);
        assert_eq!(s.poll_timeout(), None);
    }

    /// A controller with a fixed window and pacing rate.
    #[derive(Debug)]
    struct Fixed {
        window: u64,
        rate: u64,
    }

    impl Controller for Fixed {
        fn kind(&self) -> crate::proto::tuning::CcKind {
            crate::proto::tuning::CcKind::Aimd
        }
        fn on_ack(&mut self, _: &AckEvent) {}
        fn on_congestion_event(&mut self, _: &CongestionEvent) {}
        fn on_recovery_end(&mut self, _: Time) {}
        fn on_rto(&mut self, _: Time, _: u64, _: bool) {}
        fn window(&self) -> u64 {
            self.window
        }
        fn ssthresh(&self) -> Option<u64> {
            None
        }
        fn pacing_rate(&self) -> Option<u64> {
            Some(self.rate)
        }
    }

    fn paced(window: u64) -> Sender {
        let mut s = sender(tuning(RecoveryKind::Sack));
        // One 35-byte datagram per millisecond; a quantum is two datagrams.
        let mss = u64::from(s.tuning.mss);
        s.cc = Coupled::new(Box::new(Fixed {
            window,
            rate: mss * 1000,
        }));
        s
    }

    /// A paced sender sends a quantum, then nothing until the pacer allows,
    /// and says when that is in poll_timeout.
    #[test]
    fn a_paced_sender_waits_for_the_pacer() {
        let mut s = paced(100);
        assert_eq!(send(&mut s, at(0)), vec![0, 1], "a quantum at once");
        assert_eq!(s.poll_timeout(), Some(at(1)));
        let half = at(0) + Duration::from_micros(500);
        assert!(send(&mut s, half).is_empty(), "not before the deadline");
        s.handle_timeout(at(1));
        assert_eq!(send(&mut s, at(1)), vec![2]);
        assert_eq!(s.poll_timeout(), Some(at(2)));
        assert_eq!(s.snapshot(at(1)).pacing_rate, Some(35_000));
    }

    /// A SACK sender capped by `bwlimit` at one 10-byte payload per ms.
    fn capped_at_a_segment_a_ms() -> Sender {
        sender(Tuning {
            bwlimit: u64::from(PAYLOAD) * 8 * 1000,
            ..tuning(RecoveryKind::Sack)
        })
    }

    /// `bwlimit` on an unpaced controller (aimd) makes the pacer a token
    /// bucket at the cap: two datagrams at once (its depth), then one per
    /// datagram's worth of time, here 1 ms: the cap is on payload, so a
    /// 10-byte payload per ms is 80 kbit/s and the 35-byte datagrams go
    /// at 35 kB/s.
    #[test]
    fn bwlimit_makes_an_unpaced_sender_a_token_bucket() {
        let mut s = capped_at_a_segment_a_ms();
        assert_eq!(send(&mut s, at(0)), vec![0, 1], "the bucket's depth");
        assert_eq!(s.poll_timeout(), Some(at(1)));
        s.handle_timeout(at(1));
        assert_eq!(send(&mut s, at(1)), vec![2]);
        assert_eq!(s.snapshot(at(1)).pacing_rate, Some(35_000));
        // Without the cap the whole initial window goes at once.
        let mut free = sender(tuning(RecoveryKind::Sack));
        assert_eq!(send(&mut free, at(0)).len(), 4);
    }

    /// The I/O loop reads the socket before a due timer only when an ACK
    /// could cancel it: the pacer's release is not one, the RTO is.
    #[test]
    fn only_timers_an_ack_may_cancel_ask_for_a_read_first() {
        let mut s = capped_at_a_segment_a_ms();
        send(&mut s, at(0));
        assert_eq!(s.poll_timeout(), Some(at(1)), "the pacer's release");
        assert!(!s.ack_timer_due(at(1)));
        let rto = s.timer(Timer::Rto).expect("data in flight");
        assert!(s.ack_timer_due(rto));
    }

    /// A paced controller faster than `bwlimit` paces at the cap; one
    /// slower keeps its own rate.
    #[test]
    fn bwlimit_caps_a_controllers_pacing_rate() {
        let mut fast = paced(100);
        fast.tuning.bwlimit = u64::from(PAYLOAD) * 8 * 500;
        assert_eq!(fast.snapshot(at(0)).pacing_rate, Some(17_500));
        let mut slow = paced(100);
        slow.tuning.bwlimit = u64::from(PAYLOAD) * 8 * 5000;
        assert_eq!(slow.snapshot(at(0)).pacing_rate, Some(35_000));
    }

    /// With the window full there is nothing for the pacer to release: no
    /// pacing wake-up, only the retransmission timer.
    #[test]
    fn a_full_window_sets_no_pacing_timer() {
        let mut s = paced(2);
        send(&mut s, at(0));
        assert!(send(&mut s, at(0)).is_empty());
        assert_eq!(s.timer(Timer::Pacing), None);
        assert_eq!(s.poll_timeout(), s.timer(Timer::Rto));
    }

    /// DRE "Detecting application-limited phases": a sender with room in
    /// its window that waits for the application's data is
    /// application-limited; one held by cwnd is not, nor, for its rate
    /// samples, one held by the receiver's window with data to send
    /// (Linux's tcp_rate_check_app_limited), though that one does not fill
    /// its window either (`is_send_limited`, cwnd validation's sense).
    #[test]
    fn waiting_for_data_is_app_limited_the_peer_window_and_cwnd_are_not() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        assert!(!s.rate.is_app_limited(), "held by cwnd");
        assert!(!s.rate.is_send_limited(), "held by cwnd");
        let mut s = sender(tuning(RecoveryKind::Sack));
        s.set_available(at(0), 25);
        send(&mut s, at(0));
        assert!(s.rate.is_app_limited(), "waiting for the application");
        assert!(s.rate.is_send_limited(), "waiting for the application");
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        ack(
            &mut s,
            at(50),
            AckSpec {
                cum: 2,
                window: 4,
                ..ACK
            },
        );
        assert_eq!(send(&mut s, at(50)), vec![4, 5]);
        assert!(!s.rate.is_app_limited(), "held by the receiver's window");
        assert!(s.rate.is_send_limited(), "held by the receiver's window");
    }

    /// Every ACK that delivers a segment sent a minimum RTT earlier or more
    /// gives a rate sample; the sampler counts each segment once, whether
    /// SACKed first or cumulatively acknowledged.
    #[test]
    fn each_segment_is_counted_delivered_once() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        ack_with_sacks(&mut s, at(50), 0, &[(1, 3)]);
        assert_eq!(s.rate.delivered(), 2);
        ack(&mut s, at(51), AckSpec { cum: 4, ..ACK });
        assert_eq!(s.rate.delivered(), 4);
    }

    /// A sender whose application reads ahead sends only what is ready,
    /// and its idle timer does not run while it waits for the application:
    /// the peer has nothing to answer.
    #[test]
    fn sends_only_available_data_and_waiting_for_it_is_not_idle() {
        let t = Tuning {
            maxidle: Duration::from_secs(2),
            ..tuning(RecoveryKind::Sack)
        };
        let mut s = sender(t);
        s.set_available(at(0), 25);
        // Segments 0 and 1 are whole; segment 2 would need bytes 20..30.
        assert_eq!(send(&mut s, at(0)), vec![0, 1]);
        ack(&mut s, at(10), AckSpec { cum: 2, ..ACK });
        assert_eq!(send(&mut s, at(10)), Vec::<u64>::new());
        assert_eq!(s.poll_timeout(), None, "no timer while the app is behind");
        s.handle_timeout(at(60_000));
        assert_eq!(s.state(), SenderState::Sending);
        s.set_available(at(60_000), 50);
        assert_eq!(send(&mut s, at(60_000)), vec![2, 3, 4]);
        // The idle clock starts again from when data was ready.
        assert_eq!(s.timer(Timer::Idle), Some(at(62_000)));
        s.handle_timeout(at(62_000));
        assert_eq!(s.state(), SenderState::Failed);
    }

    /// A path that carries nothing back for longer than `stall` (here
    /// 40 s of lost acks, `maxidle` set long for it) is `maxidle`'s
    /// to judge, not `stall`'s: the sender keeps retrying on its backed-off
    /// RTO and finishes once an ack gets through. `stall` is for a peer
    /// that answers and takes nothing (the proptest case in
    /// tests/properties.proptest-regressions, `cc 29a4975a`: five acks of
    /// the last segment lost in a row, stalled at 39.7 s).
    #[test]
    fn a_silent_path_is_for_maxidle_and_stall_waits_for_an_answer() {
        let t = Tuning {
            maxidle: Duration::from_secs(900),
            stall: Duration::from_secs(30),
            ..tuning(RecoveryKind::Sack)
        };
        let mut s = Sender::new(&t, CONN, Some(u64::from(PAYLOAD) * 3), Time::ZERO).unwrap();
        send(&mut s, at(0));
        ack(&mut s, at(50), AckSpec { cum: 2, ..ACK });
        let mut resends = 0;
        while let Some(due) = s.poll_timeout().filter(|&t| t <= at(40_000)) {
            s.handle_timeout(due);
            resends += send(&mut s, due).len();
            assert_eq!(s.state(), SenderState::Sending, "at {due:?}");
        }
        assert!(resends >= 5, "{resends} resends in 40 s");
        ack(&mut s, at(40_000), AckSpec { cum: 3, ..ACK });
        assert_eq!(s.state(), SenderState::Finished);
    }

    /// A peer that answers every 500 ms with the same cumulative ack and
    /// a shut window, for at most 120 s: the sender's state at the end,
    /// when that was (ms), and the acks it took.
    fn against_a_shut_window(stall: Duration) -> (Sender, u64, u32) {
        let t = Tuning {
            maxidle: Duration::from_secs(2),
            stall,
            ..tuning(RecoveryKind::Sack)
        };
        let mut s = sender(t);
        let shut = AckSpec {
            cum: 2,
            window: 0,
            ..ACK
        };
        send(&mut s, at(0));
        ack(&mut s, at(50), shut);
        let mut acks = 1;
        let mut ms = 50;
        while s.state() == SenderState::Sending && ms < 120_000 {
            ms += 500;
            s.handle_timeout(at(ms));
            send(&mut s, at(ms));
            if s.state() == SenderState::Sending {
                ack(&mut s, at(ms), shut);
                acks += 1;
            }
        }
        (s, ms, acks)
    }

    /// A peer that keeps answering but never takes a byte (its window
    /// shut for good, or acks for data it never keeps) holds off
    /// `maxidle`; the `stall` deadline ends the sender, counted from the
    /// first ack that took nothing, not from the last ack.
    #[test]
    fn acks_without_a_byte_delivered_end_the_sender_at_the_stall_deadline() {
        // Without the deadline (as before it existed), the acks hold
        // the sender for as long as the peer likes.
        let (s, ms, _) = against_a_shut_window(Duration::ZERO);
        assert_eq!((s.state(), ms), (SenderState::Sending, 120_050));
        let (s, ms, acks) = against_a_shut_window(Duration::from_secs(30));
        assert_eq!(s.state(), SenderState::Stalled);
        // The first timer call at or after 30 s past the first ack that
        // took nothing (550 ms; the one at 50 ms delivered two segments).
        assert_eq!(ms, 30_550);
        assert_eq!(acks, 61);
        assert_eq!(s.good_bytes(), 2 * u64::from(PAYLOAD));
    }
}
