//! The whole receiver (`atou serve --dir`: the server and the file
//! receiver behind it, with its writer and planner threads and a real
//! DEST) driven by several hostile peers at once: hellos, stream segments,
//! and whole plan, data, finish and abort requests built from the fuzzer's
//! bytes, with time passing.
//!
//! The oracle: nothing panics; nothing outside DEST changes (a sibling
//! directory, which manifests' symlinks aim at, is walked after every
//! step); the windows the server grants stay within its budget.
//!
//! Input: records of [op: u8][who: u8][millis: u8][len: u8][bytes; len].
//! `op % 6`: 0 a hello, 1 a raw segment, 2 a plan (a manifest made from the
//! bytes: names, kinds, sizes, modes, symlink targets), 3 a data stream of
//! one chunk, 4 a finish, 5 an abort. `op / 6 % 4` picks the connection,
//! `who % 3` the source address and `who / 3 % 2` the session.
#![no_main]
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use atou::io::ServeApp;
use atou::fuzzing::wire::{
    DataFlags, DataHeader as WireHeader, Hello, ReceiverParams, DATA_HEADER_LEN,
};
use atou::{Server, ServerLimits, Time};
use atou::fuzzing::transfer::dest::{ReceivePolicy, SymlinkPolicy};
use atou::fuzzing::transfer::hash::chunk_cv;
use atou::fuzzing::transfer::manifest::{Entry, EntryKind, Manifest, RelPath};
use atou::fuzzing::transfer::messages::{
    encode_abort, encode_finish, ChunkRange, DataHeader, FilePart, Options, PlanRequest, SameFile,
};
use atou::fuzzing::transfer::receive::{FileReceiver, ReceiveConfig, ReceiveLimits};
use libfuzzer_sys::fuzz_target;

const MSS: u32 = 200;
const WINDOW_BUDGET: u64 = 64 << 10;

fn dirs() -> &'static (PathBuf, PathBuf) {
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIRS.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("atou-fuzz-receiver-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/victim"), b"precious").unwrap();
        (base.join("dest"), base.join("outside"))
    })
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let m = std::fs::symlink_metadata(&p).unwrap();
        let body = if m.is_file() {
            std::fs::read(&p).unwrap()
        } else {
            Vec::new()
        };
        out.push((p, u64::from(m.mode()), body));
    }
    out.sort();
    out
}

fn manifest(body: &[u8], outside: &Path) -> Manifest {
    let mut entries = Vec::new();
    for (i, w) in body.chunks(3).take(6).enumerate() {
        let b = |k: usize| w.get(k).copied().unwrap_or(0);
        let names = ["a", "a/b", "x.atou-part", "x", ".atou-staging", "c"];
        let name = names[usize::from(b(0)) % names.len()];
        let kind = match b(1) % 3 {
            0 => EntryKind::Dir,
            1 => EntryKind::File {
                size: u64::from(b(2)) * 7,
            },
            _ => EntryKind::Symlink {
                target: if b(2) % 2 == 0 {
                    outside.join("victim").into_os_string().into_encoded_bytes()
                } else {
                    b"../../outside/victim".to_vec()
                },
            },
        };
        let _ = i;
        if let Ok(path) = RelPath::new(name.as_bytes().to_vec()) {
            entries.push(Entry {
                path,
                kind,
                mode: u32::from(b(2)) << 4 | 0o7000,
                mtime_sec: 0,
                mtime_nsec: 0,
            });
        }
    }
    Manifest { entries }
}

fn segments(conn_id: u64, stream: &[u8]) -> Vec<Vec<u8>> {
    let payload = (MSS as usize) - DATA_HEADER_LEN;
    let n = stream.len().div_ceil(payload).max(1);
    (0..n)
        .map(|k| {
            let piece =
                &stream[(k * payload).min(stream.len())..((k + 1) * payload).min(stream.len())];
            let mut d = vec![0u8; DATA_HEADER_LEN + piece.len()];
            WireHeader {
                conn_id,
                seg: k as u64,
                timestamp: 0,
                flags: DataFlags {
                    fin: k + 1 == n,
                    retransmission: false,
                },
            }
            .emit(&mut d)
            .unwrap();
            d[DATA_HEADER_LEN..].copy_from_slice(piece);
            d
        })
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let (dest, outside) = dirs();
    let _ = std::fs::remove_dir_all(dest);
    std::fs::create_dir_all(dest).unwrap();
    let before = snapshot(outside);
    let limits = ServerLimits::default()
        .max_connections(6)
        .max_window_bytes(16 << 10)
        .total_window_bytes(WINDOW_BUDGET)
        // Plain hellos get in without an address token: the fuzzer is one
        // address whose bytes are the input.
        .unvalidated_plain(6);
    let mut server = Server::new(limits, 1 << 20, 2 << 20);
    let policy = ReceivePolicy {
        symlinks: SymlinkPolicy::All,
        ..ReceivePolicy::server()
    };
    let mut app = FileReceiver::new(
        ReceiveConfig::new(dest.clone())
            .policy(policy)
            .limits(ReceiveLimits {
                max_sessions: 2,
                max_request: 4096,
                planners: 1,
                plan_queue: 2,
                ..ReceiveLimits::default()
            }),
        |_| {},
    )
    .unwrap();
    let mut now = Time::ZERO;
    let mut out = vec![0u8; 4096];
    let mut rest = data;
    while let [op, who, millis, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (body, next) = tail.split_at(n);
        rest = next;
        let conn_id = u64::from(op / 6 % 4) + 1;
        let session = u64::from(who / 3 % 2) + 1;
        let from = SocketAddr::from(([127, 0, 0, 1], 2000 + u16::from(who % 3)));
        let mut datagrams = match op % 6 {
            0 => {
                let mut d = vec![0u8; 64];
                let len = Hello {
                    conn_id,
                    mss: MSS,
                    maxidle_ms: 2000,
                    session,
                    receiver: ReceiverParams {
                        rcvsegs: u32::from(body.first().copied().unwrap_or(1)) << 8,
                        rcvbuf: 0,
                        delack_us: 0,
                        sack: true,
                        quickack: 0,
                    },
                }
                .emit(&mut d)
                .unwrap();
                d.truncate(len);
                vec![d]
            }
            1 => {
                let seg = u64::from(body.first().copied().unwrap_or(0));
                let payload = (MSS as u64) - DATA_HEADER_LEN as u64;
                let mut d = vec![0u8; DATA_HEADER_LEN];
                WireHeader {
                    conn_id,
                    seg,
                    timestamp: 0,
                    flags: DataFlags::default(),
                }
                .emit(&mut d)
                .unwrap();
                d.extend(body.iter().cycle().take(payload as usize));
                vec![d]
            }
            2 => segments(
                conn_id,
                &PlanRequest {
                    options: Options {
                        overwrite: body.first().is_some_and(|b| b % 2 == 1),
                        skip_existing: body.first().is_some_and(|b| b % 4 >= 2),
                        checksum: body.first().is_some_and(|b| b % 8 >= 4),
                        fsync: false,
                        dry_run: body.first().is_some_and(|b| b % 16 >= 8),
                        shard: body.first().is_some_and(|b| b % 32 >= 16),
                        finish_ahead: body.first().is_some_and(|b| b % 64 >= 32),
                        compress: body.first().is_some_and(|b| *b >= 128),
                        delete: body.first().is_some_and(|b| b % 128 >= 64),
                    },
                    // Under --delete, a rule the fuzzer may make anything
                    // of: the receiver's decode checks it.
                    protect: if body.first().is_some_and(|b| b % 128 >= 64) {
                        vec![format!("- {}", String::from_utf8_lossy(&body[1..body.len().min(9)]))]
                    } else {
                        Vec::new()
                    },
                    owners: None,
                    xattrs: None,
                    // A file the same as another, which the manifest may
                    // or may not allow (sizes, order): the decode decides.
                    same: match body.get(3) {
                        Some(&b) if b % 4 != 0 => vec![SameFile {
                            file: u32::from(b % 4),
                            of: u32::from(b / 4 % 4),
                        }],
                        _ => Vec::new(),
                    },
                    subdir: None,
                    manifest: manifest(body, outside),
                    // A part of the first file, which may or may not
                    // exist or have that chunk: the receiver's checks
                    // decide.
                    parts: if body.get(2).is_some_and(|b| b % 2 == 1) {
                        vec![FilePart {
                            file: 0,
                            chunks: 0..1,
                        }]
                    } else {
                        Vec::new()
                    },
                }
                .encode(),
            ),
            3 => {
                let size = u64::from(body.first().copied().unwrap_or(0)) * 7;
                let chunk: Vec<u8> = body.iter().cycle().take(size as usize).copied().collect();
                let mut s = DataHeader {
                    ranges: vec![ChunkRange {
                        file: u32::from(body.get(1).copied().unwrap_or(0) % 3),
                        first: 0,
                        count: 1,
                    }],
                }
                .encode();
                s.extend_from_slice(&chunk);
                s.extend_from_slice(&chunk_cv(size, 0, &chunk));
                segments(conn_id, &s)
            }
            4 => {
                let hashes: Vec<[u8; 32]> = body
                    .chunks_exact(32)
                    .map(|c| c.try_into().unwrap())
                    .collect();
                segments(conn_id, &encode_finish(&hashes))
            }
            _ => segments(conn_id, &encode_abort(&String::from_utf8_lossy(body))),
        };
        now += Duration::from_millis(u64::from(*millis) * 20);
        if server.poll_timeout().is_some_and(|t| t <= now) {
            server.handle_timeout(now);
        }
        for d in &mut datagrams {
            if let Some(a) = server.handle_datagram(now, from, d) {
                app.on_arrival(&mut server, a);
            }
            while let Some(e) = server.poll_session_event() {
                app.on_event(&mut server, e);
            }
        }
        // Let the writer and planner threads answer.
        for _ in 0..20 {
            app.poll(&mut server);
            while let Some(e) = server.poll_session_event() {
                app.on_event(&mut server, e);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        while server.poll_transmit(now, &mut out).is_some() {}
        while server.poll_report().is_some() {}
        while server.poll_notice().is_some() {}
        assert!(server.windows_held() <= WINDOW_BUDGET);
        assert_eq!(snapshot(outside), before, "outside DEST changed");
    }
});
