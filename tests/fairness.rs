//! Flows sharing one bottleneck in the simulator (BBR's fairness):
//! two flows over 100 Mbit/s, 50 ms each way, a 1000-packet queue; the
//! second starts 5 s after the first, and goodput is measured over the
//! last 50 s of 60, when both run.

mod common;
use common::say;
use std::time::Duration;

use atou::sim::{run_flows, FlowConfig, FlowsConfig, FlowsResult, RunEnd, SimConfig, Simulation};
use atou::{CcKind, Observer, RecoveryKind, TimedEvent, Tuning};

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

const FWD: &str = "rate 100mbit limit 1000 | delay 50ms";
const REV: &str = "delay 50ms";
const SECS: u64 = 60;
const SECOND_START: Duration = Duration::from_secs(5);
const MEASURE_FROM: Duration = Duration::from_secs(10);

fn bbr() -> Tuning {
    Tuning::command_default()
}

fn cubic() -> Tuning {
    Tuning {
        cc: CcKind::Cubic,
        ..Tuning::command_default()
    }
}

/// Reno-like: atou's AIMD with SACK.
fn aimd() -> Tuning {
    Tuning::default()
}

fn config(a: Tuning, b: Tuning, secs: u64) -> FlowsConfig {
    let mut config = FlowsConfig::new(
        vec![
            FlowConfig::new(a),
            FlowConfig::new(b).starting_at(SECOND_START),
        ],
        FWD.parse().unwrap(),
        REV.parse().unwrap(),
        Duration::from_secs(secs),
        1,
    );
    config.measure_from = Some(MEASURE_FROM);
    config
}

/// Two flows, the second 5 s late, for `secs` of virtual time.
fn two(name: &str, a: Tuning, b: Tuning, secs: u64) -> FlowsResult {
    let result = run_flows(&config(a, b, secs), &mut ()).unwrap();
    say(&format!("fairness {name}:\n{result}"));
    for (i, f) in result.flows.iter().enumerate() {
        let sim = f.summary.sim.as_ref().unwrap();
        assert_eq!(f.outcome, RunEnd::TimeLimit, "flow {i}: {}", f.summary);
        assert_eq!(sim.first_error, None, "flow {i} delivered wrong bytes");
        assert!(f.window_bytes > 0, "flow {i} moved nothing: {result}");
    }
    result
}

/// Fairness: the second flow's Startup ends at about a fifth of
/// the link (the first flow's queue holds its window back), and ProbeBW
/// must then hand it its share: Jain 0.79 before ProbeBW_UP ran until the
/// bandwidth stopped growing and ProbeRTT kept each flow's probe clock
/// (src/proto/congestion/bbr/probe_bw.rs, probe_rtt.rs).
#[test]
fn two_bbr_flows_share_the_bottleneck_fairly() {
    let r = two("bbr + bbr", bbr(), bbr(), SECS);
    assert!(r.jain() >= 0.9, "Jain {:.3}:\n{r}", r.jain());
    assert!(r.utilisation().unwrap() >= 0.9, "{r}");
}

/// Not the scenario (that is the one above, staggered): started
/// together, two bbr flows split the link evenly.
#[test]
fn two_bbr_flows_started_together_share_the_bottleneck_fairly() {
    let mut config = config(bbr(), bbr(), SECS);
    config.flows[1].start = Duration::ZERO;
    let r = run_flows(&config, &mut ()).unwrap();
    say(&format!("fairness bbr + bbr, started together:\n{r}"));
    assert!(r.jain() >= 0.9, "Jain {:.3}:\n{r}", r.jain());
    assert!(r.utilisation().unwrap() >= 0.9, "{r}");
}

#[test]
fn two_aimd_flows_share_the_bottleneck_fairly() {
    let r = two("aimd + aimd", aimd(), aimd(), SECS);
    assert!(r.jain() >= 0.9, "Jain {:.3}:\n{r}", r.jain());
    assert!(r.utilisation().unwrap() >= 0.9, "{r}");
}

/// Reported, not asserted: how bbr and cubic split the link.
#[test]
fn bbr_against_cubic_is_reported() {
    let r = two("bbr + cubic", bbr(), cubic(), SECS);
    say(&format!(
        "fairness bbr + cubic: bbr {:.1} %, cubic {:.1} %, Jain {:.3}",
        r.share(0) * 100.0,
        r.share(1) * 100.0,
        r.jain()
    ));
}

/// Every flow's datagrams go through the one forward path: its counts are
/// the flows' transmissions together, and its queue drops what they
/// overflow between them.
#[test]
fn flows_share_one_forward_queue_and_start_on_time() {
    let mut config = config(aimd(), aimd(), 8);
    config.check_invariants = true;
    config.measure_from = None;
    struct FirstEvents(Vec<Option<TimedEvent>>);
    impl Observer for FirstEvents {
        fn on_flow_event(&mut self, flow: usize, event: &TimedEvent) {
            self.0[flow].get_or_insert_with(|| event.clone());
        }
    }
    let mut first = FirstEvents(vec![None, None]);
    let r = run_flows(&config, &mut first).unwrap();
    say(&format!("fairness aimd + aimd, 8 s:\n{r}"));
    assert_eq!(r.window, (SECOND_START, Duration::from_secs(8)));
    let sent: u64 = r.flows.iter().map(|f| f.summary.pkts_out).sum();
    assert_eq!(r.fwd_stats.offered, sent);
    assert_eq!(
        r.flows[0].summary.sim.as_ref().unwrap().fwd_stats,
        r.fwd_stats
    );
    // Both slow starts overflow the shared queue.
    assert!(r.fwd_stats.limit_drops > 0, "{r}");
    // Each flow's drops are its own share of the queue's.
    let dropped: Vec<u64> = r.flows.iter().map(|f| f.fwd_dropped).collect();
    let queue_dropped = r.fwd_stats.lost + r.fwd_stats.limit_drops;
    assert_eq!(dropped.iter().sum::<u64>(), queue_dropped, "{r}");
    assert!(dropped.iter().all(|&d| d > 0), "{r}");
    // The second flow's clock starts at its start: 3 s of its life.
    assert!(r.flows[1].summary.secs <= 3.0, "{}", r.flows[1].summary);
    assert!(r.flows[0].summary.secs > 7.9, "{}", r.flows[0].summary);
    assert!(first.0.iter().all(Option::is_some));
}

/// One flow through `run_flows` is the single-flow simulator's run.
#[test]
fn one_flow_is_the_single_flow_run() {
    let tuning = Tuning {
        recovery: RecoveryKind::Rack,
        ..bbr()
    };
    let bytes = 20_000_000;
    let fwd = "rate 100mbit limit 1000 | delay 50ms loss 0.5%";
    let single = Simulation::new(SimConfig::new(
        tuning.clone(),
        fwd.parse().unwrap(),
        REV.parse().unwrap(),
        Some(bytes),
        9,
    ))
    .unwrap()
    .run(&mut ())
    .unwrap();
    let mut flow = FlowConfig::new(tuning);
    flow.bytes = Some(bytes);
    let multi = run_flows(
        &FlowsConfig::new(
            vec![flow],
            fwd.parse().unwrap(),
            REV.parse().unwrap(),
            Duration::from_secs(30 * 86_400),
            9,
        ),
        &mut (),
    )
    .unwrap();
    assert!(single.delivered_intact(bytes));
    assert_eq!(multi.flows[0].outcome, single.outcome);
    assert_eq!(multi.end, single.end);
    assert_eq!(
        multi.flows[0].summary.to_string(),
        single.summary.to_string()
    );
}

/// `atou sim --flow`: the library's figures, per flow, as JSON.
#[test]
fn the_cli_runs_flows_sharing_a_bottleneck() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args([
            "sim",
            "--fwd",
            "rate 10mbit limit 100 | delay 20ms",
            "--rev",
            "delay 20ms",
            "--flow",
            "cc=bbr",
            "--flow",
            "cc=aimd,recovery=sack,start=1s",
            "--duration",
            "5s",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["window"], serde_json::json!([1.0, 5.0]));
    assert_eq!(v["flows"][0]["summary"]["tuning"]["cc"], "bbr");
    assert_eq!(v["flows"][1]["summary"]["tuning"]["cc"], "aimd");
    assert_eq!(v["flows"][1]["start"], 1.0);
    assert!(v["flows"][0]["fwd_dropped"].is_u64(), "{v}");
    assert_eq!(v["bottleneck_bps"], 10_000_000);
    let jain = v["jain"].as_f64().unwrap();
    assert!(jain > 0.5 && jain <= 1.0, "{v}");
    // A flow's knob that does not exist is a usage error naming it.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["sim", "--flow", "cc=bbr,wobble=3"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("wobble"));
}

/// Seeds of the coupled-stream runs: one run's share beside one BBR
/// flow varies with BBR's random probe timing by more than the issue's
/// tolerance (one flow beside one: 0.43-0.50 for seeds 1-3, started
/// together), so the share asserted is the mean over these.
const SHARE_SEEDS: [u64; 3] = [1, 2, 3];

/// `streams` BBR streams of one transfer, coupled as `groups` flows
/// (stream `i` in group `i % groups`; `None`: each on its own), beside one
/// BBR flow, all started together; the transfer's share of the goodput
/// over the last 50 s of 60, the mean over [`SHARE_SEEDS`], and the runs.
fn transfer_beside_a_flow(streams: usize, groups: Option<usize>) -> (f64, Vec<FlowsResult>) {
    let runs: Vec<FlowsResult> = SHARE_SEEDS
        .iter()
        .map(|&seed| {
            let mut flows: Vec<FlowConfig> = (0..streams)
                .map(|i| {
                    let stream = FlowConfig::new(bbr());
                    FlowConfig {
                        group: groups.map(|g| i % g),
                        ..stream
                    }
                })
                .collect();
            flows.push(FlowConfig::new(bbr()));
            let mut config = FlowsConfig::new(
                flows,
                FWD.parse().unwrap(),
                REV.parse().unwrap(),
                Duration::from_secs(SECS),
                seed,
            );
            config.measure_from = Some(MEASURE_FROM);
            let r = run_flows(&config, &mut ()).unwrap();
            for (i, f) in r.flows.iter().enumerate() {
                let sim = f.summary.sim.as_ref().unwrap();
                assert_eq!(sim.first_error, None, "flow {i} delivered wrong bytes");
                assert!(f.window_bytes > 0, "flow {i} moved nothing: {r}");
            }
            r
        })
        .collect();
    let shares: Vec<f64> = runs
        .iter()
        .map(|r| (0..streams).map(|i| r.share(i)).sum())
        .collect();
    let mean = shares.iter().sum::<f64>() / shares.len() as f64;
    say(&format!(
        "fairness {streams} streams as {groups:?} flows beside bbr: mean {mean:.3} of {shares:.3?}\n{}",
        runs[0]
    ));
    (mean, runs)
}

/// Issue 29: the streams of one transfer compete as one flow: coupled,
/// N = 2, 4, 8 BBR streams beside one BBR flow get half the bottleneck
/// (± 0.1), and fill it together.
#[test]
fn coupled_streams_take_one_flows_share() {
    for n in [2, 4, 8] {
        let (share, runs) = transfer_beside_a_flow(n, Some(1));
        assert!(
            (share - 0.5).abs() <= 0.1,
            "{n} streams: {share:.3}\n{}",
            runs[0]
        );
        for r in &runs {
            assert!(r.utilisation().unwrap() >= 0.9, "{r}");
        }
    }
}

/// The check that the test above can fail: the same streams uncoupled
/// take about N flows' share,
/// N / (N + 1), well above a half.
#[test]
fn uncoupled_streams_take_a_share_each() {
    for n in [2, 4] {
        let (share, runs) = transfer_beside_a_flow(n, None);
        let expected = n as f64 / (n as f64 + 1.0);
        assert!(share > 0.6, "{n} streams: {share:.3}\n{}", runs[0]);
        assert!(
            (share - expected).abs() <= 0.1,
            "{n} streams: {share:.3}\n{}",
            runs[0]
        );
    }
}

/// Four streams as two coupled groups of two (`--flows 2`), about two
/// flows' share (2/3) beside one flow.
#[test]
fn two_flows_of_four_streams_take_two_shares() {
    let (share, runs) = transfer_beside_a_flow(4, Some(2));
    assert!((share - 2.0 / 3.0).abs() <= 0.1, "{share:.3}\n{}", runs[0]);
}

/// One coupled transfer alone fills the path as one flow does.
#[test]
fn coupled_streams_alone_fill_the_path() {
    for n in [1, 4] {
        let flows = (0..n)
            .map(|_| FlowConfig {
                group: Some(0),
                ..FlowConfig::new(bbr())
            })
            .collect();
        let r = run_flows(
            &FlowsConfig::new(
                flows,
                FWD.parse().unwrap(),
                REV.parse().unwrap(),
                Duration::from_secs(20),
                1,
            ),
            &mut (),
        )
        .unwrap();
        say(&format!("fairness {n} coupled streams alone:\n{r}"));
        assert!(r.utilisation().unwrap() >= 0.9, "{r}");
    }
}
