//! READ, WRITE and FLUSH: pread straight into the response buffer, pwrite straight from the
//! request frame, fdatasync on FLUSH and write-through.

use std::os::unix::fs::FileExt as _;
use std::sync::Arc;

use smb_proto::msg::io::WRITE_FLAG_WRITE_THROUGH;
use smb_proto::msg::{
    FlushResponse, Message as _, ReadRequest, ReadResponse, WriteRequest, WriteResponse,
};
use smb_proto::NtStatus;

use super::open::Open;
use super::{blocking, io_status, status};
use crate::conn::Reply;
use crate::dispatch::Ctx;
use crate::session::MAX_IO;

/// The largest offset a file can have (MS-FSA: a file's size is a signed 64-bit value).
const MAX_OFFSET: u64 = i64::MAX as u64;
/// Where a write may end at most (16 TiB less 64 KiB, NTFS's MAXFILESIZE, as Windows and
/// Samba check).
const MAX_FILE_SIZE: u64 = 0xfff_ffff_0000;

/// Writes starting this far in are checked against the volume's free space first.
const FAR_OFFSET: u64 = 1 << 30;

/// A file on a share is not sparse to its clients: a write that would extend it by more than
/// the volume has free fails with ENOSPC (STATUS_DISK_FULL), as on a volume that allocates the
/// gap, rather than making a file that looks larger than the disk. (The host filesystem would
/// leave a hole and accept it.)
fn refuse_extension_past_free_space(file: &std::fs::File, offset: u64) -> std::io::Result<()> {
    let size = file.metadata()?.len();
    if offset <= size {
        return Ok(());
    }
    let vfs = rustix::fs::fstatvfs(file)?;
    let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    if offset - size > free {
        return Err(std::io::Error::from_raw_os_error(28));
    }
    Ok(())
}

/// A READ whose range is not all within a signed 64-bit size is INVALID_PARAMETER.
fn read_range_ok(offset: u64, length: u32) -> bool {
    offset
        .checked_add(u64::from(length))
        .is_some_and(|end| end <= MAX_OFFSET)
}

/// A WRITE at a negative offset, or one ending past MAXFILESIZE, is INVALID_PARAMETER; an
/// empty write is checked only for its offset.
fn write_range_ok(offset: u64, length: usize) -> bool {
    if offset > MAX_OFFSET {
        return false;
    }
    length == 0
        || offset
            .checked_add(length as u64)
            .is_some_and(|end| end <= MAX_FILE_SIZE)
}

pub async fn read(
    ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &ReadRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    if open.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    if !open.can_read() {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if req.length > MAX_IO || !read_range_ok(req.offset, req.length) {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if ctx.server.locks.conflicts(
        open.key,
        open.volatile,
        req.offset,
        u64::from(req.length),
        false,
    ) {
        return Err(status::FILE_LOCK_CONFLICT);
    }
    let body = out.len();
    ReadResponse::encode_head(0, 0, 0, out);
    let data = out.len();
    let want = req.length as usize;
    out.resize(data + want, 0);
    let got = blocking(|| {
        let buf = out.get_mut(data..).unwrap_or(&mut []);
        let mut done = 0usize;
        while done < buf.len() {
            let Some(rest) = buf.get_mut(done..) else {
                break;
            };
            match open.file.read_at(rest, req.offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    })
    .map_err(|e| io_status(&e))?;
    if (got == 0 && want > 0) || got < req.minimum_count as usize {
        return Err(status::END_OF_FILE);
    }
    out.truncate(data + got);
    open.position.store(
        req.offset + got as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    crate::wire::patch_u32(out, body + 4, got as u32);
    Ok(Reply::ok())
}

pub async fn write(
    ctx: &Ctx<'_>,
    open: &Arc<Open>,
    req: &WriteRequest<'_>,
    out: &mut Vec<u8>,
) -> Result<Reply, NtStatus> {
    if open.is_dir {
        return Err(NtStatus::INVALID_DEVICE_REQUEST);
    }
    if !open.can_write() || ctx.tree.read_only {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if !write_range_ok(req.offset, req.data.len()) {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if ctx.server.locks.conflicts(
        open.key,
        open.volatile,
        req.offset,
        req.data.len() as u64,
        true,
    ) {
        return Err(status::FILE_LOCK_CONFLICT);
    }
    crate::fs::oplock::break_readers(ctx.server, open.key, open.volatile);
    let sync = req.flags & WRITE_FLAG_WRITE_THROUGH != 0 || open.write_through;
    blocking(|| {
        if req.offset >= FAR_OFFSET && !req.data.is_empty() {
            refuse_extension_past_free_space(&open.file, req.offset)?;
        }
        open.file.write_all_at(req.data, req.offset)?;
        if sync {
            open.file.sync_data()?;
        }
        Ok::<_, std::io::Error>(())
    })
    .map_err(|e| io_status(&e))?;
    open.position.store(
        req.offset + req.data.len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    WriteResponse {
        count: req.data.len() as u32,
        remaining: 0,
    }
    .encode(out);
    Ok(Reply::ok())
}

pub async fn flush(ctx: &Ctx<'_>, open: &Arc<Open>, out: &mut Vec<u8>) -> Result<Reply, NtStatus> {
    if !open.is_dir && !open.can_write() {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if !ctx.tree.read_only {
        blocking(|| open.file.sync_data()).map_err(|e| io_status(&e))?;
    }
    FlushResponse.encode(out);
    Ok(Reply::ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_past_a_signed_64_bit_size_are_refused() {
        let max = i64::MAX as u64;
        assert!(read_range_ok(max - 1, 1));
        assert!(read_range_ok(max, 0));
        assert!(!read_range_ok(max, 1));
        assert!(!read_range_ok(max + 1, 0));
        assert!(!read_range_ok(u64::MAX, 0xffff_ffff));
        assert!(write_range_ok(max, 0));
        assert!(!write_range_ok(max, 1));
        assert!(!write_range_ok(max + 1, 0));
        assert!(!write_range_ok(u64::MAX - 1, 65536));
        assert!(!write_range_ok(MAX_FILE_SIZE, 1));
        assert!(write_range_ok(MAX_FILE_SIZE - 1, 1));
        assert!(write_range_ok(MAX_FILE_SIZE, 0));
        assert!(write_range_ok(0, 1 << 20));
    }
}
