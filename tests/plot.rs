//! `atou plot`: the series it draws hold what the trace says, the SVG
//! draws them, and `--plot` on a run draws the same as `atou plot` on the
//! run's trace file.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use netem_support::listening_addr;

use atou::internals::plot::{svg, Series};
use atou::internals::summary::config_lines;
use atou::internals::trace::Trace;
use atou::netem::NetemSpec;
use atou::sim::{SimConfig, SimResult, Simulation};
use atou::{AckRecord, CcKind, Recorder, RecoveryKind, StateRecord, TraceRecord, Tuning};

mod common;
mod netem_support;

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

/// A seeded lossy run with SACK, its trace as `--trace` would write it.
fn lossy_run(cc: CcKind) -> (SimResult, Trace) {
    let tuning = Tuning {
        recovery: RecoveryKind::Sack,
        cc,
        ..Tuning::default()
    };
    let fwd: NetemSpec = "rate 20mbit delay 20ms limit 100 loss 1%".parse().unwrap();
    let rev: NetemSpec = "delay 20ms".parse().unwrap();
    let config = SimConfig::new(tuning.clone(), fwd, rev, Some(2_000_000), 7).trace(true);
    let mut rec = Recorder::default();
    let result = Simulation::new(config).unwrap().run(&mut rec).unwrap();
    assert!(result.delivered_intact(2_000_000), "{}", result.summary);
    let trace = Trace {
        header: config_lines(&tuning),
        records: rec.trace,
    };
    (result, trace)
}

/// The contents of the SVG's <text> elements.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1;
            Some(body.split("</text>").next()?.trim().to_string())
        })
        .collect()
}

fn count<F: Fn(&TraceRecord) -> bool>(trace: &Trace, f: F) -> usize {
    trace.records.iter().filter(|r| f(r)).count()
}

#[test]
fn series_hold_what_the_trace_of_a_seeded_run_says() {
    let (result, trace) = lossy_run(CcKind::Aimd);
    let sum = &result.summary;
    let s = Series::from_trace(&trace);
    // The run lost segments and repaired them: the graph has work to do.
    assert!(sum.rxmts >= 5, "{sum}");

    // Every transmission is a point: first ones once each, segment 0 up to
    // snd_max; the rest are exactly the retransmissions the sender counted.
    let xmts = count(&trace, |r| matches!(r, TraceRecord::Xmt { .. }));
    assert_eq!(xmts as u64, sum.pkts_out);
    assert_eq!(s.sent.len() + s.retransmitted.len(), xmts);
    assert_eq!(s.retransmitted.len() as u64, sum.rxmts);
    assert_eq!(s.sent.len() as u64, sum.snd_max);
    assert!(s.sent.iter().enumerate().all(|(i, p)| p.1 == i as u64));

    // One cumulative-ACK, cwnd and state point per ACK; SACK blocks as
    // traced; RTT samples for the ACKs that carried one.
    let acks: Vec<(f64, u64, u64)> = trace
        .records
        .iter()
        .filter_map(|r| match *r {
            TraceRecord::Ack(AckRecord {
                time, ack, cwnd, ..
            }) => Some((time.as_secs_f64(), ack, cwnd)),
            _ => None,
        })
        .collect();
    assert_eq!(s.acked.len(), acks.len());
    assert!(acks.iter().zip(&s.acked).all(|(a, p)| (a.0, a.1) == *p));
    assert!(acks.iter().zip(&s.cwnd).all(|(a, p)| (a.0, a.2) == *p));
    assert_eq!(s.acked.last().unwrap().1, sum.snd_una);
    let sacks = count(&trace, |r| matches!(r, TraceRecord::Sack { .. }));
    assert!(sacks > 0, "a SACK run without SACK blocks");
    assert_eq!(s.sacked.len(), sacks);
    let states = count(&trace, |r| matches!(r, TraceRecord::State(_)));
    assert_eq!(
        states as u64,
        acks.len() as u64 + sum.timeouts,
        "one state line per ACK and per timeout"
    );
    // The window's edge is never below the cumulative ACK it came with.
    let edges = trace.records.windows(2).filter_map(|w| match (w[0], w[1]) {
        (TraceRecord::State(state), TraceRecord::Ack(AckRecord { ack, .. })) => {
            Some((state.right_edge, ack))
        }
        _ => None,
    });
    assert!(edges.clone().count() == acks.len() && edges.into_iter().all(|(e, a)| e >= a));
    assert_eq!(s.rto_ms.len(), states);
    assert_eq!(s.window_edge.len(), states);
    assert!(s.srtt_ms.len() > states / 2);
    assert!(!s.ssthresh.is_empty(), "a loss makes ssthresh finite");
    assert!(
        s.pacing_mbps.is_empty() && s.bw_mbps.is_empty(),
        "AIMD has neither"
    );
    let rtt = (
        sum.minrtt.as_secs_f64() * 1e3,
        sum.maxrtt.as_secs_f64() * 1e3,
    );
    assert!(s
        .rtt_ms
        .iter()
        .all(|p| p.1 >= rtt.0 - 1e-3 && p.1 <= rtt.1 + 1e-3));

    // The axes cover every record's time and every segment.
    let last = trace.records.last().map(record_time).unwrap();
    let first = trace.records.first().map(record_time).unwrap();
    assert!(s.time.0 <= first && s.time.1 == last, "{:?}", s.time);
    assert!(
        (last - result.summary.secs).abs() < 0.01,
        "{last} {}",
        sum.secs
    );
    let max_seg = s.sent.iter().chain(&s.retransmitted).map(|p| p.1).max();
    assert_eq!(s.seq.0, 0);
    assert!(s.seq.1 >= max_seg.unwrap() && s.seq.1 >= sum.snd_una);

    // Goodput bins add up to the payload acknowledged.
    let payload = Tuning::default().payload_size() as f64;
    let bits: f64 = s.goodput.iter().map(|g| g.1 * 1e6 * s.bin).sum();
    let want = sum.snd_una as f64 * payload * 8.0;
    assert!(
        (bits / want - 1.0).abs() < 1e-9,
        "{bits} bits, {want} acked"
    );
    // Bins of a hundredth of the run, but never shorter than a round trip.
    assert!(s.goodput.len() <= atou::internals::plot::GOODPUT_BINS);
    assert!(s.bin >= sum.minrtt.as_secs_f64() - 1e-6, "{}", s.bin);
    assert!(s.bin >= (last - first) / atou::internals::plot::GOODPUT_BINS as f64);
    assert!(s.goodput.last().unwrap().0 >= last);
}

fn record_time(r: &TraceRecord) -> f64 {
    match *r {
        TraceRecord::Xmt { time, .. }
        | TraceRecord::Ack(AckRecord { time, .. })
        | TraceRecord::Sack { time, .. }
        | TraceRecord::State(StateRecord { time, .. }) => time.as_secs_f64(),
    }
}

#[test]
fn the_svg_marks_every_retransmission_in_four_panels() {
    let (result, trace) = lossy_run(CcKind::Aimd);
    let s = Series::from_trace(&trace);
    let text = svg(&s, "lossy run").unwrap();
    // Retransmissions are the only triangles (the legend shows a square).
    let triangles = text.matches("<polygon").count();
    assert_eq!(triangles as u64, result.summary.rxmts);
    for title in [
        "lossy run",
        "time-sequence graph",
        "congestion window",
        "round-trip time",
        &format!("goodput (per {:.3} s)", s.bin),
        &format!("retransmitted ({})", result.summary.rxmts),
        "SACKed",
        "ssthresh",
        "srtt",
        "RTO",
    ] {
        assert!(
            texts(&text).iter().any(|t| t == title),
            "no `{title}` in the SVG"
        );
    }
    // No controller rates for AIMD: no second axis.
    assert!(!text.contains("pacing rate"));
    // Markers are thinned to the grid, never more than the points.
    let circles = text.matches("<circle").count();
    assert!(circles <= s.sent.len() + s.rtt_ms.len() + 2, "{circles}");
    assert!(circles > 100, "{circles}");
}

#[test]
fn bbr_runs_plot_the_pacing_rate_and_bandwidth_estimate() {
    let (_, trace) = lossy_run(CcKind::Bbr);
    let s = Series::from_trace(&trace);
    let states = count(&trace, |r| matches!(r, TraceRecord::State(_)));
    assert_eq!(s.pacing_mbps.len(), states);
    assert_eq!(s.bw_mbps.len(), states);
    // The estimate never claims more than the 20 Mbit/s link.
    assert!(
        s.bw_mbps.iter().all(|b| b.1 <= 20.0 * 1.01),
        "{:?}",
        s.bw_mbps.iter().map(|b| b.1).fold(0.0, f64::max)
    );
    assert!(s.bw_mbps.iter().any(|b| b.1 > 5.0));
    let text = svg(&s, "bbr").unwrap();
    let texts = texts(&text);
    assert!(
        texts.iter().any(|t| t == "pacing rate (Mbit/s)"),
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t == "bandwidth estimate (Mbit/s)"));
}

/// A trace with only atou's two lines (as before `sack` and `state`)
/// still plots, with the same sequence and window series.
#[test]
fn a_trace_of_atous_two_lines_still_plots() {
    let (_, trace) = lossy_run(CcKind::Aimd);
    let lines: Vec<String> = trace.records.iter().map(|r| r.to_string() + "\n").collect();
    let full = Trace::parse(&lines.concat()).unwrap();
    let old: String = lines
        .iter()
        .filter(|l| l.ends_with(" xmt\n") || l.ends_with(" ack\n"))
        .cloned()
        .collect();
    let old = Trace::parse(&old).unwrap();
    let (s, full) = (Series::from_trace(&old), Series::from_trace(&full));
    assert_eq!(s.sent.len(), full.sent.len());
    assert_eq!(s.retransmitted, full.retransmitted);
    assert_eq!(s.cwnd, full.cwnd);
    assert!(s.sacked.is_empty() && s.srtt_ms.is_empty() && s.window_edge.is_empty());
    assert_eq!(s.goodput_unit, "segments/s", "no header, no payload size");
    let svg = svg(&s, "old").unwrap();
    let texts = texts(&svg);
    assert!(texts.iter().any(|t| t == "time-sequence graph"));
    assert!(!texts.iter().any(|t| t == "SACKed"));
}

fn atou(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run atou")
}

/// `name` in this suite's directory, which is kept: its plots are for
/// looking at.
fn tmp(name: &str) -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| common::kept_dir("plot")).join(name)
}

/// `sim --plot` draws from the records in memory, `atou plot` from the
/// file: the same picture, so the file's reader loses nothing.
#[test]
fn sim_plot_and_atou_plot_of_its_trace_draw_the_same_svg() {
    let (trace, direct, replot) = (tmp("h2.trace"), tmp("direct.svg"), tmp("replot.svg"));
    let o = atou(&[
        "sim",
        "--bytes",
        "1MB",
        "--fwd",
        "rate 10mbit delay 50ms",
        "--rev",
        "delay 50ms",
        "--recovery",
        "newreno",
        "--rcvwin",
        "20",
        "--droplist",
        "101,103",
        "--trace",
        trace.to_str().unwrap(),
        "--plot",
        direct.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = atou(&[
        "plot",
        trace.to_str().unwrap(),
        "--out",
        replot.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, b) = (
        std::fs::read_to_string(&direct).unwrap(),
        std::fs::read_to_string(&replot).unwrap(),
    );
    assert!(a == b, "--plot and atou plot differ");
    // Hoe H2: segments 101 and 103 resent, one triangle each; the title
    // says what ran.
    assert_eq!(a.matches("<polygon").count(), 2);
    assert!(a.contains("fwd delay 50ms rate 10mbit"), "title");
    assert!(a.contains("recovery newreno"), "title");
}

#[test]
fn a_missing_or_foreign_trace_is_one_line_and_status_2() {
    let o = atou(&["plot", "/nonexistent/run.trace"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/run.trace"), "{err}");
    let junk = tmp("junk.trace");
    std::fs::write(&junk, "hello world\n0.1 x xmt\n").unwrap();
    let o = atou(&["plot", junk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("line 2"), "{err}");
    assert!(!junk.with_extension("svg").exists());
}

/// --plot records the trace even without --trace, and refuses to go with
/// several flows (one flow's graphs).
#[test]
fn plot_without_trace_and_not_with_flows() {
    let out = tmp("alone.svg");
    let o = atou(&["sim", "--bytes", "200KB", "--plot", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("<svg"));
    assert!(texts(&text).iter().any(|t| t.starts_with("goodput")));
    let o = atou(&["sim", "--flow", "cc=bbr", "--plot", out.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
}

/// `atou send --trace --plot` over loopback, authenticated (the default):
/// one trace and one plot per data stream, each the stream's own
/// connection (segments from 0, its retransmissions marked), and the file
/// the plot was drawn from; its `payload:` line counts the protection's
/// overhead, so bytes read back from it are the bytes sent.
#[test]
fn send_writes_a_trace_and_a_plot_per_data_stream() {
    let (src, dest, keys) = (tmp("send-src"), tmp("send-dest"), tmp("send-keys"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    for name in ["server", "client"] {
        let o = atou(&["keygen", "-f", keys.join(name).to_str().unwrap()]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    std::fs::copy(keys.join("client.pub"), keys.join("authorized_keys")).unwrap();
    for (name, len) in [("a.bin", 3_000_000), ("b.bin", 2_000_000)] {
        let data: Vec<u8> = (0..len)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(src.join(name), data).unwrap();
    }
    let mut serve = Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args([
            "serve",
            "--bind",
            "127.0.0.1:0",
            "--once",
            "--identity",
            keys.join("server").to_str().unwrap(),
            "--authorized-keys",
            keys.join("authorized_keys").to_str().unwrap(),
            "--dir",
        ])
        .arg(&dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start atou serve");
    let addr = listening_addr(&mut serve);
    let (trace, plot) = (tmp("send.trace"), tmp("send.svg"));
    let o = atou(&[
        "send",
        "--quiet",
        "--identity",
        keys.join("client").to_str().unwrap(),
        "--server-key",
        keys.join("server.pub").to_str().unwrap(),
        "--streams",
        "2",
        "--trace",
        trace.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
        src.join("a.bin").to_str().unwrap(),
        src.join("b.bin").to_str().unwrap(),
        &addr.to_string(),
    ]);
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for stream in [1, 2] {
        let t = Trace::read(&tmp(&format!("send.s{stream}.trace"))).unwrap();
        assert!(t
            .header
            .iter()
            .any(|h| h.contains(&format!("stream {stream} round 1"))));
        let s = Series::from_trace(&t);
        // Each stream carries about its share of the 5 MB (largest files
        // first: a.bin on one, b.bin on the other), in segments from 0.
        let payload = t.payload_size().unwrap();
        // Loopback's mss, 8972, less the data header (25) and the
        // protection (8 of packet number, 16 of tag).
        assert_eq!(t.tuning().unwrap().mss, 8972);
        assert_eq!(payload, 8972 - 25 - 24);
        let bytes = s.acked.last().unwrap().1 * payload;
        assert!(
            (1_900_000..3_200_000).contains(&bytes),
            "stream {stream}: {bytes}"
        );
        assert_eq!(s.sent.first().map(|p| p.1), Some(0));
        assert_eq!(s.sent.len() as u64, s.acked.last().unwrap().1);
        let svg = std::fs::read_to_string(tmp(&format!("send.s{stream}.svg"))).unwrap();
        assert_eq!(svg.matches("<polygon").count(), s.retransmitted.len());
        assert!(svg.contains(&format!("stream {stream} round 1")), "title");
    }
    assert!(
        !trace.exists() && !plot.exists(),
        "two streams: no unnumbered file"
    );
}

/// `atou probe --plot` over loopback: the probe's graphs, its
/// retransmissions counted as its summary counts them.
#[test]
fn probe_plots_its_connection() {
    let mut serve = Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["serve", "--bind", "127.0.0.1:0", "--no-auth", "--once"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start atou serve");
    let addr = listening_addr(&mut serve);
    let (trace, plot) = (tmp("probe.trace"), tmp("probe.svg"));
    // Two segments dropped by the sender itself: two retransmissions
    // whatever loopback does.
    let o = atou(&[
        "probe",
        &addr.to_string(),
        "--no-auth",
        "--json",
        "--bytes",
        "1MB",
        "--droplist",
        "100,300",
        "--trace",
        trace.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    let _ = serve.kill();
    let _ = serve.wait();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let summary: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rxmts = summary["rxmts"].as_u64().unwrap();
    assert!(rxmts >= 2, "{summary}");
    let s = Series::from_trace(&Trace::read(&trace).unwrap());
    assert_eq!(s.retransmitted.len() as u64, rxmts);
    assert!(
        s.retransmitted.iter().any(|r| r.1 == 100) && s.retransmitted.iter().any(|r| r.1 == 300)
    );
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert_eq!(svg.matches("<polygon").count() as u64, rxmts);
    assert!(texts(&svg).iter().any(|t| t.contains("probe")), "title");
}

/// atou appendix B (FACK, `droplist 200 200`, a small receive buffer):
/// the timeout shows as the RTO doubling in the RTT panel, and the
/// receive window's edge, near the data, is drawn.
#[test]
fn a_timeout_doubles_the_plotted_rto_and_a_near_window_edge_is_drawn() {
    let mut tuning = Tuning::default();
    tuning
        .apply_config("newreno 0\nfack 1\nsack 1\nrampdown 1\nrcvrwin 26\ndroplist 200 200\n")
        .unwrap();
    tuning.rcvsegs = 40;
    let fwd: NetemSpec = "rate 10mbit delay 20ms".parse().unwrap();
    let rev: NetemSpec = "delay 20ms".parse().unwrap();
    let config = SimConfig::new(tuning.clone(), fwd, rev, Some(1 << 20), 1).trace(true);
    let mut rec = Recorder::default();
    let result = Simulation::new(config).unwrap().run(&mut rec).unwrap();
    assert!(result.delivered_intact(1 << 20), "{}", result.summary);
    assert_eq!(result.summary.timeouts, 1, "{}", result.summary);
    let timeout = rec
        .events
        .iter()
        .find(|e| matches!(e.event, atou::Event::TimeoutRetransmit { .. }))
        .unwrap()
        .time
        .as_secs_f64();
    let trace = Trace {
        header: config_lines(&tuning),
        records: rec.trace,
    };
    let s = Series::from_trace(&trace);
    // At the timeout, the RTO is twice the one before it (RFC 6298 §5.5).
    let at = s
        .rto_ms
        .iter()
        .position(|p| p.0 == timeout)
        .expect("a state line at the timeout");
    assert!(at > 0);
    assert!(
        (s.rto_ms[at].1 / s.rto_ms[at - 1].1 - 2.0).abs() < 1e-9,
        "{:?}",
        &s.rto_ms[at - 1..=at]
    );
    // The edge: at most 40 segments above the cumulative ACK, so drawn.
    let edge_max = s.window_edge.iter().map(|e| e.1).max().unwrap();
    assert!(edge_max <= s.seq.1 + 40, "{edge_max} {:?}", s.seq);
    let svg = svg(&s, "appendix B").unwrap();
    assert!(texts(&svg).iter().any(|t| t == "receive window edge"));
    assert_eq!(svg.matches("<polygon").count() as u64, result.summary.rxmts);
}
