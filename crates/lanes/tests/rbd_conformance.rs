//! libiscsi's whole conformance suite across two RBD gateways (`scripts/rbd-conformance.sh`):
//! a Ceph cluster of its own, one image, two `lanes serve` exporting it, `iscsi-test-cu
//! --dataloss` with one portal on each, and a floor (`tests/conformance/rbd-floor`) that fails
//! the test when fewer tests pass. A test rather than a step of `scripts/test.sh` so that it
//! runs beside the fault campaign: both spend most of their time waiting on Ceph. Root only.

use std::path::Path;
use std::process::Command;

#[test]
fn libiscsi_across_two_rbd_gateways_meets_the_floor() {
    lanes_test_support::require_root();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(repo.join("scripts/rbd-conformance.sh"))
        .env("LANES_BIN", env!("CARGO_BIN_EXE_lanes"))
        .env("LANES_RBD_OUT", out_dir.path())
        .output()
        .expect("scripts/rbd-conformance.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    if !out.status.success() {
        for log in ["iscsi-test-cu.log", "gw1.log", "gw2.log"] {
            let text = std::fs::read_to_string(out_dir.path().join(log)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- last lines of {log}:");
            for line in tail.into_iter().rev() {
                eprintln!("{line}");
            }
        }
    }
    assert!(
        out.status.success(),
        "scripts/rbd-conformance.sh failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("rbd conformance:"),
        "no conformance summary:\n{stdout}"
    );
}
