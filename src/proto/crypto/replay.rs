//! The anti-replay window of RFC 6479: a ring of 64-bit blocks indexed by
//! the packet number, so moving the window clears whole blocks instead of
//! shifting a bitmap.
//!
//! [`ReplayWindow::check`] says whether a packet number may be opened and
//! changes nothing; [`ReplayWindow::accept`] records it, and the caller
//! calls it only after the packet authenticated, so a forged packet
//! cannot move the window (RFC 6479 §2, as IPsec and WireGuard do).

/// Blocks in the ring (a power of two, RFC 6479 §3).
const BLOCKS: usize = 32;
const BLOCK_BITS: u64 = 64;
const INDEX_MASK: u64 = BLOCKS as u64 - 1;

/// Packet numbers this far below the highest accepted one are still
/// accepted once; older ones are refused. One block of the ring is kept
/// as the slack that lets the window move a block at a time (RFC 6479 §3:
/// "the effective window size is (N-1)*BLOCK_BITS").
pub const WINDOW: u64 = (BLOCKS as u64 - 1) * BLOCK_BITS;

/// Why a packet number is refused before its packet is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Accepted before.
    Replayed,
    /// At least [`WINDOW`] below the highest packet number accepted.
    TooOld,
}

/// The packet numbers accepted so far in one direction.
#[derive(Debug, Clone)]
pub struct ReplayWindow {
    /// Highest packet number accepted; meaningful once `any` is set.
    top: u64,
    any: bool,
    bitmap: [u64; BLOCKS],
}

impl Default for ReplayWindow {
    fn default() -> Self {
        ReplayWindow {
            top: 0,
            any: false,
            bitmap: [0; BLOCKS],
        }
    }
}

impl ReplayWindow {
    pub fn new() -> ReplayWindow {
        ReplayWindow::default()
    }

    /// Highest packet number accepted, if any.
    pub fn largest(&self) -> Option<u64> {
        self.any.then_some(self.top)
    }

    /// Whether `pn` may be opened: new, and not too old. Changes nothing.
    pub fn check(&self, pn: u64) -> Result<(), Refused> {
        if !self.any || pn > self.top {
            return Ok(());
        }
        if self.top - pn >= WINDOW {
            return Err(Refused::TooOld);
        }
        let (block, bit) = Self::position(pn);
        if self.bitmap[block] & bit != 0 {
            return Err(Refused::Replayed);
        }
        Ok(())
    }

    /// Records `pn` as accepted: call after its packet authenticated, and
    /// only if [`check`](Self::check) allowed it.
    pub fn accept(&mut self, pn: u64) {
        debug_assert!(self.check(pn).is_ok(), "accept({pn}) without check");
        if self.any && pn > self.top {
            // RFC 6479 §3: clear the blocks the window moves over, at most
            // the whole ring.
            let moved = pn / BLOCK_BITS - self.top / BLOCK_BITS;
            for i in 1..=moved.min(BLOCKS as u64) {
                self.bitmap[((self.top / BLOCK_BITS + i) & INDEX_MASK) as usize] = 0;
            }
        }
        if !self.any || pn > self.top {
            self.top = pn;
            self.any = true;
        }
        let (block, bit) = Self::position(pn);
        self.bitmap[block] |= bit;
    }

    fn position(pn: u64) -> (usize, u64) {
        (
            ((pn / BLOCK_BITS) & INDEX_MASK) as usize,
            1u64 << (pn % BLOCK_BITS),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn offer(w: &mut ReplayWindow, pn: u64) -> Result<(), Refused> {
        w.check(pn)?;
        w.accept(pn);
        Ok(())
    }

    #[test]
    fn each_packet_number_is_accepted_once() {
        let mut w = ReplayWindow::new();
        assert_eq!(offer(&mut w, 0), Ok(()));
        assert_eq!(offer(&mut w, 0), Err(Refused::Replayed));
        assert_eq!(offer(&mut w, 5), Ok(()));
        assert_eq!(offer(&mut w, 3), Ok(()));
        assert_eq!(offer(&mut w, 3), Err(Refused::Replayed));
        assert_eq!(offer(&mut w, 5), Err(Refused::Replayed));
        assert_eq!(w.largest(), Some(5));
    }

    #[test]
    fn the_window_edge_is_rfc_6479s_effective_size() {
        let mut w = ReplayWindow::new();
        offer(&mut w, 10_000).unwrap();
        assert_eq!(w.check(10_000 - WINDOW), Err(Refused::TooOld));
        assert_eq!(offer(&mut w, 10_000 - WINDOW + 1), Ok(()));
    }

    #[test]
    fn a_jump_clears_old_bits_that_alias_new_numbers() {
        let mut w = ReplayWindow::new();
        offer(&mut w, 1).unwrap();
        // 1 + 64 * 32 lands on the same bit of the ring as 1.
        let alias = 1 + BLOCK_BITS * BLOCKS as u64;
        assert_eq!(offer(&mut w, alias), Ok(()));
        assert_eq!(w.check(1), Err(Refused::TooOld));
        // A huge jump clears everything, once.
        assert_eq!(offer(&mut w, u64::MAX - 1), Ok(()));
        assert_eq!(offer(&mut w, u64::MAX - 2), Ok(()));
        assert_eq!(offer(&mut w, u64::MAX), Ok(()));
        assert_eq!(offer(&mut w, u64::MAX), Err(Refused::Replayed));
    }

    #[test]
    fn check_alone_changes_nothing() {
        let mut w = ReplayWindow::new();
        assert_eq!(w.check(7), Ok(()));
        assert_eq!(w.check(7), Ok(()));
        assert_eq!(w.largest(), None);
        offer(&mut w, 7).unwrap();
        assert_eq!(w.check(6), Ok(()));
        assert_eq!(w.check(6), Ok(()));
    }

    proptest! {
        /// Against a model (the set of accepted numbers and the highest):
        /// a number is accepted iff it is new and within WINDOW of the top.
        #[test]
        fn matches_a_set_model(ops in proptest::collection::vec(
            prop_oneof![0u64..300, 0u64..5000, Just(u64::MAX)], 1..400)) {
            let mut w = ReplayWindow::new();
            let mut seen = BTreeSet::new();
            for pn in ops {
                let top = seen.iter().next_back().copied();
                let expect = match top {
                    Some(t) if pn <= t && t - pn >= WINDOW => Err(Refused::TooOld),
                    _ if seen.contains(&pn) => Err(Refused::Replayed),
                    _ => Ok(()),
                };
                prop_assert_eq!(offer(&mut w, pn), expect, "pn {}", pn);
                if expect.is_ok() {
                    seen.insert(pn);
                }
            }
        }
    }
}
