//! Test support shared by the workspace's integration tests: a `lanes serve` child process read
//! through its banner (also inside a lab namespace), a tgtd child as the reference target, an
//! etcd child as the HA witness, TOML configuration snippets, and the root check of tests that
//! need namespaces or mounts.
//!
//! Only for tests: it panics with a message whenever something it sets up does not come up.

pub mod ceph;
pub mod config;
pub mod etcd;
pub mod ports;
pub mod serve;
pub mod tgt;

/// Fails (never skips) a test that needs root: namespaces, mounts, loop devices, tgtd.
pub fn require_root() {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    assert!(root, "this test needs root (run ./scripts/test.sh as root)");
}
