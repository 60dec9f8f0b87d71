//! FACK: forward acknowledgement (Mathis & Mahdavi, SIGCOMM '96).
//!
//! The forward-most SACKed segment (snd.fack) bounds what the network still
//! holds: every un-SACKed segment below it is presumed lost and the sender
//! keeps `awnd = snd.nxt - snd.fack + retran_data` (our `pipe`, given that
//! marking) under cwnd. Recovery starts as soon as snd.fack is more than
//! `dup_thresh` segments beyond snd_una, or on `dup_thresh` duplicate ACKs.
//!
//! With `rampdown`, cwnd is not halved at once: it comes down one segment
//! per two ACKs to ssthresh, and never above `pipe + 1`, so transmission
//! continues at half the ACK rate through the lossy round trip (Mathis
//! appendix A; Linux's rate-halving, Sarolahti §3).

use super::{AckSummary, Flow, Phase, Recovery};
use crate::proto::events::RecoveryTrigger;
use crate::proto::tuning::RecoveryKind;

#[derive(Debug)]
pub struct Fack {
    rampdown: bool,
    /// ACKs received in this recovery, for the one-per-two rampdown.
    acks: u64,
}

impl Fack {
    pub fn new(rampdown: bool) -> Fack {
        Fack { rampdown, acks: 0 }
    }

    fn ramp_down(&mut self, flow: &mut Flow) {
        self.acks += 1;
        if self.acks % 2 == 0 && flow.cwnd > flow.ssthresh {
            flow.cwnd -= 1;
        }
        flow.cwnd = flow.cwnd.min(flow.sb.pipe() + 1).max(1);
    }
}

impl Recovery for Fack {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Fack
    }

    fn on_ack(&mut self, flow: &mut Flow, ack: &AckSummary) {
        let una = flow.sb.una();
        let fack = flow.sb.highest_sacked().map_or(una, |h| h + 1);
        match flow.phase {
            Phase::Recovery => {
                if flow.recovery_point_acked() {
                    flow.leave_recovery();
                    return;
                }
                flow.sb.mark_lost_below(fack);
                if self.rampdown {
                    self.ramp_down(flow);
                }
            }
            Phase::Loss => {}
            Phase::Open | Phase::Disorder => {
                let beyond = fack - una > flow.dup_thresh;
                let enough_dupacks = ack.is_dupack && u64::from(flow.dupacks) >= flow.dup_thresh;
                if beyond || enough_dupacks {
                    flow.enter_recovery(if beyond {
                        RecoveryTrigger::Fack
                    } else {
                        RecoveryTrigger::DupAcks
                    });
                    flow.sb.mark_lost_below(fack);
                    if self.rampdown {
                        self.acks = 0;
                        flow.cwnd = flow.cwnd.min(flow.sb.pipe() + 1).max(1);
                    } else {
                        flow.cwnd = flow.ssthresh;
                    }
                }
            }
        }
    }
}
