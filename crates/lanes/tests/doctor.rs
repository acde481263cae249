//! `lanes doctor` against real targets on loopback (no root for `lanes serve`; tgt needs the
//! tgt package and root, as the test command provides): a healthy target with two portals and
//! the configuration it generates (parsed), one clear FAIL line for a portal that is not iSCSI,
//! one that refuses connections, one that never answers and a wrong CHAP secret, a target that
//! refuses a second session, and a portal whose LUN identifier differs.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;

use lanes_test_support::serve::{ServeChild, ServeCommand};
use lanes_test_support::tgt::Tgt;
use serde_json::Value;

/// Starts `lanes serve ARGS` and reads portals, target and WWID from its banner.
fn serve(args: &[&str]) -> ServeChild {
    ServeCommand::new(env!("CARGO_BIN_EXE_lanes"))
        .args(args)
        .start()
}

fn lun_arg(dir: &Path, name: &str) -> String {
    format!("{},size=64M", dir.join(name).display())
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    json: Value,
}

impl Run {
    fn lines(&self, verdict: &str) -> Vec<&str> {
        let tag = format!("[{verdict:<4}]");
        self.stdout
            .lines()
            .filter(|l| l.starts_with(&tag))
            .collect()
    }

    fn check(&self, prefix: &str) -> &Value {
        self.json["checks"]
            .as_array()
            .and_then(|c| {
                c.iter()
                    .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            })
            .unwrap_or_else(|| panic!("no check '{prefix}' in:\n{}", self.stdout))
    }
}

fn doctor(dir: &Path, args: &[&str]) -> Run {
    let json = dir.join(format!("doctor-{}.json", rand_suffix()));
    let out = Command::new(env!("CARGO_BIN_EXE_lanes"))
        .arg("doctor")
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run lanes doctor");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        json: std::fs::read(&json)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or(Value::Null),
    };
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(
        !run.json.is_null(),
        "no JSON written:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    run
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A small multipath.conf reader: balanced braces, known sections and keys, quoted values with
/// blanks. Returns (section path, key, value).
fn parse_multipath_conf(text: &str) -> Vec<(String, String, String)> {
    const KEYS: &[&str] = &[
        "vendor",
        "product",
        "path_checker",
        "fast_io_fail_tmo",
        "hardware_handler",
        "prio",
        "wwid",
        "alias",
        "path_grouping_policy",
        "path_selector",
        "failback",
        "no_path_retry",
    ];
    let mut stack: Vec<String> = Vec::new();
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line == "}" {
            assert!(stack.pop().is_some(), "unbalanced }} in\n{text}");
        } else if let Some(section) = line.strip_suffix('{') {
            let section = section.trim();
            assert!(
                ["devices", "device", "multipaths", "multipath"].contains(&section),
                "section {section} in\n{text}"
            );
            stack.push(section.to_string());
        } else {
            let (key, value) = line.split_once(char::is_whitespace).expect("key value");
            assert!(KEYS.contains(&key), "unknown key {key} in\n{text}");
            assert!(!stack.is_empty(), "key outside a section in\n{text}");
            let value = value.trim();
            let value = match value.strip_prefix('"') {
                Some(v) => v.strip_suffix('"').expect("closing quote").to_string(),
                None => {
                    assert!(!value.contains(' '), "unquoted blank in {line}");
                    value.to_string()
                }
            };
            out.push((stack.join("/"), key.to_string(), value));
        }
    }
    assert!(stack.is_empty(), "unclosed {stack:?} in\n{text}");
    out
}

fn login_portals(commands: &str) -> Vec<String> {
    commands
        .lines()
        .filter(|l| l.starts_with("iscsiadm -m node") && l.ends_with("--login"))
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .position(|x| *x == "-p")
                .and_then(|i| w.get(i + 1))
                .map(|p| p.to_string())
        })
        .collect()
}

#[test]
fn healthy_two_portals_are_ok_and_the_config_names_the_wwid() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = serve(&[
        "--portal",
        "127.0.0.1:0",
        "--portal",
        "127.0.0.2:0",
        "--lun",
        &lun_arg(dir.path(), "disk.img"),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    assert_eq!(s.portals.len(), 2);
    let url = format!("iscsi://{}", s.portals[0]);
    let r = doctor(dir.path(), &[&url, "--quick"]);
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    for c in r.json["checks"].as_array().unwrap() {
        assert_eq!(c["verdict"], "OK", "{c}\n{}", r.stdout);
    }
    for p in &s.portals {
        assert!(
            r.stdout.contains(&format!("[OK  ] portal {p} reachable")),
            "{}",
            r.stdout
        );
    }
    assert!(r.check("second session")["verdict"] == "OK");
    assert_eq!(r.check("LUN 0 identity")["measurements"]["wwid"], s.wwid());
    assert!(
        !r.stdout.contains("probing throughput"),
        "--quick probes nothing"
    );

    let config = &r.json["config"];
    let entries = parse_multipath_conf(config["multipath_conf"].as_str().unwrap());
    let wwids: Vec<&str> = entries
        .iter()
        .filter(|(s, k, _)| s == "multipaths/multipath" && k == "wwid")
        .map(|(_, _, v)| v.as_str())
        .collect();
    assert_eq!(wwids, vec![s.wwid()]);
    assert!(entries.contains(&(
        "multipaths/multipath".into(),
        "path_selector".into(),
        "service-time 0".into()
    )));
    let mut logins = login_portals(config["linux_commands"].as_str().unwrap());
    logins.sort();
    let mut expected: Vec<String> = s.portals.iter().map(|p| p.to_string()).collect();
    expected.sort();
    assert_eq!(logins, expected, "one login per portal");
    assert!(config["fstab"].as_str().unwrap().contains("_netdev"));
    let windows = config["windows"].as_str().unwrap();
    assert_eq!(
        windows
            .matches("-IsMultipathEnabled $true -IsPersistent $true")
            .count(),
        2
    );
    assert!(
        windows.contains(&format!("-NodeAddress {} ", s.target)),
        "{windows}"
    );
    let esxi = config["esxi"].as_str().unwrap();
    assert!(
        esxi.contains(&format!("--device=naa.{}", &s.wwid()[1..])),
        "{esxi}"
    );
    assert!(esxi.contains("VMW_PSP_RR") && esxi.contains("--iops=1"));
}

/// Exactly one FAIL line, exit status 1, one line on stderr: returns the FAIL line.
fn one_failure(r: &Run) -> String {
    assert_eq!(r.code, Some(1), "{}\n{}", r.stdout, r.stderr);
    let fails = r.lines("FAIL");
    assert_eq!(fails.len(), 1, "{}", r.stdout);
    assert_eq!(r.stderr.trim_end().lines().count(), 1, "{}", r.stderr);
    assert!(
        r.json["config"].is_null(),
        "no configuration without a path"
    );
    fails[0].to_string()
}

#[test]
fn not_iscsi_refused_and_silent_portals_give_one_line_each() {
    let dir = tempfile::tempdir().unwrap();
    // Something that answers like a web server and closes.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let http_addr = http.local_addr().unwrap();
    std::thread::spawn(move || {
        for mut c in http.incoming().flatten() {
            let mut buf = [0u8; 48];
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let line = one_failure(&doctor(
        dir.path(),
        &[&format!("iscsi://{http_addr}"), "--quick"],
    ));
    assert!(line.contains("does not speak iSCSI"), "{line}");

    // A port nobody listens on.
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let line = one_failure(&doctor(
        dir.path(),
        &[&format!("iscsi://{closed}"), "--quick"],
    ));
    assert!(line.contains("connection refused"), "{line}");

    // A listener that accepts and never answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for c in silent.incoming().flatten() {
            held.push(c);
        }
    });
    let r = doctor(
        dir.path(),
        &[
            &format!("iscsi://{silent_addr}"),
            "--quick",
            "--timeout",
            "1s",
        ],
    );
    let line = one_failure(&r);
    assert!(line.contains("no Login Response within 1 s"), "{line}");
}

#[test]
fn a_wrong_chap_secret_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("lanes.toml");
    std::fs::write(
        &config,
        format!(
            "[[portal-group]]\ntag = 1\nportals = [\"127.0.0.1:0\"]\n\n[[target]]\n\
             name = \"iqn.2026-11.io.lanes:chap\"\n[target.chap]\nuser = \"host1\"\n\
             secret = \"the-right-secret\"\n[[target.lun]]\npath = \"{}\"\nsize = \"64M\"\n",
            dir.path().join("disk.img").display()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let s = serve(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let wrong = dir.path().join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret!\n").unwrap();
    let url = format!("iscsi://{}", s.portals[0]);
    let args = [
        url.as_str(),
        "--quick",
        "--chap-user",
        "host1",
        "--chap-secret-file",
    ];
    let r = doctor(
        dir.path(),
        &[&args[..], &[wrong.to_str().unwrap()]].concat(),
    );
    let line = one_failure(&r);
    assert!(line.contains("authentication failed"), "{line}");
    assert!(line.contains("--chap-secret-file"), "{line}");

    // The right secret passes, and the commands read it from the file.
    let right = dir.path().join("right.secret");
    std::fs::write(&right, "the-right-secret\n").unwrap();
    let r = doctor(
        dir.path(),
        &[&args[..], &[right.to_str().unwrap()]].concat(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stdout);
    let commands = r.json["config"]["linux_commands"].as_str().unwrap();
    assert!(
        commands.contains("node.session.auth.password -v \"$(cat '"),
        "{commands}"
    );
    assert!(!commands.contains("the-right-secret") && !r.stdout.contains("the-right-secret"));
}

#[test]
fn a_refused_second_session_is_named_with_its_fix() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = serve(&[
        "--portal",
        "127.0.0.1:0",
        "--portal",
        "127.0.0.2:0",
        "--lun",
        &lun_arg(dir.path(), "disk.img"),
        "--data-dir",
        data.to_str().unwrap(),
        "--allow-multiple-sessions",
        "false",
    ]);
    let r = doctor(dir.path(), &[&format!("iscsi://{}", s.portals[0])]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    let fails = r.lines("FAIL");
    assert_eq!(fails.len(), 1, "{}", r.stdout);
    assert!(
        fails[0].starts_with("[FAIL] second session per initiator"),
        "{}",
        fails[0]
    );
    assert!(
        fails[0].contains("too many connections (status class 0x02, detail 0x06)"),
        "{}",
        fails[0]
    );
    assert!(fails[0].contains("Allow multiple sessions"), "{}", fails[0]);
    // Every portal still logs in on its own, and no probe runs without a second session.
    for p in &s.portals {
        assert!(
            r.stdout.contains(&format!("[OK  ] portal {p} reachable")),
            "{}",
            r.stdout
        );
    }
    assert!(!r.stdout.contains("probing throughput"), "{}", r.stdout);
}

#[test]
fn a_portal_with_another_lun_identifier_fails_and_is_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let name = "iqn.2026-11.io.lanes:split";
    let data_a = dir.path().join("data-a");
    let a = serve(&[
        "--portal",
        "127.0.0.1:0",
        "--target-name",
        name,
        "--lun",
        &lun_arg(dir.path(), "a.img"),
        "--data-dir",
        data_a.to_str().unwrap(),
    ]);
    // The same target name on another server whose LUN has another serial: another NAA id.
    let config = dir.path().join("b.toml");
    std::fs::write(
        &config,
        format!(
            "[[portal-group]]\ntag = 1\nportals = [\"127.0.0.2:0\"]\n\n[[target]]\n\
             name = \"{name}\"\n[[target.lun]]\npath = \"{}\"\nsize = \"64M\"\nserial = \"other-disk\"\n",
            dir.path().join("b.img").display()
        ),
    )
    .unwrap();
    let data_b = dir.path().join("data-b");
    let b = serve(&[
        "--config",
        config.to_str().unwrap(),
        "--data-dir",
        data_b.to_str().unwrap(),
    ]);
    assert_ne!(a.wwid(), b.wwid());
    let url_a = format!("iscsi://{}/{name}", a.portals[0]);
    let url_b = format!("iscsi://{}/{name}", b.portals[0]);
    let r = doctor(dir.path(), &[&url_a, &url_b, "--quick"]);
    assert_eq!(r.code, Some(1), "{}", r.stdout);
    let fails = r.lines("FAIL");
    assert_eq!(fails.len(), 1, "{}", r.stdout);
    assert!(
        fails[0].starts_with("[FAIL] LUN 0 identity"),
        "{}",
        fails[0]
    );
    assert!(
        fails[0].contains(&format!("{} reports naa.{}", b.portals[0], &b.wwid()[1..])),
        "{}",
        fails[0]
    );
    let config = &r.json["config"];
    assert_eq!(
        login_portals(config["linux_commands"].as_str().unwrap()),
        vec![a.portals[0].to_string()]
    );
    let entries = parse_multipath_conf(config["multipath_conf"].as_str().unwrap());
    assert!(entries.contains(&(
        "multipaths/multipath".into(),
        "wwid".into(),
        a.wwid().to_string()
    )));
    assert!(!config["multipath_conf"]
        .as_str()
        .unwrap()
        .contains(b.wwid()));
    assert!(!config["windows"]
        .as_str()
        .unwrap()
        .contains(&b.portals[0].ip().to_string()));
    assert_eq!(
        r.json["targets"][0]["excluded"][0],
        b.portals[0].to_string()
    );
}

#[test]
fn tgt_with_two_portals_reports_one_lun_identity() {
    let dir = tempfile::tempdir().unwrap();
    let tgt = Tgt::start(64);
    let port = tgt.portals[0].port();
    // tgt's SendTargets names only the portal asked, so both are given.
    let r = doctor(
        dir.path(),
        &[
            &format!("iscsi://127.0.0.1:{port}"),
            &format!("iscsi://127.0.0.2:{port}"),
            "--quick",
        ],
    );
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(r.lines("FAIL").is_empty(), "{}", r.stdout);
    let identity = r.check("LUN 1 identity");
    assert_eq!(identity["verdict"], "OK", "{}", r.stdout);
    let wwid = identity["measurements"]["wwid"]
        .as_str()
        .unwrap()
        .to_string();
    let entries = parse_multipath_conf(r.json["config"]["multipath_conf"].as_str().unwrap());
    assert!(entries.contains(&("multipaths/multipath".into(), "wwid".into(), wwid)));
    let mut logins = login_portals(r.json["config"]["linux_commands"].as_str().unwrap());
    logins.sort();
    assert_eq!(
        logins,
        vec![format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")]
    );
    drop(tgt);
}
