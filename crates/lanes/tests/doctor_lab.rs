//! `lanes doctor` in the lab (network namespaces, 1gbit shaped links): `lanes serve` in the
//! storage node, the doctor in the host namespace with 2 s probes. A healthy 1:1 set-up adds
//! up; a mesh and two portals on one storage NIC are named as shared bottlenecks with their
//! cause; LACP is named as one flow per link.
//!
//! Needs root, ip and tc (fails, not skips, without them). The tests of this binary take
//! turns (a lock here, and the `lab` test group in .config/nextest.toml), so no probe shares
//! the CPU or the links with another.

use lanes_test_support::require_root;
use lanes_test_support::serve::{ServeChild, ServeCommand};

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

const LANES: &str = env!("CARGO_BIN_EXE_lanes");

/// One lab test at a time, also under plain `cargo test`.
static TURN: Mutex<()> = Mutex::new(());

/// A lab and the target in its storage node, removed however the test ends.
struct Lab {
    name: String,
    serve: Option<ServeChild>,
    dir: tempfile::TempDir,
    /// Storage addresses (one per storage NIC), or the aggregate address for LACP.
    storage: Vec<String>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.serve = None;
        let _ = Command::new(LANES)
            .args(["lab", "down", &self.name])
            .output();
    }
}

impl Lab {
    /// `lanes lab up` with 1gbit links; reads the storage addresses from its summary.
    fn up(tag: &str, topology: &str, nics: usize, storage_nics: Option<usize>) -> Lab {
        require_root();
        let name = format!("dr{}-{tag}", std::process::id() % 100_000);
        let _ = Command::new(LANES).args(["lab", "down", &name]).output();
        let mut cmd = Command::new(LANES);
        cmd.args(["lab", "up", "--name", &name, "--rate", "1gbit"])
            .args(["--topology", topology, "--nics", &nics.to_string()]);
        if let Some(n) = storage_nics {
            cmd.args(["--storage-nics", &n.to_string()]);
        }
        let out = cmd.output().expect("run lanes lab up");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut lab = Lab {
            name,
            serve: None,
            dir: tempfile::tempdir().expect("tempdir"),
            storage: Vec::new(),
        };
        assert!(
            out.status.success(),
            "lanes lab up: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [link, ..] if link.starts_with("link") => {
                    if let Some(i) = words.iter().position(|w| *w == "node1") {
                        let addr = words.get(i + 1).and_then(|a| a.split('/').next());
                        lab.storage.extend(addr.map(str::to_string));
                    }
                }
                ["aggregate", .., "node1", addr] => lab.storage = vec![addr.to_string()],
                _ => {}
            }
        }
        assert!(!lab.storage.is_empty(), "no storage address in:\n{text}");
        lab
    }

    fn namespace(&self, short: &str) -> String {
        format!("lanes-{}-{short}", self.name)
    }

    /// `lanes serve` in node1 on `portals`, ready once its banner is out.
    fn serve(&mut self, portals: &[String]) {
        let child = ServeCommand::new(LANES)
            .in_namespace(&self.namespace("node1"))
            .portals(portals)
            .disk(self.dir.path(), "disk.img", "256M")
            .inherit_stderr()
            .start();
        self.serve = Some(child);
    }

    /// `lanes doctor URL --probe-time 2s --json` in the host namespace.
    fn doctor(&self, url: &str) -> (Option<i32>, String, Value) {
        let json = self.dir.path().join("doctor.json");
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.namespace("host"),
                LANES,
                "doctor",
                url,
            ])
            .args(["--probe-time", "2s", "--json"])
            .arg(&json)
            .output()
            .expect("run lanes doctor in the host namespace");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        let doc = std::fs::read(&json)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_else(|| panic!("no JSON:\n{stdout}\n{stderr}"));
        (out.status.code(), stdout, doc)
    }
}

fn check<'a>(doc: &'a Value, prefix: &str, stdout: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .and_then(|c| {
            c.iter()
                .find(|c| c["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
        })
        .unwrap_or_else(|| panic!("no check '{prefix}' in:\n{stdout}"))
}

fn number(check: &Value, key: &str) -> f64 {
    check["measurements"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no {key} in {check}"))
}

fn portal(addr: &str, port: u16) -> String {
    format!("{}", SocketAddr::new(addr.parse().expect("address"), port))
}

#[test]
fn healthy_one_to_one_paths_add_up() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up("ok", "pathing", 2, None);
    let portals: Vec<String> = lab.storage.iter().map(|a| portal(a, 3260)).collect();
    lab.serve(&portals);
    let (code, stdout, doc) = lab.doctor(&format!("iscsi://{}", portals[0]));
    assert_eq!(code, Some(0), "{stdout}");
    for c in doc["checks"].as_array().expect("checks") {
        assert_eq!(c["verdict"], "OK", "{c}\n{stdout}");
    }
    let first = format!("throughput {} alone", portals[0]);
    let alone = number(check(&doc, &first, &stdout), "mb_per_s");
    assert!(
        (80.0..135.0).contains(&alone),
        "one 1gbit path: {alone} MB/s\n{stdout}"
    );
    let together = check(&doc, "throughput all 2 paths", &stdout);
    let rate = number(together, "together_mb_per_s");
    assert!(
        rate > 1.6 * alone,
        "two paths give {rate} MB/s, one {alone}\n{stdout}"
    );
}

#[test]
fn a_mesh_is_named_as_a_shared_host_nic() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up("mesh", "mesh", 2, None);
    let portals: Vec<String> = lab.storage.iter().map(|a| portal(a, 3260)).collect();
    assert_eq!(portals.len(), 2);
    lab.serve(&portals);
    let (code, stdout, doc) = lab.doctor(&format!("iscsi://{}", portals[0]));
    assert_eq!(code, Some(0), "warnings only: {stdout}");
    let together = check(&doc, "throughput all 2 paths", &stdout);
    assert_eq!(together["verdict"], "WARN", "{stdout}");
    assert!(number(together, "ratio") < 0.7, "{together}");
    let detail = together["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains(&format!(
            "{} and {} share one bottleneck",
            portals[0], portals[1]
        )),
        "{detail}"
    );
    assert!(
        detail.contains("through link1") && detail.contains("mesh"),
        "{detail}"
    );
    // Without the probe the route alone already tells.
    assert_eq!(
        check(&doc, "local interface link1", &stdout)["verdict"],
        "WARN"
    );
}

#[test]
fn two_portals_on_one_storage_nic_are_named() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up("nic", "mesh", 2, Some(1));
    assert_eq!(lab.storage.len(), 1, "{:?}", lab.storage);
    let portals = vec![portal(&lab.storage[0], 3260), portal(&lab.storage[0], 3261)];
    lab.serve(&portals);
    let (code, stdout, doc) = lab.doctor(&format!("iscsi://{}", portals[0]));
    assert_eq!(code, Some(0), "warnings only: {stdout}");
    let together = check(&doc, "throughput all 2 paths", &stdout);
    assert_eq!(together["verdict"], "WARN", "{stdout}");
    let detail = together["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("two portals on one target address"),
        "{detail}"
    );
    assert!(number(together, "ratio") < 0.7, "{together}");
}

#[test]
fn lacp_is_named_as_one_flow_per_link() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::up("lacp", "lacp", 2, None);
    assert_eq!(
        lab.storage,
        vec!["10.77.100.2".to_string()],
        "aggregate address"
    );
    let portals = vec![portal(&lab.storage[0], 3260)];
    lab.serve(&portals);
    let (code, stdout, doc) = lab.doctor(&format!("iscsi://{}", portals[0]));
    assert_eq!(code, Some(0), "warnings only: {stdout}");
    let lacp = check(&doc, "link aggregate to 10.77.100.2:3260", &stdout);
    assert_eq!(lacp["verdict"], "WARN", "{stdout}");
    let detail = lacp["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("LACP") && detail.contains("gets one link"),
        "{detail}"
    );
    assert_eq!(number(lacp, "members"), 2.0);
    // One session is one TCP flow: one member link, never the aggregate.
    let one = number(lacp, "one_session_mb_per_s");
    assert!(
        (80.0..135.0).contains(&one),
        "one session: {one} MB/s\n{stdout}"
    );
    assert_eq!(check(&doc, "paths to", &stdout)["verdict"], "WARN");
}
