//! `--no-path-cache` and the path cache's use by `send`, `copy` and
//! `probe`: recall what the last transfer to a destination learnt before
//! connecting, remember what this one learnt after. A cache that cannot
//! be read or written costs a warning, never the transfer.

use std::net::IpAddr;
use std::time::SystemTime;

use crate::config::path_cache::{Destination, PathCache};
use crate::proto::PathMemory;
use crate::report::summary::Summary;

/// One destination's entry in the user's path cache, or nothing with
/// `--no-path-cache` (or without a cache directory).
pub(super) struct PathHint {
    cache: Option<PathCache>,
    peer: IpAddr,
    /// The server's pinned key; one-time keys (`atou copy`) are not part
    /// of the destination, or no entry would ever be found again.
    server_key: Option<[u8; 32]>,
}

impl PathHint {
    pub(super) fn new(no_path_cache: bool, peer: IpAddr, server_key: Option<[u8; 32]>) -> Self {
        PathHint {
            cache: (!no_path_cache).then(PathCache::open_default).flatten(),
            peer,
            server_key,
        }
    }

    fn destination(&self) -> Destination<'_> {
        Destination {
            peer: self.peer,
            server_key: self.server_key.as_ref(),
        }
    }

    /// The memory saved for this destination, if a fresh one is there.
    pub(super) fn recall(&self) -> Option<PathMemory> {
        let cache = self.cache.as_ref()?;
        match cache.load(&self.destination(), SystemTime::now()) {
            Ok(memory) => memory,
            Err(why) => {
                eprintln!(
                    "atou: warning: ignoring the path cache entry {why} (delete it, or use --no-path-cache)"
                );
                None
            }
        }
    }

    /// Saves what the connections learnt: the one that carried the most
    /// data, whose estimates rest on the most samples; over the entry
    /// there, a bandwidth that is only a lower bound keeps a larger one
    /// ([`PathMemory::over`]).
    pub(super) fn remember<'a>(&self, streams: impl IntoIterator<Item = &'a Summary>) {
        let Some(cache) = &self.cache else {
            return;
        };
        let best = streams
            .into_iter()
            .filter(|s| s.path_memory.is_some())
            .max_by_key(|s| s.bytes);
        let Some(memory) = best.and_then(|s| s.path_memory) else {
            return;
        };
        let older = cache
            .load(&self.destination(), SystemTime::now())
            .ok()
            .flatten();
        let memory = memory.over(older.as_ref());
        if let Err(e) = cache.save(&self.destination(), &memory, SystemTime::now()) {
            eprintln!(
                "atou: warning: cannot save the path cache in {}: {e}",
                cache.dir().display()
            );
        }
    }
}
