//! A connected socket's error queue (IP_RECVERR / IPV6_RECVERR, Linux):
//! what ICMP reported about datagrams the socket sent, each report with
//! the start of the datagram it quoted. quinn-udp reads the queue too,
//! but passes on the report without the quote, and RFC 8899 §4.6.1 asks
//! a packetization layer to check the quote before it takes a "too big"
//! as a hint: a forger off the path can name the socket's addresses and
//! ports, but not what it wrote in its datagrams.

use std::io;
use std::os::fd::BorrowedFd;

/// Bytes of a quoted datagram kept: a protected datagram's clear header
/// and packet number (`frame::AAD_LEN`, 20) and some to spare.
pub(crate) const QUOTE_LEN: usize = 32;

/// One report read from the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorReport {
    /// The next-hop MTU an ICMP "fragmentation needed" (type 3 code 4) or
    /// ICMPv6 "packet too big" (type 2) named; `None` for other reports.
    pub(crate) too_big: Option<u32>,
    quote: [u8; QUOTE_LEN],
    quote_len: usize,
}

impl ErrorReport {
    /// The start of the datagram the report is about, as the kernel gives
    /// it: the UDP payload the ICMP message quoted (routers after RFC 1812
    /// quote up to 576 bytes in all, older ones 8 bytes past the IP
    /// header, which leaves nothing here), at most [`QUOTE_LEN`] bytes.
    pub(crate) fn quote(&self) -> &[u8] {
        &self.quote[..self.quote_len]
    }
}

/// `SO_EE_ORIGIN_ICMP` and `SO_EE_ORIGIN_ICMP6` (linux/errqueue.h).
const ORIGIN_ICMP: u8 = 2;
const ORIGIN_ICMP6: u8 = 3;
/// `struct sock_extended_err`: ee_errno (u32), ee_origin, ee_type,
/// ee_code, ee_pad (u8 each), ee_info (u32), ee_data (u32), in the host's
/// byte order.
const EXTENDED_ERR_LEN: usize = 16;

/// One control message of an error-queue read: `level`, `kind` and its
/// data. `None` unless it is an extended error of IPv4 or IPv6.
fn decode(level: i32, kind: i32, data: &[u8], quote: &[u8]) -> Option<ErrorReport> {
    let is_error = (level == libc::IPPROTO_IP && kind == libc::IP_RECVERR)
        || (level == libc::IPPROTO_IPV6 && kind == libc::IPV6_RECVERR);
    if !is_error || data.len() < EXTENDED_ERR_LEN {
        return None;
    }
    let (origin, icmp_type, code) = (data[4], data[5], data[6]);
    let info = u32::from_ne_bytes(data[8..12].try_into().expect("4 bytes"));
    let too_big = match (origin, icmp_type, code) {
        (ORIGIN_ICMP, 3, 4) | (ORIGIN_ICMP6, 2, 0) => Some(info),
        _ => None,
    };
    let quote_len = quote.len().min(QUOTE_LEN);
    let mut kept = [0u8; QUOTE_LEN];
    kept[..quote_len].copy_from_slice(&quote[..quote_len]);
    Some(ErrorReport {
        too_big,
        quote: kept,
        quote_len,
    })
}

/// A control buffer aligned as `struct cmsghdr` needs.
#[cfg(target_os = "linux")]
#[repr(C, align(8))]
struct Control([u8; 512]);

/// Reads one report from `fd`'s error queue without blocking; `None` when
/// the queue is empty (or the report is not an IP one).
#[cfg(target_os = "linux")]
pub(crate) fn recv(fd: BorrowedFd<'_>) -> io::Result<Option<ErrorReport>> {
    use std::os::fd::AsRawFd;
    let mut quote = [0u8; QUOTE_LEN];
    let mut control = Control([0; 512]);
    let mut iov = libc::iovec {
        iov_base: quote.as_mut_ptr().cast(),
        iov_len: quote.len(),
    };
    // SAFETY: an all-zero msghdr is a valid one (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (over `quote`) and at `control`,
        // live and of the lengths given, for the call's duration; the
        // kernel writes no more than those lengths.
        let n = unsafe {
            libc::recvmsg(
                fd.as_raw_fd(),
                &mut msg,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
            )
        };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    };
    let quoted = &quote[..n.min(QUOTE_LEN)];
    let mut report = None;
    // SAFETY: `msg` is the header recvmsg just filled: CMSG_FIRSTHDR and
    // CMSG_NXTHDR return a header inside `control` (within the
    // msg_controllen the kernel set) or null.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() && report.is_none() {
        // SAFETY: `cmsg` is non-null and points at a whole cmsghdr inside
        // `control` (the macros above check that it fits).
        let (level, kind, len) = unsafe {
            (
                (*cmsg).cmsg_level,
                (*cmsg).cmsg_type,
                (*cmsg).cmsg_len as usize,
            )
        };
        // SAFETY: as above; CMSG_DATA is the header's address plus its
        // aligned size, still inside `control`.
        let data_at = unsafe { libc::CMSG_DATA(cmsg) } as usize - control.0.as_ptr() as usize;
        // SAFETY: CMSG_LEN(0) is arithmetic on its argument only.
        let data_len = len.saturating_sub(unsafe { libc::CMSG_LEN(0) } as usize);
        let end = (data_at + data_len).min(msg.msg_controllen as usize);
        if let Some(data) = control.0.get(data_at..end) {
            report = decode(level, kind, data, quoted);
        }
        // SAFETY: as for CMSG_FIRSTHDR; null past the last header.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(report)
}

/// Elsewhere there is no error queue to read.
#[cfg(not(target_os = "linux"))]
pub(crate) fn recv(_fd: BorrowedFd<'_>) -> io::Result<Option<ErrorReport>> {
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extended_err(origin: u8, icmp_type: u8, code: u8, info: u32) -> Vec<u8> {
        let mut d = vec![0u8; EXTENDED_ERR_LEN];
        d[0..4].copy_from_slice(&90u32.to_ne_bytes());
        d[4] = origin;
        d[5] = icmp_type;
        d[6] = code;
        d[8..12].copy_from_slice(&info.to_ne_bytes());
        d
    }

    /// What a test does when this host cannot run it.
    #[allow(dead_code, unreachable_pub)]
    mod ci {
        include!("../../tests/common/ci.rs");
    }

    /// The Internet checksum (RFC 1071) of `bytes`.
    fn checksum(bytes: &[u8]) -> u16 {
        let mut sum: u32 = bytes
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    /// An ICMP "fragmentation needed" (RFC 792, RFC 1191) or ICMPv6
    /// "packet too big" (RFC 4443 §3.2) naming `mtu`, about a UDP datagram
    /// from `from` to `to` that carried `payload`, quoted whole.
    fn forged_too_big(
        from: std::net::SocketAddr,
        to: std::net::SocketAddr,
        payload: &[u8],
        mtu: u16,
    ) -> Vec<u8> {
        let udp_len = (8 + payload.len()) as u16;
        let mut udp = Vec::new();
        udp.extend_from_slice(&from.port().to_be_bytes());
        udp.extend_from_slice(&to.port().to_be_bytes());
        udp.extend_from_slice(&udp_len.to_be_bytes());
        udp.extend_from_slice(&[0, 0]);
        udp.extend_from_slice(payload);
        match (from.ip(), to.ip()) {
            (std::net::IpAddr::V4(src), std::net::IpAddr::V4(dst)) => {
                let mut ip = vec![0x45, 0];
                ip.extend_from_slice(&(20 + udp_len).to_be_bytes());
                ip.extend_from_slice(&[0, 0, 0x40, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
                ip.extend_from_slice(&src.octets());
                ip.extend_from_slice(&dst.octets());
                let mut icmp = vec![3, 4, 0, 0, 0, 0];
                icmp.extend_from_slice(&mtu.to_be_bytes());
                icmp.extend_from_slice(&ip);
                icmp.extend_from_slice(&udp);
                let sum = checksum(&icmp);
                icmp[2..4].copy_from_slice(&sum.to_be_bytes());
                icmp
            }
            (std::net::IpAddr::V6(src), std::net::IpAddr::V6(dst)) => {
                // The kernel fills in an ICMPv6 raw socket's checksum.
                let mut icmp = vec![2, 0, 0, 0];
                icmp.extend_from_slice(&u32::from(mtu).to_be_bytes());
                icmp.extend_from_slice(&[0x60, 0, 0, 0]);
                icmp.extend_from_slice(&udp_len.to_be_bytes());
                icmp.extend_from_slice(&[libc::IPPROTO_UDP as u8, 64]);
                icmp.extend_from_slice(&src.octets());
                icmp.extend_from_slice(&dst.octets());
                icmp.extend_from_slice(&udp);
                icmp
            }
            _ => unreachable!("one family"),
        }
    }

    /// The kernel's path: a forged "too big" about a datagram a connected
    /// socket sent reaches its error queue with the MTU it named and the
    /// datagram's start, for IPv4 and IPv6 alike, and twenty forged ones
    /// before it do not push it out of what the drain hands on (what the client then
    /// checks the quote against is its own test:
    /// `a_too_big_is_a_hint_only_when_it_quotes_a_datagram_of_this_connection`).
    /// In a network namespace of its own, so the route MTU the report
    /// teaches loopback stays there. Needs root.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_too_big_reaches_the_error_queue_with_the_datagram_it_quotes() {
        let name = "a_too_big_reaches_the_error_queue_with_the_datagram_it_quotes";
        let run = std::thread::spawn(move || -> Result<(), String> {
            // SAFETY: unshare takes no pointers; CLONE_NEWNET moves this
            // thread alone (the test's own) into a new network namespace.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(format!(
                    "needs root for a network namespace ({})",
                    io::Error::last_os_error()
                ));
            }
            let up = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up"])
                .status();
            if !up.is_ok_and(|s| s.success()) {
                return Err("`ip link set lo up` failed in the new namespace".into());
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                for local in ["127.0.0.1:0", "[::1]:0"] {
                    let local: std::net::SocketAddr = local.parse().unwrap();
                    let peer = std::net::UdpSocket::bind(local).unwrap();
                    let peer = peer.local_addr().unwrap();
                    let io = crate::io::UdpIo::bind(local).unwrap();
                    io.connect(peer).await.unwrap();
                    let from = io.local_addr().unwrap();
                    let payload: Vec<u8> = (0..1400u32).map(|i| (i * 7) as u8).collect();
                    io.send(peer, &payload, None).await.unwrap();
                    let (domain, protocol) = if local.is_ipv4() {
                        (socket2::Domain::IPV4, socket2::Protocol::ICMPV4)
                    } else {
                        (socket2::Domain::IPV6, socket2::Protocol::ICMPV6)
                    };
                    let raw =
                        socket2::Socket::new(domain, socket2::Type::RAW, Some(protocol)).unwrap();
                    let to = std::net::SocketAddr::new(from.ip(), 0);
                    // Twenty forged with a quote of nothing this socket
                    // sent, then one quoting what it sent: all of them
                    // reach the client, the real one last.
                    let garbage = [0xeeu8; 400];
                    for _ in 0..20 {
                        let icmp = forged_too_big(from, peer, &garbage, 1280);
                        raw.send_to(&icmp, &to.into()).unwrap();
                    }
                    let icmp = forged_too_big(from, peer, &payload[..400], 1300);
                    raw.send_to(&icmp, &to.into()).unwrap();
                    let mut reports = Vec::new();
                    for _ in 0..100 {
                        reports.extend(io.drain_errors().too_big);
                        if reports.len() >= 21 {
                            break;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    assert_eq!(reports.len(), 21, "{local}: {reports:?}");
                    assert!(reports[..20]
                        .iter()
                        .all(|r| r.too_big == Some(1280) && r.quote() == &garbage[..QUOTE_LEN]));
                    let report = &reports[20];
                    assert_eq!(report.too_big, Some(1300), "{local}");
                    assert_eq!(report.quote(), &payload[..QUOTE_LEN], "{local}");
                }
            });
            Ok(())
        });
        match run.join().expect("the namespace thread") {
            Ok(()) => {}
            Err(why) => ci::cannot_run(name, &why),
        }
    }

    #[test]
    fn too_big_of_either_family_names_its_mtu_and_keeps_the_quote() {
        let quote: Vec<u8> = (0..40).collect();
        let v4 = decode(
            libc::IPPROTO_IP,
            libc::IP_RECVERR,
            &extended_err(ORIGIN_ICMP, 3, 4, 1400),
            &quote,
        )
        .unwrap();
        assert_eq!(v4.too_big, Some(1400));
        assert_eq!(v4.quote(), &quote[..QUOTE_LEN]);
        let v6 = decode(
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVERR,
            &extended_err(ORIGIN_ICMP6, 2, 0, 1280),
            &quote[..5],
        )
        .unwrap();
        assert_eq!(v6.too_big, Some(1280));
        assert_eq!(v6.quote(), &quote[..5]);
    }

    #[test]
    fn other_reports_name_no_mtu_and_other_messages_are_not_reports() {
        let unreachable = extended_err(ORIGIN_ICMP, 3, 3, 0);
        let r = decode(libc::IPPROTO_IP, libc::IP_RECVERR, &unreachable, &[]).unwrap();
        assert_eq!((r.too_big, r.quote()), (None, &[][..]));
        // ICMPv6 type 2 from the local origin (1), not ICMP: no MTU.
        let local = extended_err(1, 2, 0, 1400);
        let r = decode(libc::IPPROTO_IPV6, libc::IPV6_RECVERR, &local, &[]).unwrap();
        assert_eq!(r.too_big, None);
        let too_big = extended_err(ORIGIN_ICMP, 3, 4, 1400);
        assert_eq!(
            decode(libc::SOL_SOCKET, libc::IP_RECVERR, &too_big, &[]),
            None
        );
        assert_eq!(decode(libc::IPPROTO_IP, libc::IP_TOS, &too_big, &[]), None);
        assert_eq!(
            decode(libc::IPPROTO_IP, libc::IP_RECVERR, &too_big[..12], &[]),
            None
        );
    }
}
