//! File transfer on top of the transport: `atou send`, `atou serve --dir`
//! and `atou copy`. See docs/transfer.md for the whole pipeline.
//!
//! A transfer is a *session* of transport connections to one server:
//! first a plan (the manifest out, the receiver's decision back), then
//! data streams (chunks of files with their BLAKE3 values, several
//! connections at once), then a finish (every file's hash out, "all
//! verified and in place" back). See [`messages`] for what each says.

pub mod bootstrap;
pub mod dest;
mod error;
pub mod exclude;
pub mod hash;
pub mod layout;
pub mod manifest;
pub mod messages;
pub mod parts;
pub mod receive;
pub mod remote;
pub mod send;
pub mod shard;
pub mod source;
pub mod staged;

pub use error::{Change, Error};
use manifest::{EntryKind, Manifest};

/// The sizes of the manifest's files, in order: file numbers index this.
pub fn file_sizes(manifest: &Manifest) -> Vec<u64> {
    manifest
        .entries
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { size } => Some(size),
            _ => None,
        })
        .collect()
}
