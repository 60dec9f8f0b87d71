//! How cwnd comes down to ssthresh during fast recovery, for controllers
//! that keep an ssthresh (AIMD, CUBIC).
//!
//! The controller decides how far to reduce (ssthresh); the way cwnd gets
//! there follows the loss-recovery variant's accounting of what has left
//! the network, so it is chosen from the tuning.

use super::AckEvent;
use crate::proto::tuning::{RecoveryKind, Tuning};

/// How cwnd moves during fast recovery, from the reduction to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// RFC 5681 §3.2 steps 3–4, RFC 6582 §3.2 steps 2–4: without SACK,
    /// duplicate ACKs stand in for segments that left the network. cwnd =
    /// ssthresh + dup_thresh, one more per duplicate ACK; a partial ACK
    /// deflates it by what it acknowledged and adds one back.
    Inflation { dup_thresh: u64 },
    /// RFC 6675 §5 (4.2): cwnd = ssthresh at once; pipe does the counting.
    Immediate,
    /// Mathis & Mahdavi appendix A (FACK `rampdown`): cwnd comes down one
    /// segment per two ACKs to ssthresh, never above pipe + 1, so sending
    /// goes on at half the ACK rate (Linux's rate-halving, Sarolahti §3).
    RateHalving {
        /// ACKs received in this recovery.
        acks: u64,
    },
}

impl Reduction {
    pub fn for_tuning(t: &Tuning) -> Reduction {
        match t.recovery {
            RecoveryKind::Reno | RecoveryKind::NewReno => Reduction::Inflation {
                dup_thresh: u64::from(t.dup_thresh),
            },
            RecoveryKind::Fack if t.rampdown => Reduction::RateHalving { acks: 0 },
            RecoveryKind::Sack | RecoveryKind::Fack | RecoveryKind::Rack => Reduction::Immediate,
        }
    }

    /// cwnd at the start of fast recovery, once ssthresh is reduced.
    pub fn start(&mut self, cwnd: u64, ssthresh: u64, pipe: u64) -> u64 {
        match self {
            // RFC 5681 §3.2 step 3: inflate by the segments that left.
            Reduction::Inflation { dup_thresh } => ssthresh + *dup_thresh,
            Reduction::Immediate => ssthresh,
            Reduction::RateHalving { acks } => {
                *acks = 0;
                cwnd.min(pipe + 1).max(1)
            }
        }
    }

    /// cwnd after one ACK during fast recovery that did not end it.
    pub fn on_ack(&mut self, cwnd: u64, ssthresh: u64, ack: &AckEvent) -> u64 {
        match self {
            Reduction::Inflation { .. } => {
                if ack.newly_acked > 0 {
                    // RFC 6582 §3.2 step 3, partial acknowledgement.
                    cwnd.saturating_sub(ack.newly_acked).max(1) + 1
                } else if ack.is_dupack {
                    // RFC 5681 §3.2 step 4, RFC 6582 §3.2 step 4: each
                    // further duplicate means a segment left the network.
                    cwnd + 1
                } else {
                    cwnd
                }
            }
            Reduction::Immediate => cwnd,
            Reduction::RateHalving { acks } => {
                *acks += 1;
                let cwnd = if *acks % 2 == 0 && cwnd > ssthresh {
                    cwnd - 1
                } else {
                    cwnd
                };
                cwnd.min(ack.pipe + 1).max(1)
            }
        }
    }
}
