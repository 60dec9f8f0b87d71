//! atou's end-of-run summary: printed in atou's layout, or as JSON with
//! atou's names as keys (times in seconds, rates in bits per second).

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::io::{ClientEnd, ClientReport};
use crate::netem::NetemStats;
use crate::proto::congestion::CcReport;
use crate::proto::events::Thresh;
use crate::proto::tuning::KNOBS;
use crate::proto::{PathMemory, ReceiverStats, SenderSnapshot, SenderStats, Tuning};

/// What the simulator adds: the paths and what they did.
#[derive(Debug, Clone, Serialize)]
pub struct SimReport {
    pub seed: u64,
    pub fwd: String,
    pub rev: String,
    pub fwd_stats: NetemStats,
    pub rev_stats: NetemStats,
    /// Bytes delivered in order and checked against what was sent.
    pub verified_bytes: u64,
    /// Offset of the first wrong byte, if the stream was not intact.
    pub first_error: Option<u64>,
}

fn secs_f64<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn thresh<S: serde::Serializer>(t: &u64, s: S) -> Result<S::Ok, S::Error> {
    if *t == u64::MAX {
        s.serialize_none()
    } else {
        s.serialize_u64(*t)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// `local => remote`.
    pub path: String,
    /// `finished`, or why not.
    pub status: String,
    /// Good (acknowledged payload) bytes.
    pub bytes: u64,
    pub secs: f64,
    pub goodput_bps: f64,
    pub pkts_in: u64,
    pub pkts_out: u64,
    pub bytes_out: u64,
    pub enobufs: u64,
    pub rxmts: u64,
    pub dup3s: u64,
    pub packs: u64,
    pub timeouts: u64,
    pub dups: u64,
    pub badacks: u64,
    pub maxack: u64,
    pub maxburst: u64,
    /// Transmissions dropped by the droplist.
    pub dropped: u64,
    pub dsacks: u64,
    /// Retransmissions a D-SACK proved unnecessary (RFC 3708 §3).
    pub spurious_rxmts: u64,
    pub reneges: u64,
    pub bad_packets: u64,
    /// Tail loss probes (RFC 8985 §7).
    pub tlps: u64,
    /// Reductions undone as spurious (Sarolahti §6).
    pub undos: u64,
    /// Window reductions for local congestion (ENOBUFS), CWR.
    pub cwrs: u64,
    /// The largest reordering seen, in segments.
    pub reordering: u64,
    /// The duplicate threshold at the end (raised by `reordering adaptive`).
    pub dup_thresh: u64,
    #[serde(serialize_with = "secs_f64")]
    pub minrtt: Duration,
    #[serde(serialize_with = "secs_f64")]
    pub maxrtt: Duration,
    #[serde(serialize_with = "secs_f64")]
    pub avgrtt: Duration,
    #[serde(serialize_with = "secs_f64")]
    pub rto: Duration,
    #[serde(serialize_with = "secs_f64")]
    pub srtt: Duration,
    #[serde(serialize_with = "secs_f64")]
    pub rttvar: Duration,
    pub snd_nxt: u64,
    pub snd_una: u64,
    pub snd_max: u64,
    pub cwnd: u64,
    /// `null` while unlimited (no loss yet and `thresh_init 0`).
    #[serde(serialize_with = "thresh")]
    pub ssthresh: u64,
    /// The controller's pacing rate at the end, in bits per second; absent
    /// for a controller that does not pace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing_bps: Option<f64>,
    /// A model-based controller's state and estimates at the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub controller: Option<CcReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receiver: Option<ReceiverStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<SocketReport>,
    /// Authentication and packet protection of a real-socket run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security: Option<SecurityReport>,
    pub tuning: Tuning,
    /// What the connection learnt about its path, for the next one to the
    /// same destination (`crate::config::path_cache`); not part of the report.
    #[serde(skip)]
    pub path_memory: Option<PathMemory>,
}

/// How a connection was protected (handshake and cipher).
#[derive(Debug, Clone, Serialize)]
pub struct SecurityReport {
    /// The packet cipher, or "none" for a plain (`--no-auth`) connection.
    pub cipher: String,
    /// From the first hello to the server's accepting answer, in seconds.
    pub handshake_secs: Option<f64>,
    /// Datagrams that failed to open (forged, corrupted, replayed),
    /// dropped unanswered.
    pub dropped: u64,
    /// Datagrams sealed on a thread beside the protocol's
    /// (`--seal-thread`); 0 where all were sealed on it.
    pub sealed_aside: u64,
}

/// What a real-socket run adds: the buffers the kernels granted.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SocketReport {
    /// This end's SO_SNDBUF and SO_RCVBUF as the kernel reports them.
    pub sndbuf: u32,
    pub rcvbuf: u32,
    /// The server's socket receive buffer, from its welcome.
    pub server_rcvbuf: Option<u32>,
    /// Paced sends carried departure times (SO_TXTIME), which an fq
    /// qdisc honours; false: the pacer's bursts left as sent.
    pub txtime: bool,
}

impl Summary {
    pub fn new(
        path: String,
        status: String,
        tuning: &Tuning,
        stats: &SenderStats,
        snap: &SenderSnapshot,
    ) -> Summary {
        let secs = snap.elapsed.as_secs_f64();
        Summary {
            path,
            status,
            bytes: snap.good_bytes,
            secs,
            goodput_bps: if secs > 0.0 {
                snap.good_bytes as f64 * 8.0 / secs
            } else {
                0.0
            },
            pkts_in: stats.pkts_in,
            pkts_out: stats.pkts_out,
            bytes_out: stats.bytes_out,
            enobufs: 0,
            rxmts: stats.rxmts,
            dup3s: stats.dup3s,
            packs: stats.packs,
            timeouts: stats.timeouts,
            dups: stats.dups,
            badacks: stats.badacks,
            maxack: stats.maxack,
            maxburst: stats.maxburst,
            dropped: stats.dropped,
            dsacks: stats.dsacks,
            spurious_rxmts: stats.spurious_rxmts,
            reneges: stats.reneges,
            tlps: stats.tlps,
            undos: stats.undos,
            cwrs: stats.cwrs,
            reordering: stats.reordering,
            dup_thresh: stats.dup_thresh,
            bad_packets: stats.bad_packets,
            minrtt: snap.minrtt,
            maxrtt: snap.maxrtt,
            avgrtt: snap.avgrtt,
            rto: snap.rto,
            srtt: snap.srtt,
            rttvar: snap.rttvar,
            snd_nxt: snap.snd_nxt,
            snd_una: snap.snd_una,
            snd_max: snap.snd_max,
            cwnd: snap.cwnd,
            ssthresh: snap.ssthresh,
            pacing_bps: snap.pacing_rate.map(|r| r as f64 * 8.0),
            controller: snap.cc,
            receiver: None,
            sim: None,
            sockets: None,
            security: None,
            tuning: tuning.clone(),
            path_memory: PathMemory::from_snapshot(snap, tuning.mss),
        }
    }

    /// The summary of a real-socket connection to `peer_name` (the peer
    /// as the user named it) that got as far as sending: what it
    /// measured, and how it ended. The sockets are the caller's to add.
    pub fn from_client(
        report: &ClientReport,
        end: &ClientEnd,
        peer_name: &str,
        tuning: &Tuning,
    ) -> Summary {
        let status = match end {
            ClientEnd::Closed { peer: Some(_) } | ClientEnd::Answered => "finished".to_string(),
            ClientEnd::Closed { peer: None } => {
                "finished (all data acknowledged; the close was not)".to_string()
            }
            ClientEnd::Failed { why } => format!("failed: {why}"),
        };
        let mut s = Summary::new(
            format!("{} => {peer_name}", local_name()),
            status,
            tuning,
            &report.stats,
            &report.snapshot,
        );
        s.enobufs = report.enobufs;
        s.bad_packets += report.bad_packets;
        s.security = Some(SecurityReport {
            cipher: report
                .cipher
                .map_or("none".to_string(), |c| c.name().to_string()),
            handshake_secs: report.handshake.map(|d| d.as_secs_f64()),
            dropped: report.crypto_drops.total(),
            sealed_aside: report.sealed_aside,
        });
        if let ClientEnd::Closed { peer: Some(p) } = end {
            s.receiver = Some(*p);
        }
        s
    }
}

/// This host's name, for the summary's path; `localhost` when unknown.
fn local_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The `config:` lines: every knob, five to a line, then what the caller adds.
pub fn config_lines(tuning: &Tuning) -> Vec<String> {
    KNOBS
        .chunks(5)
        .map(|chunk| {
            let pairs: Vec<String> = chunk
                .iter()
                .map(|k| format!("{} {}", k.name, tuning.get(k.name).unwrap_or_default()))
                .collect();
            format!("config: {}", pairs.join(" "))
        })
        .collect()
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_config(f)?;
        self.fmt_rates(f)?;
        self.fmt_sender(f)?;
        self.fmt_events(f)?;
        self.fmt_sim(f)?;
        self.fmt_sockets_and_status(f)
    }
}

impl Summary {
    /// The `config:` lines: the release, the path, every knob, the seed.
    fn fmt_config(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "config: atou {} {}",
            env!("CARGO_PKG_VERSION"),
            self.path
        )?;
        for line in config_lines(&self.tuning) {
            writeln!(f, "{line}")?;
        }
        if let Some(sim) = &self.sim {
            writeln!(
                f,
                "config: seed {} fwd \"{}\" rev \"{}\"",
                sim.seed, sim.fwd, sim.rev
            )?;
        }
        Ok(())
    }

    /// The headline: goodput, bytes, packets and loss.
    fn fmt_rates(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tuning;
        let mbs = self.goodput_bps / 1e6;
        writeln!(
            f,
            "{} {mbs:.6} Mbs win {} rxmts {}",
            self.path, t.rcvwin, self.rxmts
        )?;
        writeln!(
            f,
            "{:.6} secs {} good bytes goodput {:.6} KBs {mbs:.6} Mbs",
            self.secs,
            self.bytes,
            self.goodput_bps / 8e3
        )?;
        writeln!(
            f,
            "pkts in {} out {} enobufs {}",
            self.pkts_in, self.pkts_out, self.enobufs
        )?;
        let loss = if self.pkts_out > 0 {
            self.rxmts as f64 * 100.0 / self.pkts_out as f64
        } else {
            0.0
        };
        let out_mbs = if self.secs > 0.0 {
            self.bytes_out as f64 * 8.0 / self.secs / 1e6
        } else {
            0.0
        };
        writeln!(
            f,
            "total bytes out {} loss {loss:.3} % {out_mbs:.6} Mbs",
            self.bytes_out
        )?;
        Ok(())
    }

    /// The sender's counters, its RTT estimate and its state at the end.
    fn fmt_sender(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tuning;
        writeln!(
            f,
            "rxmts {} dup3s {} packs {} timeouts {} dups {} badacks {} maxack {} maxburst {}",
            self.rxmts,
            self.dup3s,
            self.packs,
            self.timeouts,
            self.dups,
            self.badacks,
            self.maxack,
            self.maxburst
        )?;
        writeln!(
            f,
            "minrtt {:.6} maxrtt {:.6} avgrtt {:.6}",
            self.minrtt.as_secs_f64(),
            self.maxrtt.as_secs_f64(),
            self.avgrtt.as_secs_f64()
        )?;
        writeln!(
            f,
            "rto {:.6} srtt {:.6} rttvar {:.6}",
            self.rto.as_secs_f64(),
            self.srtt.as_secs_f64(),
            self.rttvar.as_secs_f64()
        )?;
        let avg = self.avgrtt.as_secs_f64();
        let win_bits = f64::from(t.rcvwin) * t.payload_size() as f64 * 8.0;
        let win_rtt = if avg > 0.0 { win_bits / avg / 1e6 } else { 0.0 };
        let bwdelay = self.goodput_bps * avg / 8.0;
        writeln!(
            f,
            "win/rtt = {win_rtt:.6} Mbs bwdelay = {:.0} KB {:.0} segs",
            bwdelay / 1e3,
            bwdelay / t.payload_size() as f64
        )?;
        writeln!(
            f,
            "snd_nxt {} snd_cwnd {} snd_una {} ssthresh {} snd_max {}",
            self.snd_nxt,
            self.cwnd,
            self.snd_una,
            Thresh(self.ssthresh),
            self.snd_max
        )?;
        if let Some(bps) = self.pacing_bps {
            writeln!(f, "pacing rate {:.6} Mbs", bps / 1e6)?;
        }
        if let Some(c) = &self.controller {
            writeln!(
                f,
                "cc {} state {} bw {:.6} Mbs min_rtt {:.6}",
                t.cc,
                c.state,
                c.bw_bps as f64 / 1e6,
                c.min_rtt.as_secs_f64()
            )?;
        }
        Ok(())
    }

    /// Counters shown only when not zero, and the receiver's.
    fn fmt_events(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dropped > 0 || self.dsacks > 0 || self.bad_packets > 0 || self.reneges > 0 {
            writeln!(
                f,
                "droplist drops {} dsacks {} spurious rxmts {} reneges {} bad packets {}",
                self.dropped, self.dsacks, self.spurious_rxmts, self.reneges, self.bad_packets
            )?;
        }
        if self.tlps > 0 || self.undos > 0 {
            writeln!(f, "tlps {} undos {}", self.tlps, self.undos)?;
        }
        if self.cwrs > 0 {
            writeln!(
                f,
                "cwr reductions {} (socket refused datagrams: enobufs)",
                self.cwrs
            )?;
        }
        if self.reordering > 0 {
            writeln!(
                f,
                "reordering {} segments, dup_thresh {}",
                self.reordering, self.dup_thresh
            )?;
        }
        if let Some(r) = &self.receiver {
            writeln!(
                f,
                "receiver: segments {} bytes {} acks {} dups {} out-of-order {} beyond-window {}",
                r.segments, r.bytes, r.acks, r.duplicates, r.out_of_order, r.beyond_window
            )?;
        }
        Ok(())
    }

    /// What the simulator's paths did, and whether the stream arrived intact.
    fn fmt_sim(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(sim) = &self.sim {
            for (name, s) in [("fwd", &sim.fwd_stats), ("rev", &sim.rev_stats)] {
                writeln!(
                    f,
                    "{name}: offered {} delivered {} lost {} limit-drops {} duplicated {} reordered {} corrupted {}",
                    s.offered, s.delivered, s.lost, s.limit_drops, s.duplicated, s.reordered, s.corrupted
                )?;
            }
            match sim.first_error {
                None => writeln!(f, "verified {} bytes in order", sim.verified_bytes)?,
                Some(at) => writeln!(f, "STREAM CORRUPT at byte {at}")?,
            }
        }
        Ok(())
    }

    /// The sockets, the security of the connection and, if it did not
    /// finish, why.
    fn fmt_sockets_and_status(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(k) = &self.sockets {
            write!(
                f,
                "sockets: sndbuf {} rcvbuf {} granted",
                k.sndbuf, k.rcvbuf
            )?;
            if let Some(r) = k.server_rcvbuf {
                write!(f, "; server rcvbuf {r}")?;
            }
            writeln!(f, "; txtime {}", if k.txtime { "on" } else { "off" })?;
        }
        if let Some(s) = &self.security {
            match s.handshake_secs {
                Some(h) => writeln!(
                    f,
                    "security: {} (Noise IK, keys pinned) handshake {h:.6} secs dropped {}",
                    s.cipher, s.dropped
                )?,
                None => writeln!(f, "security: {} (unauthenticated, unencrypted)", s.cipher)?,
            }
        }
        if self.status != "finished" {
            writeln!(f, "status: {}", self.status)?;
        }
        Ok(())
    }
}
