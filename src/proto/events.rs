//! atou's instrumentation: event lines and the packet trace.
//!
//! These are program output, not logs. Event lines keep atou's names and
//! fields (atou Fig. 2) behind a time column; trace lines keep atou's format
//! exactly (`time seg xmt`, `time ack rtt cwnd ssthresh ack`), so existing
//! scripts such as atou's `probeall.pl` read them.

use std::fmt;
use std::time::Duration;

/// Why the sender entered loss recovery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryTrigger {
    /// `dup_thresh` duplicate ACKs.
    DupAcks,
    /// RFC 6675 IsLost: `dup_thresh` segments SACKed above the first hole.
    SackLoss,
    /// FACK: the forward-most SACK lies more than `dup_thresh` beyond snd_una.
    Fack,
    /// RACK (RFC 8985 §6.2): a segment sent before one since delivered has
    /// waited longer than an RTT and the reordering window.
    Rack,
}

impl RecoveryTrigger {
    fn name(self) -> &'static str {
        match self {
            RecoveryTrigger::DupAcks => "3dup",
            RecoveryTrigger::SackLoss => "sack",
            RecoveryTrigger::Fack => "fack",
            RecoveryTrigger::Rack => "rack",
        }
    }
}

/// Writes an ssthresh: a number, or `inf` before the first loss.
pub(crate) struct Thresh(pub u64);

impl fmt::Display for Thresh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == u64::MAX {
            f.write_str("inf")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// One of the sender's event lines (`--events`), with atou's names and
/// fields (atou Fig. 2); its [`fmt::Display`] writes the line without the
/// time column. Segment numbers and windows are in segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// `3duprxmit`: fast retransmit; window values from before the reduction.
    FastRetransmit(Retransmission),
    /// `timerxmit`: retransmission timeout; values after the reduction.
    TimeoutRetransmit {
        /// The segment sent again: the first unacknowledged one.
        seg: u64,
        /// The next segment to send, after going back to snd_una.
        snd_nxt: u64,
        /// One past the highest segment sent.
        snd_max: u64,
        /// The congestion window after the timeout.
        cwnd: u64,
        /// The slow-start threshold after the timeout; `u64::MAX` is `inf`.
        ssthresh: u64,
    },
    /// `packrxmit`: any further retransmission during recovery (NewReno's
    /// partial-ACK retransmits, SACK and FACK repairs).
    RecoveryRetransmit {
        /// The segment and the window, as a fast retransmit reports them.
        retransmission: Retransmission,
        /// The cumulative ACK point (first unacknowledged segment).
        snd_una: u64,
    },
    /// `badack`: an ACK below snd_una (out of order) or above snd_max.
    BadAck {
        /// The cumulative ACK the peer sent.
        ack: u64,
        /// One past the highest segment sent.
        snd_max: u64,
        /// The next segment to send.
        snd_nxt: u64,
        /// The first unacknowledged segment.
        snd_una: u64,
    },
    /// `enter_recovery`: loss recovery began; window values after the
    /// reduction.
    EnterRecovery {
        /// What detected the loss.
        trigger: RecoveryTrigger,
        /// The first unacknowledged segment.
        snd_una: u64,
        /// NewReno's `recover` (RFC 6582 §3.2): an ACK beyond it ends
        /// this recovery.
        recover: u64,
        /// The congestion window.
        cwnd: u64,
        /// The slow-start threshold; `u64::MAX` is `inf`.
        ssthresh: u64,
    },
    /// `leave_recovery`: an ACK covered `recover` and recovery ended.
    LeaveRecovery {
        /// The first unacknowledged segment.
        snd_una: u64,
        /// The congestion window on leaving.
        cwnd: u64,
        /// The slow-start threshold; `u64::MAX` is `inf`.
        ssthresh: u64,
        /// How long recovery lasted.
        duration: Duration,
    },
    /// No ACK for `maxidle`: the sender gives up.
    Idle {
        /// How long no ACK came (`maxidle`).
        idle: Duration,
    },
    /// `tlp`: a tail loss probe (RFC 8985 §7.3): new data, or the highest
    /// segment sent again.
    LossProbe {
        /// The segment sent as the probe.
        seg: u64,
        /// One past the highest segment sent, after the probe.
        snd_max: u64,
        /// True when the probe resent the highest segment (`rxmt`), false
        /// when it was new data (`new`).
        retransmission: bool,
    },
    /// `undo`: every retransmission of a recovery or a timeout proved
    /// spurious (D-SACK, RFC 2883; or the echoed timestamp, Eifel) and the
    /// reduction was reverted (Sarolahti §6). Values after the undo.
    Undo {
        /// `dsack` or `timestamp`.
        how: &'static str,
        /// The first unacknowledged segment.
        snd_una: u64,
        /// The congestion window restored.
        cwnd: u64,
        /// The slow-start threshold restored; `u64::MAX` is `inf`.
        ssthresh: u64,
    },
    /// `cc_state`: a model-based controller changed state, or its
    /// bandwidth estimate (by a quarter or more) or minimum RTT changed.
    Controller {
        /// The controller's name, as `--cc` takes it (`bbr`).
        controller: &'static str,
        /// Its state, as the BBR draft names it (`Startup`, `ProbeBW_UP`, ...).
        state: &'static str,
        /// Bandwidth estimate, bits per second.
        bw_bps: u64,
        /// Its minimum RTT estimate.
        min_rtt: Duration,
        /// The congestion window it sets, in segments.
        cwnd: u64,
        /// Pacing rate, bits per second.
        pacing_bps: u64,
    },
}

/// A retransmission during loss recovery, as atou's `3duprxmit` and
/// `packrxmit` lines report it: the segment sent again and the sender's
/// window, all in segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retransmission {
    /// The segment sent again.
    pub seg: u64,
    /// The next segment to send.
    pub snd_nxt: u64,
    /// One past the highest segment ever sent.
    pub snd_max: u64,
    /// The congestion window.
    pub cwnd: u64,
    /// The slow-start threshold; `u64::MAX` (written `inf`) before the
    /// first loss.
    pub ssthresh: u64,
    /// NewReno's `recover` (RFC 6582 §3.2): snd_max when recovery began;
    /// an ACK beyond it ends recovery.
    pub recover: u64,
}

/// `pkt S nxt N max M cwnd C thresh T recover R`, atou's words.
impl fmt::Display for Retransmission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pkt {} nxt {} max {} cwnd {} thresh {} recover {}",
            self.seg,
            self.snd_nxt,
            self.snd_max,
            self.cwnd,
            Thresh(self.ssthresh),
            self.recover
        )
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Event::FastRetransmit(ref retransmission) => write!(f, "3duprxmit {retransmission}"),
            Event::TimeoutRetransmit { seg, snd_nxt, snd_max, cwnd, ssthresh } => write!(
                f,
                "timerxmit pkt {seg} snd_nxt {snd_nxt} snd_max {snd_max} snd_cwnd {cwnd} thresh {}",
                Thresh(ssthresh)
            ),
            Event::RecoveryRetransmit {
                ref retransmission,
                snd_una,
            } => write!(f, "packrxmit {retransmission} una {snd_una}"),
            Event::BadAck { ack, snd_max, snd_nxt, snd_una } => write!(
                f,
                "badack {ack} snd_max {snd_max} snd_nxt {snd_nxt} snd_una {snd_una}"
            ),
            Event::EnterRecovery { trigger, snd_una, recover, cwnd, ssthresh } => write!(
                f,
                "enter_recovery una {snd_una} recover {recover} cwnd {cwnd} thresh {} trigger {}",
                Thresh(ssthresh),
                trigger.name()
            ),
            Event::LeaveRecovery { snd_una, cwnd, ssthresh, duration } => write!(
                f,
                "leave_recovery una {snd_una} cwnd {cwnd} thresh {} secs {:.6}",
                Thresh(ssthresh),
                duration.as_secs_f64()
            ),
            Event::Idle { idle } => write!(f, "maxidle no ACK for {:.3} s, giving up", idle.as_secs_f64()),
            Event::LossProbe { seg, snd_max, retransmission } => write!(
                f,
                "tlp pkt {seg} max {snd_max} {}",
                if retransmission { "rxmt" } else { "new" }
            ),
            Event::Undo { how, snd_una, cwnd, ssthresh } => write!(
                f,
                "undo {how} una {snd_una} cwnd {cwnd} thresh {}",
                Thresh(ssthresh)
            ),
            Event::Controller { controller, state, bw_bps, min_rtt, cwnd, pacing_bps } => write!(
                f,
                "cc_state {controller} {state} bw {:.6} Mbs min_rtt {:.6} cwnd {cwnd} pacing {:.6} Mbs",
                bw_bps as f64 / 1e6,
                min_rtt.as_secs_f64(),
                pacing_bps as f64 / 1e6
            ),
        }
    }
}

/// An event and when it happened, relative to the start of the transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedEvent {
    /// Since the start of the transfer.
    pub time: Duration,
    /// What happened.
    pub event: Event,
}

impl fmt::Display for TimedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.6} {}", self.time.as_secs_f64(), self.event)
    }
}

/// One line of atou's packet trace.
///
/// `Xmt` and `Ack` are atou's two lines. `Sack` and `State` are ours,
/// added for `atou plot`: each ends in its own tag, so a script that
/// selects atou's lines by their last word (`$NF == "ack"`) reads them as
/// before. They come just before the `Ack` line of the same ACK, which
/// stays followed by the transmissions that ACK released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceRecord {
    /// A segment transmitted (first time or again).
    Xmt {
        /// Since the start of the transfer.
        time: Duration,
        /// The segment's number.
        seg: u64,
    },
    /// `time ack rtt cwnd ssthresh ack`: an ACK processed, its cumulative
    /// ACK, RTT sample, and the window after it.
    Ack(AckRecord),
    /// `time start end sack`: one SACK block of the ACK, segments
    /// `start..end` held above the cumulative ACK.
    Sack {
        /// Since the start of the transfer.
        time: Duration,
        /// The block's first segment.
        start: u64,
        /// One past the block's last segment.
        end: u64,
    },
    /// `time srtt rto edge pacing bw state`: the sender after an ACK (and
    /// after a retransmission timeout, with the RTO backed off).
    State(StateRecord),
}

/// The trace's `ack` line: an ACK processed, its cumulative ACK, RTT
/// sample, and the window after it. Its fields live here once, so the
/// line's writer ([`fmt::Display`]) and its readers take the record whole
/// instead of each listing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRecord {
    /// When, relative to the start of the transfer.
    pub time: Duration,
    /// The cumulative ACK, in segments: the next segment the peer expects.
    pub ack: u64,
    /// The RTT sample from the echoed timestamp; zero when the ACK gave
    /// none.
    pub rtt: Duration,
    /// The congestion window after the ACK, in segments.
    pub cwnd: u64,
    /// The slow-start threshold, in segments; `u64::MAX` (written `inf`)
    /// before the first loss.
    pub ssthresh: u64,
}

impl fmt::Display for AckRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:.6} {} {:.6} {} {} ack",
            self.time.as_secs_f64(),
            self.ack,
            self.rtt.as_secs_f64(),
            self.cwnd,
            Thresh(self.ssthresh)
        )
    }
}

/// The trace's `state` line: the sender after an ACK, or after a
/// retransmission timeout with the RTO backed off. Its fields live here
/// once, so the line's writer ([`fmt::Display`]) and its readers take the
/// record whole instead of each listing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateRecord {
    /// When, relative to the start of the transfer.
    pub time: Duration,
    /// Smoothed RTT (RFC 6298 §2); zero before the first sample.
    pub srtt: Duration,
    /// Retransmission timeout (RFC 6298 §2, backed off per §5.5).
    pub rto: Duration,
    /// The receive window's right edge: the first segment the peer cannot
    /// take.
    pub right_edge: u64,
    /// The controller's pacing rate, bits per second; `None` (`-`) when it
    /// does not pace.
    pub pacing_bps: Option<u64>,
    /// The controller's bandwidth estimate, bits per second; `None` (`-`)
    /// when it keeps none.
    pub bw_bps: Option<u64>,
}

impl fmt::Display for StateRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rate = |r: Option<u64>| r.map_or("-".to_string(), |r| r.to_string());
        write!(
            f,
            "{:.6} {:.6} {:.6} {} {} {} state",
            self.time.as_secs_f64(),
            self.srtt.as_secs_f64(),
            self.rto.as_secs_f64(),
            self.right_edge,
            rate(self.pacing_bps),
            rate(self.bw_bps)
        )
    }
}

impl fmt::Display for TraceRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TraceRecord::Xmt { time, seg } => write!(f, "{:.6} {seg} xmt", time.as_secs_f64()),
            TraceRecord::Ack(ref ack) => ack.fmt(f),
            TraceRecord::Sack { time, start, end } => {
                write!(f, "{:.6} {start} {end} sack", time.as_secs_f64())
            }
            TraceRecord::State(ref state) => state.fmt(f),
        }
    }
}

/// Receives what happens during a run: the event lines and the packet
/// trace of one or several connections. The simulator and the I/O driver
/// both feed one; the CLI and the transfer layer implement it.
pub trait Observer {
    /// An event line of a single-flow run; by default ignored.
    fn on_event(&mut self, _event: &TimedEvent) {}
    /// A trace record of a single-flow run; by default ignored.
    fn on_trace(&mut self, _record: &TraceRecord) {}
    /// An event of flow `flow` (0 in a single-flow run); by default
    /// [`Observer::on_event`], whichever the flow.
    fn on_flow_event(&mut self, _flow: usize, event: &TimedEvent) {
        self.on_event(event);
    }
    /// A trace record of flow `flow`; by default [`Observer::on_trace`].
    fn on_flow_trace(&mut self, _flow: usize, record: &TraceRecord) {
        self.on_trace(record);
    }
}

/// Ignores everything.
impl Observer for () {}

/// Keeps everything, for tests.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every event, in the order they came.
    pub events: Vec<TimedEvent>,
    /// Every trace record, in the order they came.
    pub trace: Vec<TraceRecord>,
}

impl Observer for Recorder {
    fn on_event(&mut self, event: &TimedEvent) {
        self.events.push(event.clone());
    }
    fn on_trace(&mut self, record: &TraceRecord) {
        self.trace.push(*record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_match_atou_figure_2_and_the_trace_format() {
        let retransmission = Retransmission {
            seg: 416,
            snd_nxt: 616,
            snd_max: 616,
            cwnd: 200,
            ssthresh: 200,
            recover: 0,
        };
        let e = Event::FastRetransmit(retransmission.clone());
        assert_eq!(
            e.to_string(),
            "3duprxmit pkt 416 nxt 616 max 616 cwnd 200 thresh 200 recover 0"
        );
        let e = Event::RecoveryRetransmit {
            retransmission,
            snd_una: 420,
        };
        assert_eq!(
            e.to_string(),
            "packrxmit pkt 416 nxt 616 max 616 cwnd 200 thresh 200 recover 0 una 420"
        );
        let e = Event::BadAck {
            ack: 6636,
            snd_max: 6808,
            snd_nxt: 6808,
            snd_una: 6661,
        };
        assert_eq!(
            e.to_string(),
            "badack 6636 snd_max 6808 snd_nxt 6808 snd_una 6661"
        );
        let at = Duration::from_micros(408_196);
        for (record, line) in [
            (
                TraceRecord::Ack(AckRecord {
                    time: at,
                    ack: 234,
                    rtt: Duration::from_micros(38_062),
                    cwnd: 26,
                    ssthresh: 26,
                }),
                "0.408196 234 0.038062 26 26 ack",
            ),
            (
                TraceRecord::Xmt {
                    time: Duration::from_micros(408_133),
                    seg: 258,
                },
                "0.408133 258 xmt",
            ),
            (
                TraceRecord::Sack {
                    time: at,
                    start: 236,
                    end: 240,
                },
                "0.408196 236 240 sack",
            ),
            (
                TraceRecord::State(StateRecord {
                    time: at,
                    srtt: Duration::from_micros(38_500),
                    rto: Duration::from_millis(200),
                    right_edge: 8426,
                    pacing_bps: None,
                    bw_bps: Some(95_000_000),
                }),
                "0.408196 0.038500 0.200000 8426 - 95000000 state",
            ),
        ] {
            assert_eq!(record.to_string(), line);
        }
    }
}
