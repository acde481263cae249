//! The device's asynchronous side: every request goes to librbd's `rbd_aio_*` calls and is
//! completed by librbd's own threads; no thread of ours waits.

use blockstore::{AioCompletion, AsyncBlockIo, ReadDone};
use bytes::{Bytes, BytesMut};

use super::RbdDevice;

/// `rbd_aio_*`: librbd's own threads complete each request; no thread of ours waits.
impl AsyncBlockIo for RbdDevice {
    fn read(&self, buf: BytesMut, len: usize, offset: u64, done: AioCompletion<ReadDone>) {
        let conn = match self.check(offset, len as u64).and_then(|()| self.gate()) {
            Ok(conn) => conn,
            Err(e) => return done.complete((Err(e), buf)),
        };
        // Ranges inside the image always read in full (unwritten ones as zeros).
        conn.image
            .aio_read(buf, len, offset, done, conn.on_error.clone());
    }

    fn write(&self, data: Vec<Bytes>, offset: u64, done: AioCompletion<std::io::Result<()>>) {
        let len = data.iter().map(|b| b.len() as u64).sum();
        let conn = match self.check(offset, len).and_then(|()| self.gate()) {
            Ok(conn) => conn,
            Err(e) => return done.complete(Err(e)),
        };
        if len == 0 {
            // librbd refuses an empty vector; there is nothing to write.
            return done.complete(Ok(()));
        }
        conn.image
            .aio_write(data, offset, done, conn.on_error.clone());
    }

    fn flush(&self, done: AioCompletion<std::io::Result<()>>) {
        let conn = match self.gate() {
            Ok(conn) => conn,
            Err(e) => return done.complete(Err(e)),
        };
        conn.image.aio_flush(done, conn.on_error.clone());
    }

    fn has_extended(&self) -> bool {
        true
    }

    fn discard(&self, offset: u64, len: u64, done: AioCompletion<std::io::Result<()>>) {
        let conn = match self.check(offset, len).and_then(|()| self.gate()) {
            Ok(conn) => conn,
            Err(e) => return done.complete(Err(e)),
        };
        if len == 0 {
            return done.complete(Ok(()));
        }
        conn.image
            .aio_discard(offset, len, done, conn.on_error.clone());
    }

    fn write_same(
        &self,
        pattern: Bytes,
        offset: u64,
        len: u64,
        done: AioCompletion<std::io::Result<()>>,
    ) {
        let conn = match self.check(offset, len).and_then(|()| self.gate()) {
            Ok(conn) => conn,
            Err(e) => return done.complete(Err(e)),
        };
        conn.image
            .aio_write_same(pattern, offset, len, done, conn.on_error.clone());
    }

    fn compare_and_write(
        &self,
        compare: Bytes,
        write: Bytes,
        offset: u64,
        done: AioCompletion<std::io::Result<Option<u64>>>,
    ) {
        let conn = match self
            .check(offset, write.len() as u64)
            .and_then(|()| self.gate())
        {
            Ok(conn) => conn,
            Err(e) => return done.complete(Err(e)),
        };
        // librbd reports the first difference relative to the request, as SCSI does.
        conn.image
            .aio_compare_and_write(compare, write, offset, done, conn.on_error.clone());
    }
}
