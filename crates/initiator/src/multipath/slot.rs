//! One path of a multipath device: its current session, the per-path atomic counters the
//! selector reads on every request, and a latency histogram the health task samples.

use mpath::{PathId, PathView};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;

use crate::Session;

/// Histogram buckets: four per power of two of microseconds, up to about 2^40 us.
pub(crate) const BUCKETS: usize = 160;

/// Bucket of a latency in microseconds.
pub(crate) fn bucket(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as usize;
    ((e - 1) * 4 + ((us >> (e - 2)) & 3) as usize).min(BUCKETS - 1)
}

/// Lower bound, in microseconds, of a bucket.
pub(crate) fn bucket_floor(index: usize) -> u64 {
    if index < 4 {
        return index as u64;
    }
    let e = index / 4 + 1;
    (1u64 << e) + (((index % 4) as u64) << (e - 2))
}

/// The quantile `q` (0..1) of a histogram, in microseconds.
pub(crate) fn quantile(hist: &[u64], q: f64) -> u64 {
    let total: u64 = hist.iter().sum();
    if total == 0 {
        return 0;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in hist.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return bucket_floor(i);
        }
    }
    0
}

/// Counters that only grow; the health task keeps the previous snapshot and takes deltas.
pub(crate) struct Stats {
    pub(crate) completed: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) hist: [AtomicU64; BUCKETS],
}

impl Stats {
    fn new() -> Stats {
        Stats {
            completed: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    pub(crate) fn record(&self, latency: Duration, bytes: u32) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(u64::from(bytes), Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        if let Some(b) = self.hist.get(bucket(us)) {
            b.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Rates of the last health tick, kept for `status`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Rates {
    pub(crate) iops: f64,
    pub(crate) bytes_per_sec: f64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
}

pub(crate) struct PathSlot {
    pub(crate) id: PathId,
    pub(crate) portal: SocketAddr,
    /// The portal group the portal was discovered in (session identity is per group).
    pub(crate) tpgt: u16,
    /// One ISID for the device's lifetime: every login of this path (and the fencing login of
    /// its failed session through another portal) uses it, so each reinstates the previous one.
    pub(crate) isid: [u8; 6],
    /// Local interface the path's connections leave through, if bound.
    pub(crate) interface: Option<String>,
    /// Connection ID of the path's logins (its index + 1; with MC/S all paths share the ISID).
    pub(crate) cid: u16,
    pub(crate) weight: u32,
    pub(crate) priority: u32,
    session: RwLock<Option<Arc<Session>>>,
    /// Incremented when a session is installed; commands remember the epoch they ran in.
    pub(crate) epoch: AtomicU64,
    /// Highest epoch whose session the target is known to have ended (fenced).
    pub(crate) fenced: watch::Sender<u64>,
    /// Serializes logins of this path's ISID (reconnects and fences).
    pub(crate) login_lock: tokio::sync::Mutex<()>,
    pub(crate) reconnecting: AtomicBool,
    pub(crate) eligible: AtomicBool,
    pub(crate) tier: AtomicU8,
    /// ALUA target port group of the path (from page 0x83), else the TPGT.
    pub(crate) port_group: AtomicU16,
    pub(crate) inflight_bytes: AtomicU64,
    pub(crate) inflight_cmds: AtomicU32,
    pub(crate) stats: Stats,
    /// When a command last completed on the path, in ns after `Inner::started` (0 = never).
    pub(crate) last_completion: AtomicU64,
    pub(crate) rates: std::sync::Mutex<Rates>,
}

impl PathSlot {
    pub(crate) fn new(
        id: PathId,
        portal: SocketAddr,
        tpgt: u16,
        isid: [u8; 6],
        (weight, priority): (u32, u32),
        interface: Option<String>,
    ) -> PathSlot {
        PathSlot {
            interface,
            id,
            portal,
            tpgt,
            isid,
            cid: u16::try_from(id.0 + 1).unwrap_or(u16::MAX),
            weight: weight.max(1),
            priority,
            session: RwLock::new(None),
            epoch: AtomicU64::new(0),
            fenced: watch::Sender::new(0),
            login_lock: tokio::sync::Mutex::new(()),
            reconnecting: AtomicBool::new(false),
            eligible: AtomicBool::new(false),
            tier: AtomicU8::new(0),
            port_group: AtomicU16::new(tpgt),
            inflight_bytes: AtomicU64::new(0),
            inflight_cmds: AtomicU32::new(0),
            stats: Stats::new(),
            last_completion: AtomicU64::new(0),
            rates: std::sync::Mutex::new(Rates::default()),
        }
    }

    /// `base` as this path logs in: its interface binding.
    pub(crate) fn options(&self, base: &crate::LoginOptions) -> crate::LoginOptions {
        crate::LoginOptions {
            bind_device: self.interface.clone(),
            ..base.clone()
        }
    }

    /// The current session and its epoch.
    pub(crate) fn current(&self) -> Option<(Arc<Session>, u64)> {
        let guard = self.session.read().unwrap_or_else(|e| e.into_inner());
        let s = guard.as_ref()?.clone();
        Some((s, self.epoch.load(Ordering::Acquire)))
    }

    /// Installs a freshly logged-in session; its epoch.
    pub(crate) fn install(&self, session: Session) -> u64 {
        let mut guard = self.session.write().unwrap_or_else(|e| e.into_inner());
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        *guard = Some(Arc::new(session));
        // Logging in with this path's ISID reinstated (ended) any earlier session of it.
        self.fenced.send_modify(|f| *f = (*f).max(epoch - 1));
        epoch
    }

    /// Takes the session of `epoch` away (None when it is already gone or newer).
    pub(crate) fn take(&self, epoch: u64) -> Option<Arc<Session>> {
        let mut guard = self.session.write().unwrap_or_else(|e| e.into_inner());
        if self.epoch.load(Ordering::Acquire) != epoch {
            return None;
        }
        guard.take()
    }

    pub(crate) fn view(&self) -> PathView {
        PathView {
            eligible: self.eligible.load(Ordering::Relaxed),
            tier: self.tier.load(Ordering::Relaxed),
            inflight_bytes: self.inflight_bytes.load(Ordering::Relaxed),
            inflight_cmds: self.inflight_cmds.load(Ordering::Relaxed),
            throughput: 0,
            weight: self.weight,
            priority: self.priority,
        }
    }

    pub(crate) fn begin(&self, bytes: u32) {
        self.inflight_bytes
            .fetch_add(u64::from(bytes), Ordering::Relaxed);
        // SeqCst pairs with the pause flag (`Inner::quiesce`): either the quiescing task sees
        // this command, or this command sees the pause.
        self.inflight_cmds.fetch_add(1, Ordering::SeqCst);
    }

    /// Returns true when this was the path's last command in flight.
    pub(crate) fn end(&self, bytes: u32) -> bool {
        self.inflight_bytes
            .fetch_sub(u64::from(bytes), Ordering::Relaxed);
        self.inflight_cmds.fetch_sub(1, Ordering::SeqCst) == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_close() {
        let mut last = 0;
        for us in [0u64, 1, 3, 4, 5, 7, 8, 100, 1000, 12345, 1 << 30] {
            let b = bucket(us);
            assert!(b >= last);
            last = b;
            let floor = bucket_floor(b);
            assert!(floor <= us, "{us}: floor {floor}");
            assert!(
                us < 4 || (us - floor) * 4 <= us,
                "{us}: floor {floor} too coarse"
            );
        }
        let mut hist = [0u64; BUCKETS];
        hist[bucket(100)] = 98;
        hist[bucket(5000)] = 2;
        assert_eq!(quantile(&hist, 0.5), bucket_floor(bucket(100)));
        assert_eq!(quantile(&hist, 0.99), bucket_floor(bucket(5000)));
    }
}
