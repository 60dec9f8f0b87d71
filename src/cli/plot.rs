//! `atou plot`: a trace file in, an SVG of the run's graphs out.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use atou::trace::Trace;

use super::UsageError;

#[derive(Args, Debug)]
#[command(
    after_help = "Four panels, one above the other: the time-sequence graph as tcptrace \
    draws it (each segment sent, retransmissions as red triangles, the cumulative ACK, SACKed \
    ranges, the receive window's right edge); cwnd and ssthresh, with the pacing rate and \
    bandwidth estimate when the controller has them (BBR); RTT samples with srtt and RTO; \
    goodput per hundredth of the run. Traces written before the sack and state lines existed \
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
