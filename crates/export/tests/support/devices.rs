//! Devices for tests that need control over timing: reads of one block wait for a gate, and
//! every call can yield to the scheduler half-way so concurrent requests really interleave.

use std::future::Future;
use std::io;

use bytes::Bytes;
use lanes_export::{Device, MemoryDevice};
use tokio::sync::Semaphore;

pub struct TestDevice {
    pub inner: MemoryDevice,
    /// Reads starting at this offset wait for [`TestDevice::open_gate`].
    pub gated_offset: Option<u64>,
    /// Yield between the call and its effect.
    pub yields: bool,
    gate: Semaphore,
}

impl TestDevice {
    pub fn new(inner: MemoryDevice, gated_offset: Option<u64>, yields: bool) -> TestDevice {
        TestDevice {
            inner,
            gated_offset,
            yields,
            gate: Semaphore::new(0),
        }
    }

    pub fn open_gate(&self) {
        self.gate.add_permits(Semaphore::MAX_PERMITS / 2);
    }

    async fn pause(&self) {
        if self.yields {
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
        }
    }
}

impl Device for TestDevice {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn max_io(&self) -> u32 {
        self.inner.max_io()
    }
    async fn read(&self, offset: u64, len: u32) -> io::Result<Bytes> {
        if self.gated_offset == Some(offset) {
            self.gate.acquire().await.expect("gate").forget();
        }
        self.pause().await;
        self.inner.read(offset, len).await
    }
    async fn write(&self, offset: u64, data: Bytes, fua: bool) -> io::Result<()> {
        self.pause().await;
        self.inner.write(offset, data, fua).await
    }
    fn flush(&self) -> impl Future<Output = io::Result<()>> + Send {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> impl Future<Output = io::Result<()>> + Send {
        self.inner.trim(offset, len)
    }
    async fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        self.pause().await;
        self.inner.write_zeroes(offset, len, fua).await
    }
}
