//! The `atou` command line.
//!
//! Exit statuses: see [`exit::Exit`] (0 success, 2 usage error, 130
//! interrupted, and one number per kind of failure).

// Only `io` may hold `unsafe` (each block with a SAFETY line).
#![forbid(unsafe_code)]

mod auth;
mod cipher_cost;
mod docs;
mod exit;
mod host_config;
mod keygen;
mod metrics;
mod net;
mod netem;
mod path_hint;
mod path_size;
mod plot;
mod remote;
mod transfer;
mod tuning_args;

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::netem::NetemSpec;
use crate::proto::{Observer, TimedEvent, TraceRecord};
use crate::report::summary::config_lines;
use crate::sim::{run_flows, FlowConfig, FlowsConfig, RunEnd, SimConfig, Simulation};
use crate::util::units::{parse_duration, parse_size, TimeUnit};

pub(crate) use tuning_args::TuningArgs;

#[derive(Parser, Debug)]
#[command(
    name = "atou",
    version,
    about = "Reliable transfer over a tunable, instrumented TCP-like protocol on UDP",
    long_about = "Reliable transfer over a tunable, instrumented TCP-like protocol on UDP, \
                  after ORNL's atou (\"almost TCP over UDP\"). Every transport knob can be set \
                  per run, and every run can be traced and replayed.",
    after_help = exit::Exit::table()
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Send files and directory trees to an `atou serve --dir` (resumable, every file verified)
    Send(transfer::SendArgs),
    /// Copy files and trees: locally (through atou over loopback), to or from [USER@]HOST:PATH, or between two hosts, running the remote ends over ssh
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
    /// Draw a run's graphs from its --trace file as SVG: time-sequence, cwnd, RTT, goodput
    Plot(plot::PlotArgs),
    /// Print a shell completion script (bash, zsh or fish) on stdout
    Completions(docs::CompletionsArgs),
    /// Write the man pages into a directory (docs/man is made this way)
    #[command(name = "__man", hide = true)]
    Man(docs::ManArgs),
    /// The far end of `atou copy` over ssh (run by ssh, not by people)
    #[command(name = "__remote", hide = true)]
    Remote(remote::RemoteArgs),
    /// The packet cipher's own cost per GB of data (scripts/bench-crypto.sh)
    #[command(name = "__cipher-cost", hide = true)]
    CipherCost(cipher_cost::CipherCostArgs),
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
    Flows sharing the forward path: each --flow adds one (its own sender, receiver and copy of --rev; \
    the forward path, its rate and its limit queue, is shared). SPEC is comma-separated KEY=VALUE: \
    start=TIME (when it starts; bare number = seconds; default 0), bytes=SIZE (default: pattern data \
    until --duration), and any knob by its config-file name (cc=cubic, recovery=sack, bbr_loss_thresh=5%), \
    set on top of the tuning flags, which every flow shares. The run lasts --duration; it prints each \
    flow's goodput over the window from --measure-from to the end, Jain's fairness index and the \
    bottleneck's utilisation (goodput over the forward path's rate). --events prefixes each line \
    with its flow (times count from the flow's start); --trace and --bytes are for one flow. See docs/congestion.md.\n\n\
    Example: atou sim --bytes 100MB --fwd 'rate 100mbit delay 50ms limit 1000 loss 1%' --rev 'delay 50ms'\n\
    Example: atou sim --fwd 'rate 100mbit limit 1000 | delay 50ms' --rev 'delay 50ms' \
    --flow cc=bbr --flow cc=cubic,start=5s --duration 60s --measure-from 10s"
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
    /// One flow sharing the forward path, as KEY=VALUE[,KEY=VALUE...]
    /// (start=TIME, bytes=SIZE, knobs: cc=bbr); repeat for each flow (see below)
    #[arg(long, value_name = "SPEC", value_parser = parse_flow, conflicts_with_all = ["bytes", "trace", "plot"])]
    flow: Vec<FlowArg>,
    /// With --flow: virtual time the run lasts (bare number = seconds) [default: 60s]
    #[arg(long, value_name = "TIME", value_parser = parse_secs)]
    duration: Option<std::time::Duration>,
    /// With --flow: start of the goodput window, to the end of the run
    /// (bare number = seconds) [default: the last flow's start]
    #[arg(long, value_name = "TIME", value_parser = parse_secs)]
    measure_from: Option<std::time::Duration>,
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
    /// At the end of the run, draw its graphs into FILE (SVG), as `atou plot` does from a trace
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Print atou's event lines (3duprxmit, timerxmit, packrxmit, badack, ...) on stderr
    #[arg(long)]
    pub events: bool,
    /// Print the summary as JSON instead of atou's layout
    #[arg(long)]
    pub json: bool,
}

fn parse_spec(s: &str) -> Result<NetemSpec, crate::netem::SpecError> {
    s.parse()
}

fn parse_bytes(s: &str) -> Result<u64, crate::util::units::UnitError> {
    parse_size(s)
}

fn parse_secs(s: &str) -> Result<std::time::Duration, crate::util::units::UnitError> {
    parse_duration(s, TimeUnit::Seconds)
}

/// One `--flow`: when it starts, how much it sends, and its own knobs.
#[derive(Debug, Clone, Default)]
struct FlowArg {
    start: std::time::Duration,
    bytes: Option<u64>,
    knobs: Vec<(String, String)>,
}

fn parse_flow(s: &str) -> Result<FlowArg, String> {
    let mut flow = FlowArg::default();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("`{item}`: expected KEY=VALUE, as in cc=bbr or start=5s"))?;
        let (key, value) = (key.trim(), value.trim());
        match key {
            "start" => flow.start = parse_secs(value).map_err(|e| e.to_string())?,
            "bytes" => {
                flow.bytes = Some(parse_size(value).map_err(|e| e.to_string())?).filter(|&b| b > 0)
            }
            _ => flow.knobs.push((key.to_string(), value.to_string())),
        }
    }
    Ok(flow)
}

/// `atou sim --flow ...`: several flows over one forward path.
fn sim_flows(args: SimArgs) -> Result<ExitCode> {
    let (base, notes) = args.tuning.resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let mut flows = Vec::new();
    for (i, f) in args.flow.iter().enumerate() {
        let mut tuning = base.clone();
        let bad = |e: crate::proto::tuning::TuningError| {
            UsageError(format!("--flow #{}: {}: {}", i + 1, e.key, e.message))
        };
        for (key, value) in &f.knobs {
            tuning.set(key, value).map_err(bad)?;
        }
        tuning.validate().map_err(bad)?;
        flows.push(FlowConfig {
            tuning,
            bytes: f.bytes,
            start: f.start,
            group: None,
        });
    }
    let duration = args.duration.unwrap_or(std::time::Duration::from_secs(60));
    let mut config = FlowsConfig::new(flows, args.fwd, args.rev, duration, args.seed);
    config.measure_from = args.measure_from;
    let mut out = FlowEvents(args.output.events);
    let result = run_flows(&config, &mut out)?;
    let text = if args.output.json {
        let (from, to) = result.window;
        let flows: Vec<_> = result
            .flows
            .iter()
            .map(|f| {
                serde_json::json!({
                    "start": f.start.as_secs_f64(),
                    "window_bytes": f.window_bytes,
                    "goodput_bps": f.goodput_bps,
                    "fwd_dropped": f.fwd_dropped,
                    "summary": f.summary,
                })
            })
            .collect();
        let json = serde_json::json!({
            "seed": args.seed,
            "window": [from.as_secs_f64(), to.as_secs_f64()],
            "jain": result.jain(),
            "utilisation": result.utilisation(),
            "bottleneck_bps": result.bottleneck_bps,
            "fwd_stats": result.fwd_stats,
            "flows": flows,
        });
        serde_json::to_string_pretty(&json)? + "\n"
    } else {
        let mut text = String::new();
        for (i, f) in result.flows.iter().enumerate() {
            text += &format!("flow {}:\n{}\n", i + 1, f.summary);
        }
        text + &result.to_string()
    };
    print_stdout(&text)?;
    let ok = result.flows.iter().all(|f| {
        matches!(f.outcome, RunEnd::Finished | RunEnd::TimeLimit)
            && f.summary
                .sim
                .as_ref()
                .is_some_and(|s| s.first_error.is_none())
    });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        exit::Exit::Failed.into()
    })
}

/// `--events` with several flows: each line after its flow's number.
struct FlowEvents(bool);

impl Observer for FlowEvents {
    fn on_flow_event(&mut self, flow: usize, event: &TimedEvent) {
        if self.0 {
            let _ = writeln!(io::stderr().lock(), "flow {} {event}", flow + 1);
        }
    }
}

/// Writes events to stderr and trace lines to a file as the run goes.
pub(crate) struct Output {
    events: bool,
    trace: Option<BufWriter<File>>,
    trace_path: Option<PathBuf>,
    error: Option<io::Error>,
    /// `--plot FILE`: the trace kept in memory to draw at the end.
    plot: Option<(PathBuf, crate::report::trace::Trace)>,
    /// The trace's `#` header: what ran, then every knob.
    header: Vec<String>,
}

impl Observer for Output {
    fn on_event(&mut self, event: &TimedEvent) {
        if self.events {
            // stderr closed by the reader: nothing useful to do about it.
            let _ = writeln!(io::stderr().lock(), "{event}");
        }
    }

    fn on_trace(&mut self, record: &TraceRecord) {
        if let Some((_, kept)) = self.plot.as_mut() {
            // The record as the trace file holds it (times to the
            // microsecond), so --plot draws what `atou plot` of the file does.
            let line = record.to_string();
            if let Ok(Some(r)) = crate::report::trace::parse_record(&line) {
                kept.records.push(r);
            }
        }
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
        tuning: &crate::proto::Tuning,
    ) -> Result<Output> {
        let mut header = vec![crate::report::trace::FORMAT_LINE.to_string()];
        header.extend(run);
        header.extend(config_lines(tuning));
        Ok(Output {
            events,
            trace: trace.map(|p| create_trace(p, &header)).transpose()?,
            trace_path: trace.map(Path::to_path_buf),
            error: None,
            plot: None,
            header,
        })
    }

    /// `--plot FILE`: keep the trace to draw it into FILE when the run ends
    /// ([`finish_trace`]); the run must record its trace.
    pub(crate) fn plot_to(mut self, path: Option<&Path>) -> Output {
        self.plot = path.map(|p| {
            let kept = crate::report::trace::Trace {
                header: self.header.clone(),
                records: Vec::new(),
            };
            (p.to_path_buf(), kept)
        });
        self
    }
}

impl OutputArgs {
    /// Whether the run must record its packet trace (for --trace or --plot).
    pub(crate) fn wants_trace(&self) -> bool {
        self.trace.is_some() || self.plot.is_some()
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
    if !args.flow.is_empty() {
        return sim_flows(args);
    }
    if args.duration.is_some() || args.measure_from.is_some() {
        return Err(UsageError(
            "--duration and --measure-from are for runs of several flows: add --flow".into(),
        )
        .into());
    }
    let (tuning, notes) = args.tuning.resolve()?;
    for note in notes {
        eprintln!("atou: {note}");
    }
    let bytes = (args.bytes > 0).then_some(args.bytes);
    let config = SimConfig::new(tuning.clone(), args.fwd, args.rev, bytes, args.seed)
        .trace(args.output.wants_trace());

    let mut out = Output::open(
        args.output.events,
        args.output.trace.as_deref(),
        vec![
            format!("atou {} sim seed {}", env!("CARGO_PKG_VERSION"), args.seed),
            format!("fwd {}", config.fwd),
            format!("rev {}", config.rev),
            format!("bytes {}", args.bytes),
            // The simulator's connections are plain.
            crate::report::trace::payload_line(crate::proto::endpoint::client::segment_payload(
                &tuning, None,
            )),
        ],
        &tuning,
    )?
    .plot_to(args.output.plot.as_deref());
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
    Ok(if result.outcome == RunEnd::Finished && intact {
        ExitCode::SUCCESS
    } else {
        exit::Exit::Failed.into()
    })
}

/// Flushes the trace file, reporting the first write error; draws --plot.
pub(crate) fn finish_trace(out: &mut Output) -> Result<()> {
    if let Some(mut w) = out.trace.take() {
        let path = out.trace_path.as_deref().unwrap_or(Path::new("trace"));
        if let Some(e) = out.error.take() {
            return Err(e).with_context(|| format!("cannot write trace file {}", path.display()));
        }
        w.flush()
            .with_context(|| format!("cannot write trace file {}", path.display()))?;
    }
    if let Some((path, trace)) = out.plot.take() {
        plot::draw(&trace, &path)?;
    }
    Ok(())
}

/// Writes to stdout; a reader that went away (`atou sim | head`) is not an error.
/// Set once this process's stdout carries the ssh tunnel's frames (the
/// far end of a copy that switched): nothing else may be written there.
pub(crate) static STDOUT_CARRIES_TUNNEL: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

pub(crate) fn print_stdout(text: &str) -> Result<()> {
    // The far end's report is not shown there anyway: the local end
    // reports what it received.
    if STDOUT_CARRIES_TUNNEL.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(e).context("cannot write to stdout"),
        _ => Ok(()),
    }
}

pub(crate) fn main() -> ExitCode {
    use clap::CommandFactory;
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let files = host_config::default_files();
    let (argv, from_files) = match host_config::prepare(Cli::command(), argv, &files) {
        Ok(host_config::Prepared::Args(argv, used)) => (argv, used),
        Ok(host_config::Prepared::Show(text)) => {
            return match print_stdout(&text) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("atou: {e:#}");
                    exit::Exit::Failed.into()
                }
            };
        }
        Err(e) => {
            eprintln!("atou: {e:#}");
            return exit::Exit::Usage.into();
        }
    };
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = print_stdout(&e.render().to_string());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // One line that names the offending flag or token.
            let text = e.render().to_string();
            let mut lines = text.lines().filter(|l| !l.trim().is_empty());
            let line = lines.next().unwrap_or("bad arguments");
            // "...were not provided:" names the flags on the next line.
            let more = match lines.next() {
                Some(next) if line.ends_with(':') => format!(" {}", next.trim()),
                _ => String::new(),
            };
            let blame = host_config::blame(&text, &from_files);
            eprintln!("atou: {}{more}{blame}", line.trim_start_matches("error: "));
            return exit::Exit::Usage.into();
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
        Command::Plot(args) => plot::plot(args),
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
        Command::Remote(args) => remote::remote(args),
        Command::CipherCost(args) => cipher_cost::cipher_cost(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("atou: {e:#}");
            exit::of_error(&e).into()
        }
    }
}

/// A mistake in what the user asked for (exit status 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub String);
