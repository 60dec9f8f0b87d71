//! Seal and open 1400-byte datagrams (a 33-byte header as associated data,
//! a nonce from a 64-bit packet number XOR a 96-bit IV, as atou will) with
//! AES-256-GCM and ChaCha20-Poly1305 from ring, RustCrypto and, with
//! `--features aws-lc`, aws-lc-rs. Prints GB/s of payload and ns/packet for
//! sealing and for opening (the opened packet is checked, so nothing is
//! optimised away).
//!
//! Run alone on an idle machine: `cargo run --release [--features aws-lc]`.

use std::hint::black_box;
use std::time::{Duration, Instant};

const PAYLOAD: usize = 1400;
const HEADER: usize = 33;
const TAG: usize = 16;
const PACKETS: u64 = 100_000;
const ROUNDS: usize = 5;

/// One implementation of one cipher: seal `buf[..PAYLOAD]` in place and
/// write the tag after it; open `buf[..PAYLOAD + TAG]` in place.
trait Aead {
    fn seal(&self, nonce: [u8; 12], aad: &[u8], buf: &mut [u8]);
    fn open(&self, nonce: [u8; 12], aad: &[u8], buf: &mut [u8]) -> bool;
}

fn nonce(iv: &[u8; 12], pn: u64) -> [u8; 12] {
    let mut n = *iv;
    for (b, p) in n[4..].iter_mut().zip(pn.to_be_bytes()) {
        *b ^= p;
    }
    n
}

macro_rules! ring_like {
    ($name:ident, $krate:ident) => {
        struct $name($krate::aead::LessSafeKey);
        impl $name {
            fn new(alg: &'static $krate::aead::Algorithm, key: &[u8; 32]) -> Self {
                $name($krate::aead::LessSafeKey::new(
                    $krate::aead::UnboundKey::new(alg, key).unwrap(),
                ))
            }
        }
        impl Aead for $name {
            fn seal(&self, nonce: [u8; 12], aad: &[u8], buf: &mut [u8]) {
                let (data, tag_out) = buf.split_at_mut(PAYLOAD);
                let tag = self
                    .0
                    .seal_in_place_separate_tag(
                        $krate::aead::Nonce::assume_unique_for_key(nonce),
                        $krate::aead::Aad::from(aad),
                        data,
                    )
                    .unwrap();
                tag_out[..TAG].copy_from_slice(tag.as_ref());
            }
            fn open(&self, nonce: [u8; 12], aad: &[u8], buf: &mut [u8]) -> bool {
                self.0
                    .open_in_place(
                        $krate::aead::Nonce::assume_unique_for_key(nonce),
                        $krate::aead::Aad::from(aad),
                        buf,
                    )
                    .is_ok()
            }
        }
    };
}

ring_like!(Ring, ring);
#[cfg(feature = "aws-lc")]
ring_like!(AwsLc, aws_lc_rs);

struct Rc<A>(A);
impl<A: aes_gcm::aead::AeadInPlace> Aead for Rc<A> {
    fn seal(&self, nonce: [u8; 12], aad: &[u8], buf: &mut [u8]) {
        let (data, tag_out) = buf.split_at_mut(PAYLOAD);
        let tag = self
            .0
            .encrypt_in_place_detached(aes_gcm::aead::Nonce::<A>::from_slice(&nonce), aad, data)
            .unwrap();
        tag_out[..TAG].copy_from_slice(&tag);
    }
    fn open(&self, nonce: [u8; 12], aad: &[u8], buf: &mut [u8]) -> bool {
        let (data, tag) = buf.split_at_mut(PAYLOAD);
        let tag = aes_gcm::aead::Tag::<A>::clone_from_slice(&tag[..TAG]);
        self.0
            .decrypt_in_place_detached(aes_gcm::aead::Nonce::<A>::from_slice(&nonce), aad, data, &tag)
            .is_ok()
    }
}

/// Best of ROUNDS: (seal time, open time) for PACKETS packets. Opens work
/// on a copy of 64 sealed packets; the time of the copies alone is
/// measured and subtracted.
fn measure(a: &dyn Aead) -> (Duration, Duration) {
    let iv = [7u8; 12];
    let mut header = [0x5au8; HEADER];
    let mut packets = vec![[0u8; PAYLOAD + TAG]; 64];
    for (i, p) in packets.iter_mut().enumerate() {
        p.iter_mut().enumerate().for_each(|(j, b)| *b = (i * 31 + j) as u8);
    }
    let mut work = [0u8; PAYLOAD + TAG];
    let (mut best_seal, mut best_open) = (Duration::MAX, Duration::MAX);
    for round in 0..ROUNDS as u64 {
        let base = round * PACKETS;
        let t = Instant::now();
        for pn in base..base + PACKETS {
            header[1..9].copy_from_slice(&pn.to_be_bytes());
            let p = &mut packets[(pn % 64) as usize];
            a.seal(nonce(&iv, pn), &header, black_box(p));
        }
        best_seal = best_seal.min(t.elapsed());
        // packets[i] now holds the packet numbered last + 1 - 64 + i.
        let first = base + PACKETS - 64;
        let t = Instant::now();
        for i in 0..PACKETS {
            let pn = first + (i % 64);
            work.copy_from_slice(&packets[(pn % 64) as usize]);
            black_box(&mut work);
        }
        let copies = t.elapsed();
        let t = Instant::now();
        let mut ok = 0u64;
        for i in 0..PACKETS {
            let pn = first + (i % 64);
            header[1..9].copy_from_slice(&pn.to_be_bytes());
            work.copy_from_slice(&packets[(pn % 64) as usize]);
            ok += a.open(nonce(&iv, pn), &header, black_box(&mut work)) as u64;
        }
        let open = t.elapsed().saturating_sub(copies);
        assert_eq!(ok, PACKETS, "open failed");
        best_open = best_open.min(open);
    }
    (best_seal, best_open)
}

fn report(name: &str, a: &dyn Aead) {
    let (seal, open) = measure(a);
    let per = |d: Duration| d.as_nanos() as f64 / PACKETS as f64;
    let gbps = |d: Duration| (PACKETS as f64 * PAYLOAD as f64) / d.as_secs_f64() / 1e9;
    println!(
        "{name:<34} seal {:6.2} GB/s {:7.0} ns/pkt   open {:6.2} GB/s {:7.0} ns/pkt",
        gbps(seal),
        per(seal),
        gbps(open),
        per(open)
    );
}

fn main() {
    use aes_gcm::KeyInit;
    let key = [0x42u8; 32];
    println!("{PAYLOAD}-byte payload, {HEADER}-byte header as AAD, {PACKETS} packets, best of {ROUNDS}");
    report("ring AES-256-GCM", &Ring::new(&ring::aead::AES_256_GCM, &key));
    report("ring ChaCha20-Poly1305", &Ring::new(&ring::aead::CHACHA20_POLY1305, &key));
    #[cfg(feature = "aws-lc")]
    {
        report("aws-lc-rs AES-256-GCM", &AwsLc::new(&aws_lc_rs::aead::AES_256_GCM, &key));
        report(
            "aws-lc-rs ChaCha20-Poly1305",
            &AwsLc::new(&aws_lc_rs::aead::CHACHA20_POLY1305, &key),
        );
    }
    report(
        "RustCrypto aes-gcm AES-256-GCM",
        &Rc(aes_gcm::Aes256Gcm::new(&key.into())),
    );
    report(
        "RustCrypto chacha20poly1305",
        &Rc(chacha20poly1305::ChaCha20Poly1305::new(&key.into())),
    );
}
