//! The sender's scoreboard: what is known of every segment in
//! `[snd_una, snd_max)`.
//!
//! Each segment may be SACKed, marked lost, and have a retransmission in
//! flight. Counters kept up to date on every change give RFC 6675's `pipe`
//! in constant time:
//!
//! `pipe = outstanding - sacked - lost + retransmitted`
//!
//! which counts a segment neither SACKed nor lost once, a lost one whose
//! retransmission is in flight once, a lost one not yet resent zero times,
//! and a non-lost one that was resent twice (RFC 6675 §4, SetPipe).
//! Marking is idempotent and cursors make it amortised O(1) per segment.
//!
//! Each segment also keeps the delivery-rate stamp of its latest
//! transmission (send time, delivered count, app-limited flag:
//! [`SendStamp`]). When a SACK or cumulative ACK first reports it
//! delivered, the stamp moves to a queue the sender drains with
//! [`Scoreboard::take_delivered`], so each delivery is counted once.
//!
//! For time-based loss detection (RACK, RFC 8985) each segment also keeps
//! the time of its latest transmission, and the segments in flight (sent,
//! neither SACKed nor awaiting retransmission) are kept ordered by that
//! time, RFC 8985 §8's time-ordered list: [`Scoreboard::in_flight_by_xmit`].
//! Each delivery is also recorded as a [`Delivery`] for the ACK being
//! processed ([`Scoreboard::deliveries`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::proto::congestion::delivery_rate::SendStamp;
use crate::proto::time::Time;
use crate::proto::wire::SackBlock;

use thiserror::Error;

/// An invariant of the [`Scoreboard`] found broken: a bug, reported by
/// [`Scoreboard::check_invariants`] to tests and property checks.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScoreboardInvariant {
    #[error("segment {0}: sacked flag disagrees with ranges")]
    SackedFlag(u64),
    #[error("segment {0}: time-ordered list disagrees")]
    TimeOrder(u64),
    #[error("lost segment {0} below the retransmit cursor")]
    LostBelowCursor(u64),
    /// Each `(sacked, lost, retransmitted, lost and not yet resent)`.
    #[error("counters {counted:?} != recount {recount:?}")]
    Counters {
        counted: (u64, u64, u64, u64),
        recount: (u64, u64, u64, u64),
    },
    #[error("time-ordered list holds segments not in flight")]
    NotInFlight,
    #[error("bad SACK range {start}..{end}")]
    BadSackRange { start: u64, end: u64 },
}

/// A segment an ACK reported delivered for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub seg: u64,
    /// When its latest transmission left.
    pub xmit: Time,
    /// It was sent more than once, so which copy arrived is ambiguous.
    pub retransmitted: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Seg {
    sacked: bool,
    lost: bool,
    /// A retransmission is in flight (cleared when presumed lost again).
    retx: bool,
    /// The latest transmission's stamp, until the segment is delivered.
    stamp: Option<SendStamp>,
    /// When the latest transmission left.
    xmit: Time,
    /// Sent more than once.
    retransmitted: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Scoreboard {
    una: u64,
    segs: VecDeque<Seg>,
    /// Disjoint, non-adjacent SACKed ranges `start -> end`, all at or above `una`.
    sacked_ranges: BTreeMap<u64, u64>,
    n_sacked: u64,
    /// Lost and not SACKed.
    n_lost: u64,
    /// Retransmission in flight and not SACKed.
    n_retx: u64,
    /// Lost, not SACKed, not yet retransmitted: what awaits retransmission.
    n_lost_pending: u64,
    /// Every un-SACKed segment below it has been through `mark_lost_below`.
    loss_frontier: u64,
    /// No lost-pending segment lies below it.
    retx_cursor: u64,
    /// Segments ever marked lost (each marking counts).
    lost_total: u64,
    /// Stamps of segments delivered since the last `take_delivered`.
    delivered: Vec<SendStamp>,
    /// `(xmit, seg)` of every segment in flight: not SACKed, and not
    /// marked lost unless its retransmission is out.
    by_xmit: BTreeSet<(Time, u64)>,
    /// Segments delivered since the last `clear_deliveries`.
    deliveries: Vec<Delivery>,
}

impl Scoreboard {
    pub(crate) fn una(&self) -> u64 {
        self.una
    }

    /// One past the highest segment sent.
    pub(crate) fn max(&self) -> u64 {
        self.una + self.segs.len() as u64
    }

    pub(crate) fn outstanding(&self) -> u64 {
        self.segs.len() as u64
    }

    pub(crate) fn sacked(&self) -> u64 {
        self.n_sacked
    }

    /// Retransmissions in flight.
    pub(crate) fn retransmissions_in_flight(&self) -> u64 {
        self.n_retx
    }

    pub(crate) fn lost_pending(&self) -> u64 {
        self.n_lost_pending
    }

    /// RFC 6675 §4 SetPipe, in segments.
    pub(crate) fn pipe(&self) -> u64 {
        self.outstanding() - self.n_sacked - self.n_lost + self.n_retx
    }

    /// Segments sent and not known to have left the network by ACK or by a
    /// loss not yet repaired: BSD's `snd_nxt - snd_una`. SACKed segments
    /// count, as RFC 5681's FlightSize does.
    pub(crate) fn flight(&self) -> u64 {
        self.outstanding() - self.n_lost_pending
    }

    fn get(&self, seg: u64) -> Option<&Seg> {
        seg.checked_sub(self.una)
            .and_then(|i| self.segs.get(usize::try_from(i).ok()?))
    }

    fn get_mut(&mut self, seg: u64) -> Option<&mut Seg> {
        let i = usize::try_from(seg.checked_sub(self.una)?).ok()?;
        self.segs.get_mut(i)
    }

    /// How many times a segment has been marked lost, in total.
    pub(crate) fn lost_total(&self) -> u64 {
        self.lost_total
    }

    /// Keeps the delivery-rate stamp of `seg`'s latest transmission, and
    /// its send time (`stamp.sent_time`) for time-based loss detection.
    pub(crate) fn stamp(&mut self, seg: u64, stamp: SendStamp) {
        let Some(s) = self.get_mut(seg) else { return };
        if s.sacked {
            return;
        }
        let old = s.xmit;
        s.stamp = Some(stamp);
        s.xmit = stamp.sent_time;
        let in_flight = !s.lost || s.retx;
        self.by_xmit.remove(&(old, seg));
        if in_flight {
            self.by_xmit.insert((stamp.sent_time, seg));
        }
    }

    /// The segments in flight, oldest transmission first (RFC 8985 §8):
    /// `(xmit, seg)`.
    pub(crate) fn in_flight_by_xmit(&self) -> impl Iterator<Item = (Time, u64)> + '_ {
        self.by_xmit.iter().copied()
    }

    /// The segments first reported delivered since the last
    /// [`Scoreboard::clear_deliveries`].
    pub(crate) fn deliveries(&self) -> &[Delivery] {
        &self.deliveries
    }

    pub(crate) fn clear_deliveries(&mut self) {
        self.deliveries.clear();
    }

    /// The stamps of the segments delivered (first SACKed or cumulatively
    /// acknowledged) since the last call, in the order they were reported.
    pub(crate) fn take_delivered(&mut self) -> impl Iterator<Item = SendStamp> + '_ {
        self.delivered.drain(..)
    }

    pub(crate) fn is_sacked(&self, seg: u64) -> bool {
        self.get(seg).is_some_and(|s| s.sacked)
    }

    /// Records the first transmission of the next new segment; returns its number.
    pub(crate) fn on_send_new(&mut self) -> u64 {
        self.segs.push_back(Seg::default());
        let seg = self.max() - 1;
        self.by_xmit.insert((Time::ZERO, seg));
        seg
    }

    /// Records a retransmission of `seg`.
    pub(crate) fn on_retransmit(&mut self, seg: u64) {
        let Some(s) = self.get_mut(seg) else { return };
        debug_assert!(!s.sacked, "retransmitting a SACKed segment");
        s.retransmitted = true;
        if !s.retx && !s.sacked {
            s.retx = true;
            let (lost, xmit) = (s.lost, s.xmit);
            self.n_retx += 1;
            if lost {
                self.n_lost_pending -= 1;
                self.by_xmit.insert((xmit, seg));
            }
        }
    }

    /// Removes every segment below `cum` (the receiver has them all);
    /// returns how many.
    pub(crate) fn ack_through(&mut self, cum: u64) -> u64 {
        let mut acked = 0;
        while self.una < cum {
            let Some(s) = self.segs.pop_front() else {
                break;
            };
            self.una += 1;
            acked += 1;
            self.delivered.extend(s.stamp);
            if !s.sacked {
                self.by_xmit.remove(&(s.xmit, self.una - 1));
                self.deliveries.push(Delivery {
                    seg: self.una - 1,
                    xmit: s.xmit,
                    retransmitted: s.retransmitted,
                });
            }
            if s.sacked {
                self.n_sacked -= 1;
            } else {
                if s.lost {
                    self.n_lost -= 1;
                    if !s.retx {
                        self.n_lost_pending -= 1;
                    }
                }
                if s.retx {
                    self.n_retx -= 1;
                }
            }
        }
        while let Some((&start, &end)) = self.sacked_ranges.iter().next() {
            if start >= self.una {
                break;
            }
            self.sacked_ranges.remove(&start);
            if end > self.una {
                self.sacked_ranges.insert(self.una, end);
            }
        }
        self.loss_frontier = self.loss_frontier.max(self.una);
        self.retx_cursor = self.retx_cursor.max(self.una);
        acked
    }

    /// Marks the segments of `block` SACKed; returns how many were new.
    /// Walks the ranges it overlaps from the top down, marking only the
    /// gaps between them, then stores the merged range: no allocation.
    pub(crate) fn apply_sack(&mut self, block: SackBlock) -> u64 {
        let start = block.start.max(self.una);
        let end = block.end.min(self.max());
        if start >= end {
            return 0;
        }
        let (mut merged_start, mut merged_end) = (start, end);
        let mut newly = 0;
        // Everything in [start, hi) not yet examined.
        let mut hi = end;
        while hi > start {
            match self.sacked_ranges.range(..=hi).next_back() {
                // Overlapping or adjacent (e == start, s == end): merge.
                Some((&s, &e)) if e >= start => {
                    for seg in e.max(start)..hi {
                        newly += u64::from(self.mark_sacked(seg));
                    }
                    self.sacked_ranges.remove(&s);
                    merged_start = merged_start.min(s);
                    merged_end = merged_end.max(e);
                    hi = s;
                }
                _ => {
                    for seg in start..hi {
                        newly += u64::from(self.mark_sacked(seg));
                    }
                    hi = start;
                }
            }
        }
        self.sacked_ranges.insert(merged_start, merged_end);
        newly
    }

    fn mark_sacked(&mut self, seg: u64) -> bool {
        let Some(s) = self.get_mut(seg) else {
            return false;
        };
        if s.sacked {
            return false;
        }
        let (lost, retx) = (s.lost, s.retx);
        let stamp = s.stamp.take();
        let delivery = Delivery {
            seg,
            xmit: s.xmit,
            retransmitted: s.retransmitted,
        };
        s.sacked = true;
        s.lost = false;
        s.retx = false;
        self.n_sacked += 1;
        self.by_xmit.remove(&(delivery.xmit, seg));
        self.deliveries.push(delivery);
        if lost {
            self.n_lost -= 1;
            if !retx {
                self.n_lost_pending -= 1;
            }
        }
        if retx {
            self.n_retx -= 1;
        }
        self.delivered.extend(stamp);
        true
    }

    /// Forgets every SACK: the receiver reneged (RFC 2018 §8), so what it
    /// reported holding may be gone. Segments go back to plain outstanding.
    pub(crate) fn clear_sacks(&mut self) {
        for (i, s) in self.segs.iter_mut().enumerate().filter(|(_, s)| s.sacked) {
            s.sacked = false;
            self.by_xmit.insert((s.xmit, self.una + i as u64));
        }
        self.sacked_ranges.clear();
        self.n_sacked = 0;
        self.loss_frontier = self.una;
    }

    /// The highest SACKed segment.
    pub(crate) fn highest_sacked(&self) -> Option<u64> {
        self.sacked_ranges.iter().next_back().map(|(_, &e)| e - 1)
    }

    /// The `k`-th highest SACKed segment: every segment below it has at least
    /// `k` SACKed segments above it (RFC 6675 §4 IsLost, in segments).
    pub(crate) fn kth_highest_sacked(&self, k: u64) -> Option<u64> {
        let mut need = k.max(1);
        for (&s, &e) in self.sacked_ranges.iter().rev() {
            let len = e - s;
            if len >= need {
                return Some(e - need);
            }
            need -= len;
        }
        None
    }

    /// Marks `seg` lost unless it is SACKed or already lost; returns whether it changed.
    pub(crate) fn mark_lost(&mut self, seg: u64) -> bool {
        let Some(s) = self.get_mut(seg) else {
            return false;
        };
        if s.sacked || s.lost {
            return false;
        }
        s.lost = true;
        let (retx, xmit) = (s.retx, s.xmit);
        self.n_lost += 1;
        self.lost_total += 1;
        if !retx {
            self.n_lost_pending += 1;
            self.retx_cursor = self.retx_cursor.min(seg);
            self.by_xmit.remove(&(xmit, seg));
        }
        true
    }

    /// Marks `seg` lost whatever it was: a lost segment whose
    /// retransmission is in flight is presumed lost again and awaits
    /// another retransmission (RFC 8985 §6.2: a retransmission is judged
    /// by its own send time like any segment). Returns whether it changed.
    pub(crate) fn mark_lost_again(&mut self, seg: u64) -> bool {
        let Some(s) = self.get_mut(seg) else {
            return false;
        };
        if s.sacked || (s.lost && !s.retx) {
            return false;
        }
        if !s.lost {
            return self.mark_lost(seg);
        }
        s.retx = false;
        let xmit = s.xmit;
        self.n_retx -= 1;
        self.n_lost_pending += 1;
        self.lost_total += 1;
        self.retx_cursor = self.retx_cursor.min(seg);
        self.by_xmit.remove(&(xmit, seg));
        true
    }

    /// Marks every un-SACKed segment below `limit` lost; returns how many changed.
    pub(crate) fn mark_lost_below(&mut self, limit: u64) -> u64 {
        let limit = limit.min(self.max());
        let mut n = 0;
        let mut seg = self.loss_frontier.max(self.una);
        while seg < limit {
            n += u64::from(self.mark_lost(seg));
            seg += 1;
        }
        self.loss_frontier = self.loss_frontier.max(limit);
        n
    }

    /// After a retransmission timeout every un-SACKed segment is presumed
    /// lost, retransmissions included, and will be sent again.
    pub(crate) fn mark_all_lost(&mut self) {
        let mut lost = 0;
        for s in self.segs.iter_mut().filter(|s| !s.sacked) {
            if !s.lost || s.retx {
                self.lost_total += 1;
            }
            s.lost = true;
            s.retx = false;
            lost += 1;
        }
        self.n_lost = lost;
        self.n_lost_pending = lost;
        self.n_retx = 0;
        self.by_xmit.clear();
        self.loss_frontier = self.max();
        self.retx_cursor = self.una;
    }

    /// Forgets every loss not yet retransmitted: a spurious timeout or
    /// recovery was undone, so those segments are still in flight
    /// (Sarolahti §6: "the lost mark is removed from all segments").
    pub(crate) fn clear_pending_losses(&mut self) {
        let una = self.una;
        for (i, s) in self.segs.iter_mut().enumerate() {
            if s.lost && !s.retx && !s.sacked {
                s.lost = false;
                self.n_lost -= 1;
                self.n_lost_pending -= 1;
                self.by_xmit.insert((s.xmit, una + i as u64));
            }
        }
        self.loss_frontier = una;
    }

    /// The lowest segment awaiting retransmission.
    pub(crate) fn next_lost_pending(&mut self) -> Option<u64> {
        if self.n_lost_pending == 0 {
            return None;
        }
        let mut seg = self.retx_cursor.max(self.una);
        while let Some(s) = self.get(seg) {
            if s.lost && !s.retx && !s.sacked {
                self.retx_cursor = seg;
                return Some(seg);
            }
            seg += 1;
        }
        debug_assert!(false, "n_lost_pending > 0 but none found");
        None
    }

    /// The lowest segment in `[from, below)` neither SACKed nor retransmitted
    /// (RFC 6675 NextSeg rule 3).
    pub(crate) fn next_unsacked_unretransmitted(&self, from: u64, below: u64) -> Option<u64> {
        (from.max(self.una)..below.min(self.max())).find(|&seg| {
            self.get(seg)
                .is_some_and(|s| !s.sacked && !s.retx && !s.lost)
        })
    }

    /// The highest segment not SACKed (RFC 8985 §7.3: what a tail loss
    /// probe resends when there is no new data).
    pub(crate) fn highest_unsacked(&self) -> Option<u64> {
        (self.una..self.max())
            .rev()
            .find(|&seg| self.get(seg).is_some_and(|s| !s.sacked))
    }

    /// The highest segment that is neither SACKed nor has a retransmission
    /// in flight (RFC 6675 NextSeg rule 4, the rescue retransmission).
    pub(crate) fn highest_unsacked_unretransmitted(&self) -> Option<u64> {
        (self.una..self.max())
            .rev()
            .find(|&seg| self.get(seg).is_some_and(|s| !s.sacked && !s.retx))
    }

    /// Recounts everything from scratch and compares: for tests and
    /// property checks, O(window).
    pub(crate) fn check_invariants(&self) -> Result<(), ScoreboardInvariant> {
        let (mut sacked, mut lost, mut retx, mut pending) = (0, 0, 0, 0);
        for (i, s) in self.segs.iter().enumerate() {
            let seg = self.una + i as u64;
            let in_ranges = self
                .sacked_ranges
                .range(..=seg)
                .next_back()
                .is_some_and(|(_, &e)| seg < e);
            if s.sacked != in_ranges {
                return Err(ScoreboardInvariant::SackedFlag(seg));
            }
            if s.sacked {
                sacked += 1;
                continue;
            }
            if (!s.lost || s.retx) != self.by_xmit.contains(&(s.xmit, seg)) {
                return Err(ScoreboardInvariant::TimeOrder(seg));
            }
            lost += u64::from(s.lost);
            retx += u64::from(s.retx);
            pending += u64::from(s.lost && !s.retx);
            if s.lost && !s.retx && seg < self.retx_cursor {
                return Err(ScoreboardInvariant::LostBelowCursor(seg));
            }
        }
        let counted = (self.n_sacked, self.n_lost, self.n_retx, self.n_lost_pending);
        let recount = (sacked, lost, retx, pending);
        if counted != recount {
            return Err(ScoreboardInvariant::Counters { counted, recount });
        }
        let in_flight = self
            .segs
            .iter()
            .filter(|s| !s.sacked && (!s.lost || s.retx));
        if in_flight.count() != self.by_xmit.len() {
            return Err(ScoreboardInvariant::NotInFlight);
        }
        let mut prev_end = None;
        for (&s, &e) in &self.sacked_ranges {
            if s < self.una || e <= s || prev_end.is_some_and(|p| p >= s) {
                return Err(ScoreboardInvariant::BadSackRange { start: s, end: e });
            }
            prev_end = Some(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(n: u64) -> Scoreboard {
        let mut sb = Scoreboard::default();
        for _ in 0..n {
            sb.on_send_new();
        }
        sb
    }

    fn block(s: u64, e: u64) -> SackBlock {
        SackBlock::new(s, e).unwrap()
    }

    /// A counter out of step with the segments, or a SACK range that ends
    /// before it starts, is reported as that broken invariant.
    #[test]
    fn a_broken_invariant_is_named() {
        let mut sb = board(4);
        sb.check_invariants().unwrap();
        sb.n_lost = 2;
        let broken = ScoreboardInvariant::Counters {
            counted: (0, 2, 0, 0),
            recount: (0, 0, 0, 0),
        };
        assert_eq!(sb.check_invariants(), Err(broken.clone()));
        assert_eq!(
            broken.to_string(),
            "counters (0, 2, 0, 0) != recount (0, 0, 0, 0)"
        );

        let mut sb = board(4);
        sb.sacked_ranges.insert(9, 7);
        assert_eq!(
            sb.check_invariants(),
            Err(ScoreboardInvariant::BadSackRange { start: 9, end: 7 })
        );
    }

    #[test]
    fn rfc6675_pipe_counts() {
        let mut sb = board(10);
        assert_eq!(sb.pipe(), 10);
        assert_eq!(sb.apply_sack(block(3, 6)), 3);
        assert_eq!(sb.pipe(), 7);
        assert!(sb.mark_lost(0));
        assert_eq!(sb.pipe(), 6, "lost, not resent: 0");
        sb.on_retransmit(0);
        assert_eq!(sb.pipe(), 7, "lost and resent: 1");
        sb.on_retransmit(1);
        assert_eq!(sb.pipe(), 8, "not lost and resent: 2");
        sb.check_invariants().unwrap();
    }

    #[test]
    fn sack_merges_and_counts_only_new_segments() {
        let mut sb = board(20);
        assert_eq!(sb.apply_sack(block(5, 7)), 2);
        assert_eq!(sb.apply_sack(block(10, 12)), 2);
        assert_eq!(sb.apply_sack(block(5, 12)), 3);
        assert_eq!(sb.apply_sack(block(4, 13)), 2);
        assert_eq!(sb.apply_sack(block(4, 13)), 0);
        assert_eq!(sb.sacked(), 9);
        assert_eq!(sb.highest_sacked(), Some(12));
        sb.check_invariants().unwrap();
        // Blocks beyond what was sent are clipped.
        assert_eq!(sb.apply_sack(block(19, 40)), 1);
        sb.check_invariants().unwrap();
    }

    #[test]
    fn kth_highest_sacked_walks_ranges() {
        let mut sb = board(30);
        sb.apply_sack(block(20, 22));
        sb.apply_sack(block(10, 12));
        assert_eq!(sb.kth_highest_sacked(1), Some(21));
        assert_eq!(sb.kth_highest_sacked(2), Some(20));
        assert_eq!(sb.kth_highest_sacked(3), Some(11));
        assert_eq!(sb.kth_highest_sacked(4), Some(10));
        assert_eq!(sb.kth_highest_sacked(5), None);
    }

    #[test]
    fn cumulative_ack_trims_ranges_and_counters() {
        let mut sb = board(10);
        sb.apply_sack(block(2, 6));
        sb.mark_lost(0);
        sb.mark_lost(1);
        sb.on_retransmit(0);
        assert_eq!(sb.ack_through(4), 4);
        assert_eq!((sb.una(), sb.sacked(), sb.pipe()), (4, 2, 4));
        sb.check_invariants().unwrap();
    }

    #[test]
    fn lost_segments_come_out_lowest_first() {
        let mut sb = board(10);
        sb.apply_sack(block(6, 9));
        assert_eq!(sb.mark_lost_below(sb.kth_highest_sacked(3).unwrap()), 6);
        assert_eq!(sb.next_lost_pending(), Some(0));
        sb.on_retransmit(0);
        assert_eq!(sb.next_lost_pending(), Some(1));
        assert_eq!(sb.mark_lost_below(6), 0, "idempotent");
        sb.mark_all_lost();
        assert_eq!(sb.next_lost_pending(), Some(0));
        assert_eq!(sb.pipe(), 0);
        assert_eq!(sb.lost_pending(), 7);
        sb.check_invariants().unwrap();
    }

    /// RFC 8985 §8: segments in flight in the order they were last sent; a
    /// retransmission moves to the end, a lost one leaves until resent.
    #[test]
    fn in_flight_segments_are_ordered_by_last_transmission() {
        use crate::proto::congestion::DeliveryRate;
        let mut rate = DeliveryRate::default();
        let mut sb = Scoreboard::default();
        let at = |ms: u64| Time::from_nanos(ms * 1_000_000);
        for ms in 0..4 {
            let seg = sb.on_send_new();
            sb.stamp(seg, rate.on_sent(at(ms), seg, 0, 0));
        }
        sb.mark_lost(1);
        let order = |sb: &Scoreboard| sb.in_flight_by_xmit().map(|(_, s)| s).collect::<Vec<_>>();
        assert_eq!(order(&sb), vec![0, 2, 3]);
        sb.on_retransmit(1);
        sb.stamp(1, rate.on_sent(at(10), 4, 0, 0));
        assert_eq!(order(&sb), vec![0, 2, 3, 1]);
        assert!(sb.mark_lost_again(1), "its retransmission is lost");
        assert_eq!(sb.lost_pending(), 1);
        sb.apply_sack(block(2, 3));
        sb.ack_through(1);
        assert_eq!(order(&sb), vec![3]);
        let delivered: Vec<u64> = sb.deliveries().iter().map(|d| d.seg).collect();
        assert_eq!(delivered, vec![2, 0]);
        sb.check_invariants().unwrap();
    }

    #[test]
    fn sack_of_a_lost_segment_clears_its_loss() {
        let mut sb = board(5);
        sb.mark_lost(2);
        sb.on_retransmit(2);
        sb.apply_sack(block(2, 3));
        assert_eq!(sb.pipe(), 4);
        assert_eq!(sb.lost_pending(), 0);
        sb.check_invariants().unwrap();
    }
}
