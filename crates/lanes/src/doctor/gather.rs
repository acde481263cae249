//! Talking to the target: SendTargets discovery on every given portal, then one login per
//! portal (and per LUN), one at a time, to read what each path reports. Sessions are logged out
//! before the next one starts, so a target that allows one session per initiator still shows
//! every path; the second-session check is separate and deliberate.

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use lanes_initiator::{discover, random_isid, ChapSecret, Error, LoginOptions, Session};

use super::facts::{login_failure, Failure, LunFacts, NegotiatedSummary, PathFacts, PathInfo};

/// How the doctor logs in.
#[derive(Debug, Clone)]
pub struct Settings {
    pub initiator_name: String,
    pub chap: Option<ChapSecret>,
    /// Limit for a connect + login and for each command.
    pub timeout: Duration,
    /// The LUN named in the URL; None: every disk LUN REPORT LUNS lists.
    pub lun: Option<u64>,
}

impl Settings {
    pub fn options(&self, lun: u64, chap: bool) -> LoginOptions {
        let mut options = LoginOptions::new(self.initiator_name.clone());
        options.isid = random_isid();
        options.lun = lun;
        if chap {
            options.chap = self.chap.clone();
        }
        options
    }
}

/// Runs `f` within the doctor's time limit.
pub async fn within<T>(
    limit: Duration,
    what: &'static str,
    f: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    tokio::time::timeout(limit, f)
        .await
        .unwrap_or(Err(Error::Timeout(what)))
}

/// Logs in within the time limit (connect, security and operational stages).
pub async fn login(
    portal: SocketAddr,
    target: &str,
    options: &LoginOptions,
    limit: Duration,
) -> Result<Session, Error> {
    within(
        limit,
        "a Login Response",
        Session::login(portal, target, options),
    )
    .await
}

/// SendTargets=All; with CHAP credentials, retried with them when the target wants
/// authentication for discovery (most do not, and offering CHAP to one that does not fails).
pub async fn discovery(
    portal: SocketAddr,
    s: &Settings,
) -> Result<Vec<(String, Vec<(SocketAddr, u16)>)>, Error> {
    let plain = within(
        s.timeout,
        "a Login Response",
        discover(portal, &s.options(0, false)),
    )
    .await;
    let wants_auth = |e: &Error| match e {
        Error::LoginRefused { class: 2, detail } => *detail == 1 || *detail == 2,
        Error::Protocol(m) => m.contains("requires authentication"),
        _ => false,
    };
    match plain {
        Err(e) if s.chap.is_some() && wants_auth(&e) => {
            within(
                s.timeout,
                "a Login Response",
                discover(portal, &s.options(0, true)),
            )
            .await
        }
        other => other,
    }
}

/// Logs in on one portal and reads everything the checks need from it.
pub async fn path_facts(portal: SocketAddr, tpgt: u16, target: &str, s: &Settings) -> PathFacts {
    let outcome = path_info(portal, target, s).await;
    let local = super::local::route_to(portal.ip()).await;
    PathFacts {
        portal,
        tpgt,
        outcome,
        local,
    }
}

async fn path_info(portal: SocketAddr, target: &str, s: &Settings) -> Result<PathInfo, Failure> {
    let chap = s.chap.is_some();
    let first_lun = s.lun.unwrap_or(0);
    let started = Instant::now();
    let session = login(portal, target, &s.options(first_lun, chap), s.timeout)
        .await
        .map_err(|e| login_failure(portal, &e, s.timeout))?;
    let login_ms = started.elapsed().as_secs_f64() * 1000.0;
    let negotiated = summarize(session.negotiated());
    let scsi = |e: Error| Failure {
        what: format!("logged in, but {e}"),
        fix: "see the target's log; the path cannot carry I/O as it is".to_string(),
    };
    let mut rtt_ms = Vec::new();
    for _ in 0..5 {
        let rtt = within(s.timeout, "a NOP-In", session.ping())
            .await
            .map_err(scsi)?;
        rtt_ms.push(rtt.as_secs_f64() * 1000.0);
    }
    // The first command after login may report a unit attention; TEST UNIT READY takes it.
    within(s.timeout, "TEST UNIT READY", session.test_unit_ready())
        .await
        .map_err(scsi)?;
    let candidates = match s.lun {
        Some(lun) => vec![lun],
        None => report_luns(&session, s.timeout).await.unwrap_or(vec![0]),
    };
    let mut luns = Vec::new();
    let mut alua = Err("no disk LUN to ask".to_string());
    for lun in candidates {
        let facts = if lun == first_lun {
            lun_facts(&session, lun, s).await
        } else {
            let other = login(portal, target, &s.options(lun, chap), s.timeout)
                .await
                .map_err(|e| login_failure(portal, &e, s.timeout))?;
            let facts = lun_facts(&other, lun, s).await;
            let _ = within(s.timeout, "a Logout Response", other.logout()).await;
            facts
        };
        match facts.map_err(scsi)? {
            Some((facts, groups)) => {
                if luns.is_empty() {
                    alua = groups;
                }
                luns.push(facts);
            }
            None if s.lun.is_some() => {
                return Err(Failure {
                    what: format!("LUN {lun} is not a disk (or not present)"),
                    fix: "name a disk LUN in the URL (iscsi://PORTAL/IQN/LUN)".to_string(),
                })
            }
            None => {}
        }
    }
    let _ = within(s.timeout, "a Logout Response", session.logout()).await;
    if luns.is_empty() {
        return Err(Failure {
            what: "the target has no disk LUN for this initiator".to_string(),
            fix: "map a LUN to the target (and allow this initiator in its access list)"
                .to_string(),
        });
    }
    Ok(PathInfo {
        login_ms,
        rtt_ms,
        negotiated,
        luns,
        alua,
    })
}

type LunAnswer = Option<(LunFacts, Result<Vec<(u16, u8)>, String>)>;

/// Identity, size and ALUA states of one LUN; None when it is not a disk (a controller LUN).
async fn lun_facts(session: &Session, lun: u64, s: &Settings) -> Result<LunAnswer, Error> {
    let t = s.timeout;
    let standard = within(t, "INQUIRY", session.inquiry(None)).await?;
    let Some(&byte0) = standard.first() else {
        return Ok(None);
    };
    // Peripheral qualifier 0 (connected) and device type 0 (direct access block device).
    if byte0 != 0 {
        return Ok(None);
    }
    let text = |range: std::ops::Range<usize>| {
        standard
            .get(range)
            .map(|b| String::from_utf8_lossy(b).trim().to_string())
            .unwrap_or_default()
    };
    let _ = within(t, "TEST UNIT READY", session.test_unit_ready()).await;
    let (blocks, block_size) = within(t, "READ CAPACITY", session.read_capacity16()).await?;
    let identity = within(t, "INQUIRY", session.device_identity()).await?;
    let groups = within(
        t,
        "REPORT TARGET PORT GROUPS",
        session.report_target_port_groups(),
    )
    .await
    .map(|g| g.iter().map(|p| (p.group, p.state)).collect())
    .map_err(|e| e.to_string());
    Ok(Some((
        LunFacts {
            lun,
            id: identity.lun,
            blocks,
            block_size,
            vendor: text(8..16),
            product: text(16..32),
            target_port_group: identity.target_port_group,
        },
        groups,
    )))
}

/// REPORT LUNS (SPC-4 6.33): the LUN numbers (peripheral and flat addressing), at most 64.
async fn report_luns(session: &Session, limit: Duration) -> Option<Vec<u64>> {
    let mut cdb = [0u8; 16];
    cdb[0] = 0xa0;
    cdb[6..10].copy_from_slice(&4096u32.to_be_bytes());
    for _ in 0..4 {
        let out = within(limit, "REPORT LUNS", session.execute(cdb, 4096, None))
            .await
            .ok()?;
        if out.status == 0 && out.response == 0 {
            return Some(parse_report_luns(&out.data));
        }
    }
    None
}

pub fn parse_report_luns(data: &Bytes) -> Vec<u64> {
    let len = data
        .get(0..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0) as usize;
    let body = data.get(8..).unwrap_or_default();
    let body = body.get(..len.min(body.len())).unwrap_or_default();
    body.chunks_exact(8)
        .filter_map(|entry| match entry {
            [b0, b1, ..] if b0 >> 6 == 0 => Some(u64::from(*b1)),
            [b0, b1, ..] if b0 >> 6 == 1 => Some((u64::from(b0 & 0x3f) << 8) | u64::from(*b1)),
            _ => None,
        })
        .take(64)
        .collect()
}

fn summarize(n: &lanes_initiator::Negotiated) -> NegotiatedSummary {
    let key = |k: &str| n.keys.get(k).cloned().unwrap_or_else(|| "None".to_string());
    NegotiatedSummary {
        target_max_recv_data_segment_length: n.max_send_data_segment_length,
        initiator_max_recv_data_segment_length: n.max_recv_data_segment_length,
        first_burst_length: n.first_burst_length,
        max_burst_length: n.max_burst_length,
        immediate_data: n.immediate_data,
        initial_r2t: n.initial_r2t,
        max_outstanding_r2t: n.max_outstanding_r2t,
        header_digest: key("HeaderDigest"),
        data_digest: key("DataDigest"),
    }
}

/// Whether a second session of the same initiator (another ISID) is accepted while the first
/// is logged in: multipath needs one session per path. Ok(()) or the login error.
pub async fn second_session(
    target: &str,
    first: SocketAddr,
    second: SocketAddr,
    s: &Settings,
) -> Result<(), (SocketAddr, Error)> {
    let chap = s.chap.is_some();
    let lun = s.lun.unwrap_or(0);
    let a = login(first, target, &s.options(lun, chap), s.timeout)
        .await
        .map_err(|e| (first, e))?;
    let b = login(second, target, &s.options(lun, chap), s.timeout).await;
    let _ = within(s.timeout, "a Logout Response", a.logout()).await;
    let b = b.map_err(|e| (second, e))?;
    let _ = within(s.timeout, "a Logout Response", b.logout()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_luns_reads_peripheral_and_flat_entries() {
        let mut d = vec![0, 0, 0, 24, 0, 0, 0, 0];
        d.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        d.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
        d.extend_from_slice(&[0x41, 0x02, 0, 0, 0, 0, 0, 0]);
        assert_eq!(parse_report_luns(&Bytes::from(d)), vec![0, 1, 0x102]);
        // A length beyond the data and a truncated entry do not panic.
        let d = vec![0, 0, 1, 0, 0, 0, 0, 0, 0, 3, 0];
        assert_eq!(parse_report_luns(&Bytes::from(d)), Vec::<u64>::new());
        assert!(parse_report_luns(&Bytes::new()).is_empty());
    }
}
