//! The files atou reads and writes between runs: keys, known hosts,
//! authorized keys and the path cache.

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

pub mod keys;
pub(crate) mod path_cache;
