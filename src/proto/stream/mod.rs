//! One stream's reliable delivery: the sending and receiving halves, the
//! SACK scoreboard and the RTT estimator they share.

pub(crate) mod receiver;
pub mod rtt;
pub(crate) mod scoreboard;
pub(crate) mod sender;
