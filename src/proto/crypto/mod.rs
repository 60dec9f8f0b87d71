//! Handshake and packet protection, sans I/O.
//!
//! - [`protect`]: per-direction AEAD keys, sealing and opening a datagram as
//!   a pure function of key, packet number and bytes; key updates before the
//!   AEAD's limits (RFC 9001 §6.6); a [`Null`](Protection::Null) protection
//!   with the same interface and no overhead.
//! - [`replay`]: the sliding anti-replay window of RFC 6479.
//! - [`handshake`]: Noise IK on `snow`, 1 RTT, mutual authentication by
//!   static X25519 keys, the version and the transfer's parameters bound
//!   in; out come the two traffic secrets and the peer's static key.
//! - [`cookie`]: stateless address validation under load (WireGuard's
//!   cookie reply, QUIC's Retry).
//! - [`amplification`]: at most 3× the bytes received to an address not
//!   yet validated (RFC 9000 §8.1).
//! - [`ratelimit`]: the price of a public-key operation, per source and
//!   for all together (WireGuard's ratelimiter.c).
//! - [`replayed`]: hellos replayed in bulk, whose copies the driver drops
//!   before they are read.
//! - [`key_text`]: a public key as text (`atou-x25519 BASE64`) and the
//!   checked lines of a key file; [`authorized`]: the server's
//!   `authorized_keys`, parsed, with each key's options.
//!
//! Nothing here reads a clock or a socket. Randomness (ephemeral keys,
//! cookie secrets) comes from the OS CSPRNG through the crypto crates, or
//! is passed in where a test needs it fixed.

pub mod amplification;
pub mod authorized;
pub mod cookie;
pub mod frame;
pub mod handshake;
pub mod key_text;
pub mod protect;
pub mod ratelimit;
pub mod replay;
pub mod replayed;

pub use authorized::{AuthorizedKey, AuthorizedKeys, KeyOptions};
pub use cookie::{Cookie, CookieSecret};
pub use handshake::{
    ClientConfig, Decision, Established, FreshHello, HandshakeError, HelloWork, Initiator, Judged,
    OpenedHello, Progress, PublicKey, RefuseReason, Reply, Responder, ResponseWork, Screened,
    StaticKeypair,
};
pub use key_text::{format_public_key, parse_public_key, KeyTextError, LineError, KEY_TYPE};
pub use protect::{
    Cipher, DropCounters, Dropped, OpenTicket, Opener, PacketKey, Protection, SealError,
    SealTicket, Sealer, Slot, TrafficSecret,
};
pub use replay::ReplayWindow;

use std::sync::Arc;

use super::wire::DATA_HEADER_LEN;

/// What a client brings to an authenticated connection: its key, the
/// server's key it pins (known_hosts, `--server-key`, or the ssh
/// channel), and the packet cipher it asks for.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// The client's own key pair (Noise IK's static key).
    pub identity: StaticKeypair,
    /// The server's public key: a hello is sealed to it, and an answer
    /// from any other key is refused.
    pub server_key: PublicKey,
    /// The packet cipher asked for.
    pub cipher: Cipher,
}

/// What a server accepts.
#[derive(Debug, Clone, Default)]
pub struct ServerAuth {
    /// The server's key; `None`: no authenticated hello is answered.
    pub identity: Option<StaticKeypair>,
    /// Client keys allowed, with their restrictions; `None` accepts any
    /// key (a probe sink: nothing is written anywhere).
    pub authorized: Option<Arc<AuthorizedKeys>>,
    /// Unauthenticated, unencrypted hellos are served too (`--no-auth`,
    /// or a plain `atou serve` for probes).
    pub allow_plain: bool,
}

impl ServerAuth {
    /// Today's behaviour: plain hellos only.
    pub fn plain() -> ServerAuth {
        ServerAuth {
            identity: None,
            authorized: None,
            allow_plain: true,
        }
    }
}

/// Payload bytes in a full data segment of `mss` bytes protected with a
/// tag of `tag_len` bytes: the one place this is computed for protected
/// packets. With [`Protection::Null`] (`tag_len` 0) it is today's
/// `Tuning::payload_size`, so unprotected runs keep their segment sizes.
/// `None` if the header and tag leave no room for a payload byte.
pub fn payload_size(mss: usize, tag_len: usize) -> Option<usize> {
    mss.checked_sub(DATA_HEADER_LEN + tag_len)
        .filter(|&n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::Tuning;

    #[test]
    fn null_protection_keeps_todays_payload_size() {
        let t = Tuning::default();
        assert_eq!(
            payload_size(t.mss as usize, Protection::Null.tag_len()),
            Some(t.payload_size())
        );
    }

    #[test]
    fn a_tag_takes_its_bytes_from_the_payload_and_a_tiny_mss_gives_none() {
        assert_eq!(payload_size(1400, 16), Some(1400 - DATA_HEADER_LEN - 16));
        assert_eq!(payload_size(DATA_HEADER_LEN + 16, 16), None);
        assert_eq!(payload_size(3, 16), None);
    }
}
