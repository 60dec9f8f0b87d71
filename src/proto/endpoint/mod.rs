//! The two ends of a connection: the handshake, keys and connection ids
//! around the streams' [`Sender`](super::Sender) and [`Receiver`](super::Receiver).

pub(crate) mod client;
pub mod server;
