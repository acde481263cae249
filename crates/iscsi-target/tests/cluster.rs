//! `[cluster]`: one configuration file for both nodes of an HA pair, and two servers in this
//! process replicating one LUN over loopback with a real etcd as the witness.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use lanes_iscsi_target::config::{CliOverrides, ServeConfig};
use lanes_test_support::etcd::Etcd;
use support::*;

/// Both nodes' portal groups (1 on node 1, 2 on node 2), one 16 MiB LUN of 512-byte blocks.
fn cluster_toml(etcd: SocketAddr, portals: [u16; 2], repl: [u16; 2], node_line: &str) -> String {
    format!(
        r#"[server]
data-dir = "{{dir}}/data"
nop-interval = "30s"
nop-timeout = "120s"

[cluster]
{node_line}
name = "test-pair"
etcd = ["{etcd}"]
listen = "127.0.0.1:{r1}"
peer = "127.0.0.1:{r2}"
heartbeat = "100ms"

[[portal-group]]
tag = 1
node = 1
portals = ["127.0.0.1:{p1}"]

[[portal-group]]
tag = 2
node = 2
portals = ["127.0.0.1:{p2}"]

[[target]]
name = "{TARGET}"

[[target.lun]]
lun = 0
path = "disk0.img"
size = "16M"
block-size = 512
"#,
        p1 = portals[0],
        p2 = portals[1],
        r1 = repl[0],
        r2 = repl[1],
    )
}

fn from_file(text: &str, node: Option<u8>) -> Result<ServeConfig, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lanes.toml");
    std::fs::write(
        &file,
        text.replace("{dir}", &dir.path().display().to_string()),
    )
    .unwrap();
    ServeConfig::from_cli(&CliOverrides {
        config: Some(file),
        node,
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

#[test]
fn one_file_serves_both_nodes_with_the_same_lun_identity() {
    let etcd: SocketAddr = "127.0.0.1:2379".parse().unwrap();
    let text = cluster_toml(etcd, [3260, 3261], [7000, 7100], "");
    let one = from_file(&text, Some(1)).unwrap();
    let two = from_file(&text, Some(2)).unwrap();
    let tags = |c: &ServeConfig| c.portal_groups.iter().map(|g| g.tag).collect::<Vec<_>>();
    assert_eq!((tags(&one), tags(&two)), (vec![1], vec![2]));
    let (c1, c2) = (one.cluster.clone().unwrap(), two.cluster.clone().unwrap());
    assert_eq!(c1.peer_groups().map(|g| g.tag).collect::<Vec<_>>(), [2]);
    assert_eq!(c2.peer_groups().map(|g| g.tag).collect::<Vec<_>>(), [1]);
    // LUN N on port + N; each node listens on its own address and dials the other's.
    assert_eq!(c1.listen(3).to_string(), "127.0.0.1:7003");
    assert_eq!(c1.peer(3).to_string(), "127.0.0.1:7103");
    assert_eq!((c2.listen(0), c2.peer(0)), (c1.peer(0), c1.listen(0)));
    assert_eq!(c1.epoch_key(0), "/lanes/test-pair/lun0/epoch");
    // The LUN's identity derives from the target name and LUN number: equal on both nodes.
    let lun = |c: &ServeConfig| c.targets[0].luns[0].clone();
    assert_eq!(
        lanes_iscsi_target::config::naa_id(TARGET, &lun(&one)),
        lanes_iscsi_target::config::naa_id(TARGET, &lun(&two))
    );
    assert_eq!(
        lun(&one).effective_serial(TARGET),
        lun(&two).effective_serial(TARGET)
    );
    // `lanes config show` writes both nodes' groups and the pair back; it parses to the same.
    for c in [&one, &two] {
        let back =
            ServeConfig::from_toml_str(&c.to_toml(), std::path::Path::new("/shown/lanes.toml"))
                .unwrap_or_else(|e| panic!("{e}\n{}", c.to_toml()));
        assert_eq!(&back, c);
    }
    // The activity log: 1237 extents unless set; a value out of range names line and key.
    assert_eq!(c1.activity_log_extents, 1237);
    let set = text.replace(
        "heartbeat = \"100ms\"\n",
        "heartbeat = \"100ms\"\nactivity-log-extents = 300\n",
    );
    let c = from_file(&set, Some(1)).unwrap().cluster.unwrap();
    assert_eq!(c.activity_log_extents, 300);
    let line = 1 + set
        .lines()
        .position(|l| l.starts_with("activity-log"))
        .unwrap();
    let e = from_file(&set.replace("= 300", "= 1"), Some(1)).unwrap_err();
    assert!(
        e.contains(&format!("lanes.toml:{line}:")) && e.contains("cluster.activity-log-extents"),
        "{e}"
    );
    // Without a node anywhere, the file is refused, naming the key.
    let e = from_file(&text, None).unwrap_err();
    assert!(e.contains("cluster.node"), "{e}");
    // A group without its node names file, line and key.
    let broken = text.replacen("node = 2\n", "", 1);
    let e = from_file(&broken, Some(1)).unwrap_err();
    assert!(
        e.contains("lanes.toml:") && e.contains("portal-group[1].node"),
        "{e}"
    );
    // node = 3 is refused at its line.
    let line = 1 + text.lines().position(|l| l == "node = 2").unwrap();
    let e = from_file(&text.replace("node = 2\n", "node = 3\n"), Some(1)).unwrap_err();
    assert!(
        e.contains(&format!("lanes.toml:{line}:")) && e.contains("must be 1 or 2"),
        "{e}"
    );
    // A node key without [cluster] is refused.
    let plain = text.replace(
        &text[text.find("[cluster]").unwrap()..text.find("[[portal-group]]").unwrap()],
        "",
    );
    let e = from_file(&plain, None).unwrap_err();
    assert!(e.contains("only meaningful with a [cluster]"), "{e}");
}

fn status(server: &TestServer) -> serde_json::Value {
    let mut s = UnixStream::connect(server.status_socket()).expect("status socket");
    s.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).expect("JSON reply")
}

/// Poll the status socket until the pair's role is `role` (bounded).
fn wait_role(server: &TestServer, role: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = status(server);
        if s["pairs"][0]["role"] == role {
            return s;
        }
        assert!(Instant::now() < deadline, "role never became {role}: {s}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// VPD page 0x83's first designator (the NAA identifier).
fn naa(c: &mut Conn) -> Vec<u8> {
    let r = c
        .scsi(&[0x12, 0x01, 0x83, 0x01, 0x00, 0x00], 256, None)
        .unwrap();
    assert_eq!(r.status, 0);
    let len = usize::from(r.data[7]);
    r.data[8..8 + len].to_vec()
}

/// REPORT TARGET PORT GROUPS: (group id, state code).
fn rtpg(c: &mut Conn) -> Vec<(u16, u8)> {
    let cdb = [0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
    let r = c.scsi(&cdb, 1024, None).unwrap();
    assert_eq!(r.status, 0, "{:?}", r.sense_triplet());
    let mut out = Vec::new();
    let mut at = 4;
    while at + 8 <= r.data.len() {
        let d = &r.data[at..];
        out.push((u16::from_be_bytes([d[2], d[3]]), d[0] & 0x0f));
        at += 8 + 4 * usize::from(d[7]);
    }
    out.sort_unstable();
    out
}

#[test]
fn two_servers_replicate_one_lun_and_report_both_port_groups() {
    let etcd = Etcd::start();
    let [p1, p2, r1, r2] = lanes_test_support::ports::free_ports();
    let (portals, repl) = ([p1, p2], [r1, r2]);
    let node1 = TestServer::start(&cluster_toml(etcd.client, portals, repl, "node = 1"));
    let node2 = TestServer::start(&cluster_toml(etcd.client, portals, repl, "node = 2"));
    assert_eq!(
        node1.portals.len(),
        1,
        "a node listens only on its own portals"
    );
    assert_eq!(node1.portals[0].1.port(), portals[0]);
    assert_eq!(node2.portals[0].1.port(), portals[1]);
    wait_role(&node1, "Paired");
    let s = wait_role(&node2, "Paired");
    assert_eq!(
        (
            s["pairs"][0]["node"].as_u64(),
            s["pairs"][0]["peer_connected"].as_bool()
        ),
        (Some(2), Some(true))
    );

    let mut a = Conn::login_to(node1.portals[0].1, &LoginOpts::normal());
    let mut b = Conn::login_to(node2.portals[0].1, &LoginOpts::normal());
    a.clear_unit_attentions();
    b.clear_unit_attentions();
    assert_eq!(naa(&mut a), naa(&mut b), "one WWID on both nodes");
    assert_eq!(rtpg(&mut a), [(1, 0), (2, 0)]);
    assert_eq!(rtpg(&mut b), [(1, 0), (2, 0)]);

    let data = pattern(42, 64 * 512);
    a.write10(1000, &data);
    assert!(b.read10(1000, 64) == data, "node 2 reads what node 1 wrote");
    let data2 = pattern(43, 8 * 512);
    b.write10(5000, &data2);
    assert!(a.read10(5000, 8) == data2, "node 1 reads what node 2 wrote");
    // Both backing files hold both writes.
    for server in [&node1, &node2] {
        let file = std::fs::read(server.lun_path()).unwrap();
        assert!(file[1000 * 512..1064 * 512] == data[..]);
        assert!(file[5000 * 512..5008 * 512] == data2[..]);
    }

    // Node 2 stops: node 1 wins the epoch and goes on alone; its report marks node 2's group
    // unavailable.
    drop(b);
    drop(node2);
    wait_role(&node1, "Alone");
    a.clear_unit_attentions();
    let after = pattern(44, 16 * 512);
    a.write10(2000, &after);
    assert!(a.read10(2000, 16) == after);
    assert_eq!(rtpg(&mut a), [(1, 0), (2, 3)]);
}

/// A pair paired, then etcd killed and node 2 stopped: node 1 with a logged-in connection
/// (unit attentions cleared) and the count of commands that connection had sent so far.
fn node_1_without_peer_and_witness() -> (Etcd, TestServer, Conn, u64) {
    let mut etcd = Etcd::start();
    let [p1, p2, r1, r2] = lanes_test_support::ports::free_ports();
    let (portals, repl) = ([p1, p2], [r1, r2]);
    let node1 = TestServer::start(&cluster_toml(etcd.client, portals, repl, "node = 1"));
    let node2 = TestServer::start(&cluster_toml(etcd.client, portals, repl, "node = 2"));
    wait_role(&node1, "Paired");
    wait_role(&node2, "Paired");
    etcd.kill();
    drop(node2);
    let mut a = Conn::login_to(node1.portals[0].1, &LoginOpts::normal());
    a.clear_unit_attentions();
    let before = commands(&status(&node1)).expect("the session in the status");
    (etcd, node1, a, before)
}

/// Commands received on the first session's first connection, per the status.
fn commands(s: &serde_json::Value) -> Option<u64> {
    s["sessions"][0]["connections"][0]["commands"].as_u64()
}

/// Poll until `server` has received more than `before` commands (bounded).
fn wait_command_past(server: &TestServer, before: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while commands(&status(server)).unwrap_or(0) <= before {
        assert!(Instant::now() < deadline, "the write never reached node 1");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends a WRITE(10) of 8 blocks of `pattern(seed)` at `lba` without waiting for its answer
/// (node 1 holds it), and waits until node 1 has received it; returns the data.
fn send_held_write(node1: &TestServer, a: &mut Conn, before: u64, lba: u32, seed: u64) -> Vec<u8> {
    let data = pattern(seed, 8 * 512);
    let (itt, cmd_sn) = (a.itt(), a.cmd_sn);
    a.send_scsi(
        itt,
        cmd_sn,
        0,
        &cdb_write10(lba, 8, 0),
        8 * 512,
        Some(&data),
    );
    wait_command_past(node1, before);
    data
}

/// A node that lost its peer and its witness holds writes it may not acknowledge; shutting it
/// down must still end: the held writes fail (they were never acknowledged) and the server
/// stops, instead of waiting for them forever.
#[test]
fn a_node_holding_writes_without_peer_and_etcd_still_shuts_down() {
    let (_etcd, node1, mut a, before) = node_1_without_peer_and_witness();
    // The write waits in node 1: no peer to replicate to, no witness to win the epoch from.
    let writer = std::thread::spawn(move || {
        // Any answer or a closed connection: the point is that the server stops.
        let _ = a.scsi(&cdb_write10(100, 8, 0), 8 * 512, Some(&pattern(7, 8 * 512)));
    });
    wait_command_past(&node1, before);
    assert_ne!(
        status(&node1)["pairs"][0]["role"],
        "Alone",
        "no epoch without etcd"
    );
    // TestServer's drop gives the stop 20 s; it must end well within that.
    let stopping = Instant::now();
    drop(node1);
    let took = stopping.elapsed();
    assert!(took < Duration::from_secs(18), "shutdown took {took:?}");
    writer.join().unwrap();
}

/// A write held in node 1 (no peer to replicate to, no witness to win the epoch from) when its
/// connection drops still ends once the witness is back and node 1 goes on alone: a command on
/// asynchronous storage outlives its connection's reader, the write lands, and the session
/// ends only after it (dropping the command instead would leave its task for ever, and the
/// session with it).
#[test]
fn a_write_held_when_its_connection_drops_still_ends_and_its_session_with_it() {
    let (mut etcd, node1, mut a, before) = node_1_without_peer_and_witness();
    let data = send_held_write(&node1, &mut a, before, 300, 8);
    a.shutdown();
    drop(a);
    assert_eq!(
        status(&node1)["sessions"].as_array().map(Vec::len),
        Some(1),
        "the held write keeps its session"
    );
    etcd.restart();
    wait_role(&node1, "Alone");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = status(&node1);
        if s["sessions"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the session never ended: its held write never did: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let file = std::fs::read(node1.lun_path()).unwrap();
    assert!(
        file[300 * 512..308 * 512] == data[..],
        "the held write landed"
    );
}

/// The TSIHs of the sessions in `server`'s table.
fn tsihs(server: &TestServer) -> Vec<u64> {
    let s = status(server);
    let all = s["sessions"].as_array().cloned().unwrap_or_default();
    all.iter().filter_map(|x| x["tsih"].as_u64()).collect()
}

/// A login that reinstates a session holding a write waits for the write (RFC 7143 6.3.5).
/// When its initiator gives that login up and logs in again with the same ISID, the new login
/// must wait for the held write too: the session that the abandoned login created (and that
/// the new login reinstates) has no tasks, but the one it ended still has. Answering at once
/// would let the host replay the write and write newer data while the held one can still land
/// after it.
#[test]
fn a_login_after_an_abandoned_reinstatement_still_waits_for_the_old_tasks() {
    let (mut etcd, node1, mut a, before) = node_1_without_peer_and_witness();
    let first = tsihs(&node1);
    assert_eq!(first.len(), 1);
    let data = send_held_write(&node1, &mut a, before, 500, 9);
    // The second login reinstates the first session and waits for the held write.
    let portal = node1.portals[0].1;
    let mut second = Conn::connect(portal);
    let second_stream = second.stream.try_clone().unwrap();
    let abandoned = std::thread::spawn(move || second.login(&LoginOpts::normal()).is_ok());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = tsihs(&node1);
        if now.len() == 1 && now != first {
            break;
        }
        assert!(Instant::now() < deadline, "no reinstatement: {now:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Its initiator gives it up, as an initiator's login timeout does, and logs in again.
    let _ = second_stream.shutdown(std::net::Shutdown::Both);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let third = std::thread::spawn(move || {
        let mut c = Conn::connect(portal);
        let ok = c.login(&LoginOpts::normal()).is_ok();
        done_tx.send(ok).unwrap();
        c
    });
    assert!(
        done_rx.recv_timeout(Duration::from_secs(2)).is_err(),
        "a login completed while a write of the session it replaces was still held"
    );
    etcd.restart();
    wait_role(&node1, "Alone");
    let ok = done_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the third login completes once the held write has ended");
    assert!(ok, "the third login succeeded");
    let file = std::fs::read(node1.lun_path()).unwrap();
    assert!(
        file[500 * 512..508 * 512] == data[..],
        "the held write landed before the new session began"
    );
    assert!(
        !abandoned.join().unwrap(),
        "the abandoned login got no answer"
    );
    drop(third.join().unwrap());
    drop(a);
}

/// COMPARE AND WRITE(16) of one 512-byte block at `lba`.
fn caw16(c: &mut Conn, lba: u64, verify: &[u8], write: &[u8]) -> ScsiResult {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x89;
    cdb[2..10].copy_from_slice(&lba.to_be_bytes());
    cdb[13] = 1;
    let data = [verify, write].concat();
    c.scsi(&cdb, data.len() as u32, Some(&data)).unwrap()
}

/// Two hosts, one session on each node, racing COMPARE AND WRITE on one block from the same
/// expected content to different new content: one GOOD and one MISCOMPARE every round.
#[test]
fn caws_racing_through_both_nodes_have_one_winner_per_round() {
    let etcd = Etcd::start();
    let [p1, p2, r1, r2] = lanes_test_support::ports::free_ports();
    let (portals, repl) = ([p1, p2], [r1, r2]);
    let node1 = TestServer::start(&cluster_toml(etcd.client, portals, repl, "node = 1"));
    let node2 = TestServer::start(&cluster_toml(etcd.client, portals, repl, "node = 2"));
    wait_role(&node1, "Paired");
    wait_role(&node2, "Paired");
    let mut conns = [
        Conn::login_to(node1.portals[0].1, &LoginOpts::normal()),
        Conn::login_to(node2.portals[0].1, &LoginOpts::normal()),
    ];
    for c in &mut conns {
        c.clear_unit_attentions();
    }
    const ROUNDS: u64 = 100;
    const LBA: u64 = 300;
    let mut current = vec![0u8; 512];
    let mut wins = [0u64; 2];
    for round in 0..ROUNDS {
        let start = std::sync::Barrier::new(2);
        let results: Vec<(ScsiResult, Vec<u8>)> = std::thread::scope(|s| {
            let racers: Vec<_> = conns
                .iter_mut()
                .enumerate()
                .map(|(n, c)| {
                    let (start, verify) = (&start, &current);
                    s.spawn(move || {
                        let new = pattern(round << 8 | n as u64 | 1 << 40, 512);
                        start.wait();
                        (caw16(c, LBA, verify, &new), new)
                    })
                })
                .collect();
            racers.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut winner = None;
        for (n, (r, new)) in results.into_iter().enumerate() {
            match (r.status, r.sense_triplet()) {
                (0, _) => {
                    assert!(winner.is_none(), "round {round}: both nodes' CAWs won");
                    winner = Some(new);
                    wins[n] += 1;
                }
                (2, Some((0x0E, 0x1D, 0))) => {}
                other => panic!("round {round}: node {}'s CAW ended {other:?}", n + 1),
            }
        }
        current = winner.unwrap_or_else(|| panic!("round {round}: no CAW won"));
    }
    println!(
        "{ROUNDS} rounds: node 1 won {}, node 2 won {}",
        wins[0], wins[1]
    );
    for c in &mut conns {
        assert!(
            c.read10(LBA as u32, 1) == current,
            "a node reads another block"
        );
    }
}
