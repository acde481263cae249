//! Asynchronous I/O for devices whose storage completes requests by itself (librbd's
//! `rbd_aio_*`): the caller submits a request with an [`AioCompletion`] and awaits the
//! matching [`AioWait`]; no thread sleeps per request. The device owns the request's buffers
//! until it completes, so dropping the future early never frees memory the storage still
//! writes into.
//!
//! Runtime-agnostic (no tokio here): the completion stores the result and wakes whatever
//! task polled the future.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;

/// What an asynchronous read gives back: the outcome and the buffer it was asked to fill
/// (on success, with the bytes read appended).
pub type ReadDone = (std::io::Result<()>, BytesMut);

/// A block device's asynchronous side (see [`crate::BlockDevice::aio`]). Each call takes the
/// completion it signals exactly once, from any thread, possibly before the call returns.
pub trait AsyncBlockIo: Send + Sync {
    /// Appends the `len` bytes at `offset` to `buf`. The bytes are read into `buf`'s spare
    /// capacity where the storage can (nothing is zeroed first only to be overwritten); on
    /// failure `buf` may hold any part of them.
    fn read(&self, buf: BytesMut, len: usize, offset: u64, done: AioCompletion<ReadDone>);
    /// Writes the concatenation of `data` at `offset`.
    fn write(&self, data: Vec<Bytes>, offset: u64, done: AioCompletion<std::io::Result<()>>);
    /// Makes every write completed before the call durable.
    fn flush(&self, done: AioCompletion<std::io::Result<()>>);

    /// Whether [`AsyncBlockIo::discard`], [`AsyncBlockIo::write_same`] and
    /// [`AsyncBlockIo::compare_and_write`] are the device's own; the defaults refuse them
    /// (Unsupported) and callers take the blocking path instead.
    fn has_extended(&self) -> bool {
        false
    }

    /// Deallocates `len` bytes at `offset`: the range reads as zeros afterwards, partial
    /// blocks included.
    fn discard(&self, _offset: u64, _len: u64, done: AioCompletion<std::io::Result<()>>) {
        done.complete(Err(unsupported()));
    }

    /// Writes `pattern` repeated over `len` bytes from `offset` (`len` a whole number of
    /// patterns).
    fn write_same(
        &self,
        _pattern: Bytes,
        _offset: u64,
        _len: u64,
        done: AioCompletion<std::io::Result<()>>,
    ) {
        done.complete(Err(unsupported()));
    }

    /// Compares the range at `offset` with `compare` and, only if equal, writes `write` (the
    /// same length), atomically against every other write of the storage, whoever sends it.
    /// `Ok(Some(i))`: byte `i` of the range differed and nothing was written.
    fn compare_and_write(
        &self,
        _compare: Bytes,
        _write: Bytes,
        _offset: u64,
        done: AioCompletion<std::io::Result<Option<u64>>>,
    ) {
        done.complete(Err(unsupported()));
    }
}

fn unsupported() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "not an asynchronous operation of this device",
    )
}

enum State<T> {
    Waiting(Option<Waker>),
    Done(T),
    /// The device dropped the completion without signalling it.
    Abandoned,
    Taken,
}

struct Slot<T> {
    state: Mutex<State<T>>,
}

/// The device's end: signals the result once.
pub struct AioCompletion<T> {
    slot: Option<Arc<Slot<T>>>,
}

/// The caller's end: resolves to the result, or `None` when the device dropped the request.
pub struct AioWait<T> {
    slot: Arc<Slot<T>>,
}

/// A new request's two ends.
pub fn aio_pair<T>() -> (AioCompletion<T>, AioWait<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State::Waiting(None)),
    });
    (
        AioCompletion {
            slot: Some(slot.clone()),
        },
        AioWait { slot },
    )
}

impl<T> AioCompletion<T> {
    /// Signals the result and wakes the waiting task.
    pub fn complete(mut self, value: T) {
        if let Some(slot) = self.slot.take() {
            slot.set(State::Done(value));
        }
    }
}

impl<T> Slot<T> {
    fn set(&self, new: State<T>) {
        let waker = {
            let mut state = self.state.lock();
            match std::mem::replace(&mut *state, new) {
                State::Waiting(w) => w,
                _ => None,
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Drop for AioCompletion<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.set(State::Abandoned);
        }
    }
}

impl<T> Future for AioWait<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut state = self.slot.state.lock();
        match std::mem::replace(&mut *state, State::Taken) {
            State::Waiting(_) => {
                *state = State::Waiting(Some(cx.waker().clone()));
                Poll::Pending
            }
            State::Done(v) => Poll::Ready(Some(v)),
            State::Abandoned | State::Taken => Poll::Ready(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn poll<T>(w: &mut AioWait<T>, waker: &Waker) -> Poll<Option<T>> {
        Pin::new(w).poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn a_completion_from_another_thread_wakes_the_waiting_task_once() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (done, mut wait) = aio_pair::<u32>();
        assert!(poll(&mut wait, &waker).is_pending());
        std::thread::spawn(move || done.complete(7))
            .join()
            .expect("completer");
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(Some(7)));
    }

    #[test]
    fn a_result_signalled_before_the_first_poll_is_kept() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (done, mut wait) = aio_pair::<&str>();
        done.complete("early");
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(Some("early")));
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_dropped_request_resolves_to_none_instead_of_hanging() {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let (done, mut wait) = aio_pair::<u8>();
        assert!(poll(&mut wait, &waker).is_pending());
        drop(done);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert_eq!(poll(&mut wait, &waker), Poll::Ready(None));
    }

    #[test]
    fn dropping_the_waiter_first_leaves_the_completion_harmless() {
        let (done, wait) = aio_pair::<Vec<u8>>();
        drop(wait);
        done.complete(vec![1, 2, 3]);
    }
}
