//! What a run reports: the end-of-run summary, the packet trace and its plot.

pub mod plot;
pub mod summary;
pub mod trace;
