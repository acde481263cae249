//! Malformed input: the target neither panics nor hangs, keeps serving healthy connections,
//! and never lets a bad PDU change stored data.

mod support;

use bytes::Bytes;
use iscsi_proto::pdu::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use support::*;

/// A fresh connection still logs in and reads what was written: the target is alive.
fn assert_alive(server: &TestServer, lba: u32, expected: &[u8]) {
    let mut c = Conn::login_to(
        server.addr(),
        &LoginOpts {
            isid: [0x80, 0, 0, 0x77, 0x77, 0x77],
            ..LoginOpts::normal()
        },
    );
    assert_eq!(c.read10(lba, (expected.len() / 512) as u16), expected);
}

#[test]
fn data_segment_longer_than_max_recv_data_segment_length() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let data = pattern(30, 4096);
    c.write10(16, &data);
    let limit = c.max_xmit;
    let nop = Pdu::NopOut(NopOut {
        immediate: true,
        itt: 0x1234,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        data: Bytes::from(vec![0xabu8; limit * 2]),
        ..NopOut::default()
    });
    let _ = c.try_send(&nop);
    let (closed, seen) = c.wait_closed(TIMEOUT);
    assert!(
        closed || seen.iter().any(|p| matches!(p, Pdu::Reject(_))),
        "oversized segment neither rejected nor closed: {seen:?}"
    );
    assert!(
        !seen
            .iter()
            .any(|p| matches!(p, Pdu::NopIn(n) if n.itt == 0x1234)),
        "oversized ping answered"
    );
    assert_alive(&server, 16, &data);
}

#[test]
fn unknown_opcode_is_rejected_with_command_not_supported() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let mut bhs = [0u8; BHS_LEN];
    bhs[0] = 0x1c; // not an initiator opcode RFC 7143 defines
    bhs[1] = 0x80;
    bhs[16..20].copy_from_slice(&0x4242u32.to_be_bytes());
    c.send_raw(&bhs).unwrap();
    match c.recv() {
        Ok(Pdu::Reject(r)) => {
            assert_eq!(r.reason, reject_reason::COMMAND_NOT_SUPPORTED);
            assert_eq!(&r.data[..], &bhs[..], "Reject carries the offending header");
        }
        other => panic!("expected Reject, got {other:?}"),
    }
    assert_eq!(&c.ping(b"still here").unwrap()[..], b"still here");
}

#[test]
fn bad_header_digest_closes_the_connection() {
    let server = TestServer::simple("header-digest = \"CRC32C\"");
    let opts = LoginOpts {
        header_digest: true,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert!(c.framer.header_digest);
    let mut bytes = c.framer.encode_to_vec(&Pdu::NopOut(NopOut {
        immediate: true,
        itt: 0x99,
        ttt: RESERVED_TAG,
        cmd_sn: c.cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        ..NopOut::default()
    }));
    bytes[BHS_LEN] ^= 0xff; // first byte of the header digest
    c.send_raw(&bytes).unwrap();
    let (closed, seen) = c.wait_closed(TIMEOUT);
    assert!(closed, "connection must close after a header digest error");
    assert!(!seen.iter().any(|p| matches!(p, Pdu::NopIn(_))), "{seen:?}");
    assert_alive(&server, 0, &[0u8; 512]);
}

#[test]
fn bad_data_digest_on_write_is_rejected_and_nothing_is_written() {
    let server = TestServer::simple("data-digest = \"CRC32C\"");
    let opts = LoginOpts {
        data_digest: true,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    assert!(c.framer.data_digest);
    let before = pattern(31, 4096);
    c.write10(64, &before);
    let cmd_sn = c.cmd_sn;
    let evil = pattern(32, 4096);
    let mut bytes = c.framer.encode_to_vec(&Pdu::ScsiCommand(ScsiCommand {
        final_bit: true,
        write: true,
        attr: task_attr::SIMPLE,
        itt: 0x5151,
        expected_data_length: 4096,
        cmd_sn,
        exp_stat_sn: c.exp_stat_sn,
        cdb: {
            let mut cdb = [0u8; 16];
            cdb[..10].copy_from_slice(&cdb_write10(64, 8, 0));
            cdb
        },
        data: Bytes::from(evil),
        ..ScsiCommand::default()
    }));
    let last = bytes.len() - 1;
    bytes[last] ^= 0x5a; // the data digest
    c.send_raw(&bytes).unwrap();
    match c.recv() {
        Ok(Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::DATA_DIGEST_ERROR),
        other => panic!("expected Reject (data digest error), got {other:?}"),
    }
    // The rejected command consumed no CmdSN (RFC 7143 7.8): reuse it for a read.
    c.cmd_sn = cmd_sn;
    assert_eq!(
        c.read10(64, 8),
        before,
        "a PDU with a bad data digest wrote data"
    );
}

#[test]
fn data_out_for_unknown_itt_is_rejected() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    c.send(&Pdu::DataOut(DataOut {
        final_bit: true,
        itt: 0xfeed_0001,
        ttt: RESERVED_TAG,
        exp_stat_sn: c.exp_stat_sn,
        data: Bytes::from(vec![0xee; 512]),
        ..DataOut::default()
    }));
    match c.recv() {
        Ok(Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        other => panic!("expected Reject, got {other:?}"),
    }
    let d = pattern(33, 512);
    c.write10(1, &d);
    assert_eq!(c.read10(1, 1), d);
    assert_eq!(
        c.read10(0, 1),
        vec![0u8; 512],
        "stray Data-Out wrote nothing"
    );
}

#[test]
fn garbage_before_login_closes_the_connection() {
    let server = TestServer::simple("");
    let mut rng = Rng(0x1234_5678);
    for i in 0..50 {
        let mut c = Conn::connect(server.addr());
        let len = 48 + rng.below(200) as usize;
        let mut g: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if g[0] & 0x3f == 0x03 {
            g[0] = 0x3e; // not a Login Request
        }
        c.send_raw(&g).unwrap();
        let (closed, seen) = c.wait_closed(TIMEOUT);
        assert!(closed, "string {i}: connection not closed");
        assert!(
            !seen
                .iter()
                .any(|p| matches!(p, Pdu::LoginResponse(r) if r.status_class == 0)),
            "string {i}: garbage got a successful login response"
        );
    }
    assert_alive(&server, 0, &[0u8; 512]);
}

/// Random byte strings (10,000 of them) on logged-in connections while a healthy connection
/// writes and reads; afterwards everything the healthy connection wrote is intact.
///
/// Task management opcodes are replaced: a random TARGET COLD RESET would legitimately end the
/// healthy session, and a LUN RESET would give it a unit attention.
#[test]
fn random_bytes_after_login_do_not_disturb_a_healthy_connection() {
    let server = TestServer::simple("");
    let addr = server.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let healthy = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = Conn::login_to(
                addr,
                &LoginOpts {
                    isid: [0x80, 0, 0, 1, 1, 1],
                    ..LoginOpts::normal()
                },
            );
            let mut written = Vec::new();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) || i < 20 {
                let lba = 4096 + (i % 256) * 8;
                let d = pattern(1000 + u64::from(i), 4096);
                c.write10(lba, &d);
                assert_eq!(c.read10(lba, 8), d, "healthy read-back {i}");
                if written.len() <= (i % 256) as usize {
                    written.push(d);
                } else {
                    written[(i % 256) as usize] = d;
                }
                i += 1;
            }
            (c, written)
        })
    };
    let mut rng = Rng(0x0dd_ba11);
    let mut fuzz: Option<Conn> = None;
    let mut logins = 0;
    for n in 0..10_000u32 {
        if fuzz.is_none() || n % 100 == 0 {
            let opts = LoginOpts {
                isid: [0x80, 0, 0, 2, 2, 2],
                ..LoginOpts::normal()
            };
            let mut c = Conn::connect(addr);
            c.login(&opts)
                .unwrap_or_else(|e| panic!("fuzz login {logins}: {e:?}"));
            logins += 1;
            fuzz = Some(c);
        }
        let c = fuzz.as_mut().unwrap();
        let len = rng.below(160) as usize;
        let mut g: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if let Some(b0) = g.first_mut() {
            if *b0 & 0x3f == 0x02 {
                *b0 ^= 0x10;
            }
        }
        if g.len() >= 8 && rng.below(2) == 0 {
            // A plausible DataSegmentLength, so the PDU decoder, not the length check, runs.
            g[5] = 0;
            g[6] = (rng.below(2)) as u8;
            g[7] = rng.next() as u8;
        }
        let sent = c.send_raw(&g).is_ok();
        // Drain whatever came back without blocking; EOF means the target dropped us.
        c.stream.set_nonblocking(true).unwrap();
        let mut closed = !sent;
        let mut sink = [0u8; 65536];
        loop {
            use std::io::Read;
            match c.stream.read(&mut sink) {
                Ok(0) => {
                    closed = true;
                    break;
                }
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    closed = true;
                    break;
                }
            }
        }
        c.stream.set_nonblocking(false).unwrap();
        if closed {
            fuzz = None;
        }
    }
    drop(fuzz);
    stop.store(true, Ordering::Relaxed);
    let (mut c, written) = healthy.join().expect("healthy connection thread");
    for (slot, d) in written.iter().enumerate() {
        assert_eq!(&c.read10(4096 + slot as u32 * 8, 8), d, "slot {slot}");
    }
    // The fuzzed region of the healthy connection aside, a new session still works.
    assert_alive(&server, 4096, &written[0]);
    eprintln!("fuzz: {logins} logins for 10000 strings");
}

/// A write announcing more data than any command here takes is refused before any data is
/// solicited: no R2T, CHECK CONDITION ILLEGAL REQUEST, nothing written.
#[test]
fn oversized_write_is_refused_without_soliciting_data() {
    let server = TestServer::simple("");
    let mut c = Conn::login_to(server.addr(), &LoginOpts::normal());
    let d = pattern(77, 512);
    let r = c
        .scsi(&cdb_write10(3, 1, 0), 1 << 30, Some(&d))
        .expect("the command is answered");
    assert_eq!(r.status, 2, "CHECK CONDITION");
    assert_eq!(r.r2ts, 0, "no data solicited");
    assert_eq!(r.sense_triplet(), Some((0x05, 0x24, 0x00)));
    assert_eq!(c.read10(3, 1), vec![0u8; 512], "nothing written");
}

/// ErrorRecoveryLevel 0: a Data-Out out of DataSN sequence is rejected and its command ends
/// with ABORTED COMMAND (incorrect amount of data) instead of waiting forever; nothing is
/// written and the session keeps working.
#[test]
fn bad_data_sn_ends_the_command_with_sense() {
    let server = TestServer::simple("");
    let opts = LoginOpts {
        initial_r2t: true,
        immediate_data: false,
        ..LoginOpts::normal()
    };
    let mut c = Conn::login_to(server.addr(), &opts);
    let cmd_sn = c.cmd_sn;
    c.cmd_sn = c.cmd_sn.wrapping_add(1);
    let itt = c.itt();
    let data = pattern(5, 1024);
    c.send_scsi(itt, cmd_sn, 0, &cdb_write10(8, 2, 0), 1024, Some(&data));
    let r2t = match c.wait_for(|p| matches!(p, Pdu::R2t(r) if r.itt == itt)) {
        Ok(Pdu::R2t(r)) => r,
        other => panic!("expected R2T, got {other:?}"),
    };
    c.send(&Pdu::DataOut(DataOut {
        final_bit: true,
        itt,
        ttt: r2t.ttt,
        exp_stat_sn: c.exp_stat_sn,
        data_sn: 27,
        buffer_offset: 0,
        data: Bytes::from(data.clone()),
        ..DataOut::default()
    }));
    match c.wait_for(|p| matches!(p, Pdu::Reject(_))) {
        Ok(Pdu::Reject(r)) => assert_eq!(r.reason, reject_reason::PROTOCOL_ERROR),
        other => panic!("expected Reject, got {other:?}"),
    }
    match c.wait_for(|p| matches!(p, Pdu::ScsiResponse(r) if r.itt == itt)) {
        Ok(Pdu::ScsiResponse(r)) => {
            assert_eq!(r.status, 2);
            assert_eq!(r.data[2] & 0x7f, 0x70, "fixed-format sense");
            assert_eq!(
                (r.data[4] & 0x0f, r.data[14], r.data[15]),
                (0x0b, 0x0c, 0x0d)
            );
        }
        other => panic!("expected the command's response, got {other:?}"),
    }
    assert_eq!(c.read10(8, 2), vec![0u8; 1024], "nothing written");
}
