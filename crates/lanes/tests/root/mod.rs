//! The lab tests' precondition: they build network namespaces, so they need root. Missing root
//! is a failure with a message, not a silent skip.

pub fn require_root() {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    assert!(root, "lab tests need root (run ./scripts/test.sh as root)");
}
