//! The fault campaign's COMPARE AND WRITE check: a third host races COMPARE AND WRITEs
//! through node 1 and node 2 at once on one block (VMware ATS-style: both expect the block's
//! current value, each writes its own new value). Per round at most one may land; a GOOD
//! answer means it did, a MISCOMPARE is only right if the other one landed, and the block then
//! holds the lander's value on every path.
//!
//! A COMPARE AND WRITE answered NOT READY (the path's node lost its peer while it was in
//! flight: the outcome is unknown to that node, and the host retries elsewhere) may or may not
//! have landed: the block read back says which, and it must agree with the other answer.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use lanes_initiator::{LoginOptions, Session};

use super::pr_probe::PORTALS;
use super::{BS, TARGET};

const RACER: &str = "iqn.2026-11.io.lanes:lab-caw-racer";
/// The block the racers share: past the load's slots.
pub const LBA: u64 = 4000;
const BOUND: Duration = Duration::from_secs(4);

/// What one COMPARE AND WRITE came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Written,
    Miscompare,
    /// CHECK CONDITION, NOT READY: not executed here, or its outcome unknown to this node.
    NotReady(String),
    /// Anything else, described.
    Other(String),
}

/// The racers' state across the campaign.
pub struct CawProbe {
    /// The value the block holds (a round counter tagged with the winner), 0 = never written.
    current: u64,
    pub rounds: u64,
    /// Rounds in which a racer was answered NOT READY (its outcome read back).
    pub unknown: u64,
    /// The LUN's logical block size (one block per COMPARE AND WRITE).
    block: usize,
}

impl Default for CawProbe {
    /// The pair's LUN: 4 KiB blocks.
    fn default() -> CawProbe {
        CawProbe::with_block_size(BS)
    }
}

fn value_block(v: u64, len: usize) -> Bytes {
    let mut b = vec![0u8; len];
    for chunk in b.chunks_exact_mut(8) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    Bytes::from(b)
}

async fn login(portal: &str, target: &str) -> Result<Session, String> {
    let addr: SocketAddr = portal.parse().unwrap();
    match tokio::time::timeout(
        BOUND,
        Session::login(addr, target, &LoginOptions::new(RACER)),
    )
    .await
    {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("login to {portal}: {e}")),
        Err(_) => Err(format!("login to {portal}: timed out")),
    }
}

async fn compare_and_write(s: &Session, block: usize, expect: u64, new: u64) -> Outcome {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&LBA.to_be_bytes());
    cdb[13] = 1;
    let mut data = Vec::with_capacity(2 * block);
    data.extend_from_slice(&value_block(expect, block));
    data.extend_from_slice(&value_block(new, block));
    for _ in 0..8 {
        let r = tokio::time::timeout(BOUND, s.execute(cdb, 0, Some(Bytes::from(data.clone()))));
        let o = match r.await {
            Ok(Ok(o)) => o,
            Ok(Err(e)) => return Outcome::Other(e.to_string()),
            Err(_) => return Outcome::Other("timed out".into()),
        };
        match (o.response, o.status, o.sense_triplet().map(|t| t.0)) {
            (0, 0, _) => return Outcome::Written,
            (0, 2, Some(6)) => continue, // unit attention: reported once, send again
            (0, 2, Some(0x0E)) => return Outcome::Miscompare,
            (0, 2, Some(2)) => return Outcome::NotReady(format!("{:?}", o.sense_triplet())),
            _ => {
                return Outcome::Other(format!(
                    "response {} status {} sense {:?}",
                    o.response,
                    o.status,
                    o.sense_triplet()
                ))
            }
        }
    }
    Outcome::Other("unit attentions without end".into())
}

/// The block's value through `s`. A path answering NOT READY (its node resyncing after a
/// peer loss) is asked again, as a host would, until BOUND has passed.
async fn read_value(s: &Session) -> Result<u64, String> {
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut attentions = 0;
    loop {
        match tokio::time::timeout_at(deadline, s.read(LBA, 1)).await {
            Ok(Ok(b)) => {
                let v = u64::from_le_bytes(b[..8].try_into().unwrap());
                if b.chunks_exact(8).any(|c| c != &b[..8]) {
                    return Err(format!("block {LBA} torn: {:?}...", &b[..24]));
                }
                return Ok(v);
            }
            Ok(Err(lanes_initiator::Error::Scsi {
                sense: Some((6, _, _)),
                ..
            })) if attentions < 8 => attentions += 1,
            Ok(Err(lanes_initiator::Error::Scsi {
                sense: Some((2, _, _)),
                ..
            })) => tokio::time::sleep(Duration::from_millis(20)).await,
            Ok(Err(e)) => return Err(format!("read: {e}")),
            Err(_) => return Err(format!("read: no data within {BOUND:?}")),
        }
    }
}

impl CawProbe {
    /// Racers on a LUN of `block`-byte logical blocks.
    pub fn with_block_size(block: usize) -> CawProbe {
        CawProbe {
            current: 0,
            rounds: 0,
            unknown: 0,
            block,
        }
    }

    /// `rounds` races through a portal of each node (both Paired); `Err` names a violation.
    pub async fn race(&mut self, seed: usize, rounds: u64) -> Result<(), String> {
        let (a, b) = (PORTALS[seed % 2].0, PORTALS[2 + (seed / 2) % 2].0);
        self.race_between(a, b, TARGET, rounds).await
    }

    /// `rounds` races through portals `a` and `b` (of two nodes or gateways) of `target`.
    pub async fn race_between(
        &mut self,
        a: &str,
        b: &str,
        target: &str,
        rounds: u64,
    ) -> Result<(), String> {
        let a = login(a, target).await?;
        let b = login(b, target).await?;
        let result = self.rounds_on(&a, &b, rounds).await;
        for s in [a, b] {
            let _ = tokio::time::timeout(BOUND, s.logout()).await;
        }
        result
    }

    async fn rounds_on(&mut self, a: &Session, b: &Session, rounds: u64) -> Result<(), String> {
        for _ in 0..rounds {
            self.rounds += 1;
            let r = self.rounds;
            let (va, vb) = (r << 1, (r << 1) | 1);
            let (oa, ob) = tokio::join!(
                compare_and_write(a, self.block, self.current, va),
                compare_and_write(b, self.block, self.current, vb)
            );
            let settled = match (&oa, &ob) {
                (Outcome::Written, Outcome::Miscompare) => Some(va),
                (Outcome::Miscompare, Outcome::Written) => Some(vb),
                (Outcome::Written, Outcome::Written) => {
                    return Err(format!(
                        "round {r}: COMPARE AND WRITE won through both portals alike"
                    ))
                }
                (
                    Outcome::NotReady(_),
                    Outcome::Written | Outcome::Miscompare | Outcome::NotReady(_),
                )
                | (Outcome::Written | Outcome::Miscompare, Outcome::NotReady(_)) => None,
                other => {
                    return Err(format!(
                        "round {r}: outcomes {other:?} (one winner expected)"
                    ))
                }
            };
            let mut seen = Vec::with_capacity(2);
            for s in [a, b] {
                seen.push(read_value(s).await?);
            }
            if seen[0] != seen[1] {
                return Err(format!(
                    "round {r}: the portals read {:#x} and {:#x} after {oa:?}, {ob:?}",
                    seen[0], seen[1]
                ));
            }
            let landed = seen[0];
            let won = match settled {
                Some(won) => won,
                None => {
                    self.unknown += 1;
                    // Who may hold the block, given each answer.
                    let fits = |o: &Outcome, mine: u64, theirs: u64| match o {
                        Outcome::Written => landed == mine,
                        Outcome::Miscompare => landed == theirs,
                        _ => true,
                    };
                    let possible = [self.current, va, vb].contains(&landed)
                        && fits(&oa, va, vb)
                        && fits(&ob, vb, va);
                    if !possible {
                        return Err(format!(
                            "round {r}: the block holds {landed:#x} after {oa:?}, {ob:?} \
                             (it held {:#x}; the racers wrote {va:#x} and {vb:#x})",
                            self.current
                        ));
                    }
                    landed
                }
            };
            if landed != won {
                return Err(format!(
                    "round {r}: the portals read {landed:#x}, the winner wrote {won:#x}"
                ));
            }
            self.current = won;
        }
        Ok(())
    }
}
