//! The sender fed arbitrary ACK datagrams between transmissions and
//! timeouts: it never panics and its invariants always hold.
//!
//! Input: records of [op: u8][len: u8][bytes; len]. op % 4: 0 transmit,
//! 1 an ACK body behind a valid header (this connection), 2 raw bytes,
//! 3 fire the next timer.
#![no_main]
use atou::fuzzing::wire::{MAGIC, VERSION};
use atou::fuzzing::Sender;
use atou::{PatternSource, RecoveryKind, Time, Tuning};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&kind, mut rest)) = data.split_first() else {
        return;
    };
    let tuning = Tuning {
        mss: 43,
        rcvwin: 32,
        recovery: RecoveryKind::ALL[usize::from(kind) % 4],
        ..Tuning::default()
    };
    let mut s = Sender::new(&tuning, 1, Some(10 * 300), Time::ZERO).expect("valid tuning");
    let mut now = Time::ZERO;
    let mut buf = vec![0u8; 64];
    while let [op, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (body, next) = tail.split_at(n);
        rest = next;
        now += std::time::Duration::from_micros(u64::from(*len) * 997);
        match op % 4 {
            0 => while s.poll_transmit(now, &mut buf, &mut PatternSource).is_some() {},
            1 => {
                let mut d = Vec::new();
                d.extend_from_slice(&MAGIC);
                d.extend_from_slice(&[VERSION, 2, 0, 0, 0, 0, 0, 0, 0, 1]);
                d.extend_from_slice(body);
                let _ = s.handle_datagram(now, &d);
            }
            2 => {
                let _ = s.handle_datagram(now, body);
            }
            _ => {
                if let Some(t) = s.poll_timeout() {
                    now = now.max(t);
                    s.handle_timeout(now);
                }
            }
        }
        while s.poll_event().is_some() {}
        if let Err(e) = s.check_invariants() {
            panic!("{e}");
        }
    }
});
