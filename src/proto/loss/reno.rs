//! Reno: RFC 5681 §3.2 fast retransmit and fast recovery.
//!
//! Any ACK of new data ends recovery, so a second loss in the same window
//! needs a second fast retransmit or, usually, a timeout (Hoe §2.2.2). Reno
//! keeps no memory of a timeout either: duplicate ACKs caused by its own
//! go-back-N retransmissions can trigger a false fast retransmit (Hoe §2.2.3).
//! Both are kept on purpose: this is the baseline the other variants beat.
//! The window inflation of RFC 5681 §3.2 steps 3–4 is the congestion
//! controller's (`congestion::aimd`).

use super::{AckSummary, DupEvidence, LossRecovery, LossState, Phase, Verdict};
use crate::proto::events::RecoveryTrigger;
use crate::proto::stream::scoreboard::Scoreboard;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug)]
pub(super) struct Reno;

impl LossRecovery for Reno {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Reno
    }

    /// RFC 5681 §2: same ACK, same window. Every such ACK counts, those
    /// caused by its own needless retransmissions included.
    fn is_duplicate(&self, e: &DupEvidence) -> bool {
        !e.window_changed
    }

    fn on_ack(&mut self, _sb: &mut Scoreboard, st: &mut LossState, ack: &AckSummary) -> Verdict {
        if st.phase == Phase::Recovery {
            return if ack.newly_acked > 0 {
                // RFC 5681 §3.2 step 6.
                Verdict::Leave
            } else {
                Verdict::Continue
            };
        }
        if st.enough_dupacks(ack) {
            Verdict::Enter {
                trigger: RecoveryTrigger::DupAcks,
                lost_below: None,
            }
        } else {
            Verdict::Stay
        }
    }
}
