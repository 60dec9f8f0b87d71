//! One UDP socket with batched I/O: recvmmsg with GRO on the way in, GSO
//! on the way out (through quinn-udp), socket buffers as asked.

use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use super::error_queue::{self, ErrorReport};
use crate::proto::crypto::frame::SealJob;
use quinn_udp::{RecvMeta, Transmit, UdpSockRef, UdpSocketState, BATCH_SIZE};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;

/// A GRO buffer holds at most one 64 KiB super-datagram.
const RECV_BUF_LEN: usize = 1 << 16;
/// Largest GSO send: the kernel's limit on one UDP datagram's payload.
const GSO_MAX_BYTES: usize = 65_000;
/// How far ahead of now a paced run may be scheduled: two of the
/// pacer's millisecond quanta.
const TXTIME_HORIZON_NS: u64 = 2_000_000;

/// What [`UdpIo::drain_errors`] found in the error queue.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    /// Reports read.
    pub(crate) count: u64,
    /// The "too big" reports among them.
    pub(crate) too_big: Vec<ErrorReport>,
}

/// Socket buffer sizes the kernel reports after setting them (Linux
/// reports twice the value set, for its bookkeeping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBuffers {
    /// Send buffer (SO_SNDBUF), in bytes, as the kernel reports it.
    pub sndbuf: u32,
    /// Receive buffer (SO_RCVBUF), in bytes, as the kernel reports it.
    pub rcvbuf: u32,
}

pub(crate) struct UdpIo {
    sock: UdpSocket,
    state: UdpSocketState,
    /// The socket takes a departure time with each send (SO_TXTIME);
    /// cleared for good the first time such a send fails.
    txtime: AtomicBool,
    /// Bound to a wildcard address (0.0.0.0, [::]): a datagram may arrive
    /// at any address of this host, and an answer must leave from the
    /// one it arrived at ([`UdpIo::answer_from`]).
    wildcard: bool,
}

/// Buffers for one recvmmsg.
pub(crate) struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    metas: Vec<RecvMeta>,
    /// Messages the last [`UdpIo::try_recv_batch`] read.
    filled: usize,
}

impl RecvBatch {
    pub(crate) fn new() -> RecvBatch {
        RecvBatch {
            bufs: (0..BATCH_SIZE).map(|_| vec![0; RECV_BUF_LEN]).collect(),
            metas: vec![RecvMeta::default(); BATCH_SIZE],
            filled: 0,
        }
    }

    /// Each datagram the last [`UdpIo::try_recv_batch`] read, GRO
    /// batches split by their stride, with its source; the same datagrams
    /// in the same order each time.
    pub(crate) fn datagrams_mut(&mut self) -> impl Iterator<Item = (SocketAddr, &mut [u8])> {
        self.datagrams_at_mut().map(|(from, _, d)| (from, d))
    }

    /// [`Self::datagrams_mut`] with each datagram's destination, the
    /// address of this host it arrived at, where the kernel said.
    pub(crate) fn datagrams_at_mut(
        &mut self,
    ) -> impl Iterator<Item = (SocketAddr, Option<IpAddr>, &mut [u8])> {
        self.metas
            .iter()
            .zip(self.bufs.iter_mut())
            .take(self.filled)
            .flat_map(|(meta, buf)| {
                let stride = if meta.stride == 0 {
                    meta.len
                } else {
                    meta.stride
                };
                buf[..meta.len]
                    .chunks_mut(stride.max(1))
                    .map(move |d| (meta.addr, meta.dst_ip, d))
            })
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
    pub(crate) fn bind(addr: SocketAddr) -> io::Result<UdpIo> {
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
    pub(crate) fn from_std(std_sock: std::net::UdpSocket) -> io::Result<UdpIo> {
        std_sock.set_nonblocking(true)?;
        let state = UdpSocketState::new(UdpSockRef::from(&std_sock))?;
        let wildcard = std_sock.local_addr()?.ip().is_unspecified();
        let sock = UdpSocket::from_std(std_sock)?;
        Ok(UdpIo {
            sock,
            state,
            txtime: AtomicBool::new(false),
            wildcard,
        })
    }

    /// The source an answer to a datagram that arrived at `local` (its
    /// destination, IP_PKTINFO; quinn-udp asks for it on every socket)
    /// must leave from, so that a client that sent to a second address of
    /// this host (an alias, another interface), whose socket is connected
    /// to that address, takes it: `None` where the kernel's choice is
    /// right (a socket bound to one address) or cannot be overridden (a
    /// broadcast or multicast destination; an IPv6 link-local one, which
    /// would need its interface too).
    pub(crate) fn answer_from(&self, local: Option<IpAddr>) -> Option<IpAddr> {
        let ip = local.filter(|_| self.wildcard)?;
        let usable = match ip {
            IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast()),
            IpAddr::V6(v6) => {
                !(v6.is_unspecified() || v6.is_multicast() || v6.is_unicast_link_local())
            }
        };
        usable.then_some(ip)
    }

    /// Fixes the peer: the kernel then reports ICMP errors from it
    /// (port or host unreachable) on this socket. It also turns on
    /// IP_RECVERR, without which Linux hides a qdisc's refusal of a
    /// datagram (udp_send_skb counts ENOBUFS and reports success), the
    /// local congestion signal the sender's CWR answers (Sarolahti §3).
    /// The errors it queues are drained by [`Self::drain_errors`]; without
    /// it (other systems) the sender just does without CWR.
    pub(crate) async fn connect(&self, peer: SocketAddr) -> io::Result<()> {
        self.sock.connect(peer).await?;
        let _ = self
            .state
            .enable_transport_errors(UdpSockRef::from(&self.sock));
        self.txtime
            .store(txtime::enable(&self.sock), Ordering::Relaxed);
        Ok(())
    }

    /// Sends carry departure times (SO_TXTIME): where the egress qdisc is
    /// fq, the kernel spaces a pacer's burst out at the pacing rate;
    /// elsewhere the times are ignored and the burst leaves at once.
    pub(crate) fn txtime(&self) -> bool {
        self.txtime.load(Ordering::Relaxed)
    }

    /// Empties the socket's error queue (ICMP reports IP_RECVERR keeps,
    /// charged to the receive buffer until read): how many reports there
    /// were, and the "too big" ones among them, each with the datagram it
    /// quoted (the first [`error_queue::QUOTE_LEN`] bytes).
    pub(crate) fn drain_errors(&self) -> Drained {
        let mut drained = Drained::default();
        // Bounded: a peer flooding ICMP cannot hold the driver here.
        while drained.count < 256 {
            match error_queue::recv(self.sock.as_fd()) {
                Ok(Some(report)) => {
                    drained.count += 1;
                    // All of them: a flood of forged ones must not push
                    // a router's real one out before the client checks
                    // their quotes.
                    if report.too_big.is_some() {
                        drained.too_big.push(report);
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        drained
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Segments one GSO send may carry now; it can drop to 1 at any time
    /// if the kernel or driver refuses segmentation offload.
    pub(crate) fn max_gso_segments(&self) -> usize {
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
    pub(crate) fn set_buffers(&self, sndbuf: u32, rcvbuf: u32) -> io::Result<SocketBuffers> {
        Ok(SocketBuffers {
            sndbuf: self.size(Buf::Send, sndbuf)?,
            rcvbuf: self.size(Buf::Recv, rcvbuf)?,
        })
    }

    /// Sets SO_RCVBUF alone; returns what the kernel granted.
    pub(crate) fn set_rcvbuf(&self, bytes: u32) -> io::Result<u32> {
        self.size(Buf::Recv, bytes)
    }

    /// Drops in the kernel, before they are read, the hellos whose client
    /// ids are `ids` (replays: [`crate::proto::crypto::replayed`]); an
    /// empty list removes the filter. A socket filter (classic BPF,
    /// SO_ATTACH_FILTER) runs where the datagram is queued, so a copy it
    /// drops costs this process nothing; the program replaces the last
    /// one at once. Elsewhere than Linux: `Unsupported`.
    pub(crate) fn drop_hellos(&self, ids: &[u64]) -> io::Result<()> {
        hello_filter::attach(&self.sock, ids)
    }

    /// Waits until a datagram may be read.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        self.sock.readable().await
    }

    /// Reads what is waiting (one recvmmsg) without blocking and hands
    /// each datagram, GRO batches split by their stride, to `f`. Returns
    /// the number of datagrams; 0 when nothing was waiting.
    pub(crate) fn try_recv(
        &self,
        batch: &mut RecvBatch,
        mut f: impl FnMut(SocketAddr, &mut [u8]),
    ) -> io::Result<usize> {
        self.try_recv_at(batch, |from, _, datagram| f(from, datagram))
    }

    /// [`Self::try_recv`], with the source an answer to each datagram
    /// leaves from ([`Self::answer_from`]).
    pub(crate) fn try_recv_at(
        &self,
        batch: &mut RecvBatch,
        mut f: impl FnMut(SocketAddr, Option<IpAddr>, &mut [u8]),
    ) -> io::Result<usize> {
        self.try_recv_batch(batch)?;
        let mut count = 0;
        for (from, local, datagram) in batch.datagrams_at_mut() {
            f(from, self.answer_from(local), datagram);
            count += 1;
        }
        Ok(count)
    }

    /// Reads what is waiting (one recvmmsg) into `batch` without blocking,
    /// for [`RecvBatch::datagrams_mut`]; returns the messages read (a GRO
    /// message holds several datagrams), 0 when nothing was waiting.
    pub(crate) fn try_recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        let RecvBatch {
            bufs,
            metas,
            filled,
        } = batch;
        *filled = 0;
        let mut slices: Vec<IoSliceMut<'_>> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        *filled = match self.sock.try_io(Interest::READABLE, || {
            self.state
                .recv(UdpSockRef::from(&self.sock), &mut slices, metas)
        }) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
            Err(e) => return Err(e),
        };
        Ok(*filled)
    }

    /// Sends `contents` to `to`, as GSO segments of `segment_size` when
    /// given. Waits while the socket buffer is full. If the kernel refuses
    /// segmentation offload, quinn-udp turns it off (max_gso_segments
    /// drops to 1) and the batch goes again datagram by datagram.
    pub(crate) async fn send(
        &self,
        to: SocketAddr,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        self.send_from(to, None, contents, segment_size).await
    }

    /// [`Self::send`] from source address `src` where given (an answer,
    /// [`Self::answer_from`]).
    async fn send_from(
        &self,
        to: SocketAddr,
        src: Option<IpAddr>,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        let result = self.send_once_from(to, src, contents, segment_size).await;
        match (result, segment_size) {
            (Err(_), Some(size)) if size < contents.len() && self.max_gso_segments() == 1 => {
                for chunk in contents.chunks(size) {
                    self.send_once_from(to, src, chunk, None).await?;
                }
                Ok(())
            }
            (r, _) => r,
        }
    }

    /// [`Self::send_once`] from `src`; should the kernel refuse that
    /// source (the address went away), from its own choice instead.
    async fn send_once_from(
        &self,
        to: SocketAddr,
        src: Option<IpAddr>,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        match self.send_once(to, src, contents, segment_size).await {
            Err(e) if src.is_some() && source_refused(&e) => {
                self.send_once(to, None, contents, segment_size).await
            }
            sent => sent,
        }
    }

    /// Sends `contents` (a GSO run if `segment_size`) on the connected
    /// socket to leave at `departure` (CLOCK_MONOTONIC nanoseconds). If
    /// the kernel refuses the departure time, the socket stops using them
    /// and the run goes as an ordinary send.
    pub(crate) async fn send_at(
        &self,
        to: SocketAddr,
        contents: &[u8],
        segment_size: Option<usize>,
        departure: u64,
    ) -> io::Result<()> {
        loop {
            let sent = self.sock.try_io(Interest::WRITABLE, || {
                txtime::send(&self.sock, contents, segment_size, departure)
            });
            match sent {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.sock.writable().await?,
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tokio::task::yield_now().await;
                    return Err(e);
                }
                Err(e) if txtime::refused(&e) => {
                    self.txtime.store(false, Ordering::Relaxed);
                    return self.send(to, contents, segment_size).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One run of [`TxBatch::flush`]: at departure time `at` where it is
    /// paced, at once otherwise.
    async fn send_run(
        &self,
        to: SocketAddr,
        src: Option<IpAddr>,
        run: &[u8],
        segment_size: Option<usize>,
        at: Option<u64>,
    ) -> io::Result<()> {
        // Departure times are a connected socket's, whose source is fixed.
        match at {
            Some(at) => self.send_at(to, run, segment_size, at).await,
            None => self.send_from(to, src, run, segment_size).await,
        }
    }

    /// [`Self::send_run`] from a thread outside the runtime: waits in
    /// poll(2) while the socket buffer is full, and goes datagram by
    /// datagram where the kernel refuses segmentation offload, as
    /// [`Self::send`] does.
    pub(crate) fn send_run_blocking(
        &self,
        to: SocketAddr,
        src: Option<IpAddr>,
        run: &[u8],
        segment_size: Option<usize>,
        at: Option<u64>,
    ) -> io::Result<()> {
        if let Some(at) = at.filter(|_| self.txtime()) {
            match self.until_sent(|| txtime::send(&self.sock, run, segment_size, at)) {
                Err(e) if txtime::refused(&e) => self.txtime.store(false, Ordering::Relaxed),
                sent => return sent,
            }
        }
        let try_once = |contents: &[u8], segment_size: Option<usize>, src_ip: Option<IpAddr>| {
            let transmit = Transmit {
                destination: to,
                ecn: None,
                contents,
                segment_size,
                src_ip,
            };
            self.until_sent(|| self.state.try_send(UdpSockRef::from(&self.sock), &transmit))
        };
        // From `src`, or, should the kernel refuse that source, from its
        // own choice.
        let once = |contents: &[u8], segment_size: Option<usize>| match try_once(
            contents,
            segment_size,
            src,
        ) {
            Err(e) if src.is_some() && source_refused(&e) => try_once(contents, segment_size, None),
            sent => sent,
        };
        match (once(run, segment_size), segment_size) {
            (Err(_), Some(size)) if size < run.len() && self.max_gso_segments() == 1 => {
                for chunk in run.chunks(size) {
                    once(chunk, None)?;
                }
                Ok(())
            }
            (r, _) => r,
        }
    }

    /// Runs `send` until the socket takes it: on EWOULDBLOCK, waits in
    /// poll(2) for room (outside tokio, whose readiness this leaves
    /// alone: its own sends still find out for themselves).
    fn until_sent(&self, mut send: impl FnMut() -> io::Result<()>) -> io::Result<()> {
        loop {
            match send() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let mut fds = [rustix::event::PollFd::new(
                        &self.sock,
                        rustix::event::PollFlags::OUT,
                    )];
                    let wait = rustix::time::Timespec {
                        tv_sec: 0,
                        tv_nsec: 50_000_000,
                    };
                    match rustix::event::poll(&mut fds, Some(&wait)) {
                        Ok(_) | Err(rustix::io::Errno::INTR) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                sent => return sent,
            }
        }
    }

    async fn send_once(
        &self,
        to: SocketAddr,
        src_ip: Option<IpAddr>,
        contents: &[u8],
        segment_size: Option<usize>,
    ) -> io::Result<()> {
        let transmit = Transmit {
            destination: to,
            ecn: None,
            contents,
            segment_size,
            src_ip,
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

/// The kernel may have refused the source address asked for: it is no
/// longer this host's (an alias removed), or not one to send from, or no
/// route leaves from it (Linux says EINVAL, EADDRNOTAVAIL or ENETUNREACH).
/// The send is tried once more from the kernel's choice: where the error
/// was the peer's, it comes again.
fn source_refused(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EINVAL | libc::EADDRNOTAVAIL | libc::ENETUNREACH)
    )
}

/// Tries of one run in [`TxBatch::flush`] when a send fails: each may
/// meet an ICMP report's pending error, not a fault of the run's own.
pub(crate) const SENDS_PER_RUN: usize = 4;

/// A datagram written into a [`TxQueue`]: where it goes, where from
/// (`None`: the kernel's choice), its length, and the job that seals it
/// where it is not sealed yet.
type Filled = (SocketAddr, Option<IpAddr>, usize, Option<SealJob>);

/// Datagrams waiting to be sent, packed back to back: what a [`TxBatch`]
/// fills and sends, and what a sealing thread takes and gives back.
#[derive(Default)]
pub(crate) struct TxQueue {
    /// Only grows: datagrams are written in place, never zeroed first.
    buf: Vec<u8>,
    /// Bytes of `buf` in use.
    used: usize,
    /// (destination, source, start, length, alone) of each datagram: the
    /// source where it must leave from a given address of this host (a
    /// server's answer, [`UdpIo::answer_from`]); one `alone` goes in a
    /// send of its own, never in a GSO run.
    items: Vec<(SocketAddr, Option<IpAddr>, usize, usize, bool)>,
    /// (start, job) of each datagram prepared and not yet sealed
    /// ([`prepare`](crate::proto::crypto::frame::prepare)): none of them may leave until [`Self::seal`].
    unsealed: Vec<(usize, SealJob)>,
}

impl TxQueue {
    pub(crate) fn len(&self) -> usize {
        self.items.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes of the datagrams still to be sealed: the AEAD work waiting.
    pub(crate) fn unsealed_bytes(&self) -> usize {
        self.unsealed.iter().map(|(_, job)| job.len()).sum()
    }

    /// Seals every datagram prepared and not yet sealed, in place. One
    /// whose seal fails is taken out of the queue, so that it never leaves
    /// in clear; returns how many were. (A job carries its key, so a key
    /// update since it was prepared does not fail it.)
    pub(crate) fn seal(&mut self) -> usize {
        let mut failed = Vec::new();
        for (start, job) in self.unsealed.drain(..) {
            let len = job.len();
            if job.seal(&mut self.buf[start..start + len]).is_err() {
                failed.push(start);
            }
        }
        if !failed.is_empty() {
            self.items
                .retain(|(_, _, start, _, _)| !failed.contains(start));
        }
        failed.len()
    }

    /// Writes one datagram with `fill`, which returns what
    /// [`Filled`] says, or `None`: nothing to send.
    fn push(
        &mut self,
        max_len: usize,
        alone: bool,
        fill: impl FnOnce(&mut [u8]) -> Option<Filled>,
    ) -> bool {
        let start = self.used;
        if self.buf.len() < start + max_len {
            self.buf.resize(start + max_len, 0);
        }
        match fill(&mut self.buf[start..start + max_len]) {
            Some((to, src, n, job)) => {
                debug_assert!(n <= max_len);
                self.used = start + n;
                self.items.push((to, src, start, n, alone));
                if let Some(job) = job {
                    debug_assert_eq!(job.len(), n);
                    self.unsealed.push((start, job));
                }
                true
            }
            None => false,
        }
    }

    fn clear(&mut self) {
        self.used = 0;
        self.items.clear();
        // Dropped unsealed only when a flush failed: they never leave.
        self.unsealed.clear();
    }

    /// The GSO runs the queue goes in, each with its departure time where
    /// it is paced: each run of datagrams to one destination, all of one
    /// size but the last; with a pacing rate and a socket that takes
    /// departure times, at most a quarter millisecond's worth, leaving one
    /// after the other at that rate from `departure` (where the last
    /// burst's schedule ended, but never more than TXTIME_HORIZON_NS
    /// ahead, so a fast pacer cannot queue the future: fq drops what lies
    /// beyond its horizon), which is moved on.
    fn runs(&self, io: &UdpIo, pacing: Option<u64>, departure: &mut u64) -> Vec<Run> {
        let mut paced = pacing.filter(|&r| r > 0 && io.txtime()).map(|rate| {
            let now = monotonic_nanos();
            (rate, (*departure).clamp(now, now + TXTIME_HORIZON_NS))
        });
        let mut runs = Vec::new();
        let mut i = 0;
        while i < self.items.len() {
            let (to, src, start, size, alone) = self.items[i];
            let quantum = paced.map_or(usize::MAX, |(rate, _)| {
                usize::try_from(rate / 4_000 / size.max(1) as u64).unwrap_or(usize::MAX)
            });
            let max_segments = io
                .max_gso_segments()
                .min(GSO_MAX_BYTES / size.max(1))
                .min(quantum)
                .max(1);
            let mut j = i + 1;
            let mut end = start + size;
            while !alone && j < self.items.len() && j - i < max_segments {
                let (t, from, s, n, single) = self.items[j];
                if single || t != to || from != src || s != end || n > size {
                    break;
                }
                end = s + n;
                j += 1;
                if n < size {
                    // A shorter datagram ends a GSO run.
                    break;
                }
            }
            let at = paced.as_mut().map(|(rate, departure)| {
                let at = *departure;
                *departure += ((end - start) as u64).saturating_mul(1_000_000_000) / *rate;
                at
            });
            runs.push(Run {
                to,
                src,
                start,
                end,
                segment_size: (j - i > 1).then_some(size),
                at,
                datagrams: (j - i) as u64,
            });
            i = j;
        }
        if let Some((_, d)) = paced {
            *departure = d;
        }
        runs
    }

    /// [`TxBatch::flush`] from a thread outside the runtime (a sealing
    /// thread): seals what is not sealed yet, sends every run, waiting in
    /// poll(2) while the socket buffer is full, and empties the queue.
    /// Returns the datagrams the kernel refused (ENOBUFS) and the first
    /// error; `departure` is the pacing schedule, moved on.
    pub(crate) fn send_blocking(
        &mut self,
        io: &UdpIo,
        pacing: Option<u64>,
        departure: &mut u64,
    ) -> (u64, io::Result<()>) {
        self.seal();
        let runs = self.runs(io, pacing, departure);
        let mut tries = RunTries::default();
        let mut result = Ok(());
        for run in &runs {
            let bytes = &self.buf[run.start..run.end];
            let send = || io.send_run_blocking(run.to, run.src, bytes, run.segment_size, run.at);
            let mut sent = send();
            let ended = loop {
                match tries.after(sent) {
                    Some(ended) => break ended,
                    None => sent = send(),
                }
            };
            if let Err(e) = tries.settle(ended, run) {
                result = Err(e);
                break;
            }
        }
        self.clear();
        let enobufs = tries.enobufs;
        match (result, tries.reported) {
            (Err(e), _) | (Ok(()), Some(e)) => (enobufs, Err(e)),
            (Ok(()), None) => (enobufs, Ok(())),
        }
    }
}

/// One GSO send of a [`TxQueue`]: `buf[start..end]` to `to`, from `src`
/// where given.
struct Run {
    to: SocketAddr,
    src: Option<IpAddr>,
    start: usize,
    end: usize,
    segment_size: Option<usize>,
    /// Departure time (CLOCK_MONOTONIC ns) where paced.
    at: Option<u64>,
    datagrams: u64,
}

/// The tries of a flush's runs. A connected socket with IP_RECVERR holds
/// an ICMP report's error (sk_err) for the next call, and a send that
/// meets it fails without sending: "too big" from a router on every
/// datagram over its MTU, each eating the run after it (the size probes
/// that would have stepped down: the send stalled to maxidle behind a
/// real router, tests/pmtu.rs). The kernel clears the error as it reports
/// it, so a failed run is sent again, up to SENDS_PER_RUN times in all
/// (the report of an oversized run sent just before may land between two
/// tries); the first error still goes to the caller, whose error-queue
/// drain reads the reports. A run that fails every time fails the flush.
#[derive(Default)]
struct RunTries {
    /// Tries of the current run so far.
    tries: usize,
    /// The first error a try met.
    reported: Option<io::Error>,
    /// Datagrams refused with ENOBUFS: lost, not retried.
    enobufs: u64,
}

impl RunTries {
    /// After a try of the run: `None` to send it again, or how it ended.
    fn after(&mut self, sent: io::Result<()>) -> Option<io::Result<()>> {
        self.tries += 1;
        match sent {
            Err(e) if e.raw_os_error() != Some(libc::ENOBUFS) && self.tries < SENDS_PER_RUN => {
                self.reported.get_or_insert(e);
                None
            }
            ended => {
                self.tries = 0;
                Some(ended)
            }
        }
    }

    /// The run's last try: ENOBUFS counts its datagrams lost; another
    /// error fails the flush (the first one reported goes back).
    fn settle(&mut self, sent: io::Result<()>, run: &Run) -> io::Result<()> {
        match sent {
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                self.enobufs += run.datagrams;
                Ok(())
            }
            Err(e) => Err(self.reported.take().unwrap_or(e)),
            Ok(()) => Ok(()),
        }
    }
}

/// Datagrams waiting to be sent, sent as GSO runs, and the sending
/// state that outlives a batch: the pacing schedule and the count of
/// datagrams the kernel refused.
pub(crate) struct TxBatch {
    queue: TxQueue,
    /// Datagrams refused with ENOBUFS (atou's `enobufs`): lost.
    pub enobufs: u64,
    /// When the last paced run was to leave, CLOCK_MONOTONIC ns.
    departure: u64,
}

impl TxBatch {
    pub(crate) fn new() -> TxBatch {
        TxBatch {
            queue: TxQueue::default(),
            enobufs: 0,
            departure: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The datagrams being filled, for a look at what they hold.
    pub(crate) fn queue(&self) -> &TxQueue {
        &self.queue
    }

    /// Puts `other` in the place of the datagrams being filled: to hand
    /// a filled queue to a sealing thread (an empty one in its place), or
    /// to take a sealed one back to send.
    pub(crate) fn swap_queue(&mut self, other: &mut TxQueue) {
        std::mem::swap(&mut self.queue, other);
    }

    /// Writes one datagram of at most `max_len` bytes with `fill`, which
    /// returns its length (or `None`: nothing to send).
    pub(crate) fn push_with(
        &mut self,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize)>,
    ) -> bool {
        self.queue.push(max_len, false, |b| {
            fill(b).map(|(to, n)| (to, None, n, None))
        })
    }

    /// [`Self::push_with`] for a datagram that must leave from a given
    /// address of this host where `fill` names one (a server's answer).
    pub(crate) fn push_from_with(
        &mut self,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, Option<IpAddr>, usize)>,
    ) -> bool {
        self.queue.push(max_len, false, |b| {
            fill(b).map(|(to, src, n)| (to, src, n, None))
        })
    }

    /// [`Self::push_with`] for a datagram that must travel alone: a size
    /// probe. A Linux router forwards a GSO run (a VM's or a container's,
    /// handed over unsegmented) as one packet and drops it whole, with
    /// one "too big", if its segment size is over the next hop's MTU: a
    /// probe riding at the end of a larger probe's run is lost with it
    /// (a search behind a 1,400-byte hop found 1,280).
    pub(crate) fn push_alone_with(
        &mut self,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize)>,
    ) -> bool {
        self.queue.push(max_len, true, |b| {
            fill(b).map(|(to, n)| (to, None, n, None))
        })
    }

    /// [`Self::push_with`] for a datagram that may come prepared and not
    /// yet sealed, with the job that seals it (sealed before it is sent).
    pub(crate) fn push_unsealed_with(
        &mut self,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> Option<(SocketAddr, usize, Option<SealJob>)>,
    ) -> bool {
        self.queue.push(max_len, false, |b| {
            fill(b).map(|(to, n, job)| (to, None, n, job))
        })
    }

    /// Sends everything: each run of datagrams to one destination, all of
    /// one size but the last, goes as one GSO send. With a pacing rate
    /// (bytes per second) and a socket that takes departure times, runs
    /// are at most a quarter millisecond's worth and leave one after the
    /// other at that rate (SO_TXTIME), instead of the pacer's whole burst
    /// at once.
    pub(crate) async fn flush(&mut self, io: &UdpIo, pacing: Option<u64>) -> io::Result<()> {
        // What was prepared and not handed to a sealing thread is sealed
        // here: nothing leaves in clear.
        self.queue.seal();
        let runs = self.queue.runs(io, pacing, &mut self.departure);
        let mut tries = RunTries::default();
        for run in &runs {
            let bytes = &self.queue.buf[run.start..run.end];
            let send = || io.send_run(run.to, run.src, bytes, run.segment_size, run.at);
            let mut sent = send().await;
            let ended = loop {
                match tries.after(sent) {
                    Some(ended) => break ended,
                    None => sent = send().await,
                }
            };
            if let Err(e) = tries.settle(ended, run) {
                self.enobufs += tries.enobufs;
                self.clear();
                return Err(e);
            }
        }
        self.enobufs += tries.enobufs;
        self.clear();
        tries.reported.map_or(Ok(()), Err)
    }

    /// The pacing schedule and the datagrams refused so far, for a send
    /// done elsewhere ([`TxQueue::send_blocking`]): one at a time, and
    /// none from here meanwhile, so the schedule goes on where it was.
    pub(crate) fn departure(&self) -> u64 {
        self.departure
    }

    /// What a send done elsewhere left: where its schedule ended and how
    /// many datagrams the kernel refused.
    pub(crate) fn sent_elsewhere(&mut self, departure: u64, enobufs: u64) {
        self.departure = departure;
        self.enobufs += enobufs;
    }

    fn clear(&mut self) {
        self.queue.clear();
    }
}

impl Default for TxBatch {
    fn default() -> Self {
        TxBatch::new()
    }
}

/// SO_TXTIME (Linux 4.19): departure times on sends, which the fq qdisc
/// honours. quinn-udp's `Transmit` has no field for one, so a paced run is
/// sent here with both control messages, UDP_SEGMENT and SCM_TXTIME.
#[cfg(target_os = "linux")]
mod txtime {
    use std::io;
    use std::os::fd::{AsFd, AsRawFd};

    /// asm-generic/socket.h (x86, arm, riscv); libc 0.2 does not have it.
    /// SCM_TXTIME has the same number.
    const SO_TXTIME: libc::c_int = 61;

    /// Asks for departure times on CLOCK_MONOTONIC, the clock std's
    /// Instant reads, without error reports. False if the kernel refuses.
    pub(super) fn enable(sock: &impl AsFd) -> bool {
        rustix::net::sockopt::set_txtime(
            sock,
            rustix::time::ClockId::Monotonic,
            rustix::net::TxTimeFlags::empty(),
        )
        .is_ok()
    }

    /// The kernel or the device will not take a departure time (or a GSO
    /// run with one): send without.
    pub(super) fn refused(e: &io::Error) -> bool {
        matches!(
            e.raw_os_error(),
            Some(libc::EINVAL | libc::EOPNOTSUPP | libc::ENOPROTOOPT | libc::EIO)
        )
    }

    /// One sendmsg on a connected socket: `contents` as one datagram, or
    /// cut into `segment_size` datagrams by the kernel (UDP GSO), to leave
    /// at `departure` nanoseconds.
    pub(super) fn send(
        sock: &impl AsFd,
        contents: &[u8],
        segment_size: Option<usize>,
        departure: u64,
    ) -> io::Result<()> {
        // Room for two control messages, u64-aligned as cmsghdr wants.
        let mut control = [0u64; 8];
        let mut iov = libc::iovec {
            iov_base: contents.as_ptr().cast_mut().cast(),
            iov_len: contents.len(),
        };
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        let gso = segment_size.and_then(|n| u16::try_from(n).ok());
        // SAFETY: CMSG_SPACE only computes a size.
        let space =
            unsafe { libc::CMSG_SPACE(8) + gso.map_or(0, |_| libc::CMSG_SPACE(2)) } as usize;
        debug_assert!(space <= std::mem::size_of_val(&control));
        msg.msg_controllen = space;
        // SAFETY: msg_control points at `control`, 64 zeroed bytes that
        // outlive this call, and msg_controllen says how many of them are
        // ours; CMSG_FIRSTHDR/CMSG_NXTHDR return headers inside that span
        // (non-null: it has room for both), CMSG_DATA points inside each,
        // and the writes are unaligned-safe and of the sizes CMSG_LEN
        // declared. sendmsg reads iov (which borrows `contents`) and the
        // control buffer only for the duration of the call.
        let rc = unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = SO_TXTIME;
            (*cmsg).cmsg_len = libc::CMSG_LEN(8) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u64>(), departure);
            if let Some(size) = gso {
                let cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
                (*cmsg).cmsg_level = libc::SOL_UDP;
                (*cmsg).cmsg_type = libc::UDP_SEGMENT;
                (*cmsg).cmsg_len = libc::CMSG_LEN(2) as _;
                std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), size);
            }
            libc::sendmsg(sock.as_fd().as_raw_fd(), &msg, 0)
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(not(target_os = "linux"))]
mod txtime {
    use std::io;
    use std::os::fd::AsFd;

    pub fn enable(_: &impl AsFd) -> bool {
        false
    }

    pub fn refused(_: &io::Error) -> bool {
        true
    }

    pub fn send(_: &impl AsFd, _: &[u8], _: Option<usize>, _: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// Now on CLOCK_MONOTONIC in nanoseconds, the clock departure times are on.
pub(crate) fn monotonic_nanos() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (now.tv_sec as u64).saturating_mul(1_000_000_000) + now.tv_nsec as u64
}

/// The MTU of the route to `peer` when `peer` is an address of this host
/// (loopback, or one of its own interfaces, which Linux routes over lo),
/// else `None`. On this host no router lies between the ends, so the
/// route's MTU is the path's, as kernel TCP assumes when it sizes its MSS
/// from the interface; elsewhere the path may be narrower than the first
/// link, and only path MTU discovery could say.
pub(crate) fn this_host_mtu(peer: SocketAddr) -> Option<u32> {
    let ip = peer.ip();
    // Binding to an address succeeds only if this host has it (unless
    // ip_nonlocal_bind is set, which the route MTU below then catches:
    // a real interface's MTU, not lo's).
    if !ip.is_loopback() && std::net::UdpSocket::bind((ip, 0)).is_err() {
        return None;
    }
    route_mtu(peer)
}

/// The MTU of the route to `peer` as this host's kernel knows it (the
/// first hop's, or a smaller one ICMP taught it): the largest IP packet
/// worth a path-MTU probe.
pub(crate) fn route_mtu(peer: SocketAddr) -> Option<u32> {
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

    /// What a test does when this host cannot run it, shared with the
    /// integration suites.
    #[allow(dead_code, unreachable_pub)]
    mod ci {
        include!("../../tests/common/ci.rs");
    }

    #[test]
    fn loopback_is_this_host_with_lo_mtu_and_a_documentation_address_is_not() {
        let lo = this_host_mtu("127.0.0.1:9".parse().unwrap());
        assert!(lo.is_some_and(|m| m >= 9000), "{lo:?}");
        // TEST-NET-3 (RFC 5737) is never assigned to a host.
        assert_eq!(this_host_mtu("203.0.113.7:9".parse().unwrap()), None);
    }

    /// The replay filter drops the hellos it names and nothing else: not
    /// another id's hello, not a datagram too short to hold an id, not a
    /// data packet whose bytes after its header happen to be that id.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_replay_filter_drops_exactly_the_hellos_it_names() {
        use crate::proto::crypto::handshake::hello_prefix;
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        let tx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = rx.local_addr().unwrap();
        let hello = |id: u64| {
            let mut d = hello_prefix().to_vec();
            d.extend_from_slice(&id.to_be_bytes());
            d.resize(1200, 0);
            d
        };
        let replayed = 0x0123_4567_89ab_cdef_u64;
        let mut data = hello(replayed);
        data[3] ^= 0xff;
        let sent: Vec<(Vec<u8>, bool)> = vec![
            (hello(replayed), false),
            (hello(replayed ^ 1), true),
            (hello(replayed ^ (1 << 40)), true),
            (hello(replayed)[..10].to_vec(), true),
            (data, true),
            (b"x".to_vec(), true),
        ];
        let receive = |rx: &std::net::UdpSocket| {
            let mut got = Vec::new();
            let mut buf = [0u8; 2048];
            while let Ok(n) = rx.recv(&mut buf) {
                got.push(buf[..n].to_vec());
            }
            got
        };
        hello_filter::attach(&rx, &[7, replayed, 9]).unwrap();
        for (d, _) in &sent {
            tx.send_to(d, to).unwrap();
        }
        let kept: Vec<Vec<u8>> = sent
            .iter()
            .filter(|(_, kept)| *kept)
            .map(|(d, _)| d.clone())
            .collect();
        assert_eq!(receive(&rx), kept);
        // An empty list takes the filter off; so does a list without it.
        hello_filter::attach(&rx, &[]).unwrap();
        hello_filter::attach(&rx, &[]).unwrap();
        tx.send_to(&hello(replayed), to).unwrap();
        assert_eq!(receive(&rx), vec![hello(replayed)]);
        hello_filter::attach(&rx, &[5]).unwrap();
        tx.send_to(&hello(replayed), to).unwrap();
        assert_eq!(receive(&rx), vec![hello(replayed)]);
    }

    /// A pull's sender is the far end's client, on the socket its punch
    /// left from (handed in by the bootstrap, not opened here): that
    /// socket is connected to the receiver exactly as a fresh one is, so
    /// the pull's data carries departure times (SO_TXTIME, which only
    /// `UdpIo::connect` turns on, with IP_RECVERR for the qdisc's drops)
    /// like a push's.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_socket_handed_in_is_connected_and_paced_as_a_fresh_one() {
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let peer = receiver.local_addr().unwrap();
        let unspecified: std::net::SocketAddr = (std::net::Ipv4Addr::UNSPECIFIED, 0).into();
        let tuning = crate::proto::Tuning::default();
        let (fresh, _) = crate::io::client_socket(None, unspecified, peer, &tuning)
            .await
            .unwrap();
        if !fresh.txtime() {
            ci::cannot_run(
                "a_socket_handed_in_is_connected_and_paced_as_a_fresh_one",
                "this kernel refused SO_TXTIME",
            );
            return;
        }
        let handed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let its_port = handed.local_addr().unwrap();
        let (io, _) = crate::io::client_socket(Some(handed), unspecified, peer, &tuning)
            .await
            .unwrap();
        assert_eq!(
            io.local_addr().unwrap(),
            its_port,
            "not the socket handed in"
        );
        assert!(
            io.txtime(),
            "the handed-in socket sends without departure times"
        );
        io.send(peer, b"through the connected socket", None)
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let (n, from) = receiver.recv_from(&mut buf).unwrap();
        assert_eq!(
            (&buf[..n], from),
            (&b"through the connected socket"[..], its_port)
        );
    }

    /// A sender connected to a plain receiver, both on loopback.
    async fn pair() -> (UdpIo, std::net::UdpSocket) {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let tx = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        tx.connect(rx.local_addr().unwrap()).await.unwrap();
        (tx, rx)
    }

    /// A socket on every address sends each answer from the source it
    /// is given, batched or sent from another thread: one to 127.0.0.2
    /// leaves from 127.0.0.2 (the kernel would pick 127.0.0.1); one whose
    /// source is not this host's (the kernel refuses it) leaves from the
    /// kernel's choice instead of being lost.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn answers_leave_from_the_source_asked_for_or_the_kernels_if_refused() {
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let to = rx.local_addr().unwrap();
        let tx = UdpIo::bind("0.0.0.0:0".parse().unwrap()).unwrap();
        let second = "127.0.0.2".parse::<IpAddr>().unwrap();
        assert_eq!(tx.answer_from(Some(second)), Some(second));
        assert_eq!(
            tx.answer_from(Some("255.255.255.255".parse().unwrap())),
            None
        );
        let not_ours = "192.0.2.1".parse::<IpAddr>().unwrap();
        let mut batch = TxBatch::new();
        for (i, src) in [Some(second), Some(not_ours), None].into_iter().enumerate() {
            assert!(batch.push_from_with(100, |b| {
                b[..100].fill(i as u8);
                Some((to, src, 100))
            }));
        }
        batch.flush(&tx, None).await.unwrap();
        let mut queue = TxQueue::default();
        queue.push(100, false, |b| {
            b[..100].fill(9);
            Some((to, Some(second), 100, None))
        });
        let (_, sent) = queue.send_blocking(&tx, None, &mut 0);
        sent.unwrap();
        let mut buf = [0u8; 200];
        let mut from = Vec::new();
        for _ in 0..4 {
            let (n, f) = rx.recv_from(&mut buf).expect("every datagram arrives");
            assert_eq!(n, 100);
            from.push((buf[0], f.ip()));
        }
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(
            from,
            [(0, second), (1, local), (2, local), (9, second)],
            "(datagram, source)"
        );
        // Bound to one address, the kernel's choice stands.
        let one = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        assert_eq!(one.answer_from(Some(second)), None);
    }

    /// An ICMP report (here port unreachable; behind a router, "too
    /// big") leaves an error pending on a connected socket, and the next
    /// send fails with it, sending nothing. The flush sends the run again:
    /// every datagram arrives, and the error still reaches the caller,
    /// whose error-queue drain reads the report. Before, the flush gave
    /// up the whole batch (behind a real router, the size probes every
    /// time: tests/pmtu.rs).
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_pending_icmp_error_fails_one_try_not_the_batch() {
        let (tx, rx) = pair().await;
        let to = rx.local_addr().unwrap();
        drop(rx);
        // Loopback's "port unreachable" comes back in a softirq, which a
        // loaded machine may run late (a fixed 50 ms wait failed once in
        // CI: the report came after the flush's first try), and the
        // kernel's global ICMP budget (`icmp_msgs_per_sec`) may drop it
        // while other tests spray closed ports: sent again until one
        // lands. The socket turns error-ready then; waiting so reads
        // nothing.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "no port unreachable from loopback in 10 s"
            );
            // A report that lands between a wait and this send fails the
            // send and is gone: send again, and wait for the next one.
            if let Err(e) = tx.send(to, b"to nobody", None).await {
                assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED), "{e}");
                continue;
            }
            let ready = tokio::time::timeout(
                std::time::Duration::from_millis(250),
                tx.sock.ready(tokio::io::Interest::ERROR),
            )
            .await;
            if let Ok(ready) = ready {
                ready.unwrap();
                break;
            }
        }
        let rx = std::net::UdpSocket::bind(to).unwrap();
        rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
            .unwrap();
        let mut batch = TxBatch::new();
        for i in 0..3u8 {
            assert!(batch.push_with(100, |b| {
                b[..100].fill(i);
                Some((to, 100))
            }));
        }
        let flushed = batch.flush(&tx, None).await;
        assert_eq!(
            flushed.map_err(|e| e.raw_os_error()),
            Err(Some(libc::ECONNREFUSED))
        );
        let mut buf = [0u8; 200];
        for i in 0..3u8 {
            let n = rx.recv(&mut buf).expect("a datagram of the batch");
            assert_eq!(&buf[..n], &[i; 100][..]);
        }
        assert_eq!(tx.drain_errors().count, 1);
    }

    /// The SO_TXTIME send builds both control messages right: Linux takes
    /// the socket option (4.19 on) and a GSO run with a departure time
    /// arrives as its datagrams, the last one short, in order.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "current_thread")]
    async fn a_paced_gso_run_with_a_departure_time_arrives_as_its_datagrams() {
        let (tx, rx) = pair().await;
        assert!(tx.txtime(), "this kernel refused SO_TXTIME");
        let to = rx.local_addr().unwrap();
        let run: Vec<u8> = (0..2500u32).map(|i| (i % 251) as u8).collect();
        tx.send_at(to, &run, Some(1000), monotonic_nanos())
            .await
            .unwrap();
        tx.send_at(to, b"one", None, monotonic_nanos() + 1_000)
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        for _ in 0..4 {
            let n = rx.recv(&mut buf).unwrap();
            got.push(buf[..n].to_vec());
        }
        let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
        assert_eq!(sizes, [1000, 1000, 500, 3]);
        assert_eq!(got[..3].concat(), run);
        assert!(tx.txtime(), "no send fell back");
    }

    /// Paced runs are scheduled back to back at the rate, and a burst that
    /// follows at once starts where the last one's schedule ended, but
    /// never more than the horizon ahead.
    #[tokio::test(flavor = "current_thread")]
    async fn paced_runs_leave_at_the_rate_within_the_horizon() {
        let (tx, rx) = pair().await;
        if !tx.txtime() {
            ci::cannot_run(
                "paced_runs_leave_at_the_rate_within_the_horizon",
                "this kernel refused SO_TXTIME",
            );
            return;
        }
        let to = rx.local_addr().unwrap();
        let mut batch = TxBatch::new();
        let fill = |batch: &mut TxBatch, n: usize| {
            for _ in 0..n {
                assert!(batch.push_with(1000, |b| {
                    b[..1000].fill(7);
                    Some((to, 1000))
                }));
            }
        };
        // 1 MB/s: a quarter millisecond is 250 bytes, so one datagram a
        // run, 1 ms apart; ten of them end 10 ms on.
        fill(&mut batch, 10);
        let start = monotonic_nanos();
        batch.flush(&tx, Some(1_000_000)).await.unwrap();
        let end = batch.departure;
        let spread = end.saturating_sub(start);
        assert!(
            (10_000_000..10_000_000 + 5_000_000).contains(&spread),
            "ten 1000-byte runs at 1 MB/s end {spread} ns on"
        );
        fill(&mut batch, 1);
        batch.flush(&tx, Some(1_000_000)).await.unwrap();
        let now = monotonic_nanos();
        assert!(
            batch.departure <= now + TXTIME_HORIZON_NS + 1_000_000,
            "the next burst waits at most the horizon"
        );
        // Unpaced: nothing scheduled.
        fill(&mut batch, 1);
        let before = batch.departure;
        batch.flush(&tx, None).await.unwrap();
        assert_eq!(batch.departure, before);
        let mut buf = [0u8; 2048];
        for _ in 0..12 {
            assert_eq!(rx.recv(&mut buf).unwrap(), 1000);
        }
    }

    /// A datagram prepared and not sealed never leaves in clear: a queue
    /// handed to another thread is sealed and sent there
    /// (`send_blocking`, outside the runtime), and a flush seals what was
    /// not sealed aside; both open at the peer, in order.
    #[tokio::test]
    async fn prepared_datagrams_leave_sealed_whether_sealed_here_or_aside() {
        use crate::proto::crypto::{frame, Cipher, Opener, Sealer, TrafficSecret};
        let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        receiver
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let peer = receiver.local_addr().unwrap();
        let io = UdpIo::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let secret = TrafficSecret::new([3; 32]);
        let mut sealer = Sealer::new(Cipher::Aes256Gcm, secret.clone());
        let mut opener = Opener::new(Cipher::Aes256Gcm, secret);
        let body = [0x5a_u8; 1000];
        let mut prepare = |b: &mut [u8]| {
            // An inner packet: a 12-byte header of this version, then a body.
            b[frame::PN_LEN..frame::PN_LEN + 2].copy_from_slice(&crate::proto::wire::MAGIC);
            b[frame::PN_LEN + 2] = crate::proto::wire::VERSION;
            b[frame::PN_LEN + 3] = 1;
            let inner = crate::proto::wire::HEADER_LEN + body.len();
            b[frame::PN_LEN + crate::proto::wire::HEADER_LEN..frame::PN_LEN + inner]
                .copy_from_slice(&body);
            let job = frame::prepare(&mut sealer, 7, b, inner).unwrap();
            Some((peer, job.len(), Some(job)))
        };
        let mut tx = TxBatch::new();
        assert!(tx.push_unsealed_with(2048, &mut prepare));
        assert_eq!(tx.queue().unsealed_bytes(), 1000 + 12 + 24);
        // Aside: the queue goes to another thread, which seals and sends
        // it outside the runtime.
        let mut aside = TxQueue::default();
        tx.swap_queue(&mut aside);
        assert!(tx.is_empty());
        let mut departure = 0;
        let (refused, sent) = std::thread::scope(|s| {
            s.spawn(|| aside.send_blocking(&io, None, &mut departure))
                .join()
                .unwrap()
        });
        assert_eq!((refused, sent.unwrap()), (0, ()));
        assert!(aside.is_empty());
        // Here: flush seals it.
        assert!(tx.push_unsealed_with(2048, &mut prepare));
        tx.flush(&io, None).await.unwrap();
        for pn in 0..2 {
            let mut buf = [0u8; 2048];
            let (n, _) = receiver.recv_from(&mut buf).unwrap();
            let d = &mut buf[..n];
            assert_eq!(frame::packet_number(d), pn);
            assert!(!d.windows(body.len()).any(|w| w == body), "sent in clear");
            let inner = frame::open(&mut opener, 9, d).expect("opens");
            assert_eq!(&d[inner][crate::proto::wire::HEADER_LEN..], &body[..]);
        }
    }
}

/// The socket filter of [`UdpIo::drop_hellos`].
#[cfg(target_os = "linux")]
mod hello_filter {
    use std::io;

    use socket2::{SockFilter, SockRef};

    use crate::proto::crypto::handshake::hello_prefix;

    /// A UDP socket's filter sees the datagram from its UDP header on.
    const PAYLOAD_AT: u32 = 8;
    /// Bytes a filter reads: the hello's prefix and its client id.
    const MATCHED_LEN: u32 = 4 + 8;
    const ACCEPT: u32 = u32::MAX;
    const DROP: u32 = 0;
    /// Hellos one program can hold: five instructions each, of 4,096.
    pub(super) const MAX_IDS: usize = 512;

    fn op(code: u32, jt: u8, jf: u8, k: u32) -> SockFilter {
        SockFilter::new(code as u16, jt, jf, k)
    }

    /// `ids` dropped, everything else kept. A datagram too short to hold
    /// a client id is kept before any load: a classic BPF load past the
    /// end would end the program with a drop.
    pub(super) fn program(ids: &[u64]) -> Vec<SockFilter> {
        use libc::{
            BPF_ABS, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_K, BPF_LD, BPF_LEN, BPF_MEM, BPF_RET, BPF_ST,
            BPF_W,
        };
        let prefix = u32::from_be_bytes(hello_prefix());
        let mut p = vec![
            op(BPF_LD | BPF_W | BPF_LEN, 0, 0, 0),
            op(BPF_JMP | BPF_JGE | BPF_K, 1, 0, PAYLOAD_AT + MATCHED_LEN),
            op(BPF_RET | BPF_K, 0, 0, ACCEPT),
            op(BPF_LD | BPF_W | BPF_ABS, 0, 0, PAYLOAD_AT),
            op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, prefix),
            op(BPF_RET | BPF_K, 0, 0, ACCEPT),
            op(BPF_LD | BPF_W | BPF_ABS, 0, 0, PAYLOAD_AT + 4),
            op(BPF_ST, 0, 0, 0),
            op(BPF_LD | BPF_W | BPF_ABS, 0, 0, PAYLOAD_AT + 8),
            op(BPF_ST, 0, 0, 1),
        ];
        for &id in ids.iter().take(MAX_IDS) {
            // Each id: its high word, then its low word; a miss goes on
            // to the next id's first instruction.
            p.push(op(BPF_LD | BPF_W | BPF_MEM, 0, 0, 0));
            p.push(op(BPF_JMP | BPF_JEQ | BPF_K, 0, 3, (id >> 32) as u32));
            p.push(op(BPF_LD | BPF_W | BPF_MEM, 0, 0, 1));
            p.push(op(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, id as u32));
            p.push(op(BPF_RET | BPF_K, 0, 0, DROP));
        }
        p.push(op(BPF_RET | BPF_K, 0, 0, ACCEPT));
        p
    }

    pub(super) fn attach(sock: &impl std::os::fd::AsFd, ids: &[u64]) -> io::Result<()> {
        let sock = SockRef::from(sock);
        if ids.is_empty() {
            return match sock.detach_filter() {
                // None attached.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
                r => r,
            };
        }
        sock.attach_filter(&program(ids))
    }
}

#[cfg(not(target_os = "linux"))]
mod hello_filter {
    pub fn attach(_: &impl std::os::fd::AsFd, _: &[u64]) -> std::io::Result<()> {
        Err(std::io::ErrorKind::Unsupported.into())
    }
}
