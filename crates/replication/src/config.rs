//! Configuration of one replica.

use crate::wire::NodeId;

/// Nanoseconds of the driver's monotonic clock (time since any fixed start).
pub type Nanos = u64;

/// Settings of one LUN's replica on one node. Both nodes must agree on the sizes (checked in
/// the handshake).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This node (0 or 1).
    pub node: NodeId,
    /// The node that wins epoch races on a tie (it races at once; the other waits
    /// `tie_delay` first) and orders concurrent writes when neither node holds the epoch alone.
    pub preferred: NodeId,
    /// LUN size in blocks.
    pub lun_blocks: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Dirty-bitmap granularity in blocks. Default: one 4 KiB block per bit, as DRBD: small
    /// random writes while the peer is away then cost exactly their own size in resync, which
    /// is what keeps resync within ~1.2x of the data written (a 64 KiB bit would move up to
    /// 16x for 4 KiB random writes). The price is memory: 32 MiB of bitmap per TiB.
    pub region_blocks: u32,
    /// Activity-log extent size in blocks (default 4 MiB). After a crash every AL extent is
    /// compared by checksum with the peer (only differing blocks are copied), so this times
    /// `al_slots` bounds what a crash costs to read.
    pub al_extent_blocks: u64,
    /// Activity-log slots (default 127: at most 508 MiB compared after a crash).
    pub al_slots: usize,
    /// Most host writes in flight at once on this node (more are refused as busy).
    pub max_inflight: usize,
    /// Heartbeat period (default 100 ms).
    pub heartbeat_interval: Nanos,
    /// Missed heartbeat periods before the peer counts as lost (default 3).
    pub heartbeat_misses: u32,
    /// How long after a heartbeat was sent its acknowledgement lets this node serve reads while
    /// paired (default 2 periods, below the failure timeout so a peer that declares this node
    /// lost is sure it serves no more reads).
    pub read_lease: Nanos,
    /// Extra wait before racing for the epoch on the node that is not preferred.
    pub tie_delay: Nanos,
    /// Wait before racing again after the epoch store was unreachable.
    pub race_retry: Nanos,
    /// Most regions per resync chunk.
    pub resync_chunk_regions: u32,
    /// Most resync chunks in flight.
    pub resync_window: usize,
    /// A resync that moves no chunk, checksum or final step for this long is reported and
    /// started again on a new connection (default 20 s; its bitmaps keep every difference).
    pub resync_stall: Nanos,
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("node and preferred node must be 0 or 1")]
    Node,
    #[error("sizes must be non-zero and the AL extent a multiple of the region")]
    Sizes,
    #[error("the failure timeout must exceed the read lease")]
    Lease,
    #[error("the resync stall timeout must exceed the failure timeout")]
    Stall,
}

impl Config {
    /// Defaults for a LUN of `lun_blocks` 4 KiB blocks.
    pub fn new(node: NodeId, preferred: NodeId, lun_blocks: u64) -> Config {
        const MS: Nanos = 1_000_000;
        Config {
            node,
            preferred,
            lun_blocks,
            block_size: 4096,
            region_blocks: 1,
            al_extent_blocks: 1024,
            al_slots: 127,
            max_inflight: 128,
            heartbeat_interval: 100 * MS,
            heartbeat_misses: 3,
            read_lease: 200 * MS,
            tie_delay: 100 * MS,
            race_retry: 100 * MS,
            resync_chunk_regions: 64,
            resync_window: 8,
            resync_stall: 20_000 * MS,
        }
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node > 1 || self.preferred > 1 {
            return Err(ConfigError::Node);
        }
        if self.lun_blocks == 0
            || self.block_size == 0
            || self.region_blocks == 0
            || self.al_extent_blocks == 0
            || self.al_slots < 2
            || self.max_inflight == 0
            || self.resync_chunk_regions == 0
            || self.resync_window == 0
            || !self
                .al_extent_blocks
                .is_multiple_of(u64::from(self.region_blocks))
        {
            return Err(ConfigError::Sizes);
        }
        if self.failure_timeout() <= self.read_lease {
            return Err(ConfigError::Lease);
        }
        if self.resync_stall <= self.failure_timeout() {
            return Err(ConfigError::Stall);
        }
        Ok(())
    }

    /// The other node.
    pub fn peer(&self) -> NodeId {
        1 - self.node
    }

    /// Silence after which the peer counts as lost.
    pub fn failure_timeout(&self) -> Nanos {
        self.heartbeat_interval * u64::from(self.heartbeat_misses)
    }

    /// Bitmap regions of the LUN.
    pub fn regions(&self) -> u64 {
        self.lun_blocks.div_ceil(u64::from(self.region_blocks))
    }
}
