//! The handshake's decoders: bytes as a hello to the server (with and
//! without load, so the cookie path runs) and as an answer to a client
//! waiting for one. The bytes are taken raw, or XORed onto a genuine hello
//! or response so that mutations reach past the framing into Noise.
//!
//! The oracle: nothing panics; no session is made from bytes no key
//! sealed (only the genuine message, perhaps with more zero padding,
//! establishes); a cookie
//! reply is never larger than a third of the hello.
//!
//! Input: [mode: u8][bytes]; `mode % 4`: 0 raw hello, 1 genuine hello
//! XOR bytes, 2 raw answer, 3 genuine response XOR bytes; `mode & 4`:
//! the server is under load.
#![no_main]
use std::net::SocketAddr;
use std::sync::OnceLock;

use atou::fuzzing::crypto::cookie::CookieSecret;
use atou::fuzzing::crypto::handshake::{
    ClientConfig, Decision, Initiator, Progress, Reply, Responder, StaticKeypair,
};
use atou::fuzzing::crypto::Cipher;
use atou::Time;
use libfuzzer_sys::fuzz_target;

struct Fixture {
    server_key: StaticKeypair,
    config: ClientConfig,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let server_key = StaticKeypair::generate().unwrap();
        let config = ClientConfig {
            identity: StaticKeypair::generate().unwrap(),
            server_key: server_key.public(),
            cipher: Cipher::Aes256Gcm,
            params: b"params".to_vec(),
        };
        Fixture { server_key, config }
    })
}

fn xor(genuine: &[u8], mask: &[u8]) -> Vec<u8> {
    let mut out = genuine.to_vec();
    for (o, m) in out.iter_mut().zip(mask) {
        *o ^= m;
    }
    if mask.len() > genuine.len() {
        out.extend_from_slice(&mask[genuine.len()..]);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let from = SocketAddr::from(([192, 0, 2, 1], 4000));
    let mut server = Responder::new(f.server_key.clone(), CookieSecret::new([7; 32]));
    let mut client = Initiator::new(&f.config, 1, 1).unwrap();
    let under_load = mode & 4 != 0;
    let accept = |_: &_, _: &[u8]| Decision::Accept(b"ok".to_vec());
    match mode % 4 {
        0 | 1 => {
            let hello = if mode % 4 == 0 {
                bytes.to_vec()
            } else {
                xor(client.hello(), bytes)
            };
            match server.on_hello(Time::ZERO, from, &hello, under_load, 2, accept) {
                Ok(Reply::Cookie(reply)) => assert!(reply.len() * 3 <= hello.len()),
                // More zero padding is the same hello.
                Ok(_) => assert!(
                    hello.starts_with(client.hello())
                        && hello[client.hello().len()..].iter().all(|&b| b == 0),
                    "a session from a hello no client sealed"
                ),
                Err(_) => {}
            }
        }
        _ => {
            let answer = if mode % 4 == 2 {
                bytes.to_vec()
            } else {
                let Ok(Reply::Accepted { datagram, .. }) =
                    server.on_hello(Time::ZERO, from, client.hello(), false, 2, accept)
                else {
                    panic!("the genuine hello was not accepted");
                };
                let answer = xor(&datagram, bytes);
                if answer == datagram {
                    return;
                }
                answer
            };
            assert!(
                !matches!(client.on_datagram(&answer), Ok(Progress::Established(_))),
                "a session from an answer no server sealed"
            );
        }
    }
});
