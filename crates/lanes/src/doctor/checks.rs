//! Verdicts on what the paths reported: reachability and round trip, the LUN identity on every
//! path, ALUA states, negotiated parameters, MTU and local interfaces. Pure functions of
//! [`TargetFacts`]; they also decide which paths go into the generated configuration.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use lanes_initiator::Error;

use super::facts::{linux_wwid, LunFacts, NegotiatedSummary, PathFacts, TargetFacts};
use super::report::Check;

/// Median NOP round trip above which a LAN path is suspect.
const SLOW_RTT_MS: f64 = 5.0;
const KIB: u32 = 1024;

/// How dm-multipath should group the paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// Every path equal (all active/optimized, or no ALUA): one group, I/O on all.
    Multibus,
    /// ALUA states differ: group by priority, optimized paths first.
    GroupByPrio,
}

/// The verdicts on one target and what the configuration may use.
#[derive(Debug, Clone)]
pub struct Assessment {
    pub checks: Vec<Check>,
    /// Indices (into `TargetFacts::paths`) of the paths fit for the configuration.
    pub good: Vec<usize>,
    /// The LUNs as the good paths report them.
    pub luns: Vec<LunFacts>,
    pub grouping: Grouping,
}

pub fn assess(t: &TargetFacts) -> Assessment {
    let mut checks = Vec::new();
    for p in &t.paths {
        checks.push(reachability(p));
    }
    let (identity_checks, good, luns) = identity(t);
    checks.extend(identity_checks);
    let good_paths: Vec<&PathFacts> = good.iter().filter_map(|&i| t.paths.get(i)).collect();
    match good_paths.len() {
        0 => {}
        1 => checks.push(Check::warn(
            format!("paths to {}", t.name),
            "only one usable path: no redundancy and no extra bandwidth.",
            "give the target one portal per NIC, each on its own subnet, and check that \
             discovery reports them all",
        )),
        n => checks.push(Check::ok(
            format!("paths to {}", t.name),
            format!("{n} usable paths."),
        )),
    }
    let (alua_check, grouping) = alua(&good_paths);
    if let Some(c) = alua_check {
        checks.push(c);
    }
    checks.extend(negotiation(&good_paths));
    checks.extend(mtu(&good_paths));
    checks.extend(local_interfaces(&good_paths));
    Assessment {
        checks,
        good,
        luns,
        grouping,
    }
}

fn reachability(p: &PathFacts) -> Check {
    let name = format!("portal {} reachable", p.portal);
    match &p.outcome {
        Err(f) => Check::fail(name, format!("{}.", f.what), f.fix.clone()),
        Ok(info) => {
            let rtt = info.rtt_median_ms();
            let max = info.rtt_ms.iter().copied().fold(0.0, f64::max);
            let detail = format!(
                "login in {:.1} ms, round trip {rtt:.2} ms (median of {} NOP pings, max {max:.2} ms)",
                info.login_ms,
                info.rtt_ms.len()
            );
            let check = if rtt > SLOW_RTT_MS {
                Check::warn(
                    name,
                    format!("{detail}: slow for storage, every queue-depth-1 I/O waits for it."),
                    "check for a routed or congested path; storage traffic belongs on a LAN \
                     segment next to the target",
                )
            } else {
                Check::ok(name, format!("{detail}."))
            };
            check
                .with("login_ms", info.login_ms)
                .with("rtt_median_ms", rtt)
                .with("rtt_max_ms", max)
        }
    }
}

/// The identifier most paths report for `lun` (ties: the first path's).
fn reference_id(paths: &[PathFacts], lun: u64) -> Option<String> {
    let mut votes: Vec<(String, usize)> = Vec::new();
    for id in paths.iter().filter_map(|p| p.info()?.lun(lun)?.id.clone()) {
        match votes.iter_mut().find(|(v, _)| *v == id) {
            Some((_, n)) => *n += 1,
            None => votes.push((id, 1)),
        }
    }
    let best = votes.iter().map(|(_, n)| *n).max()?;
    votes.into_iter().find(|(_, n)| *n == best).map(|(v, _)| v)
}

/// Every LUN must show the same identifier, size and block size on every path; a path that
/// differs is left out of the configuration.
fn identity(t: &TargetFacts) -> (Vec<Check>, Vec<usize>, Vec<LunFacts>) {
    let mut checks = Vec::new();
    let mut lun_numbers: Vec<u64> = Vec::new();
    for info in t.paths.iter().filter_map(PathFacts::info) {
        for l in &info.luns {
            if !lun_numbers.contains(&l.lun) {
                lun_numbers.push(l.lun);
            }
        }
    }
    lun_numbers.sort_unstable();
    let mut excluded = vec![false; t.paths.len()];
    let mut luns = Vec::new();
    for &lun in &lun_numbers {
        let name = format!("LUN {lun} identity on every path");
        let Some(reference) = reference_id(&t.paths, lun) else {
            checks.push(Check::fail(
                name,
                "no path reports a LUN identifier (VPD page 0x83 has no NAA, EUI-64 or name \
                 designator).",
                "configure a unique LUN serial/NAA on the target: multipath groups paths by it",
            ));
            excluded.iter_mut().for_each(|e| *e = true);
            continue;
        };
        let mut shape: Option<&LunFacts> = None;
        let mut bad = Vec::new();
        for (i, p) in t.paths.iter().enumerate() {
            let Some(info) = p.info() else { continue };
            match info.lun(lun) {
                None => bad.push(format!("{} does not show LUN {lun}", p.portal)),
                Some(l) if l.id.as_deref() != Some(&reference) => bad.push(format!(
                    "{} reports {} instead of {reference}: it reaches a different LUN",
                    p.portal,
                    l.id.as_deref().unwrap_or("no identifier")
                )),
                Some(l) => match shape {
                    None => {
                        shape = Some(l);
                        continue;
                    }
                    Some(s) if (s.blocks, s.block_size) != (l.blocks, l.block_size) => {
                        bad.push(format!(
                            "{} reports {} blocks of {} bytes, another path {} of {}",
                            p.portal, l.blocks, l.block_size, s.blocks, s.block_size
                        ))
                    }
                    Some(_) => continue,
                },
            }
            excluded[i] = true;
        }
        let wwid = linux_wwid(&reference).unwrap_or_default();
        let check = match (bad.is_empty(), shape) {
            (true, Some(s)) => Check::ok(
                name,
                format!(
                    "every path reports {reference} (Linux WWID {wwid}), {} blocks of {} bytes.",
                    s.blocks, s.block_size
                ),
            ),
            _ => Check::fail(
                name,
                format!("{}; left out of the configuration.", bad.join("; ")),
                "make every portal of the target export the same LUN (check portal-to-target \
                 mappings; two targets with one name behind different portals are two LUNs)",
            ),
        };
        checks.push(check.with("lun_id", reference.clone()).with("wwid", wwid));
        if let Some(s) = shape {
            luns.push(s.clone());
        }
    }
    let good = t
        .paths
        .iter()
        .enumerate()
        .filter(|(i, p)| p.info().is_some() && !excluded[*i])
        .map(|(i, _)| i)
        .collect();
    (checks, good, luns)
}

fn alua_state_name(state: u8) -> &'static str {
    match state {
        0 => "active/optimized",
        1 => "active/non-optimized",
        2 => "standby",
        3 => "unavailable",
        0xe => "offline",
        0xf => "transitioning",
        _ => "unknown",
    }
}

/// ALUA states of the paths' port groups, and the grouping that follows from them.
fn alua(paths: &[&PathFacts]) -> (Option<Check>, Grouping) {
    let mut states: Vec<(SocketAddr, u8)> = Vec::new();
    let mut missing = None;
    for p in paths {
        let Some(info) = p.info() else { continue };
        let group = info
            .luns
            .first()
            .and_then(|l| l.target_port_group)
            .unwrap_or(p.tpgt);
        match &info.alua {
            Ok(groups) => match groups.iter().find(|(g, _)| *g == group) {
                Some((_, s)) => states.push((p.portal, *s)),
                None => missing = Some(format!("port group {group} is not in the report")),
            },
            Err(e) => missing = Some(e.clone()),
        }
    }
    let name = "ALUA path states";
    if states.is_empty() {
        let why = missing.unwrap_or_else(|| "no path".into());
        return (
            (!paths.is_empty()).then(|| {
                Check::ok(
                    name,
                    format!("no ALUA ({why}): all paths are treated as equal (multibus)."),
                )
            }),
            Grouping::Multibus,
        );
    }
    let text: Vec<String> = states
        .iter()
        .map(|(p, s)| format!("{p} {}", alua_state_name(*s)))
        .collect();
    let grouping = if states.iter().all(|(_, s)| *s == states[0].1) {
        Grouping::Multibus
    } else {
        Grouping::GroupByPrio
    };
    let policy = match grouping {
        Grouping::Multibus => "multibus",
        Grouping::GroupByPrio => "group_by_prio",
    };
    let check = if states.iter().all(|(_, s)| *s > 1) {
        Check::fail(
            name,
            format!("{}: no path can carry I/O.", text.join(", ")),
            "make at least one port group active on the target",
        )
    } else if states.iter().any(|(_, s)| *s > 1) {
        Check::warn(
            name,
            format!(
                "{}: standby or unavailable paths carry I/O only after a failover \
                 ({policy}).",
                text.join(", ")
            ),
            "expected on an active/passive target; otherwise set every port group active",
        )
    } else {
        Check::ok(name, format!("{} ({policy}).", text.join(", ")))
    };
    (Some(check), grouping)
}

/// What in the negotiated keys costs throughput, one phrase each.
pub fn negotiation_issues(n: &NegotiatedSummary) -> Vec<String> {
    let mut out = Vec::new();
    if n.target_max_recv_data_segment_length < 64 * KIB {
        out.push(format!(
            "the target's MaxRecvDataSegmentLength is {} bytes (under 64 KiB: each 256 KiB \
             write becomes {} PDUs)",
            n.target_max_recv_data_segment_length,
            (256 * KIB).div_ceil(n.target_max_recv_data_segment_length.max(1))
        ));
    }
    if n.initiator_max_recv_data_segment_length < 64 * KIB {
        out.push(format!(
            "MaxRecvDataSegmentLength for reads is {} bytes (under 64 KiB)",
            n.initiator_max_recv_data_segment_length
        ));
    }
    if !n.immediate_data && n.initial_r2t {
        out.push(
            "ImmediateData=No with InitialR2T=Yes (every write waits a round trip for an R2T)"
                .to_string(),
        );
    }
    if (n.immediate_data || !n.initial_r2t) && n.first_burst_length < 64 * KIB {
        out.push(format!(
            "FirstBurstLength is {} bytes (under 64 KiB of unsolicited write data)",
            n.first_burst_length
        ));
    }
    if n.max_burst_length < 256 * KIB {
        out.push(format!(
            "MaxBurstLength is {} bytes (under 256 KiB: large I/O is cut into sequences)",
            n.max_burst_length
        ));
    }
    for (key, value) in [
        ("HeaderDigest", &n.header_digest),
        ("DataDigest", &n.data_digest),
    ] {
        if value != "None" {
            out.push(format!("{key}={value} (a CRC32C over every PDU costs CPU)"));
        }
    }
    out
}

fn describe(n: &NegotiatedSummary) -> String {
    let yn = |b: bool| if b { "Yes" } else { "No" };
    format!(
        "MaxRecvDataSegmentLength {}/{} (target/initiator), FirstBurstLength {}, MaxBurstLength \
         {}, ImmediateData={}, InitialR2T={}, HeaderDigest={}, DataDigest={}",
        n.target_max_recv_data_segment_length,
        n.initiator_max_recv_data_segment_length,
        n.first_burst_length,
        n.max_burst_length,
        yn(n.immediate_data),
        yn(n.initial_r2t),
        n.header_digest,
        n.data_digest
    )
}

/// One check for all paths when they negotiated alike, else one per path.
fn negotiation(paths: &[&PathFacts]) -> Vec<Check> {
    let mut by_value: BTreeMap<String, (Vec<String>, NegotiatedSummary)> = BTreeMap::new();
    for p in paths {
        if let Some(info) = p.info() {
            let entry = by_value
                .entry(describe(&info.negotiated))
                .or_insert_with(|| (Vec::new(), info.negotiated.clone()));
            entry.0.push(p.portal.to_string());
        }
    }
    let single = by_value.len() == 1;
    by_value
        .into_values()
        .map(|(portals, n)| {
            let name = if single {
                "negotiated parameters".to_string()
            } else {
                format!("negotiated parameters on {}", portals.join(", "))
            };
            let issues = negotiation_issues(&n);
            let check = if issues.is_empty() {
                Check::ok(name, format!("{}.", describe(&n)))
            } else {
                Check::warn(
                    name,
                    format!("{}.", issues.join("; ")),
                    "on the target, allow MaxRecvDataSegmentLength and FirstBurstLength of 256 \
                     KiB or more, MaxBurstLength of 1 MiB, ImmediateData=Yes and digests None",
                )
            };
            check
                .with(
                    "target_max_recv_data_segment_length",
                    n.target_max_recv_data_segment_length,
                )
                .with("first_burst_length", n.first_burst_length)
                .with("max_burst_length", n.max_burst_length)
                .with("immediate_data", n.immediate_data)
                .with("initial_r2t", n.initial_r2t)
        })
        .collect()
}

fn mtu(paths: &[&PathFacts]) -> Option<Check> {
    let per_path: Vec<(String, String, u32)> = paths
        .iter()
        .filter_map(|p| {
            let l = p.local.as_ref()?;
            Some((p.portal.to_string(), l.device.clone(), l.mtu?))
        })
        .collect();
    let first = per_path.first()?.2;
    let text: Vec<String> = per_path
        .iter()
        .map(|(p, dev, mtu)| format!("{p} via {dev} MTU {mtu}"))
        .collect();
    let check = if per_path.iter().all(|(_, _, m)| *m == first) {
        Check::ok("MTU per path", format!("{}.", text.join(", ")))
    } else {
        Check::warn(
            "MTU per path",
            format!("the paths differ: {}.", text.join(", ")),
            "use one MTU on every storage NIC, switch port and target NIC (1500, or 9000 \
             end to end)",
        )
    };
    Some(check)
}

/// Paths that leave through one local interface share its bandwidth (loopback excepted).
fn local_interfaces(paths: &[&PathFacts]) -> Vec<Check> {
    let mut by_device: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in paths {
        if let Some(l) = &p.local {
            if l.aggregate.is_none() {
                by_device
                    .entry(l.device.clone())
                    .or_default()
                    .push(p.portal.to_string());
            }
        }
    }
    let mut checks = Vec::new();
    for (device, portals) in by_device {
        if portals.len() < 2 || device == "lo" {
            continue;
        }
        checks.push(Check::warn(
            format!("local interface {device}"),
            format!(
                "the paths to {} all leave through {device}: they share its bandwidth (several \
                 NICs on one subnet use the first route only, a mesh; or one NIC for two \
                 target ports).",
                portals.join(" and ")
            ),
            "put each host NIC and its target portal on a subnet of their own, or bind one \
             iSCSI interface per NIC (iscsiadm -m iface; lanes attach --bind PORTAL=NIC)",
        ));
    }
    if checks.is_empty() && paths.len() > 1 {
        let devices: Vec<String> = paths
            .iter()
            .filter_map(|p| Some(format!("{} via {}", p.portal, p.local.as_ref()?.device)))
            .collect();
        if !devices.is_empty() {
            checks.push(Check::ok(
                "local interfaces",
                format!("{}.", devices.join(", ")),
            ));
        }
    }
    checks
}

/// The verdict on a second session of the same initiator.
pub fn second_session_check(
    initiator: &str,
    result: &Result<(), (SocketAddr, Error)>,
    timeout: std::time::Duration,
) -> Check {
    let name = "second session per initiator";
    match result {
        Ok(()) => Check::ok(
            name,
            format!("a second session of {initiator} (another ISID) was accepted."),
        ),
        Err((portal, e @ Error::LoginRefused { .. })) => Check::fail(
            name,
            format!("{portal} refused a second session of {initiator}: {e}."),
            "enable \"Allow multiple sessions\" for this target (lanes serve: \
             allow-multiple-sessions = true); multipath needs one session per path",
        ),
        Err((portal, e)) => {
            let f = super::facts::login_failure(*portal, e, timeout);
            Check::fail(
                name,
                format!("{portal}: a second session failed: {}.", f.what),
                f.fix,
            )
        }
    }
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod tests;
