//! `atou plot`: a trace file in, an SVG of the run's graphs out.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::{anyhow, Result};
use clap::Args;

use crate::proto::TraceRecord;
use crate::report::summary::config_lines;
use crate::report::trace::{parse_record, Trace};
use crate::transfer::send::{SendConfig, TraceSink};

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
pub(super) struct PlotArgs {
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

pub(super) fn plot(args: PlotArgs) -> Result<ExitCode> {
    let trace = Trace::read(&args.trace).map_err(|e| match e {
        crate::report::trace::TraceError::Read { .. } => UsageError(e.to_string()),
        _ => UsageError(format!("{}: {e}", args.trace.display())),
    })?;
    let out = args.out.unwrap_or_else(|| args.trace.with_extension("svg"));
    let title = args
        .title
        .unwrap_or_else(|| crate::report::plot::title(&trace));
    crate::report::plot::write_svg(&trace, &title, &out)?;
    Ok(ExitCode::SUCCESS)
}

/// `--plot FILE` at the end of a run.
pub(crate) fn draw(trace: &Trace, path: &Path) -> Result<()> {
    crate::report::plot::write_svg(trace, &crate::report::plot::title(trace), path)?;
    Ok(())
}

/// `atou send --trace FILE --plot FILE`: the data connections' traces.
#[derive(Args, Debug)]
pub(crate) struct SendOutputArgs {
    /// Write the packet trace of each data stream to FILE, as `atou sim --trace`
    /// (with --streams above 1: FILE.s1, FILE.s2, ...; a repair round's: FILE.s1.r2)
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// At the end, draw each data stream's graphs into FILE (SVG), named as for --trace
    /// (keeps the trace in memory meanwhile, some 150 bytes per segment)
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

/// What the connections of a send left for the end: the traces to draw and
/// the first error in writing one.
#[derive(Default)]
pub(crate) struct SendTraces {
    plots: Mutex<Vec<(PathBuf, Trace)>>,
    error: Mutex<Option<anyhow::Error>>,
}

impl SendOutputArgs {
    /// With --trace or --plot: the sink the send's data connections write
    /// through, and what they leave for [`SendTraces::finish`].
    pub(crate) fn sink(&self, config: &SendConfig) -> Option<(TraceSink, Arc<SendTraces>)> {
        if self.trace.is_none() && self.plot.is_none() {
            return None;
        }
        let left = Arc::new(SendTraces::default());
        let (trace, plot) = (self.trace.clone(), self.plot.clone());
        let streams = config.streams;
        let what = format!("send to {} ({})", config.host, config.peer);
        let knobs = config_lines(&config.tuning);
        let payload =
            crate::report::trace::payload_line(crate::proto::endpoint::client::segment_payload(
                &config.tuning,
                config.auth.as_ref().map(|a| a.cipher),
            ));
        let shared = left.clone();
        let sink = TraceSink(Arc::new(move |round, stream| {
            let several = streams > 1 || round > 1;
            let mut header = vec![
                crate::report::trace::FORMAT_LINE.to_string(),
                format!(
                    "atou {} {what} stream {stream} round {round}",
                    env!("CARGO_PKG_VERSION")
                ),
            ];
            header.push(payload.clone());
            header.extend(knobs.iter().cloned());
            let mut conn = ConnTrace {
                file: None,
                plot: plot.as_ref().map(|p| {
                    let kept = Trace {
                        header: header.clone(),
                        records: Vec::new(),
                    };
                    (per_conn(p, round, stream, several), kept)
                }),
                left: shared.clone(),
            };
            if let Some(path) = &trace {
                let path = per_conn(path, round, stream, several);
                match super::create_trace(&path, &header) {
                    Ok(w) => conn.file = Some((path, w)),
                    Err(e) => conn.fail(e),
                }
            }
            Box::new(move |r| conn.take(r))
        }));
        Some((sink, left))
    }
}

impl SendTraces {
    /// Draws the plots; reports the first error in writing a trace.
    pub(crate) fn finish(&self) -> Result<()> {
        if let Some(e) = self.error.lock().expect("trace lock").take() {
            return Err(e);
        }
        let plots = std::mem::take(&mut *self.plots.lock().expect("trace lock"));
        for (path, trace) in &plots {
            draw(trace, path)?;
        }
        Ok(())
    }
}

/// One data connection's trace file, and its records kept for --plot.
struct ConnTrace {
    file: Option<(PathBuf, BufWriter<File>)>,
    plot: Option<(PathBuf, Trace)>,
    left: Arc<SendTraces>,
}

impl ConnTrace {
    fn take(&mut self, r: &TraceRecord) {
        let line = r.to_string();
        if let Some((path, w)) = &mut self.file {
            if let Err(e) = writeln!(w, "{line}") {
                let e = anyhow!("cannot write trace file {}: {e}", path.display());
                self.file = None;
                self.fail(e);
            }
        }
        if let Some((_, kept)) = &mut self.plot {
            // As the file holds it, as --plot on sim and probe.
            if let Ok(Some(r)) = parse_record(&line) {
                kept.records.push(r);
            }
        }
    }

    fn fail(&self, e: anyhow::Error) {
        self.left.error.lock().expect("trace lock").get_or_insert(e);
    }
}

impl Drop for ConnTrace {
    /// The connection ended: the file flushed, the records left to draw.
    fn drop(&mut self) {
        if let Some((path, mut w)) = self.file.take() {
            if let Err(e) = w.flush() {
                self.fail(anyhow!("cannot write trace file {}: {e}", path.display()));
            }
        }
        if let Some(plot) = self.plot.take() {
            self.left.plots.lock().expect("trace lock").push(plot);
        }
    }
}

/// `run.svg` for the only connection; `run.s2.svg` for stream 2, and
/// `run.s1.r2.svg` for stream 1 of a second round, when there may be several.
fn per_conn(path: &Path, round: usize, stream: usize, several: bool) -> PathBuf {
    if !several {
        return path.to_path_buf();
    }
    let mut tag = format!("s{stream}");
    if round > 1 {
        tag += &format!(".r{round}");
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{tag}"),
    };
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connections_files_are_numbered_only_when_there_may_be_several() {
        let p = Path::new("/tmp/run.svg");
        assert_eq!(per_conn(p, 1, 1, false), p);
        assert_eq!(per_conn(p, 1, 2, true), Path::new("/tmp/run.s2.svg"));
        assert_eq!(per_conn(p, 2, 1, true), Path::new("/tmp/run.s1.r2.svg"));
        assert_eq!(
            per_conn(Path::new("t"), 1, 3, true),
            Path::new("t.s3"),
            "no extension"
        );
    }
}
