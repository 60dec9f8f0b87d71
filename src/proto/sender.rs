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

use std::collections::VecDeque;
use std::time::Duration;

use super::events::{Event, TimedEvent, TraceRecord};
use super::payload::PayloadSource;
use super::recovery::{self, AckSummary, DupEvidence, Flow, Forced, Phase, Recovery, SenderStats};
use super::rtt::RttEstimator;
use super::time::{wire_elapsed, Time};
use super::tuning::{DropList, Tuning, TuningError};
use super::wire::{Ack, DataFlags, DataHeader, Packet, DATA_HEADER_LEN};
use super::InputError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SenderState {
    Sending,
    /// Everything sent was acknowledged and nothing is left to send.
    Finished,
    /// No ACK for `maxidle`.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// Retransmission timeout.
    Rto,
    /// `maxidle` without an ACK.
    Idle,
    /// Zero-window probe.
    Persist,
}

const TIMERS: [Timer; 3] = [Timer::Rto, Timer::Idle, Timer::Persist];

/// Window values and RTT figures at one instant, for summaries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SenderSnapshot {
    pub snd_una: u64,
    pub snd_nxt: u64,
    pub snd_max: u64,
    pub cwnd: u64,
    pub ssthresh: u64,
    pub rto: Duration,
    pub srtt: Duration,
    pub rttvar: Duration,
    pub minrtt: Duration,
    pub maxrtt: Duration,
    pub avgrtt: Duration,
    pub good_bytes: u64,
    /// From creation to the last ACK (or now, while running).
    pub elapsed: Duration,
}

#[derive(Debug)]
pub struct Sender {
    conn_id: u64,
    tuning: Tuning,
    droplist: DropList,
    flow: Flow,
    recovery: Box<dyn Recovery>,
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
    /// `cum_ack + window` of the latest ACK: new data must stay below it.
    peer_right_edge: u64,
    last_ack_at: Time,
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
            flow: Flow::new(tuning, now),
            recovery: recovery::for_kind(tuning),
            rtt: RttEstimator::new(tuning),
            timers: [None; TIMERS.len()],
            payload_size,
            stream_len,
            total_segments: stream_len.map(|n| n.div_ceil(payload_size)),
            send_deadline: (!tuning.maxtime.is_zero()).then(|| now + tuning.maxtime),
            // Until the peer speaks, assume the buffer we asked it for.
            available: None,
            app_limited: false,
            peer_right_edge: u64::from(tuning.rcvsegs),
            last_ack_at: now,
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
        &self.flow.stats
    }

    pub fn phase(&self) -> Phase {
        self.flow.phase
    }

    pub fn snapshot(&mut self, now: Time) -> SenderSnapshot {
        let end = self.finished_at.unwrap_or(now);
        SenderSnapshot {
            snd_una: self.flow.sb.una(),
            snd_nxt: self.flow.snd_nxt(),
            snd_max: self.flow.sb.max(),
            cwnd: self.flow.cwnd,
            ssthresh: self.flow.ssthresh,
            rto: self.rtt.rto(),
            srtt: self.rtt.srtt(),
            rttvar: self.rtt.rttvar(),
            minrtt: self.rtt.min(),
            maxrtt: self.rtt.max(),
            avgrtt: self.rtt.avg(),
            good_bytes: self.good_bytes(),
            elapsed: end.saturating_since(self.flow.start),
        }
    }

    /// Payload bytes the receiver has acknowledged.
    pub fn good_bytes(&self) -> u64 {
        let bytes = self.flow.sb.una().saturating_mul(self.payload_size);
        self.stream_len.map_or(bytes, |len| bytes.min(len))
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        self.timers.iter().flatten().min().copied()
    }

    pub fn poll_event(&mut self) -> Option<TimedEvent> {
        self.flow.events.pop_front()
    }

    pub fn poll_trace(&mut self) -> Option<TraceRecord> {
        self.trace.as_mut()?.pop_front()
    }

    fn advance(&mut self, now: Time) {
        // Time never runs backwards inside the sender, whatever the caller does.
        self.flow.now = self.flow.now.max(now);
    }

    fn since_start(&self) -> Duration {
        self.flow.now.saturating_since(self.flow.start)
    }

    fn set_timer(&mut self, t: Timer, at: Option<Time>) {
        self.timers[t as usize] = at;
    }

    fn timer(&self, t: Timer) -> Option<Time> {
        self.timers[t as usize]
    }

    fn arm_rto(&mut self) {
        let at = self.rtt.deadline(self.flow.now, self.rtt.rto());
        self.set_timer(Timer::Rto, Some(at));
    }

    fn arm_idle(&mut self) {
        let at = (!self.tuning.maxidle.is_zero()).then(|| self.last_ack_at + self.tuning.maxidle);
        self.set_timer(Timer::Idle, at);
    }

    /// Handles one datagram from the peer.
    pub fn handle_datagram(&mut self, now: Time, datagram: &[u8]) -> Result<(), InputError> {
        let result = match Packet::decode(datagram) {
            Err(e) => Err(InputError::Wire(e)),
            Ok(Packet::Ack(ack)) => return self.handle_ack(now, &ack),
            Ok(other) => Err(InputError::Unexpected(other.kind_name())),
        };
        self.advance(now);
        self.flow.stats.pkts_in += 1;
        self.flow.stats.bad_packets += 1;
        result
    }

    /// Handles one decoded ACK.
    pub fn handle_ack(&mut self, now: Time, ack: &Ack) -> Result<(), InputError> {
        self.advance(now);
        self.flow.stats.pkts_in += 1;
        if ack.conn_id != self.conn_id {
            self.flow.stats.bad_packets += 1;
            return Err(InputError::WrongConnection {
                expected: self.conn_id,
                got: ack.conn_id,
            });
        }
        self.on_ack(ack);
        Ok(())
    }

    fn on_ack(&mut self, ack: &Ack) {
        if self.state != SenderState::Sending {
            return;
        }
        self.burst = 0;
        let now = self.flow.now;
        let (una, max) = (self.flow.sb.una(), self.flow.sb.max());
        if ack.cum_ack < una || ack.cum_ack > max {
            // atou's badack: an ACK older than one already processed, or
            // one for data never sent.
            self.flow.stats.badacks += 1;
            let snd_nxt = self.flow.snd_nxt();
            self.flow.emit(Event::BadAck {
                ack: ack.cum_ack,
                snd_max: max,
                snd_nxt,
                snd_una: una,
            });
            return;
        }
        self.last_ack_at = now;
        self.arm_idle();

        let rtt = wire_elapsed(now.wire_micros(), ack.echo_timestamp);
        // An echo from the future or from before we started is not ours.
        let sample_ok = rtt <= self.since_start();
        if sample_ok {
            self.rtt.on_sample(now, rtt);
        }

        let right_edge = ack.cum_ack.saturating_add(u64::from(ack.window));
        let window_changed = right_edge != self.peer_right_edge;
        self.peer_right_edge = right_edge;

        let uses_sack = self.recovery.kind().uses_sack();
        let mut newly_sacked = 0;
        if uses_sack {
            for block in ack.sack_blocks() {
                newly_sacked += self.flow.sb.apply_sack(*block);
            }
        }
        if ack.dsack.is_some() {
            self.flow.stats.dsacks += 1;
        }
        let newly_acked = self.flow.sb.ack_through(ack.cum_ack);
        // RFC 2018 §8: a cumulative ACK that stops at a segment the receiver
        // SACKed means it threw SACKed data away; trust no SACK until new
        // ones arrive.
        if self.flow.sb.is_sacked(self.flow.sb.una()) {
            self.flow.sb.clear_sacks();
            self.flow.stats.reneges += 1;
        }
        // A retransmission queued for a segment this ACK covers is moot.
        if let Some(forced) = self.flow.force_retransmit {
            let seg = forced.seg();
            if seg < self.flow.sb.una() || self.flow.sb.is_sacked(seg) {
                self.flow.force_retransmit = None;
            }
        }
        self.flow.stats.maxack = self.flow.stats.maxack.max(newly_acked);
        let outstanding = self.flow.sb.outstanding();
        let is_dupack = newly_acked == 0
            && outstanding > 0
            && self.recovery.is_duplicate(&DupEvidence {
                newly_sacked,
                window_changed,
                dsack: ack.dsack.is_some(),
            });

        if newly_acked > 0 {
            self.flow.dupacks = 0;
            self.rtt.reset_backoff();
            // RFC 6298 §5.3 and §5.2.
            if outstanding > 0 {
                self.arm_rto();
            } else {
                self.set_timer(Timer::Rto, None);
            }
        }
        if is_dupack {
            self.flow.dupacks += 1;
            self.flow.stats.dups += 1;
        }
        if self.flow.phase == Phase::Loss && self.flow.recovery_point_acked() {
            self.flow.phase = Phase::Open;
        }

        let was_in_recovery = self.flow.phase == Phase::Recovery;
        let summary = AckSummary {
            newly_acked,
            is_dupack,
        };
        self.recovery.on_ack(&mut self.flow, &summary);

        if !was_in_recovery && self.flow.phase != Phase::Recovery && newly_acked > 0 {
            self.grow_cwnd(newly_acked);
        }
        if matches!(self.flow.phase, Phase::Open | Phase::Disorder) {
            self.flow.phase = if self.flow.dupacks > 0 || self.flow.sb.sacked() > 0 {
                Phase::Disorder
            } else {
                Phase::Open
            };
        }
        self.moderate_burst(newly_acked);

        if let Some(trace) = self.trace.as_mut() {
            trace.push_back(TraceRecord::Ack {
                time: now.saturating_since(self.flow.start),
                ack: ack.cum_ack,
                rtt: if sample_ok { rtt } else { Duration::ZERO },
                cwnd: self.flow.cwnd,
                ssthresh: self.flow.ssthresh,
            });
        }
        self.update_state(now);
    }

    /// Slow start and congestion avoidance (RFC 5681 §3.1), capped at the
    /// sender window since a cwnd that cannot be used is not validated.
    fn grow_cwnd(&mut self, newly_acked: u64) {
        let f = &mut self.flow;
        let cap = u64::from(self.tuning.rcvwin);
        if f.cwnd >= cap {
            return;
        }
        if f.cwnd < f.ssthresh {
            // RFC 3465 §2.2: appropriate byte counting with L = 2.
            f.cwnd += newly_acked.min(2);
        } else {
            // RFC 5681 eq. (3), tracked exactly: `increment` virtual segments
            // per window of ACKs. Per ACK, not per segment acknowledged, so
            // delayed ACKs halve the rate (Mathis footnote 2) and the window
            // never grows more than `increment` per RTT (Brakmo §3.3–3.4).
            f.cwnd_cnt += u64::from(self.tuning.increment) * f.vmss;
            while f.cwnd_cnt >= f.cwnd {
                f.cwnd_cnt -= f.cwnd;
                f.cwnd += 1;
            }
        }
        f.cwnd = f.cwnd.min(cap);
    }

    /// Brakmo §3.5: an ACK of three or more segments must not release a
    /// burst; cwnd comes down to what is in flight plus three and slow start
    /// takes it back to where it was (ssthresh remembers it).
    fn moderate_burst(&mut self, newly_acked: u64) {
        const MAX_BURST: u64 = 3;
        let f = &mut self.flow;
        if f.phase == Phase::Recovery || newly_acked < MAX_BURST {
            return;
        }
        let flight = f.sb.flight();
        if f.cwnd > flight + MAX_BURST {
            f.ssthresh = f.ssthresh.max(f.cwnd);
            f.cwnd = flight + MAX_BURST;
            f.cwnd_cnt = 0;
        }
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
                        self.flow.emit(Event::Idle { idle });
                        self.timers = [None; TIMERS.len()];
                        return;
                    }
                    Timer::Persist => self.persist_probe = true,
                }
            }
        }
        self.update_state(now);
    }

    fn on_rto(&mut self) {
        let f = &mut self.flow;
        if f.sb.outstanding() == 0 {
            return;
        }
        f.stats.timeouts += 1;
        // RFC 5681 §3.1 eq. (4); a repeated timeout of the same data keeps ssthresh.
        if self.rtt.backoff() == 0 {
            f.ssthresh = f.reduced_ssthresh();
        }
        // RFC 5681 §3.1: loss window of one (virtual, atou §4.1) segment.
        f.cwnd = f.vmss;
        f.cwnd_cnt = 0;
        f.dupacks = 0;
        f.recover = f.sb.max();
        f.phase = Phase::Loss;
        f.force_retransmit = None;
        f.sb.mark_all_lost();
        let event = Event::TimeoutRetransmit {
            seg: f.sb.una(),
            snd_nxt: f.sb.una(),
            snd_max: f.sb.max(),
            cwnd: f.cwnd,
            ssthresh: f.ssthresh,
        };
        f.emit(event);
        // RFC 6298 §5.5–5.6.
        self.rtt.back_off();
        self.arm_rto();
    }

    fn more_data(&self, seg: u64) -> bool {
        self.total_segments.is_none_or(|n| seg < n)
            && (self.tuning.maxpkts == 0 || seg < self.tuning.maxpkts)
            && self.send_deadline.is_none_or(|d| self.flow.now < d)
    }

    fn limited_transmit_allowance(&self) -> u64 {
        if self.tuning.limited_transmit && self.flow.phase == Phase::Disorder {
            // RFC 3042 sends on the first two duplicates; with a larger
            // dup_thresh, on each one below it (Sarolahti §5).
            u64::from(self.flow.dupacks).min(self.flow.dup_thresh.saturating_sub(1))
        } else {
            0
        }
    }

    fn window_open(&self) -> bool {
        let f = &self.flow;
        match f.phase {
            Phase::Recovery | Phase::Loss => f.sb.pipe() < f.cwnd,
            Phase::Open | Phase::Disorder => {
                f.sb.flight() < f.cwnd + self.limited_transmit_allowance()
            }
        }
    }

    fn may_send_new(&self) -> bool {
        let seg = self.flow.sb.max();
        self.more_data(seg)
            && self.data_ready(seg)
            && seg < self.flow.sb.una() + u64::from(self.tuning.rcvwin)
            && (seg < self.peer_right_edge || self.persist_probe)
    }

    /// Chooses the next segment to send, and whether it was forced.
    fn next_segment(&mut self) -> Option<(u64, Option<Forced>)> {
        if let Some(forced) = self.flow.force_retransmit.take() {
            let seg = forced.seg();
            debug_assert!(seg >= self.flow.sb.una() && !self.flow.sb.is_sacked(seg));
            return Some((seg, Some(forced)));
        }
        if !self.window_open() {
            return None;
        }
        if matches!(self.flow.phase, Phase::Recovery | Phase::Loss) {
            if let Some(seg) = self.flow.sb.next_lost_pending() {
                return Some((seg, None));
            }
        }
        if self.may_send_new() {
            return Some((self.flow.sb.max(), None));
        }
        if self.more_data(self.flow.sb.max()) {
            return None;
        }
        self.recovery
            .tail_retransmission(&self.flow)
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
            let (seg, forced) = self.next_segment()?;
            let is_new = seg == self.flow.sb.max();
            if is_new {
                self.persist_probe = false;
                self.flow.sb.on_send_new();
            } else {
                self.record_retransmission(seg, forced);
            }
            // Test bookkeeping: the property tests assert it stays zero.
            if cfg!(debug_assertions) && forced.is_none() && !self.sent_within_window(is_new) {
                self.window_violations += 1;
            }
            self.burst += 1;
            self.flow.stats.maxburst = self.flow.stats.maxburst.max(self.burst);
            self.flow.stats.pkts_out += 1;
            if let Some(trace) = self.trace.as_mut() {
                trace.push_back(TraceRecord::Xmt {
                    time: now.saturating_since(self.flow.start),
                    seg,
                });
            }
            // RFC 6298 §5.1; and a forced retransmission restarts the timer
            // so it is not pre-empted by a timeout armed a round trip
            // earlier (Linux, Sarolahti §4.1; RFC 6582 §3.2 step 5).
            if self.timer(Timer::Rto).is_none() || forced.is_some() {
                self.arm_rto();
            }
            self.set_timer(Timer::Persist, None);
            if self.droplist.consume(seg) {
                // Scripted loss: sent as far as the protocol knows, but it
                // never reaches the wire.
                self.flow.stats.dropped += 1;
                continue;
            }
            let len = self.write_segment(seg, !is_new, buf, source);
            self.flow.stats.bytes_out += len as u64;
            return Some(len);
        }
    }

    fn record_retransmission(&mut self, seg: u64, forced: Option<Forced>) {
        self.flow.sb.on_retransmit(seg);
        self.flow.stats.rxmts += 1;
        let is_fast_retransmit = matches!(forced, Some(Forced::FastRetransmit(_)));
        if self.flow.phase == Phase::Recovery && !is_fast_retransmit {
            self.flow.stats.packs += 1;
            let f = &mut self.flow;
            let event = Event::RecoveryRetransmit {
                seg,
                snd_nxt: f.snd_nxt(),
                snd_max: f.sb.max(),
                cwnd: f.cwnd,
                ssthresh: f.ssthresh,
                recover: f.recover,
                snd_una: f.sb.una(),
            };
            f.emit(event);
        }
    }

    /// Re-checks, after the fact, that an unforced transmission fitted the
    /// windows: the property tests assert no violation is ever counted.
    fn sent_within_window(&self, is_new: bool) -> bool {
        let f = &self.flow;
        let cwnd_ok = match f.phase {
            Phase::Recovery | Phase::Loss => f.sb.pipe() <= f.cwnd,
            Phase::Open | Phase::Disorder => {
                f.sb.flight() <= f.cwnd + self.limited_transmit_allowance()
            }
        };
        let rcvwin_ok = f.sb.outstanding() <= u64::from(self.tuning.rcvwin);
        let peer_ok = !is_new || f.sb.max() <= self.peer_right_edge + 1;
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
            offset,
            timestamp: self.flow.now.wire_micros(),
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
        let f = &self.flow;
        if f.sb.outstanding() == 0 && !self.more_data(f.sb.max()) {
            self.state = SenderState::Finished;
            self.finished_at = Some(now);
            self.timers = [None; TIMERS.len()];
            return;
        }
        if f.sb.outstanding() == 0 && !self.data_ready(f.sb.max()) {
            self.app_limited = true;
            self.set_timer(Timer::Idle, None);
            self.set_timer(Timer::Persist, None);
            return;
        }
        if self.app_limited {
            // The peer's silence counts again from now.
            self.app_limited = false;
            self.last_ack_at = self.last_ack_at.max(now);
            self.arm_idle();
        }
        let f = &self.flow;
        // Persist: nothing in flight, data to send, but the peer's window is
        // shut. Probe after an RTO so a lost window update cannot deadlock.
        let blocked = f.sb.outstanding() == 0 && !self.may_send_new() && self.more_data(f.sb.max());
        if blocked && self.timer(Timer::Persist).is_none() && !self.persist_probe {
            let at = self.rtt.deadline(now, self.rtt.rto());
            self.set_timer(Timer::Persist, Some(at));
        }
    }

    /// Checks the sender's invariants; O(window), for tests.
    pub fn check_invariants(&mut self) -> Result<(), String> {
        self.flow.sb.check_invariants()?;
        let (una, max) = (self.flow.sb.una(), self.flow.sb.max());
        let nxt = self.flow.snd_nxt();
        if !(una <= nxt && nxt <= max) {
            return Err(format!(
                "snd_una {una} <= snd_nxt {nxt} <= snd_max {max} fails"
            ));
        }
        if self.flow.cwnd < 1 {
            return Err("cwnd below one segment".into());
        }
        if max - una > u64::from(self.tuning.rcvwin) {
            return Err(format!(
                "{} segments outstanding, rcvwin {}",
                max - una,
                self.tuning.rcvwin
            ));
        }
        if self.window_violations > 0 {
            return Err(format!(
                "{} transmissions outside the window",
                self.window_violations
            ));
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
    use crate::proto::tuning::RecoveryKind;
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
        ack(
            &mut s,
            at(20),
            AckSpec {
                cum: 6,
                sack: &[(7, 8)],
                ..ACK
            },
        );
        ack(
            &mut s,
            at(21),
            AckSpec {
                cum: 6,
                sack: &[(9, 10), (7, 8)],
                ..ACK
            },
        );
        ack(
            &mut s,
            at(22),
            AckSpec {
                cum: 6,
                sack: &[(9, 11), (7, 8)],
                ..ACK
            },
        );
        assert_eq!(send(&mut s, at(22)), vec![6], "the fast retransmit");
        let snap = s.snapshot(at(22));
        assert_eq!((snap.cwnd, snap.ssthresh), (5, 5));
        // pipe = 10 outstanding - 3 SACKed - 1 lost (6) + 1 resent = 7 > 5.
        assert!(send(&mut s, at(22)).is_empty());
        // Now 7 SACKed, so 8 has three above it and is lost too:
        // pipe = 10 - 7 - 2 + 1 = 2, room for three.
        ack(
            &mut s,
            at(23),
            AckSpec {
                cum: 6,
                sack: &[(9, 15), (7, 8)],
                ..ACK
            },
        );
        assert_eq!(
            send(&mut s, at(23)),
            vec![8, 16, 17],
            "NextSeg rules 1 then 2"
        );
    }

    /// FACK: every un-SACKed segment below the highest SACK is lost once
    /// recovery starts, which it does as soon as that SACK is more than
    /// dup_thresh beyond snd_una.
    #[test]
    fn fack_starts_on_distance_and_marks_all_holes() {
        let mut s = sender(tuning(RecoveryKind::Fack));
        fill(&mut s, 16);
        // 6, 7, 8 lost; one SACK for 9 and 10 puts snd.fack at 11 > 6 + 3.
        ack(
            &mut s,
            at(20),
            AckSpec {
                cum: 6,
                sack: &[(9, 11)],
                ..ACK
            },
        );
        assert_eq!(s.phase(), Phase::Recovery);
        assert_eq!(s.stats().dups, 1);
        let sent = send(&mut s, at(20));
        assert_eq!(sent.first(), Some(&6));
        ack(
            &mut s,
            at(21),
            AckSpec {
                cum: 6,
                sack: &[(9, 15)],
                ..ACK
            },
        );
        ack(
            &mut s,
            at(22),
            AckSpec {
                cum: 6,
                sack: &[(9, 19)],
                ..ACK
            },
        );
        assert_eq!(send(&mut s, at(22))[..2], [7, 8]);
    }

    /// RFC 2018 §8: SACKs are advisory. A receiver that SACKs a segment and
    /// then stops its cumulative ACK there has reneged: the sender forgets
    /// its SACKs and fast-retransmits the first unacknowledged segment.
    #[test]
    fn a_reneging_receiver_makes_the_sender_forget_its_sacks() {
        let mut s = sender(tuning(RecoveryKind::Sack));
        send(&mut s, at(0));
        ack(
            &mut s,
            at(1),
            AckSpec {
                cum: 0,
                sack: &[(2, 4)],
                ..ACK
            },
        );
        ack(&mut s, at(2), AckSpec { cum: 2, ..ACK });
        assert_eq!(s.stats().reneges, 1);
        assert_eq!(send(&mut s, at(2)), vec![4, 5, 6, 7]);
        // Three duplicates with new SACKs: limited transmit twice, then the
        // fast retransmit of segment 2, which was SACKed and then reneged.
        let mut sent = Vec::new();
        for t in 3..6 {
            ack(
                &mut s,
                at(t),
                AckSpec {
                    cum: 2,
                    sack: &[(3, t + 1)],
                    ..ACK
                },
            );
            sent.push(send(&mut s, at(t)));
        }
        assert_eq!(sent, vec![vec![8], vec![9], vec![2]]);
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
}
