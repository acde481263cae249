//! The multipath device over one multi-connection session (`--mcs`, RFC 7143 MC/S): every
//! path is a connection (CID = path index + 1) of one session with one ISID, sharing its CmdSN
//! window. What differs from one session per path is fencing and re-login:
//!
//! - A failed connection is fenced by a Logout "close the connection" for its CID sent on a
//!   surviving connection; the target answers once that connection and its tasks are gone.
//!   The CmdSNs its lost commands had taken are holes that stall the whole session's command
//!   order, so each one the target has not yet seen (>= ExpCmdSN) is filled with a NOP-Out
//!   before the commands are replayed as new ones.
//! - A failed connection comes back by joining the session again through any live
//!   connection; with none left, a new leading login with the same ISID reinstates (ends) the
//!   old session, which fences every path at once.

use std::sync::atomic::Ordering;
use std::time::Duration;
use tracing::{info, warn};

use super::health::PathLogin;
use super::Inner;
use crate::{LoginOptions, Session};
use iscsi_proto::serial;

/// Adds a connection with `cid` through `portal` to the session `lead` belongs to, and reads
/// what identifies the LUN there.
pub(crate) async fn login_connection(
    lead: &Session,
    portal: std::net::SocketAddr,
    target: &str,
    options: &LoginOptions,
    isid: [u8; 6],
    cid: u16,
    limit: Duration,
) -> Result<PathLogin, crate::Error> {
    let opts = LoginOptions {
        isid,
        ..options.clone()
    };
    let work = async {
        let session = lead.add_connection(portal, target, &opts, cid).await?;
        super::health::identify(session).await
    };
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| crate::Error::Timeout("a connection's login"))?
}

impl Inner {
    /// A live connection of the session other than path `except`.
    pub(crate) fn live_connection(&self, except: usize) -> Option<std::sync::Arc<Session>> {
        self.slots
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != except)
            .find_map(|(_, s)| s.current().map(|(session, _)| session))
    }

    /// Fences the lost connection of path `index` (epoch `epoch`) and fills the CmdSN holes
    /// its lost commands left.
    pub(crate) async fn fence_connection(&self, index: usize, epoch: u64, taken: Vec<u32>) {
        let Some(slot) = self.slots.get(index) else {
            return;
        };
        let _serial = slot.login_lock.lock().await;
        if *slot.fenced.borrow() >= epoch {
            return;
        }
        let Some(via) = self.live_connection(index) else {
            warn!(
                path = %slot.id, cid = slot.cid,
                "no live connection left to close the failed one through: its writes wait for a new login"
            );
            return;
        };
        let closed =
            tokio::time::timeout(Duration::from_secs(10), via.logout_connection(slot.cid)).await;
        match closed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // "No such connection": the target already dropped it, and with it its tasks.
                info!(path = %slot.id, cid = slot.cid, "closing the failed connection: {e}");
            }
            Err(_) => {
                warn!(path = %slot.id, cid = slot.cid, "the target did not confirm closing the failed connection");
                return;
            }
        }
        let exp = via.exp_cmd_sn();
        tracing::debug!(path = %slot.id, exp, ?taken, "CmdSNs the failed connection had taken");
        // Every hole at once: a NOP-Out is answered only when its CmdSN's turn comes, so
        // waiting for each in turn would deadlock behind a later hole.
        let mut holes: Vec<u32> = taken.into_iter().filter(|c| serial::le(exp, *c)).collect();
        holes.sort_by_key(|c| c.wrapping_sub(exp));
        let results = futures_util::future::join_all(holes.iter().map(|&cmd_sn| {
            let via = via.clone();
            async move { tokio::time::timeout(Duration::from_secs(10), via.plug(cmd_sn)).await }
        }))
        .await;
        let plugged = results.iter().filter(|r| matches!(r, Ok(Ok(())))).count();
        if plugged < holes.len() {
            warn!(path = %slot.id, ?holes, plugged, "could not fill every CmdSN hole");
        }
        slot.fenced.send_modify(|f| *f = (*f).max(epoch));
        self.fences.fetch_add(1, Ordering::Relaxed);
        info!(
            path = %slot.id, cid = slot.cid, plugged,
            "fenced: the target closed the failed connection; its commands are replayed"
        );
    }

    /// Logs path `index` in again: joins the live session, or starts a new one (reinstating
    /// the old, which fences every path).
    pub(crate) async fn reconnect_connection(
        &self,
        index: usize,
        limit: Duration,
    ) -> Result<PathLogin, crate::Error> {
        let Some(slot) = self.slots.get(index) else {
            return Err(crate::Error::InvalidRequest("no such path".into()));
        };
        match self.live_connection(index) {
            Some(lead) => {
                login_connection(
                    &lead,
                    slot.portal,
                    &self.config.target,
                    &slot.options(&self.config.login),
                    slot.isid,
                    slot.cid,
                    limit,
                )
                .await
            }
            None => {
                let login = super::health::login_path(
                    slot.portal,
                    &self.config.target,
                    &slot.options(&self.config.login),
                    slot.isid,
                    limit,
                )
                .await?;
                // A new leading login with the session's ISID ended the old session and all
                // its connections: every path's old epoch is fenced.
                for s in &self.slots {
                    let e = s.epoch.load(Ordering::Acquire);
                    s.fenced.send_modify(|f| *f = (*f).max(e));
                }
                Ok(login)
            }
        }
    }
}
