//! Unit tests of fault planning: the command lines each fault runs and undoes, no root needed.

use super::*;
use crate::options::{Options, Topology};

fn plan(topology: Topology, nodes: usize) -> Plan {
    Plan::new(&Options {
        name: "t".into(),
        topology,
        nics: 2,
        storage_nics: 2,
        rate: "1gbit".parse().unwrap(),
        storage_nodes: nodes,
        mtu: 1500,
        pair: Default::default(),
    })
    .unwrap()
}

fn lines(cmds: &[Cmd]) -> Vec<String> {
    cmds.iter().map(ToString::to_string).collect()
}

#[test]
fn targets_and_modes_parse() {
    assert_eq!("link2".parse(), Ok(FaultTarget::Link(2)));
    assert_eq!("node1".parse(), Ok(FaultTarget::Node(1)));
    assert!("link0".parse::<FaultTarget>().is_err());
    assert!("eth0".parse::<FaultTarget>().is_err());
    assert_eq!("loss=5%".parse(), Ok(FaultMode::Loss { percent: 5 }));
    assert_eq!("loss=5".parse(), Ok(FaultMode::Loss { percent: 5 }));
    let delay = |micros, jitter_micros| FaultMode::Delay {
        micros,
        jitter_micros,
    };
    assert_eq!("delay=50ms".parse(), Ok(delay(50_000, 0)));
    assert_eq!("delay=1s".parse(), Ok(delay(1_000_000, 0)));
    assert_eq!("delay=50ms/10ms".parse(), Ok(delay(50_000, 10_000)));
    assert_eq!("delay=2ms/500us".parse(), Ok(delay(2_000, 500)));
    for bad in [
        "loss=0%",
        "loss=101%",
        "delay=50",
        "delay=ms",
        "delay=0ms",
        "delay=11s",
        "delay=10ms/20ms",
        "delay=10ms/",
        "delay=99999999999999999s",
        "up",
        "loss=x",
    ] {
        assert!(bad.parse::<FaultMode>().is_err(), "{bad} parsed");
    }
    for text in ["delay=50ms", "delay=50ms/10ms", "delay=1500us/1ms"] {
        assert_eq!(text.parse::<FaultMode>().unwrap().to_string(), text);
    }
}

#[test]
fn link_blackhole_drops_on_both_ends_and_undoes_itself() {
    let plan = plan(Topology::Pathing, 1);
    let actions = actions(&plan, FaultTarget::Link(2), FaultMode::Blackhole).unwrap();
    assert_eq!(
        lines(&actions.apply),
        [
            "ip -n lanes-t-host rule add pref 10 iif link2 blackhole",
            // What a delay would hand in through its TUN is dropped too.
            "ip -n lanes-t-host rule add pref 10 iif dly-link2 blackhole",
            "ip -n lanes-t-node1 rule add pref 10 iif link2 blackhole",
            "ip -n lanes-t-node1 rule add pref 10 iif dly-link2 blackhole",
        ]
    );
    assert_eq!(
        lines(&actions.undo),
        [
            "ip -n lanes-t-host rule del pref 10 iif link2 blackhole",
            "ip -n lanes-t-host rule del pref 10 iif dly-link2 blackhole",
            "ip -n lanes-t-node1 rule del pref 10 iif link2 blackhole",
            "ip -n lanes-t-node1 rule del pref 10 iif dly-link2 blackhole",
        ]
    );
}

#[test]
fn node_blackhole_also_drops_what_the_node_sends() {
    let plan = plan(Topology::Mesh, 2);
    let actions = actions(&plan, FaultTarget::Node(2), FaultMode::Blackhole).unwrap();
    let apply = lines(&actions.apply);
    assert!(apply.contains(&"ip -n lanes-t-node2 rule add pref 10 iif link1 blackhole".into()));
    assert!(
        apply.contains(&"ip -n lanes-t-host rule add pref 10 from 10.77.0.202 blackhole".into())
    );
    assert!(
        apply.contains(&"ip -n lanes-t-node1 rule add pref 10 from 10.77.0.201 blackhole".into())
    );
    assert!(!apply.iter().any(|l| l.contains("lanes-t-sw")));
    assert_eq!(actions.apply.len(), actions.undo.len());
}

#[test]
fn down_brings_routes_back() {
    let plan = plan(Topology::Lacp, 1);
    let actions = actions(&plan, FaultTarget::Link(1), FaultMode::Down).unwrap();
    let undo = lines(&actions.undo);
    assert_eq!(undo[0], "ip -n lanes-t-host link set link1 up");
    assert!(undo
        .iter()
        .any(|l| l.contains("route replace 10.77.100.2/32")));
}

#[test]
fn loss_uses_one_nft_table_per_fault() {
    let plan = plan(Topology::Pathing, 1);
    let actions = actions(&plan, FaultTarget::Link(1), FaultMode::Loss { percent: 5 }).unwrap();
    let apply = lines(&actions.apply);
    assert!(apply.contains(
        &"ip netns exec lanes-t-host nft add rule inet lanes_link1 faults iifname link1 numgen random mod 100 < 5 drop".into()
    ));
    assert!(apply.contains(
        &"ip netns exec lanes-t-node1 nft add rule inet lanes_link1 faults iifname dly-link1 numgen random mod 100 < 5 drop".into()
    ));
    assert_eq!(
        lines(&actions.undo),
        [
            "ip netns exec lanes-t-host nft delete table inet lanes_link1",
            "ip netns exec lanes-t-node1 nft delete table inet lanes_link1",
        ]
    );
}

#[test]
fn a_link_delay_redirects_both_ends_through_one_relay_each() {
    let plan = plan(Topology::Pathing, 1);
    let mode = "delay=50ms".parse().unwrap();
    let actions = actions(&plan, FaultTarget::Link(2), mode).unwrap();
    let apply = lines(&actions.apply);
    for ns in ["host", "node1"] {
        for line in [
            format!("ip -n lanes-t-{ns} link set dly-link2 mtu 1500 txqueuelen 10000 up"),
            format!("tc -n lanes-t-{ns} qdisc add dev link2 handle ffff: ingress"),
            format!(
                "tc -n lanes-t-{ns} filter add dev link2 parent ffff: protocol ip prio 1 \
                 u32 match u32 0 0 action mirred egress redirect dev dly-link2"
            ),
        ] {
            assert!(apply.contains(&line), "{line} missing from {apply:#?}");
        }
    }
    assert_eq!(
        lines(&actions.undo),
        [
            "tc -n lanes-t-host qdisc del dev link2 ingress",
            "tc -n lanes-t-node1 qdisc del dev link2 ingress",
        ]
    );
    let relays: Vec<_> = actions
        .relays
        .iter()
        .map(|r| (r.namespace.as_str(), r.args.devices.clone()))
        .collect();
    assert_eq!(
        relays,
        [
            ("host", vec!["dly-link2".to_string()]),
            ("node1", vec!["dly-link2".to_string()]),
        ]
    );
    let args = &actions.relays[0].args;
    assert_eq!(args.delay, Duration::from_millis(50));
    // 1.25 x 125 MB/s x 50 ms + 4 MiB.
    assert_eq!(args.queue_bytes, 7_812_500 + (4 << 20));
}

#[test]
fn a_node_delay_also_catches_what_the_node_sends() {
    let plan = plan(Topology::Mesh, 2);
    let mode = "delay=5ms/1ms".parse().unwrap();
    let actions = actions(&plan, FaultTarget::Node(1), mode).unwrap();
    let apply = lines(&actions.apply);
    // node1's own NICs: everything; the host's and node2's: what comes from node1.
    assert!(apply.contains(
        &"tc -n lanes-t-node1 filter add dev link1 parent ffff: protocol ip prio 1 u32 match u32 0 0 action mirred egress redirect dev dly-link1".into()
    ));
    for ns in ["host", "node2"] {
        for (device, source) in [("link1", "10.77.0.101"), ("link2", "10.77.0.102")] {
            let line = format!(
                "tc -n lanes-t-{ns} filter add dev {device} parent ffff: protocol ip prio 1 \
                 u32 match ip src {source}/32 action mirred egress redirect dev dly-{device}"
            );
            assert!(apply.contains(&line), "{line}");
        }
    }
    assert_eq!(actions.relays.len(), 3);
    assert!(actions.relays.iter().all(|r| r.args.devices.len() == 2));
    assert!(actions
        .relays
        .iter()
        .all(|r| r.args.jitter == Duration::from_millis(1)));
    // The switch forwards; it neither delays nor runs a relay.
    assert!(!apply.iter().any(|l| l.contains("lanes-t-sw")));
    assert_eq!(actions.undo.len(), 6);
    let nics = delayed_nics(&plan, FaultTarget::Node(1), mode).unwrap();
    assert_eq!(nics.len(), 6);
    let blackhole = delayed_nics(&plan, FaultTarget::Link(1), FaultMode::Blackhole).unwrap();
    assert!(blackhole.is_empty());
}

#[test]
fn a_mesh_link_delay_also_catches_what_the_link_sends_to_other_numbers() {
    let mesh = plan(Topology::Mesh, 1);
    let mode = "delay=5ms".parse().unwrap();
    let actions = actions(&mesh, FaultTarget::Link(1), mode).unwrap();
    let apply = lines(&actions.apply);
    let redirect = |ns: &str, device: &str, selector: &str| {
        format!(
            "tc -n lanes-t-{ns} filter add dev {device} parent ffff: protocol ip prio 1 u32 \
             match {selector} action mirred egress redirect dev dly-{device}"
        )
    };
    for line in [
        redirect("host", "link1", "u32 0 0"),
        redirect("node1", "link1", "u32 0 0"),
        // host link1 -> node1 link2 and node1 link1 -> host link2.
        redirect("node1", "link2", "ip src 10.77.0.11/32"),
        redirect("host", "link2", "ip src 10.77.0.101/32"),
    ] {
        assert!(apply.contains(&line), "{line} missing from {apply:#?}");
    }
    assert_eq!(apply.iter().filter(|l| l.contains("filter add")).count(), 4);
    // In pathing a link's traffic stays on its own NICs.
    let pathing = plan(Topology::Pathing, 1);
    let actions = super::actions(&pathing, FaultTarget::Link(1), mode).unwrap();
    assert!(!lines(&actions.apply).iter().any(|l| l.contains("link2")));
}

#[test]
fn a_link_missing_on_the_storage_side_of_a_mesh_is_host_only() {
    let plan = Plan::new(&Options {
        name: "t".into(),
        topology: Topology::Mesh,
        nics: 4,
        storage_nics: 2,
        rate: "1gbit".parse().unwrap(),
        storage_nodes: 1,
        mtu: 1500,
        pair: Default::default(),
    })
    .unwrap();
    let actions = actions(&plan, FaultTarget::Link(3), FaultMode::Blackhole).unwrap();
    assert_eq!(
        lines(&actions.apply),
        [
            "ip -n lanes-t-host rule add pref 10 iif link3 blackhole",
            "ip -n lanes-t-host rule add pref 10 iif dly-link3 blackhole"
        ]
    );
    let err = super::actions(&plan, FaultTarget::Link(5), FaultMode::Down).unwrap_err();
    assert!(err.contains("link1..link4"), "{err}");
}

#[test]
fn unknown_targets_are_refused() {
    let plan = plan(Topology::Pathing, 1);
    let err = actions(&plan, FaultTarget::Node(2), FaultMode::Down).unwrap_err();
    assert!(err.contains("no node2"), "{err}");
    assert!(actions(&plan, FaultTarget::Link(3), FaultMode::Down).is_err());
}

fn pair_plan() -> Plan {
    Plan::new(&Options {
        name: "t".into(),
        topology: Topology::Pathing,
        nics: 2,
        storage_nics: 2,
        rate: "1gbit".parse().unwrap(),
        storage_nodes: 2,
        mtu: 1500,
        pair: crate::options::Pair {
            peer_nics: 1,
            peer_rate: None,
            witness: true,
        },
    })
    .unwrap()
}

#[test]
fn a_pair_s_links_are_targets_and_a_dead_node_loses_them_too() {
    assert_eq!("peer1".parse(), Ok(FaultTarget::Peer(1)));
    assert_eq!("witness2".parse(), Ok(FaultTarget::Witness(2)));
    let plan = pair_plan();
    let peer = lines(
        &actions(&plan, FaultTarget::Peer(1), FaultMode::Blackhole)
            .unwrap()
            .apply,
    );
    assert_eq!(
        peer,
        [
            "ip -n lanes-t-node1 rule add pref 10 iif peer1 blackhole",
            "ip -n lanes-t-node1 rule add pref 10 iif dly-peer1 blackhole",
            "ip -n lanes-t-node2 rule add pref 10 iif peer1 blackhole",
            "ip -n lanes-t-node2 rule add pref 10 iif dly-peer1 blackhole",
        ]
    );
    let witness = lines(
        &actions(&plan, FaultTarget::Witness(2), FaultMode::Down)
            .unwrap()
            .apply,
    );
    assert_eq!(
        witness,
        [
            "ip -n lanes-t-node2 link set witness down",
            "ip -n lanes-t-witness link set node2 down",
        ]
    );
    let node = lines(
        &actions(&plan, FaultTarget::Node(2), FaultMode::Blackhole)
            .unwrap()
            .apply,
    );
    for expected in [
        "ip -n lanes-t-node2 rule add pref 10 iif peer1 blackhole",
        "ip -n lanes-t-node2 rule add pref 10 iif witness blackhole",
        "ip -n lanes-t-node1 rule add pref 10 from 10.78.1.2 blackhole",
        "ip -n lanes-t-witness rule add pref 10 from 10.79.2.2 blackhole",
        "ip -n lanes-t-host rule add pref 10 from 10.77.1.3 blackhole",
    ] {
        assert!(
            node.contains(&expected.to_string()),
            "missing {expected}: {node:#?}"
        );
    }
    let err = actions(&plan, FaultTarget::Peer(2), FaultMode::Down).unwrap_err();
    assert!(
        err.contains("peer1..peer1") && err.contains("witness1, witness2"),
        "{err}"
    );
}

#[test]
fn a_node_cut_from_the_hosts_keeps_its_peer_and_witness() {
    assert_eq!("front2".parse(), Ok(FaultTarget::Front(2)));
    assert_eq!(FaultTarget::Front(2).to_string(), "front2");
    let plan = pair_plan();
    let front = lines(
        &actions(&plan, FaultTarget::Front(2), FaultMode::Blackhole)
            .unwrap()
            .apply,
    );
    for expected in [
        "ip -n lanes-t-node2 rule add pref 10 iif link1 blackhole",
        "ip -n lanes-t-node2 rule add pref 10 iif link2 blackhole",
        // The host shares each front-end subnet with node 1: it drops node 2's packets by
        // source address, not by NIC.
        "ip -n lanes-t-host rule add pref 10 from 10.77.1.3 blackhole",
        "ip -n lanes-t-host rule add pref 10 from 10.77.2.3 blackhole",
    ] {
        assert!(
            front.contains(&expected.to_string()),
            "missing {expected}: {front:#?}"
        );
    }
    assert!(!front
        .iter()
        .any(|l| l.contains("iif peer1") || l.contains("iif witness")));
    assert!(!front
        .iter()
        .any(|l| l.contains("10.78.") || l.contains("10.79.")));
    // Node 1's and the host's own NICs keep receiving.
    assert!(!front
        .iter()
        .any(|l| l.contains("lanes-t-host rule add pref 10 iif")));
    assert!(!front
        .iter()
        .any(|l| l.contains("lanes-t-node1 rule add pref 10 iif")));
    let err = actions(&plan, FaultTarget::Front(3), FaultMode::Down).unwrap_err();
    assert!(err.contains("front1, front2"), "{err}");
}
