//! The host's side of each path: which interface the kernel sends a portal's traffic through
//! (`ip route get`), its MTU (`/sys/class/net/DEV/mtu`), and whether that is an aggregate whose
//! members are picked per TCP connection (a bond, or a route with several nexthops): the things
//! that make paths silently share one link.

use std::net::IpAddr;
use std::path::Path;

use serde_json::Value;

use super::facts::{Aggregate, LocalRoute};

/// Looks up the route to `addr` in this network namespace; None when `ip` is missing or has
/// no route (the path checks say so on their own).
pub async fn route_to(addr: IpAddr) -> Option<LocalRoute> {
    let target = addr.to_string();
    let get = ip_json(&["-j", "route", "get", &target]).await?;
    let device = get.get(0)?.get("dev")?.as_str()?.to_string();
    let mtu = read_mtu(Path::new("/sys/class/net"), &device);
    let mut aggregate = bond_members(Path::new("/sys/class/net"), &device);
    if aggregate.is_none() {
        let family = if addr.is_ipv4() { "-4" } else { "-6" };
        if let Some(routes) = ip_json(&[family, "-j", "route", "show", "match", &target]).await {
            aggregate = ecmp_members(&routes);
        }
    }
    Some(LocalRoute {
        device,
        mtu,
        aggregate,
    })
}

async fn ip_json(args: &[&str]) -> Option<Value> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    // `ip` answers at once; the blocking pool keeps the runtime's threads free meanwhile.
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("ip")
            .args(&args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
    })
    .await
    .ok()?
    .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

fn read_mtu(sys: &Path, device: &str) -> Option<u32> {
    std::fs::read_to_string(sys.join(device).join("mtu"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A bonding master and its slaves (`/sys/class/net/DEV/bonding/{mode,slaves}`).
fn bond_members(sys: &Path, device: &str) -> Option<Aggregate> {
    let dir = sys.join(device).join("bonding");
    let slaves = std::fs::read_to_string(dir.join("slaves")).ok()?;
    let mode = std::fs::read_to_string(dir.join("mode")).unwrap_or_default();
    let mode = mode.split_whitespace().next().unwrap_or("unknown mode");
    let members: Vec<String> = slaves.split_whitespace().map(str::to_string).collect();
    (members.len() > 1).then(|| Aggregate {
        kind: format!("bond {device} ({mode})"),
        members,
    })
}

/// The most specific route of `ip -j route show match ADDR` when it has several nexthops.
pub fn ecmp_members(routes: &Value) -> Option<Aggregate> {
    let best = routes
        .as_array()?
        .iter()
        .max_by_key(|r| prefix_len(r.get("dst").and_then(Value::as_str).unwrap_or("")))?;
    let hops = best.get("nexthops")?.as_array()?;
    let members: Vec<String> = hops
        .iter()
        .filter_map(|h| h.get("dev").and_then(Value::as_str).map(str::to_string))
        .collect();
    (members.len() > 1).then(|| Aggregate {
        kind: "ECMP route (one nexthop per flow)".to_string(),
        members,
    })
}

/// `default` is /0; a bare address is a host route.
fn prefix_len(dst: &str) -> u8 {
    match dst.split_once('/') {
        Some((_, len)) => len.parse().unwrap_or(0),
        None if dst == "default" => 0,
        None if dst.contains(':') => 128,
        None => 32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ecmp_routes_are_found_in_ip_json() {
        // `ip -j route show match 10.77.100.2` in a lab with two LACP members.
        let routes: Value = serde_json::from_str(
            r#"[{"dst":"default","gateway":"10.0.0.1","dev":"eth0","flags":[]},
                {"dst":"10.77.100.2","prefsrc":"10.77.100.1","flags":[],
                 "nexthops":[{"gateway":"10.77.1.2","dev":"link1","weight":1,"flags":[]},
                             {"gateway":"10.77.2.2","dev":"link2","weight":1,"flags":[]}]}]"#,
        )
        .unwrap();
        let a = ecmp_members(&routes).unwrap();
        assert_eq!(a.members, vec!["link1", "link2"]);
        let single: Value = serde_json::from_str(
            r#"[{"dst":"10.77.0.0/24","dev":"link1"},{"dst":"default","dev":"eth0"}]"#,
        )
        .unwrap();
        assert_eq!(ecmp_members(&single), None);
        assert_eq!(ecmp_members(&Value::Null), None);
    }

    #[test]
    fn bonds_and_mtus_are_read_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        let bond = dir.path().join("bond0");
        std::fs::create_dir_all(bond.join("bonding")).unwrap();
        std::fs::write(bond.join("mtu"), "9000\n").unwrap();
        std::fs::write(bond.join("bonding/slaves"), "eth1 eth2\n").unwrap();
        std::fs::write(bond.join("bonding/mode"), "802.3ad 4\n").unwrap();
        assert_eq!(read_mtu(dir.path(), "bond0"), Some(9000));
        let a = bond_members(dir.path(), "bond0").unwrap();
        assert_eq!(a.kind, "bond bond0 (802.3ad)");
        assert_eq!(a.members, vec!["eth1", "eth2"]);
        assert_eq!(bond_members(dir.path(), "eth1"), None);
        assert_eq!(read_mtu(dir.path(), "missing"), None);
    }
}
