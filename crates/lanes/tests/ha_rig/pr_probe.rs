//! The fault campaign's reservation check: a second host registers keys through one node or
//! the other while faults hit the pair, then reads the registrations through all four paths.
//! Every path must report the same generation and keys, and each I_T nexus's last key that
//! was answered GOOD must be there (or, after an unanswered change, one of its candidates).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use lanes_initiator::{LoginOptions, ScsiOutcome, Session};

use super::TARGET;

/// The four portals with their relative target port ids: node 1's two, then node 2's.
pub const PORTALS: [(&str, u16); 4] = [
    ("10.77.1.2:3260", 1),
    ("10.77.2.2:3260", 2),
    ("10.77.1.3:3260", 3),
    ("10.77.2.3:3260", 4),
];

const CHECKER: &str = "iqn.2026-11.io.lanes:lab-pr-checker";
/// One initiator port for every session of the checker, so that its I_T nexuses are the four
/// (initiator port, target port) pairs, whichever session a change used.
const ISID: [u8; 6] = [0x80, 0x00, 0x00, 0x00, 0x0a, 0x11];
/// Bound for one login or one command of the checker (a faulted node may not answer).
const BOUND: Duration = Duration::from_secs(4);

/// What the checker expects of the shared reservation state.
pub struct PrProbe {
    /// The portals it reads through, each with the relative target port id of its path.
    portals: Vec<(String, u16)>,
    target: String,
    /// How long a change may take before it counts as unanswered.
    change_bound: Duration,
    /// Per relative target port (= per I_T nexus of the checker): the keys it may hold. One
    /// entry after a GOOD; more while a change's outcome is unknown.
    candidates: BTreeMap<u16, Vec<u64>>,
    pub changes: u64,
    pub unanswered: u64,
}

impl Default for PrProbe {
    /// The pair's four portals.
    fn default() -> PrProbe {
        PrProbe::new(
            PORTALS
                .iter()
                .map(|(p, port)| (p.to_string(), *port))
                .collect(),
            TARGET,
        )
    }
}

async fn login(portal: &str, target: &str) -> Result<Session, String> {
    let addr: SocketAddr = portal.parse().unwrap();
    match tokio::time::timeout(
        BOUND,
        Session::login(
            addr,
            target,
            &LoginOptions {
                isid: ISID,
                ..LoginOptions::new(CHECKER)
            },
        ),
    )
    .await
    {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("login to {portal}: {e}")),
        Err(_) => Err(format!("login to {portal}: timed out")),
    }
}

/// One command, again while it reports a unit attention (each is reported once) or TASK
/// ABORTED (another host's reset ended it: a host sends it again).
async fn run(
    s: &Session,
    cdb: [u8; 16],
    read_len: u32,
    out: Option<Bytes>,
    bound: Duration,
) -> Result<ScsiOutcome, String> {
    for _ in 0..8 {
        let r = tokio::time::timeout(bound, s.execute(cdb, read_len, out.clone())).await;
        let o = match r {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("timed out".into()),
        };
        if o.status == 2 && o.sense_triplet().map(|t| t.0) == Some(6) || o.status == 0x40 {
            continue;
        }
        return Ok(o);
    }
    Err("unit attentions without end".into())
}

/// PERSISTENT RESERVE OUT, REGISTER AND IGNORE EXISTING KEY with `key`.
async fn register(s: &Session, key: u64, bound: Duration) -> Result<(), String> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x5F;
    cdb[1] = 0x06;
    cdb[8] = 24;
    let mut params = vec![0u8; 24];
    params[8..16].copy_from_slice(&key.to_be_bytes());
    let o = run(s, cdb, 0, Some(Bytes::from(params)), bound).await?;
    if o.response != 0 || o.status != 0 {
        return Err(format!(
            "status {:#x} sense {:?}",
            o.status,
            o.sense_triplet()
        ));
    }
    Ok(())
}

/// PERSISTENT RESERVE IN, READ KEYS: (generation, keys in the order reported).
async fn read_keys(s: &Session) -> Result<(u32, Vec<u64>), String> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x5E;
    cdb[7] = 0x10; // 4096 bytes
    let o = run(s, cdb, 4096, None, BOUND).await?;
    if o.status != 0 || o.data.len() < 8 {
        return Err(format!(
            "status {:#x} sense {:?}",
            o.status,
            o.sense_triplet()
        ));
    }
    let d = &o.data;
    let generation = u32::from_be_bytes(d[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap()) as usize;
    let keys = d[8..]
        .chunks_exact(8)
        .take(len / 8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    Ok((generation, keys))
}

impl PrProbe {
    /// A checker reading through `portals` (address, relative target port id) of `target`.
    pub fn new(portals: Vec<(String, u16)>, target: &str) -> PrProbe {
        PrProbe {
            portals,
            target: target.to_string(),
            change_bound: BOUND,
            candidates: BTreeMap::new(),
            changes: 0,
            unanswered: 0,
        }
    }

    /// Changes may take up to `bound` (a change that waits out a silent peer) before they
    /// count as unanswered. (The pair's campaign keeps the default.)
    #[allow(dead_code)]
    pub fn with_change_bound(mut self, bound: Duration) -> PrProbe {
        self.change_bound = bound;
        self
    }

    /// Registers `key` for the checker's nexus through portal `index` of its portals, in a
    /// session of its own, bounded; records the outcome. Runs on the host runtime.
    pub async fn change(&mut self, index: usize, key: u64) {
        let (portal, port) = self.portals[index].clone();
        self.changes += 1;
        let result = match login(&portal, &self.target).await {
            Ok(s) => {
                let r = register(&s, key, self.change_bound).await;
                let _ = tokio::time::timeout(BOUND, s.logout()).await;
                r
            }
            // Not logged in: nothing was sent.
            Err(_) => return,
        };
        let c = self.candidates.entry(port).or_default();
        match result {
            Ok(()) => *c = vec![key],
            // Failed or unanswered: it may or may not have been installed (0: the nexus may
            // still have no registration at all).
            Err(why) => {
                eprintln!("reservation change {key} through {portal}: not answered GOOD: {why}");
                self.unanswered += 1;
                if c.is_empty() {
                    c.push(0);
                }
                c.push(key);
            }
        }
    }

    /// Reads the registrations through every path; `Err` names the difference.
    pub async fn check(&mut self) -> Result<(), String> {
        let mut views = Vec::new();
        for (portal, _) in &self.portals {
            let s = login(portal, &self.target).await?;
            let keys = read_keys(&s).await.map_err(|e| format!("{portal}: {e}"))?;
            let _ = tokio::time::timeout(BOUND, s.logout()).await;
            views.push((portal, keys));
        }
        let (_, first) = &views[0];
        for (portal, view) in &views[1..] {
            let mut a = view.1.clone();
            let mut b = first.1.clone();
            a.sort_unstable();
            b.sort_unstable();
            if view.0 != first.0 || a != b {
                return Err(format!(
                    "reservation state differs by path: {} says {view:?}, {} says {first:?}",
                    views[0].0, portal
                ));
            }
        }
        let keys = &first.1;
        let mut registered = 0;
        for (port, c) in &mut self.candidates {
            let held: Vec<u64> = c
                .iter()
                .copied()
                .filter(|k| *k != 0 && keys.contains(k))
                .collect();
            match held.as_slice() {
                [k] => {
                    *c = vec![*k];
                    registered += 1;
                }
                [] if c.contains(&0) => *c = vec![0],
                [] => {
                    return Err(format!(
                        "port {port}: registration {c:?} lost (keys {keys:?})"
                    ))
                }
                _ => return Err(format!("port {port}: several of {c:?} in {keys:?}")),
            }
        }
        if keys.len() != registered {
            return Err(format!(
                "keys {keys:?}: {registered} expected from {:?}",
                self.candidates
            ));
        }
        Ok(())
    }
}
