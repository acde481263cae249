//! `lanes bench` against a `lanes serve` child process on loopback: a read and a write pattern
//! with `--verify` and `--json`, and one clear error line for bad input.

use std::process::Command;

mod served;

use served::serve;

#[test]
fn bench_reads_and_writes_with_verify() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = serve(dir.path());
    let json = dir.path().join("bench.json");
    let url = format!("iscsi://{}/{}/0", s.portal, s.target);
    let out = Command::new(env!("CARGO_BIN_EXE_lanes"))
        .args([
            "bench",
            &url,
            "--pattern",
            "4k-randwrite,8k-randrw-67,64k-seqread",
        ])
        .args([
            "--threads",
            "2",
            "--depth",
            "4",
            "--duration",
            "700ms",
            "--size",
            "16M",
        ])
        .arg("--verify")
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run lanes bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("4k-randwrite") && stdout.contains("IOPS"),
        "{stdout}"
    );
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("json file")).expect("valid JSON");
    let results = doc["results"].as_array().expect("results");
    assert_eq!(results.len(), 3, "{doc}");
    for r in results {
        assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["mb_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["lat_p99_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
    }
    assert!(results[0]["writes"].as_u64().unwrap_or(0) > 0);
    assert!(results[1]["reads"].as_u64().unwrap_or(0) > 0);
    assert!(results[1]["writes"].as_u64().unwrap_or(0) > 0);
    assert!(results[2]["reads"].as_u64().unwrap_or(0) > 0);
}

fn one_error_line(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lanes"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run lanes bench");
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    stderr
}

#[test]
fn bench_errors_are_one_line() {
    let e = one_error_line(&["iscsi://127.0.0.1", "--pattern", "4k-randread"]);
    assert!(e.contains("missing target name"), "{e}");
    let e = one_error_line(&["http://x/iqn.a:b/0", "--pattern", "4k-randread"]);
    assert!(e.contains("not an iSCSI URL"), "{e}");
    let e = one_error_line(&["/dev/sdb", "--pattern", "4k-randread"]);
    assert!(e.contains("not supported yet"), "{e}");
    let e = one_error_line(&["iscsi://127.0.0.1:1/iqn.a:b/0", "--pattern", "4k-randread"]);
    assert!(e.contains("127.0.0.1:1"), "{e}");
    let e = one_error_line(&["iscsi://127.0.0.1:1/iqn.a:b/0", "--pattern", "5k-x"]);
    assert!(e.contains("unknown pattern"), "{e}");
}

#[test]
fn bench_refused_login_is_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = serve(dir.path());
    let url = format!("iscsi://{}/iqn.2026-01.test.lanes:missing/0", s.portal);
    let e = one_error_line(&[&url, "--pattern", "4k-randread", "--duration", "1s"]);
    assert!(e.contains("target not found"), "{e}");
}
