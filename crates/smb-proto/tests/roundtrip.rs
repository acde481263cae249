//! Encode-then-decode round trips for the header, the chain and every message type.

use proptest::prelude::*;
use smb_proto::compound::append_to_chain;
use smb_proto::msg::create::FileTimes;
use smb_proto::msg::negotiate::NegotiateContext;
use smb_proto::msg::*;
use smb_proto::{split_compound, Command, DirectTcp, Flags, Header, HeaderIds, HEADER_LEN};

fn header_strategy() -> impl Strategy<Value = Header> {
    (
        any::<u16>(),
        any::<u32>(),
        0u16..0x20,
        any::<u16>(),
        any::<u32>(),
        any::<u64>(),
        prop_oneof![
            (any::<u32>(), any::<u32>()).prop_map(|(process_id, tree_id)| HeaderIds::Sync {
                process_id,
                tree_id
            }),
            any::<u64>().prop_map(|async_id| HeaderIds::Async { async_id }),
        ],
        any::<u64>(),
        any::<[u8; 16]>(),
    )
        .prop_map(|(cc, st, cmd, cr, fl, mid, ids, sid, sig)| Header {
            credit_charge: cc,
            status: st,
            command: Command::from_u16(cmd),
            credits: cr,
            flags: Flags(fl & !Flags::ASYNC_COMMAND),
            next_command: 0,
            message_id: mid,
            ids,
            session_id: sid,
            signature: sig,
        })
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..max)
}

fn file_id() -> impl Strategy<Value = FileId> {
    (any::<u64>(), any::<u64>()).prop_map(|(persistent, volatile)| FileId {
        persistent,
        volatile,
    })
}

fn hdr() -> Header {
    Header::decode(
        &[0xFE, b'S', b'M', b'B', 64, 0]
            .into_iter()
            .chain([0; 58])
            .collect::<Vec<_>>(),
    )
    .unwrap()
}

/// Encodes `m` after a header and decodes it back.
fn rt<'a, M: Message<'a> + PartialEq + std::fmt::Debug>(m: &M, buf: &'a mut Vec<u8>) -> M {
    *buf = encode_message(&hdr(), m);
    M::decode(buf).expect("decodes")
}

macro_rules! check {
    ($v:expr) => {{
        let v = $v;
        let mut buf = Vec::new();
        let back = rt(&v, &mut buf);
        prop_assert_eq!(back, v);
    }};
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn header(h in header_strategy()) {
        let b = h.to_bytes();
        prop_assert_eq!(Header::decode(&b).unwrap(), h);
    }

    #[test]
    fn chain_of_messages(bodies in proptest::collection::vec(bytes(40), 1..5), related in any::<bool>()) {
        let mut frame = Vec::new();
        let mut last = None;
        for (i, b) in bodies.iter().enumerate() {
            let mut h = hdr();
            h.command = Command::Echo;
            h.message_id = i as u64;
            if related && i > 0 {
                h.flags = Flags(Flags::RELATED_OPERATIONS);
            }
            let mut m = h.to_bytes().to_vec();
            EchoRequest.encode(&mut m);
            m.extend_from_slice(b);
            last = Some(append_to_chain(&mut frame, last, &m));
        }
        let els = split_compound(&frame).unwrap();
        prop_assert_eq!(els.len(), bodies.len());
        for (i, e) in els.iter().enumerate() {
            prop_assert_eq!(e.header.message_id, i as u64);
            prop_assert_eq!(e.offset % 8, 0);
            prop_assert_eq!(e.is_related(), related && i > 0);
            prop_assert_eq!(Request::decode(&e.header, e.bytes).unwrap(), Request::Echo(EchoRequest));
        }
        let mut framed = DirectTcp::prefix(frame.len()).unwrap().to_vec();
        framed.extend_from_slice(&frame);
        let (used, f) = DirectTcp::default().decode(&framed).unwrap().unwrap();
        prop_assert_eq!(used, framed.len());
        prop_assert_eq!(f, &frame[..]);
        prop_assert_eq!(DirectTcp::default().decode(&framed[..framed.len() - 1]).unwrap(), None);
    }

    #[test]
    fn negotiate(
        dialects in proptest::collection::vec(any::<u16>(), 1..6),
        salt in bytes(40),
        ciphers in proptest::collection::vec(1u16..5, 1..5),
        signing in proptest::collection::vec(0u16..3, 1..4),
        name in "[a-z.]{0,12}",
        other in bytes(20),
        guid in any::<[u8; 16]>(),
        sec in bytes(100),
    ) {
        let contexts = vec![
            NegotiateContext::PreauthIntegrity { hash_algorithms: vec![1], salt: &salt },
            NegotiateContext::Encryption { ciphers: ciphers.clone() },
            NegotiateContext::Signing { algorithms: signing.clone() },
            NegotiateContext::NetName(name.clone()),
            NegotiateContext::Other { context_type: 0x77, data: &other },
        ];
        let mut d = dialects.clone();
        d.push(0x0311);
        check!(NegotiateRequest { security_mode: 1, capabilities: 0x7f, client_guid: guid, dialects: d, contexts: contexts.clone() });
        check!(NegotiateResponse {
            security_mode: 1, dialect: 0x0311, server_guid: guid, capabilities: 0x2f,
            max_transact_size: 1 << 20, max_read_size: 1 << 23, max_write_size: 1 << 23,
            system_time: 7, server_start_time: 0, security_buffer: &sec, contexts,
        });
    }

    #[test]
    fn session_tree_and_misc(sec in bytes(300), flags in any::<u8>(), path in bytes(60)) {
        check!(SessionSetupRequest { flags, security_mode: 1, capabilities: 1, channel: 0, previous_session_id: 9, security_buffer: &sec });
        check!(SessionSetupResponse { session_flags: 4, security_buffer: &sec });
        check!(TreeConnectRequest { flags: 0, path: &path });
        check!(TreeConnectResponse { share_type: 1, share_flags: 0x30, capabilities: 8, maximal_access: 0x1f01ff });
        check!(ErrorResponse { error_context_count: 0, error_data: &sec });
        check!(LogoffRequest);
        check!(EchoResponse);
        check!(CancelRequest);
    }

    #[test]
    fn create_and_close(
        name in bytes(40).prop_map(|mut v| { v.truncate(v.len() & !1); v }),
        ctx in proptest::collection::vec((proptest::collection::vec(any::<u8>(), 1..8), bytes(60)), 0..4),
        fid in file_id(),
        t in any::<[u64; 4]>(),
    ) {
        let contexts: Vec<CreateContext<'_>> = ctx.iter().map(|(n, d)| CreateContext { name: n, data: d }).collect();
        check!(CreateRequest {
            security_flags: 0, requested_oplock_level: 0xff, impersonation_level: 2, smb_create_flags: 0,
            desired_access: 0x12019f, file_attributes: 0x80, share_access: 7, create_disposition: 1,
            create_options: 0x40, name: &name, contexts: contexts.clone(),
        });
        let times = FileTimes { creation: t[0], last_access: t[1], last_write: t[2], change: t[3] };
        check!(CreateResponse {
            oplock_level: 0xff, flags: 0, create_action: 1, times, allocation_size: 4096,
            end_of_file: 10, file_attributes: 0x20, file_id: fid, contexts,
        });
        check!(CloseRequest { flags: 1, file_id: fid });
        check!(CloseResponse { flags: 1, times, allocation_size: 1, end_of_file: 2, file_attributes: 3 });
    }

    #[test]
    fn io(data in bytes(500), ci in bytes(20), fid in file_id(), off in any::<u64>(), len in any::<u32>()) {
        check!(ReadRequest { padding: 0x50, flags: 0, length: len, offset: off, file_id: fid, minimum_count: 0, channel: 0, remaining_bytes: 0, read_channel_info: &ci });
        check!(ReadResponse { data_remaining: 0, flags: 0, data: &data });
        check!(WriteRequest { offset: off, file_id: fid, channel: 0, remaining_bytes: 0, flags: 1, write_channel_info: &ci, data: &data });
        check!(WriteResponse { count: len, remaining: 0 });
        check!(FlushRequest { file_id: fid });
        check!(FlushResponse);
    }

    #[test]
    fn info_lock_ioctl_oplock(
        a in bytes(80), b in bytes(80), fid in file_id(),
        locks in proptest::collection::vec((any::<u64>(), any::<u64>(), any::<u32>()), 1..5),
        key in any::<[u8; 16]>(), state in any::<u32>(), level in any::<u8>(),
    ) {
        check!(QueryInfoRequest { info_type: 1, file_info_class: 5, output_buffer_length: 4096, input: &a, additional_information: 0, flags: 0, file_id: fid });
        check!(QueryInfoResponse { output: &a });
        check!(SetInfoRequest { info_type: 1, file_info_class: 4, additional_information: 0, file_id: fid, buffer: &b });
        check!(SetInfoResponse);
        check!(QueryDirectoryRequest { file_information_class: 0x25, flags: 1, file_index: 0, file_id: fid, file_name: &b, output_buffer_length: 65536 });
        check!(QueryDirectoryResponse { output: &b });
        check!(ChangeNotifyRequest { flags: 1, output_buffer_length: 4096, file_id: fid, completion_filter: 0x17 });
        check!(ChangeNotifyResponse { output: &a });
        let locks: Vec<LockElement> = locks.into_iter().map(|(offset, length, flags)| LockElement { offset, length, flags }).collect();
        check!(LockRequest { lock_sequence: 0x51, file_id: fid, locks });
        check!(LockResponse);
        check!(IoctlRequest { ctl_code: 0x140204, file_id: fid, input: &a, max_input_response: 0, output: &b, max_output_response: 65536, flags: 1 });
        check!(IoctlResponse { ctl_code: 0x140204, file_id: fid, input: &a, output: &b, flags: 0 });
        check!(OplockBreak::Oplock { oplock_level: level, file_id: fid });
        check!(OplockBreak::LeaseNotification { new_epoch: 2, flags: 1, lease_key: key, current_lease_state: state, new_lease_state: 1 });
        check!(OplockBreak::LeaseAck { flags: 0, lease_key: key, lease_state: state });
    }
}

#[test]
fn read_response_head_is_the_fixed_part() {
    let mut head = Vec::new();
    ReadResponse::encode_head(5, 0, 0, &mut head);
    let mut whole = Vec::new();
    ReadResponse {
        data_remaining: 0,
        flags: 0,
        data: b"hello",
    }
    .encode(&mut whole);
    assert_eq!(head.len(), 16);
    assert_eq!(&whole[..16], &head[..]);
    assert_eq!(head[2] as usize, HEADER_LEN + 16);
}
