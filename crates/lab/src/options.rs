//! What `lanes lab up` was asked for: topology, NIC count, rate, MTU, storage nodes, name; each
//! validated before anything is built.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most NICs per namespace: addresses such as `10.77.0.1I` assume a single digit.
pub const MAX_NICS: usize = 8;

/// How host and storage NICs are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// One link and one subnet per path: host NIC i to storage NIC i.
    Pathing,
    /// Every NIC on one shared switch and subnet.
    Mesh,
    /// N member links bundled into one aggregate hashed on layer 3+4.
    Lacp,
}

impl FromStr for Topology {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pathing" => Ok(Self::Pathing),
            "mesh" => Ok(Self::Mesh),
            "lacp" => Ok(Self::Lacp),
            other => Err(format!(
                "unknown topology {other:?} (expected pathing, mesh or lacp)"
            )),
        }
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Pathing => "pathing",
            Self::Mesh => "mesh",
            Self::Lacp => "lacp",
        })
    }
}

/// A link rate in bits per second, written as tc writes it (`1gbit`, `100mbit`, `500kbit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub bits_per_second: u64,
}

impl Rate {
    /// Bytes per second, as tbf counts them.
    pub fn bytes_per_second(self) -> u64 {
        self.bits_per_second / 8
    }
}

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let lower = s.trim().to_ascii_lowercase();
        let digits_end = lower
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(lower.len());
        let (number, unit) = lower.split_at(digits_end);
        let multiplier: f64 = match unit {
            "bit" => 1.0,
            "kbit" => 1e3,
            "mbit" => 1e6,
            "gbit" => 1e9,
            "tbit" => 1e12,
            _ => {
                return Err(format!(
                "bad rate {s:?}: expected a number and one of bit, kbit, mbit, gbit (e.g. 1gbit)"
            ))
            }
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("bad rate {s:?}: {number:?} is not a number"))?;
        let bits = (value * multiplier).round();
        if !(8_000.0..=100e9).contains(&bits) {
            return Err(format!("rate {s:?} is outside 8kbit..100gbit"));
        }
        // In range, so the conversion is exact enough and cannot overflow.
        Ok(Self {
            bits_per_second: bits as u64,
        })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.bits_per_second;
        for (unit, size) in [
            ("gbit", 1_000_000_000),
            ("mbit", 1_000_000),
            ("kbit", 1_000),
        ] {
            if b % size == 0 {
                return write!(f, "{}{unit}", b / size);
            }
        }
        write!(f, "{b}bit")
    }
}

/// Everything `lanes lab up` needs to build a lab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Options {
    pub name: String,
    pub topology: Topology,
    /// NICs of the host.
    pub nics: usize,
    /// NICs of each storage node: the same as `nics` except in a mesh, where a host with 4
    /// NICs may talk to storage nodes with 2. (Absent in state files of older labs: 0, which
    /// [`Options::storage_nic_count`] reads as `nics`.)
    #[serde(default)]
    pub storage_nics: usize,
    pub rate: Rate,
    pub storage_nodes: usize,
    pub mtu: u32,
    /// What joins the two storage nodes of an HA pair. (Absent in older state files.)
    #[serde(default)]
    pub pair: Pair,
}

/// The HA pair's own wiring: replication links between node1 and node2, and a witness
/// namespace running etcd, reached by each node over a link of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Pair {
    /// Replication links `peerI` between node1 (`10.78.I.1`) and node2 (`10.78.I.2`).
    pub peer_nics: usize,
    /// Their rate (default: the front-end rate).
    pub peer_rate: Option<Rate>,
    /// A `witness` namespace with etcd on `10.79.K.1:2379`, linked to nodeK (`10.79.K.2`).
    pub witness: bool,
}

impl Options {
    /// Checks the combination; the error says what to change.
    pub fn validate(&self) -> Result<(), String> {
        validate_name(&self.name)?;
        if !(1..=MAX_NICS).contains(&self.nics) {
            return Err(format!("--nics {} is outside 1..={MAX_NICS}", self.nics));
        }
        if !(1..=2).contains(&self.storage_nodes) {
            return Err(format!(
                "--storage-nodes {} must be 1 or 2",
                self.storage_nodes
            ));
        }
        let storage_nics = self.storage_nic_count();
        if !(1..=MAX_NICS).contains(&storage_nics) {
            return Err(format!(
                "--storage-nics {storage_nics} is outside 1..={MAX_NICS}"
            ));
        }
        if storage_nics != self.nics && self.topology != Topology::Mesh {
            return Err(format!(
                "--storage-nics {storage_nics} differs from --nics {}: only a mesh can join \
                 unequal NIC counts (in {} each host NIC is wired to one storage NIC); use \
                 --topology mesh or the same count",
                self.nics, self.topology
            ));
        }
        if self.mtu != 1500 && self.mtu != 9000 {
            return Err(format!("--mtu {} must be 1500 or 9000", self.mtu));
        }
        if (self.pair.peer_nics > 0 || self.pair.witness) && self.storage_nodes != 2 {
            return Err(
                "--peer-nics and the witness join the two nodes of an HA pair; use \
                 --storage-nodes 2"
                    .to_string(),
            );
        }
        if self.pair.peer_nics > MAX_NICS {
            return Err(format!(
                "--peer-nics {} is outside 0..={MAX_NICS}",
                self.pair.peer_nics
            ));
        }
        if self.topology == Topology::Lacp && self.storage_nodes != 1 {
            return Err(
                "--topology lacp bundles the links between the host and one storage node; \
                        use --storage-nodes 1"
                    .to_string(),
            );
        }
        Ok(())
    }

    /// NICs of each storage node.
    pub fn storage_nic_count(&self) -> usize {
        if self.storage_nics == 0 {
            self.nics
        } else {
            self.storage_nics
        }
    }

    /// Short names of the storage nodes: `node1`, `node2`.
    pub fn node_names(&self) -> Vec<String> {
        (1..=self.storage_nodes)
            .map(|k| format!("node{k}"))
            .collect()
    }
}

/// Lab names become parts of namespace and file names: lowercase letters, digits and `-`.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = (1..=24).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bad lab name {name:?}: use 1 to 24 lowercase letters, digits or '-', not starting with '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_like_tc() {
        assert_eq!(
            "1gbit".parse::<Rate>().unwrap().bits_per_second,
            1_000_000_000
        );
        assert_eq!(
            "100mbit".parse::<Rate>().unwrap().bits_per_second,
            100_000_000
        );
        assert_eq!(
            "2.5gbit".parse::<Rate>().unwrap().bits_per_second,
            2_500_000_000
        );
        assert_eq!("1GBIT".parse::<Rate>().unwrap().to_string(), "1gbit");
        assert_eq!("1500kbit".parse::<Rate>().unwrap().to_string(), "1500kbit");
        for bad in ["1gbps", "fast", "", "gbit", "0bit", "1.2.3mbit"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn names_and_combinations_are_checked() {
        let mut options = Options {
            name: "lab-1".into(),
            topology: Topology::Lacp,
            nics: 2,
            storage_nics: 2,
            rate: "1gbit".parse().unwrap(),
            storage_nodes: 1,
            mtu: 1500,
            pair: Pair::default(),
        };
        assert!(options.validate().is_ok());
        options.pair.peer_nics = 1;
        assert!(options
            .validate()
            .unwrap_err()
            .contains("--storage-nodes 2"));
        options.pair = Pair {
            witness: true,
            ..Pair::default()
        };
        assert!(options
            .validate()
            .unwrap_err()
            .contains("--storage-nodes 2"));
        options.pair = Pair::default();
        options.storage_nics = 1;
        let err = options.validate().unwrap_err();
        assert!(err.contains("only a mesh"), "{err}");
        options.storage_nics = 2;
        options.storage_nodes = 2;
        assert!(options.validate().unwrap_err().contains("lacp"));
        options.topology = Topology::Mesh;
        assert!(options.validate().is_ok());
        options.nics = 4;
        assert!(options.validate().is_ok(), "a 4x2 mesh");
        options.storage_nics = 9;
        assert!(options.validate().is_err());
        options.storage_nics = 0;
        assert_eq!(
            options.storage_nic_count(),
            4,
            "older state files: as many as the host"
        );
        options.storage_nics = 2;
        options.nics = 9;
        assert!(options.validate().is_err());
        options.nics = 2;
        options.mtu = 4000;
        assert!(options.validate().is_err());
        for bad in ["", "A", "-x", "a/b", "a b", "x".repeat(25).as_str()] {
            assert!(validate_name(bad).is_err(), "{bad} accepted");
        }
    }
}
