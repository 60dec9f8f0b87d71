//! Delivery-rate sampling, after draft-cheng-iccrg-delivery-rate-estimation-02
//! ("DRE" below; section names are the draft's).
//!
//! Pure: the sender stamps each transmission with [`DeliveryRate::on_sent`]
//! and keeps the [`SendStamp`] in the scoreboard beside the segment; when an
//! ACK or SACK first reports the segment delivered, the sender hands the
//! stamp back to [`DeliveryRate::on_delivered`], and once per ACK asks
//! [`DeliveryRate::sample`] for the [`RateSample`] the ACK gives.
//!
//! Counts are in segments and rates in segments per second: the windows they
//! feed are in segments too.
//!
//! The rate is delivered / interval over the most recent flight, with
//! interval = max(send elapsed, ACK elapsed), so neither a burst of sends
//! nor a burst of ACKs (ACK compression) inflates it; samples shorter than
//! the minimum RTT are rejected. A segment is counted once, when it is first
//! SACKed or cumulatively acknowledged, so only SACK-based recovery gives
//! samples as deliveries happen; with Reno and NewReno a cumulative ACK that
//! fills a hole reports everything above it at once.

use std::time::Duration;

use crate::proto::time::Time;

/// What the sampler knew when a segment was (re)transmitted: DRE's
/// per-packet (P) state, plus BBR's `tx_in_flight` and `lost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SendStamp {
    /// When this transmission left.
    pub sent_time: Time,
    /// Segments delivered when it left (C.delivered).
    pub delivered: u64,
    /// When the last of those was delivered (C.delivered_time).
    pub delivered_time: Time,
    /// When the segment most recently delivered at that moment had been
    /// sent: the start of this segment's send phase (C.first_sent_time).
    pub first_sent_time: Time,
    /// Segments in flight once this one was sent (RFC 6675 pipe).
    pub tx_in_flight: u64,
    /// Segments marked lost when it left.
    pub lost: u64,
    /// Sent while the sender was application-limited.
    pub is_app_limited: bool,
}

/// The delivery rate an ACK measured: DRE's rate sample (rs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RateSample {
    /// Segments delivered over `interval`.
    pub delivered: u64,
    /// max(send_elapsed, ack_elapsed), never shorter than the minimum RTT.
    pub interval: Duration,
    pub send_elapsed: Duration,
    pub ack_elapsed: Duration,
    /// C.delivered when the newest segment this ACK delivered was sent.
    pub prior_delivered: u64,
    /// In flight when that segment was sent.
    pub tx_in_flight: u64,
    /// Segments marked lost since that segment was sent.
    pub lost: u64,
    /// The sender was application-limited when that segment was sent: the
    /// rate says what the sender offered, not what the path can carry, so
    /// it may only raise a bandwidth estimate, never stand for it.
    pub is_app_limited: bool,
}

impl RateSample {
    /// Segments per second.
    pub(crate) fn rate(&self) -> f64 {
        self.delivered as f64 / self.interval.as_secs_f64()
    }
}

/// The newest segment delivered by the ACK being processed.
#[derive(Debug, Clone, Copy)]
struct Newest {
    stamp: SendStamp,
    /// When it was delivered (C.delivered_time at the time).
    delivered_at: Time,
}

/// DRE's per-connection (C) state.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeliveryRate {
    /// Segments delivered so far, SACKed ones included (C.delivered).
    delivered: u64,
    /// When `delivered` last grew (C.delivered_time).
    delivered_time: Time,
    /// Send time of the segment most recently delivered (C.first_sent_time).
    first_sent_time: Time,
    /// Zero, or the value of `delivered` at which the current
    /// application-limited phase ends (C.app_limited).
    app_limited: u64,
    /// Zero, or the value of `delivered` at which a phase held by the
    /// receiver's window ends: the sender did not fill its window, but
    /// had data to send, so its rate samples still measure the path.
    window_limited: u64,
    /// The newest segment delivered by the ACK in progress.
    newest: Option<Newest>,
    /// Segments the other connections of a coupled group have delivered
    /// ([`DeliveryRate::set_group_others`]); zero for a connection alone.
    others: u64,
}

impl DeliveryRate {
    /// Segments delivered so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Segments the whole coupled group has delivered: this connection's
    /// and the others' ([`DeliveryRate::set_group_others`]). The stamps
    /// and samples count these, so a coupled connection measures its
    /// group's delivery rate, as if the group were one connection; the
    /// application-limited phases count this connection's own.
    pub(crate) fn group_delivered(&self) -> u64 {
        self.delivered + self.others
    }

    /// What the other connections of this one's coupled group have
    /// delivered so far (never less than last told).
    pub(crate) fn set_group_others(&mut self, others: u64) {
        self.others = self.others.max(others);
    }

    /// Whether the sender is in an application-limited phase.
    pub(crate) fn is_app_limited(&self) -> bool {
        self.app_limited != 0
    }

    /// Whether the sender has not filled its window of late, waiting for
    /// the application or for the receiver's window (what cwnd validation
    /// means by application-limited, RFC 9438 §5.8).
    pub(crate) fn is_send_limited(&self) -> bool {
        self.app_limited != 0 || self.window_limited != 0
    }

    /// DRE "Transmitting a data packet": the stamp to keep with a segment
    /// sent at `now` while `outstanding` segments were already unacknowledged
    /// and `lost` had been marked lost; `in_flight` counts it.
    pub(crate) fn on_sent(
        &mut self,
        now: Time,
        outstanding: u64,
        in_flight: u64,
        lost: u64,
    ) -> SendStamp {
        if outstanding == 0 {
            // Nothing in flight: a new send phase starts now, so the idle
            // time before it counts in neither elapsed time.
            self.first_sent_time = now;
            self.delivered_time = now;
        }
        SendStamp {
            sent_time: now,
            delivered: self.group_delivered(),
            delivered_time: self.delivered_time,
            first_sent_time: self.first_sent_time,
            tx_in_flight: in_flight,
            lost,
            is_app_limited: self.is_app_limited(),
        }
    }

    /// DRE "Detecting application-limited phases": the sender has room in
    /// its window and nothing lost to resend, but the application has not
    /// produced the data. The phase lasts until what is now in flight is
    /// delivered, and the samples of what is sent in it are marked.
    pub(crate) fn on_app_limited(&mut self, in_flight: u64) {
        self.app_limited = (self.delivered + in_flight).max(1);
    }

    /// Room in the window, data to send, but the receiver's window is
    /// shut. Not application-limited for the rate samples: DRE's first
    /// condition is "less than one SMSS of unsent data", as Linux's
    /// tcp_rate_check_app_limited ("less than 1 MSS of unsent data in the
    /// write queue"). A sender held by a window sized near two BDPs (the
    /// commands' 32768 segments at 1 Gbit/s, 100 ms, while a hole holds
    /// snd_una for two round trips) delivers at the path's rate; marking
    /// its samples kept bbr's plateau check (draft-ietf-ccwg-bbr
    /// §5.3.1.2, which skips app-limited samples) from ever counting a
    /// round, and Startup ran on with a full queue. The phase still counts
    /// as not filling the window (`is_send_limited`).
    pub(crate) fn on_window_limited(&mut self, in_flight: u64) {
        self.window_limited = (self.delivered + in_flight).max(1);
    }

    /// DRE "Upon receiving an ACK", UpdateRateSample: `stamp`'s segment was
    /// delivered (first SACKed or cumulatively acknowledged) at `now`. Call
    /// once per segment, never again for the same transmission.
    pub(crate) fn on_delivered(&mut self, now: Time, stamp: &SendStamp) {
        self.delivered += 1;
        self.delivered_time = now;
        let newest = match &self.newest {
            None => true,
            // The segment sent last defines the flight being measured.
            Some(n) => {
                stamp.sent_time > n.stamp.sent_time
                    || (stamp.sent_time == n.stamp.sent_time && stamp.delivered > n.stamp.delivered)
            }
        };
        if newest {
            self.newest = Some(Newest {
                stamp: *stamp,
                delivered_at: now,
            });
            self.first_sent_time = stamp.sent_time;
        }
    }

    /// DRE "Upon receiving an ACK", GenerateRateSample: once every segment
    /// an ACK delivered has been passed to [`DeliveryRate::on_delivered`].
    /// `lost` is the number of segments marked lost so far; `min_rtt` the
    /// smallest RTT seen, zero if none. `None` if the ACK delivered nothing,
    /// or its interval is shorter than `min_rtt` and so cannot be trusted.
    pub(crate) fn sample(&mut self, lost: u64, min_rtt: Duration) -> Option<RateSample> {
        // The application-limited bubble has been delivered.
        if self.app_limited != 0 && self.delivered > self.app_limited {
            self.app_limited = 0;
        }
        if self.window_limited != 0 && self.delivered > self.window_limited {
            self.window_limited = 0;
        }
        let Newest {
            stamp: p,
            delivered_at,
        } = self.newest.take()?;
        let send_elapsed = p.sent_time.saturating_since(p.first_sent_time);
        let ack_elapsed = delivered_at.saturating_since(p.delivered_time);
        let interval = send_elapsed.max(ack_elapsed);
        if interval.is_zero() || interval < min_rtt {
            return None;
        }
        Some(RateSample {
            delivered: self.group_delivered() - p.delivered,
            interval,
            send_elapsed,
            ack_elapsed,
            prior_delivered: p.delivered,
            tx_in_flight: p.tx_in_flight,
            lost: lost.saturating_sub(p.lost),
            is_app_limited: p.is_app_limited,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Time {
        Time::from_nanos(n * 1_000_000)
    }

    /// A flight of ten segments sent 1 ms apart and acknowledged 1 ms apart
    /// one RTT later: ten segments per ten milliseconds.
    #[test]
    fn a_paced_flight_measures_its_own_rate() {
        let mut r = DeliveryRate::default();
        let stamps: Vec<SendStamp> = (0..10).map(|i| r.on_sent(ms(i), i, i + 1, 0)).collect();
        let mut last = None;
        for (i, s) in stamps.iter().enumerate() {
            r.on_delivered(ms(100 + i as u64), s);
            last = r.sample(0, Duration::from_millis(100)).or(last);
        }
        let s = last.expect("samples once the interval reaches min_rtt");
        // The last ACK: 10 delivered since the first was sent, over
        // max(9 ms of sending, 109 ms since the flight began).
        assert_eq!(s.delivered, 10);
        assert_eq!(s.interval, Duration::from_millis(109));
        assert!(!s.is_app_limited);
    }

    /// DRE: a sample over an interval shorter than min_rtt is no sample.
    #[test]
    fn samples_shorter_than_min_rtt_are_rejected() {
        let mut r = DeliveryRate::default();
        let a = r.on_sent(ms(0), 0, 1, 0);
        r.on_delivered(ms(50), &a);
        assert!(r.sample(0, Duration::from_millis(60)).is_none());
        let b = r.on_sent(ms(50), 0, 1, 0);
        r.on_delivered(ms(120), &b);
        assert!(r.sample(0, Duration::from_millis(60)).is_some());
    }

    /// Segments sent during an application-limited phase give samples
    /// marked as such; the phase ends once its bubble is delivered.
    #[test]
    fn app_limited_marks_last_until_the_bubble_is_delivered() {
        let mut r = DeliveryRate::default();
        let a = r.on_sent(ms(0), 0, 1, 0);
        r.on_app_limited(1);
        let b = r.on_sent(ms(10), 1, 2, 0);
        r.on_delivered(ms(100), &a);
        assert!(!r.sample(0, Duration::ZERO).unwrap().is_app_limited);
        assert!(
            r.is_app_limited(),
            "the phase ends once more than its flight is delivered"
        );
        r.on_delivered(ms(110), &b);
        assert!(r.sample(0, Duration::ZERO).unwrap().is_app_limited);
        assert!(!r.is_app_limited());
        let c = r.on_sent(ms(110), 0, 1, 0);
        r.on_delivered(ms(210), &c);
        assert!(!r.sample(0, Duration::ZERO).unwrap().is_app_limited);
    }

    /// A coupled connection's sample counts what its group delivered
    /// since the segment left: ten of its own and thirty of the others'
    /// over 100 ms is the group's 400 segments a second.
    #[test]
    fn a_coupled_sample_counts_the_groups_deliveries() {
        let mut r = DeliveryRate::default();
        r.set_group_others(5);
        let stamps: Vec<SendStamp> = (0..10).map(|i| r.on_sent(ms(0), i, i + 1, 0)).collect();
        assert_eq!(stamps[0].delivered, 5);
        r.set_group_others(35);
        for s in &stamps {
            r.on_delivered(ms(100), s);
        }
        let s = r.sample(0, Duration::ZERO).unwrap();
        assert_eq!(s.delivered, 40);
        assert_eq!(s.rate(), 400.0);
        assert_eq!((r.delivered(), r.group_delivered()), (10, 45));
        // What the others delivered never goes back.
        r.set_group_others(3);
        assert_eq!(r.group_delivered(), 45);
    }

    /// Losses between a segment's transmission and its delivery are
    /// reported with the sample (BBR's loss rate per flight).
    #[test]
    fn a_sample_reports_losses_since_its_segment_left() {
        let mut r = DeliveryRate::default();
        let a = r.on_sent(ms(0), 0, 1, 3);
        r.on_delivered(ms(100), &a);
        assert_eq!(r.sample(7, Duration::ZERO).unwrap().lost, 4);
    }
}

#[cfg(test)]
mod properties {
    //! The sampler and the real scoreboard, driven by a model path: a
    //! bottleneck that serves one segment per `service`, constant delays,
    //! random loss, a receiver that SACKs every arrival, and an application
    //! that stalls at random. After every ACK the samples are checked
    //! against what the model knows was delivered.
    use std::cmp::Reverse;
    use std::collections::{BTreeSet, BinaryHeap};

    use proptest::prelude::*;

    use super::*;
    use crate::proto::stream::scoreboard::Scoreboard;
    use crate::proto::wire::SackBlock;

    #[derive(Debug, Clone)]
    struct Path {
        /// Bottleneck service time per segment, microseconds.
        service_us: u64,
        fwd_us: u64,
        rev_us: u64,
        loss: f64,
        cwnd: u64,
        /// (time in µs, segments the application has produced by then).
        supply: Vec<(u64, u64)>,
        seed: u64,
    }

    fn path() -> impl Strategy<Value = Path> {
        (
            50u64..5_000,
            0u64..50_000,
            0u64..50_000,
            prop_oneof![Just(0.0), 0.0..0.2f64],
            1u64..64,
            proptest::collection::vec((0u64..2_000_000, 1u64..40), 1..12),
            any::<u64>(),
        )
            .prop_map(|(service_us, fwd_us, rev_us, loss, cwnd, steps, seed)| {
                // The application produces its data in steps at random times.
                let mut supply: Vec<(u64, u64)> = Vec::new();
                let mut times: Vec<u64> = steps.iter().map(|s| s.0).collect();
                times.sort_unstable();
                let mut total = 0;
                for (t, (_, n)) in times.into_iter().zip(steps) {
                    total += n;
                    supply.push((t, total));
                }
                Path {
                    service_us,
                    fwd_us,
                    rev_us,
                    loss,
                    cwnd,
                    supply,
                    seed,
                }
            })
    }

    #[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Ev {
        /// The application may have more data.
        Supply,
        /// (segment, its transmission's send time) reaches the receiver.
        Arrive(u64, u64),
        /// An ACK (cumulative, the segment it SACKs, echoed send time).
        Ack(u64, u64, u64),
    }

    struct Run {
        samples: Vec<(Time, RateSample)>,
        /// When the sender first learnt of each segment's delivery.
        deliveries: Vec<Time>,
        min_rtt: Duration,
    }

    fn us(t: u64) -> Time {
        Time::from_nanos(t * 1_000)
    }

    /// Runs the model to the end of the application's data.
    fn run(p: &Path) -> Run {
        let mut rng = p.seed | 1;
        let mut lose = move || {
            // xorshift64: a reproducible coin per transmission.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % 1_000_000) as f64 / 1e6 < p.loss
        };
        let total = p.supply.last().unwrap().1;
        let mut sb = Scoreboard::default();
        let mut rate = DeliveryRate::default();
        let mut events = BinaryHeap::new();
        for &(t, _) in &p.supply {
            events.push(Reverse((t, Ev::Supply)));
        }
        let (mut available, mut bottleneck_free) = (0, 0);
        let mut received = BTreeSet::new();
        let mut known = BTreeSet::new();
        let mut known_below = 0;
        let mut out = Run {
            samples: Vec::new(),
            deliveries: Vec::new(),
            min_rtt: Duration::ZERO,
        };
        let mut rtt_min: Option<Duration> = None;
        let mut steps = 0;
        while let Some(Reverse((t, ev))) = events.pop() {
            steps += 1;
            if steps > 200_000 {
                break;
            }
            let now = us(t);
            match ev {
                Ev::Supply => {
                    available = p
                        .supply
                        .iter()
                        .take_while(|s| s.0 <= t)
                        .last()
                        .map_or(0, |s| s.1);
                }
                Ev::Arrive(seg, sent) => {
                    received.insert(seg);
                    let cum = (0..).find(|s| !received.contains(s)).unwrap();
                    events.push(Reverse((t + p.rev_us, Ev::Ack(cum, seg, sent))));
                }
                Ev::Ack(cum, seg, sent) => {
                    let rtt = now.saturating_since(us(sent));
                    rtt_min = Some(rtt_min.map_or(rtt, |m| m.min(rtt)));
                    if let Some(b) = SackBlock::new(seg, seg + 1) {
                        sb.apply_sack(b);
                    }
                    sb.ack_through(cum);
                    for stamp in sb.take_delivered() {
                        rate.on_delivered(now, &stamp);
                    }
                    for s in (known_below..cum).chain([seg]) {
                        if known.insert(s) {
                            out.deliveries.push(now);
                        }
                    }
                    known_below = known_below.max(cum);
                    if let Some(limit) = sb.kth_highest_sacked(3) {
                        sb.mark_lost_below(limit);
                    }
                    if let Some(s) = rate.sample(sb.lost_total(), rtt_min.unwrap()) {
                        out.samples.push((now, s));
                    }
                }
            }
            // Send what the window and the application allow.
            loop {
                let next = sb.next_lost_pending();
                let outstanding = sb.outstanding();
                let room = sb.pipe() < p.cwnd;
                let seg = match next {
                    Some(seg) if room => {
                        sb.on_retransmit(seg);
                        seg
                    }
                    None if room && sb.max() < available => sb.on_send_new(),
                    _ => {
                        if room && next.is_none() {
                            rate.on_app_limited(sb.pipe());
                        }
                        break;
                    }
                };
                let stamp = rate.on_sent(now, outstanding, sb.pipe(), sb.lost_total());
                sb.stamp(seg, stamp);
                if !lose() {
                    bottleneck_free = bottleneck_free.max(t) + p.service_us;
                    events.push(Reverse((bottleneck_free + p.fwd_us, Ev::Arrive(seg, t))));
                }
            }
            if sb.una() >= total && events.iter().all(|e| matches!(e.0 .1, Ev::Supply)) {
                break;
            }
            // Everything sent was lost: a timeout resends it.
            if events.is_empty() && sb.outstanding() > 0 {
                sb.mark_all_lost();
                events.push(Reverse((t + 1_000_000, Ev::Supply)));
            }
        }
        out.min_rtt = rtt_min.unwrap_or_default();
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// No sample claims more than was delivered over its interval: every
        /// segment it counts was first reported delivered within
        /// [now − interval, now].
        #[test]
        fn a_sample_never_exceeds_what_was_delivered_over_its_interval(p in path()) {
            let r = run(&p);
            for (now, s) in &r.samples {
                let from = Time::from_nanos(now.as_nanos().saturating_sub(s.interval.as_nanos() as u64));
                let seen = r.deliveries.iter().filter(|&&d| d >= from && d <= *now).count() as u64;
                prop_assert!(s.delivered <= seen, "{s:?} at {now:?}: {seen} delivered in its interval");
            }
        }

        /// A bottleneck of one segment per `service` can deliver at most one
        /// more segment than `interval / service`: no sample, app-limited or
        /// not, and so no max-bandwidth filter fed by them (BBR's, which
        /// takes app-limited samples only when they raise it), exceeds that.
        #[test]
        fn app_limited_periods_never_raise_the_estimate_above_the_bottleneck(p in path()) {
            let r = run(&p);
            let bottleneck = 1e6 / p.service_us as f64;
            let mut max_bw: f64 = 0.0;
            for (_, s) in &r.samples {
                if !s.is_app_limited || s.rate() > max_bw {
                    max_bw = max_bw.max(s.rate());
                }
                let bound = bottleneck * s.ack_elapsed.as_secs_f64() / s.interval.as_secs_f64()
                    + 1.0 / s.interval.as_secs_f64();
                prop_assert!(s.rate() <= bound * (1.0 + 1e-9), "{s:?}: {} > {bound}", s.rate());
            }
            let base = Duration::from_micros(p.service_us + p.fwd_us + p.rev_us);
            if !r.samples.is_empty() {
                prop_assert!(r.min_rtt >= base);
                prop_assert!(max_bw <= (bottleneck + 1.0 / base.as_secs_f64()) * (1.0 + 1e-9),
                    "max {max_bw} bottleneck {bottleneck}");
            }
        }
    }
}
