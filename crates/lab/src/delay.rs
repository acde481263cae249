//! The delay fault without netem: every IP packet arriving on an affected NIC is handed by tc to
//! a userspace relay, held for the delay, and given back to the kernel as if it had just
//! arrived. This module works out the commands and relays (pure); [`crate::relay`] is the relay.
//!
//! # How a packet is delayed
//!
//! ```text
//!  peer --veth (tbf-shaped)--> linkI ingress --u32 + mirred--> dly-linkI (TUN) --read--> relay
//!                                                                                         | hold D
//!                             local delivery <-- kernel receives it on dly-linkI <--write-+
//! ```
//!
//! - In each namespace that receives over an affected NIC, an `ingress` qdisc on the NIC with
//!   a `u32` filter whose `mirred egress redirect` sends every IP packet (ARP stays on the NIC)
//!   out of a TUN device `dly-linkI` in the same namespace. The relay, a process running in that
//!   namespace, reads the packet, holds it in a FIFO ([`crate::delay_line`]) and writes it back
//!   to the same TUN once its time has come; the kernel then receives it on `dly-linkI` and
//!   delivers it to the local address it was sent to (`rp_filter` is off in lab namespaces).
//! - Both ends of a link do this, so each direction is delayed once: a round trip grows by
//!   2 x D. For a node, its own NICs redirect everything, and the NICs of the other namespaces
//!   redirect what comes from the node's addresses (`u32 match ip src`). In a mesh a link's
//!   NICs also talk to NICs of other numbers, so those redirect what comes from the link's
//!   addresses too.
//! - Blackhole and loss rules also match the TUN devices (`iif dly-linkI`), so they combine
//!   with a delay on other NICs; two delays may not share a NIC.
//! - Shaping is untouched: tbf sits on the senders' egress, before the delay, so the rate limit
//!   stays and the relay never needs a shaper of its own. Order is kept (one FIFO per NIC);
//!   jitter (`delay=50ms/10ms`) draws each packet's delay from D ± J but never lets a packet
//!   leave before the one ahead of it, so under load delays bunch towards D + J, as netem's do
//!   when it must not reorder.
//! - The relay's queue is bounded at 1.25 x rate x (D + J) + 4 MiB per NIC (at most 256 MiB);
//!   beyond that packets are dropped, like a full switch buffer.
//! - `restore` deletes the ingress qdiscs first (new packets take the direct path at once),
//!   waits D + J so the packets the relays still hold arrive, then stops the relays; their TUN
//!   devices vanish with them. `down` deletes the namespaces, which stops everything inside
//!   them first.
//! - The relay sleeps on a timerfd set to the next packet's release time, so a delay is kept to
//!   the microsecond, not rounded to poll's milliseconds.
//!
//! # Why this design
//!
//! This kernel has no netem and no nft `queue`. The other userspace route, iptables-legacy
//! NFQUEUE with a process holding verdicts, needs the iptables package and its legacy backend,
//! still copies every packet to userspace, and must keep thousands of verdicts open at
//! 1gbit x 50 ms (it was considered, not built). Routing the peer's address through a pair of
//! TUNs would bypass the veth and its tbf (so the TUN would need a shaper of its own) and
//! breaks down in a mesh, where one NIC talks to many peers. Redirecting at ingress needs only
//! tc (`u32`, `mirred`) and a TUN, touches neither routes nor the root namespace, and works the
//! same for every topology and for node faults. Its cost is two system calls per packet in the
//! receiving namespace (a TUN has no batched read).
//!
//! Measured on this 2-core machine, one 1gbit pathing link, iperf3 single stream unless said:
//!
//! | fault | round trip (TCP SYN -> RST) | iperf3 |
//! |---|---|---|
//! | none | 0.02 ms | 957 Mbit/s |
//! | delay=1ms | 2.2 ms | 850-953 Mbit/s (debug or release build; lower while other builds run) |
//! | delay=50ms | 100.4 ms | 205-236 Mbit/s, 0 retransmits: one stream is held by its 4 MiB send buffer (4 MiB per 100 ms round trip); 8 streams 800-846 Mbit/s |
//! | delay=20ms/10ms | 27-60 ms | |

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use crate::fault::FaultActions;
use crate::options::Topology;
use crate::plan::{real_namespace, Cmd, Nic, Plan};
use crate::relay::RelayArgs;

/// The TUN device a NIC's delayed packets pass through.
pub fn tun_name(device: &str) -> String {
    format!("dly-{device}")
}

/// Packets a TUN device queues for the relay (the kernel's default, 500, overflows on bursts
/// when the relay is briefly descheduled).
const TUN_QUEUE: &str = "10000";

/// A relay to start: the namespace (short name) it runs in and what it does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelaySpec {
    pub namespace: String,
    pub args: RelayArgs,
}

/// Which packets arriving on a NIC are delayed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Selection {
    All,
    From(Vec<Ipv4Addr>),
}

/// The NICs (namespace, device) whose arriving packets a delay on these NICs goes through,
/// and which packets: everything arriving on the NICs themselves, and at every NIC of another
/// namespace what comes from them. The latter matters for a failed node, and in a mesh, where a
/// NIC talks to every NIC of the other namespaces, not only to those with its number.
fn selections(
    plan: &Plan,
    nics: &[&Nic],
    node_sources: &[(String, Ipv4Addr)],
) -> BTreeMap<(String, String), Selection> {
    let mut sources = node_sources.to_vec();
    if plan.options.topology == Topology::Mesh {
        for nic in nics {
            for ns in plan.namespaces.iter().filter(|ns| ns.short != "sw") {
                if ns.short != nic.namespace && !sources.contains(&(ns.short.clone(), nic.address))
                {
                    sources.push((ns.short.clone(), nic.address));
                }
            }
        }
    }
    let mut chosen: BTreeMap<(String, String), Selection> = BTreeMap::new();
    for nic in nics {
        chosen.insert((nic.namespace.clone(), nic.device.clone()), Selection::All);
    }
    for (namespace, address) in &sources {
        for nic in plan.nics.iter().filter(|n| n.namespace == *namespace) {
            let entry = chosen
                .entry((nic.namespace.clone(), nic.device.clone()))
                .or_insert_with(|| Selection::From(Vec::new()));
            if let Selection::From(addresses) = entry {
                addresses.push(*address);
            }
        }
    }
    chosen
}

/// The NICs a delay fault takes over, as (namespace, device): each gets an ingress qdisc and
/// a TUN device of the fault's own.
pub fn touched(
    plan: &Plan,
    nics: &[&Nic],
    node_sources: &[(String, Ipv4Addr)],
) -> Vec<(String, String)> {
    selections(plan, nics, node_sources).into_keys().collect()
}

/// Bytes a relay may hold per NIC.
pub fn queue_bytes(bytes_per_second: u64, hold: Duration) -> usize {
    const SLACK: u128 = 4 << 20;
    const MAX: u128 = 256 << 20;
    let in_flight = u128::from(bytes_per_second) * hold.as_micros() / 1_000_000;
    let bytes = (in_flight * 5 / 4 + SLACK).min(MAX);
    usize::try_from(bytes).unwrap_or(usize::MAX)
}

/// The commands and relays of a delay fault.
pub fn actions(
    plan: &Plan,
    nics: &[&Nic],
    node_sources: &[(String, Ipv4Addr)],
    delay: Duration,
    jitter: Duration,
) -> FaultActions {
    let options = &plan.options;
    let queue = queue_bytes(options.rate.bytes_per_second(), delay + jitter);
    let mtu = options.mtu.to_string();
    let mut apply = Vec::new();
    let mut undo = Vec::new();
    let mut relays: Vec<RelaySpec> = Vec::new();
    for ((namespace, device), selection) in selections(plan, nics, node_sources) {
        let tun = tun_name(&device);
        match relays.iter_mut().find(|r| r.namespace == namespace) {
            Some(relay) => relay.args.devices.push(tun.clone()),
            None => relays.push(RelaySpec {
                namespace: namespace.clone(),
                args: RelayArgs {
                    lab: options.name.clone(),
                    namespace: namespace.clone(),
                    delay,
                    jitter,
                    queue_bytes: queue,
                    devices: vec![tun.clone()],
                },
            }),
        }
        // No IPv6 on the TUN: it would send its own neighbour discovery through the relay.
        apply.push(plan.ip_cmd(&namespace, ["link", "set", &tun, "addrgenmode", "none"]));
        apply.push(plan.ip_cmd(
            &namespace,
            [
                "link",
                "set",
                &tun,
                "mtu",
                &mtu,
                "txqueuelen",
                TUN_QUEUE,
                "up",
            ],
        ));
        let real = real_namespace(&options.name, &namespace);
        let tc = |args: &[&str]| {
            let mut all = vec!["tc", "-n", &real];
            all.extend_from_slice(args);
            Cmd::new(all)
        };
        apply.push(tc(&[
            "qdisc", "add", "dev", &device, "handle", "ffff:", "ingress",
        ]));
        let matches: Vec<Vec<String>> = match &selection {
            Selection::All => vec![vec!["u32".into(), "0".into(), "0".into()]],
            Selection::From(addresses) => addresses
                .iter()
                .map(|a| vec!["ip".into(), "src".into(), format!("{a}/32")])
                .collect(),
        };
        for selector in &matches {
            let mut args = vec![
                "filter", "add", "dev", &device, "parent", "ffff:", "protocol", "ip", "prio", "1",
                "u32", "match",
            ];
            args.extend(selector.iter().map(String::as_str));
            args.extend(["action", "mirred", "egress", "redirect", "dev", &tun]);
            apply.push(tc(&args));
        }
        undo.push(tc(&["qdisc", "del", "dev", &device, "ingress"]));
    }
    FaultActions {
        apply,
        undo,
        relays,
    }
}
