//! The sender's driver when its thread is not run for a while, as on a
//! loaded machine (a 2-core VM shared by a copy's readers, writers and the
//! other end's I/O thread): the ACKs that arrived meanwhile wait in its
//! socket, and so do its timers, both due. The ACKs answer the timers, so
//! they must be read first; fired first, the timers send a tail loss probe
//! or a retransmission timeout for data that was delivered in time (on
//! loopback a copy of 1 GiB fired dozens of such probes per stream).
//!
//! In-process over loopback: `io::serve` with the crate's own `Server`
//! against `io::connect`, whose thread another task holds (as a
//! descheduled thread is held) once data is in flight.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use atou::internals::server::{Arrival, SessionEvent};
use atou::io::{self, ProbeConfig, ServeApp, ServeConfig, ServeEvent, StreamFeed};
use atou::{Event, Observer, PatternSource, PayloadSource, Server, TimedEvent, Tuning};
use tokio::sync::Notify;

/// Longer than the retransmission timeout's floor (`min_rto`, 0.2 s), so
/// that every timer the sender had armed is due when its thread runs again.
const HELD: Duration = Duration::from_millis(400);

/// A server that keeps nothing: every byte is released as it comes.
struct Sink;

impl ServeApp for Sink {
    fn on_arrival(&mut self, server: &mut Server, a: Arrival<'_>) {
        server.release(a.conn_id, u64::MAX);
    }
    fn on_event(&mut self, server: &mut Server, event: SessionEvent) {
        if let SessionEvent::Complete { conn_id } = event {
            server.respond(conn_id, Vec::new());
        }
    }
    fn poll(&mut self, _: &mut Server) {}
    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// Runs [`Sink`] on loopback in a thread of its own until `stop`.
fn run_server(stop: Arc<Notify>) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _ = rt.block_on(io::serve(
            ServeConfig::new("127.0.0.1:0".parse().unwrap()),
            &mut Sink,
            |e| {
                if let ServeEvent::Listening { addr, .. } = e {
                    let _ = tx.send(addr);
                }
            },
            async move { stop.notified().await },
        ));
    });
    (rx.recv_timeout(Duration::from_secs(10)).unwrap(), thread)
}

/// Where the client's loop is, as its feed, its observer and the task
/// that holds its thread see it.
#[derive(Default)]
struct Hold {
    /// Stream bytes the sender has taken from the feed.
    sent: AtomicU64,
    /// Asked for, with data in flight: the next time the client's task
    /// waits, the thread is held.
    asked: AtomicBool,
    /// The hold is over.
    resumed: AtomicBool,
    /// Passes of the client's loop begun since the hold (its feed's
    /// refills).
    passes_since: AtomicU32,
    /// Probes and timeouts fired in the loop's first pass after the hold.
    fired_on_resuming: AtomicU32,
}

/// The pattern stream, whose feed asks for the hold once, with data in
/// flight.
struct HeldFeed {
    hold: Arc<Hold>,
    ask: Arc<Notify>,
}

impl PayloadSource for HeldFeed {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        PatternSource.read_at(offset, buf);
        let end = offset + buf.len() as u64;
        self.hold.sent.fetch_max(end, Relaxed);
    }
}

impl StreamFeed for HeldFeed {
    fn refill(&mut self, acked: u64) -> Result<Option<u64>, io::FeedError> {
        let hold = &self.hold;
        if hold.resumed.load(Relaxed) {
            hold.passes_since.fetch_add(1, Relaxed);
        }
        if !hold.asked.load(Relaxed) && acked >= 64 << 10 && hold.sent.load(Relaxed) > acked {
            hold.asked.store(true, Relaxed);
            self.ask.notify_one();
        }
        Ok(None)
    }
    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }
}

struct Fired(Arc<Hold>);

impl Observer for Fired {
    fn on_event(&mut self, event: &TimedEvent) {
        let timer = matches!(
            event.event,
            Event::LossProbe { .. } | Event::TimeoutRetransmit { .. }
        );
        let hold = &self.0;
        if timer && hold.resumed.load(Relaxed) && hold.passes_since.load(Relaxed) == 1 {
            hold.fired_on_resuming.fetch_add(1, Relaxed);
        }
    }
}

#[test]
fn acks_that_arrived_while_the_thread_was_held_are_read_before_its_timers_fire() {
    let stop = Arc::new(Notify::new());
    let (addr, server) = run_server(stop.clone());
    let hold = Arc::new(Hold::default());
    let ask = Arc::new(Notify::new());
    let config = ProbeConfig::new(addr)
        .tuning(Tuning {
            maxidle: Duration::from_secs(5),
            ..Tuning::default()
        })
        .bytes(Some(4 << 20));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Another task of the client's runtime that does not yield: it runs
    // when the client's task waits, and holds the thread meanwhile.
    rt.spawn({
        let (hold, ask) = (hold.clone(), ask.clone());
        async move {
            ask.notified().await;
            std::thread::sleep(HELD);
            hold.resumed.store(true, Relaxed);
        }
    });
    let mut feed = HeldFeed {
        hold: hold.clone(),
        ask,
    };
    let result = rt.block_on(io::connect(
        config,
        &mut feed,
        &mut Fired(hold.clone()),
        std::future::pending(),
    ));
    stop.notify_one();
    server.join().unwrap();
    assert!(result.outcome.is_ok(), "{:?}", result.outcome.err());
    assert!(
        hold.passes_since.load(Relaxed) > 0,
        "the thread was held with data in flight"
    );
    assert_eq!(
        hold.fired_on_resuming.load(Relaxed),
        0,
        "probes or timeouts fired for data whose ACKs were waiting in the socket"
    );
}
