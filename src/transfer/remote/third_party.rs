//! A third-party copy: `atou copy [USER@]A:PATH... [USER@]B:PATH` run on
//! a third host, here, which starts both ends over ssh and moves no data
//! itself (issue 30 point 1):
//!
//! 1. Here runs `atou __remote send-to` at A, which binds one UDP socket
//!    per stream in `--port` and answers with their ports and its
//!    one-time key `K_A`.
//! 2. Here runs `atou __remote receive --third-party` at B, started with
//!    step 1 (`--hello-stdin`: both log in at once), with `K_A` in its
//!    hello, the first line on its stdin once A answered: B's receiver
//!    takes that key and no other, with only the
//!    rights this user's flags give (no overwrite, delete, owners or
//!    attributes unless asked here, only the names asked for here). B
//!    answers with its port and its one-time key `K_B`.
//! 3. Here tells A, on A's stdin, where B is — the address *this* host
//!    resolved for B, B's word only picking among them — and `K_B`: A's
//!    send is pinned to `K_B`, and goes nowhere B chose.
//! 4. A sends to B over UDP. A's and B's messages reach here on their
//!    ssh channels. With `--via-local` A's datagrams go instead through
//!    A's ssh channel to here, and from here through B's channel to B
//!    (as `scp -3`), for an A that cannot reach B.
//!
//! Neither end trusts the other more than a pull's or a push's would: the
//! keys and the address came over the two ssh channels, which ssh has
//! authenticated, and the receiving end's policy is what this user said.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use super::{
    bind_and_answer, client_auth, failed, one_time_key, read_bootstrap_line, RemoteEnd,
    RemoteError, SshCommand, EXIT_GRACE,
};
use crate::proto::crypto::{ClientAuth, PublicKey, StaticKeypair};
use crate::transfer::bootstrap::{Hello, PortRange, SendRoute, SendTo};
use crate::transfer::send::{Bound, Progress};
use crate::transfer::tunnel;
use crate::util::text::escape;

/// What the source prints on stdout, before it exits, when no UDP of its
/// reached the destination or came back: the host running the copy then
/// goes through itself instead (as `--via-local`).
pub(crate) const UNREACHED: &str = "ATOU-UNREACHED";

/// What starts a line of the source's progress on its stdout
/// (`--progress-lines`): `ATOU-PROGRESS DONE TOTAL STAGE`, bytes.
pub(crate) const PROGRESS_LINE: &str = "ATOU-PROGRESS";

/// A [`PROGRESS_LINE`] line's bytes done, bytes in all and stage (the
/// source's word, escaped here); `None` for any other line.
fn progress_of(line: &str) -> Option<(u64, u64, String)> {
    let mut words = line
        .strip_prefix(PROGRESS_LINE)?
        .strip_prefix(' ')?
        .splitn(3, ' ');
    let done = words.next()?.parse().ok()?;
    let total = words.next()?.parse().ok()?;
    let stage = escape(words.next().unwrap_or_default().as_bytes());
    Some((done, total, stage))
}

/// A third-party copy whose two ends have answered.
pub(crate) struct ThirdParty {
    source: RemoteEnd,
    dest: RemoteEnd,
    /// Where the source sends: the destination's port, at the address of
    /// the destination host as this host resolved it.
    pub peer: SocketAddr,
    dest_key: PublicKey,
}

/// How a third-party copy ended, once its order was given.
pub(crate) struct ThirdPartyOutcome {
    /// The source's exit status (its send's: success once the destination
    /// verified every file); `None` if it could not be had.
    pub source: Option<ExitStatus>,
    /// The destination's.
    pub dest: Option<ExitStatus>,
    /// `"udp"` (A to B directly) or `"ssh"` (through here).
    pub route: &'static str,
    /// What the source printed on stdout after its answer (its `--json`
    /// report), unescaped: the caller checks it.
    pub said: Vec<String>,
    /// The source said [`UNREACHED`]: nothing it sent over UDP reached
    /// the destination, or nothing came back.
    pub unreached: bool,
}

impl ThirdParty {
    /// Runs both ends: the destination's hello carries the source's key,
    /// which it authorizes for this transfer only, so the destination
    /// answers after the source; but both ssh log-ins run at once (the
    /// destination's hello goes on its stdin once the source answered,
    /// `--hello-stdin`), so the copy waits for the slower log-in, not for
    /// both one after the other. Each end is `(TARGET, ARGS, PREAMBLE)`:
    /// PREAMBLE goes first on its stdin (after the destination's hello:
    /// what ARGS announce, a --files-from list, the names it starts).
    pub(crate) fn start(
        ssh: &SshCommand,
        source: (&str, &[String], &[u8]),
        dest: (&str, &[String], &[u8]),
    ) -> Result<ThirdParty, RemoteError> {
        // The source is a client of the destination, with a key of its
        // own; the key in its hello is this end's and is not used.
        let unused = Hello {
            key: one_time_key()?.public(),
        };
        let mut source_end = RemoteEnd::start(ssh, source.0, &unused, source.1)?;
        let mut dest_end = RemoteEnd::start_hello_later(ssh, dest.0, dest.1)?;
        source_end.say_first(source.2);
        // Dropped on an error, each end's ssh is ended with it.
        let from = source_end.bootstrap()?;
        dest_end.say_hello_first(&Hello { key: from.key }, dest.2);
        let to = dest_end.bootstrap()?;
        let peer = SocketAddr::new(dest_end.peer_ip(ssh, &to)?, to.ports[0]);
        Ok(ThirdParty {
            source: source_end,
            dest: dest_end,
            peer,
            dest_key: to.key,
        })
    }

    /// `[USER@]HOST` of the source and of the destination.
    pub(crate) fn targets(&self) -> (&str, &str) {
        (self.source.target(), self.dest.target())
    }

    /// Tells the source where to send and waits for it to end, then for
    /// the destination. `interrupted` (Ctrl-C here) ends both. The
    /// source's progress lines, as they come, go into `progress`.
    pub(crate) fn run(
        mut self,
        via_local: bool,
        interrupted: &AtomicBool,
        progress: &Progress,
    ) -> Result<ThirdPartyOutcome, RemoteError> {
        let key = self.dest_key;
        // Held until the source has ended: dropping one stops its relay.
        let mut tunnels = Vec::new();
        if via_local {
            let Some((from_dest, to_dest)) = self.dest.switch_to_tunnel()? else {
                return Err(failed(format!(
                    "atou on {} did not take the ssh tunnel (an older release?): run this atou \
                     release there, or copy without --via-local",
                    self.dest.host()
                )));
            };
            self.source.say(
                &SendTo {
                    route: SendRoute::Ssh,
                    key,
                }
                .encode(),
            )?;
            match self.source.lines.recv_timeout(EXIT_GRACE) {
                Ok(line) if line == tunnel::SWITCH => {}
                Ok(line) => {
                    return Err(failed(format!(
                        "{} said `{}` where the switch to the ssh tunnel expected {}: is atou \
                         there the same release?",
                        self.source.host(),
                        escape(line.as_bytes()),
                        tunnel::SWITCH
                    )))
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(failed(format!(
                        "atou on {} did not switch to the ssh tunnel in {:.0} s",
                        self.source.host(),
                        EXIT_GRACE.as_secs_f64()
                    )))
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(self.source.failure("before the switch to the ssh tunnel"))
                }
            }
            let frames = self
                .source
                .frames
                .recv_timeout(EXIT_GRACE)
                .map_err(|_| failed("ssh's stdout closed at the switch to the tunnel"))?;
            let to_source = self
                .source
                .stdin
                .take()
                .ok_or_else(|| failed("ssh's stdin is closed"))?;
            // The destination serves one port through its tunnel, the
            // source sends to one.
            tunnels.push(tunnel::splice(frames, to_source, from_dest, to_dest, 1));
        } else {
            self.source.say(
                &SendTo {
                    route: SendRoute::Udp(self.peer),
                    key,
                }
                .encode(),
            )?;
        }
        let mut printed = Vec::new();
        let mut take = |lines: &super::Lines| {
            for line in lines.try_iter() {
                match progress_of(&line) {
                    Some((done, total, stage)) => {
                        progress.total.store(total, Ordering::Relaxed);
                        progress.done.store(done.min(total), Ordering::Relaxed);
                        *progress.stage.lock().expect("progress lock") = stage;
                    }
                    None => printed.push(line),
                }
            }
        };
        let source = self.source.wait_for_exit_with(interrupted, &mut take);
        take(&self.source.lines);
        drop(tunnels);
        let (marks, said): (Vec<String>, Vec<String>) =
            printed.into_iter().partition(|l| l == UNREACHED);
        let sent = source.is_some_and(|s| s.success());
        let dest = if sent {
            // Its receiver served one transfer: it ends by itself once
            // that is over.
            self.dest.finish()
        } else {
            // The source said why; what the destination adds is noise,
            // and it is not waited for.
            self.dest.quiet();
            self.dest.stdin = None;
            self.dest.wait_for(Duration::from_millis(500))
        };
        Ok(ThirdPartyOutcome {
            source,
            dest,
            route: if via_local { "ssh" } else { "udp" },
            said,
            unreached: !sent && !marks.is_empty(),
        })
    }
}

/// The source end of a third-party copy, bound and answered, waiting to
/// be told where to send.
pub(crate) struct FarSendTo {
    socks: Vec<UdpSocket>,
    identity: StaticKeypair,
}

/// Where the source of a third-party copy was told to send.
pub(crate) enum Ordered {
    /// Straight to the destination over UDP, from these sockets.
    Udp(Vec<Bound>, ClientAuth),
    /// Through the ssh channel (`--via-local`): the caller stands in for
    /// the destination at this end of it.
    Ssh(ClientAuth),
}

impl FarSendTo {
    /// Binds and answers as a pull's source does, without a punch token
    /// (the destination is a server, reached without one).
    pub(crate) fn answer(
        ip: Option<IpAddr>,
        port: PortRange,
        streams: usize,
        sources: &[PathBuf],
    ) -> Result<FarSendTo, RemoteError> {
        let (socks, identity) = bind_and_answer(ip, port, streams, sources, None)?;
        Ok(FarSendTo { socks, identity })
    }

    /// Reads the order on `input` (one line, a byte at a time: what
    /// follows it, the tunnel's frames, stays there) and says where to
    /// send and with which pinned key. `None`: the input ended first.
    pub(crate) fn order(self, input: &mut impl Read) -> Result<Option<Ordered>, RemoteError> {
        let Some(line) = read_bootstrap_line(input, "the send-to order")? else {
            return Ok(None);
        };
        let order = SendTo::decode(&line).map_err(|e| failed(format!("the send-to order: {e}")))?;
        let auth = client_auth(self.identity, order.key);
        Ok(Some(match order.route {
            SendRoute::Ssh => Ordered::Ssh(auth),
            SendRoute::Udp(peer) => {
                let from = self
                    .socks
                    .into_iter()
                    .map(|socket| {
                        socket.set_nonblocking(true)?;
                        Ok(Bound { socket, peer })
                    })
                    .collect::<std::io::Result<Vec<_>>>()?;
                Ordered::Udp(from, auth)
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_progress_line_is_read_and_anything_else_is_the_sources_word() {
        assert_eq!(
            progress_of("ATOU-PROGRESS 1024 4096 sending"),
            Some((1024, 4096, "sending".to_string()))
        );
        assert_eq!(
            progress_of("ATOU-PROGRESS 0 0 "),
            Some((0, 0, String::new()))
        );
        // A stage that would drive the terminal arrives escaped.
        let (_, _, stage) = progress_of("ATOU-PROGRESS 1 2 \u{1b}[2Jgone").unwrap();
        assert!(!stage.contains('\u{1b}'), "{stage}");
        for other in [
            "ATOU-PROGRESS",
            "ATOU-PROGRESS 1",
            "ATOU-PROGRESS -1 2 x",
            "ATOU-PROGRESSX 1 2 x",
            "ATOU-PROGRESS 1 99999999999999999999999 x",
            "send   1.00 MiB  a.bin",
            UNREACHED,
        ] {
            assert_eq!(progress_of(other), None, "{other}");
        }
    }
}
