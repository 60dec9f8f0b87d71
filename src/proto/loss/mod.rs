//! Loss recovery: what is lost and what to resend, behind one trait.
//!
//! The sender owns the scoreboard; after each ACK has updated it, the
//! sender asks its [`LossRecovery`] variant what the ACK means: whether to
//! start fast recovery, what to mark lost, what to resend at once, when to
//! leave. A variant never moves the congestion window: the sender tells the
//! congestion controller ([`super::congestion`]) what the variant decided.
//! Everything the variants share (the fast retransmit of snd_una, the
//! recovery point, timeouts) lives here or in the sender, so a variant file
//! holds only what makes it different. Adding a variant is one new file and
//! one arm in [`for_kind`].

mod fack;
mod newreno;
mod rack;
mod reno;
mod sack;

use std::fmt;
use std::time::Duration;

use super::events::RecoveryTrigger;
use super::time::Time;
use super::tuning::{RecoveryKind, ReorderingKind, Tuning};
use super::wire::SackBlock;
use crate::proto::stream::scoreboard::Scoreboard;

/// The sender's loss state, after Linux's (Sarolahti §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Nothing unusual.
    Open,
    /// Duplicate ACKs or SACKs seen, below the recovery trigger: limited
    /// transmit (RFC 3042) applies.
    Disorder,
    /// Fast recovery, until everything sent before it began is acknowledged.
    Recovery,
    /// After a retransmission timeout, until everything sent before it is
    /// acknowledged; no fast retransmit meanwhile (RFC 6582 §4.1, Hoe §3.2).
    Loss,
}

/// A retransmission that goes out whatever the window says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forced {
    /// The fast retransmit that starts recovery.
    FastRetransmit(u64),
    /// NewReno's retransmit on a partial ACK (RFC 6582 §3.2 step 3).
    PartialAck(u64),
    /// A tail loss probe (RFC 8985 §7.3): new data when the segment is
    /// snd_max, otherwise a retransmission.
    Probe(u64),
}

impl Forced {
    pub(crate) fn seg(self) -> u64 {
        match self {
            Forced::FastRetransmit(s) | Forced::PartialAck(s) | Forced::Probe(s) => s,
        }
    }
}

/// What an ACK that acknowledged nothing new carried: the variant decides
/// whether it is a duplicate ACK.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DupEvidence {
    /// Segments newly covered by SACK blocks.
    pub newly_sacked: u64,
    /// The advertised right edge moved (a window update).
    pub window_changed: bool,
    /// The ACK reports a duplicate segment (RFC 2883): the receiver got
    /// something twice, which says nothing about loss.
    pub dsack: bool,
}

/// What one ACK changed, as the variants need it. The segments it
/// delivered are in [`Scoreboard::deliveries`].
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AckSummary {
    /// Segments newly covered by the cumulative ACK.
    pub newly_acked: u64,
    /// Segments newly covered by SACK blocks.
    pub newly_sacked: u64,
    /// A duplicate ACK, as the variant's [`LossRecovery::is_duplicate`] judged it.
    pub is_dupack: bool,
    /// When the ACK arrived.
    pub now: Time,
    /// The timestamp the ACK echoes (wire microseconds).
    pub echo: u32,
    /// The D-SACK block it carries (RFC 2883).
    pub dsack: Option<SackBlock>,
    /// RFC 6298 SRTT and the minimum RTT, after this ACK's sample.
    pub srtt: Duration,
    pub min_rtt: Duration,
}

/// What a variant's timer needs to know of the sender when it is armed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimerContext {
    pub now: Time,
    pub srtt: Duration,
    /// When the retransmission timer will fire, if armed.
    pub rto_at: Option<Time>,
    /// The receiver's delayed-ACK timer (RFC 8985 §7.2 WCDelAckT).
    pub max_ack_delay: Duration,
    /// Restart the probe timer: new data went out, or the cumulative ACK
    /// advanced (RFC 8985 §7.2).
    pub restart: bool,
}

/// What a variant's timer decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerVerdict {
    Nothing,
    /// Segments were marked lost outside fast recovery: start it.
    Enter(RecoveryTrigger),
    /// Segments were marked lost during recovery or timeout repair.
    Lost,
    /// Send a tail loss probe: this segment (snd_max for new data).
    Probe(u64),
}

/// What an ACK means for fast recovery, as a variant decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Outside fast recovery, and staying outside.
    Stay,
    /// Start fast recovery: the sender retransmits snd_una at once and
    /// marks every un-SACKed segment below `lost_below` lost.
    Enter {
        trigger: RecoveryTrigger,
        lost_below: Option<u64>,
    },
    /// Start fast recovery with the losses the variant has marked, and
    /// nothing forced: what is lost goes out as pipe allows (RACK).
    EnterMarked { trigger: RecoveryTrigger },
    /// Stay in fast recovery.
    Continue,
    /// Leave fast recovery: everything sent before it began is acknowledged.
    Leave,
}

/// The loss-recovery state the variants read and change.
#[derive(Debug)]
pub(crate) struct LossState {
    pub phase: Phase,
    pub dupacks: u32,
    /// snd_max when the last recovery or timeout began (RFC 6582 `recover`).
    pub recover: u64,
    /// Sent next whatever the window says.
    pub force_retransmit: Option<Forced>,
    pub dup_thresh: u64,
    /// `reordering adaptive`: measured reordering raises `dup_thresh`.
    adaptive: bool,
    /// The largest displacement seen, in segments (Linux's tp->reordering
    /// less its initial 3): how far below the highest SACKed segment an
    /// original, never resent, was delivered.
    pub reordering: u64,
}

/// The most `dup_thresh` the reordering metric may set (Linux's
/// tcp_max_reordering).
pub(crate) const MAX_REORDERING: u64 = 300;

impl LossState {
    pub(crate) fn new(t: &Tuning) -> LossState {
        LossState {
            phase: Phase::Open,
            dupacks: 0,
            recover: 0,
            force_retransmit: None,
            dup_thresh: u64::from(t.dup_thresh),
            adaptive: t.reordering == ReorderingKind::Adaptive,
            reordering: 0,
        }
    }

    /// Sarolahti & Kuznetsov §5 (Linux's tcp_update_reordering): a segment
    /// delivered `displacement` segments below the highest SACKed one, an
    /// original never resent. Fast retransmit waits for more
    /// duplicates than that, up to [`MAX_REORDERING`], and FACK stops
    /// taking everything below snd.fack for lost.
    pub(crate) fn note_reordering(&mut self, displacement: u64) {
        if displacement <= self.reordering {
            return;
        }
        self.reordering = displacement;
        if self.adaptive {
            self.dup_thresh = self.dup_thresh.max((displacement + 1).min(MAX_REORDERING));
        }
    }

    /// FACK's marking is off for this connection: reordering was seen
    /// and the threshold adapts (Linux's tcp_disable_fack).
    pub(crate) fn fack_off(&self) -> bool {
        self.adaptive && self.reordering > 0
    }

    /// BSD's snd_nxt: the next segment to go out, a retransmission if one is due.
    pub(crate) fn snd_nxt(&self, sb: &mut Scoreboard) -> u64 {
        self.force_retransmit
            .map(Forced::seg)
            .or_else(|| match self.phase {
                Phase::Recovery | Phase::Loss => sb.next_lost_pending(),
                Phase::Open | Phase::Disorder => None,
            })
            .unwrap_or(sb.max())
    }

    /// True once the cumulative ACK covers everything sent before the
    /// current recovery (or timeout) began.
    pub(crate) fn recovery_point_acked(&self, sb: &Scoreboard) -> bool {
        sb.una() >= self.recover
    }

    /// Whether `dup_thresh` duplicate ACKs have now arrived.
    pub(crate) fn enough_dupacks(&self, ack: &AckSummary) -> bool {
        // Brakmo §3.6: `>=`, not `>`.
        ack.is_dupack && u64::from(self.dupacks) >= self.dup_thresh
    }

    /// Fast retransmit (RFC 5681 §3.2 step 2): snd_una is lost and goes out
    /// now; recovery lasts until everything sent so far is acknowledged.
    pub(crate) fn enter_recovery(&mut self, sb: &mut Scoreboard, lost_below: Option<u64>) {
        let una = sb.una();
        self.recover = sb.max();
        sb.mark_lost(una);
        self.force_retransmit = Some(Forced::FastRetransmit(una));
        self.phase = Phase::Recovery;
        if let Some(limit) = lost_below {
            sb.mark_lost_below(limit);
        }
    }

    /// A retransmission timeout: every un-SACKed segment is presumed lost
    /// and resent from snd_una (RFC 6298 §5.4, RFC 5681 §3.1), and no fast
    /// retransmit starts until all of it is acknowledged.
    pub(crate) fn on_rto(&mut self, sb: &mut Scoreboard) {
        self.dupacks = 0;
        self.recover = sb.max();
        self.phase = Phase::Loss;
        self.force_retransmit = None;
        sb.mark_all_lost();
    }

    /// After an ACK outside fast recovery and timeout repair: Disorder while
    /// duplicate ACKs or SACKs are about, Open otherwise.
    pub(crate) fn settle(&mut self, sb: &Scoreboard) {
        if matches!(self.phase, Phase::Open | Phase::Disorder) {
            self.phase = if self.dupacks > 0 || sb.sacked() > 0 {
                Phase::Disorder
            } else {
                Phase::Open
            };
        }
    }
}

/// A loss-recovery variant. The sender calls `on_ack` after each valid ACK
/// has updated the scoreboard and the duplicate-ACK count.
pub(crate) trait LossRecovery: fmt::Debug + Send {
    fn kind(&self) -> RecoveryKind;

    /// Whether an ACK that acknowledged nothing new, with data outstanding,
    /// is a duplicate ACK. The default is RFC 6675 §2: it carries new SACK
    /// information.
    fn is_duplicate(&self, evidence: &DupEvidence) -> bool {
        evidence.newly_sacked > 0
    }

    /// Decides about entering, continuing and leaving fast recovery; marks
    /// losses and queues retransmissions while in it. Entering and leaving
    /// are the sender's to carry out.
    fn on_ack(&mut self, sb: &mut Scoreboard, st: &mut LossState, ack: &AckSummary) -> Verdict;

    /// A segment to retransmit when no segment is marked lost and the
    /// stream has no new data left (RFC 6675 NextSeg rules 3 and 4). Most
    /// variants have none.
    fn tail_retransmission(&mut self, _sb: &Scoreboard, _st: &LossState) -> Option<u64> {
        None
    }

    /// When the variant's own timer (RACK's reordering timer, TLP's probe
    /// timeout) should fire.
    fn deadline(&self) -> Option<Time> {
        None
    }

    /// After an ACK or a transmission: arm or cancel the variant's timer.
    fn arm(&mut self, _ctx: &TimerContext, _sb: &Scoreboard, _st: &LossState) {}

    /// The variant's timer expired; `new_data` says whether a segment of
    /// new data may go out (the receiver's window and the stream allow).
    fn on_deadline(
        &mut self,
        _now: Time,
        _sb: &mut Scoreboard,
        _st: &mut LossState,
        _new_data: bool,
    ) -> TimerVerdict {
        TimerVerdict::Nothing
    }

    /// A retransmission timeout.
    fn on_rto(&mut self) {}

    /// Whether the last ACK showed that a tail loss probe repaired a loss
    /// the congestion controller has not yet answered (RFC 8985 §7.4).
    fn take_probe_loss(&mut self) -> bool {
        false
    }
}

/// Builds the variant a tuning asks for.
pub(crate) fn for_kind(t: &Tuning) -> Box<dyn LossRecovery> {
    match t.recovery {
        RecoveryKind::Reno => Box::new(reno::Reno),
        RecoveryKind::NewReno => Box::new(newreno::NewReno),
        RecoveryKind::Sack => Box::new(sack::Sack::default()),
        RecoveryKind::Fack => Box::new(fack::Fack::default()),
        RecoveryKind::Rack => Box::new(rack::Rack::new(t)),
    }
}
