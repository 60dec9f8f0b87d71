//! Reno: RFC 5681 §3.2 fast retransmit and fast recovery.
//!
//! Any ACK of new data ends recovery, so a second loss in the same window
//! needs a second fast retransmit or, usually, a timeout (Hoe §2.2.2). Reno
//! keeps no memory of a timeout either: duplicate ACKs caused by its own
//! go-back-N retransmissions can trigger a false fast retransmit (Hoe §2.2.3).
//! Both are kept on purpose: this is the baseline the other variants beat.

use super::{AckSummary, DupEvidence, Flow, Phase, Recovery};
use crate::proto::events::RecoveryTrigger;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug)]
pub struct Reno;

impl Recovery for Reno {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Reno
    }

    /// RFC 5681 §2: same ACK, same window. Every such ACK counts, those
    /// caused by its own needless retransmissions included.
    fn is_duplicate(&self, e: &DupEvidence) -> bool {
        !e.window_changed
    }

    fn on_ack(&mut self, flow: &mut Flow, ack: &AckSummary) {
        if flow.phase == Phase::Recovery {
            if ack.newly_acked > 0 {
                // RFC 5681 §3.2 step 6: deflate to ssthresh (Brakmo §3.1).
                flow.leave_recovery();
            } else if ack.is_dupack {
                // RFC 5681 §3.2 step 4: each further duplicate means a
                // segment left the network.
                flow.cwnd += 1;
            }
            return;
        }
        // Brakmo §3.6: `>=`, not `>`.
        if ack.is_dupack && u64::from(flow.dupacks) >= flow.dup_thresh {
            flow.enter_recovery(RecoveryTrigger::DupAcks);
            // RFC 5681 §3.2 step 3: inflate by the segments that left.
            flow.cwnd = flow.ssthresh + flow.dup_thresh;
        }
    }
}
