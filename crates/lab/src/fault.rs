//! Link and node faults: what `lanes lab fail` accepts, and the commands that apply and undo
//! each fault (pure: computed from the [`Plan`], run by [`crate::run`]).
//!
//! Faults act where packets arrive (ingress), in every namespace that receives over the
//! affected NICs, so a sender never gets a local error and the peer never sends a reset.

use std::fmt;
use std::str::FromStr;

use crate::plan::{real_namespace, Cmd, Plan, FAULT_RULE_PRIORITY};

/// What a fault hits: link i (host NIC i and storage NIC i) or a whole storage node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultTarget {
    Link(usize),
    Node(usize),
}

impl FromStr for FaultTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |rest: &str| rest.parse::<usize>().ok().filter(|n| *n >= 1);
        if let Some(i) = s.strip_prefix("link").and_then(parse) {
            Ok(Self::Link(i))
        } else if let Some(k) = s.strip_prefix("node").and_then(parse) {
            Ok(Self::Node(k))
        } else {
            Err(format!(
                "bad fault target {s:?}: expected a link (link1, link2, ...) or a node (node1, node2)"
            ))
        }
    }
}

impl fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Link(i) => write!(f, "link{i}"),
            Self::Node(k) => write!(f, "node{k}"),
        }
    }
}

/// How the target fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// The NICs go down, like a pulled cable.
    Down,
    /// Every packet silently vanishes: no RST, no ICMP.
    Blackhole,
    /// Extra one-way delay on every packet the affected NICs send, in microseconds (netem).
    Delay { micros: u64 },
    /// Each arriving packet is dropped with this probability, in percent.
    Loss { percent: u8 },
}

impl FromStr for FaultMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "down" {
            return Ok(Self::Down);
        }
        if s == "blackhole" {
            return Ok(Self::Blackhole);
        }
        if let Some(value) = s.strip_prefix("loss=") {
            let number = value.strip_suffix('%').unwrap_or(value);
            return match number.parse::<u8>() {
                Ok(percent) if (1..=100).contains(&percent) => Ok(Self::Loss { percent }),
                _ => Err(format!(
                    "bad loss {value:?}: expected a whole percentage 1%..100%"
                )),
            };
        }
        if let Some(value) = s.strip_prefix("delay=") {
            let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
                (n, 1_000)
            } else if let Some(n) = value.strip_suffix("us") {
                (n, 1)
            } else if let Some(n) = value.strip_suffix('s') {
                (n, 1_000_000)
            } else {
                (value, 0)
            };
            return match number.parse::<u64>() {
                Ok(n) if scale > 0 && n > 0 && n * scale <= 10_000_000 => {
                    Ok(Self::Delay { micros: n * scale })
                }
                _ => Err(format!(
                    "bad delay {value:?}: expected e.g. 50ms, 500us or 1s (at most 10s)"
                )),
            };
        }
        Err(format!(
            "bad fault mode {s:?}: expected down, blackhole, delay=50ms or loss=5%"
        ))
    }
}

impl fmt::Display for FaultMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Down => f.write_str("down"),
            Self::Blackhole => f.write_str("blackhole"),
            Self::Delay { micros } if micros % 1000 == 0 => write!(f, "delay={}ms", micros / 1000),
            Self::Delay { micros } => write!(f, "delay={micros}us"),
            Self::Loss { percent } => write!(f, "loss={percent}%"),
        }
    }
}

/// The commands that inject a fault and the ones that take it back out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultActions {
    pub apply: Vec<Cmd>,
    pub undo: Vec<Cmd>,
}

/// Works out a fault for a lab; errors name what does not exist in this lab.
pub fn actions(plan: &Plan, target: FaultTarget, mode: FaultMode) -> Result<FaultActions, String> {
    let options = &plan.options;
    let nics: Vec<_> = match target {
        FaultTarget::Link(i) if i <= options.nics => {
            plan.nics.iter().filter(|n| n.index == i).collect()
        }
        FaultTarget::Node(k) if k <= options.storage_nodes => {
            let ns = format!("node{k}");
            plan.nics.iter().filter(|n| n.namespace == ns).collect()
        }
        _ => {
            let links = match options.nics {
                1 => "link1".to_string(),
                n => format!("link1..link{n}"),
            };
            let nodes = options.node_names().join(", ");
            return Err(format!(
                "lab {} has no {target} (it has {links} and {nodes})",
                options.name
            ));
        }
    };
    // For a node, the other endpoints must also drop what the node sends them.
    let node_sources: Vec<(String, std::net::Ipv4Addr)> = match target {
        FaultTarget::Node(k) => {
            let ns = format!("node{k}");
            let mut addresses: Vec<_> = nics.iter().map(|n| n.address).collect();
            addresses.extend(
                plan.aggregates
                    .iter()
                    .filter(|(a, _)| *a == ns)
                    .map(|(_, a)| *a),
            );
            let others = plan
                .namespaces
                .iter()
                .filter(|n| n.short != ns && n.short != "sw");
            others
                .flat_map(|other| addresses.iter().map(|a| (other.short.clone(), *a)))
                .collect()
        }
        FaultTarget::Link(_) => Vec::new(),
    };
    let mut apply = Vec::new();
    let mut undo = Vec::new();
    match mode {
        FaultMode::Down => {
            for nic in &nics {
                apply.push(plan.ip_cmd(&nic.namespace, ["link", "set", &nic.device, "down"]));
                undo.push(plan.ip_cmd(&nic.namespace, ["link", "set", &nic.device, "up"]));
            }
            // The kernel dropped the routes through the NICs that went down.
            undo.extend(plan.routes.iter().map(|r| r.cmd.clone()));
        }
        FaultMode::Blackhole => {
            let pref = FAULT_RULE_PRIORITY.to_string();
            let mut rule = |ns: &str, selector: [&str; 2]| {
                for (verb, list) in [("add", &mut apply), ("del", &mut undo)] {
                    let args = [
                        "rule",
                        verb,
                        "pref",
                        &pref,
                        selector[0],
                        selector[1],
                        "blackhole",
                    ];
                    list.push(plan.ip_cmd(ns, args));
                }
            };
            for nic in &nics {
                rule(&nic.namespace, ["iif", &nic.device]);
            }
            for (ns, address) in &node_sources {
                rule(ns, ["from", &address.to_string()]);
            }
        }
        FaultMode::Loss { percent } => {
            let table = format!("lanes_{target}");
            let percent = percent.to_string();
            let mut namespaces: Vec<&str> = Vec::new();
            let mut rules: Vec<(&str, [String; 2])> = Vec::new();
            for nic in &nics {
                rules.push((
                    nic.namespace.as_str(),
                    ["iifname".into(), nic.device.clone()],
                ));
            }
            for (ns, address) in &node_sources {
                rules.push((ns.as_str(), ["ip saddr".into(), address.to_string()]));
            }
            for (ns, _) in &rules {
                if !namespaces.contains(ns) {
                    namespaces.push(ns);
                }
            }
            let nft = |ns: &str, args: &[&str]| {
                let real = real_namespace(&options.name, ns);
                let mut all = vec!["ip", "netns", "exec", &real, "nft"];
                all.extend_from_slice(args);
                Cmd::new(all)
            };
            for ns in &namespaces {
                apply.push(nft(ns, &["add", "table", "inet", &table]));
                apply.push(nft(
                    ns,
                    &[
                        "add",
                        "chain",
                        "inet",
                        &table,
                        "faults",
                        "{ type filter hook prerouting priority -300 ; policy accept ; }",
                    ],
                ));
                undo.push(nft(ns, &["delete", "table", "inet", &table]));
            }
            for (ns, [selector, value]) in &rules {
                apply.push(nft(
                    ns,
                    &[
                        "add", "rule", "inet", &table, "faults", selector, value, "numgen",
                        "random", "mod", "100", "<", &percent, "drop",
                    ],
                ));
            }
        }
        FaultMode::Delay { micros } => {
            let delay = format!("{micros}us");
            for nic in &nics {
                let shaper = plan
                    .shapers
                    .iter()
                    .find(|s| s.namespace == nic.namespace && s.device == nic.device);
                let Some(shaper) = shaper else { continue };
                let real = real_namespace(&options.name, &nic.namespace);
                apply.push(Cmd::new([
                    "tc",
                    "-n",
                    &real,
                    "qdisc",
                    "add",
                    "dev",
                    &nic.device,
                    "parent",
                    "1:1",
                    "handle",
                    "10:",
                    "netem",
                    "delay",
                    &delay,
                ]));
                // Deleting tbf's child would leave it with a qdisc that drops everything, so
                // undo rebuilds the shaper instead.
                undo.push(Cmd::new([
                    "tc",
                    "-n",
                    &real,
                    "qdisc",
                    "del",
                    "dev",
                    &nic.device,
                    "root",
                ]));
                undo.push(plan.tbf(shaper, "add"));
            }
        }
    }
    Ok(FaultActions { apply, undo })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::{Options, Topology};

    fn plan(topology: Topology, nodes: usize) -> Plan {
        Plan::new(&Options {
            name: "t".into(),
            topology,
            nics: 2,
            rate: "1gbit".parse().unwrap(),
            storage_nodes: nodes,
            mtu: 1500,
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
        assert_eq!(
            "delay=50ms".parse(),
            Ok(FaultMode::Delay { micros: 50_000 })
        );
        assert_eq!(
            "delay=1s".parse(),
            Ok(FaultMode::Delay { micros: 1_000_000 })
        );
        for bad in [
            "loss=0%",
            "loss=101%",
            "delay=50",
            "delay=ms",
            "up",
            "loss=x",
        ] {
            assert!(bad.parse::<FaultMode>().is_err(), "{bad} parsed");
        }
        assert_eq!(
            FaultMode::Delay { micros: 50_000 }.to_string(),
            "delay=50ms"
        );
    }

    #[test]
    fn link_blackhole_drops_on_both_ends_and_undoes_itself() {
        let plan = plan(Topology::Pathing, 1);
        let actions = actions(&plan, FaultTarget::Link(2), FaultMode::Blackhole).unwrap();
        assert_eq!(
            lines(&actions.apply),
            [
                "ip -n lanes-t-host rule add pref 10 iif link2 blackhole",
                "ip -n lanes-t-node1 rule add pref 10 iif link2 blackhole",
            ]
        );
        assert_eq!(
            lines(&actions.undo),
            [
                "ip -n lanes-t-host rule del pref 10 iif link2 blackhole",
                "ip -n lanes-t-node1 rule del pref 10 iif link2 blackhole",
            ]
        );
    }

    #[test]
    fn node_blackhole_also_drops_what_the_node_sends() {
        let plan = plan(Topology::Mesh, 2);
        let actions = actions(&plan, FaultTarget::Node(2), FaultMode::Blackhole).unwrap();
        let apply = lines(&actions.apply);
        assert!(apply.contains(&"ip -n lanes-t-node2 rule add pref 10 iif link1 blackhole".into()));
        assert!(apply
            .contains(&"ip -n lanes-t-host rule add pref 10 from 10.77.0.202 blackhole".into()));
        assert!(apply
            .contains(&"ip -n lanes-t-node1 rule add pref 10 from 10.77.0.201 blackhole".into()));
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
        assert_eq!(
            lines(&actions.undo),
            [
                "ip netns exec lanes-t-host nft delete table inet lanes_link1",
                "ip netns exec lanes-t-node1 nft delete table inet lanes_link1",
            ]
        );
    }

    #[test]
    fn unknown_targets_are_refused() {
        let plan = plan(Topology::Pathing, 1);
        let err = actions(&plan, FaultTarget::Node(2), FaultMode::Down).unwrap_err();
        assert!(err.contains("no node2"), "{err}");
        assert!(actions(&plan, FaultTarget::Link(3), FaultMode::Down).is_err());
    }
}
