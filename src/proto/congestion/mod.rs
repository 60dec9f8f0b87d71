//! Congestion control: how much may be in flight, and how fast to send.
//!
//! Apart from loss recovery ([`super::loss`]), which decides what is lost
//! and what to resend and never moves the window. The sender owns the
//! scoreboard; it tells its [`Controller`] what each ACK, congestion event
//! and timeout did, and asks it for the window (and, for controllers that
//! pace, a rate). One trait object per connection, built from the tuning by
//! [`build`] (quinn-proto's `ControllerFactory`). Adding a controller is one
//! new file and one arm in [`build`].

mod aimd;
pub(crate) mod bbr;
mod coupled;
mod cubic;
pub(crate) mod delivery_rate;
mod hoe;
pub(crate) mod pacer;
mod reduction;
mod vegas;

use std::fmt;
use std::time::Duration;

pub(crate) use aimd::Aimd;
pub(crate) use bbr::Bbr;
pub(crate) use coupled::Coupled;
pub(crate) use cubic::Cubic;
pub(crate) use delivery_rate::{DeliveryRate, RateSample};
// `CcReport` is defined below.
pub(crate) use pacer::Pacer;
pub(crate) use vegas::Vegas;

use super::path_memory::PathMemory;
use super::time::Time;
use super::tuning::{CcKind, Tuning};

/// Where an ACK left fast recovery, as loss recovery decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecoveryStep {
    /// Not in fast recovery before or after this ACK (a retransmission
    /// timeout's `Loss` phase counts as outside).
    Outside,
    /// This ACK started fast recovery; [`Controller::on_congestion_event`]
    /// has been called for it.
    Entered,
    /// In fast recovery before and after this ACK.
    During,
    /// This ACK ended fast recovery.
    Left,
}

impl RecoveryStep {
    /// Whether the sender is in fast recovery after this ACK.
    pub(crate) fn in_recovery(self) -> bool {
        matches!(self, RecoveryStep::Entered | RecoveryStep::During)
    }
}

/// What one valid ACK did, once the scoreboard and loss recovery have
/// processed it. Segment counts are in segments.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AckEvent {
    pub now: Time,
    /// Segments newly covered by the cumulative ACK.
    pub newly_acked: u64,
    /// Segments this ACK reported delivered for the first time, SACKed or
    /// cumulatively acknowledged: what a controller counts as acknowledged
    /// data (RFC 3465 byte counting, RFC 9438 `segments_acked`) when
    /// SACKed segments must not count twice.
    pub newly_delivered: u64,
    /// Segments loss recovery newly marked lost while processing this ACK.
    pub newly_lost: u64,
    /// Segments delivered so far (delivery-rate estimation's C.delivered).
    pub delivered: u64,
    /// Segments sent so far, new and resent (RFC 6937's prr_out counts
    /// them from the start of recovery).
    pub sent: u64,
    /// A duplicate ACK, as the loss-recovery variant judged it.
    pub is_dupack: bool,
    pub recovery: RecoveryStep,
    /// RFC 5681 FlightSize after the ACK (SACKed segments included).
    pub flight: u64,
    /// RFC 6675 pipe after the ACK.
    pub pipe: u64,
    /// The RTT sample this ACK gave, if any.
    pub rtt: Option<Duration>,
    /// The smoothed RTT (RFC 6298), zero before the first sample.
    pub srtt: Duration,
    /// snd_una after the ACK and snd_max: what is acknowledged, and what
    /// has been sent, in segment numbers (for counting round trips).
    pub snd_una: u64,
    pub snd_max: u64,
    /// The sender is application-limited (delivery-rate estimation's
    /// definition): it is not using its window, so its window has not
    /// been tested and should not grow (RFC 9438 §5.8, RFC 7661).
    pub app_limited: bool,
    /// The delivery rate this ACK measured, if it gave a valid sample.
    pub rate: Option<RateSample>,
}

#[cfg(test)]
impl AckEvent {
    /// The controllers' tests' base ACK: at `now`, one segment newly
    /// acknowledged and delivered, nothing lost, outside recovery, no RTT
    /// or rate sample, nothing in flight. Each test sets what its scenario
    /// varies with struct update syntax.
    pub(crate) fn of_one_segment(now: Time) -> AckEvent {
        AckEvent {
            now,
            newly_acked: 1,
            newly_delivered: 1,
            newly_lost: 0,
            delivered: 0,
            sent: 0,
            is_dupack: false,
            recovery: RecoveryStep::Outside,
            flight: 0,
            pipe: 0,
            rtt: None,
            srtt: Duration::ZERO,
            snd_una: 0,
            snd_max: 0,
            app_limited: false,
            rate: None,
        }
    }
}

/// Fast recovery begins: loss recovery has judged an ACK to signal
/// congestion.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CongestionEvent {
    /// RFC 5681 FlightSize when recovery began, before anything was marked
    /// lost.
    pub flight: u64,
    /// RFC 6675 pipe once loss recovery has marked what it presumes lost.
    pub pipe: u64,
    /// Segments sent so far, new and resent, as in [`AckEvent::sent`].
    pub sent: u64,
}

/// What a model-based controller reports of itself: for `--events`, the
/// summary and `--json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CcReport {
    /// The state, with the specification's name for it.
    pub state: &'static str,
    /// The bottleneck-bandwidth estimate, bits per second.
    pub bw_bps: u64,
    /// The minimum-RTT estimate.
    #[serde(serialize_with = "secs")]
    pub min_rtt: Duration,
    /// BBR.filled_pipe: the model has seen the path full, so `bw_bps` is
    /// the path's; before, it is what the connection reached (a lower
    /// bound).
    #[serde(skip)]
    pub filled_pipe: bool,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The controller's half of the sender: it decides how much may be in
/// flight and how fast to send. It never marks a segment lost.
///
/// The sender calls, for each valid ACK: [`Controller::on_congestion_event`]
/// first if loss recovery starts fast recovery on it, or
/// [`Controller::on_recovery_end`] if it ends it; then
/// [`Controller::on_ack`]. A retransmission timeout calls
/// [`Controller::on_rto`]; it ends fast recovery without
/// `on_recovery_end`. [`Controller::undo`] may follow either, instead of
/// or after `on_recovery_end`.
pub(crate) trait Controller: fmt::Debug + Send {
    fn kind(&self) -> CcKind;

    /// An ACK, after loss recovery has processed it.
    fn on_ack(&mut self, ack: &AckEvent);

    /// Loss recovery starts fast recovery.
    fn on_congestion_event(&mut self, event: &CongestionEvent);

    /// Fast recovery ends: everything sent before it began is acknowledged.
    fn on_recovery_end(&mut self, now: Time);

    /// A retransmission timeout; `flight` is counted before everything is
    /// marked lost; `first` is false for a repeated timeout of the same data.
    fn on_rto(&mut self, now: Time, flight: u64, first: bool);

    /// Loss recovery has proved the last reduction (fast recovery or
    /// timeout) spurious: every retransmission of it was unnecessary
    /// (D-SACK, RFC 2883; the echoed timestamp, Eifel; Sarolahti §6).
    /// Controllers that reduce go back to the window and ssthresh from
    /// before it (RFC 9438 §4.9); the default does nothing.
    fn undo(&mut self, _now: Time) {}

    /// The congestion window, in segments: the most that may be in flight.
    fn window(&self) -> u64;

    /// The slow-start threshold in segments, for controllers that have one;
    /// `Some(u64::MAX)` before the first reduction.
    fn ssthresh(&self) -> Option<u64>;

    /// The rate to pace at, in bytes per second; `None` sends as fast as the
    /// window allows.
    fn pacing_rate(&self) -> Option<u64> {
        None
    }

    /// The state and model of a model-based controller; `None` for the
    /// others.
    fn report(&self) -> Option<CcReport> {
        None
    }

    /// Before anything is sent: start from what a previous connection to
    /// the same destination learnt, as far as it applies and within
    /// bounds; the default ignores it.
    fn use_path_memory(&mut self, _memory: &PathMemory) {}

    /// Another connection of the same transfer, on the same path, has
    /// sent its last byte: its share of the bottleneck is likely free.
    /// The application knows this; the path would tell a controller only
    /// at its next probe. The default ignores it.
    fn on_sibling_done(&mut self, _now: Time) {}

    /// Whether this controller can model a group of connections as one
    /// flow, given the group's delivery-rate samples and its counts
    /// scaled to the group's ([`Coupled`]); the default cannot.
    fn couples(&self) -> bool {
        false
    }

    /// From now on, draw random choices from `seed` (as [`build`]'s);
    /// the default has none.
    fn reseed(&mut self, _seed: u64) {}
}

/// What a reduction multiplies: RFC 5681 eq. (4) FlightSize, but never
/// more than the window. A sender that sends by pipe (RFC 6675 in
/// recovery; RACK in every phase) keeps sending new data while a hole
/// holds snd_una, so FlightSize can grow to the receiver's window however
/// small cwnd is; β times that would *raise* cwnd at a congestion event,
/// and each later event raise it again (a 0.1 % loss path ran CUBIC to
/// 18 000 segments against a 1 900-segment path). Linux multiplies cwnd
/// (tcp_cubic's bictcp_recalc_ssthresh, tcp_reno_ssthresh); the minimum
/// keeps RFC 5681's FlightSize where the window is not full. AIMD keeps
/// FlightSize itself: it sends by FlightSize outside recovery, so FlightSize
/// cannot run ahead of its window there, and the papers' tests hold it to
/// RFC 5681's letter.
pub(super) fn reduction_base(flight: u64, cwnd: u64) -> u64 {
    flight.min(cwnd)
}

/// Builds the controller a tuning asks for; `seed` makes its random
/// choices (BBR's probe timing) reproducible and different per connection.
pub(crate) fn build(t: &Tuning, seed: u64) -> Box<dyn Controller> {
    match t.cc {
        CcKind::Bbr => Box::new(Bbr::new(t, seed)),
        CcKind::Aimd => Box::new(Aimd::new(t)),
        CcKind::Cubic => Box::new(Cubic::new(t)),
        CcKind::Vegas => Box::new(Vegas::new(t)),
    }
}
