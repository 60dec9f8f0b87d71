//! The decryptor: arbitrary (packet number, key phase, header, sealed
//! bytes) records to an opener whose keys the fuzzer does not know, mixed
//! with genuine packets from the matching sealer.
//!
//! The oracle: nothing panics; no forged record opens; every genuine
//! packet opens exactly once whatever the forgeries before it.
//!
//! Input: records of [op: u8][pn: 8 bytes][len: u8][bytes; len]; `op % 2`:
//! 0 a forgery, 1 the next genuine packet (its payload the bytes).
#![no_main]
use atou::fuzzing::crypto::protect::{Cipher, Opener, Sealer, TrafficSecret};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let cipher = if data.first().is_some_and(|b| b & 0x80 != 0) {
        Cipher::ChaCha20Poly1305
    } else {
        Cipher::Aes256Gcm
    };
    let mut sealer = Sealer::with_interval(cipher, TrafficSecret::new([3; 32]), 4);
    let mut opener = Opener::new(cipher, TrafficSecret::new([3; 32]));
    let mut rest = data;
    while let [op, tail @ ..] = rest {
        let Some((pn, tail)) = tail.split_first_chunk::<8>() else {
            break;
        };
        let Some((len, tail)) = tail.split_first() else {
            break;
        };
        let n = usize::from(*len).min(tail.len());
        let (body, next) = tail.split_at(n);
        rest = next;
        if op % 2 == 0 {
            let mut buf = body.to_vec();
            let r = opener.open_in_place(u64::from_be_bytes(*pn), op & 2 != 0, &[*op], &mut buf);
            assert!(r.is_err(), "a forgery opened");
        } else {
            let slot = sealer.next_slot().unwrap();
            let (pn, phase) = (slot.pn(), slot.key_phase());
            let header = pn.to_be_bytes();
            let mut buf = body.to_vec();
            buf.resize(body.len() + sealer.tag_len(), 0);
            sealer.seal_in_place(slot, &header, &mut buf).unwrap();
            let mut copy = buf.clone();
            match opener.open_in_place(pn, phase, &header, &mut buf) {
                Ok(plain) => assert_eq!(plain, body),
                // Forgeries never authenticate, so they never move the
                // replay window or the key phase: a genuine packet opens.
                Err(e) => panic!("genuine packet {pn} dropped: {e}"),
            }
            assert!(opener.open_in_place(pn, phase, &header, &mut copy).is_err());
        }
    }
});
