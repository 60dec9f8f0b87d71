//! Packet protection: every datagram after the handshake is sealed with an
//! AEAD under a per-direction key, the header as associated data and a
//! nonce made of the packet number.
//!
//! - Nonce: the 64-bit packet number, big-endian, left-padded to 96 bits
//!   and XORed with a per-direction IV (RFC 9001 §5.3, RFC 8446 §5.3;
//!   WireGuard uses the counter alone). A [`Sealer`] hands out each packet
//!   number once, as a [`Slot`] that sealing consumes, so no nonce repeats
//!   under a key.
//! - Key update (RFC 9001 §6): after [`KEY_UPDATE_INTERVAL`] packets under
//!   one key the sealer moves to the next, derived from the current
//!   traffic secret with HKDF-SHA256 (RFC 5869, from ring), and flips the
//!   key phase bit that the header carries; the [`Opener`] follows the bit.
//!   The IV stays (as in QUIC): packet numbers keep rising across updates.
//! - Replay: the opener refuses a packet number it accepted before or one
//!   too old ([`ReplayWindow`], RFC 6479), and records a number only after
//!   its packet authenticated.
//! - [`Protection::Null`]: no encryption, tag length 0, no replay window,
//!   the same interface, so the simulator and the papers' scenarios keep
//!   their bytes.
//!
//! Failures are counted ([`DropCounters`]) and the packet dropped; nothing
//! is ever answered.

use std::fmt;
use std::sync::Arc;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey, NONCE_LEN};
use ring::hkdf;
use thiserror::Error;
use zeroize::Zeroize;

use super::replay::{Refused, ReplayWindow};
use crate::proto::tuning::named_enum;

/// Bytes of the authentication tag of both AEADs.
pub const TAG_LEN: usize = 16;

/// Packets sealed under one key before the next key takes over.
///
/// RFC 9001 §6.6: AES-GCM's confidentiality limit is 2^23 full-size
/// packets; ChaCha20-Poly1305's is beyond any packet count. One interval
/// for both keeps the schedule simple: at 1400 bytes a key protects about
/// 11 GiB, so a 100 GB transfer updates its keys about 9 times.
pub const KEY_UPDATE_INTERVAL: u64 = 1 << 23;

/// Highest packet number a sealer hands out (QUIC's 2^62 − 1, RFC 9000
/// §12.3). Unreachable in practice (10^9 packets a second for 146 years);
/// a connection there must close rather than wrap.
pub const MAX_PACKET_NUMBER: u64 = (1 << 62) - 1;

named_enum! {
    /// An AEAD for packet protection.
    pub enum Cipher {
        /// AES-256 in Galois/Counter Mode (RFC 5116): fastest where the
        /// CPU has AES instructions.
        Aes256Gcm = "aes-256-gcm",
        /// ChaCha20-Poly1305 (RFC 8439): fastest in software.
        ChaCha20Poly1305 = "chacha20-poly1305",
    }
}

impl Cipher {
    /// AES-256-GCM where the CPU has AES and carry-less multiply
    /// instructions, ChaCha20-Poly1305 otherwise (the figures
    /// are in docs/security.md).
    pub fn for_this_cpu() -> Cipher {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("aes")
                && std::arch::is_x86_feature_detected!("pclmulqdq")
            {
                return Cipher::Aes256Gcm;
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("aes")
                && std::arch::is_aarch64_feature_detected!("pmull")
            {
                return Cipher::Aes256Gcm;
            }
        }
        Cipher::ChaCha20Poly1305
    }

    /// Failed openings after which a connection must close (RFC 9001
    /// §6.6): 2^52 for AES-GCM, 2^36 for ChaCha20-Poly1305.
    pub(crate) fn integrity_limit(self) -> u64 {
        match self {
            Cipher::Aes256Gcm => 1 << 52,
            Cipher::ChaCha20Poly1305 => 1 << 36,
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

/// A `--cipher` that names none; the name is held escaped, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown cipher `{0}`: aes-256-gcm, chacha20-poly1305 or auto")]
pub struct UnknownCipher(String);

impl std::str::FromStr for Cipher {
    type Err = UnknownCipher;

    /// `--cipher`: `aes-256-gcm`, `chacha20-poly1305` (or `aes`, `chacha`),
    /// or `auto` ([`Cipher::for_this_cpu`]); names in lower case only.
    fn from_str(s: &str) -> Result<Cipher, UnknownCipher> {
        let alias = match s {
            "aes" => Some(Cipher::Aes256Gcm),
            "chacha" => Some(Cipher::ChaCha20Poly1305),
            "auto" => Some(Cipher::for_this_cpu()),
            _ => None,
        };
        alias
            .or_else(|| Cipher::ALL.into_iter().find(|c| c.name() == s))
            .ok_or_else(|| UnknownCipher(crate::util::text::escape(s.as_bytes())))
    }
}

/// How one connection protects its packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protection {
    /// No encryption, no tag: the simulator and the papers' runs.
    Null,
    Aead(Cipher),
}

impl Protection {
    /// Bytes the protection adds to a packet.
    pub fn tag_len(self) -> usize {
        match self {
            Protection::Null => 0,
            Protection::Aead(_) => TAG_LEN,
        }
    }
}

/// The secret of one direction of a connection, from the handshake's
/// Split() (Noise spec §5.2). Keys and the IV derive from it; it is wiped
/// when dropped and never printed.
#[derive(Clone)]
pub struct TrafficSecret([u8; 32]);

impl Drop for TrafficSecret {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl TrafficSecret {
    pub fn new(bytes: [u8; 32]) -> TrafficSecret {
        TrafficSecret(bytes)
    }

    /// The secret of the next key phase (RFC 9001 §6.1 derives it with the
    /// label "quic ku"; ours is "atou ku").
    fn next(&self) -> TrafficSecret {
        let mut out = [0u8; 32];
        expand(&self.0, b"atou ku", &mut out);
        TrafficSecret(out)
    }
}

impl fmt::Debug for TrafficSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TrafficSecret(..)")
    }
}

/// HKDF-Expand (RFC 5869 §2.3) with SHA-256 of a 32-byte secret that is
/// already uniformly random (the Noise split output or an expansion of
/// it), as TLS 1.3's HKDF-Expand-Label is applied to its secrets.
fn expand(secret: &[u8; 32], label: &[u8], out: &mut [u8]) {
    struct Len(usize);
    impl hkdf::KeyType for Len {
        fn len(&self) -> usize {
            self.0
        }
    }
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let info = [label];
    // Cannot fail: the output is far below HKDF's 255 × 32-byte limit.
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF output within its limit");
}

/// The AEAD key and IV of one key phase: `(key, iv)` bytes. Pure; the
/// property tests use it to check that no (key, nonce) pair repeats.
pub(crate) fn key_material(
    secret: &TrafficSecret,
    cipher: Cipher,
    iv_from: &TrafficSecret,
) -> ([u8; 32], [u8; NONCE_LEN]) {
    let mut key = [0u8; 32];
    let mut label = b"atou key ".to_vec();
    label.extend_from_slice(cipher.name().as_bytes());
    expand(&secret.0, &label, &mut key);
    let mut iv = [0u8; NONCE_LEN];
    expand(&iv_from.0, b"atou iv", &mut iv);
    (key, iv)
}

/// One key phase of one direction: sealing and opening are pure functions
/// of this key, a packet number, the header and the bytes.
pub struct PacketKey {
    cipher: Cipher,
    key: LessSafeKey,
    iv: [u8; NONCE_LEN],
}

impl fmt::Debug for PacketKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PacketKey")
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

/// The tag did not verify: the packet was forged, corrupted, or sealed
/// under another key or packet number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("the packet failed authentication")]
pub struct BadTag;

impl PacketKey {
    /// The key of `secret`'s phase, with the IV of the direction's first
    /// secret `iv_from`.
    pub fn new(cipher: Cipher, secret: &TrafficSecret, iv_from: &TrafficSecret) -> PacketKey {
        let (mut key, iv) = key_material(secret, cipher, iv_from);
        // Cannot fail: both AEADs take 32-byte keys.
        let unbound = UnboundKey::new(cipher.algorithm(), &key).expect("32-byte AEAD key");
        key.zeroize();
        PacketKey {
            cipher,
            key: LessSafeKey::new(unbound),
            iv,
        }
    }

    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// RFC 9001 §5.3: the packet number, left-padded to the IV's length,
    /// XORed with the IV.
    fn nonce(&self, pn: u64) -> Nonce {
        let mut n = self.iv;
        for (b, p) in n[NONCE_LEN - 8..].iter_mut().zip(pn.to_be_bytes()) {
            *b ^= p;
        }
        Nonce::assume_unique_for_key(n)
    }

    /// Seals `in_out[..in_out.len() - TAG_LEN]` in place and writes the tag
    /// into its last [`TAG_LEN`] bytes. The caller guarantees that `pn` was
    /// never sealed under this key ([`Sealer`] does).
    pub fn seal_in_place(
        &self,
        pn: u64,
        header: &[u8],
        in_out: &mut [u8],
    ) -> Result<(), SealError> {
        let len = in_out
            .len()
            .checked_sub(TAG_LEN)
            .ok_or(SealError::NoRoomForTag)?;
        let (data, tag_out) = in_out.split_at_mut(len);
        let tag = self
            .key
            .seal_in_place_separate_tag(self.nonce(pn), Aad::from(header), data)
            .map_err(|_| SealError::TooLong)?;
        tag_out.copy_from_slice(tag.as_ref());
        Ok(())
    }

    /// `payload` sealed: ciphertext followed by the tag.
    pub fn seal(&self, pn: u64, header: &[u8], payload: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut out = Vec::with_capacity(payload.len() + TAG_LEN);
        out.extend_from_slice(payload);
        out.resize(payload.len() + TAG_LEN, 0);
        self.seal_in_place(pn, header, &mut out)?;
        Ok(out)
    }

    /// Opens ciphertext-and-tag in place; the plaintext is the returned
    /// prefix. On failure the contents of `in_out` are unspecified.
    pub fn open_in_place<'a>(
        &self,
        pn: u64,
        header: &[u8],
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], BadTag> {
        if in_out.len() < TAG_LEN {
            return Err(BadTag);
        }
        self.key
            .open_in_place(self.nonce(pn), Aad::from(header), in_out)
            .map_err(|_| BadTag)
    }
}

/// Why a packet could not be sealed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum SealError {
    #[error("the buffer has no room for the {TAG_LEN}-byte tag")]
    NoRoomForTag,
    #[error("the packet is longer than the AEAD can seal")]
    TooLong,
    #[error("the slot was taken under a key that has since been updated")]
    StaleSlot,
    #[error("the connection has used every packet number; it must close")]
    Exhausted,
}

/// One packet number, handed out once by [`Sealer::next_slot`] and
/// consumed by [`Sealer::seal_in_place`]: not `Clone`, so a number cannot
/// be sealed twice. The header written for it carries
/// [`pn`](Self::pn) and [`key_phase`](Self::key_phase).
#[derive(Debug, PartialEq, Eq)]
pub struct Slot {
    pn: u64,
    key_phase: bool,
    generation: u64,
}

impl Slot {
    pub fn pn(&self) -> u64 {
        self.pn
    }

    pub fn key_phase(&self) -> bool {
        self.key_phase
    }
}

/// The sending half of a direction: hands out packet numbers, seals, and
/// updates its key every `interval` packets.
#[derive(Debug)]
pub struct Sealer {
    next_pn: u64,
    state: Option<SealKeys>,
}

#[derive(Debug)]
struct SealKeys {
    /// Shared with the [`SealTicket`]s still to be sealed under it.
    key: Arc<PacketKey>,
    secret: TrafficSecret,
    iv_from: TrafficSecret,
    generation: u64,
    sealed_under_key: u64,
    interval: u64,
}

impl Sealer {
    /// A sealer for [`Protection::Null`]: packet numbers, no encryption.
    pub fn null() -> Sealer {
        Sealer {
            next_pn: 0,
            state: None,
        }
    }

    pub fn new(cipher: Cipher, secret: TrafficSecret) -> Sealer {
        Sealer::with_interval(cipher, secret, KEY_UPDATE_INTERVAL)
    }

    /// A sealer that updates its key every `interval` packets (at most
    /// [`KEY_UPDATE_INTERVAL`]; tests use a few).
    pub fn with_interval(cipher: Cipher, secret: TrafficSecret, interval: u64) -> Sealer {
        Sealer {
            next_pn: 0,
            state: Some(SealKeys {
                key: Arc::new(PacketKey::new(cipher, &secret, &secret)),
                iv_from: secret.clone(),
                secret,
                generation: 0,
                sealed_under_key: 0,
                interval: interval.clamp(1, KEY_UPDATE_INTERVAL),
            }),
        }
    }

    pub fn protection(&self) -> Protection {
        match &self.state {
            None => Protection::Null,
            Some(s) => Protection::Aead(s.key.cipher()),
        }
    }

    pub fn tag_len(&self) -> usize {
        self.protection().tag_len()
    }

    /// Key updates so far.
    pub fn generation(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.generation)
    }

    /// The next packet number, after a key update if the current key has
    /// sealed its interval (RFC 9001 §6.6).
    pub fn next_slot(&mut self) -> Result<Slot, SealError> {
        if self.next_pn > MAX_PACKET_NUMBER {
            return Err(SealError::Exhausted);
        }
        let pn = self.next_pn;
        self.next_pn += 1;
        let Some(s) = &mut self.state else {
            return Ok(Slot {
                pn,
                key_phase: false,
                generation: 0,
            });
        };
        if s.sealed_under_key >= s.interval {
            s.secret = s.secret.next();
            s.key = Arc::new(PacketKey::new(s.key.cipher(), &s.secret, &s.iv_from));
            s.generation += 1;
            s.sealed_under_key = 0;
        }
        s.sealed_under_key += 1;
        Ok(Slot {
            pn,
            key_phase: s.generation % 2 == 1,
            generation: s.generation,
        })
    }

    /// The packet number the next datagram will take: every one below it
    /// has been handed out.
    pub fn next_pn(&self) -> u64 {
        self.next_pn
    }

    /// The next slot with the key it must be sealed under: sealing it
    /// needs nothing more from the sealer, so it may happen on another
    /// thread while the sealer hands out the next slots.
    pub fn next_ticket(&mut self) -> Result<SealTicket, SealError> {
        let slot = self.next_slot()?;
        let key = self.state.as_ref().map(|s| Arc::clone(&s.key));
        Ok(SealTicket { slot, key })
    }

    /// Seals the packet of `slot`: `in_out` holds the payload followed by
    /// [`tag_len`](Self::tag_len) spare bytes; `header` (which carries the
    /// slot's packet number and key phase) is authenticated, not encrypted.
    pub fn seal_in_place(
        &self,
        slot: Slot,
        header: &[u8],
        in_out: &mut [u8],
    ) -> Result<(), SealError> {
        match &self.state {
            None => Ok(()),
            Some(s) if s.generation != slot.generation => Err(SealError::StaleSlot),
            Some(s) => s.key.seal_in_place(slot.pn, header, in_out),
        }
    }
}

/// A [`Slot`] and the key of its generation ([`Sealer::next_ticket`]):
/// all that sealing its packet needs. Not `Clone`: consumed by sealing,
/// so its packet number is sealed once.
#[derive(Debug)]
pub struct SealTicket {
    slot: Slot,
    /// `None` under [`Protection::Null`].
    key: Option<Arc<PacketKey>>,
}

impl SealTicket {
    pub fn pn(&self) -> u64 {
        self.slot.pn
    }

    pub fn key_phase(&self) -> bool {
        self.slot.key_phase
    }

    /// As [`Sealer::seal_in_place`], under the key the ticket carries: a
    /// key update since the ticket was taken does not stale it.
    pub fn seal_in_place(self, header: &[u8], in_out: &mut [u8]) -> Result<(), SealError> {
        match &self.key {
            None => Ok(()),
            Some(key) => key.seal_in_place(self.slot.pn, header, in_out),
        }
    }
}

/// Why a received packet was dropped. The opener's state is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Dropped {
    #[error("shorter than the authentication tag")]
    TooShort,
    #[error("failed authentication")]
    BadTag,
    #[error("a packet number accepted before (a replay or a duplicate)")]
    Replayed,
    #[error("a packet number older than the replay window")]
    TooOld,
    #[error("too many packets failed authentication (RFC 9001 §6.6); the connection must close")]
    IntegrityLimit,
}

/// Packets dropped by an [`Opener`], by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DropCounters {
    pub too_short: u64,
    pub bad_tag: u64,
    pub replayed: u64,
    pub too_old: u64,
}

impl DropCounters {
    pub fn total(&self) -> u64 {
        self.too_short + self.bad_tag + self.replayed + self.too_old
    }
}

/// The receiving half of a direction: replay window, the keys of the
/// current phase, the one before (for packets reordered across an
/// update) and the one after (RFC 9001 §6.2, §6.5).
#[derive(Debug)]
pub struct Opener {
    state: Option<OpenKeys>,
    counters: DropCounters,
}

#[derive(Debug)]
struct OpenKeys {
    window: ReplayWindow,
    iv_from: TrafficSecret,
    current: Arc<PacketKey>,
    /// Secret of the next phase; its key is `next`.
    next_secret: TrafficSecret,
    next: Arc<PacketKey>,
    previous: Option<Arc<PacketKey>>,
    generation: u64,
    /// Lowest packet number opened under `current`: a packet of the other
    /// phase below it belongs to `previous`, above it to `next`.
    current_lowest: Option<u64>,
}

impl Opener {
    /// An opener for [`Protection::Null`]: accepts every packet as it is,
    /// duplicates included (the transport counts them, D-SACK reports
    /// them); nothing is dropped.
    pub fn null() -> Opener {
        Opener {
            state: None,
            counters: DropCounters::default(),
        }
    }

    pub fn new(cipher: Cipher, secret: TrafficSecret) -> Opener {
        let next_secret = secret.next();
        Opener {
            state: Some(OpenKeys {
                window: ReplayWindow::new(),
                current: Arc::new(PacketKey::new(cipher, &secret, &secret)),
                next: Arc::new(PacketKey::new(cipher, &next_secret, &secret)),
                next_secret,
                iv_from: secret,
                previous: None,
                generation: 0,
                current_lowest: None,
            }),
            counters: DropCounters::default(),
        }
    }

    pub fn protection(&self) -> Protection {
        match &self.state {
            None => Protection::Null,
            Some(s) => Protection::Aead(s.current.cipher()),
        }
    }

    pub fn tag_len(&self) -> usize {
        self.protection().tag_len()
    }

    pub fn counters(&self) -> DropCounters {
        self.counters
    }

    /// Key updates followed so far.
    pub fn generation(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.generation)
    }

    /// Whether so many packets failed authentication that the connection
    /// must close (RFC 9001 §6.6).
    pub fn integrity_limit_reached(&self) -> bool {
        match &self.state {
            None => false,
            Some(s) => self.counters.bad_tag >= s.current.cipher().integrity_limit(),
        }
    }

    /// Opens a packet whose header (associated data) carries `pn` and
    /// `key_phase`; `in_out` is the ciphertext and tag, the plaintext is
    /// the returned prefix. A dropped packet is counted and changes
    /// nothing else (the contents of `in_out` are then unspecified).
    /// The three steps of [`ticket`](Self::ticket),
    /// [`OpenTicket::open_in_place`] and [`settle`](Self::settle), at once.
    pub fn open_in_place<'a>(
        &mut self,
        pn: u64,
        key_phase: bool,
        header: &[u8],
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], Dropped> {
        let ticket = self.ticket(pn, key_phase, in_out.len())?;
        let opened = ticket.open_in_place(header, in_out);
        self.settle(ticket, opened.is_ok())?;
        opened.map_err(|_| Dropped::BadTag)
    }

    /// The checks before a packet of `len` bytes (ciphertext and tag)
    /// claiming `pn` and `key_phase` is opened, and the key to open it
    /// with. A refused packet is counted and changes nothing else.
    pub fn ticket(&mut self, pn: u64, key_phase: bool, len: usize) -> Result<OpenTicket, Dropped> {
        let limit_reached = self.integrity_limit_reached();
        let Some(s) = &mut self.state else {
            return Ok(OpenTicket {
                pn,
                key: None,
                generation: 0,
            });
        };
        if limit_reached {
            return Err(Dropped::IntegrityLimit);
        }
        if len < TAG_LEN {
            self.counters.too_short += 1;
            return Err(Dropped::TooShort);
        }
        // RFC 6479: refuse replays before spending an AEAD operation.
        check_window(&s.window, &mut self.counters, pn)?;
        let current_phase = s.generation % 2 == 1;
        let (key, generation) = if key_phase == current_phase {
            (&s.current, s.generation)
        } else if let Some(previous) = s
            .previous
            .as_ref()
            .filter(|_| s.current_lowest.is_some_and(|low| pn < low))
        {
            (previous, s.generation - 1)
        } else {
            (&s.next, s.generation + 1)
        };
        Ok(OpenTicket {
            pn,
            key: Some(Arc::clone(key)),
            generation,
        })
    }

    /// Records how `ticket`'s packet fared: a failure is counted; a
    /// success moves the replay window and, for the first packet of the
    /// peer's next key phase, the keys (RFC 9001 §6.2). The window is
    /// checked again, since another packet of the same number may have
    /// been settled since the ticket was taken.
    pub fn settle(&mut self, ticket: OpenTicket, opened: bool) -> Result<(), Dropped> {
        let Some(s) = &mut self.state else {
            return Ok(());
        };
        if !opened {
            self.counters.bad_tag += 1;
            return Err(Dropped::BadTag);
        }
        let pn = ticket.pn;
        check_window(&s.window, &mut self.counters, pn)?;
        // Authenticated: now, and only now, the state moves.
        s.window.accept(pn);
        if ticket.generation == s.generation {
            s.current_lowest = Some(s.current_lowest.map_or(pn, |low| low.min(pn)));
        } else if ticket.generation == s.generation + 1 {
            // RFC 9001 §6.2: the peer updated; follow, keep the old key
            // for packets still in flight under it.
            let cipher = s.current.cipher();
            let after = s.next_secret.next();
            let next = Arc::new(PacketKey::new(cipher, &after, &s.iv_from));
            s.previous = Some(std::mem::replace(
                &mut s.current,
                std::mem::replace(&mut s.next, next),
            ));
            s.next_secret = after;
            s.generation += 1;
            s.current_lowest = Some(pn);
        }
        Ok(())
    }
}

/// RFC 6479: whether `pn` may still be accepted; a refusal is counted.
fn check_window(
    window: &ReplayWindow,
    counters: &mut DropCounters,
    pn: u64,
) -> Result<(), Dropped> {
    match window.check(pn) {
        Ok(()) => Ok(()),
        Err(Refused::Replayed) => {
            counters.replayed += 1;
            Err(Dropped::Replayed)
        }
        Err(Refused::TooOld) => {
            counters.too_old += 1;
            Err(Dropped::TooOld)
        }
    }
}

/// A received packet that passed [`Opener::ticket`]'s checks, with the key
/// that is to open it: opening needs nothing more from the opener, so it
/// may happen on another thread; [`Opener::settle`] then records it.
#[derive(Debug)]
pub struct OpenTicket {
    pn: u64,
    /// `None` under [`Protection::Null`]: the bytes are the plaintext.
    key: Option<Arc<PacketKey>>,
    /// The key phase generation of `key`.
    generation: u64,
}

impl OpenTicket {
    /// Opens ciphertext-and-tag in place; the plaintext is the returned
    /// prefix. Pure: the opener learns the outcome at [`Opener::settle`].
    pub fn open_in_place<'a>(
        &self,
        header: &[u8],
        in_out: &'a mut [u8],
    ) -> Result<&'a mut [u8], BadTag> {
        match &self.key {
            None => Ok(in_out),
            Some(key) => key.open_in_place(self.pn, header, in_out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashSet;

    const HEADER: &[u8] = b"AT\x02\x01 a 33-byte header, say......";

    fn secret(b: u8) -> TrafficSecret {
        TrafficSecret::new([b; 32])
    }

    fn pair(cipher: Cipher, interval: u64) -> (Sealer, Opener) {
        (
            Sealer::with_interval(cipher, secret(9), interval),
            Opener::new(cipher, secret(9)),
        )
    }

    /// A sealed packet: (pn, key phase, header, ciphertext and tag).
    fn seal_one(s: &mut Sealer, payload: &[u8]) -> (u64, bool, Vec<u8>, Vec<u8>) {
        let slot = s.next_slot().unwrap();
        let (pn, phase) = (slot.pn(), slot.key_phase());
        let mut header = HEADER.to_vec();
        header[4..12].copy_from_slice(&pn.to_be_bytes());
        header[12] = phase as u8;
        let mut buf = payload.to_vec();
        buf.resize(payload.len() + s.tag_len(), 0);
        s.seal_in_place(slot, &header, &mut buf).unwrap();
        (pn, phase, header, buf)
    }

    fn open(o: &mut Opener, p: &(u64, bool, Vec<u8>, Vec<u8>)) -> Result<Vec<u8>, Dropped> {
        let mut buf = p.3.clone();
        o.open_in_place(p.0, p.1, &p.2, &mut buf)
            .map(|b| b.to_vec())
    }

    #[test]
    fn sealed_packets_open_under_both_ciphers_and_nowhere_else() {
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            let (mut s, mut o) = pair(cipher, KEY_UPDATE_INTERVAL);
            let p = seal_one(&mut s, b"hello");
            assert_eq!(p.3.len(), 5 + TAG_LEN);
            assert_ne!(&p.3[..5], b"hello");
            assert_eq!(open(&mut o, &p).unwrap(), b"hello");
            // The other direction's secret does not open it.
            let mut other = Opener::new(cipher, secret(10));
            assert_eq!(open(&mut other, &p), Err(Dropped::BadTag));
            assert_eq!(other.counters().bad_tag, 1);
        }
    }

    #[test]
    fn the_two_ciphers_differ_and_a_packet_of_one_fails_the_other() {
        let (mut s, _) = pair(Cipher::Aes256Gcm, KEY_UPDATE_INTERVAL);
        let p = seal_one(&mut s, b"payload");
        let mut o = Opener::new(Cipher::ChaCha20Poly1305, secret(9));
        assert_eq!(open(&mut o, &p), Err(Dropped::BadTag));
    }

    #[test]
    fn null_protection_passes_bytes_through_duplicates_included() {
        let mut s = Sealer::null();
        let mut o = Opener::null();
        assert_eq!(s.tag_len(), 0);
        let p = seal_one(&mut s, b"plain");
        assert_eq!(p.3, b"plain");
        assert_eq!(open(&mut o, &p).unwrap(), b"plain");
        assert_eq!(open(&mut o, &p).unwrap(), b"plain");
        assert_eq!(o.counters(), DropCounters::default());
        assert_eq!(s.next_slot().unwrap().pn(), 1);
    }

    #[test]
    fn a_replayed_packet_is_dropped_and_counted() {
        let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305, KEY_UPDATE_INTERVAL);
        let p = seal_one(&mut s, b"once");
        assert!(open(&mut o, &p).is_ok());
        assert_eq!(open(&mut o, &p), Err(Dropped::Replayed));
        assert_eq!(o.counters().replayed, 1);
    }

    #[test]
    fn a_forged_packet_does_not_move_the_replay_window() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm, KEY_UPDATE_INTERVAL);
        let p = seal_one(&mut s, b"real");
        // A forgery claiming a far packet number, then the real packet.
        let forged = (1_000_000, false, p.2.clone(), p.3.clone());
        assert_eq!(open(&mut o, &forged), Err(Dropped::BadTag));
        assert_eq!(open(&mut o, &p).unwrap(), b"real");
    }

    #[test]
    fn a_packet_too_short_for_a_tag_is_dropped() {
        let (_, mut o) = pair(Cipher::Aes256Gcm, KEY_UPDATE_INTERVAL);
        let mut buf = [0u8; TAG_LEN - 1];
        assert_eq!(
            o.open_in_place(0, false, HEADER, &mut buf),
            Err(Dropped::TooShort)
        );
        assert_eq!(o.counters().too_short, 1);
    }

    #[test]
    fn no_room_for_a_tag_is_an_error_not_a_panic() {
        let mut s = Sealer::new(Cipher::Aes256Gcm, secret(1));
        let slot = s.next_slot().unwrap();
        let mut buf = [0u8; TAG_LEN - 1];
        assert_eq!(
            s.seal_in_place(slot, HEADER, &mut buf),
            Err(SealError::NoRoomForTag)
        );
    }

    #[test]
    fn keys_update_every_interval_and_the_opener_follows_the_phase_bit() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm, 3);
        let mut phases = vec![];
        for i in 0..10u8 {
            let p = seal_one(&mut s, &[i; 20]);
            phases.push(p.1);
            assert_eq!(open(&mut o, &p).unwrap(), [i; 20]);
        }
        assert_eq!(
            phases,
            [false, false, false, true, true, true, false, false, false, true]
        );
        assert_eq!(s.generation(), 3);
        assert_eq!(o.generation(), 3);
    }

    #[test]
    fn packets_reordered_across_a_key_update_still_open_once() {
        let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305, 4);
        let ps: Vec<_> = (0..8u8).map(|i| seal_one(&mut s, &[i])).collect();
        // 4..8 are under the second key; 2 and 3 arrive after them.
        for i in [0, 1, 4, 5, 3, 6, 2, 7] {
            assert_eq!(open(&mut o, &ps[i]).unwrap(), [i as u8], "packet {i}");
        }
        for p in &ps {
            assert_eq!(open(&mut o, p), Err(Dropped::Replayed));
        }
        assert_eq!(o.generation(), 1);
    }

    /// RFC 9001 §6.6: the real interval, not a test one. Slots are cheap;
    /// only the packets on either side of the update are sealed.
    #[test]
    fn the_first_key_protects_exactly_2_pow_23_packets() {
        let mut s = Sealer::new(Cipher::Aes256Gcm, secret(4));
        let mut o = Opener::new(Cipher::Aes256Gcm, secret(4));
        for _ in 0..KEY_UPDATE_INTERVAL - 1 {
            s.next_slot().unwrap();
        }
        let last_old = seal_one(&mut s, b"old");
        assert_eq!(
            (last_old.0, last_old.1, s.generation()),
            (KEY_UPDATE_INTERVAL - 1, false, 0)
        );
        let first_new = seal_one(&mut s, b"new");
        assert_eq!(
            (first_new.0, first_new.1, s.generation()),
            (KEY_UPDATE_INTERVAL, true, 1)
        );
        assert_eq!(open(&mut o, &first_new).unwrap(), b"new");
        assert_eq!(open(&mut o, &last_old).unwrap(), b"old");
        assert_eq!(o.generation(), 1);
    }

    #[test]
    fn a_slot_taken_before_a_key_update_cannot_be_sealed_after_it() {
        let mut s = Sealer::with_interval(Cipher::Aes256Gcm, secret(1), 1);
        let old = s.next_slot().unwrap();
        let _new = s.next_slot().unwrap();
        let mut buf = [0u8; TAG_LEN + 1];
        assert_eq!(
            s.seal_in_place(old, HEADER, &mut buf),
            Err(SealError::StaleSlot)
        );
    }

    /// A ticket carries its key: sealed after the sealer moved to the
    /// next key (as a worker thread may), it still opens, where a bare
    /// slot is refused as stale.
    #[test]
    fn a_ticket_taken_before_a_key_update_seals_under_its_own_key() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm, 1);
        let tickets: Vec<_> = (0..3).map(|_| s.next_ticket().unwrap()).collect();
        assert_eq!(s.generation(), 2);
        // Sealed newest first, all after the sealer's last update.
        let mut sealed: Vec<_> = tickets
            .into_iter()
            .enumerate()
            .rev()
            .map(|(i, t)| {
                let (pn, phase) = (t.pn(), t.key_phase());
                let mut header = HEADER.to_vec();
                header[4..12].copy_from_slice(&pn.to_be_bytes());
                let mut buf = vec![i as u8; 4 + TAG_LEN];
                t.seal_in_place(&header, &mut buf).unwrap();
                (pn, phase, header, buf)
            })
            .collect();
        sealed.reverse();
        for (i, p) in sealed.iter().enumerate() {
            assert_eq!(open(&mut o, p).unwrap(), [i as u8; 4], "packet {i}");
        }
        assert_eq!(o.generation(), 2);
        let stale = s.next_slot().unwrap();
        let _newer = s.next_slot().unwrap();
        let mut buf = [0u8; TAG_LEN + 1];
        assert_eq!(
            s.seal_in_place(stale, HEADER, &mut buf),
            Err(SealError::StaleSlot)
        );
    }

    /// A batch is ticketed before any of it is settled (opened on
    /// workers): a duplicate inside the batch opens under its key, yet
    /// only one copy settles; the rest are replays, as if one by one.
    #[test]
    fn a_duplicate_within_one_batch_settles_once() {
        let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305, KEY_UPDATE_INTERVAL);
        let p = seal_one(&mut s, b"twice");
        let tickets: Vec<_> = (0..2)
            .map(|_| o.ticket(p.0, p.1, p.3.len()).unwrap())
            .collect();
        let mut results = vec![];
        for t in tickets {
            let mut buf = p.3.clone();
            let opened = t.open_in_place(&p.2, &mut buf).is_ok();
            assert!(opened);
            results.push(o.settle(t, opened));
        }
        assert_eq!(results, [Ok(()), Err(Dropped::Replayed)]);
        assert_eq!(o.counters().replayed, 1);
    }

    /// Packets of the peer's next key phase ticketed in one batch: the
    /// first settled moves the opener to that phase, the others settle
    /// under it as current, and the phase after still opens.
    #[test]
    fn a_key_update_inside_one_batch_moves_the_opener_once() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm, 2);
        let ps: Vec<_> = (0..6u8).map(|i| seal_one(&mut s, &[i])).collect();
        for p in &ps[..2] {
            assert!(open(&mut o, p).is_ok());
        }
        let batch: Vec<_> = ps[2..4]
            .iter()
            .map(|p| (p, o.ticket(p.0, p.1, p.3.len()).unwrap()))
            .collect();
        for (p, t) in batch {
            let mut buf = p.3.clone();
            let opened = t.open_in_place(&p.2, &mut buf).is_ok();
            assert_eq!(o.settle(t, opened), Ok(()));
        }
        assert_eq!(o.generation(), 1);
        for (i, p) in ps.iter().enumerate().skip(4) {
            assert_eq!(open(&mut o, p).unwrap(), [i as u8]);
        }
        assert_eq!(o.generation(), 2);
    }

    #[test]
    fn the_interval_never_exceeds_the_aes_gcm_limit() {
        let s = Sealer::with_interval(Cipher::Aes256Gcm, secret(1), u64::MAX);
        assert_eq!(s.state.as_ref().unwrap().interval, KEY_UPDATE_INTERVAL);
        assert_eq!(KEY_UPDATE_INTERVAL, 1 << 23, "RFC 9001 §6.6");
    }

    #[test]
    fn cipher_names_round_trip() {
        for c in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            assert_eq!(c.to_string().parse::<Cipher>(), Ok(c));
        }
        assert_eq!("auto".parse::<Cipher>(), Ok(Cipher::for_this_cpu()));
        assert_eq!("aes".parse::<Cipher>(), Ok(Cipher::Aes256Gcm));
        assert_eq!("chacha".parse::<Cipher>(), Ok(Cipher::ChaCha20Poly1305));
        // Unlike the knobs' names, a cipher's is read in lower case only.
        assert!("AES-256-GCM".parse::<Cipher>().is_err());
        assert!("rot13"
            .parse::<Cipher>()
            .unwrap_err()
            .to_string()
            .contains("aes-256-gcm"));
    }

    /// An unknown cipher is refused as one, its name escaped so that no
    /// control character reaches the terminal.
    #[test]
    fn an_unknown_cipher_is_named_escaped() {
        let e = "rot\x1b13".parse::<Cipher>().unwrap_err();
        assert_eq!(e, UnknownCipher("rot\\x1b13".into()));
        assert_eq!(
            e.to_string(),
            "unknown cipher `rot\\x1b13`: aes-256-gcm, chacha20-poly1305 or auto"
        );
    }

    #[test]
    fn secrets_are_not_printed() {
        assert_eq!(format!("{:?}", secret(7)), "TrafficSecret(..)");
        let k = PacketKey::new(Cipher::Aes256Gcm, &secret(7), &secret(7));
        assert!(!format!("{k:?}").contains("7, 7"));
    }

    proptest! {
        /// Any single bit flipped in the header or the sealed bytes makes
        /// the packet fail authentication, and it is counted.
        #[test]
        fn any_bit_flip_fails(payload in proptest::collection::vec(any::<u8>(), 0..200),
                              bit in any::<proptest::sample::Index>(),
                              chacha in any::<bool>()) {
            let cipher = if chacha { Cipher::ChaCha20Poly1305 } else { Cipher::Aes256Gcm };
            let (mut s, mut o) = pair(cipher, KEY_UPDATE_INTERVAL);
            let (pn, phase, mut header, mut sealed) = seal_one(&mut s, &payload);
            let bits = (header.len() + sealed.len()) * 8;
            let b = bit.index(bits);
            if b < header.len() * 8 {
                header[b / 8] ^= 1 << (b % 8);
            } else {
                let b = b - header.len() * 8;
                sealed[b / 8] ^= 1 << (b % 8);
            }
            prop_assert_eq!(open(&mut o, &(pn, phase, header, sealed)), Err(Dropped::BadTag));
            prop_assert_eq!(o.counters().bad_tag, 1);
        }

        /// Any arrival order within the replay window, with duplicates:
        /// every packet opens exactly once, every repeat is dropped.
        #[test]
        fn out_of_order_within_the_window_opens_once(
            order in proptest::collection::vec(0usize..40, 1..200),
            interval in 1u64..10) {
            let (mut s, mut o) = pair(Cipher::Aes256Gcm, interval);
            let ps: Vec<_> = (0..40u8).map(|i| seal_one(&mut s, &[i; 3])).collect();
            let mut opened = HashSet::new();
            for i in order {
                match open(&mut o, &ps[i]) {
                    Ok(plain) => {
                        prop_assert_eq!(plain, vec![i as u8; 3]);
                        prop_assert!(opened.insert(i), "packet {} opened twice", i);
                    }
                    Err(Dropped::Replayed) => prop_assert!(opened.contains(&i)),
                    Err(e) => {
                        // Reordered across two key updates or more: the
                        // opener keeps one old key only, as QUIC.
                        prop_assert_eq!(e, Dropped::BadTag);
                        prop_assert!(!opened.contains(&i));
                    }
                }
            }
        }

        /// Forgeries (any packet number, phase, header and bytes, under no
        /// key the opener knows) interleaved with genuine packets across
        /// key updates: no forgery opens, and none keeps a genuine packet
        /// from opening exactly once (the fuzz target `opener`, as a test).
        #[test]
        fn forgeries_never_open_nor_block_genuine_packets(
            ops in proptest::collection::vec(
                (any::<bool>(), prop_oneof![0u64..64, any::<u64>()], any::<bool>(),
                 proptest::collection::vec(any::<u8>(), 0..48)), 1..80)) {
            let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305, 4);
            for (genuine, pn, phase, bytes) in ops {
                if genuine {
                    let p = seal_one(&mut s, &bytes);
                    prop_assert_eq!(open(&mut o, &p), Ok(bytes));
                    prop_assert_eq!(open(&mut o, &p), Err(Dropped::Replayed));
                } else {
                    let mut buf = bytes.clone();
                    prop_assert!(o.open_in_place(pn, phase, HEADER, &mut buf).is_err());
                }
            }
        }

        /// Across key updates the sealer never uses a (key, nonce) pair
        /// twice, and packet numbers only rise.
        #[test]
        fn no_nonce_is_reused_across_key_updates(interval in 1u64..8, n in 1usize..64) {
            let cipher = Cipher::Aes256Gcm;
            let first = secret(3);
            let mut s = Sealer::with_interval(cipher, first.clone(), interval);
            let mut seen = HashSet::new();
            let mut keys = HashSet::new();
            let mut last = None;
            for _ in 0..n {
                let slot = s.next_slot().unwrap();
                let mut phase_secret = first.clone();
                for _ in 0..slot.generation {
                    phase_secret = phase_secret.next();
                }
                let (key, iv) = key_material(&phase_secret, cipher, &first);
                keys.insert(key);
                let mut nonce = iv;
                for (b, p) in nonce[4..].iter_mut().zip(slot.pn().to_be_bytes()) {
                    *b ^= p;
                }
                prop_assert!(seen.insert((key, nonce)), "nonce reused at pn {}", slot.pn());
                prop_assert!(last.is_none_or(|l| l < slot.pn()));
                last = Some(slot.pn());
            }
            prop_assert_eq!(keys.len() as u64, s.generation() + 1, "each update gives a new key");
        }
    }
}
