//! Prints Mathis's constant C = BW·RTT·√p/MSS as measured in the simulator
//! for every recovery variant, with and without delayed ACKs, next to the
//! paper's values (Mathis, Semke, Mahdavi & Ott 1997, Table 1 and §3.1).
//!
//!     cargo run --release --example mathis

use atou::proto::RecoveryKind;
use atou::sim::scenarios::{mathis, mathis_expected_c};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!(
        "{:>8} {:>6} {:>8} {:>7} {:>7} {:>9} {:>8}",
        "acks", "p", "variant", "C", "paper", "episodes", "timeouts"
    );
    for delayed in [false, true] {
        for p in [0.001, 0.003, 0.01] {
            for kind in RecoveryKind::ALL {
                let run = mathis(kind, delayed, p, 300.0, 1)?;
                println!(
                    "{:>8} {:>5}% {:>8} {:>7.3} {:>7.2} {:>9} {:>8}",
                    if delayed { "delayed" } else { "every" },
                    p * 100.0,
                    kind.name(),
                    run.c,
                    mathis_expected_c(delayed),
                    run.episodes,
                    run.timeouts
                );
            }
        }
    }
    Ok(())
}
