//! The handshake: Noise IK (Noise spec §7.5, the pattern WireGuard uses)
//! on the `snow` crate, 1 RTT, sans I/O.
//!
//! ```text
//! client (initiator)                                   server (responder)
//! knows its static key s_c and the server's S_s        knows s_s
//!   HELLO  [cookie?] -> e, es, s, ss, {cipher, time, client_id, params}
//!                                                      [under load, no valid cookie:
//!                                                       <- COOKIE, nothing kept]
//!          <- RESPONSE  e, ee, se, {status, client_id, server_id, params}
//! both: Split() -> (client->server, server->client) traffic secrets
//! ```
//!
//! - Mutual authentication by static X25519 keys: the client pins the
//!   server's key (it encrypts to it: a server without the private key
//!   cannot read the hello); the server learns the client's key from the
//!   hello and the caller decides whether it is authorized.
//! - Forward secrecy from the ephemeral keys (`ee`, `se`): the traffic
//!   secrets survive no static key's compromise.
//! - The protocol version is the Noise prologue (Noise spec §6): a peer of
//!   another version derives other keys and fails. The transfer's
//!   parameters, the cipher and both connection ids travel in the
//!   encrypted payloads, so they are bound to the handshake hash and keys
//!   (the ids also travel in clear and must match their encrypted copies).
//! - A hello is padded to at least [`HELLO_MIN_LEN`] bytes and a shorter
//!   one is dropped (RFC 9000 §14.1), so that with the 3× rule of
//!   [`amplification`](super::amplification) an answer never amplifies.
//! - Under load the server answers a hello without a valid cookie with a
//!   [`Cookie`] for the hello's address and keeps nothing (WireGuard's
//!   cookie reply); the client sends the same hello again with it.
//! - Replay: a hello is a Noise message anyone can capture and resend.
//!   The client puts a timestamp in it (WireGuard's TAI64N); the server
//!   keeps, per authorized static key, the greatest accepted, and refuses
//!   a hello that is not newer: a replayed hello creates no second session.
//!   The table can be read out ([`Responder::remembered`]) and given to
//!   the next run ([`Responder::with_remembered`]), so that a restart does
//!   not forget it; the caller keeps it (`atou serve --dir` in its
//!   staging directory).
//!   The server's session still counts as unconfirmed until the client's
//!   first protected packet arrives (key confirmation; the integration's
//!   job, as WireGuard's).
//! - The key and timestamp are known only after IK's first two
//!   Diffie-Hellmans (`es`, `ss`), so a copy of a hello is also found
//!   before any: [`Responder::screen`] looks the hello's digest up among
//!   those already worked through, whatever their outcome (a key the
//!   server ignores included). The caller puts its price on what is left
//!   between [`screen`](Responder::screen) and
//!   [`answer`](Responder::answer).
//!
//! Nothing here reads a clock: cookie checks take `now`, hello timestamps
//! are given by the caller (wall-clock nanoseconds, strictly increasing
//! per client key). Ephemeral keys and ids come from the OS CSPRNG through
//! snow and ring.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use snow::params::NoiseParams;
use thiserror::Error;
use zeroize::Zeroize;

use super::cookie::{Cookie, CookieSecret, COOKIE_LEN};
use super::protect::{Cipher, Opener, Sealer, TrafficSecret};
use crate::proto::wire::codec::{Reader, Truncated, Writer};
use crate::proto::wire::{MAGIC, VERSION};
use crate::proto::Time;

/// The Noise protocol name (Noise spec §8): IK, X25519, ChaCha20-Poly1305,
/// BLAKE2s, as WireGuard. The handshake's AEAD is independent of the one
/// that protects packets, which the client chooses.
pub const NOISE_PATTERN: &str = "Noise_IK_25519_ChaChaPoly_BLAKE2s";

/// Smallest hello a server reads (RFC 9000 §14.1's 1200 bytes).
pub const HELLO_MIN_LEN: usize = 1200;

/// Largest parameters blob either side may send.
pub const MAX_PARAMS_LEN: usize = 1024;

/// Hello timestamps remembered at most (one per authorized client key).
pub const DEFAULT_MAX_REMEMBERED: usize = 65_536;

/// How far a client's clock may be behind a server's that has just
/// started: a hello timestamped earlier than the server's start less this
/// is refused ([`Responder::with_timestamp_floor`]).
pub const RESTART_SKEW: std::time::Duration = std::time::Duration::from_secs(120);

pub const KIND_HELLO: u8 = 0x20;
const KIND_RESPONSE: u8 = 0x21;
const KIND_COOKIE: u8 = 0x22;
/// A client that does not know the server's key yet asks for it (trust
/// on first use, as ssh's first connection); the answer is not
/// authenticated, so the client records it and says so.
pub const KIND_KEY_QUERY: u8 = 0x23;
const KIND_KEY_ANSWER: u8 = 0x24;
const PREFIX_LEN: usize = 4;
/// Noise IK overheads: e (32) + encrypted s (32 + 16) + payload tag (16);
/// e (32) + payload tag (16).
const HELLO_NOISE_OVERHEAD: usize = 32 + 48 + 16;
const RESPONSE_NOISE_OVERHEAD: usize = 32 + 16;
const HELLO_PAYLOAD_FIXED: usize = 1 + 8 + 8;
/// Longest parameters whose hello, with a cookie, still fits in
/// [`HELLO_MIN_LEN`]: the room early data may take without the hello
/// growing past the padding every hello has anyway.
pub const HELLO_PARAMS_ROOM: usize = {
    let room = HELLO_MIN_LEN
        - PREFIX_LEN
        - 8
        - 1
        - COOKIE_LEN
        - 2
        - HELLO_NOISE_OVERHEAD
        - HELLO_PAYLOAD_FIXED;
    if room < MAX_PARAMS_LEN {
        room
    } else {
        MAX_PARAMS_LEN
    }
};
const RESPONSE_PAYLOAD_FIXED: usize = 1 + 8 + 8;

fn noise_params() -> NoiseParams {
    // Cannot fail: a constant, valid protocol name.
    NOISE_PATTERN.parse().expect("valid Noise protocol name")
}

/// The prologue (Noise spec §6): the protocol and its version, so peers of
/// different versions never agree on keys.
fn prologue() -> [u8; 8] {
    [b'a', b't', b'o', b'u', b'/', b'1', b'3', VERSION]
}

/// An X25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublicKey(pub [u8; 32]);

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey(")?;
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// A static X25519 key pair. The private half is wiped when dropped and
/// never printed.
#[derive(Clone)]
pub struct StaticKeypair {
    private: [u8; 32],
    public: PublicKey,
}

impl Drop for StaticKeypair {
    fn drop(&mut self) {
        self.private.zeroize();
    }
}

impl fmt::Debug for StaticKeypair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StaticKeypair")
            .field("public", &self.public)
            .finish_non_exhaustive()
    }
}

impl StaticKeypair {
    /// A new key pair from the OS CSPRNG.
    pub fn generate() -> Result<StaticKeypair, HandshakeError> {
        let kp = snow::Builder::new(noise_params()).generate_keypair()?;
        let mut private = [0u8; 32];
        let mut public = [0u8; 32];
        private.copy_from_slice(&kp.private);
        public.copy_from_slice(&kp.public);
        Ok(StaticKeypair {
            private,
            public: PublicKey(public),
        })
    }

    /// The pair of a private key read from a file; the public half is
    /// computed (X25519 of the base point, by snow's resolver), never
    /// trusted from elsewhere.
    pub fn from_private(private: [u8; 32]) -> Result<StaticKeypair, HandshakeError> {
        use snow::resolvers::{CryptoResolver, DefaultResolver};
        let mut dh = DefaultResolver
            .resolve_dh(&snow::params::DHChoice::Curve25519)
            .ok_or(HandshakeError::Noise("no X25519".into()))?;
        dh.set(&private);
        let public = dh
            .pubkey()
            .try_into()
            .map_err(|_| HandshakeError::Malformed("public key"))?;
        Ok(StaticKeypair {
            private,
            public: PublicKey(public),
        })
    }

    /// The public half, which peers pin and `authorized_keys` lists.
    pub fn public(&self) -> PublicKey {
        self.public
    }

    pub(crate) fn private_bytes(&self) -> &[u8; 32] {
        &self.private
    }
}

/// Why the server refused an authenticated client; sent to the client
/// inside the (authenticated) response, so the client can say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefuseReason {
    /// The client's key is not in the server's authorized keys.
    NotAuthorized,
    /// The server does not accept the transfer's parameters.
    ParamsRefused,
    /// The server is at one of its limits.
    Busy,
    /// The hello's timestamp is older than the server's floor (its start,
    /// less [`RESTART_SKEW`]): a hello made before the server started may
    /// be a replay, which a restarted server cannot tell from a client
    /// whose clock is behind.
    ClockBehind,
}

impl RefuseReason {
    fn code(self) -> u8 {
        match self {
            RefuseReason::NotAuthorized => 1,
            RefuseReason::ParamsRefused => 2,
            RefuseReason::Busy => 3,
            RefuseReason::ClockBehind => 4,
        }
    }

    fn from_code(code: u8) -> Option<RefuseReason> {
        match code {
            1 => Some(RefuseReason::NotAuthorized),
            2 => Some(RefuseReason::ParamsRefused),
            3 => Some(RefuseReason::Busy),
            4 => Some(RefuseReason::ClockBehind),
            _ => None,
        }
    }
}

impl fmt::Display for RefuseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RefuseReason::NotAuthorized => {
                "the server does not know this client's key (add its public key to the server's authorized keys)"
            }
            RefuseReason::ParamsRefused => "the server refused the transfer's parameters",
            RefuseReason::Busy => "the server is busy (at one of its limits); try again later",
            RefuseReason::ClockBehind => {
                "this host's clock is behind the server's: the hello's time is more than 2 min \
                 before the server started, and a server that restarted cannot tell such a hello \
                 from a replayed one; set this host's clock (NTP), or retry once the server has \
                 run as long as the clocks differ"
            }
        })
    }
}

/// Why a handshake message was not accepted. Neither side's state changes
/// on an error, except where noted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HandshakeError {
    #[error("not an atou handshake message")]
    NotHandshake,
    #[error("protocol version {got}, this atou speaks {ours}")]
    Version { got: u8, ours: u8 },
    #[error("a hello of {0} bytes, under the {HELLO_MIN_LEN} required")]
    HelloTooShort(usize),
    #[error("malformed handshake message: {0}")]
    Malformed(&'static str),
    #[error("parameters of {0} bytes, over the {MAX_PARAMS_LEN} allowed")]
    ParamsTooLong(usize),
    #[error("the message does not decrypt: tampered, or meant for another key")]
    Undecryptable,
    #[error("a hello no newer than one already accepted from this key (a replay)")]
    Replayed,
    #[error("the answer is for another connection")]
    WrongConnection,
    #[error("the server refused: {0}")]
    Refused(RefuseReason),
    #[error("the handshake is already complete")]
    Finished,
    #[error("noise: {0}")]
    Noise(String),
}

impl From<snow::Error> for HandshakeError {
    fn from(e: snow::Error) -> Self {
        match e {
            snow::Error::Decrypt => HandshakeError::Undecryptable,
            other => HandshakeError::Noise(other.to_string()),
        }
    }
}

/// A completed handshake: who the peer is, what it asked, and the keys.
pub struct Established {
    /// The peer's static key, authenticated: what authorization looks up.
    pub peer_static: PublicKey,
    pub client_id: u64,
    pub server_id: u64,
    pub cipher: Cipher,
    /// The peer's parameters blob, authenticated.
    pub peer_params: Vec<u8>,
    /// The Noise handshake hash (spec §5.2 GetHandshakeHash): a channel
    /// binding, the same on both sides.
    pub handshake_hash: Vec<u8>,
    send: TrafficSecret,
    recv: TrafficSecret,
}

impl fmt::Debug for Established {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Established")
            .field("peer_static", &self.peer_static)
            .field("client_id", &self.client_id)
            .field("server_id", &self.server_id)
            .field("cipher", &self.cipher)
            .finish_non_exhaustive()
    }
}

impl Established {
    /// The packet protection of this side: sealing what it sends, opening
    /// what it receives.
    pub fn into_protection(self) -> (Sealer, Opener) {
        (
            Sealer::new(self.cipher, self.send.clone()),
            Opener::new(self.cipher, self.recv.clone()),
        )
    }
}

fn cipher_code(c: Cipher) -> u8 {
    match c {
        Cipher::Aes256Gcm => 1,
        Cipher::ChaCha20Poly1305 => 2,
    }
}

fn cipher_from_code(c: u8) -> Option<Cipher> {
    match c {
        1 => Some(Cipher::Aes256Gcm),
        2 => Some(Cipher::ChaCha20Poly1305),
        _ => None,
    }
}

/// Checks magic, version and kind; returns the bytes after them.
fn strip_prefix(datagram: &[u8], kind: u8) -> Result<&[u8], HandshakeError> {
    let mut r = Reader::new(datagram);
    let Ok([magic @ .., version, got_kind]) = r.array::<PREFIX_LEN>() else {
        return Err(HandshakeError::NotHandshake);
    };
    if magic != MAGIC {
        return Err(HandshakeError::NotHandshake);
    }
    if version != VERSION {
        return Err(HandshakeError::Version {
            got: version,
            ours: VERSION,
        });
    }
    if got_kind != kind {
        return Err(HandshakeError::NotHandshake);
    }
    Ok(r.rest())
}

/// The first bytes of every hello of this version; its client id follows
/// in the next eight, big-endian (what a socket filter matches,
/// `io::socket::UdpIo::drop_hellos`).
pub fn hello_prefix() -> [u8; PREFIX_LEN] {
    prefix(KIND_HELLO)
}

fn prefix(kind: u8) -> [u8; PREFIX_LEN] {
    [MAGIC[0], MAGIC[1], VERSION, kind]
}

/// A handshake message that ends early is malformed, naming the field
/// that did not fit.
fn malformed(what: &'static str) -> impl Fn(Truncated) -> HandshakeError {
    move |_| HandshakeError::Malformed(what)
}

/// A random 64-bit id from the OS CSPRNG.
pub fn random_id() -> Result<u64, HandshakeError> {
    let mut b = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .map_err(|_| HandshakeError::Noise("the OS random generator failed".into()))?;
    Ok(u64::from_be_bytes(b))
}

/// What a client brings to a handshake.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub identity: StaticKeypair,
    /// The server's key, pinned (known_hosts, `--server-key`, or the ssh
    /// channel).
    pub server_key: PublicKey,
    pub cipher: Cipher,
    /// The transfer's parameters, bound into the handshake.
    pub params: Vec<u8>,
}

/// What the client should do after an answer.
#[derive(Debug)]
pub enum Progress {
    /// The server asked for a cookie: send [`Initiator::hello`] again.
    SendHelloAgain,
    Established(Box<Established>),
}

/// The client's side of the handshake.
///
/// Drive it as: [`Initiator::new`], send [`hello`](Self::hello), feed every
/// datagram from the server to [`on_datagram`](Self::on_datagram) until it
/// returns [`Progress::Established`]; on a timeout, send `hello` again (the
/// same bytes: the server has kept nothing) or start a new initiator.
/// Garbage, forged or tampered answers return an error and change nothing,
/// so an off-path attacker cannot end the handshake.
pub struct Initiator {
    noise: Option<Box<snow::HandshakeState>>,
    client_id: u64,
    cipher: Cipher,
    noise_msg: Vec<u8>,
    cookie: Option<Cookie>,
    hello: Vec<u8>,
}

impl fmt::Debug for Initiator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Initiator")
            .field("client_id", &self.client_id)
            .field("finished", &self.noise.is_none())
            .finish_non_exhaustive()
    }
}

impl Initiator {
    /// Starts a handshake. `timestamp` is the wall clock in nanoseconds
    /// (strictly increasing per client key: the server refuses a hello
    /// that is not newer than the last it accepted from the key).
    pub fn new(
        config: &ClientConfig,
        client_id: u64,
        timestamp: u64,
    ) -> Result<Initiator, HandshakeError> {
        if config.params.len() > MAX_PARAMS_LEN {
            return Err(HandshakeError::ParamsTooLong(config.params.len()));
        }
        let prologue = prologue();
        let mut noise = snow::Builder::new(noise_params())
            .local_private_key(config.identity.private_bytes())?
            .remote_public_key(&config.server_key.0)?
            .prologue(&prologue)?
            .build_initiator()?;
        let mut payload = Vec::with_capacity(HELLO_PAYLOAD_FIXED + 8 + config.params.len());
        payload.push(cipher_code(config.cipher));
        payload.put_u64(timestamp);
        payload.put_u64(client_id);
        payload.extend_from_slice(&config.params);
        let mut noise_msg = vec![0u8; HELLO_NOISE_OVERHEAD + payload.len()];
        let n = noise.write_message(&payload, &mut noise_msg)?;
        noise_msg.truncate(n);
        let mut i = Initiator {
            noise: Some(Box::new(noise)),
            client_id,
            cipher: config.cipher,
            noise_msg,
            cookie: None,
            hello: Vec::new(),
        };
        i.build_hello();
        Ok(i)
    }

    /// HELLO: prefix, client id, cookie flag and cookie, the Noise message
    /// with its length, zeros to [`HELLO_MIN_LEN`].
    fn build_hello(&mut self) {
        let mut h = Vec::with_capacity(HELLO_MIN_LEN);
        h.extend_from_slice(&prefix(KIND_HELLO));
        h.put_u64(self.client_id);
        match &self.cookie {
            None => h.push(0),
            Some(c) => {
                h.push(1);
                h.extend_from_slice(c.as_bytes());
            }
        }
        h.put_u16(self.noise_msg.len() as u16);
        h.extend_from_slice(&self.noise_msg);
        if h.len() < HELLO_MIN_LEN {
            h.resize(HELLO_MIN_LEN, 0);
        }
        self.hello = h;
    }

    /// The hello to send (again after [`Progress::SendHelloAgain`]).
    pub fn hello(&self) -> &[u8] {
        &self.hello
    }

    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// An answer from the server: a cookie reply or the response.
    pub fn on_datagram(&mut self, datagram: &[u8]) -> Result<Progress, HandshakeError> {
        if self.noise.is_none() {
            return Err(HandshakeError::Finished);
        }
        if datagram.len() > 3 && datagram[3] == KIND_COOKIE {
            return self.on_cookie(datagram);
        }
        let mut r = Reader::new(strip_prefix(datagram, KIND_RESPONSE)?);
        let client_id = r.u64().map_err(malformed("client id"))?;
        let server_id = r.u64().map_err(malformed("server id"))?;
        let len = r.u16().map_err(malformed("noise length"))? as usize;
        let msg = r.bytes(len).map_err(malformed("noise message"))?;
        if r.remaining() != 0 {
            return Err(HandshakeError::Malformed("trailing bytes"));
        }
        if client_id != self.client_id {
            return Err(HandshakeError::WrongConnection);
        }
        let noise = self.noise.as_mut().ok_or(HandshakeError::Finished)?;
        let mut payload = vec![0u8; len];
        // A failed read leaves snow's state as it was (it restores its
        // checkpoint), so a forged answer cannot end the handshake.
        let n = noise.read_message(msg, &mut payload)?;
        let mut p = Reader::new(&payload[..n]);
        let status = p.u8().map_err(malformed("status"))?;
        let inner_client = p.u64().map_err(malformed("client id"))?;
        let inner_server = p.u64().map_err(malformed("server id"))?;
        let params = p.rest().to_vec();
        if inner_client != client_id || inner_server != server_id {
            // Authenticated by the server yet inconsistent: a broken peer.
            self.noise = None;
            return Err(HandshakeError::Malformed(
                "ids in clear differ from the encrypted ones",
            ));
        }
        let mut noise = self.noise.take().ok_or(HandshakeError::Finished)?;
        if status != 0 {
            let reason =
                RefuseReason::from_code(status).ok_or(HandshakeError::Malformed("status"))?;
            return Err(HandshakeError::Refused(reason));
        }
        let peer_static = remote_static(&noise)?;
        let handshake_hash = noise.get_handshake_hash().to_vec();
        let (c2s, s2c) = noise.dangerously_get_raw_split();
        Ok(Progress::Established(Box::new(Established {
            peer_static,
            client_id,
            server_id,
            cipher: self.cipher,
            peer_params: params,
            handshake_hash,
            send: TrafficSecret::new(c2s),
            recv: TrafficSecret::new(s2c),
        })))
    }

    /// COOKIE: prefix, client id, cookie. Not authenticated (as QUIC's
    /// Retry is not confidential): a forged cookie only costs the client a
    /// round trip, which anyone on the path could cost it anyway.
    fn on_cookie(&mut self, datagram: &[u8]) -> Result<Progress, HandshakeError> {
        let mut r = Reader::new(strip_prefix(datagram, KIND_COOKIE)?);
        let client_id = r.u64().map_err(malformed("client id"))?;
        let cookie = r.bytes(COOKIE_LEN).map_err(malformed("cookie"))?;
        if r.remaining() != 0 {
            return Err(HandshakeError::Malformed("trailing bytes"));
        }
        if client_id != self.client_id {
            return Err(HandshakeError::WrongConnection);
        }
        self.cookie = Some(Cookie::from_bytes(
            cookie.try_into().expect("cookie length"),
        ));
        self.build_hello();
        Ok(Progress::SendHelloAgain)
    }
}

/// The server's decision about an authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Accept, answering with these parameters.
    Accept(Vec<u8>),
    Refuse(RefuseReason),
    /// Say nothing (a key the server does not know): a refusal would cost
    /// the three X25519 operations of a response, for anyone who replays
    /// or forges hellos, and would tell a prober which keys are unknown.
    /// The client times out, as WireGuard's does.
    Ignore,
}

/// How far behind a key's newest accepted hello another may be and still
/// be accepted, if its timestamp was not seen: the streams of one
/// transfer start together and their hellos race.
pub const REPLAY_WINDOW_NS: u64 = 10_000_000_000;
/// Timestamps remembered per key inside the window; when full, only a
/// hello newer than all of them is accepted.
const REPLAY_SEEN_MAX: usize = 64;

/// A key's recent hello timestamps.
#[derive(Debug, Default)]
struct Recent {
    newest: u64,
    /// Accepted timestamps within [`REPLAY_WINDOW_NS`] of `newest`.
    seen: Vec<u64>,
    /// The newest timestamp a run before this one accepted
    /// ([`Responder::with_remembered`]): which timestamps inside its
    /// window were seen is not kept across a restart, so none at or
    /// before it is admitted, as WireGuard's strict rule would have it.
    sealed: Option<u64>,
}

impl Recent {
    /// Remembered from an earlier run: only a hello newer than `newest`
    /// gets in.
    fn sealed_at(newest: u64) -> Recent {
        Recent {
            newest,
            seen: Vec::new(),
            sealed: Some(newest),
        }
    }

    /// A hello newer than all before it, or one inside the window that
    /// was not seen (a replay repeats a timestamp exactly), and never one
    /// at or before what an earlier run accepted.
    fn admits(&self, timestamp: u64) -> bool {
        self.sealed.is_none_or(|sealed| timestamp > sealed)
            && (timestamp > self.newest
                || (self.seen.len() < REPLAY_SEEN_MAX
                    && self.newest - timestamp <= REPLAY_WINDOW_NS
                    && !self.seen.contains(&timestamp)))
    }

    /// Records an accepted timestamp; true if it is newer than any before
    /// it (the value a restart must find).
    fn record(&mut self, timestamp: u64) -> bool {
        let advanced = timestamp > self.newest;
        self.newest = self.newest.max(timestamp);
        let floor = self.newest.saturating_sub(REPLAY_WINDOW_NS);
        self.seen.retain(|&t| t >= floor);
        self.seen.push(timestamp);
        advanced
    }
}

/// What the server sends back for a hello.
#[derive(Debug)]
pub enum Reply {
    /// Under load and no valid cookie: send this cookie reply; nothing is
    /// kept.
    Cookie(Vec<u8>),
    /// Send `datagram`; the session starts (unconfirmed until the client's
    /// first protected packet).
    Accepted {
        datagram: Vec<u8>,
        session: Box<Established>,
        /// The hello carried a valid cookie: its address is validated
        /// (RFC 9000 §8.1), the 3× limit no longer applies to it.
        address_validated: bool,
        /// The hello is newer than any accepted from its key before (or
        /// the key's first): [`Responder::remembered`] changed, and a
        /// server that keeps it across restarts saves it before it sends
        /// `datagram`.
        timestamp_advanced: bool,
    },
    /// Send `datagram`, an authenticated refusal the client can explain;
    /// nothing is kept.
    Refused {
        datagram: Vec<u8>,
        peer: PublicKey,
        reason: RefuseReason,
    },
    /// Send nothing ([`Decision::Ignore`]); nothing is kept but the
    /// hello's digest, so a copy of it costs a lookup.
    Ignored { peer: PublicKey },
}

/// A hello before any public-key operation ([`Responder::screen`]).
#[derive(Debug)]
pub enum Screened<'a> {
    /// Under load and no valid cookie: send a cookie reply
    /// ([`Responder::cookie_reply`]) if the caller's budget for them
    /// allows it; nothing is kept.
    NeedsCookie { client_id: u64 },
    /// A copy of a hello already worked on (a replay, or the network's
    /// duplicate): drop it, answer nothing. A lookup, no Diffie-Hellman.
    /// `client_id` names it in clear, for
    /// [`ReplayedHellos`](super::replayed::ReplayedHellos).
    Seen { client_id: u64 },
    /// New: worth the public-key operations of [`Responder::answer`] if
    /// the caller's budget allows it.
    Fresh(FreshHello<'a>),
}

/// A hello that passed [`Responder::screen`].
#[derive(Debug)]
pub struct FreshHello<'a> {
    frame: HelloFrame<'a>,
    digest: Digest,
    address_validated: bool,
}

impl FreshHello<'_> {
    /// It carried a valid cookie for its address.
    pub fn address_validated(&self) -> bool {
        self.address_validated
    }
}

/// What a hello is remembered by: a hash of its client id and Noise
/// message (the ephemeral key, the encrypted static key and the encrypted
/// payload with its timestamp), not of the cookie or padding an attacker
/// may change around it. A changed Noise message is another digest, and fails to
/// open after one Diffie-Hellman, which the caller's budget prices.
type Digest = [u8; 16];

fn digest(frame: &HelloFrame<'_>) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(b"atou hello digest v1");
    // The client id in clear is checked against its encrypted copy: a
    // copy with another id fails, and must not make the genuine hello,
    // arriving after it, look seen.
    h.update(&frame.client_id.to_be_bytes());
    h.update(frame.noise);
    h.finalize().as_bytes()[..16].try_into().expect("16 bytes")
}

/// Digests of hellos worked on, remembered at most (first in, first out).
/// At the default global budget of 1,000 hellos a second a digest stays
/// at least 16 s; a copy replayed later costs one more budgeted hello.
pub const DEFAULT_MAX_SEEN: usize = 16_384;

/// A bounded set of hello digests, oldest forgotten first.
#[derive(Debug)]
struct SeenHellos {
    set: std::collections::HashSet<Digest>,
    order: std::collections::VecDeque<Digest>,
    max: usize,
}

impl SeenHellos {
    fn new(max: usize) -> SeenHellos {
        SeenHellos {
            set: std::collections::HashSet::new(),
            order: std::collections::VecDeque::new(),
            max: max.max(1),
        }
    }

    fn contains(&self, d: &Digest) -> bool {
        self.set.contains(d)
    }

    fn insert(&mut self, d: Digest) {
        if !self.set.insert(d) {
            return;
        }
        self.order.push_back(d);
        while self.order.len() > self.max {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
    }
}

/// The server's side of the handshake: stateless per hello (IK completes
/// in the server's one answer); it keeps only its key, the cookie secret
/// and, per authorized client key, the newest hello timestamp.
pub struct Responder {
    /// Shared with the work handed out ([`HelloWork`]), never copied.
    identity: Arc<StaticKeypair>,
    cookies: CookieSecret,
    newest: HashMap<PublicKey, Recent>,
    max_remembered: usize,
    seen: SeenHellos,
    /// Hellos timestamped before this are refused (0: none).
    floor: u64,
}

impl fmt::Debug for Responder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Responder")
            .field("public", &self.identity.public())
            .field("remembered", &self.newest.len())
            .finish_non_exhaustive()
    }
}

impl Responder {
    pub fn new(identity: StaticKeypair, cookies: CookieSecret) -> Responder {
        Responder {
            identity: Arc::new(identity),
            cookies,
            newest: HashMap::new(),
            max_remembered: DEFAULT_MAX_REMEMBERED,
            seen: SeenHellos::new(DEFAULT_MAX_SEEN),
            floor: 0,
        }
    }

    /// Refuses hellos timestamped before `floor` (wall-clock nanoseconds
    /// since the Unix epoch, as the timestamps are): WireGuard keeps, per
    /// key, the greatest timestamp seen (whitepaper §5.1), in memory, so a
    /// restarted responder would accept once more a hello captured before
    /// the restart. A floor of the start time less [`RESTART_SKEW`] refuses
    /// every hello made more than that before the start, without a file
    /// to keep; the price is that a client whose clock is behind the
    /// server's by more than the skew is refused (with
    /// [`RefuseReason::ClockBehind`], which says so) until the server has
    /// run for the difference.
    ///
    /// Alone, a hello captured within the skew before a restart can still
    /// be replayed once; [`with_remembered`](Self::with_remembered) closes
    /// that for the keys it names. The floor stays for what that table
    /// cannot know: a key forgotten from a full table, a server with no
    /// place to keep one (no `--dir`), another DEST served under the same
    /// key, a table an operator removed, and a hello that never reached
    /// the server before (delivered late by whoever held it back).
    pub fn with_timestamp_floor(mut self, floor: u64) -> Responder {
        self.floor = floor;
        self
    }

    /// Caps the digests of hellos remembered ([`DEFAULT_MAX_SEEN`]).
    pub fn with_max_seen(mut self, max: usize) -> Responder {
        self.seen = SeenHellos::new(max);
        self
    }

    /// Caps the table of hello timestamps (one per accepted client key).
    /// When full, the key with the oldest timestamp is forgotten: a hello
    /// of that key captured before could then be replayed once, and would
    /// create an unconfirmed session no one can use.
    pub fn with_max_remembered(mut self, max: usize) -> Responder {
        self.max_remembered = max.max(1);
        self.forget_oldest_down_to(self.max_remembered);
        self
    }

    /// Starts from the newest hello timestamp each key had in an earlier
    /// run ([`remembered`](Self::remembered), saved by the caller): what
    /// WireGuard keeps in memory (whitepaper §5.1), carried across a
    /// restart, so that a hello captured before it is not accepted once
    /// more. A remembered key's hello must be newer than its entry: the
    /// window of racing hellos (`REPLAY_WINDOW_NS`) does not reach back
    /// past it, since which timestamps in it were seen is not kept. At
    /// most [`with_max_remembered`](Self::with_max_remembered) entries
    /// are kept, the newest; a key given twice keeps its newest.
    pub fn with_remembered(
        mut self,
        remembered: impl IntoIterator<Item = (PublicKey, u64)>,
    ) -> Responder {
        for (key, newest) in remembered {
            let sealed = match self.newest.get(&key) {
                Some(r) => r.newest.max(newest),
                None => newest,
            };
            self.newest.insert(key, Recent::sealed_at(sealed));
        }
        self.forget_oldest_down_to(self.max_remembered);
        self
    }

    /// Each remembered key with the newest hello timestamp accepted from
    /// it (in no particular order): what a restart gives
    /// [`with_remembered`](Self::with_remembered).
    pub fn remembered(&self) -> impl Iterator<Item = (PublicKey, u64)> + '_ {
        self.newest.iter().map(|(k, r)| (*k, r.newest))
    }

    /// Most entries [`remembered`](Self::remembered) yields.
    pub fn max_remembered(&self) -> usize {
        self.max_remembered
    }

    pub fn public(&self) -> PublicKey {
        self.identity.public()
    }

    /// Rotates the cookie secret (`fresh` from the OS CSPRNG); call about
    /// every [`BUCKET`](super::cookie::BUCKET).
    pub fn rotate_cookie_secret(&mut self, fresh: [u8; 32]) {
        self.cookies.rotate(fresh);
    }

    /// A hello from `peer`: [`screen`](Self::screen), then, if fresh,
    /// [`answer`](Self::answer) (a copy already worked on is
    /// [`HandshakeError::Replayed`]). For callers with no budget to check
    /// in between.
    pub fn on_hello(
        &mut self,
        now: Time,
        peer: SocketAddr,
        datagram: &[u8],
        under_load: bool,
        server_id: u64,
        decide: impl FnOnce(&PublicKey, &[u8]) -> Decision,
    ) -> Result<Reply, HandshakeError> {
        match self.screen(now, peer, datagram, under_load)? {
            Screened::NeedsCookie { client_id } => {
                Ok(Reply::Cookie(self.cookie_reply(now, peer, client_id)))
            }
            Screened::Seen { .. } => Err(HandshakeError::Replayed),
            Screened::Fresh(hello) => self.answer(hello, server_id, decide),
        }
    }

    /// What a hello from `peer` is worth, before any public-key
    /// operation: its frame parsed, a copy of one already worked on found
    /// by a lookup, and, `under_load` (the server's budgets are tight), a
    /// valid cookie required (WireGuard's cookie reply, whitepaper §5.3).
    /// Changes nothing.
    pub fn screen<'a>(
        &self,
        now: Time,
        peer: SocketAddr,
        datagram: &'a [u8],
        under_load: bool,
    ) -> Result<Screened<'a>, HandshakeError> {
        let frame = HelloFrame::parse(datagram)?;
        let digest = digest(&frame);
        if self.seen.contains(&digest) {
            return Ok(Screened::Seen {
                client_id: frame.client_id,
            });
        }
        let address_validated = frame
            .cookie
            .is_some_and(|c| self.cookies.verify(&c, &peer, now));
        if under_load && !address_validated {
            return Ok(Screened::NeedsCookie {
                client_id: frame.client_id,
            });
        }
        Ok(Screened::Fresh(FreshHello {
            frame,
            digest,
            address_validated,
        }))
    }

    /// The cookie reply to the hello of `client_id` from `peer`
    /// ([`Screened::NeedsCookie`]): a MAC of the address, made only when
    /// it is sent.
    pub fn cookie_reply(&self, now: Time, peer: SocketAddr, client_id: u64) -> Vec<u8> {
        cookie_reply(client_id, &self.cookies.issue(&peer, now))
    }

    /// Works through a screened hello at once: [`work_on`](Self::work_on),
    /// [`HelloWork::open`] (two X25519), [`judge`](Self::judge) (the
    /// replay rule, then `decide` on the authenticated client key and its
    /// parameters) and, unless `decide` says [`Decision::Ignore`],
    /// [`ResponseWork::respond`] (three more). A server that works hellos
    /// off its I/O thread calls the four itself, the two `Work`s on
    /// another thread. `server_id` is the id this server assigns (from
    /// [`random_id`] or the server's own allocator).
    pub fn answer(
        &mut self,
        hello: FreshHello<'_>,
        server_id: u64,
        decide: impl FnOnce(&PublicKey, &[u8]) -> Decision,
    ) -> Result<Reply, HandshakeError> {
        let opened = self.work_on(hello).open()?;
        match self.judge(opened, server_id, decide)? {
            Judged::Ignored { peer } => Ok(Reply::Ignored { peer }),
            Judged::Respond(work) => work.respond(),
        }
    }

    /// Takes a screened hello for its public-key work: its digest is
    /// remembered from now on, whatever the work's outcome, so a copy of
    /// it is [`Screened::Seen`] (also while the work is still running).
    pub fn work_on(&mut self, hello: FreshHello<'_>) -> HelloWork {
        self.seen.insert(hello.digest);
        HelloWork {
            identity: Arc::clone(&self.identity),
            client_id: hello.frame.client_id,
            noise: hello.frame.noise.to_vec(),
            address_validated: hello.address_validated,
        }
    }

    /// Decides about an opened hello, on the thread that holds this
    /// responder's state: WireGuard's timestamp rule (whitepaper §5.1),
    /// widened to a window, then `decide` on the client key and its
    /// parameters, then the restart floor. An accepted hello's timestamp
    /// is remembered now, before its response is made, so that no other
    /// hello judged while that response is on its way can pass as it.
    pub fn judge(
        &mut self,
        opened: OpenedHello,
        server_id: u64,
        decide: impl FnOnce(&PublicKey, &[u8]) -> Decision,
    ) -> Result<Judged, HandshakeError> {
        let OpenedHello {
            noise,
            client_key,
            timestamp,
            cipher,
            client_id,
            params,
            address_validated,
        } = opened;
        // Replay: WireGuard's timestamp rule, widened to a window so that
        // several connections of one client (the streams of a transfer,
        // whose hellos race each other) all get in.
        if self
            .newest
            .get(&client_key)
            .is_some_and(|r| !r.admits(timestamp))
        {
            return Err(HandshakeError::Replayed);
        }
        let decision = decide(&client_key, &params);
        let too_old = timestamp < self.floor;
        let (status, server_params) = match decision {
            // Said nothing to, whatever its time.
            Decision::Ignore => return Ok(Judged::Ignored { peer: client_key }),
            _ if too_old => (RefuseReason::ClockBehind.code(), Vec::new()),
            Decision::Accept(sp) => (0, sp),
            Decision::Refuse(reason) => (reason.code(), Vec::new()),
        };
        let timestamp_advanced = status == 0 && self.remember(client_key, timestamp);
        Ok(Judged::Respond(ResponseWork {
            noise,
            status,
            ids: (client_id, server_id),
            server_params,
            client_key,
            cipher,
            client_params: params,
            address_validated,
            timestamp_advanced,
        }))
    }

    /// Records an accepted hello's timestamp; true if it advanced its
    /// key's newest (a key not remembered before included).
    fn remember(&mut self, key: PublicKey, timestamp: u64) -> bool {
        if !self.newest.contains_key(&key) {
            self.forget_oldest_down_to(self.max_remembered - 1);
        }
        match self.newest.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().record(timestamp),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Recent::default()).record(timestamp);
                true
            }
        }
    }

    /// Forgets the keys with the oldest timestamps until at most `max`
    /// are remembered: one pass over the table, however many go.
    fn forget_oldest_down_to(&mut self, max: usize) {
        let excess = self.newest.len().saturating_sub(max);
        if excess == 0 {
            return;
        }
        if excess == 1 {
            // A new key at a full table, the usual case: no allocation.
            let oldest = self
                .newest
                .iter()
                .min_by_key(|(_, r)| r.newest)
                .map(|(k, _)| *k);
            if let Some(key) = oldest {
                self.newest.remove(&key);
            }
            return;
        }
        let mut by_age: Vec<(u64, PublicKey)> =
            self.newest.iter().map(|(k, r)| (r.newest, *k)).collect();
        by_age.select_nth_unstable_by_key(excess - 1, |&(newest, _)| newest);
        for (_, key) in &by_age[..excess] {
            self.newest.remove(key);
        }
    }
}

/// A fresh hello's public-key work ([`Responder::work_on`]): owned bytes
/// and the server's key, nothing else of the responder's, so it may run
/// on any thread.
pub struct HelloWork {
    identity: Arc<StaticKeypair>,
    client_id: u64,
    noise: Vec<u8>,
    address_validated: bool,
}

impl fmt::Debug for HelloWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HelloWork")
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl HelloWork {
    /// Reads IK's first message (Noise spec §7.5: `e, es, s, ss`, two
    /// X25519): the client's key, its timestamp, cipher and parameters,
    /// authenticated. Pure: the same bytes give the same result anywhere.
    pub fn open(self) -> Result<OpenedHello, HandshakeError> {
        let prologue = prologue();
        let mut noise = snow::Builder::new(noise_params())
            .local_private_key(self.identity.private_bytes())?
            .prologue(&prologue)?
            .build_responder()?;
        let mut buf = vec![0u8; self.noise.len()];
        let n = noise.read_message(&self.noise, &mut buf)?;
        let payload = HelloPayload::parse(&buf[..n])?;
        if payload.client_id != self.client_id {
            return Err(HandshakeError::Malformed(
                "ids in clear differ from the encrypted ones",
            ));
        }
        let client_key = remote_static(&noise)?;
        Ok(OpenedHello {
            client_key,
            timestamp: payload.timestamp,
            cipher: payload.cipher,
            client_id: self.client_id,
            params: payload.params.to_vec(),
            address_validated: self.address_validated,
            noise: Box::new(noise),
        })
    }
}

/// A hello read ([`HelloWork::open`]), for [`Responder::judge`].
pub struct OpenedHello {
    noise: Box<snow::HandshakeState>,
    client_key: PublicKey,
    timestamp: u64,
    cipher: Cipher,
    client_id: u64,
    params: Vec<u8>,
    address_validated: bool,
}

impl fmt::Debug for OpenedHello {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenedHello")
            .field("client_key", &self.client_key)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl OpenedHello {
    /// The client's authenticated key and its id for the connection,
    /// before the hello is judged.
    pub(crate) fn client(&self) -> (PublicKey, u64) {
        (self.client_key, self.client_id)
    }
}

/// What [`Responder::judge`] decided.
#[derive(Debug)]
pub enum Judged {
    /// Send nothing ([`Decision::Ignore`]).
    Ignored { peer: PublicKey },
    /// Make the response: an acceptance or an authenticated refusal.
    Respond(ResponseWork),
}

/// The response's public-key work (Noise spec §7.5: `e, ee, se`, three
/// X25519, then Split): owned, so it may run on any thread.
pub struct ResponseWork {
    noise: Box<snow::HandshakeState>,
    status: u8,
    ids: (u64, u64),
    server_params: Vec<u8>,
    client_key: PublicKey,
    cipher: Cipher,
    client_params: Vec<u8>,
    address_validated: bool,
    /// The accepted hello advanced its key's newest timestamp (judged
    /// on the responder's thread): the table to keep across restarts
    /// changed.
    timestamp_advanced: bool,
}

impl fmt::Debug for ResponseWork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseWork")
            .field("client_key", &self.client_key)
            .field("ids", &self.ids)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl ResponseWork {
    /// The client is accepted (not refused).
    pub fn accepts(&self) -> bool {
        self.status == 0
    }

    /// The client's authenticated key and its id for the connection.
    pub fn client(&self) -> (PublicKey, u64) {
        (self.client_key, self.ids.0)
    }

    /// The response, and for an accepted client the session's keys.
    pub fn respond(self) -> Result<Reply, HandshakeError> {
        let ResponseWork {
            mut noise,
            status,
            ids,
            server_params,
            client_key,
            cipher,
            client_params,
            address_validated,
            timestamp_advanced,
        } = self;
        let datagram = response(&mut noise, status, ids, &server_params)?;
        if let Some(reason) = RefuseReason::from_code(status) {
            return Ok(Reply::Refused {
                datagram,
                peer: client_key,
                reason,
            });
        }
        let handshake_hash = noise.get_handshake_hash().to_vec();
        let (c2s, s2c) = noise.dangerously_get_raw_split();
        Ok(Reply::Accepted {
            datagram,
            address_validated,
            timestamp_advanced,
            session: Box::new(Established {
                peer_static: client_key,
                client_id: ids.0,
                server_id: ids.1,
                cipher,
                peer_params: client_params,
                handshake_hash,
                send: TrafficSecret::new(s2c),
                recv: TrafficSecret::new(c2s),
            }),
        })
    }
}

/// HELLO as it arrives: prefix, client id, cookie flag and cookie, the
/// Noise message with its length, zero padding to [`HELLO_MIN_LEN`].
#[derive(Debug)]
struct HelloFrame<'a> {
    client_id: u64,
    cookie: Option<Cookie>,
    noise: &'a [u8],
}

impl<'a> HelloFrame<'a> {
    fn parse(datagram: &'a [u8]) -> Result<HelloFrame<'a>, HandshakeError> {
        let mut r = Reader::new(strip_prefix(datagram, KIND_HELLO)?);
        if datagram.len() < HELLO_MIN_LEN {
            return Err(HandshakeError::HelloTooShort(datagram.len()));
        }
        let client_id = r.u64().map_err(malformed("client id"))?;
        let cookie = match r.u8().map_err(malformed("cookie flag"))? {
            0 => None,
            1 => {
                let bytes = r.bytes(COOKIE_LEN).map_err(malformed("cookie"))?;
                Some(Cookie::from_bytes(bytes.try_into().expect("cookie length")))
            }
            _ => return Err(HandshakeError::Malformed("cookie flag")),
        };
        let len = r.u16().map_err(malformed("noise length"))? as usize;
        let noise = r.bytes(len).map_err(malformed("noise message"))?;
        if r.rest().iter().any(|&b| b != 0) {
            return Err(HandshakeError::Malformed("padding"));
        }
        Ok(HelloFrame {
            client_id,
            cookie,
            noise,
        })
    }
}

/// The hello's encrypted payload: cipher, timestamp, client id, params.
struct HelloPayload<'a> {
    cipher: Cipher,
    timestamp: u64,
    client_id: u64,
    params: &'a [u8],
}

impl<'a> HelloPayload<'a> {
    fn parse(bytes: &'a [u8]) -> Result<HelloPayload<'a>, HandshakeError> {
        let mut p = Reader::new(bytes);
        let cipher = p.u8().map_err(malformed("cipher"))?;
        let cipher = cipher_from_code(cipher).ok_or(HandshakeError::Malformed("cipher"))?;
        let timestamp = p.u64().map_err(malformed("timestamp"))?;
        let client_id = p.u64().map_err(malformed("client id"))?;
        let params = p.rest();
        if params.len() > MAX_PARAMS_LEN {
            return Err(HandshakeError::ParamsTooLong(params.len()));
        }
        Ok(HelloPayload {
            cipher,
            timestamp,
            client_id,
            params,
        })
    }
}

/// COOKIE: prefix, client id, cookie.
/// KEY QUERY: prefix, client id, zeros to [`HELLO_MIN_LEN`] (so that its
/// answer, 44 bytes, never amplifies).
pub fn key_query(client_id: u64) -> Vec<u8> {
    let mut q = Vec::with_capacity(HELLO_MIN_LEN);
    q.extend_from_slice(&prefix(KIND_KEY_QUERY));
    q.put_u64(client_id);
    q.resize(HELLO_MIN_LEN, 0);
    q
}

/// The answer to a key query, if `datagram` is one (at least
/// [`HELLO_MIN_LEN`] bytes, all padding zero): the server's public key.
pub fn answer_key_query(datagram: &[u8], server: &PublicKey) -> Option<Vec<u8>> {
    let mut r = Reader::new(strip_prefix(datagram, KIND_KEY_QUERY).ok()?);
    let client_id = r.u64().ok()?;
    if datagram.len() < HELLO_MIN_LEN || r.rest().iter().any(|&b| b != 0) {
        return None;
    }
    let mut a = Vec::with_capacity(PREFIX_LEN + 8 + 32);
    a.extend_from_slice(&prefix(KIND_KEY_ANSWER));
    a.put_u64(client_id);
    a.extend_from_slice(&server.0);
    Some(a)
}

/// The key in an answer to the query of `client_id`.
pub fn parse_key_answer(datagram: &[u8], client_id: u64) -> Option<PublicKey> {
    let mut r = Reader::new(strip_prefix(datagram, KIND_KEY_ANSWER).ok()?);
    let answered = r.u64().ok()?;
    let key = r.array().ok()?;
    (answered == client_id && r.remaining() == 0).then_some(PublicKey(key))
}

fn cookie_reply(client_id: u64, cookie: &Cookie) -> Vec<u8> {
    let mut reply = Vec::with_capacity(PREFIX_LEN + 8 + COOKIE_LEN);
    reply.extend_from_slice(&prefix(KIND_COOKIE));
    reply.put_u64(client_id);
    reply.extend_from_slice(cookie.as_bytes());
    reply
}

/// RESPONSE: prefix, both ids, the Noise message (status, ids and the
/// server's parameters encrypted) with its length.
fn response(
    noise: &mut snow::HandshakeState,
    status: u8,
    (client_id, server_id): (u64, u64),
    server_params: &[u8],
) -> Result<Vec<u8>, HandshakeError> {
    if server_params.len() > MAX_PARAMS_LEN {
        return Err(HandshakeError::ParamsTooLong(server_params.len()));
    }
    let mut payload = Vec::with_capacity(RESPONSE_PAYLOAD_FIXED + server_params.len());
    payload.push(status);
    payload.put_u64(client_id);
    payload.put_u64(server_id);
    payload.extend_from_slice(server_params);
    let mut msg = vec![0u8; RESPONSE_NOISE_OVERHEAD + payload.len()];
    let m = noise.write_message(&payload, &mut msg)?;
    let mut datagram = Vec::with_capacity(PREFIX_LEN + 18 + m);
    datagram.extend_from_slice(&prefix(KIND_RESPONSE));
    datagram.put_u64(client_id);
    datagram.put_u64(server_id);
    datagram.put_u16(m as u16);
    datagram.extend_from_slice(&msg[..m]);
    Ok(datagram)
}

/// The peer's static key, once the handshake has read it.
fn remote_static(noise: &snow::HandshakeState) -> Result<PublicKey, HandshakeError> {
    noise
        .get_remote_static()
        .and_then(|k| k.try_into().ok())
        .map(PublicKey)
        .ok_or(HandshakeError::Malformed("no static key"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::crypto::cookie::BUCKET;
    use crate::proto::crypto::protect::TAG_LEN;
    use proptest::prelude::*;

    const T0: Time = Time::from_nanos(1_000_000_000);

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    struct World {
        client_key: StaticKeypair,
        server: Responder,
    }

    fn world() -> World {
        let server_key = StaticKeypair::generate().unwrap();
        World {
            client_key: StaticKeypair::generate().unwrap(),
            server: Responder::new(server_key, CookieSecret::new([5; 32])),
        }
    }

    fn config(w: &World) -> ClientConfig {
        ClientConfig {
            identity: w.client_key.clone(),
            server_key: w.server.public(),
            cipher: Cipher::Aes256Gcm,
            params: b"window=64MiB".to_vec(),
        }
    }

    /// The server's policy in these tests: only `allowed` is authorized.
    fn only(allowed: PublicKey) -> impl FnOnce(&PublicKey, &[u8]) -> Decision {
        move |k, _| {
            if *k == allowed {
                Decision::Accept(b"granted".to_vec())
            } else {
                Decision::Refuse(RefuseReason::NotAuthorized)
            }
        }
    }

    fn hello_at(
        w: &mut World,
        client: &Initiator,
        under_load: bool,
    ) -> Result<Reply, HandshakeError> {
        let allowed = w.client_key.public();
        w.server.on_hello(
            T0,
            addr("192.0.2.7:5000"),
            client.hello(),
            under_load,
            77,
            only(allowed),
        )
    }

    #[test]
    fn a_full_handshake_gives_both_sides_matching_keys_and_each_others_identity() {
        let mut w = world();
        let mut client = Initiator::new(&config(&w), 42, 1).unwrap();
        assert!(client.hello().len() >= HELLO_MIN_LEN);
        let Reply::Accepted {
            datagram,
            session,
            address_validated,
            ..
        } = hello_at(&mut w, &client, false).unwrap()
        else {
            panic!("not accepted");
        };
        assert!(datagram.len() <= 3 * client.hello().len(), "RFC 9000 §8.1");
        assert!(!address_validated, "no cookie, no proof of address");
        let Progress::Established(mine) = client.on_datagram(&datagram).unwrap() else {
            panic!("not established");
        };
        assert_eq!(mine.peer_static, w.server.public());
        assert_eq!(session.peer_static, w.client_key.public());
        assert_eq!((mine.client_id, mine.server_id), (42, 77));
        assert_eq!((session.client_id, session.server_id), (42, 77));
        assert_eq!(session.peer_params, b"window=64MiB");
        assert_eq!(mine.peer_params, b"granted");
        assert_eq!(session.cipher, Cipher::Aes256Gcm);
        assert_eq!(mine.handshake_hash, session.handshake_hash);

        // Each direction's keys open what the other side sealed, and
        // only in that direction.
        let (mut c_seal, mut c_open) = mine.into_protection();
        let (mut s_seal, mut s_open) = session.into_protection();
        let mut buf = b"to the server".to_vec();
        buf.resize(buf.len() + TAG_LEN, 0);
        let slot = c_seal.next_slot().unwrap();
        let pn = slot.pn();
        c_seal.seal_in_place(slot, b"hdr", &mut buf).unwrap();
        let mut copy = buf.clone();
        assert_eq!(
            s_open.open_in_place(pn, false, b"hdr", &mut buf).unwrap(),
            b"to the server"
        );
        assert!(c_open.open_in_place(pn, false, b"hdr", &mut copy).is_err());
        let mut back = b"to the client".to_vec();
        back.resize(back.len() + TAG_LEN, 0);
        let slot = s_seal.next_slot().unwrap();
        s_seal.seal_in_place(slot, b"h", &mut back).unwrap();
        assert_eq!(
            c_open.open_in_place(0, false, b"h", &mut back).unwrap(),
            b"to the client"
        );
    }

    #[test]
    fn a_client_pinning_the_wrong_server_key_gets_no_session() {
        let mut w = world();
        let mut cfg = config(&w);
        cfg.server_key = StaticKeypair::generate().unwrap().public();
        let client = Initiator::new(&cfg, 1, 1).unwrap();
        // The real server cannot read a hello encrypted to another key, and
        // answers nothing.
        assert_eq!(
            hello_at(&mut w, &client, false).unwrap_err(),
            HandshakeError::Undecryptable
        );
    }

    #[test]
    fn an_impostor_server_cannot_answer_a_pinned_client() {
        let w = world();
        let client = Initiator::new(&config(&w), 1, 1).unwrap();
        let mut impostor = Responder::new(
            StaticKeypair::generate().unwrap(),
            CookieSecret::new([0; 32]),
        );
        let r = impostor.on_hello(
            T0,
            addr("192.0.2.7:5000"),
            client.hello(),
            false,
            9,
            |_, _| Decision::Accept(vec![]),
        );
        assert_eq!(r.unwrap_err(), HandshakeError::Undecryptable);
    }

    #[test]
    fn an_unauthorized_client_is_refused_with_a_reason_it_can_print() {
        let mut w = world();
        let mut cfg = config(&w);
        cfg.identity = StaticKeypair::generate().unwrap();
        let stranger = cfg.identity.public();
        let mut client = Initiator::new(&cfg, 3, 1).unwrap();
        let Reply::Refused {
            datagram,
            peer,
            reason,
        } = hello_at(&mut w, &client, false).unwrap()
        else {
            panic!("not refused");
        };
        assert_eq!((peer, reason), (stranger, RefuseReason::NotAuthorized));
        let err = client.on_datagram(&datagram).unwrap_err();
        assert_eq!(err, HandshakeError::Refused(RefuseReason::NotAuthorized));
        assert!(err.to_string().contains("authorized keys"), "{err}");
        assert_eq!(
            client.on_datagram(&datagram).unwrap_err(),
            HandshakeError::Finished
        );
    }

    /// A key the server chooses not to answer gets nothing, and a copy
    /// of its hello is found by a lookup before any public-key operation,
    /// whatever cookie is spliced into it; only its Noise message (with
    /// the client id) is what makes it the same hello.
    #[test]
    fn an_ignored_hello_is_answered_with_nothing_and_its_copies_cost_a_lookup() {
        let mut w = world();
        let mut cfg = config(&w);
        cfg.identity = StaticKeypair::generate().unwrap();
        let stranger = cfg.identity.public();
        let client = Initiator::new(&cfg, 3, 1).unwrap();
        let here = addr("192.0.2.7:5000");
        let Screened::Fresh(fresh) = w.server.screen(T0, here, client.hello(), false).unwrap()
        else {
            panic!("not fresh");
        };
        // Screening changed nothing: the same hello is still fresh.
        assert!(matches!(
            w.server.screen(T0, here, client.hello(), false),
            Ok(Screened::Fresh(_))
        ));
        let r = w.server.answer(fresh, 9, |_, _| Decision::Ignore).unwrap();
        assert!(matches!(r, Reply::Ignored { peer } if peer == stranger));
        assert!(matches!(
            w.server.screen(T0, here, client.hello(), false),
            Ok(Screened::Seen { client_id }) if client_id == client.client_id()
        ));
        // With a cookie spliced in, from elsewhere, under load: still seen.
        let mut spliced = client.hello()[..12].to_vec();
        spliced.push(1);
        spliced.extend_from_slice(&[7; COOKIE_LEN]);
        spliced.extend_from_slice(&client.hello()[13..]);
        assert!(matches!(
            w.server.screen(T0, addr("198.51.100.1:1"), &spliced, true),
            Ok(Screened::Seen { .. })
        ));
        // Another client id in clear around the same Noise message is not
        // the same hello (it fails after the first Diffie-Hellman).
        let mut other_id = client.hello().to_vec();
        other_id[PREFIX_LEN] ^= 0x80;
        assert!(matches!(
            w.server.screen(T0, here, &other_id, false),
            Ok(Screened::Fresh(_))
        ));
    }

    #[test]
    fn the_table_of_seen_hellos_forgets_the_oldest_first() {
        let mut seen = SeenHellos::new(3);
        for i in 0..5u8 {
            seen.insert([i; 16]);
            seen.insert([i; 16]);
        }
        assert_eq!((seen.set.len(), seen.order.len()), (3, 3));
        assert!(!seen.contains(&[1; 16]));
        assert!(seen.contains(&[2; 16]) && seen.contains(&[4; 16]));
    }

    #[test]
    fn a_tampered_hello_is_refused_and_answered_with_nothing() {
        let mut w = world();
        let client = Initiator::new(&config(&w), 1, 1).unwrap();
        let noise_start = PREFIX_LEN + 8 + 1 + 2;
        for i in [noise_start, noise_start + 40, noise_start + 100] {
            let mut h = client.hello().to_vec();
            h[i] ^= 0x01;
            let r = w
                .server
                .on_hello(T0, addr("192.0.2.7:1"), &h, false, 1, |_, _| {
                    Decision::Accept(vec![])
                });
            assert_eq!(r.unwrap_err(), HandshakeError::Undecryptable, "byte {i}");
        }
        // The client id in clear is checked against its encrypted copy.
        let mut h = client.hello().to_vec();
        h[PREFIX_LEN] ^= 0x80;
        let r = w
            .server
            .on_hello(T0, addr("192.0.2.7:1"), &h, false, 1, |_, _| {
                Decision::Accept(vec![])
            });
        assert!(matches!(r.unwrap_err(), HandshakeError::Malformed(_)));
    }

    #[test]
    fn a_tampered_response_is_ignored_and_the_genuine_one_still_completes() {
        let mut w = world();
        let mut client = Initiator::new(&config(&w), 1, 1).unwrap();
        let Reply::Accepted { datagram, .. } = hello_at(&mut w, &client, false).unwrap() else {
            panic!("not accepted");
        };
        let mut bad = datagram.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0x20;
        assert_eq!(
            client.on_datagram(&bad).unwrap_err(),
            HandshakeError::Undecryptable
        );
        assert_eq!(
            client.on_datagram(&datagram[..14]).unwrap_err(),
            HandshakeError::Malformed("server id")
        );
        assert!(matches!(
            client.on_datagram(&datagram),
            Ok(Progress::Established(_))
        ));
    }

    #[test]
    fn a_replayed_hello_creates_no_second_session() {
        let mut w = world();
        let t = 2 * REPLAY_WINDOW_NS;
        let client = Initiator::new(&config(&w), 1, t).unwrap();
        assert!(matches!(
            hello_at(&mut w, &client, false),
            Ok(Reply::Accepted { .. })
        ));
        assert_eq!(
            hello_at(&mut w, &client, false).unwrap_err(),
            HandshakeError::Replayed
        );
        // A hello older than the window is refused as a replay too (one
        // inside it that was never seen is another connection's:
        // `racing_hellos_of_one_key_all_get_in_and_none_twice`).
        let older = Initiator::new(&config(&w), 2, t - REPLAY_WINDOW_NS - 1).unwrap();
        assert_eq!(
            hello_at(&mut w, &older, false).unwrap_err(),
            HandshakeError::Replayed
        );
        // The client's next handshake, newer, is accepted.
        let next = Initiator::new(&config(&w), 3, t + 1).unwrap();
        assert!(matches!(
            hello_at(&mut w, &next, false),
            Ok(Reply::Accepted { .. })
        ));
    }

    /// The streams of one transfer share a key and start together: their
    /// hellos may arrive out of timestamp order, and all must get in; a
    /// replay of any of them, or a hello older than the window, must not.
    #[test]
    fn racing_hellos_of_one_key_all_get_in_and_none_twice() {
        let mut w = world();
        let base = 2 * REPLAY_WINDOW_NS;
        let later = Initiator::new(&config(&w), 1, base + 2_000).unwrap();
        let earlier = Initiator::new(&config(&w), 2, base + 1_000).unwrap();
        let stale = Initiator::new(&config(&w), 3, base + 2_000 - REPLAY_WINDOW_NS - 1).unwrap();
        let hello = |w: &mut World, i: &Initiator, id: u64| {
            w.server
                .on_hello(T0, addr("192.0.2.7:1"), i.hello(), false, id, |_, _| {
                    Decision::Accept(vec![])
                })
        };
        assert!(matches!(
            hello(&mut w, &later, 10),
            Ok(Reply::Accepted { .. })
        ));
        assert!(matches!(
            hello(&mut w, &earlier, 11),
            Ok(Reply::Accepted { .. })
        ));
        assert_eq!(
            hello(&mut w, &earlier, 12).unwrap_err(),
            HandshakeError::Replayed
        );
        assert_eq!(
            hello(&mut w, &later, 13).unwrap_err(),
            HandshakeError::Replayed
        );
        assert_eq!(
            hello(&mut w, &stale, 14).unwrap_err(),
            HandshakeError::Replayed
        );
    }

    /// WireGuard's rule (whitepaper §5.1) keeps the greatest timestamp per
    /// key in memory; across a restart the floor stands in for it: older
    /// hellos are refused with a reason the client can print, newer ones
    /// get in, and a key the server ignores is told nothing either way.
    #[test]
    fn a_hello_older_than_the_floor_is_refused_as_a_clock_behind() {
        let mut w = world();
        let floor = 100 * REPLAY_WINDOW_NS;
        w.server = Responder::new(
            StaticKeypair::generate().unwrap(),
            CookieSecret::new([5; 32]),
        )
        .with_timestamp_floor(floor);
        let mut old = Initiator::new(&config(&w), 1, floor - 1).unwrap();
        let Reply::Refused {
            datagram, reason, ..
        } = hello_at(&mut w, &old, false).unwrap()
        else {
            panic!("not refused");
        };
        assert_eq!(reason, RefuseReason::ClockBehind);
        let err = old.on_datagram(&datagram).unwrap_err();
        assert!(err.to_string().contains("clock is behind"), "{err}");
        let stranger = Initiator::new(&config(&w), 2, floor - 1).unwrap();
        let r = w.server.on_hello(
            T0,
            addr("192.0.2.7:1"),
            stranger.hello(),
            false,
            2,
            |_, _| Decision::Ignore,
        );
        assert!(matches!(r, Ok(Reply::Ignored { .. })));
        let new = Initiator::new(&config(&w), 3, floor).unwrap();
        assert!(matches!(
            hello_at(&mut w, &new, false),
            Ok(Reply::Accepted { .. })
        ));
    }

    #[test]
    fn forgetting_the_oldest_key_keeps_the_table_bounded() {
        let mut w = world();
        w.server = Responder::new(
            StaticKeypair::generate().unwrap(),
            CookieSecret::new([5; 32]),
        )
        .with_max_remembered(2);
        for i in 0..5u64 {
            let mut cfg = config(&w);
            cfg.identity = StaticKeypair::generate().unwrap();
            let c = Initiator::new(&cfg, i, 10).unwrap();
            let r = w
                .server
                .on_hello(T0, addr("192.0.2.7:1"), c.hello(), false, i, |_, _| {
                    Decision::Accept(vec![])
                });
            assert!(matches!(r, Ok(Reply::Accepted { .. })));
        }
        assert_eq!(w.server.newest.len(), 2);
    }

    /// A responder as a restart builds it: the same key, and what the
    /// run before remembered.
    fn restarted(identity: &StaticKeypair, remembered: Vec<(PublicKey, u64)>) -> Responder {
        Responder::new(identity.clone(), CookieSecret::new([6; 32])).with_remembered(remembered)
    }

    fn accept_any(
        server: &mut Responder,
        client: &Initiator,
        id: u64,
    ) -> Result<Reply, HandshakeError> {
        server.on_hello(
            T0,
            addr("192.0.2.7:1"),
            client.hello(),
            false,
            id,
            |_, _| Decision::Accept(vec![]),
        )
    }

    /// WireGuard keeps each key's newest timestamp in memory (whitepaper
    /// §5.1); read out and given to the next run, it refuses there every
    /// hello the run before accepted, the older racing ones included,
    /// which a fresh table (the window reaching back 10 s) would take.
    #[test]
    fn remembered_timestamps_refuse_every_earlier_hello_after_a_restart() {
        let server_key = StaticKeypair::generate().unwrap();
        let mut w = world();
        w.server = Responder::new(server_key.clone(), CookieSecret::new([5; 32]));
        let base = 100 * REPLAY_WINDOW_NS;
        let later = Initiator::new(&config(&w), 1, base + 2_000).unwrap();
        let earlier = Initiator::new(&config(&w), 2, base + 1_000).unwrap();
        assert!(accept_any(&mut w.server, &later, 10).is_ok());
        assert!(accept_any(&mut w.server, &earlier, 11).is_ok());
        let remembered: Vec<_> = w.server.remembered().collect();
        assert_eq!(remembered, vec![(w.client_key.public(), base + 2_000)]);

        // Without the table the earlier hello gets in again: it is inside
        // the window of the later one, which was not seen by this run.
        let mut forgetful = restarted(&server_key, Vec::new());
        assert!(accept_any(&mut forgetful, &later, 20).is_ok());
        assert!(matches!(
            accept_any(&mut forgetful, &earlier, 21),
            Ok(Reply::Accepted { .. })
        ));

        let mut server = restarted(&server_key, remembered);
        for (hello, id) in [(&later, 30), (&earlier, 31)] {
            assert_eq!(
                accept_any(&mut server, hello, id).unwrap_err(),
                HandshakeError::Replayed
            );
        }
        // The client's next hellos get in, racing ones too.
        let next = Initiator::new(&config(&w), 3, base + 5_000).unwrap();
        let racing = Initiator::new(&config(&w), 4, base + 4_000).unwrap();
        assert!(matches!(
            accept_any(&mut server, &next, 32),
            Ok(Reply::Accepted {
                timestamp_advanced: true,
                ..
            })
        ));
        assert!(matches!(
            accept_any(&mut server, &racing, 33),
            Ok(Reply::Accepted {
                timestamp_advanced: false,
                ..
            })
        ));
        // Not below the remembered one, though inside the window.
        let stale = Initiator::new(&config(&w), 5, base + 2_000).unwrap();
        assert_eq!(
            accept_any(&mut server, &stale, 34).unwrap_err(),
            HandshakeError::Replayed
        );
        assert_eq!(
            server.remembered().collect::<Vec<_>>(),
            vec![(w.client_key.public(), base + 5_000)]
        );
    }

    /// Only a hello that moves its key's newest timestamp changes what a
    /// restart must find; one inside the window, older, does not.
    #[test]
    fn an_accepted_hello_says_whether_it_advanced_its_keys_timestamp() {
        let mut w = world();
        let base = 100 * REPLAY_WINDOW_NS;
        let advanced = |w: &mut World, t: u64, id: u64| {
            let c = Initiator::new(&config(w), id, t).unwrap();
            match accept_any(&mut w.server, &c, id) {
                Ok(Reply::Accepted {
                    timestamp_advanced, ..
                }) => timestamp_advanced,
                other => panic!("{other:?}"),
            }
        };
        assert!(advanced(&mut w, base, 1), "the key's first");
        assert!(advanced(&mut w, base + 10, 2));
        assert!(!advanced(&mut w, base + 5, 3), "inside the window");
        assert!(advanced(&mut w, base + 11, 4));
    }

    /// What a restart is given is bounded like the table it came from:
    /// the newest entries are kept, and a key given twice keeps its newest.
    #[test]
    fn remembered_entries_are_bounded_and_a_key_keeps_its_newest() {
        let keys: Vec<PublicKey> = (0..5)
            .map(|_| StaticKeypair::generate().unwrap().public())
            .collect();
        let mut given: Vec<(PublicKey, u64)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, 10 + i as u64))
            .collect();
        given.push((keys[0], 99));
        given.push((keys[4], 1));
        let server = Responder::new(
            StaticKeypair::generate().unwrap(),
            CookieSecret::new([5; 32]),
        )
        .with_max_remembered(2)
        .with_remembered(given);
        let mut kept: Vec<_> = server.remembered().collect();
        kept.sort_by_key(|&(_, t)| t);
        assert_eq!(kept, vec![(keys[4], 14), (keys[0], 99)]);
        assert_eq!(server.max_remembered(), 2);
    }

    /// Early data fills the hello's padding and no more: with the
    /// longest parameters it may have, a hello is exactly
    /// [`HELLO_MIN_LEN`] bytes, with a cookie too.
    #[test]
    fn a_hello_with_params_of_the_whole_room_keeps_to_1200_bytes_with_a_cookie() {
        let mut w = world();
        let mut cfg = config(&w);
        cfg.params = vec![7; HELLO_PARAMS_ROOM];
        let mut client = Initiator::new(&cfg, 8, 1).unwrap();
        let here = addr("198.51.100.1:7000");
        let Reply::Cookie(reply) = w
            .server
            .on_hello(T0, here, client.hello(), true, 1, |_, _| Decision::Ignore)
            .unwrap()
        else {
            panic!("no cookie reply");
        };
        assert!(client.hello().len() <= HELLO_MIN_LEN);
        client.on_datagram(&reply).unwrap();
        assert_eq!(client.hello().len(), HELLO_MIN_LEN);
    }

    #[test]
    fn under_load_a_hello_needs_a_cookie_for_its_address_and_time() {
        let mut w = world();
        let mut client = Initiator::new(&config(&w), 8, 1).unwrap();
        let here = addr("198.51.100.1:7000");
        let allowed = w.client_key.public();
        // No cookie: a cookie reply, far smaller than the hello.
        let Reply::Cookie(reply) = w
            .server
            .on_hello(T0, here, client.hello(), true, 1, only(allowed))
            .unwrap()
        else {
            panic!("no cookie reply");
        };
        assert!(reply.len() * 3 <= client.hello().len());
        assert!(matches!(
            client.on_datagram(&reply),
            Ok(Progress::SendHelloAgain)
        ));
        assert!(client.hello().len() >= HELLO_MIN_LEN);

        // The cookie from another address, or after its bucket, is refused
        // (another cookie reply, no session).
        let there = addr("198.51.100.2:7000");
        let r = w
            .server
            .on_hello(T0, there, client.hello(), true, 1, only(allowed))
            .unwrap();
        assert!(matches!(r, Reply::Cookie(_)));
        let later = T0 + BUCKET * 2;
        let r = w
            .server
            .on_hello(later, here, client.hello(), true, 1, only(allowed))
            .unwrap();
        assert!(matches!(r, Reply::Cookie(_)));

        // From its address, in time: accepted.
        let Reply::Accepted {
            datagram,
            address_validated,
            ..
        } = w
            .server
            .on_hello(T0, here, client.hello(), true, 1, only(allowed))
            .unwrap()
        else {
            panic!("not accepted with a valid cookie");
        };
        assert!(address_validated);
        assert!(matches!(
            client.on_datagram(&datagram),
            Ok(Progress::Established(_))
        ));
    }

    #[test]
    fn not_under_load_no_cookie_is_needed() {
        let mut w = world();
        let client = Initiator::new(&config(&w), 8, 1).unwrap();
        assert!(matches!(
            hello_at(&mut w, &client, false),
            Ok(Reply::Accepted { .. })
        ));
    }

    #[test]
    fn a_short_hello_and_another_version_are_refused() {
        let mut w = world();
        let client = Initiator::new(&config(&w), 8, 1).unwrap();
        let h = client.hello();
        let r = w.server.on_hello(
            T0,
            addr("192.0.2.7:1"),
            &h[..HELLO_MIN_LEN - 1],
            false,
            1,
            |_, _| Decision::Accept(vec![]),
        );
        assert_eq!(
            r.unwrap_err(),
            HandshakeError::HelloTooShort(HELLO_MIN_LEN - 1)
        );
        let mut other = h.to_vec();
        other[2] = VERSION.wrapping_add(1);
        let r = w
            .server
            .on_hello(T0, addr("192.0.2.7:1"), &other, false, 1, |_, _| {
                Decision::Accept(vec![])
            });
        assert!(matches!(r.unwrap_err(), HandshakeError::Version { .. }));
    }

    #[test]
    fn parameters_over_the_limit_are_refused_before_anything_is_sent() {
        let w = world();
        let mut cfg = config(&w);
        cfg.params = vec![0; MAX_PARAMS_LEN + 1];
        assert_eq!(
            Initiator::new(&cfg, 1, 1).unwrap_err(),
            HandshakeError::ParamsTooLong(MAX_PARAMS_LEN + 1)
        );
    }

    #[test]
    fn a_key_pair_rebuilt_from_its_private_half_has_the_same_public_key() {
        let kp = StaticKeypair::generate().unwrap();
        let again = StaticKeypair::from_private(*kp.private_bytes()).unwrap();
        assert_eq!(again.public(), kp.public());
        assert!(!format!("{kp:?}").contains(&format!("{:?}", kp.private_bytes())));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any bytes, to either side: an error or a cookie reply, never a
        /// panic or a session.
        #[test]
        fn arbitrary_datagrams_never_panic_or_establish(bytes in proptest::collection::vec(any::<u8>(), 0..1400),
                                                        kind in prop_oneof![Just(KIND_HELLO), Just(KIND_RESPONSE), Just(KIND_COOKIE)]) {
            let mut w = world();
            let mut d = bytes;
            if d.len() >= PREFIX_LEN {
                d[..PREFIX_LEN].copy_from_slice(&prefix(kind));
            }
            let r = w.server.on_hello(T0, addr("192.0.2.7:1"), &d, false, 1, |_, _| Decision::Accept(vec![]));
            prop_assert!(r.is_err());
            let mut client = Initiator::new(&config(&w), 1, 1).unwrap();
            let r = client.on_datagram(&d);
            prop_assert!(!matches!(r, Ok(Progress::Established(_))));
        }
    }
}
