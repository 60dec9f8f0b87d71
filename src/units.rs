//! Parsing and printing of the quantities a person types and reads.
//!
//! Rates are bits per second, 1000-based, as `tc` and `iperf3` print them.
//! Sizes are bytes; `K`/`M`/`G` and `KiB`/`MiB`/`GiB` are 1024-based,
//! `KB`/`MB`/`GB` 1000-based. Durations take `us`, `ms` or `s`; a bare number
//! is in the unit the caller names (atou's knobs mix seconds and milliseconds).

use std::time::Duration;

/// The unit a bare number is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    Micros,
    Millis,
    Seconds,
}

/// Splits `12.5ms` into 12.5 and `ms`; `what` names the expected form.
fn split_number<'a>(s: &'a str, what: &str) -> Result<(f64, &'a str), String> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    match num.parse::<f64>() {
        Ok(value) if value.is_finite() => Ok((value, unit.trim())),
        _ => Err(format!("`{s}` is not {what}")),
    }
}

/// Parses `200ms`, `1.5s`, `50us`, or a bare number in `bare`.
pub fn parse_duration(s: &str, bare: TimeUnit) -> Result<Duration, String> {
    let (value, unit) = split_number(s, "a time like 50ms")?;
    if value < 0.0 {
        return Err(format!("`{s}`: a duration cannot be negative"));
    }
    let secs = match unit.to_ascii_lowercase().as_str() {
        "" => match bare {
            TimeUnit::Micros => value / 1e6,
            TimeUnit::Millis => value / 1e3,
            TimeUnit::Seconds => value,
        },
        "ns" => value / 1e9,
        "us" | "usec" | "usecs" | "µs" => value / 1e6,
        "ms" | "msec" | "msecs" => value / 1e3,
        "s" | "sec" | "secs" => value,
        "m" | "min" => value * 60.0,
        other => {
            return Err(format!(
                "`{s}`: unknown time unit `{other}` (use us, ms or s)"
            ))
        }
    };
    if secs > 1e9 {
        return Err(format!("`{s}` is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses a rate in bits per second: `100mbit`, `1.6mbit`, `128kbit`, `10gbit`,
/// `500bit`; `bps`, `kbps`, `mbps`, `gbps` are bytes per second, as in tc(8).
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let (value, unit) = split_number(s, "a rate like 100mbit")?;
    let unit_l = unit.to_ascii_lowercase();
    let mult = match unit_l.as_str() {
        "" | "bit" => 1.0,
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        "tbit" => 1e12,
        "kibit" => 1024.0,
        "mibit" => 1024.0 * 1024.0,
        "gibit" => 1024.0 * 1024.0 * 1024.0,
        "bps" => 8.0,
        "kbps" => 8e3,
        "mbps" => 8e6,
        "gbps" => 8e9,
        other => {
            return Err(format!(
                "`{s}`: unknown rate unit `{other}` (use bit, kbit, mbit, gbit, or bps for bytes/s)"
            ))
        }
    };
    let bits = value * mult;
    if !(1.0..=1e15).contains(&bits) {
        return Err(format!("`{s}`: rate must be between 1bit and 1000tbit"));
    }
    Ok(bits.round() as u64)
}

/// Parses a size in bytes: `1500`, `64KiB`, `100M` (MiB), `100MB` (10^8).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let (value, unit) = split_number(s, "a size like 64MiB")?;
    if value < 0.0 {
        return Err(format!("`{s}`: a size cannot be negative"));
    }
    let mult: f64 = match unit {
        "" | "B" | "b" => 1.0,
        "K" | "k" | "KiB" | "kiB" => 1024.0,
        "M" | "m" | "MiB" => 1024.0 * 1024.0,
        "G" | "g" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "t" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => {
            return Err(format!(
                "`{s}`: unknown size unit `{other}` (use K/M/G or KiB/MiB/GiB for 1024-based, KB/MB/GB for 1000-based)"
            ))
        }
    };
    let bytes = value * mult;
    if bytes > 1.0e18 {
        return Err(format!("`{s}` is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Parses a probability: `1%`, `0.5%`, or a bare fraction `0.01` (as tc does).
pub fn parse_probability(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let p = if let Some(num) = t.strip_suffix('%') {
        num.trim()
            .parse::<f64>()
            .map_err(|_| format!("`{s}` is not a percentage"))?
            / 100.0
    } else {
        t.parse::<f64>()
            .map_err(|_| format!("`{s}` is not a probability (write 1% or 0.01)"))?
    };
    if !(0.0..=1.0).contains(&p) {
        return Err(format!("`{s}` is not between 0% and 100%"));
    }
    Ok(p)
}

/// `12.345 Mbit/s`, 1000-based.
pub fn format_rate(bits_per_sec: f64) -> String {
    let (v, u) = if bits_per_sec >= 1e9 {
        (bits_per_sec / 1e9, "Gbit/s")
    } else if bits_per_sec >= 1e6 {
        (bits_per_sec / 1e6, "Mbit/s")
    } else if bits_per_sec >= 1e3 {
        (bits_per_sec / 1e3, "kbit/s")
    } else {
        (bits_per_sec, "bit/s")
    };
    format!("{v:.3} {u}")
}

/// `64.0 MiB`, 1024-based.
pub fn format_size(bytes: u64) -> String {
    let b = bytes as f64;
    const K: f64 = 1024.0;
    if b >= K * K * K {
        format!("{:.2} GiB", b / (K * K * K))
    } else if b >= K * K {
        format!("{:.2} MiB", b / (K * K))
    } else if b >= K {
        format!("{:.2} KiB", b / K)
    } else {
        format!("{bytes} B")
    }
}

/// Seconds with microsecond precision, the way atou prints times.
pub fn secs6(d: Duration) -> String {
    format!("{:.6}", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(
            parse_duration("200ms", TimeUnit::Seconds),
            Ok(Duration::from_millis(200))
        );
        assert_eq!(
            parse_duration("200", TimeUnit::Millis),
            Ok(Duration::from_millis(200))
        );
        assert_eq!(
            parse_duration("0.5", TimeUnit::Seconds),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_duration("50us", TimeUnit::Seconds),
            Ok(Duration::from_micros(50))
        );
        assert!(parse_duration("5 parsecs", TimeUnit::Seconds).is_err());
        assert!(parse_duration("-1", TimeUnit::Seconds).is_err());
        assert!(parse_duration("", TimeUnit::Seconds).is_err());
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
        assert_eq!(parse_probability("1%"), Ok(0.01));
        assert_eq!(parse_probability("0.25"), Ok(0.25));
        assert!(parse_probability("101%").is_err());
        assert!(parse_probability("lots").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_rate(1_534_000.0), "1.534 Mbit/s");
        assert_eq!(format_size(64 << 20), "64.00 MiB");
        assert_eq!(format_size(12), "12 B");
    }
}
