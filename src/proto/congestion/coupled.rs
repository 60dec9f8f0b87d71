//! The streams of one transfer as one flow: each stream's controller models
//! the whole group and the stream uses its share of the model's outputs.
//!
//! The design (docs/congestion.md, "Coupled streams"): the connections of
//! a transfer to one host share a bottleneck, so, as RFC 6356 §1 asks of
//! a multipath connection's subflows ("take no more capacity on any path
//! than if it was a single path flow"), together they should compete as
//! one flow. For BBR (draft-ietf-ccwg-bbr), whose model is a bandwidth
//! and a round-trip time, one flow's model is measured by counting the
//! group's deliveries in every rate sample ([`super::DeliveryRate`]'s
//! group count): each stream's BBR sees the group's delivery rate, as one
//! connection carrying all of them would. Its counts of what this stream
//! acknowledged, lost and has in flight are scaled up to the group's (the
//! stream's part of the group is `share`), and its window and pacing rate
//! scaled down by `share`: each stream sends its share of what one BBR
//! would send for the group. The caller (the IO layer, the simulator)
//! sets `share` from what it knows of the group: `flows` over the streams
//! still sending, so a stream that has finished hands its share to the
//! others. Loss recovery stays per stream.
//!
//! Only controllers that say they couple ([`Controller::couples`]) are
//! scaled: a loss-based controller's windows grow per ACK and shrink per
//! loss of its own stream, so scaling them would not make one flow of
//! the group (RFC 6356's linked increase is not implemented).

use super::{AckEvent, CcReport, CongestionEvent, Controller};
use crate::proto::path_memory::PathMemory;
use crate::proto::time::Time;
use crate::proto::tuning::CcKind;

/// A controller and the share of its outputs its stream uses.
#[derive(Debug)]
pub(crate) struct Coupled {
    inner: Box<dyn Controller>,
    /// This stream's part of the group, in (0, 1]; 1 for a stream alone.
    share: f64,
}

impl Coupled {
    pub(crate) fn new(inner: Box<dyn Controller>) -> Coupled {
        Coupled { inner, share: 1.0 }
    }

    /// Whether the controller models a group ([`Controller::couples`]).
    pub(crate) fn couples(&self) -> bool {
        self.inner.couples()
    }

    /// Sets this stream's part of its group, clamped to (0, 1]; ignored
    /// by a controller that does not couple.
    pub(crate) fn set_share(&mut self, share: f64) {
        if self.inner.couples() && share.is_finite() && share > 0.0 {
            self.share = share.min(1.0);
        }
    }

    /// A count of this stream's, as the group's: what the group would
    /// count if every stream did as this one.
    fn to_group(&self, segments: u64) -> u64 {
        (segments as f64 / self.share).round() as u64
    }

    /// A count of the group's, this stream's part: at least one segment
    /// where the group's is not zero.
    fn to_stream(&self, segments: u64) -> u64 {
        (segments as f64 * self.share).ceil() as u64
    }
}

impl Controller for Coupled {
    fn kind(&self) -> CcKind {
        self.inner.kind()
    }

    fn couples(&self) -> bool {
        self.inner.couples()
    }

    fn on_ack(&mut self, ack: &AckEvent) {
        // A stream alone (every stream of cubic, aimd, vegas; bbr with
        // `--flows` at `--streams`): its counts are the group's, with no
        // per-ACK arithmetic.
        if self.share == 1.0 {
            return self.inner.on_ack(ack);
        }
        let mut group = *ack;
        group.newly_acked = self.to_group(ack.newly_acked);
        group.newly_delivered = self.to_group(ack.newly_delivered);
        group.newly_lost = self.to_group(ack.newly_lost);
        group.sent = self.to_group(ack.sent);
        group.flight = self.to_group(ack.flight);
        group.pipe = self.to_group(ack.pipe);
        group.rate = ack.rate.map(|mut r| {
            r.tx_in_flight = self.to_group(r.tx_in_flight);
            r.lost = self.to_group(r.lost);
            r
        });
        self.inner.on_ack(&group);
    }

    fn on_congestion_event(&mut self, event: &CongestionEvent) {
        self.inner.on_congestion_event(&CongestionEvent {
            flight: self.to_group(event.flight),
            pipe: self.to_group(event.pipe),
            sent: self.to_group(event.sent),
        });
    }

    fn on_recovery_end(&mut self, now: Time) {
        self.inner.on_recovery_end(now);
    }

    fn on_rto(&mut self, now: Time, flight: u64, first: bool) {
        self.inner.on_rto(now, self.to_group(flight), first);
    }

    fn undo(&mut self, now: Time) {
        self.inner.undo(now);
    }

    fn window(&self) -> u64 {
        self.to_stream(self.inner.window()).max(1)
    }

    fn ssthresh(&self) -> Option<u64> {
        self.inner
            .ssthresh()
            .map(|s| if s == u64::MAX { s } else { self.to_stream(s) })
    }

    fn pacing_rate(&self) -> Option<u64> {
        self.inner
            .pacing_rate()
            .map(|r| ((r as f64 * self.share) as u64).max(1))
    }

    /// The group's model: a coupled stream's bandwidth estimate is the
    /// group's.
    fn report(&self) -> Option<CcReport> {
        self.inner.report()
    }

    fn use_path_memory(&mut self, memory: &PathMemory) {
        self.inner.use_path_memory(memory);
    }

    fn on_sibling_done(&mut self, now: Time) {
        self.inner.on_sibling_done(now);
    }

    fn reseed(&mut self, seed: u64) {
        self.inner.reseed(seed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::congestion::build;
    use crate::proto::tuning::Tuning;

    /// Alone (share 1) the wrapper changes nothing; a quarter's stream
    /// uses a quarter of the window and pacing rate, rounded up.
    #[test]
    fn a_share_scales_the_outputs() {
        let t = Tuning::command_default();
        let mut c = Coupled::new(build(&t, 3));
        let alone = (c.window(), c.pacing_rate());
        c.on_ack(&AckEvent {
            srtt: std::time::Duration::from_millis(100),
            ..AckEvent::of_one_segment(Time::from_nanos(100_000_000))
        });
        let inner = (c.inner.window(), c.inner.pacing_rate());
        assert_eq!((c.window(), c.pacing_rate()), inner);
        assert_eq!(alone.0, u64::from(t.initsegs));
        c.set_share(0.25);
        assert_eq!(c.window(), inner.0.div_ceil(4));
        assert_eq!(c.pacing_rate(), inner.1.map(|r| r / 4));
    }

    /// A loss-based controller is not scaled.
    #[test]
    fn a_controller_that_does_not_couple_keeps_its_window() {
        let t = Tuning {
            cc: CcKind::Cubic,
            ..Tuning::command_default()
        };
        let mut c = Coupled::new(build(&t, 3));
        let w = c.window();
        c.set_share(0.25);
        assert_eq!(c.window(), w);
        assert!(!c.couples());
    }
}
