//! atou: reliable file transfer over a tunable, instrumented TCP-like
//! protocol on UDP, after Dunigan & Fowler's "almost TCP over UDP" (ORNL 2002).
//!
//! - [`proto`]: the transport as a sans-I/O library.
//! - [`sim`]: a virtual-time simulator driving it over modelled links.
//! - [`report`]: the end-of-run summary; a packet trace read back and drawn as SVG.
//! - [`config`]: key files, known hosts, authorized keys, the path cache.
//! - [`util`]: parsing and printing of rates, sizes and durations; text escaping.

pub mod config;
pub mod io;
pub mod netem;
pub mod proto;
pub mod report;
pub mod sim;
pub mod transfer;
pub mod util;
