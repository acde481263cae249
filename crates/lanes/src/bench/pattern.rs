//! The seeds' access patterns, and the parsing of `--duration` and `--size`.

use std::time::Duration;

use anyhow::{bail, Context as _};

/// One access pattern of the seeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pattern {
    pub name: &'static str,
    /// Bytes per I/O.
    pub block: usize,
    /// Share of reads, in percent.
    pub read_percent: u64,
    pub random: bool,
    /// Fixed queue depth 1 on one thread.
    pub qd1: bool,
}

const fn p(
    name: &'static str,
    block: usize,
    read_percent: u64,
    random: bool,
    qd1: bool,
) -> Pattern {
    Pattern {
        name,
        block,
        read_percent,
        random,
        qd1,
    }
}

/// DiskSpd's and fio's patterns from the seeds, in the order the table and charts show them.
pub const PATTERNS: &[Pattern] = &[
    p("4k-randread", 4096, 100, true, false),
    p("4k-randwrite", 4096, 0, true, false),
    p("8k-randrw-67", 8192, 67, true, false),
    p("8k-seqrw-67", 8192, 67, false, false),
    p("64k-seqread", 65536, 100, false, false),
    p("64k-seqwrite", 65536, 0, false, false),
    p("128k-seqread", 131_072, 100, false, false),
    p("256k-seqread", 262_144, 100, false, false),
    p("256k-seqwrite", 262_144, 0, false, false),
    p("1m-seqread", 1 << 20, 100, false, false),
    p("1m-seqwrite", 1 << 20, 0, false, false),
    p("1m-seqread-qd1", 1 << 20, 100, false, true),
];

pub fn pattern(name: &str) -> anyhow::Result<Pattern> {
    PATTERNS
        .iter()
        .find(|p| p.name == name)
        .copied()
        .with_context(|| {
            let known: Vec<_> = PATTERNS.iter().map(|p| p.name).collect();
            format!("unknown pattern '{name}' (known: {})", known.join(", "))
        })
}

/// Where a pattern sits in `PATTERNS` (charts order their bars by it); unknown names last.
pub fn order(name: &str) -> usize {
    PATTERNS
        .iter()
        .position(|p| p.name == name)
        .unwrap_or(PATTERNS.len())
}

pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let bad = || format!("bad --duration '{s}': expected e.g. 10s, 500ms, 2m");
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.trim().parse().ok().with_context(bad)?;
    let secs = match unit {
        "" | "s" => n,
        "ms" => n / 1000.0,
        "m" | "min" => n * 60.0,
        _ => bail!(bad()),
    };
    if !(secs.is_finite() && secs > 0.0 && secs < 86_400.0) {
        bail!(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let bad = || format!("bad --size '{s}': expected e.g. 64M, 1G, 1048576");
    let (num, unit) = s.split_at(s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len()));
    let n: f64 = num.trim().parse().ok().with_context(bad)?;
    let mult = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1u64,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => bail!(bad()),
    };
    let v = n * mult as f64;
    if !(v.is_finite() && v >= 1.0 && v < 2f64.powi(62)) {
        bail!(bad());
    }
    Ok(v as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_options() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
        assert!(pattern("4k-randread").is_ok());
        assert!(pattern("5k").is_err());
    }

    #[test]
    fn patterns_are_whole_4k_blocks_with_unique_names() {
        for (i, p) in PATTERNS.iter().enumerate() {
            assert_eq!(p.block % 4096, 0, "{}", p.name);
            assert_eq!(order(p.name), i);
        }
        assert_eq!(order("nope"), PATTERNS.len());
    }
}
