//! `atou plot`: the graphs of a run, drawn from its trace as SVG.
//!
//! [`Series`] turns a [`Trace`] into what the graphs show, in numbers a
//! test can check against the trace; [`svg`] draws them with plotters'
//! SVG backend in four panels, one above the other:
//!
//! 1. the time-sequence graph as tcptrace draws it: each segment sent
//!    (seq against time), retransmissions marked apart, the cumulative ACK,
//!    the SACKed ranges and the receive window's right edge;
//! 2. cwnd and ssthresh, with the pacing rate and the bandwidth estimate on
//!    a second axis when the controller (BBR) has them;
//! 3. RTT samples with srtt and the RTO;
//! 4. goodput: payload acknowledged per time bin (a hundredth of the run,
//!    or a round trip if that is longer).

use std::collections::HashSet;
use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use thiserror::Error;

use crate::proto::events::{AckRecord, StateRecord};
use crate::proto::TraceRecord;
use crate::report::trace::Trace;

/// Goodput bins across the run, at most: a bin is never shorter than an RTT.
pub const GOODPUT_BINS: usize = 100;

/// Width and height of the whole picture, in pixels.
const SIZE: (u32, u32) = (1000, 1400);

/// Markers and line vertices are kept at most once per cell of a grid this
/// fine (about a pixel of a panel's plotting area), so a trace of a million
/// segments draws an SVG of the same size as one of a few thousand.
const GRID: (f64, f64) = (1000.0, 300.0);

/// Room above the data of the window and RTT panels, for their legends.
const LEGEND_ROOM: f64 = 0.35;

/// What the panels show, in the trace's units: times in seconds, segments
/// as numbered on the wire.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// First transmissions: (time, segment).
    pub sent: Vec<(f64, u64)>,
    /// Transmissions of a segment sent before.
    pub retransmitted: Vec<(f64, u64)>,
    /// Cumulative ACK after each ACK.
    pub acked: Vec<(f64, u64)>,
    /// SACK blocks: (time, first segment, one past the last).
    pub sacked: Vec<(f64, u64, u64)>,
    /// The receive window's right edge after each ACK.
    pub window_edge: Vec<(f64, u64)>,
    /// cwnd in segments after each ACK.
    pub cwnd: Vec<(f64, u64)>,
    /// ssthresh after each ACK, once it is finite.
    pub ssthresh: Vec<(f64, u64)>,
    /// Pacing rate, Mbit/s, when the controller paces.
    pub pacing_mbps: Vec<(f64, f64)>,
    /// Bandwidth estimate, Mbit/s, when the controller keeps one.
    pub bw_mbps: Vec<(f64, f64)>,
    /// RTT samples, milliseconds (ACKs without a sample left out).
    pub rtt_ms: Vec<(f64, f64)>,
    /// Smoothed RTT, milliseconds, once there is a sample.
    pub srtt_ms: Vec<(f64, f64)>,
    /// Retransmission timeout, milliseconds, backed off after a timeout.
    pub rto_ms: Vec<(f64, f64)>,
    /// Goodput per bin: (end of the bin, rate in `goodput_unit`).
    pub goodput: Vec<(f64, f64)>,
    /// `Mbit/s` when the trace's header gives the payload size, else
    /// `segments/s`.
    pub goodput_unit: &'static str,
    /// Bin width, seconds.
    pub bin: f64,
    /// First and last time in the trace.
    pub time: (f64, f64),
    /// Lowest and highest segment number sent, acknowledged or SACKed.
    pub seq: (u64, u64),
}

impl Series {
    /// The series of every panel, read from the trace's records in order.
    pub fn from_trace(trace: &Trace) -> Series {
        let mut s = Series::default();
        let mut next_new = 0;
        let (mut tmin, mut tmax) = (f64::INFINITY, f64::NEG_INFINITY);
        let (mut lo, mut hi) = (u64::MAX, 0);
        for r in &trace.records {
            let t = match *r {
                TraceRecord::Xmt { time, seg } => {
                    let t = time.as_secs_f64();
                    // As tcptrace: a segment at or below the highest sent
                    // so far is a retransmission.
                    if seg >= next_new {
                        next_new = seg.saturating_add(1);
                        s.sent.push((t, seg));
                    } else {
                        s.retransmitted.push((t, seg));
                    }
                    (lo, hi) = (lo.min(seg), hi.max(seg));
                    t
                }
                TraceRecord::Ack(ref ack) => {
                    (lo, hi) = (lo.min(ack.ack), hi.max(ack.ack));
                    s.add_ack(ack)
                }
                TraceRecord::Sack { time, start, end } => {
                    let t = time.as_secs_f64();
                    s.sacked.push((t, start, end));
                    (lo, hi) = (lo.min(start), hi.max(end));
                    t
                }
                TraceRecord::State(ref state) => s.add_state(state),
            };
            (tmin, tmax) = (tmin.min(t), tmax.max(t));
        }
        if tmin > tmax {
            (tmin, tmax) = (0.0, 0.0);
        }
        s.time = (tmin.min(0.0), tmax);
        s.seq = if lo > hi { (0, 0) } else { (lo, hi) };
        s.goodput(trace.payload_size());
        s
    }

    /// Adds an `ack` line's points to the acknowledged, window, threshold
    /// and RTT series; returns its time in seconds.
    fn add_ack(&mut self, ack: &AckRecord) -> f64 {
        let t = ack.time.as_secs_f64();
        self.acked.push((t, ack.ack));
        self.cwnd.push((t, ack.cwnd));
        // `u64::MAX` is the trace's `inf`: no threshold to draw yet.
        if ack.ssthresh != u64::MAX {
            self.ssthresh.push((t, ack.ssthresh));
        }
        // A zero RTT is the trace's "no sample".
        if !ack.rtt.is_zero() {
            self.rtt_ms.push((t, ack.rtt.as_secs_f64() * 1e3));
        }
        t
    }

    /// Adds a `state` line's points to the RTT, window-edge and rate
    /// series; returns its time in seconds.
    fn add_state(&mut self, state: &StateRecord) -> f64 {
        let t = state.time.as_secs_f64();
        // A zero srtt is the sender's "no sample yet".
        if !state.srtt.is_zero() {
            self.srtt_ms.push((t, state.srtt.as_secs_f64() * 1e3));
        }
        self.rto_ms.push((t, state.rto.as_secs_f64() * 1e3));
        self.window_edge.push((t, state.right_edge));
        if let Some(p) = state.pacing_bps {
            self.pacing_mbps.push((t, p as f64 / 1e6));
        }
        if let Some(b) = state.bw_bps {
            self.bw_mbps.push((t, b as f64 / 1e6));
        }
        t
    }

    /// Payload acknowledged per bin; Mbit/s when the payload size is known,
    /// else segments per second.
    fn goodput(&mut self, payload: Option<u64>) {
        let (t0, t1) = self.time;
        // A bin is at least a round trip (the least RTT sampled): a window
        // is acknowledged in bursts an RTT apart, which shorter bins show
        // as noise.
        let rtt = self
            .rtt_ms
            .iter()
            .map(|p| p.1 / 1e3)
            .fold(f64::INFINITY, f64::min);
        let rtt = if rtt.is_finite() { rtt } else { 0.0 };
        // Never longer than the run: the bins stay on the time axis.
        self.bin = ((t1 - t0) / GOODPUT_BINS as f64)
            .max(rtt.min(t1 - t0))
            .max(1e-3);
        let (scale, unit) = match payload {
            Some(p) => (p as f64 * 8.0 / 1e6, "Mbit/s"),
            None => (1.0, "segments/s"),
        };
        self.goodput_unit = unit;
        // Less a hair, so that rounding makes no empty bin past the end.
        let bins = ((t1 - t0) / self.bin - 1e-6).ceil().max(1.0) as usize;
        let mut acked = self.acked.iter().peekable();
        // Everything acknowledged counts, from the first segment on.
        let mut base = self.seq.0;
        let mut high = base;
        for i in 0..bins {
            let end = t0 + (i + 1) as f64 * self.bin;
            while let Some(&&(t, ack)) = acked.peek() {
                // The last bin takes what is left, whatever rounding did.
                if t > end && i + 1 < bins {
                    break;
                }
                high = high.max(ack);
                acked.next();
            }
            let segs = (high - base) as f64;
            self.goodput.push((end, segs * scale / self.bin));
            base = high;
        }
    }
}

/// Why a plot was not made.
#[derive(Debug, Error)]
pub enum PlotError {
    /// The drawing backend failed; its message.
    #[error("cannot draw the plot: {0}")]
    Draw(String),
    /// The SVG could not be written.
    #[error("cannot write the plot {path}: {error}")]
    Write {
        /// The file it was written to.
        path: String,
        /// What the write returned.
        error: std::io::Error,
    },
}

fn draw_err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// A title from the trace's header: what ran, over which paths, with which
/// recovery and controller.
pub fn title(trace: &Trace) -> String {
    let mut parts: Vec<String> = trace
        .header
        .iter()
        .filter(|h| !crate::report::trace::is_bookkeeping(h))
        .cloned()
        .collect();
    if let Some(t) = trace.tuning() {
        parts.push(format!("recovery {} cc {}", t.recovery, t.cc));
    }
    if parts.is_empty() {
        "atou trace".to_string()
    } else {
        parts.join("; ")
    }
}

/// Draws `trace` and writes the SVG to `path`.
pub fn write_svg(trace: &Trace, title: &str, path: &Path) -> Result<(), PlotError> {
    let text = svg(&Series::from_trace(trace), title)?;
    std::fs::write(path, text).map_err(|error| PlotError::Write {
        path: path.display().to_string(),
        error,
    })
}

/// The SVG of the four panels under `title`.
pub fn svg(s: &Series, title: &str) -> Result<String, PlotError> {
    let mut buf = String::new();
    {
        let root = SVGBackend::with_string(&mut buf, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let root = root.titled(title, ("sans-serif", 18)).map_err(draw_err)?;
        let panels = root.split_evenly((4, 1));
        sequence_panel(&panels[0], s)?;
        window_panel(&panels[1], s)?;
        rtt_panel(&panels[2], s)?;
        goodput_panel(&panels[3], s)?;
        root.present().map_err(draw_err)?;
    }
    Ok(buf)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// A range that plotters can draw: not empty, with a little room above.
fn span(lo: f64, hi: f64) -> std::ops::Range<f64> {
    span_with(lo, hi, 0.04)
}

/// As [`span`], with `room` (a fraction of the range) above the data: the
/// legend of a panel whose data may fill its top sits there.
fn span_with(lo: f64, hi: f64, room: f64) -> std::ops::Range<f64> {
    // A single value gets a range around it that floats can tell apart.
    let hi = if hi > lo {
        hi
    } else {
        lo + (lo.abs() * 1e-6).max(1.0)
    };
    lo..hi + (hi - lo) * room
}

/// Points thinned to one a grid cell (see [`GRID`]), in order.
fn thin_points(
    points: impl Iterator<Item = (f64, f64)>,
    x: (f64, f64),
    y: (f64, f64),
) -> Vec<(f64, f64)> {
    let mut seen = HashSet::new();
    let (dx, dy) = ((x.1 - x.0).max(1e-9), (y.1 - y.0).max(1e-9));
    points
        .filter(|&(px, py)| {
            let cell = (
                ((px - x.0) / dx * GRID.0) as i64,
                ((py - y.0) / dy * GRID.1) as i64,
            );
            seen.insert(cell)
        })
        .collect()
}

/// A line thinned to its first, lowest, highest and last vertex in each
/// grid column, in time order, so its envelope survives.
fn thin_line(points: &[(f64, f64)], x: (f64, f64)) -> Vec<(f64, f64)> {
    let dx = (x.1 - x.0).max(1e-9);
    let column = |p: &(f64, f64)| ((p.0 - x.0) / dx * GRID.0) as i64;
    let mut out = Vec::new();
    for group in points.chunk_by(|a, b| column(a) == column(b)) {
        let by_value =
            |a: &(usize, &(f64, f64)), b: &(usize, &(f64, f64))| a.1 .1.total_cmp(&b.1 .1);
        let lowest = group.iter().enumerate().min_by(by_value).map_or(0, |p| p.0);
        let highest = group.iter().enumerate().max_by(by_value).map_or(0, |p| p.0);
        let mut keep = vec![0, lowest, highest, group.len() - 1];
        keep.sort_unstable();
        keep.dedup();
        out.extend(keep.into_iter().map(|i| group[i]));
    }
    out
}

/// A thinned line drawn as steps: each value holds until the next one, as
/// the sender's variables do between the ACKs that change them.
fn step_line(points: &[(f64, f64)], x: (f64, f64)) -> Vec<(f64, f64)> {
    steps(&thin_line(points, x))
}

fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &p) in points.iter().enumerate() {
        if let Some(&prev) = i.checked_sub(1).map(|j| &points[j]) {
            out.push((p.0, prev.1));
        }
        out.push(p);
    }
    out
}

fn as_f64(points: &[(f64, u64)]) -> Vec<(f64, f64)> {
    points.iter().map(|&(t, v)| (t, v as f64)).collect()
}

fn swatch(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
}

const SENT: RGBColor = RGBColor(0, 70, 200);
const RXMT: RGBColor = RGBColor(220, 0, 0);
const ACKED: RGBColor = RGBColor(0, 150, 0);
const SACKED: RGBColor = RGBColor(160, 0, 200);
const EDGE: RGBColor = RGBColor(210, 160, 0);
const GREY: RGBColor = RGBColor(110, 110, 110);

fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> Result<(), PlotError> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(GREY)
        .label_font(("sans-serif", 12))
        .draw()
        .map_err(draw_err)
}

/// A panel's chart builder: its caption, and room for its axes' labels.
fn panel_chart<'a, 'b, 'c>(
    area: &'a Area<'c>,
    caption: impl AsRef<str>,
) -> ChartBuilder<'a, 'b, SVGBackend<'c>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(64);
    builder
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// How a panel's y axis writes its values.
enum Labels {
    /// Counts (segments): no fraction.
    Whole,
    /// plotters' own format.
    Plain,
}

/// A panel's grid, with time along x and `y_desc` up the side.
fn draw_mesh(chart: &mut Chart, y_desc: &str, labels: Labels) -> Result<(), PlotError> {
    fn whole(v: &f64) -> String {
        format!("{v:.0}")
    }
    let mut mesh = chart.configure_mesh();
    mesh.x_desc("time (s)")
        .y_desc(y_desc)
        .light_line_style(WHITE);
    if let Labels::Whole = labels {
        mesh.y_label_formatter(&whole);
    }
    mesh.draw().map_err(draw_err)
}

/// `points` drawn as steps (see [`step_line`]) and named in the legend.
fn draw_steps(
    chart: &mut Chart,
    points: &[(f64, f64)],
    x: (f64, f64),
    color: RGBColor,
    width: u32,
    label: impl Into<String>,
) -> Result<(), PlotError> {
    chart
        .draw_series(LineSeries::new(
            step_line(points, x),
            color.stroke_width(width),
        ))
        .map_err(draw_err)?
        .label(label)
        .legend(swatch(color));
    Ok(())
}

fn sequence_panel(area: &Area, s: &Series) -> Result<(), PlotError> {
    let x = span(s.time.0, s.time.1);
    // The receive window's edge usually lies a whole buffer above what was
    // sent: the axis takes it in only when that costs at most half again.
    let edge_high = s.window_edge.iter().map(|e| e.1).max();
    let seq_len = s.seq.1 - s.seq.0;
    let edge_fits = edge_high.is_some_and(|e| e <= s.seq.1.saturating_add(seq_len / 2));
    let top = match edge_high {
        Some(e) if edge_fits => e.max(s.seq.1),
        _ => s.seq.1,
    };
    let y = span(s.seq.0 as f64, top as f64);
    let (xr, yr) = ((x.start, x.end), (y.start, y.end));
    let mut chart = panel_chart(area, "time-sequence graph")
        .build_cartesian_2d(x, y)
        .map_err(draw_err)?;
    draw_mesh(&mut chart, "segment", Labels::Whole)?;
    match edge_high {
        Some(_) if edge_fits => {
            draw_steps(
                &mut chart,
                &as_f64(&s.window_edge),
                xr,
                EDGE,
                1,
                "receive window edge",
            )?;
        }
        Some(e) => {
            // Named in the legend, not drawn.
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                .map_err(draw_err)?
                .label(format!("receive window edge: above, up to {e}"))
                .legend(swatch(EDGE));
        }
        None => {}
    }
    if !s.sacked.is_empty() {
        let mut seen = HashSet::new();
        let row = |seg: u64| ((seg as f64 - yr.0) / (yr.1 - yr.0) * GRID.1) as i64;
        let blocks = s.sacked.iter().filter(|&&(t, a, b)| {
            let cell = (((t - xr.0) / (xr.1 - xr.0) * GRID.0) as i64, row(a), row(b));
            seen.insert(cell)
        });
        chart
            .draw_series(blocks.map(|&(t, a, b)| {
                PathElement::new(vec![(t, a as f64), (t, b as f64)], SACKED.stroke_width(1))
            }))
            .map_err(draw_err)?
            .label("SACKed")
            .legend(swatch(SACKED));
    }
    draw_steps(
        &mut chart,
        &as_f64(&s.acked),
        xr,
        ACKED,
        1,
        "cumulative ACK",
    )?;
    let sent = thin_points(as_f64(&s.sent).into_iter(), xr, yr);
    chart
        .draw_series(sent.into_iter().map(|p| Circle::new(p, 1, SENT.filled())))
        .map_err(draw_err)?
        .label("sent")
        .legend(|(x, y)| Circle::new((x + 9, y), 3, SENT.filled()));
    // Every retransmission gets its own marker: they are what one looks for.
    chart
        .draw_series(
            s.retransmitted
                .iter()
                .map(|&(t, seg)| TriangleMarker::new((t, seg as f64), 4, RXMT.filled())),
        )
        .map_err(draw_err)?
        .label(format!("retransmitted ({})", s.retransmitted.len()))
        .legend(|(x, y)| Rectangle::new([(x + 5, y - 3), (x + 12, y + 4)], RXMT.filled()));
    legend(&mut chart)
}

fn window_panel(area: &Area, s: &Series) -> Result<(), PlotError> {
    let x = span(s.time.0, s.time.1);
    let xr = (x.start, x.end);
    let high = s
        .cwnd
        .iter()
        .chain(&s.ssthresh)
        .map(|p| p.1)
        .max()
        .unwrap_or(0);
    let rates = !s.pacing_mbps.is_empty() || !s.bw_mbps.is_empty();
    let rate_high = s
        .pacing_mbps
        .iter()
        .chain(&s.bw_mbps)
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let mut chart = panel_chart(area, "congestion window")
        .right_y_label_area_size(if rates { 64 } else { 0 })
        .build_cartesian_2d(x.clone(), span_with(0.0, high as f64, LEGEND_ROOM))
        .map_err(draw_err)?
        .set_secondary_coord(x, span_with(0.0, rate_high, LEGEND_ROOM));
    draw_mesh(&mut chart, "segments", Labels::Whole)?;
    draw_steps(&mut chart, &as_f64(&s.cwnd), xr, SENT, 1, "cwnd")?;
    if !s.ssthresh.is_empty() {
        draw_steps(&mut chart, &as_f64(&s.ssthresh), xr, RXMT, 1, "ssthresh")?;
    }
    if rates {
        chart
            .configure_secondary_axes()
            .y_desc("Mbit/s")
            .draw()
            .map_err(draw_err)?;
        for (points, name, color) in [
            (&s.pacing_mbps, "pacing rate (Mbit/s)", ACKED),
            (&s.bw_mbps, "bandwidth estimate (Mbit/s)", SACKED),
        ] {
            if points.is_empty() {
                continue;
            }
            chart
                .draw_secondary_series(LineSeries::new(
                    step_line(points, xr),
                    color.stroke_width(1),
                ))
                .map_err(draw_err)?
                .label(name)
                .legend(swatch(color));
        }
    }
    legend(&mut chart)
}

fn rtt_panel(area: &Area, s: &Series) -> Result<(), PlotError> {
    let x = span(s.time.0, s.time.1);
    let xr = (x.start, x.end);
    let seen = s
        .rtt_ms
        .iter()
        .chain(&s.srtt_ms)
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let rto = s.rto_ms.iter().map(|p| p.1).fold(0.0, f64::max);
    // A backed-off RTO (up to max_rto) would flatten the samples: the axis
    // stops at four times the largest RTT and the RTO is drawn along it.
    let top = if seen > 0.0 {
        rto.min(4.0 * seen).max(seen)
    } else {
        rto
    };
    let y = span_with(0.0, top, LEGEND_ROOM);
    let yr = (y.start, y.end);
    let mut chart = panel_chart(area, "round-trip time")
        .build_cartesian_2d(x, y)
        .map_err(draw_err)?;
    draw_mesh(&mut chart, "ms", Labels::Plain)?;
    let samples = thin_points(s.rtt_ms.iter().copied(), xr, yr);
    chart
        .draw_series(
            samples
                .into_iter()
                .map(|p| Circle::new(p, 1, SENT.filled())),
        )
        .map_err(draw_err)?
        .label("RTT sample")
        .legend(|(x, y)| Circle::new((x + 9, y), 3, SENT.filled()));
    if !s.srtt_ms.is_empty() {
        draw_steps(&mut chart, &s.srtt_ms, xr, ACKED, 2, "srtt")?;
    }
    if !s.rto_ms.is_empty() {
        let rto: Vec<(f64, f64)> = s.rto_ms.iter().map(|&(t, r)| (t, r.min(yr.1))).collect();
        draw_steps(&mut chart, &rto, xr, RXMT, 1, "RTO")?;
    }
    legend(&mut chart)
}

fn goodput_panel(area: &Area, s: &Series) -> Result<(), PlotError> {
    let x = span(s.time.0, s.time.1);
    let high = s.goodput.iter().map(|p| p.1).fold(0.0, f64::max);
    let mut chart = panel_chart(area, format!("goodput (per {:.3} s)", s.bin))
        .build_cartesian_2d(x, span(0.0, high))
        .map_err(draw_err)?;
    draw_mesh(&mut chart, s.goodput_unit, Labels::Plain)?;
    // Each bin's rate held across the bin, as a step.
    let steps = s
        .goodput
        .iter()
        .flat_map(|&(end, v)| [(end - s.bin, v), (end, v)]);
    chart
        .draw_series(LineSeries::new(steps, SENT.stroke_width(1)))
        .map_err(draw_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thin_line_keeps_each_columns_extremes_in_order() {
        // 10 000 points in one grid column of a 0..1000 s axis: at most
        // four survive, the first, the last, a lowest and a highest, in
        // time order.
        let pts: Vec<(f64, f64)> = (0..10_000)
            .map(|i| (i as f64 * 1e-5, ((i * 7919 + 500) % 1000) as f64))
            .collect();
        let thin = thin_line(&pts, (0.0, 1000.0));
        assert!(thin.len() <= 4, "{thin:?}");
        assert_eq!(thin.first(), pts.first());
        assert_eq!(thin.last(), pts.last());
        assert!(thin.iter().any(|p| p.1 == 0.0) && thin.iter().any(|p| p.1 == 999.0));
        assert!(thin.windows(2).all(|w| w[0].0 < w[1].0));
        // Points in different columns are all kept.
        let spread: Vec<(f64, f64)> = (0..100).map(|i| (i as f64, i as f64)).collect();
        assert_eq!(thin_line(&spread, (0.0, 100.0)), spread);
    }

    /// What a fuzzer would try first: the extremes of every field, and a
    /// trace of one record, draw without panicking.
    #[test]
    fn extreme_traces_draw() {
        let max = u64::MAX;
        for text in [
            format!("0 {max} xmt\n0 {max} xmt\n1e9 0 xmt\n"),
            format!("5 {max} 1e9 {max} {max} ack\n5 0 {max} sack\n"),
            format!("1 1e12 1e12 {max} {max} {max} state\n"),
            "0 0 xmt\n".to_string(),
            "0.000001 3 0.000001 0 0 ack\n".to_string(),
        ] {
            let trace = Trace::parse(&text).unwrap();
            let s = Series::from_trace(&trace);
            let svg = svg(&s, &title(&trace)).unwrap();
            assert!(svg.starts_with("<svg"), "{text}");
        }
    }

    #[test]
    fn steps_hold_each_value_until_the_next() {
        let pts = [(0.0, 1.0), (1.0, 5.0), (3.0, 2.0)];
        assert_eq!(
            steps(&pts),
            vec![(0.0, 1.0), (1.0, 1.0), (1.0, 5.0), (3.0, 5.0), (3.0, 2.0)]
        );
        assert!(steps(&[]).is_empty());
    }

    #[test]
    fn goodput_bins_add_up_to_what_was_acknowledged() {
        let text =
            "# config: mss 1025\n0 0 xmt\n0.5 10 0.001 10 inf ack\n1.0 25 0.001 10 inf ack\n";
        let s = Series::from_trace(&Trace::parse(text).unwrap());
        assert_eq!(s.goodput.len(), GOODPUT_BINS);
        assert_eq!(s.goodput_unit, "Mbit/s");
        // 25 segments of 1000 bytes (1025 - 25 header) in all.
        let bits: f64 = s.goodput.iter().map(|g| g.1 * 1e6 * s.bin).sum();
        assert!((bits - 25.0 * 8000.0).abs() < 1e-6, "{bits}");
    }
}
