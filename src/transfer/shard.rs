//! `--shard K/N`: the part of the tree one of N independent senders sends,
//! so that N processes (on N hosts, or N tasks of a Slurm array or a
//! Kubernetes indexed Job) together deliver what one run would.
//!
//! The split is a pure function of the walked tree (each entry's path,
//! kind and size) and N; it does not depend on the order of the walk, so
//! every shard computes the same split without talking to the others. The
//! rules (docs/scale-out.md says why):
//!
//! - Every **directory** is in every shard. The receiver creates a
//!   directory that is already there as a no-op, so each shard's plan can
//!   check and create the parents of its own files whatever the other
//!   shards have done.
//! - Every **file** and **symlink** is in exactly one shard, whole: a
//!   file is not split across shards. Files are dealt out largest first
//!   (ties by path) to the shard with the fewest bytes so far (then the
//!   fewest entries, then the lowest K): greedy longest-processing-time
//!   first. Empty files and symlinks weigh nothing and are spread by count.
//!
//! Balance: no shard gets more than `total/N + largest·(N-1)/N` bytes,
//! where `largest` is the largest file (see [`assign`]). A tree whose largest
//! file is above `total/N` cannot be balanced by whole files; that is the
//! documented limit.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::str::FromStr;

use super::manifest::{EntryKind, LocalEntry};

/// The most shards a tree may be split into: beyond this, a coordinator
/// that hands out work (docs/scale-out.md) serves better than a fixed split.
pub const MAX_SHARDS: u32 = 1024;

/// Shard `index` (1-based, as K in `--shard K/N`) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// `None` unless 1 <= index <= count <= [`MAX_SHARDS`].
    pub fn new(index: u32, count: u32) -> Option<Shard> {
        (1 <= index && index <= count && count <= MAX_SHARDS).then_some(Shard { index, count })
    }

    /// K, from 1.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// N.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The entries of `tree` this shard sends, in the walk's order: every
    /// directory, and the files and symlinks [`assign`] gives it.
    pub fn select(&self, tree: Vec<LocalEntry>) -> Vec<LocalEntry> {
        let items: Vec<Item<'_>> = tree.iter().map(Item::of).collect();
        let ours: Vec<bool> = assign(&items, self.count)
            .into_iter()
            .map(|owner| owner.is_none_or(|k| k == self.index - 1))
            .collect();
        tree.into_iter()
            .zip(ours)
            .filter_map(|(e, keep)| keep.then_some(e))
            .collect()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Shard, String> {
        let usage = || {
            format!(
                "`{s}`: give K/N, shard K of N, with 1 <= K <= N <= {MAX_SHARDS} \
                 (e.g. 1/4; from a Slurm array, $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)"
            )
        };
        let (k, n) = s.split_once('/').ok_or_else(usage)?;
        let k: u32 = k.trim().parse().map_err(|_| usage())?;
        let n: u32 = n.trim().parse().map_err(|_| usage())?;
        Shard::new(k, n).ok_or_else(usage)
    }
}

/// One entry as the split sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item<'a> {
    /// A directory: in every shard.
    Everywhere,
    /// A file (its size) or a symlink (size 0): in exactly one shard.
    Once { path: &'a [u8], size: u64 },
}

impl<'a> Item<'a> {
    fn of(e: &'a LocalEntry) -> Item<'a> {
        let path = e.entry.path.as_bytes();
        match e.entry.kind {
            EntryKind::Dir => Item::Everywhere,
            EntryKind::File { size } => Item::Once { path, size },
            EntryKind::Symlink { .. } => Item::Once { path, size: 0 },
        }
    }
}

/// The shard (0-based) of each item, `None` for those in every shard.
///
/// Greedy, largest first: items sorted by size descending, then path
/// ascending (so the result does not depend on the order given, and paths
/// are unique in a tree), each to the shard with the least (bytes,
/// entries, index). Bound: let shard S end with the most bytes, L, and f
/// be the last file it was given. When f was dealt, S had the fewest
/// bytes, at most the mean of what was dealt before f, which is at most
/// (total - f) / N; so L <= (total - f)/N + f = total/N + f·(N-1)/N
/// <= total/N + largest·(N-1)/N.
pub fn assign(items: &[Item<'_>], count: u32) -> Vec<Option<u32>> {
    let mut order: Vec<(u64, &[u8], usize)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| match *item {
            Item::Once { path, size } => Some((size, path, i)),
            Item::Everywhere => None,
        })
        .collect();
    order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    // Min-heap of (bytes, entries, shard).
    let mut loads: BinaryHeap<Reverse<(u64, u64, u32)>> =
        (0..count).map(|k| Reverse((0, 0, k))).collect();
    let mut owner = vec![None; items.len()];
    for (size, _, i) in order {
        let Some(Reverse((bytes, entries, k))) = loads.pop() else {
            break;
        };
        owner[i] = Some(k);
        loads.push(Reverse((bytes.saturating_add(size), entries + 1, k)));
    }
    owner
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn k_over_n_is_parsed_and_checked() {
        assert_eq!("3/4".parse(), Ok(Shard { index: 3, count: 4 }));
        assert_eq!("1/1".parse::<Shard>().unwrap().to_string(), "1/1");
        let max = format!("{MAX_SHARDS}/{MAX_SHARDS}");
        assert!(max.parse::<Shard>().is_ok());
        let beyond = format!("1/{}", MAX_SHARDS + 1);
        for bad in [
            "0/4", "5/4", "4", "1/0", "a/4", "1/4/2", "-1/4", "", &beyond,
        ] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains("1 <= K <= N"), "{bad}: {e}");
        }
    }

    /// Distinct paths and sizes; a few zero-size entries (empty files
    /// and symlinks), a few huge ones.
    fn tree() -> impl Strategy<Value = Vec<(Vec<u8>, Option<u64>)>> {
        let size = prop_oneof![
            3 => 0u64..4 << 20,
            1 => Just(0u64),
            1 => 0u64..1 << 40,
        ];
        proptest::collection::btree_map(
            proptest::collection::vec(b'a'..=b'z', 1..6),
            proptest::option::weighted(0.9, size),
            0..200,
        )
        .prop_map(|m| m.into_iter().collect())
    }

    fn items(tree: &[(Vec<u8>, Option<u64>)]) -> Vec<Item<'_>> {
        tree.iter()
            .map(|(path, size)| match size {
                Some(size) => Item::Once { path, size: *size },
                None => Item::Everywhere,
            })
            .collect()
    }

    proptest! {
        /// Every file's bytes are in exactly one shard and every
        /// directory in all of them, for any N in 1..=16; no shard holds
        /// more than total/N + the largest file.
        #[test]
        fn each_entry_once_and_shards_balanced(tree in tree(), count in 1u32..=16) {
            let items = items(&tree);
            let owner = assign(&items, count);
            prop_assert_eq!(owner.len(), items.len());
            let mut bytes = vec![0u128; count as usize];
            let (mut total, mut largest) = (0u128, 0u128);
            for (item, owner) in items.iter().zip(&owner) {
                match (item, owner) {
                    (Item::Everywhere, None) => {}
                    (Item::Once { size, .. }, Some(k)) => {
                        prop_assert!(*k < count);
                        bytes[*k as usize] += u128::from(*size);
                        total += u128::from(*size);
                        largest = largest.max(u128::from(*size));
                    }
                    (item, owner) => prop_assert!(false, "{item:?} went to {owner:?}"),
                }
            }
            prop_assert_eq!(bytes.iter().sum::<u128>(), total);
            let n = u128::from(count);
            for b in &bytes {
                // b <= total/N + largest·(N-1)/N, without rounding.
                prop_assert!(
                    b * n <= total + (n - 1) * largest,
                    "{bytes:?} total {total} largest {largest}"
                );
            }
        }

        /// The split is a function of the tree, not of the order the walk
        /// listed it in.
        #[test]
        fn the_order_of_the_walk_does_not_matter(tree in tree(), count in 1u32..=16, seed: u64) {
            let mut shuffled: Vec<usize> = (0..tree.len()).collect();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let items = items(&tree);
            let other: Vec<Item<'_>> = shuffled.iter().map(|&i| items[i]).collect();
            let (a, b) = (assign(&items, count), assign(&other, count));
            for (j, &i) in shuffled.iter().enumerate() {
                prop_assert_eq!(a[i], b[j]);
            }
        }
    }

    #[test]
    fn zero_size_entries_are_spread_by_count() {
        let names: Vec<Vec<u8>> = (0..8).map(|i| vec![b'a' + i]).collect();
        let items: Vec<Item<'_>> = names
            .iter()
            .map(|path| Item::Once { path, size: 0 })
            .collect();
        let owner = assign(&items, 4);
        for k in 0..4 {
            assert_eq!(owner.iter().filter(|o| **o == Some(k)).count(), 2);
        }
    }
}
