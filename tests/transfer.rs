//! `atou send` into `atou serve --dir` as real processes over loopback (and
//! through `atou netem relay`): what arrives is what was sent — names,
//! kinds, bytes, modes, mtimes, symlink targets — and what must be refused
//! is refused, with one readable line on stderr.
//!
//! Each test has its own scratch directory under the system's temp dir
//! (kept, and named in the log, when the test fails) and its own ephemeral
//! ports.

mod common;
mod netem_support;

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::io::{Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::unix::fs::{symlink, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use atou::internals::crypto::handshake::{ClientConfig, Initiator, Progress};
use atou::internals::crypto::parse_public_key;
use atou::internals::crypto::Cipher;
use atou::internals::io::dest_dir::{HELLO_TIMESTAMPS, STAGING_DIR};
use atou::internals::io::{fresh_conn_id, wall_clock_ns};
use atou::internals::keys::{read_identity, Strictness};
use atou::internals::transfer::manifest::Manifest;
use atou::internals::transfer::messages::Request;
use atou::internals::wire::{Hello, ReceiverParams, CONTROL_MAX_LEN};
use common::TestDir;
use netem_support::{json_lines, listening_addr, say, u, Daemon, Relay, ATOU};
use serde_json::Value;

/// The path cache of the atou processes this test starts: its own, so
/// that neither the user's entries nor another test's hint its runs.
const TEST_CACHE: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/path-cache-", module_path!());

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// 2001-02-03 00:00:00 UTC.
const FEB_3_2001: u64 = 981_158_400;

// Exit statuses (`atou --help`, src/cli/exit.rs).
const REFUSED: i32 = 5;
const NETWORK: i32 = 10;
const LOCAL_IO: i32 = 11;
const PARTIAL: i32 = 23;
const TIMEOUT: i32 = 30;

// ---------------------------------------------------------------------------
// Scratch space, content, times
// ---------------------------------------------------------------------------

/// xorshift64: reproducible content without a rand crate.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

/// A file of `size` random bytes, written 1 MiB at a time.
fn write_random(path: &Path, size: u64, seed: u64) {
    let mut rng = XorShift::new(seed);
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let mut buf = vec![0u8; MIB as usize];
    let mut left = size;
    while left > 0 {
        let n = left.min(MIB) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
}

fn set_mtime(path: &Path, sec: u64, nsec: u32) {
    let t = UNIX_EPOCH + Duration::new(sec, nsec);
    File::open(path)
        .and_then(|f| f.set_times(FileTimes::new().set_modified(t).set_accessed(t)))
        .unwrap_or_else(|e| panic!("set the mtime of {}: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

// ---------------------------------------------------------------------------
// Trees
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink,
}

fn kind_of(m: &fs::Metadata) -> Kind {
    let t = m.file_type();
    if t.is_symlink() {
        Kind::Symlink
    } else if t.is_dir() {
        Kind::Dir
    } else if t.is_file() {
        Kind::File
    } else {
        panic!("unexpected file type {t:?}")
    }
}

/// Every entry under `root` (and `root` itself, as ""), symlinks not
/// followed, by relative path.
fn walk(root: &Path) -> BTreeMap<PathBuf, fs::Metadata> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let full = root.join(&rel);
        let m =
            fs::symlink_metadata(&full).unwrap_or_else(|e| panic!("stat {}: {e}", full.display()));
        if m.is_dir() {
            for e in fs::read_dir(&full).unwrap() {
                stack.push(rel.join(e.unwrap().file_name()));
            }
        }
        out.insert(rel, m);
    }
    out
}

/// Files, directories and symlinks under `root`, the root not counted.
fn census(root: &Path) -> (usize, usize, usize) {
    let mut c = (0, 0, 0);
    for (rel, m) in walk(root) {
        match kind_of(&m) {
            Kind::File => c.0 += 1,
            Kind::Dir if rel.as_os_str().is_empty() => {}
            Kind::Dir => c.1 += 1,
            Kind::Symlink => c.2 += 1,
        }
    }
    c
}

/// Reads up to `buf.len()` bytes, short only at the end of the file.
fn read_full(f: &mut File, buf: &mut [u8]) -> usize {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]).unwrap() {
            0 => break,
            k => n += k,
        }
    }
    n
}

/// `None` if the two files hold the same bytes, else where they first
/// differ. Streams both 1 MiB at a time, so a 2 GiB file costs 2 MiB.
/// A new client key and the authorized_keys file in its scratch that
/// lists it alone.
struct KeyFile {
    key: PathBuf,
    authorized: PathBuf,
    line: String,
}

impl KeyFile {
    /// Key `name`, listed after `options` (an authorized_keys option list,
    /// or nothing).
    fn new(scratch: &TestDir, name: &str, options: &str) -> KeyFile {
        let (key, line) = common::keygen(scratch.root(), name, TEST_CACHE);
        let file = KeyFile {
            key,
            authorized: scratch.path("authorized_keys"),
            line,
        };
        file.list_with(options);
        file
    }

    /// Lists the key again, after `options` now.
    fn list_with(&self, options: &str) {
        let line = if options.is_empty() {
            self.line.clone()
        } else {
            format!("{options} {}", self.line)
        };
        fs::write(&self.authorized, format!("{line}\n")).unwrap();
    }
}

fn first_difference(a: &Path, b: &Path) -> Option<u64> {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut offset = 0u64;
    loop {
        let (na, nb) = (read_full(&mut fa, &mut ba), read_full(&mut fb, &mut bb));
        if ba[..na] != bb[..nb] {
            let at = ba[..na]
                .iter()
                .zip(&bb[..nb])
                .position(|(x, y)| x != y)
                .unwrap_or(na.min(nb));
            return Some(offset + at as u64);
        }
        if na == 0 {
            return None;
        }
        offset += na as u64;
    }
}

/// Panics, listing the first differences, unless the tree at `dst` is the
/// tree at `src`: the same relative paths, of the same kinds; files
/// byte-identical; the same permission bits and mtimes (to the nanosecond)
/// on files and directories; the same symlink targets. Returns the number
/// of entries compared.
fn assert_same_tree(src: &Path, dst: &Path) -> usize {
    let (a, b) = (walk(src), walk(dst));
    let mut problems = Vec::new();
    for rel in a.keys().filter(|k| !b.contains_key(*k)) {
        problems.push(format!("missing at the destination: {}", rel.display()));
    }
    for rel in b.keys().filter(|k| !a.contains_key(*k)) {
        problems.push(format!("extra at the destination: {}", rel.display()));
    }
    for (rel, ma) in &a {
        let Some(mb) = b.get(rel) else { continue };
        let shown = if rel.as_os_str().is_empty() {
            "(the top directory)".to_string()
        } else {
            rel.display().to_string()
        };
        let (ka, kb) = (kind_of(ma), kind_of(mb));
        if ka != kb {
            problems.push(format!("{shown}: a {ka:?} became a {kb:?}"));
            continue;
        }
        if ka == Kind::Symlink {
            let (ta, tb) = (
                fs::read_link(src.join(rel)).unwrap(),
                fs::read_link(dst.join(rel)).unwrap(),
            );
            if ta != tb {
                problems.push(format!(
                    "{shown}: symlink to {} arrived pointing to {}",
                    ta.display(),
                    tb.display()
                ));
            }
            continue;
        }
        if ma.mode() & 0o7777 != mb.mode() & 0o7777 {
            problems.push(format!(
                "{shown}: mode {:04o} arrived as {:04o}",
                ma.mode() & 0o7777,
                mb.mode() & 0o7777
            ));
        }
        if (ma.mtime(), ma.mtime_nsec()) != (mb.mtime(), mb.mtime_nsec()) {
            problems.push(format!(
                "{shown}: mtime {}.{:09} arrived as {}.{:09}",
                ma.mtime(),
                ma.mtime_nsec(),
                mb.mtime(),
                mb.mtime_nsec()
            ));
        }
        if ka == Kind::File {
            if ma.len() != mb.len() {
                problems.push(format!(
                    "{shown}: {} bytes arrived as {}",
                    ma.len(),
                    mb.len()
                ));
            } else if let Some(at) = first_difference(&src.join(rel), &dst.join(rel)) {
                problems.push(format!("{shown}: contents differ from byte {at}"));
            }
        }
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(25);
        panic!(
            "{} differs from {} in {n} ways:\n  {}",
            dst.display(),
            src.display(),
            problems.join("\n  ")
        );
    }
    a.len()
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// Key files shared by every test here: the server's identity, one
/// authorized client, and the client's identity. Transfers in these tests
/// are authenticated and encrypted, as a user's are by default.
struct Keys {
    server: PathBuf,
    server_pub: PathBuf,
    client: PathBuf,
    authorized: PathBuf,
}

fn keys() -> &'static Keys {
    static KEYS: std::sync::OnceLock<Keys> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let dir = common::kept_dir("transfer-keys");
        let (server, _) = common::keygen(&dir, "server", TEST_CACHE);
        let (client, line) = common::keygen(&dir, "client", TEST_CACHE);
        let authorized = dir.join("authorized_keys");
        // `overwrite`: tests that replace files need it, as a user would;
        // `owners`, `xattrs`, `acls`: those that keep them.
        fs::write(&authorized, format!("overwrite,owners,xattrs,acls {line}")).unwrap();
        Keys {
            server_pub: dir.join("server.pub"),
            server,
            client,
            authorized,
        }
    })
}

/// `atou serve --dir DEST` on an ephemeral loopback port with the test
/// keys, for a test that reads its stderr itself.
fn keyed_serve(dest: &Path) -> Command {
    let mut c = Command::new(ATOU);
    c.env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["serve", "--bind", "127.0.0.1:0", "--dir"])
        .arg(dest)
        .arg("--identity")
        .arg(&keys().server)
        .arg("--authorized-keys")
        .arg(&keys().authorized);
    c
}

/// `atou serve --dir DEST --json` on an ephemeral loopback port, with the
/// test keys; SIGTERM and reaped when dropped.
struct Serve {
    process: Option<Daemon>,
    addr: SocketAddr,
    reports: mpsc::Receiver<Value>,
}

impl Serve {
    fn start(dest: &Path) -> Serve {
        Serve::start_with(dest, &[])
    }

    /// With receiver policy flags (`--allow-overwrite`, …).
    fn start_with(dest: &Path, args: &[&str]) -> Serve {
        Serve::start_keyed(dest, &keys().authorized, args)
    }

    /// With another authorized keys file.
    fn start_keyed(dest: &Path, authorized: &Path, args: &[&str]) -> Serve {
        let mut child = Command::new(ATOU)
            .env("XDG_CACHE_HOME", TEST_CACHE)
            .args(["serve", "--bind", "127.0.0.1:0", "--json", "--dir"])
            .arg(dest)
            .arg("--identity")
            .arg(&keys().server)
            // --no-auth takes any client: a keys file with it is refused.
            .args(if args.contains(&"--no-auth") {
                vec![]
            } else {
                vec![OsStr::new("--authorized-keys"), authorized.as_os_str()]
            })
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou serve");
        let addr = listening_addr(&mut child);
        let reports = json_lines(&mut child, true);
        let process = Daemon::new(child);
        Serve {
            process: Some(process),
            addr,
            reports,
        }
    }

    fn target(&self) -> String {
        self.addr.to_string()
    }

    /// The next transfer's report line.
    fn report(&self) -> Value {
        self.reports
            .recv_timeout(Duration::from_secs(30))
            .expect("a transfer report from atou serve")
    }

    /// SIGKILL: the receiver dies mid-write, as in a crash.
    fn kill(&mut self) {
        let status = self.process.take().expect("running").kill();
        say(&format!("  serve killed: {status}"));
    }
}

/// What a finished `atou send` left.
struct Sent {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    secs: f64,
}

impl Sent {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }

    /// The JSON report of a successful send, checked to be one.
    fn report(&self) -> Value {
        assert_eq!(
            self.code(),
            Some(0),
            "atou send failed ({}):\n{}",
            self.status,
            self.stderr
        );
        let r: Value = serde_json::from_str(self.stdout.trim())
            .unwrap_or_else(|e| panic!("send --json: {e}: `{}`", self.stdout));
        assert_eq!(r["verified"], true, "{r}");
        r
    }

    /// The one-line reason of a failed send, checked to be exit status
    /// `want` (see `atou --help`: 5 refused, 10 network, 11 local I/O,
    /// 23 partial, 30 timeout, ...) and one readable line.
    fn failure(&self, want: i32) -> String {
        assert_eq!(
            self.code(),
            Some(want),
            "atou send should have failed with status {want} ({}); stdout:\n{}\nstderr:\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
        one_readable_line(&self.stderr)
    }
}

/// Checks that a failed command's stderr is one line, for a person: no
/// panic, no backtrace, no bare `Os { code: .. }`.
fn one_readable_line(stderr: &str) -> String {
    let text = stderr.trim_end();
    for bad in ["panicked", "backtrace", "RUST_BACKTRACE", "Os {", "Error {"] {
        assert!(!text.contains(bad), "stderr contains `{bad}`:\n{text}");
    }
    assert!(
        !text.is_empty() && !text.contains('\n'),
        "stderr is not one line:\n{text}"
    );
    assert!(text.starts_with("atou: "), "stderr: {text}");
    text.to_string()
}

/// `atou send --quiet --json ARGS SRC... TARGET` as a process, SIGTERMed
/// and reaped if the test fails before it ends.
struct Sending {
    process: Daemon,
    out: mpsc::Receiver<String>,
    err: mpsc::Receiver<String>,
    started: Instant,
}

fn spawn_send(sources: &[&Path], target: &str, args: &[&str]) -> Sending {
    let mut child = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["send", "--quiet", "--json"])
        .args(
            if args.contains(&"--no-auth") || args.contains(&"--identity") {
                vec![]
            } else {
                vec!["--identity".into(), keys().client.clone().into_os_string()]
            },
        )
        .args(
            if ["--no-auth", "--known-hosts", "--server-key"]
                .iter()
                .any(|a| args.contains(a))
            {
                vec![]
            } else {
                vec![
                    "--server-key".into(),
                    keys().server_pub.clone().into_os_string(),
                ]
            },
        )
        .args(args)
        .args(sources)
        .arg(target)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start atou send");
    let drain = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            let _ = tx.send(s);
        });
        rx
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    Sending {
        process: Daemon::new(child),
        out,
        err,
        started: Instant::now(),
    }
}

impl Sending {
    fn running(&mut self) -> bool {
        self.process.child().try_wait().unwrap().is_none()
    }

    /// Waits for the send to end by itself (panics after `limit`).
    fn finish(mut self, limit: Duration) -> Sent {
        while self.running() {
            assert!(
                self.started.elapsed() < limit,
                "atou send still running after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let secs = self.started.elapsed().as_secs_f64();
        let status = self.process.release().wait().unwrap();
        Sent {
            status,
            stdout: self.out.recv().unwrap_or_default(),
            stderr: self.err.recv().unwrap_or_default(),
            secs,
        }
    }

    fn kill(self) {
        let status = self.process.kill();
        say(&format!("  send killed: {status}"));
    }
}

/// Runs `atou send` to the end (at most 5 minutes).
fn send(sources: &[&Path], target: &str, args: &[&str]) -> Sent {
    spawn_send(sources, target, args).finish(Duration::from_secs(300))
}

/// Bytes the file at `path` has on disk.
fn allocated(path: &Path) -> u64 {
    fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

fn report_u(r: &Value, key: &str) -> u64 {
    u(&r[key])
}

// ---------------------------------------------------------------------------
// 1. Everything a tree can hold arrives as it was
// ---------------------------------------------------------------------------

/// The odd-names tree: every kind, size edge, mode and mtime that must
/// survive, 10,000 small files in 100 directories, and a sparse 2 GiB file.
fn build_odd_tree(root: &Path) {
    fs::create_dir_all(root).unwrap();
    let mut rng = XorShift::new(1);
    let mut mtimes: Vec<(PathBuf, u64, u32)> = Vec::new();
    // Entry i's mtime: its own second and nanosecond.
    let next_time = |p: &Path, i: u64| {
        let nsec = (i * 123_456_789 % 1_000_000_000) as u32;
        (p.to_path_buf(), FEB_3_2001 + i * 3601, nsec)
    };

    let mut files: Vec<(&str, u64)> = vec![
        ("name with spaces.txt", 1000),
        ("ünïcødé ✓.txt", 777),
        ("-rf", 11),
        ("--help", 12),
        ("empty.bin", 0),
        ("also empty", 0),
    ];
    for d in ["empty_dir", "nested/empty/deeper", "sizes", "perms/private"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    files.extend([
        ("sizes/one", 1),
        ("sizes/mib_minus_1", MIB - 1),
        ("sizes/mib", MIB),
        ("sizes/mib_plus_1", MIB + 1),
        ("sizes/three_mib_17", 3 * MIB + 17),
        ("sizes/zero", 0),
        ("perms/private/secret", 4 * KIB),
        ("perms/script.sh", 300),
        ("perms/readonly", 5000),
    ]);
    for (i, (name, size)) in files.iter().enumerate() {
        let p = root.join(name);
        write_random(&p, *size, 100 + i as u64);
        mtimes.push(next_time(&p, i as u64 + 1));
    }
    symlink("sizes/one", root.join("link_to_one")).unwrap();
    symlink("no/such/file", root.join("dangling")).unwrap();

    // 10,000 files of 1–4 KiB in 100 directories, each its own mtime.
    let mut buf = vec![0u8; 4 * KIB as usize];
    for d in 0..100 {
        let dir = root.join(format!("many/d{d:03}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            let n = (KIB + rng.below(3 * KIB + 1)) as usize;
            rng.fill(&mut buf[..n]);
            let p = dir.join(format!("f{f:03}"));
            fs::write(&p, &buf[..n]).unwrap();
            let k = (d * 100 + f) as u64;
            let nsec = (k * 7919 % 1_000_000_000) as u32;
            let t = UNIX_EPOCH + Duration::new(FEB_3_2001 + 86_400 + k, nsec);
            File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_times(FileTimes::new().set_modified(t))
                .unwrap();
        }
    }

    // Sparse: 2 GiB long, a few bytes at 0, 1 GiB and the end.
    let sparse = root.join("sparse_2g");
    let f = File::create(&sparse).unwrap();
    f.set_len(2 << 30).unwrap();
    f.write_all_at(b"start", 0).unwrap();
    f.write_all_at(b"middle", 1 << 30).unwrap();
    f.write_all_at(b"end", (2 << 30) - 3).unwrap();
    drop(f);
    mtimes.push(next_time(&sparse, 40));

    // Modes, then mtimes (chmod leaves mtime alone), directories last and
    // deepest first, as creating their children moved theirs.
    set_mode(&root.join("perms/private/secret"), 0o600);
    set_mode(&root.join("perms/script.sh"), 0o755);
    set_mode(&root.join("perms/readonly"), 0o444);
    set_mode(&root.join("perms/private"), 0o700);
    for (p, s, ns) in &mtimes {
        set_mtime(p, *s, *ns);
    }
    let dirs = [
        "nested/empty/deeper",
        "nested/empty",
        "nested",
        "empty_dir",
        "sizes",
        "perms/private",
        "perms",
        "many/d042",
        "",
    ];
    for (i, d) in dirs.iter().enumerate() {
        let (_, s, ns) = next_time(&root.join(d), 50 + i as u64);
        set_mtime(&root.join(d), s, ns);
    }
}

#[test]
fn a_tree_with_odd_names_arrives_identical() {
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-odd-tree");
    let tree = scratch.path("src/odd tree");
    build_odd_tree(&tree);
    let dest = scratch.dir("dest");
    let built = t0.elapsed().as_secs_f64();

    // Ten thousand files: syncing each is the disk's time, not what is tested.
    let server = Serve::start_with(&dest, &["--no-fsync"]);
    let sent = send(&[&tree], &server.target(), &[]);
    let r = sent.report();
    let (files, dirs, symlinks) = census(&tree);
    assert_eq!(report_u(&r, "files"), files as u64, "{r}");
    assert_eq!(
        report_u(&r, "dirs"),
        dirs as u64 + 1,
        "the top directory counts: {r}"
    );
    assert_eq!(report_u(&r, "symlinks"), symlinks as u64, "{r}");
    assert_eq!(report_u(&r, "skipped_files"), 0);
    let served = server.report();
    assert!(served.get("transfer").is_some(), "{served}");

    let t1 = Instant::now();
    let n = assert_same_tree(&tree, &dest.join("odd tree"));
    let compared = t1.elapsed().as_secs_f64();
    let sparse = dest.join("odd tree/sparse_2g");
    say(&format!(
        "a_tree_with_odd_names_arrives_identical: {n} entries ({files} files, {} bytes) in {:.1} s \
         ({} sent); build {built:.1} s, compare {compared:.1} s, total {:.1} s; the 2 GiB sparse file \
         takes {} on disk at the destination",
        report_u(&r, "bytes_total"),
        sent.secs,
        report_u(&r, "bytes_sent"),
        t0.elapsed().as_secs_f64(),
        allocated(&sparse),
    ));
}

// ---------------------------------------------------------------------------
// 2. Crafted manifests and plan requests
// ---------------------------------------------------------------------------

const KIND_DIR: u8 = 1;
const KIND_FILE: u8 = 2;
const KIND_SYMLINK: u8 = 3;

/// One manifest entry, encoded by hand as src/transfer/manifest.rs
/// documents it. `extra` is the file size or the symlink target.
fn entry(kind: u8, path: &[u8], extra: &[u8]) -> Vec<u8> {
    let mut e = vec![kind];
    e.extend_from_slice(&0o644u32.to_be_bytes());
    e.extend_from_slice(&(FEB_3_2001 as i64).to_be_bytes());
    e.extend_from_slice(&5u32.to_be_bytes());
    e.extend_from_slice(&(path.len() as u16).to_be_bytes());
    e.extend_from_slice(path);
    match kind {
        KIND_FILE => {
            e.extend_from_slice(&u64::from_be_bytes(extra.try_into().unwrap()).to_be_bytes())
        }
        KIND_SYMLINK => {
            e.extend_from_slice(&(extra.len() as u16).to_be_bytes());
            e.extend_from_slice(extra);
        }
        _ => {}
    }
    e
}

fn file(path: &[u8], size: u64) -> Vec<u8> {
    entry(KIND_FILE, path, &size.to_be_bytes())
}

fn manifest(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut m = b"ATMF".to_vec();
    m.push(1);
    m.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for e in entries {
        m.extend_from_slice(e);
    }
    m
}

fn plan_request(subdir: &[u8], manifest: &[u8]) -> Vec<u8> {
    let mut p = vec![b'P', 1, 0];
    p.extend_from_slice(&(subdir.len() as u16).to_be_bytes());
    p.extend_from_slice(subdir);
    p.extend_from_slice(manifest);
    // Sealed with its BLAKE3 hash, as any sender (or attacker) can.
    let hash = blake3::hash(&p);
    p.extend_from_slice(hash.as_bytes());
    p
}

#[test]
fn path_traversal_in_a_crafted_manifest_is_refused_at_decode() {
    // The hand encoding is right: a harmless manifest decodes, alone and in
    // a plan request.
    let good = manifest(&[
        entry(KIND_DIR, b"ok", &[]),
        file(b"ok/x", 3),
        entry(KIND_SYMLINK, b"ok/s", b"../../anywhere"),
    ]);
    let m = Manifest::decode(&good).expect("a valid manifest decodes");
    assert_eq!(m.entries.len(), 3);
    assert!(matches!(
        Request::decode(&plan_request(b"in/coming", &good)),
        Ok(Request::Plan(_))
    ));

    // Each bad path, and how the message must name it.
    let bad: [(&[u8], &str); 4] = [
        (b"../evil", "../evil"),
        (b"/etc/x", "/etc/x"),
        (b"a/../../b", "a/../../b"),
        (b"ok/\0x", "ok/\\x00x"),
    ];
    for (path, shown) in bad {
        for (what, entries) in [
            ("a file", vec![file(path, 1)]),
            ("a directory", vec![entry(KIND_DIR, path, &[])]),
            ("a symlink", vec![entry(KIND_SYMLINK, path, b"t")]),
            (
                "after a good entry",
                vec![entry(KIND_DIR, b"ok", &[]), file(path, 1)],
            ),
        ] {
            let bytes = manifest(&entries);
            let e = Manifest::decode(&bytes)
                .expect_err(&format!("{shown:?} as {what} must not decode"))
                .to_string();
            assert!(
                e.contains(shown),
                "{shown} as {what}: the error `{e}` does not name it"
            );
            // The same inside a plan request.
            let e = Request::decode(&plan_request(b"", &bytes))
                .expect_err(&format!("a plan with {shown:?} as {what} must not decode"))
                .to_string();
            assert!(e.contains(shown), "plan with {shown} as {what}: `{e}`");
        }
    }

    // A plan whose destination subdirectory leaves the destination.
    for (subdir, shown) in [
        (&b".."[..], ".."),
        (b"../up", "../up"),
        (b"in/../..", "in/../.."),
        (b"/etc", "/etc"),
    ] {
        let e = Request::decode(&plan_request(subdir, &good))
            .expect_err(&format!("subdir {shown:?} must not decode"))
            .to_string();
        assert!(e.contains(&format!("`{shown}`")), "subdir {shown}: `{e}`");
    }

    // Nothing may be placed under a symlink (or a file): the receiver would
    // write through it.
    for (parent, what) in [
        (entry(KIND_SYMLINK, b"s", b"/etc"), "symlink"),
        (file(b"s", 0), "file"),
    ] {
        for child in [file(b"s/x", 1), entry(KIND_DIR, b"s/x", &[])] {
            let bytes = manifest(&[parent.clone(), child]);
            let e = Manifest::decode(&bytes)
                .expect_err(&format!("an entry under a {what} must not decode"))
                .to_string();
            assert!(
                e.contains("s/x") && e.contains(what),
                "under a {what}: `{e}`"
            );
        }
    }
    // Nor under a directory that was not listed first.
    let e = Manifest::decode(&manifest(&[file(b"d/x", 1), entry(KIND_DIR, b"d", &[])]))
        .expect_err("a parent listed after its child")
        .to_string();
    assert!(e.contains("d/x"), "`{e}`");
}

// ---------------------------------------------------------------------------
// 3. A symlink in the destination
// ---------------------------------------------------------------------------

#[test]
fn a_symlink_in_the_destination_is_not_followed() {
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-dest-symlink");
    let src = scratch.dir("src/out");
    write_random(&src.join("payload"), 10_000, 3);
    fs::create_dir(src.join("sub")).unwrap();
    write_random(&src.join("sub/deeper"), 100, 4);
    let elsewhere = scratch.dir("elsewhere");
    let dest = scratch.dir("dest");
    symlink(&elsewhere, dest.join("out")).unwrap();

    let server = Serve::start(&dest);
    let sent = send(&[&src], &server.target(), &[]);
    let why = sent.failure(REFUSED);
    assert!(
        why.contains("symlink") && why.contains("out"),
        "the reason does not name the symlink: {why}"
    );
    let written: Vec<_> = fs::read_dir(&elsewhere).unwrap().collect();
    assert!(
        written.is_empty(),
        "written through the symlink: {written:?}"
    );
    assert!(fs::symlink_metadata(dest.join("out"))
        .unwrap()
        .file_type()
        .is_symlink());
    let names: Vec<_> = fs::read_dir(&dest)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != STAGING_DIR)
        .collect();
    assert_eq!(names, ["out"], "only the symlink in DEST");

    // --overwrite does not make it follow the symlink either.
    let sent = send(&[&src], &server.target(), &["--overwrite"]);
    let why2 = sent.failure(REFUSED);
    assert!(why2.contains("symlink"), "{why2}");
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    say(&format!(
        "a_symlink_in_the_destination_is_not_followed: `{why}` ({:.1} s)",
        t0.elapsed().as_secs_f64()
    ));
}

// ---------------------------------------------------------------------------
// 4. Existing files: refuse, skip, overwrite
// ---------------------------------------------------------------------------

#[test]
fn existing_files_are_refused_unless_overwrite_and_skip_existing_skips_identical() {
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-existing");
    let tree = scratch.dir("src/tree");
    fs::create_dir(tree.join("sub")).unwrap();
    for (i, (name, size)) in [
        ("a", 1000),
        ("b", 2 * MIB + 5),
        ("sub/c", 70_000),
        ("sub/empty", 0),
    ]
    .iter()
    .enumerate()
    {
        let p = tree.join(name);
        write_random(&p, *size, 40 + i as u64);
        set_mtime(&p, FEB_3_2001 + i as u64, 500 + i as u32);
    }
    symlink("a", tree.join("sub/link")).unwrap();
    let (files, _, _) = census(&tree);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let target = server.target();

    let first = send(&[&tree], &target, &[]).report();
    assert_eq!(report_u(&first, "files"), files as u64);
    assert_same_tree(&tree, &dest.join("tree"));

    // Again: refused, nothing changed.
    let again = send(&[&tree], &target, &[]);
    let why = again.failure(REFUSED);
    assert!(why.contains("--overwrite"), "{why}");
    // Named from DEST: the sender does not learn where DEST is.
    assert!(why.contains("already exist in DEST:"), "{why}");
    assert!(!why.contains(dest.to_str().unwrap()), "{why}");
    assert_same_tree(&tree, &dest.join("tree"));

    // --skip-existing: every file is already there.
    let skip = send(&[&tree], &target, &["--skip-existing"]).report();
    assert_eq!(report_u(&skip, "skipped_files"), files as u64, "{skip}");
    assert_eq!(report_u(&skip, "bytes_sent"), 0, "{skip}");
    assert_same_tree(&tree, &dest.join("tree"));

    // Change one file (same size, new content and mtime): --overwrite
    // replaces it.
    let b = tree.join("b");
    write_random(&b, 2 * MIB + 5, 99);
    set_mtime(&b, FEB_3_2001 + 1_000_000, 42);
    assert!(first_difference(&b, &dest.join("tree/b")).is_some());
    // The sender may ask; this server does not allow it.
    let refused = send(&[&tree], &target, &["--overwrite"]).failure(REFUSED);
    assert!(refused.contains("--allow-overwrite"), "{refused}");
    assert!(first_difference(&b, &dest.join("tree/b")).is_some());
    drop(server);
    let server = Serve::start_with(&dest, &["--allow-overwrite"]);
    let over = send(&[&tree], &server.target(), &["--overwrite"]).report();
    assert_same_tree(&tree, &dest.join("tree"));
    say(&format!(
        "existing_files_…: refused with `{why}`; --skip-existing skipped {} files, sent {} bytes; \
         --overwrite sent {} of {} bytes (skipped {}); {:.1} s",
        report_u(&skip, "skipped_files"),
        report_u(&skip, "bytes_sent"),
        report_u(&over, "bytes_sent"),
        report_u(&over, "bytes_total"),
        report_u(&over, "bytes_skipped"),
        t0.elapsed().as_secs_f64()
    ));
}

/// Names ending in `.atou-part` are ordinary names: a tree with a file
/// `foo.atou-part` and a symlink `foo` beside it arrives whole (the
/// partial file used to be `foo.atou-part`, and the symlink replaced it).
#[test]
fn a_file_named_like_a_partial_file_arrives_beside_its_namesake() {
    let scratch = TestDir::new("transfer-part-names");
    let tree = scratch.dir("src/tree");
    write_random(&tree.join("foo.atou-part"), 5000, 81);
    symlink("foo.atou-part", tree.join("foo")).unwrap();
    write_random(&tree.join("bar"), 3 * MIB, 82);
    write_random(&tree.join("bar.atou-part"), 2 * MIB + 1, 83);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let r = send(&[&tree], &server.target(), &[]).report();
    assert_eq!(report_u(&r, "files"), 3, "{r}");
    assert_same_tree(&tree, &dest.join("tree"));
}

/// `--skip-existing` alone trusts size and mtime (and says so); with
/// `--checksum` the receiver compares by BLAKE3: only the chunk that
/// differs is sent, and a file that differs is replaced only where the
/// sender may replace files.
#[test]
fn checksum_compares_existing_files_by_content_not_mtime() {
    let scratch = TestDir::new("transfer-checksum");
    let tree = scratch.dir("src/tree");
    let f = tree.join("f");
    write_random(&f, 3 * MIB + 7, 70);
    set_mtime(&f, FEB_3_2001, 0);
    let dest = scratch.dir("dest");
    let server = Serve::start_with(&dest, &["--allow-overwrite"]);
    let target = server.target();
    send(&[&tree], &target, &[]).report();
    // Same size and mtime, one chunk's content changed at the source.
    {
        let file = fs::OpenOptions::new().write(true).open(&f).unwrap();
        file.write_all_at(b"changed", MIB + 10).unwrap();
    }
    set_mtime(&f, FEB_3_2001, 0);
    let trusting = send(&[&tree], &target, &["--skip-existing"]).report();
    assert_eq!(report_u(&trusting, "skipped_files"), 1, "{trusting}");
    assert!(first_difference(&f, &dest.join("tree/f")).is_some());
    // --checksum without --overwrite: it differs, so it is refused.
    let why = send(&[&tree], &target, &["--skip-existing", "--checksum"]).failure(REFUSED);
    assert!(
        why.contains("differs") && why.contains("--overwrite"),
        "{why}"
    );
    assert!(first_difference(&f, &dest.join("tree/f")).is_some());
    let r = send(
        &[&tree],
        &target,
        &["--skip-existing", "--checksum", "--overwrite"],
    )
    .report();
    assert_eq!(first_difference(&f, &dest.join("tree/f")), None);
    assert_eq!(
        report_u(&r, "bytes_sent"),
        MIB,
        "only the changed chunk: {r}"
    );
    // Identical now: nothing sent, the file left as it is.
    let r = send(&[&tree], &target, &["--skip-existing", "--checksum"]).report();
    assert_eq!(report_u(&r, "bytes_sent"), 0, "{r}");
}

#[test]
fn checksum_reading_has_a_budget() {
    let scratch = TestDir::new("transfer-checksum-budget");
    let tree = scratch.dir("src/t");
    write_random(&tree.join("a"), 3 * MIB, 5);
    let dest = scratch.dir("dest");
    let server = Serve::start_with(&dest, &["--max-checksum", "2MiB"]);
    let target = server.target();
    send(&[&tree], &target, &[]).report();
    // Comparing 3 MiB by content is over the server's 2 MiB.
    let out = send(&[&tree], &target, &["--skip-existing", "--checksum"]);
    let why = out.failure(REFUSED);
    assert!(why.contains("--max-checksum"), "{why}");
    // On size and mtime it costs the server no reading.
    let r = send(&[&tree], &target, &["--skip-existing"]).report();
    assert_eq!(report_u(&r, "bytes_sent"), 0, "{r}");
}

// ---------------------------------------------------------------------------
// 5. Resume after a kill
// ---------------------------------------------------------------------------

const BIG: u64 = 400 * MIB;
/// Slow enough that "half" can be caught: 400 MiB take ~8 s.
const RATE: &str = "rate 400mbit";

/// Waits until about half of `size` bytes of `part` are on disk; panics if
/// the send ends first or it takes more than a minute.
fn wait_for_half(part: &Path, size: u64, sending: &mut Sending) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = allocated(part);
        if a >= size / 2 {
            return a;
        }
        assert!(
            sending.running(),
            "atou send ended before half was written ({a} bytes)"
        );
        assert!(
            Instant::now() < deadline,
            "only {a} bytes written after 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The partial file (`*.part`) of DEST's one file being received, in the
/// staging directory (named by where it goes, not nameable by a sender);
/// beside it there may be the record of a split file's parts.
fn staged_part(dest: &Path) -> PathBuf {
    let staging = dest.join(STAGING_DIR);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let parts: Vec<PathBuf> = fs::read_dir(&staging)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        let parts: Vec<PathBuf> = parts
            .into_iter()
            .filter(|p| p.extension().is_some_and(|x| x == "part"))
            .collect();
        match parts.as_slice() {
            [one] => return one.clone(),
            [] if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            other => panic!(
                "expected one partial file in {}: {other:?}",
                staging.display()
            ),
        }
    }
}

/// The names in DEST's staging directory that transfers left there (none
/// if there is no such directory): every entry but the server's own
/// table of hello timestamps, which it keeps there across restarts.
fn left_in_staging(dest: &Path) -> Vec<String> {
    fs::read_dir(dest.join(STAGING_DIR))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n != HELLO_TIMESTAMPS)
                .collect()
        })
        .unwrap_or_default()
}

fn check_resumed(what: &str, src: &Path, dest: &Path, r: &Value, at_kill: u64) {
    let (sent, skipped) = (report_u(r, "bytes_sent"), report_u(r, "bytes_skipped"));
    say(&format!(
        "a_killed_transfer_resumes…: {what}: killed with {} MiB on disk; the rerun sent {sent} bytes \
         ({:.1} %), skipped {skipped} ({:.1} %), chunks_resent {}, rounds {}",
        at_kill / MIB,
        100.0 * sent as f64 / BIG as f64,
        100.0 * skipped as f64 / BIG as f64,
        r["chunks_resent"],
        r["rounds"],
    ));
    assert!(
        first_difference(src, &dest.join("big.bin")).is_none(),
        "{what}: the resumed file differs"
    );
    let left = left_in_staging(dest);
    assert!(left.is_empty(), "{what}: the part file remains: {left:?}");
    assert!(skipped > 0, "{what}: nothing was resumed: {r}");
    assert!(
        (sent as f64) < 0.6 * BIG as f64,
        "{what}: the rerun sent {sent} of {BIG} bytes"
    );
    assert_eq!(sent + skipped, BIG, "{what}: {r}");
}

#[test]
fn a_killed_transfer_resumes_and_resends_under_60_percent() {
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-resume");
    let src = scratch.dir("src").join("big.bin");
    write_random(&src, BIG, 5);
    let args = ["--streams", "1", "--maxidle", "3"];

    // The sender is killed half way.
    {
        let dest = scratch.dir("dest-sender-killed");
        let server = Serve::start(&dest);
        let relay = Relay::start(server.addr, RATE, "", 5);
        let mut sending = spawn_send(&[&src], &relay.addr.to_string(), &args);
        let part = staged_part(&dest);
        let at_kill = wait_for_half(&part, BIG, &mut sending);
        let took = sending.started.elapsed().as_secs_f64();
        sending.kill();
        say(&format!(
            "  half of {BIG} bytes in {took:.1} s through `{RATE}`"
        ));
        assert!(part.exists());
        assert!(!dest.join("big.bin").exists());
        let rerun = send(&[&src], &server.target(), &args);
        check_resumed("sender killed", &src, &dest, &rerun.report(), at_kill);
        drop(relay);
    }

    // The receiver is killed half way, and started again.
    {
        let dest = scratch.dir("dest-server-killed");
        let mut server = Serve::start(&dest);
        let relay = Relay::start(server.addr, RATE, "", 6);
        let mut sending = spawn_send(&[&src], &relay.addr.to_string(), &args);
        let part = staged_part(&dest);
        let at_kill = wait_for_half(&part, BIG, &mut sending);
        server.kill();
        let failed = sending.finish(Duration::from_secs(60));
        let why = failed.failure(TIMEOUT);
        say(&format!(
            "  the sender, its receiver killed: `{why}` after {:.1} s",
            failed.secs
        ));
        drop(relay);
        assert!(part.exists());
        let server = Serve::start(&dest);
        let rerun = send(&[&src], &server.target(), &args);
        check_resumed("receiver killed", &src, &dest, &rerun.report(), at_kill);
    }
    say(&format!(
        "a_killed_transfer_resumes_and_resends_under_60_percent: {:.1} s",
        t0.elapsed().as_secs_f64()
    ));
}

/// A file of `size` bytes whose every 1 MiB chunk is half random, half
/// a repeated line: zstd makes each about half its size.
fn write_half_compressible(path: &Path, size: u64, seed: u64) {
    let mut rng = XorShift::new(seed);
    let mut f = File::create(path).unwrap();
    let line = b"let chunk = frame.expand(raw_len)?; // half of every MiB is this\n";
    let mut buf = vec![0u8; MIB as usize];
    for (i, b) in buf[MIB as usize / 2..].iter_mut().enumerate() {
        *b = line[i % line.len()];
    }
    let mut left = size;
    while left > 0 {
        let n = left.min(MIB) as usize;
        rng.fill(&mut buf[..MIB as usize / 2]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
}

fn compress_report(r: &Value) -> (u64, u64) {
    let c = &r["compress"];
    assert!(c.is_object(), "no compress figures: {r}");
    (u(&c["raw_bytes"]), u(&c["wire_bytes"]))
}

fn sent_plain(r: &Value) -> u64 {
    u(&r["compress"]["sent_plain"])
}

/// `--compress`: a tree of text arrives identical in well under half its
/// bytes on the wire; random data goes raw, every chunk of it, so the
/// wire carries exactly its bytes: alone, plain (its sample did not
/// shrink), and beside the text, framed, each of its chunks flagged raw.
#[test]
fn compress_shrinks_text_and_sends_random_data_raw() {
    let scratch = TestDir::new("transfer-compress");
    let src = scratch.dir("src");
    let text = src.join("text");
    fs::create_dir_all(text.join("sub")).unwrap();
    let mut raw_text = 0;
    for i in 0..40u64 {
        let line = format!("fn item_{i}(x: u64) -> u64 {{ x * {i} + {} }}\n", i * 7);
        let body = line.repeat(200 + 3000 * (i as usize % 5));
        raw_text += body.len() as u64;
        let dir = if i % 2 == 0 {
            text.clone()
        } else {
            text.join("sub")
        };
        fs::write(dir.join(format!("f{i}.rs")), body).unwrap();
    }
    let random = src.join("random.bin");
    write_random(&random, 5 * MIB + 123, 9);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);

    let r = send(&[&text], &server.target(), &["--compress"]).report();
    let (raw, wire) = compress_report(&r);
    say(&format!("compress: text {raw} bytes went as {wire}"));
    assert_eq!((raw, report_u(&r, "bytes_sent")), (raw_text, raw_text));
    assert!(wire * 4 < raw, "text: {wire} of {raw} bytes on the wire");
    assert_eq!(sent_plain(&r), 0, "{r}");
    assert_same_tree(&text, &dest.join("text"));

    let r = send(&[&random], &server.target(), &["--compress"]).report();
    assert_eq!(compress_report(&r), (5 * MIB + 123, 5 * MIB + 123), "{r}");
    assert_eq!(sent_plain(&r), 5 * MIB + 123, "{r}");
    assert!(first_difference(&random, &dest.join("random.bin")).is_none());

    // Text is most of these bytes: framed, the random file's chunks raw.
    let both = scratch.dir("both");
    let server_both = Serve::start(&both);
    let r = send(&[&text, &random], &server_both.target(), &["--compress"]).report();
    let (raw, wire) = compress_report(&r);
    say(&format!(
        "compress: text and random {raw} bytes went as {wire}"
    ));
    assert_eq!(raw, raw_text + 5 * MIB + 123);
    assert_eq!(sent_plain(&r), 0, "{r}");
    assert!(wire > 5 * MIB + 123 && wire < raw, "{wire} of {raw}");
    assert_same_tree(&text, &both.join("text"));
    assert!(first_difference(&random, &both.join("random.bin")).is_none());

    // Without the flag there are no such figures.
    let plain = format!("{}:plain", server.target());
    let r = send(&[&random], &plain, &[]).report();
    assert!(r.get("compress").is_none(), "{r}");
}

/// `--compress` sends a file whose bytes another file of the transfer
/// has only once: the receiver writes the others from its chunks, each
/// with its own mode and mtime, and the tree arrives identical. Where the
/// original is already there and skipped, its copy is sent as any file.
#[test]
fn compress_sends_identical_files_once() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = TestDir::new("transfer-compress-same");
    let tree = scratch.dir("src").join("tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    let big = 3 * MIB + 17;
    write_random(&tree.join("a.bin"), big, 3);
    write_random(&tree.join("b.bin"), big, 4);
    for copy in ["sub/a2.bin", "z.bin"] {
        fs::copy(tree.join("a.bin"), tree.join(copy)).unwrap();
    }
    fs::set_permissions(tree.join("z.bin"), fs::Permissions::from_mode(0o600)).unwrap();
    let text = "the same licence, word for word\n".repeat(500);
    fs::write(tree.join("COPYING"), &text).unwrap();
    fs::write(tree.join("sub/COPYING"), &text).unwrap();
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);

    let r = send(&[&tree], &server.target(), &["--compress"]).report();
    assert_eq!(report_u(&r, "copied_files"), 3, "{r}");
    assert_eq!(
        report_u(&r, "bytes_copied"),
        2 * big + text.len() as u64,
        "{r}"
    );
    assert_eq!(
        report_u(&r, "bytes_sent"),
        2 * big + text.len() as u64,
        "{r}"
    );
    assert_same_tree(&tree, &dest.join("tree"));

    // The original there already, the copies gone: they are sent.
    fs::remove_file(dest.join("tree/z.bin")).unwrap();
    fs::remove_file(dest.join("tree/sub/COPYING")).unwrap();
    let args = ["--compress", "--skip-existing"];
    let r = send(&[&tree], &server.target(), &args).report();
    assert_eq!(report_u(&r, "copied_files"), 0, "{r}");
    assert_eq!(report_u(&r, "bytes_sent"), big + text.len() as u64, "{r}");
    // (The directories' mtimes are this host's now: the removals moved
    // them, and --skip-existing sets only those of directories it makes.)
    for f in ["z.bin", "sub/COPYING"] {
        assert!(
            first_difference(&tree.join(f), &dest.join("tree").join(f)).is_none(),
            "{f}"
        );
    }
    let mode = fs::metadata(dest.join("tree/z.bin"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // Without --compress every file is sent.
    let plain = scratch.dir("plain");
    let server_plain = Serve::start(&plain);
    let r = send(&[&tree], &server_plain.target(), &[]).report();
    assert_eq!(report_u(&r, "copied_files"), 0, "{r}");
    assert_eq!(
        report_u(&r, "bytes_sent"),
        4 * big + 2 * text.len() as u64,
        "{r}"
    );
    assert_same_tree(&tree, &plain.join("tree"));
}

/// A `--compress` transfer killed half way resumes: the rerun sends only
/// the chunks the receiver does not hold (offsets and values are of the
/// raw bytes, whatever went on the wire), and the file arrives whole.
#[test]
fn a_killed_compressed_transfer_resumes() {
    const SIZE: u64 = 96 * MIB;
    let scratch = TestDir::new("transfer-compress-resume");
    let src = scratch.dir("src").join("big.bin");
    write_half_compressible(&src, SIZE, 11);
    let args = ["--compress", "--streams", "1", "--maxidle", "3"];
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let relay = Relay::start(server.addr, "rate 100mbit", "", 7);
    let mut sending = spawn_send(&[&src], &relay.addr.to_string(), &args);
    let part = staged_part(&dest);
    let at_kill = wait_for_half(&part, SIZE, &mut sending);
    sending.kill();
    assert!(!dest.join("big.bin").exists());
    let r = send(&[&src], &server.target(), &args).report();
    let (sent, skipped) = (report_u(&r, "bytes_sent"), report_u(&r, "bytes_skipped"));
    say(&format!(
        "a_killed_compressed_transfer_resumes: killed with {} MiB on disk; the rerun sent {sent}, skipped {skipped}, {:?}",
        at_kill / MIB,
        compress_report(&r)
    ));
    assert!(first_difference(&src, &dest.join("big.bin")).is_none());
    assert!(skipped > 0, "nothing was resumed: {r}");
    assert_eq!(sent + skipped, SIZE, "{r}");
    let (raw, wire) = compress_report(&r);
    assert_eq!(raw, sent);
    assert!(wire < raw * 3 / 4, "{wire} of {raw} on the wire");
    assert!(left_in_staging(&dest).is_empty());
    drop(relay);
}

// ---------------------------------------------------------------------------
// 6. A full destination
// ---------------------------------------------------------------------------

fn is_root() -> bool {
    fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) == 0
}

/// A mounted tmpfs, unmounted when dropped (also when the test fails).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            say(&format!(
                "  umount {} failed; detaching it lazily",
                self.0.display()
            ));
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

#[test]
fn a_full_destination_fails_cleanly() {
    let name = "a_full_destination_fails_cleanly";
    if !is_root() {
        common::cannot_run(
            name,
            "not root (mounting a small tmpfs needs root; CI runs as root)",
        );
        return;
    }
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-full");
    let tree = scratch.dir("src/t");
    // atou sends the largest files first: the 5 MiB file fits in the 8 MiB
    // left on the tmpfs and completes first; the small ones after it
    // overflow.
    write_random(&tree.join("a_big"), 5 * MIB, 60);
    let smalls: Vec<String> = (1..=20).map(|i| format!("z_small_{i:02}")).collect();
    for (i, small) in smalls.iter().enumerate() {
        write_random(&tree.join(small), 200 * KIB, 61 + i as u64);
    }
    let dest = scratch.dir("dest");
    let mount = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=12m", "tmpfs"])
        .arg(&dest)
        .output()
        .expect("run mount");
    if !mount.status.success() {
        common::cannot_run(
            name,
            &format!(
                "cannot mount a tmpfs: {}",
                String::from_utf8_lossy(&mount.stderr).trim()
            ),
        );
        return;
    }
    let _mounted = Mount(dest.clone());
    // 4 MiB already used, by someone else: 8 MiB left of 12.
    write_random(&dest.join("ballast"), 4 * MIB, 59);
    let server = Serve::start(&dest);

    // Files that could never fit (a sparse 1 GiB file into 12 MiB) are
    // refused before anything is written: the receiver keeps a value per
    // chunk, so a manifest must not claim more than the file system holds.
    let huge = scratch.dir("src/huge");
    File::create(huge.join("sparse"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let refused = send(&[&huge], &server.target(), &[]).failure(REFUSED);
    assert!(
        refused.contains("more than the whole file system"),
        "{refused}"
    );
    assert!(
        !dest.join("huge").exists(),
        "a refused transfer wrote something"
    );

    // One stream, so the big file's chunks all go (and are written) before
    // any small file's: with two, a small file could take the space the
    // big file's last chunk needs. And a window of 64 segments (90 KiB):
    // in CI, on a loaded machine, a_big's write once failed for want of
    // room, so 3 MiB of small files had been written before its last
    // chunk; a chunk of a_big dropped on loopback and resent while the
    // default window (32768 segments) let the small files through is the
    // way that can happen, and 90 KiB cannot fill the 3 MiB left.
    let sent = send(
        &[&tree],
        &server.target(),
        &["--streams", "1", "--rcvwin", "64"],
    );
    let why = sent.failure(PARTIAL);
    let listing: Vec<String> = fs::read_dir(dest.join("t"))
        .map(|d| {
            let mut names: Vec<String> = d
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            names
        })
        .unwrap_or_default();
    say(&format!(
        "{name}: `{why}`; in DEST/t: {listing:?} ({:.1} s)",
        t0.elapsed().as_secs_f64()
    ));
    assert!(why.contains("no space left"), "{why}");
    assert!(
        smalls.iter().any(|s| why.contains(s.as_str())),
        "the reason does not name the file: {why}"
    );
    // No file takes its final name before the finish has compared its
    // hash, and the finish never came: nothing is in place, and a_big,
    // complete before the disk filled, waits whole in the staging
    // directory for the rerun.
    let in_place: Vec<&String> = smalls
        .iter()
        .filter(|s| dest.join("t").join(s).exists())
        .collect();
    assert!(
        in_place.is_empty(),
        "in place without a finish: {in_place:?}"
    );
    assert!(
        !dest.join("t/a_big").exists(),
        "a_big in place without a finish"
    );
    let whole_big = fs::read_dir(dest.join(STAGING_DIR))
        .unwrap()
        .any(|e| first_difference(&tree.join("a_big"), &e.unwrap().path()).is_none());
    assert!(whole_big, "a_big is not whole in the staging directory");
    drop(server);
}

// ---------------------------------------------------------------------------
// 7. Through a lossy path
// ---------------------------------------------------------------------------

/// A relay between one `atou send` and its server that drops the first
/// handshake response to each connection (by the client id every
/// response carries in the clear after its 4-byte prefix), so every
/// hello, the one carrying the plan included, is said again. Returns
/// its address and, once stopped, how many responses it dropped.
struct FirstResponseDropper {
    addr: SocketAddr,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl FirstResponseDropper {
    /// Handshake response kind (src/proto/crypto/handshake.rs).
    const KIND_RESPONSE: u8 = 0x21;

    fn start(server: SocketAddr) -> FirstResponseDropper {
        use std::collections::{HashMap, HashSet};
        use std::sync::atomic::Ordering;
        let outer = UdpSocket::bind("127.0.0.1:0").unwrap();
        outer
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let addr = outer.local_addr().unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut inner: HashMap<SocketAddr, UdpSocket> = HashMap::new();
            let mut answered: HashSet<[u8; 8]> = HashSet::new();
            let mut dropped = 0;
            let mut buf = vec![0u8; 65_536];
            while !stopping.load(Ordering::Relaxed) {
                if let Ok((n, client)) = outer.recv_from(&mut buf) {
                    let up = inner.entry(client).or_insert_with(|| {
                        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
                        s.connect(server).unwrap();
                        s.set_nonblocking(true).unwrap();
                        s
                    });
                    let _ = up.send(&buf[..n]);
                }
                for (client, up) in &inner {
                    while let Ok(n) = up.recv(&mut buf) {
                        if n >= 12 && buf[3] == Self::KIND_RESPONSE {
                            let id: [u8; 8] = buf[4..12].try_into().unwrap();
                            if answered.insert(id) {
                                dropped += 1;
                                continue;
                            }
                        }
                        let _ = outer.send_to(&buf[..n], client);
                    }
                }
            }
            dropped
        });
        FirstResponseDropper {
            addr,
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A hello said again after its response was lost (here: the first
/// response to every connection, the plan's included) must not make the
/// receiver act on its request twice: the plan rode the hello, and a
/// second copy of it would fail the session ("a second plan for one
/// session"). The transfer succeeds and the tree arrives identical.
#[test]
fn a_transfer_whose_hello_responses_are_lost_once_arrives_identical() {
    let scratch = TestDir::new("transfer-rehello");
    let tree = scratch.dir("src/rehello");
    write_random(&tree.join("one"), 300 * KIB, 81);
    write_random(&tree.join("two"), 40 * KIB, 82);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let relay = FirstResponseDropper::start(server.addr);
    let sent = send(&[&tree], &relay.addr.to_string(), &[]);
    let dropped = relay.stop();
    let r = sent.report();
    assert!(dropped >= 1, "no response dropped");
    assert_same_tree(&tree, &dest.join("rehello"));
    say(&format!(
        "a_transfer_whose_hello_responses_are_lost_once_arrives_identical: {dropped} responses \
         dropped, {} bytes in {:.2} s",
        report_u(&r, "bytes_sent"),
        sent.secs
    ));
}

#[test]
fn a_transfer_through_a_lossy_relay_arrives_identical() {
    let t0 = Instant::now();
    let (fwd, rev, seed) = ("loss 1% delay 20ms", "delay 20ms", 11);
    let scratch = TestDir::new("transfer-lossy");
    let tree = scratch.dir("src/lossy");
    for (i, (name, size)) in [
        ("eight", 8 * MIB),
        ("six", 6 * MIB + 3),
        ("four", 4 * MIB),
        ("one", MIB + 5),
        ("half", 512 * KIB),
        ("tiny", 100),
    ]
    .iter()
    .enumerate()
    {
        let p = tree.join(name);
        write_random(&p, *size, 70 + i as u64);
        set_mtime(&p, FEB_3_2001 + 7 * i as u64, 7 + i as u32);
    }
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let relay = Relay::start(server.addr, fwd, rev, seed);
    let sent = send(&[&tree], &relay.addr.to_string(), &[]);
    let r = sent.report();
    let counts = relay.stop();
    assert_same_tree(&tree, &dest.join("lossy"));
    let rxmts: Vec<u64> = r["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .map(|s| u(&s["rxmts"]))
        .collect();
    let timeouts: Vec<u64> = r["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| u(&s["timeouts"]))
        .collect();
    say(&format!(
        "a_transfer_through_a_lossy_relay_arrives_identical: fwd `{fwd}` rev `{rev}` seed {seed}: \
         {} bytes in {:.1} s, per-stream rxmts {rxmts:?}, timeouts {timeouts:?}; relay lost {} of {} \
         ({:.1} s in all)",
        report_u(&r, "bytes_sent"),
        sent.secs,
        counts["fwd"]["lost"],
        counts["fwd"]["offered"],
        t0.elapsed().as_secs_f64()
    ));
    assert!(
        u(&counts["fwd"]["lost"]) > 0,
        "the relay lost nothing: {counts}"
    );
    assert!(
        rxmts.iter().sum::<u64>() > 0,
        "lost segments were never retransmitted?"
    );
}

/// A finish's connection is opened while its round runs and held until
/// the round's last byte goes; a hold is bounded (half of `--maxidle`
/// here), so a round longer than that opens the finish's connection
/// again each time its hold runs out, and the finish still finds one
/// welcomed (before, it went on a fresh connection: a hello's round trip
/// more at the end of every transfer longer than 5 s). Counted at the
/// relay: the plan's, the data's, and a finish's every half second of a
/// 3-s round, where it was four connections in all.
#[test]
fn a_finish_held_longer_than_its_hold_is_opened_again_while_the_round_runs() {
    let scratch = TestDir::new("transfer-finish-held");
    let tree = scratch.dir("src/held");
    write_random(&tree.join("three"), 3 * MIB, 91);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let relay = Relay::start(server.addr, "delay 5ms", "delay 5ms", 12);
    let sent = send(
        &[&tree],
        &relay.addr.to_string(),
        &["--bwlimit", "8mbit", "--maxidle", "1", "--streams", "1"],
    );
    sent.report();
    let counts = relay.stop();
    assert_same_tree(&tree, &dest.join("held"));
    let opened = u(&counts["sources"]["opened"]);
    say(&format!(
        "a_finish_held_longer_than_its_hold_is_opened_again_while_the_round_runs: \
         {opened} connections in {:.1} s",
        sent.secs
    ));
    assert!(
        opened >= 6,
        "{opened} connections for a {:.1}-s round: the finish's was not held again",
        sent.secs
    );
}

/// A path that corrupts datagrams past the UDP checksum (the relay flips a
/// bit and re-sends), unauthenticated (`--no-auth`), so that corrupted
/// datagrams reach the transfer: a corrupted chunk fails its BLAKE3 check
/// and is sent again; a corrupted header cannot place data elsewhere.
/// (Authenticated, the same datagrams are dropped before the transport:
/// `corrupted_datagrams_are_dropped_by_the_authenticated_path`.)
#[test]
fn corrupted_chunks_are_sent_again() {
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-corrupt");
    let tree = scratch.dir("src/c");
    write_random(&tree.join("twenty"), 20 * MIB, 90);
    write_random(&tree.join("small"), 1000, 91);
    // 20 MiB in ~14,500 datagrams, of which 0.1 % is ~15 corrupted.
    let r = send_through_corruption("corrupted_chunks_are_sent_again", &scratch, &tree, 5, &[]);
    say(&format!("  ({:.1} s)", t0.elapsed().as_secs_f64()));
    assert!(u(&r["rounds"]) >= 2, "{r}");
    assert!(r["verified"].as_bool().unwrap());
}

/// Sends `tree` (`scratch`'s `src/c`), unauthenticated, through a relay
/// that corrupts 0.1 % of datagrams (seed `seed`) in 1472-byte datagrams,
/// as across a 1500-byte path (a relay on loopback is this host, where the
/// default is 8972); checks that the tree arrived whole and that some
/// chunk was sent again, and returns the sender's report.
fn send_through_corruption(
    test: &str,
    scratch: &TestDir,
    tree: &Path,
    seed: u64,
    extra: &[&str],
) -> Value {
    let dest = scratch.dir("dest");
    let server = Serve::start_with(&dest, &["--no-auth"]);
    let relay = Relay::start(server.addr, "corrupt 0.1%", "", seed);
    let mut args = vec!["--no-auth", "--mss", "1472"];
    args.extend_from_slice(extra);
    let r = send(&[tree], &relay.addr.to_string(), &args).report();
    let counts = relay.stop();
    assert_same_tree(tree, &dest.join("c"));
    let resent = u(&r["chunks_resent"]);
    say(&format!(
        "{test}: {resent} chunks sent again in {} rounds; relay: {counts}",
        u(&r["rounds"])
    ));
    assert!(resent > 0, "no chunk was corrupted: the test tests nothing");
    r
}

/// The finish goes as soon as the first round's last data went, before
/// the streams' answers (docs/transfer.md, "The pipeline"): where a chunk
/// failed its check, the receiver answers it with the chunks missing and
/// the session goes on, so a repair round follows and the second finish
/// verifies every file. One stream, so that the round is one connection.
/// (End to end this passes with the finish after the answers too; the
/// receiver's side is pinned by its unit tests in
/// src/transfer/receive/session.rs.)
#[test]
fn a_finish_sent_with_the_last_data_names_the_corrupted_chunks_for_a_repair_round() {
    let scratch = TestDir::new("transfer-corrupt-finish");
    let tree = scratch.dir("src/c");
    write_random(&tree.join("eight"), 8 * MIB, 93);
    let r = send_through_corruption(
        "a_finish_sent_with_the_last_data_names_the_corrupted_chunks_for_a_repair_round",
        &scratch,
        &tree,
        6,
        &["--streams", "1"],
    );
    assert!(u(&r["rounds"]) >= 2, "{r}");
    assert!(r["verified"].as_bool().unwrap());
}

/// The same corrupting path, authenticated (the default): every corrupted
/// datagram fails to open and is dropped before the transport, so no
/// corrupted chunk ever reaches its BLAKE3 check.
#[test]
fn corrupted_datagrams_are_dropped_by_the_authenticated_path() {
    let t0 = Instant::now();
    let scratch = TestDir::new("transfer-corrupt-auth");
    let tree = scratch.dir("src/c");
    write_random(&tree.join("twenty"), 20 * MIB, 92);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let relay = Relay::start(server.addr, "corrupt 0.1%", "corrupt 0.1%", 6);
    // 1472-byte datagrams, as in corrupted_chunks_are_sent_again.
    let sent = send(&[&tree], &relay.addr.to_string(), &["--mss", "1472"]);
    let r = sent.report();
    let counts = relay.stop();
    assert_same_tree(&tree, &dest.join("c"));
    say(&format!(
        "corrupted_datagrams_are_dropped_by_the_authenticated_path: relay {counts} ({:.1} s)",
        t0.elapsed().as_secs_f64()
    ));
    assert!(
        u(&counts["fwd"]["corrupted"]) > 0,
        "nothing was corrupted: the test tests nothing ({counts})"
    );
    assert_eq!(u(&r["chunks_resent"]), 0, "a corrupted chunk got through");
    assert!(r["verified"].as_bool().unwrap());
}

/// An authorized key with `subdir=` writes only beneath it, and without
/// `overwrite` cannot replace files even where the server allows it.
#[test]
fn an_authorized_keys_subdir_confines_its_key() {
    let scratch = TestDir::new("transfer-confined");
    let tree = scratch.dir("src/tree");
    write_random(&tree.join("a"), 1000, 93);
    let dest = scratch.dir("dest");
    let KeyFile {
        key, authorized, ..
    } = KeyFile::new(&scratch, "confined", "subdir=jail");
    let server = Serve::start_keyed(&dest, &authorized, &["--allow-overwrite"]);
    let identity = key.to_str().unwrap();
    let target = format!("{}:sub", server.target());
    let sent = send(&[&tree], &target, &["--identity", identity]);
    sent.report();
    assert_same_tree(&tree, &dest.join("jail/sub/tree"));
    assert!(
        !dest.join("sub").exists(),
        "the key wrote outside its subdir"
    );
    // `..` cannot climb out: the subdir is a plain relative name.
    let out = send(
        &[&tree],
        &format!("{}:../x", server.target()),
        &["--identity", identity],
    );
    assert_eq!(out.code(), Some(2), "{}", out.stderr);
    // Replacing needs `overwrite` on the key's line.
    let again = send(&[&tree], &target, &["--identity", identity, "--overwrite"]);
    assert_eq!(again.code(), Some(REFUSED), "{}", again.stderr);
    assert!(again.stderr.contains("`overwrite`"), "{}", again.stderr);
    // The standard test key is not in this file at all: the server does
    // not answer it (a prober learns nothing), and the client says what to
    // check once its wait is over (10: worth retrying once fixed).
    let stranger = send(&[&tree], &target, &["--maxidle", "2"]);
    assert_eq!(stranger.code(), Some(NETWORK), "{}", stranger.stderr);
    assert!(
        stranger.stderr.contains("authorized keys"),
        "{}",
        stranger.stderr
    );
}

#[test]
fn a_confined_keys_symlinks_are_judged_where_they_lead() {
    let scratch = TestDir::new("transfer-confined-links");
    let dest = scratch.dir("dest");
    fs::create_dir_all(dest.join("bob")).unwrap();
    fs::write(dest.join("bob/secret"), "bob's").unwrap();
    let key = scratch.path("alice");
    let out = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["keygen", "-C", "alice", "-f"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let authorized = scratch.path("authorized_keys");
    let line = fs::read_to_string(scratch.path("alice.pub")).unwrap();
    fs::write(&authorized, format!("subdir=alice {line}")).unwrap();
    let server = Serve::start_keyed(&dest, &authorized, &[]);
    let identity = key.to_str().unwrap();
    // Each arrives as DEST/alice/sub/NAME/...: three levels below DEST.
    let target = format!("{}:sub", server.target());
    // rsync's CVE-2024-12088: `d/up -> ..` and a link through it, each
    // inside DEST when read as text, together at /etc.
    let chain = scratch.dir("src/chain");
    fs::create_dir_all(chain.join("d")).unwrap();
    symlink("..", chain.join("d/up")).unwrap();
    symlink("d/up/d/up/d/up/../../../../../../../etc", chain.join("etc")).unwrap();
    // Into a sibling key's directory: inside DEST, outside alice.
    let peek = scratch.dir("src/peek");
    symlink("../../../bob", peek.join("bob")).unwrap();
    for (tree, link) in [(&chain, "etc"), (&peek, "bob")] {
        let out = send(&[tree], &target, &["--identity", identity]);
        assert_eq!(out.code(), Some(REFUSED), "{}", out.stderr);
        assert!(
            out.stderr.contains("leads out of this key's subdirectory"),
            "{}",
            out.stderr
        );
        let name = tree.file_name().unwrap();
        let placed = dest.join("alice/sub").join(name).join(link);
        assert!(
            fs::symlink_metadata(&placed).is_err(),
            "{} was created",
            placed.display()
        );
    }
    // A link that stays in alice's directory through the chain is fine.
    let fine = scratch.dir("src/fine");
    fs::create_dir_all(fine.join("d")).unwrap();
    symlink("..", fine.join("d/up")).unwrap();
    symlink("d/up/d/up/../..", fine.join("top")).unwrap();
    let out = send(&[&fine], &target, &["--identity", identity]);
    out.report();
    assert_eq!(
        fs::read_link(dest.join("alice/sub/fine/top")).unwrap(),
        Path::new("d/up/d/up/../..")
    );
}

#[test]
fn thirty_two_senders_at_once_all_finish_by_waiting_their_turn() {
    let scratch = TestDir::new("transfer-busy");
    let dest = scratch.dir("dest");
    // The server's defaults: 8 transfers at once per address.
    let server = Serve::start(&dest);
    scratch.dir("src");
    let srcs: Vec<PathBuf> = (0..32)
        .map(|i| {
            let f = scratch.path(&format!("src/f{i:02}"));
            write_random(&f, 2 * MIB + i * 4099, 500 + i);
            f
        })
        .collect();
    let started = Instant::now();
    let sending: Vec<Sending> = srcs
        .iter()
        .enumerate()
        .map(|(i, f)| spawn_send(&[f], &format!("{}:s{i:02}", server.target()), &[]))
        .collect();
    let sent: Vec<Sent> = sending
        .into_iter()
        .map(|s| s.finish(Duration::from_secs(240)))
        .collect();
    let failed: Vec<String> = sent
        .iter()
        .enumerate()
        .filter(|(_, s)| s.code() != Some(0))
        .map(|(i, s)| format!("sender {i}: {:?} {}", s.code(), s.stderr.trim()))
        .collect();
    say(&format!(
        "32 senders at once: {} finished in {:.1} s",
        32 - failed.len(),
        started.elapsed().as_secs_f64()
    ));
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    for (i, f) in srcs.iter().enumerate() {
        let got = dest.join(format!("s{i:02}")).join(f.file_name().unwrap());
        assert_eq!(first_difference(f, &got), None, "{}", got.display());
    }
}

#[test]
fn a_sender_that_will_not_wait_for_a_busy_server_exits_10() {
    let scratch = TestDir::new("transfer-busy-now");
    let dest = scratch.dir("dest");
    let server = Serve::start_with(&dest, &["--max-sessions-per-ip", "1"]);
    scratch.dir("src");
    let big = scratch.path("src/big");
    write_random(&big, 64 * MIB, 77);
    let small = scratch.path("src/small");
    write_random(&small, 1000, 78);
    // One transfer holds the address's one place, slowly.
    let mut first = spawn_send(
        &[&big],
        &format!("{}:a", server.target()),
        &["--bwlimit", "40mbit"],
    );
    // Its session is planned once its claim or partial file is there (the
    // staging directory itself is made when the server starts).
    let until = Instant::now() + Duration::from_secs(20);
    let started = || !left_in_staging(&dest).is_empty();
    while !started() {
        assert!(Instant::now() < until, "the first transfer did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = send(
        &[&small],
        &format!("{}:b", server.target()),
        &["--wait-busy", "0"],
    );
    assert_eq!(out.code(), Some(NETWORK), "{}", out.stderr);
    assert!(out.stderr.contains("busy"), "{}", out.stderr);
    assert!(
        out.stderr.contains("--max-sessions-per-ip"),
        "{}",
        out.stderr
    );
    // Waiting, it gets in once the first is done.
    let waited = send(
        &[&small],
        &format!("{}:b", server.target()),
        &["--wait-busy", "60"],
    );
    assert_eq!(waited.code(), Some(0), "{}", waited.stderr);
    assert!(first.running() || dest.join("a/big").exists());
    first.kill();
}

/// An off-path spoofer floods `atou serve` with garbage hellos in the
/// client's address (127.0.0.1, another port: it cannot see the answers),
/// 2,000 a second, a new client id each, past that address's handshake
/// budget of 20 a second. That kept the budget empty and every hello of
/// the authorized client was dropped: its send timed out. Its hello is
/// now answered with a cookie, and with it the client is held to a budget
/// no spoofer can spend.
#[test]
fn a_spoofer_flooding_in_the_clients_address_does_not_lock_it_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let scratch = TestDir::new("transfer-spoofed-source");
    let dest = scratch.dir("dest");
    let src = scratch.dir("src").join("small.bin");
    fs::write(&src, vec![7u8; 100_000]).unwrap();
    let server = Serve::start(&dest);
    let to = server.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let flooding = Arc::clone(&stop);
    let flood = std::thread::spawn(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut sent = 0u64;
        while !flooding.load(Ordering::Relaxed) {
            for _ in 0..20 {
                let h = common::garbage_hello(0x5eed_0000_0000_0000 ^ sent);
                if sock.send_to(&h, to).is_ok() {
                    sent += 1;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        sent
    });
    // The address's budget is spent before the client starts.
    std::thread::sleep(Duration::from_millis(500));
    let sent = send(&[&src], &server.target(), &[]);
    stop.store(true, Ordering::Relaxed);
    let flooded = flood.join().unwrap();
    say(&format!(
        "  {flooded} spoofed hellos; the send took {:.2} s",
        sent.secs
    ));
    assert!(flooded >= 500, "{flooded}");
    let r = sent.report();
    assert_eq!(report_u(&r, "files"), 1);
    assert_eq!(
        fs::read(dest.join("small.bin")).unwrap(),
        vec![7u8; 100_000]
    );
}

/// One hello replayed far faster than any client resends one (the price
/// of a hello): once the server has seen it 64 times in a second, it asks the
/// kernel to drop its further copies (a socket filter on its client id),
/// so they cost no system call to read. The copies are paced so that the
/// server could read every one; without the filter it reads them all.
#[cfg(target_os = "linux")]
#[test]
fn a_replayed_hello_is_dropped_before_it_is_read() {
    use atou::internals::crypto::handshake::{random_id, ClientConfig, Initiator};
    use atou::internals::crypto::{Cipher, StaticKeypair};
    use std::io::{BufRead, BufReader};

    let scratch = TestDir::new("transfer-replay-filter");
    let dest = scratch.dir("dest");
    let mut child = keyed_serve(&dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start atou serve");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let server = Daemon::new(child);
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr: SocketAddr = line
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in `{line}`"));
    // A hello of a key the server does not know, as a capture holds it.
    let server_key = atou::internals::crypto::parse_public_key(
        fs::read_to_string(&keys().server_pub).unwrap().trim(),
    )
    .unwrap();
    let config = ClientConfig {
        identity: StaticKeypair::generate().unwrap(),
        server_key,
        cipher: Cipher::for_this_cpu(),
        params: Vec::new(),
    };
    let now_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let hello = Initiator::new(&config, random_id().unwrap(), now_ns)
        .unwrap()
        .hello()
        .to_vec();
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let replay = |copies: usize| {
        for i in 0..copies {
            sock.send_to(&hello, addr).unwrap();
            if i % 20 == 19 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    replay(200);
    std::thread::sleep(Duration::from_millis(300));
    replay(3000);
    std::thread::sleep(Duration::from_millis(300));
    // SIGINT: the server stops and prints its counters.
    let child = server.release();
    let interrupted = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let _ = child.wait_with_output();
    say(&rest);
    assert!(rest.contains("its copies are dropped unread"), "{rest}");
    let stopped = rest
        .lines()
        .find(|l| l.contains("stopped after"))
        .unwrap_or_else(|| panic!("no last line: {rest}"));
    let read_copies: u64 = stopped
        .split("replays ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no replay count in `{stopped}`"));
    assert!(stopped.contains("(dropped unread: 1 hellos)"), "{stopped}");
    // The first 200 copies were read (64 of them named the replay); of
    // the 3,000 after, none.
    assert!(read_copies <= 200, "{stopped}");
    assert!(read_copies >= 64, "{stopped}");
}

#[test]
fn abandoned_partial_files_go_after_the_staging_ttl() {
    let scratch = TestDir::new("transfer-staging-ttl");
    let dest = scratch.dir("dest");
    let staging = dest.join(".atou-staging");
    fs::create_dir(&staging).unwrap();
    set_mode(&staging, 0o700);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let day = 86_400;
    let old = staging.join("0123456789abcdef0123456789abcdef.part");
    let recent = staging.join("fedcba9876543210fedcba9876543210.part");
    for (f, age) in [(&old, 8 * day), (&recent, day)] {
        write_random(f, 100_000, 3);
        set_mtime(f, now - age, 0);
    }
    // A directory there is not atou's to remove, however old; nor is the
    // server's table of hello timestamps, however long no client came.
    fs::create_dir(staging.join("not-ours")).unwrap();
    let table = staging.join(HELLO_TIMESTAMPS);
    fs::write(&table, atou::internals::io::hello_timestamps::encode(&[])).unwrap();
    set_mtime(&table, now - 30 * day, 0);
    // 0 keeps everything.
    let server = Serve::start_with(&dest, &["--staging-ttl", "0"]);
    drop(server);
    assert!(old.exists() && recent.exists());
    // The default is a week: the 8-day-old file goes at start.
    let server = Serve::start(&dest);
    assert!(!old.exists(), "{} is still there", old.display());
    assert!(recent.exists());
    assert!(staging.join("not-ours").is_dir());
    // A shorter time takes the other one too.
    drop(server);
    let _server = Serve::start_with(&dest, &["--staging-ttl", "12h"]);
    assert!(!recent.exists());
    assert!(table.is_file(), "the table of hello timestamps was removed");
}

/// The per-key quota of staged files: one key starts a transfer, abandons it once its
/// partial file is there, and starts another. Before
/// `--max-staged-per-key` the second was taken like the first, so a key
/// could abandon and repeat until DEST's disk was full of partial files
/// kept for `--staging-ttl` (a week), for every other key too. Now the
/// abandoned transfer counts against the key's quota, after a restart
/// too, and the second is refused (5) saying what is staged and how to
/// free it; a sparse file counts at its size; another key has a quota of
/// its own; the abandoned transfer resumes, not counted twice, and
/// finished it gives the key its whole quota back.
#[test]
fn a_keys_abandoned_transfers_count_against_its_quota_of_staged_files() {
    let scratch = TestDir::new("transfer-staged-quota");
    let first = scratch.dir("src/first");
    write_random(&first.join("f"), 12 * MIB, 31);
    let second = scratch.dir("src/second");
    write_random(&second.join("f"), 12 * MIB, 32);
    let dest = scratch.dir("dest");
    let (other_key, other_line) = common::keygen(scratch.root(), "other", TEST_CACHE);
    let other = ["--identity", other_key.to_str().unwrap()];
    let authorized = scratch.path("authorized_keys");
    let ours = fs::read_to_string(&keys().authorized).unwrap();
    fs::write(&authorized, format!("{}\n{other_line}", ours.trim_end())).unwrap();
    let quota = ["--max-staged-per-key", "16MiB"];
    let server = Serve::start_keyed(&dest, &authorized, &quota);

    // Slowed (12 MiB take 6 s), and killed once a chunk is in its
    // partial file.
    let args = ["--streams", "1", "--bwlimit", "16mbit"];
    let mut abandoned = spawn_send(&[&first], &server.target(), &args);
    let part = staged_part(&dest);
    let deadline = Instant::now() + Duration::from_secs(60);
    while allocated(&part) < 2 * MIB {
        assert!(abandoned.running(), "the first transfer ended by itself");
        assert!(Instant::now() < deadline, "no chunk written in 60 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    abandoned.kill();

    let refused = |server: &Serve| {
        let why = send(&[&second], &server.target(), &[]).failure(REFUSED);
        for want in [
            "12.00 MiB staged",
            "12.00 MiB more",
            "16.00 MiB per key (--max-staged-per-key)",
            "run the unfinished transfers again",
            "7d (--staging-ttl)",
        ] {
            assert!(why.contains(want), "`{want}` is not in: {why}");
        }
        assert!(
            !dest.join("second").exists(),
            "a refused transfer wrote something"
        );
    };
    refused(&server);
    // A restarted server counts it from its claim in the staging directory.
    drop(server);
    let server = Serve::start_keyed(&dest, &authorized, &quota);
    refused(&server);

    // A sparse file counts at its size, whatever it holds.
    let sparse = scratch.dir("src/sparse");
    File::create(sparse.join("s"))
        .unwrap()
        .set_len(64 * MIB)
        .unwrap();
    let why = send(&[&sparse], &server.target(), &other).failure(REFUSED);
    assert!(why.contains("would stage 64.00 MiB"), "{why}");
    // Another key is not held to the first one's partial files.
    send(&[&second], &server.target(), &other).report();
    assert_same_tree(&second, &dest.join("second"));

    // The abandoned transfer resumes within the quota: its 12 MiB once.
    let resumed = send(&[&first], &server.target(), &[]).report();
    assert!(report_u(&resumed, "bytes_skipped") > 0, "{resumed}");
    // (The file: `first` itself keeps the mode 0700 the abandoned run
    // created it with, as any resumed transfer's directories do.)
    assert_eq!(
        first_difference(&first.join("f"), &dest.join("first/f")),
        None
    );
    // Finished, it holds nothing: the key's next 12 MiB go.
    let again = format!("{}:again", server.target());
    send(&[&second], &again, &[]).report();
    assert_same_tree(&second, &dest.join("again/second"));
    let left = left_in_staging(&dest);
    assert!(left.is_empty(), "left in the staging directory: {left:?}");
}

/// UDP ports bound to 127.0.0.1 and not connected, held by process `pid`.
fn loopback_listening_ports(pid: u32) -> Vec<u16> {
    let inodes: Vec<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().to_string();
                    l.strip_prefix("socket:[")?
                        .strip_suffix(']')
                        .map(String::from)
                })
                .collect()
        })
        .unwrap_or_default();
    let table = fs::read_to_string(format!("/proc/{pid}/net/udp")).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
            let (ip, port) = local.split_once(':')?;
            (ip == "0100007F" && *remote == "00000000:0000" && inodes.iter().any(|i| i == inode))
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .collect()
}

/// `atou copy SRC LOCALDIR` receives on a loopback port any local user can
/// find in /proc/net/udp: nobody but the copy itself gets in, plain or
/// with a key of their own.
#[test]
fn another_local_process_cannot_write_through_atou_copy() {
    let scratch = TestDir::new("transfer-copy-intruder");
    let src = scratch.dir("src");
    // Sparse and large, so the copy is still running while we try.
    File::create(src.join("big"))
        .unwrap()
        .set_len(4 << 30)
        .unwrap();
    let dest = scratch.path("dest");
    let planted = scratch.dir("planted");
    fs::write(planted.join(".bashrc"), b"echo owned\n").unwrap();
    let mut copy = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        // A window of 4 segments: the copy crawls, and its receiver's
        // socket never fills (a debug build could not drain a full one).
        .args(["copy", "--quiet", "--rcvwin", "4"])
        .arg(src.join("big"))
        .arg(&dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = copy.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    let port = loop {
        if let Some(p) = loopback_listening_ports(pid).first() {
            break *p;
        }
        assert!(Instant::now() < deadline, "no loopback port appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    let target = format!("127.0.0.1:{port}");
    say(&format!("  the copy's receiver: {target}"));
    let known = scratch.path("known_hosts");
    let plain = send(&[&planted.join(".bashrc")], &target, &["--no-auth"]);
    let keyed = send(
        &[&planted.join(".bashrc")],
        &target,
        &[
            "--known-hosts",
            known.to_str().unwrap(),
            "--identity",
            keys().client.to_str().unwrap(),
            "--maxidle",
            "2",
        ],
    );
    let still_running = copy.try_wait().unwrap().is_none();
    let _ = copy.kill();
    let _ = copy.wait();
    assert!(
        still_running,
        "the copy ended before the attempts: the test tests nothing"
    );
    assert_eq!(plain.code(), Some(REFUSED), "{}", plain.stderr);
    assert!(
        plain.stderr.contains("authenticated clients only"),
        "{}",
        plain.stderr
    );
    // Not answered at all: the copy's one-time key is the only one it takes.
    assert_eq!(keyed.code(), Some(NETWORK), "{}", keyed.stderr);
    assert!(keyed.stderr.contains("authorized keys"), "{}", keyed.stderr);
    assert!(!dest.join(".bashrc").exists());
}

// ---------------------------------------------------------------------------
// Exit statuses a script can act on
// ---------------------------------------------------------------------------

impl Sent {
    /// The `--json` report on stdout, whatever the status.
    fn json(&self) -> Value {
        serde_json::from_str(self.stdout.trim()).unwrap_or_else(|e| {
            panic!(
                "send --json: {e}: `{}`; stderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Checks the exit status and the `--json` report's status word and
    /// number agree with `want`; the reason on stderr.
    fn failed_as(&self, want: i32, word: &str) -> String {
        let why = self.failure(want);
        let r = self.json();
        assert_eq!(r["status"], word, "{r}");
        assert_eq!(r["exit"], want, "{r}");
        // The report gives the same reason as stderr.
        assert_eq!(
            format!("atou: {}", r["error"].as_str().unwrap_or_default()),
            why,
            "{r}"
        );
        why
    }
}

#[test]
fn exit_statuses_tell_a_script_what_failed() {
    let scratch = TestDir::new("transfer-exit-statuses");
    let src = scratch.dir("src/tree");
    write_random(&src.join("a"), 100 * KIB, 71);
    let dest = scratch.dir("dest");

    // Nothing listens on a port just released: loopback answers ICMP
    // unreachable, and that is a network failure, worth retrying.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let why = send(&[&src], &dead.to_string(), &[]).failed_as(NETWORK, "network");
    assert!(why.contains("no atou server"), "{why}");

    // A port where nothing ever answers, as behind a firewall that drops
    // UDP (issue 29): the same family, and the way round it named, with
    // a pinned key, without authentication, and before a key query's
    // answer (trust on first use).
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let target = silent.local_addr().unwrap().to_string();
    let known = scratch.path("known_hosts");
    for args in [
        &["--maxidle", "1"][..],
        &["--maxidle", "1", "--no-auth"],
        &["--maxidle", "1", "--known-hosts", known.to_str().unwrap()],
    ] {
        let sent = send(&[&src], &target, args);
        // The key query fails before the send, with no --json report.
        let why = if args.contains(&"--known-hosts") {
            sent.failure(NETWORK)
        } else {
            sent.failed_as(NETWORK, "network")
        };
        assert!(
            why.contains(&format!(
                "no UDP reply from {target} — a firewall? `atou copy` over ssh can go through TCP"
            )),
            "{args:?}: {why}"
        );
    }

    // A source that is not there: a local I/O error, before any packet.
    let missing = scratch.path("src/missing");
    let why = send(&[&missing], &dead.to_string(), &[]).failed_as(LOCAL_IO, "io");
    assert!(why.contains("missing"), "the reason names the file: {why}");

    // Success says "ok" too.
    let server = Serve::start(&dest);
    let r = send(&[&src], &server.target(), &[]).report();
    assert_eq!(r["status"], "ok", "{r}");
    assert_eq!(r["exit"], 0, "{r}");

    // Again, without --overwrite: the receiver refuses; retrying as is
    // would not help.
    let why = send(&[&src], &server.target(), &[]).failed_as(REFUSED, "refused");
    assert!(why.contains("--overwrite"), "{why}");
}

#[test]
fn an_interrupted_send_exits_130_and_says_so_in_its_report() {
    let scratch = TestDir::new("transfer-exit-interrupted");
    let src = scratch.dir("src");
    let big = src.join("big.bin");
    write_random(&big, 64 * MIB, 72);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    // 64 MiB at 40 Mbit/s: about 13 s, time enough to be interrupted.
    let relay = Relay::start(server.addr, "rate 40mbit", "", 7);
    let mut sending = spawn_send(&[&big], &relay.addr.to_string(), &[]);
    let part = staged_part(&dest);
    let deadline = Instant::now() + Duration::from_secs(30);
    while allocated(&part) < 4 * MIB {
        assert!(
            sending.running(),
            "atou send ended before it was interrupted"
        );
        assert!(Instant::now() < deadline, "nothing written after 30 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = sending.process.child().id();
    let kill = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let sent = sending.finish(Duration::from_secs(30));
    let why = sent.failed_as(130, "interrupted");
    assert!(why.contains("run the same command again"), "{why}");
}

// ---------------------------------------------------------------------------
// Progress for machines (`--progress json`)
// ---------------------------------------------------------------------------

#[test]
fn progress_json_is_json_lines_that_end_at_the_bytes_sent() {
    let scratch = TestDir::new("transfer-progress-json");
    let src = scratch.dir("src");
    let file = src.join("f.bin");
    let size = 8 * MIB + 123;
    write_random(&file, size, 73);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    // About 1.7 s at 40 Mbit/s: several lines at 0.2 s; 10 ms each way,
    // so every stream's srtt is at least 20 ms once it has a sample.
    let relay = Relay::start(server.addr, "rate 40mbit delay 10ms", "delay 10ms", 8);
    let sent = send(
        &[&file],
        &relay.addr.to_string(),
        &["--progress", "json", "--progress-interval", "0.2"],
    );
    assert_eq!(sent.code(), Some(0), "{}", sent.stderr);
    let lines: Vec<Value> = sent
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: `{l}`")))
        .collect();
    // Intervals, then the end, then the --json report on one line.
    let (report, rest) = lines.split_last().expect("lines on stdout");
    let (end, intervals) = rest.split_last().expect("an end line");
    assert_eq!(report["status"], "ok", "{report}");
    assert_eq!(end["event"], "end", "{end}");
    assert_eq!(end["status"], "ok", "{end}");
    assert_eq!(end["exit"], 0, "{end}");
    assert_eq!(u(&end["bytes"]), size, "{end}");
    assert_eq!(u(&end["total"]), size, "{end}");
    assert!(intervals.len() >= 3, "{} interval lines", intervals.len());
    let mut last = (0.0, 0);
    for l in intervals {
        assert_eq!(l["event"], "interval", "{l}");
        let (t, b) = (l["time"].as_f64().unwrap(), u(&l["bytes"]));
        assert!(t > last.0 && b >= last.1 && b <= size, "{l} after {last:?}");
        last = (t, b);
    }
    // The streams' figures: each stream's bytes add up to the whole; the
    // srtt is the path's; cwnd is what the report ends with.
    let streams = end["streams"].as_array().unwrap();
    assert_eq!(streams.len(), report["streams"].as_array().unwrap().len());
    assert_eq!(streams.iter().map(|s| u(&s["bytes"])).sum::<u64>(), size);
    for (live, done) in streams.iter().zip(report["streams"].as_array().unwrap()) {
        let srtt = live["srtt_ms"].as_f64().unwrap();
        assert!(srtt >= 20.0, "srtt {srtt} ms over a 20 ms path: {live}");
        assert_eq!(live["cwnd"], done["cwnd"], "{live} against {done}");
        assert_eq!(live["rxmts"], done["rxmts"], "{live} against {done}");
    }
    // The middle of the run names the file being sent.
    assert!(
        intervals.iter().any(|l| l["files"][0] == "f.bin"),
        "{intervals:?}"
    );
}

// ---------------------------------------------------------------------------
// rsync's everyday options
// ---------------------------------------------------------------------------

/// Everything about `root` a transfer could change, byte for byte: each
/// entry (the root included) with its kind, mode, size, mtime to the
/// nanosecond, and the BLAKE3 hash of a file's content or a symlink's
/// target (a hash, so that a failure prints a readable difference).
/// Not the server's own table of hello timestamps, which any accepted
/// hello updates (a dry run's too), nor so the staging directory's mtime,
/// which that table's rename into place moves; its entries still count.
fn exact_state(root: &Path) -> Vec<(PathBuf, u32, u64, i64, i64, String)> {
    let table = Path::new(STAGING_DIR).join(HELLO_TIMESTAMPS);
    walk(root)
        .into_iter()
        .filter(|(rel, _)| *rel != table)
        .map(|(rel, m)| {
            let full = root.join(&rel);
            let content = if m.is_file() {
                fs::read(&full).unwrap()
            } else if m.file_type().is_symlink() {
                fs::read_link(&full)
                    .unwrap()
                    .into_os_string()
                    .into_encoded_bytes()
            } else {
                Vec::new()
            };
            let hash = blake3::hash(&content).to_hex().to_string();
            let (mtime, mtime_nsec) = if rel == Path::new(STAGING_DIR) {
                (0, 0)
            } else {
                (m.mtime(), m.mtime_nsec())
            };
            (rel, m.mode(), m.len(), mtime, mtime_nsec, hash)
        })
        .collect()
}

fn dry_files(r: &Value) -> Vec<(String, String, u64)> {
    r["dry_run"]
        .as_array()
        .unwrap_or_else(|| panic!("no dry_run list: {r}"))
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["action"].as_str().unwrap().to_string(),
                f["send_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// `--dry-run` against a running `atou serve --dir`: it lists what would
/// be sent and skipped, with the bytes, exits as the real run would (0,
/// or 5 refused), and leaves the destination exactly as it was: no new
/// directory (a real plan creates them), no partial file, not a
/// timestamp. The real run that follows sends what the dry run said.
#[test]
fn a_dry_run_says_what_would_happen_and_changes_nothing() {
    let scratch = TestDir::new("transfer-dry-run");
    let tree = scratch.dir("src/tree");
    fs::create_dir(tree.join("sub")).unwrap();
    for (i, (name, size)) in [("a", 1000), ("b", 2 * MIB + 5), ("sub/c", 70_000)]
        .iter()
        .enumerate()
    {
        let p = tree.join(name);
        write_random(&p, *size, 70 + i as u64);
        set_mtime(&p, FEB_3_2001 + i as u64, 7);
    }
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let target = server.target();
    send(&[&tree], &target, &[]).report();

    // New: a file, and a directory with a file in it.
    write_random(&tree.join("e"), 3 * MIB, 80);
    fs::create_dir(tree.join("newdir")).unwrap();
    write_random(&tree.join("newdir/d"), 5000, 81);
    let before = exact_state(&dest);
    let dry = send(&[&tree], &target, &["--dry-run", "--skip-existing"]);
    assert_eq!(dry.code(), Some(0), "{}", dry.stderr);
    let r: Value = serde_json::from_str(dry.stdout.trim()).unwrap();
    assert_eq!(
        (r["status"].as_str(), r["exit"].as_u64()),
        (Some("ok"), Some(0))
    );
    let files = dry_files(&r);
    let want: Vec<(String, String, u64)> = [
        ("tree/a", "skip", 0),
        ("tree/b", "skip", 0),
        ("tree/e", "send", 3 * MIB),
        ("tree/newdir/d", "send", 5000),
        ("tree/sub/c", "skip", 0),
    ]
    .iter()
    .map(|(p, a, b)| (p.to_string(), a.to_string(), *b))
    .collect();
    assert_eq!(files, want);
    assert_eq!(report_u(&r, "bytes_sent"), 3 * MIB + 5000);
    assert_eq!(
        exact_state(&dest),
        before,
        "a dry run changed the destination"
    );
    assert!(!dest.join("tree/newdir").exists());

    // Without --json: one line per file and the totals, on stdout.
    let text = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["send", "-n", "--skip-existing", "--identity"])
        .arg(&keys().client)
        .arg("--server-key")
        .arg(&keys().server_pub)
        .arg(&tree)
        .arg(&target)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&text.stdout);
    assert!(
        out.contains("tree/newdir/d") && out.contains("dry run: would send 2 of 5 files"),
        "{out}"
    );
    assert_eq!(exact_state(&dest), before);

    // The real run sends what the dry run said it would.
    let real = send(&[&tree], &target, &["--skip-existing"]).report();
    assert_eq!(report_u(&real, "bytes_sent"), 3 * MIB + 5000, "{real}");
    for f in ["e", "newdir/d"] {
        assert_eq!(
            first_difference(&tree.join(f), &dest.join("tree").join(f)),
            None
        );
    }

    // A changed file without --overwrite: the dry run is refused as the
    // real run would be (status 5, the file named), and changes nothing.
    write_random(&tree.join("a"), 1000, 90);
    let before = exact_state(&dest);
    let refused = send(&[&tree], &target, &["-n", "--skip-existing"]);
    let why = refused.failure(REFUSED);
    assert!(why.contains("tree/a"), "{why}");
    assert_eq!(
        exact_state(&dest),
        before,
        "a refused dry run changed the destination"
    );
}

/// `atou copy --dry-run` to a local DEST that does not exist does not
/// create it; to one that exists it creates nothing in it, not even the
/// staging directory a real receiver makes at its start.
#[test]
fn a_copy_dry_run_creates_nothing() {
    let scratch = TestDir::new("transfer-copy-dry-run");
    let tree = scratch.dir("src/tree");
    write_random(&tree.join("f"), 100_000, 3);
    let missing = scratch.path("nowhere/dest");
    let out = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["copy", "-n", "--json"])
        .arg(&tree)
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        dry_files(&r),
        vec![("tree/f".to_string(), "send".to_string(), 100_000)]
    );
    assert!(!scratch.path("nowhere").exists(), "DEST was created");
    let dest = scratch.dir("dest");
    let before = exact_state(&dest);
    let out = Command::new(ATOU)
        .env("XDG_CACHE_HOME", TEST_CACHE)
        .args(["copy", "-n", "--quiet"])
        .arg(&tree)
        .arg(&dest)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(exact_state(&dest), before);
    assert!(!dest.join(STAGING_DIR).exists());
}

/// `--exclude` and `--exclude-from` on a real send: what they name does
/// not arrive, and an excluded directory's contents are not read (an
/// unreadable FIFO inside it would fail the walk).
#[test]
fn excluded_entries_do_not_arrive() {
    let scratch = TestDir::new("transfer-exclude");
    let tree = scratch.dir("src/tree");
    for d in ["src", "build/deep", "logs"] {
        fs::create_dir_all(tree.join(d)).unwrap();
    }
    for f in ["src/main.c", "src/main.o", "logs/today.log", "README"] {
        write_random(&tree.join(f), 1000, 5);
    }
    let fifo = tree.join("build/deep/pipe");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let list = scratch.path("exclude.txt");
    fs::write(
        &list,
        "# build output\n*.o\n\n; and the logs\n/tree/logs/\n",
    )
    .unwrap();
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let r = send(
        &[&tree],
        &server.target(),
        &[
            "--exclude",
            "build/",
            "--exclude-from",
            list.to_str().unwrap(),
        ],
    )
    .report();
    assert_eq!(report_u(&r, "files"), 2, "{r}");
    let mut got: Vec<String> = walk(&dest.join("tree"))
        .keys()
        .map(|p| p.display().to_string())
        .collect();
    got.sort();
    assert_eq!(got, ["", "README", "src", "src/main.c"]);
}

/// Whether rsync is here to compare with; says why `test` skips if not.
fn have_rsync(test: &str) -> bool {
    let here = Command::new("rsync").arg("--version").output().is_ok();
    if !here {
        eprintln!("SKIPPED {test}: no rsync on this host");
    }
    here
}

/// `rsync ARGS SRC DEST/`: SRC arrives as DEST/NAME, as atou sends it.
#[track_caller]
fn rsync_into(args: &[&str], src: &Path, dest: &Path) {
    let out = Command::new("rsync")
        .args(args)
        .arg(src)
        .arg(format!("{}/", dest.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "rsync {args:?}: {out:?}");
}

/// The paths beneath `root` (none if it is not there), sorted, the
/// receiver's staging directory left out.
fn listing(root: &Path) -> Vec<String> {
    if !root.exists() {
        return Vec::new();
    }
    let mut got: Vec<String> = walk(root)
        .keys()
        .map(|p| p.display().to_string())
        .filter(|p| !p.starts_with(STAGING_DIR))
        .collect();
    got.sort();
    got
}

/// `--include`, `--exclude`, `--filter` and the rule files select what
/// `rsync -a` with the same rules, in the same order, selects from the
/// same tree: the first rule that matches decides, an excluded directory
/// is not descended into, `!` clears.
#[test]
fn filters_select_what_rsync_selects() {
    if !have_rsync("filters_select_what_rsync_selects") {
        return;
    }
    let scratch = TestDir::new("transfer-filters");
    let tree = scratch.dir("src/tree");
    for d in ["src/deep", "build", "docs", "cache/x"] {
        fs::create_dir_all(tree.join(d)).unwrap();
    }
    for f in [
        "src/a.c",
        "src/a.h",
        "src/deep/b.c",
        "src/deep/b.o",
        "build/c.c",
        "docs/readme.txt",
        "cache/x/blob",
        "top.c",
        "keep.o",
    ] {
        write_random(&tree.join(f), 100, 3);
    }
    let rules = scratch.path("rules.txt");
    fs::write(&rules, "# a comment\n+ keep.o\n*.o\n").unwrap();
    let rules = rules.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["--include=*/", "--include=*.c", "--exclude=*"],
        &["--include=*.c", "--exclude=*"],
        &[
            "--exclude=build/",
            "--exclude-from",
            rules,
            "--include=src/***",
        ],
        &[
            "--filter=- *.c",
            "--filter=!",
            "--filter=+ cache/***",
            "--exclude=/tree/*",
        ],
        &["--exclude=+ top.c", "--exclude=*.c", "--include=- docs/"],
    ];
    for (i, flags) in cases.iter().enumerate() {
        let by_rsync = scratch.dir(&format!("rsync{i}"));
        let mut args = vec!["-a"];
        args.extend(*flags);
        rsync_into(&args, &tree, &by_rsync);
        let dest = scratch.dir(&format!("atou{i}"));
        let server = Serve::start(&dest);
        send(&[&tree], &server.target(), flags).report();
        assert_eq!(
            listing(&dest.join("tree")),
            listing(&by_rsync.join("tree")),
            "rules {flags:?}"
        );
    }
}

/// The hidden `--progress-lines` (what a third-party copy's source runs
/// with, for the host running the copy to draw a bar): progress as
/// `ATOU-PROGRESS DONE TOTAL STAGE` lines on stdout, bytes, done never
/// past total, and the report still on stderr.
#[test]
fn progress_lines_count_bytes_on_stdout() {
    let scratch = TestDir::new("transfer-progress-lines");
    let src = scratch.path("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), common::noise(2 << 20, 5)).unwrap();
    let out = Command::new(ATOU)
        .args(["copy", "--progress-lines", "--bwlimit", "20mbit"])
        .arg(&src)
        .arg(scratch.path("dest"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let counts: Vec<(u64, u64)> = stdout
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            assert_eq!(w[0], "ATOU-PROGRESS", "{l}");
            (w[1].parse().unwrap(), w[2].parse().unwrap())
        })
        .collect();
    assert!(counts.len() >= 2, "{stdout}");
    assert!(counts.iter().all(|(d, t)| d <= t), "{stdout}");
    assert!(
        counts.iter().any(|(d, t)| *t == 2 << 20 && *d > 0),
        "{stdout}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("atou: sent 1 file"));
}

/// `--files-from`: the listed paths arrive as `rsync -a -r --files-from`
/// delivers them from the same list (comments, `/./`, a listed directory
/// whole, the directories on a path's way without their other contents),
/// with the same bytes; a list naming `..` is refused before anything
/// is sent.
#[test]
fn files_from_sends_what_rsync_sends() {
    if !have_rsync("files_from_sends_what_rsync_sends") {
        return;
    }
    let scratch = TestDir::new("transfer-files-from");
    let tree = scratch.dir("src/tree");
    for d in ["src/deep", "build", "docs/old", "data"] {
        fs::create_dir_all(tree.join(d)).unwrap();
    }
    for (i, f) in [
        "src/a.c",
        "src/deep/b.c",
        "src/deep/b.o",
        "build/c.c",
        "docs/readme.txt",
        "docs/old/x.txt",
        "data/big",
        "top.c",
    ]
    .iter()
    .enumerate()
    {
        write_random(&tree.join(f), 1000 + 7 * i as u64, i as u64);
    }
    let list = scratch.path("list");
    fs::write(
        &list,
        "# what to send\n; and how\n\nsrc/deep\n/top.c\ndocs/./old/x.txt\ndata/big\nsrc/deep/b.c\n",
    )
    .unwrap();
    let by_rsync = scratch.dir("rsync");
    let list_arg = format!("--files-from={}", list.display());
    rsync_into(&["-a", "-r", &list_arg], &tree, &by_rsync);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let r = send(
        &[&tree],
        &server.target(),
        &["--files-from", list.to_str().unwrap()],
    )
    .report();
    assert_eq!(report_u(&r, "files"), 5, "{r}");
    assert_eq!(listing(&dest), listing(&by_rsync));
    for f in ["src/deep/b.o", "top.c", "old/x.txt", "data/big"] {
        assert_eq!(
            fs::read(dest.join(f)).unwrap(),
            fs::read(by_rsync.join(f)).unwrap(),
            "{f}"
        );
    }
    fs::write(&list, "src/a.c\nsrc/../../etc/passwd\n").unwrap();
    let out = Command::new(common::ATOU)
        .args(["send", "--files-from"])
        .arg(&list)
        .arg(&tree)
        .arg(server.target())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
}

/// `-H`: files that are one file at the source arrive as one file with
/// the same names as `rsync -aH` gives them (compared by inode groups),
/// their bytes sent once; a link to a file outside the tree arrives as a
/// copy; a rerun with --skip-existing keeps them.
#[test]
fn hard_links_arrive_as_rsync_h_makes_them() {
    if !have_rsync("hard_links_arrive_as_rsync_h_makes_them") {
        return;
    }
    let scratch = TestDir::new("transfer-hard-links");
    let tree = scratch.dir("src/tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write_random(&tree.join("a"), 300_000, 1);
    write_random(&tree.join("d"), 5000, 2);
    write_random(&scratch.path("outside"), 4000, 3);
    fs::hard_link(tree.join("a"), tree.join("b")).unwrap();
    fs::hard_link(tree.join("a"), tree.join("sub/c")).unwrap();
    fs::hard_link(tree.join("d"), tree.join("sub/e")).unwrap();
    fs::hard_link(scratch.path("outside"), tree.join("f")).unwrap();
    let groups = |root: &Path| -> Vec<Vec<String>> {
        use std::os::unix::fs::MetadataExt;
        let mut by_inode: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        for (rel, md) in walk(root) {
            let rel = rel.display().to_string();
            if md.is_file() && !rel.starts_with(STAGING_DIR) {
                by_inode.entry(md.ino()).or_default().push(rel);
            }
        }
        let mut groups: Vec<Vec<String>> = by_inode
            .into_values()
            .map(|mut g| {
                g.sort();
                g
            })
            .collect();
        groups.sort();
        groups
    };
    let by_rsync = scratch.dir("rsync");
    rsync_into(&["-aH"], &tree, &by_rsync);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let r = send(&[&tree], &server.target(), &["-H"]).report();
    assert_eq!(report_u(&r, "files"), 3, "{r}");
    assert_eq!(report_u(&r, "bytes_sent"), 309_000, "{r}");
    let want = vec![
        vec!["tree/a", "tree/b", "tree/sub/c"],
        vec!["tree/d", "tree/sub/e"],
        vec!["tree/f"],
    ];
    assert_eq!(groups(&by_rsync), want);
    assert_eq!(groups(&dest), want);
    assert_same_tree(&tree, &dest.join("tree"));
    let again = send(&[&tree], &server.target(), &["-H", "--skip-existing"]).report();
    assert_eq!(report_u(&again, "bytes_sent"), 0, "{again}");
    assert_eq!(groups(&dest), want);
}

/// `--bwlimit`: a send of 4 MiB at 16 Mbit/s over loopback (which takes
/// a fraction of that time without the cap) takes at least size / rate.
#[test]
fn a_bwlimit_send_takes_at_least_size_over_rate() {
    let scratch = TestDir::new("transfer-bwlimit");
    let tree = scratch.dir("src/tree");
    let size = 4 * MIB;
    write_random(&tree.join("f"), size, 11);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let rate = 16e6;
    let sent = send(
        &[&tree],
        &server.target(),
        &["--bwlimit", "16mbit", "--streams", "2"],
    );
    sent.report();
    let floor = size as f64 * 8.0 / rate;
    assert!(
        sent.secs >= floor,
        "{} bytes at --bwlimit 16mbit in {:.2} s, under {floor:.2} s",
        size,
        sent.secs
    );
    assert_same_tree(&tree, &dest.join("tree"));
}

// ---------------------------------------------------------------------------
// Sharding: N senders, one tree
// ---------------------------------------------------------------------------

/// A tree for the shard tests: 6 directories of files from empty to
/// 300 KiB, one empty directory, a 12 MiB file of 13 chunks (above
/// total/4, so split 3/3/3/4 chunks across 4 shards), an empty file,
/// symlinks, modes and mtimes of their own. Returns its files' sizes by
/// relative path.
fn build_shard_tree(root: &Path) -> BTreeMap<String, u64> {
    let mut rng = XorShift::new(15);
    let mut sizes = BTreeMap::new();
    let mut file = |rel: &str, size: u64, i: u64| {
        let p = root.join(rel);
        write_random(&p, size, 1500 + i);
        set_mode(&p, [0o644, 0o600, 0o755][i as usize % 3]);
        set_mtime(
            &p,
            FEB_3_2001 + i * 61,
            (i * 7_777_777 % 1_000_000_000) as u32,
        );
        sizes.insert(format!("tree/{rel}"), size);
    };
    fs::create_dir_all(root.join("empty/dir")).unwrap();
    file("big.bin", 12 * MIB + 3, 0);
    file("empty-file", 0, 1);
    let mut i = 2;
    for d in 0..6 {
        let dir = format!("d{d}/sub");
        fs::create_dir_all(root.join(&dir)).unwrap();
        for f in 0..8 {
            let at = if f % 2 == 0 {
                format!("d{d}")
            } else {
                dir.clone()
            };
            file(&format!("{at}/f{f}"), rng.below(300 * KIB), i);
            i += 1;
        }
    }
    symlink("../big.bin", root.join("d0/to-big")).unwrap();
    symlink("sub/f1", root.join("d1/to-f1")).unwrap();
    // Directories last, deepest first: writing into them set their mtimes.
    let mut dirs: Vec<PathBuf> = walk(root)
        .into_iter()
        .filter(|(_, m)| m.is_dir())
        .map(|(rel, _)| rel)
        .collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for (j, d) in dirs.iter().enumerate() {
        set_mtime(&root.join(d), FEB_3_2001 + 5000 + j as u64, 0);
    }
    sizes
}

/// `--shard K/N` checks K and N, and a dry run of each shard lists its
/// own part: together the four parts list every file exactly once, but
/// the one above total/4, which each lists with its range of chunks, the
/// ranges tiling the file.
#[test]
fn shards_are_checked_and_their_dry_runs_list_each_file_once() {
    let scratch = TestDir::new("transfer-shard-dry");
    let tree = scratch.path("src/tree");
    let sizes = build_shard_tree(&tree);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    for bad in ["0/4", "5/4", "1/1025", "2", "x/4"] {
        let out = Command::new(ATOU)
            .args(["send", "--shard", bad])
            .arg(&tree)
            .arg(server.target())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--shard {bad}: {stderr}");
        assert!(
            stderr.contains("1 <= K <= N <= 1024"),
            "--shard {bad}: {stderr}"
        );
    }
    let mut listed: Vec<String> = Vec::new();
    let mut ranges: Vec<(u64, u64, u64)> = Vec::new();
    for k in 1..=4 {
        let shard = format!("{k}/4");
        let r: Value = {
            let dry = send(
                &[&tree],
                &server.target(),
                &["--dry-run", "--shard", &shard],
            );
            assert_eq!(dry.code(), Some(0), "{}", dry.stderr);
            serde_json::from_str(dry.stdout.trim()).unwrap()
        };
        assert_eq!(r["shard"].as_str(), Some(shard.as_str()), "{r}");
        let part = dry_files(&r);
        assert!(!part.is_empty(), "shard {shard} has no file: {r}");
        let files = r["dry_run"].as_array().unwrap();
        for f in files.iter().filter(|f| !f["part"].is_null()) {
            assert_eq!(f["path"], "tree/big.bin", "only big.bin is split: {f}");
            ranges.push((
                u(&f["part"][0]),
                u(&f["part"][1]),
                f["send_bytes"].as_u64().unwrap(),
            ));
        }
        listed.extend(
            part.into_iter()
                .map(|(path, _, _)| path)
                .filter(|p| p != "tree/big.bin"),
        );
    }
    listed.sort();
    let all: Vec<String> = sizes
        .keys()
        .filter(|p| *p != "tree/big.bin")
        .cloned()
        .collect();
    assert_eq!(
        listed, all,
        "the shards' parts are not the tree's files, each once"
    );
    ranges.sort();
    let tiled: Vec<(u64, u64)> = ranges.iter().map(|&(a, b, _)| (a, b)).collect();
    assert_eq!(tiled, [(0, 3), (3, 6), (6, 9), (9, 13)], "big.bin's parts");
    assert_eq!(
        ranges.iter().map(|r| r.2).sum::<u64>(),
        sizes["tree/big.bin"],
        "the parts' bytes are not the file's"
    );
    // The server's table of hello timestamps is its own, not the run's.
    let table = Path::new(STAGING_DIR).join(HELLO_TIMESTAMPS);
    let left: Vec<PathBuf> = walk(&dest).into_keys().filter(|p| *p != table).collect();
    assert_eq!(
        left,
        [PathBuf::new(), PathBuf::from(STAGING_DIR)],
        "a dry run wrote to the destination"
    );
}

/// Four `atou send --shard K/4` at once into one `atou serve --dir`
/// deliver the tree a single run delivers: the same entries, bytes,
/// modes, mtimes and symlink targets (directories' too); none of the
/// shards refuses on a directory another just created, and each shard's
/// bytes stay within the balance bound, total/4 + 2 chunks (one split
/// file; the largest file sent whole is 300 KiB at most), which the
/// 12 MiB file sent whole would break. One after another, the split file
/// takes its name only with the last shard, and a shard run again sends
/// nothing of its part.
#[test]
fn four_shards_at_once_deliver_the_tree_of_a_single_run() {
    let scratch = TestDir::new("transfer-shard");
    let tree = scratch.path("src/tree");
    let sizes = build_shard_tree(&tree);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let single = send(&[&tree], &format!("{}:single", server.target()), &[]).report();
    server.report();

    let sharded = format!("{}:sharded", server.target());
    let running: Vec<Sending> = (1..=4)
        .map(|k| spawn_send(&[&tree], &sharded, &["--shard", &format!("{k}/4")]))
        .collect();
    let reports: Vec<Value> = running
        .into_iter()
        .map(|s| s.finish(Duration::from_secs(120)).report())
        .collect();
    for _ in 0..4 {
        server.report();
    }

    let total: u64 = sizes.values().sum();
    let mut files = 0;
    for (k, r) in reports.iter().enumerate() {
        let bytes = report_u(r, "bytes_total");
        assert!(
            bytes <= total / 4 + 2 * MIB,
            "shard {}/4 sent {bytes} bytes of {total}, above total/4 + 2 MiB",
            k + 1
        );
        assert_eq!(
            report_u(r, "files_in_part"),
            1,
            "shard {}/4 sent no part of big.bin: {r}",
            k + 1
        );
        files += report_u(r, "files") - report_u(r, "files_in_part");
    }
    // big.bin once, in four parts.
    assert_eq!(files + 1, report_u(&single, "files"));
    assert_eq!(files + 1, sizes.len() as u64);
    assert_same_tree(&dest.join("single/tree"), &dest.join("sharded/tree"));
    assert_same_tree(&tree, &dest.join("sharded/tree"));

    // One after another, the first shard creates every directory and
    // sets its mtime before the others write into them: the last to
    // write into a directory sets its mtime again.
    let serial = format!("{}:serial", server.target());
    let big = dest.join("serial/tree/big.bin");
    for k in 1..=3 {
        send(&[&tree], &serial, &["--shard", &format!("{k}/4")]).report();
        server.report();
        assert!(!big.exists(), "big.bin took its name with {k} of 4 parts");
    }
    // Shard 2 again: its files are there, its part of big.bin recorded.
    let again = send(&[&tree], &serial, &["--shard", "2/4", "--skip-existing"]).report();
    server.report();
    assert_eq!(report_u(&again, "bytes_sent"), 0, "{again}");
    assert!(!big.exists(), "big.bin took its name with 3 of 4 parts");
    send(&[&tree], &serial, &["--shard", "4/4"]).report();
    server.report();
    assert_same_tree(&dest.join("single/tree"), &dest.join("serial/tree"));
    assert_eq!(
        left_in_staging(&dest),
        Vec::<String>::new(),
        "partial files were left behind"
    );
}

/// A split file left waiting (one shard of four ran) is finished by an
/// unsharded run, which resumes from the shard's partial file, sends only
/// the rest, and takes the record of parts away with it.
#[test]
fn a_whole_run_finishes_a_split_file_a_shard_left_waiting() {
    let scratch = TestDir::new("transfer-shard-then-whole");
    let tree = scratch.path("src/tree");
    let sizes = build_shard_tree(&tree);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    let first = send(&[&tree], &server.target(), &["--shard", "1/4"]).report();
    server.report();
    assert_eq!(report_u(&first, "files_in_part"), 1, "{first}");
    assert!(!dest.join("tree/big.bin").exists());
    let mut staged: Vec<String> = left_in_staging(&dest)
        .iter()
        .map(|name| name.rsplit('.').next().unwrap().to_string())
        .collect();
    staged.sort();
    assert_eq!(
        staged,
        ["chunks", "claim", "part"],
        "a partial file, the record of its parts and the claim that counts it \
         against its key's quota"
    );
    let whole = send(&[&tree], &server.target(), &["--skip-existing"]).report();
    server.report();
    // Shard 1's part of big.bin (3 of its 13 chunks) was not sent again.
    assert_eq!(
        report_u(&whole, "bytes_skipped"),
        report_u(&first, "bytes_total"),
        "{whole}"
    );
    // (Directories' mtimes are shard 1's: a run that creates none sets
    // none, shard or not.)
    assert_eq!(
        fs::read(dest.join("tree/big.bin")).unwrap(),
        fs::read(tree.join("big.bin")).unwrap()
    );
    assert_eq!(sizes.len() as u64, report_u(&whole, "files"));
    assert_eq!(
        left_in_staging(&dest),
        Vec::<String>::new(),
        "the partial file or the record of its parts was left behind"
    );
}

/// A shard killed half way through its part of a split file resumes its
/// own part when run again, sending only what is missing, while the other
/// shard's part, recorded earlier, is not touched; the file takes its name
/// with the rerun and nothing is left in the staging directory.
#[test]
fn a_shard_killed_mid_part_resumes_its_part_alone() {
    let scratch = TestDir::new("transfer-shard-kill");
    let src = scratch.dir("src").join("big.bin");
    let size = 64 * MIB;
    write_random(&src, size, 21);
    let dest = scratch.dir("dest");
    let server = Serve::start(&dest);
    // Shard 2 first: chunks 32..64, recorded, the file waiting.
    let second = send(&[&src], &server.target(), &["--shard", "2/2"]).report();
    server.report();
    assert_eq!(report_u(&second, "bytes_sent"), 32 * MIB, "{second}");
    // Shard 1 at 100 Mbit/s (32 MiB in ~2.7 s), killed half way.
    let args = ["--shard", "1/2", "--streams", "1", "--bwlimit", "100mbit"];
    let mut sending = spawn_send(&[&src], &server.target(), &args);
    let part = staged_part(&dest);
    let deadline = Instant::now() + Duration::from_secs(60);
    while allocated(&part) < 48 * MIB {
        assert!(
            sending.running(),
            "shard 1 ended before half its part was written"
        );
        assert!(
            Instant::now() < deadline,
            "shard 1 wrote too little in 60 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    sending.kill();
    assert!(!dest.join("big.bin").exists(), "named with half a part");
    let rerun = send(&[&src], &server.target(), &["--shard", "1/2"]).report();
    server.report();
    let (sent, skipped) = (
        report_u(&rerun, "bytes_sent"),
        report_u(&rerun, "bytes_skipped"),
    );
    say(&format!(
        "a_shard_killed_mid_part_resumes_its_part_alone: the rerun sent {sent} bytes, skipped {skipped}"
    ));
    assert_eq!(sent + skipped, 32 * MIB, "{rerun}");
    assert!(
        skipped >= 8 * MIB,
        "shard 1's rerun resumed little: {rerun}"
    );
    assert!(first_difference(&src, &dest.join("big.bin")).is_none());
    assert_eq!(left_in_staging(&dest), Vec::<String>::new());
}

/// Four `atou copy --shard K/4` at once into one local DEST, each with
/// its own receiver, together copy the tree; none removes the staging
/// directory, which another shard may be writing into.
#[test]
fn four_copy_shards_at_once_share_one_destination() {
    let scratch = TestDir::new("transfer-shard-copy");
    let tree = scratch.path("src/tree");
    build_shard_tree(&tree);
    let dest = scratch.dir("dest");
    let copies: Vec<std::process::Child> = (1..=4)
        .map(|k| {
            Command::new(ATOU)
                .args(["copy", "--quiet", "--shard", &format!("{k}/4")])
                .arg(&tree)
                .arg(&dest)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start atou copy")
        })
        .collect();
    for (k, copy) in copies.into_iter().enumerate() {
        let out = copy.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "copy --shard {}/4: {}",
            k + 1,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_same_tree(&tree, &dest.join("tree"));
    // Kept, since a shard cannot know that the others are done; empty.
    let staging = fs::read_dir(dest.join(STAGING_DIR))
        .expect("a shard leaves the staging directory to the other shards")
        .count();
    assert_eq!(staging, 0, "partial files were left behind");
}

// ---------------------------------------------------------------------------
// A hello replayed across a restart
// ---------------------------------------------------------------------------

/// An authorized client's first datagram as `atou probe` makes it with the
/// test keys, stamped with the wall clock now: the initiator that reads
/// the server's answer (its hello is [`Initiator::hello`]).
fn authorized_hello() -> Initiator {
    let identity = read_identity(&keys().client, Strictness::Lax).unwrap();
    let server_key = parse_public_key(&fs::read_to_string(&keys().server_pub).unwrap()).unwrap();
    let conn_id = fresh_conn_id();
    let mut params = vec![0u8; CONTROL_MAX_LEN];
    let n = Hello {
        conn_id,
        mss: 1400,
        maxidle_ms: 10_000,
        session: 0,
        receiver: ReceiverParams {
            rcvsegs: 64,
            rcvbuf: 0,
            delack_us: 0,
            quickack: 0,
            sack: true,
        },
    }
    .emit(&mut params)
    .unwrap();
    params.truncate(n);
    let config = ClientConfig {
        identity,
        server_key,
        cipher: Cipher::ChaCha20Poly1305,
        params,
    };
    Initiator::new(&config, conn_id, wall_clock_ns()).unwrap()
}

/// The first datagram `sock` receives within 2 s.
fn answer(sock: &UdpSocket) -> Option<Vec<u8>> {
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut b = vec![0u8; 65536];
    let (n, _) = sock.recv_from(&mut b).ok()?;
    Some(b[..n].to_vec())
}

/// A hello is a Noise message anyone on the path can capture. The server
/// accepted it before a restart (a crash: SIGKILL); after, the same bytes,
/// sent from anywhere, must make no session and are answered with nothing.
/// `atou serve` kept each key's newest hello timestamp in memory only, and
/// its floor (its start less 2 minutes) let the hello of a client seen in
/// the 2 minutes before the restart in once more.
#[test]
fn a_hello_accepted_before_a_restart_is_not_accepted_after_it() {
    let scratch = TestDir::new("transfer-replay-restart");
    let dest = scratch.dir("dest");
    let mut client = authorized_hello();
    let captured = client.hello().to_vec();
    let mut first = Serve::start(&dest);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.send_to(&captured, first.addr).unwrap();
    let response = answer(&sock).expect("the server answers an authorized hello");
    assert!(
        matches!(client.on_datagram(&response), Ok(Progress::Established(_))),
        "the hello was not accepted before the restart: the test would test nothing"
    );
    first.kill();

    let second = Serve::start(&dest);
    let attacker = UdpSocket::bind("127.0.0.1:0").unwrap();
    attacker.send_to(&captured, second.addr).unwrap();
    if let Some(reply) = answer(&attacker) {
        panic!(
            "the restarted server answered the replayed hello ({} bytes, kind {:#04x}): \
             a session was made for a hello it had accepted before the restart",
            reply.len(),
            reply.get(3).copied().unwrap_or(0)
        );
    }
    // The client's next hello gets in: the server is up, the key authorized.
    let mut next = authorized_hello();
    sock.send_to(next.hello(), second.addr).unwrap();
    let response = answer(&sock).expect("the restarted server answers a fresh hello");
    assert!(matches!(
        next.on_datagram(&response),
        Ok(Progress::Established(_))
    ));
}

/// The table of hello timestamps is kept in DEST's staging directory; one
/// the server cannot use stops it at start (exit 1: it could not run), naming
/// the file and what to do, rather than serving with an empty table,
/// which would accept the replays the file is there to refuse.
#[test]
fn a_damaged_table_of_hello_timestamps_stops_the_server_at_start() {
    let scratch = TestDir::new("transfer-replay-table");
    let dest = scratch.dir("dest");
    let staging = dest.join(STAGING_DIR);
    fs::create_dir(&staging).unwrap();
    set_mode(&staging, 0o700);
    let table = staging.join(HELLO_TIMESTAMPS);
    let start = |what: &str| {
        let mut child = keyed_serve(&dest)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start atou serve");
        let until = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > until {
                let _ = child.kill();
                panic!("{what}: the server started");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{what}: {stderr}");
        let line = one_readable_line(&stderr);
        for says in [table.to_str().unwrap(), "remove it", "replayed"] {
            assert!(line.contains(says), "{what}: `{line}` does not say {says}");
        }
        line
    };
    fs::write(&table, b"not a table of timestamps, or a truncated one").unwrap();
    say(&start("garbage"));
    let mut flipped = atou::internals::io::hello_timestamps::encode(&[(
        parse_public_key(&fs::read_to_string(&keys().server_pub).unwrap()).unwrap(),
        wall_clock_ns(),
    )]);
    flipped[20] ^= 1;
    fs::write(&table, &flipped).unwrap();
    assert!(start("a flipped bit").contains("checksum"));
    fs::remove_file(&table).unwrap();
    fs::create_dir(&table).unwrap();
    assert!(start("a directory").contains("not a regular file"));
    fs::remove_dir(&table).unwrap();
    symlink("/etc/passwd", &table).unwrap();
    assert!(start("a symlink").contains("symlink"));
    fs::remove_file(&table).unwrap();
    // Removed, as the message says, the server starts (and the floor of
    // its start less 2 minutes stands in for the table).
    let _server = Serve::start(&dest);
}

/// A table that cannot be saved (here the name it is written under
/// before its rename is taken by a directory) keeps the response from
/// being sent: the client gets no session, the server says why, naming
/// the file, and stays up.
#[test]
fn a_hello_whose_timestamp_cannot_be_saved_is_not_answered() {
    use std::io::BufRead;
    let scratch = TestDir::new("transfer-replay-unsaved");
    let dest = scratch.dir("dest");
    let staging = dest.join(STAGING_DIR);
    fs::create_dir(&staging).unwrap();
    set_mode(&staging, 0o700);
    let blocker = staging.join(format!("{HELLO_TIMESTAMPS}.new"));
    fs::create_dir_all(blocker.join("in-the-way")).unwrap();
    let mut child = keyed_serve(&dest)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start atou serve");
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    let addr: SocketAddr = first
        .split_whitespace()
        .skip_while(|w| *w != "on")
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in `{first}`"));
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in stderr.lines().map_while(Result::ok) {
            say(&format!("  serve: {l}"));
            let _ = lines_tx.send(l);
        }
    });
    let mut server = Daemon::new(child);
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let client = authorized_hello();
    sock.send_to(client.hello(), addr).unwrap();
    assert_eq!(answer(&sock), None, "answered with its timestamp unsaved");
    let said: Vec<String> = lines.try_iter().collect();
    let table = staging.join(HELLO_TIMESTAMPS);
    assert!(
        said.iter()
            .any(|l| l.contains("cannot save the hello timestamps")
                && l.contains(table.to_str().unwrap())),
        "{said:?}"
    );
    assert!(
        server.child().try_wait().unwrap().is_none(),
        "the server stopped"
    );
    // Once it can save again, the client's next hello gets in.
    fs::remove_dir_all(&blocker).unwrap();
    let mut next = authorized_hello();
    sock.send_to(next.hello(), addr).unwrap();
    let response = answer(&sock).expect("an answer once the table is saved");
    assert!(matches!(
        next.on_datagram(&response),
        Ok(Progress::Established(_))
    ));
    assert!(table.is_file());
}

// ---------------------------------------------------------------------------
// `atou serve --metrics`
// ---------------------------------------------------------------------------

/// `GET /metrics` from `addr`: the body of a 200 answer.
fn scrape(addr: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to --metrics");
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: atou\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    body.to_string()
}

/// The value of the sample `name` (with its labels) in a scrape; 0 if absent.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{name} {v}: {e}")))
        .next()
        .unwrap_or(0)
}

#[test]
fn metrics_count_a_real_transfer() {
    let scratch = TestDir::new("transfer-metrics");
    let f = scratch.dir("src").join("f");
    let size = 24 * MIB + 5;
    write_random(&f, size, 30);
    let dest = scratch.dir("dest");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let server = Serve::start_with(&dest, &["--metrics", &metrics]);
    let before = scrape(&metrics);
    assert_eq!(sample(&before, "atou_serve_transfers_done_total"), 0);
    let sending = spawn_send(&[&f], &server.target(), &[]);
    // Scraped while the transfer runs (or just after, on a fast machine):
    // it answers all the same.
    let during = scrape(&metrics);
    assert!(during.ends_with("# EOF\n"), "{during}");
    sending.finish(Duration::from_secs(120)).report();
    assert_eq!(server.report()["transfer"]["bytes_written"], size);
    // The connection's counters arrive with its report, as it closes.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let text = scrape(&metrics);
        if sample(&text, "atou_serve_handshakes_total") >= 1 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    say(&after);
    assert_eq!(sample(&after, "atou_serve_transfers_done_total"), 1);
    assert_eq!(sample(&after, "atou_serve_transfers_failed_total"), 0);
    assert_eq!(sample(&after, "atou_serve_files_written_total"), 1);
    assert_eq!(sample(&after, "atou_serve_written_bytes_total"), size);
    assert!(
        sample(&after, "atou_serve_handshakes_total") >= 1,
        "{after}"
    );
    assert!(
        sample(&after, "atou_serve_hellos_total{fate=\"worked\"}") >= 1,
        "{after}"
    );
    assert_eq!(
        sample(&after, "atou_serve_hellos_total{fate=\"rate_limited\"}"),
        0
    );
    assert!(
        sample(&after, "atou_serve_connection_seconds_count") >= 1,
        "{after}"
    );
}

/// `--delete` leaves each directory sent as `rsync -a --delete` leaves it
/// from the same tree onto the same destination: what the sender does not
/// have goes, what the filter rules exclude stays (and the directory
/// holding it), a symlink is removed as a link and never followed, and
/// nothing outside the directories sent is touched. The server must allow
/// it and the key's line must say `delete`; `-n` lists it and removes
/// nothing.
#[test]
fn delete_mirrors_as_rsync_delete_does() {
    if !have_rsync("delete_mirrors_as_rsync_delete_does") {
        return;
    }
    let scratch = TestDir::new("transfer-delete");
    let tree = scratch.dir("src/tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write_random(&tree.join("a"), 3000, 1);
    write_random(&tree.join("sub/b"), 2000, 2);
    write_random(&tree.join("sub/keep.o"), 100, 3);
    let outside = scratch.dir("outside");
    fs::write(outside.join("precious"), "mine\n").unwrap();
    // The same stale destination for both tools: an earlier copy plus
    // what the source no longer has.
    let stale = |root: &Path| {
        fs::create_dir_all(root.join("tree/old/deep")).unwrap();
        fs::create_dir_all(root.join("tree/sub/gone")).unwrap();
        fs::write(root.join("tree/old/deep/f"), "x").unwrap();
        fs::write(root.join("tree/old/kept.o"), "o").unwrap();
        fs::write(root.join("tree/sub/gone/g"), "g").unwrap();
        fs::write(root.join("tree/stale"), "s").unwrap();
        fs::write(root.join("tree/p.o"), "p").unwrap();
        symlink(&outside, root.join("tree/sub/link")).unwrap();
        fs::write(root.join("beside"), "b").unwrap();
    };
    let rules = ["--exclude=*.o"];
    let by_rsync = scratch.dir("rsync");
    let rsync = |extra: &[&str]| {
        let mut args = vec!["-a"];
        args.extend(extra);
        args.extend(rules);
        rsync_into(&args, &tree, &by_rsync);
    };
    rsync(&[]);
    stale(&by_rsync);
    rsync(&["--delete"]);

    let dest = scratch.dir("dest");
    let keys = KeyFile::new(&scratch, "deleter", "");
    let (key, authorized) = (keys.key.clone(), keys.authorized.clone());
    let identity = ["--identity", key.to_str().unwrap()];
    let args = |more: &[&'static str]| -> Vec<&str> {
        let mut a: Vec<&str> = identity.to_vec();
        a.extend(rules);
        a.extend(more);
        a
    };
    {
        let server = Serve::start_keyed(&dest, &authorized, &[]);
        send(&[&tree], &server.target(), &args(&[])).report();
    }
    stale(&dest);
    let before = listing(&dest);
    // Neither the server nor the key allows it yet.
    {
        let server = Serve::start_keyed(&dest, &authorized, &[]);
        let why = send(
            &[&tree],
            &server.target(),
            &args(&["--delete", "--skip-existing"]),
        )
        .failure(REFUSED);
        assert!(why.contains("--allow-delete"), "{why}");
        let server = Serve::start_keyed(&dest, &authorized, &["--allow-delete"]);
        let why = send(
            &[&tree],
            &server.target(),
            &args(&["--delete", "--skip-existing"]),
        )
        .failure(REFUSED);
        assert!(why.contains("`delete`"), "{why}");
    }
    assert_eq!(listing(&dest), before);
    keys.list_with("delete");
    let server = Serve::start_keyed(&dest, &authorized, &["--allow-delete"]);
    let dry = send(
        &[&tree],
        &server.target(),
        &args(&["--delete", "--skip-existing", "-n"]),
    );
    assert_eq!(dry.code(), Some(0), "{}", dry.stderr);
    let dry: Value = serde_json::from_str(dry.stdout.trim()).unwrap();
    let listed: Vec<&str> = dry["deleted"]["listed"]
        .as_array()
        .unwrap_or_else(|| panic!("no deletions listed: {dry}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        listed,
        ["tree/old/", "tree/stale", "tree/sub/gone/", "tree/sub/link"],
        "{dry}"
    );
    assert_eq!(listing(&dest), before, "a dry run removed something");
    let r = send(
        &[&tree],
        &server.target(),
        &args(&["--delete", "--skip-existing"]),
    )
    .report();
    assert_eq!(report_u(&r["deleted"], "total"), 4, "{r}");
    assert_eq!(listing(&dest), listing(&by_rsync));
    assert!(listing(&dest).contains(&"tree/old/kept.o".to_string()));
    assert_eq!(
        fs::read_to_string(outside.join("precious")).unwrap(),
        "mine\n"
    );
    assert!(dest.join("beside").exists());
}

/// scratch/src/tree: a file, one in a subdirectory, a symlink to the
/// first; what the rsync comparisons of owners and attributes send.
fn small_tree(scratch: &TestDir) -> PathBuf {
    let tree = scratch.dir("src/tree");
    fs::create_dir_all(tree.join("sub")).unwrap();
    write_random(&tree.join("a"), 3000, 1);
    write_random(&tree.join("sub/b"), 2000, 2);
    symlink("a", tree.join("l")).unwrap();
    tree
}

/// `-o -g` (and `--numeric-ids`) give each file, directory and symlink
/// the owner and group `rsync -a -o -g --numeric-ids` gives it from the
/// same tree, where the receiver runs as root and allows it; a server
/// that does not allow it refuses the transfer and writes nothing.
#[test]
fn owners_and_groups_arrive_as_rsync_gives_them() {
    if !is_root() {
        eprintln!("SKIPPED owners_and_groups_arrive_as_rsync_gives_them: needs root to chown");
        return;
    }
    if !have_rsync("owners_and_groups_arrive_as_rsync_gives_them") {
        return;
    }
    use std::os::unix::fs::{chown, lchown};
    let scratch = TestDir::new("transfer-owners");
    let tree = small_tree(&scratch);
    chown(tree.join("a"), Some(1234), Some(5678)).unwrap();
    chown(tree.join("sub"), Some(4321), Some(8765)).unwrap();
    chown(tree.join("sub/b"), Some(0), Some(65534)).unwrap();
    // After its chown, which clears it.
    set_mode(&tree.join("sub/b"), 0o2755);
    lchown(tree.join("l"), Some(1111), Some(2222)).unwrap();
    let ids = |root: &Path| -> Vec<(String, u32, u32)> {
        walk(root)
            .into_iter()
            .map(|(rel, md)| (rel.display().to_string(), md.uid(), md.gid()))
            .filter(|(rel, _, _)| !rel.starts_with(STAGING_DIR))
            .collect()
    };
    let by_rsync = scratch.dir("rsync");
    rsync_into(&["-a", "-o", "-g", "--numeric-ids"], &tree, &by_rsync);
    let dest = scratch.dir("dest");
    {
        let server = Serve::start(&dest);
        let why = send(&[&tree], &server.target(), &["-o", "-g"]).failure(REFUSED);
        assert!(why.contains("--allow-owners"), "{why}");
        assert!(!dest.join("tree").exists(), "{:?}", listing(&dest));
    }
    let server = Serve::start_with(&dest, &["--allow-owners", "--allow-special-bits"]);
    send(&[&tree], &server.target(), &["-o", "-g", "--numeric-ids"]).report();
    assert_eq!(ids(&dest), ids(&by_rsync));
    assert_eq!(ids(&dest.join("tree")), ids(&tree));
    // The owner is set before the mode, which a change of owner would
    // otherwise strip of its setgid bit.
    assert_eq!(
        fs::metadata(dest.join("tree/sub/b")).unwrap().mode() & 0o7777,
        0o2755
    );
    // By name: the same host, so the same ids.
    let named = scratch.dir("named");
    let server = Serve::start_with(&named, &["--allow-owners", "--allow-special-bits"]);
    send(&[&tree], &server.target(), &["-o", "-g"]).report();
    assert_eq!(ids(&named.join("tree")), ids(&tree));
}

/// `cmd ARGS` run in `dir`, its stdout; `None` where it is not installed.
fn output_in(dir: &Path, cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd)
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    assert!(out.status.success(), "{cmd} {args:?} in {dir:?}: {out:?}");
    Some(String::from_utf8(out.stdout).unwrap())
}

/// `-X -A` give each file and directory the extended attributes and POSIX
/// ACLs (a named user, a named group, a directory's default ACL) that
/// `rsync -aAX` gives it from the same tree: `getfacl -R -p` and
/// `getfattr -dR -m -` print the same; a server that does not allow them
/// refuses the transfer and writes nothing.
#[test]
fn xattrs_and_acls_arrive_as_rsync_gives_them() {
    const TEST: &str = "xattrs_and_acls_arrive_as_rsync_gives_them";
    if !is_root() {
        eprintln!(
            "SKIPPED {TEST}: needs root (rsync sets security.* as root; ACLs name other users)"
        );
        return;
    }
    if !have_rsync(TEST) {
        return;
    }
    let scratch = TestDir::new("transfer-xattrs");
    let tree = small_tree(&scratch);
    let set = |args: &[&str]| -> bool {
        Command::new(args[0])
            .args(&args[1..])
            .current_dir(&tree)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !set(&["setfattr", "-n", "user.probe", "-v", "1", "a"])
        || !set(&["setfacl", "-m", "u:1234:rwx", "a"])
    {
        eprintln!(
            "SKIPPED {TEST}: no setfattr/setfacl (apt-get install acl attr), or the file \
             system of {} takes no user xattrs or ACLs",
            tree.display()
        );
        return;
    }
    let big = "v".repeat(3000);
    for args in [
        &["setfattr", "-x", "user.probe", "a"][..],
        &["setfattr", "-n", "user.colour", "-v", "red", "a"],
        &["setfattr", "-n", "user.big", "-v", &big, "a"],
        &["setfattr", "-n", "trusted.t", "-v", "root's", "a"],
        &["setfattr", "-n", "user.dir", "-v", "0x00ff01", "sub"],
        &["setfacl", "-m", "u:4321:r-x,g:5678:rwx", "sub"],
        &["setfacl", "-d", "-m", "u:1234:r-x,g:8765:r--", "sub"],
        &["setfacl", "-m", "g:5678:rw-", "sub/b"],
    ] {
        assert!(set(args), "{args:?}");
    }
    let by_rsync = scratch.dir("rsync");
    rsync_into(&["-aAX"], &tree, &by_rsync);
    let dest = scratch.dir("dest");
    {
        let server = Serve::start_with(&dest, &["--allow-acls"]);
        let why = send(&[&tree], &server.target(), &["-A", "-X"]).failure(REFUSED);
        assert!(why.contains("--allow-xattrs"), "{why}");
        assert!(!dest.join("tree").exists(), "{:?}", listing(&dest));
        let server = Serve::start_with(&dest, &["--allow-xattrs"]);
        let why = send(&[&tree], &server.target(), &["-A"]).failure(REFUSED);
        assert!(why.contains("--allow-acls"), "{why}");
        assert!(!dest.join("tree").exists(), "{:?}", listing(&dest));
    }
    // The modes as rsync -a keeps them: the group bits are the ACLs' masks.
    let server = Serve::start_with(
        &dest,
        &["--allow-xattrs=all", "--allow-acls", "--umask", "000"],
    );
    let sent = send(&[&tree], &server.target(), &["-A", "-X"]).report();
    // a: two user.*, a trusted.* and an ACL; sub: user.dir, its ACL and
    // default ACL; sub/b: its ACL. The symlink has none (Linux allows no user.* there).
    // The sender counts what its plan carried: the receiver set them all.
    assert_eq!(report_u(&sent, "xattrs_sent"), 8, "{sent}");
    assert_eq!(report_u(&sent, "xattr_entries"), 3, "{sent}");
    let report = &server.report()["transfer"];
    assert_eq!(report["xattrs_set"], 8, "{report}");
    assert_eq!(report["xattrs_not_set"], 0, "{report}");
    for (cmd, args, shows) in [
        (
            "getfacl",
            &["-R", "-p", "tree"][..],
            "default:user:1234:r-x",
        ),
        (
            "getfattr",
            &["-dR", "-m", "-", "--absolute-names", "tree"],
            "user.big",
        ),
    ] {
        let ours = output_in(&dest, cmd, args).unwrap();
        assert_eq!(ours, output_in(&by_rsync, cmd, args).unwrap(), "{cmd}");
        assert!(ours.contains(shows), "{ours}");
    }
    // A server that sets user.* alone leaves trusted.* out, counted.
    let user_only = scratch.dir("user-only");
    let server = Serve::start_with(&user_only, &["--allow-xattrs", "--allow-acls"]);
    send(&[&tree], &server.target(), &["-A", "-X"]).report();
    let report = &server.report()["transfer"];
    assert_eq!(report["xattrs_set"], 7, "{report}");
    assert_eq!(report["xattrs_not_set"], 1, "{report}");
    let attrs = output_in(&user_only, "getfattr", &["-d", "-m", "-", "tree/a"]).unwrap();
    assert!(
        attrs.contains("user.colour") && !attrs.contains("trusted"),
        "{attrs}"
    );
    // --follow sends what a link points to: its attributes too.
    let links = scratch.dir("src/links");
    symlink(tree.join("a"), links.join("to-a")).unwrap();
    send(&[&links], &server.target(), &["-X", "--follow"]).report();
    let attrs = output_in(&user_only, "getfattr", &["-d", "links/to-a"]).unwrap();
    assert!(attrs.contains("user.colour"), "{attrs}");
}

/// A server that allows owners, attributes and ACLs gives them only to a
/// key whose authorized_keys line says so (`owners`, `xattrs`, `acls`), as
/// `overwrite` and `delete`: an operator can let one key keep ownership
/// and keep every other from it.
#[test]
fn owners_xattrs_and_acls_need_the_keys_own_options() {
    let scratch = TestDir::new("transfer-key-options");
    let tree = scratch.dir("src/tree");
    write_random(&tree.join("a"), 1000, 94);
    let dest = scratch.dir("dest");
    let keys = KeyFile::new(&scratch, "plain", "");
    let (key, authorized) = (keys.key.clone(), keys.authorized.clone());
    let allow = ["--allow-owners", "--allow-xattrs", "--allow-acls"];
    let identity = key.to_str().unwrap();
    {
        let server = Serve::start_keyed(&dest, &authorized, &allow);
        for (flag, option) in [("-o", "owners"), ("-X", "xattrs"), ("-A", "acls")] {
            let why =
                send(&[&tree], &server.target(), &["--identity", identity, flag]).failure(REFUSED);
            assert!(
                why.contains(&format!("no `{option}` option")),
                "{flag}: {why}"
            );
            assert!(!dest.join("tree").exists(), "{:?}", listing(&dest));
        }
    }
    // With the options, -X and -A go through (-o needs this end to be
    // root; owners_and_groups_arrive_as_rsync_gives_them covers it).
    keys.list_with("xattrs,acls");
    let server = Serve::start_keyed(&dest, &authorized, &allow);
    send(
        &[&tree],
        &server.target(),
        &["--identity", identity, "-X", "-A"],
    )
    .report();
    assert!(dest.join("tree/a").exists(), "{:?}", listing(&dest));
}
