//! Interop with real NBD clients: QEMU's NBD driver (qemu-img) and libnbd inside fio.

mod support;

use std::process::Command;

use lanes_export::MemoryDevice;
use support::{pattern, require_tool, run, On, Served};

const MIB: u64 = 1 << 20;

fn qemu_img_roundtrip(on: On) {
    require_tool("qemu-img", "qemu-utils");
    let served = Served::new(MemoryDevice::new(64 * MIB, 512).unwrap(), on);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src.img");
    let back = work.path().join("back.img");
    let data = pattern(16 * MIB as usize, 0x5eed);
    std::fs::write(&src, &data).unwrap();

    let info = run(Command::new("qemu-img").args(["info", "--output=json", &served.uri()]));
    assert!(
        info.contains(&format!("\"virtual-size\": {}", 64 * MIB)),
        "qemu-img info shows the export size:\n{info}"
    );

    // -n: the target exists (an NBD export cannot be created).
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(served.uri()));
    assert_eq!(
        &served.dev.read_bytes(0, data.len()).unwrap()[..],
        &data[..],
        "the device holds the file"
    );
    // The rest of the export is still zeroes (and was never allocated).
    assert!(served
        .dev
        .read_bytes(16 * MIB, (48 * MIB) as usize)
        .unwrap()
        .iter()
        .all(|&b| b == 0));

    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(served.uri())
        .arg(&back));
    let copied = std::fs::read(&back).unwrap();
    assert_eq!(copied.len() as u64, 64 * MIB);
    assert!(copied[..data.len()] == data[..], "read back byte-identical");
    assert!(copied[data.len()..].iter().all(|&b| b == 0));
    assert!(
        served.dev.stats().flushes > 0,
        "qemu-img flushed the export"
    );
}

#[test]
fn qemu_img_convert_in_and_out_over_unix_socket() {
    qemu_img_roundtrip(On::Unix);
}

#[test]
fn qemu_img_convert_in_and_out_over_loopback_tcp() {
    qemu_img_roundtrip(On::Tcp);
}

/// Runs fio with the nbd engine and returns its JSON report.
fn fio(served: &Served, args: &[&str]) -> serde_json::Value {
    require_tool("fio", "fio");
    // In the server's temp dir: fio leaves verify state files in its working directory.
    let out = run(Command::new("fio")
        .current_dir(served.dir.path())
        .args(["--ioengine=nbd", "--output-format=json"])
        .arg(format!("--uri={}", served.uri()))
        .args(args));
    // fio may print notes before the JSON document.
    let start = out.find('{').expect("fio printed JSON");
    serde_json::from_str(&out[start..]).expect("fio JSON parses")
}

fn job_errors(report: &serde_json::Value) -> Vec<i64> {
    report["jobs"]
        .as_array()
        .expect("fio jobs")
        .iter()
        .map(|job| job["error"].as_i64().unwrap_or(-1))
        .collect()
}

#[test]
fn fio_verify_4k_and_64k_at_iodepth_16() {
    let served = Served::new(MemoryDevice::new(64 * MIB, 512).unwrap(), On::Unix);
    for bs in ["4k", "64k"] {
        let report = fio(
            &served,
            &[
                "--name=verify",
                "--rw=randwrite",
                &format!("--bs={bs}"),
                "--iodepth=16",
                "--size=32m",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
            ],
        );
        assert_eq!(job_errors(&report), vec![0], "fio verify with bs={bs}");
        let written = report["jobs"][0]["write"]["io_bytes"].as_u64().unwrap_or(0);
        let verified = report["jobs"][0]["read"]["io_bytes"].as_u64().unwrap_or(0);
        assert_eq!(written, 32 * MIB, "bs={bs}: wrote the whole range");
        assert_eq!(
            verified,
            32 * MIB,
            "bs={bs}: read everything back to verify"
        );
    }
}

/// Not a benchmark: a smoke figure that the pipelined path performs sanely, printed for the
/// record (`--nocapture`). Asserts only that the jobs ran clean and moved data.
#[test]
fn fio_throughput_smoke_figures() {
    let served = Served::new(MemoryDevice::new(256 * MIB, 512).unwrap(), On::Unix);
    // Fill the device so reads return real data, not holes.
    fio(
        &served,
        &[
            "--name=fill",
            "--rw=write",
            "--bs=1m",
            "--iodepth=8",
            "--size=256m",
        ],
    );
    for (name, rw, bs, depth) in [
        ("randread-4k-qd32", "randread", "4k", "32"),
        ("seqread-64k-qd16", "read", "64k", "16"),
    ] {
        let report = fio(
            &served,
            &[
                &format!("--name={name}"),
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                &format!("--iodepth={depth}"),
                "--size=256m",
                "--time_based",
                "--runtime=3",
            ],
        );
        assert_eq!(job_errors(&report), vec![0], "{name}");
        let read = &report["jobs"][0]["read"];
        let iops = read["iops"].as_f64().unwrap_or(0.0);
        let mib_s = read["bw_bytes"].as_f64().unwrap_or(0.0) / MIB as f64;
        println!(
            "fio {name} over NBD (unix socket, MemoryDevice): {iops:.0} IOPS, {mib_s:.0} MiB/s"
        );
        assert!(iops > 0.0, "{name} moved data");
    }
}
