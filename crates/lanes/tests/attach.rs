//! `lanes attach` as a user runs it: against a `lanes serve` child with two portals on
//! loopback, exported over NBD (qemu-img writes and reads through it) and as a FUSE file; a
//! second attach of the same LUN is refused; SIGTERM drains and logs out of every path; bad
//! arguments and unreachable targets give one clear line.

mod served;

use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use served::serve_on;

/// A `lanes attach` child, killed on drop if the test did not stop it.
struct Attached {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    printed: Vec<String>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lanes(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lanes"));
    c.args(args).env("RUST_LOG", "warn");
    c
}

/// What the attach printed before its "attached" line, e.g. `metrics: http://...`.
fn printed(a: &Attached, prefix: &str) -> Option<String> {
    a.printed
        .iter()
        .find_map(|l| l.strip_prefix(prefix).map(str::to_string))
}

fn attach(run_dir: &Path, args: &[&str]) -> Attached {
    let mut child = lanes(args)
        .env("LANES_RUN_DIR", run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn lanes attach");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut a = Attached {
        child,
        lines: rx,
        printed: Vec::new(),
    };
    loop {
        let line = a
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("lanes attach prints 'attached' within 30 s");
        if line.starts_with("attached ") {
            assert!(line.contains("over 2 path(s)"), "{line}");
            return a;
        }
        a.printed.push(line);
    }
}

fn output(mut c: impl std::borrow::BorrowMut<Command>) -> Output {
    c.borrow_mut().output().expect("run")
}

fn random_file(path: &Path, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(path, &data).expect("write input");
    data
}

#[test]
fn nbd_export_status_second_attach_and_clean_stop() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = serve_on(dir.path(), &["127.0.0.1:0", "127.0.0.2:0"]);
    let url = format!("iscsi://{}/{}/0", served.portal, served.target);
    let nbd = dir.path().join("nbd.sock");
    let status = dir.path().join("attach.sock");
    let run_dir = dir.path().join("run");
    let mut a = attach(
        &run_dir,
        &[
            "attach",
            &url,
            "--nbd",
            &format!("unix:{}", nbd.display()),
            "--status-socket",
            status.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
        ],
    );

    // qemu-img writes 16 MiB through the NBD export and reads it back.
    let input = dir.path().join("in.raw");
    let data = random_file(&input, 16 << 20);
    let uri = format!("nbd+unix:///lanes?socket={}", nbd.display());
    let w = output(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&input)
            .arg(&uri),
    );
    assert!(
        w.status.success(),
        "qemu-img convert in: {}",
        String::from_utf8_lossy(&w.stderr)
    );
    let back = dir.path().join("out.raw");
    let r = output(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&back),
    );
    assert!(
        r.status.success(),
        "qemu-img convert out: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let got = std::fs::read(&back).expect("read back");
    assert_eq!(got.len(), 64 << 20);
    assert!(
        got[..data.len()] == data[..],
        "data read back through NBD differs"
    );

    // Both paths carried I/O.
    let st = output(lanes(&[
        "status",
        "--json",
        "--socket",
        status.to_str().unwrap(),
    ]));
    assert!(st.status.success());
    let v: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status JSON");
    let paths = v["paths"].as_array().expect("paths");
    assert_eq!(paths.len(), 2);
    for p in paths {
        assert_eq!(p["state"], "active", "{p}");
        assert!(
            p["completed"].as_u64().unwrap() > 0,
            "a path carried nothing: {p}"
        );
    }
    let table = output(lanes(&["status", "--socket", status.to_str().unwrap()]));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("Paths (2)") && text.contains("active"),
        "{text}"
    );

    // Prometheus metrics name both paths.
    let metrics = printed(&a, "metrics: http://").expect("metrics address printed");
    let addr = metrics.trim_end_matches("/metrics").to_string();
    let mut http = std::net::TcpStream::connect(&addr).expect("metrics connect");
    http.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    http.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert_eq!(body.matches("lanes_path_up{").count(), 2, "{body}");
    assert!(body.contains("lanes_replayed_total"), "{body}");

    // A second attach of the same LUN on this host is refused.
    let second = output(
        lanes(&[
            "attach",
            &url,
            "--status-socket",
            dir.path().join("s2.sock").to_str().unwrap(),
        ])
        .env("LANES_RUN_DIR", &run_dir),
    );
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("already attached"), "{err}");

    // SIGTERM: drain, flush, log out of both paths, exit 0.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&a.child),
        rustix::process::Signal::Term,
    )
    .expect("SIGTERM");
    let code = a.child.wait().expect("wait");
    assert!(code.success(), "lanes attach exit: {code}");
    let sessions =
        output(lanes(&["status", "--json", "--socket"]).arg(dir.path().join("data/lanes.sock")));
    let v: serde_json::Value = serde_json::from_slice(&sessions.stdout).expect("serve status JSON");
    assert_eq!(
        v["sessions"].as_array().map(Vec::len),
        Some(0),
        "sessions left: {v}"
    );
    drop(served);
}

#[test]
fn fuse_file_export() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = serve_on(dir.path(), &["127.0.0.1:0", "127.0.0.2:0"]);
    let url = format!("iscsi://{}/{}/0", served.portal, served.target);
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let a = attach(
        &dir.path().join("run"),
        &[
            "attach",
            &url,
            "--fuse",
            mnt.to_str().unwrap(),
            "--status-socket",
            dir.path().join("a.sock").to_str().unwrap(),
        ],
    );
    let disk = mnt.join("disk");
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&disk)
        .expect("open DIR/disk");
    assert_eq!(f.metadata().unwrap().len(), 64 << 20);
    // An unaligned write through the file lands where it should.
    f.seek(SeekFrom::Start(1_000_003)).unwrap();
    f.write_all(b"lanes multipath").unwrap();
    f.sync_all().expect("fsync");
    let mut back = [0u8; 15];
    f.seek(SeekFrom::Start(1_000_003)).unwrap();
    f.read_exact(&mut back).unwrap();
    assert_eq!(&back, b"lanes multipath");
    drop(f);

    // The seed's workflow without a kernel initiator: a loop device on the file, ext4, mount,
    // write, unmount, and a clean fsck.
    let fs = FsGuard::new(&disk, &dir.path().join("fs"));
    let file = fs.mnt.join("hello.txt");
    std::fs::write(&file, b"written through every path\n").expect("write on ext4");
    fs.finish();

    drop(a);
    // Killed without a clean stop: the mount must not be left behind for the next test.
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    drop(served);
}

/// A loop device on the FUSE file with ext4 mounted on it, torn down however the test ends.
struct FsGuard {
    loopdev: String,
    mnt: std::path::PathBuf,
    mounted: bool,
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl FsGuard {
    fn new(disk: &Path, mnt: &Path) -> FsGuard {
        std::fs::create_dir_all(mnt).unwrap();
        let loopdev = run_ok(Command::new("losetup").args(["--find", "--show"]).arg(disk));
        let mut g = FsGuard {
            loopdev,
            mnt: mnt.to_path_buf(),
            mounted: false,
        };
        run_ok(Command::new("mkfs.ext4").args(["-q", "-F", &g.loopdev]));
        run_ok(Command::new("mount").arg(&g.loopdev).arg(mnt));
        g.mounted = true;
        g
    }

    /// Unmounts and checks the file system.
    fn finish(mut self) {
        run_ok(Command::new("umount").arg(&self.mnt));
        self.mounted = false;
        run_ok(Command::new("e2fsck").args(["-fn", &self.loopdev]));
    }
}

impl Drop for FsGuard {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = Command::new("losetup").args(["-d", &self.loopdev]).status();
    }
}

#[test]
fn bad_arguments_and_unreachable_targets_give_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&[&str], &str); 3] = [
        (&["attach", "http://example/x"], "not an iSCSI URL"),
        (
            &["attach", "iscsi://127.0.0.1:1/iqn.2026-01.x:y/0"],
            "127.0.0.1:1",
        ),
        (
            &[
                "attach",
                "iscsi://127.0.0.1:1/iqn.2026-01.x:y/0",
                "--policy",
                "fastest",
            ],
            "fastest",
        ),
    ];
    for (args, needle) in cases {
        let out = output(lanes(args).env("LANES_RUN_DIR", dir.path()));
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(
            lines.len() <= 3,
            "{args:?}: more than a short message:\n{err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}
