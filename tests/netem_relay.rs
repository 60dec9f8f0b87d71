//! Scenarios through `atou netem relay` on loopback: real sockets, the
//! netem model in real time, no root needed. Each records its specs and
//! seed with its result (see `netem_support::record`).

mod common;
mod netem_support;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netem_support::{probe, record, u, Relay, Server};
use serde_json::json;

/// One scenario at a time: they are real-time, and two would share the
/// machine's two cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `n` numbered datagrams through a relay to a sink and returns the
/// relay's counts and the sorted payload ids the sink received. A run in
/// which the sink got fewer datagrams than the relay delivered (the
/// kernel dropped them at the sink's buffer, the machine being busy) says
/// nothing of the relay's seeded fates and is run again, up to 3 times.
fn numbered_run(fwd: &str, seed: u64, n: u32) -> (serde_json::Value, Vec<u32>) {
    let mut run = numbered_run_once(fwd, seed, n);
    for _ in 0..2 {
        if run.1.len() as u64 == u(&run.0["fwd"]["delivered"]) {
            break;
        }
        eprintln!(
            "the sink got {} of the {} datagrams delivered: run again",
            run.1.len(),
            run.0["fwd"]["delivered"]
        );
        run = numbered_run_once(fwd, seed, n);
    }
    run
}

fn numbered_run_once(fwd: &str, seed: u64, n: u32) -> (serde_json::Value, Vec<u32>) {
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Room for every datagram of the run, should the receiving thread
    // wait for a core (capped at the host's rmem_max).
    let _ = socket2::SockRef::from(&sink).set_recv_buffer_size(8 << 20);
    sink.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let relay = Relay::start(sink.local_addr().unwrap(), fwd, "", seed);
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let receiver = std::thread::spawn(move || {
        let mut ids = Vec::new();
        let mut buf = [0u8; 2048];
        while let Ok(len) = sink.recv(&mut buf) {
            assert_eq!(len, 64);
            ids.push(u32::from_be_bytes(buf[..4].try_into().unwrap()));
        }
        ids
    });
    let start = Instant::now();
    for i in 0..n {
        let mut p = [0u8; 64];
        p[..4].copy_from_slice(&i.to_be_bytes());
        client.send_to(&p, relay.addr).unwrap();
        // 20,000 datagrams a second: well inside the relay and the queue.
        while start.elapsed() < Duration::from_micros(50) * (i + 1) {
            std::hint::spin_loop();
        }
    }
    let mut ids = receiver.join().unwrap();
    ids.sort_unstable();
    (relay.stop(), ids)
}

/// The same seed twice through the relay: the same datagrams dropped,
/// duplicated, corrupted and sent ahead; another seed, different ones.
#[test]
fn same_seed_twice_gives_identical_drops() {
    let _g = serial();
    let fwd = "loss 5% duplicate 2% corrupt 1% delay 1ms reorder 10% gap 3";
    let (a, ids_a) = numbered_run(fwd, 42, 5000);
    let (b, ids_b) = numbered_run(fwd, 42, 5000);
    let (c, ids_c) = numbered_run(fwd, 43, 5000);
    for key in [
        "offered",
        "lost",
        "limit_drops",
        "duplicated",
        "corrupted",
        "reordered",
    ] {
        assert_eq!(a["fwd"][key], b["fwd"][key], "{key}: {a} vs {b}");
    }
    assert_eq!(u(&a["fwd"]["offered"]), 5000);
    assert!(u(&a["fwd"]["lost"]) > 150, "{a}");
    assert_eq!(ids_a, ids_b, "the same datagrams arrive");
    assert_ne!(ids_a, ids_c, "another seed, another fate");
    assert_ne!(a["fwd"]["lost"], c["fwd"]["lost"], "{a} vs {c}");
    record(
        "same seed twice",
        "relay",
        fwd,
        "",
        42,
        json!({"run1": a["fwd"], "run2": b["fwd"], "seed43": c["fwd"], "received": ids_a.len()}),
    );
}

/// atou §4.3, the ORNL cable path: 60 % of packets sent ahead of the rest,
/// displacing them by up to ~30 positions at 6 Mbit/s. Waiting for nine
/// duplicate ACKs instead of three at least halves the needless fast
/// retransmissions' cost: goodput ≥ 1.5×.
#[test]
fn atou_4_3_dup_thresh_9_beats_3_on_a_reordering_path() {
    let _g = serial();
    let (fwd, rev, seed) = ("rate 6mbit | delay 60ms reorder 60%", "delay 10ms", 7);
    let server = Server::start(None, "127.0.0.1:0");
    let relay = Relay::start(server.addr, fwd, rev, seed);
    let target = relay.addr.to_string();
    let mut goodput = HashMap::new();
    for thresh in ["3", "9"] {
        let s = probe(
            None,
            &target,
            &[
                "--bytes",
                "3MB",
                // The paper's sender: AIMD, loss by duplicate ACKs, the
                // threshold as set (the commands adapt it to reordering,
                // which would make 3 as good as 9).
                "--cc",
                "aimd",
                "--recovery",
                "sack",
                "--reordering",
                "fixed",
                "--rcvwin",
                "200",
                "--dup-thresh",
                thresh,
            ],
        );
        assert_eq!(s["status"], "finished", "{s}");
        goodput.insert(thresh, (s["goodput_bps"].as_f64().unwrap(), u(&s["rxmts"])));
    }
    let counts = relay.stop();
    let (g3, g9) = (goodput["3"].0, goodput["9"].0);
    record(
        "atou 4.3 reordering",
        "relay",
        fwd,
        rev,
        seed,
        json!({"goodput_bps_dup3": g3, "rxmts_dup3": goodput["3"].1,
               "goodput_bps_dup9": g9, "rxmts_dup9": goodput["9"].1, "relay": counts}),
    );
    assert!(u(&counts["fwd"]["reordered"]) > 1000, "{counts}");
    assert!(
        g9 >= 1.5 * g3,
        "dup_thresh 9: {g9:.0} bit/s, 3: {g3:.0} bit/s"
    );
}

/// atou §4.4: when the return path is slow enough to limit the ACKs, a
/// receiver that ACKs every other segment moves at least as much data.
///
/// The sender is window-limited (`--rcvwin 64`, 94 KB), as the paper's
/// home path was: its rate is the window over the RTT, and the ACKs'
/// queue on the 128 kbit/s return path is part of that RTT. ACKing every
/// segment fills that queue (117 ms RTT here, 6.0 Mbit/s); ACKing every
/// other one halves it (74 ms, 9.4 Mbit/s). Without the window limit the
/// outcome hung on whether one timeout happened, and a CI run saw delayed
/// ACK off at 9.09 Mbit/s against 8.92 on.
#[test]
fn atou_4_4_delayed_ack_helps_on_an_ack_limited_path() {
    let _g = serial();
    let (fwd, rev, seed) = (
        "rate 10mbit delay 20ms",
        "rate 128kbit limit 50 | delay 20ms",
        9,
    );
    let server = Server::start(None, "127.0.0.1:0");
    let relay = Relay::start(server.addr, fwd, rev, seed);
    let target = relay.addr.to_string();
    let mut goodput = HashMap::new();
    for delack in ["0", "200"] {
        let s = probe(
            None,
            &target,
            &[
                "--bytes",
                "3MB",
                // The paper's sender: AIMD, clocked by the ACKs.
                "--cc",
                "aimd",
                "--recovery",
                "sack",
                "--rcvwin",
                "64",
                "--delack",
                delack,
            ],
        );
        assert_eq!(s["status"], "finished", "{s}");
        let r = &s["receiver"];
        goodput.insert(
            delack,
            (
                s["goodput_bps"].as_f64().unwrap(),
                u(&r["acks"]),
                u(&r["segments"]),
                s["avgrtt"].as_f64().unwrap(),
            ),
        );
    }
    let counts = relay.stop();
    let (off, on) = (goodput["0"], goodput["200"]);
    record(
        "atou 4.4 ACK-limited",
        "relay",
        fwd,
        rev,
        seed,
        json!({"delack_off": {"goodput_bps": off.0, "acks": off.1, "segments": off.2, "avgrtt": off.3},
               "delack_on": {"goodput_bps": on.0, "acks": on.1, "segments": on.2, "avgrtt": on.3},
               "rcvwin": 64, "relay": counts}),
    );
    // The receiver did delay its ACKs, which shortened the ACKs' queue, and
    // that helped.
    assert!((on.1 as f64) < 0.7 * on.2 as f64, "{on:?}");
    assert!(
        on.3 < off.3,
        "avgrtt with delayed ACK {} s, without {} s",
        on.3,
        off.3
    );
    assert!(
        on.0 >= off.0,
        "delayed ACK on {:.0} bit/s, off {:.0} bit/s",
        on.0,
        off.0
    );
}

/// Waits for one datagram on `sink` (up to `patience`); its first byte.
fn tag_of_next(sink: &UdpSocket) -> Option<u8> {
    let mut buf = [0u8; 64];
    sink.recv(&mut buf).ok().map(|_| buf[0])
}

/// Whoever can send UDP to the relay could make it hold a socket and a
/// thread per source address, forever (300 one-datagram sources held 286
/// threads and 294 descriptors). With `--max-sources 3`: three sources
/// get through, a fourth is dropped and counted; once the three have been
/// idle for `--idle`, they are forgotten and the fourth gets through.
#[test]
fn sources_beyond_the_cap_are_refused_until_idle_ones_are_reclaimed() {
    let _g = serial();
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let relay = Relay::start_with(
        sink.local_addr().unwrap(),
        "",
        "",
        1,
        &["--max-sources", "3", "--idle", "1s"],
    );
    let sources: Vec<UdpSocket> = (0..4)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut got = Vec::new();
    for (tag, s) in sources[..3].iter().enumerate() {
        s.send_to(&[tag as u8], relay.addr).unwrap();
        // One at a time, so the three are held before the fourth comes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() <= tag && Instant::now() < deadline {
            got.extend(tag_of_next(&sink));
        }
    }
    assert_eq!(got, [0, 1, 2], "the first three sources get through");
    // The fourth, while the three are held: dropped. It keeps trying
    // until the three are reclaimed and it gets through.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tries = 0u64;
    let mut fourth = None;
    while fourth.is_none() && Instant::now() < deadline {
        sources[3].send_to(&[3], relay.addr).unwrap();
        tries += 1;
        fourth = tag_of_next(&sink);
    }
    assert_eq!(
        fourth,
        Some(3),
        "the fourth source got through once the others were idle"
    );
    let counts = relay.stop();
    let s = &counts["sources"];
    assert_eq!(u(&s["opened"]), 4, "{counts}");
    assert_eq!(u(&s["reclaimed"]), 3, "{counts}");
    assert_eq!(u(&s["live"]), 1, "{counts}");
    let refused = u(&s["refused"]);
    assert!(refused >= 1 && refused < tries, "{counts}, {tries} tries");
    // Exactly the datagrams of admitted sources were forwarded.
    assert_eq!(
        u(&counts["fwd"]["offered"]),
        3 + tries - refused,
        "{counts}"
    );
}

/// A relay stopped the moment it says `ready` exits with its report, every
/// time: its signal handling is in place before it says so.
#[test]
fn a_relay_stopped_as_soon_as_it_is_ready_reports() {
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    for round in 0..100 {
        let relay = Relay::start(sink.local_addr().unwrap(), "delay 1ms", "", round);
        // final_json: exit 0 and the JSON report, not death by SIGTERM.
        let report = relay.stop();
        assert!(report.get("fwd").is_some(), "round {round}: {report}");
    }
}

/// The relay's socket asks for a 4 MiB receive buffer (the kernel grants
/// up to net.core.rmem_max), so a relay descheduled for a moment does not
/// lose datagrams at its socket, where its counts cannot see them.
#[test]
fn the_relay_reads_through_a_large_receive_buffer() {
    let sysctl = |name: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    let (max, default) = (sysctl("rmem_max"), sysctl("rmem_default"));
    if max <= default {
        eprintln!(
            "skipped: net.core.rmem_max ({max}) leaves no room above the default ({default})"
        );
        return;
    }
    let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay = Relay::start(sink.local_addr().unwrap(), "delay 1ms", "", 1);
    let port = relay.addr.port();
    let ss = std::process::Command::new("ss")
        .args(["-u", "-a", "-n", "-m", &format!("sport = :{port}")])
        .output();
    relay.stop();
    let Ok(ss) = ss else {
        eprintln!("skipped: `ss` (iproute2) is not installed");
        return;
    };
    let text = String::from_utf8_lossy(&ss.stdout);
    let rb: u64 = text
        .split([',', '('])
        .find_map(|f| f.strip_prefix("rb"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no rb in `ss -m` for port {port}: {text}"));
    // Linux reports twice what was set, for its bookkeeping.
    let granted = (4u64 << 20).min(max);
    assert!(rb >= granted, "rb {rb} < {granted}: {text}");
}
