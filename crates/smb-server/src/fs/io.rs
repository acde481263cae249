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
    if req.length > MAX_IO {
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
