//! Stateless address validation: a cookie is a MAC of the client's
//! address and a time bucket under a secret only the server knows, so the
//! server can ask a client to prove it receives at its address without
//! keeping anything per client (WireGuard's cookie reply, whitepaper §5.4.7;
//! QUIC's Retry token, RFC 9000 §8.1.2).
//!
//! The MAC is BLAKE3 in keyed mode (from the `blake3` crate). Buckets are
//! [`BUCKET`] long; a cookie verifies in the bucket it was issued in and the
//! next, so it lives between one and two buckets. The secret rotates (the
//! server calls [`CookieSecret::rotate`] with fresh random bytes every
//! bucket or so); cookies under the previous secret still verify.
//!
//! An address token (a plain hello's, from a [`Retry`](crate::proto::wire::Retry))
//! is the same MAC in another domain, of the IP address alone: the
//! client may send its next connections' hellos from other ports with
//! the same token (RFC 9000 §8.1.3: a token's client may have another
//! port), and proving it receives at the IP is what stops a spoofer.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::proto::wire::{AddressToken, TOKEN_LEN};
use crate::proto::Time;

/// Length of a time bucket (WireGuard renews its cookie secret every two
/// minutes).
pub const BUCKET: Duration = Duration::from_secs(120);

/// Bytes of a cookie.
pub const COOKIE_LEN: usize = 32;

/// A cookie as it travels in a hello.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Cookie([u8; COOKIE_LEN]);

impl std::fmt::Debug for Cookie {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cookie(..)")
    }
}

fn bucket(now: Time) -> u64 {
    now.as_nanos() / BUCKET.as_nanos() as u64
}

/// The address as the MAC sees it: family, address, port.
fn address_bytes(peer: &SocketAddr) -> ([u8; 19], usize) {
    let mut out = [0u8; 19];
    match peer {
        SocketAddr::V4(a) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&a.ip().octets());
            out[5..7].copy_from_slice(&a.port().to_be_bytes());
            (out, 7)
        }
        SocketAddr::V6(a) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&a.ip().octets());
            out[17..19].copy_from_slice(&a.port().to_be_bytes());
            (out, 19)
        }
    }
}

fn mac(secret: &[u8; 32], peer: &SocketAddr, bucket: u64) -> blake3::Hash {
    let (addr, len) = address_bytes(peer);
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(b"atou cookie v1");
    h.update(&bucket.to_be_bytes());
    h.update(&addr[..len]);
    h.finalize()
}

/// The address token's MAC: the IP (an IPv4-mapped address as IPv4),
/// under its own label.
fn token_mac(secret: &[u8; 32], ip: IpAddr, bucket: u64) -> AddressToken {
    let ip = ip.to_canonical();
    let mut h = blake3::Hasher::new_keyed(secret);
    h.update(b"atou address token v1");
    h.update(&bucket.to_be_bytes());
    match ip {
        IpAddr::V4(a) => h.update(&[4]).update(&a.octets()),
        IpAddr::V6(a) => h.update(&[6]).update(&a.octets()),
    };
    h.finalize().as_bytes()[..TOKEN_LEN]
        .try_into()
        .expect("TOKEN_LEN bytes")
}

/// Compares two tokens in time that does not depend on where they differ.
fn same_token(a: &AddressToken, b: &AddressToken) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Cookie {
    pub fn from_bytes(bytes: [u8; COOKIE_LEN]) -> Cookie {
        Cookie(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; COOKIE_LEN] {
        &self.0
    }

    /// The cookie for `peer` in the bucket of `now`.
    pub fn issue(secret: &[u8; 32], peer: &SocketAddr, now: Time) -> Cookie {
        Cookie(*mac(secret, peer, bucket(now)).as_bytes())
    }

    /// Whether this cookie was issued to `peer` under `secret` in the
    /// bucket of `now` or the one before. The comparison takes constant
    /// time (`blake3::Hash`'s equality).
    pub fn verify(&self, secret: &[u8; 32], peer: &SocketAddr, now: Time) -> bool {
        let got = blake3::Hash::from_bytes(self.0);
        let b = bucket(now);
        let current = mac(secret, peer, b) == got;
        let previous = b > 0 && mac(secret, peer, b - 1) == got;
        current | previous
    }
}

/// The server's cookie secret and the one before it.
pub struct CookieSecret {
    current: [u8; 32],
    previous: Option<[u8; 32]>,
}

impl std::fmt::Debug for CookieSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CookieSecret(..)")
    }
}

impl Drop for CookieSecret {
    fn drop(&mut self) {
        use zeroize::Zeroize;
        self.current.zeroize();
        if let Some(p) = &mut self.previous {
            p.zeroize();
        }
    }
}

impl CookieSecret {
    /// `fresh`: 32 bytes from the OS CSPRNG (tests pass fixed bytes).
    pub fn new(fresh: [u8; 32]) -> CookieSecret {
        CookieSecret {
            current: fresh,
            previous: None,
        }
    }

    /// 32 bytes from the OS CSPRNG, through ring.
    pub fn random() -> Result<CookieSecret, ring::error::Unspecified> {
        let mut b = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)?;
        Ok(CookieSecret::new(b))
    }

    /// Replaces the secret; cookies under the old one keep verifying until
    /// the next rotation.
    pub fn rotate(&mut self, fresh: [u8; 32]) {
        self.previous = Some(std::mem::replace(&mut self.current, fresh));
    }

    pub fn issue(&self, peer: &SocketAddr, now: Time) -> Cookie {
        Cookie::issue(&self.current, peer, now)
    }

    pub fn verify(&self, cookie: &Cookie, peer: &SocketAddr, now: Time) -> bool {
        cookie.verify(&self.current, peer, now)
            | self
                .previous
                .as_ref()
                .is_some_and(|p| cookie.verify(p, peer, now))
    }

    /// The address token for `ip` in the bucket of `now`.
    pub fn issue_token(&self, ip: IpAddr, now: Time) -> AddressToken {
        token_mac(&self.current, ip, bucket(now))
    }

    /// Whether `token` was issued to `ip` in the bucket of `now` or the
    /// one before, under this secret or the previous one.
    pub fn verify_token(&self, token: &AddressToken, ip: IpAddr, now: Time) -> bool {
        let b = bucket(now);
        let secrets = std::iter::once(&self.current).chain(self.previous.as_ref());
        let mut ok = false;
        for secret in secrets {
            ok |= same_token(token, &token_mac(secret, ip, b));
            ok |= b > 0 && same_token(token, &token_mac(secret, ip, b - 1));
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(buckets: f64) -> Time {
        Time::from_secs_f64(buckets * BUCKET.as_secs_f64())
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_cookie_verifies_for_its_address_in_its_bucket_and_the_next() {
        let s = CookieSecret::new([1; 32]);
        let a = addr("192.0.2.1:4000");
        let c = s.issue(&a, at(10.5));
        assert!(s.verify(&c, &a, at(10.0)));
        assert!(s.verify(&c, &a, at(10.99)));
        assert!(s.verify(&c, &a, at(11.99)));
    }

    #[test]
    fn a_cookie_from_an_expired_bucket_is_refused() {
        let s = CookieSecret::new([1; 32]);
        let a = addr("192.0.2.1:4000");
        let c = s.issue(&a, at(10.5));
        assert!(!s.verify(&c, &a, at(12.0)));
        assert!(!s.verify(&c, &a, at(9.9)), "nor one from the future");
    }

    #[test]
    fn a_cookie_for_another_address_or_port_is_refused() {
        let s = CookieSecret::new([1; 32]);
        let c = s.issue(&addr("192.0.2.1:4000"), at(3.0));
        assert!(!s.verify(&c, &addr("192.0.2.2:4000"), at(3.0)));
        assert!(!s.verify(&c, &addr("192.0.2.1:4001"), at(3.0)));
        assert!(!s.verify(&c, &addr("[::ffff:192.0.2.1]:4000"), at(3.0)));
    }

    #[test]
    fn rotation_keeps_the_previous_secret_one_round_only() {
        let mut s = CookieSecret::new([1; 32]);
        let a = addr("[2001:db8::1]:9");
        let c = s.issue(&a, at(1.0));
        s.rotate([2; 32]);
        assert!(s.verify(&c, &a, at(1.0)));
        assert_ne!(s.issue(&a, at(1.0)), c);
        s.rotate([3; 32]);
        assert!(!s.verify(&c, &a, at(1.0)));
    }

    #[test]
    fn an_address_token_is_bound_to_the_ip_not_the_port_and_expires() {
        let mut s = CookieSecret::new([1; 32]);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        let t = s.issue_token(ip, at(10.5));
        assert!(s.verify_token(&t, ip, at(11.9)));
        assert!(s.verify_token(&t, "::ffff:192.0.2.1".parse().unwrap(), at(10.5)));
        assert!(!s.verify_token(&t, "192.0.2.2".parse().unwrap(), at(10.5)));
        assert!(!s.verify_token(&t, ip, at(12.0)));
        // Not a cookie: another domain of the same secret.
        let c = s.issue(&addr("192.0.2.1:0"), at(10.5));
        assert_ne!(&c.as_bytes()[..TOKEN_LEN], &t[..]);
        let mut forged = t;
        forged[0] ^= 1;
        assert!(!s.verify_token(&forged, ip, at(10.5)));
        s.rotate([2; 32]);
        assert!(s.verify_token(&t, ip, at(10.5)));
        s.rotate([3; 32]);
        assert!(!s.verify_token(&t, ip, at(10.5)));
    }

    #[test]
    fn a_forged_cookie_is_refused() {
        let s = CookieSecret::new([1; 32]);
        let a = addr("192.0.2.1:4000");
        assert!(!s.verify(&Cookie::from_bytes([0; COOKIE_LEN]), &a, at(0.0)));
        let mut c = *s.issue(&a, at(0.0)).as_bytes();
        c[31] ^= 1;
        assert!(!s.verify(&Cookie::from_bytes(c), &a, at(0.0)));
    }
}
