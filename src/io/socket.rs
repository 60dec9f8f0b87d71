//! One UDP socket with batched I/O: recvmmsg with GRO on the way in, GSO
//! on the way out (through quinn-udp), socket buffers as asked.

use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};

use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState, BATCH_SIZE};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// A GRO buffer holds at most one 64 KiB super-datagram.
const RECV_BUF_LEN: usize = 1 << 16;
/// Largest GSO send: the kernel's limit on one UDP datagram's payload.
const GSO_MAX_BYTES: usize = 65_000;

/// Socket buffer sizes the kernel reports after setting them (Linux
/// reports twice the value set, for its bookkeeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBuffers {
    pub sndbuf: u32,
    pub rcvbuf: u32,
}

pub struct UdpIo {
    sock: UdpSocket,
    state: UdpSocketState,
}

/// Buffers for one recvmmsg.
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
}

impl RecvBatch {
    pub fn new() -> RecvBatch {
        RecvBatch {
            bufs: (0..BATCH_SIZE).map(|_| vec![0; RECV_BUF_LEN]).collect(),
            metas: vec![RecvMeta::default(); BATCH_SIZE],
        }
    }
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch::new()
    }
}

/// Which buffer to size.
#[derive(Debug, Clone, Copy)]
enum Buf {
    Send,
    Recv,
}

impl UdpIo {
    /// Binds a non-blocking UDP socket (on a tokio runtime).
    pub fn bind(addr: SocketAddr) -> io::Result<UdpIo> {
        let sock = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            // Serve IPv4 clients too when bound to [::].
            let _ = sock.set_only_v6(false);
        }
        sock.set_nonblocking(true)?;
        sock.bind(&addr.into())?;
        UdpIo::from_std(sock.into())
    }

    /// Takes over a socket already bound (the ssh bootstrap's, which sent
    /// or received a punch datagram through a NAT): made non-blocking and
    /// registered with the current tokio runtime.
    pub fn from_std(std_sock: std::net::UdpSocket) -> io::Result<UdpIo> {
        std_sock.set_nonblocking(true)?;
        let state = UdpSocketState::new(UdpSockRef::from(&std_sock))?;
        let sock = UdpSocket::from_std(std_sock)?;
        Ok(UdpIo { sock, state })
    }

    /// Fixes the peer: the kernel then reports ICMP errors from it
    /// (port or host unreachable) on this socket. It also turns on
    /// IP_RECVERR, without which Linux hides a qdisc's refusal of a
    /// datagram (udp_send_skb counts ENOBUFS and reports success), the
    /// local congestion signal the sender's CWR answers (Sarolahti §3).
    /// The errors it queues are drained by [`Self::drain_errors`]; without
    /// it (other systems) the sender just does without CWR.
    pub async fn connect(&self, peer: SocketAddr) -> io::Result<()> {
        self.sock.connect(peer).await?;
        let _ = self
            .state
            .enable_transport_errors(UdpSockRef::from(&self.sock));
        Ok(())
    }

    /// Empties the socket's error queue (ICMP reports IP_RECVERR keeps,
    /// charged to the receive buffer until read); returns how many.
    pub fn drain_errors(&self) -> u64 {
        let mut drained = 0;
        // Bounded: a peer flooding ICMP cannot hold the driver here.
        while drained < 256 {
            match self
                .state
                .recv_transport_error(UdpSockRef::from(&self.sock))
            {
                Ok(Some(_)) => drained += 1,
                Ok(None) | Err(_) => break,
            }
        }
        drained
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Segments one GSO send may carry now; it can drop to 1 at any time
    /// if the kernel or driver refuses segmentation offload.
    pub fn max_gso_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn size(&self, which: Buf, bytes: u32) -> io::Result<u32> {
        let sock = UdpSockRef::from(&self.sock);
        let read = |s: &Self| -> io::Result<u32> {
            let sock = UdpSockRef::from(&s.sock);
            let n = match which {
                Buf::Send => s.state.send_buffer_size(sock)?,
                Buf::Recv => s.state.recv_buffer_size(sock)?,
            };
            Ok(u32::try_from(n).unwrap_or(u32::MAX))
        };
        match which {
            Buf::Send => self.state.set_send_buffer_size(sock, bytes as usize)?,
            Buf::Recv => self.state.set_recv_buffer_size(sock, bytes as usize)?,
        }
        let got = read(self)?;
        if u64::from(got) < u64::from(bytes) {
            // Capped by net.core.[rw]mem_max; with CAP_NET_ADMIN the FORCE
            // variants go past the cap. Failure (no privilege) leaves the
            // capped size, which the caller reports.
            let option = match which {
                Buf::Send => libc::SO_SNDBUFFORCE,
                Buf::Recv => libc::SO_RCVBUFFORCE,
            };
            let value = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
            // SAFETY: setsockopt on a socket this struct owns, with a pointer
            // to a live c_int and its exact size; the kernel only reads it.
            let rc = unsafe {
                libc::setsockopt(
                    self.sock.as_fd().as_raw_fd(),
                    libc::SOL_SOCKET,
                    option,
                    (&value as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                return read(self);
            }
        }
        Ok(got)
    }

    /// Sets SO_SNDBUF and SO_RCVBUF; returns what the kernel granted.
    pub fn set_buffers(&self, sndbuf: u32, rcvbuf: u32) -> io::Result<SocketBuffers> {
        Ok(SocketBuffers {
            sndbuf: self.size(Buf::Send, sndbuf)?,
            rcvbuf: self.size(Buf::Recv, rcvbuf)?,
        })
    }

    /// Sets SO_RCVBUF alone; returns what the kernel granted.
    pub fn set_rcvbuf(&self, bytes: u32) -> io::Result<u32> {
        self.size(Buf::Recv, bytes)
    }

    /// Waits until a datagram may be read.
    pub async fn readable(&self) -> io::Result<()> {
        self.sock.readable().await
    }

    /// Reads what is waiting (one recvmmsg) without blocking and hands
    /// each datagram, GRO batches split by their stride, to `f`. Returns
    /// the number of datagrams; 0 when nothing was waiting.
    pub fn try_recv(
        &self,
        batch: &mut RecvBatch,
        mut f: impl FnMut(SocketAddr, &mut [u8]),
    ) -> io::Result<usize> {
        let RecvBatch { bufs, metas } = batch;
        let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let msgs = match self.sock.try_io(Interest::READABLE, || {
            self.state
                .recv(UdpSockRef::from(&self.sock), &mut slices, metas)
        }) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut count = 0;
        for (meta, buf) in metas.iter().zip(slices.iter_mut()).take(msgs) {
            let data = &mut buf[..meta.len];
            let stride = if meta.stride == 0 {
                meta.len
            } else {
                meta.stride
            };
            for datagram in data.chunks_mut(stride.max(1)) {
                f(meta.addr, datagram);
                count += 1;
            }
        }
        Ok(count)
    }

    /// Sends `contents` to `to`, as GSO segments of `segment_size` when
    /// given. Waits while the socket buffer is full. If the kernel refuses
    /// segmentation offload, quinn-udp turns it off (max_gso_segments
    /// drops to 1) and the batch goes again datagram by datagram.
    pub async fn send(
        &self,
        to: SocketAddr,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        let result = self.send_once(to, contents, segment_size).await;
        match (result, segment_size) {
            (Err(_), Some(size)) if size < contents.len() && self.max_gso_segments() == 1 => {
                for chunk in contents.chunks(size) {
                    self.send_once(to, chunk, None).await?;
                }
                Ok(())
            }
            (r, _) => r,
        }
    }

    async fn send_once(
        &self,
        to: SocketAddr,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        let transmit = Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size,
            src_ip: None,
        };
        loop {
            match self.sock.try_io(Interest::WRITABLE, || {
                self.state.try_send(UdpSockRef::from(&self.sock), &transmit)
            }) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.sock.writable().await?,
                // The kernel's queue to the device is full: wait a moment.
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tokio::task::yield_now().await;
                    return Err(e);
                }
                r => return r,
            }
        }
    }
}

/// Datagrams waiting to be sent, packed back to back, sent as GSO runs.
pub struct TxBatch {
    /// Only grows: datagrams are written in place, never zeroed first.
    buf: Vec<u8>,
    /// Bytes of `buf` in use.
    used: usize,
    /// (destination, start, length) of each datagram.
    items: Vec<(SocketAddr, usize, usize)>,
    /// Datagrams refused with ENOBUFS (atou's `enobufs`): lost.
    pub enobufs: u64,
}

impl TxBatch {
    pub fn new() -> TxBatch {
        TxBatch {
            buf: Vec::new(),
            used: 0,
            items: Vec::new(),
            enobufs: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Writes one datagram of at most `max_len` bytes with `fill`, which
    /// returns its length (or `None`: nothing to send).
    pub fn push_with(
        &mut self,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize)>,
    ) -> bool {
        let start = self.used;
        if self.buf.len() < start + max_len {
            self.buf.resize(start + max_len, 0);
        }
        match fill(&mut self.buf[start..start + max_len]) {
            Some((to, n)) => {
                debug_assert!(n <= max_len);
                self.used = start + n;
                self.items.push((to, start, n));
                true
            }
            None => false,
        }
    }

    /// Sends everything: each run of datagrams to one destination, all of
    /// one size but the last, goes as one GSO send.
    pub async fn flush(&mut self, io: &UdpIo) -> io::Result<()> {
        let mut i = 0;
        while i < self.items.len() {
            let (to, start, size) = self.items[i];
            let max_segments = io
                .max_gso_segments()
                .min(GSO_MAX_BYTES / size.max(1))
                .max(1);
            let mut j = i + 1;
            let mut end = start + size;
            while j < self.items.len() && j - i < max_segments {
                let (t, s, n) = self.items[j];
                if t != to || s != end || n > size {
                    break;
                }
                end = s + n;
                j += 1;
                if n < size {
                    // A shorter datagram ends a GSO run.
                    break;
                }
            }
            let segment_size = (j - i > 1).then_some(size);
            match io.send(to, &self.buf[start..end], segment_size).await {
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => self.enobufs += (j - i) as u64,
                Err(e) => {
                    self.clear();
                    return Err(e);
                }
                Ok(()) => {}
            }
            i = j;
        }
        self.clear();
        Ok(())
    }

    fn clear(&mut self) {
        self.used = 0;
        self.items.clear();
    }
}

impl Default for TxBatch {
    fn default() -> Self {
        TxBatch::new()
    }
}

/// The MTU of the route to `peer` when `peer` is an address of this host
/// (loopback, or one of its own interfaces, which Linux routes over lo),
/// else `None`. On this host no router lies between the ends, so the
/// route's MTU is the path's, as kernel TCP assumes when it sizes its MSS
/// from the interface; elsewhere the path may be narrower than the first
/// link, and only path MTU discovery could say.
pub fn this_host_mtu(peer: SocketAddr) -> Option<u32> {
    let ip = peer.ip();
    // Binding to an address succeeds only if this host has it (unless
    // ip_nonlocal_bind is set, which the route MTU below then catches:
    // a real interface's MTU, not lo's).
    if !ip.is_loopback() && std::net::UdpSocket::bind((ip, 0)).is_err() {
        return None;
    }
    let unspecified: SocketAddr = if peer.is_ipv6() {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    };
    let probe = std::net::UdpSocket::bind(unspecified).ok()?;
    probe.connect(peer).ok()?;
    let mtu = if peer.is_ipv6() {
        rustix::net::sockopt::ipv6_mtu(&probe)
    } else {
        rustix::net::sockopt::ip_mtu(&probe)
    };
    mtu.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_this_host_with_lo_mtu_and_a_documentation_address_is_not() {
        let lo = this_host_mtu("127.0.0.1:9".parse().unwrap());
        assert!(lo.is_some_and(|m| m >= 9000), "{lo:?}");
        // TEST-NET-3 (RFC 5737) is never assigned to a host.
        assert_eq!(this_host_mtu("203.0.113.7:9".parse().unwrap()), None);
    }
}
