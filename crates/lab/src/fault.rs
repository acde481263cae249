//! Link and node faults: what `lanes lab fail` accepts, and the commands that apply and undo
//! each fault (pure: computed from the [`Plan`], run by [`crate::run`]).
//!
//! Faults act where packets arrive (ingress), in every namespace that receives over the
//! affected NICs, so a sender never gets a local error and the peer never sends a reset.

use std::fmt;
use std::str::FromStr;

use std::net::Ipv4Addr;
use std::time::Duration;

use crate::delay::{self, RelaySpec};
use crate::plan::{real_namespace, Cmd, Nic, Plan, FAULT_RULE_PRIORITY};

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
    /// Extra one-way delay on every packet the affected NICs receive, in microseconds, with
    /// an optional jitter (± that many microseconds); order is kept (see [`crate::delay`]).
    Delay { micros: u64, jitter_micros: u64 },
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
            let (delay, jitter) = match value.split_once('/') {
                Some((delay, jitter)) => (delay, Some(jitter)),
                None => (value, None),
            };
            let bad = || {
                format!(
                    "bad delay {value:?}: expected e.g. 50ms, 500us or 1s (at most 10s), \
                     optionally with a jitter no larger than the delay (50ms/10ms)"
                )
            };
            let micros = parse_duration(delay).filter(|m| *m > 0).ok_or_else(bad)?;
            let jitter_micros = match jitter {
                None => 0,
                Some(jitter) => parse_duration(jitter)
                    .filter(|j| *j <= micros)
                    .ok_or_else(bad)?,
            };
            return Ok(Self::Delay {
                micros,
                jitter_micros,
            });
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
            Self::Delay {
                micros,
                jitter_micros,
            } => {
                write!(f, "delay={}", Micros(*micros))?;
                if *jitter_micros > 0 {
                    write!(f, "/{}", Micros(*jitter_micros))?;
                }
                Ok(())
            }
            Self::Loss { percent } => write!(f, "loss={percent}%"),
        }
    }
}

/// A duration written as `50ms`, `500us` or `1s`, in microseconds (at most 10 s).
fn parse_duration(text: &str) -> Option<u64> {
    let (number, scale) = if let Some(n) = text.strip_suffix("ms") {
        (n, 1_000)
    } else if let Some(n) = text.strip_suffix("us") {
        (n, 1)
    } else {
        (text.strip_suffix('s')?, 1_000_000)
    };
    let micros = number.parse::<u64>().ok()?.checked_mul(scale)?;
    (micros <= 10_000_000).then_some(micros)
}

/// Microseconds written back the way [`parse_duration`] reads them.
struct Micros(u64);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 % 1000 == 0 {
            write!(f, "{}ms", self.0 / 1000)
        } else {
            write!(f, "{}us", self.0)
        }
    }
}

/// The commands that inject a fault and the ones that take it back out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultActions {
    /// Run after the relays are ready.
    pub apply: Vec<Cmd>,
    /// Run before the relays are stopped.
    pub undo: Vec<Cmd>,
    /// Processes the fault needs (delay only), one per namespace.
    pub relays: Vec<RelaySpec>,
}

/// The NICs a target consists of, and for a node the (namespace, node address) pairs whose
/// packets the other endpoints must treat as the node's.
type Affected<'a> = (Vec<&'a Nic>, Vec<(String, Ipv4Addr)>);

/// Works out what a target stands for in this lab; errors name what does not exist.
fn affected(plan: &Plan, target: FaultTarget) -> Result<Affected<'_>, String> {
    let options = &plan.options;
    let nics: Vec<_> = match target {
        FaultTarget::Link(i) => plan.nics.iter().filter(|n| n.index == i).collect(),
        FaultTarget::Node(k) => {
            let ns = format!("node{k}");
            plan.nics.iter().filter(|n| n.namespace == ns).collect()
        }
    };
    if nics.is_empty() {
        // In a mesh the host and the storage nodes may have different NIC counts.
        let most = plan.nics.iter().map(|n| n.index).max().unwrap_or(1);
        let links = match most {
            1 => "link1".to_string(),
            n => format!("link1..link{n}"),
        };
        let nodes = options.node_names().join(", ");
        return Err(format!(
            "lab {} has no {target} (it has {links} and {nodes})",
            options.name
        ));
    }
    // For a node, the other endpoints must also drop what the node sends them.
    let node_sources: Vec<(String, Ipv4Addr)> = match target {
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
    Ok((nics, node_sources))
}

/// The NICs, as (namespace, device), whose arriving packets a fault acts on. A delay takes
/// its NICs' packets onto a TUN device, so it must not share a NIC with another fault.
pub fn touched(
    plan: &Plan,
    target: FaultTarget,
    mode: FaultMode,
) -> Result<Vec<(String, String)>, String> {
    let (nics, node_sources) = affected(plan, target)?;
    Ok(match mode {
        FaultMode::Delay { .. } => delay::touched(plan, &nics, &node_sources),
        _ => nics
            .iter()
            .map(|n| (n.namespace.clone(), n.device.clone()))
            .collect(),
    })
}

/// Works out a fault for a lab; errors name what does not exist in this lab.
pub fn actions(plan: &Plan, target: FaultTarget, mode: FaultMode) -> Result<FaultActions, String> {
    let options = &plan.options;
    let (nics, node_sources) = affected(plan, target)?;
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
        FaultMode::Delay {
            micros,
            jitter_micros,
        } => {
            return Ok(delay::actions(
                plan,
                &nics,
                &node_sources,
                Duration::from_micros(micros),
                Duration::from_micros(jitter_micros),
            ));
        }
    }
    Ok(FaultActions {
        apply,
        undo,
        relays: Vec::new(),
    })
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
            storage_nics: 2,
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
        let nics = touched(&plan, FaultTarget::Node(1), mode).unwrap();
        assert_eq!(nics.len(), 6);
        let blackhole = touched(&plan, FaultTarget::Link(1), FaultMode::Blackhole).unwrap();
        assert_eq!(blackhole.len(), 3, "host, node1 and node2 link1");
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
        })
        .unwrap();
        let actions = actions(&plan, FaultTarget::Link(3), FaultMode::Blackhole).unwrap();
        assert_eq!(
            lines(&actions.apply),
            ["ip -n lanes-t-host rule add pref 10 iif link3 blackhole"]
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
}
