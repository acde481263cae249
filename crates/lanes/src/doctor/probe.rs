//! The throughput probe: sequential 256 KiB reads with a few commands outstanding per session,
//! for a fixed time, on one or several portals at once. One session per path is what a
//! multipath device uses, so that is what "a path alone" means here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lanes_initiator::{Error, Session};

use super::bottleneck::{
    aggregate_check, alone_checks, per_flow_check, together_check, ProbedPath, SHARED_RATIO,
};
use super::facts::PathFacts;
use super::gather::{login, within, Settings};
use super::report::Check;

/// Bytes per read.
const READ_BYTES: u64 = 256 << 10;
/// Commands outstanding per session: enough to fill a 1-10 Gbit/s link at LAN round trips.
const DEPTH: usize = 8;
/// Reads stay in the first 256 MiB of the LUN (or all of a smaller one), so a target serves
/// them from cache and the network is what is measured.
const REGION: u64 = 256 << 20;

/// One portal and how many sessions to open on it.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub portal: SocketAddr,
    pub sessions: usize,
}

/// Reads from every load at once for `duration`; MB/s (10^6 bytes) per load, in order.
pub async fn measure(
    target: &str,
    lun: u64,
    loads: &[Load],
    duration: Duration,
    s: &Settings,
) -> Result<Vec<f64>, (SocketAddr, Error)> {
    let mut sessions: Vec<(usize, Arc<Session>, u64)> = Vec::new();
    let chap = s.chap.is_some();
    for (k, load) in loads.iter().enumerate() {
        for _ in 0..load.sessions {
            let fail = |e| (load.portal, e);
            let session = login(load.portal, target, &s.options(lun, chap), s.timeout)
                .await
                .map_err(fail)?;
            within(s.timeout, "TEST UNIT READY", session.test_unit_ready())
                .await
                .map_err(fail)?;
            let (blocks, block_size) =
                within(s.timeout, "READ CAPACITY", session.read_capacity16())
                    .await
                    .map_err(fail)?;
            let bytes = blocks.saturating_mul(u64::from(block_size));
            let region = bytes.min(REGION) / READ_BYTES * READ_BYTES;
            if region == 0 {
                return Err(fail(Error::InvalidRequest(format!(
                    "LUN {lun} is smaller than one {READ_BYTES}-byte read"
                ))));
            }
            sessions.push((k, Arc::new(session), region));
        }
    }
    let counters: Vec<Arc<AtomicU64>> = loads.iter().map(|_| Arc::default()).collect();
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for (n, (k, session, region)) in sessions.iter().enumerate() {
        let region = *region;
        let block_size = u64::from(session.block_size());
        let blocks = (READ_BYTES / block_size) as u32;
        for d in 0..DEPTH {
            let session = session.clone();
            let counter = counters[*k].clone();
            // Each task streams through its own part of the region.
            let mut offset = ((n * DEPTH + d) as u64 * READ_BYTES * 16) % region;
            tasks.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    session.read(offset / block_size, blocks).await?;
                    counter.fetch_add(READ_BYTES, Ordering::Relaxed);
                    offset = (offset + READ_BYTES) % region;
                }
                Ok::<(), Error>(())
            }));
        }
    }
    let mut failed = None;
    for (i, task) in tasks.into_iter().enumerate() {
        let portal = sessions
            .get(i / DEPTH)
            .map(|(_, s, _)| s.portal())
            .unwrap_or(loads[0].portal);
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failed = failed.or(Some((portal, e))),
            Err(e) => failed = failed.or(Some((portal, Error::Protocol(e.to_string())))),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    for (_, session, _) in sessions {
        if let Ok(session) = Arc::try_unwrap(session) {
            let _ = within(s.timeout, "a Logout Response", session.logout()).await;
        }
    }
    if let Some(f) = failed {
        return Err(f);
    }
    Ok(counters
        .iter()
        .map(|c| c.load(Ordering::Relaxed) as f64 / elapsed / 1e6)
        .collect())
}

/// Sessions opened on one portal to see whether several flows beat one.
const FLOWS: usize = 8;

/// The probe for one target's good paths: each alone, all together (and pairs when more than
/// two share something), and several sessions on a portal behind an aggregate or when there is
/// only one portal. Returns the checks; a failed measurement is one FAIL line.
pub async fn probe_target(
    target: &str,
    lun: u64,
    paths: &[&PathFacts],
    duration: Duration,
    s: &Settings,
) -> Vec<Check> {
    match probe_inner(target, lun, paths, duration, s).await {
        Ok(checks) => checks,
        Err((portal, e)) => vec![Check::fail(
            "throughput probe",
            format!("reading from {portal} failed: {e}."),
            "see the target's log; rerun with --quick to skip the probe",
        )],
    }
}

async fn probe_inner(
    target: &str,
    lun: u64,
    paths: &[&PathFacts],
    duration: Duration,
    s: &Settings,
) -> Result<Vec<Check>, (SocketAddr, Error)> {
    let one = |portal| Load {
        portal,
        sessions: 1,
    };
    let mut probed = Vec::new();
    for p in paths {
        let rates = measure(target, lun, &[one(p.portal)], duration, s).await?;
        probed.push(ProbedPath {
            portal: p.portal.to_string(),
            address: p.portal.ip().to_string(),
            alone_mb_s: rates.first().copied().unwrap_or(0.0),
            device: p.local.as_ref().map(|l| l.device.clone()),
            aggregate: p
                .local
                .as_ref()
                .and_then(|l| l.aggregate.as_ref())
                .map(|a| a.kind.clone()),
        });
    }
    let mut checks = alone_checks(&probed);
    if paths.len() > 1 {
        let loads: Vec<Load> = paths.iter().map(|p| one(p.portal)).collect();
        let together: f64 = measure(target, lun, &loads, duration, s)
            .await?
            .iter()
            .sum();
        let sum: f64 = probed.iter().map(|p| p.alone_mb_s).sum();
        let mut pairs = Vec::new();
        // Which paths share it: only worth measuring when there is a loss and more than one
        // pair (with two paths the pair is the whole set). At most 4 paths: 6 pairs.
        if together < SHARED_RATIO * sum && (3..=4).contains(&paths.len()) {
            for i in 0..paths.len() {
                for j in i + 1..paths.len() {
                    let loads = [one(paths[i].portal), one(paths[j].portal)];
                    let rate: f64 = measure(target, lun, &loads, duration, s)
                        .await?
                        .iter()
                        .sum();
                    pairs.push((i, j, rate));
                }
            }
        }
        checks.push(together_check(&probed, together, &pairs));
    }
    for (p, probe) in paths.iter().zip(&probed) {
        let aggregate = p.local.as_ref().and_then(|l| l.aggregate.as_ref());
        if aggregate.is_none() && paths.len() > 1 {
            continue;
        }
        let load = Load {
            portal: p.portal,
            sessions: FLOWS,
        };
        let many: f64 = measure(target, lun, &[load], duration, s)
            .await?
            .iter()
            .sum();
        let portal = p.portal.to_string();
        checks.push(match aggregate {
            Some(a) => aggregate_check(
                &portal,
                &a.kind,
                a.members.len(),
                Some((probe.alone_mb_s, FLOWS, many)),
            ),
            None => per_flow_check(&portal, probe.alone_mb_s, FLOWS, many),
        });
    }
    Ok(checks)
}
