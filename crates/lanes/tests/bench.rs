//! `lanes bench` against a `lanes serve` child process on loopback and against a temp file: read
//! and write patterns with `--verify`, `--json` and `--chart`; `lanes bench chart` drawing a PNG
//! from JSON; one clear error line for bad input.

use std::path::Path;
use std::process::{Command, Output};

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
        assert!(r["cpu_percent"].as_f64().is_some(), "{r}");
        assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["mb_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["lat_p99_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["lat_p50_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
    }
    assert!(results[0]["writes"].as_u64().unwrap_or(0) > 0);
    assert!(results[1]["reads"].as_u64().unwrap_or(0) > 0);
    assert!(results[1]["writes"].as_u64().unwrap_or(0) > 0);
    assert!(results[2]["reads"].as_u64().unwrap_or(0) > 0);
    assert_eq!(doc["kind"], "iscsi", "{doc}");
    let cpu: f64 = results
        .iter()
        .map(|r| r["cpu_user_s"].as_f64().unwrap_or(0.0) + r["cpu_sys_s"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(cpu > 0.0, "no CPU time measured: {doc}");
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
    let e = one_error_line(&["/dev/lanes-no-such-device", "--pattern", "4k-randread"]);
    assert!(e.contains("does not exist"), "{e}");
    let e = one_error_line(&[
        "iscsi://127.0.0.1:1/iqn.a:b/0",
        "--pattern",
        "4k-randread",
        "--threads",
        "0",
    ]);
    assert!(e.contains("--threads"), "{e}");
    let e = one_error_line(&[
        "iscsi://127.0.0.1:1/iqn.a:b/0",
        "--pattern",
        "4k-randread",
        "--size",
        "12Q",
    ]);
    assert!(e.contains("bad --size"), "{e}");
    let e = one_error_line(&[
        "iscsi://127.0.0.1:1/iqn.a:b/0",
        "--pattern",
        "4k-randread",
        "--duration",
        "soon",
    ]);
    assert!(e.contains("bad --duration"), "{e}");
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

fn lanes(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
        .args(args)
        .output()
        .expect("run lanes")
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).expect("json file")).expect("valid JSON")
}

#[test]
fn bench_file_target_creates_verifies_and_reuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("disk.img");
    let file_s = file.to_str().expect("utf-8 path");
    let json = dir.path().join("file.json");
    let chart = dir.path().join("file.png");
    let out = lanes(&[
        "bench",
        file_s,
        "--size",
        "8M",
        "--pattern",
        "4k-randread,8k-randrw-67,64k-seqwrite,1m-seqread-qd1",
        "--threads",
        "2",
        "--depth",
        "2",
        "--duration",
        "500ms",
        "--verify",
        "--json",
        json.to_str().expect("utf-8"),
        "--chart",
        chart.to_str().expect("utf-8"),
        "--label",
        "temp file",
    ]);
    let stdout = ok(&out);
    assert!(
        stdout.contains("CPU") && stdout.contains("1m-seqread-qd1"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("created"), "{stderr}");
    // A new path is created with --size bytes and written once.
    assert_eq!(std::fs::metadata(&file).expect("created").len(), 8 << 20);
    let doc = read_json(&json);
    assert_eq!(doc["kind"], "file", "{doc}");
    assert_eq!(doc["label"], "temp file", "{doc}");
    assert_eq!(doc["region_bytes"], 8 << 20, "{doc}");
    let results = doc["results"].as_array().expect("results");
    assert_eq!(results.len(), 4, "{doc}");
    for r in results {
        assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert!(r["lat_p99_us"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
    }
    assert!(results[0]["reads"].as_u64().unwrap_or(0) > 0 && results[0]["writes"] == 0);
    assert!(results[1]["reads"].as_u64().unwrap_or(0) > 0);
    assert!(results[1]["writes"].as_u64().unwrap_or(0) > 0);
    assert!(results[2]["writes"].as_u64().unwrap_or(0) > 0 && results[2]["reads"] == 0);
    assert_eq!(
        (results[3]["threads"].as_u64(), results[3]["depth"].as_u64()),
        (Some(1), Some(1))
    );
    let cpu: f64 = results
        .iter()
        .map(|r| r["cpu_percent"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(cpu > 0.0, "no CPU use measured: {doc}");
    assert_png(&chart, 1280, 720, 1);
    // The file exists now: used as it is, whole, without --size.
    let out = lanes(&[
        "bench",
        file_s,
        "--pattern",
        "64k-seqread",
        "--threads",
        "1",
        "--depth",
        "2",
        "--duration",
        "300ms",
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    ok(&out);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("created"));
    let doc = read_json(&json);
    assert_eq!(doc["region_bytes"], 8 << 20, "{doc}");
    assert!(
        doc["results"][0]["reads"].as_u64().unwrap_or(0) > 0,
        "{doc}"
    );
}

#[test]
fn bench_file_target_errors_are_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().to_str().expect("utf-8");
    let missing = format!("{d}/missing.img");
    let e = one_error_line(&[&missing, "--pattern", "4k-randread"]);
    assert!(e.contains("does not exist") && e.contains("--size"), "{e}");
    assert!(!Path::new(&missing).exists());
    let e = one_error_line(&[
        &format!("{d}/no/such/dir.img"),
        "--size",
        "1M",
        "--pattern",
        "4k-randread",
    ]);
    assert!(e.contains("creating") && e.contains("No such file"), "{e}");
    let e = one_error_line(&[d, "--pattern", "4k-randread"]);
    assert!(e.contains("is a directory"), "{e}");
    let small = dir.path().join("small.img");
    std::fs::write(&small, vec![0u8; 1 << 20]).expect("write");
    let small = small.to_str().expect("utf-8");
    let e = one_error_line(&[small, "--size", "2M", "--pattern", "4k-randread"]);
    assert!(e.contains("larger than"), "{e}");
    let e = one_error_line(&["/dev/null", "--pattern", "4k-randread"]);
    assert!(
        e.contains("neither a regular file nor a block device"),
        "{e}"
    );
    let e = one_error_line(&[small, "--pattern", "1m-seqread-qd1", "--size", "512K"]);
    assert!(e.contains("too small"), "{e}");
}

/// Checks the PNG signature and IHDR size, and that `series` bar colours (the chart's palette,
/// in order) were drawn.
fn assert_png(path: &Path, width: u32, height: u32, series: usize) {
    let bytes = std::fs::read(path).expect("chart file");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
    let h = u32::from_be_bytes(bytes[20..24].try_into().expect("4 bytes"));
    assert_eq!((w, h), (width, height));
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks_exact(3).collect();
    let palette: [[u8; 3]; 3] = [[31, 119, 180], [255, 127, 14], [44, 160, 44]];
    for (i, c) in palette.iter().enumerate() {
        let n = pixels.iter().filter(|p| *p == c).count();
        if i < series {
            assert!(n > 200, "series {i}: only {n} pixels of its colour");
        } else {
            assert_eq!(
                n, 0,
                "colour of series {i} drawn, but there are {series} series"
            );
        }
    }
    let dark = pixels.iter().filter(|p| p.iter().all(|v| *v < 80)).count();
    assert!(dark > 500, "no text or axes drawn ({dark} dark pixels)");
}

#[test]
fn bench_chart_draws_one_series_per_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut inputs = Vec::new();
    for (i, label) in ["lanes 1 path", "tgt 1 path"].iter().enumerate() {
        let doc = serde_json::json!({
            "label": label,
            "results": [
                {"pattern": "64k-seqread", "mb_per_s": 119.4 - i as f64, "iops": 1822.0},
                {"pattern": "1m-seqread-qd1", "mb_per_s": 119.6 - i as f64, "iops": 114.0},
                {"pattern": "4k-randread", "mb_per_s": 60.0 + 20.0 * i as f64, "iops": 14600.0},
            ],
        });
        let p = dir.path().join(format!("in{i}.json"));
        std::fs::write(&p, doc.to_string()).expect("write json");
        inputs.push(p.to_str().expect("utf-8").to_string());
    }
    let out_png = dir.path().join("chart.png");
    let out_s = out_png.to_str().expect("utf-8");
    ok(&lanes(&["bench", "chart", out_s, &inputs[0], &inputs[1]]));
    assert_png(&out_png, 1280, 720, 2);
    ok(&lanes(&[
        "bench", "chart", out_s, &inputs[1], "--metric", "iops", "--width", "800", "--height",
        "500", "--title", "IOPS",
    ]));
    assert_png(&out_png, 800, 500, 1);
    // Bad inputs: one line each, naming the file.
    let e = one_error_line(&[
        "chart",
        out_s,
        &format!("{}/nope.json", dir.path().display()),
    ]);
    assert!(e.contains("nope.json"), "{e}");
    let not_bench = dir.path().join("other.json");
    std::fs::write(&not_bench, "{\"x\": 1}").expect("write");
    let e = one_error_line(&["chart", out_s, not_bench.to_str().expect("utf-8")]);
    assert!(e.contains("other.json") && e.contains("results"), "{e}");
    let e = one_error_line(&["chart", out_s, &inputs[0], "--width", "10"]);
    assert!(e.contains("width"), "{e}");
    let e = one_error_line(&[
        "chart",
        &format!("{}/no/dir/x.png", dir.path().display()),
        &inputs[0],
    ]);
    assert!(e.contains("x.png"), "{e}");
}

/// A loop device over a temp file, detached on drop.
struct LoopDevice(String);

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

#[test]
fn bench_block_device_with_verify() {
    let me = Command::new("id").arg("-u").output().expect("id -u");
    assert_eq!(
        String::from_utf8_lossy(&me.stdout).trim(),
        "0",
        "this test attaches a loop device and needs root"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("backing.img");
    std::fs::write(&file, vec![0u8; 16 << 20]).expect("backing file");
    let out = Command::new("losetup")
        .args(["--find", "--show", "--sector-size", "4096"])
        .arg(&file)
        .output()
        .expect("losetup (Debian package mount) is needed for this test");
    assert!(
        out.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dev = LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_string());
    let json = dir.path().join("dev.json");
    let out = lanes(&[
        "bench",
        &dev.0,
        "--pattern",
        "4k-randwrite,8k-randrw-67,64k-seqread",
        "--threads",
        "2",
        "--depth",
        "2",
        "--duration",
        "400ms",
        "--verify",
        "--json",
        json.to_str().expect("utf-8"),
    ]);
    ok(&out);
    let doc = read_json(&json);
    assert_eq!(doc["kind"], "device", "{doc}");
    assert_eq!(doc["direct"], true, "{doc}");
    assert_eq!(
        doc["block_size"], 4096,
        "the loop device's logical block size: {doc}"
    );
    assert_eq!(doc["region_bytes"], 16 << 20, "{doc}");
    for r in doc["results"].as_array().expect("results") {
        assert!(r["iops"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
        assert_eq!(r["verify_errors"], 0, "{r}");
    }
    // Beyond the device's end: one line.
    let e = one_error_line(&[&dev.0, "--size", "32M", "--pattern", "4k-randread"]);
    assert!(e.contains("larger than"), "{e}");
}
