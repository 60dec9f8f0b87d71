//! How cwnd comes down to ssthresh during fast recovery, for controllers
//! that keep an ssthresh (AIMD, CUBIC).
//!
//! The controller decides how far to reduce (ssthresh); the way cwnd gets
//! there follows the loss-recovery variant's accounting of what has left
//! the network, so it is chosen from the tuning.

use super::{AckEvent, CongestionEvent};
use crate::proto::tuning::{RecoveryKind, ReductionKind, Tuning};

/// How cwnd moves during fast recovery, from the reduction to its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reduction {
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
    /// RFC 6937 §3.1, Proportional Rate Reduction with the slow-start
    /// reduction bound (PRR-SSRB): while pipe is above ssthresh, send
    /// ssthresh / RecoverFS of what is delivered; below it, catch up by
    /// at most what is delivered plus one per ACK. cwnd = pipe + sndcnt.
    Proportional {
        /// prr_delivered: segments delivered since recovery began.
        delivered: u64,
        /// RecoverFS: FlightSize when recovery began.
        recover_fs: u64,
        /// [`AckEvent::sent`] when recovery began, so prr_out is the
        /// difference.
        sent_at_start: u64,
    },
}

impl Reduction {
    /// PRR needs pipe, so it replaces only the SACK variants' one-step
    /// reduction: Reno and NewReno keep inflation (their sender counts
    /// FlightSize, not pipe), and FACK's `rampdown` is asked for by name.
    pub(super) fn for_tuning(t: &Tuning) -> Reduction {
        match t.recovery {
            RecoveryKind::Reno | RecoveryKind::NewReno => Reduction::Inflation {
                dup_thresh: u64::from(t.dup_thresh),
            },
            RecoveryKind::Fack if t.rampdown => Reduction::RateHalving { acks: 0 },
            RecoveryKind::Sack | RecoveryKind::Fack | RecoveryKind::Rack => match t.reduction {
                ReductionKind::Halve => Reduction::Immediate,
                ReductionKind::Prr => Reduction::Proportional {
                    delivered: 0,
                    recover_fs: 0,
                    sent_at_start: 0,
                },
            },
        }
    }

    /// cwnd at the start of fast recovery, once ssthresh is reduced.
    pub(super) fn start(&mut self, cwnd: u64, ssthresh: u64, event: &CongestionEvent) -> u64 {
        match self {
            // RFC 5681 §3.2 step 3: inflate by the segments that left.
            Reduction::Inflation { dup_thresh } => ssthresh + *dup_thresh,
            Reduction::Immediate => ssthresh,
            Reduction::RateHalving { acks } => {
                *acks = 0;
                cwnd.min(event.pipe + 1).max(1)
            }
            Reduction::Proportional {
                delivered,
                recover_fs,
                sent_at_start,
            } => {
                // RFC 6937 §3.1, at the beginning of recovery.
                *delivered = 0;
                *recover_fs = event.flight.max(1);
                *sent_at_start = event.sent;
                // Nothing may go out yet but the fast retransmit, which is
                // sent whatever the window says; the ACK that began
                // recovery then counts ([`Reduction::on_entering_ack`]).
                event.pipe.max(1)
            }
        }
    }

    /// cwnd after the ACK that began fast recovery: only PRR counts what
    /// it delivered (RFC 6937 §3.1, "on every ACK during recovery";
    /// Linux's tcp_cwnd_reduction runs on it). The others keep cwnd.
    pub(super) fn on_entering_ack(&mut self, cwnd: u64, ssthresh: u64, ack: &AckEvent) -> u64 {
        match self {
            Reduction::Proportional { .. } => self.on_ack(cwnd, ssthresh, ack),
            _ => cwnd,
        }
    }

    /// cwnd after one ACK during fast recovery that did not end it.
    pub(super) fn on_ack(&mut self, cwnd: u64, ssthresh: u64, ack: &AckEvent) -> u64 {
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
            Reduction::Proportional {
                delivered,
                recover_fs,
                sent_at_start,
            } => {
                // RFC 6937 §3.1, on every ACK during recovery.
                *delivered += ack.newly_delivered;
                let prr_out = ack.sent.saturating_sub(*sent_at_start);
                let pipe = ack.pipe;
                let sndcnt = if pipe > ssthresh {
                    // Proportional Rate Reduction.
                    let due = (*delivered * ssthresh).div_ceil(*recover_fs);
                    due.saturating_sub(prr_out)
                } else {
                    // PRR-SSRB: catch up, by at most what was delivered
                    // (or this ACK's delivery) plus one.
                    let limit = delivered.saturating_sub(prr_out).max(ack.newly_delivered) + 1;
                    (ssthresh - pipe).min(limit)
                };
                // Linux's tcp_cwnd_reduction: the fast retransmit goes out
                // whatever the count (atou forces it), so nothing more.
                (pipe + sndcnt).max(1)
            }
        }
    }
}
