//! A running session, driven by the core task itself: it reads both sockets when they are
//! readable and decodes frames in place, and it writes what a pass over the core's actions
//! queued with one non-blocking write per channel, waiting for writability only when the
//! socket does not take it all. No task or channel stands between the core and the peer's
//! bytes: a replicated write crosses no wake-up on the way out or in beyond the socket's own.

use std::io::{self, IoSlice};

use bytes::{Bytes, BytesMut};
use replication::{Channel, Message};
use tokio::net::TcpStream;

use super::Streams;

/// Room kept free for a read.
const READ_CHUNK: usize = 256 << 10;
/// Reads per readable event at most, so host requests are not starved by a busy peer.
const READS_PER_WAKE: usize = 4;
/// An output buffer grown past this by a burst (resync data) is given back once empty.
const OUT_KEEP: usize = 4 << 20;

/// One connection of a session: its socket, bytes read and not yet decoded, bytes queued and
/// not yet written.
struct Wire {
    stream: TcpStream,
    input: BytesMut,
    /// Frames queued, except their large payloads (`split`).
    out: Vec<u8>,
    /// Large payloads queued by reference, each with the offset in `out` where it goes: sent
    /// from the host's buffer by a vectored write, never copied into `out`.
    split: Vec<(usize, Bytes)>,
    /// Bytes in `split`.
    split_bytes: usize,
    /// Bytes of the queue (`out` with the payloads in place) already written.
    written: usize,
}

/// Pieces per vectored write at most.
const IOVS: usize = 64;

impl Wire {
    fn new(stream: TcpStream) -> Wire {
        Wire {
            stream,
            input: BytesMut::with_capacity(READ_CHUNK),
            out: Vec::with_capacity(64 << 10),
            split: Vec::new(),
            split_bytes: 0,
            written: 0,
        }
    }

    fn queue(&mut self, message: &Message) {
        let before = self.split.len();
        replication::encode_split(message, &mut self.out, &mut self.split);
        self.split_bytes += self.split[before..]
            .iter()
            .map(|(_, d)| d.len())
            .sum::<usize>();
    }

    fn queued(&self) -> usize {
        self.out.len() + self.split_bytes
    }

    fn backlog(&self) -> bool {
        self.written < self.queued()
    }

    /// Write what is queued as far as the socket takes it now.
    fn flush(&mut self) -> Result<(), String> {
        while self.written < self.queued() {
            let sent = if self.split.is_empty() {
                self.stream.try_write(&self.out[self.written..])
            } else {
                let mut iov = [IoSlice::new(&[]); IOVS];
                let n = self.unwritten(&mut iov);
                self.stream.try_write_vectored(&iov[..n])
            };
            match sent {
                Ok(0) => return Err("write: connection closed".into()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("write: {e}")),
            }
        }
        self.out.clear();
        self.split.clear();
        self.split_bytes = 0;
        self.written = 0;
        if self.out.capacity() > OUT_KEEP {
            self.out.shrink_to(64 << 10);
        }
        Ok(())
    }

    /// The queue's unwritten bytes in wire order (each payload at its offset), as many
    /// pieces as fit in `iov`; returns how many.
    fn unwritten<'a>(&'a self, iov: &mut [IoSlice<'a>]) -> usize {
        let tail = self.split.last().map_or(0, |(offset, _)| *offset);
        let mut at = 0;
        let pieces = self
            .split
            .iter()
            .flat_map(move |(offset, data)| {
                let before = &self.out[at..*offset];
                at = *offset;
                [before, &data[..]]
            })
            .chain(std::iter::once(&self.out[tail..]));
        let (mut skip, mut n) = (self.written, 0);
        for piece in pieces {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            iov[n] = IoSlice::new(&piece[skip..]);
            skip = 0;
            n += 1;
            if n == iov.len() {
                break;
            }
        }
        n
    }

    /// Read what the socket has (a few reads at most) and decode every complete frame into
    /// `frames`. `Err`: the connection is broken (closed, failed, or a bad frame).
    fn read(&mut self, frames: &mut Vec<Message>) -> Result<(), String> {
        for _ in 0..READS_PER_WAKE {
            // Room for the frame at the front (its length was checked by `decode` after the
            // read that brought it; clamped anyway), and never less than a quarter chunk.
            let need = self
                .frame_len()
                .unwrap_or(0)
                .min(4 + replication::codec::MAX_FRAME as usize)
                .max(READ_CHUNK / 4);
            if self.input.capacity() - self.input.len() < need {
                self.input.reserve(need.max(READ_CHUNK));
            }
            match self.stream.try_read_buf(&mut self.input) {
                Ok(0) => return Err("read: connection closed by the peer".into()),
                // Read until the socket says it is empty (which clears its readiness), or
                // until the bound: then it stays ready and the core comes back.
                Ok(_) => self.decode(frames)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("read: {e}")),
            }
        }
        Ok(())
    }

    /// Length of the frame at the front (with its length field), once that field is in.
    fn frame_len(&self) -> Option<usize> {
        let len = self.input.get(..4)?;
        Some(4 + u32::from_le_bytes([len[0], len[1], len[2], len[3]]) as usize)
    }

    fn decode(&mut self, frames: &mut Vec<Message>) -> Result<(), String> {
        while let Some(total) = self.frame_len() {
            let n = total - 4;
            if !(8..=replication::codec::MAX_FRAME as usize).contains(&n) {
                return Err(format!("frame length {n} out of range"));
            }
            if self.input.len() < total {
                return Ok(());
            }
            // Zero-copy: the frame's payload (write data) stays in the read buffer's memory.
            let frame = self.input.split_to(total).freeze();
            match replication::decode(&frame) {
                Ok(Some((message, used))) if used == frame.len() => frames.push(message),
                Ok(_) => return Err("frame length mismatch".into()),
                Err(e) => return Err(format!("decode: {e}")),
            }
        }
        if self.input.is_empty() && self.input.capacity() > OUT_KEEP {
            // Grown for a large frame: give the memory back.
            self.input = BytesMut::with_capacity(READ_CHUNK);
        }
        Ok(())
    }
}

/// The two connections (data, control) of one session with the peer.
pub struct Session {
    wires: [Wire; 2],
}

fn index(channel: Channel) -> usize {
    match channel {
        Channel::Data => 0,
        Channel::Control => 1,
    }
}

impl Session {
    pub fn new(streams: Streams) -> Session {
        Session {
            wires: [Wire::new(streams.data), Wire::new(streams.control)],
        }
    }

    /// Queue `message` on `channel`; written by the next [`Session::flush`].
    pub fn queue(&mut self, channel: Channel, message: &Message) {
        self.wires[index(channel)].queue(message);
    }

    /// Write what is queued on both connections as far as the sockets take it now.
    pub fn flush(&mut self) -> Result<(), String> {
        for w in &mut self.wires {
            w.flush()?;
        }
        Ok(())
    }

    /// Whether connection `i` (0 data, 1 control) has bytes the socket did not take yet.
    pub fn backlog(&self, i: usize) -> bool {
        self.wires[i].backlog()
    }

    /// Connection `i` may have bytes to read.
    pub async fn readable(&self, i: usize) -> io::Result<()> {
        self.wires[i].stream.readable().await
    }

    /// Connection `i` may take more bytes.
    pub async fn writable(&self, i: usize) -> io::Result<()> {
        self.wires[i].stream.writable().await
    }

    /// Read connection `i` and decode its complete frames into `frames`.
    pub fn read(&mut self, i: usize, frames: &mut Vec<Message>) -> Result<(), String> {
        self.wires[i].read(frames)
    }

    /// Write connection `i`'s backlog as far as the socket takes it now.
    pub fn flush_one(&mut self, i: usize) -> Result<(), String> {
        self.wires[i].flush()
    }
}

/// `session`'s connection `i` is readable; never ready without a session.
pub async fn readable(session: &Option<Session>, i: usize) -> io::Result<()> {
    match session {
        Some(s) => s.readable(i).await,
        None => std::future::pending().await,
    }
}

/// `session`'s connection `i` is writable; never ready without a session.
pub async fn writable(session: &Option<Session>, i: usize) -> io::Result<()> {
    match session {
        Some(s) => s.writable(i).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use replication::{Body, Header, Write};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    /// A session over loopback, and the peer's ends of its two connections.
    async fn session() -> (Session, TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let data = TcpStream::connect(at).await.unwrap();
        let (data_peer, _) = listener.accept().await.unwrap();
        let control = TcpStream::connect(at).await.unwrap();
        let (control_peer, _) = listener.accept().await.unwrap();
        (
            Session::new(Streams { data, control }),
            data_peer,
            control_peer,
        )
    }

    fn write(seq: u64, len: usize) -> Message {
        Message {
            header: Header {
                epoch: 3,
                node: 1,
                seq,
            },
            body: Body::Write(Write {
                wseq: seq,
                seen: 0,
                lba: seq * 8,
                blocks: (len / 4096) as u32,
                fua: false,
                data: Bytes::from(vec![seq as u8; len]),
            }),
        }
    }

    /// Read connection `i` until `n` frames came (or it broke).
    async fn frames(s: &mut Session, i: usize, n: usize) -> Result<Vec<Message>, String> {
        let mut got = Vec::new();
        while got.len() < n {
            s.readable(i).await.map_err(|e| e.to_string())?;
            s.read(i, &mut got)?;
        }
        Ok(got)
    }

    #[tokio::test]
    async fn frames_dribbled_byte_by_byte_or_in_one_piece_decode_the_same() {
        let (mut s, mut data, _control) = session().await;
        let sent: Vec<Message> = [4096, 8192, 1 << 20, 4096]
            .iter()
            .enumerate()
            .map(|(i, &len)| write(i as u64 + 1, len))
            .collect();
        let mut bytes = Vec::new();
        for m in &sent[..2] {
            replication::encode(m, &mut bytes);
        }
        for b in bytes.chunks(1) {
            data.write_all(b).await.unwrap();
        }
        let mut bytes = Vec::new();
        for m in &sent[2..] {
            replication::encode(m, &mut bytes);
        }
        data.write_all(&bytes).await.unwrap();
        let got = frames(&mut s, 0, 4).await.unwrap();
        assert_eq!(got, sent);
    }

    #[tokio::test]
    async fn a_length_out_of_range_or_a_closed_peer_breaks_the_connection() {
        let (mut s, mut data, control) = session().await;
        data.write_all(&u32::MAX.to_le_bytes()).await.unwrap();
        let e = frames(&mut s, 0, 1).await.expect_err("refused");
        assert!(e.contains("out of range"), "{e}");
        drop(control);
        let e = frames(&mut s, 1, 1).await.expect_err("closed");
        assert!(e.contains("closed"), "{e}");
    }

    #[tokio::test]
    async fn what_the_socket_does_not_take_waits_and_goes_out_in_order() {
        let (mut s, mut data, _control) = session().await;
        // Far more than the socket buffers hold while the peer reads nothing; payloads sent
        // by reference (1 MiB, 16 KiB) between copied ones (4 KiB), more pieces than one
        // vectored write takes.
        let sizes = [1 << 20, 4096, 16 << 10, 4096];
        let sent: Vec<Message> = (1..=160).map(|i| write(i, sizes[i as usize % 4])).collect();
        for m in &sent {
            s.queue(Channel::Data, m);
        }
        s.flush().unwrap();
        assert!(s.backlog(0), "40 MiB went out at once");
        let total: usize = sent
            .iter()
            .map(|m| replication::encode_to_vec(m).len())
            .sum();
        let reader = tokio::spawn(async move {
            let mut all = vec![0u8; total];
            data.read_exact(&mut all).await.unwrap();
            all
        });
        while s.backlog(0) {
            s.writable(0).await.unwrap();
            s.flush_one(0).unwrap();
        }
        let all = Bytes::from(reader.await.unwrap());
        let mut at = 0;
        for m in &sent {
            let (got, used) = replication::decode(&all.slice(at..)).unwrap().unwrap();
            assert_eq!(&got, m);
            at += used;
        }
        assert_eq!(at, total);
    }
}
