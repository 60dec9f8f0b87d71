//! A hello flood against `atou serve`, for scripts/bench-flood.sh: one
//! handshake hello of a key the server does not authorize, made with the
//! crate's own initiator (what a capture of a real client's hello holds),
//! with the server's cookie spliced in if it asks for one, then replayed
//! as fast as one thread can send it for SECS seconds, from one address or
//! from SOURCES addresses (127.1.x.y: loopback's whole /8 is this host's,
//! so each is a source address of its own without raw sockets; on
//! loopback the one address is 127.1.0.1 too).
//!
//!     cargo run --release --example hello_flood -- ADDR KEY SECS [SOURCES] [distinct|varied]
//!
//! With `distinct`, every hello is a new one (a new client id and
//! ephemeral key, the cookie of its source spliced in), so none is found
//! by the server's lookup of copies: each within the budgets costs the
//! server two X25519 operations, the most a key it does not know can buy;
//! making each costs the flooder as much, so it sends about a thousand a
//! second. With `varied`, the one hello is sent with a client id of its
//! own each time (bytes 4..12 in clear): as cheap to send as a replay, at
//! line rate, but no copy a lookup or the kernel filter finds; each within
//! the budgets fails after its first Diffie-Hellman.
//!
//! KEY is the server's public key (`atou-x25519 BASE64`, as `atou serve`
//! prints it). Prints what was sent and what came back, and the ratio.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use atou::internals::crypto::handshake::{random_id, ClientConfig, Initiator, Progress};
use atou::internals::crypto::{Cipher, StaticKeypair};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        return Err("usage: hello_flood ADDR KEY SECS [SOURCES] [distinct|varied]".into());
    }
    let server: SocketAddr = args[0].parse()?;
    let server_key = atou::internals::crypto::parse_public_key(&args[1])?;
    let secs: f64 = args[2].parse()?;
    let sources: usize = args.get(3).map_or(Ok(1), |s| s.parse())?;
    let distinct = args.get(4).is_some_and(|a| a == "distinct");
    let varied = args.get(4).is_some_and(|a| a == "varied");
    if sources > 1 && !server.ip().is_loopback() {
        return Err(
            "several sources are 127.1.x.y addresses: the server must be on loopback".into(),
        );
    }

    // The "captured" hello: a key of our own, which the server does not know.
    let config = ClientConfig {
        identity: StaticKeypair::generate()?,
        server_key,
        cipher: Cipher::for_this_cpu(),
        params: Vec::new(),
    };
    let now_ns = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
    let mut initiator = Initiator::new(&config, random_id()?, now_ns)?;

    let sockets: Vec<UdpSocket> = (0..sources)
        .map(|i| {
            // On loopback even the one address is not 127.0.0.1, where the
            // authorized client of scripts/bench-flood.sh sends from: an
            // attacker's address is not its victim's.
            let ip: IpAddr = if sources == 1 && !(server.is_ipv4() && server.ip().is_loopback()) {
                if server.is_ipv4() {
                    Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                }
            } else {
                Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250 + 1) as u8).into()
            };
            UdpSocket::bind(SocketAddr::new(ip, 0))
        })
        .collect::<Result<_, _>>()?;

    // One exchange as a real address would have it: a cookie asked for
    // is taken and spliced into the hello that is then replayed.
    sockets[0].send_to(initiator.hello(), server)?;
    sockets[0].set_read_timeout(Some(Duration::from_millis(500)))?;
    let mut buf = [0u8; 2048];
    if let Ok((n, _)) = sockets[0].recv_from(&mut buf) {
        if let Ok(Progress::SendHelloAgain) = initiator.on_datagram(&buf[..n]) {
            eprintln!("hello_flood: the server asked for a cookie; it is in the hello replayed");
        }
    }
    let mut hello = initiator.hello().to_vec();
    for s in &sockets {
        s.set_nonblocking(true)?;
    }
    // Distinct hellos: each source's cookie, kept from its first answer,
    // goes into every new hello it sends (a cookie is bound to the
    // address and the time, not to the hello).
    let mut cookies: Vec<Option<Vec<u8>>> = vec![None; sources];
    let fresh =
        |i: usize, cookies: &[Option<Vec<u8>>]| -> Result<Vec<u8>, Box<dyn std::error::Error>> {
            let now_ns = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos() as u64;
            let id = random_id()?;
            let mut h = Initiator::new(&config, id, now_ns)?;
            if let Some(reply) = &cookies[i] {
                let mut reply = reply.clone();
                reply[4..12].copy_from_slice(&id.to_be_bytes());
                let _ = h.on_datagram(&reply);
            }
            Ok(h.hello().to_vec())
        };

    let started = Instant::now();
    let until = started + Duration::from_secs_f64(secs);
    let (mut sent, mut back, mut back_bytes) = (0u64, 0u64, 0u64);
    'flood: loop {
        for (i, s) in sockets.iter().enumerate() {
            if Instant::now() >= until {
                break 'flood;
            }
            if varied {
                hello[4..12].copy_from_slice(&(sent ^ 0x5eed_0000_0000_0000).to_be_bytes());
            }
            let made;
            let this: &[u8] = if distinct {
                made = fresh(i, &cookies)?;
                &made
            } else {
                &hello
            };
            if s.send_to(this, server).is_ok() {
                sent += 1;
            }
            while let Ok((n, _)) = s.recv_from(&mut buf) {
                back += 1;
                back_bytes += n as u64;
                // A cookie reply: prefix (4), client id (8), cookie (32).
                if distinct && n == 44 && buf[3] == 0x22 {
                    cookies[i] = Some(buf[..n].to_vec());
                }
            }
        }
    }
    // Answers still on their way.
    std::thread::sleep(Duration::from_millis(200));
    for s in &sockets {
        while let Ok((n, _)) = s.recv_from(&mut buf) {
            back += 1;
            back_bytes += n as u64;
        }
    }
    let took = started.elapsed().as_secs_f64();
    let sent_bytes = sent * hello.len() as u64;
    println!(
        "hello_flood: {sent} {}hellos ({} B each) from {sources} address{} in {took:.1} s \
         ({:.0}/s); {back} answers, {back_bytes} B: {:.3}x the bytes sent",
        match (distinct, varied) {
            (true, _) => "distinct ",
            (_, true) => "varied ",
            _ => "",
        },
        hello.len(),
        if sources == 1 { "" } else { "es" },
        sent as f64 / took,
        back_bytes as f64 / sent_bytes.max(1) as f64
    );
    Ok(())
}
