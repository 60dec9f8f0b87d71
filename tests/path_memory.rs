//! Per-destination memory of the path (the path cache): a transfer that
//! starts from what the last one to the same destination learnt starts
//! faster, and a memory that no longer holds costs little. Simulated, so
//! the figures are exact and repeatable; docs/tuning.md quotes them.

use std::time::Duration;

use atou::internals::path_memory::PathMemory;
use atou::sim::{SimConfig, SimResult, Simulation};
use atou::{CcKind, RecoveryKind, Tuning};

/// 100 Mbit/s, 50 ms each way (RTT 100 ms), a queue of about one BDP.
const FWD: &str = "rate 100mbit delay 50ms limit 1000";
const REV: &str = "delay 50ms";
const SEED: u64 = 7;

fn tuning(cc: CcKind) -> Tuning {
    Tuning {
        cc,
        rcvwin: 100_000,
        rcvsegs: 100_000,
        ..Tuning::command_default()
    }
}

fn run(cc: CcKind, fwd: &str, bytes: u64, memory: Option<PathMemory>) -> SimResult {
    let config = SimConfig::new(
        tuning(cc),
        fwd.parse().unwrap(),
        REV.parse().unwrap(),
        Some(bytes),
        SEED,
    )
    .check_invariants(true)
    .path_memory(memory);
    let result = Simulation::new(config).unwrap().run(&mut ()).unwrap();
    assert!(
        result.delivered_intact(bytes),
        "incomplete: {}",
        result.summary
    );
    result
}

fn secs(r: &SimResult) -> f64 {
    r.summary.secs
}

/// A first run learns the path; a second, seeded with its memory, moves
/// the same 16 MB sooner. The gain is Startup's climb from ten segments,
/// which the seeded run skips (careful resume's jump to half the BDP).
#[test]
fn a_second_bbr_transfer_on_a_long_path_finishes_sooner() {
    const BYTES: u64 = 16_000_000;
    let first = run(CcKind::Bbr, FWD, BYTES, None);
    let memory = first
        .summary
        .path_memory
        .expect("the first run learnt the path");
    let bw = memory.btl_bw_bps.unwrap() as f64;
    assert!((80e6..=100e6).contains(&bw), "bandwidth learnt {bw}");
    let second = run(CcKind::Bbr, FWD, BYTES, Some(memory));
    let (a, b) = (secs(&first), secs(&second));
    println!("BBR 16 MB, 100 Mbit/s, 100 ms: first {a:.3} s, second {b:.3} s");
    assert!(b < a - 0.2, "first {a:.3} s, second {b:.3} s");
}

/// A 54 KB file between two large transfers: it never leaves Startup,
/// so the bandwidth it reached is a lower bound, and saved over the large
/// transfer's memory it keeps the larger one (`PathMemory::over`): the
/// next large transfer jumps as it would have straight after the first.
/// Saved as measured (as before), it cost that transfer its jump.
#[test]
fn a_small_transfer_does_not_lower_the_bandwidth_remembered() {
    const BYTES: u64 = 16_000_000;
    let first = run(CcKind::Bbr, FWD, BYTES, None)
        .summary
        .path_memory
        .unwrap();
    let small = run(CcKind::Bbr, FWD, 54_000, Some(first))
        .summary
        .path_memory
        .unwrap();
    assert!(small.btl_bw_is_lower_bound, "{small:?}");
    assert!(
        !first.btl_bw_is_lower_bound,
        "16 MB fills a 100 Mbit/s pipe"
    );
    let (bw, small_bw) = (first.btl_bw_bps.unwrap(), small.btl_bw_bps.unwrap());
    assert!(
        small_bw < bw,
        "the small file reached {small_bw}, the large {bw}"
    );
    let kept = small.over(Some(&first));
    assert_eq!(kept.btl_bw_bps, Some(bw));
    let after_kept = run(CcKind::Bbr, FWD, BYTES, Some(kept));
    let after_measured = run(CcKind::Bbr, FWD, BYTES, Some(small));
    let after_first = run(CcKind::Bbr, FWD, BYTES, Some(first));
    let (k, m, f) = (secs(&after_kept), secs(&after_measured), secs(&after_first));
    println!(
        "BBR 16 MB after a 54 KB file that reached {:.1} Mbit/s (the first {:.1}): \
         memory kept {k:.3} s, replaced {m:.3} s, straight after the first {f:.3} s",
        small_bw as f64 / 1e6,
        bw as f64 / 1e6
    );
    assert!(k < m - 0.1, "kept {k:.3} s, replaced {m:.3} s");
    assert!(k <= f + 0.05, "kept {k:.3} s, straight after {f:.3} s");
}

/// A memory from a path ten times as fast as this one: the seeded run
/// overshoots once, and is no more than a few round trips slower.
#[test]
fn a_wrong_memory_costs_little() {
    const BYTES: u64 = 4_000_000;
    const SLOW: &str = "rate 10mbit delay 50ms limit 100";
    let fast = run(CcKind::Bbr, FWD, 16_000_000, None)
        .summary
        .path_memory
        .unwrap();
    let plain = run(CcKind::Bbr, SLOW, BYTES, None);
    let misled = run(CcKind::Bbr, SLOW, BYTES, Some(fast));
    let (a, b) = (secs(&plain), secs(&misled));
    println!("BBR 4 MB, 10 Mbit/s path, memory of 100 Mbit/s: none {a:.3} s, wrong {b:.3} s");
    assert!(b < a + 0.5, "no memory {a:.3} s, a wrong one {b:.3} s");
}

/// CUBIC takes the saved ssthresh: slow start ends near the BDP instead
/// of overflowing the queue.
#[test]
fn a_second_cubic_transfer_does_not_overshoot() {
    const BYTES: u64 = 16_000_000;
    let first = run(CcKind::Cubic, FWD, BYTES, None);
    let memory = first.summary.path_memory.unwrap();
    let second = run(CcKind::Cubic, FWD, BYTES, Some(memory));
    println!(
        "CUBIC 16 MB: first {:.3} s {} rxmts, second {:.3} s {} rxmts (ssthresh {:?} B)",
        secs(&first),
        first.summary.rxmts,
        secs(&second),
        second.summary.rxmts,
        memory.ssthresh_bytes
    );
    assert!(
        second.summary.rxmts * 10 < first.summary.rxmts,
        "retransmissions: first {}, second {}",
        first.summary.rxmts,
        second.summary.rxmts
    );
    assert!(secs(&second) <= secs(&first) + 0.1);
}

/// The first RTO of a connection to a remembered destination comes from
/// the saved RTT, not RFC 6298's one second.
#[test]
fn the_first_rto_comes_from_the_memory() {
    let memory = PathMemory {
        srtt: Duration::from_millis(100),
        rttvar: Duration::from_millis(10),
        ssthresh_bytes: None,
        btl_bw_bps: None,
        min_rtt: None,
        datagram_size: None,
        btl_bw_is_lower_bound: false,
    };
    let t = Tuning {
        recovery: RecoveryKind::Sack,
        ..Tuning::default()
    };
    let plain = atou::internals::Sender::new(&t, 1, Some(1000), atou::Time::ZERO).unwrap();
    let seeded = atou::internals::Sender::new(&t, 1, Some(1000), atou::Time::ZERO)
        .unwrap()
        .with_path_memory(&memory);
    assert_eq!(plain.rto(), Duration::from_secs(1));
    assert_eq!(seeded.rto(), Duration::from_millis(300));
}
