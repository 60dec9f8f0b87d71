//! What a run reports: the end-of-run summary, the packet trace and its plot.

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

pub mod plot;
pub mod summary;
pub mod trace;
