//! Measurements from the papers, shared by the tests (which assert on them)
//! and the examples (which print them).

use std::time::Duration;

use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

use super::flows::bottleneck;
use super::{
    run_flows, FlowConfig, FlowsConfig, Pair, PairConfig, SimConfig, SimError, Simulation,
};
use crate::netem::{mix_seed, Netem, NetemSpec};
use crate::proto::crypto::{ClientAuth, ServerAuth};
use crate::proto::tuning::CcKind;
use crate::proto::{Event, Recorder, RecoveryKind, Time, Tuning};
use crate::util::units::Probability;

/// Mathis §3.1: MSS in the paper's sense, payload bytes per segment.
pub(crate) const MATHIS_MSS: u64 = 1460;

/// One measurement of Mathis's constant.
#[derive(Debug, Clone, Copy)]
pub struct MathisRun {
    /// C = BW · RTT · √p / MSS.
    pub c: f64,
    /// Goodput in bits per second over the measured span.
    pub bw_bps: f64,
    /// The connection's own average RTT (Mathis §3.2: the right RTT to use).
    pub rtt: Duration,
    /// Loss episodes in the measured span.
    pub episodes: usize,
    /// Retransmission timeouts over the whole run: a run with many is
    /// outside Mathis's model, which assumes none.
    pub timeouts: u64,
}

/// Which endpoints run a scenario.
#[derive(Debug, Clone)]
pub enum Endpoints {
    /// A bare `Sender` and `Receiver`, as in the papers.
    Bare,
    /// `Client` and `Server`: a plain hello (and the server's retry), then
    /// the same connection ([`Pair`]).
    Plain,
    /// `Client` and `Server` with a Noise handshake and sealed packets.
    Keys(ServerAuth, ClientAuth),
}

/// Mathis §3.1, queueless random loss: 100 ms RTT, MSS 1460, link loss `p`,
/// a link ten times faster than the flow so no queue stands, the
/// connection between `endpoints`. Runs for `losses / p` segments and
/// measures from the tenth recovery on, leaving out the slow-start
/// overshoot (Mathis appendix B).
pub fn mathis_through(
    kind: RecoveryKind,
    delayed_ack: bool,
    p: f64,
    losses: f64,
    seed: u64,
    endpoints: Endpoints,
) -> Result<MathisRun, SimError> {
    const WARMUP_EPISODES: usize = 10;
    let tuning = Tuning {
        mss: (MATHIS_MSS as usize + crate::proto::wire::DATA_HEADER_LEN) as u32,
        recovery: kind,
        delack: if delayed_ack {
            Duration::from_millis(200)
        } else {
            Duration::ZERO
        },
        // Window never limits (Mathis §2, item 1).
        rcvwin: 1 << 20,
        rcvsegs: 1 << 20,
        maxpkts: (losses / p) as u64,
        ..Tuning::default()
    };
    // A limit the window never reaches: the loss is the only signal.
    let loss = Probability::from_ppb((p * 1e9).round() as u32);
    let fwd: NetemSpec = format!("rate 100mbit delay 50ms limit 100000 loss {loss}")
        .parse()
        .expect("valid spec");
    let rev: NetemSpec = "delay 50ms".parse().expect("valid spec");
    let mut recorder = Recorder::default();
    let run = SimConfig::new(tuning, fwd, rev, None, seed);
    let (secs, snd_una, rtt, timeouts) = match endpoints {
        Endpoints::Bare => {
            let s = Simulation::new(run)?.run(&mut recorder)?.summary;
            (s.secs, s.snd_una, s.avgrtt, s.timeouts)
        }
        Endpoints::Plain | Endpoints::Keys(..) => {
            let mut config = PairConfig::new(run);
            if let Endpoints::Keys(server, client) = endpoints {
                config = config.authenticated(server, client);
            }
            let mut pair = Pair::new(config).map_err(|e| SimError::Pair(e.to_string()))?;
            let now = pair.run(&mut recorder).end;
            let sender = pair
                .client
                .sender_mut()
                .ok_or_else(|| SimError::Pair("the handshake never completed".to_string()))?;
            let timeouts = sender.stats().timeouts;
            let snap = sender.snapshot(now);
            (
                snap.elapsed.as_secs_f64(),
                snap.snd_una,
                snap.avgrtt,
                timeouts,
            )
        }
    };
    let exits: Vec<(Duration, u64)> = recorder
        .events
        .iter()
        .filter_map(|e| match e.event {
            Event::LeaveRecovery { snd_una, .. } => Some((e.time, snd_una)),
            _ => None,
        })
        .collect();
    let (t0, una0) = exits
        .get(WARMUP_EPISODES - 1)
        .copied()
        .unwrap_or((Duration::ZERO, 0));
    let span = secs - t0.as_secs_f64();
    // Segments per second: C is the same whatever each one carries (a
    // sealed segment carries its tag's 16 bytes less).
    let segs_per_sec = (snd_una - una0) as f64 / span;
    Ok(MathisRun {
        c: segs_per_sec * rtt.as_secs_f64() * p.sqrt(),
        bw_bps: segs_per_sec * MATHIS_MSS as f64 * 8.0,
        rtt,
        episodes: exits.len().saturating_sub(WARMUP_EPISODES),
        timeouts,
    })
}

/// Mathis Table 1: the expected C for random loss.
pub fn mathis_expected_c(delayed_ack: bool) -> f64 {
    if delayed_ack {
        0.93
    } else {
        1.31
    }
}

/// How a link reorders: sends `packets` numbered datagrams of `size` bytes
/// every `interval` and returns (fraction arriving out of place, largest
/// displacement in positions).
pub fn displacement(
    spec: &NetemSpec,
    packets: u32,
    size: usize,
    interval: Duration,
    seed: u64,
) -> (f64, u64) {
    let mut link: Netem<Vec<u8>> = Netem::new(spec.clone(), seed);
    let mut arrivals = Vec::new();
    // Packets leave as soon as they are due, as they would on a wire.
    let mut release_until = |link: &mut Netem<Vec<u8>>, until: Option<Time>| {
        while let Some(at) = link.next_release() {
            if until.is_some_and(|u| at > u) {
                break;
            }
            if let Some(p) = link.poll(at) {
                arrivals.push(u32::from_be_bytes([p[0], p[1], p[2], p[3]]));
            }
        }
    };
    for i in 0..packets {
        let now = Time::ZERO + interval * i;
        release_until(&mut link, Some(now));
        let mut p = vec![0u8; size.max(4)];
        p[..4].copy_from_slice(&i.to_be_bytes());
        link.enqueue(now, p);
    }
    release_until(&mut link, None);
    let mut displaced = 0u64;
    let mut max = 0u64;
    for (pos, &id) in arrivals.iter().enumerate() {
        let d = (pos as i64 - i64::from(id)).unsigned_abs();
        displaced += u64::from(d > 0);
        max = max.max(d);
    }
    let pos = arrivals.len();
    (displaced as f64 / pos.max(1) as f64, max)
}

/// Brakmo & Peterson §2's path: a 200 KB/s line with 50 ms delay and a
/// 10-packet drop-tail router queue (the queue with which Reno takes the
/// paper's 8.2 s for a megabyte).
pub const BRAKMO_FWD: &str = "rate 1.6mbit limit 10 | delay 50ms";
/// Brakmo §2's return path: the line's 50 ms the other way.
pub const BRAKMO_REV: &str = "delay 50ms";
/// Brakmo §2: 1 KB segments.
const BRAKMO_PAYLOAD: u32 = 1024;

/// A sender as Brakmo & Peterson's x-kernel TCPs: 1 KB segments, one at
/// first, `window` KB of send buffer (§2: 50 for the measured transfers),
/// Reno's fast recovery, and for AIMD BSD's initial ssthresh of 64 KB
/// (`thresh_init` is a fraction of the window).
pub fn brakmo_sender(cc: CcKind, window: u32) -> Tuning {
    Tuning {
        cc,
        recovery: RecoveryKind::Reno,
        mss: BRAKMO_PAYLOAD + crate::proto::wire::DATA_HEADER_LEN as u32,
        rcvwin: window,
        initsegs: 1,
        thresh_init: if cc == CcKind::Aimd {
            64.0 / f64::from(window)
        } else {
            0.0
        },
        ..Tuning::default()
    }
}

/// The kinds of conversation tcplib draws (Danzig & Jamin 1991, as
/// Brakmo §2.1's TRAFFIC protocol uses them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversation {
    /// An interactive session: a few hundred bytes to a few KB.
    Telnet,
    /// A mail message.
    Smtp,
    /// A batch of news articles.
    Nntp,
    /// A batch of files: most of the bytes.
    Ftp,
}

/// A size distribution: `items` (geometric with this mean, at least one)
/// each Pareto with minimum `min` bytes and shape `alpha`, capped at `cap`.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    items: f64,
    min: f64,
    alpha: f64,
    cap: f64,
}

impl Sizes {
    /// The mean bytes of a conversation: items × E[min(X, cap)] for X
    /// Pareto(min, alpha) (alpha > 1).
    fn mean(&self) -> f64 {
        let Sizes {
            items,
            min,
            alpha,
            cap,
        } = *self;
        let item =
            min * alpha / (alpha - 1.0) - min.powf(alpha) * cap.powf(1.0 - alpha) / (alpha - 1.0);
        items * item
    }

    fn draw(&self, rng: &mut ChaCha8Rng) -> u64 {
        // Geometric on 1, 2, …: mean `items`.
        let items = if self.items > 1.0 {
            1 + (unit(rng).ln() / (1.0 - 1.0 / self.items).ln()).floor() as u64
        } else {
            1
        };
        (0..items)
            .map(|_| (self.min / unit(rng).powf(1.0 / self.alpha)).min(self.cap) as u64)
            .sum()
    }
}

/// tcplib-like conversations: (kind, share of arrivals, sizes). Not
/// tcplib's tables (we do not have them) but their shape: Danzig & Jamin
/// find TELNET and SMTP the most frequent conversations and FTP the one
/// carrying most bytes, every size distribution heavy-tailed. So: TELNET
/// 30 % of arrivals, Pareto(200 B, 1.5) capped at 20 KB; SMTP 35 %,
/// Pareto(1 KB, 1.3) capped at 100 KB (mail messages); NNTP 15 %, 3
/// articles on average of the same sizes; FTP 20 %, 2 items on average,
/// Pareto(4 KB, 1.2) capped at 1 MB. Shapes between 1.2 and 1.5 are those
/// measured for file and transfer sizes (Crovella & Bestavros 1997). The
/// mean conversation is 9.9 KB (TELNET 0.6, SMTP 3.5, NNTP 10.5, FTP 34.7),
/// the median 1.8 KB, and the largest tenth carries 68 % of the bytes
/// (from the formulas in [`Sizes::mean`] and 200 000 draws in Python).
/// Each conversation is one bulk transfer on its own connection: tcplib's
/// TELNET pacing by the user's keystrokes is left out.
const TCPLIB_MIX: [(Conversation, f64, Sizes); 4] = [
    (
        Conversation::Telnet,
        0.30,
        Sizes {
            items: 1.0,
            min: 200.0,
            alpha: 1.5,
            cap: 20_000.0,
        },
    ),
    (
        Conversation::Smtp,
        0.35,
        Sizes {
            items: 1.0,
            min: 1000.0,
            alpha: 1.3,
            cap: 100_000.0,
        },
    ),
    (
        Conversation::Nntp,
        0.15,
        Sizes {
            items: 3.0,
            min: 1000.0,
            alpha: 1.3,
            cap: 100_000.0,
        },
    ),
    (
        Conversation::Ftp,
        0.20,
        Sizes {
            items: 2.0,
            min: 4000.0,
            alpha: 1.2,
            cap: 1_000_000.0,
        },
    ),
];

/// A uniform draw in (0, 1]: never 0, so its logarithm is finite.
fn unit(rng: &mut ChaCha8Rng) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
}

/// The mean payload bytes of a tcplib-like conversation.
pub fn tcplib_mean_bytes() -> f64 {
    TCPLIB_MIX.iter().map(|(_, p, s)| p * s.mean()).sum()
}

/// tcplib-like background traffic (Brakmo §2.1's TRAFFIC): conversations
/// arriving from 0 to `until` with exponential interarrival times, so many
/// that on average they offer `offered_bps` of payload, each a finite
/// flow of `tuning` whose kind and size are drawn from `TCPLIB_MIX` (its
/// doc says which distributions and why). The same seed gives the same
/// conversations, whatever `tuning` is.
pub fn tcplib_background(
    tuning: &Tuning,
    offered_bps: f64,
    until: Duration,
    seed: u64,
) -> Vec<(Conversation, FlowConfig)> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let per_sec = offered_bps / 8.0 / tcplib_mean_bytes();
    let mut flows = Vec::new();
    let mut at = 0.0;
    loop {
        at += -unit(&mut rng).ln() / per_sec;
        if at >= until.as_secs_f64() {
            break flows;
        }
        let mut pick = unit(&mut rng);
        let (kind, _, sizes) = TCPLIB_MIX
            .iter()
            .find(|(_, p, _)| {
                pick -= p;
                pick <= 0.0
            })
            .unwrap_or(&TCPLIB_MIX[TCPLIB_MIX.len() - 1]);
        let flow = FlowConfig {
            tuning: tuning.clone(),
            bytes: Some(sizes.draw(&mut rng).max(1)),
            start: Duration::from_secs_f64(at),
            group: None,
        };
        flows.push((*kind, flow));
    }
}

/// One run of Brakmo §4's Table 4 experiment.
#[derive(Debug, Clone)]
pub struct Table4Run {
    /// The distinguished transfer's payload bytes over its 20 s, per second.
    pub throughput: f64,
    /// Its retransmitted segments over its segments sent (all 1 KB).
    pub retransmitted: f64,
    /// The background's payload over the same 20 s, as a fraction of the
    /// bottleneck's rate.
    pub background: f64,
    /// Everyone's payload over the 20 s as a fraction of the bottleneck's
    /// rate.
    pub utilisation: f64,
    /// Background conversations started before the end.
    pub conversations: usize,
}

/// Brakmo §4, Table 4: a distinguished 20-second transfer (a 50 KB send
/// buffer) on §2's path, sharing the bottleneck with tcplib-like
/// conversations ([`tcplib_background`]) of the same controller `cc`
/// (each with 4.4BSD's 8 KB default send buffer, §2: only the measured
/// transfers had 50 KB) offering `offered` of the line's rate. The
/// background runs `warmup` alone first, so the transfer meets traffic
/// already queued.
///
/// AIMD (the paper's Reno) times out on BSD's 500 ms clock (§3.2; the
/// paper's Reno lacks even the RTO fixes of §3.2, footnote 7), Vegas on a
/// fine-grained one (Brakmo, O'Malley & Peterson 1994 §3.1: Vegas reads
/// the clock for every segment to decide on retransmissions). With a
/// fine-grained clock for both, Reno loses less time to its timeouts and
/// the Vegas/Reno throughput ratio falls from 1.23 to 1.13 (20 seeds,
/// `offered` 0.6; measured before the RTO floor of srtt + min_rto).
pub fn brakmo_table_4(
    cc: CcKind,
    offered: f64,
    warmup: Duration,
    seed: u64,
) -> Result<Table4Run, SimError> {
    const TRANSFER: Duration = Duration::from_secs(20);
    const BSD_SENDSPACE_KB: u32 = 8;
    const BSD_TICK: Duration = Duration::from_millis(500);
    let fwd: NetemSpec = BRAKMO_FWD.parse().expect("valid spec");
    let rev: NetemSpec = BRAKMO_REV.parse().expect("valid spec");
    let line_bps = bottleneck(&fwd).expect("the path has a rate") as f64;
    let end = warmup + TRANSFER;
    let sender = |window| Tuning {
        tick: if cc == CcKind::Aimd {
            BSD_TICK
        } else {
            Duration::ZERO
        },
        ..brakmo_sender(cc, window)
    };
    let background = tcplib_background(
        &sender(BSD_SENDSPACE_KB),
        offered * line_bps,
        end,
        mix_seed(seed, 0x7cb1),
    );
    let conversations = background.len();
    let distinguished = FlowConfig::new(sender(50)).starting_at(warmup);
    let flows = std::iter::once(distinguished)
        .chain(background.into_iter().map(|(_, f)| f))
        .collect();
    let mut config = FlowsConfig::new(flows, fwd, rev, end, seed);
    config.measure_from = Some(warmup);
    let result = run_flows(&config, &mut ())?;
    let transfer = &result.flows[0];
    let bps = |bytes: u64| bytes as f64 * 8.0 / TRANSFER.as_secs_f64();
    let background_bytes: u64 = result.flows[1..].iter().map(|f| f.window_bytes).sum();
    let total_bytes = transfer.window_bytes + background_bytes;
    Ok(Table4Run {
        throughput: transfer.window_bytes as f64 / TRANSFER.as_secs_f64(),
        retransmitted: transfer.summary.rxmts as f64 / transfer.summary.pkts_out.max(1) as f64,
        background: bps(background_bytes) / line_bps,
        utilisation: bps(total_bytes) / line_bps,
        conversations,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator is seeded, offers about the load asked of it and
    /// draws the kinds in TCPLIB_MIX's shares.
    #[test]
    fn tcplib_background_is_seeded_and_offers_its_load() {
        let tuning = brakmo_sender(CcKind::Aimd, 8);
        let span = Duration::from_secs(20_000);
        let offered_bps = 800_000.0;
        let a = tcplib_background(&tuning, offered_bps, span, 7);
        let b = tcplib_background(&tuning, offered_bps, span, 7);
        let other = tcplib_background(&tuning, offered_bps, Duration::from_secs(20), 8);
        let key =
            |flows: &[(Conversation, FlowConfig)]| -> Vec<(Conversation, Option<u64>, Duration)> {
                flows.iter().map(|(k, f)| (*k, f.bytes, f.start)).collect()
            };
        assert_eq!(key(&a), key(&b));
        assert_ne!(key(&a[..other.len()]), key(&other));
        assert!(a.windows(2).all(|w| w[0].1.start <= w[1].1.start));
        assert!(a.iter().all(|(_, f)| f.start < span));
        let bytes: u64 = a.iter().filter_map(|(_, f)| f.bytes).sum();
        let got_bps = bytes as f64 * 8.0 / span.as_secs_f64();
        assert!(
            (got_bps / offered_bps - 1.0).abs() < 0.05,
            "offered {got_bps:.0} bit/s of {offered_bps:.0}"
        );
        for (kind, share, _) in TCPLIB_MIX {
            let n = a.iter().filter(|(k, _)| *k == kind).count();
            let got = n as f64 / a.len() as f64;
            assert!((got - share).abs() < 0.01, "{kind:?}: {got:.3} of arrivals");
        }
    }
}
