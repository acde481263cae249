//! The running configuration written back as a configuration file (`lanes config show`),
//! every key explicit, so that it parses back to the same [`ServeConfig`].

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use super::{AluaStateConfig, ChapAlgorithm, ChapConfig, DigestConfig, Secret, ServeConfig};

fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

/// Paths are written absolute: relative paths in a file are relative to the file, which
/// would move them.
fn path(p: &Path) -> String {
    quoted(
        &std::path::absolute(p)
            .unwrap_or_else(|_| p.to_path_buf())
            .display()
            .to_string(),
    )
}

fn duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("\"{}s\"", d.as_secs())
    } else {
        format!("\"{}ms\"", d.as_millis())
    }
}

/// Secrets as hex, the RFC 7143 5.1 binary form the file accepts, so any bytes round-trip.
fn secret(s: &Secret) -> String {
    let mut hex = String::from("\"0x");
    for b in s.expose() {
        let _ = write!(hex, "{b:02x}");
    }
    hex.push('"');
    hex
}

fn digests(list: &[DigestConfig]) -> String {
    let names: Vec<&str> = list.iter().map(|d| d.as_key_value()).collect();
    quoted(&names.join(","))
}

fn alua(state: AluaStateConfig) -> &'static str {
    match state {
        AluaStateConfig::ActiveOptimized => "active-optimized",
        AluaStateConfig::ActiveNonOptimized => "active-non-optimized",
        AluaStateConfig::Standby => "standby",
        AluaStateConfig::Unavailable => "unavailable",
        AluaStateConfig::Transitioning => "transitioning",
    }
}

fn algorithm(a: ChapAlgorithm) -> &'static str {
    match a {
        ChapAlgorithm::Sha3_256 => "sha3-256",
        ChapAlgorithm::Sha256 => "sha256",
        ChapAlgorithm::Sha1 => "sha1",
        ChapAlgorithm::Md5 => "md5",
    }
}

fn list(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(", "))
}

fn chap(out: &mut String, table: &str, c: &ChapConfig) {
    let _ = writeln!(out, "\n[{table}]");
    let _ = writeln!(out, "user = {}", quoted(&c.user));
    let _ = writeln!(out, "secret = {}", secret(&c.secret));
    if let (Some(user), Some(s)) = (&c.mutual_user, &c.mutual_secret) {
        let _ = writeln!(out, "mutual-user = {}", quoted(user));
        let _ = writeln!(out, "mutual-secret = {}", secret(s));
    }
    let names = c.algorithms.iter().map(|a| quoted(algorithm(*a)));
    let _ = writeln!(out, "algorithms = {}", list(names));
}

impl ServeConfig {
    /// The configuration as a TOML file (secrets included, as hex; paths absolute).
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "[server]");
        let _ = writeln!(out, "nop-interval = {}", duration(self.nop_interval));
        let _ = writeln!(out, "nop-timeout = {}", duration(self.nop_timeout));
        if let Some(addr) = self.metrics_addr {
            let _ = writeln!(out, "metrics = {}", quoted(&addr.to_string()));
        }
        let _ = writeln!(out, "data-dir = {}", path(&self.data_dir));
        if let Some(socket) = &self.status_socket {
            let _ = writeln!(out, "status-socket = {}", path(socket));
        }
        if let Some(auth) = &self.discovery_auth {
            chap(&mut out, "discovery-auth", auth);
        }
        let l = &self.limits;
        let _ = writeln!(out, "\n[limits]");
        let _ = writeln!(out, "connections = {}", l.connections);
        let _ = writeln!(out, "connections-per-portal = {}", l.connections_per_portal);
        let _ = writeln!(out, "sessions-per-initiator = {}", l.sessions_per_initiator);
        let _ = writeln!(out, "login-timeout = {}", duration(l.login_timeout));
        let _ = writeln!(out, "commands-per-session = {}", l.commands_per_session);
        let _ = writeln!(out, "text-rounds = {}", l.text_rounds);
        let _ = writeln!(out, "text-keys = {}", l.text_keys);
        let _ = writeln!(out, "text-bytes = {}", l.text_bytes);
        let _ = writeln!(out, "send-backlog = {}", l.send_backlog);
        let _ = writeln!(out, "log-interval = {}", duration(l.log_interval));
        // With [cluster]: the pair, and the groups of both nodes (this node's as they run).
        let groups: Vec<(Option<u8>, &super::PortalGroupConfig)> = match &self.cluster {
            Some(c) => {
                let _ = writeln!(out, "\n[cluster]");
                let _ = writeln!(out, "node = {}", c.node);
                let _ = writeln!(out, "preferred = {}", c.preferred);
                let _ = writeln!(out, "name = {}", quoted(&c.name));
                let etcd = c.etcd.iter().map(|e| quoted(&e.to_string()));
                let _ = writeln!(out, "etcd = {}", list(etcd));
                let _ = writeln!(out, "listen = {}", quoted(&c.node1.to_string()));
                let _ = writeln!(out, "peer = {}", quoted(&c.node2.to_string()));
                let _ = writeln!(out, "heartbeat = {}", duration(c.heartbeat));
                let _ = writeln!(out, "activity-log-extents = {}", c.activity_log_extents);
                c.groups
                    .iter()
                    .map(|(n, g)| {
                        let running = self.portal_groups.iter().find(|r| r.tag == g.tag);
                        (Some(*n), running.unwrap_or(g))
                    })
                    .collect()
            }
            None => self.portal_groups.iter().map(|g| (None, g)).collect(),
        };
        for (node, g) in groups {
            let _ = writeln!(out, "\n[[portal-group]]");
            let _ = writeln!(out, "tag = {}", g.tag);
            if let Some(n) = node {
                let _ = writeln!(out, "node = {n}");
            }
            let _ = writeln!(out, "name = {}", quoted(&g.name));
            let portals = g.portals.iter().map(|p| quoted(&p.to_string()));
            let _ = writeln!(out, "portals = {}", list(portals));
            let _ = writeln!(out, "alua = {}", quoted(alua(g.alua_state)));
        }
        for t in &self.targets {
            let _ = writeln!(out, "\n[[target]]");
            let _ = writeln!(out, "name = {}", quoted(&t.name));
            if let Some(alias) = &t.alias {
                let _ = writeln!(out, "alias = {}", quoted(alias));
            }
            let tags = t.portal_groups.iter().map(u16::to_string);
            let _ = writeln!(out, "portal-groups = {}", list(tags));
            let acl = t.acl.iter().map(|r| quoted(&r.to_string()));
            let _ = writeln!(out, "acl = {}", list(acl));
            let _ = writeln!(
                out,
                "allow-multiple-sessions = {}",
                t.allow_multiple_sessions
            );
            let _ = writeln!(out, "max-connections = {}", t.max_connections);
            let _ = writeln!(out, "header-digest = {}", digests(&t.header_digest));
            let _ = writeln!(out, "data-digest = {}", digests(&t.data_digest));
            let _ = writeln!(out, "first-burst-length = {}", t.first_burst_length);
            let _ = writeln!(out, "max-burst-length = {}", t.max_burst_length);
            let _ = writeln!(
                out,
                "max-recv-data-segment-length = {}",
                t.max_recv_data_segment_length
            );
            let _ = writeln!(out, "immediate-data = {}", t.immediate_data);
            let _ = writeln!(out, "initial-r2t = {}", t.initial_r2t);
            let _ = writeln!(out, "max-outstanding-r2t = {}", t.max_outstanding_r2t);
            if let Some(c) = &t.chap {
                chap(&mut out, "target.chap", c);
            }
            for l in &t.luns {
                let _ = writeln!(out, "\n[[target.lun]]");
                let _ = writeln!(out, "lun = {}", l.lun);
                match &l.rbd {
                    Some(rbd) => {
                        let _ = writeln!(out, "backend = \"rbd\"");
                        let _ = writeln!(out, "pool = {}", quoted(&rbd.pool));
                        let _ = writeln!(out, "image = {}", quoted(&rbd.image));
                        let _ = writeln!(out, "ceph-conf = {}", path(&rbd.ceph_conf));
                        let _ = writeln!(out, "ceph-client = {}", quoted(&rbd.client));
                        let _ = writeln!(out, "watch-timeout = {}", rbd.watch_timeout_s);
                    }
                    None => {
                        let _ = writeln!(out, "path = {}", path(&l.path));
                    }
                }
                if let Some(size) = l.size {
                    let _ = writeln!(out, "size = {size}");
                }
                let _ = writeln!(out, "block-size = {}", l.block_size);
                if let Some(serial) = &l.serial {
                    let _ = writeln!(out, "serial = {}", quoted(serial));
                }
                let _ = writeln!(out, "read-only = {}", l.read_only);
                let _ = writeln!(out, "write-cache = {}", l.write_cache);
                if l.volatile_cache {
                    let _ = writeln!(out, "volatile-cache = true");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::ServeConfig;
    use std::path::Path;

    #[test]
    fn a_full_configuration_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().display().to_string();
        let text = r#"
[server]
nop-interval = "1500ms"
nop-timeout = "2m"
metrics = "127.0.0.1:9261"
data-dir = "data"
status-socket = "/tmp/lanes-show-test.sock"

[discovery-auth]
user = "disc"
secret = "0b3q2+7Q=="
[[portal-group]]
tag = 1
portals = ["127.0.0.1:3260", "[::1]"]

[[portal-group]]
tag = 7
name = "lan \"b\""
portals = ["127.0.0.2:3261"]
alua = "standby"

[[target]]
name = "iqn.2026-11.io.lanes:show"
alias = "shown"
portal-groups = [7]
acl = ["iqn.2005-03.org.open-iscsi:host1", "10.0.0.0/24"]
allow-multiple-sessions = false
header-digest = "CRC32C"
max-burst-length = "512K"
first-burst-length = "64K"
immediate-data = false
initial-r2t = true
max-outstanding-r2t = 4

[target.chap]
user = "host1"
secret = "a secret of 12+ bytes"
mutual-user = "lanes"
mutual-secret = "0x00112233445566778899aabbccddeeff"
algorithms = ["sha256", "md5"]

[[target.lun]]
path = "a.img"
size = "4M"
block-size = 4096
read-only = true

[[target.lun]]
lun = 9
path = "b.img"
serial = "disk-b"
write-cache = false
"#
        .replace("0b3q2+7Q==", "0bMTIzNDU2Nzg5MDEyMzQ=");
        let file = Path::new(&base).join("lanes.toml");
        let config = ServeConfig::from_toml_str(&text, &file).unwrap();
        let shown = config.to_toml();
        let again = ServeConfig::from_toml_str(&shown, &Path::new(&base).join("shown.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{shown}"));
        assert_eq!(again, config, "{shown}");
        assert_eq!(again.to_toml(), shown);
    }
}
