//! The receiver fed an arbitrary sequence of datagrams: it never panics,
//! holds at most rcvsegs segments, and every ACK it sends decodes.
//!
//! Input: records of [flags: u8][len: u8][bytes; len]. Flag bit 0 puts a
//! valid data header (this connection) in front of the bytes so the fuzzer
//! reaches past the header checks; bit 1 reads what is in order; bit 2
//! fires the delayed-ACK timer.
#![no_main]
use std::time::Duration;

use atou::fuzzing::wire::{Packet, ACK_MAX_LEN, MAGIC, VERSION};
use atou::fuzzing::{Receiver, ReceiverConfig};
use atou::Time;
use libfuzzer_sys::fuzz_target;

const RCVSEGS: u32 = 16;

fuzz_target!(|data: &[u8]| {
    let mut r = Receiver::new(
        ReceiverConfig {
            sack: true,
            delack: Duration::from_millis(40),
            rcvsegs: RCVSEGS,
            quickack: 4,
        },
        1,
    );
    let mut now = Time::ZERO;
    let mut rest = data;
    let mut out = [0u8; ACK_MAX_LEN];
    while let [flags, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (body, next) = tail.split_at(n);
        rest = next;
        let mut dgram = Vec::new();
        if flags & 1 != 0 {
            dgram.extend_from_slice(&MAGIC);
            dgram.extend_from_slice(&[VERSION, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        }
        dgram.extend_from_slice(body);
        let _ = r.handle_datagram(now, &dgram);
        now += Duration::from_millis(u64::from(*len % 50));
        if flags & 4 != 0 {
            r.handle_timeout(now);
        }
        if flags & 2 != 0 {
            while r.read().is_some() {}
        }
        while let Some(n) = r.poll_transmit(now, &mut out) {
            assert!(matches!(Packet::decode(&out[..n]), Ok(Packet::Ack(_))));
        }
        assert!(r.window() <= RCVSEGS);
    }
});
