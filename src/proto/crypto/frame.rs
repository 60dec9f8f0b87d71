//! A protected datagram: the one layout every packet after the handshake
//! has, and the one place it is sealed and opened.
//!
//! ```text
//! 0      2        3             4               12                 20
//! | "AT" | version | kind | 0x40 | recipient id | key phase | pn    | ciphertext of the inner body | tag |
//!  \___________________ associated data (20 bytes) _______________/
//! ```
//!
//! The inner packet is today's cleartext packet ([`super::super::wire`]):
//! a 12-byte header (magic, version, kind, connection id) and a body. Its
//! body is encrypted; its kind travels in clear with [`PROTECTED`] set; the
//! connection id field names the *recipient's* id for the connection
//! (the server's id one way, the client's the other: WireGuard's receiver
//! index), so the server finds the keys without trusting the address. The
//! packet number (62 bits) and the key phase (the top bit) follow
//! (RFC 9001 §5.3: the nonce is the packet number XOR the IV; §6 key
//! phase). Everything before the ciphertext is associated data.
//!
//! Sealing expects the inner packet written at `buf[PN_LEN..]`, so the
//! body is already where the ciphertext goes: no copy. Opening rewrites
//! the clear header in place into the inner packet's header, so the
//! decoders see exactly what an unprotected peer would have sent.

use std::ops::Range;

use super::protect::{BadTag, Dropped, OpenTicket, Opener, SealError, SealTicket, Sealer};
use crate::proto::wire::{HEADER_LEN, MAGIC};

/// Set in the kind byte of a protected datagram.
pub const PROTECTED: u8 = 0x40;
/// The packet number field.
pub const PN_LEN: usize = 8;
/// Associated data: the clear header and the packet number.
pub const AAD_LEN: usize = HEADER_LEN + PN_LEN;
const KEY_PHASE_BIT: u64 = 1 << 63;

/// Bytes protection adds to a packet with a tag of `tag_len` bytes.
pub const fn overhead(tag_len: usize) -> usize {
    PN_LEN + tag_len
}

/// Whether `datagram` claims to be protected (nothing is checked yet).
pub fn is_protected(datagram: &[u8]) -> bool {
    datagram.len() >= AAD_LEN && datagram[0..2] == MAGIC && datagram[3] & PROTECTED != 0
}

/// Seals the inner packet of `inner_len` bytes written at
/// `buf[PN_LEN..]`, for the peer that knows the connection as
/// `recipient_id`. Returns the datagram's length; `buf` must hold
/// `inner_len + overhead(tag_len)` bytes. [`prepare`] and
/// [`SealJob::seal`] at once.
pub fn seal(
    sealer: &mut Sealer,
    recipient_id: u64,
    buf: &mut [u8],
    inner_len: usize,
) -> Result<usize, SealError> {
    let job = prepare(sealer, recipient_id, buf, inner_len)?;
    let total = job.len();
    job.seal(buf)?;
    Ok(total)
}

/// The first half of [`seal`], the half that must stay in order on the
/// protocol's side: takes the packet number (and with it the key
/// generation, so the key update and the integrity limit count every
/// packet) and writes the clear header. The body is still plaintext
/// until the returned job seals it; until then the datagram must not
/// leave.
pub fn prepare(
    sealer: &mut Sealer,
    recipient_id: u64,
    buf: &mut [u8],
    inner_len: usize,
) -> Result<SealJob, SealError> {
    debug_assert!(inner_len >= HEADER_LEN);
    let total = inner_len + overhead(sealer.tag_len());
    debug_assert!(buf.len() >= total);
    let ticket = sealer.next_ticket()?;
    // Magic, version and kind of the inner header move to the front.
    buf.copy_within(PN_LEN..PN_LEN + 4, 0);
    buf[3] |= PROTECTED;
    buf[4..12].copy_from_slice(&recipient_id.to_be_bytes());
    let phase = if ticket.key_phase() { KEY_PHASE_BIT } else { 0 };
    buf[12..AAD_LEN].copy_from_slice(&(ticket.pn() | phase).to_be_bytes());
    Ok(SealJob { ticket, total })
}

/// A datagram [`prepare`]d and not yet sealed: its length and the ticket
/// of its packet number. Sealing it needs nothing from the endpoint, so
/// the I/O layer may do it on another thread.
#[derive(Debug)]
pub struct SealJob {
    ticket: SealTicket,
    total: usize,
}

impl SealJob {
    /// The datagram's length once sealed (tag included).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.total
    }

    /// Seals the prepared datagram, `datagram[..self.len()]`, in place.
    pub fn seal(self, datagram: &mut [u8]) -> Result<(), SealError> {
        let (aad, rest) = datagram[..self.total].split_at_mut(AAD_LEN);
        self.ticket.seal_in_place(aad, rest)
    }
}

/// The packet number a protected datagram claims (unauthenticated until
/// it opens; see [`is_protected`]).
pub fn packet_number(datagram: &[u8]) -> u64 {
    u64::from_be_bytes(datagram[12..AAD_LEN].try_into().expect("8 bytes")) & !KEY_PHASE_BIT
}

/// The recipient id of a protected datagram (see [`is_protected`]).
pub fn recipient_id(datagram: &[u8]) -> u64 {
    u64::from_be_bytes(datagram[4..12].try_into().expect("8 bytes"))
}

/// Opens a protected datagram in place. On success returns where the
/// inner packet now is in `datagram`, its header carrying `inner_id` as
/// its connection id. A datagram that fails is counted by `opener` and
/// must be dropped unanswered. [`open_ticket`], [`open_with`] and
/// [`Opener::settle`] at once.
pub fn open(
    opener: &mut Opener,
    inner_id: u64,
    datagram: &mut [u8],
) -> Result<Range<usize>, Dropped> {
    let ticket = open_ticket(opener, datagram)?;
    let opened = open_with(&ticket, inner_id, datagram);
    opener.settle(ticket, opened.is_ok())?;
    opened.map_err(|_| Dropped::BadTag)
}

/// The opener's checks on a protected datagram's clear header (length,
/// replay window, key phase) and the key to open it with.
pub fn open_ticket(opener: &mut Opener, datagram: &[u8]) -> Result<OpenTicket, Dropped> {
    if datagram.len() < AAD_LEN {
        return Err(Dropped::TooShort);
    }
    let field = u64::from_be_bytes(datagram[12..AAD_LEN].try_into().expect("8 bytes"));
    opener.ticket(
        field & !KEY_PHASE_BIT,
        field & KEY_PHASE_BIT != 0,
        datagram.len() - AAD_LEN,
    )
}

/// Opens `datagram` under `ticket`'s key, as [`open`] does, without the
/// opener: the bytes only. The opener must [`settle`](Opener::settle)
/// the ticket before the inner packet is used.
pub fn open_with(
    ticket: &OpenTicket,
    inner_id: u64,
    datagram: &mut [u8],
) -> Result<Range<usize>, BadTag> {
    let (aad, body) = datagram.split_at_mut(AAD_LEN);
    let plain = ticket.open_in_place(aad, body)?.len();
    // The inner header, rebuilt just before the plaintext body.
    datagram.copy_within(0..4, PN_LEN);
    datagram[PN_LEN + 3] &= !PROTECTED;
    datagram[PN_LEN + 4..AAD_LEN].copy_from_slice(&inner_id.to_be_bytes());
    Ok(PN_LEN..AAD_LEN + plain)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::crypto::protect::{Cipher, TrafficSecret};
    use crate::proto::wire::{Ack, Packet};

    fn pair(interval: u64) -> (Sealer, Opener) {
        let secret = TrafficSecret::new([7; 32]);
        (
            Sealer::with_interval(Cipher::Aes256Gcm, secret.clone(), interval),
            Opener::new(Cipher::Aes256Gcm, secret),
        )
    }

    fn sealed_ack(sealer: &mut Sealer, cum_ack: u64) -> Vec<u8> {
        let mut buf = vec![0u8; 256];
        let n = Ack::new(5, 9, cum_ack, 64)
            .emit(&mut buf[PN_LEN..])
            .unwrap();
        let len = seal(sealer, 0xAB, &mut buf, n).unwrap();
        buf.truncate(len);
        buf
    }

    #[test]
    fn a_sealed_packet_opens_to_the_inner_packet_under_the_inner_id() {
        let (mut sealer, mut opener) = pair(1 << 20);
        let mut d = sealed_ack(&mut sealer, 77);
        assert!(is_protected(&d));
        assert_eq!(recipient_id(&d), 0xAB);
        let r = open(&mut opener, 5, &mut d).unwrap();
        match Packet::decode(&d[r]).unwrap() {
            Packet::Ack(a) => {
                assert_eq!((a.conn_id, a.cum_ack, a.echo_timestamp), (5, 77, 9));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_is_dropped_and_a_replay_too() {
        let (mut sealer, mut opener) = pair(1 << 20);
        let d = sealed_ack(&mut sealer, 1);
        for bit in 0..d.len() * 8 {
            let mut bad = d.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            // The magic and kind bits only make it not ours; every other
            // bit fails authentication.
            assert!(open(&mut opener, 5, &mut bad).is_err(), "bit {bit}");
        }
        let mut good = d.clone();
        assert!(open(&mut opener, 5, &mut good).is_ok());
        let mut again = d;
        assert_eq!(open(&mut opener, 5, &mut again), Err(Dropped::Replayed));
        assert_eq!(opener.counters().replayed, 1);
    }

    #[test]
    fn the_key_phase_travels_in_the_header_across_updates() {
        let (mut sealer, mut opener) = pair(3);
        for k in 0..10 {
            let mut d = sealed_ack(&mut sealer, k);
            assert!(open(&mut opener, 5, &mut d).is_ok(), "packet {k}");
        }
        assert!(opener.generation() >= 3);
    }
}
