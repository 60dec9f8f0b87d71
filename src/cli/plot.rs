//! `atou plot`: a trace file in, an SVG of the run's graphs out.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use clap::Args;

use atou::summary::config_lines;
use atou::trace::Trace;
use atou::transfer::send::{ConnTrace, SendConfig, TraceSink};

use super::UsageError;

#[derive(Args, Debug)]
#[command(
    after_help = "Four panels, one above the other: the time-sequence graph as tcptrace \
    draws it (each segment sent, retransmissions as red triangles, the cumulative ACK, SACKed \
    ranges, the receive window's right edge); cwnd and ssthresh, with the pacing rate and \
    bandwidth estimate when the controller has them (BBR); RTT samples with srtt and RTO; \
    goodput per hundredth of the run or per round trip if longer. Traces written before the sack and state lines existed \
    plot without those series. See docs/plots.md.\n\n\
    Example: atou sim --bytes 1MB --recovery newreno --trace run.trace && atou plot run.trace --out run.svg\n\
    Example: atou sim --bytes 1MB --plot run.svg"
)]
pub struct PlotArgs {
    /// A trace written by --trace (sim, probe)
    #[arg(value_name = "TRACE")]
    trace: PathBuf,
    /// The SVG file to write [default: TRACE with .svg]
    #[arg(long, short, value_name = "FILE")]
    out: Option<PathBuf>,
    /// The title above the graphs [default: what ran, from the trace's header]
    #[arg(long, value_name = "TEXT")]
    title: Option<String>,
}

pub fn plot(args: PlotArgs) -> Result<ExitCode> {
    let trace = Trace::read(&args.trace).map_err(|e| match e {
        atou::trace::TraceError::Read { .. } => UsageError(e.to_string()),
        _ => UsageError(format!("{}: {e}", args.trace.display())),
    })?;
    let out = args.out.unwrap_or_else(|| args.trace.with_extension("svg"));
    let title = args.title.unwrap_or_else(|| atou::plot::title(&trace));
    atou::plot::write_svg(&trace, &title, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// `--plot FILE` at the end of a run.
pub(crate) fn draw(trace: &Trace, path: &Path) -> Result<()> {
    atou::plot::write_svg(trace, &atou::plot::title(trace), path)?;
    Ok(())
}

/// `atou send --trace FILE --plot FILE`: the data connections' traces.
#[derive(Args, Debug)]
pub(crate) struct SendOutputArgs {
    /// Write the packet trace of each data stream to FILE, as `atou sim --trace`
    /// (with several streams or rounds: FILE.s2 for stream 2, FILE.s1.r2 for a second round)
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// At the end, draw each data stream's graphs into FILE (SVG), named as for --trace
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

impl SendOutputArgs {
    /// Where the send records its traces, if either flag asks for them.
    pub(crate) fn sink(&self) -> Option<TraceSink> {
        (self.trace.is_some() || self.plot.is_some()).then(|| Arc::new(Mutex::new(Vec::new())))
    }

    /// Writes the traces and plots of the connections `config`'s sink holds.
    pub(crate) fn write(&self, config: &SendConfig) -> Result<()> {
        let Some(sink) = &config.trace else {
            return Ok(());
        };
        let mut conns = std::mem::take(&mut *sink.lock().expect("trace lock"));
        conns.sort_by_key(|c| (c.round, c.stream));
        let several = conns.len() > 1;
        for conn in &conns {
            let trace = Trace {
                header: header(config, conn),
                records: conn.records.clone(),
            };
            if let Some(path) = &self.trace {
                let path = per_conn(path, conn, several);
                let mut w = super::create_trace(&path, &trace.header)?;
                for r in &trace.records {
                    writeln!(w, "{r}")
                        .with_context(|| format!("cannot write trace file {}", path.display()))?;
                }
                w.flush()
                    .with_context(|| format!("cannot write trace file {}", path.display()))?;
            }
            if let Some(path) = &self.plot {
                // Drawn from the records as the file holds them, as --plot
                // on sim and probe.
                let lines: String = trace.records.iter().map(|r| format!("{r}\n")).collect();
                let kept = Trace {
                    header: trace.header.clone(),
                    records: Trace::parse(&lines).map(|t| t.records).unwrap_or_default(),
                };
                draw(&kept, &per_conn(path, conn, several))?;
            }
        }
        Ok(())
    }
}

/// The header of a send's trace: what ran, then every knob.
fn header(config: &SendConfig, conn: &ConnTrace) -> Vec<String> {
    let mut header = vec![
        atou::trace::FORMAT_LINE.to_string(),
        format!(
            "atou {} send to {} ({}) stream {} round {}",
            env!("CARGO_PKG_VERSION"),
            config.host,
            config.peer,
            conn.stream,
            conn.round
        ),
    ];
    header.extend(config_lines(&config.tuning));
    header
}

/// `run.svg` for the only connection; `run.s2.svg` for stream 2, and
/// `run.s1.r2.svg` for stream 1 of a second round, when there are several.
fn per_conn(path: &Path, conn: &ConnTrace, several: bool) -> PathBuf {
    if !several {
        return path.to_path_buf();
    }
    let mut tag = format!("s{}", conn.stream);
    if conn.round > 1 {
        tag += &format!(".r{}", conn.round);
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{tag}"),
    };
    path.with_file_name(name)
}
