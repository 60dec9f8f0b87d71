//! Path-MTU discovery beside the handshake (RFC 8899, DPLPMTUD): the
//! client sends, with its hello, one padded probe of each candidate size
//! ([`SizeSearch`]); the server acks each probe that arrives; the
//! connection's datagrams are the largest acked size, and the base size
//! until an ack says more. The search costs no round trip of its own: the
//! acks come back beside the welcome.
//!
//! A connection's segments have one payload size for its life, so the
//! search is made where it is cheap, before the data, and not continued
//! during it (RFC 8899 §5.2's SEARCH_COMPLETE from the start).

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

    /// Writes the next probe not yet sent into `buf`; `None` when all went
    /// out, or none is larger than a size already confirmed.
    pub(crate) fn poll_probe(&mut self, buf: &mut [u8]) -> Option<usize> {
        let confirmed = self.confirmed.unwrap_or(0);
        let next = self
            .probes
            .iter_mut()
            .find(|(size, sent)| !*sent && *size > confirmed)?;
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
}
