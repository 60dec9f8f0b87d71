//! Measurements from the papers, shared by the tests (which assert on them)
//! and the examples (which print them).

use std::time::Duration;

use super::{Pair, PairConfig, SimConfig, SimError, Simulation};
use crate::netem::{Netem, NetemSpec};
use crate::proto::crypto::{ClientAuth, ServerAuth};
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
