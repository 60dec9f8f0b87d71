//! SACK: RFC 6675's conservative loss recovery.
//!
//! A segment is lost once `dup_thresh` segments above it are SACKed (IsLost).
//! Recovery starts on `dup_thresh` duplicate ACKs or when snd_una is lost;
//! cwnd drops to ssthresh at once and the sender transmits while
//! `pipe < cwnd`, choosing with NextSeg: lost segments first (rule 1), then
//! new data (rule 2, in the sender), then un-SACKed segments below the
//! highest SACK (rule 3), then one rescue retransmission (rule 4).
//!
//! Deviation: rules 3 and 4 apply only once the stream has no new data
//! left, the tail case they exist for. While the sender is merely held by
//! a window, more ACKs are coming and they would only resend segments
//! still in flight.

use super::{AckSummary, Flow, Phase, Recovery};
use crate::proto::events::RecoveryTrigger;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug, Default)]
pub struct Sack {
    /// RFC 6675 RescueRxt: at most one rescue retransmission per recovery.
    rescue_sent: bool,
}

impl Recovery for Sack {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Sack
    }

    fn on_ack(&mut self, flow: &mut Flow, ack: &AckSummary) {
        // RFC 6675 §4 IsLost: everything below the dup_thresh-th highest
        // SACKed segment has dup_thresh SACKed segments above it.
        let lost_below = flow.sb.kth_highest_sacked(flow.dup_thresh);
        match flow.phase {
            Phase::Recovery => {
                // RFC 6675 §5 (A).
                if flow.recovery_point_acked() {
                    flow.leave_recovery();
                } else if let Some(limit) = lost_below {
                    flow.sb.mark_lost_below(limit);
                }
            }
            // RFC 6675 §5.1: no new recovery until the timeout is repaired.
            Phase::Loss => {}
            Phase::Open | Phase::Disorder => {
                let una_lost = lost_below.is_some_and(|limit| flow.sb.una() < limit);
                let enough_dupacks = ack.is_dupack && u64::from(flow.dupacks) >= flow.dup_thresh;
                if enough_dupacks || una_lost {
                    flow.enter_recovery(if enough_dupacks {
                        RecoveryTrigger::DupAcks
                    } else {
                        RecoveryTrigger::SackLoss
                    });
                    // RFC 6675 §5 (4.2): cwnd = ssthresh, no inflation.
                    flow.cwnd = flow.ssthresh;
                    if let Some(limit) = lost_below {
                        flow.sb.mark_lost_below(limit);
                    }
                    self.rescue_sent = false;
                }
            }
        }
    }

    fn tail_retransmission(&mut self, flow: &Flow) -> Option<u64> {
        if flow.phase != Phase::Recovery {
            return None;
        }
        // RFC 6675 §4 NextSeg rule 3.
        if let Some(highest) = flow.sb.highest_sacked() {
            if let Some(seg) = flow
                .sb
                .next_unsacked_unretransmitted(flow.sb.una(), highest)
            {
                return Some(seg);
            }
        }
        // RFC 6675 §4 NextSeg rule 4: one rescue retransmission.
        if !self.rescue_sent {
            if let Some(seg) = flow.sb.highest_unsacked_unretransmitted() {
                self.rescue_sent = true;
                return Some(seg);
            }
        }
        None
    }
}
