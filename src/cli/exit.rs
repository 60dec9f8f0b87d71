//! Exit statuses, in one place: each one's number, the word `--json`
//! reports carry, and what it means to a script.
//!
//! rsync's numbers where the meaning matches (5 a refusal at the start,
//! 10 socket I/O, 11 file I/O, 12 protocol, 23 partial transfer, 30 a
//! timeout in data send/receive), so that scripts written for rsync read
//! them right; 0, 1, 2 and 130 as before.

use std::process::ExitCode;

use crate::transfer::send::Fault;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok,
    Failed,
    Usage,
    Refused,
    Network,
    Io,
    Protocol,
    Verify,
    Partial,
    Timeout,
    Interrupted,
}

impl Exit {
    /// Every status, in the order of their numbers (the help's table).
    pub const ALL: [Exit; 11] = [
        Exit::Ok,
        Exit::Failed,
        Exit::Usage,
        Exit::Refused,
        Exit::Network,
        Exit::Io,
        Exit::Protocol,
        Exit::Verify,
        Exit::Partial,
        Exit::Timeout,
        Exit::Interrupted,
    ];

    pub fn code(self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::Failed => 1,
            Exit::Usage => 2,
            Exit::Refused => 5,
            Exit::Network => 10,
            Exit::Io => 11,
            Exit::Protocol => 12,
            // rsync has no number for this (it retries, then says 23);
            // 16 is free in rsync's list.
            Exit::Verify => 16,
            Exit::Partial => 23,
            Exit::Timeout => 30,
            Exit::Interrupted => 130,
        }
    }

    /// The reason as one word: `"status"` in `--json` reports.
    pub fn word(self) -> &'static str {
        match self {
            Exit::Ok => "ok",
            Exit::Failed => "failed",
            Exit::Usage => "usage",
            Exit::Refused => "refused",
            Exit::Network => "network",
            Exit::Io => "io",
            Exit::Protocol => "protocol",
            Exit::Verify => "verify",
            Exit::Partial => "partial",
            Exit::Timeout => "timeout",
            Exit::Interrupted => "interrupted",
        }
    }

    /// What happened and what to do, short enough for one line of
    /// `--help` (the README says more).
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Ok => "every file sent and verified",
            Exit::Failed => "failed otherwise (the reason is on stderr)",
            Exit::Usage => "usage error: fix the command",
            Exit::Refused => "refused by the receiver (a file in the way, policy, keys)",
            Exit::Network => "no server, unreachable, path failed, still busy: retry later",
            Exit::Io => "a local file could not be read (or changed while sent)",
            Exit::Protocol => "the two ends do not understand each other (releases)",
            Exit::Verify => "what arrived is not what was sent (BLAKE3)",
            Exit::Partial => "the receiver failed partway; run again to resume",
            Exit::Timeout => "the peer went silent (--maxidle) mid-transfer: retry",
            Exit::Interrupted => "interrupted (Ctrl-C); run again to resume",
        }
    }

    /// The help's table of exit statuses, one line each.
    pub fn table() -> String {
        let mut s = String::from("Exit status:\n");
        for e in Exit::ALL {
            s += &format!("  {:>3} {:<11} {}\n", e.code(), e.word(), e.meaning());
        }
        s
    }
}

impl From<Fault> for Exit {
    fn from(f: Fault) -> Exit {
        match f {
            Fault::Refused => Exit::Refused,
            Fault::Network => Exit::Network,
            Fault::Timeout => Exit::Timeout,
            Fault::Protocol => Exit::Protocol,
            Fault::Verify => Exit::Verify,
            Fault::Partial => Exit::Partial,
            Fault::Io => Exit::Io,
            Fault::Interrupted => Exit::Interrupted,
            Fault::Other => Exit::Failed,
        }
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}

/// An error that knows its exit status, for failures found in the CLI
/// itself (no typed error below says what they are).
#[derive(Debug, thiserror::Error)]
#[error("{1}")]
pub(super) struct Failure(pub Exit, pub String);

/// The status of an error that reached `main`: typed errors by their
/// kind, a usage error as 2, anything else 1.
pub(super) fn of_error(e: &anyhow::Error) -> Exit {
    if e.downcast_ref::<super::UsageError>().is_some() {
        return Exit::Usage;
    }
    if let Some(Failure(status, _)) = e.downcast_ref::<Failure>() {
        return *status;
    }
    if let Some(e) = e.downcast_ref::<crate::transfer::send::SendError>() {
        return e.fault().into();
    }
    if let Some(e) = e.downcast_ref::<crate::io::ProbeError>() {
        return crate::transfer::send::probe_fault(e).into();
    }
    if let Some(e) = e.downcast_ref::<crate::transfer::Error>() {
        return e.fault().into();
    }
    Exit::Failed
}

/// A `--json` report with its status word and number added.
pub(super) fn json_report<T: serde::Serialize>(
    report: &T,
    status: Exit,
) -> anyhow::Result<serde_json::Value> {
    let mut v = serde_json::to_value(report)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("status".into(), status.word().into());
        m.insert("exit".into(), status.code().into());
    }
    Ok(v)
}

/// The `--json` report of a transfer that failed: the status word and
/// number, the other end, and the reason stderr gives.
pub(super) fn json_failure(status: Exit, host: &str, why: &str) -> serde_json::Value {
    serde_json::json!({
        "status": status.word(),
        "exit": status.code(),
        "host": host,
        "error": why,
    })
}

/// A report as `--json` prints it: pretty, or on one line where stdout
/// is JSON Lines (`--progress json`).
pub(super) fn json_text(v: &serde_json::Value, one_line: bool) -> String {
    if one_line {
        format!("{v}\n")
    } else {
        serde_json::to_string_pretty(v).expect("a JSON value prints") + "\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_words_are_distinct_and_fit_a_shell() {
        let mut codes: Vec<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        let mut words: Vec<&str> = Exit::ALL.iter().map(|e| e.word()).collect();
        // ALL is in the order of the numbers: the help's table reads down.
        assert!(codes.windows(2).all(|w| w[0] < w[1]), "{codes:?}");
        codes.dedup();
        words.sort_unstable();
        words.dedup();
        assert_eq!(codes.len(), Exit::ALL.len());
        assert_eq!(words.len(), Exit::ALL.len());
        // The shell reports a death by signal N as 128+N: a failure must
        // not look like one, except our own 130 for Ctrl-C.
        assert!(codes.iter().all(|&c| c < 128 || c == 130));
    }

    mod transfer_errors {
        use super::*;
        use crate::transfer::manifest::NameError;
        use crate::transfer::messages::MessageError;
        use crate::transfer::send::SendError;
        use crate::transfer::{Change, Error};
        use std::path::PathBuf;

        fn path() -> PathBuf {
            PathBuf::from("d/f")
        }

        fn io() -> std::io::Error {
            std::io::ErrorKind::PermissionDenied.into()
        }

        fn refused(why: &str) -> Error {
            Error::Refused { why: why.into() }
        }

        /// Each error reaches `main` as itself (a receiver's DEST, a
        /// far end's) or inside a `SendError` (a file read while
        /// comparing chunks): both give its status.
        #[track_caller]
        fn assert_status(cases: Vec<Error>, want: Exit) {
            for e in cases {
                let shown = e.to_string();
                assert_eq!(of_error(&anyhow::Error::from(e)), want, "{shown}");
            }
        }

        #[test]
        fn a_local_file_that_cannot_be_read_or_written_is_io() {
            let changes = [
                Change::Symlinked,
                Change::Removed,
                Change::Replaced,
                Change::NotAFile,
                Change::Modified,
                Change::Shrank { listed: 9 },
            ];
            let mut cases: Vec<Error> = changes
                .into_iter()
                .map(|change| Error::Changed {
                    path: path(),
                    change,
                })
                .collect();
            cases.push(Error::Unreadable {
                action: "read",
                path: path(),
                source: io(),
            });
            cases.push(Error::disk("create directory", &path(), io()));
            assert_status(cases, Exit::Io);
            let inside = SendError::Read(Error::Changed {
                path: path(),
                change: Change::Modified,
            });
            assert_eq!(of_error(&inside.into()), Exit::Io);
        }

        #[test]
        fn what_the_destination_or_its_policy_will_not_take_is_refused() {
            let cases = vec![
                Error::DestNotDir { path: path() },
                Error::InTheWay {
                    path: path(),
                    what: "a directory",
                },
                Error::SubdirInTheWay { path: path() },
                Error::SymlinkInTheWay { path: path() },
                Error::StagedInTheWay { entry: "f".into() },
                Error::Reserved { entry: None },
                Error::UnaskedSubdir {
                    subdir: "sub".into(),
                },
                Error::UnaskedEntry {
                    entry: "f".into(),
                    asked: "g".into(),
                },
                refused("1 entry already exists"),
                Error::KeyNotAuthorized,
                Error::OverBudget {
                    why: "over --max-files".into(),
                },
                Error::KeySubdir(NameError::Empty),
            ];
            assert_status(cases, Exit::Refused);
            let inside = SendError::Read(refused("no"));
            assert_eq!(of_error(&inside.into()), Exit::Refused);
        }

        #[test]
        fn what_the_other_end_says_that_does_not_read_is_protocol() {
            let cases = vec![
                Error::MalformedPlan(MessageError::Truncated),
                Error::NotAPlan,
                Error::Bootstrap("not a bootstrap line".into()),
            ];
            assert_status(cases, Exit::Protocol);
        }

        #[test]
        fn a_host_that_cannot_start_a_receiver_is_a_plain_failure() {
            let cases = vec![Error::System("cannot start a receiver thread".into())];
            assert_status(cases, Exit::Failed);
        }
    }

    #[test]
    fn the_table_lists_every_status() {
        let t = Exit::table();
        for e in Exit::ALL {
            let line = format!("{:>3} {:<11} ", e.code(), e.word());
            assert!(t.contains(&line), "{line:?} missing from\n{t}");
        }
        // One line each on an 80-column terminal: clap would wrap a longer
        // one without its indent.
        assert!(t.lines().all(|l| l.len() <= 80), "{t}");
    }
}
