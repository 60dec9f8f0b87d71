//! Path-MTU discovery beside the handshake (RFC 8899, DPLPMTUD): the
//! client sends, with its hello, one padded probe of each candidate size
//! ([`SizeSearch`]); the server acks each probe that arrives; the
//! connection's datagrams are the largest acked size, and the base size
//! until an ack says more. The search costs no round trip of its own: the
//! acks come back beside the welcome.
//!
//! A connection's segments have one payload size for its life, so the
//! search is made where it is cheap, before the data, and not continued
//! during it (RFC 8899 §5.2's SEARCH_COMPLETE from the start). A path
//! that stops carrying that size later (a route change, a size the path
//! cache remembered) is caught by [`BlackHoleWatch`]: the connection ends
//! with the size its probes found, and the transfer goes on, resumed, on
//! a new connection of that size.

use super::wire::{SizeAck, SizeProbe, SIZE_PROBE_MIN_LEN};

/// RFC 8899 §5.1.2's BASE_PLPMTU in UDP payload bytes: what every IPv4
/// path is taken to carry (RFC 9000 §14: 1,200).
pub(crate) const BASE_PAYLOAD_V4: u32 = SIZE_PROBE_MIN_LEN as u32;
/// On IPv6, the minimum link MTU (RFC 8200 §5: 1,280) less the IPv6 and
/// UDP headers.
pub(crate) const BASE_PAYLOAD_V6: u32 = 1280 - 48;

/// The IP packet sizes worth a probe, largest first: a jumbo frame
/// (9,000), Ethernet (1,500), PPPoE (1,492: RFC 2516 §7), WireGuard's
/// default tunnel MTU (1,420), a tunnel clamped to 1,400 (the common
/// IPsec and SSL-VPN setting), and IPv6's minimum (1,280). Six probes
/// beside a hello cost some 15 KB once per connection, never more than
/// the route's MTU allows.
const CANDIDATE_MTUS: [u32; 6] = [9000, 1500, 1492, 1420, 1400, 1280];

/// The UDP payload sizes to probe on a route of `route_mtu` (the first
/// hop's IP MTU) with `ip_udp_header` bytes of IP and UDP headers: the
/// route's own size, then each candidate below it, largest first, each
/// above `base`.
pub(crate) fn candidate_payloads(route_mtu: u32, ip_udp_header: u32, base: u32) -> Vec<u32> {
    let route = route_mtu.saturating_sub(ip_udp_header);
    let mut sizes: Vec<u32> = std::iter::once(route)
        .chain(
            CANDIDATE_MTUS
                .iter()
                .map(|mtu| mtu.saturating_sub(ip_udp_header)),
        )
        .filter(|size| *size > base && *size <= route)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    sizes
}

/// One connection's search: the probes it sends, and the largest size a
/// matching ack confirmed.
#[derive(Debug, Clone)]
pub(crate) struct SizeSearch {
    conn_id: u64,
    /// Drawn by the caller from a CSPRNG: an off-path host cannot ack a
    /// probe it never saw.
    nonce: u64,
    base: u32,
    /// Candidate sizes, largest first, each with whether it went out.
    probes: Vec<(u32, bool)>,
    confirmed: Option<u32>,
}

impl SizeSearch {
    /// A search over `candidates` (as [`candidate_payloads`] gives them)
    /// above `base`, whose probes carry `conn_id` and `nonce`.
    pub(crate) fn new(conn_id: u64, nonce: u64, base: u32, candidates: &[u32]) -> SizeSearch {
        let mut probes: Vec<(u32, bool)> = candidates
            .iter()
            .filter(|size| **size > base && **size >= BASE_PAYLOAD_V4)
            .map(|size| (*size, false))
            .collect();
        probes.sort_unstable_by_key(|p| std::cmp::Reverse(p.0));
        probes.dedup_by_key(|p| p.0);
        SizeSearch {
            conn_id,
            nonce,
            base,
            probes,
            confirmed: None,
        }
    }

    /// The largest probe's size: the buffer [`poll_probe`](Self::poll_probe) needs.
    pub(crate) fn largest_probe(&self) -> usize {
        self.probes.first().map_or(0, |p| p.0 as usize)
    }

    /// The next probe [`poll_probe`](Self::poll_probe) writes: not yet
    /// sent, and larger than a size already confirmed.
    fn next_due(&self) -> Option<usize> {
        let confirmed = self.confirmed.unwrap_or(0);
        self.probes
            .iter()
            .position(|(size, sent)| !*sent && *size > confirmed)
    }

    /// Whether [`poll_probe`](Self::poll_probe) has a probe to write.
    pub(crate) fn has_probe_due(&self) -> bool {
        self.next_due().is_some()
    }

    /// Writes the next probe not yet sent into `buf`; `None` when all went
    /// out, or none is larger than a size already confirmed.
    pub(crate) fn poll_probe(&mut self, buf: &mut [u8]) -> Option<usize> {
        let due = self.next_due()?;
        let next = &mut self.probes[due];
        next.1 = true;
        let probe = SizeProbe {
            conn_id: self.conn_id,
            nonce: self.nonce,
            size: next.0,
        };
        probe.emit(buf).ok()
    }

    /// Sends the probes not yet acked again (with a resent hello: the
    /// first ones may have been lost to congestion, not to their size).
    pub(crate) fn resend(&mut self) {
        for probe in &mut self.probes {
            probe.1 = false;
        }
    }

    /// An ack from the peer; whether it confirmed a size. One for another
    /// connection, with another nonce, or for a size never probed (a
    /// hostile or confused server) changes nothing.
    pub(crate) fn on_ack(&mut self, ack: &SizeAck) -> bool {
        let probed = self
            .probes
            .iter()
            .any(|(size, sent)| *sent && *size == ack.size);
        if ack.conn_id != self.conn_id || ack.nonce != self.nonce || !probed {
            return false;
        }
        if self.confirmed.is_some_and(|c| c >= ack.size) {
            return false;
        }
        self.confirmed = Some(ack.size);
        true
    }

    /// The size the connection's datagrams may take: the largest acked,
    /// else the base.
    pub(crate) fn size(&self) -> u32 {
        self.confirmed.unwrap_or(self.base).max(self.base)
    }

    /// Whether an ack confirmed a size above the base.
    pub(crate) fn found(&self) -> bool {
        self.confirmed.is_some()
    }

    /// Whether nothing larger is left to learn: the largest probe is acked.
    pub(crate) fn is_settled(&self) -> bool {
        self.probes
            .first()
            .is_none_or(|p| self.confirmed == Some(p.0))
    }
}

/// RTOs in a row with nothing newly delivered before a connection doubts
/// its datagram size and probes: the full-size probe, unacked, is then the
/// third full-size loss in a row, RFC 8899 §5.1.2's MAX_PROBES (3). One
/// lost segment is congestion; timeouts of the same data with nothing
/// getting through are a path that stopped carrying them, or no path.
/// Two, not three: before the first RTT sample the RTO is 1 s, and the
/// verdict (at the third timeout, 7 s in) must come before `maxidle`'s
/// default 10 s ends the connection.
pub(crate) const QUIET_RTOS: u64 = 2;

/// What [`BlackHoleWatch`] concluded: full-size datagrams of `stopped`
/// bytes are lost while probes of `carried` bytes pass (UDP payloads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StepDown {
    pub(crate) stopped: u32,
    pub(crate) carried: u32,
}

/// Black hole detection during a connection (RFC 8899 §4.3 and §5.2):
/// after [`QUIET_RTOS`] timeouts in a row with nothing newly delivered,
/// one padded probe of the full size and of each usual size below it,
/// down to the base, goes out (the server acks probes whoever sends
/// them); at the next timeout, still with nothing delivered, an ack for
/// a smaller probe while the full-size one stayed unacked is the verdict.
/// The connection cannot cut its segments smaller (segment `n` carries
/// bytes from `n × payload`), so the verdict ends it and the caller
/// redoes the rest at the size found.
///
/// Only acks to this connection's probes count (its id and a nonce the
/// caller drew from a CSPRNG); an ICMP "too big" may start the probes
/// early ([`BlackHoleWatch::on_too_big`]) but never decides: an off-path
/// host cannot make a connection step down.
#[derive(Debug, Clone)]
pub(crate) struct BlackHoleWatch {
    conn_id: u64,
    nonce: u64,
    /// IP and UDP header bytes: 28 on IPv4, 48 on IPv6.
    ip_udp_header: u32,
    /// The sender's delivered bytes and timeout count when it last made
    /// progress.
    delivered: u64,
    timeouts_at_progress: u64,
    timeouts_seen: u64,
    search: Option<SizeSearch>,
    /// The full size the probes went out against.
    probed_from: u32,
}

impl BlackHoleWatch {
    pub(crate) fn new(conn_id: u64, nonce: u64, ip_udp_header: u32) -> BlackHoleWatch {
        BlackHoleWatch {
            conn_id,
            nonce,
            ip_udp_header,
            delivered: 0,
            timeouts_at_progress: 0,
            timeouts_seen: 0,
            search: None,
            probed_from: 0,
        }
    }

    fn base(&self) -> u32 {
        if self.ip_udp_header > 28 {
            BASE_PAYLOAD_V6
        } else {
            BASE_PAYLOAD_V4
        }
    }

    /// After the sender took an ack or its timers: `delivered` its bytes
    /// acknowledged, `timeouts` its RTO count, `largest` the largest
    /// datagram the connection sent. The verdict, if this is it.
    pub(crate) fn on_sender(
        &mut self,
        delivered: u64,
        timeouts: u64,
        largest: u32,
    ) -> Option<StepDown> {
        if delivered > self.delivered {
            self.delivered = delivered;
            self.timeouts_at_progress = timeouts;
            self.timeouts_seen = timeouts;
            self.search = None;
            return None;
        }
        if timeouts == self.timeouts_seen {
            return None;
        }
        self.timeouts_seen = timeouts;
        if timeouts - self.timeouts_at_progress < QUIET_RTOS || largest <= self.base() {
            return None;
        }
        if let Some(search) = &self.search {
            let carried = search.found().then(|| search.size());
            match carried {
                Some(carried) if carried < self.probed_from => {
                    return Some(StepDown {
                        stopped: self.probed_from,
                        carried,
                    });
                }
                // The full size passed: congestion or a stalled peer, not
                // the size; nothing to learn until the data moves.
                Some(_) => return None,
                // Nothing acked, not even the base: no path at all, which
                // maxidle ends. Probe again meanwhile.
                None => {}
            }
        }
        self.start_search(largest);
        None
    }

    /// An ICMP "too big" taken as a hint only (RFC 8899 §4.6): anyone on
    /// or off the path can forge one, so it never steps the size down; a
    /// valid one only starts the probes now, rather than after
    /// [`QUIET_RTOS`], and the verdict still needs a smaller probe acked
    /// while the full size is not, with nothing delivered. Valid
    /// (§4.6.1): the quoted datagram is `quoted_len` bytes, the full size
    /// this connection sends (`largest`), and the next-hop MTU it names
    /// is below that datagram's IP size and not below the base; the
    /// kernel matched its addresses and ports to the connected socket.
    /// Whether it started the probes.
    pub(crate) fn on_too_big(&mut self, next_hop_mtu: u32, quoted_len: u32, largest: u32) -> bool {
        let named = next_hop_mtu.saturating_sub(self.ip_udp_header);
        let valid = quoted_len == largest && named < largest && named >= self.base();
        if !valid || largest <= self.base() || self.search.is_some() {
            return false;
        }
        self.start_search(largest);
        true
    }

    /// Probes `largest` and each usual size below it, down to the base.
    fn start_search(&mut self, largest: u32) {
        self.probed_from = largest;
        let candidates: Vec<u32> = std::iter::once(largest)
            .chain(candidate_payloads(
                largest + self.ip_udp_header,
                self.ip_udp_header,
                self.base(),
            ))
            .chain(std::iter::once(self.base()))
            .collect();
        // The base itself is probed too: `new` keeps sizes above its floor.
        self.search = Some(SizeSearch::new(
            self.conn_id,
            self.nonce,
            self.base() - 1,
            &candidates,
        ));
    }

    /// Writes the next probe due into `buf` (at least the largest
    /// datagram sent); `None` when none is.
    pub(crate) fn poll_probe(&mut self, buf: &mut [u8]) -> Option<usize> {
        let search = self.search.as_mut()?;
        if buf.len() < search.largest_probe() {
            return None;
        }
        search.poll_probe(buf)
    }

    /// Whether [`poll_probe`](Self::poll_probe) has a probe to write.
    pub(crate) fn has_probe_due(&self) -> bool {
        self.search.as_ref().is_some_and(SizeSearch::has_probe_due)
    }

    /// An ack from the peer to one of the probes; others change nothing.
    pub(crate) fn on_ack(&mut self, ack: &SizeAck) {
        if let Some(search) = self.search.as_mut() {
            search.on_ack(ack);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::wire::{Packet, SIZE_ACK_LEN};

    const CONN: u64 = 0x1234;
    const NONCE: u64 = 0xfeed_f00d_dead_beef;

    fn probes_sent(search: &mut SizeSearch) -> Vec<SizeProbe> {
        let mut buf = vec![0u8; search.largest_probe()];
        let mut out = Vec::new();
        while let Some(n) = search.poll_probe(&mut buf) {
            let Ok(Packet::SizeProbe(p)) = Packet::decode(&buf[..n]) else {
                panic!("not a probe");
            };
            assert_eq!(p.size as usize, n);
            out.push(p);
        }
        out
    }

    #[test]
    fn candidates_are_the_route_and_the_usual_mtus_below_it_largest_first() {
        assert_eq!(
            candidate_payloads(1500, 28, BASE_PAYLOAD_V4),
            vec![1472, 1464, 1392, 1372, 1252]
        );
        assert_eq!(
            candidate_payloads(9000, 28, BASE_PAYLOAD_V4),
            vec![8972, 1472, 1464, 1392, 1372, 1252]
        );
        // A route between two candidates is probed at its own size first.
        assert_eq!(
            candidate_payloads(1450, 48, BASE_PAYLOAD_V6),
            vec![1402, 1372, 1352]
        );
        assert!(candidate_payloads(1280, 48, BASE_PAYLOAD_V6).is_empty());
    }

    #[test]
    fn the_largest_acked_probe_sets_the_size_and_the_base_holds_before_any() {
        let mut search = SizeSearch::new(CONN, NONCE, 1200, &[1472, 1372, 1252]);
        assert_eq!(search.size(), 1200);
        let sent = probes_sent(&mut search);
        assert_eq!(
            sent.iter().map(|p| p.size).collect::<Vec<_>>(),
            [1472, 1372, 1252]
        );
        // The hop drops 1472: only the smaller two come back, in any order.
        assert!(search.on_ack(&sent[2].ack()));
        assert_eq!(search.size(), 1252);
        assert!(search.on_ack(&sent[1].ack()));
        assert_eq!(search.size(), 1372);
        assert!(search.found() && !search.is_settled());
        // A late ack for a smaller size does not lower it.
        assert!(!search.on_ack(&sent[2].ack()));
        assert_eq!(search.size(), 1372);
        // Resent with the hello: only the sizes above the confirmed one.
        search.resend();
        assert_eq!(
            probes_sent(&mut search)
                .iter()
                .map(|p| p.size)
                .collect::<Vec<_>>(),
            [1472]
        );
        assert!(search.on_ack(&sent[0].ack()));
        assert!(search.is_settled());
        assert_eq!(search.size(), 1472);
    }

    #[test]
    fn a_hostile_servers_acks_for_sizes_never_probed_or_other_nonces_are_ignored() {
        let mut search = SizeSearch::new(CONN, NONCE, 1200, &[1472, 1372]);
        let unsent = SizeAck {
            conn_id: CONN,
            nonce: NONCE,
            size: 1472,
        };
        // Before the probe went out, even the right size is not believed.
        assert!(!search.on_ack(&unsent));
        probes_sent(&mut search);
        for forged in [
            SizeAck {
                size: 9000,
                ..unsent
            },
            SizeAck {
                size: 1400,
                ..unsent
            },
            SizeAck {
                size: u32::MAX,
                ..unsent
            },
            SizeAck {
                nonce: NONCE ^ 1,
                ..unsent
            },
            SizeAck {
                conn_id: CONN + 1,
                ..unsent
            },
        ] {
            assert!(!search.on_ack(&forged), "{forged:?}");
        }
        assert_eq!(search.size(), 1200);
        assert!(!search.found());
    }

    #[test]
    fn no_probe_below_the_base_and_no_ack_larger_than_a_fiftieth_of_its_probe() {
        let mut search = SizeSearch::new(CONN, NONCE, 1300, &[1472, 1252, 800]);
        let sent = probes_sent(&mut search);
        assert_eq!(sent.iter().map(|p| p.size).collect::<Vec<_>>(), [1472]);
        let mut buf = [0u8; 64];
        let n = sent[0].ack().emit(&mut buf).unwrap();
        assert_eq!(n, SIZE_ACK_LEN);
        assert!(n * 50 <= SIZE_PROBE_MIN_LEN);
        // A short "probe" does not decode, so it is never answered.
        let short = [
            b'A', b'T', 6, 13, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        assert!(Packet::decode(&short).is_err());
    }

    fn watch_probes(watch: &mut BlackHoleWatch, largest: u32) -> Vec<SizeProbe> {
        let mut buf = vec![0u8; largest as usize];
        let mut out = Vec::new();
        while let Some(n) = watch.poll_probe(&mut buf) {
            let Ok(Packet::SizeProbe(p)) = Packet::decode(&buf[..n]) else {
                panic!("not a probe");
            };
            out.push(p);
        }
        out
    }

    /// Polls the watch's probes, checks they are the full size and every
    /// usual size below it, and acks those a hop dropping packets over
    /// 1,400 bytes lets through (1372 and below).
    fn probe_a_1400_hole(watch: &mut BlackHoleWatch) {
        let sent = watch_probes(watch, 1472);
        assert_eq!(
            sent.iter().map(|p| p.size).collect::<Vec<_>>(),
            [1472, 1464, 1392, 1372, 1252, 1200]
        );
        for p in &sent[3..] {
            watch.on_ack(&p.ack());
        }
    }

    #[test]
    fn quiet_rtos_probe_below_the_full_size_and_a_smaller_ack_is_the_verdict() {
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        assert_eq!(watch.on_sender(5_000_000, 0, 1472), None);
        // Fewer timeouts with nothing delivered: no probe yet.
        for t in 1..QUIET_RTOS {
            assert_eq!(watch.on_sender(5_000_000, t, 1472), None);
            assert!(watch_probes(&mut watch, 1472).is_empty());
        }
        assert_eq!(watch.on_sender(5_000_000, QUIET_RTOS, 1472), None);
        probe_a_1400_hole(&mut watch);
        // Acks alone are no verdict; the next timeout is.
        assert_eq!(watch.on_sender(5_000_000, QUIET_RTOS, 1472), None);
        assert_eq!(
            watch.on_sender(5_000_000, QUIET_RTOS + 1, 1472),
            Some(StepDown {
                stopped: 1472,
                carried: 1372
            })
        );
    }

    #[test]
    fn progress_a_full_size_ack_or_a_forged_ack_is_no_verdict() {
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        for t in 1..=QUIET_RTOS {
            watch.on_sender(0, t, 1472);
        }
        let sent = watch_probes(&mut watch, 1472);
        // Data moved: the probes are forgotten, their acks ignored.
        assert_eq!(watch.on_sender(1, QUIET_RTOS, 1472), None);
        watch.on_ack(&sent[3].ack());
        for t in QUIET_RTOS + 1..2 * QUIET_RTOS + 2 {
            assert_eq!(watch.on_sender(1, t, 1472), None);
        }
        // Stalled again, probed again: the full size is acked, so the
        // losses are not the size's.
        let sent = watch_probes(&mut watch, 1472);
        assert_eq!(sent.len(), 6);
        for p in &sent {
            watch.on_ack(&p.ack());
        }
        assert_eq!(watch.on_sender(1, 2 * QUIET_RTOS + 2, 1472), None);
        // Acks for another connection, nonce or an unprobed size prove
        // nothing; nothing acked means no path, and probes go again.
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        for t in 1..=QUIET_RTOS {
            watch.on_sender(0, t, 1472);
        }
        let sent = watch_probes(&mut watch, 1472);
        watch.on_ack(&SizeAck {
            nonce: NONCE ^ 1,
            ..sent[3].ack()
        });
        watch.on_ack(&SizeAck {
            conn_id: CONN ^ 1,
            ..sent[3].ack()
        });
        watch.on_ack(&SizeAck {
            size: 1300,
            ..sent[3].ack()
        });
        assert_eq!(watch.on_sender(0, QUIET_RTOS + 1, 1472), None);
        assert_eq!(watch_probes(&mut watch, 1472).len(), 6);
    }

    #[test]
    fn a_connection_at_the_base_size_is_not_watched() {
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 48);
        for t in 1..=QUIET_RTOS + 2 {
            assert_eq!(watch.on_sender(0, t, BASE_PAYLOAD_V6), None);
        }
        assert!(watch_probes(&mut watch, BASE_PAYLOAD_V6).is_empty());
    }

    #[test]
    fn a_valid_too_big_starts_the_probes_and_only_their_evidence_steps_down() {
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        assert_eq!(watch.on_sender(1_000, 0, 1472), None);
        // A hop of 1,400 bytes quoting one of the connection's 1472s.
        assert!(watch.on_too_big(1400, 1472, 1472));
        probe_a_1400_hole(&mut watch);
        // The hint and the acks are no verdict while data still moves.
        assert_eq!(watch.on_sender(2_000, 1, 1472), None);
        assert!(watch_probes(&mut watch, 1472).is_empty());
        // Hinted again, and now nothing is delivered: the verdict comes
        // with the quiet timeouts, as without the hint.
        assert!(watch.on_too_big(1400, 1472, 1472));
        probe_a_1400_hole(&mut watch);
        assert_eq!(watch.on_sender(2_000, 2, 1472), None);
        assert_eq!(
            watch.on_sender(2_000, 3, 1472),
            Some(StepDown {
                stopped: 1472,
                carried: 1372
            })
        );
        // The full size acked: the hint was wrong, no step-down.
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        assert!(watch.on_too_big(1400, 1472, 1472));
        for p in &watch_probes(&mut watch, 1472) {
            watch.on_ack(&p.ack());
        }
        for t in 1..=QUIET_RTOS + 2 {
            assert_eq!(watch.on_sender(0, t, 1472), None);
        }
    }

    #[test]
    fn a_forged_or_unmatched_too_big_changes_nothing() {
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        for (mtu, quoted) in [
            (1400, 1372),     // quotes a size the connection does not send
            (1400, 9000),     // nor this one
            (1500, 1472),     // names an MTU the datagram fits
            (9000, 1472),     // larger still
            (1000, 1472),     // below every path's base
            (0, 1472),        // nonsense
            (u32::MAX, 1472), // nonsense
        ] {
            assert!(!watch.on_too_big(mtu, quoted, 1472), "{mtu} {quoted}");
            assert!(watch_probes(&mut watch, 1472).is_empty());
        }
        assert_eq!(watch.on_sender(0, 1, 1472), None);
        // At the base size there is nothing smaller to try.
        let mut watch = BlackHoleWatch::new(CONN, NONCE, 28);
        assert!(!watch.on_too_big(1228, 1200, 1200));
        assert!(watch_probes(&mut watch, 1200).is_empty());
    }
}
