//! Data path over real sockets: writes and reads with immediate data, R2T, unsolicited
//! Data-Out, multi-PDU Data-In, CRC32C digests, residuals, the CmdSN window and MC/S ordering.

mod support;

use iscsi_proto::pdu::*;
use support::*;

#[test]
fn write_then_read_with_immediate_data() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    assert!(c.immediate_data, "ImmediateData=Yes negotiated");
    let data = pattern(1, 8 * 512);
    let w = c.write10(10, &data);
    assert_eq!(w.r2ts, 0, "all data went as immediate data");
    assert_eq!(c.read10(10, 8), data);
}

#[test]
fn write_through_r2t_when_initial_r2t_is_required() {
    let server = TestServer::simple("initial-r2t = true\nimmediate-data = false");
    let opts = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert!(c.initial_r2t && !c.immediate_data, "{:?}", c.negotiated);
    let data = pattern(2, 64 * 1024);
    let w = c.write10(100, &data);
    assert!(w.r2ts >= 1, "the target asked for the data with R2T");
    assert_eq!(c.read10(100, 128), data);
}

#[test]
fn unsolicited_data_out_then_r2t_for_the_rest() {
    let server = TestServer::simple("initial-r2t = false\nfirst-burst-length = \"16K\"");
    let opts = LoginOpts {
        initial_r2t: false,
        first_burst: 16384,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert!(!c.initial_r2t, "{:?}", c.negotiated);
    assert_eq!(c.first_burst, 16384);
    let data = pattern(3, 96 * 1024);
    let w = c.write10(300, &data);
    assert!(w.r2ts >= 1, "data beyond FirstBurstLength needs R2T");
    assert_eq!(c.read10(300, 192), data);
}

#[test]
fn multi_pdu_data_in_with_small_max_recv_data_segment_length() {
    let server = TestServer::simple("");
    let opts = LoginOpts {
        max_recv: 4096,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    let data = pattern(4, 64 * 1024);
    c.write10(500, &data);
    let r = c.scsi(&cdb_read10(500, 128), 64 * 1024, None).unwrap();
    assert_eq!(r.status, 0);
    assert!(
        r.data_in_pdus >= 16,
        "{} Data-In PDUs of at most 4096 bytes",
        r.data_in_pdus
    );
    assert_eq!(r.data, data);
}

#[test]
fn header_and_data_digests_crc32c() {
    let server =
        TestServer::simple("header-digest = \"CRC32C,None\"\ndata-digest = \"CRC32C,None\"");
    let opts = LoginOpts {
        header_digest: true,
        data_digest: true,
        max_recv: 4096,
        initial_r2t: true,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert!(
        c.framer.header_digest && c.framer.data_digest,
        "{:?}",
        c.negotiated
    );
    let data = pattern(5, 48 * 1024);
    c.write10(700, &data);
    assert_eq!(c.read10(700, 96), data);
    assert_eq!(&c.ping(b"digest ping").unwrap()[..], b"digest ping");
}

#[test]
fn read_residuals_overflow_and_underflow() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let data = pattern(6, 4096);
    c.write10(900, &data);
    // EDTL smaller than the 8 blocks the CDB asks for: overflow (RFC 7143 11.4.5.1).
    let r = c.scsi(&cdb_read10(900, 8), 2048, None).unwrap();
    assert_eq!(r.status, 0);
    assert!(r.overflow && !r.underflow, "{r:?}");
    assert_eq!(r.residual, 2048);
    assert_eq!(r.data, data[..2048]);
    // EDTL larger: underflow, residual = EDTL - transferred.
    let r = c.scsi(&cdb_read10(900, 8), 8192, None).unwrap();
    assert_eq!(r.status, 0);
    assert!(r.underflow && !r.overflow, "{r:?}");
    assert_eq!(r.residual, 4096);
    assert_eq!(r.data, data);
}

#[test]
fn command_beyond_max_cmd_sn_is_ignored_but_connection_keeps_working() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let far = c.max_cmd_sn.wrapping_add(1000);
    let stray_itt = 0x7777_0001;
    c.send_scsi(stray_itt, far, 0, &cdb_read10(0, 1), 512, None);
    let data = pattern(7, 2048);
    c.write10(40, &data);
    assert_eq!(c.read10(40, 4), data);
    // Nothing ever answers the out-of-window command.
    match c.recv_timeout(std::time::Duration::from_secs(2)) {
        Err(e) if e == "timeout" => {}
        other => panic!("expected silence for the out-of-window command, got {other:?}"),
    }
}

#[test]
fn abort_task_of_unknown_task() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    c.write10(0, &pattern(8, 512));
    // RFC 7143 11.5.1 c): RefCmdSN outside the window -> "task does not exist".
    let far = c.cmd_sn.wrapping_add(100_000);
    assert_eq!(
        c.tmf(tmf::ABORT_TASK, 0, 0xdead_0001, far),
        tmf_response::TASK_DOES_NOT_EXIST
    );
    // A completed command's CmdSN is below ExpCmdSN, outside the window: "does not exist".
    let done = c.cmd_sn.wrapping_sub(1);
    assert_eq!(
        c.tmf(tmf::ABORT_TASK, 0, 0xdead_0002, done),
        tmf_response::TASK_DOES_NOT_EXIST
    );
    // The session still works.
    assert_eq!(c.tur().0, 0);
    // 11.5.1 b): RefCmdSN in the window (a CmdSN hole) and below the TMF's CmdSN -> "function
    // complete". CmdSN N is never sent, N+1 is parked behind it, the TMF carries N+2.
    let n = c.cmd_sn;
    c.send_scsi(
        0xdead_0003,
        n.wrapping_add(1),
        0,
        &cdb_read10(0, 1),
        512,
        None,
    );
    c.cmd_sn = n.wrapping_add(2);
    assert_eq!(
        c.tmf(tmf::ABORT_TASK, 0, 0xdead_0004, n),
        tmf_response::COMPLETE
    );
}

#[test]
fn lun_reset_raises_unit_attention_on_every_session() {
    let server = TestServer::simple("");
    let mut a = Conn::login_to(server.addr(), &LoginOpts::normal());
    let mut b = Conn::login_to(
        server.addr(),
        &LoginOpts {
            isid: [0x80, 0, 0, 0x12, 0x34, 0x02],
            ..LoginOpts::normal()
        },
    );
    assert_eq!(
        a.tmf(tmf::LOGICAL_UNIT_RESET, 0, RESERVED_TAG, 0),
        tmf_response::COMPLETE
    );
    for (name, c) in [("resetting session", &mut a), ("other session", &mut b)] {
        let (status, sense) = c.tur();
        assert_eq!(status, 2, "{name}: CHECK CONDITION after LUN RESET");
        assert_eq!(sense, Some((6, 0x29, 0x03)), "{name}: UNIT ATTENTION 29/03");
        assert_eq!(c.tur().0, 0, "{name}: reported once");
    }
}

/// SAM-5 5.6 with TAS set in the control mode page: a task that a LOGICAL UNIT RESET from
/// another I_T nexus aborted is answered TASK ABORTED (its host retries at once) instead of
/// vanishing (its host would wait out its command timeout). Here B's write waits for its data
/// when A resets the LUN; the data comes afterwards, is not written, and B hears why.
#[test]
fn lun_reset_from_another_session_answers_its_tasks_task_aborted() {
    let server = TestServer::simple("initial-r2t = true\nimmediate-data = false");
    let opts = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut a = Conn::login_to(server.addr(), &opts);
    let mut b = Conn::login_to(
        server.addr(),
        &LoginOpts {
            isid: [0x80, 0, 0, 0x12, 0x34, 0x03],
            ..opts.clone()
        },
    );
    // The control mode page (0x0A, after the 8-byte header; no block descriptors) sets TAS.
    let page = b
        .scsi(&cdb_mode_sense10(0x0a, 64), 64, None)
        .expect("MODE SENSE");
    assert_eq!(page.data.get(8), Some(&0x0a), "{:?}", page.data);
    assert_eq!(page.data[8 + 5] & 0x40, 0x40, "TAS set: {:?}", page.data);
    let data = pattern(9, 4096);
    let itt = 0xb0b1;
    let n = b.cmd_sn;
    b.cmd_sn = n.wrapping_add(1);
    b.send_scsi(itt, n, 0, &cdb_write10(70, 8, 0), 4096, Some(&data));
    let r2t = match b.wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == itt)) {
        Ok(Pdu::R2t(r)) => r,
        other => panic!("expected an R2T, got {other:?}"),
    };
    assert_eq!(
        a.tmf(tmf::LOGICAL_UNIT_RESET, 0, RESERVED_TAG, 0),
        tmf_response::COMPLETE
    );
    let (off, len) = (r2t.buffer_offset as usize, r2t.desired_length as usize);
    b.send_data_out(itt, 0, r2t.ttt, &data, off, len);
    match b.wait_for(|p| matches!(p, Pdu::ScsiResponse(r) if r.itt == itt)) {
        Ok(Pdu::ScsiResponse(r)) => assert_eq!(r.status, 0x40, "TASK ABORTED: {r:?}"),
        other => panic!("expected B's write to be answered, got {other:?}"),
    }
    a.clear_unit_attentions();
    assert_eq!(
        a.read10(70, 8),
        vec![0u8; 4096],
        "the aborted write did not land"
    );
    let (status, sense) = b.tur();
    assert_eq!(
        (status, sense),
        (2, Some((6, 0x29, 0x03))),
        "B hears of the reset"
    );
    assert_eq!(b.tur().0, 0);
}

fn mcs_toml() -> String {
    format!(
        r#"
[server]
data-dir = "{{dir}}/data"

[[portal-group]]
tag = 1
portals = ["127.0.0.1:0", "127.0.0.2:0"]

[[target]]
name = "{TARGET}"
max-connections = 4

[[target.lun]]
path = "{{dir}}/disk0.img"
size = "16M"
"#
    )
}

#[test]
fn mcs_two_connections_execute_in_cmd_sn_order() {
    let server = TestServer::start(&mcs_toml());
    assert_eq!(server.portals.len(), 2);
    let mut a = Conn::login_to(server.portals[0].1, &LoginOpts::normal());
    let opts_b = LoginOpts {
        tsih: a.tsih,
        cid: 2,
        cmd_sn: a.cmd_sn,
        ..LoginOpts::normal()
    };
    let mut b = Conn::connect(server.portals[1].1);
    b.login(&opts_b)
        .expect("second connection joins the session");
    assert_eq!(b.tsih, a.tsih);

    // CmdSN N+1 on B arrives before N on A. It is held until N arrives: no answer comes back,
    // and an immediate READ (which bypasses CmdSN ordering) still sees the old data. The
    // Control mode page reports unrestricted reordering (QUEUE ALGORITHM MODIFIER 1), so once
    // both are released two overlapping SIMPLE writes may run in either order; N writes
    // elsewhere and the test checks each lands.
    let n = a.cmd_sn;
    let first = pattern(9, 4096);
    let second = pattern(10, 4096);
    b.send_scsi(
        0xb001,
        n.wrapping_add(1),
        0,
        &cdb_write10(2000, 8, 0),
        4096,
        Some(&second),
    );
    match b.recv_timeout(std::time::Duration::from_secs(1)) {
        Err(e) if e == "timeout" => {}
        other => panic!("CmdSN N+1 answered before N arrived: {other:?}"),
    }
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&cdb_read10(2000, 8));
    a.send(&Pdu::ScsiCommand(ScsiCommand {
        immediate: true,
        final_bit: true,
        read: true,
        write: false,
        attr: task_attr::SIMPLE,
        lun: 0,
        itt: 0xa000,
        expected_data_length: 4096,
        cmd_sn: n,
        exp_stat_sn: a.exp_stat_sn,
        cdb,
        extended_cdb: None,
        bidi_read_length: None,
        data: bytes::Bytes::new(),
    }));
    let probe = a.complete_scsi(0xa000, None).unwrap();
    assert_eq!(probe.status, 0);
    assert_eq!(
        probe.data,
        vec![0u8; 4096],
        "CmdSN N+1 executed before N arrived"
    );
    a.send_scsi(0xa001, n, 0, &cdb_write10(2008, 8, 0), 4096, Some(&first));
    let ra = a.complete_scsi(0xa001, Some(&first)).unwrap();
    let rb = b.complete_scsi(0xb001, Some(&second)).unwrap();
    assert_eq!((ra.status, rb.status), (0, 0));
    a.cmd_sn = n.wrapping_add(2);
    assert_eq!(a.read10(2000, 8), second, "N+1 executed once N arrived");
    assert_eq!(a.read10(2008, 8), first, "N executed");

    // Alternate connections with consecutive CmdSNs.
    let mut sn = a.cmd_sn;
    for i in 0..10u32 {
        let c = if i % 2 == 0 { &mut a } else { &mut b };
        c.cmd_sn = sn;
        let d = pattern(100 + u64::from(i), 1024);
        c.write10(3000 + i * 2, &d);
        sn = c.cmd_sn;
        let other = if i % 2 == 0 { &mut b } else { &mut a };
        other.cmd_sn = sn;
        assert_eq!(
            other.read10(3000 + i * 2, 2),
            d,
            "written on one, read on the other"
        );
        sn = other.cmd_sn;
    }

    // Close B; A keeps the session.
    b.cmd_sn = sn;
    assert_eq!(b.logout(1, 2), 0, "connection logout");
    sn = b.cmd_sn;
    assert!(b.wait_closed(TIMEOUT).0, "B closed after logout");
    a.cmd_sn = sn;
    let d = pattern(11, 2048);
    a.write10(4000, &d);
    assert_eq!(a.read10(4000, 4), d);
}

/// README/config: `nop-interval = "0s"` turns NOP-In pings off.
#[test]
fn nop_interval_zero_disables_pings() {
    let toml = simple_toml("").replace("nop-interval = \"30s\"", "nop-interval = \"0s\"");
    let server = TestServer::start(&toml);
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    match c.recv_raw(std::time::Duration::from_millis(1500)) {
        Err(e) if e == "timeout" => {}
        other => panic!("nop-interval 0s, yet the target sent {other:?}"),
    }
}

/// MC/S: a connection lost while its write waits for Data-Out (data must come on that
/// connection) ends that task: the session gets its CmdSN window slot back, keeps working on
/// the other connection, and can be reinstated.
#[test]
fn lost_connection_releases_its_waiting_writes() {
    let server = TestServer::start(&mcs_toml());
    let opts_a = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut a = Conn::login_to(server.portals[0].1, &opts_a);
    let opts_b = LoginOpts {
        tsih: a.tsih,
        cid: 2,
        cmd_sn: a.cmd_sn,
        ..opts_a.clone()
    };
    let mut b = Conn::connect(server.portals[1].1);
    b.login(&opts_b).expect("second connection joins");
    // Session-wide keys are the leading connection's (RFC 7143 13: "LO").
    b.immediate_data = false;
    b.initial_r2t = true;
    // B announces a write, gets its R2T, and then disappears without sending the data.
    let n = a.cmd_sn;
    let data = pattern(3, 4096);
    b.send_scsi(0xb0b0, n, 0, &cdb_write10(50, 8, 0), 4096, Some(&data));
    match b.wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == 0xb0b0)) {
        Ok(Pdu::R2t(_)) => {}
        other => panic!("expected an R2T, got {other:?}"),
    }
    b.shutdown();
    drop(b);
    // A keeps working past a full window of commands.
    a.cmd_sn = n.wrapping_add(1);
    for i in 0..140u32 {
        assert_eq!(a.tur(), (0, None), "command {i} after the loss");
    }
    // The lost write's CmdSN window slot came back: the window is full again (128) once the
    // session is idle. A command's slot is freed just after its response is sent, so the
    // NOP-In may overtake the last one; ask again (bounded) until every slot is back.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let window = loop {
        a.ping(b"window").expect("ping");
        let window = a.max_cmd_sn.wrapping_sub(a.cmd_sn).wrapping_add(1);
        if window == 128 || std::time::Instant::now() >= deadline {
            break window;
        }
    };
    assert_eq!(window, 128, "full CmdSN window once idle");
    // Reinstating the session (same InitiatorName + ISID) waits for its tasks: it completes.
    let mut again = Conn::connect(server.portals[0].1);
    again
        .login(&opts_a)
        .expect("reinstatement completes: no task left hanging");
    again.clear_unit_attentions();
    let d = pattern(4, 512);
    again.write10(60, &d);
    assert_eq!(again.read10(60, 1), d);
}

/// MC/S fencing: a logout of connection B sent on connection A is answered only once B is
/// gone with its tasks, so whatever B still had pending can never execute afterwards: B's
/// write that waited for its data stays unwritten even if the data shows up late.
#[test]
fn logout_of_another_connection_fences_it() {
    let server = TestServer::start(&mcs_toml());
    let opts_a = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut a = Conn::login_to(server.portals[0].1, &opts_a);
    let opts_b = LoginOpts {
        tsih: a.tsih,
        cid: 2,
        cmd_sn: a.cmd_sn,
        ..opts_a.clone()
    };
    let mut b = Conn::connect(server.portals[1].1);
    b.login(&opts_b).expect("second connection joins");
    b.immediate_data = false;
    b.initial_r2t = true;
    let before = a.read10(70, 8);
    // B's write gets its R2T; then B goes silent (its socket stays open, as in a black hole).
    let n = a.cmd_sn;
    let stale = pattern(77, 4096);
    b.send_scsi(0xb1b1, n, 0, &cdb_write10(70, 8, 0), 4096, Some(&stale));
    let ttt = match b.wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == 0xb1b1)) {
        Ok(Pdu::R2t(r)) => r.ttt,
        other => panic!("expected an R2T, got {other:?}"),
    };
    a.cmd_sn = n.wrapping_add(1);
    assert_eq!(
        a.logout(1, 2),
        0,
        "logout of connection 2 through connection 1"
    );
    // B's data arrives late: it must not land.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        b.send_data_out(0xb1b1, 0, ttt, &stale, 0, 4096);
    }));
    assert!(b.wait_closed(TIMEOUT).0, "connection 2 closed");
    assert_eq!(
        a.read10(70, 8),
        before,
        "the fenced connection's write landed"
    );
    let fresh = pattern(78, 4096);
    a.write10(70, &fresh);
    assert_eq!(
        a.read10(70, 8),
        fresh,
        "the session goes on through connection 1"
    );
}
