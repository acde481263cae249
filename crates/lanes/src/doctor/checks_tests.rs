//! Verdicts on synthetic facts: healthy paths, a path on another LUN, ALUA, bad negotiation,
//! MTU, a shared local interface, a refused second session.

use super::*;
use crate::doctor::facts::{Aggregate, Failure, LocalRoute, PathInfo};
use crate::doctor::report::Verdict;

fn negotiated() -> NegotiatedSummary {
    NegotiatedSummary {
        target_max_recv_data_segment_length: 262_144,
        initiator_max_recv_data_segment_length: 262_144,
        first_burst_length: 262_144,
        max_burst_length: 1 << 20,
        immediate_data: true,
        initial_r2t: false,
        max_outstanding_r2t: 1,
        header_digest: "None".into(),
        data_digest: "None".into(),
    }
}

fn lun(id: &str) -> LunFacts {
    LunFacts {
        lun: 0,
        id: Some(id.to_string()),
        blocks: 131_072,
        block_size: 512,
        vendor: "LANES".into(),
        product: "disk".into(),
        target_port_group: Some(1),
    }
}

fn path(portal: &str, id: &str, device: &str) -> PathFacts {
    PathFacts {
        portal: portal.parse().unwrap(),
        tpgt: 1,
        outcome: Ok(PathInfo {
            login_ms: 1.0,
            rtt_ms: vec![0.2, 0.1, 0.3],
            negotiated: negotiated(),
            luns: vec![lun(id)],
            alua: Ok(vec![(1, 0)]),
        }),
        local: Some(LocalRoute {
            device: device.to_string(),
            mtu: Some(1500),
            aggregate: None,
        }),
    }
}

fn target(paths: Vec<PathFacts>) -> TargetFacts {
    TargetFacts {
        name: "iqn.2026-11.io.lanes:t".into(),
        paths,
    }
}

fn find<'a>(a: &'a Assessment, prefix: &str) -> &'a Check {
    a.checks
        .iter()
        .find(|c| c.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no check {prefix}: {:#?}", a.checks))
}

#[test]
fn healthy_paths_are_all_ok() {
    let t = target(vec![
        path("10.0.1.2:3260", "naa.60a6c61", "eth1"),
        path("10.0.2.2:3260", "naa.60a6c61", "eth2"),
    ]);
    let a = assess(&t);
    for c in &a.checks {
        assert_eq!(c.verdict, Verdict::Ok, "{}", c.line());
    }
    assert_eq!(a.good, vec![0, 1]);
    assert_eq!(a.grouping, Grouping::Multibus);
    assert!(find(&a, "LUN 0 identity").detail.contains("WWID 360a6c61"));
    assert!(find(&a, "portal 10.0.1.2:3260").detail.contains("0.20 ms"));
    assert!(find(&a, "MTU").detail.contains("MTU 1500"));
}

#[test]
fn a_path_on_another_lun_fails_and_is_left_out() {
    let t = target(vec![
        path("10.0.1.2:3260", "naa.60a6c61", "eth1"),
        path("10.0.2.2:3260", "naa.6bad", "eth2"),
        path("10.0.3.2:3260", "naa.60a6c61", "eth3"),
    ]);
    let a = assess(&t);
    let c = find(&a, "LUN 0 identity");
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(
        c.detail
            .contains("10.0.2.2:3260 reports naa.6bad instead of naa.60a6c61"),
        "{}",
        c.line()
    );
    assert_eq!(a.good, vec![0, 2]);
    assert_eq!(a.luns[0].id.as_deref(), Some("naa.60a6c61"));
}

#[test]
fn a_size_mismatch_fails() {
    let mut other = path("10.0.2.2:3260", "naa.60a6c61", "eth2");
    if let Ok(info) = &mut other.outcome {
        info.luns[0].blocks = 1;
    }
    let a = assess(&target(vec![
        path("10.0.1.2:3260", "naa.60a6c61", "eth1"),
        other,
    ]));
    assert_eq!(find(&a, "LUN 0 identity").verdict, Verdict::Fail);
    assert_eq!(a.good, vec![0]);
    assert_eq!(find(&a, "paths to").verdict, Verdict::Warn, "one path left");
}

#[test]
fn unreachable_paths_fail_with_their_reason() {
    let mut dead = path("10.0.2.2:3260", "naa.1", "eth2");
    dead.outcome = Err(Failure {
        what: "connection refused: nothing listens on port 3260".into(),
        fix: "check the portal".into(),
    });
    let a = assess(&target(vec![path("10.0.1.2:3260", "naa.1", "eth1"), dead]));
    let c = find(&a, "portal 10.0.2.2:3260");
    assert_eq!(c.verdict, Verdict::Fail);
    assert_eq!(
        c.line(),
        "[FAIL] portal 10.0.2.2:3260 reachable: connection refused: nothing listens on port \
         3260. Fix: check the portal"
    );
    assert_eq!(a.good, vec![0]);
}

#[test]
fn alua_states_choose_the_grouping() {
    let mut b = path("10.0.2.2:3260", "naa.1", "eth2");
    if let Ok(info) = &mut b.outcome {
        info.luns[0].target_port_group = Some(2);
        info.alua = Ok(vec![(1, 0), (2, 1)]);
    }
    let a = assess(&target(vec![
        path("10.0.1.2:3260", "naa.1", "eth1"),
        b.clone(),
    ]));
    assert_eq!(a.grouping, Grouping::GroupByPrio);
    let c = find(&a, "ALUA");
    assert_eq!(c.verdict, Verdict::Ok);
    assert!(
        c.detail.contains("10.0.2.2:3260 active/non-optimized"),
        "{}",
        c.line()
    );
    if let Ok(info) = &mut b.outcome {
        info.alua = Ok(vec![(1, 0), (2, 2)]);
    }
    let a = assess(&target(vec![path("10.0.1.2:3260", "naa.1", "eth1"), b]));
    assert_eq!(find(&a, "ALUA").verdict, Verdict::Warn);
    let mut c = path("10.0.1.2:3260", "naa.1", "eth1");
    if let Ok(info) = &mut c.outcome {
        info.alua = Err("SCSI REPORT TARGET PORT GROUPS failed".into());
    }
    let a = assess(&target(vec![c]));
    assert!(find(&a, "ALUA").detail.contains("no ALUA"));
    assert_eq!(a.grouping, Grouping::Multibus);
}

#[test]
fn negotiated_values_that_hurt_are_named_with_their_numbers() {
    let mut n = negotiated();
    assert!(negotiation_issues(&n).is_empty());
    n.target_max_recv_data_segment_length = 8192;
    n.immediate_data = false;
    n.initial_r2t = true;
    n.max_burst_length = 65536;
    n.header_digest = "CRC32C".into();
    let issues = negotiation_issues(&n).join("; ");
    assert!(
        issues.contains("8192 bytes") && issues.contains("32 PDUs"),
        "{issues}"
    );
    assert!(
        issues.contains("ImmediateData=No with InitialR2T=Yes"),
        "{issues}"
    );
    assert!(issues.contains("MaxBurstLength is 65536"), "{issues}");
    assert!(issues.contains("HeaderDigest=CRC32C"), "{issues}");
    let mut n = negotiated();
    n.first_burst_length = 8192;
    assert!(negotiation_issues(&n)[0].contains("FirstBurstLength is 8192"));
    let mut p = path("10.0.1.2:3260", "naa.1", "eth1");
    if let Ok(info) = &mut p.outcome {
        info.negotiated.target_max_recv_data_segment_length = 8192;
    }
    let a = assess(&target(vec![p]));
    assert_eq!(find(&a, "negotiated parameters").verdict, Verdict::Warn);
}

#[test]
fn mtu_and_shared_interfaces_warn() {
    let mut b = path("10.0.2.2:3260", "naa.1", "eth2");
    b.local.as_mut().unwrap().mtu = Some(9000);
    let a = assess(&target(vec![path("10.0.1.2:3260", "naa.1", "eth1"), b]));
    let c = find(&a, "MTU");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c.detail.contains("eth2 MTU 9000"), "{}", c.line());
    let a = assess(&target(vec![
        path("10.77.0.101:3260", "naa.1", "link1"),
        path("10.77.0.102:3260", "naa.1", "link1"),
    ]));
    let c = find(&a, "local interface link1");
    assert_eq!(c.verdict, Verdict::Warn);
    assert!(c.detail.contains("mesh"), "{}", c.line());
    // Loopback paths share `lo` without harm; an aggregate is judged elsewhere.
    let a = assess(&target(vec![
        path("127.0.0.1:3260", "naa.1", "lo"),
        path("127.0.0.2:3260", "naa.1", "lo"),
    ]));
    assert!(a.checks.iter().all(|c| c.verdict == Verdict::Ok));
    let mut agg = path("10.77.100.2:3260", "naa.1", "link1");
    agg.local.as_mut().unwrap().aggregate = Some(Aggregate {
        kind: "ECMP route".into(),
        members: vec!["link1".into(), "link2".into()],
    });
    assert!(local_interfaces(&[&agg]).is_empty());
}

#[test]
fn a_refused_second_session_names_the_status_and_the_fix() {
    let portal: SocketAddr = "10.0.1.2:3260".parse().unwrap();
    let c = second_session_check(
        "iqn.x:host",
        &Err((
            portal,
            Error::LoginRefused {
                class: 2,
                detail: 6,
            },
        )),
        std::time::Duration::from_secs(10),
    );
    assert_eq!(c.verdict, Verdict::Fail);
    assert!(
        c.detail
            .contains("too many connections (status class 0x02, detail 0x06)"),
        "{}",
        c.line()
    );
    assert!(c.fix.contains("Allow multiple sessions"));
    let ok = second_session_check("iqn.x:host", &Ok(()), std::time::Duration::from_secs(10));
    assert_eq!(ok.verdict, Verdict::Ok);
}
