//! Shared by the suites that run atou as real processes (netem, loopback,
//! transfer): starting `atou serve`, `atou netem relay` and `atou netem
//! bridge`, and recording each scenario.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
pub const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

pub const ATOU: &str = env!("CARGO_BIN_EXE_atou");

pub use crate::common::say;

/// Records a scenario's specs, backend and seed with its result, in the
/// log and in `target/netem-suite.jsonl`.
pub fn record(scenario: &str, via: &str, fwd: &str, rev: &str, seed: u64, result: Value) {
    let rec = json!({
        "scenario": scenario, "via": via, "fwd": fwd, "rev": rev, "seed": seed, "result": result,
    });
    say(&format!("netem-suite: {rec}"));
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/netem-suite.jsonl");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{rec}");
    }
}

/// Reads a child's stderr on a thread, forwarding lines until one
/// contains `ready`; returns all lines seen by then.
fn wait_ready(child: &mut Child, what: &str) -> Vec<String> {
    let stderr = BufReader::new(child.stderr.take().expect("piped stderr"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut sent = false;
        for line in stderr.lines().map_while(Result::ok) {
            if !sent {
                seen.push(line.clone());
                if line.trim() == "ready" {
                    let _ = tx.send(Ok(std::mem::take(&mut seen)));
                    sent = true;
                }
            } else {
                say(&format!("  {line}"));
            }
        }
        if !sent {
            let _ = tx.send(Err(seen));
        }
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(lines)) => lines,
        Ok(Err(lines)) => panic!("{what} exited before it was ready:\n{}", lines.join("\n")),
        Err(_) => panic!("{what} was not ready after 20 s"),
    }
}

/// SIGTERM, so the process tears down and reports (SIGKILL would not).
fn terminate(child: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
}

/// A process that is sent SIGTERM and reaped when dropped, so a failing
/// test never leaves a relay, bridge or server behind.
pub struct Daemon(Option<Child>);

impl Daemon {
    pub fn new(child: Child) -> Daemon {
        Daemon(Some(child))
    }

    /// The running process, e.g. to poll it with `try_wait`.
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("not yet stopped")
    }

    /// Sends SIGTERM and hands the process over to be waited for.
    pub fn stop(mut self) -> Child {
        let child = self.0.take().expect("not yet stopped");
        terminate(&child);
        child
    }

    /// Hands the process over without a signal (it has exited, or the
    /// caller waits for it to).
    pub fn release(mut self) -> Child {
        self.0.take().expect("not yet stopped")
    }

    /// SIGKILL and reap: the process gets no chance to tidy up, as when a
    /// machine loses power or the OOM killer strikes.
    pub fn kill(mut self) -> std::process::ExitStatus {
        let mut child = self.0.take().expect("not yet stopped");
        let _ = child.kill();
        child.wait().expect("reap a killed process")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            terminate(&c);
            let _ = c.wait();
        }
    }
}

fn final_json(child: Child, what: &str) -> Value {
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{what} failed: {:?}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{what}: {e}: `{text}`"))
}

/// Reads `atou serve`'s first stderr line, "listening on ADDR ...", and
/// passes the rest of its stderr through (past the test capture).
pub fn listening_addr(child: &mut Child) -> SocketAddr {
    let mut stderr = BufReader::new(child.stderr.take().expect("stderr piped"));
    let mut line = String::new();
    stderr.read_line(&mut line).expect("read serve's stderr");
    let addr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in `{line}`"));
    std::thread::spawn(move || {
        for l in stderr.lines().map_while(Result::ok) {
            say(&format!("  serve: {l}"));
        }
    });
    addr
}

/// A child's stdout as JSON values, one per line (other lines skipped);
/// each line is also said past the capture when `echo`.
pub fn json_lines(child: &mut Child, echo: bool) -> mpsc::Receiver<Value> {
    let stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
    let (tx, values) = mpsc::channel();
    std::thread::spawn(move || {
        for l in stdout.lines().map_while(Result::ok) {
            if echo {
                say(&format!("  serve: {l}"));
            }
            if let Ok(v) = serde_json::from_str::<Value>(&l) {
                let _ = tx.send(v);
            }
        }
    });
    values
}

/// `atou serve --json`, in a host if `netns` is given.
pub struct Server {
    _process: Daemon,
    pub addr: SocketAddr,
    reports: mpsc::Receiver<Value>,
}

impl Server {
    pub fn start(netns: Option<&str>, bind: &str) -> Server {
        Server::start_with(netns, bind, &[] as &[&str])
    }

    /// As `start`, with more of `atou serve`'s flags.
    pub fn start_with(
        netns: Option<&str>,
        bind: &str,
        extra: &[impl AsRef<std::ffi::OsStr>],
    ) -> Server {
        let mut cmd = in_host(netns, &["serve", "--bind", bind, "--json"]);
        let mut child = cmd
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou serve");
        let addr = listening_addr(&mut child);
        let reports = json_lines(&mut child, false);
        Server {
            _process: Daemon(Some(child)),
            addr,
            reports,
        }
    }

    /// The next connection's report.
    pub fn report(&self) -> Value {
        self.reports
            .recv_timeout(Duration::from_secs(30))
            .expect("a connection report from atou serve")
    }
}

/// `atou ARGS`, or `ip netns exec NS atou ARGS`.
pub fn in_host(netns: Option<&str>, args: &[&str]) -> Command {
    match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.env("XDG_CACHE_HOME", TEST_CACHE);
            c.args(["netns", "exec", ns, ATOU]).args(args);
            c
        }
        None => {
            let mut c = Command::new(ATOU);
            c.env("XDG_CACHE_HOME", TEST_CACHE);
            c.args(args);
            c
        }
    }
}

/// Runs `atou probe TARGET --json ARGS` and returns its summary; panics
/// with its stderr if it fails.
pub fn probe(netns: Option<&str>, target: &str, args: &[&str]) -> Value {
    // --no-auth: these tests measure the transport across impaired paths;
    // a key query would also go through the loss model's draws.
    // --no-path-cache: each starts cold, whatever path the last one had.
    let mut all = vec!["probe", target, "--json", "--no-auth", "--no-path-cache"];
    all.extend_from_slice(args);
    let out: Output = in_host(netns, &all).output().expect("run atou probe");
    assert!(
        out.status.success(),
        "probe {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON summary")
}

/// `atou netem relay` on an ephemeral loopback port.
pub struct Relay {
    process: Daemon,
    pub addr: SocketAddr,
}

impl Relay {
    pub fn start(to: SocketAddr, fwd: &str, rev: &str, seed: u64) -> Relay {
        Relay::start_with(to, fwd, rev, seed, &[])
    }

    /// With more flags (`--max-sources`, `--idle`).
    pub fn start_with(to: SocketAddr, fwd: &str, rev: &str, seed: u64, more: &[&str]) -> Relay {
        let mut child = Command::new(ATOU)
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .args([
                "netem",
                "relay",
                "--listen",
                "127.0.0.1:0",
                "--to",
                &to.to_string(),
            ])
            .args([
                "--fwd",
                fwd,
                "--rev",
                rev,
                "--seed",
                &seed.to_string(),
                "--json",
            ])
            .args(more)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou netem relay");
        let lines = wait_ready(&mut child, "atou netem relay");
        let addr = lines[0]
            .split_whitespace()
            .nth(3)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no address in `{}`", lines[0]));
        Relay {
            process: Daemon(Some(child)),
            addr,
        }
    }

    /// Stops the relay; its final counts.
    pub fn stop(self) -> Value {
        final_json(self.process.stop(), "atou netem relay")
    }
}

/// Why the bridge suite cannot run here, if it cannot.
pub fn bridge_unavailable() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(1)
        != 0
    {
        return Some(
            "not root (network namespaces and TUN devices need root; CI runs as root)".into(),
        );
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("no /dev/net/tun".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) is not installed".into());
    }
    None
}

/// Prints why a root-only scenario is skipped; true if it must be.
pub fn skip_bridge(scenario: &str) -> bool {
    match bridge_unavailable() {
        Some(why) => {
            crate::common::cannot_run(scenario, &why);
            true
        }
        None => false,
    }
}

/// `atou netem bridge` with its own hosts `atou-tN-a`, `atou-tN-b` on
/// 10.77.N.0/24, so scenarios can run side by side.
pub struct Bridge {
    process: Daemon,
    pub a: String,
    pub b: String,
    pub addr_b: String,
    pub backend: String,
}

impl Bridge {
    pub fn start(n: u8, fwd: &str, rev: &str, seed: u64) -> Bridge {
        let (a, b) = (format!("atou-t{n}-a"), format!("atou-t{n}-b"));
        let addrs = format!("10.77.{n}.1,10.77.{n}.2");
        let mut child = Command::new(ATOU)
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .args([
                "netem",
                "bridge",
                "--hosts",
                &format!("{a},{b}"),
                "--addrs",
                &addrs,
            ])
            .args([
                "--fwd",
                fwd,
                "--rev",
                rev,
                "--seed",
                &seed.to_string(),
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou netem bridge");
        let lines = wait_ready(&mut child, "atou netem bridge");
        let backend = lines[0]
            .split_whitespace()
            .skip_while(|w| *w != "backend")
            .nth(1)
            .unwrap_or("?")
            .trim_end_matches(',')
            .to_string();
        Bridge {
            process: Daemon(Some(child)),
            a,
            b,
            addr_b: format!("10.77.{n}.2"),
            backend,
        }
    }

    /// Stops the bridge; its final counts (tun backend).
    pub fn stop(self) -> Value {
        let child = self.process.stop();
        if self.backend == "tc" {
            let out = child.wait_with_output().expect("wait");
            assert!(
                out.status.success(),
                "atou netem bridge failed: {:?}",
                out.status
            );
            return Value::Null;
        }
        final_json(child, "atou netem bridge")
    }
}

pub fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// `ip ARGS`, which must succeed.
pub fn ip(args: &[&str]) {
    let st = Command::new("ip").args(args).status().expect("run ip");
    assert!(st.success(), "ip {args:?}");
}

/// Deletes these namespaces if they exist.
pub fn remove_netns(names: &[&str]) {
    for ns in names {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Two namespaces joined by a veth pair, removed when dropped.
pub struct VethPair {
    pub a: &'static str,
    pub b: &'static str,
}

impl VethPair {
    /// Hosts `a` (`{net}.1`, device `{dev}1`) and `b` (`{net}.2`,
    /// `{dev}2`).
    pub fn start(a: &'static str, b: &'static str, dev: &str, net: &str) -> VethPair {
        let (dev_a, dev_b) = (format!("{dev}1"), format!("{dev}2"));
        remove_netns(&[a, b]);
        let pair = VethPair { a, b };
        ip(&["netns", "add", a]);
        ip(&["netns", "add", b]);
        let peer = ["peer", "name", dev_b.as_str(), "netns", b];
        ip(&[
            &["-n", a, "link", "add", dev_a.as_str(), "type", "veth"][..],
            &peer,
        ]
        .concat());
        for (ns, dev, host) in [(a, dev_a.as_str(), 1), (b, dev_b.as_str(), 2)] {
            ip(&[
                "-n",
                ns,
                "addr",
                "add",
                &format!("{net}.{host}/24"),
                "dev",
                dev,
            ]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        pair
    }

    /// Gives the pair IPv6 addresses too: `{prefix}::1/64` on `{dev}1`
    /// in `a`, `{prefix}::2/64` on `{dev}2` in `b`, usable at once
    /// (`nodad`: no duplicate address detection to wait for).
    pub fn with_v6(self, dev: &str, prefix: &str) -> VethPair {
        for (ns, host) in [(self.a, 1), (self.b, 2)] {
            ip(&[
                "-n",
                ns,
                "-6",
                "addr",
                "add",
                &format!("{prefix}::{host}/64"),
                "dev",
                &format!("{dev}{host}"),
                "nodad",
            ]);
        }
        self
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        remove_netns(&[self.a, self.b]);
    }
}
