//! The streams of one transfer coupled as `flows` flows, across the threads
//! that run them (docs/congestion.md, "Coupled streams").
//!
//! The proto sender is sans-IO: it is told its group's news as plain
//! values (`Sender::set_group`). The counts those values come from are
//! shared between the streams' threads here, in atomics: a group's
//! segments delivered, and how many of its streams are still sending.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// One coupled group's counts, shared by its streams.
#[derive(Debug, Default)]
struct GroupCounts {
    /// Segments the group's streams have delivered, as each last told.
    delivered: AtomicU64,
    /// The group's streams that have not finished.
    sending: AtomicUsize,
}

/// One stream's place in its coupled group.
#[derive(Debug)]
pub(crate) struct GroupMember {
    counts: Arc<GroupCounts>,
    /// The group's controllers' seed (`Sender::set_group`).
    seed: u64,
    /// This stream's delivered segments as last added to the group's.
    told: u64,
    finished: bool,
    /// Its share as last told; kept once it has finished, so that its
    /// last report's window is the one it sent with.
    share: f64,
}

impl GroupMember {
    /// The members of `streams` streams coupled as `flows` flows: stream
    /// `i` in group `i % flows`, each group's controllers seeded from
    /// `seed` and the group's number. `None` for a stream alone in its
    /// group (`flows` at or above `streams`): it runs uncoupled, as one
    /// flow of its own, and hears of its siblings' departures instead.
    pub(crate) fn of_streams(streams: usize, flows: usize, seed: u64) -> Vec<Option<GroupMember>> {
        let flows = flows.clamp(1, streams.max(1));
        let groups: Vec<Arc<GroupCounts>> = (0..flows).map(|_| Arc::default()).collect();
        (0..streams)
            .map(|i| {
                let group = i % flows;
                let size = (streams - group).div_ceil(flows);
                (size > 1).then(|| {
                    let counts = groups[group].clone();
                    counts.sending.fetch_add(1, Ordering::Relaxed);
                    GroupMember {
                        counts,
                        seed: seed.wrapping_add(group as u64),
                        told: 0,
                        finished: false,
                        share: 1.0 / size as f64,
                    }
                })
            })
            .collect()
    }

    /// This stream has delivered `delivered` segments, and has `finished`
    /// (every byte of it sent and acknowledged) or not: what the others of
    /// its group have delivered, its share of the group (one over the
    /// group's streams still sending) and the group's seed, for
    /// `Sender::set_group`.
    pub(crate) fn couple(&mut self, delivered: u64, finished: bool) -> (u64, f64, u64) {
        if delivered > self.told {
            self.counts
                .delivered
                .fetch_add(delivered - self.told, Ordering::Relaxed);
            self.told = delivered;
        }
        if finished && !self.finished {
            self.finished = true;
            self.counts.sending.fetch_sub(1, Ordering::Relaxed);
        }
        let others = self
            .counts
            .delivered
            .load(Ordering::Relaxed)
            .saturating_sub(self.told);
        if !self.finished {
            let sending = self.counts.sending.load(Ordering::Relaxed).max(1);
            self.share = 1.0 / sending as f64;
        }
        (others, self.share, self.seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Five streams as two flows: groups of three and two; each member
    /// sees the others' deliveries, and a finished stream's share goes to
    /// the rest of its group.
    #[test]
    fn members_share_their_groups_counts() {
        let mut m: Vec<GroupMember> = GroupMember::of_streams(5, 2, 7)
            .into_iter()
            .map(Option::unwrap)
            .collect();
        assert_eq!(m[0].couple(10, false), (0, 1.0 / 3.0, 7));
        assert_eq!(m[2].couple(5, false), (10, 1.0 / 3.0, 7));
        assert_eq!(m[1].couple(4, false), (0, 0.5, 8));
        assert_eq!(m[4].couple(20, true), (15, 1.0 / 3.0, 7));
        assert_eq!(m[0].couple(12, false), (25, 0.5, 7));
    }

    /// As many flows as streams (or more): every stream alone, uncoupled.
    #[test]
    fn a_stream_alone_in_its_group_is_not_coupled() {
        assert!(GroupMember::of_streams(2, 2, 1).iter().all(Option::is_none));
        assert!(GroupMember::of_streams(2, 8, 1).iter().all(Option::is_none));
        assert!(GroupMember::of_streams(1, 1, 1).iter().all(Option::is_none));
        let three_as_two = GroupMember::of_streams(3, 2, 1);
        let coupled: Vec<bool> = three_as_two.iter().map(Option::is_some).collect();
        assert_eq!(coupled, [true, false, true]);
    }
}
