//! The price of a public-key operation: token buckets per source and for
//! all sources together, checked before a hello costs any Diffie-Hellman.
//!
//! The per-source bucket is WireGuard's (`drivers/net/wireguard/ratelimiter.c`):
//! tokens are nanoseconds, a hello costs a second's share of the rate, a
//! bucket holds a burst's worth, and a source is an IPv4 address or an
//! IPv6 /64 (one host's share of addresses, which it can change at will).
//! Spoofed sources are unlimited, so the table is bounded: entries idle
//! for a second (their bucket full again, as good as absent) are swept
//! once a second, as WireGuard's garbage collector does, and a new source
//! in a full table takes the place of the fullest buckets (a quarter of
//! the table at once) instead of being refused (WireGuard refuses it,
//! which lets a table filled by a flood lock out every new source until
//! the sweep).
//!
//! Unlike ratelimiter.c, which only runs under load, once every packet
//! must carry a cookie, this one runs always, so a source's budget is
//! split by proof: hellos that carried a valid cookie have a bucket of
//! their own, which a spoofer sending in the source's name cannot spend
//! ([`RateLimiter::unvalidated_spent`] tells the server when to ask a
//! source for its cookie).
//!
//! Nothing here reads a clock: every call takes `now`.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::time::Duration;

use crate::proto::Time;

const NANOS_PER_SEC: u64 = 1_000_000_000;

/// What a source is counted as: an IPv4 address, or an IPv6 /64
/// (ratelimiter.c keys IPv6 by its upper 64 bits). An IPv4-mapped IPv6
/// address is its IPv4 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    V4([u8; 4]),
    V6([u8; 8]),
}

impl Source {
    pub fn of(ip: IpAddr) -> Source {
        match ip {
            IpAddr::V4(a) => Source::V4(a.octets()),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Source::V4(v4.octets()),
                None => {
                    let o = a.octets();
                    Source::V6(o[..8].try_into().expect("8 bytes"))
                }
            },
        }
    }
}

/// One token bucket, in nanoseconds of credit (ratelimiter.c's
/// `tokens`, `last_time_ns`).
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u64,
    last: Time,
}

/// A rate and a burst, as the cost of one event and the most a bucket
/// holds, in nanoseconds (ratelimiter.c's `PACKET_COST`, `TOKEN_MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    cost: u64,
    max: u64,
}

impl Rate {
    /// `per_sec` events a second, `burst` at once (each at least 1).
    pub fn new(per_sec: u32, burst: u32) -> Rate {
        let cost = NANOS_PER_SEC / u64::from(per_sec.max(1));
        Rate {
            cost,
            max: cost.saturating_mul(u64::from(burst.max(1))),
        }
    }

    /// A bucket as it would be at `now`, refilled, without taking.
    fn refilled(&self, b: &Bucket, now: Time) -> u64 {
        let elapsed = now.saturating_since(b.last).as_nanos();
        let elapsed = u64::try_from(elapsed).unwrap_or(u64::MAX);
        b.tokens.saturating_add(elapsed).min(self.max)
    }

    /// Refills `b` to `now` and takes one event's tokens if it has them.
    fn take(&self, b: &mut Bucket, now: Time) -> bool {
        b.tokens = self.refilled(b, now);
        b.last = b.last.max(now);
        if b.tokens >= self.cost {
            b.tokens -= self.cost;
            true
        } else {
            false
        }
    }

    fn full(&self, now: Time) -> Bucket {
        Bucket {
            tokens: self.max,
            last: now,
        }
    }
}

/// Why a hello is not worth a public-key operation now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    /// Its source spent its budget.
    Source,
    /// All sources together spent theirs.
    Global,
}

/// How often idle entries are swept (ratelimiter.c's `gc_entries`, every
/// second), and how long an entry must have been idle to go: by then its
/// bucket is full, so forgetting it gives its key nothing.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

/// Token buckets of one rate, one per key, at most `capacity` of them:
/// entries idle for a second are swept once a second, and a new key in a
/// full table takes the place of the fullest buckets. Forgetting a key
/// only ever fills its bucket, so an attacker who churns the table can
/// give budget away, never take it from anyone.
#[derive(Debug)]
pub struct Buckets<K> {
    rate: Rate,
    map: HashMap<K, Bucket>,
    capacity: usize,
    swept: Time,
}

impl<K: Copy + Eq + Hash> Buckets<K> {
    /// `rate` for each key, at most `capacity` keys (at least 1).
    pub fn new(rate: Rate, capacity: usize) -> Buckets<K> {
        Buckets {
            rate,
            map: HashMap::new(),
            capacity: capacity.max(1),
            swept: Time::ZERO,
        }
    }

    /// Takes one event's tokens from `key`'s bucket if it has them.
    pub fn take(&mut self, now: Time, key: K) -> bool {
        self.sweep(now);
        if !self.map.contains_key(&key) && self.map.len() >= self.capacity {
            self.make_room(now);
        }
        let rate = self.rate;
        let bucket = self.map.entry(key).or_insert_with(|| rate.full(now));
        rate.take(bucket, now)
    }

    /// Whether `key`'s bucket lacks one event's tokens at `now`. Changes
    /// nothing.
    pub fn is_spent(&self, now: Time, key: K) -> bool {
        self.map
            .get(&key)
            .is_some_and(|b| self.rate.refilled(b, now) < self.rate.cost)
    }

    /// Gives one event's tokens back to `key` (never past the burst).
    pub fn refund(&mut self, now: Time, key: K) {
        let rate = self.rate;
        if let Some(b) = self.map.get_mut(&key) {
            b.tokens = rate
                .refilled(b, now)
                .saturating_add(rate.cost)
                .min(rate.max);
            b.last = b.last.max(now);
        }
    }

    /// Keys tracked now (at most the capacity).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// No key tracked.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Forgets, once a second, the keys idle for a second.
    fn sweep(&mut self, now: Time) {
        if now.saturating_since(self.swept) < SWEEP_EVERY {
            return;
        }
        self.swept = now;
        self.map
            .retain(|_, b| now.saturating_since(b.last) < SWEEP_EVERY);
    }

    /// Makes room for new keys: the fullest quarter of the buckets now
    /// (the least active) go at once. A flood of new keys (spoofed
    /// addresses, a new one each datagram) then costs one pass over the
    /// table per quarter of it, where taking out the single fullest cost
    /// one pass per key.
    fn make_room(&mut self, now: Time) {
        let rate = self.rate;
        let mut by_fill: Vec<(u64, K)> = self
            .map
            .iter()
            .map(|(k, b)| (rate.refilled(b, now), *k))
            .collect();
        let first_out = by_fill.len() - (by_fill.len() / 4).max(1);
        by_fill.select_nth_unstable_by_key(first_out, |&(tokens, _)| tokens);
        for (_, key) in &by_fill[first_out..] {
            self.map.remove(key);
        }
    }
}

/// A source's budget is two buckets: one for the hellos that carried a
/// valid cookie (which only the address's owner receives) and one for
/// the rest. An off-path spoofer can send hellos in any address's name,
/// so it can spend that address's second bucket, never its first: the
/// owner, turned away there, is answered with a cookie
/// ([`RateLimiter::unvalidated_spent`]) and gets in on its own budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Charged {
    source: Source,
    address_validated: bool,
}

/// Per-source buckets and one for everyone, with a bounded table.
#[derive(Debug)]
pub struct RateLimiter {
    global_rate: Rate,
    global: Bucket,
    sources: Buckets<Charged>,
    /// Sources where an authorized key made a session lately, and until
    /// when that counts ([`RateLimiter::prove`]).
    proven: HashMap<Source, Time>,
}

/// How long a source that made a session is spared the global budget.
pub const PROVEN_FOR: Duration = Duration::from_secs(600);

/// Sources spared the global budget at once.
const PROVEN_MAX: usize = 4096;

impl RateLimiter {
    /// `per_source` for each source (each of its two buckets); `global`
    /// for all together; at most `capacity` buckets tracked (at least 1).
    pub fn new(per_source: Rate, global: Rate, capacity: usize) -> RateLimiter {
        RateLimiter {
            global_rate: global,
            global: global.full(Time::ZERO),
            sources: Buckets::new(per_source, capacity),
            proven: HashMap::new(),
        }
    }

    /// An authorized key made a session from `ip`: for [`PROVEN_FOR`] its
    /// hellos are held to their source's budget only, not to everyone's,
    /// so that a flood that spends the global budget (distinct hellos
    /// from many addresses, each with its cookie) does not lock out the
    /// clients the server already knows. A spoofer cannot borrow this:
    /// past the server's load threshold (200 hellos worked a second)
    /// every hello must carry a cookie, which only the address's owner
    /// receives, and each source keeps its own bucket.
    pub fn prove(&mut self, now: Time, ip: IpAddr) {
        let source = Source::of(ip);
        if !self.proven.contains_key(&source) && self.proven.len() >= PROVEN_MAX {
            self.proven.retain(|_, until| *until > now);
            if self.proven.len() >= PROVEN_MAX {
                if let Some(soonest) = self
                    .proven
                    .iter()
                    .min_by_key(|(_, until)| **until)
                    .map(|(s, _)| *s)
                {
                    self.proven.remove(&soonest);
                }
            }
        }
        self.proven.insert(source, now + PROVEN_FOR);
    }

    fn is_proven(&self, now: Time, source: &Source) -> bool {
        self.proven.get(source).is_some_and(|until| *until > now)
    }

    /// Buckets tracked now (at most the capacity).
    pub fn tracked(&self) -> usize {
        self.sources.len()
    }

    /// Whether `ip`'s bucket for hellos without a valid cookie is spent:
    /// its next such hello would be dropped, so the server asks it for a
    /// cookie instead, as it does everyone's under load. Changes nothing.
    pub fn unvalidated_spent(&self, now: Time, ip: IpAddr) -> bool {
        self.sources.is_spent(
            now,
            Charged {
                source: Source::of(ip),
                address_validated: false,
            },
        )
    }

    /// Whether one hello from `ip` (`address_validated`: it carried a
    /// valid cookie) may cost a public-key operation at `now`; if so, its
    /// tokens are taken from its source's bucket of that kind and from
    /// everyone's. The source's bucket is checked first, so a source over
    /// its budget takes nothing from everyone else's.
    pub fn allow(&mut self, now: Time, ip: IpAddr, address_validated: bool) -> Result<(), Limited> {
        let source = Source::of(ip);
        let charged = Charged {
            source,
            address_validated,
        };
        if !self.sources.take(now, charged) {
            return Err(Limited::Source);
        }
        if !self.is_proven(now, &source) && !self.global_rate.take(&mut self.global, now) {
            // Not spent after all: the source keeps its tokens.
            self.sources.refund(now, charged);
            return Err(Limited::Global);
        }
        if address_validated {
            // What it may spend without a cookie is spent too, if it is
            // there, so that the two buckets together allow one rate, not
            // two, to a source that mixes its hellos.
            let unvalidated = Charged {
                address_validated: false,
                ..charged
            };
            let _ = self.sources.take(now, unvalidated);
        }
        Ok(())
    }

    /// Gives back the source's tokens for a hello that turned out to be
    /// worth its price (it made a session): the streams of one transfer,
    /// which start together, are not held back by their own bucket. The
    /// global budget is not refunded: the work was done.
    pub fn refund(&mut self, now: Time, ip: IpAddr, address_validated: bool) {
        self.sources.refund(
            now,
            Charged {
                source: Source::of(ip),
                address_validated,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn ms(n: u64) -> Time {
        Time::ZERO + Duration::from_millis(n)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// A hello without a cookie.
    fn allow(r: &mut RateLimiter, now: Time, ip: IpAddr) -> Result<(), Limited> {
        r.allow(now, ip, false)
    }

    fn refund(r: &mut RateLimiter, now: Time, ip: IpAddr) {
        r.refund(now, ip, false)
    }

    fn wireguard(capacity: usize) -> RateLimiter {
        RateLimiter::new(Rate::new(20, 5), Rate::new(1_000_000, 1_000_000), capacity)
    }

    /// ratelimiter.c: a burst of PACKETS_BURSTABLE (5), then one every
    /// 1/PACKETS_PER_SECOND (50 ms).
    #[test]
    fn a_source_gets_its_burst_then_twenty_a_second() {
        let mut r = wireguard(16);
        let a = ip("192.0.2.1");
        for _ in 0..5 {
            assert_eq!(allow(&mut r, ms(0), a), Ok(()));
        }
        assert_eq!(allow(&mut r, ms(0), a), Err(Limited::Source));
        assert_eq!(allow(&mut r, ms(49), a), Err(Limited::Source));
        assert_eq!(allow(&mut r, ms(50), a), Ok(()));
        assert_eq!(allow(&mut r, ms(50), a), Err(Limited::Source));
        // Over a second from empty: 20 more, and never more than the burst.
        let allowed = (51..1051)
            .filter(|&t| allow(&mut r, ms(t), a).is_ok())
            .count();
        assert_eq!(allowed, 20);
        assert_eq!(
            (0..10)
                .filter(|_| allow(&mut r, ms(10_000), a).is_ok())
                .count(),
            5
        );
        // Another source has its own bucket.
        assert_eq!(allow(&mut r, ms(50), ip("192.0.2.2")), Ok(()));
    }

    #[test]
    fn an_ipv6_source_is_its_slash_64_and_a_mapped_address_its_ipv4() {
        let mut r = wireguard(16);
        for i in 0..5u16 {
            let a = Ipv6Addr::new(0x2001, 0xdb8, 0, 1, i, i, i, i);
            assert_eq!(allow(&mut r, ms(0), IpAddr::V6(a)), Ok(()));
        }
        assert_eq!(
            allow(&mut r, ms(0), ip("2001:db8:0:1:ffff::1")),
            Err(Limited::Source)
        );
        assert_eq!(allow(&mut r, ms(0), ip("2001:db8:0:2::1")), Ok(()));
        assert_eq!(
            Source::of(ip("::ffff:192.0.2.9")),
            Source::of(ip("192.0.2.9"))
        );
    }

    #[test]
    fn the_global_budget_holds_whatever_the_number_of_sources() {
        let mut r = RateLimiter::new(Rate::new(20, 5), Rate::new(100, 25), 4096);
        let allowed = (0..1000u32)
            .filter(|i| {
                let a = IpAddr::from([10, 0, (i >> 8) as u8, *i as u8]);
                allow(&mut r, ms(u64::from(*i)), a).is_ok()
            })
            .count();
        // 25 at once, then 100 a second over the 999 ms.
        assert!((25..=25 + 100).contains(&allowed), "{allowed}");
        // A source turned away by the global budget kept its own tokens.
        let mut r = RateLimiter::new(Rate::new(20, 5), Rate::new(1, 1), 16);
        assert_eq!(allow(&mut r, ms(0), ip("192.0.2.1")), Ok(()));
        for _ in 0..10 {
            assert_eq!(allow(&mut r, ms(0), ip("192.0.2.2")), Err(Limited::Global));
        }
        assert_eq!(allow(&mut r, ms(1000), ip("192.0.2.2")), Ok(()));
    }

    /// A flood that spends the global budget does not lock out a source
    /// where an authorized key made a session lately: it keeps its own
    /// budget, and only for [`PROVEN_FOR`].
    #[test]
    fn a_proven_source_is_held_to_its_own_budget_only() {
        let mut r = RateLimiter::new(Rate::new(20, 5), Rate::new(1, 1), 16);
        assert_eq!(allow(&mut r, ms(0), ip("192.0.2.1")), Ok(()));
        // The global budget is spent.
        assert_eq!(allow(&mut r, ms(1), ip("192.0.2.2")), Err(Limited::Global));
        r.prove(ms(1), ip("192.0.2.2"));
        for i in 0..5 {
            assert_eq!(allow(&mut r, ms(2), ip("192.0.2.2")), Ok(()), "hello {i}");
        }
        // Its own bucket still holds it.
        assert_eq!(allow(&mut r, ms(2), ip("192.0.2.2")), Err(Limited::Source));
        // Another address of the same IPv6 /64 counts as the same source;
        // one outside it does not.
        r.prove(ms(2), ip("2001:db8::1"));
        assert_eq!(allow(&mut r, ms(3), ip("2001:db8::2")), Ok(()));
        assert_eq!(
            allow(&mut r, ms(3), ip("2001:db8:1::2")),
            Err(Limited::Global)
        );
        // Past PROVEN_FOR, the global budget again (spent by others).
        let later = ms(2) + PROVEN_FOR;
        assert_eq!(allow(&mut r, later, ip("192.0.2.9")), Ok(()));
        assert_eq!(allow(&mut r, later, ip("192.0.2.2")), Err(Limited::Global));
    }

    #[test]
    fn the_table_stays_within_its_capacity_and_forgets_the_fullest() {
        let mut r = wireguard(8);
        let busy = ip("192.0.2.200");
        for _ in 0..5 {
            allow(&mut r, ms(0), busy).unwrap();
        }
        for i in 0..1000u32 {
            let a = IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
            let _ = allow(&mut r, ms(1), a);
            assert!(r.tracked() <= 8);
        }
        // The busy source, its bucket empty, was never the one forgotten.
        assert_eq!(allow(&mut r, ms(1), busy), Err(Limited::Source));
        // Room is made a quarter of the table at a time: 8 full, one
        // more key, 8 - 2 + 1.
        let mut b = Buckets::new(Rate::new(20, 5), 8);
        for i in 0..8u8 {
            assert!(b.take(ms(2), i));
        }
        assert!(b.take(ms(2), 100));
        assert_eq!(b.len(), 7);
    }

    #[test]
    fn idle_sources_are_swept_once_a_second() {
        let mut r = wireguard(64);
        for i in 0..50u8 {
            allow(&mut r, ms(0), IpAddr::from([10, 0, 0, i])).unwrap();
        }
        assert_eq!(r.tracked(), 50);
        allow(&mut r, ms(999), ip("192.0.2.1")).unwrap();
        allow(&mut r, ms(1000), ip("192.0.2.2")).unwrap();
        assert_eq!(r.tracked(), 2, "the 50 idle for a second went");
    }

    #[test]
    fn a_refund_gives_back_one_hello_and_never_more_than_the_burst() {
        let mut r = wireguard(16);
        let a = ip("192.0.2.1");
        for _ in 0..100 {
            allow(&mut r, ms(0), a).unwrap();
            refund(&mut r, ms(0), a);
        }
        for _ in 0..5 {
            allow(&mut r, ms(0), a).unwrap();
        }
        assert_eq!(allow(&mut r, ms(0), a), Err(Limited::Source));
    }

    /// Hellos in an address's name without a cookie (what an off-path
    /// spoofer can send) spend that source's bucket for them, not the
    /// one of the hellos that proved the address; and the server can see
    /// the first is spent without spending anything.
    #[test]
    fn hellos_without_a_cookie_cannot_spend_the_budget_of_those_with_one() {
        let mut r = wireguard(16);
        let a = ip("192.0.2.1");
        assert!(!r.unvalidated_spent(ms(0), a));
        for _ in 0..5 {
            assert_eq!(r.allow(ms(0), a, false), Ok(()));
        }
        assert_eq!(r.allow(ms(0), a, false), Err(Limited::Source));
        assert!(r.unvalidated_spent(ms(0), a));
        assert!(r.unvalidated_spent(ms(0), a), "looking took nothing");
        assert!(!r.unvalidated_spent(ms(50), a), "refilled");
        for i in 0..5 {
            assert_eq!(r.allow(ms(0), a, true), Ok(()), "hello {i} with a cookie");
        }
        assert_eq!(r.allow(ms(0), a, true), Err(Limited::Source));
        // A refund goes to the bucket that was charged.
        r.refund(ms(0), a, true);
        assert_eq!(r.allow(ms(0), a, false), Err(Limited::Source));
        assert_eq!(r.allow(ms(0), a, true), Ok(()));
        // A hello with a cookie turned away by the global budget takes
        // nothing from either of its source's buckets.
        let mut r = RateLimiter::new(Rate::new(20, 5), Rate::new(1, 1), 16);
        assert_eq!(r.allow(ms(0), ip("192.0.2.9"), false), Ok(()));
        for _ in 0..10 {
            assert_eq!(r.allow(ms(0), a, true), Err(Limited::Global));
        }
        r.prove(ms(0), a);
        for _ in 0..5 {
            assert_eq!(r.allow(ms(0), a, false), Ok(()));
        }
        // Hellos with a cookie spend what the source may spend without
        // one, while there is any: mixing the two buys no second rate.
        let mut r = wireguard(16);
        let mixed = (0..1000)
            .filter(|&t| r.allow(ms(t), a, t % 2 == 0).is_ok())
            .count();
        assert!(mixed <= 5 + 5 + 20, "{mixed}");
        // An IPv6 /64 is one source for both.
        let mut r = wireguard(16);
        for _ in 0..5 {
            r.allow(ms(0), ip("2001:db8::1"), false).unwrap();
        }
        assert!(r.unvalidated_spent(ms(0), ip("2001:db8::2")));
        assert!(!r.unvalidated_spent(ms(0), ip("2001:db8:1::2")));
    }

    #[test]
    fn buckets_keyed_by_address_hold_each_to_its_rate() {
        let mut b = Buckets::new(Rate::new(20, 2), 2);
        let (x, y, z) = ("192.0.2.1:1", "192.0.2.1:2", "192.0.2.1:3");
        let k = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(b.take(ms(0), k(x)) && b.take(ms(0), k(x)));
        assert!(!b.take(ms(0), k(x)));
        assert!(b.is_spent(ms(0), k(x)) && !b.is_spent(ms(0), k(y)));
        assert!(b.take(ms(0), k(y)));
        // A third key in a table of two: the fullest (y) goes, x stays spent.
        assert!(b.take(ms(0), k(z)));
        assert_eq!(b.len(), 2);
        assert!(b.is_spent(ms(0), k(x)));
    }
}
