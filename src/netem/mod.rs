//! Link impairment in tc-netem(8)'s syntax and semantics, sans I/O.
//!
//! One model serves the simulator (virtual time), `atou netem relay` (a
//! UDP relay in real time) and `atou netem bridge` (IP packets between two
//! network namespaces over TUN devices). It follows the kernel's sch_netem
//! step for step: duplicate, loss, corrupt, `limit`, then reorder or delay
//! (with `rate` serialising after the last packet queued) into a time-ordered
//! queue, released through `slot`s. Where it differs from the kernel, and
//! why, is listed in docs/netem.md.
//!
//! ```
//! use atou::netem::{Netem, NetemSpec};
//! use atou::Time;
//!
//! let spec: NetemSpec = "delay 10ms loss 1% seed 7".parse().unwrap();
//! let mut link: Netem<Vec<u8>> = Netem::new(spec, 0);
//! link.enqueue(Time::ZERO, vec![0; 100]);
//! let due = link.next_release().unwrap();
//! assert_eq!(due, Time::from_nanos(10_000_000));
//! assert_eq!(link.poll(due).map(|p| p.len()), Some(100));
//! ```

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

mod model;
mod random;
pub mod spec;

pub(crate) use model::mix_seed;
pub use model::{Datagram, Netem, NetemStats};
pub use spec::{
    Distribution, FourState, GilbertElliott, Loss, NetemSpec, QdiscSpec, Rate, Slot, SlotDelay,
    SpecError,
};
