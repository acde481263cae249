use super::*;
use proptest::prelude::*;

fn gens() -> impl Strategy<Value = Generations> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(c, b, h0, h1)| {
        Generations {
            current: c,
            bitmap: b,
            history: [h0, h1],
        }
    })
}

/// Mostly short payloads, sometimes one around [`SPLIT_MIN`] (a pattern, not random bytes, so
/// the cases stay quick), which `encode_split` leaves out of the frame's bytes.
fn data() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        3 => proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from),
        1 => (any::<u8>(), SPLIT_MIN - 2..SPLIT_MIN + 70_000).prop_map(|(seed, n)| {
            Bytes::from((0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect::<Vec<u8>>())
        }),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (
            any::<u16>(),
            gens(),
            0u8..8,
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>()
        )
            .prop_map(
                |(version, gens, flags, lun_blocks, block_size, region_blocks, next_wseq)| {
                    Body::Hello(Hello {
                        version,
                        gens,
                        outdated: flags & 1 != 0,
                        alone: flags & 2 != 0,
                        booted: flags & 4 != 0,
                        lun_blocks,
                        block_size,
                        region_blocks,
                        next_wseq,
                    })
                }
            ),
        (any::<u64>(), proptest::collection::vec(any::<u64>(), 0..8))
            .prop_map(|(first_word, words)| Body::Bitmap(Bitmap { first_word, words })),
        any::<u64>().prop_map(|set_bits| Body::BitmapEnd(BitmapEnd { set_bits })),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>(),
            data()
        )
            .prop_map(|(wseq, seen, lba, blocks, fua, data)| Body::Write(Write {
                wseq,
                seen,
                lba,
                blocks,
                fua,
                data
            })),
        (any::<u64>(), 0u8..3, any::<u64>()).prop_map(|(wseq, s, fence)| {
            let status = [
                WriteStatus::Applied,
                WriteStatus::Superseded,
                WriteStatus::Retry,
            ][s as usize];
            Body::WriteAck(WriteAck {
                wseq,
                status,
                fence,
            })
        }),
        any::<u64>().prop_map(|sent_at| Body::Heartbeat(Heartbeat { sent_at })),
        any::<u64>().prop_map(|echo| Body::HeartbeatAck(HeartbeatAck { echo })),
        any::<u64>().prop_map(|id| Body::Flush(Flush { id })),
        any::<u64>().prop_map(|id| Body::FlushAck(FlushAck { id })),
        (any::<u64>(), any::<u32>(), data())
            .prop_map(|(lba, blocks, data)| Body::ResyncData(ResyncData { lba, blocks, data })),
        (any::<u64>(), any::<u32>())
            .prop_map(|(lba, blocks)| Body::ResyncAck(ResyncAck { lba, blocks })),
        gens().prop_map(|gens| Body::ResyncDone(ResyncDone { gens })),
        (any::<u64>(), 0u8..3, any::<u64>(), data()).prop_map(|(id, k, base, payload)| {
            Body::Shared(Shared {
                id,
                kind: [SharedKind::Change, SharedKind::Snapshot, SharedKind::Notice][k as usize],
                base,
                payload,
            })
        }),
        (any::<u64>(), any::<bool>())
            .prop_map(|(id, accepted)| Body::SharedAck(SharedAck { id, accepted })),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            any::<bool>(),
            data(),
            data()
        )
            .prop_map(|(id, lba, blocks, fua, verify, write)| Body::Caw(Caw {
                id,
                lba,
                blocks,
                fua,
                verify,
                write,
            })),
        (any::<u64>(), 0u8..3, any::<u64>()).prop_map(|(id, k, i)| Body::CawResult(CawResult {
            id,
            status: [
                CawStatus::Written,
                CawStatus::Miscompare(i),
                CawStatus::Refused
            ][k as usize],
        })),
        (any::<u64>(), proptest::collection::vec(any::<u64>(), 0..8))
            .prop_map(|(first_word, words)| Body::Suspect(Suspect { first_word, words })),
        (any::<u64>(), any::<u32>(), data())
            .prop_map(|(lba, blocks, sums)| Body::ResyncSums(ResyncSums { lba, blocks, sums })),
        (any::<u64>(), any::<u32>(), data()).prop_map(|(lba, blocks, differ)| {
            Body::ResyncDiffer(ResyncDiffer {
                lba,
                blocks,
                differ,
            })
        }),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    (any::<u64>(), any::<u8>(), any::<u64>(), body()).prop_map(|(epoch, node, seq, body)| Message {
        header: Header { epoch, node, seq },
        body,
    })
}

/// Every data payload a message carries.
fn payloads(m: &Message) -> impl Iterator<Item = &Bytes> {
    let v: Vec<&Bytes> = match &m.body {
        Body::Write(w) => vec![&w.data],
        Body::ResyncData(r) => vec![&r.data],
        Body::ResyncSums(r) => vec![&r.sums],
        Body::ResyncDiffer(r) => vec![&r.differ],
        Body::Shared(s) => vec![&s.payload],
        Body::Caw(c) => vec![&c.verify, &c.write],
        _ => vec![],
    };
    v.into_iter()
}

proptest! {
    #[test]
    fn round_trip(msgs in proptest::collection::vec(message(), 1..4)) {
        let mut wire = Vec::new();
        for m in &msgs {
            encode(m, &mut wire);
        }
        let mut buf = Bytes::from(wire);
        for m in &msgs {
            // Every strict prefix of a frame asks for more bytes or decodes an earlier frame.
            let (got, used) = decode(&buf).unwrap().unwrap();
            prop_assert_eq!(&got, m);
            prop_assert_eq!(decode(&buf.slice(..used - 1)), Ok(None));
            buf = buf.slice(used..);
        }
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn split_frames_are_the_same_bytes(msgs in proptest::collection::vec(message(), 1..4)) {
        let (mut plain, mut out, mut split) = (Vec::new(), vec![0xee], Vec::new());
        for m in &msgs {
            encode(m, &mut plain);
            encode_split(m, &mut out, &mut split);
        }
        // Bytes already queued stay in front; payloads go where their offsets say.
        let large = msgs.iter().map(|m| payloads(m).filter(|d| d.len() >= SPLIT_MIN).count());
        prop_assert_eq!(split.len(), large.sum::<usize>());
        let (mut wire, mut at) = (Vec::new(), 1);
        for (offset, data) in &split {
            prop_assert!(data.len() >= SPLIT_MIN);
            wire.extend_from_slice(&out[at..*offset]);
            wire.extend_from_slice(data);
            at = *offset;
        }
        wire.extend_from_slice(&out[at..]);
        prop_assert_eq!(out[0], 0xee);
        prop_assert!(wire == plain, "the split frames differ from the copied ones");
    }

    #[test]
    fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let buf = Bytes::from(bytes);
        if let Ok(Some((msg, used))) = decode(&buf) {
            prop_assert!(used <= buf.len());
            let again = encode_to_vec(&msg);
            prop_assert_eq!(&again[..], &buf[..used]);
        }
    }

    #[test]
    fn any_flipped_bit_is_refused(m in message(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut wire = encode_to_vec(&m);
        let i = at.index(wire.len());
        wire[i] ^= 1 << bit;
        // A flipped bit gives an error or a short read (length grew), never another message.
        let got = decode(&Bytes::from(wire));
        prop_assert!(!matches!(got, Ok(Some(_))), "decoded {:?}", got);
    }
}

#[test]
fn errors_are_specific() {
    let m = Message {
        header: Header {
            epoch: 1,
            node: 0,
            seq: 1,
        },
        body: Body::Flush(Flush { id: 9 }),
    };
    let wire = encode_to_vec(&m);
    let mut bad = wire.clone();
    bad[wire.len() - 1] ^= 0xff;
    assert_eq!(decode(&Bytes::from(bad)), Err(DecodeError::Checksum));
    assert_eq!(
        decode(&Bytes::from_static(&[1, 0, 0, 0, 0])),
        Err(DecodeError::Length(1))
    );
    assert_eq!(
        decode(&Bytes::from_static(&[0xff, 0xff, 0xff, 0xff])),
        Err(DecodeError::Length(u32::MAX))
    );
    // An unknown type with a valid checksum.
    let mut unk = wire.clone();
    unk[4] = 99;
    let n = unk.len();
    let crc = crc32c::crc32c(&unk[..n - 4]);
    unk[n - 4..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(decode(&Bytes::from(unk)), Err(DecodeError::UnknownType(99)));
}

/// Re-frames `wire` after `edit` changed its body (a valid checksum over invalid content).
fn reframe(mut wire: Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let n = wire.len();
    wire.truncate(n - 4);
    edit(&mut wire);
    let len = (wire.len() - 4 + 4) as u32;
    wire[..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c(&wire);
    wire.extend_from_slice(&crc.to_le_bytes());
    Bytes::from(wire)
}

#[test]
fn shared_messages_refuse_bad_fields() {
    let header = Header {
        epoch: 3,
        node: 1,
        seq: 7,
    };
    let shared = Message {
        header,
        body: Body::Shared(Shared {
            id: 5,
            kind: SharedKind::Change,
            base: 41,
            payload: Bytes::from_static(b"lanes-pr 1\ngeneration 2\n"),
        }),
    };
    let wire = encode_to_vec(&shared);
    let (got, used) = decode(&Bytes::from(wire.clone())).unwrap().unwrap();
    assert_eq!((got, used), (shared, wire.len()));
    // The kind byte sits after the 22-byte head and the 8-byte id.
    let bad_kind = reframe(wire.clone(), |w| w[22 + 8] = 3);
    assert_eq!(decode(&bad_kind), Err(DecodeError::Invalid("Shared kind")));
    // A payload length beyond the frame.
    let long = reframe(wire.clone(), |w| {
        let at = 22 + 8 + 1 + 8;
        w[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
    });
    assert_eq!(decode(&long), Err(DecodeError::Truncated));
    // A trailing byte after the payload.
    let trailing = reframe(wire, |w| w.push(0));
    assert_eq!(decode(&trailing), Err(DecodeError::Trailing(1)));
    let ack = Message {
        header,
        body: Body::SharedAck(SharedAck {
            id: 5,
            accepted: true,
        }),
    };
    let wire = encode_to_vec(&ack);
    assert_eq!(decode(&Bytes::from(wire.clone())).unwrap().unwrap().0, ack);
    let bad_flag = reframe(wire, |w| w[22 + 8] = 2);
    assert_eq!(
        decode(&bad_flag),
        Err(DecodeError::Invalid("SharedAck accepted"))
    );
}

#[test]
fn caw_messages_refuse_bad_fields() {
    let header = Header {
        epoch: 2,
        node: 1,
        seq: 9,
    };
    let caw = Message {
        header,
        body: Body::Caw(Caw {
            id: 4,
            lba: 100,
            blocks: 1,
            fua: false,
            verify: Bytes::from_static(b"old!"),
            write: Bytes::from_static(b"new!"),
        }),
    };
    let wire = encode_to_vec(&caw);
    assert_eq!(decode(&Bytes::from(wire.clone())).unwrap().unwrap().0, caw);
    // The fua flag sits after the head, id, lba and blocks.
    let bad_fua = reframe(wire.clone(), |w| w[22 + 8 + 8 + 4] = 2);
    assert_eq!(decode(&bad_fua), Err(DecodeError::Invalid("Caw fua")));
    // The write payload's length beyond the frame.
    let long = reframe(wire.clone(), |w| {
        let at = 22 + 8 + 8 + 4 + 1 + 4 + 4;
        w[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
    });
    assert_eq!(decode(&long), Err(DecodeError::Truncated));
    let trailing = reframe(wire, |w| w.push(0));
    assert_eq!(decode(&trailing), Err(DecodeError::Trailing(1)));
    for (status, offset) in [(0u8, 0u64), (1, 17), (2, 0)] {
        let result = Message {
            header,
            body: Body::CawResult(CawResult {
                id: 4,
                status: match status {
                    0 => CawStatus::Written,
                    1 => CawStatus::Miscompare(offset),
                    _ => CawStatus::Refused,
                },
            }),
        };
        let wire = encode_to_vec(&result);
        assert_eq!(decode(&Bytes::from(wire)).unwrap().unwrap().0, result);
    }
    let result = Message {
        header,
        body: Body::CawResult(CawResult {
            id: 4,
            status: CawStatus::Written,
        }),
    };
    let wire = encode_to_vec(&result);
    // An unknown status, and an offset with a status that has none.
    let bad_status = reframe(wire.clone(), |w| w[22 + 8] = 3);
    assert_eq!(
        decode(&bad_status),
        Err(DecodeError::Invalid("CawResult status"))
    );
    let stray_offset = reframe(wire, |w| w[22 + 8 + 1] = 1);
    assert_eq!(
        decode(&stray_offset),
        Err(DecodeError::Invalid("CawResult status"))
    );
}
