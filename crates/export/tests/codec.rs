//! The sans-IO NBD codec and handshake: round-trips for every message, partial input,
//! malformed input, and random bytes (never a panic).

use bytes::{Buf, Bytes, BytesMut};
use lanes_export::nbd::handshake::{ExportInfo, Handshake, HandshakeError, Progress};
use lanes_export::nbd::proto::*;
use proptest::prelude::*;

fn bytes(max: usize) -> impl Strategy<Value = Bytes> {
    proptest::collection::vec(any::<u8>(), 0..max).prop_map(Bytes::from)
}

fn info() -> impl Strategy<Value = Info> {
    prop_oneof![
        (any::<u64>(), any::<u16>()).prop_map(|(size, flags)| Info::Export {
            size,
            flags: TransmissionFlags(flags)
        }),
        bytes(64).prop_map(Info::Name),
        bytes(64).prop_map(Info::Description),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(minimum, preferred, maximum)| {
            Info::BlockSize {
                minimum,
                preferred,
                maximum,
            }
        }),
        (4u16.., bytes(32)).prop_map(|(info, data)| Info::Unknown {
            info: InfoType(info),
            data
        }),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    (
        any::<u16>(),
        any::<u16>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(flags, command, cookie, offset, length)| Request {
            flags: CommandFlags(flags),
            command: Command(command),
            cookie,
            offset,
            length,
        })
}

/// Every strict prefix of `encoded` is `Incomplete` and consumes nothing.
fn check_prefixes<T: std::fmt::Debug>(
    encoded: &[u8],
    decode: impl Fn(&mut BytesMut) -> Result<T, ProtoError>,
) -> Result<(), TestCaseError> {
    for cut in 0..encoded.len() {
        let mut buf = BytesMut::from(&encoded[..cut]);
        match decode(&mut buf) {
            Err(ProtoError::Incomplete { needed }) => {
                prop_assert!(needed > 0 && cut + needed <= encoded.len());
                prop_assert_eq!(buf.len(), cut, "nothing consumed");
            }
            other => prop_assert!(false, "prefix of {} decoded as {:?}", cut, other),
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn fixed_size_messages_round_trip(
        handshake in any::<u16>(), client in any::<u32>(), request in request(),
        error in any::<u32>(), cookie in any::<u64>(), size in any::<u64>(), flags in any::<u16>(),
        padded in any::<bool>(),
    ) {
        let mut buf = BytesMut::new();
        let greeting = Greeting { flags: HandshakeFlags(handshake) };
        greeting.encode(&mut buf);
        prop_assert_eq!(buf.len(), Greeting::LEN);
        check_prefixes(&buf, Greeting::decode)?;
        prop_assert_eq!(Greeting::decode(&mut buf).unwrap(), greeting);

        ClientFlags(client).encode(&mut buf);
        prop_assert_eq!(ClientFlags::decode(&mut buf).unwrap(), ClientFlags(client));

        request.encode(&mut buf);
        prop_assert_eq!(buf.len(), Request::LEN);
        check_prefixes(&buf, Request::decode)?;
        prop_assert_eq!(Request::decode(&mut buf).unwrap(), request);

        let reply = SimpleReply { error: ErrorCode(error), cookie };
        prop_assert_eq!(&reply.to_bytes()[..], {
            reply.encode(&mut buf);
            buf.split().freeze()
        });
        buf.extend_from_slice(&reply.to_bytes());
        prop_assert_eq!(SimpleReply::decode(&mut buf).unwrap(), reply);

        let export = ExportNameReply { size, flags: TransmissionFlags(flags), zero_padding: padded };
        export.encode(&mut buf);
        prop_assert_eq!(buf.len(), export.len());
        check_prefixes(&buf, |b| ExportNameReply::decode(b, padded))?;
        prop_assert_eq!(ExportNameReply::decode(&mut buf, padded).unwrap(), export);
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn variable_messages_round_trip(
        option in any::<u32>(), reply in any::<u32>(), data in bytes(300),
        name in bytes(100), requests in proptest::collection::vec(any::<u16>(), 0..20),
        info in info(),
    ) {
        let request = OptionRequest { option: OptionCode(option), data: data.clone() };
        let mut buf = BytesMut::new();
        request.encode(&mut buf);
        prop_assert_eq!(buf.len(), OptionHeader::LEN + data.len());
        check_prefixes(&buf, |b| OptionRequest::decode(b, 1024))?;
        prop_assert_eq!(OptionRequest::decode(&mut buf, 1024).unwrap(), request);

        let option_reply = OptionReply { option: OptionCode(option), reply: ReplyType(reply), data };
        option_reply.encode(&mut buf);
        check_prefixes(&buf, |b| OptionReply::decode(b, 1024))?;
        prop_assert_eq!(OptionReply::decode(&mut buf, 1024).unwrap(), option_reply);

        let info_request = InfoRequest {
            name,
            requests: requests.into_iter().map(InfoType).collect(),
        };
        info_request.encode(&mut buf);
        prop_assert_eq!(InfoRequest::decode(buf.split().freeze()).unwrap(), info_request);

        info.encode(&mut buf);
        prop_assert_eq!(Info::decode(buf.split().freeze()).unwrap(), info);
    }

    #[test]
    fn random_bytes_never_panic_a_decoder(data in bytes(200), max in any::<u32>()) {
        let _ = Greeting::decode(&mut data.clone());
        let _ = ClientFlags::decode(&mut data.clone());
        let _ = OptionHeader::decode(&mut data.clone());
        let _ = OptionRequest::decode(&mut BytesMut::from(&data[..]), max);
        let _ = OptionReply::decode(&mut BytesMut::from(&data[..]), max);
        let _ = ExportNameReply::decode(&mut data.clone(), true);
        let _ = InfoRequest::decode(data.clone());
        let _ = Info::decode(data.clone());
        let _ = Request::decode(&mut data.clone());
        let _ = SimpleReply::decode(&mut data.clone());
    }

    /// Random client bytes, whole or in random pieces: the handshake answers or refuses,
    /// never panics, and the answer does not depend on how the stream was cut.
    #[test]
    fn handshake_survives_random_input_in_any_cuts(
        options in proptest::collection::vec((0u32..13, bytes(80)), 0..6),
        garbage in bytes(100),
        cuts in proptest::collection::vec(0usize..800, 0..8),
        prefix_valid in any::<bool>(),
    ) {
        let mut stream = BytesMut::new();
        if prefix_valid {
            ClientFlags(3).encode(&mut stream);
        }
        // Well-formed options with random codes and data (so most of the state machine is
        // reached), then garbage.
        for (option, data) in options {
            OptionRequest { option: OptionCode(option), data }.encode(&mut stream);
        }
        stream.extend_from_slice(&garbage);
        let whole = drive(&stream, &[]);
        let pieces = drive(&stream, &cuts);
        prop_assert_eq!(whole, pieces);
    }
}

fn export() -> ExportInfo {
    ExportInfo {
        name: "export".into(),
        size: 1 << 30,
        flags: TransmissionFlags::HAS_FLAGS | TransmissionFlags::SEND_FLUSH,
        minimum_block: 512,
        preferred_block: 65536,
        maximum_payload: 4 << 20,
    }
}

/// Feeds `stream` in pieces cut at `cuts`; returns all output and how it ended.
fn drive(stream: &[u8], cuts: &[usize]) -> (Vec<u8>, String) {
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c.min(stream.len())).collect();
    cuts.push(stream.len());
    cuts.sort_unstable();
    let mut handshake = Handshake::new(export());
    let mut output = handshake.take_output().to_vec();
    let mut input = BytesMut::new();
    let mut fed = 0;
    for cut in cuts {
        input.extend_from_slice(&stream[fed..cut]);
        fed = cut;
        let result = handshake.handle(&mut input);
        output.extend_from_slice(&handshake.take_output());
        match result {
            Ok(Progress::NeedInput) => {}
            Ok(end) => return (output, format!("{end:?}")),
            Err(e) => return (output, format!("{e}")),
        }
    }
    (output, "NeedInput".into())
}

#[test]
fn malformed_messages_are_clear_errors() {
    let mut bad = BytesMut::from(&[0u8; 28][..]);
    assert!(matches!(
        Request::decode(&mut bad),
        Err(ProtoError::BadMagic { expected, .. }) if expected == u64::from(REQUEST_MAGIC)
    ));
    let mut header = BytesMut::new();
    OptionHeader {
        option: OptionCode::GO,
        length: u32::MAX,
    }
    .encode(&mut header);
    assert!(matches!(
        OptionRequest::decode(&mut header, 65536),
        Err(ProtoError::TooLarge { len, .. }) if len == u64::from(u32::MAX)
    ));
    assert_eq!(header.len(), OptionHeader::LEN, "nothing consumed");
    assert!(InfoRequest::decode(Bytes::from_static(&[0, 0, 0, 9, 1, 2])).is_err());
    assert!(InfoRequest::decode(Bytes::from_static(&[0, 0, 0, 0, 0, 2, 0, 1])).is_err());
    assert!(
        Info::decode(Bytes::from_static(&[0, 0, 1, 2, 3])).is_err(),
        "short EXPORT"
    );
    assert!(
        Info::decode(Bytes::from_static(&[0, 3, 0, 0, 2, 0])).is_err(),
        "short BLOCK_SIZE"
    );
    let mut reply = BytesMut::new();
    OptionReply {
        option: OptionCode::LIST,
        reply: ReplyType::SERVER,
        data: Bytes::from_static(b"xx"),
    }
    .encode(&mut reply);
    assert!(matches!(
        OptionReply::decode(&mut reply, 1),
        Err(ProtoError::TooLarge { .. })
    ));
    assert!(ReplyType::ERR_UNSUP.is_error() && !ReplyType::ACK.is_error());
    assert_eq!(format!("{:?}", Command::WRITE_ZEROES), "WRITE_ZEROES");
    assert_eq!(format!("{:?}", Command(99)), "Command(0x63)");
}

#[test]
fn handshake_refuses_unknown_flags_and_exports() {
    let mut hs = Handshake::new(export());
    let mut greeting = hs.take_output();
    assert_eq!(
        Greeting::decode(&mut greeting).unwrap().flags,
        HandshakeFlags(3)
    );
    let mut input = BytesMut::from(&[0, 0, 0, 4][..]);
    assert_eq!(
        hs.handle(&mut input),
        Err(HandshakeError::UnknownClientFlags(4))
    );

    let mut hs = Handshake::new(export());
    let mut input = BytesMut::new();
    ClientFlags(1).encode(&mut input);
    OptionRequest {
        option: OptionCode::EXPORT_NAME,
        data: Bytes::from_static(b"other"),
    }
    .encode(&mut input);
    assert!(
        matches!(hs.handle(&mut input), Err(HandshakeError::UnknownExport(name)) if name == "other")
    );
    assert_eq!(hs.handle(&mut input), Err(HandshakeError::Finished));

    // An over-long option is skipped even when its data arrives in pieces.
    let mut hs = Handshake::new(export());
    hs.take_output();
    let mut input = BytesMut::new();
    ClientFlags(3).encode(&mut input);
    OptionHeader {
        option: OptionCode(42),
        length: 1 << 20,
    }
    .encode(&mut input);
    assert_eq!(hs.handle(&mut input).unwrap(), Progress::NeedInput);
    for _ in 0..16 {
        input.extend_from_slice(&[7u8; 65536]);
        assert_eq!(hs.handle(&mut input).unwrap(), Progress::NeedInput);
    }
    let mut out = BytesMut::from(&hs.take_output()[..]);
    let reply = OptionReply::decode(&mut out, 1024).unwrap();
    assert_eq!(
        (reply.option, reply.reply),
        (OptionCode(42), ReplyType::ERR_TOO_BIG)
    );
    assert!(!input.has_remaining());
}
