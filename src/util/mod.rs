//! Small helpers every layer shares: units and text.

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

pub(crate) mod text;
pub(crate) mod units;
