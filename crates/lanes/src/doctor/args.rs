//! `lanes doctor`'s command line: target URLs (the IQN and LUN optional), credentials, output
//! and probe options.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use lanes_initiator::{IscsiUrl, UrlError};

/// Checks a target's portals and paths and prints the host configuration that works.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// iscsi://[user%secret@]HOST[:PORT][/IQN[/LUN]]; give several when discovery does not list
    /// every portal. Without an IQN every target found is checked, without a LUN every disk LUN.
    /// Or smb://[DOMAIN;]USER@HOST[:PORT]/SHARE for an SMB server's multichannel set-up.
    #[arg(value_name = "URL", required = true)]
    pub urls: Vec<String>,
    /// CHAP user name (one-way CHAP).
    #[arg(long, requires = "chap_secret_file")]
    pub chap_user: Option<String>,
    /// File holding the CHAP secret (one line).
    #[arg(long, value_name = "FILE", requires = "chap_user")]
    pub chap_secret_file: Option<PathBuf>,
    /// Initiator name [default: the one in /etc/iscsi/initiatorname.iscsi, else
    /// iqn.2026-11.io.lanes:doctor].
    #[arg(long)]
    pub initiator_name: Option<String>,
    /// Write every check (name, verdict, detail, measurements) and the configuration as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Skip the throughput probe.
    #[arg(long)]
    pub quick: bool,
    /// Length of each throughput measurement (e.g. 3s, 500ms).
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub probe_time: Duration,
    /// SMB: file holding the password (one line) [default: $LANES_SMB_PASSWORD].
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// SMB: ask for encryption (AES-128-GCM) and report whether the server grants it.
    #[arg(long)]
    pub encrypt: bool,
    /// Limit for a connect and login, and for each command.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `3s`, `500ms`, `2` (seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else {
        (text, 1.0)
    };
    number
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0 && *v * scale <= 3600.0)
        .map(|v| Duration::from_secs_f64(v * scale))
        .ok_or_else(|| format!("'{text}' is not a duration: expected e.g. 3s or 500ms"))
}

/// What one URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoctorUrl {
    /// `host:port` (IPv6 in brackets).
    pub portal: String,
    pub target: Option<String>,
    pub lun: Option<u64>,
    pub chap: Option<(String, String)>,
}

/// Parses `iscsi://[user%secret@]HOST[:PORT][/IQN[/LUN]]`, leaving what is absent open.
pub fn parse_url(text: &str) -> Result<DoctorUrl, UrlError> {
    // The initiator's URL type wants IQN and LUN: fill in what is missing and forget it again,
    // so host, port and credentials are checked by the same rules everywhere.
    const PLACEHOLDER: &str = "iqn.2026-11.io.lanes:doctor-placeholder";
    let trimmed = text.trim_end_matches('/');
    let path = trimmed
        .strip_prefix("iscsi://")
        .and_then(|rest| rest.split_once('/'))
        .map(|(_, path)| path)
        .unwrap_or("");
    let segments = path.split('/').filter(|s| !s.is_empty()).count();
    let (full, has_target, has_lun) = match segments {
        0 => (format!("{trimmed}/{PLACEHOLDER}/0"), false, false),
        1 => (format!("{trimmed}/0"), true, false),
        _ => (trimmed.to_string(), true, true),
    };
    let url: IscsiUrl = full.parse()?;
    Ok(DoctorUrl {
        portal: url.portal(),
        target: has_target.then_some(url.target),
        lun: has_lun.then_some(url.lun),
        chap: url.chap,
    })
}

/// The initiator name open-iscsi on this host uses, else ours.
pub fn default_initiator_name() -> String {
    std::fs::read_to_string("/etc/iscsi/initiatorname.iscsi")
        .ok()
        .and_then(|text| {
            text.lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .find_map(|l| l.trim().strip_prefix("InitiatorName=").map(str::to_string))
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "iqn.2026-11.io.lanes:doctor".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_may_leave_out_target_and_lun() {
        let u = parse_url("iscsi://10.0.0.1").unwrap();
        assert_eq!(u.portal, "10.0.0.1:3260");
        assert_eq!((u.target, u.lun), (None, None));
        let u = parse_url("iscsi://10.0.0.1:3261/iqn.2026-11.io.lanes:x/").unwrap();
        assert_eq!(u.portal, "10.0.0.1:3261");
        assert_eq!(u.target.as_deref(), Some("iqn.2026-11.io.lanes:x"));
        assert_eq!(u.lun, None);
        let u = parse_url("iscsi://bob%secretsecret@[::1]/iqn.a:b/3").unwrap();
        assert_eq!(u.portal, "[::1]:3260");
        assert_eq!(u.lun, Some(3));
        assert_eq!(u.chap, Some(("bob".into(), "secretsecret".into())));
        assert!(parse_url("http://x").is_err());
        assert!(parse_url("iscsi://h:0").is_err());
        assert!(parse_url("iscsi://h/iqn.a:b/x").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
