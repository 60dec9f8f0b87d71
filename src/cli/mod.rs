//! The `atou` command line.
//!
//! Exit codes: 0 success, 1 the transfer failed, 2 usage error.

mod auth;
mod docs;
mod keygen;
mod net;
mod netem;
mod remote;
mod transfer;
mod tuning_args;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use atou::netem::NetemSpec;
use atou::proto::{TimedEvent, TraceRecord};
use atou::sim::{Observer, Outcome, SimConfig, Simulation};
use atou::summary::config_lines;
use atou::units::parse_size;

pub use tuning_args::TuningArgs;

#[derive(Parser, Debug)]
#[command(
    name = "atou",
    version,
    about = "Reliable transfer over a tunable, instrumented TCP-like protocol on UDP",
    long_about = "Reliable transfer over a tunable, instrumented TCP-like protocol on UDP, \
                  after ORNL's atou (\"almost TCP over UDP\"). Every transport knob can be set \
                  per run, and every run can be traced and replayed."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Send files and directory trees to an `atou serve --dir` (resumable, every file verified)
    Send(transfer::SendArgs),
    /// Copy files and trees: locally (through atou over loopback), or to or from [USER@]HOST:PATH, running the other end over ssh
    Copy(transfer::CopyArgs),
    /// Simulate a transfer in virtual time over modelled links, reproducibly from a seed
    Sim(SimArgs),
    /// Send test data to an `atou serve` over real UDP and print atou's summary (atou's client)
    Probe(net::ProbeArgs),
    /// Receive files (--dir) and probes on a UDP port, many at once (atou's server)
    Serve(net::ServeArgs),
    /// Impair real traffic as tc-netem would: a UDP relay, or two test hosts in network namespaces
    Netem(netem::NetemArgs),
    /// Write a key pair for authenticated transfers (private key mode 0600), as ssh-keygen
    Keygen(keygen::KeygenArgs),
    /// Print a shell completion script (bash, zsh or fish) on stdout
    Completions(docs::CompletionsArgs),
    /// Write the man pages into a directory (docs/man is made this way)
    #[command(name = "__man", hide = true)]
    Man(docs::ManArgs),
    /// The far end of `atou copy` over ssh (run by ssh, not by people)
    #[command(name = "__remote", hide = true)]
    Remote(remote::RemoteArgs),
}

#[derive(Args, Debug)]
#[command(
    after_help = "Path SPECs are tc-netem(8) options with the kernel's meaning: limit PACKETS; \
    delay TIME [JITTER [CORR]] [distribution uniform|normal|pareto|paretonormal]; \
    loss [random] P [CORR] | loss state p13 [p31 [p32 [p23 [p14]]]] | loss gemodel p [r [1-h [1-k]]] | loss every N; \
    corrupt P [CORR]; duplicate P [CORR]; reorder P [CORR] [gap N]; rate RATE [OVERHEAD [CELLSIZE [CELLOVERHEAD]]]; \
    slot MIN [MAX] [packets N] [bytes B]; seed S. Stages joined by `|` feed each other: \
    one netem's limit also counts its delay line, so a bottleneck queue is `rate R limit N | delay D`. \
    Rates are bits/s (kbit, mbit, gbit); a bare probability is a percentage, as in tc; a bare time is microseconds. \
    See docs/netem.md.\n\n\
    Example: atou sim --bytes 100MB --fwd 'rate 100mbit delay 50ms limit 1000 loss 1%' --rev 'delay 50ms'"
)]
struct SimArgs {
    /// Forward (data) path, in tc-netem words
    #[arg(long, value_name = "SPEC", default_value = "rate 100mbit delay 25ms limit 1000", value_parser = parse_spec)]
    fwd: NetemSpec,
    /// Return (ACK) path, in tc-netem words
    #[arg(long, value_name = "SPEC", default_value = "delay 25ms", value_parser = parse_spec)]
    rev: NetemSpec,
    /// Bytes to transfer: 100MB (10^6), 64MiB or 64M (2^20); 0 runs until --maxtime/--maxpkts
    #[arg(long, value_name = "SIZE", default_value = "10MiB", value_parser = parse_bytes)]
    bytes: u64,
    /// Seed for every random choice of the links: same seed, same run
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    tuning: TuningArgs,
}

/// What a run writes besides its summary; shared by sim and probe.
#[derive(Args, Debug)]
pub(crate) struct OutputArgs {
    /// Write atou's packet trace to FILE (`time seg xmt`, `time ack rtt cwnd ssthresh ack`)
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Print atou's event lines (3duprxmit, timerxmit, packrxmit, badack, ...) on stderr
    #[arg(long)]
    pub events: bool,
    /// Print the summary as JSON instead of atou's layout
    #[arg(long)]
    pub json: bool,
}

fn parse_spec(s: &str) -> Result<NetemSpec, String> {
    s.parse()
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// Writes events to stderr and trace lines to a file as the run goes.
pub(crate) struct Output {
    events: bool,
    trace: Option<BufWriter<File>>,
    trace_path: Option<PathBuf>,
    error: Option<io::Error>,
}

impl Observer for Output {
    fn on_event(&mut self, event: &TimedEvent) {
        if self.events {
            // stderr closed by the reader: nothing useful to do about it.
            let _ = writeln!(io::stderr().lock(), "{event}");
        }
    }

    fn on_trace(&mut self, record: &TraceRecord) {
        if let (Some(w), None) = (self.trace.as_mut(), self.error.as_ref()) {
            if let Err(e) = writeln!(w, "{record}") {
                self.error = Some(e);
            }
        }
    }
}

impl Output {
    /// Events to stderr if asked; the trace file, if asked, created now
    /// with its `#` header: what ran (`run`), then every knob.
    pub(crate) fn open(
        events: bool,
        trace: Option<&Path>,
        run: Vec<String>,
        tuning: &atou::proto::Tuning,
    ) -> Result<Output> {
        let mut header = vec![
            "atou trace: `time seg xmt` per transmission, `time ack rtt cwnd ssthresh ack` per ACK"
                .to_string(),
        ];
        header.extend(run);
        header.extend(config_lines(tuning));
        Ok(Output {
            events,
            trace: trace.map(|p| create_trace(p, &header)).transpose()?,
            trace_path: trace.map(Path::to_path_buf),
            error: None,
        })
    }
}

fn create_trace(path: &Path, header: &[String]) -> Result<BufWriter<File>> {
    let file = File::create(path)
        .map_err(|e| UsageError(format!("cannot create trace file {}: {e}", path.display())))?;
    let mut w = BufWriter::new(file);
    for line in header {
        writeln!(w, "# {line}").with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(w)
}

fn sim(args: SimArgs) -> Result<ExitCode> {
    let (tuning, notes) = args.tuning.resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let bytes = (args.bytes > 0).then_some(args.bytes);
    let mut config = SimConfig::new(tuning.clone(), args.fwd, args.rev, bytes, args.seed);
    config.trace = args.output.trace.is_some();

    let mut out = Output::open(
        args.output.events,
        args.output.trace.as_deref(),
        vec![
            format!("atou {} sim seed {}", env!("CARGO_PKG_VERSION"), args.seed),
            format!("fwd {}", config.fwd),
            format!("rev {}", config.rev),
            format!("bytes {}", args.bytes),
        ],
        &tuning,
    )?;
    let result = Simulation::new(config)?.run(&mut out)?;
    finish_trace(&mut out)?;
    let text = if args.output.json {
        serde_json::to_string_pretty(&result.summary)? + "\n"
    } else {
        result.summary.to_string()
    };
    print_stdout(&text)?;
    let intact = result
        .summary
        .sim
        .as_ref()
        .is_some_and(|s| s.first_error.is_none());
    Ok(if result.outcome == Outcome::Finished && intact {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Flushes the trace file, reporting the first write error.
pub(crate) fn finish_trace(out: &mut Output) -> Result<()> {
    if let Some(mut w) = out.trace.take() {
        let path = out.trace_path.as_deref().unwrap_or(Path::new("trace"));
        if let Some(e) = out.error.take() {
            return Err(e).with_context(|| format!("cannot write trace file {}", path.display()));
        }
        w.flush()
            .with_context(|| format!("cannot write trace file {}", path.display()))?;
    }
    Ok(())
}

/// Writes to stdout; a reader that went away (`atou sim | head`) is not an error.
pub(crate) fn print_stdout(text: &str) -> Result<()> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("cannot write to stdout"),
        _ => Ok(()),
    }
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = print_stdout(&e.render().to_string());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line that names the offending flag or token.
            let text = e.render().to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("bad arguments");
            eprintln!("atou: {}", line.trim_start_matches("error: "));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Send(args) => transfer::send_cmd(args),
        Command::Copy(args) => transfer::copy_cmd(args),
        Command::Sim(args) => sim(args),
        Command::Probe(args) => net::probe(args),
        Command::Serve(args) => net::serve(args),
        Command::Netem(args) => netem::netem(args),
        Command::Keygen(args) => keygen::keygen(args),
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
        Command::Remote(args) => remote::remote(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("atou: {e:#}");
            ExitCode::from(e.downcast_ref::<UsageError>().map_or(1, |_| 2))
        }
    }
}

/// A mistake in what the user asked for (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
