//! The client's side of a connection: hello, the transfer, close.
//!
//! Driven like the [`Sender`] it wraps: feed [`Client::handle_datagram`] and
//! [`Client::handle_timeout`], drain [`Client::poll_transmit`],
//! [`Client::poll_event`] and [`Client::poll_trace`], sleep until
//! [`Client::poll_timeout`], and stop once [`Client::outcome`] is `Some`.
//!
//! The hello carries the protocol version, a connection id the caller chose
//! fresh, and the receiver-side tuning (`rcvsegs`, `rcvbuf`, `delack`, SACK);
//! the server answers with what it applied. The hello is repeated with
//! back-off until the welcome arrives or `maxidle` passes. When everything
//! sent is acknowledged the client sends a close, repeated the same way,
//! and finishes when the server acknowledges it with its counters.

use std::time::Duration;

use thiserror::Error;

use super::events::{TimedEvent, TraceRecord};
use super::payload::PayloadSource;
use super::receiver::ReceiverStats;
use super::sender::{Sender, SenderState};
use super::time::Time;
use super::tuning::{Tuning, TuningError};
use super::wire::{
    Close, Hello, Packet, ReceiverParams, RejectReason, WireError, CONTROL_MAX_LEN, VERSION,
};
use super::InputError;

/// First interval between hellos (and closes); doubled after each, up to
/// [`CONTROL_RETRY_MAX`].
const CONTROL_RETRY_FIRST: Duration = Duration::from_millis(250);
const CONTROL_RETRY_MAX: Duration = Duration::from_secs(2);
/// How long to wait for the close to be acknowledged when `maxidle` is 0.
const CLOSE_WAIT_DEFAULT: Duration = Duration::from_secs(10);

/// Where a connection was when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Hello,
    Transfer,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::Hello => "waiting for the server to answer the hello",
            Stage::Transfer => "during the transfer",
        })
    }
}

/// Why a connection failed. The I/O layer adds the peer's address.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConnError {
    #[error("no packet from the peer for {:.1} s (maxidle) {stage}", idle.as_secs_f64())]
    Idle { stage: Stage, idle: Duration },
    #[error(
        "the peer speaks atou protocol version {theirs}, this atou speaks version {VERSION}; \
         run the same atou release at both ends"
    )]
    VersionMismatch { theirs: u8 },
    #[error("the server refused the hello (mss or buffer sizes out of its range)")]
    Refused,
}

/// How a finished connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// The server's counters from its close acknowledgement; `None` when
    /// the close went unanswered (the data itself was all acknowledged).
    pub peer: Option<ReceiverStats>,
}

#[derive(Debug)]
enum State {
    Hello,
    Transfer,
    /// Everything acknowledged; waiting for the close acknowledgement.
    Closing {
        deadline: Time,
    },
    Done(Result<Closed, ConnError>),
}

/// Repeats a control packet with back-off.
#[derive(Debug, Clone, Copy)]
struct Retry {
    next: Time,
    interval: Duration,
}

impl Retry {
    fn now(now: Time) -> Retry {
        Retry {
            next: now,
            interval: CONTROL_RETRY_FIRST,
        }
    }

    fn due(&mut self, now: Time) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.interval;
        self.interval = (self.interval * 2).min(CONTROL_RETRY_MAX);
        true
    }
}

#[derive(Debug)]
pub struct Client {
    conn_id: u64,
    tuning: Tuning,
    stream_len: Option<u64>,
    state: State,
    started: Time,
    retry: Retry,
    sender: Option<Sender>,
    /// What the server applied, from its welcome.
    granted: Option<ReceiverParams>,
    trace: bool,
    /// Datagrams that did not decode or were not for this connection.
    bad_packets: u64,
}

impl Client {
    /// A client that will send `stream_len` bytes (or pattern data until
    /// `maxtime`/`maxpkts`) on connection `conn_id`, starting with a hello.
    pub fn new(
        tuning: &Tuning,
        conn_id: u64,
        stream_len: Option<u64>,
        now: Time,
    ) -> Result<Client, TuningError> {
        // Checks the tuning now rather than after the handshake.
        Sender::new(tuning, conn_id, stream_len, now)?;
        Ok(Client {
            conn_id,
            tuning: tuning.clone(),
            stream_len,
            state: State::Hello,
            started: now,
            retry: Retry::now(now),
            sender: None,
            granted: None,
            trace: false,
            bad_packets: 0,
        })
    }

    /// Records atou's packet trace (see [`Sender::enable_trace`]).
    pub fn enable_trace(&mut self) {
        self.trace = true;
        if let Some(s) = self.sender.as_mut() {
            s.enable_trace();
        }
    }

    /// The sender, once the server has answered.
    pub fn sender(&self) -> Option<&Sender> {
        self.sender.as_ref()
    }

    pub fn sender_mut(&mut self) -> Option<&mut Sender> {
        self.sender.as_mut()
    }

    /// The receiver settings the server applied.
    pub fn granted(&self) -> Option<ReceiverParams> {
        self.granted
    }

    pub fn bad_packets(&self) -> u64 {
        self.bad_packets
    }

    /// `Some` once the connection is over.
    pub fn outcome(&self) -> Option<&Result<Closed, ConnError>> {
        match &self.state {
            State::Done(r) => Some(r),
            _ => None,
        }
    }

    fn hello(&self) -> Hello {
        let t = &self.tuning;
        Hello {
            conn_id: self.conn_id,
            mss: t.mss,
            maxidle_ms: u32::try_from(t.maxidle.as_millis()).unwrap_or(u32::MAX),
            receiver: ReceiverParams {
                rcvsegs: t.rcvsegs,
                rcvbuf: t.rcvbuf,
                delack_us: u32::try_from(t.delack.as_micros()).unwrap_or(u32::MAX),
                sack: t.recovery.uses_sack(),
            },
        }
    }

    fn fail(&mut self, e: ConnError) {
        self.state = State::Done(Err(e));
    }

    /// Handles one datagram from the server.
    pub fn handle_datagram(&mut self, now: Time, datagram: &[u8]) -> Result<(), InputError> {
        let packet = match Packet::decode(datagram) {
            Ok(p) => p,
            Err(WireError::UnsupportedVersion(theirs)) if matches!(self.state, State::Hello) => {
                self.fail(ConnError::VersionMismatch { theirs });
                return Ok(());
            }
            Err(e) => {
                self.bad_packets += 1;
                return Err(e.into());
            }
        };
        let conn_id = match packet {
            Packet::Ack(a) => a.conn_id,
            Packet::Welcome(w) => w.conn_id,
            Packet::CloseAck(c) => c.conn_id,
            Packet::Reject(r) => r.conn_id,
            other => {
                self.bad_packets += 1;
                return Err(InputError::Unexpected(other.kind_name()));
            }
        };
        if conn_id != self.conn_id {
            self.bad_packets += 1;
            return Err(InputError::WrongConnection {
                expected: self.conn_id,
                got: conn_id,
            });
        }
        match (packet, &self.state) {
            (Packet::Reject(r), State::Hello) => self.fail(match r.reason {
                RejectReason::UnsupportedVersion => {
                    ConnError::VersionMismatch { theirs: r.version }
                }
                RejectReason::BadHello => ConnError::Refused,
            }),
            (Packet::Welcome(w), State::Hello) => {
                self.granted = Some(w.receiver);
                let mut tuning = self.tuning.clone();
                tuning.rcvsegs = w.receiver.rcvsegs.max(1);
                let mut sender = Sender::new(&tuning, self.conn_id, self.stream_len, now)
                    .expect("tuning was checked when the client was made");
                if self.trace {
                    sender.enable_trace();
                }
                self.sender = Some(sender);
                self.state = State::Transfer;
            }
            (Packet::Ack(ack), State::Transfer | State::Closing { .. }) => {
                let sender = self
                    .sender
                    .as_mut()
                    .expect("sender exists after the welcome");
                sender.handle_ack(now, &ack)?;
                self.after_sender(now);
            }
            (Packet::CloseAck(c), State::Closing { .. }) => {
                self.state = State::Done(Ok(Closed {
                    peer: Some(c.stats),
                }));
            }
            // Late copies of a welcome or an ACK, or a reject after the
            // welcome: harmless, ignored.
            _ => {}
        }
        Ok(())
    }

    fn after_sender(&mut self, now: Time) {
        let Some(sender) = self.sender.as_ref() else {
            return;
        };
        match (sender.state(), &self.state) {
            (SenderState::Finished, State::Transfer) => {
                let wait = if self.tuning.maxidle.is_zero() {
                    CLOSE_WAIT_DEFAULT
                } else {
                    self.tuning.maxidle
                };
                self.retry = Retry::now(now);
                self.state = State::Closing {
                    deadline: now + wait,
                };
            }
            (SenderState::Failed, State::Transfer) => {
                let idle = self.tuning.maxidle;
                self.fail(ConnError::Idle {
                    stage: Stage::Transfer,
                    idle,
                });
            }
            _ => {}
        }
    }

    pub fn handle_timeout(&mut self, now: Time) {
        match self.state {
            State::Hello => {
                let waited = now.saturating_since(self.started);
                if !self.tuning.maxidle.is_zero() && waited >= self.tuning.maxidle {
                    self.fail(ConnError::Idle {
                        stage: Stage::Hello,
                        idle: waited,
                    });
                }
            }
            State::Transfer => {
                if let Some(s) = self.sender.as_mut() {
                    s.handle_timeout(now);
                }
                self.after_sender(now);
            }
            State::Closing { deadline } if now >= deadline => {
                self.state = State::Done(Ok(Closed { peer: None }));
            }
            State::Closing { .. } | State::Done(_) => {}
        }
    }

    /// Writes the next datagram into `buf` (at least `mss` bytes).
    pub fn poll_transmit(
        &mut self,
        now: Time,
        buf: &mut [u8],
        source: &mut dyn PayloadSource,
    ) -> Option<usize> {
        debug_assert!(buf.len() >= CONTROL_MAX_LEN);
        match self.state {
            State::Hello if self.retry.due(now) => self.hello().emit(buf).ok(),
            State::Transfer => {
                let n = self.sender.as_mut()?.poll_transmit(now, buf, source);
                self.after_sender(now);
                n
            }
            State::Closing { .. } if self.retry.due(now) => {
                let s = self.sender.as_ref()?;
                Close {
                    conn_id: self.conn_id,
                    segments: s.stats().pkts_out,
                    bytes: s.good_bytes(),
                }
                .emit(buf)
                .ok()
            }
            _ => None,
        }
    }

    pub fn poll_timeout(&self) -> Option<Time> {
        match self.state {
            State::Hello => {
                let give_up =
                    (!self.tuning.maxidle.is_zero()).then(|| self.started + self.tuning.maxidle);
                [Some(self.retry.next), give_up].into_iter().flatten().min()
            }
            State::Transfer => self.sender.as_ref()?.poll_timeout(),
            State::Closing { deadline } => Some(self.retry.next.min(deadline)),
            State::Done(_) => None,
        }
    }

    pub fn poll_event(&mut self) -> Option<TimedEvent> {
        self.sender.as_mut()?.poll_event()
    }

    pub fn poll_trace(&mut self) -> Option<TraceRecord> {
        self.sender.as_mut()?.poll_trace()
    }
}
