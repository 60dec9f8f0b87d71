//! Shared by every integration suite: what a test says past the test
//! harness's capture, what it does when this host cannot run it, the
//! binary under test, and a directory of its own.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

// Plain items, no `use`: the crate's own unit tests include this file too.
include!("ci.rs");

/// The atou binary this build made.
pub const ATOU: &str = env!("CARGO_BIN_EXE_atou");

/// A new directory under the temp dir, named `atou-{name}-` and a random
/// tail, that outlives the test: for fixtures a whole suite shares, and
/// files a person looks at after the run.
pub fn kept_dir(name: &str) -> PathBuf {
    tempfile::Builder::new()
        .prefix(&format!("atou-{name}-"))
        .tempdir()
        .unwrap_or_else(|e| panic!("{name}: cannot make a temporary directory: {e}"))
        .keep()
}

/// A key pair made by `atou keygen -C NAME -f DIR/NAME` (with `cache` as
/// its XDG_CACHE_HOME): the private key's path and the public key's line.
pub fn keygen(dir: &Path, name: &str, cache: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let out = std::process::Command::new(ATOU)
        .env("XDG_CACHE_HOME", cache)
        .args(["keygen", "-C", name, "-f"])
        .arg(&key)
        .output()
        .expect("run atou keygen");
    assert!(out.status.success(), "atou keygen: {out:?}");
    let line = std::fs::read_to_string(dir.join(format!("{name}.pub"))).unwrap();
    (key, line)
}

/// A directory of the test's own under the temp dir, named
/// `atou-{test}-` and a random tail so that parallel runs never share
/// one. Removed when the test passes; kept, and its path said, when the
/// test panics, so that what it held can be looked at.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
}

impl TestDir {
    pub fn new(test: &str) -> TestDir {
        let dir = tempfile::Builder::new()
            .prefix(&format!("atou-{test}-"))
            .tempdir()
            .unwrap_or_else(|e| panic!("{test}: cannot make a temporary directory: {e}"));
        TestDir { dir: Some(dir) }
    }

    pub fn root(&self) -> &Path {
        self.dir.as_ref().expect("held until dropped").path()
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// `rel`, created (with its parents).
    pub fn dir(&self, rel: &str) -> PathBuf {
        let p = self.path(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        if std::thread::panicking() {
            say(&format!("  kept {} for inspection", dir.keep().display()));
        } else {
            let path = dir.path().to_owned();
            if let Err(e) = dir.close() {
                say(&format!("  could not remove {}: {e}", path.display()));
            }
        }
    }
}

/// Deterministic bytes that do not compress (xorshift64), a stream per
/// `seed`.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A plain hello as a `--no-auth` client sends it (600 s idle), from the
/// crate's own encoder.
pub fn plain_hello(conn_id: u64, session: u64, mss: u32, rcvsegs: u32) -> Vec<u8> {
    let mut b = vec![0u8; 128];
    let n = atou::internals::wire::Hello {
        conn_id,
        mss,
        maxidle_ms: 600_000,
        session,
        receiver: atou::internals::wire::ReceiverParams {
            rcvsegs,
            rcvbuf: 0,
            delack_us: 0,
            quickack: 0,
            sack: true,
        },
    }
    .emit(&mut b)
    .unwrap();
    b.truncate(n);
    b
}

/// A Noise hello whose message is noise, 1,200 bytes: the server spends
/// one X25519 operation (`es`) before it fails to open. `seed` makes it
/// distinct (its client id, and its noise).
pub fn garbage_hello(seed: u64) -> Vec<u8> {
    let mut noise = Vec::new();
    for i in 0..4u64 {
        noise.extend_from_slice(
            blake3::hash(&[seed.to_be_bytes(), i.to_be_bytes()].concat()).as_bytes(),
        );
    }
    let mut h = vec![b'A', b'T', atou::internals::wire::VERSION, 0x20];
    h.extend_from_slice(&seed.to_be_bytes());
    h.push(0);
    h.extend_from_slice(&(noise.len() as u16).to_be_bytes());
    h.extend_from_slice(&noise);
    h.resize(1200, 0);
    h
}
