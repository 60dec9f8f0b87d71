//! The transport, sans I/O: wire codec, sender, receiver, loss recovery,
//! congestion control, RTT/RTO, events and trace.
//!
//! Nothing here touches a socket, a thread or a clock. Time comes in as an
//! argument ([`Time`]), datagrams come in as byte slices and go out into
//! caller-supplied buffers. That makes every run reproducible: the
//! simulator drives the same code in virtual time.

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

pub(crate) mod congestion;
pub mod crypto;
pub(crate) mod endpoint;
pub(crate) mod events;
pub(crate) mod loss;
pub mod path_memory;
pub mod payload;
pub(crate) mod pmtu;
pub(crate) mod stream;
pub(crate) mod time;
pub mod tuning;
pub mod wire;

use thiserror::Error;

pub(crate) use endpoint::client::{Client, Closed, ConnError};
pub(crate) use endpoint::server::{ConnEnd, ConnReport, Notice, Server, ServerLimits, ServerStats};
pub(crate) use events::{Event, Observer, Recorder, TimedEvent, TraceRecord};
pub(crate) use path_memory::PathMemory;
pub(crate) use payload::{PatternSource, PatternVerifier, PayloadSource};
pub(crate) use stream::receiver::{Receiver, ReceiverConfig};
pub(crate) use stream::sender::{Sender, SenderSnapshot, SenderState, SenderStats};
pub(crate) use time::Time;
pub(crate) use tuning::{RecoveryKind, Tuning};
pub(crate) use wire::ReceiverStats;

/// Why an endpoint did not accept a datagram. Its state is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InputError {
    /// The bytes do not decode as an atou packet (truncated, bad length,
    /// unknown type or version).
    #[error(transparent)]
    Wire(#[from] wire::WireError),
    /// A packet for another connection id than this endpoint's.
    #[error("packet for connection {got:#x}, expected {expected:#x}")]
    WrongConnection {
        /// This endpoint's connection id.
        expected: u64,
        /// The id the packet carries.
        got: u64,
    },
    /// A well-formed packet of a kind this endpoint does not take in its
    /// present state; the name says which kind.
    #[error("a {0} packet arrived where none belongs")]
    Unexpected(&'static str),
}
