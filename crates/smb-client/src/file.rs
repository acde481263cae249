//! Trees (TREE_CONNECT) and open files (CREATE, READ, WRITE, FLUSH, CLOSE), and the
//! FSCTL_QUERY_NETWORK_INTERFACE_INFO a client reads to find more channels.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use smb_proto::msg::ioctl::{
    decode_network_interfaces, NetworkInterface, FSCTL_QUERY_NETWORK_INTERFACE_INFO,
    SMB2_0_IOCTL_IS_FSCTL,
};
use smb_proto::msg::{
    CloseRequest, CreateRequest, CreateResponse, FileId, FlushRequest, IoctlRequest, IoctlResponse,
    Message as _, ReadRequest, ReadResponse, TreeConnectRequest, WriteRequest, WriteResponse,
};
use smb_proto::utf16le;
use smb_proto::{Command, NtStatus};

use crate::error::SmbError;
use crate::session::Session;

/// STATUS_END_OF_FILE (MS-ERREF).
const END_OF_FILE: NtStatus = NtStatus(0xC000_0011);

/// A connected share.
#[derive(Clone)]
pub struct Tree {
    pub session: Session,
    pub id: u32,
    pub share: String,
}

/// How to open a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Create the file if missing (FILE_OPEN_IF) rather than fail (FILE_OPEN).
    pub create: bool,
    /// Truncate an existing file (FILE_OVERWRITE_IF).
    pub truncate: bool,
    pub write: bool,
}

impl OpenOptions {
    pub const READ: OpenOptions = OpenOptions {
        create: false,
        truncate: false,
        write: false,
    };
    pub const READ_WRITE: OpenOptions = OpenOptions {
        create: true,
        truncate: false,
        write: true,
    };
}

/// An open file of a tree.
#[derive(Clone)]
pub struct File {
    pub tree: Tree,
    pub id: FileId,
    pub end_of_file: u64,
}

impl Session {
    /// TREE_CONNECT to `\\host\share`.
    pub async fn tree_connect(&self, host: &str, share: &str) -> Result<Tree, SmbError> {
        let path = utf16le(&format!("\\\\{host}\\{share}"));
        let mut body = Vec::new();
        TreeConnectRequest {
            flags: 0,
            path: &path,
        }
        .encode(&mut body);
        let (h, _, _) = self
            .call(Command::TreeConnect, 0, &body, &[], 0, &[])
            .await?;
        let id = h
            .tree_id()
            .ok_or_else(|| SmbError::Protocol("TREE_CONNECT answered asynchronously".into()))?;
        Ok(Tree {
            session: self.clone(),
            id,
            share: share.to_string(),
        })
    }
}

impl Tree {
    /// CREATE of a regular file.
    pub async fn open(&self, path: &str, opts: OpenOptions) -> Result<File, SmbError> {
        let name = utf16le(path);
        // FILE_READ_DATA | FILE_READ_ATTRIBUTES | SYNCHRONIZE, plus FILE_WRITE_DATA,
        // FILE_APPEND_DATA and FILE_WRITE_ATTRIBUTES when writing.
        let mut access = 0x0010_0081u32;
        if opts.write {
            access |= 0x0000_0116;
        }
        let disposition = match (opts.create, opts.truncate) {
            (_, true) => 5, // FILE_OVERWRITE_IF
            (true, _) => 3, // FILE_OPEN_IF
            _ => 1,         // FILE_OPEN
        };
        let mut body = Vec::new();
        CreateRequest {
            impersonation_level: 2,
            desired_access: access,
            file_attributes: 0x80,
            share_access: 7,
            create_disposition: disposition,
            create_options: 0x40, // FILE_NON_DIRECTORY_FILE
            name: &name,
            ..Default::default()
        }
        .encode(&mut body);
        let (_, resp, _) = self
            .session
            .call(Command::Create, self.id, &body, &[], 0, &[])
            .await?;
        let c = CreateResponse::decode(&resp)?;
        Ok(File {
            tree: self.clone(),
            id: c.file_id,
            end_of_file: c.end_of_file,
        })
    }

    /// FSCTL_QUERY_NETWORK_INTERFACE_INFO: the interfaces the server offers for channels.
    pub async fn network_interfaces(&self) -> Result<Vec<NetworkInterface>, SmbError> {
        let mut body = Vec::new();
        IoctlRequest {
            ctl_code: FSCTL_QUERY_NETWORK_INTERFACE_INFO,
            file_id: FileId::RELATED,
            max_output_response: 64 * 1024,
            flags: SMB2_0_IOCTL_IS_FSCTL,
            ..Default::default()
        }
        .encode(&mut body);
        let (_, resp, _) = self
            .session
            .call(Command::Ioctl, self.id, &body, &[], 64 * 1024, &[])
            .await?;
        let r = IoctlResponse::decode(&resp)?;
        Ok(decode_network_interfaces(r.output)?)
    }
}

impl File {
    /// READs up to `len` bytes at `offset`; the data is a slice of the received frame (no
    /// copy). Empty at the end of the file.
    pub async fn read_at(&self, offset: u64, len: u32) -> Result<Bytes, SmbError> {
        let s = &self.tree.session;
        if len > s.negotiated().max_read_size {
            return Err(SmbError::Usage(format!(
                "read of {len} bytes exceeds the server's MaxReadSize {}",
                s.negotiated().max_read_size
            )));
        }
        let mut body = Vec::with_capacity(64);
        ReadRequest {
            length: len,
            offset,
            file_id: self.id,
            ..Default::default()
        }
        .encode(&mut body);
        let (h, resp, ch) = s
            .call(
                Command::Read,
                self.tree.id,
                &body,
                &[],
                u64::from(len),
                &[END_OF_FILE],
            )
            .await?;
        if h.nt_status() == END_OF_FILE {
            return Ok(Bytes::new());
        }
        let r = ReadResponse::decode(&resp)?;
        if r.data.is_empty() {
            return Ok(Bytes::new());
        }
        // The data borrows `resp`; its offset there lets it go out as a slice of the frame.
        let start = (r.data.as_ptr() as usize).saturating_sub(resp.as_ptr() as usize);
        if resp.get(start..start + r.data.len()) != Some(r.data) {
            return Err(SmbError::Protocol("READ data outside its response".into()));
        }
        ch.counters
            .bytes_read
            .fetch_add(r.data.len() as u64, Ordering::Relaxed);
        Ok(resp.slice(start..start + r.data.len()))
    }

    /// WRITEs `data` at `offset`; returns the count the server wrote.
    pub async fn write_at(&self, offset: u64, data: &[u8]) -> Result<u32, SmbError> {
        let s = &self.tree.session;
        if data.len() as u64 > u64::from(s.negotiated().max_write_size) {
            return Err(SmbError::Usage(format!(
                "write of {} bytes exceeds the server's MaxWriteSize {}",
                data.len(),
                s.negotiated().max_write_size
            )));
        }
        let mut body = Vec::with_capacity(48);
        WriteRequest {
            offset,
            file_id: self.id,
            ..Default::default()
        }
        .encode_head(data.len() as u32, &mut body);
        let (_, resp, ch) = s
            .call(
                Command::Write,
                self.tree.id,
                &body,
                data,
                data.len() as u64,
                &[],
            )
            .await?;
        let w = WriteResponse::decode(&resp)?;
        ch.counters
            .bytes_written
            .fetch_add(u64::from(w.count), Ordering::Relaxed);
        Ok(w.count)
    }

    pub async fn flush(&self) -> Result<(), SmbError> {
        let mut body = Vec::new();
        FlushRequest { file_id: self.id }.encode(&mut body);
        self.tree
            .session
            .call(Command::Flush, self.tree.id, &body, &[], 0, &[])
            .await?;
        Ok(())
    }

    pub async fn close(self) -> Result<(), SmbError> {
        let mut body = Vec::new();
        CloseRequest {
            flags: 0,
            file_id: self.id,
        }
        .encode(&mut body);
        self.tree
            .session
            .call(Command::Close, self.tree.id, &body, &[], 0, &[])
            .await?;
        Ok(())
    }
}
