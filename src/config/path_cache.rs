//! The path cache: one small file per destination under
//! `$XDG_CACHE_HOME/atou/paths/` (or `~/.cache/atou/paths/`), holding the
//! [`PathMemory`] of the last transfer there, for the next one to start
//! from (Linux's destination cache, `net/ipv4/tcp_metrics.c`; see
//! [`crate::proto::path_memory`]).
//!
//! As Linux's: saved when a transfer ends, ignored after an hour
//! (`TCP_METRICS_TIMEOUT`), and only ever a hint. The files are in the
//! user's own cache, but whatever put them there, a file is read as
//! untrusted input: bounded in size, every value checked, and a file that
//! does not parse is ignored with a warning rather than failing the
//! transfer. `--no-path-cache` neither reads nor writes it.

use std::fs;
use std::io::{self, Read, Write};
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use thiserror::Error;

use crate::proto::PathMemory;

/// Linux's TCP_METRICS_TIMEOUT: an entry older than this is ignored.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(3600);
/// A cache file is a few lines; anything longer is not one of ours.
const MAX_FILE_LEN: u64 = 1024;
/// Files kept in the directory at most; past it, saving first removes
/// stale entries, and then refuses to add more.
const MAX_ENTRIES: usize = 4096;
/// A clock stepped back may date a file slightly in the future; more than
/// this and the date is not believed.
const CLOCK_SLACK: Duration = Duration::from_secs(60);
/// First line of every file: the format and its version.
const MAGIC: &str = "atou-path-memory 1";

/// Why an entry, or the directory that holds it, is not used; each names
/// the file or directory at fault, for the warning.
#[derive(Debug, Error)]
pub(crate) enum PathCacheError {
    #[error("{}: {error}", .path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(
        "{}: owned by uid {uid}, not by this user; the path cache is not used",
        .dir.display()
    )]
    NotOurs { dir: PathBuf, uid: u32 },
    #[error(
        "{}: others may write to it (mode {mode:o}); the path cache is not used \
         (chmod go-w {} to use it)",
        .dir.display(),
        .dir.display()
    )]
    OthersMayWrite { dir: PathBuf, mode: u32 },
    #[error("{}: longer than {} bytes", .0.display(), MAX_FILE_LEN)]
    TooLong(PathBuf),
    #[error("{}: {why}", .path.display())]
    Malformed { path: PathBuf, why: EntryError },
    #[error("{}: saved in the future", .0.display())]
    SavedInTheFuture(PathBuf),
}

/// Why the text of an entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub(crate) enum EntryError {
    #[error("does not start with `{}`", MAGIC)]
    NoMagic,
    #[error("`{0}` is not `name value`")]
    NotNameValue(String),
    #[error("unknown field `{0}`")]
    UnknownField(String),
    #[error("`{0}` is not a whole number")]
    NotAWholeNumber(&'static str),
    #[error("`{0}` twice")]
    Twice(&'static str),
    #[error("no `{0}`")]
    Missing(&'static str),
    /// A value outside what [`PathMemory::checked`] accepts.
    #[error("a value no path has")]
    Implausible,
}

/// `$XDG_CACHE_HOME/atou/paths` if that is set to an absolute path, else
/// `$HOME/.cache/atou/paths` (XDG Base Directory Specification); `None`
/// without either.
pub(crate) fn default_dir_from(
    xdg_cache_home: Option<&Path>,
    home: Option<&Path>,
) -> Option<PathBuf> {
    let base = match (xdg_cache_home, home) {
        (Some(x), _) if x.is_absolute() => x.to_path_buf(),
        (_, Some(h)) if !h.as_os_str().is_empty() => h.join(".cache"),
        _ => return None,
    };
    Some(base.join("atou").join("paths"))
}

/// The cache of this user, from the environment.
pub(crate) fn default_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from);
    let home = std::env::var_os("HOME").map(PathBuf::from);
    default_dir_from(xdg.as_deref(), home.as_deref())
}

/// The directory of path memories.
#[derive(Debug, Clone)]
pub(crate) struct PathCache {
    dir: PathBuf,
}

/// A destination: the peer's address (not its port: Linux keys its
/// metrics by address alone, and `atou copy` over ssh picks a new port
/// each time) and, for a server whose key is pinned, that key (a different
/// server behind the same address keeps its own entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Destination<'a> {
    pub peer: IpAddr,
    pub server_key: Option<&'a [u8; 32]>,
}

impl Destination<'_> {
    /// The file's name: a hash, so that no address or key character ends
    /// up in a path.
    fn file_name(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(self.peer.to_string().as_bytes());
        if let Some(key) = self.server_key {
            h.update(b"\0");
            h.update(key);
        }
        h.finalize().to_hex()[..32].to_string()
    }
}

impl PathCache {
    pub(crate) fn at(dir: PathBuf) -> PathCache {
        PathCache { dir }
    }

    /// The user's cache directory ([`default_dir`]); `None` without one.
    pub(crate) fn open_default() -> Option<PathCache> {
        default_dir().map(PathCache::at)
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    fn path_of(&self, dest: &Destination<'_>) -> PathBuf {
        self.dir.join(dest.file_name())
    }

    /// The memory saved for `dest`, if there is one younger than
    /// [`MAX_AGE`] at `now`. `Err` says why a file there was ignored (for
    /// a warning); a missing or stale entry is `Ok(None)`.
    pub(crate) fn load(
        &self,
        dest: &Destination<'_>,
        now: SystemTime,
    ) -> Result<Option<PathMemory>, PathCacheError> {
        let path = self.path_of(dest);
        let mut text = String::new();
        if !check_private_dir(&self.dir)? {
            return Ok(None);
        }
        // Not through a symlink, and never blocking on a FIFO planted
        // where an entry should be: only a regular file is read.
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .and_then(|f| {
                if f.metadata()?.is_file() {
                    Ok(f)
                } else {
                    Err(io::Error::other("not a regular file"))
                }
            });
        match opened {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(PathCacheError::Io { path, error }),
            Ok(f) => {
                if let Err(error) = f.take(MAX_FILE_LEN + 1).read_to_string(&mut text) {
                    return Err(PathCacheError::Io { path, error });
                }
            }
        }
        if text.len() as u64 > MAX_FILE_LEN {
            return Err(PathCacheError::TooLong(path));
        }
        let (saved_at, memory) = match parse(&text) {
            Ok(parsed) => parsed,
            Err(why) => return Err(PathCacheError::Malformed { path, why }),
        };
        let now = unix_secs(now);
        if saved_at > now + CLOCK_SLACK.as_secs() {
            return Err(PathCacheError::SavedInTheFuture(path));
        }
        Ok((now.saturating_sub(saved_at) <= MAX_AGE.as_secs()).then_some(memory))
    }

    /// Saves `memory` for `dest`, replacing what was there: written to a
    /// temporary file and renamed over the old one, so that a reader sees
    /// the old file or the new one, never half of either.
    pub(crate) fn save(
        &self,
        dest: &Destination<'_>,
        memory: &PathMemory,
        now: SystemTime,
    ) -> io::Result<()> {
        create_private_dir(&self.dir)?;
        if !check_private_dir(&self.dir).map_err(io::Error::other)? {
            return Err(io::Error::other(format!("{} vanished", self.dir.display())));
        }
        let path = self.path_of(dest);
        if !path.exists() && !self.make_room(now)? {
            return Err(io::Error::other(format!(
                "{} holds {MAX_ENTRIES} entries younger than an hour",
                self.dir.display()
            )));
        }
        let tmp = self
            .dir
            .join(format!(".{}.tmp.{}", dest.file_name(), std::process::id()));
        let _ = fs::remove_file(&tmp);
        let written = (|| {
            // A new file of our own: never through a symlink left there.
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&tmp)?;
            f.write_all(format(unix_secs(now), memory).as_bytes())?;
            f.sync_all()
        })();
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path)) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }

    /// Below [`MAX_ENTRIES`] files, or stale ones removed until it is;
    /// whether there is room now.
    fn make_room(&self, now: SystemTime) -> io::Result<bool> {
        let entries: Vec<_> = fs::read_dir(&self.dir)?.filter_map(Result::ok).collect();
        if entries.len() < MAX_ENTRIES {
            return Ok(true);
        }
        let mut left = entries.len();
        for e in entries {
            let stale = e.metadata().and_then(|m| m.modified()).map_or(true, |t| {
                now.duration_since(t).unwrap_or_default() > MAX_AGE
            });
            if stale && fs::remove_file(e.path()).is_ok() {
                left -= 1;
            }
        }
        Ok(left < MAX_ENTRIES)
    }
}

fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir)
}

/// The cache is used only in a directory that is ours and that no one
/// else may write to (it can be anywhere `XDG_CACHE_HOME` says, and a
/// directory that already existed keeps its mode): another user who can
/// write there could otherwise swap entries under a transfer. `Ok(false)`:
/// there is no such directory (yet).
fn check_private_dir(dir: &Path) -> Result<bool, PathCacheError> {
    let meta = match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(error) => {
            return Err(PathCacheError::Io {
                path: dir.to_path_buf(),
                error,
            })
        }
        Ok(meta) => meta,
    };
    if !meta.is_dir() {
        return Err(PathCacheError::NotADirectory(dir.to_path_buf()));
    }
    if meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(PathCacheError::NotOurs {
            dir: dir.to_path_buf(),
            uid: meta.uid(),
        });
    }
    if meta.mode() & 0o022 != 0 {
        return Err(PathCacheError::OthersMayWrite {
            dir: dir.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    Ok(true)
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The file: the magic line, then `name value` lines, times in
/// microseconds.
fn format(saved_at: u64, m: &PathMemory) -> String {
    let mut s = format!(
        "{MAGIC}\nsaved_at {saved_at}\nsrtt_us {}\nrttvar_us {}\n",
        m.srtt.as_micros(),
        m.rttvar.as_micros()
    );
    if let Some(b) = m.ssthresh_bytes {
        s += &format!("ssthresh_bytes {b}\n");
    }
    if let (Some(bw), Some(rtt)) = (m.btl_bw_bps, m.min_rtt) {
        s += &format!("btl_bw_bps {bw}\nmin_rtt_us {}\n", rtt.as_micros());
    }
    if let Some(d) = m.datagram_size {
        s += &format!("datagram_size {d}\n");
    }
    s
}

/// The saved time and the memory of a file, every value checked
/// ([`PathMemory::checked`]); a line twice, an unknown one or a missing
/// one is an error.
fn parse(text: &str) -> Result<(u64, PathMemory), EntryError> {
    let mut lines = text.lines();
    if lines.next() != Some(MAGIC) {
        return Err(EntryError::NoMagic);
    }
    let mut fields: [Option<u64>; 7] = [None; 7];
    const NAMES: [&str; 7] = [
        "saved_at",
        "srtt_us",
        "rttvar_us",
        "ssthresh_bytes",
        "btl_bw_bps",
        "min_rtt_us",
        "datagram_size",
    ];
    for line in lines {
        let (name, value) = line
            .split_once(' ')
            .ok_or_else(|| EntryError::NotNameValue(line.to_string()))?;
        let i = NAMES
            .iter()
            .position(|n| *n == name)
            .ok_or_else(|| EntryError::UnknownField(name.to_string()))?;
        let value: u64 = value
            .parse()
            .map_err(|_| EntryError::NotAWholeNumber(NAMES[i]))?;
        if fields[i].replace(value).is_some() {
            return Err(EntryError::Twice(NAMES[i]));
        }
    }
    let need = |i: usize| fields[i].ok_or(EntryError::Missing(NAMES[i]));
    let micros = Duration::from_micros;
    let memory = PathMemory {
        srtt: micros(need(1)?),
        rttvar: micros(need(2)?),
        ssthresh_bytes: fields[3],
        btl_bw_bps: fields[4],
        min_rtt: fields[5].map(micros),
        datagram_size: match fields[6] {
            Some(d) => Some(u32::try_from(d).map_err(|_| EntryError::Implausible)?),
            None => None,
        },
        // Saved only over what it may replace (PathMemory::over).
        btl_bw_is_lower_bound: false,
    }
    .checked()
    .ok_or(EntryError::Implausible)?;
    Ok((need(0)?, memory))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache whose directory does not exist yet, under a directory of
    /// the test's own; kept afterwards, as a failed test's files are wanted.
    fn scratch(name: &str) -> PathCache {
        let parent = tempfile::Builder::new()
            .prefix(&format!("atou-path-cache-{name}-"))
            .tempdir()
            .unwrap()
            .keep();
        PathCache::at(parent.join("cache"))
    }

    fn memory() -> PathMemory {
        PathMemory {
            srtt: Duration::from_micros(101_234),
            rttvar: Duration::from_micros(4_321),
            ssthresh_bytes: Some(1_794_368),
            btl_bw_bps: Some(95_123_456),
            min_rtt: Some(Duration::from_micros(100_012)),
            datagram_size: Some(1372),
            btl_bw_is_lower_bound: false,
        }
    }

    fn dest() -> Destination<'static> {
        Destination {
            peer: "192.0.2.7".parse().unwrap(),
            server_key: None,
        }
    }

    fn t(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn the_default_directory_follows_xdg_then_home() {
        let p = |s: &str| PathBuf::from(s);
        assert_eq!(
            default_dir_from(Some(&p("/x")), Some(&p("/h"))),
            Some(p("/x/atou/paths"))
        );
        assert_eq!(
            default_dir_from(Some(&p("rel")), Some(&p("/h"))),
            Some(p("/h/.cache/atou/paths"))
        );
        assert_eq!(default_dir_from(None, None), None);
    }

    #[test]
    fn a_saved_memory_comes_back_whole_within_the_hour() {
        let cache = scratch("round-trip");
        cache.save(&dest(), &memory(), t(1_000_000)).unwrap();
        assert_eq!(cache.load(&dest(), t(1_000_000)).unwrap(), Some(memory()));
        assert_eq!(cache.load(&dest(), t(1_003_600)).unwrap(), Some(memory()));
        let model_free = PathMemory {
            btl_bw_bps: None,
            min_rtt: None,
            ssthresh_bytes: None,
            datagram_size: None,
            ..memory()
        };
        cache.save(&dest(), &model_free, t(1_000_000)).unwrap();
        assert_eq!(cache.load(&dest(), t(1_000_000)).unwrap(), Some(model_free));
        let leftovers: Vec<_> = fs::read_dir(cache.dir()).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file left behind");
        fs::remove_dir_all(cache.dir()).unwrap();
    }

    #[test]
    fn an_entry_older_than_an_hour_or_from_elsewhere_is_not_used() {
        let cache = scratch("stale");
        cache.save(&dest(), &memory(), t(1_000_000)).unwrap();
        assert_eq!(cache.load(&dest(), t(1_003_601)).unwrap(), None, "stale");
        let other_host = Destination {
            peer: "192.0.2.8".parse().unwrap(),
            server_key: None,
        };
        assert_eq!(cache.load(&other_host, t(1_000_000)).unwrap(), None);
        let key = [9u8; 32];
        let other_server = Destination {
            server_key: Some(&key),
            ..dest()
        };
        assert_eq!(cache.load(&other_server, t(1_000_000)).unwrap(), None);
        assert!(
            matches!(
                cache.load(&dest(), t(1_000_000 - 3600)),
                Err(PathCacheError::SavedInTheFuture(_))
            ),
            "saved an hour in the future"
        );
        fs::remove_dir_all(cache.dir()).unwrap();
    }

    #[test]
    fn a_corrupt_or_hostile_file_is_refused_with_a_reason() {
        let cache = scratch("corrupt");
        cache.save(&dest(), &memory(), t(1_000_000)).unwrap();
        let path = cache.path_of(&dest());
        let good = fs::read_to_string(&path).unwrap();
        let cases = [
            String::new(),
            "garbage".to_string(),
            good.replace("srtt_us 101234", "srtt_us -5"),
            good.replace("srtt_us 101234", "srtt_us 0"),
            good.replace("srtt_us 101234", "srtt_us 99999999999999999999"),
            good.replace("srtt_us 101234", "srtt_us 3600000000"),
            good.replace("btl_bw_bps 95123456", "btl_bw_bps 18446744073709551615"),
            good.replace("min_rtt_us 100012\n", ""),
            good.replace("saved_at 1000000\n", ""),
            good.clone() + "srtt_us 5\n",
            good.clone() + "cwnd 5\n",
            good.clone() + &"#".repeat(2000),
        ];
        for bad in cases {
            fs::write(&path, &bad).unwrap();
            let got = cache.load(&dest(), t(1_000_000));
            assert!(got.is_err(), "accepted {bad:?}: {got:?}");
        }
        fs::remove_dir_all(cache.dir()).unwrap();
    }

    /// Each fault of an entry is its own variant, and the warning names
    /// the file and the fault in words.
    #[test]
    fn each_fault_of_an_entry_is_named() {
        let good = format(1_000_000, &memory());
        for (text, why, message) in [
            (
                "garbage".to_string(),
                EntryError::NoMagic,
                "does not start with `atou-path-memory 1`",
            ),
            (
                good.clone() + "oops\n",
                EntryError::NotNameValue("oops".into()),
                "`oops` is not `name value`",
            ),
            (
                good.clone() + "cwnd 5\n",
                EntryError::UnknownField("cwnd".into()),
                "unknown field `cwnd`",
            ),
            (
                good.replace("srtt_us 101234", "srtt_us -5"),
                EntryError::NotAWholeNumber("srtt_us"),
                "`srtt_us` is not a whole number",
            ),
            (
                good.clone() + "srtt_us 5\n",
                EntryError::Twice("srtt_us"),
                "`srtt_us` twice",
            ),
            (
                good.replace("saved_at 1000000\n", ""),
                EntryError::Missing("saved_at"),
                "no `saved_at`",
            ),
            (
                good.replace("srtt_us 101234", "srtt_us 0"),
                EntryError::Implausible,
                "a value no path has",
            ),
        ] {
            assert_eq!(parse(&text), Err(why.clone()), "{text:?}");
            assert_eq!(why.to_string(), message);
        }

        let cache = scratch("faults");
        cache.save(&dest(), &memory(), t(1_000_000)).unwrap();
        let path = cache.path_of(&dest());
        fs::write(&path, "garbage").unwrap();
        let e = cache.load(&dest(), t(1_000_000)).unwrap_err();
        assert!(
            matches!(&e, PathCacheError::Malformed { path: p, why: EntryError::NoMagic } if *p == path),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "{}: does not start with `atou-path-memory 1`",
                path.display()
            )
        );
        fs::write(&path, "#".repeat(2000)).unwrap();
        let e = cache.load(&dest(), t(1_000_000)).unwrap_err();
        assert!(
            matches!(&e, PathCacheError::TooLong(p) if *p == path),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!("{}: longer than 1024 bytes", path.display())
        );
        fs::remove_dir_all(cache.dir()).unwrap();
    }

    /// What another local user, or a race, can leave in the cache: a FIFO
    /// where an entry goes (a plain open would block the transfer on it),
    /// a symlink to a file elsewhere, a symlink where the temporary file
    /// goes (a plain create would write through it), a directory others
    /// may write to. None blocks, none is read or written through, and the
    /// load says why.
    #[test]
    fn fifos_symlinks_and_a_shared_directory_are_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let c = scratch("hostile-fs");
        c.save(&dest(), &memory(), t(1_000_000)).unwrap();
        let entry = c.path_of(&dest());

        fs::remove_file(&entry).unwrap();
        let made = std::process::Command::new("mkfifo").arg(&entry).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo");
        let why = c.load(&dest(), t(1_000_010)).unwrap_err().to_string();
        assert!(why.contains("not a regular file"), "{why}");
        fs::remove_file(&entry).unwrap();

        let elsewhere = c.dir().with_extension("elsewhere");
        fs::write(&elsewhere, format(1_000_000, &memory())).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        assert!(
            c.load(&dest(), t(1_000_010)).is_err(),
            "read through a symlink"
        );
        fs::remove_file(&entry).unwrap();

        let tmp = c.dir().join(format!(
            ".{}.tmp.{}",
            dest().file_name(),
            std::process::id()
        ));
        std::os::unix::fs::symlink(&elsewhere, &tmp).unwrap();
        c.save(&dest(), &memory(), t(1_000_020)).unwrap();
        assert_eq!(
            fs::read_to_string(&elsewhere).unwrap(),
            format(1_000_000, &memory()),
            "written through a symlink"
        );
        assert_eq!(c.load(&dest(), t(1_000_030)).unwrap(), Some(memory()));

        fs::set_permissions(c.dir(), fs::Permissions::from_mode(0o777)).unwrap();
        let why = c.load(&dest(), t(1_000_030)).unwrap_err().to_string();
        assert!(why.contains("others may write"), "{why}");
        assert!(c.save(&dest(), &memory(), t(1_000_040)).is_err());
        let _ = fs::remove_dir_all(c.dir());
        let _ = fs::remove_file(&elsewhere);
    }
}
