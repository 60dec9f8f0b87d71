//! Prints Mathis's constant C = BW·RTT·√p/MSS as measured in the simulator
//! for every recovery variant, with and without delayed ACKs, next to the
//! paper's values (Mathis, Semke, Mahdavi & Ott 1997, Table 1 and §3.1).
//!
//!     cargo run --release --example mathis [bare|plain|keyed]
//!
//! `bare` (the default) runs a `Sender` and a `Receiver`, as the paper's
//! model has it; `plain` a `Client` and a `Server` (hello, retry, then the
//! same connection); `keyed` the same through the Noise handshake, every
//! packet sealed.

use std::sync::Arc;

use atou::internals::crypto::{
    format_public_key, AuthorizedKeys, Cipher, ClientAuth, ServerAuth, StaticKeypair,
};
use atou::internals::sim::scenarios::{mathis_expected_c, mathis_through, Endpoints};
use atou::RecoveryKind;

fn endpoints(name: &str) -> Result<Endpoints, Box<dyn std::error::Error>> {
    Ok(match name {
        "bare" => Endpoints::Bare,
        "plain" => Endpoints::Plain,
        "keyed" => {
            let (server, client) = (StaticKeypair::generate()?, StaticKeypair::generate()?);
            let line = format_public_key(&client.public(), "mathis") + "\n";
            let authorized = AuthorizedKeys::parse(line.as_bytes())?;
            Endpoints::Keys(
                ServerAuth {
                    identity: Some(server.clone()),
                    authorized: Some(Arc::new(authorized)),
                    allow_plain: false,
                },
                ClientAuth {
                    identity: client,
                    server_key: server.public(),
                    cipher: Cipher::Aes256Gcm,
                },
            )
        }
        other => return Err(format!("{other}: bare, plain or keyed").into()),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "bare".to_string());
    let through = endpoints(&name)?;
    println!("endpoints: {name}");
    println!(
        "{:>8} {:>6} {:>8} {:>7} {:>7} {:>9} {:>8}",
        "acks", "p", "variant", "C", "paper", "episodes", "timeouts"
    );
    for delayed in [false, true] {
        for p in [0.001, 0.003, 0.01] {
            for kind in RecoveryKind::ALL {
                let run = mathis_through(kind, delayed, p, 300.0, 1, through.clone())?;
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
