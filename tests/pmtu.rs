//! Path-MTU discovery (docs/transfer.md, "Datagram size") across a hop
//! that silently drops IP packets over 1,400 bytes, as VPNs, tunnels and
//! PPPoE links do: two network namespaces, an nftables rule at the
//! receiver. Needs root and nft; elsewhere it prints why it is skipped.

mod common;
mod netem_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::TestDir;
use netem_support::{ip, say, skip_bridge, u, Server, VethPair};
use serde_json::Value;

const SIZE: usize = 20_000_000;

/// `atou send --json` of `src` from host `ns` to `target`, killed after
/// two minutes (a datagram size the path drops stalls it); its report.
fn send(ns: &str, src: &std::path::Path, target: &str) -> Value {
    send_with(ns, src, target, None).0
}

/// [`send`], with the path cache in `cache` (`None`: `--no-path-cache`);
/// its report and what it said on stderr.
fn send_with(
    ns: &str,
    src: &std::path::Path,
    target: &str,
    cache: Option<&std::path::Path>,
) -> (Value, String) {
    let mut cmd = Command::new("timeout");
    cmd.args(["120", "ip", "netns", "exec", ns, common::ATOU])
        .env(
            "XDG_CACHE_HOME",
            concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-pmtu"),
        )
        .args(["send", "--json", "--no-auth"]);
    match cache {
        Some(dir) => cmd.env("XDG_CACHE_HOME", dir),
        None => cmd.args(["--quiet", "--no-path-cache"]),
    };
    let out = cmd
        .args([src.to_str().unwrap(), target])
        .output()
        .expect("run atou send");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "send failed: {stderr}");
    (
        serde_json::from_slice(&out.stdout).expect("a JSON report"),
        stderr,
    )
}

/// The send said once that it stepped down from 1,500 to 1,400.
fn said_once_it_stepped_down(said: &str) {
    assert_eq!(
        said.matches("the path stopped carrying 1500-byte datagrams; going on at 1400")
            .count(),
        1,
        "{said}"
    );
}

/// Each of `names` in `dest` holds `data`.
fn arrived_intact(dest: &std::path::Path, names: &[&str], data: &[u8]) {
    for f in names {
        assert!(
            std::fs::read(dest.join(f)).unwrap() == data,
            "{f} did not arrive intact"
        );
    }
}

/// The nft rule of the issue's black hole, at the receiver's input: IPv4
/// packets over 1,400 bytes dropped.
fn drop_over_1400(ns: &str) -> bool {
    drop_at_input(ns, "ip length gt 1400 drop")
}

/// The same hole for IPv6: `meta length` is the whole IP packet (the
/// 40-byte header in), where `ip6 length` would be the payload alone.
fn drop_v6_over_1400(ns: &str) -> bool {
    drop_at_input(ns, "meta nfproto ipv6 meta length gt 1400 drop")
}

/// `rule` in a chain at the input hook of host `ns`.
fn drop_at_input(ns: &str, rule: &str) -> bool {
    let nft = |rule: &str| {
        Command::new("ip")
            .args(["netns", "exec", ns, "nft"])
            .args(rule.split(' '))
            .status()
            .is_ok_and(|s| s.success())
    };
    nft("add table inet blackhole")
        && Command::new("ip")
            .args([
                "netns",
                "exec",
                ns,
                "nft",
                "add",
                "chain",
                "inet",
                "blackhole",
            ])
            .args(["in", "{ type filter hook input priority 0 ; }"])
            .status()
            .is_ok_and(|s| s.success())
        && nft(&format!("add rule inet blackhole in {rule}"))
}

/// A 20 MB send finds the veth's 1,500 bytes on a clean path; through a
/// hop that drops packets over 1,400 bytes it finds 1,400 and completes
/// intact (before the search it failed after 10 s, exit 30).
#[test]
fn a_send_through_a_1400_byte_black_hole_finds_the_size_and_completes() {
    let name = "a_send_through_a_1400_byte_black_hole_finds_the_size_and_completes";
    if skip_bridge(name) {
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        common::cannot_run(name, "nft (nftables) is not installed");
        return;
    }
    let hosts = VethPair::start("atou-pm-a", "atou-pm-b", "atou-pm", "10.79.0");
    // A veth hands UDP GSO batches across whole, and a rule on IP length
    // would see (and drop) the batch: one datagram per packet, as on a wire.
    ip(&[
        "-n",
        hosts.a,
        "link",
        "set",
        "atou-pm1",
        "gso_max_segs",
        "1",
    ]);
    let dir = TestDir::new(name);
    let dest = dir.dir("dest");
    let data = common::noise(SIZE, 37);
    for f in ["clean", "holed"] {
        std::fs::write(dir.path(f), &data).unwrap();
    }
    let _server = Server::start_with(
        Some(hosts.b),
        "10.79.0.2:7890",
        &["--dir", dest.to_str().unwrap(), "--no-auth"],
    );
    let clean = send(hosts.a, &dir.path("clean"), "10.79.0.2:7890");
    assert!(
        drop_over_1400(hosts.b),
        "nft could not add the black hole's rule"
    );
    let holed = send(hosts.a, &dir.path("holed"), "10.79.0.2:7890");
    let rate = |r: &Value| r["goodput_bps"].as_f64().unwrap_or(0.0) / 1e6;
    say(&format!(
        "{name}: clean {} ({}) {:.0} Mbit/s; black hole {} ({}) {:.0} Mbit/s",
        clean["path_mtu"]["path_mtu"],
        clean["path_mtu"]["from"],
        rate(&clean),
        holed["path_mtu"]["path_mtu"],
        holed["path_mtu"]["from"],
        rate(&holed),
    ));
    assert_eq!(clean["path_mtu"]["from"], "found", "{clean}");
    assert_eq!(u(&clean["path_mtu"]["path_mtu"]), 1500, "{clean}");
    assert_eq!(holed["path_mtu"]["from"], "found", "{holed}");
    assert_eq!(u(&holed["path_mtu"]["path_mtu"]), 1400, "{holed}");
    assert_eq!(u(&holed["path_mtu"]["datagram"]), 1372, "{holed}");
    arrived_intact(&dest, &["clean", "holed"], &data);
}

/// A black hole that opens after the size was learnt: the path cache
/// holds the clean path's 1,500, then a hop starts dropping packets over
/// 1,400 bytes. The send starts at the cached size, finds its full-size
/// datagrams lost while smaller probes pass, and goes on at 1,400 on a
/// new connection, the resume keeping what arrived; the cache learns
/// 1,400 (before: every data segment lost, the send failed after
/// `maxidle`, exit 30).
#[test]
fn a_black_hole_after_the_cached_size_steps_the_send_down_and_it_completes() {
    let name = "a_black_hole_after_the_cached_size_steps_the_send_down_and_it_completes";
    if skip_bridge(name) {
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        common::cannot_run(name, "nft (nftables) is not installed");
        return;
    }
    let hosts = VethPair::start("atou-ps-a", "atou-ps-b", "atou-ps", "10.79.1");
    ip(&[
        "-n",
        hosts.a,
        "link",
        "set",
        "atou-ps1",
        "gso_max_segs",
        "1",
    ]);
    let dir = TestDir::new(name);
    let dest = dir.dir("dest");
    let cache = dir.dir("cache");
    let data = common::noise(SIZE, 41);
    for f in ["before", "during", "after"] {
        std::fs::write(dir.path(f), &data).unwrap();
    }
    let _server = Server::start_with(
        Some(hosts.b),
        "10.79.1.2:7890",
        &["--dir", dest.to_str().unwrap(), "--no-auth"],
    );
    let target = "10.79.1.2:7890";
    let (before, _) = send_with(hosts.a, &dir.path("before"), target, Some(&cache));
    assert_eq!(before["path_mtu"]["from"], "found", "{before}");
    assert_eq!(u(&before["path_mtu"]["path_mtu"]), 1500, "{before}");
    assert!(
        drop_over_1400(hosts.b),
        "nft could not add the black hole's rule"
    );
    let (during, said) = send_with(hosts.a, &dir.path("during"), target, Some(&cache));
    say(&format!("{name}: {}; {said}", during["path_mtu"]));
    assert_eq!(during["path_mtu"]["from"], "stepped_down", "{during}");
    assert_eq!(u(&during["path_mtu"]["path_mtu"]), 1400, "{during}");
    assert_eq!(u(&during["path_mtu"]["datagram"]), 1372, "{during}");
    said_once_it_stepped_down(&said);
    let (after, _) = send_with(hosts.a, &dir.path("after"), target, Some(&cache));
    assert_eq!(after["path_mtu"]["from"], "cached", "{after}");
    assert_eq!(u(&after["path_mtu"]["path_mtu"]), 1400, "{after}");
    arrived_intact(&dest, &["before", "during", "after"], &data);
}

/// A black hole that opens while the data flows: the search finds the
/// clean path's 1,500, the send runs at it (capped by `--bwlimit` so that
/// it lasts some seconds), and once the progress shows bytes acknowledged
/// a hop starts dropping packets over 1,400 bytes. The send steps down to
/// 1,400, says so once, resumes keeping what arrived, and completes
/// intact; its progress goes on from the bytes already acknowledged,
/// never back (before: it restarted from 0, and the failed connection's
/// whole share was counted as done).
#[test]
fn a_black_hole_that_opens_mid_send_steps_it_down_and_it_completes() {
    let name = "a_black_hole_that_opens_mid_send_steps_it_down_and_it_completes";
    if skip_bridge(name) {
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        common::cannot_run(name, "nft (nftables) is not installed");
        return;
    }
    let hosts = VethPair::start("atou-pd-a", "atou-pd-b", "atou-pd", "10.79.2");
    ip(&[
        "-n",
        hosts.a,
        "link",
        "set",
        "atou-pd1",
        "gso_max_segs",
        "1",
    ]);
    let dir = TestDir::new(name);
    let dest = dir.dir("dest");
    let data = common::noise(SIZE, 43);
    std::fs::write(dir.path("f"), &data).unwrap();
    let _server = Server::start_with(
        Some(hosts.b),
        "10.79.2.2:7890",
        &["--dir", dest.to_str().unwrap(), "--no-auth"],
    );
    // 20 MB at 40 Mbit/s: some 4 s of data, the hole opening early in it.
    let mut sender = Command::new("timeout")
        .args(["120", "ip", "netns", "exec", hosts.a, common::ATOU])
        .env("XDG_CACHE_HOME", dir.dir("cache"))
        .args(["send", "--json", "--no-auth", "--bwlimit", "40mbit"])
        .args(["--progress", "json", "--progress-interval", "0.2"])
        .args([dir.path("f").to_str().unwrap(), "10.79.2.2:7890"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run atou send");
    let stderr = sender.stderr.take().expect("piped stderr");
    let said = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap_or_default());
    let mut lines = Vec::new();
    let mut holed_at = None;
    for line in BufReader::new(sender.stdout.take().expect("piped stdout")).lines() {
        let v: Value = serde_json::from_str(&line.expect("a line")).expect("JSON lines");
        if holed_at.is_none() && v["event"] == "interval" && u(&v["bytes"]) >= 2_000_000 {
            assert!(
                drop_over_1400(hosts.b),
                "nft could not add the black hole's rule"
            );
            holed_at = Some(u(&v["bytes"]));
        }
        lines.push(v);
    }
    let status = sender.wait().expect("wait for atou send");
    let said = said.join().expect("stderr reader");
    assert!(status.success(), "send failed ({status}): {said}");
    let holed_at = holed_at.expect("no progress line showed 2 MB acknowledged");
    let (report, progress) = lines.split_last().expect("a report");
    let end = progress.last().expect("an end line");
    say(&format!(
        "{name}: hole opened at {holed_at} bytes; {}; end {} of {}; {} bytes kept by the resume; {said}",
        report["path_mtu"],
        end["bytes"],
        end["total"],
        report["bytes_skipped"],
    ));
    assert!(holed_at < SIZE as u64, "the hole opened after the send");
    assert_eq!(report["path_mtu"]["from"], "stepped_down", "{report}");
    assert_eq!(u(&report["path_mtu"]["path_mtu"]), 1400, "{report}");
    assert_eq!(u(&report["path_mtu"]["datagram"]), 1372, "{report}");
    said_once_it_stepped_down(&said);
    // What arrived before the hole stayed: the resumed send skipped it.
    assert!(u(&report["bytes_skipped"]) >= holed_at, "{report}");
    // The progress never went back, and ended with every byte counted
    // once: what the first connections had acknowledged, then the rest.
    let bytes: Vec<u64> = progress.iter().map(|p| u(&p["bytes"])).collect();
    assert!(
        bytes.windows(2).all(|w| w[0] <= w[1]),
        "progress went back: {bytes:?}"
    );
    assert_eq!(end["event"], "end", "{end}");
    assert_eq!(u(&end["bytes"]), u(&end["total"]), "{end}");
    assert_eq!(u(&end["total"]), SIZE as u64, "{end}");
    assert!(
        std::fs::read(dest.join("f")).unwrap() == data,
        "the file did not arrive intact"
    );
}

/// The search and the black-hole watch over IPv6, whose base is 1,280
/// bytes (RFC 8200 §5) and whose headers take 48 bytes, not 28: a clean
/// send finds the veth's 1,500 and the path cache keeps it; then a hop
/// drops IPv6 packets over 1,400 bytes. A send from the cache steps down
/// to 1,400 (1,352 bytes of UDP payload) and completes; a send with no
/// cache finds 1,400 by its search.
#[test]
fn over_ipv6_the_search_and_the_black_hole_watch_find_1400_and_the_sends_complete() {
    let name = "over_ipv6_the_search_and_the_black_hole_watch_find_1400_and_the_sends_complete";
    if skip_bridge(name) {
        return;
    }
    if Command::new("nft").arg("--version").output().is_err() {
        common::cannot_run(name, "nft (nftables) is not installed");
        return;
    }
    let hosts = VethPair::start("atou-p6-a", "atou-p6-b", "atou-p6", "10.79.3")
        .with_v6("atou-p6", "fd00:79");
    ip(&[
        "-n",
        hosts.a,
        "link",
        "set",
        "atou-p61",
        "gso_max_segs",
        "1",
    ]);
    let dir = TestDir::new(name);
    let dest = dir.dir("dest");
    let cache = dir.dir("cache");
    let data = common::noise(SIZE, 47);
    for f in ["clean", "stepped", "searched"] {
        std::fs::write(dir.path(f), &data).unwrap();
    }
    let target = "[fd00:79::2]:7890";
    let _server = Server::start_with(
        Some(hosts.b),
        target,
        &["--dir", dest.to_str().unwrap(), "--no-auth"],
    );
    let (clean, _) = send_with(hosts.a, &dir.path("clean"), target, Some(&cache));
    assert_eq!(clean["path_mtu"]["from"], "found", "{clean}");
    assert_eq!(u(&clean["path_mtu"]["path_mtu"]), 1500, "{clean}");
    assert_eq!(u(&clean["path_mtu"]["datagram"]), 1452, "{clean}");
    assert!(
        drop_v6_over_1400(hosts.b),
        "nft could not add the black hole's rule"
    );
    let (stepped, said) = send_with(hosts.a, &dir.path("stepped"), target, Some(&cache));
    let searched = send(hosts.a, &dir.path("searched"), target);
    say(&format!(
        "{name}: clean {}; stepped {}; searched {}; {said}",
        clean["path_mtu"], stepped["path_mtu"], searched["path_mtu"]
    ));
    assert_eq!(stepped["path_mtu"]["from"], "stepped_down", "{stepped}");
    assert_eq!(u(&stepped["path_mtu"]["path_mtu"]), 1400, "{stepped}");
    assert_eq!(u(&stepped["path_mtu"]["datagram"]), 1352, "{stepped}");
    said_once_it_stepped_down(&said);
    assert_eq!(searched["path_mtu"]["from"], "found", "{searched}");
    assert_eq!(u(&searched["path_mtu"]["path_mtu"]), 1400, "{searched}");
    assert_eq!(u(&searched["path_mtu"]["datagram"]), 1352, "{searched}");
    arrived_intact(&dest, &["clean", "stepped", "searched"], &data);
}

/// Hosts `a` and `b` on two links joined by router `r`, which forwards
/// between them and answers a packet too big for its next hop with ICMP
/// "fragmentation needed" (ICMPv6 "packet too big"), as a router on a
/// real path does: a on `{net}.4.1/24` and `fd00:{v6}:4::1/64`, r on
/// `.4.2`, `::2` and `{net}.5.1`, `fd00:{v6}:5::1`, b on `{net}.5.2/24`
/// and `fd00:{v6}:5::2/64`.
struct Routed {
    a: &'static str,
    r: &'static str,
    b: &'static str,
}

impl Routed {
    fn start(ns: [&'static str; 3], net: &str, v6: &str) -> Routed {
        let [a, r, b] = ns;
        netem_support::remove_netns(&ns);
        let routed = Routed { a, r, b };
        for ns in ns {
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        ip(&[
            "-n", a, "link", "add", "rt-a", "type", "veth", "peer", "name", "rt-ra", "netns", r,
        ]);
        ip(&[
            "-n", r, "link", "add", "rt-rb", "type", "veth", "peer", "name", "rt-b", "netns", b,
        ]);
        for (ns, dev, v4, v6) in [
            (
                a,
                "rt-a",
                format!("{net}.4.1/24"),
                format!("fd00:{v6}:4::1/64"),
            ),
            (
                r,
                "rt-ra",
                format!("{net}.4.2/24"),
                format!("fd00:{v6}:4::2/64"),
            ),
            (
                r,
                "rt-rb",
                format!("{net}.5.1/24"),
                format!("fd00:{v6}:5::1/64"),
            ),
            (
                b,
                "rt-b",
                format!("{net}.5.2/24"),
                format!("fd00:{v6}:5::2/64"),
            ),
        ] {
            ip(&["-n", ns, "addr", "add", &v4, "dev", dev]);
            ip(&["-n", ns, "-6", "addr", "add", &v6, "dev", dev, "nodad"]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        for (ns, v4, v6) in [
            (a, format!("{net}.4.2"), format!("fd00:{v6}:4::2")),
            (b, format!("{net}.5.1"), format!("fd00:{v6}:5::1")),
        ] {
            ip(&["-n", ns, "route", "add", "default", "via", &v4]);
            ip(&["-n", ns, "-6", "route", "add", "default", "via", &v6]);
        }
        for knob in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
            let set = Command::new("ip")
                .args(["netns", "exec", r, "sysctl", "-qw", knob])
                .status()
                .expect("run sysctl");
            assert!(set.success(), "the router would not forward: {knob}");
        }
        // Until b answers through r: IPv6's neighbour discovery (and the
        // link-local addresses it waits for) can hold the first packets,
        // the search's probes among them, for a second or more.
        for to in [format!("{net}.5.2"), format!("fd00:{v6}:5::2")] {
            let answered = (0..20).any(|_| {
                Command::new("ip")
                    .args(["netns", "exec", a, "ping", "-c1", "-W1", &to])
                    .stdout(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            });
            assert!(answered, "{to} does not answer through the router");
        }
        routed
    }

    /// The MTU of the router's link to b, at both its ends.
    fn next_hop_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        ip(&["-n", self.r, "link", "set", "rt-rb", "mtu", &mtu]);
        ip(&["-n", self.b, "link", "set", "rt-b", "mtu", &mtu]);
    }

    /// The router's count of `counter` in `/proc/net/{table}`: `snmp6`
    /// has a name and a value per line, `snmp` a line of "Icmp:" names
    /// and one of their values.
    fn router_count(&self, table: &str, counter: &str) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", self.r, "cat"])
            .arg(format!("/proc/net/{table}"))
            .output()
            .expect("read the router's counters");
        let text = String::from_utf8_lossy(&out.stdout);
        let value = if table == "snmp6" {
            text.lines()
                .filter_map(|l| l.split_once(char::is_whitespace))
                .find(|(name, _)| *name == counter)
                .map(|(_, v)| v.trim().to_owned())
        } else {
            let mut icmp = text.lines().filter(|l| l.starts_with("Icmp:"));
            let (names, values) = (icmp.next().unwrap_or(""), icmp.next().unwrap_or(""));
            names
                .split_whitespace()
                .zip(values.split_whitespace())
                .find(|(name, _)| *name == counter)
                .map(|(_, v)| v.to_owned())
        };
        value
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {counter} in /proc/net/{table}"))
    }

    /// The "too big" messages the router has sent for `v6` or IPv4.
    fn too_bigs_sent(&self, v6: bool) -> u64 {
        if v6 {
            self.router_count("snmp6", "Icmp6OutPktTooBigs")
        } else {
            // Fragmentation needed is a destination unreachable.
            self.router_count("snmp", "OutDestUnreachs")
        }
    }
}

impl Drop for Routed {
    fn drop(&mut self) {
        netem_support::remove_netns(&[self.a, self.r, self.b]);
    }
}

/// A router whose next hop takes 1,400-byte packets answers each larger
/// one with "too big" (no nft: the kernel's own forwarding), and the
/// sender's GSO runs reach it unsegmented, as a VM's or a container's
/// do. A send from the path cache's 1,500 steps down to 1,400 and
/// completes intact; a search without the cache finds 1,400. Before:
/// each "too big" left an error pending on the connected socket that
/// failed the next send, which was always the size probes', and the send
/// failed after `maxidle` (exit 30, no byte delivered); and a probe sent
/// in the GSO run of a larger one was dropped with it (1,280 found).
fn behind_a_router(name: &str, ns: [&'static str; 3], net: &str, v6: bool) {
    if skip_bridge(name) {
        return;
    }
    let routed = Routed::start(ns, net, &net.replace('.', ""));
    let dir = TestDir::new(name);
    let dest = dir.dir("dest");
    let cache = dir.dir("cache");
    let data = common::noise(SIZE, 53);
    for f in ["clean", "stepped", "searched"] {
        std::fs::write(dir.path(f), &data).unwrap();
    }
    let target = if v6 {
        format!("[fd00:{}:5::2]:7890", net.replace('.', ""))
    } else {
        format!("{net}.5.2:7890")
    };
    let (header, base) = if v6 { (48, 1232) } else { (28, 1200) };
    let _server = Server::start_with(
        Some(routed.b),
        &target,
        &["--dir", dest.to_str().unwrap(), "--no-auth"],
    );
    let (clean, _) = send_with(routed.a, &dir.path("clean"), &target, Some(&cache));
    assert_eq!(clean["path_mtu"]["from"], "found", "{clean}");
    assert_eq!(u(&clean["path_mtu"]["path_mtu"]), 1500, "{clean}");
    routed.next_hop_mtu(1400);
    let before = routed.too_bigs_sent(v6);
    let (stepped, said) = send_with(routed.a, &dir.path("stepped"), &target, Some(&cache));
    let searched = send(routed.a, &dir.path("searched"), &target);
    let answered = routed.too_bigs_sent(v6) - before;
    say(&format!(
        "{name}: clean {}; stepped {} ({} s); searched {}; the router said \"too big\" {answered} times; {said}",
        clean["path_mtu"], stepped["path_mtu"], stepped["secs"], searched["path_mtu"]
    ));
    assert!(
        answered > 0,
        "the router sent no ICMP: the test proves nothing"
    );
    assert_eq!(stepped["path_mtu"]["from"], "stepped_down", "{stepped}");
    assert_eq!(u(&stepped["path_mtu"]["path_mtu"]), 1400, "{stepped}");
    assert_eq!(
        u(&stepped["path_mtu"]["datagram"]),
        1400 - header,
        "{stepped}"
    );
    assert!(1400 - header > base);
    said_once_it_stepped_down(&said);
    assert_eq!(searched["path_mtu"]["from"], "found", "{searched}");
    assert_eq!(u(&searched["path_mtu"]["path_mtu"]), 1400, "{searched}");
    arrived_intact(&dest, &["clean", "stepped", "searched"], &data);
}

#[test]
fn behind_a_router_that_answers_too_big_a_send_steps_down_and_completes() {
    behind_a_router(
        "behind_a_router_that_answers_too_big_a_send_steps_down_and_completes",
        ["atou-pr-a", "atou-pr-r", "atou-pr-b"],
        "10.80",
        false,
    );
}

/// The same over IPv6: the router's ICMPv6 "packet too big".
#[test]
fn behind_an_ipv6_router_that_answers_too_big_a_send_steps_down_and_completes() {
    behind_a_router(
        "behind_an_ipv6_router_that_answers_too_big_a_send_steps_down_and_completes",
        ["atou-p6r-a", "atou-p6r-r", "atou-p6r-b"],
        "10.81",
        true,
    );
}
