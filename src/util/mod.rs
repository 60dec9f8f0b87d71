//! Small helpers every layer shares: units and text.

pub mod text;
pub mod units;
