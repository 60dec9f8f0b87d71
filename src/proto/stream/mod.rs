//! One stream's reliable delivery: the sending and receiving halves, the
//! SACK scoreboard and the RTT estimator they share.

pub mod receiver;
pub mod rtt;
pub mod scoreboard;
pub mod sender;
