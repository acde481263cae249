//! Option haggling over a real socket: every option this server knows, unknown and malformed
//! ones, and the cases where the spec says the server must drop the client.

mod support;

use bytes::{BufMut, BytesMut};
use lanes_export::nbd::proto::{
    ClientFlags, Command, ExportNameReply, HandshakeFlags, Info, OptionCode, ReplyType,
    TransmissionFlags,
};
use lanes_export::{ExportError, MemoryDevice, NbdListen, NbdServer};
use support::client::{Client, Conn};
use support::{On, Served, EXPORT};

const SIZE: u64 = 8 << 20;

fn served() -> Served {
    Served::new(
        MemoryDevice::new(SIZE, 4096)
            .unwrap()
            .with_max_io(1 << 20)
            .unwrap(),
        On::Unix,
    )
}

fn fixed() -> ClientFlags {
    ClientFlags::FIXED_NEWSTYLE | ClientFlags::NO_ZEROES
}

#[test]
fn greeting_list_info_then_go() {
    let served = served();
    served.runtime.block_on(async {
        let mut conn = Conn::connect(&served.addr).await;
        let greeting = conn.greeting().await;
        assert_eq!(
            greeting.flags,
            HandshakeFlags::FIXED_NEWSTYLE | HandshakeFlags::NO_ZEROES
        );
        let mut out = BytesMut::new();
        fixed().encode(&mut out);
        conn.send(&out).await;

        conn.option(OptionCode::LIST, &[]).await;
        let server = conn.option_reply().await;
        assert_eq!(server.reply, ReplyType::SERVER);
        assert_eq!(&server.data[..4], &(EXPORT.len() as u32).to_be_bytes());
        assert_eq!(&server.data[4..], EXPORT.as_bytes());
        assert_eq!(conn.option_reply().await.reply, ReplyType::ACK);

        // INFO with a name request: export, block sizes and name, then ACK; still haggling.
        let mut data = BytesMut::new();
        data.put_u32(EXPORT.len() as u32);
        data.put_slice(EXPORT.as_bytes());
        data.put_u16(1);
        data.put_u16(1); // NBD_INFO_NAME
        conn.option(OptionCode::INFO, &data).await;
        let mut infos = Vec::new();
        loop {
            let reply = conn.option_reply().await;
            assert_eq!(reply.option, OptionCode::INFO);
            if reply.reply == ReplyType::ACK {
                break;
            }
            assert_eq!(reply.reply, ReplyType::INFO);
            infos.push(Info::decode(reply.data).unwrap());
        }
        let flags = TransmissionFlags::HAS_FLAGS
            | TransmissionFlags::SEND_FLUSH
            | TransmissionFlags::SEND_FUA
            | TransmissionFlags::SEND_TRIM
            | TransmissionFlags::SEND_WRITE_ZEROES
            | TransmissionFlags::CAN_MULTI_CONN;
        assert!(
            infos.contains(&Info::Export { size: SIZE, flags }),
            "{infos:?}"
        );
        assert!(infos.contains(&Info::BlockSize {
            minimum: 4096,
            preferred: 64 * 1024,
            maximum: 1 << 20
        }));
        assert!(infos.contains(&Info::Name(EXPORT.into())));

        // The default (empty) name is this export too; GO enters transmission.
        let infos = conn.go("").await;
        assert!(infos.contains(&Info::Export { size: SIZE, flags }));
    });
}

#[test]
fn unknown_unsupported_and_malformed_options_are_answered_not_fatal() {
    let served = served();
    served.runtime.block_on(async {
        let mut conn = Conn::start(&served.addr, fixed()).await;
        for option in [
            OptionCode(99),
            OptionCode::STARTTLS,
            OptionCode::STRUCTURED_REPLY,
            OptionCode::SET_META_CONTEXT,
            OptionCode::EXTENDED_HEADERS,
        ] {
            conn.option(option, &[]).await;
            let reply = conn.option_reply().await;
            assert_eq!(reply.option, option);
            assert_eq!(reply.reply, ReplyType::ERR_UNSUP, "{option:?}");
        }
        conn.option(OptionCode::LIST, b"junk").await;
        assert_eq!(conn.option_reply().await.reply, ReplyType::ERR_INVALID);
        // INFO whose name length runs past its data.
        let mut data = BytesMut::new();
        data.put_u32(1000);
        data.put_slice(b"export");
        data.put_u16(0);
        conn.option(OptionCode::INFO, &data).await;
        assert_eq!(conn.option_reply().await.reply, ReplyType::ERR_INVALID);
        // GO for an export that does not exist.
        let mut data = BytesMut::new();
        data.put_u32(5);
        data.put_slice(b"other");
        data.put_u16(0);
        conn.option(OptionCode::GO, &data).await;
        let reply = conn.option_reply().await;
        assert_eq!(reply.reply, ReplyType::ERR_UNKNOWN);
        assert!(!reply.data.is_empty(), "error replies carry a message");
        // Option data beyond the server's limit is skipped and refused.
        conn.option(OptionCode::INFO, &vec![0u8; 100 * 1024]).await;
        assert_eq!(conn.option_reply().await.reply, ReplyType::ERR_TOO_BIG);
        // After all that the client still gets in.
        conn.go(EXPORT).await;
    });
}

#[test]
fn export_name_with_and_without_zero_padding() {
    let served = served();
    served.runtime.block_on(async {
        for flags in [fixed(), ClientFlags::FIXED_NEWSTYLE] {
            let mut conn = Conn::start(&served.addr, flags).await;
            conn.option(OptionCode::EXPORT_NAME, EXPORT.as_bytes())
                .await;
            let padded = !flags.contains(ClientFlags::NO_ZEROES);
            let len = if padded { 134 } else { 10 };
            let mut bytes = conn.take(len).await;
            let reply = ExportNameReply::decode(&mut bytes, padded).unwrap();
            assert_eq!(reply.size, SIZE);
            assert!(reply.flags.contains(TransmissionFlags::SEND_FLUSH));
            // Transmission works right after: a flush.
            let mut out = BytesMut::new();
            lanes_export::nbd::proto::Request {
                flags: Default::default(),
                command: Command::FLUSH,
                cookie: 9,
                offset: 0,
                length: 0,
            }
            .encode(&mut out);
            conn.send(&out).await;
            let mut header = conn.take(16).await;
            let reply = lanes_export::nbd::proto::SimpleReply::decode(&mut header).unwrap();
            assert_eq!(reply.cookie, 9);
            assert_eq!(reply.error.0, 0);
        }
    });
}

#[test]
fn violations_end_the_session() {
    let served = served();
    served.runtime.block_on(async {
        // "MUST drop the TCP connection if the client sets an unknown flag".
        let mut conn = Conn::start(&served.addr, ClientFlags(1 << 7)).await;
        assert!(conn.closed().await, "unknown client flag");

        // Unknown export with EXPORT_NAME: no way to return an error, so the server closes.
        let mut conn = Conn::start(&served.addr, fixed()).await;
        conn.option(OptionCode::EXPORT_NAME, b"nope").await;
        assert!(conn.closed().await, "unknown export via EXPORT_NAME");

        // An option without the IHAVEOPT magic.
        let mut conn = Conn::start(&served.addr, fixed()).await;
        conn.send(&[0u8; 16]).await;
        assert!(conn.closed().await, "bad option magic");

        // ABORT is acknowledged, then the server closes.
        let mut conn = Conn::start(&served.addr, fixed()).await;
        conn.option(OptionCode::ABORT, &[]).await;
        assert_eq!(conn.option_reply().await.reply, ReplyType::ACK);
        assert!(conn.closed().await, "after NBD_OPT_ABORT");

        // A client that connects and leaves: nothing breaks, the next one is served.
        drop(Conn::connect(&served.addr).await);
        let client = Client::connect(&served.addr).await;
        client.disconnect().await;
    });
}

#[test]
fn bind_refuses_remote_tcp_and_live_sockets_replaces_stale_ones() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let remote: NbdListen = "192.0.2.1:10809".parse().unwrap();
        assert!(matches!(
            NbdServer::bind(&remote, EXPORT).await,
            Err(ExportError::RemoteRefused(_))
        ));
        assert!(matches!(
            NbdServer::bind(&remote, "a\0b").await,
            Err(ExportError::InvalidExportName(_))
        ));

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nbd.sock");
        // A socket file nobody listens on any more.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        let listen = NbdListen::Unix(path.clone());
        let live = NbdServer::bind(&listen, EXPORT)
            .await
            .expect("stale socket replaced");
        assert_eq!(live.local_addr(), format!("unix:{}", path.display()));
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        assert!(matches!(
            NbdServer::bind(&listen, EXPORT).await,
            Err(ExportError::SocketInUse(_))
        ));
    });
}
