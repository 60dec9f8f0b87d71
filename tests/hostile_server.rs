//! The sender against a hostile server, in-process over loopback: the
//! server is the crate's own sans-IO `Server` driven by `io::serve`, with
//! an application that answers each request with bytes built by the
//! crate's own message encoders, chosen by the test. Whatever it answers,
//! `send` returns an error that names the host; it never panics.
//!
//! Also the sender against a local user racing the source tree: the real
//! receiver (`FileReceiver`), with a hook that changes the source while
//! its chunks are in flight.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use atou::internals::server::{Arrival, SessionEvent};
use atou::internals::transfer::dest::{ReceivePolicy, SymlinkPolicy, UserFlags};
use atou::internals::transfer::messages::{
    ChunkRef, DataHeader, FilePlan, Outcome, PlanReply, Request,
};
use atou::internals::transfer::receive::{FileReceiver, ReceiveConfig};
use atou::internals::transfer::send::{send, Progress, SendConfig, SendError, SendReport};
use atou::io::{self, ServeApp, ServeConfig, ServeEvent};
use atou::{Server, Tuning};
use common::TestDir;
use tokio::sync::Notify;

const MIB: u64 = 1 << 20;

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Runs `app` as a server on loopback until the returned guard drops.
struct Running {
    addr: SocketAddr,
    stop: Arc<Notify>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run_server<A: ServeApp + Send + 'static>(mut app: A) -> Running {
    let (tx, rx) = std::sync::mpsc::channel();
    let stop = Arc::new(Notify::new());
    let thread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let _ = rt.block_on(io::serve(
                ServeConfig::new("127.0.0.1:0".parse().unwrap())
                    .sndbuf(4 << 20)
                    .rcvbuf(4 << 20),
                &mut app,
                |e| {
                    if let ServeEvent::Listening { addr, .. } = e {
                        let _ = tx.send(addr);
                    }
                },
                async move { stop.notified().await },
            ));
        })
    };
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    Running {
        addr,
        stop,
        thread: Some(thread),
    }
}

fn config(peer: SocketAddr) -> SendConfig {
    SendConfig::new(peer)
        .host(format!("hostile-{peer}"))
        .tuning(Tuning {
            maxidle: Duration::from_secs(5),
            ..Tuning::default()
        })
}

fn send_one(src: &Path, peer: SocketAddr) -> Result<SendReport, SendError> {
    send(
        &[src.to_path_buf()],
        &config(peer),
        Arc::new(Progress::default()),
    )
}

/// A server that takes each request stream whole and answers it with
/// `answer(request)`.
struct Scripted {
    streams: HashMap<u64, BTreeMap<u64, Vec<u8>>>,
    answer: fn(&[u8]) -> Vec<u8>,
}

impl Scripted {
    fn new(answer: fn(&[u8]) -> Vec<u8>) -> Scripted {
        Scripted {
            streams: HashMap::new(),
            answer,
        }
    }
}

impl ServeApp for Scripted {
    fn on_arrival(&mut self, server: &mut Server, a: Arrival<'_>) {
        let segs = self.streams.entry(a.conn_id).or_default();
        segs.insert(a.offset, a.payload.to_vec());
        let mut end = 0;
        while let Some(s) = segs.get(&end) {
            end += s.len() as u64;
        }
        server.release(a.conn_id, end);
    }

    fn on_event(&mut self, server: &mut Server, e: SessionEvent) {
        if let SessionEvent::Complete { conn_id } = e {
            let segs = self.streams.remove(&conn_id).unwrap_or_default();
            let request: Vec<u8> = segs.into_values().flatten().collect();
            server.respond(conn_id, (self.answer)(&request));
        }
    }

    fn poll(&mut self, _: &mut Server) {}

    fn waker(&self) -> Option<Arc<Notify>> {
        None
    }
}

/// "Send everything" for a plan, `data` for a data stream, "done" for the
/// rest.
fn answer_with(request: &[u8], data: impl FnOnce(&DataHeader) -> Vec<u8>) -> Vec<u8> {
    match request.first() {
        Some(b'P') => {
            let Ok(Request::Plan(p)) = Request::decode(request) else {
                panic!("the sender's plan does not decode")
            };
            PlanReply::Accepted {
                plans: vec![FilePlan::SendAll; p.manifest.file_count()],
                deletions: None,
            }
            .encode()
        }
        Some(b'D') => {
            let (header, _) = DataHeader::parse(request).unwrap().unwrap();
            data(&header)
        }
        _ => Outcome::Done { bad: vec![] }.encode(),
    }
}

#[track_caller]
fn assert_bad_reply(result: Result<SendReport, SendError>, peer: SocketAddr, what: &str) {
    match result {
        Err(e @ SendError::BadReply { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&peer.to_string()), "{text}");
            assert!(text.contains(what), "{text}");
        }
        other => panic!("expected a bad reply naming {what:?}, got {other:?}"),
    }
}

/// The data stream's answer names chunk 0 of file 999 as bad: the sender
/// used to index its tables with it (`plan.sizes[c.file]`) and panic.
#[test]
fn a_server_naming_a_file_that_does_not_exist_cannot_panic_the_sender() {
    let tmp = TestDir::new("hostile-nofile");
    let src = tmp.path("f");
    fs::write(&src, pattern(3 * MIB, 1)).unwrap();
    let server = run_server(Scripted::new(|r| {
        answer_with(r, |_| {
            let bad = vec![ChunkRef {
                file: 999,
                chunk: 0,
            }];
            Outcome::Done { bad }.encode()
        })
    }));
    let result = send_one(&src, server.addr);
    assert_bad_reply(result, server.addr, "chunk 0 of file 999");
}

/// The answer names a chunk past the end of a real file, and one the
/// stream did not carry: both are refused as a bad reply, not resent.
#[test]
fn a_server_naming_chunks_the_stream_did_not_carry_is_refused() {
    let tmp = TestDir::new("hostile-nochunk");
    let src = tmp.path("f");
    fs::write(&src, pattern(3 * MIB, 2)).unwrap();
    let server = run_server(Scripted::new(|r| {
        answer_with(r, |_| {
            let bad = vec![ChunkRef {
                file: 0,
                chunk: 1 << 31,
            }];
            Outcome::Done { bad }.encode()
        })
    }));
    let result = send_one(&src, server.addr);
    assert_bad_reply(result, server.addr, "chunk 2147483648 of file 0");
}

/// A plan reply announced as far longer than a plan for one small file
/// can be: refused before anything is held for it.
#[test]
fn a_server_announcing_a_huge_plan_reply_is_refused() {
    let tmp = TestDir::new("hostile-hugeplan");
    let src = tmp.path("f");
    fs::write(&src, b"small").unwrap();
    let server = run_server(Scripted::new(|r| match r.first() {
        Some(b'P') => vec![0; 2 << 20],
        _ => Outcome::Done { bad: vec![] }.encode(),
    }));
    let err = send_one(&src, server.addr).unwrap_err().to_string();
    assert!(err.contains("announced a reply of 2097152 bytes"), "{err}");
}

// ---------------------------------------------------------------------------
// A local user racing the source tree
// ---------------------------------------------------------------------------

/// The real receiver, with `hook` run once, on the first bytes of the
/// first data stream: by then the sender has read at most two chunks
/// (its read-ahead budget, with `buffer` 0), and it reads the rest after
/// the hook has run, since it frees a chunk only when the receiver has
/// acknowledged it.
struct Racing {
    inner: FileReceiver,
    hook: Option<Box<dyn FnOnce() + Send>>,
}

impl ServeApp for Racing {
    fn on_arrival(&mut self, server: &mut Server, arrival: Arrival<'_>) {
        if arrival.offset == 0 && arrival.payload.first() == Some(&b'D') {
            if let Some(hook) = self.hook.take() {
                hook();
            }
        }
        self.inner.on_arrival(server, arrival);
    }

    fn on_event(&mut self, server: &mut Server, event: SessionEvent) {
        self.inner.on_event(server, event);
    }

    fn poll(&mut self, server: &mut Server) {
        self.inner.poll(server);
    }

    fn waker(&self) -> Option<Arc<Notify>> {
        self.inner.waker()
    }
}

fn racing_receiver(dest: &Path, hook: impl FnOnce() + Send + 'static) -> Running {
    let failures = Arc::new(Mutex::new(Vec::new()));
    let inner = FileReceiver::new(
        // The user's own directory, taking whatever arrives.
        ReceiveConfig::new(dest).policy(ReceivePolicy::user(
            UserFlags {
                overwrite: true,
                special_bits: true,
                symlinks: SymlinkPolicy::All,
                fsync: false,
                delete: false,
                owners: false,
                xattrs: false,
                acls: false,
            },
            None,
        )),
        move |e| failures.lock().unwrap().push(format!("{e:?}")),
    )
    .unwrap();
    run_server(Racing {
        inner,
        hook: Some(Box::new(hook)),
    })
}

/// A file rewritten in place (same size, other bytes, a new mtime) while
/// its chunks are being sent arrives torn; the run must fail, naming the
/// file, and never report it verified.
#[test]
fn a_file_rewritten_while_it_is_sent_is_never_reported_verified() {
    let tmp = TestDir::new("hostile-torn");
    let (src, dest) = (tmp.path("src"), tmp.path("dest"));
    fs::create_dir_all(&dest).unwrap();
    let size = 8 * MIB;
    fs::write(&src, pattern(size, 3)).unwrap();
    let victim = src.clone();
    let server = racing_receiver(&dest, move || {
        let f = fs::OpenOptions::new().write(true).open(&victim).unwrap();
        f.write_all_at(&pattern(size, 99), 0).unwrap();
        let later = SystemTime::now() + Duration::from_secs(3600);
        f.set_modified(later).unwrap();
    });
    let result = send_one(&src, server.addr);
    match result {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("changed while it was being sent"), "{text}");
            assert!(text.contains(&src.display().to_string()), "{text}");
        }
        Ok(r) => panic!(
            "a torn file was reported verified: {} bytes sent, verified {}",
            r.bytes_sent, r.verified
        ),
    }
}

/// The source path is swapped for a symlink to a file the sender may read
/// but did not list (a secret) after the walk and before the data is
/// read: the secret's bytes must not leave.
#[test]
fn a_source_swapped_for_a_symlink_after_the_walk_is_not_followed() {
    let tmp = TestDir::new("hostile-swap");
    let (tree, dest) = (tmp.path("tree"), tmp.path("dest"));
    fs::create_dir_all(tree.join("sub")).unwrap();
    fs::create_dir_all(&dest).unwrap();
    let size = 4 * MIB;
    let secret = tmp.path("secret");
    fs::write(&secret, pattern(size, 7)).unwrap();
    // Two files: the first data stream's first bytes (file 0) run the
    // hook before file 1 is opened (with `buffer` 0 and one reader, a
    // chunk of file 1 is read only once file 0's are acknowledged).
    fs::write(tree.join("sub/a"), pattern(size, 5)).unwrap();
    fs::write(tree.join("sub/b"), pattern(size - 1, 6)).unwrap();
    let (victim, target) = (tree.join("sub/b"), secret.clone());
    let server = racing_receiver(&dest, move || {
        fs::remove_file(&victim).unwrap();
        std::os::unix::fs::symlink(&target, &victim).unwrap();
    });
    let result = send_one(&tree, server.addr);
    let got = fs::read(dest.join("tree/sub/b")).unwrap_or_default();
    let secret = fs::read(&secret).unwrap();
    let leaked = (0..size as usize).step_by(MIB as usize).any(|at| {
        got.get(at..at + 4096)
            .is_some_and(|g| g == &secret[at..at + 4096])
    });
    assert!(!leaked, "the secret's bytes reached the receiver");
    let err = result.expect_err("a swapped source must fail the run");
    assert!(err.to_string().contains("sub/b"), "{err}");
}
