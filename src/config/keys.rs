//! Key files, as ssh keeps them.
//!
//! - An identity: a private key file (mode 0600, created with `O_EXCL`,
//!   refused if others may read it) and `FILE.pub` beside it, under
//!   `$XDG_CONFIG_HOME/atou/` or `~/.config/atou/` (directory mode 0700).
//!   `atou keygen` writes them.
//! - `authorized_keys` (the server's): read here, parsed by
//!   [`AuthorizedKeys::parse`] (its format is written there); any
//!   malformed line refuses the whole file, naming the line.
//! - `known_hosts` (the client's): `HOST atou-x25519 BASE64` a line. A
//!   host seen for the first time is recorded; a host whose key changed is
//!   refused with the file and line to edit, as ssh does.
//!
//! A key's text form and the checks on every line are
//! [`crate::proto::crypto::key_text`]'s; this module reads and writes the
//! files.
//!
//! All three are read as sshd reads `authorized_keys` under its default
//! `StrictModes yes`: a file that group or others may write, or that a
//! user other than this one (or root) owns, is refused, and so is one in a
//! directory like that, since another local user could otherwise put
//! their own key in it. [`Strictness::Lax`] (`--no-strict-modes`) loads
//! such files anyway.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use thiserror::Error;
use zeroize::Zeroize;

use crate::proto::crypto::key_text::{
    decode_key, format_public_key, key_file_lines, KeyTextError, LineError, KEY_TYPE,
};
use crate::proto::crypto::{AuthorizedKeys, HandshakeError, PublicKey, StaticKeypair};

/// The first word of a private key file.
pub const PRIVATE_KEY_TYPE: &str = "atou-x25519-private";
/// The identity's file name in the config directory.
pub const IDENTITY_FILE: &str = "id_x25519";
pub const KNOWN_HOSTS_FILE: &str = "known_hosts";
pub const AUTHORIZED_KEYS_FILE: &str = "authorized_keys";
/// Largest key file read.
pub const MAX_FILE: u64 = 4 << 20;

/// Why a key file could not be read or written. Each message names the
/// file (and line) and, where there is one, the fix.
#[derive(Debug, Error)]
pub enum KeyError {
    #[error("neither XDG_CONFIG_HOME nor HOME is set: give the key file's path")]
    NoConfigDir,
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path} already exists; use --force to replace it")]
    Exists { path: PathBuf },
    #[error("{path} may be read by others (mode {mode:03o}); run `chmod 600 {path}`")]
    Unprotected { path: PathBuf, mode: u32 },
    /// Refused under [`Strictness::Strict`]: another user could have
    /// changed the file.
    #[error(
        "{path}: {problem}, so another user could change the keys in it; {fix}, \
         or pass --no-strict-modes to load it anyway"
    )]
    Unsafe {
        path: PathBuf,
        problem: String,
        fix: String,
    },
    #[error("{path} is over {MAX_FILE} bytes, too large for a key file")]
    TooLarge { path: PathBuf },
    #[error("{path}:{line}: {reason}")]
    Line {
        path: PathBuf,
        line: usize,
        reason: LineReason,
    },
    #[error(
        "the key of {host} has CHANGED since it was recorded in {path} line {line}: \
         someone may be intercepting the connection, or the server's key was replaced. \
         If you know the new key is right, delete line {line} of {path} and connect again"
    )]
    HostKeyChanged {
        host: String,
        path: PathBuf,
        line: usize,
    },
    #[error("`{}` cannot be recorded as a host name (spaces, control characters or '#')", crate::util::text::escape(.0.as_bytes()))]
    BadHostName(String),
}

/// Why a line of a key file was refused.
#[derive(Debug, Error)]
pub enum LineReason {
    /// The key's text, or a check every key file's lines pass.
    #[error(transparent)]
    Text(#[from] KeyTextError),
    #[error("more than one key in a private key file")]
    SecondPrivateKey,
    #[error("not an atou private key (expected `{PRIVATE_KEY_TYPE} BASE64`)")]
    NotPrivateKey,
    #[error("words after the key")]
    WordsAfterKey,
    #[error("{0}")]
    BadPrivateKey(HandshakeError),
    #[error("no key in the file")]
    NoKeyInFile,
    #[error("expected `HOST {KEY_TYPE} BASE64`")]
    NotKnownHostLine,
}

impl KeyError {
    /// A line of the file at `path` that was refused.
    fn line(path: &Path, line: usize, reason: impl Into<LineReason>) -> KeyError {
        KeyError::Line {
            path: path.to_path_buf(),
            line,
            reason: reason.into(),
        }
    }

    fn from_line(path: &Path) -> impl Fn(LineError) -> KeyError + '_ {
        move |LineError { line, reason }| KeyError::line(path, line, reason)
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> KeyError + '_ {
    move |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `$XDG_CONFIG_HOME/atou` if that is set to an absolute path, else
/// `$HOME/.config/atou` (XDG Base Directory Specification).
pub fn config_dir_from(
    xdg_config_home: Option<&Path>,
    home: Option<&Path>,
) -> Result<PathBuf, KeyError> {
    match (xdg_config_home, home) {
        (Some(x), _) if x.is_absolute() => Ok(x.join("atou")),
        (_, Some(h)) if !h.as_os_str().is_empty() => Ok(h.join(".config").join("atou")),
        _ => Err(KeyError::NoConfigDir),
    }
}

/// The user's atou config directory, from the environment.
pub fn config_dir() -> Result<PathBuf, KeyError> {
    let xdg = std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    config_dir_from(xdg.as_deref(), home.as_deref())
}

/// `FILE.pub`.
pub fn public_path(private: &Path) -> PathBuf {
    let mut p = private.as_os_str().to_owned();
    p.push(".pub");
    PathBuf::from(p)
}

/// Whether a key file that another user could have changed is refused,
/// as sshd's `StrictModes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Strictness {
    /// Refuse a file that group or others may write or that another user
    /// owns (root excepted), and one in a directory like that (unless the
    /// directory is sticky, as /tmp is). The default.
    #[default]
    Strict,
    /// Load it anyway (`--no-strict-modes`; sshd's `StrictModes no`).
    Lax,
}

/// What lets a user other than this one (effective uid `euid`) change a
/// file, or the entries of a directory (`dir`), of this `mode` owned by
/// `uid`; `None` when nothing does. Root's are as good as our own (sshd's
/// rule). In a sticky directory only a file's owner may rename or remove
/// it.
fn strict_modes_problem(mode: u32, uid: u32, euid: u32, dir: bool) -> Option<StrictProblem> {
    if uid != euid && uid != 0 {
        return Some(StrictProblem::Owner(uid));
    }
    let sticky = dir && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky {
        return Some(StrictProblem::Writable(mode & 0o7777));
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StrictProblem {
    /// Owned by this other uid.
    Owner(u32),
    /// Group or others may write it (this mode).
    Writable(u32),
}

/// Opens a key file to read; with [`Strictness::Strict`], refuses one
/// that another user could have changed ([`check_strict`]).
fn open_key_file(path: &Path, strictness: Strictness) -> Result<(File, fs::Metadata), KeyError> {
    let file = File::open(path).map_err(io_err(path))?;
    let meta = file.metadata().map_err(io_err(path))?;
    if strictness == Strictness::Strict {
        check_strict(path, &meta)?;
    }
    Ok((file, meta))
}

/// sshd's `StrictModes` for the key file opened from `path`, whose
/// `fstat` is `meta` ([`strict_problem`]).
fn check_strict(path: &Path, meta: &fs::Metadata) -> Result<(), KeyError> {
    match strict_problem(path, meta)? {
        None => Ok(()),
        Some((problem, fix)) => Err(KeyError::Unsafe {
            path: path.to_path_buf(),
            problem,
            fix,
        }),
    }
}

/// What would let another user have changed the file opened from `path`,
/// whose `fstat` is `meta`, and what fixes it; `None` when nothing would
/// (sshd's `StrictModes`). The file first; then the directory that holds
/// it, by its real path, so a symlink from a safe place does not launder
/// a file in an unsafe one.
pub(crate) fn strict_problem(
    path: &Path,
    meta: &fs::Metadata,
) -> Result<Option<(String, String)>, KeyError> {
    let euid = rustix::process::geteuid().as_raw();
    match strict_modes_problem(meta.mode(), meta.uid(), euid, false) {
        None => {}
        Some(StrictProblem::Owner(uid)) => {
            return Ok(Some((
                format!("it is owned by uid {uid}, not by you (uid {euid}) or root"),
                format!(
                    "run `chown {euid} {}` as root, or use a copy of your own",
                    path.display()
                ),
            )))
        }
        Some(StrictProblem::Writable(mode)) => {
            return Ok(Some((
                format!("group or others may write to it (mode {mode:03o})"),
                format!("run `chmod go-w {}`", path.display()),
            )))
        }
    }
    let real = fs::canonicalize(path).map_err(io_err(path))?;
    let named = fs::metadata(&real).map_err(io_err(&real))?;
    if (named.dev(), named.ino()) != (meta.dev(), meta.ino()) {
        return Ok(Some((
            format!(
                "it was replaced while it was being opened (now {})",
                real.display()
            ),
            "try again".into(),
        )));
    }
    let Some(dir) = real.parent() else {
        return Ok(None);
    };
    let dmeta = fs::metadata(dir).map_err(io_err(dir))?;
    Ok(
        match strict_modes_problem(dmeta.mode(), dmeta.uid(), euid, true) {
            None => None,
            Some(StrictProblem::Owner(uid)) => Some((
                format!(
                    "its directory {} is owned by uid {uid}, not by you (uid {euid}) or root",
                    dir.display()
                ),
                "move it to a directory of your own".into(),
            )),
            Some(StrictProblem::Writable(mode)) => Some((
                format!(
                    "group or others may write to its directory {} (mode {mode:03o})",
                    dir.display()
                ),
                format!("run `chmod go-w {}`", dir.display()),
            )),
        },
    )
}

/// A file holding a public key to pin (`--server-key FILE`), read as any
/// key file is: under `strictness`, one that another user could have
/// written is refused, since it decides whom the client trusts.
pub fn read_pinned_key_file(path: &Path, strictness: Strictness) -> Result<Vec<u8>, KeyError> {
    read_limited(path, strictness)
}

/// Reads at most [`MAX_FILE`] bytes of a key file opened by
/// [`open_key_file`].
fn read_limited(path: &Path, strictness: Strictness) -> Result<Vec<u8>, KeyError> {
    let (file, _) = open_key_file(path, strictness)?;
    read_opened(file, path)
}

fn read_opened(file: File, path: &Path) -> Result<Vec<u8>, KeyError> {
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err(path))?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(KeyError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// Writes a new key pair: the private key to `path` (mode 0600, created
/// exclusively; with `force`, written beside it and renamed over it) and
/// the public key to `path.pub`. Creates the directory (mode 0700) if
/// missing.
pub fn write_identity(
    path: &Path,
    keypair: &StaticKeypair,
    comment: &str,
    force: bool,
) -> Result<(), KeyError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err(dir))?;
    }
    let public = public_path(path);
    if !force {
        for p in [path, public.as_path()] {
            if p.symlink_metadata().is_ok() {
                return Err(KeyError::Exists {
                    path: p.to_path_buf(),
                });
            }
        }
    }
    let mut private = format!(
        "{PRIVATE_KEY_TYPE} {}\n",
        STANDARD.encode(keypair.private_bytes())
    );
    let result = write_new(path, private.as_bytes(), 0o600, force);
    private.zeroize();
    result?;
    let line = format_public_key(&keypair.public(), comment) + "\n";
    write_new(&public, line.as_bytes(), 0o644, force)
}

/// Creates `path` with `O_EXCL` (never through a symlink); with `replace`,
/// creates `path.tmp` that way and renames it over `path`.
fn write_new(path: &Path, contents: &[u8], mode: u32, replace: bool) -> Result<(), KeyError> {
    let target = if replace {
        let mut t = path.as_os_str().to_owned();
        t.push(".tmp");
        PathBuf::from(t)
    } else {
        path.to_path_buf()
    };
    if replace {
        // A leftover of an interrupted run; never a file we did not make
        // in this place.
        let _ = fs::remove_file(&target);
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&target)
        .map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => KeyError::Exists {
                path: target.clone(),
            },
            _ => KeyError::Io {
                path: target.clone(),
                source: e,
            },
        })?;
    // The umask may have cleared bits but never adds any; make it exact.
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err(&target))?;
    f.write_all(contents)
        .and_then(|()| f.sync_all())
        .map_err(io_err(&target))?;
    if replace {
        fs::rename(&target, path).map_err(io_err(path))?;
    }
    Ok(())
}

/// Reads a private key file, refusing one that others may read (as ssh
/// refuses an "UNPROTECTED PRIVATE KEY FILE"), and under `strictness`
/// one that others could have changed.
pub fn read_identity(path: &Path, strictness: Strictness) -> Result<StaticKeypair, KeyError> {
    let (file, meta) = open_key_file(path, Strictness::Lax)?;
    let mode = meta.mode() & 0o777;
    // Read or search bits first: `chmod 600` then fixes the write bits
    // too. Write bits, the owner and the directory are `strictness`'s.
    if mode & 0o055 != 0 {
        return Err(KeyError::Unprotected {
            path: path.to_path_buf(),
            mode,
        });
    }
    if strictness == Strictness::Strict {
        check_strict(path, &meta)?;
    }
    let mut bytes = read_opened(file, path)?;
    let result = parse_identity(&bytes, path);
    bytes.zeroize();
    result
}

fn parse_identity(bytes: &[u8], path: &Path) -> Result<StaticKeypair, KeyError> {
    let mut found = None;
    for item in key_file_lines(bytes) {
        let (line, text) = item.map_err(KeyError::from_line(path))?;
        let bad = |reason: LineReason| KeyError::line(path, line, reason);
        if found.is_some() {
            return Err(bad(LineReason::SecondPrivateKey));
        }
        let mut words = text.split_ascii_whitespace();
        if words.next() != Some(PRIVATE_KEY_TYPE) {
            return Err(bad(LineReason::NotPrivateKey));
        }
        let b64 = words
            .next()
            .ok_or_else(|| bad(KeyTextError::NoKeyAfterType.into()))?;
        if words.next().is_some() {
            return Err(bad(LineReason::WordsAfterKey));
        }
        let mut key = decode_key(b64).map_err(|r| bad(r.into()))?;
        let kp = StaticKeypair::from_private(key).map_err(|e| bad(LineReason::BadPrivateKey(e)));
        key.zeroize();
        found = Some(kp?);
    }
    found.ok_or_else(|| KeyError::line(path, 1, LineReason::NoKeyInFile))
}

/// `authorized_keys` read from a file: the bytes are
/// [`AuthorizedKeys::parse`]'s, the file and its modes are this module's.
impl AuthorizedKeys {
    /// Reads and parses `path`; any malformed line refuses the file, and
    /// under `strictness` a file others could have changed.
    pub fn load(path: &Path, strictness: Strictness) -> Result<AuthorizedKeys, KeyError> {
        AuthorizedKeys::parse(&read_limited(path, strictness)?).map_err(KeyError::from_line(path))
    }
}

/// What [`KnownHosts::check`] found for a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostStatus {
    /// Recorded with this key.
    Known,
    /// Not recorded.
    Unknown,
    /// Recorded with another key, on this line.
    Changed { line: usize },
}

/// What [`KnownHosts::verify`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// The key matched the one recorded.
    Matched,
    /// First use: the key was recorded.
    Recorded,
}

/// The client's `known_hosts`.
#[derive(Debug, Clone)]
pub struct KnownHosts {
    path: PathBuf,
    entries: Vec<(String, PublicKey, usize)>,
}

impl KnownHosts {
    /// Reads `path`; a missing file is an empty store. Under
    /// `strictness`, a file others could have changed is refused.
    pub fn load(path: &Path, strictness: Strictness) -> Result<KnownHosts, KeyError> {
        match read_limited(path, strictness) {
            Ok(bytes) => KnownHosts::parse(&bytes, path),
            Err(KeyError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(KnownHosts {
                    path: path.to_path_buf(),
                    entries: Vec::new(),
                })
            }
            Err(e) => Err(e),
        }
    }

    pub fn parse(bytes: &[u8], path: &Path) -> Result<KnownHosts, KeyError> {
        let mut entries = Vec::new();
        for item in key_file_lines(bytes) {
            let (line, text) = item.map_err(KeyError::from_line(path))?;
            let bad = |reason: LineReason| KeyError::line(path, line, reason);
            let mut words = text.split_ascii_whitespace();
            let host = words
                .next()
                .ok_or_else(|| bad(KeyTextError::EmptyLine.into()))?;
            if words.next() != Some(KEY_TYPE) {
                return Err(bad(LineReason::NotKnownHostLine));
            }
            let b64 = words
                .next()
                .ok_or_else(|| bad(KeyTextError::NoKeyAfterType.into()))?;
            let key = PublicKey(decode_key(b64).map_err(|r| bad(r.into()))?);
            if words.next().is_some() {
                return Err(bad(LineReason::WordsAfterKey));
            }
            entries.push((host.to_string(), key, line));
        }
        Ok(KnownHosts {
            path: path.to_path_buf(),
            entries,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The key recorded for `host` (the first line naming it, as in ssh).
    pub fn lookup(&self, host: &str) -> Option<PublicKey> {
        self.entries
            .iter()
            .find(|(h, _, _)| h == host)
            .map(|(_, k, _)| *k)
    }

    /// The first line naming `host` decides, as in ssh.
    pub fn check(&self, host: &str, key: &PublicKey) -> HostStatus {
        match self.entries.iter().find(|(h, _, _)| h == host) {
            None => HostStatus::Unknown,
            Some((_, k, _)) if k == key => HostStatus::Known,
            Some((_, _, line)) => HostStatus::Changed { line: *line },
        }
    }

    /// Trust on first use: a known key passes, an unknown host is
    /// recorded (appended to the file, created mode 0600 if missing), a
    /// changed key is refused naming the file and line to edit.
    pub fn verify(&mut self, host: &str, key: &PublicKey) -> Result<Verified, KeyError> {
        match self.check(host, key) {
            HostStatus::Known => Ok(Verified::Matched),
            HostStatus::Changed { line } => Err(KeyError::HostKeyChanged {
                host: crate::util::text::escape(host.as_bytes()),
                path: self.path.clone(),
                line,
            }),
            HostStatus::Unknown => {
                self.record(host, key)?;
                Ok(Verified::Recorded)
            }
        }
    }

    fn record(&mut self, host: &str, key: &PublicKey) -> Result<(), KeyError> {
        if host.is_empty()
            || host.starts_with('#')
            || host.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(KeyError::BadHostName(host.to_string()));
        }
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err(dir))?;
        }
        let mut f = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)
            .map_err(io_err(&self.path))?;
        // A file that does not end in a newline gets one first.
        let len = f.metadata().map_err(io_err(&self.path))?.len();
        // The file was loaded (and judged) before; these reads only find
        // its last byte and its line count.
        let needs_newline = len > 0 && {
            let bytes = read_limited(&self.path, Strictness::Lax)?;
            bytes.last() != Some(&b'\n')
        };
        let mut text = String::new();
        if needs_newline {
            text.push('\n');
        }
        text.push_str(host);
        text.push(' ');
        text.push_str(&format_public_key(key, ""));
        text.push('\n');
        f.write_all(text.as_bytes()).map_err(io_err(&self.path))?;
        let line = count_lines(&self.path);
        self.entries.push((host.to_string(), *key, line));
        Ok(())
    }
}

fn count_lines(path: &Path) -> usize {
    read_limited(path, Strictness::Lax).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::crypto::key_text::{parse_public_key, MAX_LINE};

    /// What a test does when this host cannot run it, shared with the
    /// integration suites.
    #[allow(dead_code, unreachable_pub)]
    mod ci {
        include!("../../tests/common/ci.rs");
    }

    /// A directory of the test's own; kept afterwards, as a failed
    /// test's files are wanted.
    fn tmp(name: &str) -> PathBuf {
        tempfile::Builder::new()
            .prefix(&format!("atou-keys-{name}-"))
            .tempdir()
            .unwrap()
            .keep()
    }

    fn key(b: u8) -> PublicKey {
        PublicKey([b; 32])
    }

    fn line_of(k: &PublicKey) -> String {
        format_public_key(k, "")
    }

    fn line_error(r: Result<impl std::fmt::Debug, KeyError>) -> (usize, String) {
        match r {
            Err(KeyError::Line { line, reason, .. }) => (line, reason.to_string()),
            other => panic!("expected a line error, got {other:?}"),
        }
    }

    #[test]
    fn the_config_dir_follows_xdg_then_home() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            config_dir_from(Some(&p("/x")), Some(&p("/h"))).unwrap(),
            p("/x/atou")
        );
        assert_eq!(
            config_dir_from(Some(&p("rel")), Some(&p("/h"))).unwrap(),
            p("/h/.config/atou")
        );
        assert_eq!(
            config_dir_from(None, Some(&p("/h"))).unwrap(),
            p("/h/.config/atou")
        );
        assert!(matches!(
            config_dir_from(None, None),
            Err(KeyError::NoConfigDir)
        ));
    }

    #[test]
    fn keygen_writes_a_0600_private_key_that_reads_back_and_refuses_to_overwrite() {
        let dir = tmp("keygen");
        let path = dir.join("sub/id_x25519");
        let kp = StaticKeypair::generate().unwrap();
        write_identity(&path, &kp, "me@here", false).unwrap();
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::metadata(dir.join("sub")).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            read_identity(&path, Strictness::Strict).unwrap().public(),
            kp.public()
        );
        let public = fs::read_to_string(public_path(&path)).unwrap();
        assert_eq!(
            public,
            format!("{}\n", format_public_key(&kp.public(), "me@here"))
        );
        assert_eq!(parse_public_key(&public).unwrap(), kp.public());

        let other = StaticKeypair::generate().unwrap();
        assert!(matches!(
            write_identity(&path, &other, "", false),
            Err(KeyError::Exists { .. })
        ));
        assert_eq!(
            read_identity(&path, Strictness::Strict).unwrap().public(),
            kp.public()
        );
        write_identity(&path, &other, "", true).unwrap();
        assert_eq!(
            read_identity(&path, Strictness::Strict).unwrap().public(),
            other.public()
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keygen_does_not_write_through_a_symlink() {
        let dir = tmp("symlink");
        let victim = dir.join("victim");
        fs::write(&victim, "precious").unwrap();
        let path = dir.join("id_x25519");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        let kp = StaticKeypair::generate().unwrap();
        assert!(matches!(
            write_identity(&path, &kp, "", false),
            Err(KeyError::Exists { .. })
        ));
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_private_key_others_can_read_is_refused() {
        let dir = tmp("unprotected");
        let path = dir.join("id");
        write_identity(&path, &StaticKeypair::generate().unwrap(), "", false).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_identity(&path, Strictness::Strict).unwrap_err();
        assert!(matches!(err, KeyError::Unprotected { mode: 0o644, .. }));
        assert!(err.to_string().contains("chmod 600"));
        fs::remove_dir_all(&dir).unwrap();
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// An `authorized_keys` in `dir`, mode `mode`.
    fn authorized_file(dir: &Path, mode: u32) -> PathBuf {
        let path = dir.join(AUTHORIZED_KEYS_FILE);
        fs::write(&path, format!("{}\n", line_of(&key(1)))).unwrap();
        chmod(&path, mode);
        path
    }

    /// sshd's StrictModes: another user who can write the file could add
    /// their key to it.
    #[test]
    fn an_authorized_keys_that_group_or_others_can_write_is_refused() {
        let dir = tmp("strict-ak");
        for mode in [0o666, 0o646, 0o620] {
            let path = authorized_file(&dir, mode);
            let err = AuthorizedKeys::load(&path, Strictness::Strict).unwrap_err();
            let msg = err.to_string();
            assert!(
                msg.contains(&format!("chmod go-w {}", path.display())),
                "{mode:o}: {msg}"
            );
            assert!(!msg.contains('\n'), "one line: {msg}");
        }
        // Others may read it (no secret in it), only not write.
        let path = authorized_file(&dir, 0o644);
        assert_eq!(
            AuthorizedKeys::load(&path, Strictness::Strict)
                .unwrap()
                .len(),
            1
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_identity_that_group_or_others_can_write_is_refused() {
        let dir = tmp("strict-id");
        let path = dir.join("id");
        write_identity(&path, &StaticKeypair::generate().unwrap(), "", false).unwrap();
        chmod(&path, 0o620);
        let err = read_identity(&path, Strictness::Strict).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KeyError::Unsafe { .. }), "{msg}");
        assert!(
            msg.contains(&format!("chmod go-w {}", path.display())),
            "{msg}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn known_hosts_that_group_or_others_can_write_is_refused() {
        let dir = tmp("strict-kh");
        let path = dir.join(KNOWN_HOSTS_FILE);
        fs::write(&path, format!("h {}\n", line_of(&key(1)))).unwrap();
        chmod(&path, 0o602);
        let msg = KnownHosts::load(&path, Strictness::Strict)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!("chmod go-w {}", path.display())),
            "{msg}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Whoever may write the directory may replace the file in it.
    #[test]
    fn a_key_file_in_a_directory_group_or_others_can_write_is_refused() {
        let dir = tmp("strict-dir");
        let loose = dir.join("loose");
        fs::create_dir(&loose).unwrap();
        chmod(&loose, 0o777);
        let ak = authorized_file(&loose, 0o600);
        let id = loose.join("id");
        write_identity(&id, &StaticKeypair::generate().unwrap(), "", false).unwrap();
        let kh = loose.join(KNOWN_HOSTS_FILE);
        fs::write(&kh, format!("h {}\n", line_of(&key(1)))).unwrap();
        let fix = format!("chmod go-w {}", loose.display());
        for (what, r) in [
            (
                "authorized_keys",
                AuthorizedKeys::load(&ak, Strictness::Strict).map(|_| ()),
            ),
            (
                "identity",
                read_identity(&id, Strictness::Strict).map(|_| ()),
            ),
            (
                "known_hosts",
                KnownHosts::load(&kh, Strictness::Strict).map(|_| ()),
            ),
        ] {
            let msg = r.map_err(|e| e.to_string());
            assert!(
                msg.as_ref().is_err_and(|m| m.contains(&fix)),
                "{what}: {msg:?}"
            );
        }
        // A symlink from a safe directory does not launder the file.
        let link = dir.join("linked_keys");
        std::os::unix::fs::symlink(&ak, &link).unwrap();
        let msg = AuthorizedKeys::load(&link, Strictness::Strict)
            .unwrap_err()
            .to_string();
        assert!(msg.contains(&fix), "{msg}");
        // Group-writable is as bad as world-writable.
        chmod(&loose, 0o770);
        assert!(AuthorizedKeys::load(&ak, Strictness::Strict).is_err());
        // A sticky directory (as /tmp) lets nobody else rename or remove
        // the file, and a file someone else made is refused by its owner.
        chmod(&loose, 0o1777);
        assert_eq!(
            AuthorizedKeys::load(&ak, Strictness::Strict).unwrap().len(),
            1
        );
        chmod(&loose, 0o755);
        assert_eq!(
            AuthorizedKeys::load(&ak, Strictness::Strict).unwrap().len(),
            1
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Root's files are as good as the user's own, as sshd has it.
    #[test]
    fn strict_modes_accept_the_users_and_roots_files_only() {
        let p = strict_modes_problem;
        assert_eq!(p(0o100600, 1000, 1000, false), None);
        assert_eq!(p(0o100644, 0, 1000, false), None);
        assert_eq!(p(0o100644, 0, 0, false), None);
        assert_eq!(
            p(0o100600, 1001, 1000, false),
            Some(StrictProblem::Owner(1001))
        );
        assert_eq!(
            p(0o100600, 1000, 0, false),
            Some(StrictProblem::Owner(1000))
        );
        assert_eq!(
            p(0o100664, 1000, 1000, false),
            Some(StrictProblem::Writable(0o664))
        );
        // Sticky spares a directory, not a file.
        assert_eq!(p(0o41777, 0, 1000, true), None);
        assert_eq!(
            p(0o101666, 1000, 1000, false),
            Some(StrictProblem::Writable(0o1666))
        );
        assert_eq!(
            p(0o40775, 1000, 1000, true),
            Some(StrictProblem::Writable(0o775))
        );
        assert_eq!(
            p(0o40755, 1001, 1000, true),
            Some(StrictProblem::Owner(1001))
        );
    }

    /// A file another user owns is refused even at mode 0600: they could
    /// rewrite it. Needs root to give a file away; others skip it.
    #[test]
    fn a_key_file_another_user_owns_is_refused() {
        if !rustix::process::geteuid().is_root() {
            ci::cannot_run(
                "a_key_file_another_user_owns_is_refused",
                "not root (only root can give a file to another user; CI runs as root)",
            );
            return;
        }
        let dir = tmp("strict-owner");
        let path = authorized_file(&dir, 0o600);
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let msg = AuthorizedKeys::load(&path, Strictness::Strict)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("owned by uid 65534"), "{msg}");
        let sub = dir.join("theirs");
        fs::create_dir(&sub).unwrap();
        std::os::unix::fs::chown(&sub, Some(65534), None).unwrap();
        let path = authorized_file(&sub, 0o600);
        let msg = AuthorizedKeys::load(&path, Strictness::Strict)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(&format!(
                "its directory {} is owned by uid 65534",
                sub.display()
            )),
            "{msg}"
        );
        assert_eq!(
            AuthorizedKeys::load(&path, Strictness::Lax).unwrap().len(),
            1
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// `--no-strict-modes`: loaded anyway, but a private key others may
    /// read is still refused (ssh always refuses that).
    #[test]
    fn lax_strictness_loads_key_files_others_can_write() {
        let dir = tmp("lax");
        let loose = dir.join("loose");
        fs::create_dir(&loose).unwrap();
        chmod(&loose, 0o777);
        let ak = authorized_file(&loose, 0o666);
        assert_eq!(AuthorizedKeys::load(&ak, Strictness::Lax).unwrap().len(), 1);
        let kh = loose.join(KNOWN_HOSTS_FILE);
        fs::write(&kh, format!("h {}\n", line_of(&key(1)))).unwrap();
        chmod(&kh, 0o666);
        let known = KnownHosts::load(&kh, Strictness::Lax).unwrap();
        assert_eq!(known.check("h", &key(1)), HostStatus::Known);
        let id = loose.join("id");
        let kp = StaticKeypair::generate().unwrap();
        write_identity(&id, &kp, "", false).unwrap();
        chmod(&id, 0o622);
        assert_eq!(
            read_identity(&id, Strictness::Lax).unwrap().public(),
            kp.public()
        );
        chmod(&id, 0o640);
        assert!(matches!(
            read_identity(&id, Strictness::Lax),
            Err(KeyError::Unprotected { mode: 0o640, .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hostile_private_key_files_are_refused() {
        let p = Path::new("id");
        for (bytes, why) in [
            (&b""[..], "no key"),
            (b"atou-x25519-private", "no key after"),
            (b"atou-x25519-private !!!!", "base64"),
            (b"atou-x25519-private AAAA", "3 bytes"),
            (b"ssh-ed25519 AAAA", "not an atou private key"),
            (b"atou-x25519-private \0AAA", "NUL"),
        ] {
            let (_, reason) = line_error(parse_identity(bytes, p));
            assert!(reason.contains(why), "{why}: {reason}");
        }
    }

    /// The file's path and the line's number around the parser's reason.
    #[test]
    fn a_malformed_authorized_keys_line_names_the_file_and_line() {
        let dir = tmp("ak-line");
        let path = dir.join(AUTHORIZED_KEYS_FILE);
        fs::write(
            &path,
            format!(
                "{}
subdir=/etc {}
",
                line_of(&key(1)),
                line_of(&key(2))
            ),
        )
        .unwrap();
        chmod(&path, 0o600);
        let err = AuthorizedKeys::load(&path, Strictness::Strict).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "{}:2: subdir= needs a relative path beneath --dir",
                path.display()
            )
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn known_hosts_records_on_first_use_and_refuses_a_changed_key_naming_the_line() {
        let dir = tmp("known");
        let path = dir.join("cfg/known_hosts");
        let mut kh = KnownHosts::load(&path, Strictness::Strict).unwrap();
        assert_eq!(
            kh.verify("a.example:4000", &key(1)).unwrap(),
            Verified::Recorded
        );
        assert_eq!(
            kh.verify("b.example:4000", &key(2)).unwrap(),
            Verified::Recorded
        );
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let mut kh = KnownHosts::load(&path, Strictness::Strict).unwrap();
        assert_eq!(
            kh.verify("a.example:4000", &key(1)).unwrap(),
            Verified::Matched
        );
        assert_eq!(
            kh.check("b.example:4000", &key(9)),
            HostStatus::Changed { line: 2 }
        );
        let err = kh.verify("b.example:4000", &key(9)).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, KeyError::HostKeyChanged { line: 2, .. }));
        assert!(
            msg.contains("line 2") && msg.contains(&path.display().to_string()),
            "{msg}"
        );
        // Nothing was recorded for the changed key.
        let kh = KnownHosts::load(&path, Strictness::Strict).unwrap();
        assert_eq!(kh.check("b.example:4000", &key(2)), HostStatus::Known);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn known_hosts_appends_after_a_last_line_without_newline() {
        let dir = tmp("append");
        let path = dir.join("known_hosts");
        fs::write(&path, format!("a {}", line_of(&key(1)))).unwrap();
        let mut kh = KnownHosts::load(&path, Strictness::Strict).unwrap();
        kh.verify("b", &key(2)).unwrap();
        let kh = KnownHosts::load(&path, Strictness::Strict).unwrap();
        assert_eq!(kh.check("a", &key(1)), HostStatus::Known);
        assert_eq!(kh.check("b", &key(2)), HostStatus::Known);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hostile_known_hosts_lines_and_names_are_refused() {
        let good = line_of(&key(1));
        for (bad, why) in [
            (format!("h {good} extra"), "words after"),
            ("h atou-x25519 ***".to_string(), "base64"),
            (good.clone(), "expected"),
            (format!("h\0 {good}"), "NUL"),
            ("h".repeat(MAX_LINE + 1), "over the"),
        ] {
            let (line, reason) = line_error(KnownHosts::parse(
                format!("\n{bad}").as_bytes(),
                Path::new("kh"),
            ));
            assert_eq!(line, 2);
            assert!(reason.contains(why), "{why}: {reason}");
        }
        let mut kh = KnownHosts::parse(b"", Path::new("/nonexistent/kh")).unwrap();
        for name in ["", "a b", "#x", "a\nb"] {
            assert!(
                matches!(kh.verify(name, &key(1)), Err(KeyError::BadHostName(_))),
                "{name:?}"
            );
        }
    }
}
