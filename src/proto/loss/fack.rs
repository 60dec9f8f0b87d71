//! FACK: forward acknowledgement (Mathis & Mahdavi, SIGCOMM '96).
//!
//! The forward-most SACKed segment (snd.fack) bounds what the network still
//! holds: every un-SACKed segment below it is presumed lost and the sender
//! keeps `awnd = snd.nxt - snd.fack + retran_data` (our `pipe`, given that
//! marking) under cwnd. Recovery starts as soon as snd.fack is more than
//! `dup_thresh` segments beyond snd_una, or on `dup_thresh` duplicate ACKs.
//!
//! With `rampdown`, the congestion controller brings cwnd down gradually
//! (`congestion::aimd`, Mathis appendix A); what is lost does not change.

use super::sack::Sack;
use super::{AckSummary, LossRecovery, LossState, Phase, Verdict};
use crate::proto::events::RecoveryTrigger;
use crate::proto::stream::scoreboard::Scoreboard;
use crate::proto::tuning::RecoveryKind;

/// Once the connection has seen reordering with `reordering adaptive`,
/// FACK's inference is off and RFC 6675's SACK decides (Linux's
/// tcp_disable_fack, Sarolahti §5).
#[derive(Debug, Default)]
pub(super) struct Fack {
    sack: Sack,
}

impl LossRecovery for Fack {
    fn kind(&self) -> RecoveryKind {
        RecoveryKind::Fack
    }

    fn on_ack(&mut self, sb: &mut Scoreboard, st: &mut LossState, ack: &AckSummary) -> Verdict {
        if st.fack_off() {
            return self.sack.on_ack(sb, st, ack);
        }
        let una = sb.una();
        let fack = sb.highest_sacked().map_or(una, |h| h + 1);
        match st.phase {
            Phase::Recovery => {
                if st.recovery_point_acked(sb) {
                    return Verdict::Leave;
                }
                sb.mark_lost_below(fack);
                Verdict::Continue
            }
            Phase::Loss => Verdict::Stay,
            Phase::Open | Phase::Disorder => {
                let beyond = fack - una > st.dup_thresh;
                if !(beyond || st.enough_dupacks(ack)) {
                    return Verdict::Stay;
                }
                Verdict::Enter {
                    trigger: if beyond {
                        RecoveryTrigger::Fack
                    } else {
                        RecoveryTrigger::DupAcks
                    },
                    lost_below: Some(fack),
                }
            }
        }
    }

    fn tail_retransmission(&mut self, sb: &Scoreboard, st: &LossState) -> Option<u64> {
        if st.fack_off() {
            self.sack.tail_retransmission(sb, st)
        } else {
            None
        }
    }
}
