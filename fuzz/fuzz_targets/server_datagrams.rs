//! The server fed arbitrary datagrams from a few addresses, with time
//! passing: it never panics, everything it sends decodes, and it never
//! holds more connections than its limit.
//!
//! Input: records of [op: u8][who: u8][millis: u8][len: u8][bytes; len].
//! `op % 8` picks what goes in front of the bytes so the fuzzer gets past
//! the header checks: 0 nothing (raw bytes), 1 a valid hello, 2 a data
//! header, 3 a close, 4 a fetch, 5 a key query, 6 a protected datagram's
//! header, 7 a Noise hello's prefix (padded to 1200 bytes); `op / 8 % 4`
//! picks one of four connection ids, `who % 4` one of four source
//! addresses. The server has a key and takes plain clients too. Session
//! connections' data is released and their streams answered as an
//! application would.
#![no_main]
use std::net::SocketAddr;
use std::time::Duration;

use atou::fuzzing::crypto::{handshake, ServerAuth, StaticKeypair};
use atou::fuzzing::server::SessionEvent;
use atou::fuzzing::wire::VERSION;
use atou::fuzzing::wire::{
    Close, DataFlags, DataHeader, Fetch, Hello, Packet, ReceiverParams, ACK_MAX_LEN,
    CONTROL_MAX_LEN, DATA_HEADER_LEN,
};
use atou::{Server, ServerLimits, Time};
use libfuzzer_sys::fuzz_target;

fn word(b: &[u8], i: usize) -> u32 {
    u32::from(b.get(i).copied().unwrap_or(0))
}

fuzz_target!(|data: &[u8]| {
    // Plain hellos open connections without an address token (a fuzzer
    // cannot forge one), so the data, fetch and close paths are reached;
    // a hello past the 2 such connections gets a retry.
    let limits = ServerLimits::default()
        .max_rcvsegs(64)
        .max_connections(3)
        .unvalidated_plain(2);
    let mut server = Server::new(limits, 1 << 20, 2 << 20)
        .with_auth(ServerAuth {
            identity: Some(StaticKeypair::from_private([7; 32]).unwrap()),
            authorized: None,
            allow_plain: true,
        })
        .unwrap();
    let mut now = Time::ZERO;
    let mut out = [0u8; Server::MAX_TRANSMIT_LEN + ACK_MAX_LEN + CONTROL_MAX_LEN];
    let mut rest = data;
    while let [op, who, millis, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (body, next) = tail.split_at(n);
        rest = next;
        let conn_id = u64::from(op / 8 % 4);
        let mut dgram = vec![0u8; 64];
        let head = match op % 8 {
            1 => Hello {
                conn_id,
                mss: DATA_HEADER_LEN as u32 + 1 + word(body, 0) * 64,
                maxidle_ms: word(body, 1) * 100,
                // Some connections belong to a session: their data goes to
                // the application, which releases and replies below.
                session: u64::from(word(body, 6) % 2),
                receiver: ReceiverParams {
                    rcvsegs: word(body, 2),
                    rcvbuf: word(body, 3) << 12,
                    delack_us: word(body, 4) * 1000,
                    sack: word(body, 5) % 2 == 1,
                    quickack: (word(body, 7) % 40) as u16,
                },
            }
            .emit(&mut dgram)
            .unwrap(),
            2 => DataHeader {
                conn_id,
                seg: u64::from(word(body, 0) % 80),
                timestamp: 0,
                flags: DataFlags {
                    fin: word(body, 1) % 8 == 0,
                    retransmission: false,
                },
            }
            .emit(&mut dgram)
            .unwrap(),
            3 => Close {
                conn_id,
                segments: u64::from(word(body, 0)),
                bytes: 0,
            }
            .emit(&mut dgram)
            .unwrap(),
            4 => Fetch {
                conn_id,
                offset: word(body, 0) * 100,
            }
            .emit(&mut dgram)
            .unwrap(),
            5 => {
                dgram = handshake::key_query(conn_id);
                dgram.len()
            }
            6 | 7 => {
                dgram[..4].copy_from_slice(&[
                    b'A',
                    b'T',
                    VERSION,
                    if op % 8 == 6 { 0x42 } else { 0x20 },
                ]);
                dgram[4..12].copy_from_slice(&conn_id.to_be_bytes());
                12
            }
            _ => 0,
        };
        dgram.truncate(head);
        if op % 8 != 1 {
            dgram.extend_from_slice(body);
        }
        if op % 8 == 7 && dgram.len() < 1200 {
            dgram.resize(1200, 0);
        }
        now += Duration::from_millis(u64::from(*millis) * 20);
        let from = SocketAddr::from(([127, 0, 0, 1], 1000 + u16::from(who % 4)));
        if server.poll_timeout().is_some_and(|t| t <= now) {
            server.handle_timeout(now);
        }
        if let Some(a) = server.handle_datagram(now, from, &mut dgram) {
            assert_ne!(a.session, 0);
            if word(body, 7) % 2 == 1 {
                server.release(a.conn_id, a.offset + a.payload.len() as u64);
            }
        }
        while let Some(e) = server.poll_session_event() {
            if let SessionEvent::Complete { conn_id } = e {
                server.respond(conn_id, body.repeat(usize::from(*millis) % 40));
            }
        }
        while let Some((_, m)) = server.poll_transmit(now, &mut out) {
            // Handshake answers (0x20..) are the handshake's to parse.
            assert!(out[3] >= 0x20 || Packet::decode(&out[..m]).is_ok());
        }
        while server.poll_report().is_some() {}
        while server.poll_notice().is_some() {}
        assert!(server.open_connections() <= 3);
    }
});
