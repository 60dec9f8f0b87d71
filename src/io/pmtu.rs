//! Drives a path-MTU search ([`crate::proto::pmtu::SizeSearch`]) on a
//! socket of its own: the probes go out at once, and the acks that come
//! back within about two round trips of the first say the size.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::proto::pmtu::SizeSearch;
use crate::proto::wire::Packet;

use super::socket::SENDS_PER_RUN;
use super::{RecvBatch, UdpIo};

/// No ack in this long: the probes go once more (RFC 8899 §5.1.1's
/// PROBE_TIMER is 15 s for a search that runs beside data; this one holds
/// the transfer back, so it is short).
const FIRST_WAIT: Duration = Duration::from_millis(300);
/// The longest a search holds the transfer back; then the base size.
const GIVE_UP: Duration = Duration::from_secs(1);
/// After the first ack at `t`, others are waited for until `2t` plus
/// this: probes went together, and a larger one queues behind the others
/// for at most its own serialisation time.
const STRAGGLER_SLACK: Duration = Duration::from_millis(10);

/// Runs `search` against `peer` and returns it with what the acks
/// confirmed. A peer that does not answer (an older server, a firewall
/// that drops the probes) costs [`GIVE_UP`] and leaves the base size.
pub(crate) async fn search_path_size(peer: SocketAddr, mut search: SizeSearch) -> SizeSearch {
    let unspecified: SocketAddr = if peer.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    // quinn-udp's socket sets the don't-fragment bit and ignores the
    // kernel's cached path MTU (IP_PMTUDISC_PROBE), as the data sockets
    // do: a probe that is too large is lost, never fragmented.
    let Ok(io) = UdpIo::bind(unspecified) else {
        return search;
    };
    if io.connect(peer).await.is_err() {
        return search;
    }
    let started = Instant::now();
    let mut buf = vec![0u8; search.largest_probe()];
    let mut batch = RecvBatch::new();
    let mut resent = false;
    let mut first_ack: Option<Duration> = None;
    send_probes(&io, peer, &mut search, &mut buf).await;
    loop {
        let elapsed = started.elapsed();
        let until = match first_ack {
            Some(t) => (2 * t + STRAGGLER_SLACK).min(GIVE_UP),
            None if !resent => FIRST_WAIT,
            None => GIVE_UP,
        };
        if search.is_settled() || elapsed >= until {
            if first_ack.is_none() && !resent && elapsed < GIVE_UP {
                resent = true;
                search.resend();
                send_probes(&io, peer, &mut search, &mut buf).await;
                continue;
            }
            return search;
        }
        let wait = until - elapsed;
        if tokio::time::timeout(wait, io.readable()).await.is_err() {
            continue;
        }
        let _ = io.try_recv(&mut batch, |from, datagram| {
            if from != peer {
                return;
            }
            if let Ok(Packet::SizeAck(ack)) = Packet::decode(datagram) {
                if search.on_ack(&ack) && first_ack.is_none() {
                    first_ack = Some(started.elapsed());
                }
            }
        });
        // The socket's error queue holds what ICMP said ("too big" among
        // it): a hint RFC 8899 §4.6 lets a search use, not proof; the
        // acks decide, so it is only emptied.
        let _ = io.drain_errors();
    }
}

async fn send_probes(io: &UdpIo, peer: SocketAddr, search: &mut SizeSearch, buf: &mut [u8]) {
    while let Some(n) = search.poll_probe(buf) {
        // A probe the kernel refuses (EMSGSIZE: larger than the route
        // takes) is one that is not acked. A refusal may also be the
        // pending error of a router's "too big" about the probe before
        // (the socket reports it on its next call, sending nothing; a
        // search behind a 1,400-byte hop lost its 1,400-byte probe so and
        // found 1,280): so each goes again, up to SENDS_PER_RUN times.
        for _ in 0..SENDS_PER_RUN {
            if io.send(peer, &buf[..n], None).await.is_ok() {
                break;
            }
        }
    }
}
