//! QUERY_INFO: the file, file-system and security classes clients send (MS-FSCC 2.4, 2.5),
//! and the metadata helpers CREATE, CLOSE and QUERY_DIRECTORY share.

use std::os::unix::fs::MetadataExt as _;
use std::sync::Arc;

use smb_proto::msg::create::FileTimes;
use smb_proto::msg::info::{INFO_FILE, INFO_FILESYSTEM, INFO_SECURITY};
use smb_proto::msg::{ErrorResponse, Message as _, QueryInfoRequest, QueryInfoResponse};
use smb_proto::NtStatus;

use super::open::Open;
use super::status;
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::wire::{filetime, put_u16, put_u32, put_u64, put_utf16};

pub const ATTR_READONLY: u32 = 0x01;
pub const ATTR_DIRECTORY: u32 = 0x10;
pub const ATTR_ARCHIVE: u32 = 0x20;

pub const ATTR_HIDDEN: u32 = 0x02;
pub const ATTR_SYSTEM: u32 = 0x04;
pub const ATTR_NORMAL: u32 = 0x80;
pub const ATTR_TEMPORARY: u32 = 0x100;
/// The DOS attributes the server keeps (in the `user.lanes.dos` extended attribute).
pub const ATTR_KEPT: u32 =
    ATTR_READONLY | ATTR_HIDDEN | ATTR_SYSTEM | ATTR_ARCHIVE | ATTR_TEMPORARY;
const DOS_XATTR: &str = "user.lanes.dos";

/// What Unix metadata lacks: DOS attributes, a settable creation time and a settable change
/// time, kept in an extended attribute of the file (12 bytes: attributes, creation FILETIME;
/// or 28 with the change time and the last write time it was set at). Absent on filesystems
/// without user xattrs; then the defaults apply (ARCHIVE, the birth time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dos {
    /// Stored attributes, or None for the default.
    pub attrs: Option<u32>,
    /// Stored creation time, 0 for the file's birth time.
    pub creation: u64,
    /// A change time set with SET_INFO (0: none). It holds while the last write time is still
    /// `change_at_write`; once the file is written, the change time is the last write time.
    pub change: u64,
    pub change_at_write: u64,
}

const DOS_LEN: usize = 28;

impl Dos {
    fn decode(buf: &[u8], n: usize) -> Dos {
        if n != 12 && n != DOS_LEN {
            return Dos::default();
        }
        let at = |o| crate::wire::u64_at(buf, o).unwrap_or(0);
        Dos {
            attrs: crate::wire::u32_at(buf, 0).map(|a| a & ATTR_KEPT),
            creation: at(4),
            change: if n == DOS_LEN { at(12) } else { 0 },
            change_at_write: if n == DOS_LEN { at(20) } else { 0 },
        }
    }
    pub fn of_file(f: &std::fs::File) -> Dos {
        let mut buf = [0u8; DOS_LEN];
        rustix::fs::fgetxattr(f, DOS_XATTR, &mut buf)
            .map_or(Dos::default(), |n| Dos::decode(&buf, n))
    }
    pub fn of_path(p: &std::path::Path) -> Dos {
        let mut buf = [0u8; DOS_LEN];
        rustix::fs::getxattr(p, DOS_XATTR, &mut buf)
            .map_or(Dos::default(), |n| Dos::decode(&buf, n))
    }
    pub fn store(&self, f: &std::fs::File) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(DOS_LEN);
        put_u32(&mut buf, self.attrs.unwrap_or(0));
        put_u64(&mut buf, self.creation);
        if self.change != 0 {
            put_u64(&mut buf, self.change);
            put_u64(&mut buf, self.change_at_write);
        }
        rustix::fs::fsetxattr(f, DOS_XATTR, &buf, rustix::fs::XattrFlags::empty())
            .map_err(Into::into)
    }
}

/// The four times; ChangeTime is the last write time, as Unix ctime cannot be set (Samba does
/// the same), unless a client set it and the file has not been written since.
pub fn file_times(m: &std::fs::Metadata, dos: &Dos) -> FileTimes {
    let write = filetime(m.mtime(), m.mtime_nsec());
    let creation = if dos.creation != 0 {
        dos.creation
    } else {
        m.created()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(write, |d| {
                filetime(d.as_secs() as i64, i64::from(d.subsec_nanos()))
            })
            .min(write)
    };
    FileTimes {
        creation,
        last_access: filetime(m.atime(), m.atime_nsec()),
        last_write: write,
        change: if dos.change != 0 && dos.change_at_write == write {
            dos.change
        } else {
            write
        },
    }
}

pub fn attributes(m: &std::fs::Metadata, dos: &Dos) -> u32 {
    let kept = dos
        .attrs
        .unwrap_or(if m.is_dir() { 0 } else { ATTR_ARCHIVE });
    if m.is_dir() {
        ATTR_DIRECTORY | (kept & !ATTR_TEMPORARY)
    } else if kept == 0 {
        ATTR_NORMAL
    } else {
        kept
    }
}

pub fn allocation(m: &std::fs::Metadata) -> u64 {
    if m.is_dir() {
        0
    } else {
        m.blocks() * 512
    }
}

pub fn end_of_file(m: &std::fs::Metadata) -> u64 {
    if m.is_dir() {
        0
    } else {
        m.len()
    }
}

fn put_times(out: &mut Vec<u8>, t: &FileTimes) {
    put_u64(out, t.creation);
    put_u64(out, t.last_access);
    put_u64(out, t.last_write);
    put_u64(out, t.change);
}

fn basic(out: &mut Vec<u8>, m: &std::fs::Metadata, dos: &Dos) {
    put_times(out, &file_times(m, dos));
    put_u32(out, attributes(m, dos));
    put_u32(out, 0);
}

fn standard(out: &mut Vec<u8>, m: &std::fs::Metadata, delete_pending: bool) {
    put_u64(out, allocation(m));
    put_u64(out, end_of_file(m));
    put_u32(out, m.nlink() as u32);
    out.push(u8::from(delete_pending));
    out.push(u8::from(m.is_dir()));
    put_u16(out, 0);
}

/// Fixed-size classes answer INFO_LENGTH_MISMATCH when the buffer is short; variable ones
/// (names, lists) BUFFER_OVERFLOW with what fits.
struct Answer {
    data: Vec<u8>,
    min: usize,
}

pub fn query_info(
    ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &QueryInfoRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    let a = match req.info_type {
        INFO_FILE => file_class(ctx, open, req.file_info_class)?,
        INFO_FILESYSTEM => fs_class(open, req.file_info_class)?,
        INFO_SECURITY => {
            let sd = security_descriptor(req.additional_information);
            if sd.len() > req.output_buffer_length as usize {
                let need = (sd.len() as u32).to_le_bytes();
                ErrorResponse {
                    error_context_count: 0,
                    error_data: &need,
                }
                .encode(out);
                return Ok(Reply::status(NtStatus::BUFFER_TOO_SMALL));
            }
            Answer {
                min: sd.len(),
                data: sd,
            }
        }
        _ => return Err(NtStatus::INVALID_PARAMETER),
    };
    let max = req.output_buffer_length as usize;
    if a.min > max {
        return Err(status::INFO_LENGTH_MISMATCH);
    }
    let (data, st) = if a.data.len() > max {
        (a.data.get(..max).unwrap_or(&[]), NtStatus::BUFFER_OVERFLOW)
    } else {
        (&a.data[..], NtStatus::SUCCESS)
    };
    QueryInfoResponse { output: data }.encode(out);
    Ok(Reply::status(st))
}

fn file_class(ctx: &Ctx<'_>, open: &Open, class: u8) -> Result<Answer, NtStatus> {
    let m = open.file.metadata().map_err(|e| super::io_status(&e))?;
    let dos = Dos::of_file(&open.file);
    let pending = ctx
        .server
        .files
        .lock()
        .get(&open.key)
        .is_some_and(|f| f.delete_pending);
    let mut d = Vec::with_capacity(128);
    let fixed = |d: Vec<u8>| {
        let min = d.len();
        Answer { data: d, min }
    };
    Ok(match class {
        4 => {
            basic(&mut d, &m, &dos);
            fixed(d)
        }
        5 => {
            standard(&mut d, &m, pending);
            fixed(d)
        }
        6 => {
            put_u64(&mut d, m.ino());
            fixed(d)
        }
        7 => {
            put_u32(&mut d, 0);
            fixed(d)
        }
        8 => {
            put_u32(&mut d, open.access);
            fixed(d)
        }
        14 => {
            put_u64(
                &mut d,
                open.position.load(std::sync::atomic::Ordering::Relaxed),
            );
            fixed(d)
        }
        16 => {
            put_u32(&mut d, 0);
            fixed(d)
        }
        17 => {
            put_u32(&mut d, 0);
            fixed(d)
        }
        18 => {
            basic(&mut d, &m, &dos);
            standard(&mut d, &m, pending);
            put_u64(&mut d, m.ino());
            put_u32(&mut d, 0);
            put_u32(&mut d, open.access);
            put_u64(
                &mut d,
                open.position.load(std::sync::atomic::Ordering::Relaxed),
            );
            put_u32(&mut d, 0);
            put_u32(&mut d, 0);
            let name = format!("\\{}", open.name.lock());
            let at = d.len();
            put_u32(&mut d, 0);
            let n = put_utf16(&mut d, &name);
            crate::wire::patch_u32(&mut d, at, n as u32);
            Answer { data: d, min: 104 }
        }
        21 => {
            // FileAlternateNameInformation: the 8.3 name made up from the long one.
            put_u32(&mut d, 0);
            let n = put_utf16(&mut d, &super::shortname::alternate(&open.name.lock()));
            crate::wire::patch_u32(&mut d, 0, n as u32);
            // FILE_NAME_INFORMATION with its first character: 8 bytes, as Windows counts it.
            Answer { data: d, min: 8 }
        }
        22 => {
            if !m.is_dir() {
                put_u32(&mut d, 0);
                let at = d.len();
                put_u32(&mut d, 0);
                put_u64(&mut d, m.len());
                put_u64(&mut d, allocation(&m));
                let n = put_utf16(&mut d, "::$DATA");
                crate::wire::patch_u32(&mut d, at, n as u32);
            }
            Answer { data: d, min: 32 }
        }
        28 => {
            put_u64(&mut d, end_of_file(&m));
            put_u16(&mut d, 0);
            d.extend_from_slice(&[0; 6]);
            fixed(d)
        }
        34 => {
            put_times(&mut d, &file_times(&m, &dos));
            put_u64(&mut d, allocation(&m));
            put_u64(&mut d, end_of_file(&m));
            put_u32(&mut d, attributes(&m, &dos));
            put_u32(&mut d, 0);
            fixed(d)
        }
        35 => {
            put_u32(&mut d, attributes(&m, &dos));
            put_u32(&mut d, 0);
            fixed(d)
        }
        48 => {
            // FileNormalizedNameInformation (MS-FSCC 2.4.30, MS-FSA 2.1.5.12): the name from
            // the share root with each component's on-disk case, no leading backslash and no
            // `::$DATA`; the root's is empty.
            put_u32(&mut d, 0);
            let n = put_utf16(&mut d, &open.name.lock());
            crate::wire::patch_u32(&mut d, 0, n as u32);
            Answer { data: d, min: 8 }
        }
        _ => return Err(status::INVALID_INFO_CLASS),
    })
}

fn fs_class(open: &Open, class: u8) -> Result<Answer, NtStatus> {
    let mut d = Vec::with_capacity(64);
    let vfs = rustix::fs::fstatvfs(&open.file).map_err(|_| NtStatus::INVALID_PARAMETER)?;
    let bsize = vfs.f_frsize.max(512);
    let (sectors, bytes_per_sector) = (bsize / 512, 512u32);
    let fixed = |d: Vec<u8>| {
        let min = d.len();
        Answer { data: d, min }
    };
    Ok(match class {
        1 => {
            put_u64(&mut d, 0);
            let serial = (open.key.0 as u32) ^ 0x4c41_4e45;
            put_u32(&mut d, serial);
            let at = d.len();
            put_u32(&mut d, 0);
            d.push(0);
            d.push(0);
            let n = put_utf16(&mut d, &open.share.name);
            crate::wire::patch_u32(&mut d, at, n as u32);
            Answer { data: d, min: 24 }
        }
        3 => {
            put_u64(&mut d, vfs.f_blocks);
            put_u64(&mut d, vfs.f_bavail);
            put_u32(&mut d, sectors as u32);
            put_u32(&mut d, bytes_per_sector);
            fixed(d)
        }
        4 => {
            put_u32(&mut d, 7);
            put_u32(&mut d, 0x20);
            fixed(d)
        }
        5 => {
            // CASE_SENSITIVE_SEARCH | CASE_PRESERVED_NAMES | UNICODE_ON_DISK.
            put_u32(&mut d, 0x0000_0007);
            put_u32(&mut d, 255);
            let at = d.len();
            put_u32(&mut d, 0);
            let n = put_utf16(&mut d, "NTFS");
            crate::wire::patch_u32(&mut d, at, n as u32);
            Answer { data: d, min: 16 }
        }
        6 => {
            // FileFsControlInformation: no quotas.
            d.resize(48, 0);
            fixed(d)
        }
        8 => {
            // FileFsObjectIdInformation: the volume's id from its device number.
            put_u64(&mut d, open.key.0);
            d.resize(64, 0);
            fixed(d)
        }
        7 => {
            put_u64(&mut d, vfs.f_blocks);
            put_u64(&mut d, vfs.f_bavail);
            put_u64(&mut d, vfs.f_bfree);
            put_u32(&mut d, sectors as u32);
            put_u32(&mut d, bytes_per_sector);
            fixed(d)
        }
        11 => {
            for v in [512u32, 512, 512, 512, 0x3, 0, 0] {
                put_u32(&mut d, v);
            }
            fixed(d)
        }
        _ => return Err(status::INVALID_INFO_CLASS),
    })
}

/// A minimal self-relative security descriptor: owner and group Everyone (S-1-1-0) and a DACL
/// granting Everyone full access, each part only when `additional` asks for it.
pub fn security_descriptor(additional: u32) -> Vec<u8> {
    const OWNER: u32 = 1;
    const GROUP: u32 = 2;
    const DACL: u32 = 4;
    let everyone: [u8; 12] = [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    let mut d = vec![1u8, 0];
    let mut control: u16 = 0x8000;
    if additional & DACL != 0 {
        control |= 0x0004;
    }
    put_u16(&mut d, control);
    d.extend_from_slice(&[0; 16]);
    if additional & OWNER != 0 {
        let off = d.len() as u32;
        crate::wire::patch_u32(&mut d, 4, off);
        d.extend_from_slice(&everyone);
    }
    if additional & GROUP != 0 {
        let off = d.len() as u32;
        crate::wire::patch_u32(&mut d, 8, off);
        d.extend_from_slice(&everyone);
    }
    if additional & DACL != 0 {
        let off = d.len() as u32;
        crate::wire::patch_u32(&mut d, 16, off);
        // ACL: revision 2, size 8 + ACE (4 + 4 + 12), one ACE.
        d.extend_from_slice(&[2, 0]);
        put_u16(&mut d, 28);
        put_u16(&mut d, 1);
        put_u16(&mut d, 0);
        // ACCESS_ALLOWED_ACE: type 0, flags 0, size 20, mask FILE_ALL_ACCESS, SID.
        d.extend_from_slice(&[0, 0]);
        put_u16(&mut d, 20);
        put_u32(&mut d, 0x001F_01FF);
        d.extend_from_slice(&everyone);
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dos_xattr_old_and_new_layouts() {
        let mut old = Vec::new();
        put_u32(&mut old, ATTR_HIDDEN | 0x8000);
        put_u64(&mut old, 7);
        let d = Dos::decode(&old, old.len());
        assert_eq!(d.attrs, Some(ATTR_HIDDEN));
        assert_eq!((d.creation, d.change, d.change_at_write), (7, 0, 0));
        let mut new = old.clone();
        put_u64(&mut new, 9);
        put_u64(&mut new, 11);
        let d = Dos::decode(&new, new.len());
        assert_eq!((d.creation, d.change, d.change_at_write), (7, 9, 11));
        assert_eq!(Dos::decode(&new, 20), Dos::default());
    }

    #[test]
    fn security_descriptor_layout() {
        let sd = security_descriptor(7);
        assert_eq!(sd.len(), 20 + 12 + 12 + 28);
        assert_eq!(crate::wire::u32_at(&sd, 4), Some(20));
        assert_eq!(crate::wire::u32_at(&sd, 8), Some(32));
        assert_eq!(crate::wire::u32_at(&sd, 16), Some(44));
        assert_eq!(security_descriptor(0).len(), 20);
    }
}
