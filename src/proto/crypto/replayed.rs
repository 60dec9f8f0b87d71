//! Hellos replayed in bulk: which ones the driver should drop before they
//! are read.
//!
//! A copy of a hello already worked through costs the server a lookup
//! ([`Responder::screen`](super::Responder::screen)), but reading it from
//! the socket costs more: at the rate one thread sends 1,200-byte
//! datagrams on loopback (about 190,000 a second), the system calls that
//! read them fill most of a core before any lookup. No client sends one
//! hello more than a few times (it resends on a timeout and once more with
//! a cookie), so a hello seen `copies_before_drop` times (the server's
//! `replayed_copies_before_drop` limit) within a second is a replay, and
//! the driver can drop its further copies in the kernel (a socket filter
//! matching its client id, `io::socket::UdpIo::drop_hellos`), where they
//! cost the server nothing.
//!
//! What a spoofer can do with it: only a hello it holds a copy of can be
//! dropped, and the server has already worked through that one (a copy is
//! only counted once its digest is known), so no client's next hello, which
//! carries a fresh random id, is ever affected. Data packets never match.
//!
//! Bounded: ids counted at once and ids dropped at once each have a cap,
//! and a dropped id is dropped for [`DROP_FOR`], then counted afresh.
//!
//! Nothing here reads a clock: every call takes `now`.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::proto::Time;

/// Copies of one hello within a second after which its further copies
/// are dropped before they are read. A client resends a hello on a
/// timeout of at least its RTT estimate and once with a cookie: a handful
/// a second at the very most.
pub const DEFAULT_COPIES_BEFORE_DROP: u32 = 64;

/// How long a replayed hello is dropped before it is counted afresh.
pub const DROP_FOR: Duration = Duration::from_secs(60);

/// Hellos whose copies are counted at once.
const MAX_COUNTED: usize = 1024;

/// Hellos dropped at once: what a socket filter holds comfortably (five
/// instructions each, of the 4,096 classic BPF allows).
pub const MAX_DROPPED: usize = 256;

#[derive(Debug, Clone, Copy)]
struct Copies {
    since: Time,
    count: u32,
}

/// The hellos (by client id) whose copies arrive faster than any client
/// resends one, and the list the driver drops.
#[derive(Debug)]
pub struct ReplayedHellos {
    copies_before_drop: u32,
    counted: HashMap<u64, Copies>,
    /// Client ids dropped, oldest first, with the time each stops being.
    dropped: VecDeque<(u64, Time)>,
    changed: bool,
}

impl ReplayedHellos {
    /// `copies_before_drop` 0: never drop.
    pub fn new(copies_before_drop: u32) -> ReplayedHellos {
        ReplayedHellos {
            copies_before_drop,
            counted: HashMap::new(),
            dropped: VecDeque::new(),
            changed: false,
        }
    }

    /// A copy of the hello of `client_id`, already worked through, arrived.
    /// True when this copy makes it one to drop.
    pub fn on_copy(&mut self, now: Time, client_id: u64) -> bool {
        if self.copies_before_drop == 0 {
            return false;
        }
        self.expire(now);
        if self.dropped.iter().any(|&(id, _)| id == client_id) {
            // Already on the list; a copy read before the filter took.
            return false;
        }
        let second = Duration::from_secs(1);
        if !self.counted.contains_key(&client_id) && self.counted.len() >= MAX_COUNTED {
            self.counted
                .retain(|_, c| now.saturating_since(c.since) < second);
            if self.counted.len() >= MAX_COUNTED {
                // As many distinct hellos replayed at once as are counted:
                // each copy still costs only a lookup.
                return false;
            }
        }
        let copies = self.counted.entry(client_id).or_insert(Copies {
            since: now,
            count: 0,
        });
        if now.saturating_since(copies.since) >= second {
            *copies = Copies {
                since: now,
                count: 0,
            };
        }
        copies.count += 1;
        if copies.count < self.copies_before_drop {
            return false;
        }
        self.counted.remove(&client_id);
        if self.dropped.len() >= MAX_DROPPED {
            self.dropped.pop_front();
        }
        self.dropped.push_back((client_id, now + DROP_FOR));
        self.changed = true;
        true
    }

    /// Forgets the drops whose time is over.
    pub fn expire(&mut self, now: Time) {
        while self.dropped.front().is_some_and(|&(_, until)| until <= now) {
            self.dropped.pop_front();
            self.changed = true;
        }
    }

    /// The client ids to drop, when they changed since the last call.
    pub fn poll_changed(&mut self) -> Option<Vec<u64>> {
        if !std::mem::take(&mut self.changed) {
            return None;
        }
        Some(self.dropped.iter().map(|&(id, _)| id).collect())
    }

    /// When the oldest drop ends.
    pub fn next_expiry(&self) -> Option<Time> {
        self.dropped.front().map(|&(_, until)| until)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Time = Time::from_nanos(1_000_000_000);

    fn at(ms: u64) -> Time {
        T0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_hello_copied_faster_than_a_client_resends_is_dropped() {
        let mut r = ReplayedHellos::new(64);
        for i in 0..63 {
            assert!(!r.on_copy(at(i), 7), "copy {i}");
        }
        assert_eq!(r.poll_changed(), None);
        assert!(r.on_copy(at(63), 7));
        assert_eq!(r.poll_changed(), Some(vec![7]));
        assert_eq!(r.poll_changed(), None);
        // Copies read before the filter took do not add it twice.
        assert!(!r.on_copy(at(64), 7));
        assert_eq!(r.poll_changed(), None);
    }

    #[test]
    fn copies_spread_over_seconds_are_a_client_resending() {
        let mut r = ReplayedHellos::new(64);
        for i in 0..1000 {
            assert!(!r.on_copy(at(i * 100), 7), "copy {i}");
        }
        assert_eq!(r.poll_changed(), None);
    }

    #[test]
    fn a_drop_ends_and_the_hello_is_counted_afresh() {
        let mut r = ReplayedHellos::new(2);
        r.on_copy(at(0), 7);
        assert!(r.on_copy(at(1), 7));
        assert_eq!(r.poll_changed(), Some(vec![7]));
        assert_eq!(r.next_expiry(), Some(at(1) + DROP_FOR));
        r.expire(at(1) + DROP_FOR);
        assert_eq!(r.poll_changed(), Some(vec![]));
        let later = at(2) + DROP_FOR;
        assert!(!r.on_copy(later, 7));
        assert!(r.on_copy(later, 7));
    }

    #[test]
    fn the_lists_are_bounded() {
        let mut r = ReplayedHellos::new(1);
        for id in 0..(MAX_DROPPED as u64 + 10) {
            assert!(r.on_copy(at(0), id));
        }
        let dropped = r.poll_changed().unwrap();
        assert_eq!(dropped.len(), MAX_DROPPED);
        // The oldest made room.
        assert_eq!(dropped[0], 10);

        let mut r = ReplayedHellos::new(64);
        for id in 0..(MAX_COUNTED as u64 * 4) {
            r.on_copy(at(0), id);
        }
        assert!(r.counted.len() <= MAX_COUNTED);
    }

    #[test]
    fn zero_never_drops() {
        let mut r = ReplayedHellos::new(0);
        for i in 0..1000 {
            assert!(!r.on_copy(at(i), 7));
        }
        assert_eq!(r.poll_changed(), None);
    }
}
