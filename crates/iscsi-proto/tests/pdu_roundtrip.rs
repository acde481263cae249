//! Property tests: every PDU type survives `Framer` encode -> decode, with and without digests,
//! and the lengths it declares match what it writes.

use bytes::{Bytes, BytesMut};
use iscsi_proto::pdu::*;
use proptest::prelude::*;

fn data(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn seq() -> impl Strategy<Value = (u32, u32, u32)> {
    (any::<u32>(), any::<u32>(), any::<u32>())
}

prop_compose! {
    fn nop_out()(immediate: bool, lun: u64, itt: u32, ttt: u32, cmd_sn: u32, exp_stat_sn: u32, data in data(600)) -> Pdu {
        Pdu::NopOut(NopOut { immediate, lun, itt, ttt, cmd_sn, exp_stat_sn, data })
    }
}

prop_compose! {
    fn scsi_command()(
        (immediate, final_bit, read, write, attr) in any::<(bool, bool, bool, bool, u8)>(),
        (lun, itt, expected_data_length, cmd_sn, exp_stat_sn) in any::<(u64, u32, u32, u32, u32)>(),
        cdb: [u8; 16],
        extended_cdb in proptest::option::of(data(240)),
        bidi_read_length: Option<u32>,
        data in data(600),
    ) -> Pdu {
        Pdu::ScsiCommand(ScsiCommand {
            immediate, final_bit, read, write, attr: attr & 7, lun, itt, expected_data_length,
            cmd_sn, exp_stat_sn, cdb, extended_cdb, bidi_read_length, data,
        })
    }
}

prop_compose! {
    fn scsi_response()(
        flags: (bool, bool, bool, bool),
        (response, status, itt, snack_tag) in any::<(u8, u8, u32, u32)>(),
        (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(),
        (exp_data_sn, bidi_residual, residual) in any::<(u32, u32, u32)>(),
        data in data(300),
    ) -> Pdu {
        Pdu::ScsiResponse(ScsiResponse {
            bidi_overflow: flags.0, bidi_underflow: flags.1, overflow: flags.2, underflow: flags.3,
            response, status, itt, snack_tag, stat_sn, exp_cmd_sn, max_cmd_sn, exp_data_sn,
            bidi_residual, residual, data,
        })
    }
}

prop_compose! {
    fn task_mgmt()(
        immediate: bool, function: u8, lun: u64,
        (itt, referenced_task_tag, cmd_sn, exp_stat_sn, ref_cmd_sn, exp_data_sn) in any::<(u32, u32, u32, u32, u32, u32)>(),
        response: u8, (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(), which: bool,
    ) -> Pdu {
        if which {
            Pdu::TaskMgmtRequest(TaskMgmtRequest {
                immediate, function: function & 0x7f, lun, itt, referenced_task_tag, cmd_sn,
                exp_stat_sn, ref_cmd_sn, exp_data_sn,
            })
        } else {
            Pdu::TaskMgmtResponse(TaskMgmtResponse { response, itt, stat_sn, exp_cmd_sn, max_cmd_sn })
        }
    }
}

prop_compose! {
    fn login()(
        (transit, continue_bit, csg, nsg) in any::<(bool, bool, u8, u8)>(),
        (version_max, version_min) in any::<(u8, u8)>(), isid: [u8; 6], tsih: u16,
        (itt, cid, cmd_sn, exp_stat_sn) in any::<(u32, u16, u32, u32)>(),
        (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(), status: (u8, u8),
        data in data(1000), which: bool,
    ) -> Pdu {
        let (csg, nsg) = (csg & 3, nsg & 3);
        if which {
            Pdu::LoginRequest(LoginRequest {
                transit, continue_bit, csg, nsg, version_max, version_min, isid, tsih, itt, cid,
                cmd_sn, exp_stat_sn, data,
            })
        } else {
            Pdu::LoginResponse(LoginResponse {
                transit, continue_bit, csg, nsg, version_max, version_active: version_min, isid,
                tsih, itt, stat_sn, exp_cmd_sn, max_cmd_sn, status_class: status.0,
                status_detail: status.1, data,
            })
        }
    }
}

prop_compose! {
    fn text_pdu()(
        (immediate, final_bit, continue_bit) in any::<(bool, bool, bool)>(), lun: u64,
        (itt, ttt, cmd_sn, exp_stat_sn) in any::<(u32, u32, u32, u32)>(),
        (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(), data in data(1000), which: bool,
    ) -> Pdu {
        if which {
            Pdu::TextRequest(TextRequest { immediate, final_bit, continue_bit, lun, itt, ttt, cmd_sn, exp_stat_sn, data })
        } else {
            Pdu::TextResponse(TextResponse { final_bit, continue_bit, lun, itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn, data })
        }
    }
}

prop_compose! {
    fn data_pdu()(
        flags: (bool, bool, bool, bool, bool), status: u8, lun: u64,
        (itt, ttt, exp_stat_sn, data_sn, buffer_offset, residual) in any::<(u32, u32, u32, u32, u32, u32)>(),
        (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(), data in data(2000), which: bool,
    ) -> Pdu {
        if which {
            Pdu::DataOut(DataOut { final_bit: flags.0, lun, itt, ttt, exp_stat_sn, data_sn, buffer_offset, data })
        } else {
            Pdu::DataIn(DataIn {
                final_bit: flags.0, acknowledge: flags.1, overflow: flags.2, underflow: flags.3,
                status_present: flags.4, status, lun, itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn,
                data_sn, buffer_offset, residual, data,
            })
        }
    }
}

prop_compose! {
    fn logout_snack_r2t()(
        immediate: bool, small: u8, (itt, cid, cmd_sn, exp_stat_sn) in any::<(u32, u16, u32, u32)>(),
        (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(), times: (u16, u16), lun: u64,
        (ttt, a, b, c) in any::<(u32, u32, u32, u32)>(), which in 0..4u8,
    ) -> Pdu {
        match which {
            0 => Pdu::LogoutRequest(LogoutRequest { immediate, reason: small & 0x7f, itt, cid, cmd_sn, exp_stat_sn }),
            1 => Pdu::LogoutResponse(LogoutResponse {
                response: small, itt, stat_sn, exp_cmd_sn, max_cmd_sn, time2wait: times.0, time2retain: times.1,
            }),
            2 => Pdu::SnackRequest(SnackRequest { snack_type: small & 0x0f, lun, itt, ttt, exp_stat_sn, beg_run: a, run_length: b }),
            _ => Pdu::R2t(R2t { lun, itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn, r2t_sn: a, buffer_offset: b, desired_length: c }),
        }
    }
}

prop_compose! {
    fn target_misc()(
        lun: u64, (stat_sn, exp_cmd_sn, max_cmd_sn) in seq(), (event, vendor_code, reason) in any::<(u8, u8, u8)>(),
        params: (u16, u16, u16), (itt, ttt, sn) in any::<(u32, u32, u32)>(), data in data(300), which in 0..3u8,
    ) -> Pdu {
        match which {
            0 => Pdu::AsyncMessage(AsyncMessage {
                lun, stat_sn, exp_cmd_sn, max_cmd_sn, event, vendor_code, parameter1: params.0,
                parameter2: params.1, parameter3: params.2, data,
            }),
            1 => Pdu::Reject(Reject { reason, stat_sn, exp_cmd_sn, max_cmd_sn, data_sn_or_r2t_sn: sn, data }),
            _ => Pdu::NopIn(NopIn { lun, itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn, data }),
        }
    }
}

/// Opcodes RFC 7143 does not define (kept as `Pdu::Unknown`).
fn unknown_opcode() -> impl Strategy<Value = u8> {
    prop_oneof![0x07u8..=0x0f, 0x11u8..=0x1f, 0x27u8..=0x30, 0x33u8..=0x3e]
}

prop_compose! {
    fn unknown()(opcode in unknown_opcode(), mut header: [u8; 48], data in data(100)) -> Pdu {
        header[0] = (header[0] & 0xc0) | opcode;
        header[4] = 0;
        let len = data.len() as u32;
        header[5..8].copy_from_slice(&len.to_be_bytes()[1..]);
        Pdu::Unknown { opcode: Opcode(opcode), header: Box::new(header), data }
    }
}

fn any_pdu() -> impl Strategy<Value = Pdu> {
    prop_oneof![
        nop_out(),
        scsi_command(),
        scsi_response(),
        task_mgmt(),
        login(),
        text_pdu(),
        data_pdu(),
        logout_snack_r2t(),
        target_misc(),
        unknown(),
    ]
}

fn framers() -> [Framer; 4] {
    let mut out = [Framer::default(); 4];
    for (i, f) in out.iter_mut().enumerate() {
        f.header_digest = i & 1 != 0;
        f.data_digest = i & 2 != 0;
        f.max_recv_data_segment_length = 4096;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn framer_roundtrip(pdu in any_pdu()) {
        for framer in framers() {
            let wire = framer.encode_to_vec(&pdu);
            let encoded = framer.encode(&pdu, &mut BytesMut::new());
            prop_assert_eq!(encoded.wire_len(), wire.len());
            prop_assert_eq!(wire.len() % 4, 0);
            let dsl = (usize::from(wire[5]) << 16) | (usize::from(wire[6]) << 8) | usize::from(wire[7]);
            prop_assert_eq!(dsl, pdu.data().len());
            // Every strict prefix asks for more bytes; the whole PDU decodes to itself.
            for cut in [0, 1, 47, 48, wire.len() / 2, wire.len() - 1] {
                let mut partial = BytesMut::from(&wire[..cut.min(wire.len() - 1)]);
                prop_assert_eq!(framer.decode(&mut partial), Ok(None));
                prop_assert!(framer.bytes_needed(&partial) >= 1);
            }
            let mut buf = BytesMut::from(&wire[..]);
            buf.extend_from_slice(&wire);
            prop_assert_eq!(framer.decode(&mut buf), Ok(Some(pdu.clone())));
            prop_assert_eq!(framer.decode(&mut buf), Ok(Some(pdu.clone())));
            prop_assert!(buf.is_empty());
        }
    }

    #[test]
    fn corrupted_digests_are_caught(pdu in nop_out(), flip in 0usize..4096) {
        let framer = Framer { header_digest: true, data_digest: true, max_recv_data_segment_length: 4096 };
        let mut wire = framer.encode_to_vec(&pdu);
        let at = flip % wire.len();
        wire[at] ^= 0x01;
        // Either digest fails, or the flip hit padding/length so framing sees something else;
        // it must never come back as the original PDU.
        let mut buf = BytesMut::from(&wire[..]);
        prop_assert_ne!(framer.decode(&mut buf), Ok(Some(pdu)));
    }
}

#[test]
fn oversized_segment_refused_before_buffering() {
    let framer = Framer::default();
    let pdu = Pdu::NopOut(NopOut {
        data: Bytes::from(vec![0u8; 9000]),
        ..NopOut::default()
    });
    let wire = Framer {
        max_recv_data_segment_length: 1 << 20,
        ..framer
    }
    .encode_to_vec(&pdu);
    let mut buf = BytesMut::from(&wire[..48]);
    assert!(matches!(
        framer.decode(&mut buf),
        Err(PduError::DataSegmentTooLong { len: 9000, .. })
    ));
}
