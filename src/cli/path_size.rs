//! A transfer's datagram size (docs/transfer.md, "Datagram size"):
//! `--mss` if given, lo's jumbo size to this host, the size the path
//! cache remembers, else a path-MTU search ([`crate::proto::pmtu`]) made
//! before the first connection.

use std::net::SocketAddr;

use crate::proto::pmtu::{candidate_payloads, SizeSearch, BASE_PAYLOAD_V4, BASE_PAYLOAD_V6};
use crate::proto::{PathMemory, Tuning};

/// Where a transfer's datagram size came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum SizeFrom {
    /// `--mss` (or a config file) set it; no search.
    Forced,
    /// The receiver is this host: lo's size, no search.
    ThisHost,
    /// The path cache's, from an earlier search.
    Cached,
    /// This transfer's search: the largest probe acked.
    Found,
    /// No probe above the base was acked (or none could be sent).
    Base,
    /// The path stopped carrying the size in use during the transfer (a
    /// black hole: [`crate::proto::pmtu::BlackHoleWatch`]); the rest went
    /// at the largest size its probes found.
    SteppedDown,
    /// The sockets were handed over already bound (through a NAT): they
    /// keep the default size, unprobed.
    Unprobed,
    /// Through the ssh tunnel: the datagrams cross no network, only
    /// loopback to the relays and ssh's channel between them.
    Tunnel,
}

/// The datagram size a transfer uses, and how it was chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(super) struct PathSize {
    /// The IP packet size of a full datagram: the path MTU in use.
    pub(super) path_mtu: u32,
    /// The UDP payload (`mss`).
    pub(super) datagram: u32,
    pub(super) from: SizeFrom,
}

impl PathSize {
    fn of(peer: SocketAddr, datagram: u32, from: SizeFrom) -> PathSize {
        PathSize {
            path_mtu: datagram + ip_udp_header(peer),
            datagram,
            from,
        }
    }

    /// The summary's words: "path MTU 1400 (found)".
    pub(super) fn text(&self) -> String {
        let how = match self.from {
            SizeFrom::Forced => "set by --mss",
            SizeFrom::ThisHost => "this host",
            SizeFrom::Cached => "path cache",
            SizeFrom::Found => "found",
            SizeFrom::Base => "no probe answered: the base size",
            SizeFrom::SteppedDown => "stepped down during the transfer",
            SizeFrom::Unprobed => "not probed",
            SizeFrom::Tunnel => "loopback to the ssh tunnel",
        };
        format!("path MTU {} ({how})", self.path_mtu)
    }

    /// What the path cache keeps: a size a search vouched for.
    pub(super) fn to_remember(self) -> Option<u32> {
        matches!(
            self.from,
            SizeFrom::Found | SizeFrom::Cached | SizeFrom::SteppedDown
        )
        .then_some(self.datagram)
    }

    /// The size to go on at after the path stopped carrying this one and
    /// probes of `carried` bytes passed; `None` where `--mss` forced it
    /// (the user's size is not second-guessed: the error says what to
    /// try) or `carried` is no smaller.
    pub(super) fn step_down(
        self,
        tuning: &mut Tuning,
        peer: SocketAddr,
        carried: u32,
    ) -> Option<PathSize> {
        if self.from == SizeFrom::Forced || carried >= tuning.mss {
            return None;
        }
        set_mss(tuning, carried);
        Some(PathSize::of(peer, carried, SizeFrom::SteppedDown))
    }
}

fn ip_udp_header(peer: SocketAddr) -> u32 {
    if peer.is_ipv6() {
        48
    } else {
        28
    }
}

/// Chooses `tuning.mss` for a transfer to `peer` and says how. `fixed`:
/// `--mss` or this host already set it; `probe`: the transfer runs on
/// fresh sockets, which a search's answers reach as theirs.
pub(super) fn choose(
    tuning: &mut Tuning,
    peer: SocketAddr,
    fixed: Option<SizeFrom>,
    memory: Option<&PathMemory>,
    probe: bool,
) -> PathSize {
    if let Some(from) = fixed {
        return PathSize::of(peer, tuning.mss, from);
    }
    if !probe {
        return PathSize::of(peer, tuning.mss, SizeFrom::Unprobed);
    }
    let (size, from) = match memory.and_then(|m| m.datagram_size) {
        Some(cached) => (cached, SizeFrom::Cached),
        None => search(peer),
    };
    set_mss(tuning, size);
    PathSize::of(peer, size, from)
}

/// The size for a transfer that goes on through the ssh tunnel, its peer
/// now `stand_in`, a loopback stand-in for the receiver: `mss`, lo's size,
/// as to this host. The tunnel carries each datagram as one frame, and
/// its relays' cost is per frame: at the base size of the UDP attempt
/// before it (1,200 bytes) a push through it moved 130 to 500 Mbit/s
/// where a pull, at lo's size, moved 600 to 880.
pub(super) fn through_tunnel(tuning: &mut Tuning, stand_in: SocketAddr, mss: u32) -> PathSize {
    set_mss(tuning, mss);
    PathSize::of(stand_in, mss, SizeFrom::Tunnel)
}

/// Probes the path to `peer`: the route's MTU and the usual sizes below it.
fn search(peer: SocketAddr) -> (u32, SizeFrom) {
    let base = if peer.is_ipv6() {
        BASE_PAYLOAD_V6
    } else {
        BASE_PAYLOAD_V4
    };
    // Without a route MTU (a BSD, an odd route), Ethernet's.
    let route = crate::io::route_mtu(peer).unwrap_or(1500);
    let candidates = candidate_payloads(route, ip_udp_header(peer), base);
    let search = SizeSearch::new(
        crate::io::fresh_conn_id(),
        crate::io::fresh_conn_id(),
        base,
        &candidates,
    );
    let Ok(rt) = super::net::runtime() else {
        return (base, SizeFrom::Base);
    };
    let done = rt.block_on(crate::io::pmtu::search_path_size(peer, search));
    let from = if done.found() {
        SizeFrom::Found
    } else {
        SizeFrom::Base
    };
    (done.size(), from)
}

/// Sets the datagram size, keeping the receive window's bytes: `rcvsegs`
/// was counted in segments of the old size.
fn set_mss(tuning: &mut Tuning, mss: u32) {
    let old = tuning.payload_size() as u64;
    tuning.mss = mss;
    let new = tuning.payload_size() as u64;
    let bytes = u64::from(tuning.rcvsegs) * old;
    tuning.rcvsegs = u32::try_from(bytes.div_ceil(new)).unwrap_or(u32::MAX);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn memory(datagram_size: Option<u32>) -> PathMemory {
        PathMemory {
            srtt: Duration::from_millis(10),
            rttvar: Duration::from_millis(1),
            ssthresh_bytes: None,
            btl_bw_bps: None,
            min_rtt: None,
            datagram_size,
            btl_bw_is_lower_bound: false,
        }
    }

    #[test]
    fn a_forced_or_this_hosts_size_is_kept_and_a_cached_one_is_used_without_a_search() {
        let peer: SocketAddr = "192.0.2.1:7890".parse().unwrap();
        let mut t = Tuning {
            mss: 9000,
            rcvsegs: 1000,
            ..Tuning::default()
        };
        let forced = choose(&mut t, peer, Some(SizeFrom::Forced), None, true);
        assert_eq!(
            (forced.datagram, forced.path_mtu, t.mss),
            (9000, 9028, 9000)
        );
        assert_eq!(forced.to_remember(), None);
        let mut t = Tuning {
            mss: 1472,
            rcvsegs: 1000,
            ..Tuning::default()
        };
        // TEST-NET-1 is never reached: a search would cost a second.
        let cached = choose(&mut t, peer, None, Some(&memory(Some(1372))), true);
        assert_eq!(cached.from, SizeFrom::Cached);
        assert_eq!((t.mss, cached.path_mtu), (1372, 1400));
        // The window keeps its bytes: 1000 × 1447 in segments of 1347.
        assert_eq!(t.rcvsegs, 1075);
        assert_eq!(cached.text(), "path MTU 1400 (path cache)");
        let unprobed = choose(&mut t, peer, None, Some(&memory(Some(1252))), false);
        assert_eq!((unprobed.from, t.mss), (SizeFrom::Unprobed, 1372));
    }

    #[test]
    fn a_black_hole_steps_a_found_size_down_but_never_a_forced_one() {
        let peer: SocketAddr = "192.0.2.1:7890".parse().unwrap();
        let mut t = Tuning {
            mss: 1472,
            rcvsegs: 1000,
            ..Tuning::default()
        };
        let cached = PathSize::of(peer, 1472, SizeFrom::Cached);
        let down = cached
            .step_down(&mut t, peer, 1372)
            .expect("a smaller size");
        assert_eq!((down.path_mtu, down.datagram, t.mss), (1400, 1372, 1372));
        assert_eq!(down.to_remember(), Some(1372));
        assert_eq!(
            down.text(),
            "path MTU 1400 (stepped down during the transfer)"
        );
        assert_eq!(down.step_down(&mut t, peer, 1372), None);
        let forced = PathSize::of(peer, 1372, SizeFrom::Forced);
        assert_eq!(forced.step_down(&mut t, peer, 1252), None);
        assert_eq!(t.mss, 1372);
    }
}
