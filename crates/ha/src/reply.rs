//! How the core task answers a host request: to a blocking-pool thread waiting on a channel
//! (the synchronous `BlockDevice` calls), or to an asynchronous request (`AsyncBlockIo`)
//! whose completion wakes the SCSI command's task, so no thread waits for the peer.

use std::io;
use std::sync::mpsc::SyncSender;
use std::sync::Arc;

use blockstore::AioCompletion;
use parking_lot::Mutex;
use replication::HostError;

/// The answer to a write piece or a flush.
pub(crate) enum Reply {
    Wait(SyncSender<Result<(), HostError>>),
    Aio(Arc<Gather>),
}

impl Reply {
    pub(crate) fn send(self, result: Result<(), HostError>) {
        match self {
            Reply::Wait(tx) => {
                let _ = tx.try_send(result);
            }
            Reply::Aio(g) => g.piece_done(result),
        }
    }
}

/// The answer to a read's lease check: a waiting thread, or what to do next (run on the core
/// task, so it must not block: it reads from memory or hands the read to a blocking thread).
pub(crate) enum ReadReply {
    Wait(SyncSender<bool>),
    Then(Box<dyn FnOnce(bool) + Send>),
}

impl ReadReply {
    pub(crate) fn send(self, allowed: bool) {
        match self {
            ReadReply::Wait(tx) => {
                let _ = tx.try_send(allowed);
            }
            ReadReply::Then(next) => next(allowed),
        }
    }
}

struct GatherState {
    left: usize,
    result: Result<(), HostError>,
    done: Option<AioCompletion<io::Result<()>>>,
}

/// One asynchronous request split into pieces (a write over several chunks): completed once
/// every piece is answered, with the first error if any.
pub(crate) struct Gather {
    state: Mutex<GatherState>,
    map: fn(HostError) -> io::Error,
}

impl Gather {
    pub(crate) fn new(
        pieces: usize,
        done: AioCompletion<io::Result<()>>,
        map: fn(HostError) -> io::Error,
    ) -> Arc<Gather> {
        Arc::new(Gather {
            state: Mutex::new(GatherState {
                left: pieces,
                result: Ok(()),
                done: Some(done),
            }),
            map,
        })
    }

    pub(crate) fn piece_done(&self, result: Result<(), HostError>) {
        let finished = {
            let mut s = self.state.lock();
            if s.result.is_ok() {
                s.result = result;
            }
            s.left = s.left.saturating_sub(1);
            if s.left == 0 {
                s.done.take().map(|d| (d, s.result))
            } else {
                None
            }
        };
        if let Some((done, result)) = finished {
            done.complete(result.map_err(self.map));
        }
    }

    /// Ends the request at once with `e` (a piece could not be handed to the core).
    pub(crate) fn fail(&self, e: io::Error) {
        let done = self.state.lock().done.take();
        if let Some(d) = done {
            d.complete(Err(e));
        }
    }
}

impl Drop for Gather {
    fn drop(&mut self) {
        // A core task that stopped with the request unanswered: the same error the waiting
        // thread sees when its channel closes.
        if let Some(d) = self.state.get_mut().done.take() {
            d.complete(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "replicated LUN stopped",
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockstore::aio_pair;
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    fn ready<T>(w: &mut blockstore::AioWait<T>) -> Option<Option<T>> {
        match Pin::new(w).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }

    fn not_ready(e: HostError) -> io::Error {
        io::Error::new(io::ErrorKind::NotConnected, e)
    }

    #[test]
    fn a_request_in_pieces_completes_after_the_last_with_the_first_error() {
        let (done, mut wait) = aio_pair();
        let g = Gather::new(3, done, not_ready);
        Reply::Aio(g.clone()).send(Ok(()));
        Reply::Aio(g.clone()).send(Err(HostError::NotReady));
        assert!(ready(&mut wait).is_none(), "one piece left");
        Reply::Aio(g).send(Err(HostError::Invalid));
        let r = ready(&mut wait).expect("complete").expect("answered");
        assert_eq!(r.expect_err("failed").kind(), io::ErrorKind::NotConnected);
    }

    #[test]
    fn a_core_that_stops_unanswered_fails_the_request_instead_of_hanging_it() {
        let (done, mut wait) = aio_pair();
        let g = Gather::new(2, done, not_ready);
        Reply::Aio(g.clone()).send(Ok(()));
        drop(g);
        let r = ready(&mut wait).expect("complete").expect("answered");
        assert_eq!(r.expect_err("failed").kind(), io::ErrorKind::BrokenPipe);
    }
}
