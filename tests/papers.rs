//! The papers' scenarios, run in the simulator. Each test names its
//! scenario and cites the section whose figures it checks.

mod common;
use common::say;
use std::time::Duration;

use atou::internals::rtt::RttEstimator;
use atou::internals::sim::scenarios::{
    brakmo_sender, brakmo_table_4, displacement, mathis_expected_c, mathis_through, Endpoints,
    Table4Run, BRAKMO_FWD, BRAKMO_REV,
};
use atou::internals::wire::DATA_HEADER_LEN;
use atou::netem::NetemSpec;
use atou::sim::{Pair, PairConfig, RunEnd, SimConfig, SimResult, Simulation};
use atou::{
    AckRecord, CcKind, Event, Recorder, RecoveryKind, ReductionKind, ReorderingKind,
    SsthreshEstimate, Time, TimedEvent, TraceRecord, Tuning,
};

fn simulate(tuning: Tuning, fwd: &str, rev: &str, bytes: u64, seed: u64) -> (SimResult, Recorder) {
    let fwd: NetemSpec = fwd.parse().expect("fwd spec");
    let rev: NetemSpec = rev.parse().expect("rev spec");
    let config = SimConfig::new(tuning, fwd, rev, Some(bytes), seed)
        .trace(true)
        .check_invariants(true);
    let mut rec = Recorder::default();
    let result = Simulation::new(config).unwrap().run(&mut rec).unwrap();
    assert!(
        result.delivered_intact(bytes),
        "transfer incomplete: {}",
        result.summary
    );
    (result, rec)
}

fn exits(events: &[TimedEvent]) -> Vec<(u64, u64, Duration)> {
    events
        .iter()
        .filter_map(|e| match e.event {
            Event::LeaveRecovery {
                cwnd,
                ssthresh,
                duration,
                ..
            } => Some((cwnd, ssthresh, duration)),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Brakmo & Peterson, "Performance Problems in BSD4.4 TCP"
// ---------------------------------------------------------------------------

/// Brakmo §3.2, Table 2: with a 500 ms clock the corrected estimator gives
/// the "new RTO" column from the RTT column. The estimator is primed, as
/// RFC 6298 §2.2 says, from a first measurement (one tick) taken before
/// the table's rows.
#[test]
fn brakmo_3_2_rto_with_500ms_tick_reproduces_table_2() {
    const TICK: Duration = Duration::from_millis(500);
    let rtt_ticks = [0u32, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1];
    let new_rto = [3u64, 3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 3];
    let mut e = RttEstimator::new(&Tuning {
        tick: TICK,
        ..Tuning::default()
    });
    // Each segment leaves 100 ms after a tick; its ACK comes `m` ticks later.
    let mut now = Time::ZERO;
    let mut measure = |e: &mut RttEstimator, m: u32| {
        now += TICK * 4;
        let sent = now + Duration::from_millis(100);
        let acked = sent + TICK * m;
        e.on_sample(acked, acked - sent);
    };
    measure(&mut e, 1);
    let got: Vec<u64> = rtt_ticks
        .iter()
        .map(|&m| {
            measure(&mut e, m);
            e.rto_ticks().unwrap()
        })
        .collect();
    assert_eq!(got, new_rto);
    assert_eq!(e.base_rto(), TICK * 3);
}

/// Cwnd at each ACK of a run, from the trace.
fn cwnd_series(trace: &[TraceRecord]) -> Vec<(f64, u64)> {
    trace
        .iter()
        .filter_map(|r| match *r {
            TraceRecord::Ack(AckRecord { time, cwnd, .. }) => Some((time.as_secs_f64(), cwnd)),
            _ => None,
        })
        .collect()
}

/// The largest and the average cwnd growth over one RTT, once cwnd has
/// passed `from`.
fn growth_per_rtt(series: &[(f64, u64)], rtt: f64, from: u64) -> (u64, f64) {
    let start = series
        .iter()
        .position(|&(_, c)| c >= from)
        .expect("reached ssthresh");
    let s = &series[start..];
    let mut worst = 0;
    let mut j = 0;
    for i in 0..s.len() {
        while j < s.len() && s[j].0 < s[i].0 + rtt {
            j += 1;
        }
        if j < s.len() {
            worst = worst.max(s[j - 1].1.saturating_sub(s[i].1));
        }
    }
    let (t0, c0) = s[0];
    let (t1, c1) = s[s.len() - 1];
    (worst, (c1 - c0) as f64 / ((t1 - t0) / rtt))
}

/// Brakmo §3.3–3.4: loss-free congestion avoidance opens the window by at
/// most one segment per RTT, with and without delayed ACKs (the `+MSS/8`
/// of BSD would open it by cwnd/8 more). Delayed ACKs halve the rate
/// (Mathis footnote 2).
#[test]
fn brakmo_3_4_congestion_avoidance_at_most_one_segment_per_rtt() {
    for (delack, expected_rate) in [(0u64, 1.0), (200, 0.5)] {
        let tuning = Tuning {
            rcvwin: 400,
            rcvsegs: 400,
            initsegs: 2,
            thresh_init: 0.05, // ssthresh 20: congestion avoidance early
            delack: Duration::from_millis(delack),
            ..Tuning::default()
        };
        let (result, rec) = simulate(tuning, "rate 1gbit delay 50ms", "delay 50ms", 30 << 20, 1);
        assert_eq!(result.summary.rxmts, 0);
        let rtt = result.summary.minrtt.as_secs_f64();
        let (worst, average) = growth_per_rtt(&cwnd_series(&rec.trace), rtt, 21);
        assert!(
            worst <= 1,
            "delack {delack}: cwnd grew {worst} segments in one RTT"
        );
        assert!(
            (average - expected_rate).abs() < 0.1,
            "delack {delack}: average growth {average:.3} per RTT, expected {expected_rate}"
        );
    }
}

/// Brakmo §3.5: an ACK that acknowledges three or more segments releases
/// no more than three. ACK loss on the return path makes such ACKs common.
#[test]
fn brakmo_3_5_no_burst_above_three_after_a_big_cumulative_ack() {
    let tuning = Tuning {
        recovery: RecoveryKind::NewReno,
        rcvwin: 200,
        ..Tuning::default()
    };
    let (_, rec) = simulate(
        tuning,
        "rate 100mbit delay 20ms",
        "delay 20ms loss 60%",
        20 << 20,
        // At 60 % ACK loss about one seed in 15 ends by maxidle after the
        // window collapses (measured over 30 seeds with this model and the
        // one before it); this one completes.
        1,
    );
    let mut last_ack = 0;
    let mut big_acks = 0;
    let mut i = 0;
    while i < rec.trace.len() {
        if let TraceRecord::Ack(AckRecord { time, ack, .. }) = rec.trace[i] {
            let acked = ack.saturating_sub(last_ack);
            last_ack = last_ack.max(ack);
            let sent = rec.trace[i + 1..]
                .iter()
                .take_while(|r| matches!(r, TraceRecord::Xmt { time: t, .. } if *t == time))
                .count();
            if acked >= 3 {
                big_acks += 1;
                assert!(
                    sent <= 3,
                    "an ACK of {acked} segments at {time:?} released {sent}"
                );
            }
        }
        i += 1;
    }
    assert!(big_acks > 100, "scenario produced only {big_acks} big ACKs");
}

/// Brakmo §3.1 and §3.6: when fast recovery ends, cwnd is deflated to
/// ssthresh, also when exactly `dup_thresh` duplicates arrived (`>=`, not
/// `>`). A four-segment window gives exactly three duplicates per loss.
#[test]
fn brakmo_3_6_cwnd_equals_ssthresh_when_fast_recovery_ends() {
    for kind in RecoveryKind::ALL {
        for (rcvwin, drops) in [(4u32, "40"), (40, "300,302,310-313")] {
            let tuning = Tuning {
                recovery: kind,
                rcvwin,
                droplist: drops.parse().unwrap(),
                ..Tuning::default()
            };
            let (result, rec) =
                simulate(tuning, "rate 10mbit delay 20ms", "delay 20ms", 1 << 20, 1);
            let exits = exits(&rec.events);
            assert!(
                !exits.is_empty(),
                "{kind} rcvwin {rcvwin}: no recovery happened"
            );
            for (cwnd, ssthresh, _) in exits {
                assert_eq!(cwnd, ssthresh, "{kind} rcvwin {rcvwin}: cwnd not deflated");
            }
            if rcvwin == 4 {
                assert_eq!(
                    result.summary.dups, 3,
                    "{kind}: expected exactly dup_thresh duplicates"
                );
                assert_eq!(result.summary.timeouts, 0, "{kind}");
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Hoe, "Improving the Start-up Behavior of a Congestion Control Scheme for TCP"
// ---------------------------------------------------------------------------

/// Hoe §2.2.2 and appendix A.1.2 (H1): 1 MB over a 1.6 Mbit/s bottleneck
/// with a 10-packet drop-tail queue, MSS 1024, window 50 segments, initial
/// ssthresh 64 segments, ~100 ms RTT. Slow start overflows the queue and
/// loses many segments of one window: Reno needs a timeout, NewReno none.
#[test]
fn hoe_h1_reno_times_out_newreno_does_not() {
    let run = |kind| {
        let tuning = Tuning {
            recovery: kind,
            mss: 1024 + DATA_HEADER_LEN as u32,
            rcvwin: 50,
            thresh_init: 64.0 / 50.0,
            initsegs: 1,
            ..Tuning::default()
        };
        // ssthresh starts at 64 segments (tuning.rs's
        // thresh_init_is_a_fraction_of_rcvwin).
        simulate(
            tuning,
            "rate 1.6mbit limit 10 | delay 50ms",
            "delay 50ms",
            1 << 20,
            1,
        )
        .0
    };
    let reno = run(RecoveryKind::Reno).summary;
    let newreno = run(RecoveryKind::NewReno).summary;
    assert!(reno.timeouts >= 1, "Reno: {} timeouts", reno.timeouts);
    assert_eq!(newreno.timeouts, 0, "NewReno timed out");
    assert!(
        newreno.packs > 5,
        "NewReno repaired only {} losses by partial ACKs",
        newreno.packs
    );
    assert!(
        newreno.secs < reno.secs,
        "NewReno {:.2}s, Reno {:.2}s",
        newreno.secs,
        reno.secs
    );
}

/// Hoe §2.2.2 and §3.2 (H2): segments k+1 and k+3 of one window lost.
/// NewReno repairs both with one halving and no timeout; Reno needs a
/// second reduction (another fast retransmit or a timeout).
#[test]
fn hoe_h2_newreno_recovers_two_losses_with_one_halving() {
    let run = |kind| {
        let tuning = Tuning {
            recovery: kind,
            rcvwin: 20,
            droplist: "101,103".parse().unwrap(),
            ..Tuning::default()
        };
        simulate(tuning, "rate 10mbit delay 50ms", "delay 50ms", 1 << 20, 1)
    };
    let (newreno, rec) = run(RecoveryKind::NewReno);
    let s = &newreno.summary;
    assert_eq!((s.rxmts, s.dup3s, s.packs, s.timeouts), (2, 1, 1, 0), "{s}");
    let exits = exits(&rec.events);
    assert_eq!(exits.len(), 1);
    assert_eq!(exits[0].1, 10, "one halving of the 20-segment window");
    let (reno, _) = run(RecoveryKind::Reno);
    let r = &reno.summary;
    assert!(
        r.dup3s + r.timeouts >= 2,
        "Reno reduced its window only once: {r}"
    );
}

/// Hoe §2.2.3 and Table 1: odd segments of a window are lost and so is the
/// fast retransmit, so a timeout follows. Go-back-N then resends segments
/// the receiver already holds; their duplicate ACKs make Reno fast
/// retransmit again although nothing was lost. NewReno ignores them
/// (Hoe §3.2 step (v)).
#[test]
fn hoe_2_2_3_newreno_ignores_false_dupacks_after_a_timeout() {
    let run = |kind| {
        let tuning = Tuning {
            recovery: kind,
            rcvwin: 40,
            droplist: "201 201 203 205 207 209 211 213".parse().unwrap(),
            ..Tuning::default()
        };
        simulate(tuning, "rate 10mbit delay 50ms", "delay 50ms", 1 << 20, 1)
            .0
            .summary
    };
    let reno = run(RecoveryKind::Reno);
    let newreno = run(RecoveryKind::NewReno);
    assert_eq!((reno.timeouts, newreno.timeouts), (1, 1));
    assert!(
        reno.dup3s >= 2,
        "Reno made no false fast retransmit: {reno}"
    );
    assert_eq!(
        newreno.dup3s, 1,
        "NewReno fast-retransmitted after the timeout: {newreno}"
    );
    assert!(newreno.dsacks > 0, "the receiver reported no duplicates");
}

// ---------------------------------------------------------------------------
// Sarolahti & Kuznetsov, "Congestion Control in Linux TCP", §3 (L6)
// ---------------------------------------------------------------------------

/// Linux §3 (L6): 2, 3 and 5 losses in one 40-segment window. NewReno,
/// SACK and FACK each halve once and never time out; SACK and FACK repair
/// everything in about one RTT, NewReno one loss per RTT.
#[test]
fn linux_l6_multiple_losses_in_one_window() {
    for (n, drops) in [
        (2u64, "201,204"),
        (3, "201,204,207"),
        (5, "201,204,207,210,213"),
    ] {
        for kind in [
            RecoveryKind::NewReno,
            RecoveryKind::Sack,
            RecoveryKind::Fack,
        ] {
            let tuning = Tuning {
                recovery: kind,
                rcvwin: 40,
                droplist: drops.parse().unwrap(),
                ..Tuning::default()
            };
            let (result, rec) =
                simulate(tuning, "rate 10mbit delay 50ms", "delay 50ms", 1 << 20, 1);
            let s = &result.summary;
            assert_eq!(
                (s.rxmts, s.dup3s, s.timeouts),
                (n, 1, 0),
                "{kind}, {n} losses: {s}"
            );
            let exits = exits(&rec.events);
            assert_eq!(exits.len(), 1, "{kind}, {n} losses");
            assert_eq!(exits[0].1, 20, "{kind}: one halving of 40");
            let rtts = exits[0].2.as_secs_f64() / s.minrtt.as_secs_f64();
            if kind == RecoveryKind::NewReno {
                assert!(
                    rtts >= (n - 1) as f64 && rtts <= (n + 1) as f64,
                    "NewReno took {rtts:.2} RTTs for {n} losses"
                );
            } else {
                assert!(rtts < 1.6, "{kind} took {rtts:.2} RTTs for {n} losses");
            }
        }
    }
}

/// Sarolahti & Kuznetsov §6, Figure 4: a three-second link-layer stall in
/// the middle of a 200 KB transfer fires the retransmission timer although
/// nothing is lost. "When TCP timestamps were not used, the TCP sender
/// retransmitted 11 packets unnecessarily": after the stall the ACKs of the
/// delayed originals come back in a burst and the sender, in the Loss
/// state, resends the last window as they open its window. With undo the
/// first ACK after the timeout echoes the original's timestamp, older
/// than the retransmission (Eifel), so the sender restores its window and
/// goes on with new data: "none of the segments are transmitted
/// unnecessarily". Counted here: retransmissions sent from the first ACK
/// after the stall on (the path loses nothing, so every one is
/// unnecessary); the timeouts during the stall resend the first segment in
/// both runs, as in the paper's. The window is 12 segments, so that the
/// last window is about the paper's.
#[test]
fn linux_6_undo_after_a_three_second_delay_spike() {
    const STALL_START: Duration = Duration::from_secs(1);
    const STALL: Duration = Duration::from_secs(3);
    let run = |undo: bool| {
        let tuning = Tuning {
            undo,
            rcvwin: 12,
            ..Tuning::default()
        };
        let config = SimConfig::new(
            tuning,
            "rate 1mbit delay 50ms".parse().unwrap(),
            "delay 50ms".parse().unwrap(),
            Some(200_000),
            1,
        )
        .trace(true)
        .check_invariants(true)
        .fwd_stall(Some((STALL_START, STALL)));
        let mut rec = Recorder::default();
        let result = Simulation::new(config).unwrap().run(&mut rec).unwrap();
        assert!(result.delivered_intact(200_000), "{}", result.summary);
        // From the first ACK after the stall: the burst.
        let burst = rec
            .trace
            .iter()
            .find_map(|r| match *r {
                TraceRecord::Ack(AckRecord { time, .. }) if time >= STALL_START + STALL => {
                    Some(time)
                }
                _ => None,
            })
            .unwrap();
        let mut sent = std::collections::HashSet::new();
        let mut after_stall = 0;
        for r in &rec.trace {
            if let TraceRecord::Xmt { time, seg } = *r {
                if !sent.insert(seg) && time >= burst {
                    after_stall += 1;
                }
            }
        }
        let undone = rec
            .events
            .iter()
            .filter(|e| {
                matches!(
                    e.event,
                    Event::Undo {
                        how: "timestamp",
                        ..
                    }
                )
            })
            .count();
        (result, after_stall, undone)
    };
    let (plain, plain_rxmts, plain_undos) = run(false);
    let (undo, undo_rxmts, undo_undos) = run(true);
    assert!(plain.summary.timeouts >= 1 && undo.summary.timeouts >= 1);
    assert_eq!((plain_undos, undo_undos), (0, 1));
    assert!(
        (8..=14).contains(&plain_rxmts),
        "without undo: {plain_rxmts} unnecessary retransmissions (paper: 11)"
    );
    assert_eq!(undo_rxmts, 0, "with undo (paper: 0)");
    assert!(undo.summary.goodput_bps > plain.summary.goodput_bps);
}

// ---------------------------------------------------------------------------
// Mathis, Semke, Mahdavi & Ott, "The Macroscopic Behavior of the TCP
// Congestion Avoidance Algorithm"
// ---------------------------------------------------------------------------

/// Mathis §3.1 and Table 1: under random loss with no standing queue,
/// C = BW·RTT·√p/MSS is within ±20 % of 1.31 with an ACK per segment and
/// of 0.93 with delayed ACKs, for every variant, at p = 0.1 %, 0.3 %, 1 %.
#[test]
fn mathis_3_1_random_loss_constant_c() {
    let failures = mathis_failures("bare", &Endpoints::Bare, &[0.001, 0.003, 0.01]);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Mathis's C for every variant, with and without delayed ACKs, at each
/// loss rate of `ps`: one line for each run off by more than 20 %.
fn mathis_failures(name: &str, endpoints: &Endpoints, ps: &[f64]) -> Vec<String> {
    let mut failures = Vec::new();
    for delayed in [false, true] {
        for &p in ps {
            for kind in RecoveryKind::ALL {
                let run = mathis_through(kind, delayed, p, 300.0, 1, endpoints.clone()).unwrap();
                let expected = mathis_expected_c(delayed);
                assert!(
                    run.episodes >= 150,
                    "{name} {kind} p {p}: only {} loss episodes",
                    run.episodes
                );
                if (run.c / expected - 1.0).abs() > 0.20 {
                    failures.push(format!(
                        "{name} {kind} p={p} delayed={delayed}: C = {:.3}, expected {expected} ± 20 %",
                        run.c
                    ));
                }
            }
        }
    }
    failures
}

/// Keys for a `Client` and a `Server` that know each other: how a
/// scenario runs through the Noise handshake, every packet sealed.
fn keyed_endpoints() -> Endpoints {
    use atou::internals::crypto::{
        format_public_key, AuthorizedKeys, Cipher, ClientAuth, ServerAuth, StaticKeypair,
    };
    let server = StaticKeypair::generate().unwrap();
    let client = StaticKeypair::generate().unwrap();
    let line = format_public_key(&client.public(), "scenario") + "\n";
    let authorized = AuthorizedKeys::parse(line.as_bytes());
    Endpoints::Keys(
        ServerAuth {
            identity: Some(server.clone()),
            authorized: Some(std::sync::Arc::new(authorized.unwrap())),
            allow_plain: false,
        },
        ClientAuth {
            identity: client,
            server_key: server.public(),
            cipher: Cipher::Aes256Gcm,
        },
    )
}

/// Mathis §3.1 once more, with a `Client` and a `Server` instead of a
/// bare sender and receiver, plain and through the Noise handshake: the
/// handshake, the retry and the sealing change nothing Mathis measures
/// (C within the same ±20 %), at p = 1 %.
#[test]
fn mathis_3_1_holds_through_the_handshake() {
    let mut failures = mathis_failures("plain", &Endpoints::Plain, &[0.01]);
    failures.extend(mathis_failures("keyed", &keyed_endpoints(), &[0.01]));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// Dunigan & Fowler, "A TCP-over-UDP Test Harness" (atou)
// ---------------------------------------------------------------------------

/// atou §4.3 (ORNL-cable): a path that sends 60 % of packets ahead of the
/// rest, displacing them by up to about 30 positions at 6 Mbit/s. With
/// `dup_thresh 9` the transfer gets at least 1.5 times the goodput it gets
/// with `dup_thresh 3` (the paper saw 700 kbit/s become 1.7 Mbit/s).
#[test]
fn atou_4_3_dup_thresh_9_beats_3_on_a_reordering_path() {
    const FWD: &str = "rate 6mbit | delay 60ms reorder 60%";
    // First, that the path is the paper's: most packets out of place, by up to ~30.
    let (out_of_place, max_shift) = displacement(
        &FWD.parse().unwrap(),
        20_000,
        1472,
        Duration::from_micros(1963),
        1,
    );
    assert!(
        out_of_place > 0.6,
        "only {:.0} % out of place",
        out_of_place * 100.0
    );
    assert!(
        (20..=40).contains(&max_shift),
        "displacement up to {max_shift}"
    );

    for kind in [RecoveryKind::NewReno, RecoveryKind::Sack] {
        let goodput = |dup_thresh| {
            let tuning = Tuning {
                recovery: kind,
                dup_thresh,
                rcvwin: 200,
                ..Tuning::default()
            };
            simulate(tuning, FWD, "delay 10ms", 10 << 20, 1)
                .0
                .summary
                .goodput_bps
        };
        let (g3, g9) = (goodput(3), goodput(9));
        assert!(
            g9 >= 1.5 * g3,
            "{kind}: dup_thresh 9 gave {:.2} Mbit/s, dup_thresh 3 {:.2} Mbit/s",
            g9 / 1e6,
            g3 / 1e6
        );
    }
}

/// atou appendix B: `droplist 200 200` drops segment 200 twice, which a
/// fast retransmit cannot repair, so a timeout does.
#[test]
fn atou_appendix_b_droplist_twice_forces_a_timeout() {
    let mut tuning = Tuning::default();
    tuning
        .apply_config("newreno 0\nfack 1\nsack 1\nrampdown 1\nrcvrwin 26\ndroplist 200 200\n")
        .unwrap();
    let (result, rec) = simulate(tuning, "rate 10mbit delay 20ms", "delay 20ms", 1 << 20, 1);
    let s = &result.summary;
    assert_eq!((s.dropped, s.timeouts), (2, 1), "{s}");
    assert!(rec
        .events
        .iter()
        .any(|e| matches!(e.event, Event::TimeoutRetransmit { seg: 200, .. })));
}

/// Same seed, tuning and specs: the same trace, byte for byte.
#[test]
fn same_seed_gives_an_identical_trace() {
    let run = |seed| {
        let tuning = Tuning::default();
        let (_, rec) = simulate(
            tuning,
            "rate 20mbit limit 50 | delay 30ms 5ms loss 2% duplicate 1% reorder 5% gap 4",
            "delay 30ms loss 1%",
            2 << 20,
            seed,
        );
        let mut text = String::new();
        for r in &rec.trace {
            text.push_str(&r.to_string());
            text.push('\n');
        }
        text
    };
    let a = run(11);
    assert_eq!(a, run(11));
    assert_ne!(a, run(12));
}

/// A path that delivers nothing makes the sender give up after maxidle,
/// instead of hanging.
#[test]
fn a_dead_path_fails_after_maxidle() {
    let tuning = Tuning {
        maxidle: Duration::from_secs(5),
        ..Tuning::default()
    };
    let config = SimConfig::new(
        tuning,
        "delay 10ms loss 100%".parse().unwrap(),
        "delay 10ms".parse().unwrap(),
        Some(100_000),
        1,
    );
    let result = Simulation::new(config).unwrap().run(&mut ()).unwrap();
    assert_eq!(result.outcome, RunEnd::Failed);
    assert_eq!(result.end, Time::ZERO + Duration::from_secs(5));
}

// ---------------------------------------------------------------------------
// Proportional Rate Reduction (RFC 6937), the standard successor of the
// rate-halving Sarolahti & Kuznetsov §3 describe (`--reduction prr`)
// ---------------------------------------------------------------------------

/// What one recovery looked like in the trace: its length, the longest
/// silence of the sender within it, and the most segments sent between
/// two ACKs (the ACK that began it excepted: its fast retransmit is sent
/// whatever the window says).
#[derive(Debug)]
struct RecoveryShape {
    duration: Duration,
    /// From the start of recovery to the first segment of new data.
    first_new: Duration,
    most_per_ack: u64,
    exit_cwnd: u64,
    ssthresh: u64,
}

fn recovery_shape(rec: &Recorder) -> RecoveryShape {
    let (start, recover) = rec
        .events
        .iter()
        .find_map(|e| match e.event {
            Event::EnterRecovery { recover, .. } => Some((e.time, recover)),
            _ => None,
        })
        .expect("a recovery");
    let (end, exit_cwnd, ssthresh) = rec
        .events
        .iter()
        .find_map(|e| match e.event {
            Event::LeaveRecovery { cwnd, ssthresh, .. } => Some((e.time, cwnd, ssthresh)),
            _ => None,
        })
        .expect("recovery ends");
    let mut first_new = None;
    let mut per_ack = Vec::new();
    let mut sent = 0u64;
    for r in &rec.trace {
        match *r {
            TraceRecord::Xmt { time, seg } if time >= start && time <= end => {
                if seg >= recover && first_new.is_none() {
                    first_new = Some(time - start);
                }
                sent += 1;
            }
            TraceRecord::Ack(AckRecord { time, .. }) if time > start && time <= end => {
                per_ack.push(sent);
                sent = 0;
            }
            _ => {}
        }
    }
    RecoveryShape {
        duration: end - start,
        first_new: first_new.unwrap_or(end - start),
        most_per_ack: per_ack.into_iter().skip(1).max().unwrap_or(0),
        exit_cwnd,
        ssthresh,
    }
}

/// RFC 6937 on the Linux §3 (L6) scenario (2, 3 and 5 losses in a window
/// of about 40): with `--reduction prr` the sender keeps sending through
/// recovery, in proportion to what is delivered (one segment per two
/// ACKs while pipe is above ssthresh, §3.1), never more than PRR-SSRB's
/// DeliveredData + 1 per ACK, where `halve` (RFC 6675's cwnd = ssthresh
/// at once) sends nothing new until pipe has fallen to ssthresh; recovery
/// takes no longer and ends with cwnd = ssthresh. For SACK and RACK.
#[test]
fn rfc6937_prr_on_linux_l6_sends_through_recovery_without_bursts() {
    for drops in ["201,204", "201,204,207", "201,204,207,210,213"] {
        for kind in [RecoveryKind::Sack, RecoveryKind::Rack] {
            let run = |reduction: ReductionKind| {
                // cwnd 40 as in L6, but not the receiver's window: with
                // rcvwin 40 nothing new may go out during recovery
                // whatever the reduction. Slow start stops at 40.
                let tuning = Tuning {
                    recovery: kind,
                    rcvwin: 400,
                    thresh_init: 0.1,
                    droplist: drops.parse().unwrap(),
                    reduction,
                    ..Tuning::default()
                };
                let (result, rec) =
                    simulate(tuning, "rate 10mbit delay 50ms", "delay 50ms", 1 << 20, 1);
                let s = &result.summary;
                assert_eq!((s.dup3s, s.timeouts), (1, 0), "{kind} {reduction}: {s}");
                (recovery_shape(&rec), s.minrtt)
            };
            let (halve, rtt) = run(ReductionKind::Halve);
            let (prr, _) = run(ReductionKind::Prr);
            let what = format!("{kind}, drops {drops}: halve {halve:?}, prr {prr:?}");
            // §3.1 PRR-SSRB: at most DeliveredData + 1 per ACK, and every
            // ACK here delivers one segment.
            assert!(prr.most_per_ack <= 2, "{what}");
            // New data from the first ACKs (one per two while pipe is
            // above ssthresh), not after pipe has fallen to ssthresh:
            // measured 4.7, 8.2 and 15.3 ms against 24.7, 25.9, 28.3.
            assert!(
                prr.first_new.as_secs_f64() < 0.6 * halve.first_new.as_secs_f64(),
                "{what}"
            );
            // Recovery no longer (103.5, 107.1, 114.1 ms against 124.7,
            // 125.9, 128.3), still a round trip, and cwnd = ssthresh at
            // its end (§3.1).
            assert!(
                prr.duration <= halve.duration && prr.duration >= rtt,
                "{what}"
            );
            assert_eq!(prr.exit_cwnd, prr.ssthresh, "{what}");
            assert_eq!(halve.exit_cwnd, halve.ssthresh, "{what}");
        }
    }
}

// ---------------------------------------------------------------------------
// Hoe §3.1: the initial ssthresh estimated from the first ACKs
// (`--ssthresh-estimate hoe`)
// ---------------------------------------------------------------------------

/// The highest segment sent in slow start (until an ACK first shows cwnd
/// at or above a finite ssthresh), and the first segment sent twice.
fn slow_start_end_and_first_loss(trace: &[TraceRecord]) -> (u64, Option<u64>) {
    let mut ss_end = None;
    let mut highest: Option<u64> = None;
    let mut highest_in_ss = 0;
    for r in trace {
        match *r {
            TraceRecord::Ack(AckRecord { cwnd, ssthresh, .. })
                if ss_end.is_none() && ssthresh != u64::MAX && cwnd >= ssthresh =>
            {
                ss_end = Some(());
            }
            TraceRecord::Xmt { seg, .. } => {
                if highest.is_some_and(|h| seg <= h) {
                    return (highest_in_ss, Some(seg));
                }
                highest = Some(seg);
                if ss_end.is_none() {
                    highest_in_ss = seg;
                }
            }
            _ => {}
        }
    }
    (highest_in_ss, None)
}

/// Hoe §3.1, Figure 7, on the H1 path (1 MB over a 1.6 Mbit/s bottleneck
/// with a 10-packet drop-tail queue, MSS 1024, window 50, initial
/// ssthresh 64, BDP about 20 segments): with the estimate, slow start
/// stops near the BDP and nothing it sent is lost, for Reno and NewReno;
/// without it, slow start runs to the window and overflows the queue.
#[test]
fn hoe_3_1_estimated_ssthresh_leaves_slow_start_without_loss() {
    for kind in [RecoveryKind::Reno, RecoveryKind::NewReno] {
        let run = |estimate| {
            let tuning = Tuning {
                recovery: kind,
                mss: 1024 + DATA_HEADER_LEN as u32,
                rcvwin: 50,
                thresh_init: 64.0 / 50.0,
                initsegs: 1,
                ssthresh_estimate: estimate,
                ..Tuning::default()
            };
            let (result, rec) = simulate(
                tuning,
                "rate 1.6mbit limit 10 | delay 50ms",
                "delay 50ms",
                1 << 20,
                1,
            );
            let (ss_end, first_resent) = slow_start_end_and_first_loss(&rec.trace);
            (result.summary, ss_end, first_resent)
        };
        let (hoe, hoe_ss_end, hoe_first) = run(SsthreshEstimate::Hoe);
        let (plain, _, plain_first) = run(SsthreshEstimate::None);
        // Measured: with the estimate slow start ends by segment 36 and the
        // first loss is segment 263, in congestion avoidance; 6.11 s, 3
        // retransmissions, no timeout, Reno and NewReno alike. Without:
        // segment 50 is lost in slow start; Reno 8.62 s with 53
        // retransmissions and 2 timeouts, NewReno 8.34 s with 26.
        assert!(
            hoe_first.is_none_or(|s| s > hoe_ss_end),
            "{kind}: segment {hoe_first:?} of slow start (to {hoe_ss_end}) lost"
        );
        assert!(
            plain_first.is_some_and(|s| s <= 64),
            "{kind}: without the estimate slow start should overflow the queue"
        );
        assert_eq!(hoe.timeouts, 0, "{kind}");
        assert!(
            hoe.secs < plain.secs,
            "{kind}: {} s against {} s",
            hoe.secs,
            plain.secs
        );
    }
}

// ---------------------------------------------------------------------------
// TCP Vegas on Brakmo & Peterson's path (`--cc vegas`)
// ---------------------------------------------------------------------------

/// Brakmo & Peterson §1 (the Vegas comparison) on §2's path: a 200 KB/s
/// line with 50 ms delay, 1 KB segments, a 50 KB send buffer, a
/// 10-packet drop-tail router (the queue with which Reno takes the
/// paper's time). "TCP Reno sends one MByte of data in 8.2 seconds (123
/// KB/s) and TCP Vegas sends one MByte in 6.2 seconds (166 KB/s)".
/// Measured: Reno 8.34 s (119.9 KB/s, with losses), Vegas 6.01 s (166.4
/// KB/s) without a single retransmission: its slow start ends when a
/// segment's worth is queued, and congestion avoidance holds 1 to 3.
#[test]
fn brakmo_vegas_moves_a_megabyte_in_under_6_5_seconds_where_reno_takes_8() {
    let run = |cc| {
        simulate(brakmo_sender(cc, 50), BRAKMO_FWD, BRAKMO_REV, 1_000_000, 1)
            .0
            .summary
    };
    let reno = run(CcKind::Aimd);
    let vegas = run(CcKind::Vegas);
    assert!(vegas.secs <= 6.5, "Vegas took {:.2} s", vegas.secs);
    let ratio = reno.secs / vegas.secs;
    assert!(
        ratio >= 1.25,
        "Vegas {:.2} s, Reno {:.2} s: {ratio:.2}x",
        vegas.secs,
        reno.secs
    );
    assert_eq!(
        vegas.rxmts, 0,
        "Vegas should not overrun the 10-packet queue"
    );
    assert!(reno.rxmts > 0, "Reno finds the queue's size by losing");
}

/// Brakmo & Peterson §4, Table 4: 20 runs of a distinguished 20-second
/// transfer on §2's path sharing the bottleneck with tcplib-like
/// background traffic over the same TCP (`brakmo_table_4`; the background
/// alone for 5 s first), offering 60 % of the line on average; the
/// background then uses 37–80 % of it (the paper: 30–80 %). Paper: Reno
/// 59.3 KB/s, 4.5 % retransmitted; Vegas 82.8 KB/s, 2.8 %: Vegas/Reno 1.40
/// in throughput, 0.62 in retransmissions; the bottleneck 82 % used under
/// Lite, 91 % under Vegas. Measured: Reno 60.5 KB/s, 4.50 %; Vegas 74.4
/// KB/s, 0.97 %: 1.23 and 0.22; the bottleneck 84 % and 91 % used. Per
/// run the throughput ratio spreads from 0.90 to 1.59 (sd 0.16, so the
/// mean of 20 is known to about 0.04): the test asks for 1.15, the
/// paper's direction with two standard errors below what we measure, and
/// for retransmissions no more than the paper's 0.62. Vegas gains, as the
/// paper says, not at the background's expense but by using the line
/// better.
#[test]
fn brakmo_4_table_4_vegas_against_reno_under_tcplib_background() {
    const SEEDS: u64 = 20;
    const OFFERED: f64 = 0.6;
    const WARMUP: Duration = Duration::from_secs(5);
    let runs = |cc: CcKind, name: &str| -> Vec<Table4Run> {
        (1..=SEEDS)
            .map(|seed| {
                let r = brakmo_table_4(cc, OFFERED, WARMUP, seed).unwrap();
                say(&format!(
                    "table 4 {name} seed {seed}: {:.1} KB/s, {:.2} % retransmitted, background {:.0} % of the line ({} conversations), utilisation {:.0} %",
                    r.throughput / 1e3,
                    r.retransmitted * 100.0,
                    r.background * 100.0,
                    r.conversations,
                    r.utilisation * 100.0
                ));
                assert!(
                    (0.3..=0.85).contains(&r.background),
                    "{name} seed {seed}: the background used {:.2} of the line",
                    r.background
                );
                r
            })
            .collect()
    };
    let mean = |runs: &[Table4Run], of: fn(&Table4Run) -> f64| {
        runs.iter().map(of).sum::<f64>() / runs.len() as f64
    };
    let reno = runs(CcKind::Aimd, "reno");
    let vegas = runs(CcKind::Vegas, "vegas");
    let throughput = |r: &Table4Run| r.throughput;
    let retransmitted = |r: &Table4Run| r.retransmitted;
    let background = |r: &Table4Run| r.background;
    let utilisation = |r: &Table4Run| r.utilisation;
    let ratio = mean(&vegas, throughput) / mean(&reno, throughput);
    let losses = mean(&vegas, retransmitted) / mean(&reno, retransmitted);
    say(&format!(
        "table 4 mean of {SEEDS}: reno {:.1} KB/s, {:.2} %, background {:.0} %, utilisation {:.0} %; vegas {:.1} KB/s, {:.2} %, background {:.0} %, utilisation {:.0} %; vegas/reno throughput {ratio:.2} (paper 1.40), retransmissions {losses:.2} (paper 0.62)",
        mean(&reno, throughput) / 1e3,
        mean(&reno, retransmitted) * 100.0,
        mean(&reno, background) * 100.0,
        mean(&reno, utilisation) * 100.0,
        mean(&vegas, throughput) / 1e3,
        mean(&vegas, retransmitted) * 100.0,
        mean(&vegas, background) * 100.0,
        mean(&vegas, utilisation) * 100.0,
    ));
    assert!(ratio >= 1.15, "Vegas/Reno throughput {ratio:.2}");
    assert!(losses <= 0.62, "Vegas/Reno retransmissions {losses:.2}");
    assert!(
        mean(&vegas, utilisation) > mean(&reno, utilisation),
        "Vegas should use the line better"
    );
    assert!(
        mean(&vegas, background) >= 0.95 * mean(&reno, background),
        "Vegas's gain should not come from the background"
    );
}

// ---------------------------------------------------------------------------
// Sarolahti & Kuznetsov §3 and Figure 2: quick acknowledgements
// (`--quickack`)
// ---------------------------------------------------------------------------

/// When the segment holding byte `bytes - 1` first went out.
fn sent_through(trace: &[TraceRecord], bytes: u64, payload: u64) -> Duration {
    let last = (bytes - 1) / payload;
    trace
        .iter()
        .find_map(|r| match *r {
            TraceRecord::Xmt { time, seg } if seg == last => Some(time),
            _ => None,
        })
        .expect("sent")
}

/// Sarolahti Figure 2 on the Seawind path (256 kbit/s, 200 ms, a
/// 7-packet tail-drop buffer): a Linux 2.4 sender (initial window 2,
/// cwnd counted per ACK, `abc 0`) and a receiver delaying ACKs by 200 ms
/// but ACKing every second full segment at once. "The unmodified Linux
/// sender has transmitted 50 KB in 2 seconds, but when the quick
/// acknowledgments are disabled, it takes 2.5 seconds". Measured: 1.92 s
/// with `quickack 16` (29 ACKs), 2.64 s without (18 ACKs).
#[test]
fn linux_3_quick_acks_send_50_kb_in_2_seconds_instead_of_2_5() {
    quick_acks_win("bare", |quickack| {
        let tuning = seawind_linux_sender(quickack);
        let payload = tuning.payload_size() as u64;
        let (result, rec) = simulate(
            tuning,
            "rate 256kbit limit 7 | delay 200ms",
            "delay 200ms",
            50_000,
            1,
        );
        let at = sent_through(&rec.trace, 50_000, payload);
        (at, result.summary.pkts_in)
    });
}

/// Sarolahti's Linux 2.4 sender (initial window 2, cwnd counted per ACK)
/// with a receiver delaying ACKs by 200 ms, quick ACKs as given.
fn seawind_linux_sender(quickack: u32) -> Tuning {
    Tuning {
        delack: Duration::from_millis(200),
        quickack,
        abc: 0,
        initsegs: 2,
        ..Tuning::default()
    }
}

/// Runs `run` with 16 quick ACKs and with none (each gives when the 50 KB
/// were sent and the ACKs the sender got) and checks Figure 2's result.
fn quick_acks_win(name: &str, mut run: impl FnMut(u32) -> (Duration, u64)) {
    let (quick, quick_acks) = run(16);
    let (delayed, delayed_acks) = run(0);
    let what = format!(
        "{name}: quick ACKs {quick:?} ({quick_acks} ACKs), delayed {delayed:?} ({delayed_acks} ACKs)"
    );
    assert!(quick <= Duration::from_millis(2100), "{what}");
    assert!(
        quick.as_secs_f64() <= 0.85 * delayed.as_secs_f64(),
        "{what}"
    );
    assert!(quick_acks > delayed_acks, "{what}");
}

/// Sarolahti Figure 2 through the handshake: the receiver's delayed-ACK
/// and quick-ACK settings travel in the client's hello, and the server's
/// receiver applies them, so the quick ACKs win as they do in the bare
/// run — plain and sealed. Times count from the sender's start, after the
/// handshake, as in the bare run.
#[test]
fn linux_3_quick_acks_hold_through_the_handshake() {
    for (name, endpoints) in [("plain", Endpoints::Plain), ("keyed", keyed_endpoints())] {
        quick_acks_win(name, |quickack| {
            let tuning = seawind_linux_sender(quickack);
            let mut config = PairConfig::new(
                SimConfig::new(
                    tuning.clone(),
                    "rate 256kbit limit 7 | delay 200ms".parse().unwrap(),
                    "delay 200ms".parse().unwrap(),
                    Some(50_000),
                    1,
                )
                .trace(true),
            );
            let tag = match &endpoints {
                Endpoints::Keys(server, client) => {
                    config = config.authenticated(server.clone(), client.clone());
                    atou::internals::crypto::protect::TAG_LEN
                }
                _ => 0,
            };
            let mut pair = Pair::new(config).unwrap();
            let mut rec = Recorder::default();
            let result = pair.run(&mut rec);
            assert_eq!(
                result.outcome,
                RunEnd::Finished,
                "{name} quickack {quickack}"
            );
            assert_eq!(result.handshake.is_some(), tag > 0, "{name}");
            let payload = atou::internals::crypto::payload_size(tuning.mss as usize, tag).unwrap();
            let acks = pair.client.sender().unwrap().stats().pkts_in;
            (sent_through(&rec.trace, 50_000, payload as u64), acks)
        });
    }
}

// ---------------------------------------------------------------------------
// Sarolahti & Kuznetsov §5: the reordering metric (`--reordering adaptive`)
// ---------------------------------------------------------------------------

/// On atou's cable path (60 % of packets reordered, displaced by up to
/// about 30), `reordering adaptive` with the default `dup_thresh 3` gets
/// at least 90 % of the hand-tuned `dup_thresh 9` goodput: the first late
/// originals raise the threshold above their displacement, and it stays
/// there for the connection. The summary reports the metric. Measured
/// (10 MiB, seed 1): SACK fixed 3 0.94 Mbit/s, hand-tuned 9 1.88,
/// adaptive 5.15 (displacement 30, dup_thresh 31); FACK 0.88, 1.67 and
/// 5.24. NewReno has no SACK to measure with, so `adaptive` leaves it as
/// it is (0.99 Mbit/s either way).
#[test]
fn linux_5_adaptive_reordering_matches_a_hand_tuned_dup_thresh() {
    const FWD: &str = "rate 6mbit | delay 60ms reorder 60%";
    for kind in [
        RecoveryKind::NewReno,
        RecoveryKind::Sack,
        RecoveryKind::Fack,
    ] {
        let run = |dup_thresh, reordering| {
            let tuning = Tuning {
                recovery: kind,
                dup_thresh,
                reordering,
                rcvwin: 200,
                ..Tuning::default()
            };
            simulate(tuning, FWD, "delay 10ms", 10 << 20, 1).0.summary
        };
        let fixed3 = run(3, ReorderingKind::Fixed);
        let tuned9 = run(9, ReorderingKind::Fixed);
        let adaptive = run(3, ReorderingKind::Adaptive);
        let what = format!(
            "{kind}: fixed 3 {:.2} Mbit/s, hand-tuned 9 {:.2}, adaptive {:.2} (reordering {}, dup_thresh {})",
            fixed3.goodput_bps / 1e6,
            tuned9.goodput_bps / 1e6,
            adaptive.goodput_bps / 1e6,
            adaptive.reordering,
            adaptive.dup_thresh
        );
        eprintln!("{what}");
        if kind == RecoveryKind::NewReno {
            assert_eq!(adaptive.goodput_bps, fixed3.goodput_bps, "{what}");
        } else {
            assert!(adaptive.reordering > 0, "{what}");
            assert!(adaptive.dup_thresh > 3, "{what}");
            assert!(adaptive.goodput_bps >= 0.9 * tuned9.goodput_bps, "{what}");
        }
        assert_eq!(fixed3.dup_thresh, 3, "{what}");
    }
    // Loss is not reordering: on a 1 %-loss path that reorders nothing
    // the metric stays at zero (D-SACKs of a timeout's go-back-N once
    // made it 1387).
    // (README's `atou sim` example: 100 MB, 6 timeouts.)
    let lossy = simulate(
        Tuning {
            cc: CcKind::Aimd,
            recovery: RecoveryKind::Sack,
            ..Tuning::command_default()
        },
        "rate 100mbit delay 50ms limit 1000 loss 1%",
        "delay 50ms",
        100_000_000,
        1,
    )
    .0
    .summary;
    assert_eq!((lossy.reordering, lossy.dup_thresh), (0, 3), "{lossy}");
}
