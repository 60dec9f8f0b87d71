//! Every knob of a transfer, in one struct.
//!
//! Filled from defaults, then a config file (atou's `name value` lines are
//! accepted verbatim), then command-line flags. A knob is declared once, in
//! the `knobs!` table: [`KNOBS`], [`Tuning::set`] and [`Tuning::get`] (so
//! the config parser) come from it, and the CLI flags, `--help`, the
//! `config:` lines of the summary and the trace header from [`KNOBS`].

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;

use super::wire::DATA_HEADER_LEN;
use crate::util::units::{parse_duration, parse_size, Exact, TimeUnit};

/// An enum whose values are read and written by name: the variants with
/// their names, `ALL`, `name`, `Display`, and a case-insensitive `FromStr`
/// whose error lists the names in the order given. `$what` is how the
/// error calls a value ("a recovery variant"). Without `$what`, no
/// `FromStr`: the enum reads its names its own way (`Cipher`'s aliases).
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $name:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ::serde::Serialize)]
        pub enum $ty {
            $( $(#[$vmeta])* #[serde(rename = $name)] $variant, )+
        }

        impl $ty {
            /// Every value, in the order the names are listed (`--help`'s).
            pub const ALL: [$ty; [$($name),+].len()] = [$($ty::$variant),+];

            /// The value's name, as config files, flags and traces write it.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name,)+
                }
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
    (
        $(#[$meta:meta])*
        pub enum $ty:ident: $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident = $name:literal, )+
        }
    ) => {
        named_enum! {
            $(#[$meta])*
            pub enum $ty {
                $( $(#[$vmeta])* $variant = $name, )+
            }
        }

        impl FromStr for $ty {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, UnknownName> {
                let lower = s.to_ascii_lowercase();
                $ty::ALL
                    .into_iter()
                    .find(|v| v.name() == lower)
                    .ok_or_else(|| UnknownName {
                        given: s.to_string(),
                        what: $what,
                        names: &[$($name),+],
                    })
            }
        }
    };
}
pub(crate) use named_enum;

/// A value of a `named_enum!` that is none of its names.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("`{given}` is not {what} ({})", .names.join(", "))]
pub struct UnknownName {
    pub given: String,
    /// How the enum calls a value: "a recovery variant".
    pub what: &'static str,
    /// Every name, in the order the enum lists them.
    pub names: &'static [&'static str],
}

named_enum! {
    /// Loss recovery and congestion control variant.
    pub enum RecoveryKind: "a recovery variant" {
        /// RFC 5681 fast retransmit and fast recovery.
        Reno = "reno",
        /// RFC 6582: stays in recovery across partial ACKs (Hoe §3.2).
        NewReno = "newreno",
        /// RFC 6675 pipe and NextSeg over SACK (RFC 2018).
        Sack = "sack",
        /// Forward acknowledgement (Mathis & Mahdavi 1996), optional rampdown.
        Fack = "fack",
        /// RACK-TLP (RFC 8985): time-based loss detection over SACK, tail
        /// loss probes.
        Rack = "rack",
    }
}

impl RecoveryKind {
    /// Whether the receiver must send SACK blocks for this variant.
    pub(crate) fn uses_sack(self) -> bool {
        matches!(
            self,
            RecoveryKind::Sack | RecoveryKind::Fack | RecoveryKind::Rack
        )
    }
}

named_enum! {
    /// Congestion controller: how much may be in flight and how fast to send.
    pub enum CcKind: "a congestion controller" {
        /// atou's AIMD: RFC 5681 slow start and congestion avoidance with the
        /// `multiplier`, `increment`, `vmss`, `initsegs` and `thresh_init` knobs.
        Aimd = "aimd",
        /// RFC 9438 CUBIC with HyStart++ (RFC 9406) slow start, paced.
        Cubic = "cubic",
        /// draft-ietf-ccwg-bbr (BBRv3): paced at the measured bandwidth.
        Bbr = "bbr",
        /// TCP Vegas (Brakmo & Peterson): the window follows the segments the
        /// flow keeps queued, read from the RTT.
        Vegas = "vegas",
    }
}

named_enum! {
    /// How cwnd comes down to ssthresh during fast recovery with SACK-based
    /// loss recovery (`sack`, `fack` without `rampdown`, `rack`), for the
    /// controllers that keep an ssthresh (`aimd`, `cubic`).
    pub enum ReductionKind: "a window reduction" {
        /// RFC 6937 Proportional Rate Reduction (PRR-SSRB): sending during
        /// recovery in proportion to what is delivered, so cwnd reaches
        /// ssthresh as recovery ends, without a pause or a burst.
        Prr = "prr",
        /// RFC 6675 §5: cwnd = ssthresh at once, the papers' one-step halving.
        Halve = "halve",
    }
}

named_enum! {
    /// Whether measured reordering changes the duplicate threshold.
    pub enum ReorderingKind: "a reordering mode" {
        /// `dup_thresh` as set, whatever the path does (atou's).
        Fixed = "fixed",
        /// Linux's: the largest displacement seen raises `dup_thresh` and
        /// turns FACK's inference off (Sarolahti & Kuznetsov §5).
        Adaptive = "adaptive",
    }
}

/// Linux's TCP_MAX_QUICKACKS: the commands' `quickack`.
pub const LINUX_QUICKACKS: u32 = 16;

/// `stall`'s default: three of `maxidle`'s default 10 s, so that a peer
/// slow to open its window is waited for well past an idle path, and
/// longer than the black hole watch's verdict (`src/proto/pmtu.rs`, some
/// 7 s before the first RTT sample), which ends a stall it can explain.
pub const STALL_DEFAULT: Duration = Duration::from_secs(30);

named_enum! {
    /// Where AIMD's initial ssthresh comes from, besides `thresh_init`.
    pub enum SsthreshEstimate: "an ssthresh estimate" {
        /// `thresh_init` alone (atou's, RFC 5681's arbitrary threshold).
        None = "none",
        /// Hoe §3.1: the bandwidth three closely spaced ACKs reveal times the
        /// RTT, at least four segments.
        Hoe = "hoe",
    }
}

/// Segments dropped by the sender itself on their first transmissions:
/// scripted loss (atou's `droplist`). A number listed twice is dropped on its
/// first two transmissions, which forces a timeout (atou appendix B).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DropList {
    remaining: BTreeMap<u64, u32>,
}

impl DropList {
    pub fn is_empty(&self) -> bool {
        self.remaining.is_empty()
    }

    /// True if this transmission of `seg` is to be dropped; uses it up.
    pub fn consume(&mut self, seg: u64) -> bool {
        match self.remaining.get_mut(&seg) {
            None => false,
            Some(n) => {
                *n -= 1;
                if *n == 0 {
                    self.remaining.remove(&seg);
                }
                true
            }
        }
    }

    /// Total drops still to happen.
    pub fn len(&self) -> u64 {
        self.remaining.values().map(|&n| u64::from(n)).sum()
    }
}

/// Why a droplist does not parse; each names the entry at fault.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DropListError {
    #[error("droplist entry `{0}` is not a segment number or range like 310-315")]
    NotASegment(String),
    #[error("droplist range `{0}` runs backwards")]
    Backwards(String),
    #[error("droplist `{0}`: at most a million drops can be scripted")]
    TooMany(String),
}

impl FromStr for DropList {
    type Err = DropListError;
    /// `300,302,310-315` or atou's `200 200`; `-` or empty means none.
    fn from_str(s: &str) -> Result<Self, DropListError> {
        let mut list = DropList::default();
        for tok in s
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|t| !t.is_empty() && *t != "-")
        {
            let (lo, hi) = match tok.split_once('-') {
                Some((a, b)) => (parse_seg(a, tok)?, parse_seg(b, tok)?),
                None => {
                    let n = parse_seg(tok, tok)?;
                    (n, n)
                }
            };
            if hi < lo {
                return Err(DropListError::Backwards(tok.to_string()));
            }
            if hi - lo >= 1_000_000 || list.len() + (hi - lo) >= 1_000_000 {
                return Err(DropListError::TooMany(tok.to_string()));
            }
            for seg in lo..=hi {
                *list.remaining.entry(seg).or_insert(0) += 1;
            }
        }
        Ok(list)
    }
}

fn parse_seg(s: &str, tok: &str) -> Result<u64, DropListError> {
    s.trim()
        .parse()
        .map_err(|_| DropListError::NotASegment(tok.to_string()))
}

impl fmt::Display for DropList {
    /// Compact form: runs of single drops become ranges; repeats are repeated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.remaining.is_empty() {
            return f.write_str("-");
        }
        let mut parts: Vec<String> = Vec::new();
        let mut run: Option<(u64, u64)> = None;
        let flush = |run: &mut Option<(u64, u64)>, parts: &mut Vec<String>| {
            if let Some((a, b)) = run.take() {
                parts.push(if a == b {
                    a.to_string()
                } else {
                    format!("{a}-{b}")
                });
            }
        };
        for (&seg, &n) in &self.remaining {
            if n == 1 {
                match run {
                    Some((a, b)) if b + 1 == seg => run = Some((a, seg)),
                    _ => {
                        flush(&mut run, &mut parts);
                        run = Some((seg, seg));
                    }
                }
            } else {
                flush(&mut run, &mut parts);
                for _ in 0..n {
                    parts.push(seg.to_string());
                }
            }
        }
        flush(&mut run, &mut parts);
        f.write_str(&parts.join(","))
    }
}

impl Serialize for DropList {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The transfer's knobs. Units are in the field docs and in the knob
/// table (`KNOBS`), which `atou send --help` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tuning {
    /// UDP datagram size in bytes: the 25-byte data header plus payload
    /// (and 24 bytes of packet protection on an authenticated connection).
    pub mss: u32,
    /// Sender's window limit in segments.
    pub rcvwin: u32,
    /// Congestion controller.
    pub cc: CcKind,
    /// Loss recovery: what is lost and what to resend.
    pub recovery: RecoveryKind,
    /// FACK only: bring cwnd down gradually, one segment per two ACKs,
    /// instead of at once (Mathis & Mahdavi appendix A); default off.
    pub rampdown: bool,
    /// Fixed retransmission timeout; zero selects the adaptive RTO.
    #[serde(serialize_with = "secs")]
    pub timeout: Duration,
    /// Least margin of the adaptive RTO over SRTT (RTO = SRTT +
    /// max(4·RTTVAR, min_rto), as Linux's rto_min), and the least RTO
    /// before a sample or with `tick`; default 200 ms (Linux's; RFC 6298's
    /// lower bound is 1 s).
    #[serde(serialize_with = "secs")]
    pub min_rto: Duration,
    /// Upper bound of the RTO, backoff included; default 60 s.
    #[serde(serialize_with = "secs")]
    pub max_rto: Duration,
    /// Timer granularity; zero is fine-grained, otherwise Brakmo §3.2's
    /// coarse-clock estimator runs in ticks of this length.
    #[serde(serialize_with = "secs")]
    pub tick: Duration,
    /// Give up after this long without an ACK; zero never gives up.
    #[serde(serialize_with = "secs")]
    pub maxidle: Duration,
    /// Give up after this long without a byte delivered, however many
    /// ACKs come; zero never gives up.
    #[serde(serialize_with = "secs")]
    pub stall: Duration,
    /// Initial window, in virtual segments (`vmss`).
    pub initsegs: u32,
    /// ssthresh = multiplier × flight on loss.
    pub multiplier: f64,
    /// Congestion-avoidance increase per RTT, in virtual segments.
    pub increment: u32,
    /// Initial ssthresh as a fraction of `rcvwin`; zero means unlimited.
    pub thresh_init: f64,
    /// Duplicate ACKs that trigger fast retransmit; default 3 (RFC 5681).
    pub dup_thresh: u32,
    /// Most segments sent in response to one event; zero is unlimited.
    pub burst_limit: u32,
    /// Segments to send; zero is unlimited.
    pub maxpkts: u64,
    /// Stop sending new data after this long; zero is unlimited.
    #[serde(serialize_with = "secs")]
    pub maxtime: Duration,
    /// Segments the sender drops on their first transmissions (atou's
    /// scripted loss); empty by default.
    pub droplist: DropList,
    /// Virtual MSS in segments (atou §4.1).
    pub vmss: u32,
    /// RFC 3042.
    pub limited_transmit: bool,
    /// Undo a reduction whose retransmissions all prove spurious (D-SACK,
    /// RFC 2883; timestamps, Eifel; Sarolahti §6).
    pub undo: bool,
    /// Receiver: delayed-ACK timer; zero ACKs every segment.
    #[serde(serialize_with = "secs")]
    pub delack: Duration,
    /// Receiver: buffer in segments, advertised as the window.
    pub rcvsegs: u32,
    /// Whether measured reordering raises `dup_thresh`.
    pub reordering: ReorderingKind,
    /// AIMD slow start: growth per ACK is the segments it newly
    /// acknowledges up to this many (RFC 3465's L); 0 is one per ACK.
    pub abc: u32,
    /// Receiver: segments ACKed one by one at the start and after idle,
    /// before `delack` applies; 0 never.
    pub quickack: u32,
    /// UDP socket send buffer in bytes (SO_SNDBUF), real sockets only.
    pub sndbuf: u32,
    /// UDP socket receive buffer in bytes (SO_RCVBUF), both ends of a real
    /// transfer: the server grows its socket's buffer to what the client asks.
    pub rcvbuf: u32,
    /// BBR: loss per round trip, in percent of what the round delivered
    /// and lost, above which loss is a congestion signal.
    pub bbr_loss_thresh: f64,
    /// BBR: the multiplicative cut of its bounds on congestion loss.
    pub bbr_beta: f64,
    /// BBR: share of inflight_hi left unused while cruising.
    pub bbr_headroom: f64,
    /// BBR: loss events (ACKs reporting new losses) a round trip needs
    /// before its loss counts.
    pub bbr_loss_events: u32,
    /// Cap on the sending rate, bits per second of payload (the data
    /// sent, retransmissions included; atou's, UDP's and IP's headers
    /// not); zero is no cap.
    pub bwlimit: u64,
    /// The window reduction during SACK-based fast recovery.
    pub reduction: ReductionKind,
    /// AIMD: estimate the initial ssthresh from the first ACKs.
    pub ssthresh_estimate: SsthreshEstimate,
    /// Vegas: segments queued below which the window grows, above which it
    /// shrinks, and above which slow start ends (Brakmo: 1, 3, 1).
    pub vegas_alpha: f64,
    /// Vegas: segments queued above which the window shrinks by one per
    /// RTT; default 3.
    pub vegas_beta: f64,
    /// Vegas: segments queued above which slow start ends; default 1.
    pub vegas_gamma: f64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            mss: 1472,
            rcvwin: 8192,
            cc: CcKind::Aimd,
            recovery: RecoveryKind::Sack,
            rampdown: false,
            timeout: Duration::ZERO,
            min_rto: Duration::from_millis(200),
            max_rto: Duration::from_secs(60),
            tick: Duration::ZERO,
            maxidle: Duration::from_secs(10),
            stall: STALL_DEFAULT,
            initsegs: 10,
            multiplier: 0.5,
            increment: 1,
            thresh_init: 0.0,
            dup_thresh: 3,
            burst_limit: 0,
            maxpkts: 0,
            maxtime: Duration::ZERO,
            droplist: DropList::default(),
            vmss: 1,
            limited_transmit: true,
            undo: false,
            delack: Duration::ZERO,
            rcvsegs: 8192,
            quickack: 0,
            abc: 2,
            reordering: ReorderingKind::Fixed,
            sndbuf: 4 << 20,
            rcvbuf: 4 << 20,
            bbr_loss_thresh: 2.0,
            bbr_beta: 0.7,
            bbr_headroom: 0.15,
            bbr_loss_events: 2,
            bwlimit: 0,
            reduction: ReductionKind::Halve,
            ssthresh_estimate: SsthreshEstimate::None,
            vegas_alpha: 1.0,
            vegas_beta: 3.0,
            vegas_gamma: 1.0,
        }
    }
}

/// One knob: its name, atou aliases, unit and help. Defaults come from
/// `Tuning::default()` so they cannot drift from the code.
#[derive(Debug)]
pub struct Knob {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    pub value_name: &'static str,
    pub help: &'static str,
}

/// How a knob's value is read from text and written back, so that
/// [`Tuning::set`] reads what [`Tuning::get`] writes.
trait Codec<T> {
    fn parse(&self, key: &str, v: &str) -> Result<T, TuningError>;
    fn show(&self, value: &T) -> String;
}

/// A whole number in `min..=max`.
struct Int<T>(T, T);

impl<T: FromStr + PartialOrd + fmt::Display + Copy> Codec<T> for Int<T> {
    fn parse(&self, key: &str, v: &str) -> Result<T, TuningError> {
        parse_int(key, v, self.0, self.1)
    }
    fn show(&self, value: &T) -> String {
        value.to_string()
    }
}

/// `0` or `1` (`on`/`off`, `yes`/`no`, `true`/`false` read too).
struct Flag;

impl Codec<bool> for Flag {
    fn parse(&self, key: &str, v: &str) -> Result<bool, TuningError> {
        parse_bool(key, v)
    }
    fn show(&self, value: &bool) -> String {
        u8::from(*value).to_string()
    }
}

/// A number that the predicate accepts; the text says which, for errors.
struct Real(fn(f64) -> bool, &'static str);

impl Codec<f64> for Real {
    fn parse(&self, key: &str, v: &str) -> Result<f64, TuningError> {
        parse_f64(key, v, self.0, self.1)
    }
    fn show(&self, value: &f64) -> String {
        value.to_string()
    }
}

/// A [`Real`] written with `%`, read with or without it.
struct Percent(fn(f64) -> bool, &'static str);

impl Codec<f64> for Percent {
    fn parse(&self, key: &str, v: &str) -> Result<f64, TuningError> {
        let pct = v.strip_suffix('%').unwrap_or(v).trim();
        parse_f64(key, pct, self.0, self.1)
    }
    fn show(&self, value: &f64) -> String {
        format!("{value}%")
    }
}

/// A duration, a bare number in the unit given, at most the maximum.
struct Span(TimeUnit, Duration);

impl Codec<Duration> for Span {
    fn parse(&self, key: &str, v: &str) -> Result<Duration, TuningError> {
        parse_time(key, v, self.0, self.1)
    }
    fn show(&self, value: &Duration) -> String {
        Exact(*value, self.0).to_string()
    }
}

/// A value with its own `FromStr` and `Display`: the named enums, the
/// droplist.
struct Name;

impl<T: FromStr + fmt::Display> Codec<T> for Name
where
    T::Err: fmt::Display,
{
    fn parse(&self, key: &str, v: &str) -> Result<T, TuningError> {
        v.parse().map_err(|m| err(key, m))
    }
    fn show(&self, value: &T) -> String {
        value.to_string()
    }
}

/// A socket buffer size ([`parse_bytes`]).
struct SocketBuffer;

impl Codec<u32> for SocketBuffer {
    fn parse(&self, key: &str, v: &str) -> Result<u32, TuningError> {
        parse_bytes(key, v)
    }
    fn show(&self, value: &u32) -> String {
        value.to_string()
    }
}

/// `bwlimit`'s rate ([`parse_bwlimit`]), written as tc writes one.
struct Rate;

impl Codec<u64> for Rate {
    fn parse(&self, key: &str, v: &str) -> Result<u64, TuningError> {
        parse_bwlimit(key, v)
    }
    fn show(&self, value: &u64) -> String {
        match *value {
            0 => "0".to_string(),
            rate => crate::util::units::format_rate_tc(rate),
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);
const VEGAS_SEGMENTS: Real = Real(|x| (0.0..=1000.0).contains(&x), "0 to 1000 segments");

/// The one table of knobs. Each row is `field | "atou alias": "VALUE
/// NAME", codec, "help"`, the field of [`Tuning`] naming the knob; from
/// it come [`KNOBS`] (so the CLI flags, `--help`, the summary's `config:`
/// lines and the trace header) and the names [`Tuning::set`] and
/// [`Tuning::get`] (so config files) know.
macro_rules! knobs {
    ($(
        $field:ident $(| $alias:literal)*: $value_name:literal, $codec:expr,
            $help:literal;
    )+) => {
        /// Every knob, in the order the summary prints them.
        pub const KNOBS: &[Knob] = &[$(
            Knob {
                name: stringify!($field),
                aliases: &[$($alias),*],
                value_name: $value_name,
                help: $help,
            },
        )+];

        impl Tuning {
            /// Sets the knob named `key` (canonical); `Ok(false)` if there
            /// is none.
            fn set_knob(&mut self, key: &str, v: &str) -> Result<bool, TuningError> {
                match key {
                    $(stringify!($field) $(| $alias)* => {
                        self.$field = Codec::parse(&$codec, key, v)?;
                    })+
                    _ => return Ok(false),
                }
                Ok(true)
            }

            /// The knob named `key` (canonical) as text.
            fn get_knob(&self, key: &str) -> Option<String> {
                match key {
                    $(stringify!($field) $(| $alias)* => Some(Codec::show(&$codec, &self.$field)),)+
                    _ => None,
                }
            }
        }
    };
}

knobs! {
    mss: "BYTES", Int((DATA_HEADER_LEN + 1) as u32, 65_507),
        "UDP datagram size in bytes, headers included (25 bytes, 49 authenticated; atou Table 1: 1472); send and copy search the path for it unless this is set (8972 to this host), and step down during a transfer if the path stops carrying it";
    rcvwin | "rcvrwin": "SEGMENTS", Int(1, 1 << 24),
        "sender window limit in segments (atou Table 1)";
    recovery: "VARIANT", Name,
        "loss recovery: reno (RFC 5681), newreno (RFC 6582), sack (RFC 6675), fack (Mathis-Mahdavi), rack (RFC 8985 RACK-TLP)";
    rampdown: "0|1", Flag,
        "FACK only: halve cwnd gradually, one segment per two ACKs (Mathis appendix A)";
    timeout: "SECONDS", Span(TimeUnit::Seconds, HOUR),
        "fixed retransmission timeout in seconds; 0 selects the adaptive RTO of RFC 6298";
    min_rto: "SECONDS", Span(TimeUnit::Seconds, HOUR),
        "least margin of the adaptive RTO over srtt in seconds: RTO = srtt + max(4 rttvar, min_rto), as Linux's rto_min (Linux uses 0.2, RFC 6298's lower bound is 1)";
    max_rto: "SECONDS", Span(TimeUnit::Seconds, HOUR),
        "upper bound of the RTO, backoff included, in seconds";
    tick: "SECONDS", Span(TimeUnit::Seconds, Duration::from_secs(10)),
        "timer granularity in seconds; 0 is fine-grained, >0 runs Brakmo's coarse-clock RTO estimator (§3.2)";
    maxidle: "SECONDS", Span(TimeUnit::Seconds, DAY),
        "give up after this many seconds without an ACK; 0 never gives up";
    stall: "SECONDS", Span(TimeUnit::Seconds, DAY),
        "give up after this many seconds of ACKs that deliver no byte, counted from the first such ACK (a path that carries the acks and small datagrams but not the data's size, a window that never opens); silence is maxidle's; 0 never gives up";
    initsegs: "SEGMENTS", Int(1, 1 << 20),
        "initial congestion window in (virtual) segments";
    multiplier: "FACTOR", Real(|x| x > 0.0 && x < 1.0, "between 0 and 1 (exclusive)"),
        "on loss, ssthresh = multiplier x flight (AIMD decrease; 0 < f < 1)";
    increment: "SEGMENTS", Int(1, 1 << 16),
        "congestion-avoidance increase per RTT in (virtual) segments (AIMD increase)";
    thresh_init: "FRACTION", Real(|x| (0.0..=1e6).contains(&x), "0 or more"),
        "initial ssthresh as a fraction of rcvwin; 0 means unlimited";
    dup_thresh: "ACKS", Int(1, 1 << 16),
        "duplicate ACKs that trigger fast retransmit";
    burst_limit: "SEGMENTS", Int(0, u32::MAX),
        "most segments sent in response to one ACK or timer; 0 is unlimited";
    maxpkts: "SEGMENTS", Int(0, u64::MAX >> 1),
        "stop after sending this many segments; 0 is unlimited";
    maxtime: "SECONDS", Span(TimeUnit::Seconds, 365 * DAY),
        "stop sending new data after this many seconds; 0 is unlimited";
    droplist: "LIST", Name,
        "segments the sender drops on their first transmissions, e.g. 300,302,310-315; repeat a number to drop it again";
    vmss: "K", Int(1, 1 << 16),
        "virtual MSS: initial window, loss window and additive increase in units of K segments (atou §4.1)";
    limited_transmit: "0|1", Flag,
        "send new data on the duplicate ACKs below dup_thresh (RFC 3042)";
    delack: "MS", Span(TimeUnit::Millis, Duration::from_secs(10)),
        "receiver delayed-ACK timer in milliseconds; ACKs at least every 2nd segment; 0 ACKs every segment";
    rcvsegs: "SEGMENTS", Int(1, 1 << 24),
        "receiver buffer in segments; its free space is the advertised window";
    sndbuf: "BYTES", SocketBuffer,
        "UDP socket send buffer (SO_SNDBUF) in bytes, e.g. 4MiB (atou Table 1); real sockets only";
    rcvbuf: "BYTES", SocketBuffer,
        "UDP socket receive buffer (SO_RCVBUF) in bytes, e.g. 4MiB, at both ends (atou Table 1, atousrv -b); real sockets only";
    // Knobs added after atou's own go last, so that the `config:` lines of
    // atou's knobs read as before.
    cc: "CONTROLLER", Name,
        "congestion controller: aimd (RFC 5681 with atou's multiplier, increment, vmss, initsegs, thresh_init), cubic (RFC 9438 with HyStart++, paced) bbr (draft-ietf-ccwg-bbr, BBRv3) or vegas (Brakmo & Peterson, RTT-based, see vegas_alpha); an atou config file means aimd";
    bbr_loss_thresh: "PERCENT", Percent(|x| x > 0.0 && x <= 100.0, "a percentage above 0, e.g. 2%"),
        "bbr only: loss per round trip, in percent of what the round delivered and lost, above which BBR treats loss as congestion; a probe is judged by it on top of the loss seen while cruising (draft: 2%; 20% is BBRv1-like)";
    bbr_beta: "FACTOR", Real(|x| x > 0.0 && x < 1.0, "between 0 and 1 (exclusive)"),
        "bbr only: multiplicative cut of BBR's bandwidth and inflight bounds on congestion loss (0 < f < 1)";
    bbr_headroom: "FRACTION", Real(|x| (0.0..1.0).contains(&x), "0 or more, below 1"),
        "bbr only: share of inflight_hi BBR leaves unused while cruising";
    undo: "0|1", Flag,
        "revert a window reduction when D-SACKs or echoed timestamps prove every retransmission of it spurious (Sarolahti §6, RFC 2883, Eifel); an atou config file means 0";
    bbr_loss_events: "N", Int(1, 1 << 20),
        "bbr only: ACKs reporting new losses a round trip needs before its loss counts (quiche-style, default 2)";
    bwlimit: "RATE", Rate,
        "cap on the sending rate in bits/s of data (headers not counted), with a unit: 20mbit, 500kbit, 1gbit (or tc's bytes/s: 2.5mbps); 0 is no cap. Paced controllers (bbr, cubic) pace at the lower of their rate and the cap, aimd goes through a token bucket at the cap. A transfer's cap is shared equally by its --streams. Unlike rsync's --bwlimit, a bare number is refused, not read as KiB/s";
    reduction: "prr|halve", Name,
        "aimd and cubic with sack, fack (without rampdown) or rack: how cwnd comes down to ssthresh during fast recovery; prr sends in proportion to what is delivered (RFC 6937, as Linux), halve sets cwnd = ssthresh at once (RFC 6675, the papers'); an atou config file means halve";
    ssthresh_estimate: "none|hoe", Name,
        "aimd only: hoe sets the initial ssthresh to the bandwidth three closely spaced ACKs reveal times the least RTT seen, at least 4 segments (Hoe §3.1), if below thresh_init's; none keeps thresh_init's";
    quickack: "SEGMENTS", Int(0, u32::from(u16::MAX)),
        "receiver: ACK the first N segments one by one, and again after 1 s without data, before delack applies (Linux's quick ACKs, at most half the window); 0 never; the commands use Linux's 16, an atou config file 0";
    reordering: "fixed|adaptive", Name,
        "adaptive: an original segment, never resent, delivered d segments below the highest SACKed one, or a fast retransmit that D-SACKs or timestamps prove unnecessary with d segments SACKed above its hole, raises dup_thresh to d + 1, up to 300, and turns FACK's inference off, per connection (Linux, Sarolahti §5); fixed keeps dup_thresh; the summary reports the largest displacement; an atou config file means fixed";
    abc: "SEGMENTS", Int(0, 1 << 20),
        "aimd only: in slow start each ACK grows cwnd by the segments it newly acknowledges, at most this many (RFC 3465 appropriate byte counting, L); 0 grows one segment per ACK whatever it covers (RFC 5681's count, Linux 2.4's, so delayed ACKs slow slow start)";
    vegas_alpha: "SEGMENTS", VEGAS_SEGMENTS,
        "vegas only: with fewer segments than this queued at the bottleneck (cwnd x (1 - BaseRTT/RTT)), the window grows by one per RTT (Brakmo: 1)";
    vegas_beta: "SEGMENTS", VEGAS_SEGMENTS,
        "vegas only: with more segments than this queued, the window shrinks by one per RTT (Brakmo: 3)";
    vegas_gamma: "SEGMENTS", VEGAS_SEGMENTS,
        "vegas only: slow start, doubling every other RTT, ends when more segments than this are queued (Brakmo: 1)";
}

/// A bad value for one knob.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{key}: {message}")]
pub struct TuningError {
    /// The knob's name as given (a config key or flag name).
    pub key: String,
    /// What is wrong with the value, and what is accepted.
    pub message: String,
}

/// A bad line in a config file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: {error}")]
pub struct ConfigError {
    pub line: usize,
    pub error: TuningError,
}

fn err(key: &str, message: impl fmt::Display) -> TuningError {
    TuningError {
        key: key.to_string(),
        message: message.to_string(),
    }
}

/// A rate with its unit (see [`crate::util::units::parse_rate`]), or 0 for no
/// cap. A bare number, or rsync's `K`/`M`/`G`, is refused: rsync reads
/// `--bwlimit 1000` as KiB/s and `10M` as MiB/s, tc reads a bare number as
/// bits/s, and a cap a thousandfold off is worse than a question.
fn parse_bwlimit(key: &str, v: &str) -> Result<u64, TuningError> {
    let v = v.trim();
    if v.chars().all(|c| c == '0' || c == '.') && !v.is_empty() {
        return Ok(0);
    }
    let unit = v.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    if unit.is_empty() || matches!(unit.to_ascii_lowercase().as_str(), "k" | "m" | "g") {
        return Err(err(
            key,
            format!(
                "`{v}` needs a unit: bits/s as 20mbit or 500kbit, or bytes/s as 2.5mbps; \
                 0 is no cap (rsync reads a bare number as KiB/s and M as MiB/s)"
            ),
        ));
    }
    crate::util::units::parse_rate(v).map_err(|m| err(key, m))
}

fn parse_bool(key: &str, v: &str) -> Result<bool, TuningError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "yes" | "true" => Ok(true),
        "0" | "off" | "no" | "false" => Ok(false),
        _ => Err(err(key, format!("`{v}` is not 0 or 1"))),
    }
}

fn parse_int<T: FromStr + PartialOrd + fmt::Display + Copy>(
    key: &str,
    v: &str,
    min: T,
    max: T,
) -> Result<T, TuningError> {
    let n: T = v
        .parse()
        .map_err(|_| err(key, format!("`{v}` is not a whole number")))?;
    if n < min || n > max {
        return Err(err(key, format!("{v} is outside {min}..={max}")));
    }
    Ok(n)
}

fn parse_f64(
    key: &str,
    v: &str,
    ok: impl Fn(f64) -> bool,
    range: &str,
) -> Result<f64, TuningError> {
    let x: f64 = v
        .parse()
        .map_err(|_| err(key, format!("`{v}` is not a number")))?;
    if !x.is_finite() || !ok(x) {
        return Err(err(key, format!("{v} must be {range}")));
    }
    Ok(x)
}

fn parse_time(key: &str, v: &str, bare: TimeUnit, max: Duration) -> Result<Duration, TuningError> {
    let d = parse_duration(v, bare).map_err(|m| err(key, m))?;
    if d > max {
        return Err(err(key, format!("{v} is longer than {}s", max.as_secs())));
    }
    Ok(d)
}

/// A socket buffer size: `65536`, `4MiB`; at most 1 GiB (setsockopt takes an int).
fn parse_bytes(key: &str, v: &str) -> Result<u32, TuningError> {
    let n = parse_size(v).map_err(|m| err(key, m))?;
    if !(1024..=1 << 30).contains(&n) {
        return Err(err(key, format!("{v} is outside 1KiB..=1GiB")));
    }
    Ok(n as u32)
}

fn canonical(key: &str) -> String {
    key.trim()
        .trim_start_matches("--")
        .replace('-', "_")
        .to_ascii_lowercase()
}

/// atou's flags that select a recovery variant: set-only, no knob of their own.
const ATOU_RECOVERY_FLAGS: [&str; 3] = ["newreno", "sack", "fack"];

impl Tuning {
    /// Payload bytes in a full segment.
    pub fn payload_size(&self) -> usize {
        self.mss as usize - DATA_HEADER_LEN
    }

    /// Initial ssthresh in segments (atou's `thresh_init`, 0 = unlimited).
    pub(crate) fn initial_ssthresh(&self) -> u64 {
        if self.thresh_init <= 0.0 {
            u64::MAX
        } else {
            ((f64::from(self.rcvwin) * self.thresh_init).floor() as u64).max(2)
        }
    }

    /// The defaults of atou's commands (`send`, `copy`, `sim`, `probe`,
    /// `serve`): BBR, RACK-TLP, undo, PRR (RFC 6937,
    /// Linux's reduction, for `--cc aimd` and `--cc cubic`) and Linux's 16
    /// quick ACKs (they matter only with `--delack`). Flags and config
    /// files start from here. [`Tuning::default`] is atou's own baseline,
    /// AIMD with SACK recovery and no undo: what an atou config file means,
    /// and what the papers' scenarios and the unit tests build on.
    ///
    /// The windows are four times atou's 8192 segments: BBR keeps two
    /// BDPs in flight, and the receiver holds a round trip of data behind
    /// each hole, so a 1 Gbit/s, 100 ms path (a BDP of 8500 segments)
    /// needs about 25 000 (simulated at 0.1 % loss: 0.496 of the rate with
    /// 8192, 0.923 with 32 768). Neither is memory until used: the sender
    /// holds what is in flight, the receiver what arrived out of order, and
    /// `atou serve` grants each connection at most its `--max-window`.
    pub fn command_default() -> Tuning {
        Tuning {
            cc: CcKind::Bbr,
            recovery: RecoveryKind::Rack,
            undo: true,
            rcvwin: 32768,
            rcvsegs: 32768,
            reduction: ReductionKind::Prr,
            quickack: LINUX_QUICKACKS,
            reordering: ReorderingKind::Adaptive,
            ..Tuning::default()
        }
    }

    /// Sets one knob from text, by its name or an atou alias. atou's
    /// `newreno`, `sack` and `fack` flags select the recovery variant.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), TuningError> {
        let key = canonical(key);
        let v = value.trim();
        if self.set_knob(&key, v)? || self.set_atou_recovery_flag(&key, v)? {
            return Ok(());
        }
        Err(err(
            &key,
            "unknown knob (see `atou sim --help` or docs/tuning.md)",
        ))
    }

    /// atou's `newreno`, `sack` and `fack` flags, each turning its variant
    /// on or off over the one selected; `Ok(false)` for another key.
    fn set_atou_recovery_flag(&mut self, key: &str, v: &str) -> Result<bool, TuningError> {
        use RecoveryKind::{Fack, NewReno, Rack, Reno, Sack};
        if !ATOU_RECOVERY_FLAGS.contains(&key) {
            return Ok(false);
        }
        let on = parse_bool(key, v)?;
        self.recovery = match (key, on, self.recovery) {
            ("newreno", true, Reno) => NewReno,
            ("newreno", false, NewReno) => Reno,
            ("sack", true, Reno | NewReno) => Sack,
            ("sack", false, Sack | Fack | Rack) => NewReno,
            ("fack", true, _) => Fack,
            ("fack", false, Fack) => Sack,
            (_, _, unchanged) => unchanged,
        };
        Ok(true)
    }

    /// The value of a knob as text that [`Tuning::set`] reads back.
    pub fn get(&self, key: &str) -> Option<String> {
        self.get_knob(&canonical(key))
    }

    /// Applies a config file's text: `name value` lines, `#` comments.
    /// atou's own configs load unchanged; `port` and `debug`, which have
    /// other spellings here, are accepted and reported back as notes. When the file names any of atou's `newreno`/`sack`/`fack`
    /// flags, they start from atou's defaults (newreno only) so the file
    /// means what it meant to atou. A config file selects atou's baseline,
    /// [`Tuning::default`] (`cc aimd`, `recovery sack`, `undo 0`, windows of
    /// 8192 segments, `reduction halve`), unless
    /// it names others itself.
    pub fn apply_config(&mut self, text: &str) -> Result<Vec<String>, ConfigError> {
        let mut notes = Vec::new();
        // atou's baseline, whatever the command's defaults.
        let atou = Tuning::default();
        self.cc = atou.cc;
        self.recovery = atou.recovery;
        self.undo = atou.undo;
        self.rcvwin = atou.rcvwin;
        self.rcvsegs = atou.rcvsegs;
        self.reduction = atou.reduction;
        self.quickack = atou.quickack;
        self.reordering = atou.reordering;
        let lines: Vec<(usize, &str, &str)> = text
            .lines()
            .enumerate()
            .filter_map(|(i, raw)| {
                let line = raw.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    return None;
                }
                let (k, v) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
                Some((i + 1, k, v.trim()))
            })
            .collect();
        if lines
            .iter()
            .any(|(_, k, _)| ATOU_RECOVERY_FLAGS.contains(&canonical(k).as_str()))
        {
            self.recovery = RecoveryKind::NewReno;
        }
        for (line, key, value) in lines {
            match canonical(key).as_str() {
                "debug" => notes.push(format!(
                    "line {line}: `debug {value}` ignored; use --events and --trace FILE"
                )),
                "port" => notes.push(format!(
                    "line {line}: `port {value}` ignored; give the port as HOST:PORT or --bind"
                )),
                _ => {
                    if value.is_empty() && canonical(key) != "droplist" {
                        return Err(ConfigError {
                            line,
                            error: err(key, "missing value"),
                        });
                    }
                    self.set(key, value)
                        .map_err(|error| ConfigError { line, error })?;
                }
            }
        }
        Ok(notes)
    }

    /// Checks relations between knobs.
    pub fn validate(&self) -> Result<(), TuningError> {
        if self.min_rto > self.max_rto {
            return Err(err("min_rto", "is larger than max_rto"));
        }
        if self.rampdown && self.recovery != RecoveryKind::Fack {
            return Err(err("rampdown", "only applies to --recovery fack"));
        }
        let d = Tuning::default();
        if self.cc != CcKind::Bbr {
            for (key, changed) in [
                ("bbr_loss_thresh", self.bbr_loss_thresh != d.bbr_loss_thresh),
                ("bbr_beta", self.bbr_beta != d.bbr_beta),
                ("bbr_headroom", self.bbr_headroom != d.bbr_headroom),
                ("bbr_loss_events", self.bbr_loss_events != d.bbr_loss_events),
            ] {
                if changed {
                    return Err(err(
                        key,
                        format!("only applies to --cc bbr, not {}", self.cc),
                    ));
                }
            }
        }
        if self.cc != CcKind::Vegas {
            for (key, changed) in [
                ("vegas_alpha", self.vegas_alpha != d.vegas_alpha),
                ("vegas_beta", self.vegas_beta != d.vegas_beta),
                ("vegas_gamma", self.vegas_gamma != d.vegas_gamma),
            ] {
                if changed {
                    return Err(err(
                        key,
                        format!("only applies to --cc vegas, not {}", self.cc),
                    ));
                }
            }
        } else if self.vegas_alpha > self.vegas_beta {
            return Err(err("vegas_alpha", "is larger than vegas_beta"));
        }
        if self.cc != CcKind::Aimd {
            for (key, changed) in [
                ("multiplier", self.multiplier != d.multiplier),
                ("increment", self.increment != d.increment),
                ("vmss", self.vmss != d.vmss),
                ("thresh_init", self.thresh_init != d.thresh_init),
                (
                    "ssthresh_estimate",
                    self.ssthresh_estimate != d.ssthresh_estimate,
                ),
                ("abc", self.abc != d.abc),
            ] {
                if changed {
                    return Err(err(
                        key,
                        format!("only applies to --cc aimd, not {}", self.cc),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every knob as `name value` lines, loadable with `--config`.
    pub fn config_lines(&self) -> Vec<String> {
        KNOBS
            .iter()
            .map(|k| format!("{} {}", k.name, self.get(k.name).unwrap_or_default()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atou_appendix_b_configs_load_verbatim() {
        // The FACK example of atou appendix B.
        let mut t = Tuning::default();
        let notes = t
            .apply_config(
                "newreno 0\nfack 1\nsack 1\nrampdown 1\nrcvrwin 26\nmaxtime 10\ndroplist 200 200\ndebug 4\n",
            )
            .unwrap();
        assert_eq!(t.recovery, RecoveryKind::Fack);
        assert!(t.rampdown);
        assert_eq!(t.rcvwin, 26);
        assert_eq!(t.maxtime, Duration::from_secs(10));
        assert_eq!(t.droplist.len(), 2);
        assert_eq!(notes.len(), 1);

        // The virtual-MSS example: newreno only, although our default is sack.
        let mut t = Tuning::default();
        t.apply_config("newreno 1\nrcvrwin 1000\nmaxtime 10\ninitsegs 10\nincrement 10\ndroplist 1400\ndebug 3\n")
            .unwrap();
        assert_eq!(t.recovery, RecoveryKind::NewReno);
        assert_eq!((t.initsegs, t.increment), (10, 10));
    }

    #[test]
    fn config_errors_name_line_and_key() {
        let mut t = Tuning::default();
        let e = t.apply_config("mss 1472\n\ndup_thresh zero\n").unwrap_err();
        assert_eq!(e.line, 3);
        assert_eq!(e.error.key, "dup_thresh");
        let e = t.apply_config("wibble 3").unwrap_err();
        assert!(e.to_string().contains("wibble"), "{e}");
    }

    #[test]
    fn every_knob_round_trips_through_its_text() {
        let mut t = Tuning {
            droplist: "5,7-9,7".parse().unwrap(),
            bwlimit: 1_500_001,
            delack: Duration::from_millis(200),
            recovery: RecoveryKind::Fack,
            rampdown: true,
            ..Tuning::default()
        };
        t.multiplier = 0.9;
        let text = t.config_lines().join("\n");
        let mut back = Tuning::default();
        back.apply_config(&text).unwrap();
        assert_eq!(back, t);
    }

    #[test]
    fn droplist_syntax() {
        let d: DropList = "300,302,310-315".parse().unwrap();
        assert_eq!(d.len(), 8);
        assert_eq!(d.to_string(), "300,302,310-315");
        let mut d: DropList = "200 200".parse().unwrap();
        assert!(d.consume(200));
        assert!(d.consume(200));
        assert!(!d.consume(200));
        assert!("9-3".parse::<DropList>().is_err());
        assert!("x".parse::<DropList>().is_err());
    }

    /// A bad droplist or name is refused for its own reason, in the words
    /// the config file's author reads.
    #[test]
    fn malformed_droplists_and_names_give_their_own_error() {
        for (text, variant, message) in [
            (
                "5,x",
                DropListError::NotASegment("x".into()),
                "droplist entry `x` is not a segment number or range like 310-315",
            ),
            (
                "9-3",
                DropListError::Backwards("9-3".into()),
                "droplist range `9-3` runs backwards",
            ),
            (
                "1-2000000",
                DropListError::TooMany("1-2000000".into()),
                "droplist `1-2000000`: at most a million drops can be scripted",
            ),
        ] {
            assert_eq!(text.parse::<DropList>(), Err(variant.clone()));
            assert_eq!(variant.to_string(), message);
        }
        let e = "Westwood".parse::<CcKind>().unwrap_err();
        assert_eq!(
            e,
            UnknownName {
                given: "Westwood".into(),
                what: "a congestion controller",
                names: &["aimd", "cubic", "bbr", "vegas"],
            }
        );
        assert_eq!(
            e.to_string(),
            "`Westwood` is not a congestion controller (aimd, cubic, bbr, vegas)"
        );
    }

    #[test]
    fn flags_and_aliases() {
        let mut t = Tuning::default();
        t.set("--dup-thresh", "9").unwrap();
        t.set("rcvrwin", "60").unwrap();
        t.set("delack", "200ms").unwrap();
        t.set("timeout", "0.5").unwrap();
        assert_eq!(t.dup_thresh, 9);
        assert_eq!(t.rcvwin, 60);
        assert_eq!(t.delack, Duration::from_millis(200));
        assert_eq!(t.timeout, Duration::from_millis(500));
        assert!(t.set("multiplier", "1.5").is_err());
        assert!(t.set("mss", "20").is_err());
    }

    #[test]
    fn cc_names_a_controller() {
        let mut t = Tuning::default();
        t.set("--cc", "AIMD").unwrap();
        assert_eq!(t.cc, CcKind::Aimd);
        let e = t.set("cc", "westwood").unwrap_err();
        assert!(e.message.contains("aimd"), "{e}");
        for kind in CcKind::ALL {
            assert_eq!(kind.name().parse::<CcKind>(), Ok(kind));
        }
    }

    /// `named_enum!`: each enum reads its names in any case, writes them
    /// back, and a bad name's error lists them all.
    #[test]
    fn named_enums_read_and_write_their_names() {
        fn check<T: FromStr<Err = UnknownName> + fmt::Display + PartialEq + fmt::Debug + Copy>(
            all: &[T],
            names: &str,
        ) {
            for &v in all {
                let name = v.to_string();
                assert_eq!(name.parse::<T>(), Ok(v));
                assert_eq!(name.to_ascii_uppercase().parse::<T>(), Ok(v));
            }
            let e = "wibble".parse::<T>().unwrap_err().to_string();
            assert!(e.starts_with("`wibble` is not "), "{e}");
            assert!(e.ends_with(&format!("({names})")), "{e}");
        }
        check(&RecoveryKind::ALL, "reno, newreno, sack, fack, rack");
        check(&CcKind::ALL, "aimd, cubic, bbr, vegas");
        check(&ReductionKind::ALL, "prr, halve");
        check(&ReorderingKind::ALL, "fixed, adaptive");
        check(&SsthreshEstimate::ALL, "none, hoe");
    }

    /// The `knobs!` table gives `set` and `get` every knob and alias that
    /// [`KNOBS`] lists, and nothing else.
    #[test]
    fn knobs_list_what_set_and_get_know() {
        let mut t = Tuning::default();
        for k in KNOBS {
            for name in std::iter::once(&k.name).chain(k.aliases) {
                let text = t.get(name).unwrap_or_else(|| panic!("get {name}"));
                t.set(name, &text)
                    .unwrap_or_else(|e| panic!("set {name}: {e}"));
            }
        }
        assert_eq!(t, Tuning::default());
        assert_eq!(t.get("rcvrwin"), t.get("rcvwin"));
        assert_eq!(t.get("sack"), None, "atou's flags are set-only");
        assert_eq!(t.get("wibble"), None);
    }

    /// BBR's loss response reads percentages with or without `%`, writes
    /// them back with it, and applies to `--cc bbr` only.
    #[test]
    fn bbr_knobs_parse_and_apply_to_bbr_only() {
        let mut t = Tuning::default();
        t.set("bbr-loss-thresh", "20%").unwrap();
        assert_eq!(t.bbr_loss_thresh, 20.0);
        assert_eq!(t.get("bbr_loss_thresh").unwrap(), "20%");
        t.set("bbr_loss_thresh", "0.5").unwrap();
        assert_eq!(t.bbr_loss_thresh, 0.5);
        assert!(t.set("bbr_loss_thresh", "0%").is_err());
        assert!(t.set("bbr_beta", "1").is_err());
        assert_eq!(t.validate().unwrap_err().key, "bbr_loss_thresh");
        t.cc = CcKind::Bbr;
        t.validate().unwrap();
    }

    /// An atou config file means AIMD, whatever was selected before it,
    /// unless it names a controller itself.
    #[test]
    fn a_config_file_means_aimd() {
        let mut t = Tuning {
            cc: CcKind::Cubic,
            ..Tuning::default()
        };
        t.apply_config("rcvwin 100\n").unwrap();
        assert_eq!(t.cc, CcKind::Aimd);
        t.apply_config("cc cubic\nrcvwin 100\n").unwrap();
        assert_eq!(t.cc, CcKind::Cubic);
    }

    /// `bwlimit` takes a rate with its unit, reads 0 as no cap, refuses
    /// rsync's bare KiB/s and `M`, and writes back what it reads.
    #[test]
    fn bwlimit_needs_a_unit_and_round_trips() {
        let mut t = Tuning::default();
        t.set("bwlimit", "20mbit").unwrap();
        assert_eq!(t.bwlimit, 20_000_000);
        assert_eq!(t.get("bwlimit").unwrap(), "20mbit");
        t.set("bwlimit", "2.5mbps").unwrap();
        assert_eq!(t.bwlimit, 20_000_000, "tc's bytes per second");
        for bare in ["1000", "10M", "10m", "5k"] {
            let e = t.set("bwlimit", bare).unwrap_err();
            assert!(e.message.contains("needs a unit"), "{bare}: {e}");
        }
        assert!(t.set("bwlimit", "10furlongs").is_err());
        t.set("bwlimit", "0").unwrap();
        assert_eq!((t.bwlimit, t.get("bwlimit").unwrap()), (0, "0".to_string()));
    }

    #[test]
    fn thresh_init_is_a_fraction_of_rcvwin() {
        let t = Tuning {
            rcvwin: 50,
            thresh_init: 1.28,
            ..Tuning::default()
        };
        assert_eq!(t.initial_ssthresh(), 64);
        assert_eq!(Tuning::default().initial_ssthresh(), u64::MAX);
    }

    /// The commands' defaults: bbr with rack and undo; an atou
    /// config file means atou's baseline unless it names others.
    #[test]
    fn commands_default_to_bbr_with_rack_config_files_to_atous_baseline() {
        let t = Tuning::command_default();
        assert_eq!(
            (t.cc, t.recovery, t.undo),
            (CcKind::Bbr, RecoveryKind::Rack, true)
        );
        t.validate().unwrap();
        let mut t = Tuning::command_default();
        t.apply_config("rcvrwin 26\n").unwrap();
        assert_eq!(
            (t.cc, t.recovery, t.undo),
            (CcKind::Aimd, RecoveryKind::Sack, false)
        );
        let mut t = Tuning::command_default();
        t.apply_config("cc bbr\nrecovery rack\nundo 1\n").unwrap();
        assert_eq!(
            (t.cc, t.recovery, t.undo),
            (CcKind::Bbr, RecoveryKind::Rack, true)
        );
    }
}
