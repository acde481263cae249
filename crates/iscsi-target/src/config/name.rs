//! iSCSI name validation (RFC 7143 4.2.7, RFC 3720 3.2.6, RFC 3722 stringprep profile).

/// Longest iSCSI name in bytes (RFC 7143 4.2.7.1: "not larger than 223 bytes").
pub const MAX_NAME_LENGTH: usize = 223;

/// Checks that `name` is a valid iSCSI name in its normalized form:
///
/// - `iqn.YYYY-MM.reversed.domain[:anything]` in lowercase letters, digits, `-`, `.` and `:`
///   (RFC 7143 4.2.7.2; stringprep maps names to lowercase, so an uppercase letter would make the
///   name we announce differ from the one initiators compare against);
/// - `eui.` followed by 16 hex digits (RFC 7143 4.2.7.3);
/// - `naa.` followed by 16 or 32 hex digits (RFC 7143 4.2.7.4).
///
/// Returns a human-readable reason on failure.
pub fn validate_iscsi_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("iSCSI name is empty".into());
    }
    if name.len() > MAX_NAME_LENGTH {
        return Err(format!(
            "iSCSI name is {} bytes, longer than {MAX_NAME_LENGTH}",
            name.len()
        ));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("iqn.") {
        if !name.starts_with("iqn.") {
            return Err("the `iqn.` prefix must be lowercase".into());
        }
        return validate_iqn(&name[4..]).map_err(|reason| format!("{reason} in {name:?}"));
    } else if lower.starts_with("eui.") {
        return validate_hex(name, &name[4..], &[16]);
    } else if lower.starts_with("naa.") {
        return validate_hex(name, &name[4..], &[16, 32]);
    }
    Err(format!(
        "{name:?} is not an iSCSI name: it must start with `iqn.`, `eui.` or `naa.` \
         (e.g. iqn.2026-11.io.lanes:disk0)"
    ))
}

fn validate_iqn(rest: &str) -> Result<(), String> {
    let date = rest.get(..7).ok_or("missing `YYYY-MM.` date")?;
    let bytes = date.as_bytes();
    let date_ok = bytes.iter().enumerate().all(|(i, b)| match i {
        4 => *b == b'-',
        _ => b.is_ascii_digit(),
    });
    if !date_ok {
        return Err(format!("date {date:?} is not YYYY-MM"));
    }
    let month: u32 = date[5..7].parse().map_err(|_| "bad month".to_string())?;
    if !(1..=12).contains(&month) {
        return Err(format!("month {month:02} is not 01..12"));
    }
    let after_date = &rest[7..];
    let authority = after_date
        .strip_prefix('.')
        .ok_or("missing `.` and naming authority after the date")?;
    let (domain, _unique) = match authority.split_once(':') {
        Some((domain, unique)) => (domain, Some(unique)),
        None => (authority, None),
    };
    if domain.is_empty() || domain.split('.').any(str::is_empty) {
        return Err(
            "naming authority (reversed domain name) is empty or has an empty label".into(),
        );
    }
    if let Some(bad) = rest
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | ':')))
    {
        return Err(if bad.is_ascii_uppercase() {
            format!("uppercase {bad:?} (iSCSI names are lowercase)")
        } else {
            format!("character {bad:?} not allowed (use a-z, 0-9, '-', '.', ':')")
        });
    }
    Ok(())
}

fn validate_hex(name: &str, digits: &str, lengths: &[usize]) -> Result<(), String> {
    if !lengths.contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        let expected = lengths
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(format!(
            "{name:?} must be `{}` followed by {expected} hex digits",
            &name[..4]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for name in [
            "iqn.2026-11.io.lanes:host",
            "iqn.1991-05.com.microsoft:win-host.example.com",
            "iqn.2005-03.org.open-iscsi:1c2f4a5b",
            "iqn.2001-04.com.example",
            "eui.02004567A425678D",
            "naa.52004567BA64678D",
            "naa.62004567BA64678D0123456789ABCDEF",
        ] {
            assert_eq!(validate_iscsi_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn rejects_invalid_names() {
        for name in [
            "",
            "iqn.",
            "iqn.2026.io.lanes",
            "iqn.2026-13.io.lanes",
            "iqn.2026-11",
            "iqn.2026-11.:x",
            "iqn.2026-11.io.Lanes:x",
            "iqn.2026-11.io.lanes:with space",
            "IQN.2026-11.io.lanes",
            "eui.123",
            "naa.XYZ4567BA64678D",
            "target0",
        ] {
            assert!(validate_iscsi_name(name).is_err(), "{name:?} accepted");
        }
        assert!(validate_iscsi_name(&format!("iqn.2026-11.io.lanes:{}", "a".repeat(220))).is_err());
    }
}
