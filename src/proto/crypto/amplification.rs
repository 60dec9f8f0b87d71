//! Anti-amplification (RFC 9000 §8.1): until a peer's address is
//! validated, a server sends it at most three times the bytes it received
//! from it, so a spoofed source cannot turn the server into a reflector.

/// RFC 9000 §8.1: "an endpoint MUST limit the amount of data it sends to
/// the unvalidated address to three times the amount of data received
/// from that address".
pub const FACTOR: u64 = 3;

/// Bytes received from and sent to one address, until it is validated.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Budget {
    received: u64,
    sent: u64,
    validated: bool,
}

impl Budget {
    pub fn new() -> Budget {
        Budget::default()
    }

    /// A datagram of `bytes` arrived from the address (counted whether or
    /// not it was valid: RFC 9000 §8.1 counts every datagram received).
    pub fn on_received(&mut self, bytes: usize) {
        self.received = self.received.saturating_add(bytes as u64);
    }

    /// The address proved it receives: a valid cookie, or a packet
    /// authenticated under keys only a handshake through it could give.
    pub fn validate(&mut self) {
        self.validated = true;
    }

    pub fn is_validated(&self) -> bool {
        self.validated
    }

    /// Bytes that may still be sent; `u64::MAX` once validated.
    pub fn allowance(&self) -> u64 {
        if self.validated {
            return u64::MAX;
        }
        self.received
            .saturating_mul(FACTOR)
            .saturating_sub(self.sent)
    }

    /// Whether a datagram of `bytes` may be sent now.
    pub fn may_send(&self, bytes: usize) -> bool {
        bytes as u64 <= self.allowance()
    }

    /// Records a datagram sent; the caller asked [`may_send`](Self::may_send) first.
    pub fn on_sent(&mut self, bytes: usize) {
        self.sent = self.sent.saturating_add(bytes as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unvalidated_address_gets_at_most_three_times_what_it_sent() {
        let mut b = Budget::new();
        assert!(!b.may_send(1));
        b.on_received(1200);
        assert_eq!(b.allowance(), 3600);
        let mut sent = 0;
        while b.may_send(1000) {
            b.on_sent(1000);
            sent += 1000;
        }
        assert_eq!(sent, 3000);
        assert!(b.may_send(600));
        assert!(!b.may_send(601));
        b.on_received(100);
        assert!(b.may_send(900));
    }

    #[test]
    fn validation_lifts_the_limit() {
        let mut b = Budget::new();
        b.on_received(10);
        b.on_sent(30);
        assert!(!b.may_send(1));
        b.validate();
        assert!(b.may_send(1 << 30));
    }

    #[test]
    fn huge_counts_saturate_instead_of_wrapping() {
        let mut b = Budget::new();
        b.on_received(usize::MAX);
        b.on_received(usize::MAX);
        assert_eq!(b.allowance(), u64::MAX);
    }
}
