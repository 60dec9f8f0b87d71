//! Why a transfer's step failed, by what failed in the user's terms: a
//! file being sent, the receiver's disk, its policy or budgets, what the
//! peer sent, the ssh bootstrap, this host. Each variant carries what its
//! message needs (paths are shown escaped: a tree or a peer may be
//! hostile), and [`Error::fault`] says which kind of failure it is, the
//! one classification the CLI turns into an exit status.

use std::io;
use std::path::{Path, PathBuf};

use super::manifest::NameError;
use super::messages::MessageError;
use super::send::Fault;
use crate::io::dest_dir::STAGING_DIR;
use crate::util::text::shown_path;

/// What failed in a transfer, in the user's terms; [`Error::fault`] is its
/// kind.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file being sent could not be opened or read here.
    #[error("cannot {action} {}: {}", shown_path(.path), crate::util::text::io_error(.source))]
    Unreadable {
        /// "open" or "read".
        action: &'static str,
        /// The file, as the command line's source names it.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// A file being sent is not what the walk listed any more.
    #[error("{} {change}", shown_path(.path))]
    Changed {
        /// The file, as the command line's source names it.
        path: PathBuf,
        /// How it differs.
        change: Change,
    },
    /// DEST, or an entry beneath it, could not be used as the transfer
    /// needs: the receiver's disk, its permissions, its space.
    #[error("cannot {action} {}: {}", shown_path(.path), disk_cause(.source))]
    Disk {
        /// What was being done, as a verb phrase: "create directory".
        action: &'static str,
        /// The entry: DEST joined with its path beneath it.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: io::Error,
    },
    /// DEST itself is not a directory.
    #[error("{} is not a directory", .path.display())]
    DestNotDir {
        /// DEST as given.
        path: PathBuf,
    },
    /// Something at the destination is in the way and is never replaced:
    /// a directory, or what is neither a file nor a directory.
    #[error(
        "{} exists and is {what}; remove it or choose another destination",
        shown_path(.path)
    )]
    InTheWay {
        /// The entry in the way, DEST joined with its path.
        path: PathBuf,
        /// What it is: "a directory", "a socket", ...
        what: &'static str,
    },
    /// A component of the destination subdirectory exists and is not a
    /// directory.
    #[error("{} exists and is not a directory", shown_path(.path))]
    SubdirInTheWay {
        /// The component in the way, DEST joined with its path.
        path: PathBuf,
    },
    /// A symlink where a directory must be walked through.
    #[error(
        "{} is a symlink; atou does not write through symlinks in the destination",
        shown_path(.path)
    )]
    SymlinkInTheWay {
        /// The symlink, DEST joined with its path.
        path: PathBuf,
    },
    /// What holds a file's partial state in the staging directory is not
    /// a regular file.
    #[error("the partial file of `{entry}` in {STAGING_DIR} is not a regular file; remove it")]
    StagedInTheWay {
        /// The manifest entry whose partial file it is, escaped.
        entry: String,
    },
    /// The transfer names the staging directory: the subdirectory asked
    /// for (`None`) or an entry of the manifest.
    #[error("{}", reserved(.entry.as_deref()))]
    Reserved {
        /// The manifest entry that names it, escaped; `None`: the
        /// subdirectory asked for.
        entry: Option<String>,
    },
    /// A pull or a local copy's sender named a subdirectory of DEST.
    #[error(
        "the sender named a subdirectory `{subdir}` of the destination, which was not asked \
         for; refused, nothing written"
    )]
    UnaskedSubdir {
        /// The subdirectory the sender named, escaped.
        subdir: String,
    },
    /// A pull or a local copy's sender sent what was not asked for.
    #[error(
        "the sender sent `{entry}`, which was not asked for (asked for: {asked}); refused, \
         nothing written"
    )]
    UnaskedEntry {
        /// The entry sent, escaped.
        entry: String,
        /// The names the receiver asked for, escaped.
        asked: String,
    },
    /// The receiving side's policy, its key's options or what it asked
    /// for refuse the transfer; `why` says which and what to do.
    #[error("{why}")]
    Refused {
        /// The refusal, as a person reads it.
        why: String,
    },
    /// The key a session's connection authenticated with is not (or no
    /// longer) in the server's authorized keys.
    #[error("its key is not in this server's authorized keys")]
    KeyNotAuthorized,
    /// The transfer is over one of this receiver's budgets: entries,
    /// staged bytes or files, the size of its file system.
    #[error("{why}")]
    OverBudget {
        /// Which budget, by how much, and which flag raises it.
        why: String,
    },
    /// The key's `subdir=` and the plan's subdirectory make no valid path.
    #[error("the key's subdir= with the plan's: {0}")]
    KeySubdir(NameError),
    /// A plan request that does not decode.
    #[error("a malformed plan: {0}")]
    MalformedPlan(MessageError),
    /// Another request where the plan belongs.
    #[error("a request that is not a plan where a plan belongs")]
    NotAPlan,
    /// A line of the ssh bootstrap that does not read as one.
    #[error("{0}")]
    Bootstrap(String),
    /// This host could not start what a receiver needs (its threads).
    #[error("{0}")]
    System(String),
}

/// How a file being sent differs from what the walk listed; each says to
/// run again, which lists it anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It, or a directory above it, is a symlink now (never followed).
    Symlinked,
    /// It is gone.
    Removed,
    /// Another file (another inode) has its name.
    Replaced,
    /// Not a regular file any more.
    NotAFile,
    /// Its size or mtime differs.
    Modified,
    /// It ended before the size listed.
    Shrank {
        /// The size the walk listed, in bytes.
        listed: u64,
    },
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Symlinked => f.write_str(
                "(or a directory above it) was replaced by a symlink after it was listed; \
                 it is not followed: run again",
            ),
            Change::Removed => f.write_str("was removed after it was listed; run again"),
            Change::Replaced => {
                f.write_str("was replaced by another file after it was listed; run again")
            }
            Change::NotAFile => f.write_str("is no longer a regular file; run again"),
            Change::Modified => f.write_str("changed while it was being sent; run again"),
            Change::Shrank { listed } => write!(
                f,
                "changed while it was being sent (it shrank below the {listed} bytes listed); \
                 run again"
            ),
        }
    }
}

fn reserved(entry: Option<&str>) -> String {
    match entry {
        None => format!("{STAGING_DIR} is reserved for atou's partial files"),
        Some(path) => {
            format!("`{path}`: the name {STAGING_DIR} is reserved for atou's partial files")
        }
    }
}

/// The cause of a failure at the destination in words rather than
/// `Os { .. }`, and what the words cannot say of atou's own rules.
fn disk_cause(e: &io::Error) -> String {
    let words = match e.raw_os_error() {
        Some(libc::ENOSPC) => "no space left on the device",
        Some(libc::EDQUOT) => "disk quota exceeded",
        Some(libc::EACCES) | Some(libc::EPERM) => "permission denied",
        Some(libc::EROFS) => "read-only file system",
        Some(libc::ENOENT) => "no such file or directory",
        Some(libc::ELOOP) | Some(libc::EXDEV) => {
            "a symlink is on the way, and atou never writes through symlinks at the destination"
        }
        Some(libc::EEXIST) => "something else is there now",
        _ => return crate::util::text::io_error(e),
    };
    words.to_string()
}

impl Error {
    /// "cannot ACTION PATH: CAUSE" at the destination.
    pub(crate) fn disk(action: &'static str, path: &Path, source: io::Error) -> Error {
        Error::Disk {
            action,
            path: path.to_path_buf(),
            source,
        }
    }

    /// What kind of failure this is (the CLI's exit status).
    pub fn fault(&self) -> Fault {
        match self {
            Error::Unreadable { .. } | Error::Changed { .. } | Error::Disk { .. } => Fault::Io,
            Error::DestNotDir { .. }
            | Error::InTheWay { .. }
            | Error::SubdirInTheWay { .. }
            | Error::SymlinkInTheWay { .. }
            | Error::StagedInTheWay { .. }
            | Error::UnaskedSubdir { .. }
            | Error::UnaskedEntry { .. }
            | Error::Reserved { .. }
            | Error::Refused { .. }
            | Error::OverBudget { .. }
            | Error::KeyNotAuthorized
            | Error::KeySubdir(_) => Fault::Refused,
            Error::MalformedPlan(_) | Error::NotAPlan | Error::Bootstrap(_) => Fault::Protocol,
            Error::System(_) => Fault::Other,
        }
    }
}
