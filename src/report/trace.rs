//! Reads atou's packet trace back: the one parser of the `--trace` format
//! that [`crate::proto::TraceRecord`] writes (`atou plot` and the tests use
//! it).
//!
//! A trace is `#` header lines (what ran, then every knob as `config:`
//! pairs) and one record a line, tagged by its last word: `xmt`, `ack`,
//! `sack`, `state`. Lines with another tag are skipped, so a reader of
//! today reads the traces of a later release that adds a record.

use std::io::BufRead;
use std::path::Path;
use std::time::Duration;

use thiserror::Error;

use crate::proto::events::{AckRecord, StateRecord};
use crate::proto::{TraceRecord, Tuning};

/// The first header line of every trace file: what its lines are.
pub const FORMAT_LINE: &str = "atou trace: `time seg xmt` per transmission, \
    `time ack rtt cwnd ssthresh ack` per ACK, before it `time start end sack` per SACK block \
    and `time srtt rto edge pacing bw state`";

const PAYLOAD_PREFIX: &str = "payload:";

/// The header line saying how many stream bytes one data segment of the
/// traced connection carries (`payload: N`), which its `mss` alone does
/// not tell once packets are protected:
/// the client's `segment_payload`.
pub fn payload_line(payload: u64) -> String {
    format!("{PAYLOAD_PREFIX} {payload}")
}

/// Header lines that are for readers, not for a person: the format, the
/// knobs, the payload size.
pub fn is_bookkeeping(header_line: &str) -> bool {
    header_line == FORMAT_LINE
        || header_line.starts_with("config:")
        || header_line.starts_with(PAYLOAD_PREFIX)
}

/// A trace read from a file or recorded by a run.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The header lines, without their `# `.
    pub header: Vec<String>,
    pub records: Vec<TraceRecord>,
}

#[derive(Debug, Error)]
pub enum TraceError {
    #[error("cannot read trace {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("line {line}: {why}: `{text}`")]
    Line {
        line: usize,
        text: String,
        why: RecordError,
    },
    #[error("no trace records (`time seg xmt`, `time ack rtt cwnd ssthresh ack`) in it")]
    Empty,
}

impl Trace {
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let file = std::fs::File::open(path).map_err(|error| TraceError::Read {
            path: path.display().to_string(),
            error,
        })?;
        // Line by line: a long run's trace is not held twice.
        Trace::from_lines(std::io::BufReader::new(file).lines(), path)
    }

    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        Trace::from_lines(text.lines().map(|l| Ok(l.to_string())), Path::new(""))
    }

    /// `path` names the source in a read error.
    fn from_lines(
        lines: impl Iterator<Item = std::io::Result<String>>,
        path: &Path,
    ) -> Result<Trace, TraceError> {
        let mut trace = Trace::default();
        for (i, line) in lines.enumerate() {
            let line = line.map_err(|error| TraceError::Read {
                path: path.display().to_string(),
                error,
            })?;
            let line = line.trim();
            if let Some(h) = line.strip_prefix('#') {
                trace.header.push(h.trim().to_string());
                continue;
            }
            if line.is_empty() {
                continue;
            }
            match parse_record(line) {
                Ok(Some(r)) => trace.records.push(r),
                Ok(None) => {}
                Err(why) => {
                    return Err(TraceError::Line {
                        line: i + 1,
                        text: line.chars().take(80).collect(),
                        why,
                    })
                }
            }
        }
        if trace.records.is_empty() {
            return Err(TraceError::Empty);
        }
        Ok(trace)
    }

    /// The tuning the header records (`config:` lines), over the defaults
    /// for any knob it does not name; `None` without `config:` lines.
    pub fn tuning(&self) -> Option<Tuning> {
        let mut tuning = Tuning::default();
        let mut any = false;
        for line in &self.header {
            let Some(pairs) = line.strip_prefix("config:") else {
                continue;
            };
            let words: Vec<&str> = pairs.split_whitespace().collect();
            for kv in words.chunks(2) {
                if let [key, value] = kv {
                    // A knob this release no longer knows: keep the default.
                    any |= tuning.set(key, value).is_ok();
                }
            }
        }
        any.then_some(tuning)
    }

    /// Payload bytes per segment: the header's `payload:` line, or, in a
    /// trace written before it existed, the header's `mss` less the data
    /// header (right for plain connections; a protected one carries
    /// [`crate::proto::crypto::frame::overhead`] less).
    pub fn payload_size(&self) -> Option<u64> {
        let said = self.header.iter().find_map(|h| {
            h.strip_prefix(PAYLOAD_PREFIX)
                .and_then(|n| n.trim().parse::<u64>().ok())
                .filter(|&n| n > 0)
        });
        said.or_else(|| self.tuning().map(|t| t.payload_size() as u64))
    }
}

/// Why one record line does not read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    /// `fields` counts the tag too, as a person counts the line's words.
    #[error("a `{tag}` line has {want} fields, not {got}")]
    FieldCount {
        tag: String,
        want: usize,
        got: usize,
    },
    #[error("an empty SACK block {start}..{end}")]
    EmptySack { start: u64, end: u64 },
    #[error("`{0}` is not a whole number")]
    NotAWholeNumber(String),
    #[error("`{0}` is not a time in seconds")]
    NotSeconds(String),
}

/// One record line; `Ok(None)` for a tag this release does not know.
pub fn parse_record(line: &str) -> Result<Option<TraceRecord>, RecordError> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&tag, fields)) = words.split_last() else {
        return Ok(None);
    };
    let want = |n: usize| {
        if fields.len() == n {
            Ok(())
        } else {
            Err(RecordError::FieldCount {
                tag: tag.to_string(),
                want: n + 1,
                got: fields.len() + 1,
            })
        }
    };
    let time = || secs(fields[0]);
    let record = match tag {
        "xmt" => {
            want(2)?;
            TraceRecord::Xmt {
                time: time()?,
                seg: int(fields[1])?,
            }
        }
        "ack" => {
            want(5)?;
            TraceRecord::Ack(AckRecord {
                time: time()?,
                ack: int(fields[1])?,
                rtt: secs(fields[2])?,
                cwnd: int(fields[3])?,
                ssthresh: match fields[4] {
                    "inf" => u64::MAX,
                    s => int(s)?,
                },
            })
        }
        "sack" => {
            want(3)?;
            let (start, end) = (int(fields[1])?, int(fields[2])?);
            if end <= start {
                return Err(RecordError::EmptySack { start, end });
            }
            TraceRecord::Sack {
                time: time()?,
                start,
                end,
            }
        }
        "state" => {
            want(6)?;
            let rate = |s: &str| match s {
                "-" => Ok(None),
                s => int(s).map(Some),
            };
            TraceRecord::State(StateRecord {
                time: time()?,
                srtt: secs(fields[1])?,
                rto: secs(fields[2])?,
                right_edge: int(fields[3])?,
                pacing_bps: rate(fields[4])?,
                bw_bps: rate(fields[5])?,
            })
        }
        _ => return Ok(None),
    };
    Ok(Some(record))
}

fn int(s: &str) -> Result<u64, RecordError> {
    s.parse()
        .map_err(|_| RecordError::NotAWholeNumber(s.to_string()))
}

fn secs(s: &str) -> Result<Duration, RecordError> {
    s.parse::<f64>()
        .ok()
        .and_then(|v| Duration::try_from_secs_f64(v).ok())
        .ok_or_else(|| RecordError::NotSeconds(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every record reads back as it was written: Display and the parser
    /// agree (times to the microsecond, as written).
    #[test]
    fn every_record_reads_back_as_written() {
        let t = Duration::from_micros(1_234_567);
        let records = [
            TraceRecord::Xmt { time: t, seg: 7 },
            TraceRecord::Ack(AckRecord {
                time: t,
                ack: 5,
                rtt: Duration::from_micros(100_250),
                cwnd: 12,
                ssthresh: u64::MAX,
            }),
            TraceRecord::Ack(AckRecord {
                time: t,
                ack: 5,
                rtt: Duration::ZERO,
                cwnd: 12,
                ssthresh: 6,
            }),
            TraceRecord::Sack {
                time: t,
                start: 6,
                end: 9,
            },
            TraceRecord::State(StateRecord {
                time: t,
                srtt: Duration::from_micros(101_000),
                rto: Duration::from_millis(300),
                right_edge: 70,
                pacing_bps: Some(12_000_000),
                bw_bps: None,
            }),
        ];
        for r in records {
            assert_eq!(parse_record(&r.to_string()), Ok(Some(r)), "{r}");
        }
    }

    #[test]
    fn atou_lines_parse_and_unknown_tags_are_skipped() {
        let text = "# atou trace\n# config: mss 1049 rcvwin 50\n\
                    0.408133 258 xmt\n0.408196 234 0.038062 26 inf ack\n\
                    0.5 1 2 3 future\n";
        let trace = Trace::parse(text).unwrap();
        assert_eq!(trace.records.len(), 2);
        assert_eq!(trace.header.len(), 2);
        // 1049 - the 25-byte data header (wire.rs).
        assert_eq!(trace.payload_size(), Some(1024));
    }

    /// A protected connection's segments carry the protection's overhead
    /// less than `mss` says: the `payload:` line is what counts.
    #[test]
    fn the_payload_line_wins_over_the_mss() {
        use crate::proto::crypto::Cipher;
        use crate::proto::endpoint::client::segment_payload;
        let tuning = Tuning {
            mss: 1049,
            ..Tuning::default()
        };
        let protected = segment_payload(&tuning, Some(Cipher::Aes256Gcm));
        // 1049 - 25 (data header) - 8 (packet number) - 16 (tag).
        assert_eq!(protected, 1000);
        assert_eq!(segment_payload(&tuning, None), 1024);
        let text = format!(
            "# atou trace\n# config: mss 1049\n# {}\n0.1 3 xmt\n",
            payload_line(protected)
        );
        assert_eq!(Trace::parse(&text).unwrap().payload_size(), Some(1000));
    }

    #[test]
    fn a_bad_line_is_reported_with_its_number() {
        let err = Trace::parse("0.1 3 xmt\n0.2 x xmt\n").unwrap_err();
        assert!(err.to_string().starts_with("line 2:"), "{err}");
        let err = Trace::parse("0.1 3 0.01 xmt\n").unwrap_err();
        assert!(err.to_string().contains("fields"), "{err}");
        assert!(matches!(
            Trace::parse("# only a header\n"),
            Err(TraceError::Empty)
        ));
        assert!(Trace::parse("0.1 5 4 sack\n").is_err(), "an empty block");
        assert!(Trace::parse("-1 3 xmt\n").is_err(), "a negative time");
    }

    /// Each malformed record is refused for its own reason, and the line
    /// it stands on is quoted after it.
    #[test]
    fn malformed_records_give_their_own_reason() {
        for (line, why, message) in [
            (
                "0.1 3 0.01 xmt",
                RecordError::FieldCount {
                    tag: "xmt".into(),
                    want: 3,
                    got: 4,
                },
                "a `xmt` line has 3 fields, not 4",
            ),
            (
                "0.1 5 4 sack",
                RecordError::EmptySack { start: 5, end: 4 },
                "an empty SACK block 5..4",
            ),
            (
                "0.2 x xmt",
                RecordError::NotAWholeNumber("x".into()),
                "`x` is not a whole number",
            ),
            (
                "-1 3 xmt",
                RecordError::NotSeconds("-1".into()),
                "`-1` is not a time in seconds",
            ),
        ] {
            assert_eq!(parse_record(line), Err(why.clone()));
            assert_eq!(why.to_string(), message);
            let err = Trace::parse(&format!("0.1 3 xmt\n{line}\n")).unwrap_err();
            assert!(
                matches!(&err, TraceError::Line { line: 2, why: w, .. } if *w == why),
                "{err}"
            );
            assert_eq!(err.to_string(), format!("line 2: {message}: `{line}`"));
        }
    }
}
