//! `lanes serve` as a systemd service: READY=1 on `$NOTIFY_SOCKET` once every portal listens,
//! SIGHUP (`systemctl reload`) ignored, STOPPING=1 and exit 0 on SIGTERM; the same for `lanes
//! attach` (READY=1 once its exports are up); the packaged
//! `/etc/lanes/lanes.toml` passes the real configuration parser; `lanes generate` writes the
//! packaged man pages and completions.

mod served;

use lanes_iscsi_target::config::ServeConfig;
use served::{serve_on, serve_with_env};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);

/// The next datagram on the notify socket, as text.
fn next_state(socket: &UnixDatagram) -> String {
    let mut buffer = [0u8; 4096];
    let n = socket
        .recv(&mut buffer)
        .expect("a datagram on NOTIFY_SOCKET within the deadline");
    String::from_utf8(buffer[..n].to_vec()).expect("UTF-8 state")
}

fn signal(child: &std::process::Child, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal)
        .expect("signal lanes serve");
}

fn connect(portal: SocketAddr) {
    TcpStream::connect_timeout(&portal, DEADLINE).expect("portal accepts a connection");
}

#[test]
fn notify_socket_hears_ready_then_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    notify.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut served = serve_with_env(
        dir.path(),
        &["127.0.0.1:0"],
        &[("NOTIFY_SOCKET", socket_path.as_os_str())],
    );

    assert!(served.target.starts_with("iqn."), "{}", served.target);
    let ready = next_state(&notify);
    let lines: Vec<&str> = ready.lines().collect();
    assert!(lines.contains(&"READY=1"), "{ready:?}");
    let pid = format!("MAINPID={}", served.child.id());
    assert!(lines.contains(&pid.as_str()), "{ready:?}");
    // READY=1 comes after the portals are bound: a connection is accepted at once.
    connect(served.portal);

    // systemctl reload: the target reloads (here without a file: the reload is refused and
    // logged) and keeps serving.
    signal(&served.child, rustix::process::Signal::Hup);
    connect(served.portal);
    assert!(
        served.child.try_wait().expect("try_wait").is_none(),
        "SIGHUP ended lanes serve"
    );

    signal(&served.child, rustix::process::Signal::Term);
    let stopping = next_state(&notify);
    assert!(
        stopping.lines().any(|line| line == "STOPPING=1"),
        "{stopping:?}"
    );
    let status = exit_status(&mut served.child);
    assert!(status.success(), "exit after SIGTERM: {status}");
}

/// Waits for the child to exit, within the deadline.
fn exit_status(child: &mut Child) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        assert!(started.elapsed() < DEADLINE, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed on drop (a failed assertion must not leave it running).
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn attach_notifies_ready_once_exported_then_stopping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = serve_on(dir.path(), &["127.0.0.1:0"]);
    let socket_path = dir.path().join("attach-notify.sock");
    let notify = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    notify.set_read_timeout(Some(DEADLINE)).unwrap();
    let nbd = dir.path().join("nbd.sock");
    let url = format!("iscsi://{}/{}/0", served.portal, served.target);
    let mut attach = Killed(
        Command::new(env!("CARGO_BIN_EXE_lanes"))
            .args(["attach", &url, "--nbd"])
            .arg(format!("unix:{}", nbd.display()))
            .arg("--status-socket")
            .arg(dir.path().join("attach.sock"))
            .env("LANES_RUN_DIR", dir.path().join("run"))
            .env("NOTIFY_SOCKET", &socket_path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn lanes attach"),
    );
    let ready = next_state(&notify);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(ready.contains("over 1 path(s)"), "{ready:?}");
    // READY=1 comes after the NBD export is bound.
    std::os::unix::net::UnixStream::connect(&nbd).expect("the NBD export listens");

    signal(&attach.0, rustix::process::Signal::Term);
    let stopping = next_state(&notify);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = exit_status(&mut attach.0);
    assert!(
        status.success(),
        "lanes attach exit after SIGTERM: {status}"
    );
}

#[test]
fn packaged_config_is_valid_and_keeps_data_in_var_lib() {
    let packaged = Path::new(env!("CARGO_MANIFEST_DIR")).join("debian/lanes.toml");
    let text = std::fs::read_to_string(&packaged).expect("debian/lanes.toml");
    let config = ServeConfig::from_toml_str(&text, Path::new("/etc/lanes/lanes.toml"))
        .unwrap_or_else(|e| panic!("the packaged config does not parse: {e}"));
    assert_eq!(config.data_dir, Path::new("/var/lib/lanes"));
    assert_eq!(
        config.status_socket_path(),
        Path::new("/var/lib/lanes/lanes.sock")
    );
    assert_eq!(config.targets.len(), 1);
    assert_eq!(
        config.targets[0].name,
        lanes_iscsi_target::config::default_target_name(),
        "no fixed name: two hosts with the packaged file must not share LUN identifiers"
    );
    let lun = &config.targets[0].luns[0];
    assert_eq!(lun.path, Path::new("/var/lib/lanes/disk0.img"));
    assert_eq!(
        lun.size,
        Some(1 << 30),
        "a size, so the file is created on first start"
    );
    assert_eq!(
        config.portal_groups[0].portals,
        vec!["0.0.0.0:3260".parse::<SocketAddr>().unwrap()]
    );
    assert_eq!(config.metrics_addr, None);
}

#[test]
fn packaged_unit_runs_the_packaged_config() {
    let debian = Path::new(env!("CARGO_MANIFEST_DIR")).join("debian");
    let unit = std::fs::read_to_string(debian.join("lanes.service")).expect("lanes.service");
    for line in [
        "Type=notify",
        "ExecStart=/usr/bin/lanes serve --config /etc/lanes/lanes.toml",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "StateDirectory=lanes",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "lanes.service lacks {line}"
        );
    }
    let template =
        std::fs::read_to_string(debian.join("lanes-attach@.service")).expect("attach unit");
    assert!(template.lines().any(|l| l == "Type=notify"));
    assert!(template
        .lines()
        .any(|l| l == "EnvironmentFile=/etc/lanes/attach/%i.conf"));
    assert!(template
        .lines()
        .any(|l| l == "ExecStart=/usr/bin/lanes attach $LANES_ATTACH_ARGS"));
}

#[test]
fn generate_writes_man_pages_and_completions() {
    let dir = tempfile::tempdir().expect("tempdir");
    for what in ["man", "completions"] {
        let out = Command::new(env!("CARGO_BIN_EXE_lanes"))
            .args(["generate", what])
            .arg(dir.path().join(what))
            .output()
            .expect("run lanes generate");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for page in [
        "lanes.1",
        "lanes-serve.1",
        "lanes-attach.1",
        "lanes-lab-up.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join("man").join(page))
            .unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.starts_with(".ie") || text.contains(".TH"), "{page}");
    }
    let serve = std::fs::read_to_string(dir.path().join("man/lanes-serve.1")).unwrap();
    assert!(
        serve.contains("config"),
        "lanes-serve(1) documents --config"
    );
    assert!(
        !dir.path().join("man/lanes-generate.1").exists(),
        "the hidden subcommand gets no page"
    );
    for file in ["lanes.bash", "_lanes", "lanes.fish"] {
        let text = std::fs::read_to_string(dir.path().join("completions").join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains("serve"), "{file} completes subcommands");
        assert!(
            !text.contains("generate"),
            "{file} offers the packaging command"
        );
    }
}
