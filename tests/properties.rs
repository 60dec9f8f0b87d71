//! Properties that must hold for any path, seed and tuning.

use std::time::Duration;

use proptest::prelude::*;

use atou::internals::wire::{Ack, DataFlags, DataHeader, SackBlock, ACK_MAX_LEN, DATA_HEADER_LEN};
use atou::internals::{Receiver, ReceiverConfig, Sender};
use atou::netem::NetemSpec;
use atou::sim::{RunEnd, SimConfig, SimError, Simulation};
use atou::{PatternSource, RecoveryKind, Time, Tuning};

fn percent(max: f64) -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), 0.0..max]
}

prop_compose! {
    fn forward_spec()(rate in proptest::option::of(1u64..200),
                      limit in 2u32..200,
                      delay_ms in 0u64..60,
                      jitter_frac in 0.0..0.5f64,
                      loss in percent(10.0),
                      dup in percent(5.0),
                      reorder in percent(30.0),
                      gap in 0u64..5) -> String {
        let mut s = String::new();
        if let Some(r) = rate {
            // The bottleneck queue is its own stage: one netem's limit
            // would also count the packets in its delay line.
            s += &format!("rate {r}mbit limit {limit} | ");
        }
        if delay_ms > 0 {
            let jitter = (delay_ms as f64 * jitter_frac) as u64;
            s += &format!("delay {delay_ms}ms {jitter}ms ");
            if reorder > 0.0 {
                s += &format!("reorder {reorder}% ");
                if gap > 0 {
                    s += &format!("gap {gap} ");
                }
            }
        }
        s += &format!("loss {loss}% duplicate {dup}%");
        s
    }
}

prop_compose! {
    fn return_spec()(delay_ms in 0u64..60, loss in percent(10.0), dup in percent(5.0)) -> String {
        format!("delay {delay_ms}ms loss {loss}% duplicate {dup}%")
    }
}

prop_compose! {
    fn any_tuning()(kind in prop::sample::select(RecoveryKind::ALL.to_vec()),
                    rampdown in any::<bool>(),
                    payload in 1u32..1500,
                    dup_thresh in 1u32..10,
                    delack_ms in prop_oneof![Just(0u64), 1u64..300],
                    rcvsegs in 1u32..64,
                    rcvwin in 1u32..128,
                    initsegs in 1u32..10,
                    vmss in 1u32..4,
                    multiplier in 0.1..0.9f64,
                    increment in 1u32..5,
                    limited_transmit in any::<bool>(),
                    undo in any::<bool>(),
                    burst_limit in prop_oneof![Just(0u32), 1u32..5],
                    tick_ms in prop_oneof![Just(0u64), 10u64..500],
                    timeout_ms in prop_oneof![Just(0u64), 200u64..2000],
                    drops in proptest::collection::vec(0u64..300, 0..6)) -> Tuning {
        Tuning {
            mss: DATA_HEADER_LEN as u32 + payload,
            recovery: kind,
            rampdown: rampdown && kind == RecoveryKind::Fack,
            dup_thresh,
            delack: Duration::from_millis(delack_ms),
            rcvsegs,
            rcvwin,
            initsegs,
            vmss,
            multiplier,
            increment,
            limited_transmit,
            undo,
            burst_limit,
            tick: Duration::from_millis(tick_ms),
            timeout: Duration::from_millis(timeout_ms),
            droplist: drops.iter().map(u64::to_string).collect::<Vec<_>>().join(",").parse().unwrap(),
            // Long enough that only a broken sender gives up.
            maxidle: Duration::from_secs(900),
            ..Tuning::default()
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// For any path, seed and tuning the receiver gets exactly the bytes
    /// sent, in order; nothing panics; the sender's invariants hold after
    /// every step (snd_una ≤ snd_nxt ≤ snd_max, cwnd ≥ 1, no more than
    /// rcvwin outstanding, no transmission outside the window).
    #[test]
    fn the_stream_arrives_intact(fwd in forward_spec(), rev in return_spec(),
                                 tuning in any_tuning(), seed in any::<u64>(),
                                 segments in 0u64..800) {
        let bytes = segments * tuning.payload_size() as u64;
        let fwd: NetemSpec = fwd.parse().unwrap();
        let rev: NetemSpec = rev.parse().unwrap();
        let config = SimConfig::new(tuning, fwd, rev, Some(bytes), seed).check_invariants(true);
        let result = Simulation::new(config).unwrap().run(&mut ());
        let result = match result {
            Err(SimError::Invariant { time, what }) => {
                return Err(TestCaseError::fail(format!("invariant broken at {time:?}: {what}")));
            }
            other => other.unwrap(),
        };
        prop_assert_eq!(result.outcome, RunEnd::Finished, "{}", result.summary);
        prop_assert!(result.delivered_intact(bytes), "{}", result.summary);
    }
}

/// One thing that can happen to a lone sender.
#[derive(Debug, Clone)]
enum Op {
    Transmit,
    Ack {
        cum_delta: i64,
        sacks: Vec<(u64, u64)>,
        dsack: Option<(u64, u64)>,
        window: u32,
    },
    Timeout,
    Wait(u64),
    Garbage(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::Transmit),
        6 => (-5i64..20,
              proptest::collection::vec((0u64..40, 1u64..10), 0..=4),
              proptest::option::of((0u64..60, 1u64..3)),
              prop_oneof![Just(0u32), 1u32..200])
            .prop_map(|(cum_delta, sacks, dsack, window)| Op::Ack { cum_delta, sacks, dsack, window }),
        1 => Just(Op::Timeout),
        2 => (0u64..3000).prop_map(Op::Wait),
        1 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Op::Garbage),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Any sequence of ACKs, however wrong (old, beyond what was sent,
    /// overlapping or bogus SACK blocks), timeouts and garbage leaves the
    /// sender consistent and never panics (s2n-quic style).
    #[test]
    fn the_sender_survives_any_ack_sequence(kind in prop::sample::select(RecoveryKind::ALL.to_vec()),
                                           ops in proptest::collection::vec(op(), 1..200)) {
        let tuning = Tuning { mss: DATA_HEADER_LEN as u32 + 10, recovery: kind, rcvwin: 64, ..Tuning::default() };
        let mut s = Sender::new(&tuning, 1, Some(10 * 500), Time::ZERO).unwrap();
        let mut now = Time::ZERO;
        let mut buf = vec![0u8; 2048];
        let mut una = 0u64;
        for op in ops {
            match op {
                Op::Transmit => while s.poll_transmit(now, &mut buf, &mut PatternSource).is_some() {},
                Op::Ack { cum_delta, sacks, dsack, window } => {
                    let cum = una.saturating_add_signed(cum_delta);
                    let mut a = Ack::new(1, (now.as_nanos() / 1_000) as u32, cum, window);
                    for (off, len) in sacks {
                        a.push_sack(SackBlock::new(cum + 1 + off, cum + 1 + off + len).unwrap());
                    }
                    a.dsack = dsack.and_then(|(x, l)| SackBlock::new(x, x + l));
                    let mut wire = [0u8; ACK_MAX_LEN];
                    let n = a.emit(&mut wire).unwrap();
                    s.handle_datagram(now, &wire[..n]).unwrap();
                    una = s.snapshot(now).snd_una;
                }
                Op::Timeout => if let Some(t) = s.poll_timeout() {
                    now = now.max(t);
                    s.handle_timeout(now);
                },
                Op::Wait(ms) => now += Duration::from_millis(ms),
                Op::Garbage(bytes) => { let _ = s.handle_datagram(now, &bytes); }
            }
            while s.poll_event().is_some() {}
            if let Err(e) = s.check_invariants() {
                return Err(TestCaseError::fail(e.to_string()));
            }
        }
    }

    /// Any sequence of data segments (duplicates, far out of window,
    /// overlapping FINs) and garbage keeps the receiver bounded: it holds
    /// at most rcvsegs segments and its ACKs always decode.
    #[test]
    fn the_receiver_stays_bounded(segs in proptest::collection::vec((0u64..300, any::<bool>(), 0usize..40), 1..300),
                                  reads in any::<bool>()) {
        let rcvsegs = 32;
        let mut r = Receiver::new(ReceiverConfig { sack: true, delack: Duration::from_millis(50), rcvsegs, quickack: 0 }, 1);
        let mut buf = vec![0u8; 2048];
        for (i, (seg, fin, len)) in segs.into_iter().enumerate() {
            let now = Time::from_nanos(i as u64 * 1_000_000);
            let h = DataHeader { conn_id: 1, seg, timestamp: 0, flags: DataFlags { fin, retransmission: false } };
            let mut d = vec![0u8; DATA_HEADER_LEN + len];
            h.emit(&mut d).unwrap();
            r.handle_datagram(now, &d).unwrap();
            r.handle_timeout(now);
            if reads {
                while r.read().is_some() {}
            }
            while let Some(n) = r.poll_transmit(now, &mut buf) {
                prop_assert!(atou::internals::wire::Packet::decode(&buf[..n]).is_ok());
            }
            prop_assert!(u64::from(r.window()) <= u64::from(rcvsegs));
        }
    }
}
