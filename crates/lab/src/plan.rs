//! The pure part of `lanes lab up`: from [`Options`] to the namespaces, NICs, addresses and the
//! exact `ip`/`tc`/`sysctl` command lines that build them. Nothing here runs a command, so every
//! topology is checked by unit tests without root.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};

use serde::{Deserialize, Serialize};

use crate::options::{Options, Rate, Topology};

/// One command line: the program and its arguments, never passed through a shell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cmd(pub Vec<String>);

impl Cmd {
    pub fn new<S: AsRef<str>>(args: impl IntoIterator<Item = S>) -> Self {
        Self(args.into_iter().map(|a| a.as_ref().to_string()).collect())
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for arg in &self.0 {
            if !first {
                f.write_str(" ")?;
            }
            first = false;
            if arg.is_empty() || arg.contains([' ', '"', '{', '}', ';']) {
                write!(f, "'{arg}'")?;
            } else {
                f.write_str(arg)?;
            }
        }
        Ok(())
    }
}

/// The namespace a short lab name (`host`, `node1`, `sw`) stands for.
pub fn real_namespace(lab: &str, short: &str) -> String {
    format!("lanes-{lab}-{short}")
}

/// A namespace of the lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespace {
    /// `host`, `node1`, `node2` or `sw`.
    pub short: String,
    /// `lanes-NAME-host`, ...
    pub real: String,
}

/// An emulated NIC: `linkI` in `host` or a storage node, with its address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    pub namespace: String,
    /// 1-based: host NIC i and storage NIC i form link i.
    pub index: usize,
    pub device: String,
    pub address: Ipv4Addr,
    pub prefix: u8,
}

/// A shaped veth end: a NIC or a switch port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shaper {
    pub namespace: String,
    pub device: String,
    /// Another rate than the lab's (replication links).
    #[serde(default)]
    pub rate: Option<Rate>,
}

/// A command that belongs to one namespace (so it can be re-run for that namespace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacedCmd {
    pub namespace: String,
    pub cmd: Cmd,
}

/// Everything `up` will build, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub options: Options,
    pub namespaces: Vec<Namespace>,
    pub nics: Vec<Nic>,
    /// lacp: the aggregate address of each end, on `lo`.
    pub aggregates: Vec<(String, Ipv4Addr)>,
    pub shapers: Vec<Shaper>,
    /// Replication links between node1 and node2 (`peerI`, both ends).
    #[serde(default)]
    pub peer_nics: Vec<Nic>,
    /// Each node's link to the witness namespace: `witness` in nodeK and `nodeK` in the
    /// witness namespace, both with index K.
    #[serde(default)]
    pub witness_nics: Vec<Nic>,
    /// Namespaces, links, addresses, qdiscs, rules: run once, in order.
    pub setup: Vec<Cmd>,
    /// Routes (`ip route replace`, idempotent): run after `setup`, and again for a namespace
    /// whose NICs come back up, because the kernel drops routes through a NIC that goes down.
    pub routes: Vec<NamespacedCmd>,
}

/// Priority of the `local` table's rule in lab namespaces (moved from 0 so that blackhole
/// rules can come before it).
pub const LOCAL_RULE_PRIORITY: u32 = 100;
/// Priority of fault rules (blackhole).
pub const FAULT_RULE_PRIORITY: u32 = 10;
/// etcd's client port in the witness namespace.
pub const WITNESS_PORT: u16 = 2379;
/// tbf queue in time at RATE: a shallow switch-like buffer, deep enough for full rate.
pub const TBF_LATENCY: &str = "20ms";

/// tbf bucket size in bytes: 4 ms at RATE, and at least ten full frames, so a TCP flow on a
/// shaped veth gets ~95.6% of RATE as goodput (measured: 957 Mbit/s at 1gbit, MTU 1500).
pub fn tbf_burst(bytes_per_second: u64, mtu: u32) -> u64 {
    (bytes_per_second / 250).max(10 * (u64::from(mtu) + 14))
}

impl Plan {
    /// Works out the whole lab; the options are validated first.
    pub fn new(options: &Options) -> Result<Self, String> {
        options.validate()?;
        let mut plan = Self {
            options: options.clone(),
            namespaces: Vec::new(),
            nics: Vec::new(),
            aggregates: Vec::new(),
            shapers: Vec::new(),
            peer_nics: Vec::new(),
            witness_nics: Vec::new(),
            setup: Vec::new(),
            routes: Vec::new(),
        };
        let nodes = options.node_names();
        let switched = options.topology == Topology::Mesh || options.storage_nodes > 1;
        let mut endpoints = vec!["host".to_string()];
        endpoints.extend(nodes.iter().cloned());
        for short in endpoints
            .iter()
            .map(String::as_str)
            .chain(options.pair.witness.then_some("witness"))
            .chain(switched.then_some("sw"))
        {
            plan.namespaces.push(Namespace {
                short: short.to_string(),
                real: real_namespace(&options.name, short),
            });
        }
        for ns in plan.namespaces.clone() {
            plan.ip(&ns.short, ["link", "set", "lo", "up"]);
            let mut sysctls = vec![
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
                "net.ipv4.ip_forward=0",
            ];
            if ns.short != "sw" {
                if options.topology == Topology::Mesh {
                    sysctls.push("net.ipv4.conf.all.arp_ignore=1");
                    sysctls.push("net.ipv4.conf.all.arp_announce=2");
                }
                if options.topology == Topology::Lacp {
                    sysctls.push("net.ipv4.fib_multipath_hash_policy=1");
                }
            }
            for sysctl in sysctls {
                plan.setup.push(Cmd::new([
                    "ip", "netns", "exec", &ns.real, "sysctl", "-q", "-w", sysctl,
                ]));
            }
            if ns.short != "sw" {
                let local = LOCAL_RULE_PRIORITY.to_string();
                plan.ip(
                    &ns.short,
                    ["rule", "add", "pref", &local, "lookup", "local"],
                );
                plan.ip(&ns.short, ["rule", "del", "pref", "0", "lookup", "local"]);
            }
        }

        // NICs and their addresses (in a mesh the storage nodes may have fewer or more NICs
        // than the host).
        let storage_nics = options.storage_nic_count();
        for i in 1..=options.nics.max(storage_nics) {
            for (k, ns) in endpoints.iter().enumerate() {
                let count = if k == 0 { options.nics } else { storage_nics };
                if i > count {
                    continue;
                }
                let (address, prefix) = match options.topology {
                    // host .1, node1 .2, node2 .3 on 10.77.i.0/24
                    Topology::Pathing | Topology::Lacp => {
                        (Ipv4Addr::new(10, 77, i as u8, k as u8 + 1), 24)
                    }
                    // host .1i, node1 .10i, node2 .20i on 10.77.0.0/24
                    Topology::Mesh => {
                        let host_part = if k == 0 { 10 + i } else { 100 * k + i };
                        (Ipv4Addr::new(10, 77, 0, host_part as u8), 24)
                    }
                };
                plan.nics.push(Nic {
                    namespace: ns.clone(),
                    index: i,
                    device: format!("link{i}"),
                    address,
                    prefix,
                });
            }
        }

        // Wiring.
        if switched {
            let bridges: Vec<String> = match options.topology {
                Topology::Mesh => vec!["br0".into()],
                _ => (1..=options.nics).map(|i| format!("br{i}")).collect(),
            };
            for bridge in &bridges {
                plan.ip("sw", ["link", "add", bridge, "type", "bridge"]);
            }
            for nic in plan.nics.clone() {
                let port = switch_port(&nic.namespace, nic.index);
                let bridge = if bridges.len() == 1 {
                    &bridges[0]
                } else {
                    &bridges[nic.index - 1]
                };
                let sw = real_namespace(&options.name, "sw");
                plan.ip(
                    &nic.namespace,
                    [
                        "link",
                        "add",
                        &nic.device,
                        "type",
                        "veth",
                        "peer",
                        "name",
                        &port,
                        "netns",
                        &sw,
                    ],
                );
                plan.ip("sw", ["link", "set", &port, "master", bridge]);
                plan.link_up("sw", &port);
                plan.shapers.push(Shaper {
                    namespace: "sw".into(),
                    device: port,
                    rate: None,
                });
            }
            for bridge in &bridges {
                plan.ip(
                    "sw",
                    ["link", "set", bridge, "mtu", &options.mtu.to_string()],
                );
                plan.ip("sw", ["link", "set", bridge, "up"]);
            }
        } else {
            let node = real_namespace(&options.name, "node1");
            for i in 1..=options.nics {
                let device = format!("link{i}");
                plan.ip(
                    "host",
                    [
                        "link", "add", &device, "type", "veth", "peer", "name", &device, "netns",
                        &node,
                    ],
                );
            }
        }
        for nic in plan.nics.clone() {
            let address = format!("{}/{}", nic.address, nic.prefix);
            plan.ip(
                &nic.namespace,
                ["addr", "add", &address, "dev", &nic.device],
            );
            plan.link_up(&nic.namespace, &nic.device);
            plan.shapers.push(Shaper {
                namespace: nic.namespace.clone(),
                device: nic.device.clone(),
                rate: None,
            });
        }
        plan.pair_links();
        for shaper in plan.shapers.clone() {
            let cmd = plan.tbf(&shaper, "add");
            plan.setup.push(cmd);
        }

        match options.topology {
            Topology::Lacp => plan.aggregate(),
            Topology::Mesh => plan.source_routing(),
            Topology::Pathing => {}
        }
        Ok(plan)
    }

    /// The HA pair's links: `peerI` between node1 and node2 (shaped at the peer rate), and
    /// each node's link to the witness namespace (not shaped: a few small requests).
    fn pair_links(&mut self) {
        let pair = self.options.pair;
        let node2 = self.real("node2");
        for i in 1..=pair.peer_nics {
            let device = format!("peer{i}");
            self.ip(
                "node1",
                [
                    "link", "add", &device, "type", "veth", "peer", "name", &device, "netns",
                    &node2,
                ],
            );
            for k in 1..=2u8 {
                let nic = Nic {
                    namespace: format!("node{k}"),
                    index: i,
                    device: device.clone(),
                    address: Ipv4Addr::new(10, 78, i as u8, k),
                    prefix: 24,
                };
                self.add_address(&nic);
                self.shapers.push(Shaper {
                    namespace: nic.namespace.clone(),
                    device: device.clone(),
                    rate: pair.peer_rate,
                });
                self.peer_nics.push(nic);
            }
        }
        if !pair.witness {
            return;
        }
        let witness = self.real("witness");
        for k in 1..=2u8 {
            let node = format!("node{k}");
            self.ip(
                &node,
                [
                    "link", "add", "witness", "type", "veth", "peer", "name", &node, "netns",
                    &witness,
                ],
            );
            for (namespace, device, host) in [(node.as_str(), "witness", 2), ("witness", &node, 1)]
            {
                let nic = Nic {
                    namespace: namespace.to_string(),
                    index: usize::from(k),
                    device: device.to_string(),
                    address: Ipv4Addr::new(10, 79, k, host),
                    prefix: 24,
                };
                self.add_address(&nic);
                self.witness_nics.push(nic);
            }
        }
    }

    fn add_address(&mut self, nic: &Nic) {
        let address = format!("{}/{}", nic.address, nic.prefix);
        self.ip(
            &nic.namespace,
            ["addr", "add", &address, "dev", &nic.device],
        );
        self.link_up(&nic.namespace, &nic.device);
    }

    /// Where nodeK reaches etcd: `10.79.K.1:2379` (empty without a witness).
    pub fn witness_endpoint(&self, node: usize) -> Option<SocketAddrV4> {
        self.witness_nics
            .iter()
            .find(|n| n.namespace == "witness" && n.index == node)
            .map(|n| SocketAddrV4::new(n.address, WITNESS_PORT))
    }

    /// The lab's namespace for a short name.
    pub fn namespace(&self, short: &str) -> Option<&Namespace> {
        self.namespaces.iter().find(|ns| ns.short == short)
    }

    /// The real name of one of the plan's namespaces (only called with names the plan made).
    fn real(&self, short: &str) -> String {
        real_namespace(&self.options.name, short)
    }

    /// `ip -n NS ARGS...`
    pub fn ip_cmd<S: AsRef<str>>(&self, short: &str, args: impl IntoIterator<Item = S>) -> Cmd {
        let mut all = vec!["ip".to_string(), "-n".to_string(), self.real(short)];
        all.extend(args.into_iter().map(|a| a.as_ref().to_string()));
        Cmd(all)
    }

    fn ip<S: AsRef<str>>(&mut self, short: &str, args: impl IntoIterator<Item = S>) {
        let cmd = self.ip_cmd(short, args);
        self.setup.push(cmd);
    }

    fn link_up(&mut self, short: &str, device: &str) {
        let mtu = self.options.mtu.to_string();
        self.ip(short, ["link", "set", device, "mtu", &mtu, "up"]);
    }

    /// `tc -n NS qdisc VERB dev DEV root handle 1: tbf rate RATE burst B latency L`.
    pub fn tbf(&self, shaper: &Shaper, verb: &str) -> Cmd {
        let rate = &shaper.rate.unwrap_or(self.options.rate);
        let burst = tbf_burst(rate.bytes_per_second(), self.options.mtu).to_string();
        Cmd::new([
            "tc",
            "-n",
            &self.real(&shaper.namespace),
            "qdisc",
            verb,
            "dev",
            &shaper.device,
            "root",
            "handle",
            "1:",
            "tbf",
            "rate",
            &format!("{}bit", rate.bits_per_second),
            "burst",
            &burst,
            "latency",
            TBF_LATENCY,
        ])
    }

    /// lacp: each end's aggregate address on `lo`, and an ECMP route to the other end's
    /// aggregate address over every member, hashed on layer 3+4.
    fn aggregate(&mut self) {
        let ends = [
            ("host", Ipv4Addr::new(10, 77, 100, 1), 2u8),
            ("node1", Ipv4Addr::new(10, 77, 100, 2), 1u8),
        ];
        for (short, address, _) in ends {
            self.ip(
                short,
                ["addr", "add", &format!("{address}/32"), "dev", "lo"],
            );
            self.aggregates.push((short.to_string(), address));
        }
        for (k, (short, address, peer_host_part)) in ends.iter().enumerate() {
            let peer = ends[1 - k].1;
            let mut args = vec![
                "route".to_string(),
                "replace".into(),
                format!("{peer}/32"),
                "src".into(),
                address.to_string(),
            ];
            for i in 1..=self.options.nics {
                args.extend([
                    "nexthop".to_string(),
                    "via".into(),
                    Ipv4Addr::new(10, 77, i as u8, *peer_host_part).to_string(),
                    "dev".into(),
                    format!("link{i}"),
                ]);
            }
            let cmd = self.ip_cmd(short, args);
            self.routes.push(NamespacedCmd {
                namespace: short.to_string(),
                cmd,
            });
        }
    }

    /// mesh: per-NIC tables so traffic from a NIC's address leaves through that NIC.
    fn source_routing(&mut self) {
        for nic in self.nics.clone() {
            let table = (100 + nic.index).to_string();
            let pref = (1000 + nic.index).to_string();
            let address = nic.address.to_string();
            self.ip(
                &nic.namespace,
                [
                    "rule", "add", "pref", &pref, "from", &address, "lookup", &table,
                ],
            );
            let cmd = self.ip_cmd(
                &nic.namespace,
                [
                    "route",
                    "replace",
                    "10.77.0.0/24",
                    "dev",
                    &nic.device,
                    "src",
                    &address,
                    "table",
                    &table,
                ],
            );
            self.routes.push(NamespacedCmd {
                namespace: nic.namespace,
                cmd,
            });
        }
    }

    /// Human summary printed by `up`.
    pub fn summary(&self) -> String {
        use fmt::Write as _;
        let o = &self.options;
        let mut out = String::new();
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let storage_nics = o.storage_nic_count();
        let nics = if storage_nics == o.nics {
            format!("{} NIC{} per namespace", o.nics, plural(o.nics))
        } else {
            format!(
                "{} host NIC{} and {storage_nics} per storage node",
                o.nics,
                plural(o.nics)
            )
        };
        let _ = writeln!(
            out,
            "lab {} is up: {}, {nics} at {}, {} storage node{}, MTU {}",
            o.name,
            o.topology,
            o.rate,
            o.storage_nodes,
            plural(o.storage_nodes),
            o.mtu
        );
        // One line per NIC index, every NIC with that index on it (`link3: host ADDR` alone
        // when the storage nodes have fewer NICs).
        for i in 1..=o.nics.max(storage_nics) {
            let ends: Vec<String> = self
                .nics
                .iter()
                .filter(|n| n.index == i)
                .map(|n| format!("{} {}/{}", n.namespace, n.address, n.prefix))
                .collect();
            let _ = writeln!(out, "  link{i}: {}", ends.join("  "));
        }
        for (ns, address) in &self.aggregates {
            let _ = writeln!(out, "  aggregate (lacp, layer3+4 hash): {ns} {address}");
        }
        for i in 1..=o.pair.peer_nics {
            let ends: Vec<String> = self
                .peer_nics
                .iter()
                .filter(|n| n.index == i)
                .map(|n| format!("{} {}/{}", n.namespace, n.address, n.prefix))
                .collect();
            let rate = o.pair.peer_rate.unwrap_or(o.rate);
            let _ = writeln!(out, "  peer{i} (replication, {rate}): {}", ends.join("  "));
        }
        for k in 1..=2 {
            if let Some(endpoint) = self.witness_endpoint(k) {
                let _ = writeln!(out, "  witness{k}: etcd at {endpoint} for node{k}");
            }
        }
        let names: Vec<String> = self
            .namespaces
            .iter()
            .map(|ns| format!("{} = {}", ns.short, ns.real))
            .collect();
        let _ = writeln!(out, "namespaces: {}", names.join(", "));
        let peer = self.aggregates.get(1).map(|(_, a)| *a).or_else(|| {
            self.nics
                .iter()
                .find(|n| n.namespace == "node1")
                .map(|n| n.address)
        });
        if let Some(peer) = peer {
            let _ = writeln!(
                out,
                "run a command inside:  lanes lab exec {} node1 -- iperf3 -s -D",
                o.name
            );
            let _ = writeln!(
                out,
                "                       lanes lab exec {} host -- iperf3 -c {peer}",
                o.name
            );
        }
        let _ = writeln!(
            out,
            "inject a fault:        lanes lab fail {} link1 --mode blackhole   (then: lanes lab restore {} link1)",
            o.name, o.name
        );
        let _ = writeln!(out, "remove everything:     lanes lab down {}", o.name);
        out
    }
}

/// The switch-side name of a NIC's veth: `h-link1`, `n1-link1`, `n2-link1`.
fn switch_port(namespace: &str, index: usize) -> String {
    match namespace.strip_prefix("node") {
        Some(k) => format!("n{k}-link{index}"),
        None => format!("h-link{index}"),
    }
}

#[cfg(test)]
mod tests;
