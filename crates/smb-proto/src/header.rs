//! The 64-byte SMB2 packet header (MS-SMB2 2.2.1), sync and async forms.

use crate::error::DecodeError;
use crate::status::NtStatus;
use crate::wire::{put_u16, put_u32, put_u64, Reader};

pub const HEADER_LEN: usize = 64;
pub const PROTOCOL_ID: [u8; 4] = [0xFE, b'S', b'M', b'B'];

/// SMB2 commands (MS-SMB2 2.2.1.2); codes outside the table are kept as `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    Negotiate,
    SessionSetup,
    Logoff,
    TreeConnect,
    TreeDisconnect,
    Create,
    Close,
    Flush,
    Read,
    Write,
    Lock,
    Ioctl,
    Cancel,
    Echo,
    QueryDirectory,
    ChangeNotify,
    QueryInfo,
    SetInfo,
    OplockBreak,
    Other(u16),
}

const COMMANDS: [Command; 19] = [
    Command::Negotiate,
    Command::SessionSetup,
    Command::Logoff,
    Command::TreeConnect,
    Command::TreeDisconnect,
    Command::Create,
    Command::Close,
    Command::Flush,
    Command::Read,
    Command::Write,
    Command::Lock,
    Command::Ioctl,
    Command::Cancel,
    Command::Echo,
    Command::QueryDirectory,
    Command::ChangeNotify,
    Command::QueryInfo,
    Command::SetInfo,
    Command::OplockBreak,
];

impl Command {
    pub fn from_u16(v: u16) -> Self {
        COMMANDS
            .get(usize::from(v))
            .copied()
            .unwrap_or(Command::Other(v))
    }
    pub fn to_u16(self) -> u16 {
        match self {
            Command::Other(v) => v,
            c => COMMANDS.iter().position(|x| *x == c).unwrap_or(0) as u16,
        }
    }
}

/// Header flags (MS-SMB2 2.2.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flags(pub u32);

impl Flags {
    pub const SERVER_TO_REDIR: u32 = 0x0000_0001;
    pub const ASYNC_COMMAND: u32 = 0x0000_0002;
    pub const RELATED_OPERATIONS: u32 = 0x0000_0004;
    pub const SIGNED: u32 = 0x0000_0008;
    pub const PRIORITY_MASK: u32 = 0x0000_0070;
    pub const DFS_OPERATIONS: u32 = 0x1000_0000;
    pub const REPLAY_OPERATION: u32 = 0x2000_0000;

    pub fn has(self, bit: u32) -> bool {
        self.0 & bit != 0
    }
    pub fn is_response(self) -> bool {
        self.has(Self::SERVER_TO_REDIR)
    }
    pub fn is_related(self) -> bool {
        self.has(Self::RELATED_OPERATIONS)
    }
    pub fn is_signed(self) -> bool {
        self.has(Self::SIGNED)
    }
    pub fn is_replay(self) -> bool {
        self.has(Self::REPLAY_OPERATION)
    }
    pub fn priority(self) -> u8 {
        ((self.0 & Self::PRIORITY_MASK) >> 4) as u8
    }
}

/// The header's middle 8 bytes: ProcessId and TreeId for sync messages, AsyncId for async ones
/// (SMB2_FLAGS_ASYNC_COMMAND follows from the variant).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderIds {
    Sync { process_id: u32, tree_id: u32 },
    Async { async_id: u64 },
}

/// An SMB2 packet header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub credit_charge: u16,
    /// In responses the NTSTATUS; in 3.x requests ChannelSequence (low 16 bits) and Reserved.
    pub status: u32,
    pub command: Command,
    /// CreditRequest in requests, CreditResponse in responses.
    pub credits: u16,
    /// Flags other than ASYNC_COMMAND, which `ids` decides.
    pub flags: Flags,
    pub next_command: u32,
    pub message_id: u64,
    pub ids: HeaderIds,
    pub session_id: u64,
    pub signature: [u8; 16],
}

impl Header {
    /// A response header answering `req`.
    pub fn response_to(req: &Header, status: NtStatus, credits: u16) -> Header {
        Header {
            credit_charge: req.credit_charge,
            status: status.0,
            command: req.command,
            credits,
            flags: Flags(
                Flags::SERVER_TO_REDIR
                    | (req.flags.0 & (Flags::PRIORITY_MASK | Flags::RELATED_OPERATIONS)),
            ),
            next_command: 0,
            message_id: req.message_id,
            ids: req.ids,
            session_id: req.session_id,
            signature: [0; 16],
        }
    }

    /// The interim STATUS_PENDING response that turns `req` asynchronous (MS-SMB2 3.3.4.2); its
    /// body is an empty ERROR response.
    pub fn pending_response_to(req: &Header, async_id: u64, credits: u16) -> Header {
        let mut h = Header::response_to(req, NtStatus::PENDING, credits);
        h.ids = HeaderIds::Async { async_id };
        h
    }

    pub fn channel_sequence(&self) -> u16 {
        self.status as u16
    }
    pub fn nt_status(&self) -> NtStatus {
        NtStatus(self.status)
    }
    pub fn tree_id(&self) -> Option<u32> {
        match self.ids {
            HeaderIds::Sync { tree_id, .. } => Some(tree_id),
            HeaderIds::Async { .. } => None,
        }
    }
    /// All flags as on the wire, ASYNC_COMMAND included.
    pub fn wire_flags(&self) -> u32 {
        let base = self.flags.0 & !Flags::ASYNC_COMMAND;
        match self.ids {
            HeaderIds::Sync { .. } => base,
            HeaderIds::Async { .. } => base | Flags::ASYNC_COMMAND,
        }
    }

    pub fn decode(buf: &[u8]) -> Result<Header, DecodeError> {
        if buf.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                what: "header",
                need: HEADER_LEN,
                have: buf.len(),
            });
        }
        let mut r = Reader::new(buf, "header");
        if r.array::<4>()? != PROTOCOL_ID {
            return Err(DecodeError::BadProtocolId);
        }
        let size = r.u16()?;
        if size != 64 {
            return Err(DecodeError::HeaderSize(size));
        }
        let credit_charge = r.u16()?;
        let status = r.u32()?;
        let command = Command::from_u16(r.u16()?);
        let credits = r.u16()?;
        let raw_flags = r.u32()?;
        let next_command = r.u32()?;
        let message_id = r.u64()?;
        let ids = if raw_flags & Flags::ASYNC_COMMAND != 0 {
            HeaderIds::Async { async_id: r.u64()? }
        } else {
            HeaderIds::Sync {
                process_id: r.u32()?,
                tree_id: r.u32()?,
            }
        };
        let session_id = r.u64()?;
        let signature = r.array()?;
        Ok(Header {
            credit_charge,
            status,
            command,
            credits,
            flags: Flags(raw_flags & !Flags::ASYNC_COMMAND),
            next_command,
            message_id,
            ids,
            session_id,
            signature,
        })
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&PROTOCOL_ID);
        put_u16(out, 64);
        put_u16(out, self.credit_charge);
        put_u32(out, self.status);
        put_u16(out, self.command.to_u16());
        put_u16(out, self.credits);
        put_u32(out, self.wire_flags());
        put_u32(out, self.next_command);
        put_u64(out, self.message_id);
        match self.ids {
            HeaderIds::Sync {
                process_id,
                tree_id,
            } => {
                put_u32(out, process_id);
                put_u32(out, tree_id);
            }
            HeaderIds::Async { async_id } => put_u64(out, async_id),
        }
        put_u64(out, self.session_id);
        out.extend_from_slice(&self.signature);
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut v = Vec::with_capacity(HEADER_LEN);
        self.encode(&mut v);
        let mut a = [0u8; HEADER_LEN];
        a.copy_from_slice(&v);
        a
    }
}

/// Byte offset of the Signature field in the header.
pub const SIGNATURE_OFFSET: usize = 48;
/// Byte offset of the Flags field in the header.
pub const FLAGS_OFFSET: usize = 16;
/// Byte offset of the NextCommand field in the header.
pub const NEXT_COMMAND_OFFSET: usize = 20;
