//! Command-line contract of `lanes serve`: help text, `--lun` errors, and config errors that
//! name file, line and key without touching any backing file.

use std::process::Command;

fn lanes() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
}

#[test]
fn serve_help_documents_the_flags() {
    let output = lanes().args(["serve", "--help"]).output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "--config <FILE>",
        "--portal <ADDR:PORT>",
        "--lun <SPEC>",
        "--target-name <IQN>",
        "--metrics <ADDR:PORT>",
        "--data-dir <DIR>",
        "--log-format <LOG_FORMAT>",
        "--allow-multiple-sessions <BOOL>",
    ] {
        assert!(help.contains(flag), "help lacks {flag}:\n{help}");
    }
}

#[test]
fn bad_lun_specs_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    for (spec, says) in [
        ("disk.img,size=12Q", "unknown size suffix"),
        ("disk.img,block-size=1000", "block-size must be 512 or 4096"),
        ("disk.img,colour=red", "unknown option"),
        ("size=1G", "the path comes first"),
    ] {
        let output = lanes()
            .current_dir(dir.path())
            .args(["serve", "--lun", spec])
            .output()
            .unwrap();
        assert!(!output.status.success(), "{spec} accepted");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(
            stderr.contains("--lun") && stderr.contains(says),
            "{spec}: {stderr}"
        );
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing created"
    );
}

#[test]
fn bad_portal_is_rejected() {
    let output = lanes()
        .args(["serve", "--portal", "::1:3260"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("--portal") && stderr.contains("brackets"),
        "{stderr}"
    );
}

#[test]
fn bad_config_names_file_line_and_key_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lanes.toml");
    std::fs::write(
        &config,
        "[[target]]\nname = \"iqn.2026-11.io.lanes:t\"\n\n[[target.lun]]\npath = \"disk.img\"\nsize = \"1G\"\nblock-size = 1000\n",
    )
    .unwrap();
    let output = lanes()
        .current_dir(dir.path())
        .args(["serve", "--config"])
        .arg(&config)
        .args(["--data-dir"])
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    let expected = format!(
        "{}:7:14: target[0].lun[0].block-size: must be 512 or 4096, got 1000",
        config.display()
    );
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(
        !dir.path().join("disk.img").exists(),
        "backing file created"
    );
    assert!(!dir.path().join("data").exists(), "data dir created");
}

#[test]
fn missing_config_file_is_an_error() {
    let output = lanes()
        .args(["serve", "--config", "/nonexistent/lanes.toml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("/nonexistent/lanes.toml"), "{stderr}");
}

#[test]
fn status_without_server_explains() {
    let dir = tempfile::tempdir().unwrap();
    let output = lanes()
        .args(["status", "--socket"])
        .arg(dir.path().join("none.sock"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("is lanes serve running"), "{stderr}");
}
