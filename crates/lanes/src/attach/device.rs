//! The multipath device as an export's block device.

use bytes::Bytes;
use lanes_initiator::Multipath;
use std::future::Future;
use std::io;
use std::sync::Arc;

pub struct MultipathDevice(Arc<Multipath>);

impl MultipathDevice {
    pub fn new(mp: Arc<Multipath>) -> MultipathDevice {
        MultipathDevice(mp)
    }
}

fn io_error(e: lanes_initiator::Error) -> io::Error {
    match e {
        lanes_initiator::Error::InvalidRequest(_) => io::Error::new(io::ErrorKind::InvalidInput, e),
        other => io::Error::other(other),
    }
}

impl lanes_export::Device for MultipathDevice {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }

    fn size(&self) -> u64 {
        self.0.size()
    }

    fn read(&self, offset: u64, len: u32) -> impl Future<Output = io::Result<Bytes>> + Send {
        let mp = self.0.clone();
        async move { mp.read(offset, len).await.map_err(io_error) }
    }

    fn write(
        &self,
        offset: u64,
        data: Bytes,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send {
        let mp = self.0.clone();
        async move { mp.write(offset, data, fua).await.map_err(io_error) }
    }

    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send {
        let mp = self.0.clone();
        async move { mp.flush().await.map_err(io_error) }
    }

    fn trim(&self, offset: u64, len: u64) -> impl Future<Output = io::Result<()>> + Send {
        let mp = self.0.clone();
        async move { mp.trim(offset, len).await.map_err(io_error) }
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
    ) -> impl Future<Output = io::Result<()>> + Send {
        let mp = self.0.clone();
        async move {
            mp.write_zeroes(offset, len, false, fua)
                .await
                .map_err(io_error)
        }
    }

    fn max_io(&self) -> u32 {
        4 << 20
    }
}
