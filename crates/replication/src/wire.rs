//! Peer-link messages: one type per message, each sent with a [`Header`] (epoch, node,
//! sequence). Framing and checksums are in [`crate::codec`].
//!
//! Two connections carry them ([`Channel`]): `Data` for everything that must stay in order
//! with the writes (writes, resync data, flushes, the handshake), `Control` for what must not
//! wait behind bulk data (acknowledgements and heartbeats). Each channel is a FIFO stream
//! (TCP); the header's sequence numbers each channel's frames from 1 after a connect, so a
//! duplicated or replayed frame is recognised and refused.

use bytes::Bytes;

use crate::meta::Generations;

/// A node of the pair: 0 or 1.
pub type NodeId = u8;

/// Which of the two peer connections a message travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Writes, resync data, flushes and the handshake, in order.
    Data,
    /// Acknowledgements and heartbeats.
    Control,
}

/// Carried by every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The sender's epoch; a message from an older epoch is refused.
    pub epoch: u64,
    /// The sender.
    pub node: NodeId,
    /// Per connection and channel, from 1.
    pub seq: u64,
}

/// First message on a new connection (data channel), followed by the sender's dirty bitmap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Protocol version; see [`crate::codec::VERSION`].
    pub version: u16,
    /// The sender's generation identifiers.
    pub gens: Generations,
    /// The sender knows it is outdated (lost a race, or an unfinished resync target).
    pub outdated: bool,
    /// The sender currently holds the epoch alone.
    pub alone: bool,
    /// The sender started from disk and has served nothing since: after a power loss its disk
    /// may lack writes the peer acknowledged, so with equal generations the peer is the source.
    pub booted: bool,
    /// The LUN size in blocks, the block size and the bitmap granularity: both ends must agree.
    pub lun_blocks: u64,
    pub block_size: u32,
    pub region_blocks: u32,
    /// The write sequence number of the sender's next replicated write.
    pub next_wseq: u64,
}

/// A chunk of the sender's dirty bitmap (regions that may differ from the peer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    /// Index of the first 64-bit word.
    pub first_word: u64,
    /// Little-endian words.
    pub words: Vec<u64>,
}

/// The sender's bitmap is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitmapEnd {
    /// Number of set bits the receiver should have seen (a consistency check).
    pub set_bits: u64,
}

/// A chunk of the sender's *suspect* regions (handshake, after its [`Bitmap`] and before
/// [`BitmapEnd`]): regions set in its bitmap only because they lay in an activity-log extent
/// when it crashed. They may differ from the peer or not; the sync source compares them by
/// checksum ([`ResyncSums`]) instead of copying them. Bits outside the sender's bitmap are
/// ignored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspect {
    /// Index of the first 64-bit word.
    pub first_word: u64,
    /// Little-endian words.
    pub words: Vec<u64>,
}

/// A replicated host write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The origin's write sequence number (monotonic, also across retries).
    pub wseq: u64,
    /// The highest peer write sequence number the origin had received when it sent this.
    pub seen: u64,
    pub lba: u64,
    pub blocks: u32,
    /// Durable on completion (FUA, or write cache off).
    pub fua: bool,
    pub data: Bytes,
}

/// What the receiver did with a [`Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteStatus {
    /// Applied (durably if the write was FUA).
    Applied,
    /// Not applied: fully covered by concurrent writes of the ordering node, which win.
    Superseded,
    /// Not applied: partly covered by concurrent writes of the ordering node; send it again
    /// once they are in.
    Retry,
}

/// Acknowledges a [`Write`] (control channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteAck {
    pub wseq: u64,
    pub status: WriteStatus,
    /// The acknowledging node's last sent write sequence number: the receiver handles this
    /// acknowledgement only after it has received that write.
    pub fence: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// The sender's clock when sent, echoed back.
    pub sent_at: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatAck {
    pub echo: u64,
}

/// Make every write applied so far durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flush {
    pub id: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushAck {
    pub id: u64,
}

/// Contents of dirty regions, from the sync source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResyncData {
    pub lba: u64,
    pub blocks: u32,
    pub data: Bytes,
}

/// The sync target applied a [`ResyncData`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncAck {
    pub lba: u64,
    pub blocks: u32,
}

/// Checksums of suspect blocks, from the sync source (data channel, in order with its writes
/// and resync data): for each block of `lba .. lba + blocks`, the first 8 bytes of its
/// SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResyncSums {
    pub lba: u64,
    pub blocks: u32,
    pub sums: Bytes,
}

/// The sync target compared a [`ResyncSums`] against its blocks (control channel): bit `i`
/// of `differ` (byte `i / 8`, bit `i % 8`) set means block `lba + i` differs and must be
/// copied; `blocks.div_ceil(8)` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResyncDiffer {
    pub lba: u64,
    pub blocks: u32,
    pub differ: Bytes,
}

/// Resync finished: the target is up to date and takes these generation identifiers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncDone {
    pub gens: Generations,
}

/// What a [`Shared`] message does to the pair's shared SCSI state (persistent reservations),
/// which the core carries as opaque bytes with a version both nodes agree on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharedKind {
    /// Replace the state at version `base` with the payload (version `base + 1`); refused if
    /// the receiver's version is not `base`, or if it has its own change at `base` in flight
    /// and orders the pair (it is the leader).
    Change,
    /// The sync source's state after a handshake: the receiver takes it as it is, at `base`.
    Snapshot,
    /// No state change: unit attentions for the receiver's I_T nexuses (the payload).
    Notice,
}

/// A change of the shared SCSI state, a snapshot of it, or a notice (data channel, so it
/// stays in order with the handshake and the writes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shared {
    /// The sender's identifier, echoed in the [`SharedAck`].
    pub id: u64,
    pub kind: SharedKind,
    /// The version the change applies to (`Change`) or the snapshot's version.
    pub base: u64,
    pub payload: Bytes,
}

/// Answers a [`Shared`] `Change` or `Notice` (control channel): `accepted` once the receiver
/// has installed it (and raised the notice's unit attentions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedAck {
    pub id: u64,
    pub accepted: bool,
}

/// A COMPARE AND WRITE the follower forwards to the leader, which executes every CAW of the
/// pair (data channel).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caw {
    /// The sender's identifier, echoed in the [`CawResult`].
    pub id: u64,
    pub lba: u64,
    pub blocks: u32,
    /// The new data must be durable when written (FUA, or write cache off).
    pub fua: bool,
    /// `blocks * block_size` bytes each.
    pub verify: Bytes,
    pub write: Bytes,
}

/// What the leader did with a forwarded [`Caw`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CawStatus {
    /// Matched; the new data is applied on both nodes.
    Written,
    /// Differed first at this byte; nothing written.
    Miscompare(u64),
    /// Not executed (the receiver does not lead the pair now, or had no room); nothing
    /// written.
    Refused,
}

/// Answers a [`Caw`] (data channel: it arrives after every write the leader sent before it,
/// so the follower completes the CAW only once those are in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CawResult {
    pub id: u64,
    pub status: CawStatus,
}

/// A message body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    Hello(Hello),
    Bitmap(Bitmap),
    BitmapEnd(BitmapEnd),
    Write(Write),
    WriteAck(WriteAck),
    Heartbeat(Heartbeat),
    HeartbeatAck(HeartbeatAck),
    Flush(Flush),
    FlushAck(FlushAck),
    ResyncData(ResyncData),
    ResyncAck(ResyncAck),
    ResyncDone(ResyncDone),
    Shared(Shared),
    SharedAck(SharedAck),
    Caw(Caw),
    CawResult(CawResult),
    Suspect(Suspect),
    ResyncSums(ResyncSums),
    ResyncDiffer(ResyncDiffer),
}

impl Body {
    /// The connection this message travels on.
    pub fn channel(&self) -> Channel {
        match self {
            Body::WriteAck(_)
            | Body::Heartbeat(_)
            | Body::HeartbeatAck(_)
            | Body::FlushAck(_)
            | Body::ResyncAck(_)
            | Body::ResyncDiffer(_)
            | Body::SharedAck(_) => Channel::Control,
            _ => Channel::Data,
        }
    }

    /// Short name, for events and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Body::Hello(_) => "Hello",
            Body::Bitmap(_) => "Bitmap",
            Body::BitmapEnd(_) => "BitmapEnd",
            Body::Write(_) => "Write",
            Body::WriteAck(_) => "WriteAck",
            Body::Heartbeat(_) => "Heartbeat",
            Body::HeartbeatAck(_) => "HeartbeatAck",
            Body::Flush(_) => "Flush",
            Body::FlushAck(_) => "FlushAck",
            Body::ResyncData(_) => "ResyncData",
            Body::ResyncAck(_) => "ResyncAck",
            Body::ResyncDone(_) => "ResyncDone",
            Body::Shared(_) => "Shared",
            Body::SharedAck(_) => "SharedAck",
            Body::Caw(_) => "Caw",
            Body::CawResult(_) => "CawResult",
            Body::Suspect(_) => "Suspect",
            Body::ResyncSums(_) => "ResyncSums",
            Body::ResyncDiffer(_) => "ResyncDiffer",
        }
    }
}

/// A message: header and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub body: Body,
}

impl Message {
    /// The message without its data payloads, for logs.
    pub fn body_summary(&self) -> String {
        match &self.body {
            Body::Write(w) => format!(
                "Write wseq {} seen {} {}+{} fua {}",
                w.wseq, w.seen, w.lba, w.blocks, w.fua
            ),
            Body::ResyncData(d) => format!("ResyncData {}+{}", d.lba, d.blocks),
            Body::ResyncSums(d) => format!("ResyncSums {}+{}", d.lba, d.blocks),
            Body::Suspect(b) => format!(
                "Suspect from word {} ({} words)",
                b.first_word,
                b.words.len()
            ),
            Body::Shared(s) => format!(
                "Shared id {} {:?} base {} ({} bytes)",
                s.id,
                s.kind,
                s.base,
                s.payload.len()
            ),
            Body::Caw(c) => format!("Caw id {} {}+{} fua {}", c.id, c.lba, c.blocks, c.fua),
            Body::Bitmap(b) => format!(
                "Bitmap from word {} ({} words)",
                b.first_word,
                b.words.len()
            ),
            other => format!("{other:?}"),
        }
    }
}
