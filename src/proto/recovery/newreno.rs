//! NewReno: RFC 6582, after Hoe §3.2.
//!
//! Recovery lasts until everything outstanding when it began is
//! acknowledged. Each partial ACK retransmits the next hole at once, without
//! waiting for a timeout, so several losses in one window cost one halving
//! and one round trip each. Duplicate ACKs for data sent before a timeout
//! are ignored (Hoe §3.2 step (v); RFC 6582 §4.1): the sender is then in the
//! `Loss` phase, which only ends when that data is acknowledged; and ACKs
//! that report a duplicate segment are not duplicate ACKs.

use super::{AckSummary, DupEvidence, Flow, Forced, Phase, Recovery};
use crate::proto::events::RecoveryTrigger;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug)]
pub struct NewReno;

impl Recovery for NewReno {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::NewReno
    }

    /// RFC 5681 §2, except that an ACK reporting a duplicate segment (our
    /// D-SACK, RFC 2883) is not one: after a timeout, go-back-N resends
    /// segments the receiver already holds, and their ACKs would otherwise
    /// trigger a false fast retransmit once `recover` is passed (Hoe §2.2.3,
    /// Table 1).
    fn is_duplicate(&self, e: &DupEvidence) -> bool {
        !e.window_changed && !e.dsack
    }

    fn on_ack(&mut self, flow: &mut Flow, ack: &AckSummary) {
        match flow.phase {
            Phase::Recovery if ack.newly_acked > 0 => {
                if flow.recovery_point_acked() {
                    // RFC 6582 §3.2 step 3, full acknowledgement.
                    flow.leave_recovery();
                } else {
                    // RFC 6582 §3.2 step 3, partial acknowledgement: resend
                    // the first unacknowledged segment now, deflate cwnd by
                    // what was acknowledged and add back one segment.
                    let una = flow.sb.una();
                    flow.sb.mark_lost(una);
                    flow.force_retransmit = Some(Forced::PartialAck(una));
                    flow.cwnd = flow.cwnd.saturating_sub(ack.newly_acked).max(1) + 1;
                }
            }
            Phase::Recovery => {
                if ack.is_dupack {
                    // RFC 6582 §3.2 step 4.
                    flow.cwnd += 1;
                }
            }
            // Hoe §3.2 (v): not a new congestion signal.
            Phase::Loss => {}
            Phase::Open | Phase::Disorder => {
                if ack.is_dupack && u64::from(flow.dupacks) >= flow.dup_thresh {
                    flow.enter_recovery(RecoveryTrigger::DupAcks);
                    // RFC 6582 §3.2 step 2 (RFC 5681 step 3).
                    flow.cwnd = flow.ssthresh + flow.dup_thresh;
                }
            }
        }
    }
}
