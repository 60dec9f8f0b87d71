//! `atou __cipher-cost`: what the packet cipher alone costs, in CPU
//! seconds per GB of a connection's data, at the datagram size a
//! connection uses (issue 28 point 4's yardstick: the extra CPU a
//! connection spends on encryption, per end, against this). Hidden: run
//! by `scripts/bench-crypto.sh` in the same run as the probes it is set
//! against.

use std::time::Duration;

use anyhow::Result;
use clap::Args;

use crate::proto::crypto::frame::AAD_LEN;
use crate::proto::crypto::protect::{PacketKey, TAG_LEN};
use crate::proto::crypto::{Cipher, TrafficSecret};
use crate::proto::endpoint::client::segment_payload;
use crate::proto::tuning::Tuning;
use crate::proto::wire::{ACK_MIN_LEN, HEADER_LEN};

#[derive(Args, Debug)]
pub(super) struct CipherCostArgs {
    /// Data to account for, as a connection's goodput: 1GB (10^6), 1GiB
    #[arg(long, value_name = "SIZE", default_value = "1GB", value_parser = super::parse_bytes)]
    bytes: u64,
    /// UDP datagram size in bytes, as the connection's --mss
    #[arg(long, value_name = "BYTES", default_value_t = 1472)]
    mss: u32,
    /// aes-256-gcm, chacha20-poly1305 or auto
    #[arg(long, value_name = "CIPHER", default_value = "auto", value_parser = parse_cipher)]
    cipher: Cipher,
}

fn parse_cipher(s: &str) -> Result<Cipher, crate::proto::crypto::protect::UnknownCipher> {
    s.parse()
}

/// Datagrams sealed, then opened, a batch at a time: as many as a
/// connection's socket batch, small enough to stay in the core's cache,
/// as a datagram just written or just received is.
const BATCH: usize = 256;

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// Seals and opens the datagrams that carry `--bytes` of data at
/// `--mss`, under the crate's own packet keys (ring), and as many ACKs
/// (without SACK blocks: a clean path's), and prints one JSON line: CPU
/// seconds per GB of data to seal and to open, and nanoseconds to seal
/// and to open one ACK (the caller knows how many ACKs a GB took).
pub(super) fn cipher_cost(args: CipherCostArgs) -> Result<std::process::ExitCode> {
    let tuning = Tuning {
        mss: args.mss,
        ..Tuning::default()
    };
    let data = segment_payload(&tuning, Some(args.cipher));
    anyhow::ensure!(data > 0, "--mss {} leaves no room for data", args.mss);
    // What each datagram's AEAD covers: the inner packet after the
    // associated data, and the tag.
    let sealed_len = (args.mss as usize)
        .checked_sub(AAD_LEN)
        .filter(|&n| n > TAG_LEN)
        .ok_or_else(|| anyhow::anyhow!("--mss {} is too small", args.mss))?;
    let datagrams = args.bytes.div_ceil(data).max(1);
    let secret = TrafficSecret::new([0x42; 32]);
    let key = PacketKey::new(args.cipher, &secret, &secret);
    let header = [0x5a_u8; AAD_LEN];
    // An ACK's body (its inner packet past the header) and the tag.
    let ack_sealed_len = ACK_MIN_LEN - HEADER_LEN + TAG_LEN;
    let mut bufs = vec![vec![0x17_u8; sealed_len]; BATCH];
    let mut acks = vec![vec![0x17_u8; ack_sealed_len]; BATCH];
    let (mut seal, mut open) = (Duration::ZERO, Duration::ZERO);
    let (mut ack_seal, mut ack_open) = (Duration::ZERO, Duration::ZERO);
    let mut pn = 0u64;
    while pn < datagrams {
        let n = (datagrams - pn).min(BATCH as u64) as usize;
        for (bufs, seal, open) in [
            (&mut bufs, &mut seal, &mut open),
            (&mut acks, &mut ack_seal, &mut ack_open),
        ] {
            let t0 = thread_cpu();
            for (i, buf) in bufs[..n].iter_mut().enumerate() {
                key.seal_in_place(pn + i as u64, &header, buf)?;
            }
            let t1 = thread_cpu();
            for (i, buf) in bufs[..n].iter_mut().enumerate() {
                key.open_in_place(pn + i as u64, &header, buf)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            let t2 = thread_cpu();
            *seal += t1 - t0;
            *open += t2 - t1;
        }
        pn += n as u64;
    }
    let gb = (datagrams * data) as f64 / 1e9;
    let line = serde_json::json!({
        "cipher": args.cipher.name(),
        "mss": args.mss,
        "data_per_datagram": data,
        "sealed_per_datagram": sealed_len,
        "datagrams": datagrams,
        "seal_cpu_s_per_gb": seal.as_secs_f64() / gb,
        "open_cpu_s_per_gb": open.as_secs_f64() / gb,
        "seal_ns_per_datagram": seal.as_nanos() as f64 / datagrams as f64,
        "open_ns_per_datagram": open.as_nanos() as f64 / datagrams as f64,
        "ack_sealed_len": ack_sealed_len,
        "ack_seal_ns": ack_seal.as_nanos() as f64 / datagrams as f64,
        "ack_open_ns": ack_open.as_nanos() as f64 / datagrams as f64,
    });
    println!("{line}");
    Ok(std::process::ExitCode::SUCCESS)
}
