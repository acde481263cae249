//! Persistent reservations across an HA pair: two servers in this process replicate one LUN
//! over loopback (a real etcd as the witness); a reservation taken through one node binds the
//! other, both report the same registrations and generation, unit attentions reach the other
//! node's nexuses, and a node that returns after its peer went on alone takes its state.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use lanes_test_support::etcd::Etcd;
use support::*;

/// Portal group 1 on node 1, 2 on node 2, one 16 MiB LUN in `root` (so a node can restart
/// over the same files).
fn pair_toml(root: &str, etcd: SocketAddr, portals: [u16; 2], repl: [u16; 2], node: u8) -> String {
    format!(
        r#"[server]
data-dir = "{{dir}}/data"
nop-interval = "30s"
nop-timeout = "120s"

[cluster]
node = {node}
name = "pr-pair"
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
path = "{root}/node{node}.img"
size = "16M"
block-size = 512
"#,
        p1 = portals[0],
        p2 = portals[1],
        r1 = repl[0],
        r2 = repl[1],
    )
}

fn role(server: &TestServer) -> String {
    let mut s = UnixStream::connect(server.status_socket()).expect("status socket");
    s.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).expect("JSON reply");
    v["pairs"][0]["role"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Polls the status socket until the pair's role is `want` (bounded).
fn wait_role(server: &TestServer, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while role(server) != want {
        assert!(Instant::now() < deadline, "role never became {want}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn host(addr: SocketAddr, name: &str, isid_last: u8) -> Conn {
    let mut opts = LoginOpts::normal();
    opts.initiator = name.into();
    opts.isid[5] = isid_last;
    let mut c = Conn::login_to(addr, &opts);
    c.clear_unit_attentions();
    c
}

/// PERSISTENT RESERVE OUT with a 24-byte parameter list; returns the status.
fn prout(c: &mut Conn, action: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let mut params = [0u8; 24];
    params[0..8].copy_from_slice(&key.to_be_bytes());
    params[8..16].copy_from_slice(&sa_key.to_be_bytes());
    let cdb = [0x5F, action, kind, 0, 0, 0, 0, 0, 24, 0];
    c.scsi(&cdb, 24, Some(&params)).expect("PR OUT").status
}

/// READ KEYS: (generation, keys).
fn read_keys(c: &mut Conn) -> (u32, Vec<u64>) {
    let r = c
        .scsi(&[0x5E, 0, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, None)
        .expect("READ KEYS");
    assert_eq!(r.status, 0);
    let generation = u32::from_be_bytes(r.data[0..4].try_into().unwrap());
    let len = u32::from_be_bytes(r.data[4..8].try_into().unwrap()) as usize;
    let keys = r.data[8..8 + len]
        .chunks_exact(8)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    (generation, keys)
}

/// READ RESERVATION: (key, type) of the reservation, if any.
fn read_reservation(c: &mut Conn) -> Option<(u64, u8)> {
    let r = c
        .scsi(&[0x5E, 1, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, None)
        .expect("READ RESERVATION");
    assert_eq!(r.status, 0);
    let len = u32::from_be_bytes(r.data[4..8].try_into().unwrap());
    (len >= 16).then(|| {
        (
            u64::from_be_bytes(r.data[8..16].try_into().unwrap()),
            r.data[21] & 0x0f,
        )
    })
}

fn write_status(c: &mut Conn, lba: u32) -> u8 {
    let data = pattern(u64::from(lba), 512);
    c.scsi(&cdb_write10(lba, 1, 0), 512, Some(&data))
        .expect("WRITE(10)")
        .status
}

const CONFLICT: u8 = 0x18;
const EXCLUSIVE_ACCESS: u8 = 3;
const WRITE_EXCLUSIVE: u8 = 1;

#[test]
fn a_reservation_through_one_node_binds_the_other() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let [p1, p2, r1, r2] = lanes_test_support::ports::free_ports();
    let (portals, repl) = ([p1, p2], [r1, r2]);
    let node1 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 1));
    let node2 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 2));
    wait_role(&node1, "Paired");
    wait_role(&node2, "Paired");
    let mut a = host(node1.portals[0].1, "iqn.2026-01.test:host-a", 1);
    let mut b = host(node2.portals[0].1, "iqn.2026-01.test:host-b", 2);

    // Host A registers and reserves Exclusive Access through node 1.
    assert_eq!(prout(&mut a, 0, 0, 0, 0xA), 0);
    assert_eq!(prout(&mut a, 1, EXCLUSIVE_ACCESS, 0xA, 0), 0);
    // Host B's WRITE through node 2 conflicts; so does its READ (exclusive access).
    assert_eq!(write_status(&mut b, 10), CONFLICT);
    let r = b.scsi(&cdb_read10(10, 1), 512, None).unwrap();
    assert_eq!(r.status, CONFLICT);
    // Host A writes through node 1.
    assert_eq!(write_status(&mut a, 10), 0);
    // Both nodes report the same keys, generation and holder.
    assert_eq!(read_keys(&mut a), (1, vec![0xA]));
    assert_eq!(read_keys(&mut b), (1, vec![0xA]));
    assert_eq!(read_reservation(&mut b), Some((0xA, EXCLUSIVE_ACCESS)));

    // Host B registers through node 2 and preempts A's reservation (Write Exclusive): A's
    // registration goes, and A, on the other node, gets REGISTRATIONS PREEMPTED.
    assert_eq!(prout(&mut b, 0, 0, 0, 0xB), 0);
    assert_eq!(prout(&mut b, 4, WRITE_EXCLUSIVE, 0xB, 0xA), 0);
    let (status, sense) = a.tur();
    assert_eq!((status, sense), (2, Some((0x06, 0x2A, 0x03))));
    assert_eq!(write_status(&mut a, 11), CONFLICT);
    assert_eq!(write_status(&mut b, 11), 0);
    assert_eq!(read_keys(&mut a), (3, vec![0xB]));
    assert_eq!(read_reservation(&mut a), Some((0xB, WRITE_EXCLUSIVE)));

    // A LOGICAL UNIT RESET through node 2 leaves its unit attention on node 1's nexus too.
    assert_eq!(b.tmf(5, 0, 0xffff_ffff, 0), 0);
    b.clear_unit_attentions();
    assert_eq!(a.tur(), (2, Some((0x06, 0x29, 0x03))));

    // Both nodes' copies are on disk with the same version and text.
    let file = |n: u8| std::fs::read_to_string(dir.path().join(format!("node{n}.img.pr-pair")));
    let (f1, f2) = (file(1).unwrap(), file(2).unwrap());
    assert_eq!(f1, f2);
    assert!(f1.contains("res 1 000000000000000b"), "{f1}");
}

#[test]
fn a_returning_node_takes_the_survivors_reservations() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let [p1, p2, r1, r2] = lanes_test_support::ports::free_ports();
    let (portals, repl) = ([p1, p2], [r1, r2]);
    let node1 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 1));
    let node2 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 2));
    wait_role(&node1, "Paired");
    wait_role(&node2, "Paired");
    let mut a = host(node1.portals[0].1, "iqn.2026-01.test:host-a", 1);
    a.clear_unit_attentions();
    assert_eq!(prout(&mut a, 0, 0, 0, 0xA), 0);
    assert_eq!(read_keys(&mut a), (1, vec![0xA]));

    // Node 2 stops; node 1 goes on alone, and its reservation changes are its own.
    drop(node2);
    wait_role(&node1, "Alone");
    a.clear_unit_attentions();
    assert_eq!(prout(&mut a, 1, WRITE_EXCLUSIVE, 0xA, 0), 0);
    assert_eq!(prout(&mut a, 0, 0, 0xA, 0xAA), 0);
    assert_eq!(read_keys(&mut a), (2, vec![0xAA]));

    // Node 2 returns: resynced from node 1, it reports and enforces node 1's state.
    let node2 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 2));
    wait_role(&node2, "Paired");
    wait_role(&node1, "Paired");
    let mut b = host(node2.portals[0].1, "iqn.2026-01.test:host-b", 2);
    assert_eq!(read_keys(&mut b), (2, vec![0xAA]));
    assert_eq!(read_reservation(&mut b), Some((0xAA, WRITE_EXCLUSIVE)));
    assert_eq!(write_status(&mut b, 20), CONFLICT);
    // And changes flow both ways again (node 1's ALUA report changed: 2A/06 first).
    a.clear_unit_attentions();
    assert_eq!(prout(&mut a, 2, WRITE_EXCLUSIVE, 0xAA, 0), 0);
    assert_eq!(write_status(&mut b, 20), 0);
    assert_eq!(read_reservation(&mut b), None);
}

#[test]
fn an_spc2_reservation_through_one_node_binds_the_other_until_logout() {
    let etcd = Etcd::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let [p1, p2, r1, r2] = lanes_test_support::ports::free_ports();
    let (portals, repl) = ([p1, p2], [r1, r2]);
    let node1 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 1));
    let node2 = TestServer::start(&pair_toml(&d, etcd.client, portals, repl, 2));
    wait_role(&node1, "Paired");
    wait_role(&node2, "Paired");
    let mut a = host(node1.portals[0].1, "iqn.2026-01.test:host-a", 1);
    let mut b = host(node2.portals[0].1, "iqn.2026-01.test:host-b", 2);
    a.clear_unit_attentions();
    b.clear_unit_attentions();
    let reserve6 = |c: &mut Conn| c.scsi(&[0x16, 0, 0, 0, 0, 0], 0, None).unwrap().status;
    let release6 = |c: &mut Conn| c.scsi(&[0x17, 0, 0, 0, 0, 0], 0, None).unwrap().status;
    assert_eq!(reserve6(&mut a), 0);
    assert_eq!(write_status(&mut b, 30), CONFLICT);
    assert_eq!(reserve6(&mut b), CONFLICT);
    assert_eq!(write_status(&mut a, 30), 0);
    // RELEASE through node 1 frees it for host B on node 2, whose RESERVE binds host A.
    assert_eq!(release6(&mut a), 0);
    assert_eq!(reserve6(&mut b), 0);
    assert_eq!(write_status(&mut a, 31), CONFLICT);
    // Host B logs out: the I_T nexus is gone, and with it the reservation, on both nodes.
    assert_eq!(b.logout(0, b.cid), 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while write_status(&mut a, 31) == CONFLICT {
        assert!(
            Instant::now() < deadline,
            "host B's reservation outlived its logout"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(reserve6(&mut a), 0);
}
