//! Drives the simulator from the library: a NewReno transfer of 1 MB over
//! Hoe's path (1.6 Mbit/s bottleneck, 10-packet queue, 100 ms RTT), with
//! the events printed as they happen and atou's summary at the end.
//!
//!     cargo run --example simulate

use atou::sim::{SimConfig, Simulation};
use atou::Observer;
use atou::{RecoveryKind, TimedEvent, Tuning};

struct PrintEvents;

impl Observer for PrintEvents {
    fn on_event(&mut self, event: &TimedEvent) {
        println!("{event}");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut tuning = Tuning {
        recovery: RecoveryKind::NewReno,
        rcvwin: 50,
        initsegs: 1,
        ..Tuning::default()
    };
    tuning.apply_config("mss 1057\nthresh_init 1.28\n")?;
    let config = SimConfig::new(
        tuning,
        "rate 1.6mbit limit 10 | delay 50ms".parse()?,
        "delay 50ms".parse()?,
        Some(1 << 20),
        1,
    );
    let result = Simulation::new(config)?.run(&mut PrintEvents)?;
    print!("{}", result.summary);
    Ok(())
}
