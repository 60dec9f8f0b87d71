//! The files atou reads and writes between runs: keys, known hosts,
//! authorized keys and the path cache.

pub mod keys;
pub(crate) mod path_cache;
