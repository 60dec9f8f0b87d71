//! A session client past its welcome, fed what a hostile server may send
//! while it fetches a reply: it never panics, and it never holds more for
//! the reply than its limit allows (plus the fragments kept ahead).
//!
//! Input: [limit: u16] then records of [op: u8][len: u8][bytes; len].
//! op % 3: 0 a reply fragment (offset and total from the first 8 bytes,
//! data the rest), 1 raw bytes, 2 time passes and the client transmits.
#![no_main]
use atou::fuzzing::wire::{Packet, ReceiverParams, Reply, Welcome};
use atou::{Client, PatternSource, Time, Tuning};
use libfuzzer_sys::fuzz_target;

const CONN: u64 = 5;

fuzz_target!(|data: &[u8]| {
    let [a, b, tail @ ..] = data else { return };
    let mut rest: &[u8] = tail;
    let limit = u32::from(u16::from_be_bytes([*a, *b])) * 16;
    let tuning = Tuning {
        mss: 200,
        ..Tuning::default()
    };
    let mut now = Time::ZERO;
    let mut c = Client::new(&tuning, CONN, Some(100), now)
        .expect("valid tuning")
        .with_session(9)
        .with_reply_limit(limit);
    let mut buf = vec![0u8; 2048];
    let welcome = Welcome {
        conn_id: CONN,
        receiver: ReceiverParams {
            rcvsegs: 8,
            rcvbuf: 1 << 20,
            delack_us: 0,
            quickack: 0,
            sack: true,
        },
    };
    let n = welcome.emit(&mut buf).expect("room");
    let _ = c.handle_datagram(now, &buf[..n]);
    while let [op, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (body, next) = tail.split_at(n);
        rest = next;
        match op % 3 {
            0 if body.len() >= 8 => {
                let offset = u32::from_be_bytes(body[..4].try_into().expect("4"));
                let total = u32::from_be_bytes(body[4..8].try_into().expect("4"));
                let fragment = Reply::Fragment {
                    conn_id: CONN,
                    offset,
                    total,
                    data: &body[8..],
                };
                if let Ok(n) = fragment.emit(&mut buf) {
                    if Packet::decode(&buf[..n]).is_ok() {
                        let _ = c.handle_datagram(now, &buf[..n]);
                    }
                }
            }
            1 => {
                let _ = c.handle_datagram(now, body);
            }
            _ => {
                now += std::time::Duration::from_millis(u64::from(*len));
                c.handle_timeout(now);
                while c.poll_transmit(now, &mut buf, &mut PatternSource).is_some() {}
            }
        }
        assert!(c.reply_bytes_held() <= 2 * limit as usize + (400 << 10));
    }
});
