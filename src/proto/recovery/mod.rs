//! Loss recovery variants behind one trait.
//!
//! The sender owns the scoreboard and the windows ([`Flow`]); after each ACK
//! has updated the scoreboard it asks its [`Recovery`] what the ACK means:
//! whether to enter recovery, what to mark lost, how to adjust cwnd, when to
//! leave. Everything the variants share (ssthresh reduction, the forced
//! fast retransmit, events, cwnd growth, timeouts) lives here or in the
//! sender, so a variant file holds only what makes it different. Adding a
//! variant is one new file and one arm in [`for_kind`].

mod fack;
mod newreno;
mod reno;
mod sack;

use std::collections::VecDeque;
use std::fmt;

use super::events::{Event, RecoveryTrigger, TimedEvent};
use super::scoreboard::Scoreboard;
use super::time::Time;
use super::tuning::{RecoveryKind, Tuning};

/// The sender's congestion state, after Linux's (Sarolahti §3).
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
pub enum Forced {
    /// The fast retransmit that starts recovery.
    FastRetransmit(u64),
    /// NewReno's retransmit on a partial ACK (RFC 6582 §3.2 step 3).
    PartialAck(u64),
}

impl Forced {
    pub fn seg(self) -> u64 {
        match self {
            Forced::FastRetransmit(s) | Forced::PartialAck(s) => s,
        }
    }
}

/// What an ACK that acknowledged nothing new carried: the variant decides
/// whether it is a duplicate ACK.
#[derive(Debug, Clone, Copy, Default)]
pub struct DupEvidence {
    /// Segments newly covered by SACK blocks.
    pub newly_sacked: u64,
    /// The advertised right edge moved (a window update).
    pub window_changed: bool,
    /// The ACK reports a duplicate segment (RFC 2883): the receiver got
    /// something twice, which says nothing about loss.
    pub dsack: bool,
}

/// What one ACK changed, as the variants need it.
#[derive(Debug, Clone, Copy, Default)]
pub struct AckSummary {
    /// Segments newly covered by the cumulative ACK.
    pub newly_acked: u64,
    /// A duplicate ACK, as the variant's [`Recovery::is_duplicate`] judged it.
    pub is_dupack: bool,
}

/// Counters that the summary reports with atou's names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Datagrams handed to the network, retransmissions and scripted drops included.
    pub pkts_out: u64,
    pub bytes_out: u64,
    /// Datagrams received from the peer, undecodable ones included.
    pub pkts_in: u64,
    pub rxmts: u64,
    /// Transmissions dropped by the droplist.
    pub dropped: u64,
    /// Fast retransmits (recovery entries).
    pub dup3s: u64,
    /// Retransmissions during recovery after the fast retransmit.
    pub packs: u64,
    pub timeouts: u64,
    /// Duplicate ACKs.
    pub dups: u64,
    pub badacks: u64,
    /// Datagrams that failed to decode or belonged to another connection.
    pub bad_packets: u64,
    /// ACKs carrying a D-SACK block: a segment arrived twice.
    pub dsacks: u64,
    /// Times the receiver reneged on a SACK (a cumulative ACK stopped at a
    /// segment it had SACKed); SACK information was discarded.
    pub reneges: u64,
    /// Most segments one ACK acknowledged.
    pub maxack: u64,
    /// Most segments sent in response to one event.
    pub maxburst: u64,
    /// Payload bytes acknowledged.
    pub good_bytes: u64,
}

/// The sender state the variants act on.
#[derive(Debug)]
pub struct Flow {
    pub sb: Scoreboard,
    /// Congestion window, in segments.
    pub cwnd: u64,
    /// Congestion-avoidance credit: cwnd grows by one when it reaches cwnd.
    pub cwnd_cnt: u64,
    pub ssthresh: u64,
    pub phase: Phase,
    pub dupacks: u32,
    /// snd_max when the last recovery or timeout began (RFC 6582 `recover`).
    pub recover: u64,
    /// Sent next whatever the window says.
    pub force_retransmit: Option<Forced>,
    pub dup_thresh: u64,
    pub multiplier: f64,
    pub vmss: u64,
    pub stats: SenderStats,
    pub events: VecDeque<TimedEvent>,
    pub now: Time,
    /// When the connection started: event and trace times count from it.
    pub start: Time,
    recovery_started: Time,
}

impl Flow {
    pub fn new(t: &Tuning, now: Time) -> Flow {
        Flow {
            sb: Scoreboard::default(),
            cwnd: u64::from(t.initsegs) * u64::from(t.vmss),
            cwnd_cnt: 0,
            ssthresh: t.initial_ssthresh(),
            phase: Phase::Open,
            dupacks: 0,
            recover: 0,
            force_retransmit: None,
            dup_thresh: u64::from(t.dup_thresh),
            multiplier: t.multiplier,
            vmss: u64::from(t.vmss),
            stats: SenderStats::default(),
            events: VecDeque::new(),
            now,
            start: now,
            recovery_started: now,
        }
    }

    pub fn emit(&mut self, event: Event) {
        self.events.push_back(TimedEvent {
            time: self.now.saturating_since(self.start),
            event,
        });
    }

    /// BSD's snd_nxt: the next segment to go out, a retransmission if one is due.
    pub fn snd_nxt(&mut self) -> u64 {
        self.force_retransmit
            .map(Forced::seg)
            .or_else(|| match self.phase {
                Phase::Recovery | Phase::Loss => self.sb.next_lost_pending(),
                Phase::Open | Phase::Disorder => None,
            })
            .unwrap_or(self.sb.max())
    }

    /// RFC 5681 eq. (4), with atou's multiplier and the floor in virtual
    /// segments: ssthresh = max(multiplier x FlightSize, 2 x vmss).
    pub fn reduced_ssthresh(&self) -> u64 {
        ((self.sb.flight() as f64 * self.multiplier).floor() as u64).max(2 * self.vmss)
    }

    /// Fast retransmit: reduce ssthresh, mark snd_una lost and send it now.
    /// The caller sets cwnd as its variant prescribes.
    pub fn enter_recovery(&mut self, trigger: RecoveryTrigger) {
        let una = self.sb.una();
        let event = Event::FastRetransmit {
            seg: una,
            snd_nxt: self.sb.max(),
            snd_max: self.sb.max(),
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
            recover: self.recover,
        };
        self.emit(event);
        self.ssthresh = self.reduced_ssthresh();
        self.recover = self.sb.max();
        self.sb.mark_lost(una);
        self.force_retransmit = Some(Forced::FastRetransmit(una));
        self.phase = Phase::Recovery;
        self.recovery_started = self.now;
        self.cwnd_cnt = 0;
        self.stats.dup3s += 1;
        let event = Event::EnterRecovery {
            trigger,
            snd_una: una,
            recover: self.recover,
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
        };
        self.emit(event);
    }

    /// Ends recovery with cwnd deflated to ssthresh (Brakmo §3.1, §3.6).
    pub fn leave_recovery(&mut self) {
        self.cwnd = self.ssthresh;
        self.cwnd_cnt = 0;
        self.phase = Phase::Open;
        let event = Event::LeaveRecovery {
            snd_una: self.sb.una(),
            cwnd: self.cwnd,
            ssthresh: self.ssthresh,
            duration: self.now.saturating_since(self.recovery_started),
        };
        self.emit(event);
    }

    /// True once the cumulative ACK covers everything sent before the
    /// current recovery (or timeout) began.
    pub fn recovery_point_acked(&self) -> bool {
        self.sb.una() >= self.recover
    }
}

/// A loss-recovery variant. The sender calls `on_ack` after each valid ACK
/// has updated the scoreboard and the duplicate-ACK count, and before
/// congestion-window growth (which it does itself outside recovery).
pub trait Recovery: fmt::Debug + Send {
    fn kind(&self) -> RecoveryKind;

    /// Whether an ACK that acknowledged nothing new, with data outstanding,
    /// is a duplicate ACK. The default is RFC 6675 §2: it carries new SACK
    /// information.
    fn is_duplicate(&self, evidence: &DupEvidence) -> bool {
        evidence.newly_sacked > 0
    }

    /// Decide about entering, continuing and leaving recovery.
    fn on_ack(&mut self, flow: &mut Flow, ack: &AckSummary);

    /// A segment to retransmit when no segment is marked lost and the
    /// stream has no new data left (RFC 6675 NextSeg rules 3 and 4). Most
    /// variants have none.
    fn tail_retransmission(&mut self, _flow: &Flow) -> Option<u64> {
        None
    }
}

/// Builds the variant a tuning asks for.
pub fn for_kind(t: &Tuning) -> Box<dyn Recovery> {
    match t.recovery {
        RecoveryKind::Reno => Box::new(reno::Reno),
        RecoveryKind::NewReno => Box::new(newreno::NewReno),
        RecoveryKind::Sack => Box::new(sack::Sack::default()),
        RecoveryKind::Fack => Box::new(fack::Fack::new(t.rampdown)),
    }
}
