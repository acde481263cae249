//! `lanes bench smb://` and `lanes doctor smb://` through the binary against a `lanes serve`
//! child that shares a directory on 127.0.0.1 and 127.0.0.2 (one port).

mod served;

use std::path::Path;
use std::process::Command;

fn lanes() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A config sharing `share` on both loopback addresses, and user carol ("Password").
fn setup(dir: &Path, port: u16) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("share")).unwrap();
    let text = format!(
        "[server]\ndata-dir = \"data\"\n\n[[portal-group]]\ntag = 1\nportals = [\"127.0.0.1:0\"]\n\n\
         [[target]]\nname = \"iqn.2026-11.io.lanes.test:smbbench\"\nportal-groups = [1]\n[[target.lun]]\n\
         path = \"data/disk.img\"\nsize = \"16M\"\n\n[smb]\nlisten = [\"127.0.0.1:{port}\", \"127.0.0.2:{port}\"]\n\
         link-speed = 1000\nrss = true\n\n[[share]]\nname = \"files\"\npath = \"share\"\n"
    );
    let cfg = dir.join("lanes.toml");
    std::fs::write(&cfg, text).unwrap();
    std::fs::write(dir.join("pw"), "Password\n").unwrap();
    let out = lanes()
        .args(["smb", "user", "add", "carol", "--config"])
        .arg(&cfg)
        .arg("--password-file")
        .arg(dir.join("pw"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    cfg
}

#[test]
fn bench_and_doctor_over_two_channels() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = setup(dir.path(), port);
    let served = served::command()
        .args(["--config".as_ref(), cfg.as_os_str()])
        .start();
    let _ = &served;
    let url = format!("smb://carol@127.0.0.1:{port}/files");
    let json = dir.path().join("bench.json");
    let out = lanes()
        .args(["bench", &url, "--channels", "2"])
        .args(["--pattern", "1m-seqwrite,1m-seqread,4k-randread"])
        .args([
            "--threads",
            "1",
            "--depth",
            "4",
            "--duration",
            "300ms",
            "--size",
            "8M",
        ])
        .arg("--password-file")
        .arg(dir.path().join("pw"))
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("2 channels"), "{stdout}");
    for p in ["1m-seqwrite", "1m-seqread", "4k-randread"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(p))
            .unwrap_or_else(|| panic!("{p}: {stdout}"));
        assert!(
            line.contains("127.0.0.1=") && line.contains("127.0.0.2="),
            "{line}"
        );
    }
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(doc["kind"], "smb");
    assert_eq!(doc["channels"].as_array().unwrap().len(), 2);
    for r in doc["results"].as_array().unwrap() {
        assert!(r["mb_per_s"].as_f64().unwrap() > 0.0, "{r}");
        let per: u64 = r["channels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(per, r["bytes"].as_u64().unwrap());
    }

    let out = lanes()
        .args(["doctor", &url, "--password-file"])
        .arg(dir.path().join("pw"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("[OK  ] negotiate: SMB 3.1.1"), "{stdout}");
    assert!(stdout.contains("[OK  ] multichannel"), "{stdout}");
    assert!(
        stdout.contains("[OK  ] interface 127.0.0.1: 1 Gbit/s, RSS"),
        "{stdout}"
    );
    assert!(
        stdout.contains("[OK  ] interface 127.0.0.2: 1 Gbit/s, RSS"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Multichannel will be used: 2 channels bound"),
        "{stdout}"
    );

    let out = lanes()
        .args(["doctor", &url])
        .env("LANES_SMB_PASSWORD", "wrong")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("STATUS_LOGON_FAILURE"),
        "{out:?}"
    );
}

#[test]
fn smb_bench_errors_are_one_line() {
    let run = |args: &[&str]| {
        let out = lanes()
            .arg("bench")
            .args(args)
            .env("LANES_SMB_PASSWORD", "x")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let e = run(&["smb://127.0.0.1/share"]);
    assert!(e.contains("no USER@"), "{e}");
    let e = run(&["smb://u@127.0.0.1:1/share", "--pattern", "5k-x"]);
    assert!(e.contains("pattern '5k-x'"), "{e}");
    let e = run(&["smb://u@127.0.0.1:1/share", "--duration", "1s"]);
    assert!(e.contains("connect to 127.0.0.1:1"), "{e}");
    let out = lanes()
        .args(["bench", "smb://u@127.0.0.1:1/share"])
        .env_remove("LANES_SMB_PASSWORD")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--password-file"),
        "{out:?}"
    );
}
