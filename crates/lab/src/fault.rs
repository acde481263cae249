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

/// What a fault hits: link i (host NIC i and storage NIC i), a whole storage node (every NIC
/// it has, replication and witness links included), a storage node's host-facing NICs only
/// (`front<k>`: the node is cut from the hosts but still sees its peer and the witness),
/// replication link i between the nodes of a pair, or node k's link to the witness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultTarget {
    Link(usize),
    Node(usize),
    Front(usize),
    Peer(usize),
    Witness(usize),
}

impl FromStr for FaultTarget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parse = |rest: &str| rest.parse::<usize>().ok().filter(|n| *n >= 1);
        if let Some(i) = s.strip_prefix("link").and_then(parse) {
            Ok(Self::Link(i))
        } else if let Some(k) = s.strip_prefix("node").and_then(parse) {
            Ok(Self::Node(k))
        } else if let Some(k) = s.strip_prefix("front").and_then(parse) {
            Ok(Self::Front(k))
        } else if let Some(i) = s.strip_prefix("peer").and_then(parse) {
            Ok(Self::Peer(i))
        } else if let Some(k) = s.strip_prefix("witness").and_then(parse) {
            Ok(Self::Witness(k))
        } else {
            Err(format!(
                "bad fault target {s:?}: expected a link (link1, link2, ...), a node (node1, \
                 node2), a node's host-facing NICs (front1, front2), a replication link \
                 (peer1, ...) or a node's witness link (witness1, witness2)"
            ))
        }
    }
}

impl fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Link(i) => write!(f, "link{i}"),
            Self::Node(k) => write!(f, "node{k}"),
            Self::Front(k) => write!(f, "front{k}"),
            Self::Peer(i) => write!(f, "peer{i}"),
            Self::Witness(k) => write!(f, "witness{k}"),
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
            plan.nics
                .iter()
                .chain(&plan.peer_nics)
                .chain(
                    plan.witness_nics
                        .iter()
                        .filter(|n| n.namespace != "witness"),
                )
                .filter(|n| n.namespace == ns)
                .collect()
        }
        FaultTarget::Front(k) => {
            let ns = format!("node{k}");
            plan.nics.iter().filter(|n| n.namespace == ns).collect()
        }
        FaultTarget::Peer(i) => plan.peer_nics.iter().filter(|n| n.index == i).collect(),
        FaultTarget::Witness(k) => plan.witness_nics.iter().filter(|n| n.index == k).collect(),
    };
    if nics.is_empty() {
        // In a mesh the host and the storage nodes may have different NIC counts.
        let most = plan.nics.iter().map(|n| n.index).max().unwrap_or(1);
        let links = match most {
            1 => "link1".to_string(),
            n => format!("link1..link{n}"),
        };
        let fronts = options.node_names().join(", ").replace("node", "front");
        let mut has = vec![links, options.node_names().join(", "), fronts];
        if options.pair.peer_nics > 0 {
            has.push(format!("peer1..peer{}", options.pair.peer_nics));
        }
        if options.pair.witness {
            has.push("witness1, witness2".to_string());
        }
        return Err(format!(
            "lab {} has no {target} (it has {})",
            options.name,
            has.join(", ")
        ));
    }
    // For a node, the other endpoints must also drop what the node sends them (over a shared
    // front-end subnet, the host receives node 1's and node 2's packets on one NIC).
    let node_sources: Vec<(String, Ipv4Addr)> = match target {
        FaultTarget::Node(k) | FaultTarget::Front(k) => {
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
        FaultTarget::Link(_) | FaultTarget::Peer(_) | FaultTarget::Witness(_) => Vec::new(),
    };
    Ok((nics, node_sources))
}

/// The NICs, as (namespace, device), whose arriving packets a delay fault takes through its
/// relays (none for other modes). Each such NIC gets an ingress qdisc of its own, so two
/// delays may not share a NIC.
pub fn delayed_nics(
    plan: &Plan,
    target: FaultTarget,
    mode: FaultMode,
) -> Result<Vec<(String, String)>, String> {
    let (nics, node_sources) = affected(plan, target)?;
    Ok(match mode {
        FaultMode::Delay { .. } => delay::touched(plan, &nics, &node_sources),
        _ => Vec::new(),
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
            // A delay elsewhere may hand this NIC's packets in through its TUN device: drop
            // those too (a rule for a device that does not exist matches nothing).
            for nic in &nics {
                rule(&nic.namespace, ["iif", &nic.device]);
                rule(&nic.namespace, ["iif", &delay::tun_name(&nic.device)]);
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
                for device in [nic.device.clone(), delay::tun_name(&nic.device)] {
                    rules.push((nic.namespace.as_str(), ["iifname".into(), device]));
                }
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
mod tests;
