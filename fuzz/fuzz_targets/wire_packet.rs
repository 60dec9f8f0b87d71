//! Any datagram: decoding never panics, and what decodes re-encodes to the
//! same bytes.
#![no_main]
use atou::fuzzing::wire::{hello_token, Packet, ACK_MAX_LEN, CONTROL_MAX_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match Packet::decode(data) {
        Ok(Packet::Ack(ack)) => {
            let mut buf = [0u8; ACK_MAX_LEN];
            let n = ack.emit(&mut buf).expect("fits");
            assert_eq!(&buf[..n], data);
        }
        Ok(Packet::Reply(reply)) => {
            let mut buf = vec![0u8; data.len()];
            let n = reply.emit(&mut buf).expect("fits");
            assert_eq!(&buf[..n], data);
        }
        Ok(Packet::Data(seg)) => {
            let mut buf = vec![0u8; data.len()];
            let n = seg.header.emit(&mut buf).expect("fits");
            buf[n..].copy_from_slice(seg.payload);
            assert_eq!(buf, data);
        }
        Ok(Packet::SizeProbe(probe)) => {
            // Padded to the size it tests: longer than any control packet.
            let mut buf = vec![0u8; data.len()];
            let n = probe.emit(&mut buf).expect("fits");
            assert_eq!(&buf[..n], data);
        }
        Ok(control) => {
            let mut buf = [0u8; CONTROL_MAX_LEN];
            let n = match control {
                // A plain hello may carry an address token after it.
                Packet::Hello(p) => p.emit_with_token(hello_token(data).as_ref(), &mut buf),
                Packet::Welcome(p) => p.emit(&mut buf),
                Packet::Close(p) => p.emit(&mut buf),
                Packet::CloseAck(p) => p.emit(&mut buf),
                Packet::Reject(p) => p.emit(&mut buf),
                Packet::Fetch(p) => p.emit(&mut buf),
                Packet::PathChallenge(p) => p.emit_challenge(&mut buf),
                Packet::PathResponse(p) => p.emit_response(&mut buf),
                Packet::Retry(p) => p.emit(&mut buf),
                Packet::SizeAck(p) => p.emit(&mut buf),
                Packet::Ack(_) | Packet::Data(_) | Packet::Reply(_) | Packet::SizeProbe(_) => {
                    unreachable!()
                }
            }
            .expect("fits");
            assert_eq!(&buf[..n], data);
        }
        Err(_) => {}
    }
});
