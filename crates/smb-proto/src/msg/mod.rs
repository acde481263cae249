//! One type per SMB2 message (MS-SMB2 2.2). Decoders take the whole message, header first, since
//! the body's offsets count from the header; they borrow buffers from it. Encoders append the
//! body to `out` and compute offsets as if it follows a 64-byte header directly.

use crate::error::DecodeError;
use crate::header::{Command, Header, HEADER_LEN};
use crate::wire::Reader;

pub mod create;
pub mod create_ctx;
pub mod info;
pub mod io;
pub mod ioctl;
pub mod lock;
pub mod misc;
pub mod negotiate;
pub mod oplock;
pub mod session;
pub mod tree;

pub use create::{CloseRequest, CloseResponse, CreateContext, CreateRequest, CreateResponse};
pub use info::{
    ChangeNotifyRequest, ChangeNotifyResponse, QueryDirectoryRequest, QueryDirectoryResponse,
    QueryInfoRequest, QueryInfoResponse, SetInfoRequest, SetInfoResponse,
};
pub use io::{FlushRequest, FlushResponse, ReadRequest, ReadResponse, WriteRequest, WriteResponse};
pub use ioctl::{IoctlRequest, IoctlResponse};
pub use lock::{LockElement, LockRequest, LockResponse};
pub use misc::{
    CancelRequest, EchoRequest, EchoResponse, ErrorResponse, LogoffRequest, LogoffResponse,
    TreeDisconnectRequest, TreeDisconnectResponse,
};
pub use negotiate::{NegotiateContext, NegotiateRequest, NegotiateResponse};
pub use oplock::OplockBreak;
pub use session::{SessionSetupRequest, SessionSetupResponse};
pub use tree::{TreeConnectRequest, TreeConnectResponse};

/// A wire message body.
pub trait Message<'a>: Sized {
    /// The StructureSize the body starts with.
    const STRUCTURE_SIZE: u16;
    const NAME: &'static str;
    /// Decodes the body of `msg` (the header first).
    fn decode(msg: &'a [u8]) -> Result<Self, DecodeError>;
    /// Appends the body; buffer offsets assume a 64-byte header right before it.
    fn encode(&self, out: &mut Vec<u8>);
}

/// A file handle (MS-SMB2 2.2.14.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FileId {
    pub persistent: u64,
    pub volatile: u64,
}

impl FileId {
    /// The "use the previous one" FileId of related compound operations.
    pub const RELATED: FileId = FileId {
        persistent: u64::MAX,
        volatile: u64::MAX,
    };
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(FileId {
            persistent: r.u64()?,
            volatile: r.u64()?,
        })
    }
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        crate::wire::put_u64(out, self.persistent);
        crate::wire::put_u64(out, self.volatile);
    }
}

/// A reader positioned after the StructureSize of `msg`'s body, once it matched `size`.
pub(crate) fn body<'a>(
    msg: &'a [u8],
    size: u16,
    what: &'static str,
) -> Result<Reader<'a>, DecodeError> {
    let mut r = Reader::at(msg, HEADER_LEN, what);
    let found = r.u16()?;
    if found != size {
        return Err(DecodeError::StructureSize {
            what,
            expected: size,
            found,
        });
    }
    Ok(r)
}

/// The offset from the header start of the next byte appended to `out`, for a body that began
/// at `body_start`.
pub(crate) fn here(out: &[u8], body_start: usize) -> usize {
    HEADER_LEN + out.len() - body_start
}

/// Header bytes followed by the body: a whole message ready for signing.
pub fn encode_message<'a, M: Message<'a>>(header: &Header, body: &M) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    header.encode(&mut out);
    body.encode(&mut out);
    out
}

/// A request, decoded by the header's command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Negotiate(NegotiateRequest<'a>),
    SessionSetup(SessionSetupRequest<'a>),
    Logoff(LogoffRequest),
    TreeConnect(TreeConnectRequest<'a>),
    TreeDisconnect(TreeDisconnectRequest),
    Create(CreateRequest<'a>),
    Close(CloseRequest),
    Flush(FlushRequest),
    Read(ReadRequest<'a>),
    Write(WriteRequest<'a>),
    Lock(LockRequest),
    Ioctl(IoctlRequest<'a>),
    Cancel(CancelRequest),
    Echo(EchoRequest),
    QueryDirectory(QueryDirectoryRequest<'a>),
    ChangeNotify(ChangeNotifyRequest),
    QueryInfo(QueryInfoRequest<'a>),
    SetInfo(SetInfoRequest<'a>),
    OplockBreak(OplockBreak),
}

impl<'a> Request<'a> {
    /// Decodes the body of one message of a chain by its header's command. An unknown command
    /// answers STATUS_INVALID_PARAMETER.
    pub fn decode(header: &Header, msg: &'a [u8]) -> Result<Self, DecodeError> {
        Ok(match header.command {
            Command::Negotiate => Request::Negotiate(NegotiateRequest::decode(msg)?),
            Command::SessionSetup => Request::SessionSetup(SessionSetupRequest::decode(msg)?),
            Command::Logoff => Request::Logoff(LogoffRequest::decode(msg)?),
            Command::TreeConnect => Request::TreeConnect(TreeConnectRequest::decode(msg)?),
            Command::TreeDisconnect => Request::TreeDisconnect(TreeDisconnectRequest::decode(msg)?),
            Command::Create => Request::Create(CreateRequest::decode(msg)?),
            Command::Close => Request::Close(CloseRequest::decode(msg)?),
            Command::Flush => Request::Flush(FlushRequest::decode(msg)?),
            Command::Read => Request::Read(ReadRequest::decode(msg)?),
            Command::Write => Request::Write(WriteRequest::decode(msg)?),
            Command::Lock => Request::Lock(LockRequest::decode(msg)?),
            Command::Ioctl => Request::Ioctl(IoctlRequest::decode(msg)?),
            Command::Cancel => Request::Cancel(CancelRequest::decode(msg)?),
            Command::Echo => Request::Echo(EchoRequest::decode(msg)?),
            Command::QueryDirectory => Request::QueryDirectory(QueryDirectoryRequest::decode(msg)?),
            Command::ChangeNotify => Request::ChangeNotify(ChangeNotifyRequest::decode(msg)?),
            Command::QueryInfo => Request::QueryInfo(QueryInfoRequest::decode(msg)?),
            Command::SetInfo => Request::SetInfo(SetInfoRequest::decode(msg)?),
            Command::OplockBreak => Request::OplockBreak(OplockBreak::decode(msg)?),
            Command::Other(_) => return Err(DecodeError::Invalid("unknown command")),
        })
    }

    /// The payload size a request's CreditCharge must cover (MS-SMB2 3.3.5.2.5): the larger
    /// of what it sends and what it asks to receive.
    pub fn payload_size(&self) -> u64 {
        let n = |v: usize| v as u64;
        match self {
            Request::Read(r) => u64::from(r.length),
            Request::Write(w) => n(w.data.len()),
            Request::Ioctl(i) => n(i.input.len() + i.output.len())
                .max(u64::from(i.max_input_response).max(u64::from(i.max_output_response))),
            Request::QueryDirectory(q) => u64::from(q.output_buffer_length),
            Request::ChangeNotify(c) => u64::from(c.output_buffer_length),
            Request::QueryInfo(q) => n(q.input.len()).max(u64::from(q.output_buffer_length)),
            Request::SetInfo(s) => n(s.buffer.len()),
            _ => 0,
        }
    }
}
