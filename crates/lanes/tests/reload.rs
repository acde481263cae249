//! `lanes reload`, SIGHUP, `lanes config check` and `lanes config show` against a running
//! `lanes serve` child started with --config plus a command-line override.

mod served;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use lanes_initiator::{LoginOptions, Session};
use lanes_iscsi_target::config::{CliOverrides, ServeConfig};

const TARGET: &str = "iqn.2026-11.io.lanes:reload";

fn lanes(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lanes"))
        .args(args)
        .output()
        .expect("run lanes")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The file's portal (3260) is replaced by `--portal 127.0.0.1:0` on the command line; a
/// reload must apply that override again or it would move the portal.
fn config(dir: &Path, luns: &str) -> String {
    format!(
        r#"[server]
data-dir = "{dir}/data"

[[portal-group]]
tag = 1
portals = ["127.0.0.1:3260"]

[[target]]
name = "{TARGET}"
{luns}"#,
        dir = dir.display()
    )
}

fn lun(number: u64, size: &str, extra: &str) -> String {
    format!(
        "\n[[target.lun]]\nlun = {number}\npath = \"lun{number}.img\"\nsize = \"{size}\"\n{extra}"
    )
}

/// Runs `check` every 20 ms until it is true or `limit` passes.
fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Unit attentions (ASC, ASCQ) reported by TEST UNIT READY until it answers GOOD.
async fn unit_attentions(session: &Session) -> Vec<(u8, u8)> {
    let mut seen = Vec::new();
    for _ in 0..8 {
        let out = session
            .execute(lanes_initiator::cdb::test_unit_ready(), 0, None)
            .await
            .expect("TEST UNIT READY");
        match out.sense_triplet() {
            None if out.status == 0 => return seen,
            Some((6, asc, ascq)) => seen.push((asc, ascq)),
            other => panic!("TEST UNIT READY: status {} sense {other:?}", out.status),
        }
    }
    panic!("unit attentions never cleared: {seen:?}");
}

#[test]
fn lanes_reload_and_sighup_apply_the_file_and_keep_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lanes.toml");
    std::fs::write(&file, config(dir.path(), &lun(0, "16M", ""))).unwrap();
    let file_arg = file.display().to_string();
    let served = served::serve_with(&["serve", "--config", &file_arg, "--portal", "127.0.0.1:0"]);
    let socket = dir.path().join("data/lanes.sock");
    let socket_arg = socket.display().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let session = rt
        .block_on(Session::login(
            served.portal,
            TARGET,
            &LoginOptions::new("iqn.2026-11.test:reload"),
        ))
        .expect("login");
    rt.block_on(session.test_unit_ready()).unwrap();

    // lanes reload: LUN 1 added, LUN 0 grown.
    std::fs::write(
        &file,
        config(dir.path(), &(lun(0, "32M", "") + &lun(1, "8M", ""))),
    )
    .unwrap();
    let out = lanes(&["reload", "--socket", &socket_arg]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!("{TARGET}: LUN 1 added")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{TARGET}: LUN 0 grown to {} bytes", 32 << 20)),
        "{stdout}"
    );
    assert!(
        !stdout.contains("portal"),
        "the --portal override is applied again: {stdout}"
    );
    let mut seen = rt.block_on(unit_attentions(&session));
    seen.sort_unstable();
    assert_eq!(seen, [(0x2A, 0x09), (0x3F, 0x0E)], "each once, then GOOD");
    assert_eq!(
        rt.block_on(session.read_capacity16()).unwrap(),
        ((32 << 20) / 512, 512)
    );

    // `lanes config show` prints what runs, and it parses back to the same configuration.
    let out = lanes(&["config", "show", "--socket", &socket_arg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    let running = ServeConfig::from_toml_str(&shown, &dir.path().join("shown.toml"))
        .unwrap_or_else(|e| panic!("{e}\n{shown}"));
    let expected = ServeConfig::from_cli(&CliOverrides {
        config: Some(file.clone()),
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        ..CliOverrides::default()
    })
    .unwrap();
    assert_eq!(running, expected, "{shown}");

    // A bad file: refused with file:line:column: key, exit status 1, nothing changes.
    let bad = config(
        dir.path(),
        &(lun(0, "32M", "block-size = 1000") + &lun(1, "8M", "")),
    );
    std::fs::write(&file, &bad).unwrap();
    let out = lanes(&["reload", "--socket", &socket_arg]);
    assert_eq!(out.status.code(), Some(1));
    let line = bad.lines().position(|l| l.contains("1000")).unwrap() + 1;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{file_arg}:{line}:14: target[0].lun[0].block-size: must be 512 or 4096"
        )),
        "{stderr}"
    );
    assert_eq!(
        rt.block_on(unit_attentions(&session)),
        [],
        "nothing changed"
    );

    // SIGHUP: LUN 1 removed again.
    std::fs::write(&file, config(dir.path(), &lun(0, "32M", ""))).unwrap();
    let lun1 = rt
        .block_on(Session::login(
            served.portal,
            TARGET,
            &LoginOptions {
                lun: 1,
                ..LoginOptions::new("iqn.2026-11.test:reload-lun1")
            },
        ))
        .expect("login for LUN 1");
    rt.block_on(lun1.test_unit_ready()).unwrap();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&served.child),
        rustix::process::Signal::Hup,
    )
    .expect("SIGHUP");
    let gone = wait_until(Duration::from_secs(20), || {
        let out = rt
            .block_on(lun1.execute(lanes_initiator::cdb::test_unit_ready(), 0, None))
            .expect("TEST UNIT READY");
        out.sense_triplet() == Some((5, 0x25, 0))
    });
    assert!(
        gone,
        "after SIGHUP, LUN 1 answers LOGICAL UNIT NOT SUPPORTED"
    );
    assert_eq!(rt.block_on(unit_attentions(&session)), [(0x3F, 0x0E)]);
    assert_eq!(rt.block_on(session.read(0, 1)).unwrap().len(), 512);
}

#[test]
fn a_server_without_config_cannot_reload() {
    let dir = tempfile::tempdir().unwrap();
    let _served = served::serve(dir.path());
    let socket = dir.path().join("data/lanes.sock");
    let out = lanes(&["reload", "--socket", socket.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("started without --config"), "{stderr}");
}

#[test]
fn config_check_validates_without_starting() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lanes.toml");
    std::fs::write(
        &file,
        config(dir.path(), &(lun(0, "16M", "") + &lun(1, "1M", ""))),
    )
    .unwrap();
    let out = lanes(&["config", "check", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!(
            "{}: ok: 1 target, 2 LUNs, 1 portal group, 1 portal\n",
            file.display()
        )
    );
    assert!(!dir.path().join("lun0.img").exists(), "nothing is created");
    assert!(!dir.path().join("data").exists(), "nothing is created");

    let bad = config(dir.path(), &lun(0, "16M", "block-size = 1000"));
    std::fs::write(&file, &bad).unwrap();
    let out = lanes(&["config", "check", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let line = bad.lines().position(|l| l.contains("1000")).unwrap() + 1;
    assert!(
        stderr.contains(&format!(
            "{}:{line}:14: target[0].lun[0].block-size",
            file.display()
        )),
        "{stderr}"
    );
}
