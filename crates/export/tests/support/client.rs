//! A small NBD client for tests: raw byte access for handshake tests, and a pipelining
//! transmission client that tracks which cookies are reads (simple replies carry no length).

use std::collections::HashMap;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use lanes_export::nbd::proto::{
    ClientFlags, Command, CommandFlags, ErrorCode, Greeting, Info, InfoRequest, InfoType,
    OptionCode, OptionReply, OptionRequest, ReplyType, Request, SimpleReply,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

type Reader = Box<dyn AsyncRead + Unpin + Send>;
type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// A connection with a receive buffer.
pub struct Conn {
    reader: Reader,
    writer: Writer,
    buf: BytesMut,
}

impl Conn {
    pub async fn connect(addr: &str) -> Conn {
        let (reader, writer): (Reader, Writer) = match addr.strip_prefix("unix:") {
            Some(path) => {
                let (r, w) = tokio::net::UnixStream::connect(path)
                    .await
                    .unwrap()
                    .into_split();
                (Box::new(r), Box::new(w))
            }
            None => {
                let (r, w) = tokio::net::TcpStream::connect(addr)
                    .await
                    .unwrap()
                    .into_split();
                (Box::new(r), Box::new(w))
            }
        };
        Conn {
            reader,
            writer,
            buf: BytesMut::new(),
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) {
        self.writer.write_all(bytes).await.unwrap();
    }

    /// Sends, tolerating a server that already closed.
    pub async fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.writer.write_all(bytes).await
    }

    /// Reads until `n` bytes are buffered; false if the server closed first.
    pub async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() < n {
            match tokio::time::timeout(Duration::from_secs(20), self.reader.read_buf(&mut self.buf))
                .await
                .expect("server did not answer within 20 s")
            {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        true
    }

    pub async fn take(&mut self, n: usize) -> Bytes {
        assert!(self.fill(n).await, "server closed the connection");
        self.buf.split_to(n).freeze()
    }

    /// True once the server has closed the connection (EOF or reset), within 20 s.
    pub async fn closed(&mut self) -> bool {
        let mut scratch = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(20), self.reader.read(&mut scratch))
                .await
            {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {}
            }
        }
    }

    pub async fn greeting(&mut self) -> Greeting {
        let mut bytes = self.take(Greeting::LEN).await;
        Greeting::decode(&mut bytes).unwrap()
    }

    /// Greeting read and client flags sent.
    pub async fn start(addr: &str, flags: ClientFlags) -> Conn {
        let mut conn = Conn::connect(addr).await;
        conn.greeting().await;
        let mut out = BytesMut::new();
        flags.encode(&mut out);
        conn.send(&out).await;
        conn
    }

    pub async fn option(&mut self, option: OptionCode, data: &[u8]) {
        let mut out = BytesMut::new();
        OptionRequest {
            option,
            data: Bytes::copy_from_slice(data),
        }
        .encode(&mut out);
        self.send(&out).await;
    }

    pub async fn option_reply(&mut self) -> OptionReply {
        loop {
            match OptionReply::decode(&mut self.buf, 1 << 20) {
                Ok(reply) => return reply,
                Err(lanes_export::nbd::proto::ProtoError::Incomplete { needed }) => {
                    let want = self.buf.len() + needed;
                    assert!(self.fill(want).await, "server closed during option reply");
                }
                Err(e) => panic!("bad option reply: {e}"),
            }
        }
    }

    /// `NBD_OPT_GO` asking for block sizes; returns the infos sent.
    pub async fn go(&mut self, name: &str) -> Vec<Info> {
        let mut data = BytesMut::new();
        InfoRequest {
            name: Bytes::copy_from_slice(name.as_bytes()),
            requests: vec![InfoType::BLOCK_SIZE],
        }
        .encode(&mut data);
        self.option(OptionCode::GO, &data).await;
        let mut infos = Vec::new();
        loop {
            let reply = self.option_reply().await;
            assert_eq!(reply.option, OptionCode::GO);
            match reply.reply {
                ReplyType::INFO => infos.push(Info::decode(reply.data).unwrap()),
                ReplyType::ACK => return infos,
                other => panic!("GO failed: {other:?} {:?}", reply.data),
            }
        }
    }
}

/// A transmission-phase client.
pub struct Client {
    pub conn: Conn,
    pub size: u64,
    next_cookie: u64,
    reads: HashMap<u64, u32>,
}

impl Client {
    pub async fn connect(addr: &str) -> Client {
        let mut conn =
            Conn::start(addr, ClientFlags::FIXED_NEWSTYLE | ClientFlags::NO_ZEROES).await;
        let infos = conn.go(super::EXPORT).await;
        let size = infos
            .iter()
            .find_map(|i| match i {
                Info::Export { size, .. } => Some(*size),
                _ => None,
            })
            .expect("NBD_INFO_EXPORT");
        Client {
            conn,
            size,
            next_cookie: 1,
            reads: HashMap::new(),
        }
    }

    /// Sends a request (and a write's payload); returns its cookie.
    pub async fn submit(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> u64 {
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        if command == Command::READ {
            self.reads.insert(cookie, length);
        }
        let mut out = BytesMut::with_capacity(Request::LEN + payload.len());
        Request {
            flags: CommandFlags(flags),
            command,
            cookie,
            offset,
            length,
        }
        .encode(&mut out);
        out.extend_from_slice(payload);
        self.conn.send(&out).await;
        cookie
    }

    /// The next reply: cookie, error, and a successful read's data.
    pub async fn reply(&mut self) -> (u64, ErrorCode, Bytes) {
        let mut header = self.conn.take(SimpleReply::LEN).await;
        let reply = SimpleReply::decode(&mut header).unwrap();
        let read_len = self.reads.remove(&reply.cookie);
        let data = match read_len {
            Some(len) if reply.error == ErrorCode::OK => self.conn.take(len as usize).await,
            _ => Bytes::new(),
        };
        (reply.cookie, reply.error, data)
    }

    /// One request, waiting for its reply.
    pub async fn call(
        &mut self,
        command: Command,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> (ErrorCode, Bytes) {
        let cookie = self.submit(command, flags, offset, length, payload).await;
        let (got, error, data) = self.reply().await;
        assert_eq!(got, cookie);
        (error, data)
    }

    pub async fn read(&mut self, offset: u64, len: u32) -> Bytes {
        let (error, data) = self.call(Command::READ, 0, offset, len, &[]).await;
        assert_eq!(error, ErrorCode::OK, "read of {len} at {offset}");
        data
    }

    pub async fn write(&mut self, offset: u64, data: &[u8]) {
        let (error, _) = self
            .call(Command::WRITE, 0, offset, data.len() as u32, data)
            .await;
        assert_eq!(error, ErrorCode::OK, "write of {} at {offset}", data.len());
    }

    pub async fn disconnect(mut self) {
        self.submit(Command::DISC, 0, 0, 0, &[]).await;
        assert!(self.conn.closed().await, "server closes after NBD_CMD_DISC");
    }
}
