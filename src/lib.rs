//! atou: reliable file transfer over a tunable, instrumented TCP-like
//! protocol on UDP, after Dunigan & Fowler's "almost TCP over UDP" (ORNL 2002).
//!
//! - [`proto`]: the transport as a sans-I/O library.
//! - [`sim`]: a virtual-time simulator driving it over modelled links.
//! - [`summary`]: atou's end-of-run report.
//! - [`trace`] reads a packet trace back; [`plot`] draws it as SVG.
//! - [`units`]: parsing and printing of rates, sizes and durations.

pub mod io;
pub mod keys;
pub mod netem;
pub mod path_cache;
pub mod plot;
pub mod proto;
pub mod sim;
pub mod summary;
pub mod text;
pub mod trace;
pub mod transfer;
pub mod units;
