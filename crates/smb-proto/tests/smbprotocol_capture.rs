//! A session of the smbprotocol Python client (1.x, its own SMB 3.1.1 implementation) against
//! smbd 4.17.12, captured like `samba_capture.rs` (`tests/data/smbprotocol-features.frames`),
//! for what smbclient does not send: a CREATE with RqLs v2, DH2Q, MxAc and QFid contexts, FLUSH,
//! LOCK and unlock, ECHO, a related compound (CREATE, READ, CLOSE) and its compound answer, an
//! async CHANGE_NOTIFY cancelled by a signed CANCEL, and LOGOFF.

mod common;

use common::frames::*;
use smb_proto::credits::{is_charged, CreditPolicy, CreditWindow};
use smb_proto::crypto::{SigningAlgorithm, SigningKey};
use smb_proto::msg::create::*;
use smb_proto::msg::create_ctx::*;
use smb_proto::msg::*;
use smb_proto::{split_compound, Command, HeaderIds, NtStatus, RelatedIds};

fn find(frames: &[Vec<u8>], cmd: Command) -> Vec<&[u8]> {
    frames
        .iter()
        .flat_map(|f| split_compound(f).unwrap())
        .filter(|e| e.header.command == cmd)
        .map(|e| e.bytes)
        .collect()
}

#[test]
fn everything_decodes_and_every_signature_verifies() {
    let c = features();
    let (requests, responses) = check_all_decode(&c.client, &c.server);
    // 21 frames each way, one of them a chain of three.
    assert_eq!((requests, responses), (23, 23));
    let s = sign_in(&c);
    assert_eq!(s.signing, SigningAlgorithm::AesGmac);
    let key = SigningKey::new(s.signing, s.keys.signing);
    let mut verified = Vec::new();
    for f in c.client.iter().chain(&c.server) {
        for e in split_compound(f).unwrap() {
            if e.header.flags.is_signed() {
                assert!(
                    key.verify(e.bytes),
                    "{:?} mid {}",
                    e.header.command,
                    e.header.message_id
                );
                verified.push(e.header.command);
            }
        }
    }
    // The CANCEL is signed: its GMAC nonce carries the cancel bit, and it is async.
    assert!(verified.contains(&Command::Cancel));
    assert_eq!(verified.len(), 23 + 23 - 5 - 1);
}

#[test]
fn create_contexts_both_ways() {
    let c = features();
    let req = find(&c.client, Command::Create)[0];
    let r = CreateRequest::decode(req).unwrap();
    assert_eq!(r.name_string().unwrap(), "lease.txt");
    assert_eq!(r.requested_oplock_level, 0xFF, "lease");
    let lease = Lease::decode(r.context(CTX_REQUEST_LEASE).unwrap().data).unwrap();
    let mut key = [0u8; 16];
    key[13..].copy_from_slice(&[0xAB, 0xCD, 0xEF]);
    assert_eq!(
        lease,
        Lease::V2 {
            key,
            state: 7,
            flags: 0,
            parent_key: [0; 16],
            epoch: 0
        }
    );
    let dh =
        DurableRequestV2::decode(r.context(CTX_DURABLE_HANDLE_REQUEST_V2).unwrap().data).unwrap();
    assert_eq!(dh.create_guid[14..], [0x55, 0x55]);
    // smbprotocol sends MxAc with a timestamp.
    assert!(
        decode_maximal_access_request(r.context(CTX_QUERY_MAXIMAL_ACCESS).unwrap().data)
            .unwrap()
            .is_some()
    );
    assert!(r.context(CTX_QUERY_ON_DISK_ID).unwrap().data.is_empty());

    let resp = find(&c.server, Command::Create)[0];
    let r = CreateResponse::decode(resp).unwrap();
    assert_eq!(r.oplock_level, 0xFF);
    let names: Vec<&[u8]> = r.contexts.iter().map(|x| x.name).collect();
    assert!(names.contains(&CTX_REQUEST_LEASE) && names.contains(&CTX_QUERY_MAXIMAL_ACCESS));
    for ctx in &r.contexts {
        match ctx.name {
            b"RqLs" => assert!(
                matches!(Lease::decode(ctx.data).unwrap(), Lease::V2 { key: k, .. } if k == key)
            ),
            b"MxAc" => assert_eq!(&ctx.data[..4], &[0, 0, 0, 0], "QueryStatus success"),
            b"QFid" => assert_eq!(ctx.data.len(), 32),
            b"DH2Q" => assert_eq!(ctx.data.len(), 8),
            other => panic!("context {other:?}"),
        }
    }
    // smbd's CREATE response with contexts re-encodes to its own bytes.
    let mut again = resp[..64].to_vec();
    r.encode(&mut again);
    assert_eq!(again, resp);
}

#[test]
fn related_compound_both_ways() {
    let c = features();
    let frame = c
        .client
        .iter()
        .find(|f| split_compound(f).unwrap().len() == 3)
        .unwrap();
    let els = split_compound(frame).unwrap();
    let cmds: Vec<Command> = els.iter().map(|e| e.header.command).collect();
    assert_eq!(cmds, [Command::Create, Command::Read, Command::Close]);
    assert!(!els[0].is_related() && els[1].is_related() && els[2].is_related());
    let Request::Read(read) = Request::decode(&els[1].header, els[1].bytes).unwrap() else {
        panic!()
    };
    assert_eq!(read.file_id, FileId::RELATED);
    let created = FileId {
        persistent: 1,
        volatile: 2,
    };
    let prev = RelatedIds {
        session_id: els[0].header.session_id,
        tree_id: 0,
        file_id: Some(created),
    };
    assert_eq!(
        prev.file_id_for(&els[1].header, read.file_id),
        Some(created)
    );

    let answer = c
        .server
        .iter()
        .find(|f| split_compound(f).unwrap().len() == 3)
        .unwrap();
    let els = split_compound(answer).unwrap();
    assert!(els[1].is_related() && els[2].is_related());
    let data = ReadResponse::decode(els[1].bytes).unwrap().data;
    assert_eq!(data, b"lease data from the lanes test");
}

#[test]
fn lock_echo_flush_notify_cancel() {
    let c = features();
    let locks = find(&c.client, Command::Lock);
    let l = LockRequest::decode(locks[0]).unwrap();
    assert_eq!(
        l.locks,
        vec![LockElement {
            offset: 0,
            length: 10,
            flags: 0x12
        }]
    );
    assert_eq!(LockRequest::decode(locks[1]).unwrap().locks[0].flags, 0x04);
    assert_eq!(find(&c.client, Command::Echo).len(), 1);
    assert_eq!(find(&c.client, Command::Flush).len(), 1);

    let notify = find(&c.client, Command::ChangeNotify)[0];
    let n = ChangeNotifyRequest::decode(notify).unwrap();
    assert_eq!(n.output_buffer_length, 65536);
    let answers = find(&c.server, Command::ChangeNotify);
    let interim = smb_proto::Header::decode(answers[0]).unwrap();
    let last = smb_proto::Header::decode(answers[1]).unwrap();
    assert_eq!(interim.nt_status(), NtStatus::PENDING);
    let HeaderIds::Async { async_id } = interim.ids else {
        panic!("async")
    };
    assert_eq!(last.ids, HeaderIds::Async { async_id });
    assert_eq!(last.nt_status(), NtStatus::CANCELLED);
    let cancel = smb_proto::Header::decode(find(&c.client, Command::Cancel)[0]).unwrap();
    assert_eq!(cancel.ids, HeaderIds::Async { async_id });
}

#[test]
fn credits_with_a_cancel_and_a_compound() {
    let c = features();
    let mut w = CreditWindow::new(CreditPolicy::default());
    let mut responses = c
        .server
        .iter()
        .flat_map(|f| split_compound(f).unwrap())
        .map(|e| e.header)
        .peekable();
    for f in &c.client {
        for e in split_compound(f).unwrap() {
            if !is_charged(e.header.command) {
                // Charging it would collide with the CHANGE_NOTIFY it cancels.
                assert!(w.consume(e.header.message_id, 0, 0, true).is_err());
                continue;
            }
            let req = Request::decode(&e.header, e.bytes).unwrap();
            w.consume(
                e.header.message_id,
                e.header.credit_charge,
                req.payload_size(),
                true,
            )
            .unwrap();
            while let Some(r) = responses.next_if(|r| r.message_id == e.header.message_id) {
                w.grant(r.credits);
            }
        }
    }
}
