//! Datagrams over the ssh channel, for a copy whose UDP a firewall drops
//! (issue 29 point 5).
//!
//! The datagrams are atou's own, authenticated and encrypted end to end
//! by the Noise session that the bootstrap's pinned keys start: the two
//! relays here only carry them, and neither can read or forge one. Each
//! end of a copy runs one side:
//!
//! - the **client side**, where the UDP clients are (the sender: here in a
//!   push, the remote in a pull), binds one loopback socket per server
//!   port, which stands for that server; a datagram a client sends there
//!   becomes a frame, its flow numbered by the client's address;
//! - the **server side**, where the UDP server is, binds one loopback
//!   socket per flow, which stands for that client: it sends the flow's
//!   datagrams to the server and frames what the server answers.
//!
//! A frame is `[u16 flow][u8 server][u16 length][datagram]`, big-endian.
//! What comes off the channel is the other end's word, and the other end
//! may be hostile: a frame whose length, flow or server is out of range
//! ends the tunnel with an error, and the server side forwards only what
//! the server itself sends to a flow's socket.
//!
//! When the channel is full the relay waits on it and the kernel drops
//! what no longer fits a relay socket's buffer: the sender's congestion
//! control sees loss there, as at a bottleneck's queue.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

/// The line each end says before the frames start.
pub(crate) const SWITCH: &str = "ATOU-TUNNEL";
/// Largest datagram a frame carries: UDP's largest payload over IPv4.
pub(crate) const MAX_DATAGRAM: usize = 65_507;
/// Most flows (client sockets) one tunnel carries.
pub(crate) const MAX_FLOWS: usize = 256;
/// Bytes before a frame's datagram.
const HEADER_LEN: usize = 5;
/// How often a relay socket's reader looks whether the tunnel has ended.
const POLL: Duration = Duration::from_millis(100);

/// Writes one frame.
pub(crate) fn write_frame(
    out: &mut impl Write,
    flow: u16,
    server: u8,
    datagram: &[u8],
) -> io::Result<()> {
    let len = u16::try_from(datagram.len())
        .ok()
        .filter(|&l| usize::from(l) <= MAX_DATAGRAM)
        .ok_or_else(|| invalid(format!("a {}-byte datagram", datagram.len())))?;
    let mut header = [0u8; HEADER_LEN];
    header[..2].copy_from_slice(&flow.to_be_bytes());
    header[2] = server;
    header[3..].copy_from_slice(&len.to_be_bytes());
    out.write_all(&header)?;
    out.write_all(datagram)
}

/// One frame of the channel, its datagram in `buf` (at least
/// [`MAX_DATAGRAM`] long): `(flow, server, length)`, or `None` where the
/// channel ended between frames. `servers` is how many server ports the
/// tunnel has; a frame naming another, a flow at or past [`MAX_FLOWS`] or
/// a length past [`MAX_DATAGRAM`] is an error.
pub(crate) fn read_frame(
    input: &mut impl Read,
    buf: &mut [u8],
    servers: usize,
) -> io::Result<Option<(u16, u8, usize)>> {
    let mut header = [0u8; HEADER_LEN];
    match input.read(&mut header[..1])? {
        0 => return Ok(None),
        _ => input.read_exact(&mut header[1..])?,
    }
    let flow = u16::from_be_bytes([header[0], header[1]]);
    let server = header[2];
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    if usize::from(flow) >= MAX_FLOWS {
        return Err(invalid(format!("flow {flow} (at most {MAX_FLOWS})")));
    }
    if usize::from(server) >= servers {
        return Err(invalid(format!("server {server} of {servers}")));
    }
    if len > MAX_DATAGRAM || len > buf.len() {
        return Err(invalid(format!("a {len}-byte datagram")));
    }
    input.read_exact(&mut buf[..len])?;
    Ok(Some((flow, server, len)))
}

fn invalid(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the tunnel's other end sent {what}"),
    )
}

/// A loopback socket of `addr`'s family, to stand in for it.
fn loopback_like(addr: SocketAddr) -> io::Result<UdpSocket> {
    let sock = if addr.is_ipv4() {
        UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?
    } else {
        UdpSocket::bind((Ipv6Addr::LOCALHOST, 0))?
    };
    sock.set_read_timeout(Some(POLL))?;
    // A sender's burst (a GSO run of up to 64 datagrams) lands here at
    // once while the relay may be waiting on the channel: with the
    // default buffer (212,992 bytes) a push through the tunnel resent 1.3
    // to 2.3 % of its datagrams (scripts/bench-tunnel.sh), with this one
    // none. Asked for, not required: the kernel caps it at rmem_max.
    let sock_ref = socket2::SockRef::from(&sock);
    let _ = sock_ref.set_recv_buffer_size(RELAY_BUFFER);
    let _ = sock_ref.set_send_buffer_size(RELAY_BUFFER);
    Ok(sock)
}

/// Socket buffers a relay socket asks for.
const RELAY_BUFFER: usize = 4 << 20;

/// Where a server bound to `addr` is reached from this host: an
/// unspecified address (a socket on every interface) on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => (Ipv4Addr::LOCALHOST, addr.port()).into(),
        ip if ip.is_unspecified() => (Ipv6Addr::LOCALHOST, addr.port()).into(),
        _ => addr,
    }
}

/// Frames waiting for the channel's writer: past this many a relay waits,
/// as it waited on a full channel when it wrote itself.
const QUEUED_FRAMES: usize = 256;
/// Most bytes the writer puts in one write.
const BATCH_BYTES: usize = 256 << 10;

/// The writing half of the channel, shared by the relay sockets' readers:
/// they queue frames and one thread writes them, as many as are waiting in
/// one write, where a relay that wrote its own made two writes of the
/// pipe to ssh per datagram (a third-party copy `--via-local` of 512 MiB:
/// 8.88 s against 9.77 s median of 3, interleaved, on a loaded 2-core
/// host).
#[derive(Clone)]
struct Channel {
    frames: mpsc::SyncSender<Vec<u8>>,
}

impl Channel {
    /// Its writer ends, dropping `output` (which closes it), when every
    /// clone is dropped or a write fails.
    fn new(mut output: impl Write + Send + 'static) -> Channel {
        let (frames, queued) = mpsc::sync_channel::<Vec<u8>>(QUEUED_FRAMES);
        thread::spawn(move || {
            let mut batch = Vec::with_capacity(BATCH_BYTES + HEADER_LEN + MAX_DATAGRAM);
            while let Ok(frame) = queued.recv() {
                batch.clear();
                batch.extend_from_slice(&frame);
                while batch.len() < BATCH_BYTES {
                    let Ok(frame) = queued.try_recv() else { break };
                    batch.extend_from_slice(&frame);
                }
                if output
                    .write_all(&batch)
                    .and_then(|()| output.flush())
                    .is_err()
                {
                    return;
                }
            }
        });
        Channel { frames }
    }

    /// Queues one frame; an error once the writer has ended.
    fn send(&self, flow: u16, server: u8, datagram: &[u8]) -> io::Result<()> {
        let mut frame = Vec::with_capacity(HEADER_LEN + datagram.len());
        write_frame(&mut frame, flow, server, datagram)?;
        self.frames
            .send(frame)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the tunnel's channel closed"))
    }
}

/// A tunnel at work: its threads, and how it ended.
pub(crate) struct Tunnel {
    stop: Arc<AtomicBool>,
    /// Reads the channel; ends with it. Taken by [`Tunnel::join`].
    reader: Option<thread::JoinHandle<io::Result<()>>>,
}

impl Tunnel {
    /// Whether the channel has ended (see [`Tunnel::join`] for how).
    pub(crate) fn is_finished(&self) -> bool {
        self.reader
            .as_ref()
            .is_none_or(thread::JoinHandle::is_finished)
    }

    /// Waits for the channel to end (the other end closed it): `Ok` at a
    /// clean end, the error that ended it otherwise. The relay sockets'
    /// readers stop within [`POLL`].
    pub(crate) fn join(mut self) -> io::Result<()> {
        let reader = self.reader.take().expect("joined once");
        reader
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the tunnel's reader panicked")))
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The flows the client side has numbered: one per client and server.
#[derive(Default)]
struct Flows {
    by_pair: HashMap<(SocketAddr, u8), u16>,
    /// Each flow's client and server, by flow.
    pairs: Vec<(SocketAddr, u8)>,
}

impl Flows {
    /// The flow from `client` to `server`, numbered now if it is new;
    /// `None` once [`MAX_FLOWS`] are taken.
    fn of(&mut self, client: SocketAddr, server: u8) -> Option<u16> {
        if let Some(&flow) = self.by_pair.get(&(client, server)) {
            return Some(flow);
        }
        let flow = u16::try_from(self.pairs.len())
            .ok()
            .filter(|&f| usize::from(f) < MAX_FLOWS)?;
        self.by_pair.insert((client, server), flow);
        self.pairs.push((client, server));
        Some(flow)
    }
}

/// The side where the UDP clients are: one loopback socket per server
/// port, standing for that server.
pub(crate) struct ClientSide {
    relays: Vec<UdpSocket>,
}

impl ClientSide {
    /// Stand-ins for `servers` servers, of `family`'s address family.
    pub(crate) fn bind(servers: usize, family: SocketAddr) -> io::Result<ClientSide> {
        if servers == 0 || servers > usize::from(u8::MAX) + 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{servers} servers for a tunnel"),
            ));
        }
        let relays = (0..servers)
            .map(|_| loopback_like(family))
            .collect::<io::Result<Vec<_>>>()?;
        Ok(ClientSide { relays })
    }

    /// Where the clients send to reach each server, in server order.
    pub(crate) fn addrs(&self) -> io::Result<Vec<SocketAddr>> {
        self.relays.iter().map(UdpSocket::local_addr).collect()
    }

    /// Carries datagrams between the stand-ins and the channel
    /// (`input`, `output`) until the channel ends.
    pub(crate) fn run(
        self,
        mut input: impl Read + Send + 'static,
        output: impl Write + Send + 'static,
    ) -> io::Result<Tunnel> {
        let stop = Arc::new(AtomicBool::new(false));
        let channel = Channel::new(output);
        let flows = Arc::new(Mutex::new(Flows::default()));
        let servers = self.relays.len();
        let mut senders = Vec::with_capacity(servers);
        for (index, relay) in self.relays.into_iter().enumerate() {
            let server = u8::try_from(index).expect("at most 256 servers");
            senders.push(relay.try_clone()?);
            let (stop, channel, flows) = (stop.clone(), channel.clone(), flows.clone());
            thread::spawn(move || {
                let mut buf = vec![0u8; MAX_DATAGRAM];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((n, client)) = relay.recv_from(&mut buf) else {
                        continue;
                    };
                    // Only this host's own sockets are the clients.
                    if !client.ip().is_loopback() {
                        continue;
                    }
                    let flow = flows.lock().expect("tunnel flows lock").of(client, server);
                    let Some(flow) = flow else { continue };
                    if channel.send(flow, server, &buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
        let reader = thread::spawn(move || -> io::Result<()> {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            while let Some((flow, _, len)) = read_frame(&mut input, &mut buf, servers)? {
                let pair = flows
                    .lock()
                    .expect("tunnel flows lock")
                    .pairs
                    .get(usize::from(flow))
                    .copied();
                // A flow this side never numbered has nobody to go to; a
                // flow's answers leave from its own server's stand-in,
                // whatever the frame says.
                if let Some((client, server)) = pair {
                    let _ = senders[usize::from(server)].send_to(&buf[..len], client);
                }
            }
            Ok(())
        });
        Ok(Tunnel {
            stop,
            reader: Some(reader),
        })
    }
}

/// The side where the UDP server is: one loopback socket per flow,
/// standing for that flow's client.
pub(crate) struct ServerSide {
    servers: Vec<SocketAddr>,
}

impl ServerSide {
    /// For the servers bound at `servers`, in the order the client side
    /// numbers them.
    pub(crate) fn new(servers: Vec<SocketAddr>) -> ServerSide {
        ServerSide {
            servers: servers.into_iter().map(reachable).collect(),
        }
    }

    /// Carries datagrams between the channel (`input`, `output`) and the
    /// servers until the channel ends.
    pub(crate) fn run(
        self,
        mut input: impl Read + Send + 'static,
        output: impl Write + Send + 'static,
    ) -> io::Result<Tunnel> {
        let stop = Arc::new(AtomicBool::new(false));
        let channel = Channel::new(output);
        let servers = self.servers;
        let reader = {
            let stop = stop.clone();
            thread::spawn(move || -> io::Result<()> {
                // Each flow's stand-in, and the server it talks to.
                let mut flows: HashMap<u16, (UdpSocket, SocketAddr)> = HashMap::new();
                let mut buf = vec![0u8; MAX_DATAGRAM];
                while let Some((flow, server, len)) =
                    read_frame(&mut input, &mut buf, servers.len())?
                {
                    let (sock, to) = match flows.get(&flow) {
                        Some(known) => known,
                        None => {
                            let to = servers[usize::from(server)];
                            let sock = loopback_like(to)?;
                            let answers = sock.try_clone()?;
                            let (stop, channel) = (stop.clone(), channel.clone());
                            thread::spawn(move || {
                                let mut buf = vec![0u8; MAX_DATAGRAM];
                                while !stop.load(Ordering::Relaxed) {
                                    let Ok((n, from)) = answers.recv_from(&mut buf) else {
                                        continue;
                                    };
                                    // Only the server's answers go back.
                                    if from != to {
                                        continue;
                                    }
                                    if channel.send(flow, server, &buf[..n]).is_err() {
                                        return;
                                    }
                                }
                            });
                            flows.entry(flow).or_insert((sock, to))
                        }
                    };
                    let _ = sock.send_to(&buf[..len], *to);
                }
                Ok(())
            })
        };
        Ok(Tunnel {
            stop,
            reader: Some(reader),
        })
    }
}

/// Carries frames between two channels as they come, for a relay that is
/// neither end (a third-party copy `--via-local`, here between the source
/// and the destination): the source's frames go to the destination's
/// channel and the destination's back, their flows numbered by the
/// source's client side and answered by the destination's server side,
/// as if the two were joined. Each frame is checked as an end checks it
/// (flow, server below `servers` and length in range; one that is not
/// ends that direction), and none goes through a datagram socket here:
/// the stand-ins this replaced (a server side from the source, a client
/// side to the destination) cost two more system calls and a copy into
/// the kernel and out per datagram. Ends when the source's channel does;
/// the answers' direction, when the destination's does.
pub(crate) fn splice(
    source_in: impl Read + Send + 'static,
    source_out: impl Write + Send + 'static,
    dest_in: impl Read + Send + 'static,
    dest_out: impl Write + Send + 'static,
    servers: usize,
) -> Tunnel {
    fn carry(
        mut input: impl Read + Send + 'static,
        output: Channel,
        servers: usize,
    ) -> thread::JoinHandle<io::Result<()>> {
        thread::spawn(move || -> io::Result<()> {
            let mut buf = vec![0u8; MAX_DATAGRAM];
            while let Some((flow, server, len)) = read_frame(&mut input, &mut buf, servers)? {
                output.send(flow, server, &buf[..len])?;
            }
            Ok(())
        })
    }
    carry(dest_in, Channel::new(source_out), servers);
    Tunnel {
        stop: Arc::new(AtomicBool::new(false)),
        reader: Some(carry(source_in, Channel::new(dest_out), servers)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    /// A UDP server on loopback that answers each datagram with itself
    /// prefixed by `tag`.
    fn echo(tag: u8) -> SocketAddr {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = sock.local_addr().unwrap();
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                let mut answer = vec![tag];
                answer.extend_from_slice(&buf[..n]);
                let _ = sock.send_to(&answer, from);
            }
        });
        addr
    }

    /// Both sides over a socket pair standing for the ssh channel: the
    /// client side's stand-ins and the tunnels.
    fn tunnel(servers: Vec<SocketAddr>) -> (Vec<SocketAddr>, Tunnel, Tunnel, UnixStream) {
        let (here, there) = UnixStream::pair().unwrap();
        let client = ClientSide::bind(servers.len(), servers[0]).unwrap();
        let addrs = client.addrs().unwrap();
        let near = client
            .run(here.try_clone().unwrap(), here.try_clone().unwrap())
            .unwrap();
        let far = ServerSide::new(servers)
            .run(there.try_clone().unwrap(), there.try_clone().unwrap())
            .unwrap();
        (addrs, near, far, here)
    }

    fn ask(client: &UdpSocket, to: SocketAddr, what: &[u8]) -> (Vec<u8>, SocketAddr) {
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        client.send_to(what, to).unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) = client.recv_from(&mut buf).unwrap();
        (buf[..n].to_vec(), from)
    }

    #[test]
    fn frames_round_trip_and_out_of_range_ones_are_refused() {
        let mut wire = Vec::new();
        write_frame(&mut wire, 7, 1, b"datagram").unwrap();
        write_frame(&mut wire, 0, 0, b"").unwrap();
        let mut input = wire.as_slice();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        assert_eq!(
            read_frame(&mut input, &mut buf, 2).unwrap(),
            Some((7, 1, 8))
        );
        assert_eq!(&buf[..8], b"datagram");
        assert_eq!(
            read_frame(&mut input, &mut buf, 2).unwrap(),
            Some((0, 0, 0))
        );
        assert_eq!(read_frame(&mut input, &mut buf, 2).unwrap(), None);
        // A server the tunnel does not have, a flow past the limit, a
        // length past UDP's.
        for (flow, server, len) in [
            (0u16, 2u8, 0u16),
            (MAX_FLOWS as u16, 0, 0),
            (0, 0, u16::MAX),
        ] {
            let mut frame = flow.to_be_bytes().to_vec();
            frame.push(server);
            frame.extend_from_slice(&len.to_be_bytes());
            let err = read_frame(&mut frame.as_slice(), &mut buf, 2).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        }
        // Cut inside a frame: not a clean end.
        assert!(read_frame(&mut &wire[..6], &mut buf, 2).is_err());
        assert!(write_frame(&mut Vec::new(), 0, 0, &vec![0; MAX_DATAGRAM + 1]).is_err());
    }

    /// Two clients to each of two servers: each gets its own server's
    /// answers, from the stand-in it sent to.
    #[test]
    fn datagrams_cross_to_their_server_and_answers_come_back_to_their_client() {
        let servers = vec![echo(b'a'), echo(b'b')];
        let (stand_ins, _near, _far, _channel) = tunnel(servers);
        let clients: Vec<UdpSocket> = (0..2)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for round in 0..3u8 {
            for (c, client) in clients.iter().enumerate() {
                for (s, &to) in stand_ins.iter().enumerate() {
                    let what = [round, c as u8, s as u8];
                    let (answer, from) = ask(client, to, &what);
                    assert_eq!(from, to, "the answer comes from the stand-in");
                    assert_eq!(answer[0], b"ab"[s], "server {s}'s answer");
                    assert_eq!(&answer[1..], &what);
                }
            }
        }
    }

    /// A splice between two socket pairs with nobody behind them: the
    /// source's far end, the splice, and the destination's far end.
    fn lone_splice() -> (UnixStream, Tunnel, UnixStream) {
        let (source_far, source) = UnixStream::pair().unwrap();
        let (dest, dest_far) = UnixStream::pair().unwrap();
        let spliced = splice(
            source.try_clone().unwrap(),
            source,
            dest.try_clone().unwrap(),
            dest,
            1,
        );
        (source_far, spliced, dest_far)
    }

    /// A relay between the two (a third-party copy `--via-local`) carries
    /// the frames as they are: two clients reach their server through a
    /// client side, the splice and a server side, and the answers come
    /// back; a frame out of range from the source ends the splice with
    /// an error, and the source's clean end ends it cleanly.
    #[test]
    fn a_splice_joins_a_client_side_to_a_server_side_and_checks_each_frame() {
        let server = echo(b's');
        let (near, source) = UnixStream::pair().unwrap();
        let (dest, far) = UnixStream::pair().unwrap();
        let client = ClientSide::bind(1, server).unwrap();
        let stand_in = client.addrs().unwrap()[0];
        let _near = client
            .run(near.try_clone().unwrap(), near.try_clone().unwrap())
            .unwrap();
        let _far = ServerSide::new(vec![server])
            .run(far.try_clone().unwrap(), far.try_clone().unwrap())
            .unwrap();
        let spliced = splice(
            source.try_clone().unwrap(),
            source.try_clone().unwrap(),
            dest.try_clone().unwrap(),
            dest.try_clone().unwrap(),
            1,
        );
        let clients: Vec<UdpSocket> = (0..2)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        for round in 0..3u8 {
            for (c, client) in clients.iter().enumerate() {
                let what = [round, c as u8];
                let (answer, from) = ask(client, stand_in, &what);
                assert_eq!(from, stand_in);
                assert_eq!(answer, [b's', round, c as u8]);
            }
        }
        // The source's channel, as a hostile source would write it: a
        // frame naming a server the tunnel does not have.
        let (hostile, spliced_bad, _far) = lone_splice();
        write_frame(&mut &hostile, 0, 1, b"x").unwrap();
        let err = spliced_bad.join().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(!spliced.is_finished());
        // The source's channel closing between frames ends it cleanly.
        let (quiet, ended, _far) = lone_splice();
        drop(quiet);
        ended.join().unwrap();
    }

    /// What a stranger sends to a flow's socket on the server side is not
    /// carried back: only the server's answers are.
    #[test]
    fn the_server_side_forwards_only_the_servers_answers() {
        let server = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (stand_ins, _near, _far, _channel) = tunnel(vec![server.local_addr().unwrap()]);
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        client
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        client.send_to(b"hello", stand_ins[0]).unwrap();
        let mut buf = [0u8; 64];
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let (n, flow_socket) = server.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        stranger.send_to(b"forged", flow_socket).unwrap();
        assert!(
            client.recv_from(&mut buf).is_err(),
            "the stranger's datagram came through"
        );
        server.send_to(b"answer", flow_socket).unwrap();
        let (n, _) = client.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"answer");
    }

    /// A hostile frame ends the tunnel with an error; the other end
    /// closing the channel ends it cleanly.
    #[test]
    fn a_bad_frame_ends_the_tunnel_and_a_closed_channel_ends_it_cleanly() {
        let (here, there) = UnixStream::pair().unwrap();
        let side = ClientSide::bind(1, "127.0.0.1:1".parse().unwrap()).unwrap();
        let tunnel = side.run(here.try_clone().unwrap(), here).unwrap();
        let mut there_w = there.try_clone().unwrap();
        write_frame(&mut there_w, 0, 1, b"x").unwrap();
        let err = tunnel.join().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);

        let (here, there) = UnixStream::pair().unwrap();
        let side = ServerSide::new(vec!["127.0.0.1:1".parse().unwrap()]);
        let tunnel = side.run(here.try_clone().unwrap(), here).unwrap();
        drop(there);
        let started = Instant::now();
        tunnel.join().unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
