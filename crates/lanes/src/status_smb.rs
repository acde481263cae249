//! The SMB part of `lanes status`: sessions with their channel count, like `cifs session
//! show`, then every channel with its addresses and counters, like `cifs connection show`, and
//! the multichannel counters.

use serde_json::Value;

use crate::status::{field, table};

/// The `smb` section of a status reply as tables.
pub fn render(smb: &Value) -> String {
    let empty = Vec::new();
    let sessions = smb
        .get("sessions")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut session_rows = Vec::new();
    let mut channel_rows = Vec::new();
    for s in sessions {
        let channels = s
            .get("channels")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        let signing = if s.get("signing_required").and_then(Value::as_bool) == Some(true) {
            format!("{} (required)", field(s, "signing"))
        } else {
            field(s, "signing")
        };
        session_rows.push(vec![
            field(s, "id"),
            field(s, "user"),
            field(s, "dialect"),
            signing,
            field(s, "cipher"),
            channels.len().to_string(),
            field(s, "trees"),
            field(s, "opens"),
            field(s, "binds"),
            field(s, "channels_lost"),
        ]);
        for c in channels {
            let encrypted = if c.get("encrypted").and_then(Value::as_bool) == Some(true) {
                "yes"
            } else {
                "no"
            };
            channel_rows.push(vec![
                field(s, "id"),
                field(c, "id"),
                field(c, "client"),
                field(c, "server"),
                encrypted.to_string(),
                field(c, "credits"),
                field(c, "requests"),
                field(c, "bytes_in"),
                field(c, "bytes_out"),
            ]);
        }
    }
    let mut out = format!("\nSMB sessions ({})\n", session_rows.len());
    out += &table(
        &[
            "SESSION", "USER", "DIALECT", "SIGNING", "CIPHER", "CHANNELS", "TREES", "OPENS",
            "BINDS", "LOST",
        ],
        &session_rows,
    );
    out += &format!("\nSMB channels ({})\n", channel_rows.len());
    out += &table(
        &[
            "SESSION",
            "CONN",
            "CLIENT",
            "SERVER",
            "ENCRYPTED",
            "CREDITS",
            "REQUESTS",
            "BYTES IN",
            "BYTES OUT",
        ],
        &channel_rows,
    );
    let open = smb
        .get("connections")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let c = smb.get("counters").cloned().unwrap_or(Value::Null);
    out += &format!(
        "\nSMB connections open {open}; since start: {} accepted, {} sessions, {} logon failures, \
         {} channel binds of {} attempted ({} refused), {} channels lost\n",
        field(&c, "connections"),
        field(&c, "sessions"),
        field(&c, "logon_failures"),
        field(&c, "binds"),
        field(&c, "bind_attempts"),
        field(&c, "binds_denied"),
        field(&c, "channels_lost"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_sessions_channels_and_counters() {
        let smb = serde_json::json!({
            "sessions": [{
                "id": "0x0000a1b2c3d40001", "user": "carol", "dialect": "3.1.1",
                "signing": "AES-128-GMAC", "signing_required": true, "cipher": "AES-128-GCM",
                "trees": 1, "opens": 3, "binds": 2, "channels_lost": 1,
                "channels": [
                    {"id": 7, "client": "192.0.2.50:51000", "server": "192.0.2.10:445",
                     "encrypted": false, "credits": 512, "requests": 100, "bytes_in": 4096,
                     "bytes_out": 8192},
                    {"id": 9, "client": "198.51.100.50:51001", "server": "198.51.100.10:445",
                     "encrypted": true}
                ]
            }],
            "connections": [{"id": 7}, {"id": 9}, {"id": 11}],
            "counters": {"connections": 4, "sessions": 1, "logon_failures": 2, "bind_attempts": 3,
                         "binds": 2, "binds_denied": 1, "channels_lost": 1}
        });
        let text = render(&smb);
        assert!(text.contains("SMB sessions (1)"), "{text}");
        let session = text
            .lines()
            .find(|l| l.starts_with("0x0000a1b2c3d40001  carol"))
            .unwrap_or_default();
        let cells: Vec<&str> = session.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "0x0000a1b2c3d40001",
                "carol",
                "3.1.1",
                "AES-128-GMAC",
                "(required)",
                "AES-128-GCM",
                "2",
                "1",
                "3",
                "2",
                "1"
            ]
        );
        assert!(text.contains("SMB channels (2)"), "{text}");
        let last = text
            .lines()
            .find(|l| l.contains("198.51.100.10:445"))
            .unwrap_or_default();
        assert!(last.contains(" yes ") && last.ends_with(" -"), "{last}");
        assert!(
            text.contains("SMB connections open 3; since start: 4 accepted, 1 sessions, 2 logon failures, 2 channel binds of 3 attempted (1 refused), 1 channels lost"),
            "{text}"
        );
    }
}
