//! A hostile peer against `atou serve --dir`: each test is an attack from
//! the receiver-safety review, made with the crate's own encoders (the
//! manifest, plan, data and finish messages, the wire packets), and checks
//! that it fails: nothing outside DEST changes, memory stays in budget, the
//! server stays up and answers others, the log says only what is true.
//!
//! The server is the binary under test; `ATOU_UNDER_TEST=/path/to/atou`
//! points the same attacks at another build (that is how each was seen to
//! succeed against ec3118b's receiver).

mod common;
mod netem_support;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use atou::internals::io::fresh_conn_id;
use atou::internals::payload::PayloadSource;
use atou::internals::transfer::hash::{chunk_cv, file_hash, part_digest, Cv, CHUNK_SIZE};
use atou::internals::transfer::manifest::{Entry, EntryKind, Manifest, RelPath};
use atou::internals::transfer::messages::{
    encode_abort, encode_finish, ChunkRange, DataHeader, FilePart, Options, Outcome, PlanReply,
    PlanRequest,
};
use atou::internals::wire::{
    DataFlags, DataHeader as WireHeader, DataSegment, Hello, ReceiverParams, DATA_HEADER_LEN,
};
use atou::io::{self, ProbeConfig, StreamFeed};
use atou::Tuning;
use common::TestDir;
use netem_support::{say, Daemon, ATOU};

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

fn atou_bin() -> String {
    std::env::var("ATOU_UNDER_TEST").unwrap_or_else(|_| ATOU.to_string())
}

/// A directory of the test's own holding DEST and a sibling OUTSIDE that
/// nothing may touch.
fn dest_and_outside(test: &str) -> TestDir {
    let dir = TestDir::new(&format!("adv-{test}"));
    dir.dir("dest");
    dir.dir("outside");
    dir
}

/// `atou serve --dir DEST` on a loopback port; its stdout lines kept.
struct Serve {
    process: Daemon,
    addr: SocketAddr,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Serve {
    fn start(dest: &Path, args: &[&str]) -> Serve {
        let mut child = Command::new(atou_bin())
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .args(["serve", "--bind", "127.0.0.1:0", "--dir"])
            .arg(dest)
            // These attacks speak the plain protocol: they test what the
            // receiver lets a sender do to DEST, which --no-auth leaves
            // to anyone (tests/auth.rs attacks the authenticated path).
            .arg("--no-auth")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou serve");
        let addr = netem_support::listening_addr(&mut child);
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = BufReader::new(child.stdout.take().unwrap());
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                say(&format!("  serve: {line}"));
                l.lock().unwrap().push(line);
            }
        });
        Serve {
            process: Daemon::new(child),
            addr,
            lines,
        }
    }

    fn pid(&mut self) -> u32 {
        self.process.child().id()
    }

    /// The server is still running.
    fn alive(&mut self) -> bool {
        self.process.child().try_wait().unwrap().is_none()
    }

    /// Resident memory, from /proc.
    fn rss_mib(&mut self) -> u64 {
        proc_status(self.pid(), "VmRSS:") / 1024
    }

    fn threads(&mut self) -> u64 {
        proc_status(self.pid(), "Threads:")
    }

    fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

fn proc_status(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A stream whose bytes are all in memory: what the hostile peer says.
struct Bytes(Vec<u8>);

impl PayloadSource for Bytes {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) {
        let at = offset as usize;
        buf.copy_from_slice(&self.0[at..at + buf.len()]);
    }
}

impl StreamFeed for Bytes {
    fn refill(&mut self, _acked: u64) -> Result<Option<u64>, io::FeedError> {
        Ok(None)
    }
    fn waker(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }
}

/// Sends `bytes` as one connection of `session` through the real transport
/// and returns the server's reply (or why there was none).
fn stream(to: SocketAddr, session: u64, bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    let tuning = Tuning {
        maxidle: Duration::from_secs(5),
        ..Tuning::default()
    };
    let config = ProbeConfig::new(to)
        .tuning(tuning)
        .bytes(Some(bytes.len() as u64))
        .session(session, 1 << 20);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut feed = Bytes(bytes);
    let r = rt.block_on(io::connect(
        config,
        &mut feed,
        &mut (),
        std::future::pending(),
    ));
    match r.outcome {
        Ok(closed) => closed.reply.ok_or_else(|| "no reply".to_string()),
        Err(e) => Err(e.to_string()),
    }
}

fn entry(path: &str, kind: EntryKind, mode: u32) -> Entry {
    Entry {
        path: RelPath::new(path.as_bytes().to_vec()).unwrap(),
        kind,
        mode,
        mtime_sec: 1_000_000_000,
        mtime_nsec: 0,
    }
}

fn plan(entries: Vec<Entry>, options: Options, parts: Vec<FilePart>) -> Vec<u8> {
    PlanRequest {
        options,
        subdir: None,
        manifest: Manifest { entries },
        parts,
        protect: Vec::new(),
        owners: None,
        xattrs: None,
        same: Vec::new(),
    }
    .encode()
}

/// Plans `entries`; the server's decision.
fn send_plan(s: &Serve, session: u64, entries: Vec<Entry>, options: Options) -> Result<(), String> {
    send_plan_in_part(s, session, entries, options, Vec::new())
}

/// Plans `entries`, sending only `parts` of some files (as a shard does).
fn send_plan_in_part(
    s: &Serve,
    session: u64,
    entries: Vec<Entry>,
    options: Options,
    parts: Vec<FilePart>,
) -> Result<(), String> {
    let sizes: Vec<u64> = entries
        .iter()
        .filter_map(|e| match e.kind {
            EntryKind::File { size } => Some(size),
            _ => None,
        })
        .collect();
    let reply = stream(s.addr, session, plan(entries, options, parts))?;
    match PlanReply::decode(&reply, &sizes, false) {
        Ok(PlanReply::Accepted { .. }) => Ok(()),
        Ok(PlanReply::Refused(why)) => Err(why),
        Ok(PlanReply::Busy { why, .. }) => Err(why),
        Err(_) => match Outcome::decode(&reply) {
            Ok(Outcome::Failed(why)) => Err(why),
            other => Err(format!("{other:?}")),
        },
    }
}

/// Sends the first chunk of `file`, `data`, in a data stream.
fn send_chunk(s: &Serve, session: u64, file: u32, size: u64, data: &[u8]) -> Result<(), String> {
    send_chunk_at(s, session, file, size, 0, data)
}

/// Sends chunk `chunk` of `file`, `data`, with its true value.
fn send_chunk_at(
    s: &Serve,
    session: u64,
    file: u32,
    size: u64,
    chunk: u64,
    data: &[u8],
) -> Result<(), String> {
    let mut bytes = DataHeader {
        ranges: vec![ChunkRange {
            file,
            first: chunk,
            count: 1,
        }],
    }
    .encode();
    bytes.extend_from_slice(data);
    bytes.extend_from_slice(&chunk_cv(size, chunk, data));
    match Outcome::decode(&stream(s.addr, session, bytes)?) {
        Ok(Outcome::Done { .. }) => Ok(()),
        Ok(Outcome::Failed(why) | Outcome::Refused(why) | Outcome::Mismatch(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

fn send_finish(s: &Serve, session: u64, hashes: &[Cv]) -> Result<(), String> {
    match Outcome::decode(&stream(s.addr, session, encode_finish(hashes))?) {
        Ok(Outcome::Done { .. }) => Ok(()),
        Ok(Outcome::Failed(why) | Outcome::Refused(why) | Outcome::Mismatch(why)) => Err(why),
        Err(e) => Err(e.to_string()),
    }
}

fn hash_of(data: &[u8]) -> Cv {
    let cvs: Vec<Cv> = if data.is_empty() {
        Vec::new()
    } else {
        vec![chunk_cv(data.len() as u64, 0, data)]
    };
    *file_hash(data.len() as u64, &cvs).unwrap().as_bytes()
}

fn session_id() -> u64 {
    fresh_conn_id() | 1
}

fn own(overwrite: bool) -> Options {
    Options {
        overwrite,
        ..Options::default()
    }
}

/// Walks `dir` (not following symlinks): every path with its mode, size
/// and content hash, to show nothing in it changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u32, u64, [u8; 32])> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let h = if m.is_file() {
            *blake3::hash(&std::fs::read(&p).unwrap()).as_bytes()
        } else {
            [0; 32]
        };
        out.push((p.clone(), m.mode(), m.len(), h));
        if m.is_dir() {
            out.extend(snapshot(&p));
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------
// Writes outside DEST
// ---------------------------------------------------------------------------

/// The review's first finding: a manifest symlink named like the partial
/// file of a file in the same manifest made the receiver truncate and
/// chmod 04777 a file outside DEST. Under every symlink policy, even the
/// one that creates every symlink as sent, nothing outside changes.
#[test]
fn a_symlink_named_like_a_partial_file_cannot_truncate_or_chmod_a_file_outside() {
    for policy in [&[][..], &["--symlinks", "all", "--allow-special-bits"][..]] {
        let scratch = dest_and_outside("partial-symlink");
        let victim = scratch.path("outside").join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let before = snapshot(&scratch.path("outside"));
        let s = Serve::start(&scratch.path("dest"), policy);
        let session = session_id();
        let entries = vec![
            entry(
                "x.atou-part",
                EntryKind::Symlink {
                    target: victim.as_os_str().as_encoded_bytes().to_vec(),
                },
                0o777,
            ),
            entry("x", EntryKind::File { size: 0 }, 0o4777),
        ];
        let planned = send_plan(&s, session, entries, own(true));
        let finished = planned
            .clone()
            .and_then(|()| send_finish(&s, session, &[hash_of(b"")]));
        say(&format!(
            "policy {policy:?}: plan {planned:?}, finish {finished:?}"
        ));
        assert_eq!(
            snapshot(&scratch.path("outside")),
            before,
            "outside DEST changed"
        );
        if finished.is_ok() {
            // Everything arrived as named, and nothing was followed.
            let x = std::fs::symlink_metadata(scratch.path("dest").join("x")).unwrap();
            assert!(x.is_file() && x.len() == 0);
            let link = std::fs::symlink_metadata(scratch.path("dest").join("x.atou-part")).unwrap();
            assert!(link.file_type().is_symlink());
        }
    }
}

/// A manifest directory swapped for a symlink to OUTSIDE after the plan
/// created it (a local user racing the receiver): the data and the finish
/// go nowhere outside, and the transfer fails naming the symlink.
#[test]
fn a_directory_swapped_for_a_symlink_mid_transfer_redirects_nothing() {
    let scratch = dest_and_outside("dir-swap");
    let s = Serve::start(&scratch.path("dest"), &[]);
    let session = session_id();
    let data = b"planted by a race".to_vec();
    let entries = vec![
        entry("d", EntryKind::Dir, 0o755),
        entry(
            "d/f",
            EntryKind::File {
                size: data.len() as u64,
            },
            0o644,
        ),
    ];
    send_plan(&s, session, entries, own(false)).expect("the plan is fine");
    let d = scratch.path("dest").join("d");
    std::fs::rename(&d, scratch.root().join("moved-away")).unwrap();
    symlink(scratch.path("outside"), &d).unwrap();
    let sent = send_chunk(&s, session, 0, data.len() as u64, &data);
    let finished = send_finish(&s, session, &[hash_of(&data)]);
    say(&format!("data {sent:?}, finish {finished:?}"));
    assert!(
        std::fs::read_dir(scratch.path("outside"))
            .unwrap()
            .next()
            .is_none(),
        "written through the swapped-in symlink"
    );
    let why = finished.expect_err("the finish cannot put d/f in place");
    assert!(why.contains("symlink"), "{why}");
}

/// Modes are the receiver's: setuid, setgid and sticky are cleared and the
/// server's umask applies, whatever the manifest says.
#[test]
fn setuid_setgid_and_sticky_bits_from_a_sender_are_cleared() {
    let scratch = dest_and_outside("modes");
    let s = Serve::start(&scratch.path("dest"), &[]);
    let session = session_id();
    let data = b"#!/bin/sh\necho owned\n".to_vec();
    let entries = vec![
        entry("bin", EntryKind::Dir, 0o3777),
        entry(
            "bin/sh",
            EntryKind::File {
                size: data.len() as u64,
            },
            0o6777,
        ),
    ];
    send_plan(&s, session, entries, own(false)).unwrap();
    send_chunk(&s, session, 0, data.len() as u64, &data).unwrap();
    send_finish(&s, session, &[hash_of(&data)]).unwrap();
    let mode = |p: &str| {
        std::fs::metadata(scratch.path("dest").join(p))
            .unwrap()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("bin/sh"), 0o755);
    assert_eq!(mode("bin"), 0o755);
}

/// `--overwrite` is a request: a server without `--allow-overwrite` says
/// no, names the option, and the file is untouched.
#[test]
fn a_sender_cannot_overwrite_unless_the_server_allows_it() {
    let scratch = dest_and_outside("overwrite");
    std::fs::write(scratch.path("dest").join("keep"), b"mine").unwrap();
    let s = Serve::start(&scratch.path("dest"), &[]);
    let why = send_plan(
        &s,
        session_id(),
        vec![entry("keep", EntryKind::File { size: 5 }, 0o644)],
        own(true),
    )
    .expect_err("refused");
    assert!(why.contains("--allow-overwrite"), "{why}");
    assert_eq!(
        std::fs::read(scratch.path("dest").join("keep")).unwrap(),
        b"mine"
    );
}

/// A symlink whose target leaves DEST is refused by a server for others
/// (rsync's --safe-links), before anything is written.
#[test]
fn a_symlink_leaving_dest_is_refused_by_default() {
    let scratch = dest_and_outside("unsafe-link");
    let s = Serve::start(&scratch.path("dest"), &[]);
    for target in ["/etc/passwd", "../outside", "a/../../x"] {
        let why = send_plan(
            &s,
            session_id(),
            vec![entry(
                "l",
                EntryKind::Symlink {
                    target: target.as_bytes().to_vec(),
                },
                0o777,
            )],
            own(false),
        )
        .expect_err("refused");
        assert!(why.contains("--symlinks all"), "{target}: {why}");
        assert!(std::fs::symlink_metadata(scratch.path("dest").join("l")).is_err());
    }
}

// ---------------------------------------------------------------------------
// "Verified" means verified
// ---------------------------------------------------------------------------

/// A single-chunk file used to take its final name as soon as its chunk
/// verified, before the finish compared the file's hash: whoever knew the
/// session id left their bytes in place while the finish failed.
#[test]
fn a_file_takes_its_final_name_only_after_its_hash_matches_at_the_finish() {
    let scratch = dest_and_outside("early-rename");
    let s = Serve::start(&scratch.path("dest"), &[]);
    let session = session_id();
    let data = b"not what the sender has".to_vec();
    let size = data.len() as u64;
    send_plan(
        &s,
        session,
        vec![entry("f", EntryKind::File { size }, 0o644)],
        own(false),
    )
    .unwrap();
    send_chunk(&s, session, 0, size, &data).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !scratch.path("dest").join("f").exists(),
        "in place before the finish"
    );
    // Told as a mismatch, not as a failure of the receiver: the sender's
    // exit status says "verify" (16), not "partial" (23).
    let reply = stream(s.addr, session, encode_finish(&[[7u8; 32]])).unwrap();
    match Outcome::decode(&reply) {
        Ok(Outcome::Mismatch(why)) => assert!(why.contains("BLAKE3"), "{why}"),
        other => panic!("expected a hash mismatch, got {other:?}"),
    }
    assert!(
        !scratch.path("dest").join("f").exists(),
        "in place after a failed finish"
    );
}

/// A hostile `--compress` sender, its frames made with the crate's own
/// encoders: a zstd chunk that expands past its raw length (64 MiB of a
/// byte in 2 KiB: a bomb), garbage, and a frame that comes out a byte
/// short are each named bad in the stream's answer and never written; a
/// frame that claims as many bytes as its chunk fails the session. The
/// file never appears in DEST; an honest frame of the same chunk, in a
/// session of its own, is written and verified.
#[test]
fn hostile_compressed_chunks_are_refused_and_nothing_reaches_dest() {
    use atou::internals::transfer::compress::{Encoding, FrameHeader};
    use atou::internals::transfer::messages::ChunkRef;
    let scratch = dest_and_outside("compress-hostile");
    let dest = scratch.path("dest");
    let s = Serve::start(&dest, &[]);
    let size = CHUNK_SIZE;
    let data: Vec<u8> = b"an honest line of text\n"
        .iter()
        .copied()
        .cycle()
        .take(size as usize)
        .collect();
    let compress = Options {
        compress: true,
        ..own(false)
    };
    let framed = |wire: &[u8], encoding, wire_len: u32| {
        let header = DataHeader {
            ranges: vec![ChunkRange {
                file: 0,
                first: 0,
                count: 1,
            }],
        };
        let frame = FrameHeader { encoding, wire_len }.encode();
        let mut bytes = header.encode_framed(&[frame]);
        bytes.extend_from_slice(wire);
        bytes.extend_from_slice(&chunk_cv(size, 0, &data));
        bytes
    };
    let session = session_id();
    let file = || vec![entry("f", EntryKind::File { size }, 0o644)];
    send_plan(&s, session, file(), compress).unwrap();
    let bomb = zstd::bulk::compress(&vec![b'a'; 64 << 20], 3).unwrap();
    let garbage: Vec<u8> = (0..3000u32).map(|i| (i * 7919 % 251) as u8).collect();
    let short = zstd::bulk::compress(&data[..data.len() - 1], 3).unwrap();
    for (wire, what) in [(bomb, "a bomb"), (garbage, "garbage"), (short, "short")] {
        let reply = stream(
            s.addr,
            session,
            framed(&wire, Encoding::Zstd, wire.len() as u32),
        );
        match Outcome::decode(&reply.unwrap()) {
            Ok(Outcome::Done { bad }) => {
                assert_eq!(bad, vec![ChunkRef { file: 0, chunk: 0 }], "{what}")
            }
            other => panic!("{what}: {other:?}"),
        }
        assert!(!dest.join("f").exists(), "{what}");
    }
    let claims_all = framed(&vec![0; size as usize], Encoding::Zstd, size as u32);
    let reply = stream(s.addr, session, claims_all).unwrap();
    match Outcome::decode(&reply) {
        Ok(Outcome::Failed(why)) => assert!(why.contains("not smaller"), "{why}"),
        other => panic!("a frame as long as its chunk: {other:?}"),
    }
    assert!(send_finish(&s, session, &[hash_of(&data)]).is_err());
    assert!(!dest.join("f").exists());

    let session = session_id();
    send_plan(&s, session, file(), compress).unwrap();
    let honest = zstd::bulk::compress(&data, 3).unwrap();
    let reply = stream(
        s.addr,
        session,
        framed(&honest, Encoding::Zstd, honest.len() as u32),
    );
    assert_eq!(
        Outcome::decode(&reply.unwrap()),
        Ok(Outcome::Done { bad: Vec::new() })
    );
    send_finish(&s, session, &[hash_of(&data)]).unwrap();
    assert_eq!(std::fs::read(dest.join("f")).unwrap(), data);
}

/// A session that sends part of a file (chunks 0..1 of 2, as a shard
/// does) may write only that part: a data stream carrying a chunk of the
/// other part is refused and nothing of it is written. Its own part,
/// verified and recorded at its finish, does not give the file its name;
/// only the session that brings the last part does, after checking the
/// rest on disk against the record.
#[test]
fn a_session_sending_part_of_a_file_writes_only_its_part_and_cannot_name_it_alone() {
    let scratch = dest_and_outside("parts");
    let s = Serve::start(&scratch.path("dest"), &[]);
    let size = CHUNK_SIZE + 10;
    let data: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
    let (head, tail) = data.split_at(CHUNK_SIZE as usize);
    let files = || vec![entry("f", EntryKind::File { size }, 0o644)];
    let part = |chunks| vec![FilePart { file: 0, chunks }];
    let staged_bytes = || -> u64 {
        std::fs::read_dir(scratch.path("dest").join(".atou-staging"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "part"))
            .map(|p| {
                std::fs::read(p)
                    .unwrap()
                    .iter()
                    .filter(|&&b| b != 0)
                    .count() as u64
            })
            .sum()
    };

    let first = session_id();
    send_plan_in_part(&s, first, files(), own(false), part(0..1)).unwrap();
    let why = send_chunk_at(&s, first, 0, size, 1, tail).unwrap_err();
    assert!(why.contains("outside the part"), "{why}");
    assert_eq!(staged_bytes(), 0, "a chunk of another part was written");

    let ours = session_id();
    send_plan_in_part(&s, ours, files(), own(false), part(0..1)).unwrap();
    send_chunk_at(&s, ours, 0, size, 0, head).unwrap();
    let digest = part_digest(size, 0, &[chunk_cv(size, 0, head)]);
    send_finish(&s, ours, &[digest]).unwrap();
    assert!(
        !scratch.path("dest").join("f").exists(),
        "one part of two took the file's name"
    );

    let last = session_id();
    send_plan_in_part(&s, last, files(), own(false), part(1..2)).unwrap();
    send_chunk_at(&s, last, 0, size, 1, tail).unwrap();
    let digest = part_digest(size, 1, &[chunk_cv(size, 1, tail)]);
    send_finish(&s, last, &[digest]).unwrap();
    assert_eq!(std::fs::read(scratch.path("dest").join("f")).unwrap(), data);
    assert_eq!(
        std::fs::read_dir(scratch.path("dest").join(".atou-staging"))
            .unwrap()
            .count(),
        0,
        "the partial file or the record of its parts was left behind"
    );
}

// ---------------------------------------------------------------------------
// Memory, threads, slots
// ---------------------------------------------------------------------------

fn hello(session: u64, conn_id: u64, mss: u32, rcvsegs: u32, rcvbuf: u32) -> Vec<u8> {
    let mut b = [0u8; 128];
    let n = Hello {
        conn_id,
        mss,
        maxidle_ms: 600_000,
        session,
        receiver: ReceiverParams {
            rcvsegs,
            rcvbuf,
            delack_us: 0,
            quickack: 0,
            sack: true,
        },
    }
    .emit(&mut b)
    .unwrap();
    b[..n].to_vec()
}

/// The address token a `--no-auth` server wants before it keeps anything
/// for a hello (its retry), as an attacker at a real address gets it.
fn token(sock: &UdpSocket, to: SocketAddr) -> Vec<u8> {
    sock.send_to(&hello(0, fresh_conn_id(), 1472, 64, 0), to)
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 256];
    let (n, _) = sock.recv_from(&mut b).expect("a retry");
    match atou::internals::wire::Packet::decode(&b[..n]) {
        Ok(atou::internals::wire::Packet::Retry(r)) => r.token.to_vec(),
        other => panic!("not a retry: {other:?}"),
    }
}

/// `hello` with the token after it.
fn with_token(hello: Vec<u8>, token: &[u8]) -> Vec<u8> {
    [hello, token.to_vec()].concat()
}

/// The next datagram on `sock` is a welcome: the attack's connection is
/// open (else the test would test nothing).
fn expect_welcome(sock: &UdpSocket) {
    let mut b = [0u8; 256];
    let (n, _) = sock.recv_from(&mut b).expect("a welcome");
    assert!(
        matches!(
            atou::internals::wire::Packet::decode(&b[..n]),
            Ok(atou::internals::wire::Packet::Welcome(_))
        ),
        "{:?}",
        atou::internals::wire::Packet::decode(&b[..n])
    );
}

fn segment(conn_id: u64, seg: u64, payload: &[u8], fin: bool) -> Vec<u8> {
    let header = WireHeader {
        conn_id,
        seg,
        timestamp: 0,
        flags: DataFlags {
            fin,
            retransmission: false,
        },
    };
    DataSegment { header, payload }.to_vec()
}

/// 12 KB of UDP used to take the server from 7 MB to 1 GB: a request
/// stream's first byte, then segments far out in a window of 2^20
/// segments, each zero-filling the request buffer up to it.
#[test]
fn far_offsets_in_a_request_stream_allocate_nothing() {
    let scratch = dest_and_outside("far-offsets");
    let mut s = Serve::start(&scratch.path("dest"), &[]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (mss, conn) = (1472u32, fresh_conn_id());
    let payload = u64::from(mss) - DATA_HEADER_LEN as u64;
    let t = token(&sock, s.addr);
    sock.send_to(
        &with_token(hello(session_id(), conn, mss, 1 << 20, 0), &t),
        s.addr,
    )
    .unwrap();
    expect_welcome(&sock);
    std::thread::sleep(Duration::from_millis(100));
    let before = s.rss_mib();
    let mut body = vec![0u8; payload as usize];
    body[0] = b'P';
    sock.send_to(&segment(conn, 0, &body, false), s.addr)
        .unwrap();
    for k in 1..=8u64 {
        let seg = k * ((255 << 20) / payload / 8);
        sock.send_to(&segment(conn, seg, &body, false), s.addr)
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = s.rss_mib();
    say(&format!("RSS {before} MiB -> {after} MiB"));
    assert!(s.alive(), "the server died");
    assert!(after < before + 64, "RSS {before} -> {after} MiB");
}

/// One segment per 1 MiB chunk across a huge asked-for window used to pin
/// a chunk buffer each (883 KB sent pinned 609 MB). The window is the
/// server's to grant, so memory stays within its budget.
#[test]
fn one_segment_per_chunk_across_a_huge_window_pins_no_more_than_the_budget() {
    let scratch = dest_and_outside("chunk-pin");
    let mut s = Serve::start(&scratch.path("dest"), &["--max-window", "16MiB"]);
    let session = session_id();
    let size = 900u64 << 20;
    send_plan(
        &s,
        session,
        vec![entry("big", EntryKind::File { size }, 0o644)],
        own(false),
    )
    .unwrap();
    let header = DataHeader {
        ranges: vec![ChunkRange {
            file: 0,
            first: 0,
            count: 900,
        }],
    }
    .encode();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (mss, conn) = (1472u32, fresh_conn_id());
    let payload = u64::from(mss) - DATA_HEADER_LEN as u64;
    let t = token(&sock, s.addr);
    sock.send_to(
        &with_token(hello(session, conn, mss, 1 << 20, 0), &t),
        s.addr,
    )
    .unwrap();
    expect_welcome(&sock);
    std::thread::sleep(Duration::from_millis(100));
    let before = s.rss_mib();
    let mut first = vec![0u8; payload as usize];
    first[..header.len()].copy_from_slice(&header);
    sock.send_to(&segment(conn, 0, &first, false), s.addr)
        .unwrap();
    let stride = (1 << 20) + 32;
    for chunk in 1..900u64 {
        let seg = (header.len() as u64 + chunk * stride) / payload;
        sock.send_to(&segment(conn, seg, &first, false), s.addr)
            .unwrap();
        if chunk % 64 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = s.rss_mib();
    say(&format!("RSS {before} MiB -> {after} MiB"));
    assert!(s.alive());
    assert!(after < before + 64, "RSS {before} -> {after} MiB");
}

/// 4096 hellos (168 KB) used to hold every connection slot for 600 s and
/// lock out everyone. Now one address (a real one, which got its address
/// token) gets its share, hellos that send nothing expire in seconds, a
/// full server says "busy", and the refusals do not flood the log.
#[test]
fn a_flood_of_hellos_from_one_address_does_not_lock_out_another() {
    let scratch = dest_and_outside("hello-flood");
    let mut s = Serve::start(&scratch.path("dest"), &["--json"]);
    let flood = UdpSocket::bind("127.0.0.2:0").unwrap();
    let t = token(&flood, s.addr);
    for _ in 0..4096 {
        flood
            .send_to(
                &with_token(hello(session_id(), fresh_conn_id(), 1472, 1 << 20, 0), &t),
                s.addr,
            )
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    // A real sender from another address.
    let src = scratch.root().join("src");
    std::fs::write(&src, b"hello").unwrap();
    let t0 = Instant::now();
    let out = Command::new(atou_bin())
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["send", "--quiet", "--no-auth", "--maxidle", "5"])
        .arg(&src)
        .arg(s.addr.to_string())
        .output()
        .unwrap();
    say(&format!(
        "send after the flood: {} in {:.2} s: {}",
        out.status,
        t0.elapsed().as_secs_f64(),
        String::from_utf8_lossy(&out.stderr).trim()
    ));
    assert!(out.status.success(), "locked out by the flood");
    assert!(s.alive());
    let notices = s.output().matches("notice").count();
    assert!(notices < 100, "{notices} notices for one flood");
    // The flood's connections expire in seconds, not 600 s.
    std::thread::sleep(Duration::from_secs(11));
    let one = UdpSocket::bind("127.0.0.2:0").unwrap();
    let t = token(&one, s.addr);
    one.send_to(
        &with_token(hello(session_id(), fresh_conn_id(), 1472, 64, 0), &t),
        s.addr,
    )
    .unwrap();
    one.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 256];
    let (n, _) = one.recv_from(&mut b).expect("an answer");
    let welcomed = matches!(
        atou::internals::wire::Packet::decode(&b[..n]),
        Ok(atou::internals::wire::Packet::Welcome(_))
    );
    assert!(welcomed, "the flood's slots were not given back");
}

/// A hello asking for a 2 GiB socket buffer no longer grows the server's
/// (as root, SO_RCVBUFFORCE would grant it).
#[test]
fn a_hello_cannot_grow_the_servers_socket_buffer() {
    let scratch = dest_and_outside("rcvbuf");
    let s = Serve::start(&scratch.path("dest"), &["--rcvbuf", "1MiB"]);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let t = token(&sock, s.addr);
    sock.send_to(
        &with_token(hello(0, fresh_conn_id(), 1472, 64, 2 << 30), &t),
        s.addr,
    )
    .unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = [0u8; 256];
    let (n, _) = sock.recv_from(&mut b).unwrap();
    match atou::internals::wire::Packet::decode(&b[..n]).unwrap() {
        atou::internals::wire::Packet::Welcome(w) => {
            assert!(
                w.receiver.rcvbuf < 64 << 20,
                "granted {}",
                w.receiver.rcvbuf
            )
        }
        other => panic!("{other:?}"),
    }
}

/// Plans used to get a thread each; now a fixed pool with a bounded queue
/// answers "busy", and the thread count stays put.
#[test]
fn many_plans_at_once_get_a_bounded_pool_not_a_thread_each() {
    let scratch = dest_and_outside("plans");
    let mut s = Serve::start(&scratch.path("dest"), &["--max-sessions-per-ip", "1000"]);
    let base = s.threads();
    let addr = s.addr;
    let handles: Vec<_> = (0..48)
        .map(|i| {
            std::thread::spawn(move || {
                let entries = (0..2000)
                    .map(|k| entry(&format!("p{i}-{k}"), EntryKind::File { size: 1 }, 0o644))
                    .collect();
                let bytes = plan(entries, own(false), Vec::new());
                stream(addr, session_id(), bytes).is_ok()
            })
        })
        .collect();
    let mut peak = base;
    while handles.iter().any(|h| !h.is_finished()) {
        peak = peak.max(s.threads());
        std::thread::sleep(Duration::from_millis(5));
    }
    for h in handles {
        let _ = h.join();
    }
    say(&format!("threads: {base} before, peak {peak}"));
    assert!(s.alive());
    assert!(peak <= base + 2, "threads grew from {base} to {peak}");
}

/// A manifest of more entries than the server plans for is refused before
/// anything is created, naming the option.
#[test]
fn a_manifest_over_the_servers_entry_budget_is_refused() {
    let scratch = dest_and_outside("max-files");
    let s = Serve::start(&scratch.path("dest"), &["--max-files", "5"]);
    let entries = (0..10)
        .map(|k| entry(&format!("d{k}"), EntryKind::Dir, 0o755))
        .collect();
    let why = send_plan(&s, session_id(), entries, own(false)).expect_err("refused");
    assert!(why.contains("--max-files"), "{why}");
    assert!(!scratch.path("dest").join("d0").exists());
}

// ---------------------------------------------------------------------------
// The log
// ---------------------------------------------------------------------------

/// An abort's text reached the server's log raw: a forged "every file
/// verified" line and terminal escapes. It is escaped now.
#[test]
fn an_abort_text_cannot_forge_a_log_line_or_drive_the_terminal() {
    let scratch = dest_and_outside("log");
    let s = Serve::start(&scratch.path("dest"), &[]);
    let session = session_id();
    send_plan(
        &s,
        session,
        vec![entry("a", EntryKind::Dir, 0o755)],
        own(false),
    )
    .unwrap();
    let forged = "x\n127.0.0.1:1 transfer 00 into /srv: 1 files; every file verified\x1b[2J";
    let _ = stream(s.addr, session, encode_abort(forged));
    std::thread::sleep(Duration::from_millis(300));
    let out = s.output();
    assert!(out.contains("gave up"), "{out}");
    assert!(!out.contains('\x1b'), "an escape reached the log: {out:?}");
    assert!(
        !out.lines().any(|l| l.starts_with("127.0.0.1:1 transfer")),
        "a forged line: {out}"
    );
}

// ---------------------------------------------------------------------------
// A remote panic, driven sans-IO: the server and the file receiver fed
// datagrams directly, so the order of events is the test's to choose.
// ---------------------------------------------------------------------------

mod sans_io {
    use super::*;

    use atou::internals::transfer::dest::ReceivePolicy;
    use atou::internals::transfer::receive::{
        FileReceiver, ReceiveConfig, ReceiveEvent, ReceiveLimits,
    };
    use atou::io::ServeApp;
    use atou::{Server, ServerLimits, Time};

    const MSS: u32 = 1472;

    struct Rig {
        server: Server,
        app: FileReceiver,
        now: Time,
        events: Arc<Mutex<Vec<ReceiveEvent>>>,
    }

    impl Rig {
        fn new(dest: &Path) -> Rig {
            let events = Arc::new(Mutex::new(Vec::new()));
            let e = events.clone();
            let app = FileReceiver::new(
                ReceiveConfig::new(dest)
                    .writers(2)
                    .policy(ReceivePolicy::server())
                    .limits(ReceiveLimits::default()),
                move |ev| e.lock().unwrap().push(ev),
            )
            .unwrap();
            Rig {
                // The receiver is under test, not address validation:
                // plain hellos open connections without a token.
                server: Server::new(
                    ServerLimits::default().unvalidated_plain(64),
                    1 << 20,
                    1 << 20,
                ),
                app,
                now: Time::ZERO,
                events,
            }
        }

        fn deliver(&mut self, from: SocketAddr, d: &[u8]) {
            if let Some(a) = self.server.handle_datagram(self.now, from, &mut d.to_vec()) {
                self.app.on_arrival(&mut self.server, a);
            }
            self.events_in();
        }

        fn events_in(&mut self) {
            while let Some(e) = self.server.poll_session_event() {
                self.app.on_event(&mut self.server, e);
            }
            let mut out = vec![0u8; 4096];
            while self.server.poll_transmit(self.now, &mut out).is_some() {}
        }

        /// Lets the writer and planner threads finish and takes in their work.
        fn settle(&mut self) {
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(2));
                self.app.poll(&mut self.server);
                self.events_in();
            }
        }

        fn stream(&mut self, from: SocketAddr, session: u64, conn: u64, bytes: &[u8]) {
            self.stream_without(from, session, conn, bytes, 0..0);
        }

        /// The stream, less the segments wholly inside `hole` (bytes).
        fn stream_without(
            &mut self,
            from: SocketAddr,
            session: u64,
            conn: u64,
            bytes: &[u8],
            hole: std::ops::Range<u64>,
        ) {
            self.deliver(from, &hello(session, conn, MSS, 1 << 16, 0));
            let payload = u64::from(MSS) - DATA_HEADER_LEN as u64;
            let n = (bytes.len() as u64).div_ceil(payload);
            for k in 0..n {
                let (start, end) = (k * payload, ((k + 1) * payload).min(bytes.len() as u64));
                if hole.start <= start && end <= hole.end {
                    continue;
                }
                let piece = &bytes[start as usize..end as usize];
                self.deliver(from, &segment(conn, k, piece, k + 1 == n));
            }
        }
    }

    fn data_stream(chunks: u64, size: u64) -> Vec<u8> {
        let mut s = DataHeader {
            ranges: vec![ChunkRange {
                file: 0,
                first: 0,
                count: chunks,
            }],
        }
        .encode();
        for c in 0..chunks {
            let len = (size - c * (1 << 20)).min(1 << 20) as usize;
            let data = vec![c as u8 + 1; len];
            s.extend_from_slice(&data);
            s.extend_from_slice(&chunk_cv(size, c, &data));
        }
        s
    }

    /// Writer results used to be matched to a connection by the id the
    /// client chose: a connection that went idle with chunks at the
    /// writers, and a new one under the same id with fewer chunks, made the
    /// late results index past its slots (a panic, exit 101).
    #[test]
    fn a_reused_connection_id_after_an_idle_timeout_does_not_panic_the_receiver() {
        let scratch = dest_and_outside("reused-id");
        let mut rig = Rig::new(&scratch.path("dest"));
        let from: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let session = 77;
        let size = 4u64 << 20;
        let (other, small) = (78, 1u64 << 20);
        rig.stream(
            from,
            session,
            1,
            &plan(
                vec![entry("f", EntryKind::File { size }, 0o644)],
                own(false),
                Vec::new(),
            ),
        );
        rig.stream(
            from,
            other,
            2,
            &plan(
                vec![entry("g", EntryKind::File { size: small }, 0o644)],
                own(false),
                Vec::new(),
            ),
        );
        rig.settle();
        // Chunks 1 to 3 go to the writers (chunk 0 never comes); before
        // their results are taken in, the connection goes idle, and the
        // same id comes back in the peer's other transfer with a stream of
        // one chunk.
        let header_len = atou::internals::transfer::messages::data_header_len(1) as u64;
        let chunk0 = header_len..header_len + (1 << 20) + 32;
        rig.stream_without(from, session, 9, &data_stream(4, size), chunk0);
        rig.now += Duration::from_secs(700);
        rig.server.handle_timeout(rig.now);
        rig.events_in();
        let mut one = DataHeader {
            ranges: vec![ChunkRange {
                file: 0,
                first: 0,
                count: 1,
            }],
        }
        .encode();
        let last = vec![4u8; 1 << 20];
        one.extend_from_slice(&last);
        one.extend_from_slice(&chunk_cv(small, 0, &last));
        rig.stream(from, other, 9, &one);
        rig.settle();
        let failed = rig
            .events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, ReceiveEvent::Failed { .. }))
            .count();
        say(&format!("survived; {failed} failure events"));
    }
}

/// A dry run's plan ends its session: a sender that follows it with data
/// and a finish for the same session, as if the plan were real, is told
/// the session is unknown, and nothing of it reaches DEST (no directory,
/// no partial file, no file).
#[test]
fn a_dry_run_cannot_be_continued_into_a_write() {
    let scratch = dest_and_outside("dry-run-continued");
    let s = Serve::start(&scratch.path("dest"), &[]);
    let before = snapshot(&scratch.path("dest"));
    let session = session_id();
    let data = b"payload";
    send_plan(
        &s,
        session,
        vec![
            entry("d", EntryKind::Dir, 0o755),
            entry("d/f", EntryKind::File { size: 7 }, 0o644),
        ],
        Options {
            dry_run: true,
            ..Options::default()
        },
    )
    .expect("a dry run is answered");
    assert!(
        send_chunk(&s, session, 0, 7, data).is_err(),
        "data after a dry run"
    );
    assert!(
        send_finish(&s, session, &[hash_of(data)]).is_err(),
        "finish after a dry run"
    );
    assert_eq!(snapshot(&scratch.path("dest")), before);
    assert!(!scratch.path("dest").join("d").exists());
}
