//! Small helpers every layer shares: units and text.

pub(crate) mod text;
pub(crate) mod units;
