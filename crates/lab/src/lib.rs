//! `lanes lab`: emulated NICs, switches and storage nodes on one machine, built from network
//! namespaces, veth pairs and tc, with link and node faults.
//!
//! # What a lab is
//!
//! A lab called NAME is a handful of network namespaces, `lanes-NAME-host`, `lanes-NAME-node1`,
//! `lanes-NAME-node2` and (for switched topologies) `lanes-NAME-sw`, known inside the lab by their
//! short names `host`, `node1`, `node2`, `sw`. Host NIC i and storage NIC i are both called
//! `linkI` in their namespaces. Nothing is ever configured in the root namespace: every veth is
//! created by an `ip -n NS link add` run for one of the lab's namespaces, every address is a
//! private `10.77.x.y` inside them, so deleting the namespaces removes everything (links,
//! addresses, routes, qdiscs, nftables tables) at once. That is also how `down`, a failed `up`
//! and a Ctrl-C during `up` clean up.
//!
//! # Topologies
//!
//! - `pathing`: one link and one subnet per path, `10.77.I.0/24` (host `.1`, node1 `.2`,
//!   node2 `.3`). With one storage node each link is a direct veth pair; with two, link I is a
//!   bridge `brI` in `sw` (one switch per fabric, as in a dual-fabric SAN).
//! - `mesh`: every host and storage NIC on one bridge `br0` in `sw`, one subnet `10.77.0.0/24`
//!   (host NIC i `.1I`, node1 NIC i `.10I`, node2 NIC i `.20I`, see [`plan::Plan`]). Paths cross and
//!   contend. Only a mesh may give the storage nodes another NIC count than the host
//!   (`--nics 4 --storage-nics 2`). Each NIC gets a source-address routing table (`from ADDR lookup 100+I`) and
//!   `arp_ignore=1`/`arp_announce=2`, the usual setup for several NICs in one subnet, so a
//!   connection bound to a NIC's address leaves through that NIC.
//! - `lacp`: N member links (`10.77.I.0/24`) between host and node1 bundled into one aggregate:
//!   host `10.77.100.1`, node `10.77.100.2`, both on `lo`. This kernel has no bonding driver, so
//!   the aggregate is an ECMP route (`nexthop via 10.77.1.2 dev link1 nexthop via ...`) with
//!   `net.ipv4.fib_multipath_hash_policy=1`: the kernel hashes each flow on layer 3+4 (addresses,
//!   protocol, ports) onto one member, on both sides independently, exactly the
//!   `xmit_hash_policy=layer3+4` behaviour of real LACP. One TCP connection therefore never gets
//!   more than one member's rate, while many connections spread over all members. A member that
//!   goes down is marked dead and its flows rehash onto the others, as in a LAG.
//!
//! # Shaping
//!
//! Every veth end (NICs and switch ports) has a root `tbf` (handle `1:`) at RATE, so each NIC is
//! full duplex at RATE in each direction. The burst and queue are sized in [`plan::tbf_burst`] so
//! iperf3 gets ~95.6% of RATE at MTU 1500 (1448 payload bytes per 1514 counted bytes).
//!
//! # Faults
//!
//! Faults act where packets arrive, so senders never see a local error:
//! - `down`: the NICs are set down (a pulled cable); restore sets them up and re-adds the routes.
//! - `blackhole`: `ip rule ... iif linkI blackhole` (and, for a node, `from NODEADDR blackhole`
//!   on the host) ahead of the `local` table, whose rule moves from priority 0 to 100 at `up`.
//!   Packets vanish: no RST, no ICMP (forwarding is off in the lab, so the kernel stays silent).
//! - `loss=P%`: an nftables table per fault with `numgen random mod 100 < P drop` on ingress;
//!   this needs the `nft` tool (Debian package `nftables`).
//! - `delay=D` (or `delay=D/J` with jitter): every IP packet arriving on the affected NICs
//!   is redirected by tc to a TUN device `dly-linkI`, held by a relay process for D and handed
//!   back, in order, with a bounded queue; no netem needed (see [`delay`]). Blackhole and loss
//!   also match `dly-linkI`, so they still act on packets a delay hands in; two delays may not
//!   share a NIC. The relays' pids are in the state file; `restore` and `down` stop them.
//!
//! # State
//!
//! `up` records the plan in `/run/lanes-lab/NAME.json` (created exclusively, so a second `up`
//! with the same name is refused), and `fail` records how to undo each fault there, so
//! `down`, `fail`, `restore` and `exec` work from any process.

pub mod delay;
pub mod delay_line;
pub mod fault;
pub mod options;
pub mod plan;
pub mod relay;
pub mod run;
pub mod witness;

pub use fault::{FaultMode, FaultTarget};
pub use options::{Options, Pair, Rate, Topology};
pub use plan::{Cmd, Plan};
pub use relay::RelayCommand;
pub use run::{
    down, exec_command, fail, list, restore, state, up, witness, Down, LabError, State,
    WitnessAction,
};
