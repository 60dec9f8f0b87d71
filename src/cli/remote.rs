//! `atou copy` with a remote end, over ssh, and the hidden
//! `atou __remote receive|send` that ssh runs at the far end: the flags,
//! and what is printed. The work is `crate::transfer::remote`'s.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Subcommand};

use crate::io::xattr::Wanted;
use crate::transfer::bootstrap::{split_ssh_target, ssh_server_ip, Hello, PortRange};
use crate::transfer::dest::Requested;
use crate::transfer::receive::{check_root, TransferReport};
use crate::transfer::remote::{
    check_target, read_hello, read_hello_line, receive_push, remote_path, tidy, Detoured,
    FarReceiveConfig, FarSend, FarSendTo, FirstContact, Ordered, Pull, PullConfig, PullOutcome,
    Punched, Push, RemoteError, SshCommand, ThirdParty, ThirdPartyOutcome,
};
use crate::transfer::send::Bound;
use crate::transfer::send::Progress;
use crate::transfer::tunnel::{self, ClientSide, ServerSide};
use crate::util::text::{escape, shown_path};
use crate::util::units::{format_rate, format_size, parse_size};

use super::exit::{self, Exit};
use super::transfer::{
    ctrlc_hook, is_remote, readers, run_send_from, OnFailure, ReceivingArgs, TransferArgs,
};
use super::UsageError;

/// A library error as the CLI reports it: its kind picks the exit status.
fn cli_error(e: RemoteError) -> anyhow::Error {
    match e {
        RemoteError::Usage(why) => UsageError(why).into(),
        RemoteError::Network(why) => exit::Failure(Exit::Network, why).into(),
        e => e.into(),
    }
}

/// `atou copy`'s flags for a remote end.
#[derive(Args, Debug, Clone)]
#[command(next_help_heading = "Remote end (a SRC or DEST of the form [USER@]HOST:PATH)")]
pub(super) struct SshArgs {
    /// Command that runs the remote end, split on white space as rsync's -e (e.g. "ssh -p 2222 -i ~/.ssh/lab"); ~/.ssh/config, agents, ProxyJump and known_hosts apply as for ssh itself
    #[arg(long = "ssh", value_name = "CMD", default_value = "ssh")]
    ssh: String,
    /// atou on the remote host: a command looked up in its PATH, or a path there
    #[arg(long, value_name = "PATH", default_value = "atou")]
    remote_atou: String,
    /// UDP ports the remote end binds, LOW-HIGH or one port (one port for a push, one per stream for a pull; both ends of a third-party copy bind in it); 0: any port. Open these in a firewall in front of the remote host
    #[arg(long, value_name = "LOW[-HIGH]", default_value = "0")]
    port: PortRange,
    /// Third-party copy (both SRC and DEST remote): carry the data through this host, over the two ssh connections, instead of from the source host straight to the destination over UDP (as scp -3; for a source that cannot reach the destination). Without it, a copy whose source gets no UDP through to the destination in --maxidle goes this way by itself
    #[arg(long)]
    via_local: bool,
}

/// `atou __remote`: what ssh runs at the far end.
#[derive(Args, Debug)]
pub(super) struct RemoteArgs {
    /// The bootstrap hello: `ATOU-BOOTSTRAP VERSION LOCAL-KEY`, one argument
    #[arg(long, value_name = "LINE", required_unless_present = "hello_stdin")]
    hello: Option<String>,
    /// The hello comes as the first line on stdin instead (a third-party
    /// copy's destination, started while its source logs in)
    #[arg(long, conflicts_with = "hello")]
    hello_stdin: bool,
    #[command(subcommand)]
    role: Role,
}

// Parsed once per process: the size of the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Role {
    /// Receive one transfer into PATH (a push)
    Receive(RemoteReceiveArgs),
    /// Send SRC... (a pull)
    Send(RemoteSendArgs),
    /// Send SRC... where the local end says, once it knows (the source of
    /// a third-party copy)
    SendTo(RemoteSendArgs),
}

/// What the sender of a third-party copy may do at the destination: what
/// the user's flags asked for, no more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SenderMay {
    Overwrite,
    Delete,
    Owners,
    Xattrs,
    Acls,
}

#[derive(Args, Debug)]
struct RemoteReceiveArgs {
    #[arg(long, value_name = "LOW[-HIGH]", default_value = "0")]
    port: PortRange,
    /// The sender's --buffer: the largest window a stream may ask for
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    buffer: u64,
    /// Socket receive buffer, bytes
    #[arg(long, value_name = "BYTES")]
    rcvbuf: u32,
    /// Answer a dry run only, leaving PATH exactly as it is
    #[arg(long)]
    dry_run: bool,
    /// One of several shards sending into PATH at once: leave the staging
    /// directory (and a PATH this run created) for the others, even empty
    #[arg(long)]
    shard: bool,
    /// The sender is another host (a third-party copy), not the local
    /// user's own command: it may do only what --sender-may says, and
    /// send only the roots --requested names
    #[arg(long)]
    third_party: bool,
    /// With --third-party: what the sender may do
    #[arg(long, value_enum, value_delimiter = ',', requires = "third_party")]
    sender_may: Vec<SenderMay>,
    /// With --third-party: a SRC as the local user named it at the source
    #[arg(long, value_name = "PATH", requires = "third_party")]
    requested: Vec<String>,
    /// With --third-party, in place of --requested: the names a
    /// --files-from list starts, NUL-separated, its BYTES first on stdin
    #[arg(long, hide = true, value_name = "BYTES", requires = "third_party")]
    requested_stdin: Option<u64>,
    /// What --requested-stdin's bytes named.
    #[arg(skip)]
    requested_names: Vec<Vec<u8>>,
    /// With --third-party: say nothing when the transfer is in place
    #[arg(long, requires = "third_party")]
    quiet: bool,
    /// Where the files go, relative to the home directory unless absolute
    #[arg(value_name = "PATH")]
    path: String,
    #[command(flatten)]
    receiving: ReceivingArgs,
}

#[derive(Args, Debug)]
struct RemoteSendArgs {
    #[arg(long, value_name = "LOW[-HIGH]", default_value = "0")]
    port: PortRange,
    #[arg(value_name = "SRC", required = true, num_args = 1..)]
    sources: Vec<String>,
    /// --files-from (a pull's, a third-party copy's): the list's BYTES
    /// come first on stdin
    #[arg(long, hide = true, value_name = "BYTES")]
    files_from_stdin: Option<u64>,
    #[command(flatten)]
    transfer: TransferArgs,
}

/// The most a --files-from list (or the names it starts) the local end
/// sends may hold, bytes (some ten million paths): what the far end reads
/// from its stdin before anything else.
const MAX_SENT: u64 = 1 << 30;

/// The `n` bytes the local end announced, read first from stdin; `None`
/// if it went away before they were all in.
fn read_sent(stdin: &std::io::Stdin, n: u64) -> Result<Option<Vec<u8>>> {
    if n > MAX_SENT {
        return Err(UsageError(format!(
            "{n} bytes announced on stdin: more than {MAX_SENT}"
        ))
        .into());
    }
    let mut bytes = Vec::new();
    stdin.take(n).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 == n).then_some(bytes))
}

/// `atou copy` with a remote SRC or DEST.
pub(super) fn copy(
    sources: &[PathBuf],
    dest: &str,
    transfer: &TransferArgs,
    receiving: &ReceivingArgs,
    ssh: &SshArgs,
) -> Result<ExitCode> {
    ssh.command().check().map_err(cli_error)?;
    let flags = CopyFlags {
        transfer,
        receiving,
        ssh,
    };
    let remote: Vec<Option<&str>> = sources
        .iter()
        .map(|s| s.to_str().filter(|s| is_remote(s)))
        .collect();
    let pulls = remote.iter().filter(|r| r.is_some()).count();
    if pulls == 0 {
        if ssh.via_local {
            return Err(UsageError(
                "--via-local is for a third-party copy, where SRC and DEST are both remote".into(),
            )
            .into());
        }
        let (target, path) = split_ssh_target(dest).map_err(cli_error)?;
        check_target(&target).map_err(cli_error)?;
        return push(sources, &target, &path, flags);
    }
    if pulls < sources.len() {
        return Err(UsageError(
            "some SRCs are remote and some local; give local ones in a separate `atou copy` \
             (or as ./NAME if a name has a colon)"
                .into(),
        )
        .into());
    }
    let (target, paths) = one_host(remote.into_iter().flatten())?;
    check_target(&target).map_err(cli_error)?;
    if is_remote(dest) {
        let (dest_target, dest_path) = split_ssh_target(dest).map_err(cli_error)?;
        check_target(&dest_target).map_err(cli_error)?;
        return third_party(&target, &paths, &dest_target, &dest_path, flags);
    }
    if ssh.via_local {
        return Err(UsageError(
            "--via-local is for a third-party copy, where SRC and DEST are both remote".into(),
        )
        .into());
    }
    pull(&target, &paths, dest, flags)
}

/// The host of every remote SRC, which must be one, and their paths.
fn one_host<'a>(remote: impl Iterator<Item = &'a str>) -> Result<(String, Vec<String>)> {
    let mut target = None;
    let mut paths = Vec::new();
    for r in remote {
        let (t, p) = split_ssh_target(r).map_err(cli_error)?;
        match &target {
            Some(first) if *first != t => {
                return Err(UsageError(format!(
                    "every remote SRC must be on one host: `{first}` and `{t}`"
                ))
                .into())
            }
            _ => target = Some(t),
        }
        paths.push(p);
    }
    Ok((target.expect("one remote SRC at least"), paths))
}

impl SshArgs {
    fn command(&self) -> SshCommand {
        SshCommand {
            ssh: self.ssh.clone(),
            remote_atou: self.remote_atou.clone(),
        }
    }
}

/// `__remote receive`'s arguments for a push into `path`.
fn push_args(
    path: &str,
    transfer: &TransferArgs,
    receiving: &ReceivingArgs,
    port: PortRange,
    rcvbuf: u32,
) -> Vec<String> {
    let mut args = vec![
        "receive".to_string(),
        "--port".to_string(),
        port.to_string(),
        "--buffer".to_string(),
        transfer.buffer().to_string(),
        "--rcvbuf".to_string(),
        rcvbuf.to_string(),
    ];
    if transfer.dry_run() {
        // An atou there that predates --dry-run refuses the flag: no
        // receiver that would write starts.
        args.push("--dry-run".to_string());
    }
    if transfer.shard().is_some() {
        // An atou there that predates --shard refuses the flag.
        args.push("--shard".to_string());
    }
    args.extend(receiving.remote_args());
    args.extend(["--".to_string(), path.to_string()]);
    args
}

/// The flags a copy over ssh runs with, whichever way it goes.
#[derive(Clone, Copy)]
struct CopyFlags<'a> {
    transfer: &'a TransferArgs,
    receiving: &'a ReceivingArgs,
    ssh: &'a SshArgs,
}

fn push(sources: &[PathBuf], target: &str, path: &str, flags: CopyFlags<'_>) -> Result<ExitCode> {
    let (transfer, receiving, ssh) = (flags.transfer, flags.receiving, flags.ssh);
    let (tuning, _) = transfer.tuning().resolve()?;
    let args = push_args(path, transfer, receiving, ssh.port, tuning.rcvbuf);
    let (push, auth) = Push::start(&ssh.command(), target, &args).map_err(cli_error)?;
    let shown = format!("{target}:{path}");
    let mut config = transfer.send_config(push.peer, shown, None)?;
    config.auth = Some(auth);
    config.route = Some("udp");
    let progress = Arc::new(Progress::default());
    let first_contact = FirstContact::watch(progress.clone());
    let code = run_send_from(
        sources,
        config,
        transfer,
        None,
        &[],
        progress,
        OnFailure::explain(|e| push.explain(e)).detour(|e| push.detour(e, first_contact.end())),
    )?;
    push.finish(code == ExitCode::SUCCESS).map_err(cli_error)?;
    Ok(code)
}

fn pull(target: &str, paths: &[String], dest: &str, flags: CopyFlags<'_>) -> Result<ExitCode> {
    let (transfer, receiving, ssh) = (flags.transfer, flags.receiving, flags.ssh);
    let (tuning, notes) = transfer.tuning().resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let mut args = vec![
        "send".to_string(),
        "--port".to_string(),
        ssh.port.to_string(),
    ];
    args.extend(transfer.remote_send_args()?);
    let list = transfer.remote_list(paths)?;
    if let Some(list) = &list {
        // Read here, where the user named it; the remote reads it first.
        args.push(format!("--files-from-stdin={}", list.text.len()));
    }
    if transfer.dry_run() {
        // An atou there that predates a pull's --dry-run would send for
        // real: the receiver here, answering dry runs only, refuses that.
        args.push("--dry-run".to_string());
    }
    args.push("--".to_string());
    args.extend(paths.iter().cloned());
    let preamble = list.as_ref().map_or(&[][..], |l| l.text.as_slice());
    let pull = Pull::start(&ssh.command(), target, &args, preamble).map_err(cli_error)?;
    let (host, target) = (pull.host().to_string(), pull.target().to_string());
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let i = interrupted.clone();
        let _ = ctrlc_hook(move || i.store(true, Ordering::Relaxed));
    }
    let config = PullConfig {
        dest: PathBuf::from(dest),
        // This end's rules, from its own flags: the remote only asks.
        policy: receiving.policy(
            transfer.overwrite(),
            transfer.delete(),
            transfer.keeps_owners(),
            transfer.keeps_xattrs(),
            transfer.fsync(),
            // With --files-from, the list's names, not the SRC's.
            Some(list.map_or_else(
                || Requested::from_paths(paths),
                |l| Requested::exactly(&l.names),
            )),
        ),
        overwrite: transfer.overwrite(),
        delete: transfer.delete(),
        shard: transfer.shard().is_some(),
        streams: transfer.streams(),
        buffer: transfer.buffer(),
        rcvbuf: tuning.rcvbuf,
        maxidle: tuning.maxidle,
        writers: readers(None),
        interrupted,
        dry_run: transfer.dry_run(),
    };
    let outcome = pull.receive(config).map_err(cli_error)?;
    report_pull(outcome, &host, &target, Path::new(dest), transfer)
}

/// `atou copy [USER@]A:PATH... [USER@]B:PATH`: A sends to B, both started
/// from here over ssh; here sees both ends' messages and moves no data
/// (but with --via-local). `crate::transfer::remote`'s `third_party`
/// says how, step by step.
fn third_party(
    source: &str,
    paths: &[String],
    dest_target: &str,
    dest_path: &str,
    flags: CopyFlags<'_>,
) -> Result<ExitCode> {
    let (transfer, receiving, ssh) = (flags.transfer, flags.receiving, flags.ssh);
    let (tuning, notes) = transfer.tuning().resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let mut source_args = vec![
        "send-to".to_string(),
        "--port".to_string(),
        ssh.port.to_string(),
    ];
    // Its report is the copy's: on its stderr, or as --json on its stdout
    // for this end to pass on.
    if transfer.json() {
        source_args.push("--json".to_string());
    } else if transfer.quiet() {
        source_args.push("--quiet".to_string());
    }
    source_args.extend(transfer.sender_args()?);
    if transfer.dry_run() {
        source_args.push("--dry-run".to_string());
    }
    // --files-from: the list goes to the source, the names it starts to
    // the destination, each first on its stdin.
    let list = transfer.remote_list(paths)?;
    let (source_preamble, dest_preamble) = match &list {
        Some(l) => {
            source_args.push(format!("--files-from-stdin={}", l.text.len()));
            (l.text.clone(), l.names.join(&0u8))
        }
        None => (Vec::new(), Vec::new()),
    };
    // A bar here on a terminal, drawn from the source's progress lines on
    // its stdout; through this host (--via-local) its stdout carries the
    // data, and its progress comes as lines on stderr.
    let bar = transfer.shows_a_bar() && !transfer.dry_run();
    let source_args_for = |via_local: bool| {
        let mut a = source_args.clone();
        if bar && !via_local {
            a.push("--progress-lines".to_string());
        }
        a.push("--".to_string());
        a.extend(paths.iter().cloned());
        a
    };
    let mut dest_args = push_args(dest_path, transfer, receiving, ssh.port, tuning.rcvbuf);
    let path_at_end = dest_args.split_off(dest_args.len() - 2);
    dest_args.push("--third-party".to_string());
    let xattrs = transfer.keeps_xattrs();
    let may: Vec<&str> = [
        (transfer.overwrite(), "overwrite"),
        (transfer.delete(), "delete"),
        (transfer.keeps_owners(), "owners"),
        (xattrs.xattrs, "xattrs"),
        (xattrs.acls, "acls"),
    ]
    .into_iter()
    .filter_map(|(on, word)| on.then_some(word))
    .collect();
    if !may.is_empty() {
        dest_args.push(format!("--sender-may={}", may.join(",")));
    }
    if list.is_some() {
        dest_args.push(format!("--requested-stdin={}", dest_preamble.len()));
    } else {
        for p in paths {
            dest_args.push(format!("--requested={p}"));
        }
    }
    if transfer.json() || transfer.quiet() {
        dest_args.push("--quiet".to_string());
    }
    dest_args.extend(path_at_end);
    let start = |via_local: bool| {
        ThirdParty::start(
            &ssh.command(),
            (source, &source_args_for(via_local), &source_preamble),
            (dest_target, &dest_args, &dest_preamble),
        )
        .map_err(cli_error)
    };
    let copy = start(ssh.via_local)?;
    let (from, to) = copy.targets();
    let (from, to) = (from.to_string(), to.to_string());
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let i = interrupted.clone();
        let _ = ctrlc_hook(move || i.store(true, Ordering::Relaxed));
    }
    let progress = Arc::new(Progress::default());
    let done = Arc::new(Mutex::new(false));
    let shower = (bar && !ssh.via_local).then(|| {
        let (p, d) = (progress.clone(), done.clone());
        thread::spawn(move || super::transfer::show_progress(p, d, true))
    });
    let outcome = copy.run(ssh.via_local, &interrupted, &progress);
    *done.lock().expect("progress lock") = true;
    if let Some(h) = shower {
        let _ = h.join();
    }
    let mut outcome = outcome.map_err(cli_error)?;
    if outcome.unreached && !ssh.via_local && !interrupted.load(Ordering::Relaxed) {
        // Nothing reached the destination, so nothing is half written
        // there: both ends start again, the data through this host.
        eprintln!(
            "atou: no UDP from {from} reached {to}: copying through this host instead, as \
             --via-local (give --via-local to go this way at once)"
        );
        outcome = start(true)?
            .run(true, &interrupted, &progress)
            .map_err(cli_error)?;
    }
    let shown = |target: &str, path: &str| format!("{target}:{}", escape(path.as_bytes()));
    let (from_shown, to_shown) = (shown(&from, &paths.join(" ")), shown(&to, dest_path));
    report_third_party(
        outcome,
        &from_shown,
        &to_shown,
        interrupted.load(Ordering::Relaxed),
        transfer,
    )
}

/// Says how a third-party copy ended: the source's own report came
/// through its stderr (or is passed on here as `--json`), the
/// destination's too; this adds the route, or which end failed.
fn report_third_party(
    outcome: ThirdPartyOutcome,
    from: &str,
    to: &str,
    interrupted: bool,
    transfer: &TransferArgs,
) -> Result<ExitCode> {
    let sent = outcome.source.is_some_and(|s| s.success());
    let placed = outcome.dest.is_some_and(|s| s.success());
    let (status, why) = if interrupted {
        (
            Exit::Interrupted,
            Some("interrupted; run the same command again to resume".to_string()),
        )
    } else if !sent {
        // The sender's own status: its exit codes are ours (255: ssh).
        let code = outcome.source.and_then(|s| s.code());
        let status = Exit::ALL
            .iter()
            .copied()
            .find(|e| Some(i32::from(e.code())) == code)
            .filter(|e| *e != Exit::Ok)
            .unwrap_or(Exit::Partial);
        let how = code.map_or("was killed by a signal".to_string(), |c| {
            format!("exited with status {c}")
        });
        (
            status,
            Some(format!(
                "the copy from {from} to {to} failed: atou at the source {how} (its reason \
                 is above); run the same command again to resume"
            )),
        )
    } else if !placed {
        (
            Exit::Partial,
            Some(format!(
                "the source verified every file, but atou at the destination {to} then failed \
                 ({})",
                outcome
                    .dest
                    .map_or("killed by a signal".to_string(), |s| s.to_string())
            )),
        )
    } else {
        (Exit::Ok, None)
    };
    if let Some(why) = &why {
        eprintln!("atou: {why}");
    } else if !transfer.quiet() && !transfer.json() {
        eprintln!(
            "atou: path: {}",
            if outcome.route == "ssh" {
                "ssh, through this host (--via-local)"
            } else {
                "UDP, from the source straight to the destination"
            }
        );
    }
    if transfer.json() {
        // The source's report, checked as JSON (it is the remote's word),
        // with the two ends and the route.
        let mut v = said_json(&outcome.said).unwrap_or_else(|| {
            exit::json_failure(status, from, why.as_deref().unwrap_or("no report"))
        });
        if let Some(m) = v.as_object_mut() {
            m.insert("status".into(), status.word().into());
            m.insert("exit".into(), status.code().into());
            m.insert("from".into(), from.into());
            m.insert("to".into(), to.into());
            m.insert("path".into(), outcome.route.into());
            if let Some(why) = &why {
                m.insert("error".into(), why.as_str().into());
            }
        }
        super::print_stdout(&exit::json_text(&v, false))?;
    } else {
        print_said(&outcome.said)?;
    }
    Ok(status.into())
}

/// A remote sender's `--json` report, as it printed it on stdout: its
/// word, so only a JSON object is taken.
fn said_json(said: &[String]) -> Option<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(&said.join("\n"))
        .ok()
        .filter(serde_json::Value::is_object)
}

/// What a remote sender printed on stdout (a dry run's listing), escaped:
/// it is the remote's word.
fn print_said(said: &[String]) -> Result<()> {
    if said.is_empty() {
        return Ok(());
    }
    let said: Vec<String> = said.iter().map(|l| escape(l.as_bytes())).collect();
    super::print_stdout(&format!("{}\n", said.join("\n")))
}

/// Says how a pull ended, on stderr or as `--json` on stdout.
fn report_pull(
    outcome: PullOutcome,
    host: &str,
    target: &str,
    dest: &Path,
    transfer: &TransferArgs,
) -> Result<ExitCode> {
    let why = match outcome {
        PullOutcome::Received { report: r, route } => {
            if transfer.json() {
                let mut v = exit::json_report(&r, Exit::Ok)?;
                if let Some(m) = v.as_object_mut() {
                    m.insert("path".into(), route.into());
                }
                super::print_stdout(&exit::json_text(&v, false))?;
            } else if !transfer.quiet() {
                eprint!("{}", received_text(&r, target));
                eprintln!("atou: path: {}", super::transfer::route_text(route));
            }
            return Ok(Exit::Ok.into());
        }
        PullOutcome::Planned {
            files,
            skipped,
            said,
            route,
        } => {
            if transfer.json() {
                // The remote's listing with this end's own count.
                let mut v = said_json(&said).unwrap_or_else(|| serde_json::json!({}));
                if let Some(m) = v.as_object_mut() {
                    m.insert("status".into(), Exit::Ok.word().into());
                    m.insert("exit".into(), Exit::Ok.code().into());
                    m.insert("from".into(), target.into());
                    m.insert("path".into(), route.into());
                    m.insert(
                        "answered_here".into(),
                        serde_json::json!({"files": files, "skipped": skipped}),
                    );
                }
                super::print_stdout(&exit::json_text(&v, false))?;
            } else if !transfer.quiet() {
                print_said(&said)?;
                let listed = if said.is_empty() && route == "ssh" {
                    " (the remote's list does not come through the ssh tunnel)"
                } else {
                    ""
                };
                eprintln!(
                    "atou: dry run answered here: {files} file{} would come from {target}, \
                     {skipped} {} here already{listed}; nothing was written into {}",
                    if files == 1 { "" } else { "s" },
                    if skipped == 1 { "is" } else { "are" },
                    shown_path(dest),
                );
            }
            return Ok(Exit::Ok.into());
        }
        PullOutcome::Interrupted => {
            eprintln!("atou: interrupted; run the same command again to resume");
            return Ok(Exit::Interrupted.into());
        }
        // Either way the partial files stay here for a resume.
        PullOutcome::Failed(why) => format!(
            "the transfer from {host} into {} failed: {}",
            shown_path(dest),
            escape(why.as_bytes())
        ),
        PullOutcome::Unfinished { status, last_words } => {
            let status = status.map_or("no status".to_string(), |s| s.to_string());
            format!(
                "the transfer from {host} did not finish: atou there ended (ssh: {status})\
                 {last_words}; run the same command again to resume"
            )
        }
    };
    eprintln!("atou: {why}");
    if transfer.json() {
        let v = exit::json_failure(Exit::Partial, host, &why);
        super::print_stdout(&exit::json_text(&v, false))?;
    }
    Ok(Exit::Partial.into())
}

fn received_text(r: &TransferReport, from: &str) -> String {
    let rate = if r.secs > 0.0 {
        r.bytes_written as f64 * 8.0 / r.secs
    } else {
        0.0
    };
    let mut s = format!(
        "atou: received {} file{} ({} dir{}, {} symlink{}) from {from} into {}: {} in {:.2} s, {}",
        r.files,
        if r.files == 1 { "" } else { "s" },
        r.dirs,
        if r.dirs == 1 { "" } else { "s" },
        r.symlinks,
        if r.symlinks == 1 { "" } else { "s" },
        shown_path(&r.dest),
        format_size(r.bytes_written),
        r.secs,
        format_rate(rate),
    );
    s += &super::transfer::not_sent_and_resent(r.bytes_resumed, r.skipped, r.chunks_rejected);
    s += "\natou: every file verified here (BLAKE3 per chunk and per file)\n";
    if r.deleted > 0 {
        s += &format!(
            "atou: deleted {} entr{} here that {from} does not have (--delete)\n",
            r.deleted,
            if r.deleted == 1 { "y" } else { "ies" }
        );
    }
    s += &xattrs_text(r);
    s
}

/// `-X` / `-A`: the attributes set, and those not set, when any.
fn xattrs_text(r: &TransferReport) -> String {
    if r.xattrs_set + r.xattrs_not_set == 0 {
        return String::new();
    }
    format!(
        "atou: {} extended attribute{} (ACLs among them) set here, {} not set (refused by \
         the file system, or a namespace this end may not set)\n",
        r.xattrs_set,
        if r.xattrs_set == 1 { "" } else { "s" },
        r.xattrs_not_set
    )
}

// ---------------------------------------------------------------------
// The remote end.

pub(super) fn remote(args: RemoteArgs) -> Result<ExitCode> {
    let stdin = std::io::stdin();
    let hello = match &args.hello {
        Some(line) => read_hello(line).map_err(cli_error)?,
        None => match read_hello_line(&mut stdin.lock()).map_err(cli_error)? {
            Some(hello) => hello,
            None => {
                eprintln!("atou: the local end went away before it sent its hello");
                return Ok(ExitCode::from(1));
            }
        },
    };
    // Where the ssh client reached us: the address to give back.
    let ip = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| ssh_server_ip(&c));
    // What the local end sends first on stdin, before anything else.
    let sent = match &args.role {
        Role::Send(a) | Role::SendTo(a) => a.files_from_stdin,
        Role::Receive(a) => a.requested_stdin,
    };
    let sent = match sent {
        Some(n) => match read_sent(&stdin, n)? {
            Some(bytes) => Some(bytes),
            None => {
                eprintln!("atou: the local end went away before it sent what it announced");
                return Ok(ExitCode::from(1));
            }
        },
        None => None,
    };
    let role = match (args.role, sent) {
        (Role::SendTo(mut a), sent) => {
            if let Some(text) = sent {
                a.transfer.set_files_from_sent(text);
            }
            return remote_send_to(a, ip);
        }
        (Role::Send(mut a), Some(text)) => {
            a.transfer.set_files_from_sent(text);
            Role::Send(a)
        }
        (Role::Receive(mut a), Some(names)) => {
            a.requested_names = names
                .split(|&b| b == 0)
                .filter(|n| !n.is_empty())
                .map(<[u8]>::to_vec)
                .collect();
            Role::Receive(a)
        }
        (role, None) => role,
    };
    // The local end gone (ssh closed, Ctrl-C there): stop.
    let gone = Arc::new(tokio::sync::Notify::new());
    let gone_flag = Arc::new(AtomicBool::new(false));
    // The local end's first words on stdin may ask for the ssh tunnel;
    // then nothing until it goes.
    let watch = {
        let (gone, flag) = (gone.clone(), gone_flag.clone());
        move |then: OnSwitch| {
            let mut stdin = stdin;
            if asked_to_switch(&mut stdin) {
                match then {
                    OnSwitch::Relay(receiver) => {
                        if let Err(e) = serve_tunnel(receiver) {
                            eprintln!("atou: the tunnel over ssh ended: {e}");
                        }
                    }
                    // The sender relays its own datagrams, and sees the
                    // channel end.
                    OnSwitch::Tell(switch) => {
                        switch.store(true, Ordering::Relaxed);
                        return;
                    }
                }
            }
            let mut sink = [0u8; 256];
            while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
            flag.store(true, Ordering::Relaxed);
            gone.notify_one();
        }
    };
    match role {
        Role::Receive(a) => remote_receive(a, hello, ip, move |r| watch(OnSwitch::Relay(r)), gone),
        Role::Send(a) => remote_send(
            a,
            hello,
            ip,
            move |switch| watch(OnSwitch::Tell(switch)),
            gone_flag,
        ),
        Role::SendTo(a) => remote_send_to(a, ip),
    }
}

/// What the far end does when the local end asks for the ssh tunnel.
enum OnSwitch {
    /// A push's: relay the frames to this end's receiver.
    Relay(SocketAddr),
    /// A pull's: tell the sender, which sends through the tunnel.
    Tell(Arc<AtomicBool>),
}

/// Whether the local end's first words on stdin are [`tunnel::SWITCH`],
/// which it says if it found that no UDP gets through. Anything else is
/// not a switch: the caller reads on to the end.
fn asked_to_switch(stdin: &mut std::io::Stdin) -> bool {
    let mut first = vec![0u8; tunnel::SWITCH.len() + 1];
    stdin.read_exact(&mut first).is_ok() && first == format!("{}\n", tunnel::SWITCH).as_bytes()
}

/// Says [`tunnel::SWITCH`] back: from here on stdout carries the
/// tunnel's frames and nothing else.
fn say_switch() -> std::io::Result<()> {
    super::STDOUT_CARRIES_TUNNEL.store(true, Ordering::Relaxed);
    let mut out = std::io::stdout().lock();
    out.write_all(format!("{}\n", tunnel::SWITCH).as_bytes())?;
    out.flush()
}

/// Relays the frames that follow the switch to `receiver` until the
/// local end closes the channel.
fn serve_tunnel(receiver: SocketAddr) -> std::io::Result<()> {
    say_switch()?;
    ServerSide::new(vec![receiver])
        .run(std::io::stdin(), std::io::stdout())?
        .join()
}

/// The far end of a pull, switched: stands in for the local receiver on
/// loopback and relays between it and the channel until the local end
/// closes it, then sets `gone`. Sockets to send from, one per stream,
/// each to the stand-in.
fn tunnel_sending(streams: usize, gone: Arc<AtomicBool>) -> std::io::Result<Vec<Bound>> {
    let localhost = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, 0));
    let side = ClientSide::bind(1, localhost)?;
    let stand_in = side.addrs()?[0];
    let from = (0..streams.max(1))
        .map(|_| {
            let socket = std::net::UdpSocket::bind(localhost)?;
            socket.set_nonblocking(true)?;
            Ok(Bound {
                socket,
                peer: stand_in,
            })
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    say_switch()?;
    let tunnel = side.run(std::io::stdin(), std::io::stdout())?;
    thread::spawn(move || {
        if let Err(e) = tunnel.join() {
            eprintln!("atou: the tunnel over ssh ended: {e}");
        }
        gone.store(true, Ordering::Relaxed);
    });
    Ok(from)
}

fn remote_receive(
    args: RemoteReceiveArgs,
    hello: Hello,
    ip: Option<IpAddr>,
    watch: impl FnOnce(SocketAddr) + Send + 'static,
    gone: Arc<tokio::sync::Notify>,
) -> Result<ExitCode> {
    let path = remote_path(&args.path);
    // No tidying after a dry run: nothing was created, and an empty staging
    // directory that was there before stays.
    let tidy_after = !args.dry_run && !args.shard;
    let created = !path.exists();
    let dry = args
        .dry_run
        .then(|| crate::transfer::dest::DryRunRoot::new(&path))
        .transpose()?;
    let root = match &dry {
        Some(dry) => check_root(dry.path())?,
        None => {
            crate::transfer::dest::create_destination(&path)?;
            check_root(&path)?
        }
    };
    // A push's sender is this user's own command: its flags decide. A
    // third-party copy's is another host: it may do what this user's
    // flags said, and send only the roots the user named.
    let may = |what: SenderMay| !args.third_party || args.sender_may.contains(&what);
    let policy = args.receiving.policy(
        may(SenderMay::Overwrite),
        may(SenderMay::Delete),
        may(SenderMay::Owners),
        Wanted {
            xattrs: may(SenderMay::Xattrs),
            acls: may(SenderMay::Acls),
            root: true,
        },
        false,
        args.third_party.then(|| match args.requested_stdin {
            Some(_) => Requested::exactly(&args.requested_names),
            None => Requested::from_paths(&args.requested),
        }),
    );
    let config = FarReceiveConfig {
        root: root.clone(),
        port: args.port,
        buffer: args.buffer,
        rcvbuf: args.rcvbuf,
        dry_run: args.dry_run,
        policy,
        sender_may_overwrite: may(SenderMay::Overwrite),
        sender_may_delete: may(SenderMay::Delete),
        writers: readers(None),
    };
    let received = receive_push(config, &hello, ip, watch, gone).map_err(cli_error);
    if tidy_after {
        tidy(&root, created);
    }
    match received? {
        Some(Ok(report)) => {
            // A third-party copy's destination says what it received:
            // its report reaches the user only through this stderr.
            if let (true, false, Some(r)) = (args.third_party, args.quiet, report) {
                eprint!("{}", received_text(&r, "the source host"));
            }
            Ok(ExitCode::SUCCESS)
        }
        // The sender has the reason too, in its answer.
        Some(Err(why)) => {
            eprintln!("atou: receiving failed: {}", escape(why.as_bytes()));
            Ok(ExitCode::from(1))
        }
        None => {
            eprintln!("atou: the local end went away before the transfer was over; the partial files stay for a rerun");
            Ok(ExitCode::from(1))
        }
    }
}

/// The source of a third-party copy: answers, waits for the local end to
/// say where the destination is (on stdin), and sends there.
fn remote_send_to(args: RemoteSendArgs, ip: Option<IpAddr>) -> Result<ExitCode> {
    let sources: Vec<PathBuf> = args.sources.iter().map(|s| remote_path(s)).collect();
    let streams = args.transfer.streams();
    let far = FarSendTo::answer(ip, args.port, streams, &sources).map_err(cli_error)?;
    let mut stdin = std::io::stdin();
    let Some(order) = far.order(&mut stdin).map_err(cli_error)? else {
        eprintln!("atou: the local end went away before it said where to send");
        return Ok(ExitCode::from(1));
    };
    let progress = Arc::new(Progress::default());
    let (from, auth, route) = match order {
        Ordered::Udp(from, auth) => {
            // The rest of stdin is nothing until the local end goes
            // (Ctrl-C there, ssh closed): then stop.
            let p = progress.clone();
            thread::spawn(move || {
                let mut sink = [0u8; 256];
                while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
                p.stop.store(true, Ordering::Relaxed);
            });
            (from, auth, "udp")
        }
        Ordered::Ssh(auth) => {
            let gone = Arc::new(AtomicBool::new(false));
            let from = tunnel_sending(streams, gone.clone())?;
            let p = progress.clone();
            thread::spawn(move || {
                while !gone.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(50));
                }
                p.stop.store(true, Ordering::Relaxed);
            });
            (from, auth, "via-local")
        }
    };
    let peer = from[0].peer;
    let shown = if route == "via-local" {
        "the destination (through the ssh tunnel)".to_string()
    } else {
        format!("the destination ({peer})")
    };
    let mut config = args.transfer.send_config(peer, shown, None)?;
    config.auth = Some(auth);
    // No route line here: the host that runs the copy says which way the
    // data went, in its own words.
    let unreached = Arc::new(AtomicBool::new(false));
    let seen = unreached.clone();
    let code = run_send_from(
        &sources,
        config,
        &args.transfer,
        None,
        &from,
        progress,
        OnFailure::explain(move |e| {
            let unanswered = matches!(
                e,
                crate::transfer::send::SendError::Conn(crate::io::ProbeError::Conn {
                    error: crate::proto::ConnError::Idle {
                        stage: crate::proto::endpoint::client::Stage::Hello
                            | crate::proto::endpoint::client::Stage::Handshake,
                        ..
                    },
                    ..
                }) | crate::transfer::send::SendError::Conn(
                    crate::io::ProbeError::Unreachable { .. }
                )
            );
            (unanswered && route == "udp").then(|| {
                seen.store(true, Ordering::Relaxed);
                format!(
                    "no UDP from here reached the destination ({peer}) or came back: a \
                 firewall between the two hosts? (open the destination's --port range to \
                 this host to copy directly)"
                )
            })
        }),
    );
    if unreached.load(Ordering::Relaxed) {
        // For the host running the copy, which then goes through itself
        // (its ssh channel reads our stdout by lines).
        super::print_stdout(&format!("{}\n", crate::transfer::remote::UNREACHED))?;
    }
    code
}

fn remote_send(
    args: RemoteSendArgs,
    hello: Hello,
    ip: Option<IpAddr>,
    watch: impl FnOnce(Arc<AtomicBool>) + Send + 'static,
    gone: Arc<AtomicBool>,
) -> Result<ExitCode> {
    let (tuning, _) = args.transfer.tuning().resolve()?;
    let sources: Vec<PathBuf> = args.sources.iter().map(|s| remote_path(s)).collect();
    let streams = args.transfer.streams();
    let far = FarSend::answer(&hello, ip, args.port, streams, &sources).map_err(cli_error)?;
    // Set when the local end, having heard nothing over UDP, asks for the
    // ssh tunnel (issue 29).
    let switch = Arc::new(AtomicBool::new(false));
    {
        let switch = switch.clone();
        thread::spawn(move || watch(switch));
    }
    let wait = tuning.maxidle + Duration::from_secs(5);
    // `tunneled`: the switch came before the send, which starts through
    // the tunnel; otherwise a switch stops the send, unheard, and it goes
    // again through the tunnel.
    let (from, auth, tunneled) = match far.await_punches(wait, &gone, &switch).map_err(cli_error)? {
        Punched::Ready(from, auth) => (from, auth, false),
        Punched::Switched(auth) => (tunnel_sending(streams, gone.clone())?, auth, true),
        Punched::Gone => return Ok(ExitCode::from(1)),
        Punched::TimedOut(wait) => {
            eprintln!(
                "atou: no punch datagram arrived in {:.0} s",
                wait.as_secs_f64()
            );
            return Ok(ExitCode::from(1));
        }
    };
    let local = std::env::var("SSH_CONNECTION")
        .ok()
        .and_then(|c| c.split_ascii_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "the local end".to_string());
    let mut config = args.transfer.send_config(from[0].peer, local, None)?;
    config.auth = Some(auth);
    let progress = Arc::new(Progress::default());
    {
        let (p, gone, switch) = (progress.clone(), gone.clone(), switch.clone());
        let mut switched = tunneled;
        thread::spawn(move || {
            while !gone.load(Ordering::Relaxed) {
                // Switched mid-send: the local end heard none of it; the
                // send stops and goes again through the tunnel.
                if !switched && switch.load(Ordering::Relaxed) {
                    switched = true;
                    if !p.heard.load(Ordering::Relaxed) {
                        p.stop.store(true, Ordering::Relaxed);
                    }
                }
                thread::sleep(Duration::from_millis(50));
            }
            p.stop.store(true, Ordering::Relaxed);
        });
    }
    run_send_from(
        &sources,
        config,
        &args.transfer,
        None,
        &from,
        progress,
        OnFailure::explain(|_| None).detour(|e| {
            if tunneled
                || !switch.load(Ordering::Relaxed)
                || !matches!(e, crate::transfer::send::SendError::Interrupted)
            {
                return None;
            }
            Some(
                tunnel_sending(streams, gone.clone())
                    .map(|from| Detoured {
                        peer: from[0].peer,
                        from,
                    })
                    .map_err(|e| crate::transfer::send::SendError::Failed {
                        host: "the local end".to_string(),
                        why: format!("the switch to the ssh tunnel: {e}"),
                    }),
            )
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Local {
        #[command(flatten)]
        transfer: TransferArgs,
    }

    #[derive(Parser)]
    struct Far {
        #[command(subcommand)]
        role: Role,
    }

    #[test]
    fn a_pull_forwards_the_senders_flags_and_every_knob_exactly() {
        let local = Local::try_parse_from([
            "copy",
            "--streams",
            "3",
            "--flows",
            "2",
            "--buffer",
            "32MiB",
            "--overwrite",
            "--follow",
            "--delack",
            "1ms",
            "--recovery",
            "newreno",
            "--rcvwin",
            "7",
            "--include",
            "keep.tmp",
            "--exclude",
            "*.tmp",
            "--exclude=-odd/***",
            "--shard",
            "3/8",
        ])
        .unwrap();
        let mut argv = vec!["__remote".to_string(), "send".to_string()];
        argv.extend(local.transfer.remote_send_args().unwrap());
        argv.extend(["--".to_string(), "-odd name".to_string()]);
        let Far {
            role: Role::Send(far),
        } = Far::try_parse_from(&argv).unwrap()
        else {
            panic!("not a send")
        };
        assert_eq!(far.sources, vec!["-odd name".to_string()]);
        assert_eq!(far.transfer.streams(), 3);
        assert_eq!(far.transfer.flows(), 2);
        assert_eq!(far.transfer.buffer(), 32 << 20);
        assert_eq!(
            far.transfer.shard().map(|s| s.to_string()),
            Some("3/8".into())
        );
        assert!(!far.transfer.quiet() && far.transfer.json());
        let (a, _) = local.transfer.tuning().resolve().unwrap();
        let (b, _) = far.transfer.tuning().resolve().unwrap();
        assert_eq!(a, b);
        assert_ne!(a, crate::proto::Tuning::default());
        let config = far
            .transfer
            .send_config("127.0.0.1:1".parse().unwrap(), "h".into(), None)
            .unwrap();
        assert!(config.options.overwrite && config.follow && !config.options.fsync);
        assert_eq!(config.flows, 2);
        let here = local
            .transfer
            .send_config("127.0.0.1:1".parse().unwrap(), "h".into(), None)
            .unwrap();
        assert_eq!(config.filters, here.filters);
        assert!(config.filters.excludes(b"t/-odd/x", false));
        assert!(
            !config.filters.excludes(b"t/keep.tmp", false),
            "an include kept its place"
        );
        assert!(config.filters.excludes(b"t/x.tmp", false));
    }
}
