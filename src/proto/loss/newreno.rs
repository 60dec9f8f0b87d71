//! NewReno: RFC 6582, after Hoe §3.2.
//!
//! Recovery lasts until everything outstanding when it began is
//! acknowledged. Each partial ACK retransmits the next hole at once, without
//! waiting for a timeout, so several losses in one window cost one halving
//! and one round trip each. Duplicate ACKs for data sent before a timeout
//! are ignored (Hoe §3.2 step (v); RFC 6582 §4.1): the sender is then in the
//! `Loss` phase, which only ends when that data is acknowledged; and ACKs
//! that report a duplicate segment are not duplicate ACKs. The window
//! inflation and deflation of RFC 6582 §3.2 is the congestion controller's
//! (`congestion::aimd`).

use super::{AckSummary, DupEvidence, Forced, LossRecovery, LossState, Phase, Verdict};
use crate::proto::events::RecoveryTrigger;
use crate::proto::stream::scoreboard::Scoreboard;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug)]
pub(super) struct NewReno;

impl LossRecovery for NewReno {
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

    fn on_ack(&mut self, sb: &mut Scoreboard, st: &mut LossState, ack: &AckSummary) -> Verdict {
        match st.phase {
            Phase::Recovery if ack.newly_acked > 0 => {
                if st.recovery_point_acked(sb) {
                    // RFC 6582 §3.2 step 3, full acknowledgement.
                    Verdict::Leave
                } else {
                    // RFC 6582 §3.2 step 3, partial acknowledgement: resend
                    // the first unacknowledged segment now.
                    let una = sb.una();
                    sb.mark_lost(una);
                    st.force_retransmit = Some(Forced::PartialAck(una));
                    Verdict::Continue
                }
            }
            Phase::Recovery => Verdict::Continue,
            // Hoe §3.2 (v): not a new congestion signal.
            Phase::Loss => Verdict::Stay,
            // RFC 6582 §3.2 step 2 (RFC 5681 step 3).
            Phase::Open | Phase::Disorder if st.enough_dupacks(ack) => Verdict::Enter {
                trigger: RecoveryTrigger::DupAcks,
                lost_below: None,
            },
            Phase::Open | Phase::Disorder => Verdict::Stay,
        }
    }
}
