//! `atou probe` against `atou serve` over real UDP on loopback.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

use atou::internals::wire::{Hello, Packet, ReceiverParams, RejectReason, VERSION};
use netem_support::listening_addr;
use serde_json::Value;

mod common;
mod netem_support;

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

struct Server {
    child: Child,
    addr: SocketAddr,
    stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts `atou serve --json` on an ephemeral loopback port.
    fn start(extra: &[&str]) -> Server {
        Server::start_with_config(extra, None)
    }

    /// The same, with `XDG_CONFIG_HOME` at `config` (where an empty one
    /// makes a server without a key).
    fn start_with_config(extra: &[&str], config: Option<&std::path::Path>) -> Server {
        Server::start_at("127.0.0.1:0", extra, config)
    }

    /// The same, bound to `bind`.
    fn start_at(bind: &str, extra: &[&str], config: Option<&std::path::Path>) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_atou"));
        if let Some(c) = config {
            command.env("XDG_CONFIG_HOME", c);
        }
        let mut child = command
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .args(["serve", "--bind", bind, "--json"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou serve");
        let addr = listening_addr(&mut child);
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Server {
            child,
            addr,
            stdout,
        }
    }

    /// The next connection report.
    fn report(&mut self) -> Value {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: `{line}`"))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn probe(addr: SocketAddr, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .arg("probe")
        .arg(addr.to_string())
        .args(["--json", "--maxidle", "5"])
        .args(args)
        .output()
        .expect("run atou probe")
}

fn summary(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON summary")
}

/// atou appendix B on a real socket: three segments dropped in one window
/// are each retransmitted once, without a timeout, by every variant that
/// recovers several losses per window.
#[test]
fn droplist_of_three_in_one_window_is_repaired_without_timeout() {
    let mut server = Server::start(&[]);
    for recovery in ["newreno", "sack", "fack"] {
        let out = probe(
            server.addr,
            &[
                "--bytes",
                "1MB",
                "--recovery",
                recovery,
                "--rcvwin",
                "64",
                "--droplist",
                "300,305,310",
            ],
        );
        let s = summary(&out);
        assert_eq!(s["rxmts"], 3, "{recovery}: {s}");
        assert_eq!(s["timeouts"], 0, "{recovery}");
        assert_eq!(s["dropped"], 3, "{recovery}");
        assert_eq!(s["bytes"], 1_000_000, "{recovery}");
        assert_eq!(s["receiver"]["bytes"], 1_000_000, "{recovery}");
        let r = server.report();
        assert_eq!(r["end"], "closed");
        assert_eq!(r["stats"]["bytes"], 1_000_000);
        assert_eq!(r["corrupt_bytes"], 0);
    }
}

#[test]
fn eight_concurrent_probes_against_one_server_all_complete() {
    let mut server = Server::start(&[]);
    let addr = server.addr;
    let probes: Vec<_> = (0..8)
        .map(|_| std::thread::spawn(move || probe(addr, &["--bytes", "20MB"])))
        .collect();
    for p in probes {
        let s = summary(&p.join().unwrap());
        assert_eq!(s["bytes"], 20_000_000);
        assert_eq!(s["status"], "finished");
    }
    let mut ids = std::collections::HashSet::new();
    for _ in 0..8 {
        let r = server.report();
        assert_eq!(r["stats"]["bytes"], 20_000_000);
        assert_eq!(r["corrupt_bytes"], 0);
        ids.insert(r["conn_id"].as_u64().unwrap());
    }
    assert_eq!(ids.len(), 8, "eight distinct connections");
}

#[test]
fn garbage_sprayed_at_the_server_is_counted_and_dropped() {
    let mut server = Server::start(&[]);
    let addr = server.addr;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sprayer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut x: u64 = 0x2545_F491_4F6C_DD1D;
            let mut sent = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || sent < 2000 {
                // xorshift: random lengths and bytes; every 3rd starts with
                // atou's magic and version so it gets past the first check.
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let len = (x % 1500) as usize;
                let mut d: Vec<u8> = (0..len).map(|i| (x >> (i % 57)) as u8).collect();
                if sent % 3 == 0 && d.len() >= 4 {
                    d[..4].copy_from_slice(&[b'A', b'T', VERSION, 1 + (x % 6) as u8]);
                }
                let _ = sock.send_to(&d, addr);
                sent += 1;
                if sent % 64 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            sent
        })
    };
    let out = probe(addr, &["--bytes", "200MB"]);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let sent = sprayer.join().unwrap();
    let s = summary(&out);
    assert_eq!(s["bytes"], 200_000_000);
    let r = server.report();
    assert_eq!(r["corrupt_bytes"], 0);
    let dropped = r["server"]["undecodable"].as_u64().unwrap()
        + r["server"]["unknown_connection"].as_u64().unwrap()
        + r["server"]["unexpected"].as_u64().unwrap();
    assert!(
        dropped > 100,
        "the server counted {dropped} of {sent} garbage datagrams: {r}"
    );
    // The server still serves after the spray.
    summary(&probe(addr, &["--bytes", "1MB"]));
    assert_eq!(server.report()["stats"]["bytes"], 1_000_000);
}

#[test]
fn a_server_killed_mid_probe_fails_the_probe_after_maxidle() {
    let mut server = Server::start(&[]);
    let addr = server.addr;
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .arg("probe")
        .arg(addr.to_string())
        .args(["--maxtime", "60", "--maxidle", "2", "--rcvwin", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    server.kill();
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    // 30: timeout (the peer went silent mid-run; worth retrying).
    assert_eq!(out.status.code(), Some(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("maxidle"), "{err}");
    assert!(err.contains(&addr.to_string()), "{err}");
    assert!(
        err.contains("ICMP unreachable"),
        "loopback reports the dead port: {err}"
    );
    // maxidle 2 s after the kill at 0.7 s, plus start-up: not a hang.
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert!(
        took >= Duration::from_millis(2500),
        "gave up before maxidle: {took:?}"
    );
    // The summary of what got through is still printed.
    assert!(String::from_utf8_lossy(&out.stdout).contains("status: failed"));
}

#[test]
fn a_probe_with_no_server_fails_at_once_and_a_silent_one_after_maxidle() {
    // Nothing listens on a port we just released: ICMP says so.
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = probe(port, &["--bytes", "1MB"]);
    // 10: network (no server; worth retrying).
    assert_eq!(out.status.code(), Some(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no atou server"), "{err}");

    // A socket that reads and never answers: the hello times out.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["probe", &silent.local_addr().unwrap().to_string()])
        .args(["--bytes", "1MB", "--maxidle", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("maxidle") && err.contains("key"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Plain, the hello itself goes unanswered.
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_atou"))
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["probe", &silent.local_addr().unwrap().to_string()])
        .args(["--bytes", "1MB", "--maxidle", "1", "--no-auth"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("maxidle") && err.contains("hello"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn protocol_version_mismatch_is_a_clear_error_on_both_sides() {
    // Server side: a hello in version VERSION+1 gets a reject naming ours.
    let mut server = Server::start(&[]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 64];
    let n = Hello {
        conn_id: 77,
        mss: 1472,
        maxidle_ms: 1000,
        session: 0,
        receiver: ReceiverParams {
            rcvsegs: 10,
            rcvbuf: 65536,
            delack_us: 0,
            quickack: 0,
            sack: true,
        },
    }
    .emit(&mut buf)
    .unwrap();
    buf[2] = VERSION + 1;
    sock.send_to(&buf[..n], server.addr).unwrap();
    let (m, _) = sock.recv_from(&mut buf).unwrap();
    match Packet::decode(&buf[..m]).unwrap() {
        Packet::Reject(r) => {
            assert_eq!(r.reason, RejectReason::UnsupportedVersion);
            assert_eq!(r.version, VERSION);
            assert_eq!(r.conn_id, 77);
        }
        other => panic!("expected a reject, got {other:?}"),
    }
    server.kill();

    // Client side: a "server" from the future answers in its own version.
    let future = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = future.local_addr().unwrap();
    let responder = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let (n, from) = future.recv_from(&mut buf).unwrap();
        // The client asks for the server's key first (it has none pinned).
        assert_eq!(buf[3], 0x23, "{:?}", &buf[..16.min(n)]);
        let mut reply = buf[..12].to_vec();
        reply[2] = VERSION + 1;
        reply[3] = 4; // welcome, in a layout we cannot know
        reply.extend_from_slice(&[0; 20]);
        future.send_to(&reply, from).unwrap();
    });
    let out = probe(addr, &["--bytes", "1MB"]);
    responder.join().unwrap();
    // 12: protocol (the ends speak different versions).
    assert_eq!(out.status.code(), Some(12));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("protocol version {}", VERSION + 1)),
        "{err}"
    );
}

#[test]
fn ctrl_c_stops_the_server_cleanly() {
    let mut server = Server::start(&[]);
    summary(&probe(server.addr, &["--bytes", "1MB"]));
    server.report();
    let pid = server.child.id().to_string();
    let status = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(status.success());
    let exit = server.child.wait().unwrap();
    assert!(exit.success(), "serve exited with {exit:?}");
}

#[test]
fn serve_once_exits_after_one_connection() {
    let mut server = Server::start(&["--once"]);
    summary(&probe(server.addr, &["--bytes", "1MB"]));
    let exit = server.child.wait().unwrap();
    assert!(exit.success());
}

/// The hello carries the receiver-side tuning and the server applies it:
/// with `--delack 200ms` it ACKs every second segment.
#[test]
fn the_server_applies_the_receiver_tuning_from_the_hello() {
    let mut server = Server::start(&[]);
    for (delack, low, high) in [("0", 1.0, 1.0), ("200ms", 0.45, 0.6)] {
        let s = summary(&probe(
            server.addr,
            &["--bytes", "2MB", "--delack", delack, "--rcvwin", "64"],
        ));
        let r = server.report();
        // Every segment that arrives is ACKed or not as delack says,
        // duplicates too (a tail loss probe resends one that arrived).
        let segments =
            r["stats"]["segments"].as_f64().unwrap() + r["stats"]["duplicates"].as_f64().unwrap();
        let acks = r["stats"]["acks"].as_f64().unwrap();
        let ratio = acks / segments;
        assert!(
            (low..=high).contains(&ratio),
            "delack {delack}: {acks} ACKs for {segments} segments"
        );
        assert_eq!(s["receiver"]["acks"], r["stats"]["acks"]);
    }
}

#[test]
fn a_host_recorded_in_known_hosts_never_falls_back_to_cleartext() {
    let dir = common::TestDir::new("loopback-pinned");
    let config = dir.dir("config");
    // A server with no key answers "no key", as anyone could forge.
    let mut server = Server::start_with_config(&[], Some(&config));
    let known = dir.path("known_hosts");
    let key = "atou-x25519 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    std::fs::write(&known, format!("{} {key}\n127.0.0.1 {key}\n", server.addr)).unwrap();
    let k = known.to_str().unwrap();
    let out = probe(server.addr, &["--bytes", "64K", "--known-hosts", k]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("records its key"), "{err}");
    // A host never seen: the probe goes on in the clear, and says so.
    std::fs::write(&known, "").unwrap();
    let out = probe(server.addr, &["--bytes", "64K", "--known-hosts", k]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    assert!(err.contains("unauthenticated and unencrypted"), "{err}");
    server.kill();
}

/// Per-host defaults (`Host` blocks in $XDG_CONFIG_HOME/atou/config)
/// reach a probe to that host, and a flag on the command line wins.
#[test]
fn a_probe_takes_its_hosts_settings_and_typed_flags_win() {
    let mut server = Server::start(&[]);
    let config = common::TestDir::new("host-config");
    let dir = config.path("xdg");
    std::fs::create_dir_all(dir.join("atou")).unwrap();
    std::fs::write(
        dir.join("atou/config"),
        "Host 10.*\n  bytes 9MB\nHost 127.0.0.1\n  bytes 300KB\n  cc cubic\n",
    )
    .unwrap();
    let addr = server.addr.to_string();
    let run = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_atou"))
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .env("XDG_CONFIG_HOME", &dir)
            .args(["probe", &addr, "--json", "--maxidle", "5"])
            .args(args)
            .output()
            .expect("run atou probe");
        summary(&out)
    };
    let s = run(&[]);
    assert_eq!(s["bytes"], 300_000);
    assert_eq!(s["tuning"]["cc"], "cubic", "{s}");
    server.report();
    let s = run(&["--bytes", "200KB"]);
    assert_eq!(s["bytes"], 200_000, "the typed flag wins");
    server.report();
}

/// `atou keygen` of a "server" and a "client" key in `dir`: the path of
/// each file by name ("server", "server.pub", ...).
fn server_and_client_keys(dir: &common::TestDir) -> impl Fn(&str) -> String + '_ {
    let key = |name: &str| dir.path(name).to_str().unwrap().to_owned();
    for name in ["server", "client"] {
        let made = Command::new(env!("CARGO_BIN_EXE_atou"))
            .args(["keygen", "-f", &key(name)])
            .output()
            .unwrap();
        assert!(made.status.success(), "{made:?}");
    }
    key
}

/// `--seal-thread on` seals and sends the data on a thread beside the
/// protocol's, and `atou serve --open-thread on` opens it on one (issue
/// 28, point 4): every byte arrives and matches the test pattern, and
/// each end counts the datagrams it did so; `off` does all of it on the
/// protocol's threads.
#[test]
fn data_sealed_and_opened_on_threads_of_their_own_arrives_whole() {
    let dir = common::TestDir::new("loopback-seal-thread");
    let key = server_and_client_keys(&dir);
    for (mode, aside) in [("on", true), ("off", false)] {
        let mut server = Server::start(&["--identity", &key("server"), "--open-thread", mode]);
        let out = probe(
            server.addr,
            &[
                "--bytes",
                "8MB",
                "--server-key",
                &key("server.pub"),
                "--identity",
                &key("client"),
                "--cipher",
                "aes-256-gcm",
                "--seal-thread",
                mode,
            ],
        );
        let s = summary(&out);
        assert_eq!(s["security"]["cipher"], "aes-256-gcm", "{s}");
        let sealed = s["security"]["sealed_aside"].as_u64().unwrap();
        if aside {
            // Slow start alone sends batches past the 64 KiB threshold.
            assert!(sealed > 100, "{mode}: {sealed} sealed aside: {s}");
        } else {
            assert_eq!(sealed, 0, "{mode}: {s}");
        }
        assert_eq!(s["security"]["dropped"], 0, "{s}");
        let r = server.report();
        assert_eq!(r["stats"]["bytes"], 8_000_000, "{mode}: {r}");
        assert_eq!(r["corrupt_bytes"], 0, "{mode}: {r}");
        assert_eq!(r["server"]["crypto_dropped"], 0, "{mode}: {r}");
        let opened = r["server"]["opened_aside"].as_u64().unwrap();
        if aside {
            assert!(opened > 100, "{mode}: {opened} opened aside: {r}");
        } else {
            assert_eq!(opened, 0, "{mode}: {r}");
        }
        server.kill();
    }
}

/// A server bound to every address of this host answers each client from
/// the address the client sent to. A probe to 127.0.0.2, a second address
/// of this host as an alias or another interface would be, completes,
/// plain and keyed (its datagrams opened on the protocol's thread and
/// aside), though the kernel's route back starts at 127.0.0.1, a source
/// the probe's connected socket drops: before, every such probe failed
/// after its maxidle with "no UDP reply". Bound to `[::]`, the same for
/// IPv4 clients (where this host has IPv6).
#[test]
fn a_server_bound_to_every_address_answers_from_the_one_each_client_reached() {
    let dir = common::TestDir::new("loopback-every-address");
    let key = server_and_client_keys(&dir);
    let binds: &[&str] = if UdpSocket::bind("[::]:0").is_ok() {
        &["0.0.0.0:0", "[::]:0"]
    } else {
        eprintln!("no IPv6 on this host: the [::] half of this test is skipped");
        &["0.0.0.0:0"]
    };
    for bind in binds {
        for open_thread in ["off", "on"] {
            let mut server = Server::start_at(
                bind,
                &["--identity", &key("server"), "--open-thread", open_thread],
                None,
            );
            let reached = SocketAddr::from(([127, 0, 0, 2], server.addr.port()));
            let keyed = [
                "--server-key",
                &key("server.pub"),
                "--identity",
                &key("client"),
            ];
            for (what, args) in [("plain", &["--no-auth"][..]), ("keyed", &keyed[..])] {
                let out = probe(reached, &[&["--bytes", "4MB"][..], args].concat());
                let s = summary(&out);
                assert_eq!(s["bytes"], 4_000_000, "{bind}, {what}: {s}");
                let r = server.report();
                assert_eq!(r["stats"]["bytes"], 4_000_000, "{bind}, {what}: {r}");
            }
            server.kill();
        }
    }
}
