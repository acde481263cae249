//! The `[limits]` section: bounds on everything a peer can make `lanes serve` hold (connections,
//! sessions, login time, queued commands, text negotiation), and how often hitting them is
//! logged.
//!
//! ```toml
//! [limits]
//! connections = 4096              # accepted connections in total; more are closed at once
//! connections-per-portal = 1024   # per listening address
//! sessions-per-initiator = 256    # sessions one InitiatorName may hold (all targets)
//! login-timeout = "15s"           # accept to full-feature phase, whatever the peer sends
//! commands-per-session = 128      # CmdSN window: MaxCmdSN = ExpCmdSN + this - 1
//! text-rounds = 64                # Text Request PDUs in one text exchange (C bit pieces)
//! text-keys = 256                 # key=value pairs in one login or text request
//! text-bytes = "64K"              # key text of one login or text request
//! send-backlog = "16M"            # responses queued for a peer that does not read them
//! log-interval = "60s"            # a limit hit is logged once per source and limit per interval
//! ```

use super::{parse_duration, parse_size, ConfigError};
use serde::Deserialize;
use std::ops::{Range, RangeInclusive};
use std::time::Duration;
use toml::Spanned;

/// The defaults of every `[limits]` key.
pub mod defaults {
    use std::time::Duration;

    pub const CONNECTIONS: usize = 4096;
    pub const CONNECTIONS_PER_PORTAL: usize = 1024;
    pub const SESSIONS_PER_INITIATOR: usize = 256;
    pub const LOGIN_TIMEOUT: Duration = Duration::from_secs(15);
    pub const COMMANDS_PER_SESSION: u32 = 128;
    pub const TEXT_ROUNDS: u32 = 64;
    pub const TEXT_KEYS: usize = 256;
    pub const TEXT_BYTES: usize = 64 * 1024;
    pub const SEND_BACKLOG: usize = 16 << 20;
    pub const LOG_INTERVAL: Duration = Duration::from_secs(60);
}

/// Resolved `[limits]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    /// Connections open at once over every portal (login phase included).
    pub connections: usize,
    /// Connections open at once on one listening address.
    pub connections_per_portal: usize,
    /// Sessions (discovery included) one InitiatorName may hold at once.
    pub sessions_per_initiator: usize,
    /// Longest time from accept to the full-feature phase.
    pub login_timeout: Duration,
    /// Requests a session may have queued or running: the CmdSN window it is offered.
    pub commands_per_session: u32,
    /// Text Request PDUs one full-feature text exchange may take before it is reset.
    pub text_rounds: u32,
    /// Key=value pairs one login or text request may carry.
    pub text_keys: usize,
    /// Bytes of key text one login or text request may carry.
    pub text_bytes: usize,
    /// Bytes of responses queued on one connection beyond which its requests are not read
    /// until the peer has read some.
    pub send_backlog: usize,
    /// A limit hit is logged once per source address and limit in this interval, with a count.
    pub log_interval: Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        use defaults as d;
        LimitsConfig {
            connections: d::CONNECTIONS,
            connections_per_portal: d::CONNECTIONS_PER_PORTAL,
            sessions_per_initiator: d::SESSIONS_PER_INITIATOR,
            login_timeout: d::LOGIN_TIMEOUT,
            commands_per_session: d::COMMANDS_PER_SESSION,
            text_rounds: d::TEXT_ROUNDS,
            text_keys: d::TEXT_KEYS,
            text_bytes: d::TEXT_BYTES,
            send_backlog: d::SEND_BACKLOG,
            log_interval: d::LOG_INTERVAL,
        }
    }
}

/// Largest CmdSN window offered: the orderer holds at most this many requests per session.
pub const MAX_COMMANDS_PER_SESSION: u32 = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(super) struct RawLimits {
    connections: Option<Spanned<i64>>,
    connections_per_portal: Option<Spanned<i64>>,
    sessions_per_initiator: Option<Spanned<i64>>,
    login_timeout: Option<Spanned<NumberOrText>>,
    commands_per_session: Option<Spanned<i64>>,
    text_rounds: Option<Spanned<i64>>,
    text_keys: Option<Spanned<i64>>,
    text_bytes: Option<Spanned<NumberOrText>>,
    send_backlog: Option<Spanned<NumberOrText>>,
    log_interval: Option<Spanned<NumberOrText>>,
}

/// A size or duration written as a bare number or as text with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(i64),
    Text(String),
}

/// Builds a located error from a span, a key path and a message (the file resolver's).
pub(super) type ErrorAt<'a> = &'a dyn Fn(Range<usize>, &str, String) -> ConfigError;

/// Resolves `[limits]`; absent keys keep their defaults.
pub(super) fn resolve(raw: RawLimits, error: ErrorAt<'_>) -> Result<LimitsConfig, ConfigError> {
    let mut out = LimitsConfig::default();
    let count = |value: &Option<Spanned<i64>>,
                 key: &str,
                 range: RangeInclusive<i64>,
                 default: usize|
     -> Result<usize, ConfigError> {
        let Some(value) = value else {
            return Ok(default);
        };
        let n = *value.get_ref();
        if !range.contains(&n) {
            return Err(error(
                value.span(),
                &format!("limits.{key}"),
                format!("must be {}..={}, got {n}", range.start(), range.end()),
            ));
        }
        usize::try_from(n).map_err(|_| error(value.span(), &format!("limits.{key}"), n.to_string()))
    };
    let duration = |value: &Option<Spanned<NumberOrText>>,
                    key: &str,
                    default: Duration|
     -> Result<Duration, ConfigError> {
        let Some(value) = value else {
            return Ok(default);
        };
        let key = format!("limits.{key}");
        let d = match value.get_ref() {
            NumberOrText::Number(secs) => u64::try_from(*secs)
                .map(Duration::from_secs)
                .map_err(|_| error(value.span(), &key, "must not be negative".into()))?,
            NumberOrText::Text(text) => {
                parse_duration(text).map_err(|reason| error(value.span(), &key, reason))?
            }
        };
        if d.is_zero() {
            return Err(error(
                value.span(),
                &key,
                "must be greater than zero".into(),
            ));
        }
        Ok(d)
    };
    const MILLION: i64 = 1_000_000;
    out.connections = count(
        &raw.connections,
        "connections",
        1..=MILLION,
        out.connections,
    )?;
    out.connections_per_portal = count(
        &raw.connections_per_portal,
        "connections-per-portal",
        1..=MILLION,
        out.connections_per_portal,
    )?;
    out.sessions_per_initiator = count(
        &raw.sessions_per_initiator,
        "sessions-per-initiator",
        1..=65535,
        out.sessions_per_initiator,
    )?;
    out.login_timeout = duration(&raw.login_timeout, "login-timeout", out.login_timeout)?;
    let window = count(
        &raw.commands_per_session,
        "commands-per-session",
        1..=i64::from(MAX_COMMANDS_PER_SESSION),
        defaults::COMMANDS_PER_SESSION as usize,
    )?;
    out.commands_per_session = u32::try_from(window).unwrap_or(defaults::COMMANDS_PER_SESSION);
    let rounds = count(
        &raw.text_rounds,
        "text-rounds",
        1..=65535,
        defaults::TEXT_ROUNDS as usize,
    )?;
    out.text_rounds = u32::try_from(rounds).unwrap_or(defaults::TEXT_ROUNDS);
    // The protocol crate parses at most 1024 pairs and 64 KiB of text whatever is configured.
    out.text_keys = count(&raw.text_keys, "text-keys", 1..=1024, out.text_keys)?;
    if let Some(value) = &raw.text_bytes {
        let key = "limits.text-bytes";
        let bytes = match value.get_ref() {
            NumberOrText::Number(n) => u64::try_from(*n).ok(),
            NumberOrText::Text(text) => {
                Some(parse_size(text).map_err(|reason| error(value.span(), key, reason))?)
            }
        };
        // RFC 7143 6.1: at least 8192 bytes of key text must be accepted.
        out.text_bytes = bytes
            .and_then(|b| usize::try_from(b).ok())
            .filter(|b| (8192..=64 * 1024).contains(b))
            .ok_or_else(|| error(value.span(), key, "must be 8K..=64K (RFC 7143 6.1)".into()))?;
    }
    if let Some(value) = &raw.send_backlog {
        let key = "limits.send-backlog";
        let bytes = match value.get_ref() {
            NumberOrText::Number(n) => u64::try_from(*n).ok(),
            NumberOrText::Text(text) => {
                Some(parse_size(text).map_err(|reason| error(value.span(), key, reason))?)
            }
        };
        out.send_backlog = bytes
            .and_then(|b| usize::try_from(b).ok())
            .filter(|b| (64 * 1024..=1 << 30).contains(b))
            .ok_or_else(|| error(value.span(), key, "must be 64K..=1G".into()))?;
    }
    out.log_interval = duration(&raw.log_interval, "log-interval", out.log_interval)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ServeConfig;
    use std::path::Path;

    const BASE: &str =
        "[[target]]\nname = \"iqn.2026-01.test.lanes:t\"\n[[target.lun]]\npath = \"/dev/null\"\n";

    fn parse(limits: &str) -> Result<ServeConfig, ConfigError> {
        let text = format!("{BASE}[limits]\n{limits}\n");
        ServeConfig::from_toml_str(&text, Path::new("/etc/lanes/lanes.toml"))
    }

    #[test]
    fn defaults_without_the_section() {
        let text = BASE.to_string();
        let config = ServeConfig::from_toml_str(&text, Path::new("lanes.toml")).unwrap();
        assert_eq!(config.limits, LimitsConfig::default());
        assert_eq!(config.limits.login_timeout, Duration::from_secs(15));
    }

    #[test]
    fn every_key_resolves() {
        let config = parse(
            "connections = 100\nconnections-per-portal = 50\nsessions-per-initiator = 4\n\
             login-timeout = \"2s\"\ncommands-per-session = 32\ntext-rounds = 8\n\
             text-keys = 64\ntext-bytes = \"16K\"\nlog-interval = 10\nsend-backlog = \"1M\"",
        )
        .unwrap();
        let l = config.limits;
        assert_eq!((l.connections, l.connections_per_portal), (100, 50));
        assert_eq!(l.sessions_per_initiator, 4);
        assert_eq!(l.login_timeout, Duration::from_secs(2));
        assert_eq!((l.commands_per_session, l.text_rounds), (32, 8));
        assert_eq!((l.text_keys, l.text_bytes), (64, 16384));
        assert_eq!(l.log_interval, Duration::from_secs(10));
        assert_eq!(l.send_backlog, 1 << 20);
    }

    #[test]
    fn errors_name_the_key() {
        for (text, key) in [
            ("connections = 0", "limits.connections"),
            ("login-timeout = \"0s\"", "limits.login-timeout"),
            ("login-timeout = \"soon\"", "limits.login-timeout"),
            ("commands-per-session = 5000", "limits.commands-per-session"),
            ("text-keys = 2000", "limits.text-keys"),
            ("text-bytes = \"1K\"", "limits.text-bytes"),
            ("log-interval = -1", "limits.log-interval"),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.key(), Some(key), "{text}: {err}");
        }
        assert!(parse("conections = 5").is_err(), "unknown keys are errors");
    }
}
