//! Verdicts on throughput: each path alone, all paths together, and which paths share a
//! bottleneck and why. Pure functions of the measured rates and the local routes, so every
//! verdict is tested with synthetic numbers.

use super::report::Check;

/// Together below this share of the sum of the paths alone: something is shared.
pub const SHARED_RATIO: f64 = 0.7;
/// A path below this share of the best path is slow for its own reasons.
const SLOW_RATIO: f64 = 0.5;
/// More sessions on one portal beat one session by this factor: a per-flow cap.
const PER_FLOW_GAIN: f64 = 1.5;

/// One path as the probe saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbedPath {
    pub portal: String,
    /// Target address without the port (two portals on one address share the target's NIC).
    pub address: String,
    pub alone_mb_s: f64,
    /// Local interface the path leaves through.
    pub device: Option<String>,
    /// Local aggregate (bond / ECMP) description, if the route is one.
    pub aggregate: Option<String>,
}

fn mb(v: f64) -> String {
    format!("{v:.1} MB/s")
}

/// One line per path alone; a WARN for a path far slower than the best.
pub fn alone_checks(paths: &[ProbedPath]) -> Vec<Check> {
    let best = paths.iter().map(|p| p.alone_mb_s).fold(0.0, f64::max);
    paths
        .iter()
        .map(|p| {
            let name = format!("throughput {} alone", p.portal);
            if paths.len() > 1 && p.alone_mb_s < SLOW_RATIO * best {
                Check::warn(
                    name,
                    format!(
                        "{} with one session, under half of the best path ({}).",
                        mb(p.alone_mb_s),
                        mb(best)
                    ),
                    "check this path's link speed and duplex (ethtool), cabling and switch \
                     port; service-time path selection copes, round-robin would be held back",
                )
            } else {
                Check::ok(name, format!("{} with one session.", mb(p.alone_mb_s)))
            }
            .with("mb_per_s", p.alone_mb_s)
        })
        .collect()
}

/// All paths at once against the sum of the paths alone. `pairs` are (i, j, MB/s of i and j
/// together), measured when more than two paths share something (two paths: the pair is all).
pub fn together_check(paths: &[ProbedPath], together: f64, pairs: &[(usize, usize, f64)]) -> Check {
    let sum: f64 = paths.iter().map(|p| p.alone_mb_s).sum();
    let best = paths.iter().map(|p| p.alone_mb_s).fold(0.0, f64::max);
    let share = if sum > 0.0 { together / sum } else { 0.0 };
    let name = format!("throughput all {} paths together", paths.len());
    let base = format!(
        "{} together vs {} summed over the paths alone ({:.0}%)",
        mb(together),
        mb(sum),
        share * 100.0
    );
    let check = if share >= SHARED_RATIO {
        Check::ok(
            name,
            format!("{base}: the paths add up, no shared bottleneck."),
        )
    } else {
        let groups = sharing_groups(paths, pairs);
        let mut causes = Vec::new();
        let mut fixes = Vec::new();
        for group in &groups {
            let (cause, fix) = cause_of(paths, group);
            let names: Vec<&str> = group.iter().map(|&i| paths[i].portal.as_str()).collect();
            causes.push(format!(
                "{} share one bottleneck: {cause}",
                names.join(" and ")
            ));
            if !fixes.contains(&fix) {
                fixes.push(fix);
            }
        }
        let near_one = if together <= best * 1.3 {
            format!(", about one path's worth ({})", mb(best))
        } else {
            String::new()
        };
        Check::warn(
            name,
            format!("{base}{near_one}. {}.", causes.join("; ")),
            fixes.join("; "),
        )
    };
    check
        .with("together_mb_per_s", together)
        .with("sum_alone_mb_per_s", sum)
        .with("best_alone_mb_per_s", best)
        .with("ratio", share)
}

/// Groups of paths that share a bottleneck: connected components of the pairs whose combined
/// rate stays under [`SHARED_RATIO`] of their sum. Without pair measurements (two paths) or
/// when no single pair explains the loss, all paths form one group.
pub fn sharing_groups(paths: &[ProbedPath], pairs: &[(usize, usize, f64)]) -> Vec<Vec<usize>> {
    let n = paths.len();
    let mut group: Vec<usize> = (0..n).collect();
    fn root(group: &mut [usize], mut i: usize) -> usize {
        while group[i] != i {
            group[i] = group[group[i]];
            i = group[i];
        }
        i
    }
    let mut any = false;
    for &(i, j, rate) in pairs {
        if i >= n || j >= n {
            continue;
        }
        if rate < SHARED_RATIO * (paths[i].alone_mb_s + paths[j].alone_mb_s) {
            let (a, b) = (root(&mut group, i), root(&mut group, j));
            group[a] = b;
            any = true;
        }
    }
    if !any {
        return vec![(0..n).collect()];
    }
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut roots: Vec<usize> = Vec::new();
    for i in 0..n {
        let r = root(&mut group, i);
        match roots.iter().position(|&x| x == r) {
            Some(k) => out[k].push(i),
            None => {
                roots.push(r);
                out.push(vec![i]);
            }
        }
    }
    out.retain(|g| g.len() > 1);
    out
}

/// The likely cause of a group sharing a bottleneck, and the fix, from the local routes.
pub fn cause_of(paths: &[ProbedPath], group: &[usize]) -> (String, String) {
    let members: Vec<&ProbedPath> = group.iter().filter_map(|&i| paths.get(i)).collect();
    let all_same = |f: &dyn Fn(&ProbedPath) -> Option<&str>| {
        let first = members.first().and_then(|p| f(p));
        first.is_some() && members.iter().all(|p| f(p) == first)
    };
    if members.iter().all(|p| p.device.as_deref() == Some("lo")) {
        return (
            "every one of them is on this host's loopback, where the CPU, not a link, is the \
             shared limit"
                .to_string(),
            "nothing to fix on loopback; measure over the real NICs".to_string(),
        );
    }
    if all_same(&|p| Some(p.address.as_str())) {
        return (
            "two portals on one target address (one NIC on the target)".to_string(),
            "give the target one address per NIC, each on its own subnet, and use one portal \
             per address"
                .to_string(),
        );
    }
    if let Some(agg) = members.iter().find_map(|p| p.aggregate.as_deref()) {
        return (
            format!(
                "the paths ride one link aggregate ({agg}) whose hash puts each TCP connection \
                 on one member (LACP)"
            ),
            "use separate NICs with one subnet per path instead of the aggregate (LACP gives \
             one session one link)"
                .to_string(),
        );
    }
    if all_same(&|p| p.device.as_deref()) {
        let dev = members
            .first()
            .and_then(|p| p.device.clone())
            .unwrap_or_default();
        return (
            format!(
                "every one of them leaves this host through {dev} (several NICs on one subnet \
                 use only the first route: a mesh)"
            ),
            "put each host NIC and its target portal on a subnet of their own (1:1 paths), or \
             bind one iSCSI interface per NIC (iscsiadm -m iface, Windows/VMware port binding, \
             lanes attach --bind PORTAL=NIC)"
                .to_string(),
        );
    }
    (
        "the paths use different local interfaces and target addresses, so the limit is on \
         the target (its NIC, CPU or disk) or a shared switch uplink"
            .to_string(),
        "check the target's NICs, CPU and disks, and the switch uplinks between host and target"
            .to_string(),
    )
}

/// One portal reached over a local aggregate: one session against several at once.
pub fn aggregate_check(
    portal: &str,
    aggregate: &str,
    members: usize,
    rates: Option<(f64, usize, f64)>,
) -> Check {
    let name = format!("link aggregate to {portal}");
    let mut detail = format!(
        "{portal} is reached over {aggregate} with {members} links; LACP and ECMP put each TCP \
         connection on one link, so one iSCSI session (one path) gets one link"
    );
    let mut check_rates = None;
    if let Some((one, sessions, many)) = rates {
        if many >= PER_FLOW_GAIN * one {
            detail.push_str(&format!(
                ": measured {} with one session, {} with {sessions} sessions",
                mb(one),
                mb(many)
            ));
        } else {
            detail.push_str(&format!(
                ": measured {} with one session and {} with {sessions} (the hash did not spread \
                 them, or the bottleneck is elsewhere)",
                mb(one),
                mb(many)
            ));
        }
        check_rates = Some((one, sessions, many));
    }
    let mut check = Check::warn(
        name,
        format!("{detail}."),
        "for multipath, give each NIC its own address and subnet on both sides and log in \
         once per portal instead of aggregating the links",
    )
    .with("members", members as u64);
    if let Some((one, sessions, many)) = check_rates {
        check = check
            .with("one_session_mb_per_s", one)
            .with("sessions", sessions as u64)
            .with("many_sessions_mb_per_s", many);
    }
    check
}

/// A single portal without a local aggregate: more sessions faster than one means a per-flow
/// cap somewhere (an aggregate on the target side or in the switch, or a per-connection
/// limit).
pub fn per_flow_check(portal: &str, one: f64, sessions: usize, many: f64) -> Check {
    let name = format!("sessions per path {portal}");
    let detail = format!(
        "{} with one session, {} with {sessions} sessions",
        mb(one),
        mb(many)
    );
    let check = if many >= PER_FLOW_GAIN * one {
        Check::warn(
            name,
            format!(
                "{detail}: each TCP connection is capped below what the portal can give, as \
                 behind LACP (one flow per link) on the target or switch side."
            ),
            "give the target one portal per link (its own address and subnet) so multipath \
             gets one session per link",
        )
    } else {
        Check::ok(
            name,
            format!("{detail}: one session gets what the portal gives."),
        )
    };
    check
        .with("one_session_mb_per_s", one)
        .with("sessions", sessions as u64)
        .with("many_sessions_mb_per_s", many)
}

#[cfg(test)]
#[path = "bottleneck_tests.rs"]
mod tests;
