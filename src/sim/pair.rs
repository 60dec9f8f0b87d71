//! A [`Client`] and a [`Server`] wired back to back over two netem paths
//! in virtual time: the whole connection — hello, retry or Noise
//! handshake, data, close — as `atou send` to `atou serve` runs it, with
//! no socket, thread or clock.
//!
//! [`Simulation`](super::Simulation) drives a bare `Sender` and `Receiver`
//! and so never runs the handshake; a `Pair` runs the same paths with the
//! endpoints a real transfer uses, so a paper's scenario can be checked
//! through the handshake too, and atou's own tests can put a hostile path
//! (`Pair::run_tapped`) between two real endpoints and an application on
//! the server's sessions (`Pair::run_serving`).

use std::net::SocketAddr;
use std::time::Duration;

use crate::netem::{mix_seed, Netem, NetemSpec};
use crate::proto::crypto::{ClientAuth, HandshakeError, ServerAuth};
use crate::proto::endpoint::server::{Arrival, SessionEvent};
use crate::proto::tuning::TuningError;
use crate::proto::{Client, ConnError, Observer, PatternSource, Server, ServerLimits, Time};

use super::{RunEnd, SimConfig, Tagged};

/// The client's address, as the server sees it.
pub(crate) const CLIENT_ADDR: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)),
    40_000,
);

/// Receive buffer the server's "socket" was given and granted, bytes.
const SERVER_RCVBUF: u32 = 8 << 20;

/// Which way a datagram goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Dir {
    /// Client to server: the forward (`fwd`) path.
    ToServer,
    /// Server to client: the return (`rev`) path.
    ToClient,
}

/// What a tap does to one datagram as it enters its path: the datagrams
/// that go on instead (none: dropped), each with the source address the
/// server will see (ignored towards the client).
pub type TapFn<'a> = dyn FnMut(Time, Dir, Vec<u8>) -> Vec<(SocketAddr, Vec<u8>)> + 'a;

/// A [`TapFn`] also told each datagram's address on the client's side:
/// the client's own towards the server, the one the server sent it to
/// towards the client; so a test can check where the server answers
/// while it injects datagrams from other sources.
type AddressedTapFn<'a> =
    dyn FnMut(Time, Dir, SocketAddr, Vec<u8>) -> Vec<(SocketAddr, Vec<u8>)> + 'a;

/// The server's application in a run, as the transfer layer is to
/// `atou serve`'s driver (`io::ServeApp`): it hears of each session's
/// bytes and events and may answer through the server
/// ([`Server::release`], [`Server::respond`]); it may also ask to be
/// woken at a time of its own, as a driver's application is by its
/// other threads' work.
pub trait SessionApp {
    /// New bytes of a session's stream, as the server placed them.
    fn on_arrival(&mut self, _now: Time, _server: &mut Server, _arrival: Arrival<'_>) {}
    /// A session connection opened, completed its stream (answer it with
    /// [`Server::respond`]) or ended.
    fn on_event(&mut self, _now: Time, _server: &mut Server, _event: SessionEvent) {}
    /// When [`on_timeout`](Self::on_timeout) is next due, if ever.
    fn poll_timeout(&self) -> Option<Time> {
        None
    }
    /// The time [`poll_timeout`](Self::poll_timeout) gave has come.
    fn on_timeout(&mut self, _now: Time, _server: &mut Server) {}
}

/// No application: what a probe has, whose data the server only checks.
impl SessionApp for () {}

/// One run of a client and a server: a [`SimConfig`]'s run, through the
/// endpoints. Built with [`PairConfig::new`] and its setters.
#[derive(Debug, Clone)]
pub struct PairConfig {
    /// The tuning, the paths (`fwd` client → server, `rev` server →
    /// client), the bytes the client sends, the seed and the trace; the
    /// bare engines' own settings (invariant checks, a stall, an
    /// application's rate, path memory, their time limit) are not the
    /// endpoints' and are not read.
    pub(crate) run: SimConfig,
    pub(crate) limits: ServerLimits,
    /// What the server accepts.
    pub(crate) server_auth: ServerAuth,
    /// The client's keys; `None`: a plain hello.
    pub(crate) client_auth: Option<ClientAuth>,
    /// Stop after this much virtual time whatever happens.
    pub(crate) time_limit: Duration,
}

impl PairConfig {
    /// `run` with a plain client sending its bytes of pattern data to a
    /// plain server with the default [`ServerLimits`], for at most a day
    /// of virtual time.
    pub fn new(run: SimConfig) -> PairConfig {
        PairConfig {
            run,
            limits: ServerLimits::default(),
            server_auth: ServerAuth::plain(),
            client_auth: None,
            time_limit: Duration::from_secs(86_400),
        }
    }

    /// The same run with a Noise handshake and sealed packets.
    pub fn authenticated(mut self, server: ServerAuth, client: ClientAuth) -> PairConfig {
        self.server_auth = server;
        self.client_auth = Some(client);
        self
    }

    /// The server's budgets. Default: [`ServerLimits::default`].
    #[must_use]
    pub fn limits(mut self, limits: ServerLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Stop after this much virtual time whatever happens. Default: a day.
    #[must_use]
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = limit;
        self
    }
}

/// Why [`Pair::new`] could not set up the run.
#[derive(Debug, thiserror::Error)]
pub enum PairError {
    /// The client's tuning is inconsistent.
    #[error("bad tuning: {0}")]
    Tuning(#[from] TuningError),
    /// The server's keys could not be set up.
    #[error("bad keys: {0}")]
    Keys(#[from] HandshakeError),
    /// The client could not take its keys (its `mss` leaves no room once
    /// packets are protected).
    #[error("the client refused its keys: {0}")]
    Client(#[from] ConnError),
}

/// What happens next.
#[derive(Debug, Clone, Copy)]
enum Step {
    ToServer,
    ToClient,
    ClientTimer,
    ServerTimer,
    AppTimer,
}

/// How a run ended, and when.
#[derive(Debug)]
pub struct PairResult {
    /// How the run ended: the client's outcome, or the time limit.
    pub outcome: RunEnd,
    /// Virtual time when the run stopped.
    pub end: Time,
    /// From the first hello to the session's keys (authenticated runs).
    pub handshake: Option<Duration>,
}

/// A [`Client`] and a [`Server`] through the handshake and a connection,
/// over simulated paths in virtual time.
pub struct Pair {
    /// The client endpoint, to inspect or drive between runs.
    pub client: Client,
    /// The server endpoint, to inspect or drive between runs.
    pub server: Server,
    fwd: Netem<Tagged<SocketAddr>>,
    rev: Netem<Vec<u8>>,
    /// Every address the client's datagrams have come from (a tap may
    /// move it, as a NAT rebinding does): what the server sends to any of
    /// them reaches the client.
    client_addrs: Vec<SocketAddr>,
    now: Time,
    time_limit: Duration,
    buf: Vec<u8>,
    /// Datagrams the server addressed to someone other than the client.
    pub misaddressed: u64,
}

impl Pair {
    /// A client and a server as `config` describes them, both seeded from
    /// its seed, at virtual time zero; nothing sent yet.
    pub fn new(config: PairConfig) -> Result<Pair, PairError> {
        let run = config.run;
        let conn_id = mix_seed(run.seed, 0);
        let mut client = Client::new(&run.tuning, conn_id, run.bytes, Time::ZERO)?;
        if let Some(auth) = config.client_auth {
            // The hello's timestamp: any fixed wall clock will do, the
            // server has seen no earlier one.
            client = client.with_auth(auth, 1_000_000_000)?;
        }
        if run.trace {
            client.enable_trace();
        }
        // The server's ids, challenges and secrets from the run's seed.
        let mut server_seed = [0u8; 32];
        for (i, word) in server_seed.chunks_mut(8).enumerate() {
            word.copy_from_slice(&mix_seed(run.seed, 10 + i as u64).to_be_bytes());
        }
        let server = Server::new(config.limits, SERVER_RCVBUF, SERVER_RCVBUF)
            .with_seed(server_seed)
            .with_auth(config.server_auth)?;
        let mut pair = Pair::wired(client, CLIENT_ADDR, server, (run.fwd, run.rev), run.seed);
        pair.time_limit = config.time_limit;
        Ok(pair)
    }

    /// Runs until the client has an outcome, nothing is left to happen,
    /// or the time limit.
    pub fn run(&mut self, observer: &mut dyn Observer) -> PairResult {
        let from = self.client_addrs[0];
        let outcome = self.drive(
            observer,
            &mut |_, _, _, d| vec![(from, d)],
            &mut (),
            Self::client_end_or(|_| false),
        );
        self.result(outcome)
    }

    /// `client`, whose datagrams come from `client_addr`, and `server` as
    /// they are, over `fwd` and `rev`, from time zero, with no time limit.
    fn wired(
        client: Client,
        client_addr: SocketAddr,
        server: Server,
        (fwd, rev): (NetemSpec, NetemSpec),
        seed: u64,
    ) -> Pair {
        Pair {
            client,
            server,
            fwd: Netem::new(fwd, mix_seed(seed, 1)),
            rev: Netem::new(rev, mix_seed(seed, 2)),
            client_addrs: vec![client_addr],
            now: Time::ZERO,
            time_limit: Duration::MAX,
            buf: vec![0; 65_536],
            misaddressed: 0,
        }
    }

    fn result(&self, outcome: RunEnd) -> PairResult {
        PairResult {
            outcome,
            end: self.now,
            handshake: self.client.handshake_time(),
        }
    }

    /// How a run that stops at the client's end ends: as the client did,
    /// or `RunEnd::Finished` once `stop` says so after an event.
    fn client_end_or(mut stop: impl FnMut(&Pair) -> bool) -> impl FnMut(&Pair) -> Option<RunEnd> {
        move |pair| match pair.client.outcome() {
            Some(Ok(_)) => Some(RunEnd::Finished),
            Some(Err(_)) => Some(RunEnd::Failed),
            None => stop(pair).then_some(RunEnd::Finished),
        }
    }

    /// Takes one step after another, draining both endpoints after each,
    /// until `end` says how the run ended, nothing is left to happen, or
    /// the time limit.
    fn drive(
        &mut self,
        observer: &mut dyn Observer,
        tap: &mut AddressedTapFn<'_>,
        app: &mut dyn SessionApp,
        mut end: impl FnMut(&Pair) -> Option<RunEnd>,
    ) -> RunEnd {
        loop {
            self.pump(observer, tap, app);
            if let Some(outcome) = end(self) {
                return outcome;
            }
            let Some((next, step)) = self.next_step(app) else {
                return RunEnd::Stalled;
            };
            if next.saturating_since(Time::ZERO) > self.time_limit {
                return RunEnd::TimeLimit;
            }
            self.now = self.now.max(next);
            self.take(step, app);
        }
    }

    /// The earliest thing due; ties in the order of [`Step`].
    fn next_step(&self, app: &dyn SessionApp) -> Option<(Time, Step)> {
        [
            (self.fwd.next_release(), Step::ToServer),
            (self.rev.next_release(), Step::ToClient),
            (self.client.poll_timeout(), Step::ClientTimer),
            (self.server.poll_timeout(), Step::ServerTimer),
            (app.poll_timeout(), Step::AppTimer),
        ]
        .into_iter()
        .filter_map(|(at, step)| Some((at?, step)))
        .fold(None, |best: Option<(Time, Step)>, (at, step)| match best {
            Some((b, _)) if b <= at => best,
            _ => Some((at, step)),
        })
    }

    fn take(&mut self, step: Step, app: &mut dyn SessionApp) {
        let now = self.now;
        match step {
            Step::ToServer => {
                if let Some(Tagged {
                    tag: from,
                    bytes: mut d,
                }) = self.fwd.poll(now)
                {
                    if let Some(arrival) = self.server.handle_datagram(now, from, &mut d) {
                        app.on_arrival(now, &mut self.server, arrival);
                    }
                }
            }
            Step::ToClient => {
                if let Some(d) = self.rev.poll(now) {
                    // Undecodable or foreign datagrams are counted by the client.
                    let _ = self.client.handle_datagram(now, &d);
                }
            }
            Step::ClientTimer => self.client.handle_timeout(now),
            Step::ServerTimer => self.server.handle_timeout(now),
            Step::AppTimer => app.on_timeout(now, &mut self.server),
        }
    }

    /// Drains both endpoints at the current instant into their paths.
    fn pump(
        &mut self,
        observer: &mut dyn Observer,
        tap: &mut AddressedTapFn<'_>,
        app: &mut dyn SessionApp,
    ) {
        let now = self.now;
        let client_addr = self.client_addrs[0];
        while let Some(n) = self
            .client
            .poll_transmit(now, &mut self.buf, &mut PatternSource)
        {
            let d = self.buf[..n].to_vec();
            for (from, bytes) in tap(now, Dir::ToServer, client_addr, d) {
                if !self.client_addrs.contains(&from) {
                    self.client_addrs.push(from);
                }
                self.fwd.enqueue(now, Tagged { tag: from, bytes });
            }
        }
        // The public-key work a driver's worker thread would do.
        while let Some(work) = self.server.poll_handshake_work() {
            self.server.handshake_done(now, work.run());
        }
        loop {
            while let Some(event) = self.server.poll_session_event() {
                app.on_event(now, &mut self.server, event);
            }
            let Some(early) = self.server.poll_early_arrival() else {
                break;
            };
            app.on_arrival(now, &mut self.server, early.as_arrival());
        }
        while let Some((to, n)) = self.server.poll_transmit(now, &mut self.buf) {
            if !self.client_addrs.contains(&to) {
                self.misaddressed += 1;
                continue;
            }
            for (_, d) in tap(now, Dir::ToClient, to, self.buf[..n].to_vec()) {
                self.rev.enqueue(now, d);
            }
        }
        while let Some(e) = self.client.poll_event() {
            observer.on_event(&e);
        }
        while let Some(r) = self.client.poll_trace() {
            observer.on_trace(&r);
        }
    }
}

/// What atou's own tests drive a pair with beyond [`Pair::run`]: endpoints
/// built by hand, a start time and a time limit, a tap on the paths, a
/// condition to stop at and an application on the server's sessions.
#[cfg(any(feature = "internals", fuzzing))]
impl Pair {
    /// `client`, whose datagrams come from `client_addr`, and `server` as
    /// they are, over `fwd` and `rev`, from time zero, with no time limit.
    pub fn between(
        client: Client,
        client_addr: SocketAddr,
        server: Server,
        fwd: NetemSpec,
        rev: NetemSpec,
        seed: u64,
    ) -> Pair {
        Pair::wired(client, client_addr, server, (fwd, rev), seed)
    }

    /// The run starts at `now` instead of zero.
    pub fn starting_at(mut self, now: Time) -> Pair {
        self.now = now;
        self
    }

    /// Stops runs after `limit` of virtual time from zero.
    pub fn set_time_limit(&mut self, limit: Duration) {
        self.time_limit = limit;
    }

    /// Virtual time now.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Runs as [`run`](Self::run) does, every datagram going through `tap`
    /// before its path.
    pub fn run_tapped(&mut self, observer: &mut dyn Observer, tap: &mut TapFn<'_>) -> PairResult {
        let outcome = self.run_serving(observer, tap, &mut (), |_| false);
        self.result(outcome)
    }

    /// Runs as [`run_tapped`](Self::run_tapped) does, or until `stop` says
    /// so after an event (`RunEnd::Finished` then).
    pub fn run_until(
        &mut self,
        observer: &mut dyn Observer,
        tap: &mut TapFn<'_>,
        stop: impl FnMut(&Pair) -> bool,
    ) -> RunEnd {
        self.run_serving(observer, tap, &mut (), stop)
    }

    /// Runs as [`run_until`](Self::run_until) does, with `app` on the
    /// server's sessions.
    pub fn run_serving(
        &mut self,
        observer: &mut dyn Observer,
        tap: &mut TapFn<'_>,
        app: &mut dyn SessionApp,
        stop: impl FnMut(&Pair) -> bool,
    ) -> RunEnd {
        self.drive(
            observer,
            &mut |now, dir, _, d| tap(now, dir, d),
            app,
            Self::client_end_or(stop),
        )
    }

    /// Runs as [`run_serving`](Self::run_serving) does, `tap` told each
    /// datagram's address on the client's side. What the server sends to
    /// an address no datagram of the client came from is counted in
    /// [`misaddressed`](Self::misaddressed) before any tap, as in every run.
    pub fn run_addressed(
        &mut self,
        observer: &mut dyn Observer,
        tap: &mut AddressedTapFn<'_>,
        app: &mut dyn SessionApp,
        stop: impl FnMut(&Pair) -> bool,
    ) -> RunEnd {
        self.drive(observer, tap, app, Self::client_end_or(stop))
    }

    /// Runs as [`run_serving`](Self::run_serving) does, but past the
    /// client's end, until `stop` says so (`RunEnd::Finished` then):
    /// what the server does once the client is done (the last copies of
    /// a close, a lingering connection) happens too.
    pub fn run_past_client(
        &mut self,
        observer: &mut dyn Observer,
        tap: &mut TapFn<'_>,
        app: &mut dyn SessionApp,
        mut stop: impl FnMut(&Pair) -> bool,
    ) -> RunEnd {
        self.drive(
            observer,
            &mut |now, dir, _, d| tap(now, dir, d),
            app,
            |pair| stop(pair).then_some(RunEnd::Finished),
        )
    }
}
