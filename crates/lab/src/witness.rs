//! The witness of an HA pair: one etcd (Debian's etcd-server) inside the lab's `witness`
//! namespace, serving clients on each node's witness link (`10.79.K.1:2379`), its data and log
//! under `/run/lanes-lab`. `up` starts it, `lanes lab witness NAME stop|start|restart` is the
//! fault campaign's "restart etcd", and `down` stops it with the namespace.

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::plan::{real_namespace, Plan, WITNESS_PORT};
use crate::run::{LabError, STATE_DIR};

/// etcd says this once it serves clients.
const READY: &str = "ready to serve client requests";
/// Longest wait for that line.
const START_LIMIT: Duration = Duration::from_secs(30);

/// etcd's data directory and log file for a lab.
pub fn paths(lab: &str) -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(STATE_DIR);
    (
        dir.join(format!("{lab}-etcd")),
        dir.join(format!("{lab}-etcd.log")),
    )
}

/// The etcd command line for a plan's witness.
pub fn args(plan: &Plan) -> Vec<String> {
    let lab = &plan.options.name;
    let (data, _) = paths(lab);
    let clients: Vec<String> = (1..=2)
        .filter_map(|k| plan.witness_endpoint(k))
        .map(|e| format!("http://{e}"))
        .collect();
    let clients = clients.join(",");
    let peer = format!("http://127.0.0.1:{}", WITNESS_PORT + 1);
    [
        "etcd",
        "--name",
        "witness",
        "--data-dir",
        &data.display().to_string(),
        "--listen-client-urls",
        &clients,
        "--advertise-client-urls",
        &clients,
        "--listen-peer-urls",
        &peer,
        "--initial-advertise-peer-urls",
        &peer,
        "--initial-cluster",
        &format!("witness={peer}"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Starts etcd in the witness namespace and waits until it serves clients; its pid.
pub fn start(plan: &Plan) -> Result<u32, LabError> {
    let lab = &plan.options.name;
    let (_, log) = paths(lab);
    let argv = args(plan);
    let shown = format!(
        "ip netns exec {} {}",
        real_namespace(lab, "witness"),
        argv.join(" ")
    );
    let spawn_error = |source| LabError::Spawn {
        command: shown.clone(),
        source,
    };
    let out = fs::File::create(&log).map_err(spawn_error)?;
    let err = out.try_clone().map_err(spawn_error)?;
    let mut child = Command::new("ip")
        .args(["netns", "exec", &real_namespace(lab, "witness")])
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(spawn_error)?;
    let started = Instant::now();
    loop {
        let text = fs::read_to_string(&log).unwrap_or_default();
        if text.contains(READY) {
            // `ip netns exec` execs etcd: this is etcd's pid. It outlives this call.
            return Ok(child.id());
        }
        let exited = child.try_wait().ok().flatten();
        if exited.is_some() || started.elapsed() > START_LIMIT {
            if exited.is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            return Err(LabError::Command {
                command: shown,
                status: exited.map_or_else(
                    || format!("no \"{READY}\" within {} s", START_LIMIT.as_secs()),
                    |s| s.to_string(),
                ),
                stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the etcd with this pid if it still runs (SIGKILL: a crash, as the campaign wants).
pub fn stop(pid: u32) {
    let Some(target) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    if comm.trim() != "etcd" {
        return;
    }
    let _ = rustix::process::kill_process(target, rustix::process::Signal::Kill);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !released(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` is gone, or a zombie whose every thread has exited: only then are its
/// sockets closed (the leader turns zombie while other threads may still hold the fd table,
/// and a new etcd would find its ports taken).
fn released(pid: u32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or("")
            .to_string()
    };
    field("State:").starts_with('Z') && field("Threads:") == "1"
}

/// Removes the data directory and log of a lab that is gone.
pub fn remove_files(lab: &str) {
    let (data, log) = paths(lab);
    let _ = fs::remove_dir_all(data);
    let _ = fs::remove_file(log);
}
