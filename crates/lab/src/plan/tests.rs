//! Unit tests of the topology planning: no root needed, only the command lines are checked.

use super::*;
use crate::options::Rate;

fn options(topology: Topology, nics: usize, nodes: usize) -> Options {
    Options {
        name: "demo".into(),
        topology,
        nics,
        storage_nics: nics,
        rate: "1gbit".parse::<Rate>().unwrap(),
        storage_nodes: nodes,
        mtu: 1500,
        pair: Default::default(),
    }
}

fn lines(plan: &Plan) -> Vec<String> {
    plan.setup
        .iter()
        .chain(plan.routes.iter().map(|r| &r.cmd))
        .map(ToString::to_string)
        .collect()
}

#[test]
fn pathing_is_one_veth_pair_and_one_subnet_per_link() {
    let plan = Plan::new(&options(Topology::Pathing, 2, 1)).unwrap();
    let names: Vec<_> = plan.namespaces.iter().map(|n| n.real.as_str()).collect();
    assert_eq!(names, ["lanes-demo-host", "lanes-demo-node1"]);
    let lines = lines(&plan);
    for i in 1..=2 {
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-host link add link{i} type veth peer name link{i} netns lanes-demo-node1"
        )));
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-host addr add 10.77.{i}.1/24 dev link{i}"
        )));
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-node1 addr add 10.77.{i}.2/24 dev link{i}"
        )));
        for ns in ["host", "node1"] {
            assert!(lines.contains(&format!(
                "tc -n lanes-demo-{ns} qdisc add dev link{i} root handle 1: tbf rate 1000000000bit burst 500000 latency 20ms"
            )));
        }
    }
    assert_eq!(plan.shapers.len(), 4);
    assert!(plan.routes.is_empty());
    // Nothing is ever run in the root namespace.
    for line in &lines {
        assert!(
            line.starts_with("ip -n lanes-demo-")
                || line.starts_with("tc -n lanes-demo-")
                || line.starts_with("ip netns exec lanes-demo-"),
            "{line}"
        );
    }
    // The local table's rule moves behind the fault rules.
    assert!(lines.contains(&"ip -n lanes-demo-host rule add pref 100 lookup local".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-host rule del pref 0 lookup local".to_string()));
}

#[test]
fn pathing_with_two_nodes_has_one_switch_per_link() {
    let plan = Plan::new(&options(Topology::Pathing, 2, 2)).unwrap();
    let lines = lines(&plan);
    assert!(plan.namespace("sw").is_some());
    assert!(lines.contains(&"ip -n lanes-demo-sw link add br2 type bridge".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-sw link set n2-link2 master br2".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-node2 addr add 10.77.2.3/24 dev link2".to_string()));
    // 3 NICs per link, each with a switch port: 12 shaped veth ends.
    assert_eq!(plan.shapers.len(), 12);
}

#[test]
fn mesh_shares_one_switch_and_routes_by_source() {
    let plan = Plan::new(&options(Topology::Mesh, 2, 1)).unwrap();
    let lines = lines(&plan);
    assert!(lines.contains(&"ip -n lanes-demo-sw link add br0 type bridge".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-sw link set h-link2 master br0".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-sw link set n1-link1 master br0".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-host addr add 10.77.0.12/24 dev link2".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-node1 addr add 10.77.0.101/24 dev link1".to_string()));
    assert!(lines.contains(
        &"ip -n lanes-demo-host rule add pref 1002 from 10.77.0.12 lookup 102".to_string()
    ));
    assert!(lines.contains(
        &"ip -n lanes-demo-host route replace 10.77.0.0/24 dev link2 src 10.77.0.12 table 102"
            .to_string()
    ));
    assert!(lines
        .iter()
        .any(|l| l.ends_with("sysctl -q -w net.ipv4.conf.all.arp_ignore=1")));
}

#[test]
fn a_mesh_joins_four_host_nics_to_two_per_storage_node() {
    let mut o = options(Topology::Mesh, 4, 2);
    o.storage_nics = 2;
    let plan = Plan::new(&o).unwrap();
    let count = |ns: &str| plan.nics.iter().filter(|n| n.namespace == ns).count();
    assert_eq!((count("host"), count("node1"), count("node2")), (4, 2, 2));
    // Every NIC and its switch port shaped: (4 + 2 + 2) x 2.
    assert_eq!(plan.shapers.len(), 16);
    let lines = lines(&plan);
    assert!(lines.contains(&"ip -n lanes-demo-sw link set h-link4 master br0".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-host addr add 10.77.0.14/24 dev link4".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-node2 addr add 10.77.0.202/24 dev link2".to_string()));
    assert!(!lines
        .iter()
        .any(|l| l.contains("n1-link3") || l.contains("node1 addr add 10.77.0.103")));
    let text = plan.summary();
    assert!(
        text.contains("lab demo is up: mesh, 4 host NICs and 2 per storage node at 1gbit"),
        "{text}"
    );
    // The link lines keep their format; the host's extra NICs have lines of their own.
    assert!(
        text.contains("  link2: host 10.77.0.12/24  node1 10.77.0.102/24  node2 10.77.0.202/24\n"),
        "{text}"
    );
    assert!(text.contains("  link4: host 10.77.0.14/24\n"), "{text}");
}

#[test]
fn lacp_hashes_flows_over_every_member_on_both_sides() {
    let plan = Plan::new(&options(Topology::Lacp, 2, 1)).unwrap();
    let lines = lines(&plan);
    assert!(lines.contains(&"ip -n lanes-demo-host addr add 10.77.100.1/32 dev lo".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-host route replace 10.77.100.2/32 src 10.77.100.1 nexthop via 10.77.1.2 dev link1 nexthop via 10.77.2.2 dev link2".to_string()));
    assert!(lines.contains(&"ip -n lanes-demo-node1 route replace 10.77.100.1/32 src 10.77.100.2 nexthop via 10.77.1.1 dev link1 nexthop via 10.77.2.1 dev link2".to_string()));
    for ns in ["host", "node1"] {
        assert!(lines.contains(&format!(
            "ip netns exec lanes-demo-{ns} sysctl -q -w net.ipv4.fib_multipath_hash_policy=1"
        )));
    }
}

#[test]
fn mtu_and_burst_follow_the_options() {
    let mut o = options(Topology::Pathing, 1, 1);
    o.mtu = 9000;
    o.rate = "10mbit".parse().unwrap();
    let plan = Plan::new(&o).unwrap();
    let lines = lines(&plan);
    assert!(lines.contains(&"ip -n lanes-demo-host link set link1 mtu 9000 up".to_string()));
    // 10mbit: 4 ms is only 5000 bytes, less than ten jumbo frames.
    assert_eq!(tbf_burst(o.rate.bytes_per_second(), 9000), 90_140);
}

#[test]
fn summary_names_addresses_and_commands() {
    let plan = Plan::new(&options(Topology::Lacp, 2, 1)).unwrap();
    let text = plan.summary();
    assert!(
        text.contains("lab demo is up: lacp, 2 NICs per namespace at 1gbit"),
        "{text}"
    );
    assert!(
        text.contains("link1: host 10.77.1.1/24  node1 10.77.1.2/24"),
        "{text}"
    );
    assert!(
        text.contains("lanes lab exec demo host -- iperf3 -c 10.77.100.2"),
        "{text}"
    );
}

#[test]
fn invalid_options_are_refused() {
    assert!(Plan::new(&options(Topology::Lacp, 2, 2)).is_err());
    assert!(Plan::new(&options(Topology::Pathing, 0, 1)).is_err());
    let mut unequal = options(Topology::Pathing, 4, 1);
    unequal.storage_nics = 2;
    assert!(Plan::new(&unequal).unwrap_err().contains("only a mesh"));
}

#[test]
fn commands_display_quoted_when_needed() {
    let cmd = Cmd::new(["nft", "add", "chain", "{ type filter ; }"]);
    assert_eq!(cmd.to_string(), "nft add chain '{ type filter ; }'");
}

fn pair(peer_nics: usize, peer_rate: Option<&str>) -> Options {
    Options {
        pair: crate::options::Pair {
            peer_nics,
            peer_rate: peer_rate.map(|r| r.parse().unwrap()),
            witness: true,
        },
        ..options(Topology::Pathing, 2, 2)
    }
}

#[test]
fn a_pair_gets_replication_links_at_their_rate_and_a_witness_namespace() {
    let plan = Plan::new(&pair(2, Some("10gbit"))).unwrap();
    let names: Vec<_> = plan.namespaces.iter().map(|n| n.short.as_str()).collect();
    assert_eq!(names, ["host", "node1", "node2", "witness", "sw"]);
    let lines = lines(&plan);
    for i in 1..=2 {
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-node1 link add peer{i} type veth peer name peer{i} netns lanes-demo-node2"
        )));
        for k in 1..=2 {
            assert!(lines.contains(&format!(
                "ip -n lanes-demo-node{k} addr add 10.78.{i}.{k}/24 dev peer{i}"
            )));
            let tbf = lines
                .iter()
                .find(|l| {
                    l.starts_with(&format!("tc -n lanes-demo-node{k} qdisc add dev peer{i} "))
                })
                .expect("a shaper on the replication link");
            assert!(tbf.contains("rate 10000000000bit"), "{tbf}");
        }
    }
    // Front-end links keep the lab's rate.
    assert!(lines.iter().any(
        |l| l.starts_with("tc -n lanes-demo-node1 qdisc add dev link1 ")
            && l.contains("rate 1000000000bit")
    ));
    for k in 1..=2 {
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-node{k} link add witness type veth peer name node{k} netns lanes-demo-witness"
        )));
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-node{k} addr add 10.79.{k}.2/24 dev witness"
        )));
        assert!(lines.contains(&format!(
            "ip -n lanes-demo-witness addr add 10.79.{k}.1/24 dev node{k}"
        )));
        assert_eq!(
            plan.witness_endpoint(k),
            Some(format!("10.79.{k}.1:2379").parse().unwrap())
        );
    }
    let summary = plan.summary();
    assert!(
        summary.contains("peer2 (replication, 10gbit): node1 10.78.2.1/24  node2 10.78.2.2/24"),
        "{summary}"
    );
    assert!(
        summary.contains("witness2: etcd at 10.79.2.1:2379 for node2"),
        "{summary}"
    );
    let etcd = crate::witness::args(&plan).join(" ");
    assert!(
        etcd.contains("--listen-client-urls http://10.79.1.1:2379,http://10.79.2.1:2379"),
        "{etcd}"
    );
    // Without a witness or peers nothing of this is built; a single node cannot have them.
    let plain = Plan::new(&options(Topology::Pathing, 2, 2)).unwrap();
    assert!(plain.peer_nics.is_empty() && plain.witness_nics.is_empty());
    assert_eq!(plain.witness_endpoint(1), None);
    assert!(Plan::new(&Options {
        storage_nodes: 1,
        ..pair(1, None)
    })
    .is_err());
}
