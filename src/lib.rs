//! atou: reliable file transfer over a tunable, instrumented TCP-like
//! protocol on UDP, after Dunigan & Fowler's "almost TCP over UDP" (ORNL 2002).
//!
//! The `atou` binary is this library's command line; what follows is what
//! a program embedding atou uses. Everything else is private to the crate,
//! so it can change without breaking anyone.
//!
//! **The transport, sans I/O.** Nothing here touches a socket, a thread or a
//! clock: time comes in as an argument ([`Time`]), datagrams as byte slices.
//! - [`Client`] and [`Server`] (with [`ServerLimits`]): the endpoints,
//!   handshake and packet protection included; [`Closed`], [`ConnError`]
//!   (with its [`Stage`]), [`ConnEnd`], [`ConnReport`] say how a connection
//!   went, with the counters [`SenderStats`], [`SenderSnapshot`] (its
//!   controller's [`CcReport`]) and [`ReceiverStats`]; [`InputError`] why a
//!   datagram was refused; [`Notice`] what a server tells its operator;
//!   [`HandshakeWork`] and [`HandshakeDone`] carry a server's public-key
//!   work to another thread and back.
//! - [`PayloadSource`]: what a sending endpoint sends ([`PatternSource`]:
//!   the test pattern).
//! - [`Tuning`]: every knob, with its kinds ([`CcKind`], [`RecoveryKind`],
//!   [`ReductionKind`], [`ReorderingKind`], [`SsthreshEstimate`]) and
//!   [`TuningError`].
//! - [`Event`], [`TimedEvent`], [`TraceRecord`], [`Observer`] and
//!   [`Recorder`]: atou's event lines and packet trace.
//! - Keys: [`StaticKeypair`], [`PublicKey`], [`Cipher`], [`ClientAuth`],
//!   [`ServerAuth`], [`AuthorizedKeys`].
//!
//! **Over a socket.** [`io`]: [`io::probe`] and [`io::connect`] run a client,
//! [`io::serve`] a server, on the caller's tokio runtime.
//!
//! **Files.** [`transfer`]: [`transfer::send`] with a [`transfer::SendConfig`]
//! returns a [`transfer::SendReport`]; [`transfer::FileReceiver`] with a
//! [`transfer::ReceiveConfig`] and a [`transfer::ReceivePolicy`] is the
//! receiving side, served by [`io::serve`].
//!
//! **Experiments.** [`sim`]: [`sim::Simulation`] runs the bare stream
//! engines (a sender and a receiver, below the endpoints) over modelled links in virtual time ([`sim::SimConfig`]),
//! [`sim::Pair`] a [`Client`] and a [`Server`] through the handshake,
//! [`sim::run_flows`] flows sharing a bottleneck (the papers' measurements
//! are atou's own tests, in tests/papers.rs). [`netem`]: the links, in `tc netem`'s syntax
//! ([`netem::NetemSpec`]).

// Judged on the API alone (the internals are undocumented by design), in
// every build without them: `cargo build` warns of a public item without a
// doc comment, and CI's `cargo doc` (`-D warnings`) fails on one.
#![cfg_attr(not(any(feature = "internals", fuzzing)), warn(missing_docs))]
// Dead code is judged with the internals compiled in, as every `cargo test`
// and `cargo clippy --all-targets` builds it: what only atou's own tests
// reach (the encoders hostile peers are built from) is not dead, though a
// build without them cannot see its use.
#![cfg_attr(
    not(any(feature = "internals", fuzzing)),
    allow(dead_code, unused_imports)
)]
// Reachability is judged with the internals compiled in: an item that only
// atou's own tests and fuzz targets reach stays `pub`, so the lint would
// call it unreachable in a build without them.
#![cfg_attr(any(feature = "internals", fuzzing), warn(unreachable_pub))]

mod cli;
mod config;
pub mod io;
pub mod netem;
mod proto;
mod report;
pub mod sim;
pub mod transfer;
mod util;

// Each from where it is defined, not through `proto`'s own re-exports:
// `unreachable_pub` does not see a chain of re-exports and would narrow the
// middle link (scripts/dev/narrow-pub.sh).
pub use proto::congestion::CcReport;
pub use proto::crypto::authorized::AuthorizedKeys;
pub use proto::crypto::handshake::{PublicKey, StaticKeypair};
pub use proto::crypto::protect::Cipher;
pub use proto::crypto::{ClientAuth, ServerAuth};
pub use proto::endpoint::client::{Client, Closed, ConnError, Stage};
pub use proto::endpoint::server::{
    ConnEnd, ConnReport, HandshakeDone, HandshakeWork, Notice, Server, ServerLimits,
};
pub use proto::events::{
    AckRecord, Event, Observer, Recorder, Retransmission, StateRecord, TimedEvent, TraceRecord,
};
pub use proto::payload::{PatternSource, PayloadSource};
pub use proto::stream::sender::{SenderSnapshot, SenderStats};
pub use proto::time::Time;
pub use proto::tuning::{
    CcKind, RecoveryKind, ReductionKind, ReorderingKind, SsthreshEstimate, Tuning, TuningError,
};
pub use proto::wire::ReceiverStats;
pub use proto::InputError;

/// The `atou` command line: parses the arguments, runs the subcommand and
/// says how it ended. `src/main.rs` is this one call; it is not an API.
#[doc(hidden)]
pub fn run_cli() -> std::process::ExitCode {
    cli::main()
}

/// The crate's own parts, for atou's own tests, examples and fuzz targets
/// that build hostile peers from its encoders; not a stable API.
#[doc(hidden)]
#[cfg(any(feature = "internals", fuzzing))]
pub mod internals {
    pub use crate::config::keys;
    pub use crate::proto::endpoint::server;
    // The stream engines below the endpoints: the papers' bare sender and
    // receiver, which `sim` drives and the property tests and fuzz targets
    // exercise; an embedder talks to `Client` and `Server`.
    pub use crate::proto::stream::receiver::{Receiver, ReceiverConfig};
    pub use crate::proto::stream::rtt;
    pub use crate::proto::stream::sender::Sender;
    pub use crate::proto::{crypto, path_memory, payload, tuning, wire};
    pub use crate::report::{plot, summary, trace};

    /// `io`'s parts beyond its API.
    pub mod io {
        pub use crate::io::os::{fresh_conn_id, wall_clock_ns};
        pub use crate::io::*;

        /// DEST held open (`crate::io::dest_dir`).
        pub mod dest_dir {
            pub use crate::io::dest_dir::*;
        }
        /// The hello-timestamp table (`crate::io::hello_timestamps`).
        pub mod hello_timestamps {
            pub use crate::io::hello_timestamps::*;
        }
    }

    /// `sim`'s parts beyond its API.
    pub mod sim {
        /// `crate::sim::scenarios`: the papers' measurements that
        /// tests/papers.rs asserts on and examples/mathis.rs prints.
        pub mod scenarios {
            pub use crate::sim::scenarios::*;
        }
        /// `crate::sim::pair`: the taps, stop conditions and session
        /// applications a `Pair` takes in atou's own tests.
        pub mod pair {
            pub use crate::sim::pair::*;
        }
    }

    /// `transfer`'s parts beyond its API: its modules, one each.
    pub mod transfer {
        /// `crate::transfer::bootstrap`.
        pub mod bootstrap {
            pub use crate::transfer::bootstrap::*;
        }
        /// `crate::transfer::compress`: hostile senders' chunk frames.
        pub mod compress {
            pub use crate::transfer::compress::*;
        }
        /// `crate::transfer::dest`.
        pub mod dest {
            pub use crate::transfer::dest::*;
        }
        /// `crate::transfer::hash`.
        pub mod hash {
            pub use crate::transfer::hash::*;
        }
        /// `crate::transfer::layout`.
        pub mod layout {
            pub use crate::transfer::layout::*;
        }
        /// `crate::transfer::manifest`.
        pub mod manifest {
            pub use crate::transfer::manifest::*;
        }
        /// `crate::transfer::messages`.
        pub mod messages {
            pub use crate::transfer::messages::*;
        }
        /// `crate::transfer::receive`.
        pub mod receive {
            pub use crate::transfer::receive::*;
        }
        /// `crate::transfer::send`.
        pub mod send {
            pub use crate::transfer::send::*;
        }
    }
}

/// What the fuzz targets in `fuzz/` reach (cargo-fuzz builds with
/// `--cfg fuzzing`); not a stable API.
#[doc(hidden)]
#[cfg(fuzzing)]
pub mod fuzzing {
    pub use crate::internals::*;
}
