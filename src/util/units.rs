//! Parsing and printing of the quantities a person types and reads.
//!
//! Rates are bits per second, 1000-based, as `tc` and `iperf3` print them.
//! Sizes are bytes; `K`/`M`/`G` and `KiB`/`MiB`/`GiB` are 1024-based,
//! `KB`/`MB`/`GB` 1000-based. Durations take `ns`, `us`, `ms` or `s`; a bare
//! number is in the unit the caller names (atou's knobs mix seconds and
//! milliseconds).
//!
//! Numbers are read as exact decimals, never through floating point, and
//! printed exactly, so what a trace header or a summary prints parses back
//! to the same value: a run can be repeated from its own record.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// Why a quantity a person typed was not read. `text` is what was typed,
/// trimmed, as the message quotes it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UnitError {
    /// `expected` names the form wanted: "a time like 50ms".
    #[error("`{text}` is not {expected}")]
    NotANumber {
        text: String,
        expected: &'static str,
    },
    #[error("`{text}`: unknown time unit `{unit}` (use us, ms, s, m, h or d)")]
    UnknownTimeUnit { text: String, unit: String },
    #[error(
        "`{text}`: unknown rate unit `{unit}` (use bit, kbit, mbit, gbit, or bps for bytes/s)"
    )]
    UnknownRateUnit { text: String, unit: String },
    #[error(
        "`{text}`: unknown size unit `{unit}` (use K/M/G or KiB/MiB/GiB for 1024-based, KB/MB/GB for 1000-based)"
    )]
    UnknownSizeUnit { text: String, unit: String },
    #[error("`{0}` is too long")]
    DurationTooLong(String),
    #[error("`{0}`: rate must be between 1bit and 1000tbit")]
    RateOutOfRange(String),
    #[error("`{0}` is too large")]
    SizeTooLarge(String),
    #[error("`{0}` is not between 0% and 100%")]
    PercentOutOfRange(String),
}

/// The unit a bare number is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeUnit {
    Micros,
    Millis,
    Seconds,
}

/// A non-negative decimal read exactly: `mantissa / 10^fraction_digits`.
#[derive(Debug, Clone, Copy)]
struct Decimal {
    mantissa: u128,
    fraction_digits: u32,
}

impl Decimal {
    /// `self × mult`, rounded to the nearest integer; `None` on overflow.
    fn times(self, mult: u128) -> Option<u128> {
        let den = 10u128.pow(self.fraction_digits);
        let num = self.mantissa.checked_mul(mult)?;
        Some((num + den / 2) / den)
    }
}

/// Splits `12.5ms` into an exact 12.5 and `ms`; `what` names the expected form.
fn split_number<'a>(s: &'a str, what: &'static str) -> Result<(Decimal, &'a str), UnitError> {
    let t = s.trim();
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(end);
    let bad = || UnitError::NotANumber {
        text: t.to_string(),
        expected: what,
    };
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || int.len() + frac.len() > 24 || frac.contains('.') {
        return Err(bad());
    }
    let digits = format!("{int}{frac}");
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    Ok((
        Decimal {
            mantissa,
            fraction_digits: frac.len() as u32,
        },
        unit.trim(),
    ))
}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// Parses `200ms`, `1.5s`, `50us`, `250ns`, or a bare number in `bare`.
pub(crate) fn parse_duration(s: &str, bare: TimeUnit) -> Result<Duration, UnitError> {
    let (value, unit) = split_number(s, "a time like 50ms")?;
    let nanos_per_unit: u128 = match unit.to_ascii_lowercase().as_str() {
        "" => match bare {
            TimeUnit::Micros => 1_000,
            TimeUnit::Millis => 1_000_000,
            TimeUnit::Seconds => NANOS_PER_SEC,
        },
        "ns" | "nsec" => 1,
        "us" | "usec" | "usecs" | "µs" => 1_000,
        "ms" | "msec" | "msecs" => 1_000_000,
        "s" | "sec" | "secs" => NANOS_PER_SEC,
        "m" | "min" => 60 * NANOS_PER_SEC,
        "h" | "hour" | "hours" => 3600 * NANOS_PER_SEC,
        "d" | "day" | "days" => 86_400 * NANOS_PER_SEC,
        other => {
            return Err(UnitError::UnknownTimeUnit {
                text: s.trim().to_string(),
                unit: other.to_string(),
            })
        }
    };
    let nanos = value
        .times(nanos_per_unit)
        .filter(|&n| n <= 1_000_000_000 * NANOS_PER_SEC)
        .ok_or_else(|| UnitError::DurationTooLong(s.trim().to_string()))?;
    Ok(Duration::from_nanos(nanos as u64))
}

/// Parses a rate in bits per second: `100mbit`, `1.6mbit`, `128kbit`, `10gbit`,
/// `500bit`; `bps`, `kbps`, `mbps`, `gbps` are bytes per second, as in tc(8).
pub(crate) fn parse_rate(s: &str) -> Result<u64, UnitError> {
    let (value, unit) = split_number(s, "a rate like 100mbit")?;
    let mult: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "bit" => 1,
        "kbit" => 1_000,
        "mbit" => 1_000_000,
        "gbit" => 1_000_000_000,
        "tbit" => 1_000_000_000_000,
        "kibit" => 1 << 10,
        "mibit" => 1 << 20,
        "gibit" => 1 << 30,
        "bps" => 8,
        "kbps" => 8_000,
        "mbps" => 8_000_000,
        "gbps" => 8_000_000_000,
        other => {
            return Err(UnitError::UnknownRateUnit {
                text: s.trim().to_string(),
                unit: other.to_string(),
            })
        }
    };
    match value.times(mult) {
        Some(bits) if (1..=1_000_000_000_000_000).contains(&bits) => Ok(bits as u64),
        _ => Err(UnitError::RateOutOfRange(s.trim().to_string())),
    }
}

/// Parses a size in bytes: `1500`, `64KiB`, `100M` (MiB), `100MB` (10^8).
pub(crate) fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (value, unit) = split_number(s, "a size like 64MiB")?;
    let mult: u128 = match unit {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "kiB" => 1 << 10,
        "M" | "m" | "MiB" => 1 << 20,
        "G" | "g" | "GiB" => 1 << 30,
        "T" | "t" | "TiB" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(UnitError::UnknownSizeUnit {
                text: s.trim().to_string(),
                unit: other.to_string(),
            })
        }
    };
    value
        .times(mult)
        .filter(|&b| b <= 1_000_000_000_000_000_000)
        .map(|b| b as u64)
        .ok_or_else(|| UnitError::SizeTooLarge(s.trim().to_string()))
}

/// A probability, held exactly in parts per billion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Probability(u32);

impl Probability {
    pub const ZERO: Probability = Probability(0);
    pub const ONE: Probability = Probability(1_000_000_000);

    pub fn from_ppb(ppb: u32) -> Probability {
        Probability(ppb.min(Self::ONE.0))
    }

    pub fn ppb(self) -> u32 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// True with this probability, given a uniformly random `u64`.
    pub fn happens(self, random: u64) -> bool {
        self.0 > 0 && random % 1_000_000_000 < u64::from(self.0)
    }
}

/// Parses a percentage, `1%` or `0.5%`. A bare number is a percentage too,
/// as tc(8) reads it (`loss 1` is 1 %, `loss 0.01` is 0.01 %).
pub(crate) fn parse_probability(s: &str) -> Result<Probability, UnitError> {
    let t = s.trim();
    let num = t.strip_suffix('%').unwrap_or(t);
    const PERCENTAGE: &str = "a percentage like 1%";
    let (value, rest) = split_number(num, PERCENTAGE)?;
    if !rest.is_empty() {
        return Err(UnitError::NotANumber {
            text: t.to_string(),
            expected: PERCENTAGE,
        });
    }
    match value.times(10_000_000) {
        Some(ppb) if ppb <= 1_000_000_000 => Ok(Probability(ppb as u32)),
        _ => Err(UnitError::PercentOutOfRange(t.to_string())),
    }
}

/// Writes `int.frac` with trailing zeros of the fraction dropped.
fn write_fixed(f: &mut fmt::Formatter<'_>, value: u128, scale_digits: u32) -> fmt::Result {
    let den = 10u128.pow(scale_digits);
    let (int, frac) = (value / den, value % den);
    if frac == 0 {
        return write!(f, "{int}");
    }
    let frac = format!("{frac:0width$}", width = scale_digits as usize);
    write!(f, "{int}.{}", frac.trim_end_matches('0'))
}

impl fmt::Display for Probability {
    /// As a percentage, exactly: `1%`, `0.025%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_fixed(f, u128::from(self.0), 7)?;
        f.write_str("%")
    }
}

/// A duration as a number of `unit`s, exactly (`0.2` s, `1.5` ms).
pub(crate) struct Exact(pub Duration, pub TimeUnit);

impl fmt::Display for Exact {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = match self.1 {
            TimeUnit::Micros => 3,
            TimeUnit::Millis => 6,
            TimeUnit::Seconds => 9,
        };
        write_fixed(f, self.0.as_nanos(), digits)
    }
}

/// A duration as tc writes it: the largest unit that keeps it whole.
pub(crate) fn format_time_tc(d: Duration) -> String {
    let ns = d.as_nanos();
    for (div, unit) in [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")] {
        if ns % div == 0 {
            return format!("{}{unit}", ns / div);
        }
    }
    format!("{ns}ns")
}

/// A duration of whole seconds as a flag like `--staging-ttl` takes it:
/// `7d`, `12h`, `90m` or `45s`, the largest unit that divides it.
pub(crate) fn format_whole_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        _ if s % 86_400 == 0 => format!("{}d", s / 86_400),
        _ if s % 3600 == 0 => format!("{}h", s / 3600),
        _ if s % 60 == 0 => format!("{}m", s / 60),
        _ => format!("{s}s"),
    }
}

/// A rate as tc writes it: the largest unit that keeps it whole.
pub(crate) fn format_rate_tc(bits: u64) -> String {
    for (div, unit) in [
        (1_000_000_000, "gbit"),
        (1_000_000, "mbit"),
        (1_000, "kbit"),
    ] {
        if bits % div == 0 {
            return format!("{}{unit}", bits / div);
        }
    }
    format!("{bits}bit")
}

/// A size for people, 1024-based: `512 B`, `1.50 MiB`, `4.00 GiB`.
pub(crate) fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// A rate for people, in bits per second, 1000-based as iperf3 prints
/// them: `950 bit/s`, `94.3 Mbit/s`, `10.7 Gbit/s`.
pub(crate) fn format_rate(bits_per_sec: f64) -> String {
    let mut v = bits_per_sec;
    for unit in ["bit/s", "kbit/s", "Mbit/s", "Gbit/s"] {
        if v < 1000.0 {
            return if unit == "bit/s" {
                format!("{v:.0} {unit}")
            } else {
                format!("{v:.1} {unit}")
            };
        }
        v /= 1000.0;
    }
    format!("{v:.1} Tbit/s")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes_and_rates_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(4 << 30), "4.00 GiB");
        assert_eq!(format_rate(950.0), "950 bit/s");
        assert_eq!(format_rate(94_300_000.0), "94.3 Mbit/s");
        assert_eq!(format_rate(10.72e9), "10.7 Gbit/s");
    }

    #[test]
    fn durations() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("200ms", TimeUnit::Seconds), Ok(ms(200)));
        assert_eq!(parse_duration("200", TimeUnit::Millis), Ok(ms(200)));
        assert_eq!(parse_duration("0.5", TimeUnit::Seconds), Ok(ms(500)));
        assert_eq!(
            parse_duration("50us", TimeUnit::Seconds),
            Ok(Duration::from_micros(50))
        );
        assert_eq!(
            parse_duration("88888888888808", TimeUnit::Micros),
            Ok(Duration::from_micros(88_888_888_888_808)),
            "exact, not through f64"
        );
        for bad in ["5 parsecs", "-1", "", "1.2.3", "ms", "1e3ms"] {
            assert!(parse_duration(bad, TimeUnit::Seconds).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_are_1000_based_bits() {
        assert_eq!(parse_rate("100mbit"), Ok(100_000_000));
        assert_eq!(parse_rate("1.6mbit"), Ok(1_600_000));
        assert_eq!(parse_rate("128kbit"), Ok(128_000));
        assert_eq!(parse_rate("1mbps"), Ok(8_000_000));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("0mbit").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100MB"), Ok(100_000_000));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1500"), Ok(1500));
        assert!(parse_size("1Q").is_err());
    }

    #[test]
    fn probabilities() {
        assert_eq!(
            parse_probability("1%").map(Probability::ppb),
            Ok(10_000_000)
        );
        // A bare number is a percentage, as in tc.
        assert_eq!(
            parse_probability("0.25").map(Probability::ppb),
            Ok(2_500_000)
        );
        assert!(parse_probability("101%").is_err());
        assert!(parse_probability("lots").is_err());
        assert_eq!(Probability::from_ppb(250_000).to_string(), "0.025%");
        assert_eq!(Probability::from_ppb(10_000_000).to_string(), "1%");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_time_tc(Duration::from_micros(1500)), "1500us");
        assert_eq!(format_rate_tc(1_600_000), "1600kbit");
        assert_eq!(
            Exact(Duration::from_millis(200), TimeUnit::Seconds).to_string(),
            "0.2"
        );
        assert_eq!(
            Exact(Duration::from_micros(1500), TimeUnit::Millis).to_string(),
            "1.5"
        );
    }

    /// Each malformed quantity says which way it is wrong, in the words a
    /// person reads.
    #[test]
    fn malformed_quantities_name_their_fault() {
        let text = |s: &str| s.to_string();
        let cases: [(Result<(), UnitError>, UnitError, &str); 8] = [
            (
                parse_duration(" 1.2.3 ", TimeUnit::Seconds).map(drop),
                UnitError::NotANumber {
                    text: text("1.2.3"),
                    expected: "a time like 50ms",
                },
                "`1.2.3` is not a time like 50ms",
            ),
            (
                parse_duration("5 parsecs", TimeUnit::Seconds).map(drop),
                UnitError::UnknownTimeUnit {
                    text: text("5 parsecs"),
                    unit: text("parsecs"),
                },
                "`5 parsecs`: unknown time unit `parsecs` (use us, ms, s, m, h or d)",
            ),
            (
                parse_duration("2000000000s", TimeUnit::Seconds).map(drop),
                UnitError::DurationTooLong(text("2000000000s")),
                "`2000000000s` is too long",
            ),
            (
                parse_rate("3furlongs").map(drop),
                UnitError::UnknownRateUnit {
                    text: text("3furlongs"),
                    unit: text("furlongs"),
                },
                "`3furlongs`: unknown rate unit `furlongs` (use bit, kbit, mbit, gbit, or bps for bytes/s)",
            ),
            (
                parse_rate("0mbit").map(drop),
                UnitError::RateOutOfRange(text("0mbit")),
                "`0mbit`: rate must be between 1bit and 1000tbit",
            ),
            (
                parse_size("1Q").map(drop),
                UnitError::UnknownSizeUnit {
                    text: text("1Q"),
                    unit: text("Q"),
                },
                "`1Q`: unknown size unit `Q` (use K/M/G or KiB/MiB/GiB for 1024-based, KB/MB/GB for 1000-based)",
            ),
            (
                parse_size("2000000000T").map(drop),
                UnitError::SizeTooLarge(text("2000000000T")),
                "`2000000000T` is too large",
            ),
            (
                parse_probability("101%").map(drop),
                UnitError::PercentOutOfRange(text("101%")),
                "`101%` is not between 0% and 100%",
            ),
        ];
        for (got, variant, message) in cases {
            assert_eq!(got, Err(variant.clone()));
            assert_eq!(variant.to_string(), message);
        }
        assert_eq!(
            parse_probability("5 apples"),
            Err(UnitError::NotANumber {
                text: text("5 apples"),
                expected: "a percentage like 1%",
            })
        );
    }

    proptest! {
        /// Printing and parsing are exact inverses.
        #[test]
        fn printed_values_parse_back(ns in 0u64..=1_000_000_000_000_000_000, bits in 1u64..1_000_000_000_000_000,
                                     ppb in 0u32..=1_000_000_000) {
            let d = Duration::from_nanos(ns);
            prop_assert_eq!(parse_duration(&format_time_tc(d), TimeUnit::Seconds), Ok(d));
            for unit in [TimeUnit::Micros, TimeUnit::Millis, TimeUnit::Seconds] {
                prop_assert_eq!(parse_duration(&Exact(d, unit).to_string(), unit), Ok(d));
            }
            prop_assert_eq!(parse_rate(&format_rate_tc(bits)), Ok(bits));
            let p = Probability::from_ppb(ppb);
            prop_assert_eq!(parse_probability(&p.to_string()), Ok(p));
        }
    }
}
