//! atou beside another sender on one bottleneck (issue 29 point 3): a
//! transfer's two streams (two bbr flows, each its own controller) share
//! 100 Mbit/s, 50 ms each way and a 1000-packet queue with one kernel-like
//! cubic or one bbr flow. Each stream resends no more than the path
//! dropped of its own datagrams, and next to nothing that had arrived.

mod common;
use common::say;
use std::time::Duration;

use atou::sim::{run_flows, FlowConfig, FlowsConfig, FlowsResult, RunEnd, SimConfig, Simulation};
use atou::{CcKind, Tuning};

const SECS: u64 = 20;

/// The flows that are atou's: a transfer's two streams, first.
const ATOU_STREAMS: usize = 2;

fn bbr() -> Tuning {
    Tuning::command_default()
}

fn cubic() -> Tuning {
    Tuning {
        cc: CcKind::Cubic,
        ..Tuning::command_default()
    }
}

/// atou's two streams and `other` over the path with `loss` each way;
/// checks every atou stream's resends against its own drops.
fn share(name: &str, other: Tuning, loss: &str) -> FlowsResult {
    let loss = if loss.is_empty() {
        String::new()
    } else {
        format!(" loss {loss}")
    };
    let config = FlowsConfig::new(
        vec![
            FlowConfig::new(bbr()),
            FlowConfig::new(bbr()),
            FlowConfig::new(other),
        ],
        format!("rate 100mbit limit 1000 | delay 50ms{loss}")
            .parse()
            .unwrap(),
        format!("delay 50ms{loss}").parse().unwrap(),
        Duration::from_secs(SECS),
        1,
    );
    let r = run_flows(&config, &mut ()).unwrap();
    say(&format!("sharing {name}:\n{r}"));
    for (i, f) in r.flows.iter().enumerate() {
        let s = &f.summary;
        assert_eq!(f.outcome, RunEnd::TimeLimit, "flow {i}: {s}");
        assert_eq!(s.sim.as_ref().unwrap().first_error, None, "flow {i}");
        say(&format!(
            "  flow {}: mean RTT {:.1} ms ({:.2} x the base 100 ms)",
            i + 1,
            s.avgrtt.as_secs_f64() * 1e3,
            s.avgrtt.as_secs_f64() / 0.1
        ));
    }
    for (i, f) in r.flows.iter().take(ATOU_STREAMS).enumerate() {
        let s = &f.summary;
        // The segments that arrived twice: resent though they had arrived.
        let spurious = s.receiver.unwrap().duplicates;
        // Segments dropped in the last round trip are not resent yet, so
        // the bound holds from below too; 1.2 leaves a lost resend room.
        assert!(
            s.rxmts * 5 <= f.fwd_dropped * 6,
            "flow {i} resent {} of {} dropped:\n{r}",
            s.rxmts,
            f.fwd_dropped
        );
        assert!(s.spurious_rxmts <= spurious, "flow {i}: {s}");
        assert!(
            spurious * 100 <= s.rxmts.max(100),
            "flow {i}: {spurious} of {} resends had arrived:\n{r}",
            s.rxmts
        );
    }
    r
}

/// Before the RTO kept min_rto above srtt (src/proto/stream/rtt.rs) the
/// streams resent 1682 and 2369 segments of 1029 and 1152 dropped, 656 and
/// 1217 of them spurious, after one and two timeouts.
#[test]
fn beside_cubic_at_one_percent_atou_resends_what_was_dropped() {
    share("bbr bbr + cubic, 1 %", cubic(), "1%");
}

#[test]
fn beside_cubic_without_loss_atou_resends_what_was_dropped() {
    share("bbr bbr + cubic, 0 %", cubic(), "");
}

/// Before: 4071 and 3281 resent of 2073 and 2453 dropped, 1991 and 855
/// spurious, after 9 and 2 timeouts.
#[test]
fn beside_bbr_at_one_percent_atou_resends_what_was_dropped() {
    share("bbr bbr + bbr, 1 %", bbr(), "1%");
}

#[test]
fn beside_bbr_without_loss_atou_resends_what_was_dropped() {
    share("bbr bbr + bbr, 0 %", bbr(), "");
}

/// The summary's `spurious_rxmts` is what D-SACKs proved (RFC 3708 §3):
/// over a lossless return path, exactly the resends the receiver already
/// had. A three-second stall of the forward path (Sarolahti & Kuznetsov
/// §6) makes the timeouts resend segments held in it.
#[test]
fn the_summary_counts_the_resends_dsacks_prove_spurious() {
    let config = SimConfig::new(
        bbr(),
        "rate 10mbit limit 1000 | delay 50ms".parse().unwrap(),
        "delay 50ms".parse().unwrap(),
        Some(20_000_000),
        1,
    )
    .fwd_stall(Some((Duration::from_secs(5), Duration::from_secs(3))));
    let r = Simulation::new(config).unwrap().run(&mut ()).unwrap();
    let s = &r.summary;
    say(&format!("a 3 s stall:\n{s}"));
    assert!(r.delivered_intact(20_000_000), "{s}");
    let duplicates = s.receiver.unwrap().duplicates;
    assert!(s.timeouts > 0 && duplicates > 0, "{s}");
    assert_eq!(s.spurious_rxmts, duplicates, "{s}");
    let json = serde_json::to_value(s).unwrap();
    assert_eq!(json["spurious_rxmts"], duplicates, "{json}");
}
