//! The receiving side of a connection, driven from outside.
//!
//! Feed it with [`Receiver::handle_datagram`] and [`Receiver::handle_timeout`],
//! take data with [`Receiver::read`], send what [`Receiver::poll_transmit`]
//! returns, sleep until [`Receiver::poll_timeout`].
//!
//! ACK policy:
//! - cumulative ACK = next segment expected;
//! - with SACK, up to four blocks, the one holding the newest segment first,
//!   then the most recently reported others (RFC 2018 §4); never an empty
//!   block (atou §4.4); with or without SACK, a D-SACK block for a
//!   duplicate (RFC 2883);
//! - delayed ACK counted in segments: at least every second segment,
//!   whatever its size (Brakmo §3.3), else after `delack`; immediately for a
//!   segment out of order, a duplicate, or one that fills a hole;
//! - quick ACKs (Sarolahti & Kuznetsov §3, Linux's tcp_incr_quickack): the
//!   first `quickack` segments, at most half the window's, are ACKed one by
//!   one, and again after [`QUICKACK_IDLE`] without data, so that a
//!   sender's slow start is not held back by delayed ACKs;
//! - window = free buffer: `rcvsegs` minus what arrived in order but has not
//!   been read; out-of-order data sits inside the window, so duplicate ACKs
//!   keep the same right edge, as TCP's do.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::proto::time::Time;
use crate::proto::tuning::Tuning;
use crate::proto::wire::{Ack, DataSegment, Packet, ReceiverStats, SackBlock, ACK_MAX_LEN};
use crate::proto::InputError;

/// No data for this long starts quick ACKs again (Linux: longer than its
/// RTO). The receiver has no RTT estimate of its own, so RFC 6298's
/// initial RTO stands in: long enough that the gaps between a slow
/// start's flights do not count as idle.
pub(crate) const QUICKACK_IDLE: Duration = Duration::from_secs(1);

/// How many recently received out-of-order segments are remembered for
/// choosing which SACK blocks to repeat.
const RECENT_SACKS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    pub sack: bool,
    pub delack: Duration,
    pub rcvsegs: u32,
    /// Quick ACKs at the start and after idle; 0 never.
    pub quickack: u32,
}

impl ReceiverConfig {
    pub fn from_tuning(t: &Tuning) -> ReceiverConfig {
        ReceiverConfig {
            sack: t.recovery.uses_sack(),
            delack: t.delack,
            rcvsegs: t.rcvsegs,
            quickack: t.quickack,
        }
    }

    /// Linux's bound: quick ACKs for at most half the segments the
    /// advertised window holds, so they cannot make the sender send
    /// silly small segments (Sarolahti §3).
    fn quickacks(&self) -> u32 {
        self.quickack.min(self.rcvsegs / 2)
    }
}

/// A segment's payload accepted for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewData<'a> {
    /// Its segment number: the payload starts at `seg × payload size`.
    pub seg: u64,
    pub payload: &'a [u8],
}

/// What becomes of accepted payloads, and so what frees the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Kept until [`Receiver::read`] takes them in order.
    Hold,
    /// Counted and forgotten: the window never closes.
    Sink,
    /// Handed out by [`Receiver::handle_segment`] for the application to
    /// place; the window opens as it calls [`Receiver::release`].
    Place,
}

#[derive(Debug)]
pub struct Receiver {
    conn_id: u64,
    config: ReceiverConfig,
    /// Next segment expected (the cumulative ACK).
    rcv_nxt: u64,
    /// Next segment the application will read.
    read_nxt: u64,
    /// Segments held, in order or not, keyed by number.
    held: BTreeMap<u64, Vec<u8>>,
    /// Out-of-order ranges above `rcv_nxt`, `start -> end`.
    ooo: BTreeMap<u64, u64>,
    /// Recently received out-of-order segments, newest first.
    recent: VecDeque<u64>,
    /// Segments received in order since the last ACK.
    unacked: u32,
    ack_pending: bool,
    delack_at: Option<Time>,
    /// Quick ACKs left before delayed ACKs apply.
    quick_left: u32,
    /// When data last arrived, to tell an idle period.
    last_data: Option<Time>,
    dsack: Option<SackBlock>,
    echo: u32,
    mode: Mode,
    /// Segment number after the FIN segment, once seen.
    end: Option<u64>,
    /// Window advertised in the last ACK, for window updates.
    last_window: u32,
    stats: ReceiverStats,
}

impl Receiver {
    pub fn new(config: ReceiverConfig, conn_id: u64) -> Receiver {
        Receiver {
            conn_id,
            config,
            rcv_nxt: 0,
            read_nxt: 0,
            held: BTreeMap::new(),
            ooo: BTreeMap::new(),
            recent: VecDeque::new(),
            unacked: 0,
            ack_pending: false,
            delack_at: None,
            quick_left: 0,
            last_data: None,
            dsack: None,
            echo: 0,
            mode: Mode::Hold,
            end: None,
            last_window: config.rcvsegs,
            stats: ReceiverStats::default(),
        }
    }

    /// A receiver that keeps no data: each payload is returned once by
    /// [`Receiver::handle_segment`] and is read the moment it is in order,
    /// so the window stays fully open (atousrv's memory-to-memory sink).
    pub fn sink(config: ReceiverConfig, conn_id: u64) -> Receiver {
        Receiver {
            mode: Mode::Sink,
            ..Receiver::new(config, conn_id)
        }
    }

    /// A receiver that keeps no data and leaves the window to its caller:
    /// each new payload is returned once by [`Receiver::handle_segment`],
    /// in whatever order it arrives, for the caller to place (at its
    /// segment number times the payload size); the window is `rcvsegs`
    /// beyond the point the caller last passed to [`Receiver::release`].
    /// This is how a slow disk throttles the sender instead of causing
    /// loss.
    pub fn placing(config: ReceiverConfig, conn_id: u64) -> Receiver {
        Receiver {
            mode: Mode::Place,
            ..Receiver::new(config, conn_id)
        }
    }

    pub fn stats(&self) -> &ReceiverStats {
        &self.stats
    }

    /// The cumulative ACK: every segment below it has arrived.
    pub fn rcv_nxt(&self) -> u64 {
        self.rcv_nxt
    }

    /// All data up to the FIN segment has arrived.
    pub fn is_complete(&self) -> bool {
        self.end.is_some_and(|end| self.rcv_nxt >= end)
    }

    /// Free buffer, in segments, measured from the cumulative ACK.
    pub fn window(&self) -> u32 {
        let in_order_unread = self.rcv_nxt - self.read_nxt;
        u32::try_from(u64::from(self.config.rcvsegs).saturating_sub(in_order_unread)).unwrap_or(0)
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        self.delack_at
    }

    pub fn handle_timeout(&mut self, now: Time) {
        if self.delack_at.is_some_and(|at| at <= now) {
            self.delack_at = None;
            self.ack_pending = true;
        }
    }

    /// Handles one datagram. Nothing changes unless it is a valid data
    /// segment of this connection.
    pub fn handle_datagram<'a>(
        &mut self,
        now: Time,
        datagram: &'a [u8],
    ) -> Result<Option<NewData<'a>>, InputError> {
        match Packet::decode(datagram) {
            Ok(Packet::Data(seg)) => self.handle_segment(now, &seg),
            Err(e) => {
                self.stats.bad_packets += 1;
                Err(InputError::Wire(e))
            }
            Ok(other) => {
                self.stats.bad_packets += 1;
                Err(InputError::Unexpected(other.kind_name()))
            }
        }
    }

    /// Handles one decoded data segment; returns its payload when it was
    /// new and accepted (for callers that check or store data as it comes).
    pub fn handle_segment<'a>(
        &mut self,
        now: Time,
        seg: &DataSegment<'a>,
    ) -> Result<Option<NewData<'a>>, InputError> {
        if seg.header.conn_id != self.conn_id {
            self.stats.bad_packets += 1;
            return Err(InputError::WrongConnection {
                expected: self.conn_id,
                got: seg.header.conn_id,
            });
        }
        Ok(self.on_segment(now, seg).then_some(NewData {
            seg: seg.header.seg,
            payload: seg.payload,
        }))
    }

    fn is_held_out_of_order(&self, n: u64) -> bool {
        self.ooo
            .range(..=n)
            .next_back()
            .is_some_and(|(_, &end)| n < end)
    }

    /// Returns true when the segment was new and accepted.
    fn on_segment(&mut self, now: Time, seg: &DataSegment<'_>) -> bool {
        let n = seg.header.seg;
        self.echo = seg.header.timestamp;
        // Linux's tcp_event_data_recv: quick ACKs at the first data and
        // after an idle period.
        if self
            .last_data
            .is_none_or(|t| now.saturating_since(t) > QUICKACK_IDLE)
        {
            self.quick_left = self.config.quickacks();
        }
        self.last_data = Some(now);
        if n < self.rcv_nxt || self.is_held_out_of_order(n) {
            // RFC 2883: report the duplicate at once.
            self.stats.duplicates += 1;
            self.dsack = SackBlock::new(n, n + 1);
            self.ack_pending = true;
            return false;
        }
        if n >= self.read_nxt + u64::from(self.config.rcvsegs) {
            self.stats.beyond_window += 1;
            self.ack_pending = true;
            return false;
        }
        if seg.header.flags.fin {
            self.end = Some(n + 1);
        }
        self.stats.segments += 1;
        self.stats.bytes += seg.payload.len() as u64;
        if self.mode == Mode::Hold {
            self.held.insert(n, seg.payload.to_vec());
        }
        if n == self.rcv_nxt {
            let had_holes = !self.ooo.is_empty();
            self.rcv_nxt += 1;
            // Absorb the out-of-order range that now joins up.
            if let Some(end) = self.ooo.remove(&self.rcv_nxt) {
                self.rcv_nxt = end;
            }
            if self.mode == Mode::Sink {
                // Nothing is kept, so everything in order counts as read.
                self.read_nxt = self.rcv_nxt;
            }
            if had_holes {
                // Filled a hole: ACK at once so recovery sees it.
                self.ack_pending = true;
            } else {
                self.unacked += 1;
                let quick = self.quick_left > 0;
                self.quick_left = self.quick_left.saturating_sub(1);
                if quick || self.config.delack.is_zero() || self.unacked >= 2 {
                    self.ack_pending = true;
                } else if self.delack_at.is_none() {
                    self.delack_at = Some(now + self.config.delack);
                }
            }
        } else {
            self.stats.out_of_order += 1;
            self.insert_ooo(n);
            self.recent.retain(|&s| s != n);
            self.recent.push_front(n);
            self.recent.truncate(RECENT_SACKS);
            self.ack_pending = true;
        }
        if self.is_complete() {
            self.ack_pending = true;
        }
        true
    }

    fn insert_ooo(&mut self, n: u64) {
        let mut start = n;
        let mut end = n + 1;
        if let Some((&s, &e)) = self.ooo.range(..=n).next_back() {
            if e == n {
                start = s;
                self.ooo.remove(&s);
            }
        }
        if let Some(e) = self.ooo.remove(&end) {
            end = e;
        }
        self.ooo.insert(start, end);
    }

    /// The next in-order segment: its number and payload.
    pub fn read(&mut self) -> Option<(u64, Vec<u8>)> {
        if self.read_nxt >= self.rcv_nxt {
            return None;
        }
        let seg = self.read_nxt;
        let data = self.held.remove(&seg)?;
        self.read_nxt += 1;
        self.after_read();
        Some((seg, data))
    }

    /// For a [`Receiver::placing`] receiver: the caller is done with every
    /// segment below `seg`, so the window may reach `seg + rcvsegs`. Never
    /// moves back, nor past the cumulative ACK.
    pub fn release(&mut self, seg: u64) {
        debug_assert_eq!(self.mode, Mode::Place);
        let seg = seg.min(self.rcv_nxt);
        if seg > self.read_nxt {
            self.read_nxt = seg;
            self.after_read();
        }
    }

    fn after_read(&mut self) {
        // Tell a sender stalled on a small window that it has opened (a
        // window update, RFC 1122 §4.2.3.3: once half the buffer is free).
        let half = (self.config.rcvsegs / 2).max(1);
        if self.last_window < half && self.window() >= half {
            self.ack_pending = true;
        }
    }

    /// Writes an ACK into `buf` (at least [`ACK_MAX_LEN`] bytes) if one is due.
    pub fn poll_transmit(&mut self, _now: Time, buf: &mut [u8]) -> Option<usize> {
        if !self.ack_pending {
            return None;
        }
        let window = self.window();
        let mut ack = Ack::new(self.conn_id, self.echo, self.rcv_nxt, window);
        // D-SACK whether or not SACK blocks are on: it costs 12 bytes, only
        // on ACKs a duplicate triggered, and lets the sender tell those
        // ACKs from evidence of loss.
        ack.dsack = self.dsack;
        if self.config.sack {
            self.recent.retain(|&s| s >= self.rcv_nxt);
            for &seg in &self.recent {
                let Some((&s, &e)) = self.ooo.range(..=seg).next_back() else {
                    continue;
                };
                let block = SackBlock { start: s, end: e };
                if e > seg && !ack.sack_blocks().contains(&block) && !ack.push_sack(block) {
                    break;
                }
            }
        }
        debug_assert!(buf.len() >= ACK_MAX_LEN);
        let n = ack.emit(buf).ok()?;
        self.ack_pending = false;
        self.dsack = None;
        self.unacked = 0;
        self.delack_at = None;
        self.last_window = window;
        self.stats.acks += 1;
        Some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::wire::{DataFlags, DataHeader, DATA_HEADER_LEN};

    fn config(delack_ms: u64) -> ReceiverConfig {
        ReceiverConfig {
            sack: true,
            delack: Duration::from_millis(delack_ms),
            rcvsegs: 64,
            quickack: 0,
        }
    }

    fn data(seg: u64) -> Vec<u8> {
        let mut buf = vec![0u8; DATA_HEADER_LEN + 4];
        DataHeader {
            conn_id: 1,
            seg,
            timestamp: seg as u32,
            flags: DataFlags::default(),
        }
        .emit(&mut buf)
        .unwrap();
        buf
    }

    #[track_caller]
    fn send(r: &mut Receiver, seg: u64) {
        r.handle_datagram(Time::ZERO, &data(seg)).unwrap();
    }

    #[track_caller]
    fn recv_ack(r: &mut Receiver) -> Ack {
        let mut buf = [0u8; ACK_MAX_LEN];
        let n = r.poll_transmit(Time::ZERO, &mut buf).expect("an ACK");
        match Packet::decode(&buf[..n]).unwrap() {
            Packet::Ack(a) => a,
            other => panic!("{} packet from a receiver", other.kind_name()),
        }
    }

    #[track_caller]
    fn recv_nothing(r: &mut Receiver) {
        let mut buf = [0u8; ACK_MAX_LEN];
        assert_eq!(r.poll_transmit(Time::ZERO, &mut buf), None);
    }

    fn blocks(a: &Ack) -> Vec<(u64, u64)> {
        a.sack_blocks().iter().map(|b| (b.start, b.end)).collect()
    }

    /// Sarolahti §3: the first `quickack` segments (at most half the
    /// window's) are ACKed one by one, then every second; an idle period
    /// of over [`QUICKACK_IDLE`] starts quick ACKs again.
    #[test]
    fn quick_acks_at_the_start_and_after_idle_then_delayed() {
        let mut r = Receiver::new(
            ReceiverConfig {
                quickack: 3,
                ..config(200)
            },
            1,
        );
        for seg in 0..3 {
            send(&mut r, seg);
            assert_eq!(recv_ack(&mut r).cum_ack, seg + 1, "quick ACK {seg}");
        }
        send(&mut r, 3);
        recv_nothing(&mut r);
        send(&mut r, 4);
        assert_eq!(recv_ack(&mut r).cum_ack, 5, "every second segment");
        let later = Time::ZERO + QUICKACK_IDLE + Duration::from_millis(1);
        r.handle_datagram(later, &data(5)).unwrap();
        assert_eq!(recv_ack(&mut r).cum_ack, 6, "quick again after idle");
        // Half a 4-segment window: two quick ACKs however many are asked.
        let mut small = Receiver::new(
            ReceiverConfig {
                quickack: 16,
                rcvsegs: 4,
                ..config(200)
            },
            1,
        );
        send(&mut small, 0);
        recv_ack(&mut small);
        send(&mut small, 1);
        recv_ack(&mut small);
        send(&mut small, 2);
        recv_nothing(&mut small);
    }

    #[test]
    fn acks_every_segment_without_delack() {
        let mut r = Receiver::new(config(0), 1);
        send(&mut r, 0);
        assert_eq!(recv_ack(&mut r).cum_ack, 1);
        send(&mut r, 1);
        assert_eq!(recv_ack(&mut r).cum_ack, 2);
    }

    #[test]
    fn delayed_ack_every_second_segment_or_on_timer() {
        // Brakmo §3.3: every second segment whatever its size.
        let mut r = Receiver::new(config(200), 1);
        send(&mut r, 0);
        recv_nothing(&mut r);
        assert_eq!(
            r.poll_timeout(),
            Some(Time::ZERO + Duration::from_millis(200))
        );
        send(&mut r, 1);
        assert_eq!(recv_ack(&mut r).cum_ack, 2);
        assert_eq!(r.poll_timeout(), None);
        send(&mut r, 2);
        recv_nothing(&mut r);
        r.handle_timeout(Time::ZERO + Duration::from_millis(200));
        let a = recv_ack(&mut r);
        assert_eq!((a.cum_ack, a.echo_timestamp), (3, 2));
    }

    #[test]
    fn out_of_order_and_hole_filling_are_acked_at_once() {
        let mut r = Receiver::new(config(200), 1);
        send(&mut r, 0);
        send(&mut r, 2);
        let a = recv_ack(&mut r);
        assert_eq!((a.cum_ack, blocks(&a)), (1, vec![(2, 3)]));
        send(&mut r, 1);
        let a = recv_ack(&mut r);
        assert_eq!((a.cum_ack, blocks(&a)), (3, vec![]));
        assert_eq!(r.stats().out_of_order, 1);
    }

    #[test]
    fn sack_blocks_in_rfc2018_order() {
        let mut r = Receiver::new(config(0), 1);
        for s in [2, 4, 6, 8, 10] {
            send(&mut r, s);
            recv_ack(&mut r);
        }
        send(&mut r, 5);
        let a = recv_ack(&mut r);
        // Newest block first, then the most recently reported others.
        assert_eq!(blocks(&a), vec![(4, 7), (10, 11), (8, 9), (2, 3)]);
        assert!(a.dsack.is_none());
    }

    #[test]
    fn duplicates_get_a_dsack() {
        let mut r = Receiver::new(config(200), 1);
        send(&mut r, 0);
        send(&mut r, 1);
        recv_ack(&mut r);
        send(&mut r, 0);
        let a = recv_ack(&mut r);
        assert_eq!(a.dsack, SackBlock::new(0, 1));
        assert_eq!(r.stats().duplicates, 1);
        send(&mut r, 5);
        send(&mut r, 5);
        let a = recv_ack(&mut r);
        assert_eq!(a.dsack, SackBlock::new(5, 6));
        assert_eq!(blocks(&a), vec![(5, 6)]);
    }

    #[test]
    fn window_is_free_buffer_and_beyond_is_dropped() {
        let mut r = Receiver::new(
            ReceiverConfig {
                sack: false,
                delack: Duration::ZERO,
                rcvsegs: 4,
                quickack: 0,
            },
            1,
        );
        for s in 0..3 {
            send(&mut r, s);
        }
        assert_eq!(recv_ack(&mut r).window, 1);
        send(&mut r, 9);
        assert_eq!(r.stats().beyond_window, 1);
        assert!(r.read().is_some());
        assert!(r.read().is_some());
        assert_eq!(r.window(), 3);
        // Half the buffer came free: a window update goes out.
        assert_eq!(recv_ack(&mut r).window, 3);
        let a = recv_ack_if_any(&mut r);
        assert!(a.is_none());
    }

    fn recv_ack_if_any(r: &mut Receiver) -> Option<Ack> {
        let mut buf = [0u8; ACK_MAX_LEN];
        let n = r.poll_transmit(Time::ZERO, &mut buf)?;
        match Packet::decode(&buf[..n]).ok()? {
            Packet::Ack(a) => Some(a),
            _ => None,
        }
    }

    #[test]
    fn garbage_changes_nothing() {
        let mut r = Receiver::new(config(0), 1);
        assert!(r.handle_datagram(Time::ZERO, b"garbage").is_err());
        let mut other = data(0);
        other[11] = 9; // another connection id
        assert!(r.handle_datagram(Time::ZERO, &other).is_err());
        recv_nothing(&mut r);
        assert_eq!(r.stats().bad_packets, 2);
        assert_eq!(r.rcv_nxt(), 0);
    }

    #[test]
    fn a_placing_receiver_hands_out_data_and_opens_the_window_on_release() {
        let mut r = Receiver::placing(
            ReceiverConfig {
                sack: true,
                delack: Duration::ZERO,
                rcvsegs: 4,
                quickack: 0,
            },
            1,
        );
        // Out of order first: handed out at once, with its number.
        let d = data(1);
        let got = r.handle_datagram(Time::ZERO, &d).unwrap().unwrap();
        assert_eq!(got.seg, 1);
        let d = data(0);
        assert!(r.handle_datagram(Time::ZERO, &d).unwrap().is_some());
        send(&mut r, 2);
        send(&mut r, 3);
        assert_eq!(r.window(), 0);
        assert_eq!(r.read(), None, "nothing is held");
        send(&mut r, 4);
        assert_eq!(r.stats().beyond_window, 1);
        while recv_ack_if_any(&mut r).is_some() {}
        r.release(2);
        assert_eq!(r.window(), 2);
        assert_eq!(recv_ack(&mut r).window, 2, "window update");
        // Never back, never past the cumulative ACK.
        r.release(1);
        r.release(99);
        assert_eq!(r.window(), 4);
    }
}
