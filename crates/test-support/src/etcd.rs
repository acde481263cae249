//! An etcd child (Debian's etcd-server, 3.4) on loopback, one member, its data in a temporary
//! directory; for the HA witness's tests. Ready when etcd logs that it serves clients.

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub struct Etcd {
    child: Option<Child>,
    /// The client URL's address (`http://` + this).
    pub client: SocketAddr,
    peer: SocketAddr,
    dir: tempfile::TempDir,
}

impl Etcd {
    /// A fresh single-member cluster. Its two ports are ones the kernel just handed out and
    /// released, so a test running beside it may take one first: etcd then fails to bind,
    /// and it starts again on two new ports (a few times at most).
    pub fn start() -> Etcd {
        let mut attempt = 1;
        loop {
            let [client, peer] = crate::ports::free_addrs();
            let mut etcd = Etcd {
                child: None,
                client,
                peer,
                dir: tempfile::tempdir().expect("tempdir"),
            };
            match etcd.try_spawn() {
                Ok(()) => return etcd,
                Err(log) if log.contains("address already in use") && attempt < 5 => {
                    attempt += 1;
                }
                Err(log) => panic!("etcd exited before serving clients:\n{log}"),
            }
        }
    }

    fn spawn(&mut self) {
        if let Err(log) = self.try_spawn() {
            panic!("etcd exited before serving clients:\n{log}");
        }
    }

    /// Starts etcd and waits until it serves clients; its log when it exits first.
    fn try_spawn(&mut self) -> Result<(), String> {
        let client = format!("http://{}", self.client);
        let peer = format!("http://{}", self.peer);
        let mut child = Command::new("etcd")
            .args(["--name", "witness", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("witness={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcd (the etcd-server package; scripts/test.sh installs it)");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            let mut tail = Vec::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent && line.contains("ready to serve client requests") {
                    let _ = tx.send(Ok(()));
                    sent = true;
                }
                if !sent {
                    tail.push(line);
                }
            }
            if !sent {
                let _ = tx.send(Err(tail.join("\n")));
            }
        });
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok(())) => {
                self.child = Some(child);
                Ok(())
            }
            Ok(Err(log)) => {
                let _ = child.wait();
                Err(log)
            }
            Err(_) => {
                let _ = child.kill();
                panic!("etcd did not serve clients within 30 s")
            }
        }
    }

    /// SIGKILL (the data directory stays).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kill, then start again on the same data and ports.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
