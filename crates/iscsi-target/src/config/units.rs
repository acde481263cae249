//! Human-friendly sizes (`512M`, `1.5G`) and durations (`5s`, `500ms`).

use std::time::Duration;

/// Parses a size in bytes. Suffixes are powers of 1024: `K`, `M`, `G`, `T`, `P`, optionally
/// followed by `iB` or `B` (`1G` = `1GiB` = `1GB` = 2^30 bytes), case-insensitive. A plain number
/// is bytes. A fraction is allowed when the result is a whole number of bytes (`1.5G`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let number = number.replace('_', "");
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        other => {
            return Err(format!(
                "unknown size suffix {other:?} in {text:?} (use K, M, G, T or P, powers of 1024)"
            ))
        }
    };
    let garbage = || format!("{text:?} is not a size (examples: 4096, 512M, 1G, 1.5T)");
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number.as_str(), ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(garbage());
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit())
        || (number.contains('.') && fraction.is_empty())
    {
        return Err(garbage());
    }
    let too_big = || format!("{text:?} is too large");
    let whole: u128 = whole.parse().map_err(|_| too_big())?;
    let mut bytes = whole.checked_shl(shift).ok_or_else(too_big)?;
    if !fraction.is_empty() {
        if fraction.len() > 18 {
            return Err(garbage());
        }
        let numerator: u128 = fraction.parse().map_err(|_| garbage())?;
        let denominator = 10u128.pow(fraction.len() as u32);
        let scaled = numerator << shift;
        if !scaled.is_multiple_of(denominator) {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        bytes += scaled / denominator;
    }
    u64::try_from(bytes).map_err(|_| too_big())
}

/// Parses a duration: `500ms`, `5s`, `2m`, `1h`, or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (examples: 500ms, 5s, 2m)"))?;
    let duration = match unit.trim() {
        "ms" => Some(Duration::from_millis(value)),
        "" | "s" => Some(Duration::from_secs(value)),
        "m" | "min" => value.checked_mul(60).map(Duration::from_secs),
        "h" => value.checked_mul(3600).map(Duration::from_secs),
        other => {
            return Err(format!(
                "unknown duration unit {other:?} in {text:?} (use ms, s, m or h)"
            ))
        }
    };
    duration.ok_or_else(|| format!("{text:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("10_000"), Ok(10_000));
        for bad in ["12Q", "", "G", "1.G", ".5G", "1..5G", "-1G", "1 G G", "0.1"] {
            assert!(parse_size(bad).is_err(), "{bad:?} accepted");
        }
        assert!(parse_size("99999999P").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("s").is_err());
    }
}
