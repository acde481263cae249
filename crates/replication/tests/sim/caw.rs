//! COMPARE AND WRITE in the simulation: what the hosts asked and were told, and the checks
//! on it.
//!
//! A CAW's verify data names, block by block, the version (write uid) its host expected; its
//! new data is tagged with its own uid like any write, so the oracle treats a CAW as a write
//! that may land (registered with `Oracle::submit`) and, once it miscompared, as one that must
//! never be found (`Oracle::nowrite`). On top of the oracle's checks:
//!
//! - no two CAWs replaced the same version of a block (one winner per round);
//! - a success makes its new version the *immediate* successor of the expected one: no write
//!   that must have come after the expected version (submitted after it was acknowledged) may
//!   come before a CAW of the chain that follows it (acknowledged before that CAW was
//!   submitted, or overwritten by it for good: the chain ends in the block's final version);
//! - a miscompare is allowed only if some other version could have been there: the expected
//!   one had not been acknowledged before the CAW began (or a power loss may have undone it),
//!   or some write other than it, not known to precede it, was submitted before the answer;
//! - rounds (both nodes CAW the same block from the same expected version at once): never two
//!   winners; exactly one when the expected version was certain and neither failed.

use std::collections::{BTreeMap, HashSet};

use super::oracle::{parse_block, Oracle, BLOCK};

/// How a CAW ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Written,
    Miscompare(u64),
    Failed,
}

#[derive(Debug, Clone)]
pub struct CawRec {
    pub lba: u64,
    /// The version its host expected in each block.
    pub expected: Vec<u64>,
    pub submit: u64,
    pub done: Option<(u64, End)>,
}

/// One round: the CAWs of both nodes and whether their expected version was certain.
#[derive(Debug, Clone, Default)]
pub struct Round {
    pub caws: Vec<u64>,
    pub certain: bool,
}

#[derive(Default)]
pub struct CawLog {
    pub recs: BTreeMap<u64, CawRec>,
    pub rounds: BTreeMap<u64, Round>,
}

/// Counts for the test's report.
#[derive(Debug, Default, Clone, Copy)]
pub struct CawStats {
    pub written: u64,
    pub miscompared: u64,
    pub failed: u64,
    pub rounds: u64,
    /// Rounds where no CAW failed, and those of them with exactly one winner.
    pub clean: u64,
    pub won_once: u64,
}

impl CawLog {
    pub fn submit(&mut self, uid: u64, lba: u64, expected: Vec<u64>, now: u64, round: Option<u64>) {
        self.recs.insert(
            uid,
            CawRec {
                lba,
                expected,
                submit: now,
                done: None,
            },
        );
        if let Some(r) = round {
            self.rounds.entry(r).or_default().caws.push(uid);
        }
    }

    pub fn done(&mut self, uid: u64, end: End, now: u64, oracle: &mut Oracle) {
        let Some(rec) = self.recs.get_mut(&uid) else {
            oracle.violation(format!("unknown CAW {uid} answered"));
            return;
        };
        if rec.done.is_some() {
            oracle.violation(format!("CAW {uid} answered twice"));
            return;
        }
        rec.done = Some((now, end));
        if let End::Miscompare(_) = end {
            oracle.nowrite.insert(uid);
        }
        oracle.answered(uid, end == End::Written, now);
    }

    /// Whether every CAW of round `r` has its answer, and the winner if exactly one won
    /// cleanly (no failure).
    pub fn round_over(&self, r: u64) -> (bool, Option<u64>) {
        let Some(round) = self.rounds.get(&r) else {
            return (true, None);
        };
        let ends: Vec<(u64, End)> = round
            .caws
            .iter()
            .filter_map(|u| self.recs[u].done.map(|d| (*u, d.1)))
            .collect();
        let over = ends.len() == round.caws.len();
        let clean = self.round_clean(r);
        let winners: Vec<u64> = ends
            .iter()
            .filter(|e| e.1 == End::Written)
            .map(|e| e.0)
            .collect();
        (over, (clean && winners.len() == 1).then(|| winners[0]))
    }

    fn round_clean(&self, r: u64) -> bool {
        self.rounds.get(&r).is_some_and(|round| {
            round.caws.iter().all(|u| {
                matches!(
                    self.recs[u].done,
                    Some((_, End::Written | End::Miscompare(_)))
                )
            })
        })
    }

    pub fn stats(&self) -> CawStats {
        let mut s = CawStats::default();
        for r in self.recs.values() {
            match r.done.map(|d| d.1) {
                Some(End::Written) => s.written += 1,
                Some(End::Miscompare(_)) => s.miscompared += 1,
                _ => s.failed += 1,
            }
        }
        for r in 0..self.rounds.len() as u64 {
            let (over, one) = self.round_over(r);
            if over {
                s.rounds += 1;
                s.clean += u64::from(self.round_clean(r));
                s.won_once += u64::from(one.is_some());
            }
        }
        s
    }

    /// Every check; `last` is each block's final version, `end` the time of the final check.
    pub fn check(&self, oracle: &mut Oracle, last: &[u64], end: u64) {
        let mut v = Vec::new();
        self.check_rounds(&mut v);
        for (b, &fin) in last.iter().enumerate() {
            self.check_block(oracle, b as u64, fin, end, &mut v);
        }
        for (&uid, rec) in &self.recs {
            if let Some((done, End::Miscompare(i))) = rec.done {
                self.check_miscompare(oracle, uid, rec, done, i, &mut v);
            }
        }
        for x in v {
            oracle.violation(x);
        }
    }

    fn check_rounds(&self, v: &mut Vec<String>) {
        for (r, round) in &self.rounds {
            let ends: Vec<Option<End>> = round
                .caws
                .iter()
                .map(|u| self.recs[u].done.map(|d| d.1))
                .collect();
            let won = ends.iter().filter(|e| **e == Some(End::Written)).count();
            if won > 1 {
                v.push(format!("round {r}: {won} CAWs won ({:?})", round.caws));
            }
            let answered = ends
                .iter()
                .all(|e| matches!(e, Some(End::Written | End::Miscompare(_))));
            if round.certain && answered && ends.len() == 2 && won == 0 {
                v.push(format!("round {r}: no CAW won ({:?})", round.caws));
            }
        }
    }

    fn check_block(&self, o: &Oracle, b: u64, fin: u64, end: u64, v: &mut Vec<String>) {
        // Successes on this block: expected version -> the CAW that replaced it.
        // Two may, only if a power loss may have undone the first before the second came.
        let mut succ: BTreeMap<u64, u64> = BTreeMap::new();
        let mut by_ack: Vec<(u64, u64)> = Vec::new();
        for (&uid, rec) in &self.recs {
            if let Some((t, End::Written)) = rec.done {
                by_ack.push((t, uid));
            }
        }
        by_ack.sort_unstable();
        for &(t, uid) in &by_ack {
            let rec = &self.recs[&uid];
            if b < rec.lba {
                continue;
            }
            let Some(&e) = rec.expected.get((b - rec.lba) as usize) else {
                continue;
            };
            if let Some(other) = succ.insert(e, uid) {
                if o.must_survive_uid(other, t) {
                    v.push(format!(
                        "block {b}: CAWs {other} and {uid} both replaced version {e}"
                    ));
                }
            }
        }
        if succ.is_empty() {
            return;
        }
        let committed: Vec<u64> = o.per_block[b as usize]
            .iter()
            .copied()
            .filter(|u| o.writes[u].done.is_some_and(|d| d.1))
            .collect();
        for (&e, &c) in &succ {
            let Some(acked_e) = o.acked_at(e) else {
                continue;
            };
            // The chain of CAWs that follows `e`, each the immediate successor of the last.
            let mut chain = HashSet::new();
            let (mut latest_submit, mut at, mut ends_final) = (0, c, false);
            while chain.insert(at) {
                latest_submit = latest_submit.max(self.recs[&at].submit);
                ends_final |= at == fin;
                match succ.get(&at) {
                    Some(&n) => at = n,
                    None => break,
                }
            }
            for &y in &committed {
                if y == e || chain.contains(&y) || o.writes[&y].submit <= acked_e {
                    continue;
                }
                let before_chain = o.must_survive_uid(y, latest_submit)
                    || (ends_final && o.must_survive_uid(y, end));
                if before_chain {
                    v.push(format!(
                        "block {b}: write {y} came after version {e} and before the CAW chain \
                         from {c} that replaced {e} without seeing it"
                    ));
                    return;
                }
            }
        }
    }

    fn check_miscompare(
        &self,
        o: &Oracle,
        uid: u64,
        rec: &CawRec,
        done: u64,
        i: u64,
        v: &mut Vec<String>,
    ) {
        let k = i / BLOCK as u64;
        let Some(&e) = rec.expected.get(k as usize) else {
            v.push(format!(
                "CAW {uid}: miscompare offset {i} outside its range"
            ));
            return;
        };
        let b = rec.lba + k;
        let certain = o.acked_at(e).is_some_and(|a| a < rec.submit) && o.must_survive_uid(e, done);
        if !certain {
            return;
        }
        let e_submit = if e == 0 { 0 } else { o.writes[&e].submit };
        let possible = o.per_block[b as usize].iter().any(|&y| {
            y != e
                && y != uid
                && !o.nowrite.contains(&y)
                && o.writes[&y].submit < done
                && o.acked_at(y).is_none_or(|a| a >= e_submit)
        });
        if !possible {
            v.push(format!(
                "CAW {uid}: miscompare at block {b} where version {e} was certainly current"
            ));
        }
    }
}

/// The versions (write uids) blocks `lba..lba + n` hold in `read`.
pub fn versions(read: impl Iterator<Item = [u8; BLOCK]>) -> Option<Vec<u64>> {
    read.map(|b| parse_block(&b).map(|(u, _)| u)).collect()
}

impl CawLog {
    /// Rounds without a failure and without exactly one winner, for debugging.
    pub fn odd_rounds(&self) -> Vec<String> {
        (0..self.rounds.len() as u64)
            .filter(|&r| self.round_clean(r) && self.round_over(r).1.is_none())
            .map(|r| {
                let round = &self.rounds[&r];
                let caws: Vec<String> = round
                    .caws
                    .iter()
                    .map(|u| format!("{u}: {:?}", self.recs[u]))
                    .collect();
                format!("round {r} certain {} {caws:?}", round.certain)
            })
            .collect()
    }
}
