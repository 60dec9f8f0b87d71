//! `atou serve --metrics ADDR`: the server's counters in the Prometheus
//! text format (OpenMetrics 1.0, which Prometheus scrapes), on a tiny HTTP
//! endpoint of its own.
//!
//! Fed from what the server already counts: the server-wide
//! [`ServerStats`] each connection report carries, and the receiver's
//! transfer reports. Nothing here is read from the network but the
//! scraper's request line, and that is bounded (docs/security.md).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::proto::{ConnReport, ServerStats};
use crate::transfer::receive::ReceiveEvent;

/// Bytes of a scraper's request read before it is answered or dropped:
/// a GET line and a few headers; more is not a scraper's.
const MAX_REQUEST: usize = 8 * 1024;
/// How long one scraper may take to send its request and read the
/// answer, in all: the endpoint answers one at a time, so a slow one must
/// not hold it longer.
const SCRAPE_TIME: Duration = Duration::from_secs(2);

type Reason = [(&'static str, &'static str); 1];

/// What `atou serve --metrics` counts; shared by the serve loop, the
/// receiver's event callback and the endpoint's thread.
#[derive(Debug)]
pub(super) struct ServeMetrics {
    registry: Registry,
    transfers_done: Counter,
    transfers_failed: Counter,
    files_written: Counter,
    bytes_written: Counter,
    bytes_resumed: Counter,
    chunks_rejected: Counter,
    connections_ended: Family<Reason, Counter>,
    refusals: Family<Reason, Counter>,
    handshakes: Counter,
    hellos: Family<Reason, Counter>,
    datagrams: Counter,
    connection_seconds: Histogram,
    connection_bytes: Histogram,
    connection_resent_fraction: Histogram,
    /// The server-wide counters as last counted, so that each report adds
    /// only what moved since.
    last_server: Mutex<ServerStats>,
}

impl ServeMetrics {
    pub(super) fn new() -> ServeMetrics {
        let mut registry = Registry::with_prefix("atou_serve");
        let m = ServeMetrics {
            transfers_done: Counter::default(),
            transfers_failed: Counter::default(),
            files_written: Counter::default(),
            bytes_written: Counter::default(),
            bytes_resumed: Counter::default(),
            chunks_rejected: Counter::default(),
            connections_ended: Family::default(),
            refusals: Family::default(),
            handshakes: Counter::default(),
            hellos: Family::default(),
            datagrams: Counter::default(),
            // 10 ms to about 3 h.
            connection_seconds: Histogram::new(exponential_buckets(0.01, 4.0, 11)),
            // 1 KiB to 1 TiB.
            connection_bytes: Histogram::new(exponential_buckets(1024.0, 8.0, 11)),
            // Segments that arrived twice over all that arrived: the
            // receiver's view of loss (the sender's RTT and cwnd are the
            // sender's, in its --json summary).
            connection_resent_fraction: Histogram::new([
                0.0001, 0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
            ]),
            last_server: Mutex::new(ServerStats::default()),
            registry: Registry::default(),
        };
        registry.register(
            "transfers_done",
            "Transfers finished with every file verified",
            m.transfers_done.clone(),
        );
        registry.register(
            "transfers_failed",
            "Transfers refused or failed (the reason is in the serve log)",
            m.transfers_failed.clone(),
        );
        registry.register(
            "files_written",
            "Files received, verified and in place",
            m.files_written.clone(),
        );
        registry.register(
            "written_bytes",
            "Chunk bytes received, verified and written",
            m.bytes_written.clone(),
        );
        registry.register(
            "resumed_bytes",
            "Bytes already there from an earlier attempt and not sent again",
            m.bytes_resumed.clone(),
        );
        registry.register(
            "chunks_rejected",
            "Chunks that failed their check and were sent again",
            m.chunks_rejected.clone(),
        );
        registry.register(
            "connections_ended",
            "Connections ended, by how: closed by the client or idle",
            m.connections_ended.clone(),
        );
        registry.register(
            "refusals",
            "Hellos and packets refused, by reason",
            m.refusals.clone(),
        );
        registry.register(
            "handshakes",
            "Authenticated handshakes completed (sessions made)",
            m.handshakes.clone(),
        );
        registry.register(
            "hellos",
            "Hellos by what became of them: worked (public-key work done), rate_limited \
             (over --hellos-per-sec or its per-source budget), queue_full, replayed, \
             dropped_unread, cookie (answered with a cookie under load), answer_limited (a hello, \
             key query or size probe left unanswered: its address, not yet proved, had been sent \
             its share of answers that second)",
            m.hellos.clone(),
        );
        registry.register("datagrams", "Datagrams received", m.datagrams.clone());
        registry.register(
            "connection_seconds",
            "Duration of each ended connection",
            m.connection_seconds.clone(),
        );
        registry.register(
            "connection_bytes",
            "Bytes received on each ended connection",
            m.connection_bytes.clone(),
        );
        registry.register(
            "connection_resent_fraction",
            "Duplicate segments over segments received, per ended connection",
            m.connection_resent_fraction.clone(),
        );
        ServeMetrics { registry, ..m }
    }

    /// A connection ended: its own figures, and the server-wide counters
    /// it carries.
    pub(super) fn connection_ended(&self, r: &ConnReport) {
        let end = match r.end {
            crate::proto::ConnEnd::Closed => "closed",
            crate::proto::ConnEnd::Idle => "idle",
        };
        self.connections_ended.get_or_create(&[("end", end)]).inc();
        self.connection_seconds.observe(r.secs);
        self.connection_bytes.observe(r.stats.bytes as f64);
        if r.stats.segments > 0 {
            self.connection_resent_fraction
                .observe(r.stats.duplicates as f64 / r.stats.segments as f64);
        }
        self.server_counted(&r.server);
    }

    /// Adds what moved in the server-wide counters since they were last
    /// counted (they only grow).
    fn server_counted(&self, now: &ServerStats) {
        let mut last = self
            .last_server
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let moved = |now: u64, was: u64| now.saturating_sub(was);
        self.datagrams.inc_by(moved(now.datagrams, last.datagrams));
        self.handshakes
            .inc_by(moved(now.handshakes, last.handshakes));
        for (reason, n, was) in [
            ("undecodable", now.undecodable, last.undecodable),
            (
                "unknown_connection",
                now.unknown_connection,
                last.unknown_connection,
            ),
            ("unexpected", now.unexpected, last.unexpected),
            ("version", now.version_rejects, last.version_rejects),
            ("bad_hello", now.bad_hellos, last.bad_hellos),
            ("busy", now.busy_rejects, last.busy_rejects),
            ("key_refused", now.auth_refused, last.auth_refused),
            ("bad_handshake", now.bad_handshakes, last.bad_handshakes),
            ("plain_refused", now.plain_refused, last.plain_refused),
            ("crypto_dropped", now.crypto_dropped, last.crypto_dropped),
        ] {
            self.refusals
                .get_or_create(&[("reason", reason)])
                .inc_by(moved(n, was));
        }
        for (fate, n, was) in [
            ("worked", now.hellos_worked, last.hellos_worked),
            ("rate_limited", now.hellos_limited, last.hellos_limited),
            ("queue_full", now.hellos_queue_full, last.hellos_queue_full),
            ("replayed", now.hellos_seen, last.hellos_seen),
            (
                "dropped_unread",
                now.hellos_dropped_unread,
                last.hellos_dropped_unread,
            ),
            ("cookie", now.cookies_sent, last.cookies_sent),
            ("answer_limited", now.answers_limited, last.answers_limited),
        ] {
            self.hellos
                .get_or_create(&[("fate", fate)])
                .inc_by(moved(n, was));
        }
        *last = *now;
    }

    /// What the receiver told its operator.
    pub(super) fn receive_event(&self, event: &ReceiveEvent) {
        match event {
            ReceiveEvent::Done(r) => {
                self.transfers_done.inc();
                self.files_written.inc_by(r.files);
                self.bytes_written.inc_by(r.bytes_written);
                self.bytes_resumed.inc_by(r.bytes_resumed);
                self.chunks_rejected.inc_by(r.chunks_rejected);
            }
            ReceiveEvent::Failed { .. } => {
                self.transfers_failed.inc();
            }
            ReceiveEvent::Planned { .. } | ReceiveEvent::StagingCleaned { .. } => {}
        }
    }

    /// The text a scrape returns.
    fn text(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail; a metric that could not encode
        // would end the text early, which a scraper reports.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// Binds `addr` (so that a wrong address stops `atou serve` before it
/// listens for transfers) and answers scrapes on a thread of its own, one
/// at a time, for as long as the process runs.
pub(super) fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<ServeMetrics>,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("atou-metrics".into())
        .spawn(move || {
            // A scraper that fails or stalls is dropped; the next is
            // answered.
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &metrics);
            }
        })?;
    Ok(bound)
}

/// Reads one request (at most [`MAX_REQUEST`] bytes within
/// [`SCRAPE_TIME`]) and answers it: the metrics for `GET /metrics`, 404
/// for anything else.
fn answer(mut stream: TcpStream, metrics: &ServeMetrics) -> std::io::Result<()> {
    let deadline = Instant::now() + SCRAPE_TIME;
    let mut request = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    // Only the bytes a read added (and the three before them) are
    // searched for the blank line: a scraper sending a byte at a time does
    // not make each read scan the whole request again.
    let mut searched = 0;
    while !request[searched..].windows(4).any(|w| w == b"\r\n\r\n") {
        searched = request.len().saturating_sub(3);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || request.len() >= MAX_REQUEST {
            return Ok(());
        }
        stream.set_read_timeout(Some(left))?;
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&buf[..n.min(MAX_REQUEST - request.len())]);
    }
    let line = request.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut words = line.split(|&b| b == b' ');
    let (method, target) = (words.next(), words.next());
    let response = if method == Some(b"GET") && target == Some(b"/metrics") {
        let body = metrics.text();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; \
             charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
    };
    stream.set_write_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)),
    ))?;
    stream.write_all(response.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(request).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn get_metrics_answers_and_anything_else_is_404() {
        let m = Arc::new(ServeMetrics::new());
        let addr = serve_metrics("127.0.0.1:0".parse().unwrap(), m.clone()).unwrap();
        let ok = scrape(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("atou_serve_transfers_done_total 0\n"), "{ok}");
        assert!(ok.ends_with("# EOF\n"), "{ok}");
        for other in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"POST /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics/../x HTTP/1.1\r\n\r\n",
        ] {
            let r = scrape(addr, other);
            assert!(r.starts_with("HTTP/1.1 404 "), "{r}");
        }
    }

    #[test]
    fn an_oversized_request_is_dropped_unanswered_and_the_next_is_served() {
        let m = Arc::new(ServeMetrics::new());
        let addr = serve_metrics("127.0.0.1:0".parse().unwrap(), m).unwrap();
        let huge = vec![b'A'; 3 * MAX_REQUEST];
        let mut s = TcpStream::connect(addr).unwrap();
        // The endpoint may close while this is still writing.
        let _ = s.write_all(&huge);
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        assert_eq!(out, "");
        let ok = scrape(addr, b"GET /metrics HTTP/1.0\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    }

    #[test]
    fn server_counters_add_only_what_moved() {
        let m = ServeMetrics::new();
        let mut s = ServerStats {
            handshakes: 3,
            hellos_limited: 5,
            busy_rejects: 2,
            ..ServerStats::default()
        };
        m.server_counted(&s);
        s.handshakes = 4;
        m.server_counted(&s);
        let text = m.text();
        assert!(text.contains("atou_serve_handshakes_total 4\n"), "{text}");
        assert!(
            text.contains("atou_serve_hellos_total{fate=\"rate_limited\"} 5\n"),
            "{text}"
        );
        assert!(
            text.contains("atou_serve_refusals_total{reason=\"busy\"} 2\n"),
            "{text}"
        );
    }
}
