//! Per-host defaults: `~/.config/atou/config` and `/etc/atou/config`,
//! `Host PATTERN` blocks as in ssh_config(5), each line a transfer or
//! tuning flag by its long name (`streams 8`, `cc bbr`, `remote-atou
//! /opt/atou/bin/atou`).
//!
//! ssh_config's rules: the files are read in that order, the first value
//! found for a flag wins (so the user's file wins over the system's, and
//! within a file the first matching block wins), lines before the first
//! `Host` apply to every host, and a pattern list matches when one of its
//! patterns does and none of its `!`-negated ones does. The command line
//! wins over both files: a flag the user typed is never taken from them.
//!
//! The settings become command-line flags placed right after the
//! subcommand's name, before the user's own arguments, so clap checks
//! every value exactly as it checks a typed one.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{ArgAction, ArgMatches, Command};

use super::UsageError;

/// The subcommands that read per-host defaults, and the argument that
/// names their host.
const COMMANDS: &[&str] = &["send", "copy", "probe"];

/// Flags a per-host file may not set: they are about this one command.
const NOT_PER_HOST: &[&str] = &["help", "version", "show-config", "dry-run"];

/// One `KEY VALUE` line that applies to a host.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Setting {
    /// The flag's long name (`_` written as `-`).
    pub key: String,
    pub value: String,
    pub file: PathBuf,
    pub line: usize,
    /// The `Host` line's patterns it sits under; `None` before any.
    pub block: Option<String>,
}

impl fmt::Display for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let under = match &self.block {
            Some(patterns) => format!("Host {patterns}"),
            None => "every host".to_string(),
        };
        write!(
            f,
            "{} {}\t# {}:{} ({under})",
            self.key,
            self.value,
            self.file.display(),
            self.line
        )
    }
}

/// The files read, the user's first: `$XDG_CONFIG_HOME/atou/config` (or
/// `~/.config/atou/config`), then `/etc/atou/config`.
pub(crate) fn default_files() -> Vec<PathBuf> {
    let user = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    let mut files: Vec<PathBuf> = user.map(|d| d.join("atou/config")).into_iter().collect();
    files.push(PathBuf::from("/etc/atou/config"));
    files
}

/// The settings that apply to `host` from `files` (missing files skipped),
/// the first value of each key only.
pub(crate) fn settings_for(files: &[PathBuf], host: &str) -> Result<Vec<Setting>> {
    let keys = per_host_keys();
    let mut found: Vec<Setting> = Vec::new();
    for file in files {
        let Some(text) = read_owned(file)? else {
            continue;
        };
        for setting in parse(&text, file, host, &keys)? {
            if !found.iter().any(|s| s.key == setting.key) {
                found.push(setting);
            }
        }
    }
    Ok(found)
}

/// The most a per-host file may hold: far more than any set of flags.
const MAX_FILE: u64 = 1 << 20;

/// `file`'s text, `None` if there is none; refused, as ssh refuses its
/// config, if another user could have changed it (sshd's `StrictModes`):
/// its lines choose the flags atou runs with, `--ssh`'s command among
/// them.
fn read_owned(file: &Path) -> Result<Option<String>, UsageError> {
    use std::io::Read;
    let cannot = |e: &dyn fmt::Display| UsageError(format!("cannot read {}: {e}", file.display()));
    let opened = match std::fs::File::open(file) {
        Ok(opened) => opened,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(cannot(&e)),
    };
    let meta = opened.metadata().map_err(|e| cannot(&e))?;
    let problem = crate::config::keys::strict_problem(file, &meta).map_err(|e| cannot(&e))?;
    if let Some((problem, fix)) = problem {
        return Err(UsageError(format!(
            "{}: {problem}, so another user could choose the flags atou runs with \
             (the ssh command among them); {fix}",
            file.display()
        )));
    }
    let mut text = String::new();
    opened
        .take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| cannot(&e))?;
    if text.len() as u64 > MAX_FILE {
        return Err(UsageError(format!(
            "{} is over {MAX_FILE} bytes, too large for per-host settings",
            file.display()
        )));
    }
    Ok(Some(text))
}

/// The long names a per-host line may set: every flag of a per-host
/// command but those about one command line.
fn per_host_keys() -> Vec<String> {
    let root = <super::Cli as clap::CommandFactory>::command();
    let mut keys: Vec<String> = COMMANDS
        .iter()
        .filter_map(|c| root.find_subcommand(c))
        .flat_map(|sub| sub.get_arguments().filter_map(|a| a.get_long()))
        .filter(|long| !NOT_PER_HOST.contains(long))
        .map(str::to_string)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// The lines of one file that apply to `host`, in order. Every line's key
/// is checked, in blocks for other hosts too (as ssh checks its config's
/// every option): a typo is found the first time the file is read, not
/// the first time its host is used.
fn parse(text: &str, file: &Path, host: &str, keys: &[String]) -> Result<Vec<Setting>, UsageError> {
    let at = |line: usize, why: String| UsageError(format!("{}:{line}: {why}", file.display()));
    let mut settings = Vec::new();
    let mut block: Option<String> = None;
    let mut applies = true;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) =
            split_line(line).ok_or_else(|| at(i + 1, format!("`{line}` is not KEY VALUE")))?;
        if key.eq_ignore_ascii_case("host") {
            applies = host_matches(value, host);
            block = Some(value.to_string());
            continue;
        }
        if key.eq_ignore_ascii_case("match") || key.eq_ignore_ascii_case("include") {
            return Err(at(
                i + 1,
                format!("`{key}` is ssh's; atou takes Host blocks only"),
            ));
        }
        let key = key.to_ascii_lowercase().replace('_', "-");
        if NOT_PER_HOST.contains(&key.as_str()) {
            return Err(at(i + 1, format!("`{key}` is not a per-host setting")));
        }
        if keys.binary_search(&key).is_err() {
            return Err(at(
                i + 1,
                format!("`{key}` is no flag of atou send, copy or probe"),
            ));
        }
        if applies {
            settings.push(Setting {
                key,
                value: unquote(value).to_string(),
                file: file.to_path_buf(),
                line: i + 1,
                block: block.clone(),
            });
        }
    }
    Ok(settings)
}

/// `KEY VALUE` or `KEY=VALUE`, as ssh_config.
fn split_line(line: &str) -> Option<(&str, &str)> {
    let end = line.find(|c: char| c.is_whitespace() || c == '=')?;
    let (key, rest) = line.split_at(end);
    let rest = rest.trim_start();
    let value = rest.strip_prefix('=').unwrap_or(rest).trim();
    (!key.is_empty() && !value.is_empty()).then_some((key, value))
}

fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

/// ssh_config's pattern list: a match of any pattern, and of no negated
/// one.
fn host_matches(patterns: &str, host: &str) -> bool {
    let mut any = false;
    for pattern in patterns.split_whitespace() {
        match pattern.strip_prefix('!') {
            Some(negated) if glob(negated, host) => return false,
            Some(_) => {}
            None => any |= glob(pattern, host),
        }
    }
    any
}

/// `*` (any run, empty too) and `?` (one character), case-insensitive as
/// host names are.
fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_ascii_lowercase().chars().collect();
    let t: Vec<char> = text.to_ascii_lowercase().chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The host a command's arguments name: `atou send`'s and `atou probe`'s
/// HOST, `atou copy`'s remote [USER@]HOST (none for a local copy).
fn host_of(command: &str, matches: &ArgMatches) -> Option<String> {
    match command {
        "send" => one(matches, "dest").map(|d| host_part(&d)),
        "probe" => one(matches, "host").map(|d| host_part(&d)),
        "copy" => {
            let dest = one(matches, "dest");
            let sources = matches
                .try_get_many::<PathBuf>("sources")
                .ok()
                .flatten()
                .into_iter()
                .flatten()
                .map(|p| p.to_string_lossy().into_owned());
            dest.into_iter()
                .chain(sources)
                .find(|s| super::transfer::is_remote(s))
                .and_then(|s| crate::transfer::bootstrap::split_ssh_target(&s).ok())
                .map(|(target, _)| match target.rsplit_once('@') {
                    Some((_, host)) => host.to_string(),
                    None => target,
                })
        }
        _ => None,
    }
}

fn one(matches: &ArgMatches, id: &str) -> Option<String> {
    matches.try_get_one::<String>(id).ok().flatten().cloned()
}

/// `HOST`, `HOST:PORT[:SUBDIR]` or `[ADDR]:PORT` without its port.
fn host_part(spec: &str) -> String {
    match spec.strip_prefix('[') {
        Some(inner) => inner.split(']').next().unwrap_or(inner).to_string(),
        None => spec.split(':').next().unwrap_or(spec).to_string(),
    }
}

/// What `main` does with the command line once the files are read.
pub(crate) enum Prepared {
    /// Parse these arguments: the user's, with the per-host settings that
    /// apply put in (listed, to name one that clap refuses).
    Args(Vec<OsString>, Vec<Setting>),
    /// `--show-config HOST`: print this and stop.
    Show(String),
}

/// Puts the per-host settings from `files` that apply to the command's
/// host into `argv`, unless the user gave the flag; `--show-config HOST`
/// lists them instead. Arguments clap cannot parse are returned as they
/// are, for clap to report.
pub(crate) fn prepare(
    command: Command,
    argv: Vec<OsString>,
    files: &[PathBuf],
) -> Result<Prepared> {
    let Ok(matches) = command.clone().try_get_matches_from(&argv) else {
        return Ok(Prepared::Args(argv, Vec::new()));
    };
    let Some((name, sub)) = matches.subcommand() else {
        return Ok(Prepared::Args(argv, Vec::new()));
    };
    if !COMMANDS.contains(&name) {
        return Ok(Prepared::Args(argv, Vec::new()));
    }
    let sub_command = command
        .find_subcommand(name)
        .expect("the subcommand clap matched")
        .clone();
    if let Some(host) = sub.try_get_one::<String>("show_config").ok().flatten() {
        let settings = settings_for(files, host)?;
        return Ok(Prepared::Show(show(&sub_command, host, files, &settings)));
    }
    let Some(host) = host_of(name, sub) else {
        return Ok(Prepared::Args(argv, Vec::new()));
    };
    let settings = settings_for(files, &host)?;
    let (flags, used) = flags_for(&sub_command, sub, &settings)?;
    if flags.is_empty() {
        return Ok(Prepared::Args(argv, Vec::new()));
    }
    // Right after the subcommand's name: before any `--` or positional.
    let at = argv
        .iter()
        .position(|a| a == name)
        .map_or(argv.len(), |i| i + 1);
    let mut out = argv[..at].to_vec();
    out.extend(flags.into_iter().map(OsString::from));
    out.extend_from_slice(&argv[at..]);
    Ok(Prepared::Args(out, used))
}

fn setting_error(s: &Setting, why: &str) -> UsageError {
    UsageError(format!(
        "{}:{}: `{}` {why}",
        s.file.display(),
        s.line,
        s.key
    ))
}

fn find_long<'a>(command: &'a Command, key: &str) -> Option<&'a clap::Arg> {
    command.get_arguments().find(|a| a.get_long() == Some(key))
}

/// The flags to add, one per setting this command takes and the user did
/// not type, and those settings.
fn flags_for(
    command: &Command,
    matches: &ArgMatches,
    settings: &[Setting],
) -> Result<(Vec<String>, Vec<Setting>), UsageError> {
    let mut flags = Vec::new();
    let mut used = Vec::new();
    for s in settings {
        // A flag of another command (`remote-atou` for send) is for that
        // command.
        let Some(arg) = find_long(command, &s.key) else {
            continue;
        };
        let typed = matches.value_source(arg.get_id().as_str())
            == Some(clap::parser::ValueSource::CommandLine);
        if typed {
            continue;
        }
        match arg.get_action() {
            ArgAction::SetTrue | ArgAction::Count => match yes_no(&s.value) {
                Some(true) => flags.push(format!("--{}", s.key)),
                Some(false) => {}
                None => return Err(setting_error(s, "takes yes or no")),
            },
            _ => flags.push(format!("--{}={}", s.key, s.value)),
        }
        used.push(s.clone());
    }
    Ok((flags, used))
}

/// Where a flag that clap refused came from, if a per-host file set it:
/// ` (set by FILE:LINE)`.
pub(crate) fn blame(error: &str, used: &[Setting]) -> String {
    used.iter()
        .find(|s| {
            error.contains(&format!("'--{} ", s.key)) || error.contains(&format!("'--{}'", s.key))
        })
        .map(|s| format!(" (set by {}:{})", s.file.display(), s.line))
        .unwrap_or_default()
}

fn yes_no(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "yes" | "true" | "on" => Some(true),
        "no" | "false" | "off" => Some(false),
        _ => None,
    }
}

/// `--show-config HOST`'s listing; a setting this command takes no flag
/// for (`remote-atou` for `atou send`) is listed as not used by it.
fn show(command: &Command, host: &str, files: &[PathBuf], settings: &[Setting]) -> String {
    let read: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let mut text = format!(
        "# per-host settings for {host}, from {}\n",
        read.join(", then ")
    );
    if settings.is_empty() {
        text += "# none apply\n";
    }
    for s in settings {
        match find_long(command, &s.key) {
            Some(_) => text += &format!("{s}\n"),
            None => text += &format!("{s}; not a flag of atou {}: unused\n", command.get_name()),
        }
    }
    text += "# flags typed on the command line win over these\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn root() -> Command {
        <super::super::Cli as clap::CommandFactory>::command()
    }

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn prepared(files: &[PathBuf], words: &[&str]) -> Vec<String> {
        match prepare(root(), argv(words), files).unwrap() {
            Prepared::Args(a, _) => a.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
            Prepared::Show(text) => panic!("listing: {text}"),
        }
    }

    #[test]
    fn patterns_match_as_in_ssh_config() {
        assert!(host_matches("dtn*", "dtn1.example.org"));
        assert!(host_matches(
            "*.example.org !gw.example.org",
            "dtn1.example.org"
        ));
        assert!(!host_matches(
            "*.example.org !gw.example.org",
            "gw.example.org"
        ));
        assert!(
            !host_matches("!gw", "other"),
            "negation alone matches nothing"
        );
        assert!(host_matches("a?c", "ABC"));
        assert!(!host_matches("a?c", "abbc"));
        assert!(host_matches("*", ""));
    }

    #[test]
    fn the_first_value_wins_the_users_file_over_the_systems() {
        let dir = tempfile::tempdir().unwrap();
        let user = write(
            dir.path(),
            "user",
            "# mine\nHost dtn*\n  streams 8\n  cc=cubic\nHost *\n  streams 2\n",
        );
        let system = write(dir.path(), "system", "streams 4\nbuffer 1G\ncc aimd\n");
        let got = settings_for(&[user.clone(), system.clone()], "dtn1").unwrap();
        let pairs: Vec<_> = got
            .iter()
            .map(|s| (s.key.as_str(), s.value.as_str()))
            .collect();
        assert_eq!(pairs, [("streams", "8"), ("cc", "cubic"), ("buffer", "1G")]);
        assert_eq!((got[0].file.clone(), got[0].line), (user.clone(), 3));
        assert_eq!(got[2].file, system);
        let other = settings_for(&[user, system], "login1").unwrap();
        assert_eq!(other[0].value, "2", "Host * is the first block for it");
    }

    #[test]
    fn settings_become_flags_the_user_did_not_type() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(
            dir.path(),
            "config",
            "Host dtn1\nstreams 8\ncc cubic\nskip-existing yes\nfsync no\nremote-atou /opt/atou\n",
        );
        let files = [file];
        let got = prepared(
            &files,
            &["atou", "send", "--streams", "2", "a", "dtn1:7890"],
        );
        assert_eq!(
            got,
            [
                "atou",
                "send",
                "--cc=cubic",
                "--skip-existing",
                "--streams",
                "2",
                "a",
                "dtn1:7890"
            ],
            "--streams typed wins; fsync no adds nothing; remote-atou is copy's"
        );
        let pushed = prepared(&files, &["atou", "copy", "a", "me@dtn1:in"]);
        assert!(
            pushed.contains(&"--remote-atou=/opt/atou".to_string()),
            "{pushed:?}"
        );
        let other = prepared(&files, &["atou", "send", "a", "dtn2"]);
        assert_eq!(other, ["atou", "send", "a", "dtn2"]);
        let local = prepared(&files, &["atou", "copy", "a", "dtn1"]);
        assert_eq!(
            local,
            ["atou", "copy", "a", "dtn1"],
            "a local copy has no host"
        );
    }

    #[test]
    fn a_value_clap_refuses_is_blamed_on_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", "Host h\n\nstreams 80\n");
        let Prepared::Args(args, used) = prepare(
            root(),
            argv(&["atou", "send", "a", "h"]),
            std::slice::from_ref(&file),
        )
        .unwrap() else {
            panic!("a listing")
        };
        let error = root().try_get_matches_from(args).unwrap_err().to_string();
        assert_eq!(
            blame(&error, &used),
            format!(" (set by {}:3)", file.display())
        );
        assert_eq!(blame("invalid value for '--buffer <SIZE>'", &used), "");
    }

    #[test]
    fn a_bad_line_names_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let unknown = write(dir.path(), "unknown", "Host *\n\nstreamz 8\n");
        let err = prepare(
            root(),
            argv(&["atou", "send", "a", "h"]),
            std::slice::from_ref(&unknown),
        )
        .err()
        .unwrap()
        .to_string();
        assert_eq!(
            err,
            format!(
                "{}:3: `streamz` is no flag of atou send, copy or probe",
                unknown.display()
            )
        );
        // As ssh: a typo under another host's block is found too.
        let elsewhere = write(dir.path(), "elsewhere", "Host other\nstreamz 8\n");
        let err = settings_for(std::slice::from_ref(&elsewhere), "h")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!(
                "{}:2: `streamz` is no flag of atou send, copy or probe",
                elsewhere.display()
            )
        );
        let bare = write(dir.path(), "bare", "streams\n");
        let err = settings_for(&[bare], "h").unwrap_err().to_string();
        assert!(err.ends_with(":1: `streams` is not KEY VALUE"), "{err}");
        let flag = write(dir.path(), "flag", "overwrite maybe\n");
        let err = prepare(root(), argv(&["atou", "send", "a", "h"]), &[flag])
            .err()
            .unwrap()
            .to_string();
        assert!(err.ends_with(":1: `overwrite` takes yes or no"), "{err}");
    }

    /// ssh's rule for its config: a file another user can write is
    /// refused, since its lines become the flags (and the ssh command)
    /// atou runs with.
    #[test]
    fn a_file_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", "Host *\nssh evil\n");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = settings_for(std::slice::from_ref(&file), "h")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("group or others may write to it (mode 666)"),
            "{err}"
        );
        assert!(err.contains("run `chmod go-w"), "{err}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(settings_for(&[file], "h").unwrap()[0].value, "evil");
        let open_dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(open_dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let in_open_dir = write(open_dir.path(), "config", "streams 2\n");
        let err = settings_for(&[in_open_dir], "h").unwrap_err().to_string();
        assert!(err.contains("may write to its directory"), "{err}");
    }

    #[test]
    fn show_config_lists_what_applies_and_from_where() {
        let dir = tempfile::tempdir().unwrap();
        let file = write(dir.path(), "config", "buffer 1G\nHost dtn*\nstreams 8\n");
        let Prepared::Show(text) = prepare(
            root(),
            argv(&["atou", "copy", "--show-config", "dtn3"]),
            std::slice::from_ref(&file),
        )
        .unwrap() else {
            panic!("not a listing")
        };
        let shown = file.display();
        assert!(
            text.contains(&format!("buffer 1G\t# {shown}:1 (every host)")),
            "{text}"
        );
        assert!(
            text.contains(&format!("streams 8\t# {shown}:3 (Host dtn*)")),
            "{text}"
        );
        let file = write(dir.path(), "remote", "remote-atou /opt/atou\n");
        let listing = |command: &str| match prepare(
            root(),
            argv(&["atou", command, "--show-config", "dtn3"]),
            std::slice::from_ref(&file),
        )
        .unwrap()
        {
            Prepared::Show(text) => text,
            Prepared::Args(..) => panic!("not a listing"),
        };
        let shown = file.display();
        assert!(
            listing("send").contains(&format!(
                "remote-atou /opt/atou\t# {shown}:1 (every host); not a flag of atou send: unused"
            )),
            "{}",
            listing("send")
        );
        assert!(!listing("copy").contains("unused"), "{}", listing("copy"));
    }
}
