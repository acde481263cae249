//! `[limits]` over real sockets: the login timeout, connection and session limits, the CmdSN
//! window, text negotiation bounds, and data beyond the negotiated bursts.

mod support;

use bytes::Bytes;
use iscsi_proto::pdu::*;
use std::io::Write;
use std::time::{Duration, Instant};
use support::*;

fn server_with(limits: &str) -> TestServer {
    TestServer::start(&format!("{}\n[limits]\n{limits}\n", simple_toml("")))
}

fn opts_with_isid(last: u8) -> LoginOpts {
    LoginOpts {
        isid: [0x80, 0, 0, 0x12, 0x34, last],
        ..LoginOpts::normal()
    }
}

/// A Login Request as bytes, for peers that send it slowly or not at all.
fn login_request_bytes(keys: &[(String, String)]) -> Vec<u8> {
    Framer::default().encode_to_vec(&Pdu::LoginRequest(LoginRequest {
        transit: true,
        csg: 0,
        nsg: 1,
        isid: [0x80, 0, 0, 0, 0, 9],
        itt: 1,
        cid: 1,
        cmd_sn: 1,
        data: iscsi_proto::text::encode(keys),
        ..LoginRequest::default()
    }))
}

#[test]
fn silent_and_slow_logins_are_dropped_at_the_login_timeout() {
    let server = server_with("login-timeout = \"1s\"");
    let mut established = Conn::login_to(server.addr(), &LoginOpts::normal());
    let start = Instant::now();
    let mut silent = Conn::connect(server.addr());
    let mut slow = Conn::connect(server.addr());
    let bytes = login_request_bytes(&[("InitiatorName".into(), INITIATOR.into())]);
    // One byte per 100 ms: a valid Login Request that would take 5 s to arrive. Writes start
    // failing once the target has closed the connection.
    let mut slow_closed = None;
    for b in bytes.iter().cycle() {
        if slow.stream.write_all(&[*b]).is_err() {
            slow_closed = Some(start.elapsed());
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "slow login never dropped"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (closed, _) = silent.wait_closed(Duration::from_secs(10));
    let silent_closed = start.elapsed();
    assert!(closed, "silent connection never dropped");
    let slow_closed = slow_closed.expect("slow connection dropped");
    eprintln!("silent dropped after {silent_closed:?}, slow after {slow_closed:?}");
    assert!(
        silent_closed >= Duration::from_millis(900),
        "{silent_closed:?}"
    );
    assert!(slow_closed >= Duration::from_millis(900), "{slow_closed:?}");
    assert!(silent_closed < Duration::from_secs(5), "{silent_closed:?}");
    assert_eq!(
        established.tur().0,
        0,
        "the established session is untouched"
    );
}

#[test]
fn connections_over_the_portal_limit_are_closed_at_once() {
    let server = server_with("connections-per-portal = 3");
    let mut established = Conn::login_to(server.addr(), &LoginOpts::normal());
    let idle = Conn::connect(server.addr());
    let _idle2 = Conn::connect(server.addr());
    let mut over = Conn::connect(server.addr());
    let started = Instant::now();
    let (closed, _) = over.wait_closed(Duration::from_secs(5));
    assert!(closed, "the fourth connection is closed");
    assert!(started.elapsed() < Duration::from_secs(2), "closed at once");
    assert_eq!(
        established.tur().0,
        0,
        "the established session keeps working"
    );
    // Once a connection ends there is room again.
    drop(idle);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut c = Conn::connect(server.addr());
        if c.login(&opts_with_isid(2)).is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no room after a connection ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sessions_per_initiator_are_bounded() {
    let server = server_with("sessions-per-initiator = 2");
    let _a = Conn::login_to(server.addr(), &opts_with_isid(1));
    let _b = Conn::login_to(server.addr(), &opts_with_isid(2));
    let mut c = Conn::connect(server.addr());
    assert_eq!(
        c.login(&opts_with_isid(3)).err(),
        Some(LoginError::Status(0x03, 0x02)),
        "out of resources"
    );
    let other = LoginOpts {
        initiator: "iqn.2026-01.test.lanes:other".into(),
        ..opts_with_isid(3)
    };
    let _d = Conn::login_to(server.addr(), &other);
    // Reinstating one of the two (same ISID) is not a third session.
    let _a2 = Conn::login_to(server.addr(), &opts_with_isid(1));
}

#[test]
fn the_cmdsn_window_is_commands_per_session() {
    let server = server_with("commands-per-session = 8");
    // The final Login Response offers the window with nothing in flight (read before any
    // command: `login_to` would clear unit attentions with TEST UNIT READYs first, whose
    // responses may be built while their own command still holds a slot).
    let mut c = Conn::connect(server.addr());
    c.login(&LoginOpts::normal()).expect("login");
    let window = c.max_cmd_sn.wrapping_sub(c.exp_cmd_sn).wrapping_add(1);
    assert_eq!(window, 8, "MaxCmdSN - ExpCmdSN + 1 at login");
    c.clear_unit_attentions();
    assert_eq!(c.tur().0, 0);
    // A response may be built while its own command still holds a slot: never more than 8.
    let window = c.max_cmd_sn.wrapping_sub(c.exp_cmd_sn).wrapping_add(1);
    assert!(
        (7..=8).contains(&window),
        "MaxCmdSN - ExpCmdSN + 1 = {window}"
    );
}

#[test]
fn an_endless_text_exchange_is_reset() {
    let server = server_with("text-rounds = 4");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let itt = c.itt();
    for round in 1..=5 {
        let cmd_sn = c.cmd_sn;
        c.cmd_sn = c.cmd_sn.wrapping_add(1);
        c.send(&Pdu::TextRequest(TextRequest {
            continue_bit: true,
            itt,
            ttt: RESERVED_TAG,
            cmd_sn,
            exp_stat_sn: c.exp_stat_sn,
            data: Bytes::from_static(b"X-lanes-pad=abc\0"),
            ..TextRequest::default()
        }));
        let answer = c
            .wait_for(|p| {
                matches!(p, Pdu::TextResponse(r) if r.itt == itt) || matches!(p, Pdu::Reject(_))
            })
            .expect("an answer");
        match (round, answer) {
            (1..=4, Pdu::TextResponse(r)) => assert!(!r.final_bit, "acknowledged, not final"),
            (5, Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::NEGOTIATION_RESET),
            (round, other) => panic!("round {round}: {other:?}"),
        }
    }
    assert_eq!(c.tur().0, 0, "the session keeps working");
    let targets = c.text(b"SendTargets=All\0");
    assert!(targets
        .iter()
        .any(|(k, v)| k == "TargetName" && v == TARGET));
}

#[test]
fn a_login_with_too_many_keys_fails() {
    let server = server_with("text-keys = 16");
    let mut keys = vec![("InitiatorName".to_string(), INITIATOR.to_string())];
    keys.extend((0..40).map(|i| (format!("X-lanes-k{i}"), "v".to_string())));
    let mut c = Conn::connect(server.addr());
    c.send_raw(&login_request_bytes(&keys)).expect("send");
    match c.recv_raw(TIMEOUT) {
        Ok(Pdu::LoginResponse(r)) => {
            assert_eq!(
                (r.status_class, r.status_detail),
                (0x02, 0x00),
                "initiator error"
            )
        }
        other => panic!("expected a login failure, got {other:?}"),
    }
    assert!(c.wait_closed(TIMEOUT).0, "closed after the failure");
    // Fewer keys log in fine.
    let _ok = Conn::login_to(server.addr(), &LoginOpts::normal());
}

/// (sense key, ASC, ASCQ) of a SCSI Response's sense data (after its length prefix).
/// Sends WRITE(10) of `blocks` blocks at LBA 0 declaring `expected` bytes, F bit `final_bit`,
/// with `data` as immediate data, at the next CmdSN; returns its ITT.
fn write10(c: &mut Conn, blocks: u16, expected: u32, final_bit: bool, data: Vec<u8>) -> u32 {
    let itt = c.itt();
    let cmd_sn = c.cmd_sn;
    c.cmd_sn = c.cmd_sn.wrapping_add(1);
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&cdb_write10(0, blocks, 0));
    c.send(&Pdu::ScsiCommand(ScsiCommand {
        final_bit,
        write: true,
        attr: task_attr::SIMPLE,
        itt,
        expected_data_length: expected,
        cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        cdb,
        data: Bytes::from(data),
        ..ScsiCommand::default()
    }));
    itt
}

/// Waits for the response to `itt`: CHECK CONDITION with `sense` (key, ASC, ASCQ).
fn expect_check_condition(c: &mut Conn, itt: u32, sense: (u8, u8, u8)) {
    match c.wait_for(|p| matches!(p, Pdu::ScsiResponse(r) if r.itt == itt)) {
        Ok(Pdu::ScsiResponse(r)) => {
            assert_eq!(r.status, 2, "CHECK CONDITION");
            assert_eq!(sense_of(&r), sense);
        }
        other => panic!("{other:?}"),
    }
}

fn sense_of(r: &ScsiResponse) -> (u8, u8, u8) {
    let d = &r.data;
    assert!(d.len() >= 16, "sense data in {r:?}");
    (d[4] & 0x0f, d[14], d[15])
}

#[test]
fn immediate_data_beyond_first_burst_length_is_unexpected_unsolicited_data() {
    let server = TestServer::simple("");
    let opts = LoginOpts {
        first_burst: 16384,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert_eq!(c.first_burst, 16384);
    let itt = write10(&mut c, 64, 32768, true, pattern(1, 32768));
    expect_check_condition(&mut c, itt, (0x0b, 0x0c, 0x0c));
    assert_eq!(c.read10(0, 64), vec![0u8; 32768], "nothing written");
}

#[test]
fn unsolicited_data_out_beyond_first_burst_length_is_rejected() {
    let server = TestServer::simple("");
    let opts = LoginOpts {
        first_burst: 16384,
        immediate_data: false,
        initial_r2t: false,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert!(!c.initial_r2t);
    let itt = write10(&mut c, 128, 65536, false, Vec::new());
    // 32 KiB unsolicited where FirstBurstLength allows 16 KiB.
    c.send(&Pdu::DataOut(DataOut {
        final_bit: true,
        itt,
        ttt: RESERVED_TAG,
        exp_stat_sn: c.exp_stat_sn,
        data: Bytes::from(pattern(2, 32768)),
        ..DataOut::default()
    }));
    match c.wait_for(|p| matches!(p, Pdu::Reject(_))) {
        Ok(Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        other => panic!("expected Reject, got {other:?}"),
    }
    expect_check_condition(&mut c, itt, (0x0b, 0x0c, 0x0c));
    assert_eq!(c.read10(0, 128), vec![0u8; 65536], "nothing written");
}

#[test]
fn immediate_commands_beyond_the_window_are_rejected() {
    let server = server_with("commands-per-session = 2");
    let opts = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    // Immediate writes whose data never comes stay in flight; 2 x commands-per-session may.
    for n in 0..5u32 {
        let itt = c.itt();
        let mut cdb = [0u8; 16];
        cdb[..10].copy_from_slice(&cdb_write10(n * 8, 1, 0));
        c.send(&Pdu::ScsiCommand(ScsiCommand {
            immediate: true,
            final_bit: true,
            write: true,
            attr: task_attr::SIMPLE,
            itt,
            expected_data_length: 512,
            cmd_sn: c.cmd_sn,
            exp_stat_sn: c.exp_stat_sn,
            cdb,
            ..ScsiCommand::default()
        }));
        let answer = c
            .wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == itt) || matches!(p, Pdu::Reject(_)))
            .expect("an answer");
        match (n, answer) {
            (0..=3, Pdu::R2t(_)) => {}
            (4, Pdu::Reject(r)) => {
                assert_eq!(r.reason, reject_reason::IMMEDIATE_COMMAND_REJECT)
            }
            (n, other) => panic!("command {n}: {other:?}"),
        }
    }
}

/// Commands the server has read on the session's first connection (its status socket).
fn commands_read(server: &TestServer) -> u64 {
    use std::io::{BufRead, BufReader};
    let mut s = std::os::unix::net::UnixStream::connect(server.status_socket()).expect("status");
    s.write_all(b"{\"cmd\":\"status\"}\n").expect("request");
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("reply");
    let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    v["sessions"][0]["connections"][0]["commands"]
        .as_u64()
        .expect("commands")
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// A peer that sends READs and never reads the answers: the CmdSN window reopens as answers are
/// queued, so without `send-backlog` the target would queue them without bound. It stops
/// reading that connection instead, and memory stays bounded.
#[test]
fn a_peer_that_reads_nothing_stops_being_read() {
    const COMMANDS: u32 = 20_000;
    const BLOCKS: u16 = 64; // 32 KiB each: 625 MiB if every answer were queued
    let server = server_with("send-backlog = \"1M\"\ncommands-per-session = 16");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let before = rss_kib();
    c.stream
        .set_write_timeout(Some(Duration::from_millis(500)))
        .expect("write timeout");
    let mut batch = Vec::new();
    let mut sent = 0u32;
    'send: while sent < COMMANDS {
        batch.clear();
        for _ in 0..500 {
            let itt = c.itt();
            let mut cdb = [0u8; 16];
            cdb[..10].copy_from_slice(&cdb_read10(u32::from(BLOCKS) * (sent % 256), BLOCKS));
            batch.extend(c.framer.encode_to_vec(&Pdu::ScsiCommand(ScsiCommand {
                final_bit: true,
                read: true,
                attr: task_attr::SIMPLE,
                itt,
                expected_data_length: u32::from(BLOCKS) * 512,
                cmd_sn: c.cmd_sn,
                exp_stat_sn: c.exp_stat_sn,
                cdb,
                ..ScsiCommand::default()
            })));
            c.cmd_sn = c.cmd_sn.wrapping_add(1);
            sent += 1;
        }
        if c.stream.write_all(&batch).is_err() {
            break 'send; // the target stopped reading and the socket buffers are full
        }
    }
    // Wait until the target has stopped reading (its count holds still), with a deadline.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut read = commands_read(&server);
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = commands_read(&server);
        if now == read || u64::from(COMMANDS) == now {
            break;
        }
        read = now;
        assert!(
            Instant::now() < deadline,
            "the target never stopped reading"
        );
    }
    let grown = rss_kib().saturating_sub(before);
    eprintln!("sent {sent} READs, the target read {read}; RSS grew by {grown} KiB");
    assert!(read < u64::from(COMMANDS), "the target read every command");
    assert!(grown < 128 * 1024, "RSS grew by {grown} KiB");
    // Another session is served meanwhile.
    let mut other = Conn::login_to(server.addr(), &opts_with_isid(7));
    assert_eq!(other.tur().0, 0);
}

/// Data is solicited only for a write whose CmdSN turn has come: behind a gap in CmdSN order a
/// peer cannot make the target collect the data of a whole window of writes.
#[test]
fn no_r2t_before_the_command_turn() {
    let server = TestServer::simple("");
    let opts = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    let gap = c.cmd_sn;
    let itt = c.itt();
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&cdb_write10(0, 8, 0));
    c.send(&Pdu::ScsiCommand(ScsiCommand {
        final_bit: true,
        write: true,
        attr: task_attr::SIMPLE,
        itt,
        expected_data_length: 4096,
        cmd_sn: gap.wrapping_add(1),
        exp_stat_sn: c.exp_stat_sn,
        cdb,
        ..ScsiCommand::default()
    }));
    // A NOP-Out answered proves the write has been read and is parked behind the gap.
    let ping_itt = c.itt();
    c.send(&Pdu::NopOut(NopOut {
        immediate: true,
        itt: ping_itt,
        ttt: RESERVED_TAG,
        cmd_sn: gap,
        exp_stat_sn: c.exp_stat_sn,
        ..NopOut::default()
    }));
    match c
        .wait_for(|p| matches!(p, Pdu::NopIn(n) if n.itt == ping_itt) || matches!(p, Pdu::R2t(_)))
    {
        Ok(Pdu::NopIn(_)) => {}
        other => panic!("expected only the ping's answer, got {other:?}"),
    }
    // Filling the gap releases the write, which is then solicited.
    let fill_itt = c.itt();
    c.send(&Pdu::NopOut(NopOut {
        itt: fill_itt,
        ttt: RESERVED_TAG,
        cmd_sn: gap,
        exp_stat_sn: c.exp_stat_sn,
        ..NopOut::default()
    }));
    match c.wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == itt)) {
        Ok(Pdu::R2t(r)) => assert_eq!(r.desired_length, 4096),
        other => panic!("expected the R2T, got {other:?}"),
    }
}

/// A login that never moves on (T=0 for ever) fails after 16 Login Requests (the protocol
/// crate's `MAX_LOGIN_PDUS`), long before the login timeout.
#[test]
fn an_endless_login_negotiation_fails() {
    let server = TestServer::simple("");
    let mut c = Conn::connect(server.addr());
    let mut keys = vec![
        ("InitiatorName".to_string(), INITIATOR.to_string()),
        ("SessionType".to_string(), "Normal".to_string()),
        ("TargetName".to_string(), TARGET.to_string()),
        ("AuthMethod".to_string(), "None".to_string()),
    ];
    let started = Instant::now();
    for n in 1..=20 {
        c.send(&Pdu::LoginRequest(LoginRequest {
            csg: 0,
            isid: [0x80, 0, 0, 0, 0, 9],
            itt: 1,
            cid: 1,
            cmd_sn: 1,
            exp_stat_sn: c.exp_stat_sn,
            data: iscsi_proto::text::encode(&keys),
            ..LoginRequest::default()
        }));
        keys.truncate(0);
        match c.recv_raw(TIMEOUT) {
            Ok(Pdu::LoginResponse(r)) if r.status_class == 0 => {
                c.exp_stat_sn = r.stat_sn.wrapping_add(1);
                assert!(n < 17, "login PDU {n} still accepted");
            }
            Ok(Pdu::LoginResponse(r)) => {
                assert_eq!((r.status_class, r.status_detail), (0x02, 0x00), "PDU {n}");
                assert_eq!(n, 17, "fails at the 17th PDU");
                assert!(started.elapsed() < Duration::from_secs(5));
                return;
            }
            other => panic!("PDU {n}: {other:?}"),
        }
    }
    panic!("the login never failed");
}

#[test]
fn immediate_data_when_immediate_data_is_no_is_unexpected_unsolicited_data() {
    let server = TestServer::simple("immediate-data = false");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    assert!(!c.immediate_data, "ImmediateData=No negotiated");
    let itt = write10(&mut c, 8, 4096, true, pattern(3, 4096));
    expect_check_condition(&mut c, itt, (0x0b, 0x0c, 0x0c));
    assert_eq!(c.read10(0, 8), vec![0u8; 4096], "nothing written");
}

/// A Data-Out beyond the burst an R2T asked for (MaxBurstLength bounds every R2T) is rejected
/// and its command ends with "incorrect amount of data".
#[test]
fn data_out_beyond_the_solicited_burst_is_rejected() {
    let server = TestServer::simple("");
    let opts = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        max_burst: 8192,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert_eq!(c.max_burst, 8192);
    let itt = write10(&mut c, 64, 32768, true, Vec::new());
    let r2t = match c.wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == itt)) {
        Ok(Pdu::R2t(r)) => r,
        other => panic!("expected an R2T, got {other:?}"),
    };
    assert!(r2t.desired_length <= 8192, "R2T within MaxBurstLength");
    c.send(&Pdu::DataOut(DataOut {
        final_bit: true,
        itt,
        ttt: r2t.ttt,
        exp_stat_sn: c.exp_stat_sn,
        buffer_offset: r2t.buffer_offset,
        data: Bytes::from(pattern(4, 16384)),
        ..DataOut::default()
    }));
    match c.wait_for(|p| matches!(p, Pdu::Reject(_))) {
        Ok(Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        other => panic!("expected Reject, got {other:?}"),
    }
    expect_check_condition(&mut c, itt, (0x0b, 0x0c, 0x0d));
}

/// Session reinstatement (a new leading login with the same ISID) ends the old I_T nexus: its
/// SPC-2 reservation goes with it, and a peer that reinstates in a loop leaves no per-nexus
/// state behind.
#[test]
fn reinstatement_ends_the_old_nexus() {
    let server = TestServer::simple("");
    let mut old = Conn::login_to(server.addr(), &opts_with_isid(1));
    let mut other = Conn::login_to(server.addr(), &opts_with_isid(2));
    let reserve6 = [0x16u8, 0, 0, 0, 0, 0];
    assert_eq!(old.scsi(&reserve6, 0, None).expect("RESERVE(6)").status, 0);
    let data = pattern(9, 512);
    let write = |c: &mut Conn| {
        c.scsi(&cdb_write10(0, 1, 0), 512, Some(&data))
            .expect("WRITE(10) answered")
    };
    assert_eq!(
        write(&mut other).status,
        0x18,
        "RESERVATION CONFLICT while the reservation holds"
    );
    // Reinstate the first session: its nexus, and so its reservation, is gone.
    let mut new = Conn::connect(server.addr());
    new.login(&opts_with_isid(1)).expect("reinstating login");
    assert!(
        old.wait_closed(TIMEOUT).0,
        "the old session's connection is closed"
    );
    let r = write(&mut other);
    assert_eq!(r.status, 0, "no conflict after reinstatement: {r:?}");
}

/// Accept loops and login phases run on the process's login thread, not on the server's
/// runtime. A server whose runtime shuts down without being stopped still ends everything it
/// had: its logged-in connections, the connections still logging in, and its listening socket.
#[test]
fn a_server_whose_runtime_ends_closes_its_portals_and_logins() {
    let server = server_with("login-timeout = \"30s\"");
    let addr = server.addr();
    let mut session = Conn::login_to(addr, &LoginOpts::normal());
    assert_eq!(
        session.tur().0,
        0,
        "a login handed to the serving runtime serves commands"
    );
    let mut logging_in = Conn::connect(addr);
    server.drop_runtime();
    let (closed, _) = session.wait_closed(Duration::from_secs(10));
    assert!(closed, "the session's connection ends with its runtime");
    let (closed, _) = logging_in.wait_closed(Duration::from_secs(10));
    assert!(
        closed,
        "a connection in its login phase ends with the server's runtime"
    );
    // The accept loop ends on the login thread shortly after the runtime: poll until the
    // portal refuses connections.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "{addr} still accepts connections: {other:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
