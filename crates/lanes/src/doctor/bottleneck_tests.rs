//! Verdicts on synthetic throughput: 1:1 paths, a mesh, two portals on one target NIC, LACP,
//! and a shared limit on the target side.

use super::*;
use crate::doctor::report::Verdict;

fn path(portal: &str, mb_s: f64, device: &str) -> ProbedPath {
    ProbedPath {
        portal: portal.to_string(),
        address: portal
            .rsplit_once(':')
            .map(|(a, _)| a)
            .unwrap_or(portal)
            .to_string(),
        alone_mb_s: mb_s,
        device: Some(device.to_string()),
        aggregate: None,
    }
}

#[test]
fn one_to_one_paths_add_up() {
    let paths = [
        path("10.77.1.2:3260", 118.0, "link1"),
        path("10.77.2.2:3260", 119.0, "link2"),
    ];
    let c = together_check(&paths, 236.0, &[]);
    assert_eq!(c.verdict, Verdict::Ok, "{}", c.line());
    assert!(c.detail.contains("no shared bottleneck"), "{}", c.line());
    assert!(alone_checks(&paths)
        .iter()
        .all(|c| c.verdict == Verdict::Ok));
}

#[test]
fn a_mesh_is_named_with_its_interface() {
    let paths = [
        path("10.77.0.101:3260", 119.0, "link1"),
        path("10.77.0.102:3260", 119.0, "link1"),
    ];
    let c = together_check(&paths, 119.5, &[]);
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(
        c.detail
            .contains("10.77.0.101:3260 and 10.77.0.102:3260 share"),
        "{}",
        c.line()
    );
    assert!(
        c.detail.contains("through link1") && c.detail.contains("mesh"),
        "{}",
        c.line()
    );
    assert!(c.detail.contains("about one path's worth"), "{}", c.line());
    assert!(c.fix.contains("subnet"), "{}", c.line());
    assert_eq!(
        c.measurements["ratio"].as_f64().map(|r| r < 0.7),
        Some(true)
    );
}

#[test]
fn two_portals_on_one_target_address() {
    let paths = [
        path("10.77.1.2:3260", 119.0, "link1"),
        path("10.77.1.2:3261", 118.0, "link1"),
    ];
    let c = together_check(&paths, 119.0, &[]);
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c.detail.contains("one target address"), "{}", c.line());
}

#[test]
fn lacp_is_named_when_the_route_is_an_aggregate() {
    let mut a = path("10.77.100.2:3260", 119.0, "link1");
    a.aggregate = Some("ECMP route".into());
    let mut b = path("10.77.100.2:3261", 119.0, "link2");
    b.aggregate = Some("ECMP route".into());
    b.address = "10.77.100.3".into();
    let c = together_check(&[a, b], 120.0, &[]);
    assert!(c.detail.contains("LACP"), "{}", c.line());
    let c = aggregate_check("10.77.100.2:3260", "ECMP route", 2, Some((119.0, 8, 238.0)));
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(
        c.detail
            .contains("one iSCSI session (one path) gets one link"),
        "{}",
        c.line()
    );
    assert!(
        c.detail.contains("238.0 MB/s with 8 sessions"),
        "{}",
        c.line()
    );
    let c = aggregate_check("p", "bond bond0 (802.3ad)", 2, None);
    assert_eq!(
        c.verdict,
        Verdict::Warn,
        "the route alone is enough to warn"
    );
}

#[test]
fn pairs_tell_which_paths_share() {
    // Paths 0 and 1 share a NIC; path 2 is on its own.
    let paths = [
        path("10.0.1.2:3260", 100.0, "eth1"),
        path("10.0.1.3:3260", 100.0, "eth1"),
        path("10.0.2.2:3260", 100.0, "eth2"),
    ];
    let pairs = [(0, 1, 101.0), (0, 2, 199.0), (1, 2, 198.0)];
    assert_eq!(sharing_groups(&paths, &pairs), vec![vec![0, 1]]);
    let c = together_check(&paths, 200.0, &pairs);
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(
        c.detail.contains("10.0.1.2:3260 and 10.0.1.3:3260 share"),
        "{}",
        c.line()
    );
    assert!(!c.detail.contains("10.0.2.2:3260 and"), "{}", c.line());
}

#[test]
fn a_limit_elsewhere_blames_the_target() {
    let paths = [
        path("10.0.1.2:3260", 100.0, "eth1"),
        path("10.0.2.2:3260", 100.0, "eth2"),
    ];
    let c = together_check(&paths, 110.0, &[]);
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c.detail.contains("on the target"), "{}", c.line());
    // Just above the threshold is fine.
    assert_eq!(together_check(&paths, 141.0, &[]).verdict, Verdict::Ok);
}

#[test]
fn a_slow_path_and_per_flow_caps() {
    let paths = [path("a:1", 110.0, "eth1"), path("b:1", 11.0, "eth2")];
    let checks = alone_checks(&paths);
    assert_eq!(checks[0].verdict, Verdict::Ok);
    assert_eq!(checks[1].verdict, Verdict::Warn);
    assert!(checks[1].fix.contains("duplex"));
    assert_eq!(
        per_flow_check("a:1", 119.0, 8, 238.0).verdict,
        Verdict::Warn
    );
    assert_eq!(per_flow_check("a:1", 119.0, 8, 121.0).verdict, Verdict::Ok);
}
