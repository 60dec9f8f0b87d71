//! Authenticated, encrypted connections (Noise IK, AEAD), sans I/O: a client
//! and a server wired back to back in virtual time, and hostile peers
//! built from the crate's own encoders in between.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use atou::internals::crypto::frame::{self, PROTECTED};
use atou::internals::crypto::{
    format_public_key, AuthorizedKeys, Cipher, ClientAuth, ServerAuth, StaticKeypair,
};
use atou::internals::sim::pair::{Dir, Pair};
use atou::internals::wire::{Close, DataFlags, DataHeader, Hello, ReceiverParams};
use atou::netem::NetemSpec;
use atou::{Client, ConnError, PatternSource, Server, ServerLimits, Time, Tuning};
use common::{garbage_hello, plain_hello};

const BYTES: u64 = 300_000;

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], port))
}

fn tuning() -> Tuning {
    Tuning {
        maxidle: Duration::from_secs(20),
        ..Tuning::default()
    }
}

fn authorized(keys: &[&StaticKeypair]) -> Arc<AuthorizedKeys> {
    let text: String = keys
        .iter()
        .map(|k| format_public_key(&k.public(), "test") + "\n")
        .collect();
    Arc::new(AuthorizedKeys::parse(text.as_bytes()).unwrap())
}

fn server_with(auth: ServerAuth) -> Server {
    Server::new(ServerLimits::default(), 1 << 20, 2 << 20)
        .with_auth(auth)
        .unwrap()
}

/// A server with a key that accepts one client key: the server, its key,
/// and the client's.
fn keyed_server() -> (Server, StaticKeypair, StaticKeypair) {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let server = server_with(ServerAuth {
        identity: Some(server_key.clone()),
        authorized: Some(authorized(&[&client_key])),
        allow_plain: false,
    });
    (server, server_key, client_key)
}

fn secure_client(id: u64, identity: &StaticKeypair, server: &StaticKeypair) -> Client {
    secure_client_at(id, 1_000_000_000, identity, server)
}

/// A client whose wall clock reads `wall_ns` (its hello's timestamp).
fn secure_client_at(
    id: u64,
    wall_ns: u64,
    identity: &StaticKeypair,
    server: &StaticKeypair,
) -> Client {
    Client::new(&tuning(), id, Some(BYTES), Time::ZERO)
        .unwrap()
        .with_auth(
            ClientAuth {
                identity: identity.clone(),
                server_key: server.public(),
                cipher: Cipher::Aes256Gcm,
            },
            wall_ns,
        )
        .unwrap()
}

/// Runs the pair ([`Pair`]) until the client is done or `limit` passes;
/// every datagram goes through `path`, which returns what arrives (none,
/// one, several; the source address of a datagram to the server may
/// change). Gives the two endpoints back for the test to look at.
fn run(
    client: Client,
    server: Server,
    limit: Duration,
    mut path: impl FnMut(Time, Dir, Vec<u8>) -> Vec<(SocketAddr, Vec<u8>)>,
) -> (Client, Server) {
    let (fwd, rev) = (NetemSpec::default(), NetemSpec::default());
    let mut pair = Pair::between(client, addr(1), server, fwd, rev, 1);
    pair.set_time_limit(limit);
    pair.run_tapped(&mut (), &mut path);
    (pair.client, pair.server)
}

fn straight(from: SocketAddr) -> impl FnMut(Time, Dir, Vec<u8>) -> Vec<(SocketAddr, Vec<u8>)> {
    move |_, _, d| vec![(from, d)]
}

#[test]
fn an_authenticated_transfer_completes_and_nothing_after_the_hello_is_in_clear() {
    let (server, server_key, client_key) = keyed_server();
    let client = secure_client(11, &client_key, &server_key);
    // The pattern atou sends is recognisable: 64 bytes of it must never
    // be seen on the wire.
    let mut pattern = vec![0u8; 4096];
    atou::internals::payload::fill_pattern(0, &mut pattern);
    let needle = &pattern[1000..1064];
    let mut datagrams = 0;
    let mut clear = 0;
    let (client, server) = run(client, server, Duration::from_secs(30), |_, dir, d| {
        datagrams += 1;
        let handshake = d[3] == 0x20 || d[3] == 0x21;
        if !handshake && d[3] & PROTECTED == 0 {
            clear += 1;
        }
        assert!(
            !d.windows(needle.len()).any(|w| w == needle),
            "{dir:?}: the data is in clear"
        );
        vec![(addr(1), d)]
    });
    let outcome = client.outcome().expect("finished").clone();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(clear, 0, "of {datagrams} datagrams");
    assert_eq!(client.sender().unwrap().good_bytes(), BYTES);
    let stats = *server.stats();
    assert_eq!((stats.handshakes, stats.crypto_dropped), (1, 0));
}

/// A key the server does not know is not answered (a refusal would cost
/// three X25519 operations more for anyone replaying a captured hello,
/// and tell a prober the key is unknown): its client times out, and its
/// error says what to check.
#[test]
fn an_unknown_key_is_not_answered_and_its_client_says_what_to_check() {
    let (server_key, known, stranger) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let server = server_with(ServerAuth {
        identity: Some(server_key.clone()),
        authorized: Some(authorized(&[&known])),
        allow_plain: false,
    });
    let client = secure_client(12, &stranger, &server_key);
    let mut answers = 0;
    let (client, server) = run(client, server, Duration::from_secs(30), |_, dir, d| {
        answers += usize::from(dir == Dir::ToClient);
        vec![(addr(1), d)]
    });
    assert_eq!(answers, 0);
    let Some(Err(e @ ConnError::Idle { .. })) = client.outcome() else {
        panic!("{:?}", client.outcome());
    };
    let msg = e.to_string();
    assert!(msg.contains("authorized keys"), "{msg}");
    assert_eq!(server.open_connections(), 0);
    // Each hello of the client (a new one each time) was read once.
    let s = *server.stats();
    assert!(
        s.auth_refused >= 1 && s.auth_refused == s.hellos_worked,
        "{s:?}"
    );
    assert_eq!(s.handshakes, 0);
}

#[test]
fn a_client_pinning_the_wrong_server_key_gets_no_session() {
    let (server_key, impostor, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let server = server_with(ServerAuth {
        identity: Some(server_key),
        authorized: None,
        allow_plain: false,
    });
    // The client believes the server's key is `impostor`'s.
    let client = secure_client(13, &client_key, &impostor);
    let (client, server) = run(client, server, Duration::from_secs(3), straight(addr(1)));
    assert!(matches!(
        client.outcome(),
        None | Some(Err(ConnError::Idle { .. }))
    ));
    assert_eq!(server.open_connections(), 0);
    assert!(server.stats().bad_handshakes > 0);
}

/// Issue 29: what comes from the server's address but does not open
/// under the pinned key is not an answer (a copy over ssh would stay off
/// its tunnel for a forged datagram); the server's authenticated answer,
/// or its refusal, is.
#[test]
fn only_the_servers_own_words_count_as_its_answer() {
    let (server_key, impostor, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let keyed = || {
        server_with(ServerAuth {
            identity: Some(server_key.clone()),
            authorized: None,
            allow_plain: false,
        })
    };
    let mut first_answer = Vec::new();
    let client = secure_client(14, &client_key, &server_key);
    let (client, _) = run(client, keyed(), Duration::from_secs(30), |_, dir, d| {
        if dir == Dir::ToClient && first_answer.is_empty() {
            first_answer = d.clone();
        }
        vec![(addr(1), d)]
    });
    assert!(client.answered());
    // The same answer, as from the server's address, to another client
    // of the same id and keys (its own ephemeral key): it does not open,
    // and is no answer. Any datagram from the address counted before.
    let mut other = secure_client(14, &client_key, &server_key);
    let _ = other.handle_datagram(Time::ZERO, &first_answer);
    assert!(!other.answered());
    // Nor is a server that cannot read the hello, pinned under another
    // key: it says nothing.
    let client = secure_client(13, &client_key, &impostor);
    let (client, _) = run(client, keyed(), Duration::from_secs(3), straight(addr(1)));
    assert!(!client.answered());

    // A refusal is the server's answer too: it has no key.
    let client = secure_client(15, &client_key, &server_key);
    let plain_only = server_with(ServerAuth::plain());
    let (client, _) = run(
        client,
        plain_only,
        Duration::from_secs(3),
        straight(addr(1)),
    );
    assert!(
        matches!(client.outcome(), Some(Err(ConnError::NoIdentity))),
        "{:?}",
        client.outcome()
    );
    assert!(client.answered());
}

#[test]
fn a_plain_hello_to_a_server_that_requires_keys_is_told_so() {
    let server_key = StaticKeypair::generate().unwrap();
    let server = server_with(ServerAuth {
        identity: Some(server_key),
        authorized: Some(authorized(&[])),
        allow_plain: false,
    });
    let client = Client::new(&tuning(), 14, Some(BYTES), Time::ZERO).unwrap();
    let (client, server) = run(client, server, Duration::from_secs(3), straight(addr(1)));
    assert_eq!(client.outcome(), Some(&Err(ConnError::AuthRequired)));
    assert_eq!(server.open_connections(), 0);
    assert_eq!(server.stats().plain_refused, 1);
}

#[test]
fn an_authenticating_client_is_told_when_the_server_has_no_key() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let server = server_with(ServerAuth::plain());
    let client = secure_client(15, &client_key, &server_key);
    let (client, _server) = run(client, server, Duration::from_secs(3), straight(addr(1)));
    assert_eq!(client.outcome(), Some(&Err(ConnError::NoIdentity)));
}

/// netem's `corrupt`: a bit flipped in one datagram in 20, both ways.
#[test]
fn flipped_bits_are_dropped_and_counted_and_the_transfer_still_completes() {
    let (server, server_key, client_key) = keyed_server();
    let client = secure_client(16, &client_key, &server_key);
    let mut k = [0u64; 2];
    let mut flipped = [0u64; 2];
    let (client, server) = run(client, server, Duration::from_secs(60), |_, dir, mut d| {
        let way = usize::from(dir == Dir::ToClient);
        let established = d[3] & PROTECTED != 0;
        k[way] += u64::from(established);
        let k = k[way];
        if established && k % 20 == 0 {
            let bit = (k * 7919) as usize % (d.len() * 8);
            // Not the magic or the kind: those only make it not atou's.
            let bit = bit.max(32);
            d[bit / 8] ^= 1 << (bit % 8);
            flipped[way] += 1;
        }
        vec![(addr(1), d)]
    });
    let outcome = client.outcome().expect("finished").clone();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(client.sender().unwrap().good_bytes(), BYTES);
    assert!(flipped[0] > 0 && flipped[1] > 0, "{flipped:?}");
    // Every flipped datagram to the server was dropped before the
    // transport saw it (a flip in the recipient id makes it unknown).
    let s = *server.stats();
    assert_eq!(s.crypto_dropped + s.unknown_connection, flipped[0], "{s:?}");
    let c = client.crypto_drops();
    assert!(
        c.bad_tag > 0 && c.bad_tag <= flipped[1],
        "{c:?} of {}",
        flipped[1]
    );
}

#[test]
fn replayed_datagrams_are_dropped_and_counted() {
    let (server, server_key, client_key) = keyed_server();
    let client = secure_client(17, &client_key, &server_key);
    let mut replayed = 0;
    let (client, mut server) = run(client, server, Duration::from_secs(30), |_, dir, d| {
        if dir == Dir::ToServer && d[3] & PROTECTED != 0 {
            replayed += 1;
            return vec![(addr(1), d.clone()), (addr(1), d)];
        }
        vec![(addr(1), d)]
    });
    assert!(client.outcome().unwrap().is_ok());
    assert!(replayed > 100);
    assert_eq!(server.stats().crypto_dropped, replayed);
    // The transport never saw a copy: nothing arrived twice.
    let reports: Vec<_> = std::iter::from_fn(|| server.poll_report()).collect();
    assert_eq!(reports[0].stats.duplicates, 0, "{:?}", reports[0].stats);
}

/// Someone who sees every datagram of a session (but has no key) tries to
/// inject: altered copies, plain packets under either connection id, a
/// plain close. Nothing of it reaches the transport.
#[test]
fn a_captured_session_cannot_be_injected_into() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let server = server_with(ServerAuth {
        identity: Some(server_key.clone()),
        authorized: Some(authorized(&[&client_key])),
        allow_plain: true,
    });
    let client = secure_client(18, &client_key, &server_key);
    let mut injected = 0u64;
    let (client, mut server) = run(client, server, Duration::from_secs(30), |_, dir, d| {
        let mut out = vec![(addr(1), d.clone())];
        if dir == Dir::ToServer && d[3] & PROTECTED != 0 {
            let server_id = frame::recipient_id(&d);
            // An altered copy with a fresh packet number.
            let mut altered = d.clone();
            altered[12..20].copy_from_slice(&(1u64 << 40).to_be_bytes());
            let last = altered.len() - 1;
            altered[last] ^= 1;
            // A plain data segment and a plain close under the server's
            // id and under the client's.
            let mut seg = vec![0u8; 64];
            let header = DataHeader {
                conn_id: server_id,
                seg: 0,
                timestamp: 0,
                flags: DataFlags::default(),
            };
            let n = header.emit(&mut seg).unwrap();
            seg.truncate(n + 8);
            let mut close = vec![0u8; 64];
            let n = Close {
                conn_id: 18,
                segments: 1,
                bytes: 1,
            }
            .emit(&mut close)
            .unwrap();
            close.truncate(n);
            out.push((addr(1), altered));
            out.push((addr(1), seg));
            out.push((addr(1), close));
            injected += 3;
        }
        out
    });
    assert!(client.outcome().unwrap().is_ok());
    assert_eq!(client.sender().unwrap().good_bytes(), BYTES);
    let s = *server.stats();
    assert!(injected > 0);
    assert_eq!(s.crypto_dropped + s.unknown_connection, injected, "{s:?}");
    let reports: Vec<_> = std::iter::from_fn(|| server.poll_report()).collect();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].stats.bytes, BYTES);
}

/// A NAT rebinding halfway: the client's packets start coming from
/// another port. The connection follows them.
#[test]
fn a_connection_follows_its_client_to_a_new_address() {
    let (server, server_key, client_key) = keyed_server();
    let client = secure_client(19, &client_key, &server_key);
    // 300 kB is about 210 datagrams: the 100th and later come from port 7.
    let mut sent = 0;
    let (client, mut server) = run(client, server, Duration::from_secs(30), |_, dir, d| {
        sent += usize::from(dir == Dir::ToServer);
        let from = if sent > 100 { addr(7) } else { addr(1) };
        vec![(from, d)]
    });
    let outcome = client.outcome().expect("finished").clone();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(server.stats().migrations, 1);
    // The new address answered its challenge (RFC 9000 §8.2).
    assert_eq!(server.stats().paths_validated, 1);
    assert_eq!(server.stats().paths_abandoned, 0);
    let notices: Vec<_> = std::iter::from_fn(|| server.poll_notice()).collect();
    assert!(
        notices.iter().any(|n| n.to_string().contains("moved")),
        "{notices:?}"
    );
}

/// A flood of hellos from spoofed addresses (each a different one, and
/// each a genuine Noise hello from a key the server does not know): the
/// server answers each address with at most 3× what it sent, and turns
/// to cookies; a legitimate client still gets in within a second.
#[test]
fn a_spoofed_hello_flood_gets_at_most_three_times_back_and_a_client_still_connects() {
    let (mut server, server_key, client_key) = keyed_server();
    let attacker = StaticKeypair::generate().unwrap();
    let mut flood = Vec::new();
    for i in 0..300u64 {
        let mut c = secure_client(1000 + i, &attacker, &server_key);
        let mut buf = vec![0u8; 2048];
        let n = c
            .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
            .unwrap();
        flood.push(buf[..n].to_vec());
    }
    let mut received = std::collections::HashMap::<SocketAddr, (usize, usize)>::new();
    let mut buf = vec![0u8; 65536];
    let now = Time::ZERO;
    for (i, hello) in flood.iter().enumerate() {
        let from = SocketAddr::from(([192, 0, 2, (i % 250) as u8], 1000 + i as u16));
        received.entry(from).or_default().0 += hello.len();
        server.handle_datagram(now, from, &mut hello.clone());
        while let Some((to, n)) = server.poll_transmit(now, &mut buf) {
            received.entry(to).or_default().1 += n;
        }
    }
    for (a, (inb, out)) in &received {
        assert!(*out <= 3 * inb, "{a}: {out} bytes out for {inb} in");
    }
    assert!(server.stats().cookies_sent > 0, "{:?}", server.stats());
    assert_eq!(server.open_connections(), 0);
    // Now the real client, in the same second, over a 100 ms round trip:
    // under load its first hello gets a cookie, the second gets in (two
    // round trips: the handshake's one plus the cookie's).
    let client = secure_client(20, &client_key, &server_key);
    let (hellos, answered, _, server) = handshake_over_100ms(client, server, now);
    let took = answered
        .expect("no session within a second")
        .saturating_since(now);
    assert_eq!(hellos, 2, "a hello, then the same with the cookie");
    assert!(
        took <= Duration::from_millis(202),
        "{took:?} for two round trips of 100 ms"
    );
    assert_eq!(server.stats().handshakes, 1);
}

/// Runs `client`'s handshake with `server` over a 100 ms round trip from
/// `start`, for at most a second: the hellos it sent, and when the
/// session was established.
fn handshake_over_100ms(
    client: Client,
    server: Server,
    start: Time,
) -> (usize, Option<Time>, Client, Server) {
    let path = || "delay 50ms".parse::<NetemSpec>().unwrap();
    let mut pair = Pair::between(client, addr(1), server, path(), path(), 1).starting_at(start);
    pair.set_time_limit(start.saturating_since(Time::ZERO) + Duration::from_secs(1));
    let mut hellos = 0;
    let mut count_hellos = |_: Time, dir: Dir, d: Vec<u8>| {
        hellos += usize::from(dir == Dir::ToServer && d[3] == 0x20);
        vec![(addr(1), d)]
    };
    pair.run_until(&mut (), &mut count_hellos, |p| p.client.sender().is_some());
    let established = pair.client.sender().is_some().then(|| pair.now());
    (hellos, established, pair.client, pair.server)
}

#[test]
fn a_plain_hello_still_works_where_the_operator_allows_it() {
    let server = server_with(ServerAuth::plain());
    let client = Client::new(&tuning(), 21, Some(BYTES), Time::ZERO).unwrap();
    let (client, _server) = run(client, server, Duration::from_secs(30), straight(addr(1)));
    assert!(client.outcome().unwrap().is_ok());
    // A hello is not the only thing plain: the wire is unchanged.
    let mut buf = vec![0u8; 256];
    let n = Hello {
        conn_id: 1,
        mss: 1400,
        maxidle_ms: 0,
        session: 0,
        receiver: ReceiverParams {
            rcvsegs: 10,
            rcvbuf: 0,
            delack_us: 0,
            quickack: 0,
            sack: true,
        },
    }
    .emit(&mut buf)
    .unwrap();
    assert_eq!(buf[3] & PROTECTED, 0);
    assert!(n < 100);
}

/// An on-path attacker races a captured packet from a victim's address:
/// the connection moves there, but what goes to the victim is held to 3×
/// what came from it, the victim never answers the path challenge, and
/// the connection returns to its client, which finishes.
#[test]
fn a_raced_packet_from_a_victim_address_cannot_aim_the_flow_at_it() {
    let (mut server, server_key, client_key) = keyed_server();
    let mut client = secure_client(22, &client_key, &server_key);
    let victim = SocketAddr::from(([198, 51, 100, 7], 4444));
    let (mut to_victim, mut from_victim) = (0usize, 0usize);
    let mut raced = 0;
    let mut protected = 0u64;
    let mut now = Time::ZERO;
    let mut buf = vec![0u8; 65536];
    while client.outcome().is_none() && now < Time::ZERO + Duration::from_secs(60) {
        client.handle_timeout(now);
        server.handle_timeout(now);
        for _ in 0..64 {
            let Some(n) = client.poll_transmit(now, &mut buf, &mut PatternSource) else {
                break;
            };
            let d = buf[..n].to_vec();
            // One protected datagram in 20 has a copy go first from the
            // victim's address.
            protected += u64::from(d[3] & PROTECTED != 0);
            let race = d[3] & PROTECTED != 0 && protected % 20 == 0;
            if race {
                raced += 1;
                from_victim += d.len();
                server.handle_datagram(now, victim, &mut d.clone());
            }
            server.handle_datagram(now, addr(1), &mut d.clone());
        }
        while let Some((to, n)) = server.poll_transmit(now, &mut buf) {
            if to == victim {
                to_victim += n;
            } else if to == addr(1) {
                let _ = client.handle_datagram(now, &buf[..n]);
            }
        }
        now += Duration::from_millis(1);
    }
    let outcome = client.outcome().expect("finished").clone();
    assert!(outcome.is_ok(), "{outcome:?}");
    let s = *server.stats();
    assert!(raced > 0 && s.migrations >= raced, "{raced} raced, {s:?}");
    // Each time the client's next packet took the connection back, and
    // the client answered the challenge there.
    assert!(s.paths_validated > 0, "{s:?}");
    assert!(
        to_victim <= 3 * from_victim,
        "{to_victim} bytes to the victim for {from_victim} from it"
    );
}

/// Not under load, the handshake is one round trip: one hello, and the
/// session exists when its answer arrives, 100 ms later on a 100 ms path.
#[test]
fn the_handshake_takes_one_round_trip() {
    let (server, server_key, client_key) = keyed_server();
    let client = secure_client(23, &client_key, &server_key);
    let (hellos, established, client, _) = handshake_over_100ms(client, server, Time::ZERO);
    assert_eq!(hellos, 1);
    assert!(established.is_some());
    assert_eq!(client.handshake_time(), Some(Duration::from_millis(100)));
}

/// The datagrams of `queue` due by `now`, in order.
fn take_due(queue: &mut Vec<(Time, Vec<u8>)>, now: Time) -> Vec<(Time, Vec<u8>)> {
    let (due, later): (Vec<_>, Vec<_>) = queue.drain(..).partition(|(at, _)| *at <= now);
    *queue = later;
    due
}

/// An authorized client at `addr(1)`, 50 ms from the server each way,
/// that starts at `start`: stepped beside whatever else a test sends the
/// server.
struct ClientOnPath {
    client: Client,
    start: Time,
    to_server: Vec<(Time, Vec<u8>)>,
    to_client: Vec<(Time, Vec<u8>)>,
    established: Option<Time>,
    buf: Vec<u8>,
}

impl ClientOnPath {
    const ONE_WAY: Duration = Duration::from_millis(50);

    fn new(client: Client, start: Time) -> ClientOnPath {
        ClientOnPath {
            client,
            start,
            to_server: Vec::new(),
            to_client: Vec::new(),
            established: None,
            buf: vec![0u8; 65536],
        }
    }

    /// One step at `now`: until it has its session the client sends, and
    /// what it sent reaches the server a one-way delay later; what the
    /// server sends `addr(1)` reaches the client likewise, and what it
    /// sends anyone else goes to `elsewhere` at once.
    fn step(
        &mut self,
        now: Time,
        server: &mut Server,
        mut elsewhere: impl FnMut(SocketAddr, &[u8]),
    ) {
        if now >= self.start && self.established.is_none() {
            self.client.handle_timeout(now);
            while let Some(n) = self
                .client
                .poll_transmit(now, &mut self.buf, &mut PatternSource)
            {
                self.to_server
                    .push((now + Self::ONE_WAY, self.buf[..n].to_vec()));
            }
            for (_, mut d) in take_due(&mut self.to_server, now) {
                server.handle_datagram(now, addr(1), &mut d);
            }
        }
        while let Some((to, n)) = server.poll_transmit(now, &mut self.buf) {
            if to == addr(1) {
                self.to_client
                    .push((now + Self::ONE_WAY, self.buf[..n].to_vec()));
            } else {
                elsewhere(to, &self.buf[..n]);
            }
        }
        for (_, d) in take_due(&mut self.to_client, now) {
            let _ = self.client.handle_datagram(now, &d);
        }
        if self.established.is_none() && self.client.sender().is_some() {
            self.established = Some(now);
        }
    }

    /// How long after its start the client had its session.
    fn took(&self) -> Option<Duration> {
        self.established.map(|at| at.saturating_since(self.start))
    }
}

/// A hello as an attacker holds it, with the cookie of a cookie reply
/// spliced in (the cookie is bound to the address, not to the hello, so
/// an attacker at a real address gets one and reuses it).
fn with_cookie(hello: &[u8], cookie_reply: &[u8]) -> Vec<u8> {
    // HELLO: prefix (4), client id (8), cookie flag (1) [cookie (32)], ...
    // COOKIE: prefix (4), client id (8), cookie (32).
    let cookie = &cookie_reply[12..44];
    let rest = if hello[12] == 1 {
        &hello[45..]
    } else {
        &hello[13..]
    };
    let mut out = hello[..12].to_vec();
    out.push(1);
    out.extend_from_slice(cookie);
    out.extend_from_slice(rest);
    out
}

/// The review's attack in virtual time: one captured hello of a key the
/// server does not know, replayed from one real address (which gets and
/// splices the cookies) 10,000 times in a second. Each copy used to cost
/// a full Noise response; now the first costs the two X25519 operations
/// that find the key unknown, and is remembered, so every copy after it
/// costs a lookup and is answered with nothing. An authorized client
/// connecting from another address in the middle of it gets its session
/// in one round trip.
#[test]
fn a_captured_hello_of_an_unknown_key_replayed_10000_times_is_worked_once_and_never_answered() {
    let (mut server, server_key, client_key) = keyed_server();
    let stranger = StaticKeypair::generate().unwrap();
    let mut captured = vec![0u8; 2048];
    let n = secure_client(30, &stranger, &server_key)
        .poll_transmit(Time::ZERO, &mut captured, &mut PatternSource)
        .unwrap();
    captured.truncate(n);
    let attacker = SocketAddr::from(([192, 0, 2, 66], 4000));
    let mut client = ClientOnPath::new(
        secure_client(31, &client_key, &server_key),
        Time::ZERO + Duration::from_millis(300),
    );
    let mut responses_to_attacker = 0u64;
    let step = Duration::from_micros(100);
    let mut now = Time::ZERO;
    for _ in 0..10_000 {
        server.handle_timeout(now);
        server.handle_datagram(now, attacker, &mut captured.clone());
        client.step(now, &mut server, |to, d| {
            if to == attacker {
                match d[3] {
                    0x22 => captured = with_cookie(&captured, d),
                    _ => responses_to_attacker += 1,
                }
            }
        });
        now += step;
    }
    let s = *server.stats();
    assert_eq!(responses_to_attacker, 0, "{s:?}");
    // Within WireGuard's per-source budget (a burst of 5, then 20 a
    // second) and the client's one hello; in fact the attacker's first
    // copy only: the others were found by a lookup.
    assert!(s.hellos_worked <= 5 + 20 + 1, "{s:?}");
    assert_eq!(s.hellos_worked, 2, "{s:?}");
    assert_eq!(s.hellos_seen, 9_999, "{s:?}");
    // Copies that fast are a replay: the driver is asked to drop them
    // before reading them (a socket filter on the hello's client id), and
    // nothing else: not the authorized client's hello.
    assert_eq!(s.hellos_dropped_unread, 1, "{s:?}");
    let replayed_id = u64::from_be_bytes(captured[4..12].try_into().unwrap());
    assert_eq!(server.poll_dropped_hellos(now), Some(vec![replayed_id]));
    assert_eq!(server.poll_dropped_hellos(now), None);
    let took = client
        .took()
        .expect("the authorized client got no session during the flood");
    assert!(took <= Duration::from_millis(101), "{took:?}");
    assert_eq!(s.handshakes, 1);
}

/// Distinct hellos from one address (each a new Noise message, so no
/// lookup finds it): the source gets WireGuard's budget, a burst of 5
/// then 20 a second (and once asked for a cookie, a burst more), and the
/// rest are dropped unread.
#[test]
fn distinct_hellos_from_one_source_get_its_budget_and_no_more() {
    let (mut server, _, _) = keyed_server();
    let from = SocketAddr::from(([192, 0, 2, 67], 4000));
    let mut cookie = None::<Vec<u8>>;
    let mut buf = vec![0u8; 65536];
    for i in 0..2000u64 {
        let now = Time::ZERO + Duration::from_micros(i * 500);
        let mut h = garbage_hello(i);
        if let Some(c) = &cookie {
            h = with_cookie(&h, c);
        }
        server.handle_datagram(now, from, &mut h);
        while let Some((_, n)) = server.poll_transmit(now, &mut buf) {
            if buf[3] == 0x22 {
                cookie = Some(buf[..n].to_vec());
            }
        }
    }
    let s = *server.stats();
    // Its burst without a cookie, then, asked for one, its burst with
    // one, then 20 a second.
    assert!(s.hellos_worked <= 5 + 5 + 20, "{s:?}");
    assert_eq!(s.bad_handshakes, s.hellos_worked, "{s:?}");
    assert_eq!(s.cookies_sent, 1, "{s:?}");
    assert_eq!(
        s.hellos_limited,
        2000 - s.hellos_worked - s.cookies_sent,
        "{s:?}"
    );
}

/// 1,000 sources (real ones: each gets its cookie and splices it in)
/// send distinct hellos that make the server work, six each over a
/// second: together they get no more public-key operations than the
/// global budget, however many sources there are, and the table of
/// per-source budgets stays within its capacity.
#[test]
fn a_thousand_sources_get_no_more_than_the_global_handshake_budget() {
    let server_key = StaticKeypair::generate().unwrap();
    let limits = ServerLimits::default()
        .hellos_per_sec(1000)
        .max_rate_sources(256);
    let mut server = Server::new(limits, 1 << 20, 2 << 20)
        .with_auth(ServerAuth {
            identity: Some(server_key),
            authorized: Some(authorized(&[])),
            allow_plain: false,
        })
        .unwrap();
    let mut most_tracked = 0;
    let sources: Vec<SocketAddr> = (0..1000u32)
        .map(|i| SocketAddr::from(([10, 1, (i >> 8) as u8, i as u8], 5000)))
        .collect();
    let mut cookies: std::collections::HashMap<SocketAddr, Vec<u8>> = Default::default();
    let mut buf = vec![0u8; 65536];
    let mut seed = 0u64;
    let rounds = 6;
    for round in 0..rounds {
        for (i, &from) in sources.iter().enumerate() {
            let now = Time::ZERO
                + Duration::from_micros((round * 1000 + i as u64) * 1_000_000 / (rounds * 1000));
            seed += 1;
            let mut h = garbage_hello(seed);
            if let Some(c) = cookies.get(&from) {
                h = with_cookie(&h, c);
            }
            server.handle_datagram(now, from, &mut h);
            most_tracked = most_tracked.max(server.rate_sources_tracked());
            while let Some((to, n)) = server.poll_transmit(now, &mut buf) {
                if buf[3] == 0x22 {
                    cookies.insert(to, buf[..n].to_vec());
                }
            }
        }
    }
    let s = *server.stats();
    // The global budget: 1,000 a second, 250 at once.
    assert!(s.hellos_worked <= 250 + 1000, "{s:?}");
    assert!(s.hellos_limited > 0, "{s:?}");
    assert!(most_tracked <= 256, "{most_tracked} sources tracked");
}

/// A server as `atou serve` builds it when started at `wall_ns` (the
/// wall clock, in nanoseconds since the Unix epoch), with its key from
/// a file: what a restart builds.
fn started_at(wall_ns: u64, server_key: &StaticKeypair, client_key: &StaticKeypair) -> Server {
    let limits =
        ServerLimits::default().replay_floor_ns(atou::internals::server::replay_floor(wall_ns));
    Server::new(limits, 1 << 20, 2 << 20)
        .with_auth(ServerAuth {
            identity: Some(server_key.clone()),
            authorized: Some(authorized(&[client_key])),
            allow_plain: false,
        })
        .unwrap()
}

/// The first datagram of an authenticated client whose wall clock reads
/// `wall_ns`: its hello.
fn hello_at(
    id: u64,
    wall_ns: u64,
    client_key: &StaticKeypair,
    server_key: &StaticKeypair,
) -> Vec<u8> {
    let mut c = Client::new(&tuning(), id, Some(BYTES), Time::ZERO)
        .unwrap()
        .with_auth(
            ClientAuth {
                identity: client_key.clone(),
                server_key: server_key.public(),
                cipher: Cipher::Aes256Gcm,
            },
            wall_ns,
        )
        .unwrap();
    first_datagram(&mut c)
}

/// The replay state is in memory: a hello captured from an authorized
/// client used to be accepted once more by the restarted server (a
/// session no one can use, holding a slot and a window until it
/// expires). Now a server refuses hellos timestamped before its start,
/// less a skew for clocks that differ.
#[test]
fn a_hello_accepted_before_a_restart_is_refused_after_it() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let start = 1_700_000_000_000_000_000u64;
    let mut first = started_at(start, &server_key, &client_key);
    let captured = hello_at(40, start + 60_000_000_000, &client_key, &server_key);
    let at = Time::ZERO + Duration::from_secs(60);
    first.handle_datagram(at, addr(1), &mut captured.clone());
    assert_eq!(first.stats().handshakes, 1);
    // Ten minutes later the server restarts; the attacker replays.
    let restart = start + 600_000_000_000;
    let mut second = started_at(restart, &server_key, &client_key);
    second.handle_datagram(Time::ZERO, addr(9), &mut captured.clone());
    assert_eq!(second.stats().handshakes, 0, "{:?}", second.stats());
    assert_eq!(second.open_connections(), 0);
    // The client's own next hello gets in.
    let fresh = hello_at(41, restart + 1_000_000_000, &client_key, &server_key);
    second.handle_datagram(
        Time::ZERO + Duration::from_secs(1),
        addr(1),
        &mut fresh.clone(),
    );
    assert_eq!(second.stats().handshakes, 1);
}

/// The price of the restart floor: a client whose clock is behind a
/// freshly started server's by more than the skew is refused, and told
/// why, until the server has run for the difference.
#[test]
fn a_client_clock_behind_a_fresh_server_by_more_than_the_skew_is_told_so() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let start = 1_700_000_000_000_000_000u64;
    let server = started_at(start, &server_key, &client_key);
    let client = Client::new(&tuning(), 42, Some(BYTES), Time::ZERO)
        .unwrap()
        .with_auth(
            ClientAuth {
                identity: client_key.clone(),
                server_key: server_key.public(),
                cipher: Cipher::Aes256Gcm,
            },
            start - 5 * 60_000_000_000,
        )
        .unwrap();
    let (client, server) = run(client, server, Duration::from_secs(5), straight(addr(1)));
    let Some(Err(e @ ConnError::AuthRefused(_))) = client.outcome() else {
        panic!("{:?}", client.outcome());
    };
    assert!(e.to_string().contains("clock is behind"), "{e}");
    assert_eq!(server.open_connections(), 0);
    // Within the skew, it gets in.
    let mut server = started_at(start, &server_key, &client_key);
    let hello = hello_at(43, start - 60_000_000_000, &client_key, &server_key);
    server.handle_datagram(Time::ZERO, addr(1), &mut hello.clone());
    assert_eq!(server.stats().handshakes, 1);
}

/// A server as `atou serve --dir` builds it when started at `wall_ns`:
/// its floor, and the table of hello timestamps the run before saved.
fn keeping_at(
    wall_ns: u64,
    server_key: &StaticKeypair,
    client_key: &StaticKeypair,
    remembered: Vec<(atou::internals::crypto::PublicKey, u64)>,
) -> Server {
    started_at(wall_ns, server_key, client_key).keeping_hello_timestamps(remembered)
}

/// Everything the server has to send now.
fn drain(server: &mut Server) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    while let Some((to, n)) = server.poll_transmit(Time::ZERO, &mut buf) {
        out.push((to, buf[..n].to_vec()));
    }
    out
}

/// The floor alone let a hello of the 2 minutes before a restart in once
/// more. A server that keeps its table holds the response until the
/// table is saved, and the next run, given it, refuses the hello.
#[test]
fn a_hello_of_the_minutes_before_a_restart_is_refused_by_the_kept_table() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let start = 1_700_000_000_000_000_000u64;
    let mut first = keeping_at(start, &server_key, &client_key, Vec::new());
    let stamped = start + 60_000_000_000;
    let captured = hello_at(40, stamped, &client_key, &server_key);
    first.handle_datagram(
        Time::ZERO + Duration::from_secs(60),
        addr(1),
        &mut captured.clone(),
    );
    assert_eq!(first.stats().handshakes, 1);
    assert!(drain(&mut first).is_empty(), "answered before the save");
    let table = first.hello_timestamps_to_save().expect("a table to save");
    assert_eq!(table, vec![(client_key.public(), stamped)]);
    first.hello_timestamps_saved(true);
    let sent = drain(&mut first);
    assert_eq!(sent.len(), 1, "the response, once saved");
    assert_eq!(sent[0].0, addr(1));
    assert!(first.hello_timestamps_to_save().is_none(), "saved once");

    // 30 s later the server restarts: the hello is inside the skew.
    let restart = stamped + 30_000_000_000;
    let mut forgetful = started_at(restart, &server_key, &client_key);
    forgetful.handle_datagram(Time::ZERO, addr(9), &mut captured.clone());
    assert_eq!(
        forgetful.stats().handshakes,
        1,
        "the floor alone lets it in"
    );
    let mut second = keeping_at(restart, &server_key, &client_key, table);
    second.handle_datagram(Time::ZERO, addr(9), &mut captured.clone());
    assert_eq!(second.stats().handshakes, 0, "{:?}", second.stats());
    assert_eq!(second.open_connections(), 0);
    assert!(
        drain(&mut second).is_empty(),
        "a replay is answered nothing"
    );
    assert!(second.hello_timestamps_to_save().is_none());
    // The client's own next hello gets in, once its table is saved.
    let fresh = hello_at(41, restart + 1_000_000_000, &client_key, &server_key);
    second.handle_datagram(Time::ZERO, addr(1), &mut fresh.clone());
    assert_eq!(second.stats().handshakes, 1);
    assert!(second.hello_timestamps_to_save().is_some());
    second.hello_timestamps_saved(true);
    assert_eq!(drain(&mut second).len(), 1);
}

/// A table that could not be saved (a full disk): the responses that
/// waited for it are never sent and their sessions are dropped, since a
/// restart could accept their hellos again; the table stays unsaved, so
/// the key's next hello, even one that does not advance it, waits for the
/// next save.
#[test]
fn a_response_whose_table_could_not_be_saved_is_never_sent() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let start = 1_700_000_000_000_000_000u64;
    let mut server = keeping_at(start, &server_key, &client_key, Vec::new());
    let newer = hello_at(50, start + 2_000_000, &client_key, &server_key);
    let older = hello_at(51, start + 1_000_000, &client_key, &server_key);
    server.handle_datagram(Time::ZERO, addr(1), &mut newer.clone());
    assert!(server.hello_timestamps_to_save().is_some());
    server.hello_timestamps_saved(false);
    assert!(
        drain(&mut server).is_empty(),
        "sent without its table saved"
    );
    assert_eq!(server.open_connections(), 0);
    let ended = server
        .poll_report()
        .expect("the dropped connection's report");
    assert_eq!(ended.end, atou::ConnEnd::Idle);
    // Inside the window of the newer one: accepted, and held too.
    server.handle_datagram(Time::ZERO, addr(1), &mut older.clone());
    assert_eq!(server.stats().handshakes, 2);
    assert!(drain(&mut server).is_empty());
    let table = server.hello_timestamps_to_save().expect("saved again");
    assert_eq!(table, vec![(client_key.public(), start + 2_000_000)]);
    server.hello_timestamps_saved(true);
    assert_eq!(drain(&mut server).len(), 1);
    assert_eq!(server.open_connections(), 1);
}

/// The save runs beside the server (on a thread of `atou serve`'s own):
/// one at a time, and a hello accepted while it runs waits for the next,
/// which covers its timestamp; the first save's response goes out when
/// it is reported, not before.
#[test]
fn a_hello_accepted_during_a_save_waits_for_the_next_one() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let start = 1_700_000_000_000_000_000u64;
    let mut server = keeping_at(start, &server_key, &client_key, Vec::new());
    let first = hello_at(60, start + 1_000_000, &client_key, &server_key);
    let second = hello_at(61, start + 3_000_000, &client_key, &server_key);
    server.handle_datagram(Time::ZERO, addr(1), &mut first.clone());
    let taken = server.hello_timestamps_to_save().expect("a table to save");
    assert_eq!(taken, vec![(client_key.public(), start + 1_000_000)]);
    // While that save runs, another hello is accepted.
    server.handle_datagram(Time::ZERO, addr(2), &mut second.clone());
    assert_eq!(server.stats().handshakes, 2);
    assert!(server.hello_timestamps_to_save().is_none(), "one at a time");
    assert!(drain(&mut server).is_empty(), "answered before a save");
    server.hello_timestamps_saved(true);
    let sent = drain(&mut server);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].0, addr(1), "only what the first save covers");
    let next = server.hello_timestamps_to_save().expect("the second save");
    assert_eq!(next, vec![(client_key.public(), start + 3_000_000)]);
    server.hello_timestamps_saved(true);
    let sent = drain(&mut server);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, addr(2));
    assert!(server.hello_timestamps_to_save().is_none());
}

/// The first datagram a client sends: its hello.
fn first_datagram(client: &mut Client) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    let n = client
        .poll_transmit(Time::ZERO, &mut buf, &mut PatternSource)
        .unwrap();
    buf.truncate(n);
    buf
}

/// With the offload (what `atou serve` runs), a hello costs the thread
/// that handles datagrams its screening and nothing more: the X25519
/// operations are handed out as jobs, run here on other threads, and
/// their results, given back later, make a session that carries a whole
/// transfer.
#[test]
fn with_the_offload_a_hello_is_handed_out_as_work_and_the_session_it_makes_works() {
    let (server, server_key, client_key) = keyed_server();
    let mut server = server.offload_handshakes();
    let mut client = secure_client(50, &client_key, &server_key);
    let mut buf = vec![0u8; 65536];
    server.handle_datagram(Time::ZERO, addr(1), &mut first_datagram(&mut client));
    // Screened, charged and handed out; nothing read, nothing answered.
    let s = *server.stats();
    assert_eq!((s.hellos_worked, s.handshakes, s.bad_handshakes), (1, 0, 0));
    assert!(server.poll_transmit(Time::ZERO, &mut buf).is_none());
    assert_eq!(server.open_connections(), 0);
    let open = server.poll_handshake_work().expect("the hello's work");
    assert!(server.poll_handshake_work().is_none());
    assert_eq!(server.handshakes_in_flight(), 1);
    let done = std::thread::spawn(move || open.run()).join().unwrap();
    server.handshake_done(Time::ZERO, done);
    // Decided on the server's thread: the connection holds its place, and
    // the response is the next job.
    assert_eq!(server.open_connections(), 1);
    assert!(server.poll_transmit(Time::ZERO, &mut buf).is_none());
    let respond = server.poll_handshake_work().expect("the response's work");
    let done = std::thread::spawn(move || respond.run()).join().unwrap();
    server.handshake_done(Time::ZERO, done);
    assert_eq!(server.stats().handshakes, 1);
    assert_eq!(server.handshakes_in_flight(), 0);
    let (client, _server) = run(client, server, Duration::from_secs(30), straight(addr(1)));
    let outcome = client.outcome().expect("finished").clone();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(client.sender().unwrap().good_bytes(), BYTES);
    assert_eq!(client.handshake_time(), Some(Duration::ZERO));
}

/// The work queue is bounded: a hello arriving when it is full is dropped
/// unread and counted, before it is charged to its source or remembered,
/// so that its client's resend is read once there is room.
#[test]
fn a_hello_past_the_full_work_queue_is_dropped_counted_and_read_when_resent() {
    let limits = ServerLimits::default().handshake_queue(4);
    let mut server = Server::new(limits, 1 << 20, 2 << 20)
        .with_auth(ServerAuth {
            identity: Some(StaticKeypair::generate().unwrap()),
            authorized: Some(authorized(&[])),
            allow_plain: false,
        })
        .unwrap()
        .offload_handshakes();
    let source = |i: u64| SocketAddr::from(([192, 0, 2, i as u8], 4000));
    for i in 0..10u64 {
        server.handle_datagram(Time::ZERO, source(i), &mut garbage_hello(i));
    }
    let s = *server.stats();
    assert_eq!((s.hellos_worked, s.hellos_queue_full), (4, 6), "{s:?}");
    assert_eq!(server.handshakes_in_flight(), 4);
    let jobs: Vec<_> = std::iter::from_fn(|| server.poll_handshake_work()).collect();
    assert_eq!(jobs.len(), 4);
    for job in jobs {
        server.handshake_done(Time::ZERO, job.run());
    }
    assert_eq!(server.stats().bad_handshakes, 4);
    assert_eq!(server.handshakes_in_flight(), 0);
    // A dropped hello, sent again: read, not taken for a copy.
    let later = Time::ZERO + Duration::from_millis(200);
    server.handle_datagram(later, source(9), &mut garbage_hello(9));
    let s = *server.stats();
    assert_eq!((s.hellos_worked, s.hellos_seen), (5, 0), "{s:?}");
    assert!(server.poll_handshake_work().is_some());
}

/// Five authorized hellos from one address, all read before any is
/// answered, against a budget of two connections per address: the
/// first two decided hold their places while their responses are
/// worked, so the other three are refused as busy, and exactly two
/// sessions are made, whose clients get their keys.
#[test]
fn hellos_in_flight_cannot_oversubscribe_the_connection_budget() {
    let (server_key, client_key) = (
        StaticKeypair::generate().unwrap(),
        StaticKeypair::generate().unwrap(),
    );
    let limits = ServerLimits::default().max_connections_per_ip(2);
    let mut server = Server::new(limits, 1 << 20, 2 << 20)
        .with_auth(ServerAuth {
            identity: Some(server_key.clone()),
            authorized: Some(authorized(&[&client_key])),
            allow_plain: false,
        })
        .unwrap()
        .offload_handshakes();
    let at = |i: u64| SocketAddr::from(([10, 0, 0, 1], 2000 + i as u16));
    let mut clients: Vec<Client> = (0..5u64)
        .map(|i| secure_client_at(60 + i, 1_000_000_000 + i, &client_key, &server_key))
        .collect();
    for (i, c) in clients.iter_mut().enumerate() {
        server.handle_datagram(Time::ZERO, at(i as u64), &mut first_datagram(c));
    }
    let opens: Vec<_> = std::iter::from_fn(|| server.poll_handshake_work()).collect();
    assert_eq!(opens.len(), 5);
    let read: Vec<_> = opens
        .into_iter()
        .map(|w| std::thread::spawn(move || w.run()))
        .collect();
    for done in read {
        server.handshake_done(Time::ZERO, done.join().unwrap());
    }
    // Every hello decided, no response made yet: two places held.
    assert_eq!(server.open_connections(), 2);
    assert_eq!(server.handshakes_in_flight(), 5);
    let responses: Vec<_> = std::iter::from_fn(|| server.poll_handshake_work()).collect();
    for w in responses {
        server.handshake_done(Time::ZERO, w.run());
    }
    let s = *server.stats();
    assert_eq!((s.handshakes, s.busy_rejects), (2, 3), "{s:?}");
    assert_eq!(server.open_connections(), 2);
    let mut buf = vec![0u8; 65536];
    while let Some((to, n)) = server.poll_transmit(Time::ZERO, &mut buf) {
        let i = usize::from(to.port() - 2000);
        let _ = clients[i].handle_datagram(Time::ZERO, &buf[..n]);
    }
    let keyed = clients.iter().filter(|c| c.sender().is_some()).count();
    let busy = clients
        .iter()
        .filter(|c| matches!(c.outcome(), Some(Err(ConnError::AuthRefused(_)))))
        .count();
    assert_eq!((keyed, busy), (2, 3));
}

/// An off-path spoofer sends garbage hellos with its victim's address
/// (another port: it cannot see the answers) at 1,000 a second, past
/// the per-source budget of 20. The victim, an authorized client at that
/// address, must still get its session within a few round trips: a
/// hello that has not proved its address (no valid cookie) must not be
/// able to spend the budget of the hellos that have.
#[test]
fn a_spoofer_using_a_victims_address_cannot_spend_its_handshake_budget() {
    let (mut server, server_key, client_key) = keyed_server();
    let spoofed = SocketAddr::from((addr(1).ip(), 40_000));
    let mut client = ClientOnPath::new(
        secure_client(31, &client_key, &server_key),
        Time::ZERO + Duration::from_millis(1_000),
    );
    let step = Duration::from_millis(1);
    let mut now = Time::ZERO;
    for i in 0..6_000u64 {
        server.handle_timeout(now);
        server.handle_datagram(now, spoofed, &mut garbage_hello(i));
        // What goes to the spoofed port is lost to the spoofer.
        client.step(now, &mut server, |_, _| {});
        now += step;
    }
    let s = *server.stats();
    let took = client
        .took()
        .unwrap_or_else(|| panic!("the victim got no session in 5 s: {s:?}"));
    // Two round trips: the first hello is answered with a cookie.
    assert!(took <= Duration::from_millis(202), "{took:?} {s:?}");
    assert_eq!(s.handshakes, 1, "{s:?}");
    // What the spoofed address was sent: its share of cookies (64 at
    // once, 64 a second), not one for each of 6,000 hellos; the rest
    // were dropped unanswered.
    assert!(s.cookies_sent <= 64 + 64 * 6 + 1, "{s:?}");
    assert!(s.answers_limited >= 5_000, "{s:?}");
}

/// An off-path spoofer sends, in a victim's address, every kind of
/// datagram the server answers before anyone has proved anything: key
/// queries, hellos of another version, plain hellos to a server that
/// requires keys, and path-MTU probes, 10,000 in a second. Each answer is
/// no larger than what came, but one answer for every datagram makes the
/// server a reflector at the spoofer's packet rate. The victim's address
/// gets its share (64 at once, 64 a second) and no more; another address
/// still gets its answer.
#[test]
fn answers_before_any_proof_are_priced_per_address() {
    let (mut server, _, _) = keyed_server();
    let victim = SocketAddr::from(([192, 0, 2, 70], 4000));
    let bystander = SocketAddr::from(([192, 0, 2, 71], 4000));
    let mut buf = vec![0u8; 65536];
    let mut to_victim = 0u64;
    let mut kinds_answered = std::collections::BTreeSet::new();
    for i in 0..10_000u64 {
        let now = Time::ZERO + Duration::from_micros(i * 100);
        let mut datagram = match i % 4 {
            0 => atou::internals::crypto::handshake::key_query(i),
            1 => {
                let mut h = garbage_hello(i);
                h[2] = atou::internals::wire::VERSION.wrapping_add(1);
                h
            }
            2 => plain_hello(i, 0, 1200, 64),
            _ => {
                let mut p = vec![0u8; 1200];
                let n = atou::internals::wire::SizeProbe {
                    conn_id: i,
                    nonce: i,
                    size: 1200,
                }
                .emit(&mut p)
                .unwrap();
                p.truncate(n);
                p
            }
        };
        server.handle_datagram(now, victim, &mut datagram);
        while let Some((to, _)) = server.poll_transmit(now, &mut buf) {
            if to == victim {
                to_victim += 1;
                kinds_answered.insert(i % 4);
            }
        }
    }
    let s = *server.stats();
    assert_eq!(kinds_answered.len(), 4, "each kind is answered: {s:?}");
    assert!(to_victim <= 64 + 64, "{to_victim} answers: {s:?}");
    assert_eq!(s.answers_limited, 10_000 - to_victim, "{s:?}");
    let now = Time::ZERO + Duration::from_secs(1);
    server.handle_datagram(
        now,
        bystander,
        &mut atou::internals::crypto::handshake::key_query(1),
    );
    let answered = std::iter::from_fn(|| server.poll_transmit(now, &mut buf))
        .filter(|(to, _)| *to == bystander)
        .count();
    assert_eq!(answered, 1);
}
