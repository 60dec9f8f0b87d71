//! The handshake's decoders: arbitrary bytes as a hello to the server (with
//! and without load, so the cookie path runs) and as an answer to a client
//! waiting for one.
//!
//! The oracle: nothing panics; no session is made from bytes no key
//! sealed; a cookie reply is never larger than a third of the hello.
#![no_main]
use std::net::SocketAddr;
use std::sync::OnceLock;

use atou::proto::crypto::cookie::CookieSecret;
use atou::proto::crypto::handshake::{
    ClientConfig, Decision, Initiator, Progress, Reply, Responder, StaticKeypair,
};
use atou::proto::crypto::Cipher;
use atou::proto::Time;
use libfuzzer_sys::fuzz_target;

fn keys() -> &'static (StaticKeypair, StaticKeypair) {
    static KEYS: OnceLock<(StaticKeypair, StaticKeypair)> = OnceLock::new();
    KEYS.get_or_init(|| (StaticKeypair::generate().unwrap(), StaticKeypair::generate().unwrap()))
}

fuzz_target!(|data: &[u8]| {
    let (server_key, client_key) = keys();
    let mut server = Responder::new(server_key.clone(), CookieSecret::new([7; 32]));
    let from = SocketAddr::from(([192, 0, 2, 1], 4000));
    let under_load = data.first().is_some_and(|b| b % 2 == 1);
    match server.on_hello(Time::ZERO, from, data, under_load, 1, |_, _| Decision::Accept(Vec::new())) {
        Ok(Reply::Cookie(reply)) => assert!(reply.len() * 3 <= data.len()),
        Ok(_) => panic!("a session from bytes no client sealed"),
        Err(_) => {}
    }
    let mut client = Initiator::new(
        &ClientConfig {
            identity: client_key.clone(),
            server_key: server_key.public(),
            cipher: Cipher::Aes256Gcm,
            params: Vec::new(),
        },
        1,
        1,
    )
    .unwrap();
    assert!(!matches!(client.on_datagram(data), Ok(Progress::Established(_))));
});
