//! Per-connection counters, read by `lanes status` and `/metrics` without stopping I/O.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one connection; relaxed atomics, written only by that connection's tasks.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    pub commands: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub pdus_in: AtomicU64,
    pub pdus_out: AtomicU64,
    /// Socket writes that sent them (each carries every PDU queued at the time).
    pub writes_out: AtomicU64,
    pub header_digest: std::sync::atomic::AtomicBool,
    pub data_digest: std::sync::atomic::AtomicBool,
}

impl ConnectionStats {
    pub fn add_in(&self, bytes: usize) {
        self.pdus_in.fetch_add(1, Ordering::Relaxed);
        self.bytes_in.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn add_out(&self, pdus: usize, bytes: usize) {
        self.pdus_out.fetch_add(pdus as u64, Ordering::Relaxed);
        self.writes_out.fetch_add(1, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            commands: self.commands.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            pdus_in: self.pdus_in.load(Ordering::Relaxed),
            pdus_out: self.pdus_out.load(Ordering::Relaxed),
            writes_out: self.writes_out.load(Ordering::Relaxed),
        }
    }
}

/// A consistent-enough copy of the counters for reporting.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StatsSnapshot {
    pub commands: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub pdus_in: u64,
    pub pdus_out: u64,
    pub writes_out: u64,
}
