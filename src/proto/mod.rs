//! The transport, sans I/O: wire codec, sender, receiver, loss recovery,
//! congestion control, RTT/RTO, events and trace.
//!
//! Nothing here touches a socket, a thread or a clock. Time comes in as an
//! argument ([`Time`]), datagrams come in as byte slices and go out into
//! caller-supplied buffers. That makes every run reproducible: the
//! simulator drives the same code in virtual time.

pub mod congestion;
pub mod crypto;
pub mod endpoint;
pub mod events;
pub mod loss;
pub mod path_memory;
pub mod payload;
pub mod stream;
pub mod time;
pub mod tuning;
pub mod wire;

use thiserror::Error;

pub use endpoint::client::{Client, Closed, ConnError};
pub use endpoint::server::{ConnEnd, ConnReport, Notice, Server, ServerLimits, ServerStats};
pub use events::{Event, Observer, Recorder, TimedEvent, TraceRecord};
pub use loss::Phase;
pub use path_memory::PathMemory;
pub use payload::{fill_pattern, pattern_mismatch, PatternSource, PatternVerifier, PayloadSource};
pub use stream::receiver::{NewData, Receiver, ReceiverConfig};
pub use stream::sender::{Sender, SenderSnapshot, SenderState, SenderStats};
pub use time::Time;
pub use tuning::{CcKind, RecoveryKind, ReductionKind, ReorderingKind, SsthreshEstimate, Tuning};
pub use wire::ReceiverStats;

/// Why an endpoint did not accept a datagram. Its state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InputError {
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    #[error("packet for connection {got:#x}, expected {expected:#x}")]
    WrongConnection { expected: u64, got: u64 },
    #[error("a {0} packet arrived where none belongs")]
    Unexpected(&'static str),
}
