//! What an address that has not proved it receives can make a server
//! send or hold, in every mode: plain (`--no-auth`) sessions and the
//! key-less probe server included. Sans-IO: a server in virtual time and
//! hostile datagrams built with the crate's own encoders, from spoofed
//! sources that never see an answer.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use atou::internals::server::SessionEvent;
use atou::internals::sim::pair::Pair;
use atou::internals::wire::{Close, DataFlags, DataHeader, Fetch, DATA_HEADER_LEN};
use atou::netem::NetemSpec;
use atou::{Client, Server, ServerLimits, Time, Tuning};
use common::plain_hello;

/// A plain server that lets `unvalidated` connections open without an
/// address token ([`ServerLimits::unvalidated_plain`]).
fn plain_server(unvalidated: usize) -> Server {
    let limits = ServerLimits::default().unvalidated_plain(unvalidated);
    Server::new(limits, 1 << 20, 2 << 20)
}

/// The default, 0 (a plain hello needs an address token: nothing is kept
/// for one without), and a server that lets 16 connections open without
/// one, each held to 3× what its address sent.
fn both_ways() -> [usize; 2] {
    [0, 16]
}

fn spoofed(i: u32) -> SocketAddr {
    SocketAddr::from(([198, 18, (i >> 8) as u8, i as u8], 40_000))
}

fn segment(conn_id: u64, seg: u64, payload: &[u8], fin: bool) -> Vec<u8> {
    let mut d = vec![0u8; DATA_HEADER_LEN + payload.len()];
    DataHeader {
        conn_id,
        seg,
        timestamp: 0,
        flags: DataFlags {
            fin,
            ..DataFlags::default()
        },
    }
    .emit(&mut d)
    .unwrap();
    d[DATA_HEADER_LEN..].copy_from_slice(payload);
    d
}

fn fetch(conn_id: u64, offset: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let n = Fetch { conn_id, offset }.emit(&mut b).unwrap();
    b.truncate(n);
    b
}

fn close(conn_id: u64) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    let n = Close {
        conn_id,
        segments: 1,
        bytes: 1,
    }
    .emit(&mut b)
    .unwrap();
    b.truncate(n);
    b
}

/// Bytes each way between the server and each address; the
/// application answers every complete stream with `reply`.
struct Ledger {
    to_server: HashMap<SocketAddr, usize>,
    from_server: HashMap<SocketAddr, usize>,
    reply: Vec<u8>,
}

impl Ledger {
    fn new(reply: Vec<u8>) -> Ledger {
        Ledger {
            to_server: HashMap::new(),
            from_server: HashMap::new(),
            reply,
        }
    }

    /// Delivers `d` from `from`, answers any session as the application
    /// would, and counts what the server sends back.
    fn deliver(&mut self, server: &mut Server, now: Time, from: SocketAddr, mut d: Vec<u8>) {
        *self.to_server.entry(from).or_default() += d.len();
        server.handle_datagram(now, from, &mut d);
        self.drain(server, now);
    }

    fn drain(&mut self, server: &mut Server, now: Time) {
        while let Some(e) = server.poll_session_event() {
            if let SessionEvent::Complete { conn_id } = e {
                server.respond(conn_id, self.reply.clone());
            }
        }
        let mut buf = vec![0u8; 65536];
        while let Some((to, n)) = server.poll_transmit(now, &mut buf) {
            *self.from_server.entry(to).or_default() += n;
        }
    }

    fn ratio(&self, a: SocketAddr) -> f64 {
        self.from_server.get(&a).copied().unwrap_or(0) as f64
            / self.to_server.get(&a).copied().unwrap_or(1) as f64
    }
}

/// 1,024 spoofed plain hellos (44 KB) used to hold every connection slot
/// for the hello idle time (10 s): every real client was "busy". Now an
/// unvalidated address holds nothing, and a real client from another
/// address gets in at once.
#[test]
fn spoofed_plain_hellos_from_1024_addresses_do_not_lock_out_a_client() {
    for unvalidated in both_ways() {
        lockout(unvalidated);
    }
}

fn lockout(unvalidated: usize) {
    let mut server = plain_server(unvalidated);
    let mut ledger = Ledger::new(vec![0x5a; 64 << 10]);
    for i in 0..1024u32 {
        let h = plain_hello(1 + u64::from(i), 0, 1472, 1 << 10);
        ledger.deliver(&mut server, Time::ZERO, spoofed(i), h);
    }
    let client_addr = SocketAddr::from(([10, 0, 0, 1], 5000));
    let client = Client::new(&Tuning::default(), 99_999, Some(10_000), Time::ZERO).unwrap();
    // What the server sends the spoofed addresses is dropped (counted as
    // misaddressed), as no one there answers.
    let mut pair = Pair::between(client, client_addr, server, direct(), direct(), 1);
    pair.set_time_limit(Duration::from_secs(2));
    pair.run(&mut ());
    let (client, server, now) = (&pair.client, &pair.server, pair.now());
    // No slot held past the budget for connections without a token.
    assert!(server.open_connections() <= unvalidated + 1);
    let outcome = client.outcome().cloned();
    assert!(
        matches!(outcome, Some(Ok(_))),
        "{outcome:?} {:?}",
        server.stats()
    );
    assert!(now < Time::ZERO + Duration::from_millis(100), "{now:?}");
}

/// A `--no-auth` session driven blind from a spoofed address: a hello,
/// a stream whose reply is 64 KiB, then a flood of fetches, each 16 bytes
/// asking for a 1,200-byte fragment (the review measured ×76). What goes
/// to the spoofed address is at most 3× what came from it.
#[test]
fn a_spoofed_fetch_flood_gets_at_most_three_times_its_bytes_back() {
    for unvalidated in both_ways() {
        fetch_flood(unvalidated);
    }
}

fn fetch_flood(unvalidated: usize) {
    let mut server = plain_server(unvalidated);
    let mut ledger = Ledger::new(vec![0x5a; 64 << 10]);
    let victim = spoofed(1);
    let conn = 0xfe7c;
    let mss = 1472;
    let payload = (mss as usize) - DATA_HEADER_LEN;
    let now = Time::ZERO;
    ledger.deliver(&mut server, now, victim, plain_hello(conn, 5, mss, 64));
    ledger.deliver(
        &mut server,
        now,
        victim,
        segment(conn, 0, &vec![1; payload], false),
    );
    ledger.deliver(&mut server, now, victim, segment(conn, 1, &[2; 10], true));
    for round in 0..100u32 {
        for k in 0..55u32 {
            let now = now + Duration::from_millis(u64::from(round));
            ledger.deliver(&mut server, now, victim, fetch(conn, k * 1200));
        }
    }
    let r = ledger.ratio(victim);
    assert!(
        r <= 3.0,
        "×{r:.1} to the spoofed address {:?}",
        server.stats()
    );
}

/// The key-less probe server (`atou serve` without `--dir`): it refuses
/// every session with a short text (`NoFiles`), which a spoofed session
/// then fetches again and again (the review measured ×7.5); and a probe
/// of tiny segments, out of order and repeated so that each ACK carries
/// SACK and D-SACK blocks, then repeated closes. What goes back to the
/// spoofed address is at most 3× what came from it.
#[test]
fn a_spoofed_probe_gets_at_most_three_times_its_bytes_back() {
    for unvalidated in both_ways() {
        probe_floods(unvalidated);
    }
}

fn probe_floods(unvalidated: usize) {
    let refusal = b"\x01this server receives no files: start it with `atou serve --dir DEST`";
    let mut server = plain_server(unvalidated);
    let mut ledger = Ledger::new(refusal.to_vec());
    let victim = spoofed(2);
    let now = Time::ZERO;
    let session_conn = 0x5e55;
    ledger.deliver(
        &mut server,
        now,
        victim,
        plain_hello(session_conn, 9, 1472, 64),
    );
    ledger.deliver(
        &mut server,
        now,
        victim,
        segment(session_conn, 0, &[], true),
    );
    for _ in 0..2000 {
        ledger.deliver(&mut server, now, victim, fetch(session_conn, 0));
    }
    let r = ledger.ratio(victim);
    assert!(
        r <= 3.0,
        "×{r:.2} to the spoofed address {:?}",
        server.stats()
    );
    let victim = spoofed(3);
    let conn = 0x9b0e;
    ledger.deliver(
        &mut server,
        now,
        victim,
        plain_hello(conn, 0, DATA_HEADER_LEN as u32 + 1, 1 << 16),
    );
    for seg in (1..2000u64).step_by(2) {
        ledger.deliver(&mut server, now, victim, segment(conn, seg, &[0], false));
        ledger.deliver(&mut server, now, victim, segment(conn, seg, &[0], false));
    }
    for _ in 0..100 {
        ledger.deliver(&mut server, now, victim, close(conn));
    }
    let r = ledger.ratio(victim);
    assert!(
        r <= 3.0,
        "×{r:.2} to the spoofed address {:?}",
        server.stats()
    );
}

/// The price for a real plain client: one round trip more, for the
/// retry (none once it has a token, which it may reuse from any port);
/// on a 100 ms path its hello is answered at 200 ms, then at 100 ms.
#[test]
fn a_plain_client_pays_one_round_trip_for_its_token_and_reuses_it() {
    let mut server = plain_server(0);
    let one_way = || "delay 50ms".parse::<NetemSpec>().unwrap();
    let mut token = None;
    for (port, want) in [(5000, 200), (5001, 100)] {
        let from = SocketAddr::from(([10, 0, 0, 1], port));
        let start = Time::ZERO + Duration::from_secs(u64::from(port - 4999));
        let client = Client::new(&Tuning::default(), u64::from(port), Some(1000), start)
            .unwrap()
            .with_address_token(token);
        let mut pair =
            Pair::between(client, from, server, one_way(), one_way(), 1).starting_at(start);
        pair.set_time_limit((start + Duration::from_secs(1)).saturating_since(Time::ZERO));
        pair.run_until(&mut (), &mut |_, _, d| vec![(from, d)], |p| {
            p.client.granted().is_some()
        });
        let now = pair.now();
        let client = pair.client;
        server = pair.server;
        assert!(client.granted().is_some(), "not granted by {now:?}");
        let took = now.saturating_since(start);
        let want = Duration::from_millis(want);
        assert!(
            took >= want && took <= want + Duration::from_millis(2),
            "{took:?} from port {port}"
        );
        token = client.address_token();
        assert!(token.is_some());
    }
    assert_eq!(server.stats().retries_sent, 1);
}

/// A path that delivers every datagram at once.
fn direct() -> NetemSpec {
    NetemSpec::default()
}
