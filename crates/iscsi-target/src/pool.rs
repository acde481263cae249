//! Data-In buffers recycled per connection: the writer hands a response's buffer back once it
//! is on the wire, and the next command's data lands in it, so steady-state reads allocate
//! nothing. Bounded: at most `MAX_POOLED_BYTES` of capacity is kept per connection.

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// Capacity kept per connection; beyond it, returned buffers are freed.
const MAX_POOLED_BYTES: usize = 8 << 20;
/// Buffers larger than this are not kept (rare, huge transfers).
const MAX_POOLED_BUFFER: usize = 1 << 20;

/// A connection's free Data-In buffers.
#[derive(Default)]
pub struct BufferPool {
    free: Mutex<(Vec<BytesMut>, usize)>,
}

impl BufferPool {
    /// An empty buffer with room for at least `len` bytes.
    pub fn get(&self, len: usize) -> BytesMut {
        if len == 0 {
            return BytesMut::new();
        }
        let mut free = self.free.lock();
        let (list, bytes) = &mut *free;
        if let Some(pos) = list.iter().rposition(|b| b.capacity() >= len) {
            let b = list.swap_remove(pos);
            *bytes -= b.capacity();
            return b;
        }
        drop(free);
        BytesMut::with_capacity(len.max(4096))
    }

    /// Takes a sent response's buffer back if nothing else refers to it.
    pub fn put(&self, data: Bytes) {
        let Ok(mut b) = data.try_into_mut() else {
            return;
        };
        let cap = b.capacity();
        if cap == 0 || cap > MAX_POOLED_BUFFER {
            return;
        }
        b.clear();
        let mut free = self.free.lock();
        let (list, bytes) = &mut *free;
        if *bytes + cap <= MAX_POOLED_BYTES {
            *bytes += cap;
            list.push(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_once_unshared() {
        let pool = BufferPool::default();
        let mut b = pool.get(8192);
        b.extend_from_slice(&[7u8; 8192]);
        let ptr = b.as_ptr();
        let frozen = b.freeze();
        let slice = frozen.slice(100..200);
        pool.put(frozen.clone());
        assert_ne!(
            pool.get(8192).as_ptr(),
            ptr,
            "shared buffers are not reused"
        );
        drop(slice);
        pool.put(frozen);
        let again = pool.get(4096);
        assert_eq!(
            again.as_ptr(),
            ptr,
            "the same allocation is handed out again"
        );
        assert!(again.is_empty());
    }
}
