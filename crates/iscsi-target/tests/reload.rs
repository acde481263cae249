//! Live reconfiguration over real sockets: sessions stay logged in across a reload, LUN and
//! capacity changes reach every I_T nexus once as unit attentions, CHAP and ACL changes end
//! only the sessions that lost access, portals come and go, and a bad reload changes nothing.

mod support;

use std::time::Duration;
use support::*;

const OTHER: &str = "iqn.2026-01.test.lanes:other";
const SECRET: &str = "first secret, 12+";

/// A configuration: portal group 1 on 127.0.0.1, target TARGET with `luns` (`[[target.lun]]`
/// tables) and `extra` keys, and a second target OTHER with one LUN.
fn config(extra: &str, luns: &str) -> String {
    format!(
        r#"
[server]
data-dir = "{{dir}}/data"
nop-interval = "30s"
nop-timeout = "120s"

[[portal-group]]
tag = 1
portals = ["127.0.0.1:0"]

[[target]]
name = "{TARGET}"
{extra}
{luns}

[[target]]
name = "{OTHER}"

[[target.lun]]
path = "{{dir}}/other.img"
size = "1M"
"#
    )
}

fn lun(number: u64, size: &str) -> String {
    format!(
        "[[target.lun]]\nlun = {number}\npath = \"{{dir}}/lun{number}.img\"\nsize = \"{size}\"\n"
    )
}

fn two_luns() -> String {
    lun(0, "16M") + &lun(1, "16M")
}

/// The LUN field of a command to LUN `lun` (SAM-5 peripheral device addressing).
fn lun_field(lun: u64) -> u64 {
    lun << 48
}

/// A command to `lun` on `c`, run to completion.
fn on_lun(c: &mut Conn, lun: u64, cdb: &[u8], edtl: u32) -> ScsiResult {
    let cmd_sn = c.cmd_sn;
    c.cmd_sn = c.cmd_sn.wrapping_add(1);
    let itt = c.itt();
    c.send_scsi(itt, cmd_sn, lun_field(lun), cdb, edtl, None);
    c.complete_scsi(itt, None)
        .unwrap_or_else(|e| panic!("command to LUN {lun}: {e}"))
}

fn tur(c: &mut Conn, lun: u64) -> Option<(u8, u8, u8)> {
    let r = on_lun(c, lun, &[0u8; 6], 0);
    assert!(r.status == 0 || r.sense_triplet().is_some(), "{r:?}");
    r.sense_triplet()
}

/// LUN numbers from REPORT LUNS.
fn report_luns(c: &mut Conn) -> Vec<u64> {
    let r = on_lun(c, 0, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256);
    assert_eq!(r.status, 0);
    let len = u32::from_be_bytes(r.data[..4].try_into().unwrap()) as usize;
    r.data[8..8 + len]
        .chunks(8)
        .map(|l| u64::from(u16::from_be_bytes([l[0] & 0x3f, l[1]])))
        .collect()
}

/// (last LBA, block size) from READ CAPACITY(16).
fn capacity(c: &mut Conn, lun: u64) -> (u64, u32) {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x9E;
    cdb[1] = 0x10;
    cdb[13] = 32;
    let r = on_lun(c, lun, &cdb, 32);
    assert_eq!(r.status, 0, "READ CAPACITY(16): {:?}", r.sense_triplet());
    (
        u64::from_be_bytes(r.data[..8].try_into().unwrap()),
        u32::from_be_bytes(r.data[8..12].try_into().unwrap()),
    )
}

fn session(addr: std::net::SocketAddr, isid_last: u8) -> Conn {
    let opts = LoginOpts {
        isid: [0x80, 0, 0, 0x12, 0x34, isid_last],
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(addr, &opts);
    for l in report_luns(&mut c) {
        // The power-on unit attention is per LU: clear it on every LU.
        while tur(&mut c, l).is_some() {}
    }
    c
}

const REPORTED_LUNS_CHANGED: Option<(u8, u8, u8)> = Some((6, 0x3F, 0x0E));
const CAPACITY_CHANGED: Option<(u8, u8, u8)> = Some((6, 0x2A, 0x09));

#[test]
fn an_added_lun_is_announced_once_per_session_and_sessions_stay() {
    let server = TestServer::start_file(&config("", &lun(0, "16M")));
    let mut a = session(server.addr(), 1);
    let mut b = session(server.addr(), 2);
    a.write10(8, &pattern(1, 4096));
    server.rewrite(&config("", &two_luns()));
    let report = server.reload().expect("reload");
    assert_eq!(
        report
            .changes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [format!(
            "{TARGET}: LUN 1 added ({}/lun1.img)",
            server.dir.path().display()
        )]
    );
    assert_eq!(report.sessions_ended, 0);
    // Session a learns it on LUN 0, b on the new LUN 1; each exactly once.
    assert_eq!(tur(&mut a, 0), REPORTED_LUNS_CHANGED);
    assert_eq!(tur(&mut a, 0), None);
    assert_eq!(tur(&mut a, 1), None);
    assert_eq!(tur(&mut b, 1), REPORTED_LUNS_CHANGED);
    assert_eq!(tur(&mut b, 1), None);
    assert_eq!(tur(&mut b, 0), None);
    for c in [&mut a, &mut b] {
        assert_eq!(report_luns(c), [0, 1]);
        assert_eq!(capacity(c, 1), ((16 << 20) / 512 - 1, 512));
    }
    // The same connections carry on, data intact.
    assert_eq!(a.read10(8, 8), pattern(1, 4096));
    assert_eq!(b.read10(8, 8), pattern(1, 4096));
}

#[test]
fn a_removed_lun_answers_logical_unit_not_supported() {
    let server = TestServer::start_file(&config("", &two_luns()));
    let mut c = session(server.addr(), 1);
    // Commands in flight on LUN 1 while it goes: each ends, with data or with 25/00.
    let mut itts = Vec::new();
    for i in 0..16u32 {
        let cmd_sn = c.cmd_sn;
        c.cmd_sn = c.cmd_sn.wrapping_add(1);
        let itt = c.itt();
        c.send_scsi(
            itt,
            cmd_sn,
            lun_field(1),
            &cdb_read10(i * 128, 128),
            128 * 512,
            None,
        );
        itts.push(itt);
    }
    server.rewrite(&config("", &lun(0, "16M")));
    let report = server.reload().expect("reload");
    assert_eq!(report.changes.len(), 1, "{:?}", report.changes);
    for itt in itts {
        let r = c.complete_scsi(itt, None).expect("in-flight command ends");
        assert!(
            r.status == 0 || r.sense_triplet() == Some((5, 0x25, 0)),
            "{r:?}"
        );
    }
    assert_eq!(tur(&mut c, 0), REPORTED_LUNS_CHANGED);
    assert_eq!(tur(&mut c, 1), Some((5, 0x25, 0)));
    let r = on_lun(&mut c, 1, &cdb_read10(0, 1), 512);
    assert_eq!(r.sense_triplet(), Some((5, 0x25, 0)));
    assert_eq!(report_luns(&mut c), [0]);
    assert_eq!(tur(&mut c, 0), None);
}

#[test]
fn a_grown_lun_reports_its_new_capacity_on_both_paths() {
    let two_portals = |luns: &str| {
        config("", luns).replace(
            "portals = [\"127.0.0.1:0\"]",
            "portals = [\"127.0.0.1:0\", \"127.0.0.2:0\"]",
        )
    };
    let server = TestServer::start_file(&two_portals(&lun(0, "16M")));
    let listening = server.listening();
    assert_eq!(listening.len(), 2);
    let mut paths: Vec<Conn> = listening
        .iter()
        .enumerate()
        .map(|(i, (_, addr))| {
            let opts = LoginOpts {
                isid: [0x80, 0, 0, 0x12, 0x34, i as u8 + 1],
                ..LoginOpts::normal()
            };
            Conn::login_to(*addr, &opts)
        })
        .collect();
    for c in &mut paths {
        assert_eq!(capacity(c, 0).0, (16 << 20) / 512 - 1);
    }
    server.rewrite(&two_portals(&lun(0, "48M")));
    let report = server.reload().expect("reload");
    assert_eq!(
        report
            .changes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [format!("{TARGET}: LUN 0 grown to {} bytes", 48 << 20)]
    );
    assert_eq!(
        std::fs::metadata(server.dir.path().join("lun0.img"))
            .unwrap()
            .len(),
        48 << 20
    );
    for c in &mut paths {
        assert_eq!(tur(c, 0), CAPACITY_CHANGED);
        assert_eq!(tur(c, 0), None);
        assert_eq!(capacity(c, 0), ((48 << 20) / 512 - 1, 512));
    }
    // The new space is usable from either path.
    let lba = (40 << 20) / 512;
    paths[0].write10(lba, &pattern(9, 8192));
    assert_eq!(paths[1].read10(lba, 16), pattern(9, 8192));
}

fn chap_config(secret: &str) -> String {
    config(
        &format!("[target.chap]\nuser = \"host1\"\nsecret = \"{secret}\"\n"),
        &lun(0, "16M"),
    )
}

fn chap_login(secret: &str) -> LoginOpts {
    LoginOpts {
        chap: Some(Chap {
            user: "host1".into(),
            secret: secret.as_bytes().to_vec(),
            algorithm: 5,
            mutual: None,
        }),
        ..LoginOpts::normal()
    }
}

#[test]
fn a_chap_secret_change_ends_only_the_affected_session() {
    let server = TestServer::start_file(&chap_config(SECRET));
    let mut protected = Conn::login_to(server.addr(), &chap_login(SECRET));
    let mut other = Conn::login_to(
        server.addr(),
        &LoginOpts {
            target: Some(OTHER.into()),
            ..LoginOpts::normal()
        },
    );
    server.rewrite(&chap_config("second secret, 12+"));
    let report = server.reload().expect("reload");
    assert_eq!(report.sessions_ended, 1, "{report:?}");
    let (closed, _) = protected.wait_closed(TIMEOUT);
    assert!(closed, "the session authenticated with the old secret ends");
    assert_eq!(other.tur(), (0, None), "the other target's session stays");
    let mut old = Conn::connect(server.addr());
    assert_eq!(
        old.login(&chap_login(SECRET)).unwrap_err(),
        LoginError::Status(2, 1)
    );
    let mut again = Conn::login_to(server.addr(), &chap_login("second secret, 12+"));
    assert_eq!(again.tur(), (0, None));
}

#[test]
fn an_acl_change_ends_only_the_sessions_that_lost_access() {
    let acl = |names: &str| config(&format!("acl = [{names}]"), &lun(0, "16M"));
    let kept = "iqn.2026-01.test.lanes:kept";
    let server = TestServer::start_file(&acl(&format!("\"{INITIATOR}\", \"{kept}\"")));
    let mut dropped = Conn::login_to(server.addr(), &LoginOpts::normal());
    let mut stays = Conn::login_to(
        server.addr(),
        &LoginOpts {
            initiator: kept.into(),
            ..LoginOpts::normal()
        },
    );
    server.rewrite(&acl(&format!("\"{kept}\"")));
    let report = server.reload().expect("reload");
    assert_eq!(report.sessions_ended, 1);
    assert!(
        dropped.wait_closed(TIMEOUT).0,
        "the session that lost access ends"
    );
    assert_eq!(stays.tur(), (0, None));
    let mut refused = Conn::connect(server.addr());
    assert_eq!(
        refused.login(&LoginOpts::normal()).unwrap_err(),
        LoginError::Status(2, 2)
    );
}

#[test]
fn a_bad_reload_changes_nothing() {
    let server = TestServer::start_file(&config("", &two_luns()));
    let mut c = session(server.addr(), 1);
    let before = server.running_config();

    // Does not validate: file, line, column and key.
    let bad = config("", &(two_luns() + "block-size = 1000\n"));
    server.rewrite(&bad);
    let e = server.reload().unwrap_err().to_string();
    let line = bad.lines().position(|l| l.contains("1000")).unwrap() + 1;
    let file = server.dir.path().join("lanes.toml");
    assert!(
        e.starts_with(&format!(
            "{}:{line}:14: target[0].lun[1].block-size: must be 512 or 4096",
            file.display()
        )),
        "{e}"
    );

    // Validates, but only a restart could apply it; the LUN added alongside is not added.
    let not_live = config(
        "",
        &(lun(0, "16M") + &lun(1, "16M") + "block-size = 4096\n" + &lun(2, "1M")),
    );
    server.rewrite(&not_live);
    let e = server.reload().unwrap_err();
    assert_eq!(e.key(), Some("target[0].lun[1].block-size"));
    assert!(
        e.to_string().starts_with(&format!(
            "{}: target[0].lun[1].block-size: the block size (512 -> 4096)",
            file.display()
        )),
        "{e}"
    );

    // A portal that cannot be bound: refused before anything else is applied.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = config("", &(two_luns() + &lun(2, "1M"))).replace(
        "portals = [\"127.0.0.1:0\"]",
        &format!(
            "portals = [\"127.0.0.1:0\", \"{}\"]",
            taken.local_addr().unwrap()
        ),
    );
    server.rewrite(&busy);
    let e = server.reload().unwrap_err();
    assert_eq!(e.key(), Some("portal-group[0].portals[1]"), "{e}");

    // A backing file that cannot be opened, after a LUN was grown and another added in the
    // same reload: the new file is removed and the grown one cut back.
    std::fs::create_dir(server.dir.path().join("lun3.img")).unwrap();
    let late = config(
        "",
        &(lun(0, "32M") + &lun(1, "16M") + &lun(2, "1M") + &lun(3, "1M")),
    );
    server.rewrite(&late);
    let e = server.reload().unwrap_err();
    assert_eq!(e.key(), Some("target[0].lun[3].path"), "{e}");
    let lun0 = std::fs::metadata(server.dir.path().join("lun0.img")).unwrap();
    assert_eq!(lun0.len(), 16 << 20, "the grown file is cut back");

    assert_eq!(server.running_config(), before);
    assert!(!server.dir.path().join("lun2.img").exists());
    // Same session, same LUNs, no unit attention.
    assert_eq!(tur(&mut c, 0), None);
    assert_eq!(tur(&mut c, 1), None);
    assert_eq!(report_luns(&mut c), [0, 1]);
}

#[test]
fn portals_come_and_go() {
    // The first portal on a loopback address of its own: once it is removed, no listener of
    // another test running meanwhile can take its port and answer there.
    let only_first = config("", &lun(0, "16M")).replace(
        "portals = [\"127.0.0.1:0\"]",
        "portals = [\"127.0.0.61:0\"]",
    );
    let server = TestServer::start_file(&only_first);
    let first = server.addr();
    assert_eq!(first.ip().to_string(), "127.0.0.61");
    let mut old = session(server.addr(), 1);
    let with_second = only_first.replace(
        "portals = [\"127.0.0.61:0\"]",
        "portals = [\"127.0.0.61:0\", \"127.0.0.2:0\"]",
    );
    server.rewrite(&with_second);
    let report = server.reload().expect("reload");
    assert_eq!(report.changes.len(), 1, "{:?}", report.changes);
    let second = server
        .listening()
        .into_iter()
        .map(|(_, a)| a)
        .find(|a| a.ip().to_string() == "127.0.0.2")
        .expect("second portal listening");
    let mut new = session(second, 2);
    assert_eq!(new.tur(), (0, None));
    // Remove the first portal: its session ends, the one on the second portal stays.
    server.rewrite(&with_second.replace("\"127.0.0.61:0\", ", ""));
    let report = server.reload().expect("reload");
    assert_eq!(report.connections_ended, 1, "{report:?}");
    assert!(old.wait_closed(TIMEOUT).0);
    assert_eq!(new.tur(), (0, None));
    assert!(!server.listening().iter().any(|(_, a)| *a == first));
    assert!(std::net::TcpStream::connect_timeout(&first, Duration::from_secs(5)).is_err());
}

#[test]
fn an_alua_change_raises_asymmetric_access_state_changed() {
    let server = TestServer::start_file(&config("", &lun(0, "16M")));
    let mut c = session(server.addr(), 1);
    let standby = config("", &lun(0, "16M")).replace(
        "portals = [\"127.0.0.1:0\"]",
        "portals = [\"127.0.0.1:0\"]\nalua = \"standby\"",
    );
    server.rewrite(&standby);
    server.reload().expect("reload");
    assert_eq!(tur(&mut c, 0), Some((6, 0x2A, 0x06)));
    let r = on_lun(&mut c, 0, &cdb_read10(0, 1), 512);
    assert_eq!(
        r.sense_triplet(),
        Some((2, 0x04, 0x0B)),
        "standby: NOT READY"
    );
    server.rewrite(&config("", &lun(0, "16M")));
    server.reload().expect("reload");
    assert_eq!(tur(&mut c, 0), Some((6, 0x2A, 0x06)));
    assert_eq!(c.read10(0, 1).len(), 512);
}

#[test]
fn a_server_without_a_file_cannot_reload() {
    let server = TestServer::simple("");
    let e = server.reload().unwrap_err().to_string();
    assert!(e.contains("without --config"), "{e}");
}

#[test]
fn a_backing_file_grown_outside_is_picked_up_by_a_reload() {
    let server = TestServer::start_file(&config("", &lun(0, "16M")));
    let mut c = session(server.addr(), 1);
    // Without `size` the LUN exports its file; the administrator extends the file.
    let without_size = lun(0, "16M").replace("size = \"16M\"\n", "");
    server.rewrite(&config("", &without_size));
    assert_eq!(server.reload().expect("reload").changes, []);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(server.dir.path().join("lun0.img"))
        .unwrap();
    file.set_len((24 << 20) + 100).unwrap();
    let report = server.reload().expect("reload");
    assert_eq!(
        report
            .changes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [format!("{TARGET}: LUN 0 grown to {} bytes", 24 << 20)],
        "whole blocks only"
    );
    assert_eq!(tur(&mut c, 0), CAPACITY_CHANGED);
    assert_eq!(capacity(&mut c, 0).0, (24 << 20) / 512 - 1);
}

#[test]
fn io_carries_on_through_repeated_reloads() {
    let server = TestServer::start_file(&config("", &lun(0, "16M")));
    let mut c = session(server.addr(), 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let io = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut done, mut reported) = (0u32, 0u32);
            let mut lba = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || done == 0 {
                let data = pattern(u64::from(lba), 4096);
                // Any command may be the one that reports an inventory change (another
                // reload may land before the retry).
                let mut run = |cdb: &[u8], edtl, write: Option<&[u8]>| loop {
                    let r = c.scsi(cdb, edtl, write).expect("command");
                    if r.status == 0 {
                        return r;
                    }
                    assert_eq!(r.sense_triplet(), REPORTED_LUNS_CHANGED, "lba {lba}");
                    reported += 1;
                    assert!(reported <= 20, "more reports than reloads");
                };
                run(&cdb_write10(lba, 8, 0), 4096, Some(&data));
                assert_eq!(run(&cdb_read10(lba, 8), 4096, None).data, data);
                lba = (lba + 8) % 30000;
                done += 1;
            }
            (done, reported)
        })
    };
    for _ in 0..10 {
        server.rewrite(&config("", &two_luns()));
        assert_eq!(server.reload().expect("add").changes.len(), 1);
        server.rewrite(&config("", &lun(0, "16M")));
        assert_eq!(server.reload().expect("remove").changes.len(), 1);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (done, reported) = io.join().expect("no I/O error during reloads");
    assert!(
        done > 0 && reported > 0,
        "{done} writes, {reported} reports"
    );
}

fn admin(server: &TestServer, request: &str) -> serde_json::Value {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(server.status_socket()).expect("socket");
    s.write_all(request.as_bytes()).unwrap();
    s.write_all(b"\n").unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).expect("JSON reply")
}

#[test]
fn the_status_socket_reloads_and_shows_what_runs() {
    let server = TestServer::start_file(&config("", &lun(0, "16M")));
    let mut c = session(server.addr(), 1);
    // `lanes alua` changes the running state; the running configuration says so.
    let reply = admin(&server, r#"{"cmd":"alua","group":1,"state":"standby"}"#);
    assert_eq!(reply["ok"], true, "{reply}");
    assert_eq!(tur(&mut c, 0), Some((6, 0x2A, 0x06)));
    let shown = admin(&server, r#"{"cmd":"config"}"#);
    let toml = shown["toml"].as_str().expect("toml");
    assert!(toml.contains("alua = \"standby\""), "{toml}");
    let parsed = lanes_iscsi_target::config::ServeConfig::from_toml_str(
        toml,
        &server.dir.path().join("shown.toml"),
    )
    .unwrap();
    assert_eq!(parsed, server.running_config());
    // A reload makes the server what the file says again.
    let reply = admin(&server, r#"{"cmd":"reload"}"#);
    assert_eq!(
        reply["changes"],
        serde_json::json!(["portal group 1: ALUA standby -> active-optimized"]),
        "{reply}"
    );
    assert_eq!(tur(&mut c, 0), Some((6, 0x2A, 0x06)));
    assert_eq!(c.read10(0, 1).len(), 512);
    // A refused reload answers with the error and its key.
    server.rewrite(&config("", &lun(0, "8M")));
    let reply = admin(&server, r#"{"cmd":"reload"}"#);
    assert_eq!(reply["key"], "target[0].lun[0].size", "{reply}");
    assert!(
        reply["error"].as_str().unwrap().contains("shrink"),
        "{reply}"
    );
}
