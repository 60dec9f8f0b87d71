//! File transfer on top of the transport: `atou send`, `atou serve --dir`
//! and `atou copy`. See docs/transfer.md for the whole pipeline.
//!
//! A transfer is a *session* of transport connections to one server:
//! first a plan (the manifest out, the receiver's decision back), then
//! data streams (chunks of files with their BLAKE3 values, several
//! connections at once), then a finish (every file's hash out, "all
//! verified and in place" back). The private `messages` module says what
//! each carries.

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

pub(crate) mod bootstrap;
pub(crate) mod chunk_buf;
pub(crate) mod compress;
pub(crate) mod dest;
mod error;
pub(crate) mod exclude;
pub(crate) mod hash;
pub(crate) mod layout;
pub(crate) mod manifest;
pub(crate) mod messages;
pub(crate) mod parts;
pub(crate) mod receive;
pub(crate) mod remote;
pub(crate) mod send;
pub(crate) mod shard;
pub(crate) mod source;
pub(crate) mod staged;
pub(crate) mod tunnel;

pub use dest::policy::{ReceivePolicy, SymlinkPolicy, UserFlags};
pub use receive::{FileReceiver, ReceiveConfig, ReceiveEvent, ReceiveLimits, TransferReport};
pub use send::{send, Progress, SendConfig, SendError, SendReport};

pub use error::{Change, Error};
use manifest::{EntryKind, Manifest};

/// The sizes of the manifest's files, in order: file numbers index this.
pub(crate) fn file_sizes(manifest: &Manifest) -> Vec<u64> {
    manifest
        .entries
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { size } => Some(size),
            _ => None,
        })
        .collect()
}
