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
//! - A **file larger than total/N** (and of two chunks or more) is
//!   **split by chunk ranges**: shard k (from 0) sends chunks
//!   `⌊c·k/N⌋..⌊c·(k+1)/N⌋` of its c chunks ([`part_range`]), so no
//!   single file sets the finishing time. The receiver assembles the
//!   parts in one partial file and renames it once every part is in and
//!   verified (docs/transfer.md, "Shards").
//! - Every other **file** and **symlink** is in exactly one shard, whole.
//!   They are dealt out largest first (ties by path) to the shard with the
//!   fewest bytes so far, counting its parts of split files (then the
//!   fewest entries, then the lowest K): greedy longest-processing-time
//!   first. Empty files and symlinks weigh nothing and are spread by count.
//!
//! Balance: no shard gets more than `total/N + max(whole·(N-1)/N,
//! 2·splits·chunk)` bytes, where `whole` is the largest file sent whole
//! (at most total/N, or one chunk) and `splits` the number of split files
//! (see [`assign`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use super::hash::{chunk_count, chunk_len, CHUNK_SIZE};
use super::manifest::{EntryKind, LocalEntry};

/// The most shards a tree may be split into: beyond this, a coordinator
/// that hands out work (docs/scale-out.md) serves better than a fixed split.
pub(crate) const MAX_SHARDS: u32 = 1024;

/// Shard `index` (1-based, as K in `--shard K/N`) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shard {
    index: u32,
    count: u32,
}

impl Shard {
    /// `None` unless 1 <= index <= count <= [`MAX_SHARDS`].
    pub(crate) fn new(index: u32, count: u32) -> Option<Shard> {
        (1 <= index && index <= count && count <= MAX_SHARDS).then_some(Shard { index, count })
    }

    /// The entries of `tree` this shard sends, in the walk's order: every
    /// directory, the files and symlinks [`assign`] gives it, and its
    /// part of each split file (a split file whose range for this shard
    /// is empty, fewer chunks than shards, is not in it).
    pub(crate) fn select(&self, tree: Vec<LocalEntry>) -> Vec<Selected> {
        let k = self.index - 1;
        let items: Vec<Item<'_>> = tree.iter().map(Item::of).collect();
        let owners = assign(&items, self.count);
        tree.into_iter()
            .zip(owners)
            .filter_map(|(entry, owner)| match owner {
                Owner::Everywhere => Some(Selected { entry, part: None }),
                Owner::One(o) => (o == k).then_some(Selected { entry, part: None }),
                Owner::Split => {
                    let EntryKind::File { size } = entry.entry.kind else {
                        unreachable!("only files are split")
                    };
                    let part = part_range(size, k, self.count);
                    (!part.is_empty()).then_some(Selected {
                        entry,
                        part: Some(part),
                    })
                }
            })
            .collect()
    }
}

/// One entry of a shard's part of the tree.
#[derive(Debug)]
pub(crate) struct Selected {
    pub(crate) entry: LocalEntry,
    /// The chunks of it this shard sends, for a file split across shards;
    /// `None` for an entry sent whole.
    pub(crate) part: Option<Range<u64>>,
}

/// The chunks of a split file of `size` bytes that shard `k` (from 0) of
/// `count` sends: consecutive, each shard's within one chunk of the
/// others', together every chunk once.
pub(crate) fn part_range(size: u64, k: u32, count: u32) -> Range<u64> {
    let chunks = u128::from(chunk_count(size));
    let at = |k: u32| (chunks * u128::from(k) / u128::from(count)) as u64;
    at(k)..at(k + 1)
}

/// The bytes of chunks `part` of a file of `size` bytes.
pub(crate) fn part_bytes(size: u64, part: &Range<u64>) -> u64 {
    if part.is_empty() {
        return 0;
    }
    let last = part.end - 1;
    (last - part.start) * CHUNK_SIZE + chunk_len(size, last) as u64
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
                 (e.g. 1/4), or auto or auto/N in a Slurm array or a Kubernetes indexed Job"
            )
        };
        let (k, n) = s.split_once('/').ok_or_else(usage)?;
        let k: u32 = k.trim().parse().map_err(|_| usage())?;
        let n: u32 = n.trim().parse().map_err(|_| usage())?;
        Shard::new(k, n).ok_or_else(usage)
    }
}

impl Shard {
    /// Parses `--shard`'s value: `K/N`, or `auto` and `auto/N`, which take
    /// K (and N) from the scheduler that started this process, reading
    /// its variables through `var` (the environment, or a test's table):
    ///
    /// - a Slurm array task: K is `SLURM_ARRAY_TASK_ID`, so the array's
    ///   ids are the shard numbers, 1 to N. Bare `auto` takes N from
    ///   `SLURM_ARRAY_TASK_COUNT` and refuses an array that is not `1-N`
    ///   (`SLURM_ARRAY_TASK_MIN`, `_MAX`, `_STEP`): a task resubmitted alone
    ///   (`sbatch --array=3`) is an array of one, so a script meant to be
    ///   rerun that way gives N (`auto/8`).
    /// - a Kubernetes indexed Job: K is `JOB_COMPLETION_INDEX` + 1 (it is
    ///   0-based); Kubernetes gives a pod no count, so N must be given,
    ///   equal to the Job's `completions`.
    ///
    /// The variables are the operator's, yet each is checked, and an
    /// error names the one that is missing, unparsable or out of range.
    pub(crate) fn from_spec(
        spec: &str,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Shard, String> {
        let Some(rest) = spec.trim().strip_prefix("auto") else {
            return spec.parse();
        };
        let count = match rest.strip_prefix('/') {
            None if rest.is_empty() => None,
            Some(n) => match n.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_SHARDS).contains(&n) => Some(n),
                _ => return Err(format!("`{spec}`: give auto/N with 1 <= N <= {MAX_SHARDS}")),
            },
            None => return Err(format!("`{spec}`: give K/N, auto or auto/N")),
        };
        let number = |name: &str| -> Result<Option<u32>, String> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("--shard {spec}: {name}={v:?} is not a whole number"))
                })
                .transpose()
        };
        let in_range = |k: u32, n: u32, from: &str| {
            Shard::new(k, n).ok_or_else(|| {
                format!(
                    "--shard {spec}: {from} makes shard {k} of {n}, \
                     outside 1 <= K <= N <= {MAX_SHARDS}"
                )
            })
        };
        if let Some(id) = number("SLURM_ARRAY_TASK_ID")? {
            if let Some(n) = count {
                return in_range(id, n, &format!("SLURM_ARRAY_TASK_ID={id}"));
            }
            let Some(n) = number("SLURM_ARRAY_TASK_COUNT")? else {
                return Err("--shard auto: SLURM_ARRAY_TASK_ID is set but not \
                     SLURM_ARRAY_TASK_COUNT; give N (--shard auto/N)"
                    .to_string());
            };
            let min = number("SLURM_ARRAY_TASK_MIN")?;
            let max = number("SLURM_ARRAY_TASK_MAX")?;
            let step = number("SLURM_ARRAY_TASK_STEP")?;
            if min.is_some_and(|m| m != 1)
                || max.is_some_and(|m| m != n)
                || step.is_some_and(|s| s != 1)
            {
                let shown = |v: Option<u32>| v.map_or("unset".to_string(), |v| v.to_string());
                return Err(format!(
                    "--shard auto: this array is not 1-{n} (SLURM_ARRAY_TASK_MIN={}, \
                     SLURM_ARRAY_TASK_MAX={}, SLURM_ARRAY_TASK_STEP={}), so its count \
                     is not the number of shards: a task resubmitted alone, or an \
                     array of other ids; give N (--shard auto/N) or K/N",
                    shown(min),
                    shown(max),
                    shown(step)
                ));
            }
            return in_range(
                id,
                n,
                &format!("SLURM_ARRAY_TASK_ID={id} of SLURM_ARRAY_TASK_COUNT={n}"),
            );
        }
        if let Some(index) = number("JOB_COMPLETION_INDEX")? {
            let Some(n) = count else {
                return Err(format!(
                    "--shard auto: JOB_COMPLETION_INDEX={index} is set but Kubernetes \
                     gives no count; give N, the Job's completions (--shard auto/N)"
                ));
            };
            return in_range(
                index.saturating_add(1),
                n,
                &format!("JOB_COMPLETION_INDEX={index} (+1)"),
            );
        }
        Err(format!(
            "--shard {spec}: neither SLURM_ARRAY_TASK_ID (a Slurm array task) nor \
             JOB_COMPLETION_INDEX (a Kubernetes indexed Job) is set; give K/N"
        ))
    }
}

/// One entry as the split sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Item<'a> {
    /// A directory: in every shard.
    Everywhere,
    /// A file (its size) or a symlink (size 0): in exactly one shard, or,
    /// a file above total/N, split across all of them.
    Once { path: &'a [u8], size: u64 },
}

impl<'a> Item<'a> {
    fn of(e: &'a LocalEntry) -> Item<'a> {
        let path = e.entry.path.as_bytes();
        match e.entry.kind {
            EntryKind::Dir => Item::Everywhere,
            EntryKind::File { size } => Item::Once { path, size },
            // --hard-links is refused with --shard: a link's target
            // could be in another part.
            EntryKind::Symlink { .. } | EntryKind::HardLink { .. } => Item::Once { path, size: 0 },
        }
    }
}

/// Where [`assign`] puts an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    /// A directory: in every shard.
    Everywhere,
    /// Whole, in shard k (0-based).
    One(u32),
    /// A file above total/N: each shard sends its [`part_range`].
    Split,
}

/// Where each item goes.
///
/// Files of two chunks or more above total/N are split; the rest are
/// dealt greedily, largest first: sorted by size descending, then path
/// ascending (so the result does not depend on the order given, and paths
/// are unique in a tree), each to the shard with the least (bytes,
/// entries, index), the split files' parts counted first. Bound: let shard
/// S end with the most bytes, L. If its last item was a whole file f,
/// when f was dealt S had the fewest bytes, at most the mean of what had
/// been dealt, at most (total - f)/N; so L <= total/N + f·(N-1)/N, and f
/// is at most total/N (or one chunk), or it would have been split. If S
/// got only parts, each is at most ⌈c/N⌉ chunks of a file of c, so
/// L <= total/N + 2·splits·chunk.
pub(crate) fn assign(items: &[Item<'_>], count: u32) -> Vec<Owner> {
    let total: u128 = items
        .iter()
        .map(|item| match *item {
            Item::Once { size, .. } => u128::from(size),
            Item::Everywhere => 0,
        })
        .sum();
    let split = |size: u64| {
        count > 1 && chunk_count(size) >= 2 && u128::from(size) * u128::from(count) > total
    };
    let mut owner = vec![Owner::Everywhere; items.len()];
    let mut loads: Vec<(u64, u64)> = vec![(0, 0); count as usize];
    let mut order: Vec<(u64, &[u8], usize)> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Item::Once { path, size } = *item else {
            continue;
        };
        if !split(size) {
            order.push((size, path, i));
            continue;
        }
        owner[i] = Owner::Split;
        for (k, load) in loads.iter_mut().enumerate() {
            let part = part_range(size, k as u32, count);
            if !part.is_empty() {
                load.0 = load.0.saturating_add(part_bytes(size, &part));
                load.1 += 1;
            }
        }
    }
    order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    // Min-heap of (bytes, entries, shard).
    let mut heap: BinaryHeap<Reverse<(u64, u64, u32)>> = loads
        .iter()
        .enumerate()
        .map(|(k, &(bytes, entries))| Reverse((bytes, entries, k as u32)))
        .collect();
    for (size, _, i) in order {
        let Some(Reverse((bytes, entries, k))) = heap.pop() else {
            break;
        };
        owner[i] = Owner::One(k);
        heap.push(Reverse((bytes.saturating_add(size), entries + 1, k)));
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

    #[test]
    fn auto_takes_k_and_n_from_the_scheduler_and_names_a_bad_variable() {
        let from = |spec: &str, vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Shard::from_spec(spec, |name| {
                vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
            })
        };
        let array = [
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "4"),
            ("SLURM_ARRAY_TASK_STEP", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert_eq!(from("auto", &array), Ok(Shard { index: 3, count: 4 }));
        assert_eq!(from("auto/8", &array), Ok(Shard { index: 3, count: 8 }));
        // K/N ignores the environment.
        assert_eq!(from("2/4", &array), Ok(Shard { index: 2, count: 4 }));
        // Task 3 resubmitted alone (sbatch --array=3): an array of one.
        let alone = [
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_MIN", "3"),
            ("SLURM_ARRAY_TASK_MAX", "3"),
            ("SLURM_ARRAY_TASK_COUNT", "1"),
        ];
        let e = from("auto", &alone).unwrap_err();
        assert!(
            e.contains("SLURM_ARRAY_TASK_MIN=3") && e.contains("auto/N"),
            "{e}"
        );
        assert_eq!(from("auto/4", &alone), Ok(Shard { index: 3, count: 4 }));
        let e = from("auto/2", &alone).unwrap_err();
        assert!(
            e.contains("SLURM_ARRAY_TASK_ID=3") && e.contains("shard 3 of 2"),
            "{e}"
        );
        // 0-based and stepped arrays are refused, not shifted.
        let zero = [
            ("SLURM_ARRAY_TASK_ID", "0"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_MAX", "3"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert!(from("auto", &zero).unwrap_err().contains("not 1-4"));
        assert!(from("auto/4", &zero).unwrap_err().contains("shard 0 of 4"));
        let e = from("auto", &[("SLURM_ARRAY_TASK_ID", "x1")]).unwrap_err();
        assert!(e.contains("SLURM_ARRAY_TASK_ID=\"x1\""), "{e}");
        let e = from("auto", &[("SLURM_ARRAY_TASK_ID", "1")]).unwrap_err();
        assert!(e.contains("not SLURM_ARRAY_TASK_COUNT"), "{e}");
        // Kubernetes: 0-based index, N given.
        let pod = [("JOB_COMPLETION_INDEX", "7")];
        assert_eq!(from("auto/8", &pod), Ok(Shard { index: 8, count: 8 }));
        assert!(from("auto/7", &pod).unwrap_err().contains("shard 8 of 7"));
        assert!(from("auto", &pod).unwrap_err().contains("completions"));
        let e = from("auto/8", &[("JOB_COMPLETION_INDEX", "-1")]).unwrap_err();
        assert!(e.contains("JOB_COMPLETION_INDEX"), "{e}");
        let huge = [("JOB_COMPLETION_INDEX", "4294967295")];
        assert!(from("auto/8", &huge).is_err());
        // Neither scheduler, or a malformed spec.
        assert!(from("auto", &[]).unwrap_err().contains("neither"));
        for bad in ["auto/0", "auto/1025", "auto/x", "autox", "auto/"] {
            assert!(from(bad, &pod).is_err(), "{bad}");
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
        /// Every file's bytes are in exactly one shard (whole, or as one
        /// of the consecutive parts that tile a split file) and every
        /// directory in all of them, for any N in 1..=16; no shard holds
        /// more than the bound [`assign`] proves.
        #[test]
        fn each_entry_once_and_shards_balanced(tree in tree(), count in 1u32..=16) {
            let items = items(&tree);
            let owner = assign(&items, count);
            prop_assert_eq!(owner.len(), items.len());
            let mut bytes = vec![0u128; count as usize];
            let (mut total, mut whole, mut splits) = (0u128, 0u128, 0u128);
            for (item, owner) in items.iter().zip(&owner) {
                match (item, owner) {
                    (Item::Everywhere, Owner::Everywhere) => {}
                    (Item::Once { size, .. }, Owner::One(k)) => {
                        prop_assert!(*k < count);
                        bytes[*k as usize] += u128::from(*size);
                        total += u128::from(*size);
                        whole = whole.max(u128::from(*size));
                    }
                    (Item::Once { size, .. }, Owner::Split) => {
                        let mut next = 0;
                        for k in 0..count {
                            let part = part_range(*size, k, count);
                            prop_assert_eq!(part.start, next, "parts of {} tile it", size);
                            next = part.end;
                            bytes[k as usize] += u128::from(part_bytes(*size, &part));
                        }
                        prop_assert_eq!(next, chunk_count(*size));
                        total += u128::from(*size);
                        splits += 1;
                    }
                    (item, owner) => prop_assert!(false, "{item:?} went to {owner:?}"),
                }
            }
            prop_assert_eq!(bytes.iter().sum::<u128>(), total);
            let n = u128::from(count);
            let chunk = u128::from(CHUNK_SIZE);
            // A file above total/N is split unless it is one chunk.
            prop_assert!(whole * n <= total || whole <= chunk, "whole {whole} total {total}");
            for b in &bytes {
                // b <= total/N + max(whole·(N-1)/N, 2·splits·chunk), without rounding.
                prop_assert!(
                    b * n <= total + ((n - 1) * whole).max(2 * n * splits * chunk),
                    "{bytes:?} total {total} whole {whole} splits {splits}"
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
            assert_eq!(owner.iter().filter(|o| **o == Owner::One(k)).count(), 2);
        }
    }

    /// One file of 10 chunks among small ones, in 4 shards: it is split
    /// 2, 3, 2, 3 chunks (⌊10k/4⌋), and the small files go to the shards
    /// with the smallest parts (ties to the lowest K).
    #[test]
    fn a_file_above_its_share_is_split_into_consecutive_parts() {
        let (big, a, b) = (b"big".to_vec(), b"a".to_vec(), b"b".to_vec());
        let size = 9 * CHUNK_SIZE + 5;
        let items = [
            Item::Once {
                path: &a,
                size: 1000,
            },
            Item::Once { path: &big, size },
            Item::Once {
                path: &b,
                size: 999,
            },
        ];
        assert_eq!(
            assign(&items, 4),
            [Owner::One(0), Owner::Split, Owner::One(2)]
        );
        let parts: Vec<Range<u64>> = (0..4).map(|k| part_range(size, k, 4)).collect();
        assert_eq!(parts, [0..2, 2..5, 5..7, 7..10]);
        assert_eq!(part_bytes(size, &parts[3]), 2 * CHUNK_SIZE + 5);
        assert_eq!(part_bytes(size, &(3..3)), 0);
        // One shard, or a file of one chunk, is never split; nor a file at
        // exactly its share.
        assert_eq!(assign(&items, 1)[1], Owner::One(0));
        let one = [
            Item::Once {
                path: &big,
                size: CHUNK_SIZE,
            },
            Item::Once { path: &a, size: 1 },
        ];
        assert_eq!(assign(&one, 2)[0], Owner::One(0));
        let even = [
            Item::Once {
                path: &big,
                size: 2 * CHUNK_SIZE,
            },
            Item::Once {
                path: &a,
                size: 2 * CHUNK_SIZE,
            },
        ];
        assert_eq!(assign(&even, 2), [Owner::One(1), Owner::One(0)]);
        // More shards than chunks: some parts are empty.
        let two = [Item::Once {
            path: &big,
            size: 2 * CHUNK_SIZE,
        }];
        assert_eq!(assign(&two, 4), [Owner::Split]);
        let parts: Vec<Range<u64>> = (0..4).map(|k| part_range(2 * CHUNK_SIZE, k, 4)).collect();
        assert_eq!(parts, [0..0, 0..1, 1..1, 1..2]);
    }
}
