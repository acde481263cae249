//! A logical unit: configuration, per-command gatekeeping (ALUA, unit attentions,
//! reservations) and the dispatch of decoded commands to their handlers.

use crate::alua::TargetPortGroups;
use crate::caw_lock::CawLocks;
use crate::cdb::{decode_cdb, op, Command};
use crate::io::Io;
use crate::pr::{PrLock, PrState};
use crate::sense::{status, Sense};
use crate::ua::UnitAttentions;
use crate::{put_truncated, Error, Nexus, ScsiOutcome, ScsiRequest};
use blockstore::BlockDevice;
use bytes::BytesMut;
use parking_lot::{Mutex, RwLock};
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Everything needed to create a logical unit.
#[derive(Clone)]
pub struct LunConfig {
    /// Backing store.
    pub device: Arc<dyn BlockDevice>,
    /// Logical block size: 512 or 4096.
    pub block_size: u32,
    /// NAA-6 registered extended identifier, identical on every port.
    pub naa_id: [u8; 16],
    /// Unit serial number (VPD 0x80).
    pub serial: String,
    /// T10 vendor identification (8 characters used).
    pub vendor: String,
    /// Product identification (16 characters used).
    pub product: String,
    /// Product revision level (4 characters used).
    pub revision: String,
    /// Reject writes with DATA PROTECT.
    pub read_only: bool,
    /// Initial WCE (write cache enabled); when clear every write is flushed before GOOD.
    pub write_cache: bool,
    /// Where reservations with APTPL persist; `None` disables APTPL (unless `pr_store`).
    pub pr_file: Option<PathBuf>,
    /// Reservation state shared with the other gateways of this logical unit; when set it
    /// replaces `pr_file` (see [`crate::PrStore`]).
    pub pr_store: Option<Arc<dyn crate::PrStore>>,
    /// Thin provisioning (UNMAP, WRITE SAME with UNMAP, GET LBA STATUS).
    pub thin: bool,
}

/// Largest READ/WRITE in blocks is this many bytes / block size.
pub(crate) const MAX_TRANSFER_BYTES: u64 = 8 << 20;
/// Largest COMPARE AND WRITE in blocks.
pub(crate) const MAX_CAW_BLOCKS: u32 = 255;
/// Largest WRITE SAME in blocks.
pub(crate) const MAX_WRITE_SAME_BLOCKS: u64 = 0xFFFF;
/// Largest UNMAP in blocks and descriptors.
pub(crate) const MAX_UNMAP_BLOCKS: u32 = 1 << 20;
pub(crate) const MAX_UNMAP_DESCRIPTORS: u32 = 256;

/// One emulated SBC direct-access block device.
pub struct LogicalUnit {
    pub(crate) cfg: LunConfig,
    /// Capacity in logical blocks; grows when the backing device does ([`Self::grow`]).
    blocks: AtomicU64,
    pub(crate) tpgs: Arc<TargetPortGroups>,
    pub(crate) wce: AtomicBool,
    pub(crate) ua: Arc<UnitAttentions>,
    alua_seen: AtomicU64,
    pub(crate) pr: Arc<PrLock>,
    /// Serialises this gateway's PERSISTENT RESERVE OUT commands against a shared store.
    pub(crate) pr_out_lock: Mutex<()>,
    pub(crate) caw: CawLocks,
    prevent: Mutex<HashSet<u64>>,
    pub(crate) copy: crate::xcopy::CopyManager,
    /// Other LUs of the target, for EXTENDED COPY (set by [`crate::LunMap`]).
    pub(crate) peers: RwLock<Vec<std::sync::Weak<LogicalUnit>>>,
    /// The commands under way, for a reset made through another target of this LU.
    pub(crate) drain: Arc<crate::drain::Drain>,
}

impl LogicalUnit {
    /// Creates a logical unit; loads persisted reservations from `cfg.pr_file` if it exists,
    /// or from `cfg.pr_store` (and subscribes to its changes).
    pub fn new(cfg: LunConfig, tpgs: Arc<TargetPortGroups>) -> Result<Self, Error> {
        if cfg.block_size != 512 && cfg.block_size != 4096 {
            return Err(Error::Config(format!(
                "block size {} (512 or 4096)",
                cfg.block_size
            )));
        }
        let blocks = cfg.device.size_bytes() / u64::from(cfg.block_size);
        if blocks == 0 {
            return Err(Error::Config("device smaller than one block".into()));
        }
        let pr = match &cfg.pr_file {
            Some(p) => PrState::load(p)?,
            None => PrState::default(),
        };
        let lu = Self {
            wce: AtomicBool::new(cfg.write_cache),
            cfg,
            blocks: AtomicU64::new(blocks),
            alua_seen: AtomicU64::new(tpgs.generation()),
            tpgs,
            ua: Arc::new(UnitAttentions::default()),
            pr: Arc::new(PrLock::new(pr)),
            pr_out_lock: Mutex::new(()),
            caw: CawLocks::default(),
            prevent: Mutex::new(HashSet::new()),
            copy: Default::default(),
            peers: RwLock::new(Vec::new()),
            drain: Arc::default(),
        };
        lu.attach_pr_store()?;
        Ok(lu)
    }

    /// Number of logical blocks.
    pub fn block_count(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }

    /// Grows the logical unit to `bytes` (a whole number of blocks, not smaller than now):
    /// the backing device grows first, then the capacity, and every I_T nexus gets CAPACITY
    /// DATA HAS CHANGED (SBC-3 4.6; SPC-4 2A/09) once. Returns whether the capacity changed.
    pub fn grow(&self, bytes: u64) -> Result<bool, Error> {
        let bs = u64::from(self.cfg.block_size);
        if !bytes.is_multiple_of(bs) {
            return Err(Error::Config(format!(
                "{bytes} bytes is not a whole number of {bs}-byte blocks"
            )));
        }
        let blocks = bytes / bs;
        let current = self.block_count();
        if blocks < current {
            return Err(Error::Config(format!(
                "cannot shrink from {current} to {blocks} blocks"
            )));
        }
        if blocks == current {
            return Ok(false);
        }
        self.cfg
            .device
            .grow(bytes)
            .map_err(|e| Error::Config(format!("growing the backing device: {e}")))?;
        self.blocks.store(blocks, Ordering::Release);
        self.ua.raise_all(0x2A, 0x09, None);
        Ok(true)
    }

    /// Follows a size changed outside lanes (an RBD image grown with `rbd resize`): grows the
    /// logical unit to the storage's size, rounded down to whole blocks, with CAPACITY DATA
    /// HAS CHANGED. Ok(None) for a device whose size only lanes changes; Ok(Some(false)) when
    /// nothing changed. A smaller size is an error (data would vanish under the hosts), and
    /// the capacity stays.
    pub fn follow_storage_size(&self) -> Result<Option<bool>, Error> {
        let Some(reported) = self.cfg.device.size_from_storage() else {
            return Ok(None);
        };
        let bytes =
            reported.map_err(|e| Error::Config(format!("reading the storage's size: {e}")))?;
        let bs = u64::from(self.cfg.block_size);
        self.grow(bytes - bytes % bs).map(Some)
    }

    /// Makes a nexus known that logged in before this LU existed (a LUN added at run time),
    /// with `condition` as its first unit attention.
    pub fn nexus_joined(&self, n: &Nexus, condition: (u8, u8)) {
        self.ua.add(n, Some(condition));
    }

    /// Queues unit attention `(asc, ascq)` for every nexus.
    pub fn raise_unit_attention(&self, asc: u8, ascq: u8) {
        self.ua.raise_all(asc, ascq, None);
    }

    /// Drops a queued `(asc, ascq)` of nexus `id` (reported through another LU already).
    pub fn clear_unit_attention(&self, id: u64, asc: u8, ascq: u8) {
        self.ua.clear(id, asc, ascq);
    }

    /// The configuration it was created with.
    pub fn config(&self) -> &LunConfig {
        &self.cfg
    }

    /// A new I_T nexus can reach this LU: it gets POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub fn nexus_added(&self, n: &Nexus) {
        self.ua.add(n, Some((0x29, 0x00)));
    }

    /// I_T nexus loss: its SPC-2 reservation and PREVENT state go; PR registrations persist.
    pub fn nexus_removed(&self, n: &Nexus) {
        self.ua.remove(n.id);
        self.prevent.lock().remove(&n.id);
        if self.shares_legacy() {
            // Released through the store, off the event loop: `release_shared_reservation`.
            return;
        }
        let mut pr = self.pr.write();
        if pr.is_legacy_holder(n) {
            pr.legacy_holder = None;
        }
    }

    /// Whether `n` holds an SPC-2 reservation shared with the other node of a pair, which
    /// [`Self::release_shared_reservation`] must release when the nexus is lost.
    pub fn holds_shared_reservation(&self, n: &Nexus) -> bool {
        self.shares_legacy() && self.pr.read().is_legacy_holder(n)
    }

    /// I_T nexus loss with a shared SPC-2 reservation: released on both nodes. Blocks until
    /// the other node has it: call off the event loop, after [`Self::nexus_removed`].
    pub fn release_shared_reservation(&self, n: &Nexus) {
        if self.holds_shared_reservation(n) {
            self.change_legacy(|st| {
                if st.is_legacy_holder(n) {
                    st.legacy_holder = None;
                }
                Ok(())
            });
        }
    }

    /// LOGICAL UNIT RESET received from `by`: releases SPC-2 reservations and PREVENT state and
    /// raises BUS DEVICE RESET FUNCTION OCCURRED on every nexus, the requester's included
    /// (SAM-5 6.3.4; libiscsi's MultipathIO.Reset checks every path).
    pub fn lun_reset(&self, by: Option<&Nexus>) {
        let _ = by;
        self.prevent.lock().clear();
        // A shared SPC-2 reservation is released through the store (`share_lun_reset`).
        if !self.shares_legacy() {
            self.pr.write().legacy_holder = None;
        }
        self.ua.raise_all(0x29, 0x03, None);
    }

    /// TARGET (WARM/COLD) RESET: 29/02 (warm) or 29/01 (cold) on all nexuses.
    pub fn target_reset(&self, cold: bool) {
        self.prevent.lock().clear();
        // A shared SPC-2 reservation is released through the store (`share_target_reset`).
        if !self.shares_legacy() {
            self.pr.write().legacy_holder = None;
        }
        self.ua
            .raise_all(0x29, if cold { 0x01 } else { 0x02 }, None);
    }

    /// CLEAR TASK SET / ABORT TASK SET by `by` with TAS=0: other nexuses see COMMANDS CLEARED
    /// BY ANOTHER INITIATOR only for CLEAR TASK SET.
    pub fn clear_task_set(&self, by: &Nexus) {
        self.ua.raise_all(0x2F, 0x00, Some(by.id));
    }

    pub(crate) fn check_alua_generation(&self) {
        let g = self.tpgs.generation();
        if self.alua_seen.load(Ordering::Acquire) != g
            && self.alua_seen.swap(g, Ordering::AcqRel) != g
        {
            self.ua.raise_all(0x2A, 0x06, None);
        }
    }

    /// Whether LBPRZ (unmapped blocks read as zeros) is reported. Holes of the backing file do
    /// read as zeros, but QEMU's iSCSI driver (7.2, Debian 12) asserts when LBPRZ is set on a
    /// LUN with 4096-byte blocks (it probes block status 512 bytes at a time), which kills any
    /// QEMU guest reading 32 KiB or more; so 4096-byte LUNs report LBPRZ=0 and still read zeros.
    pub(crate) fn reports_lbprz(&self) -> bool {
        self.cfg.device.holes_read_zero() && self.cfg.block_size == 512
    }

    /// Executes a READ or WRITE without sleeping, if it can complete from memory (page-cache
    /// hits, buffered writes that need no flush); `None` otherwise, with nothing changed, and
    /// the caller runs [`execute`](Self::execute) on a blocking thread. Lets an event loop
    /// serve most I/O inline instead of paying two thread hand-offs per command.
    pub fn execute_nowait(
        &self,
        req: &ScsiRequest<'_>,
        data_in: &mut BytesMut,
    ) -> Option<ScsiOutcome> {
        let opcode = req.cdb.first().copied()?;
        if !crate::cdb::is_read_or_write(opcode) {
            return None;
        }
        let _under_way = self.drain.enter();
        self.check_alua_generation();
        if self.ua.any_pending() {
            return None;
        }
        let state = self.tpgs.state_of(req.nexus.target_port_group);
        if TargetPortGroups::access_check(state, opcode, 0).is_some() {
            return None;
        }
        let cmd = match decode_cdb(req.cdb) {
            Ok(c) => c,
            Err(_) => return None,
        };
        if self.pr.conflicts(req.nexus, &cmd) {
            return None;
        }
        let done = match cmd {
            Command::Read(r) => self.read(r, data_in, Io::NoWait),
            Command::Write(r) => self.write(req, r, Io::NoWait),
            _ => return None,
        };
        match done {
            Ok(true) => Some(ScsiOutcome::good()),
            Ok(false) => None,
            Err(s) => {
                data_in.clear();
                Some(ScsiOutcome::check(s))
            }
        }
    }

    /// Whether `cdb` is a WRITE that only needs the page cache: no FUA, the write cache on, and
    /// a device whose writes stay on this machine. Such a write can still sleep in the kernel
    /// (journal, allocation, dirty throttling), but never waits for a flush or another
    /// machine, so it may queue behind other buffered writes.
    pub fn is_buffered_write(&self, cdb: &[u8]) -> bool {
        let fua = match cdb.first().copied() {
            Some(op::WRITE_6) => false,
            Some(op::WRITE_10 | op::WRITE_12 | op::WRITE_16) => {
                cdb.get(1).is_some_and(|b| b & 0x08 != 0)
            }
            _ => return false,
        };
        !fua && self.wce.load(Ordering::Relaxed) && self.cfg.device.writes_stay_local()
    }

    /// Executes one command; data-in is appended to `data_in`.
    pub fn execute(&self, req: &ScsiRequest<'_>, data_in: &mut BytesMut) -> ScsiOutcome {
        let opcode = req.cdb.first().copied().unwrap_or(0xFF);
        let action = req.cdb.get(1).copied().unwrap_or(0) & 0x1F;
        // A PERSISTENT RESERVE OUT is not waited for by a drain: it waits itself for the other
        // targets to take its change, and two of them at once through two targets would each
        // wait for the other's drain.
        let _under_way = (opcode != op::PERSISTENT_RESERVE_OUT).then(|| self.drain.enter());
        self.check_alua_generation();
        // SAM-5 5.14: INQUIRY, REPORT LUNS and REQUEST SENSE do not report or clear a UA.
        if !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
            if let Some(s) = self.ua.take(req.nexus.id) {
                return ScsiOutcome::check(s);
            }
        }
        let state = self.tpgs.state_of(req.nexus.target_port_group);
        if let Some(s) = TargetPortGroups::access_check(state, opcode, action) {
            return ScsiOutcome::check(s);
        }
        let cmd = match decode_cdb(req.cdb) {
            Ok(c) => c,
            Err(s) => return ScsiOutcome::check(s),
        };
        if self.pr.conflicts(req.nexus, &cmd) {
            return ScsiOutcome::conflict();
        }
        match self.dispatch(req, cmd, data_in) {
            Ok(st) => ScsiOutcome {
                status: st,
                sense: None,
            },
            // PERSISTENT RESERVE OUT signals RESERVATION CONFLICT with a sense-key marker.
            Err(s) if s.key == 0xFF => {
                data_in.clear();
                ScsiOutcome::conflict()
            }
            Err(s) => {
                data_in.clear();
                ScsiOutcome::check(s)
            }
        }
    }

    fn dispatch(
        &self,
        req: &ScsiRequest<'_>,
        cmd: Command,
        out: &mut BytesMut,
    ) -> Result<u8, Sense> {
        match cmd {
            Command::TestUnitReady => {}
            Command::RequestSense { desc, alloc } => {
                let s = self.ua.take(req.nexus.id).unwrap_or(Sense::new(0, 0, 0));
                if desc {
                    put_truncated(out, &s.to_descriptor_bytes(), alloc);
                } else {
                    put_truncated(out, &s.to_fixed_bytes(), alloc);
                }
            }
            Command::Inquiry { evpd, page, alloc } => {
                self.inquiry(req.nexus, evpd, page, alloc, out)?
            }
            Command::ReportLuns { .. } => return Err(Sense::invalid_opcode()),
            Command::ReadCapacity10 => {
                let last = u32::try_from(self.block_count() - 1).unwrap_or(u32::MAX);
                out.extend_from_slice(&last.to_be_bytes());
                out.extend_from_slice(&self.cfg.block_size.to_be_bytes());
            }
            Command::ReadCapacity16 { alloc } => {
                let mut b = [0u8; 32];
                b[0..8].copy_from_slice(&(self.block_count() - 1).to_be_bytes());
                b[8..12].copy_from_slice(&self.cfg.block_size.to_be_bytes());
                if self.cfg.thin {
                    b[14] = 0x80 | if self.reports_lbprz() { 0x40 } else { 0 };
                }
                put_truncated(out, &b, alloc);
            }
            Command::Read(r) => {
                self.read(r, out, Io::Blocking)?;
            }
            Command::Write(r) => {
                self.write(req, r, Io::Blocking)?;
            }
            Command::WriteAndVerify { range, .. } => {
                self.write(req, range, Io::Blocking)?;
            }
            Command::Verify { range, bytchk } => self.verify(req, range, bytchk)?,
            Command::WriteSame {
                lba,
                blocks,
                unmap,
                anchor,
                ndob,
            } => self.write_same(req, lba, blocks, unmap, anchor, ndob)?,
            Command::Unmap { anchor, param_len } => self.unmap(req, anchor, param_len)?,
            Command::CompareAndWrite(r) => self.compare_and_write(req, r)?,
            Command::PreFetch { lba, blocks } => self.check_range(lba, u64::from(blocks))?,
            Command::SynchronizeCache { lba, blocks } => {
                self.check_range(lba, u64::from(blocks))?;
                self.cfg
                    .device
                    .flush()
                    .map_err(|e| Sense::device(&e, Sense::write_error()))?;
            }
            Command::ModeSense {
                ten,
                dbd,
                llbaa,
                pc,
                page,
                subpage,
                alloc,
            } => self.mode_sense(ten, dbd, llbaa, pc, page, subpage, alloc, out)?,
            Command::ModeSelect {
                ten,
                pf,
                sp,
                param_len,
            } => self.mode_select(req, ten, pf, sp, param_len)?,
            Command::StartStopUnit { loej, start } => {
                if loej && !start && self.prevent.lock().iter().next().is_some() {
                    return Err(Sense::new(crate::sense::key::ILLEGAL_REQUEST, 0x53, 0x02));
                }
            }
            Command::PreventAllow { prevent } => {
                // Only "allow" (0) and "prevent" (1) apply to a direct-access device.
                if prevent > 1 {
                    return Err(Sense::invalid_cdb(4, Some(1)));
                }
                let mut p = self.prevent.lock();
                if prevent == 1 {
                    p.insert(req.nexus.id);
                } else {
                    p.remove(&req.nexus.id);
                }
            }
            Command::GetLbaStatus { lba, alloc } => self.get_lba_status(lba, alloc, out)?,
            Command::Reserve => self.reserve_legacy(req.nexus)?,
            Command::Release => self.release_legacy(req.nexus),
            Command::PersistentReserveIn { action, alloc } => self.pr_in(action, alloc, out)?,
            Command::PersistentReserveOut {
                action,
                scope,
                kind,
                param_len,
            } => {
                return self
                    .pr_out(req, action, scope, kind, param_len)
                    .map(|()| status::GOOD)
            }
            Command::ReportTargetPortGroups { extended, alloc } => {
                self.report_tpgs(extended, alloc, out)
            }
            Command::SetTargetPortGroups { param_len } => self.set_tpgs(req, param_len)?,
            Command::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                action,
                alloc,
            } => crate::opcodes::report(rctd, options, opcode, action, alloc, out)?,
            Command::ReportSupportedTmf { repd, alloc } => {
                // ABORT TASK, ABORT TASK SET, CLEAR TASK SET, LU RESET, TARGET RESET; QUERY TASK.
                let mut b = [0u8; 16];
                b[0] = 0x80 | 0x40 | 0x20 | 0x08 | 0x02;
                b[1] = 0x01;
                put_truncated(out, if repd { &b[..16] } else { &b[..4] }, alloc);
            }
            Command::ExtendedCopy { param_len } => self.extended_copy(req, param_len)?,
            Command::ReceiveCopyResults {
                action,
                list_id,
                alloc,
            } => self.receive_copy_results(req.nexus.id, action, list_id, alloc, out)?,
        }
        Ok(status::GOOD)
    }

    /// Checks `[lba, lba+blocks)` against the capacity (21/00 LBA OUT OF RANGE).
    pub(crate) fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.block_count() => Ok(()),
            _ => Err(Sense::lba_out_of_range()),
        }
    }

    fn reserve_legacy(&self, n: &Nexus) -> Result<(), Sense> {
        let who = crate::ua::NexusIdentity::of(n);
        let holder = crate::pr::Registration {
            key: 0,
            name: who.name.to_string(),
            isid: Some(who.isid),
            rel_port: who.rel_port,
            all_tg_pt: false,
        };
        if self.shares_legacy() {
            // Checked again against the shared state: the other node may have reserved first.
            let got = self.change_legacy(|st| {
                if st.legacy_holder.as_ref().is_some_and(|h| !h.matches(&who)) {
                    return Err(Sense::new(0xFF, 0, 0));
                }
                st.legacy_holder = Some(holder.clone());
                Ok(())
            });
            return match got {
                Some(Err(s)) => Err(s),
                Some(Ok(())) => Ok(()),
                None => Err(Sense::internal_failure()),
            };
        }
        // Conflicting holders were turned away by the reservation check before dispatch.
        self.pr.write().legacy_holder = Some(holder);
        Ok(())
    }

    fn release_legacy(&self, n: &Nexus) {
        if self.shares_legacy() {
            if self.pr.read().is_legacy_holder(n) {
                self.change_legacy(|st| {
                    if st.is_legacy_holder(n) {
                        st.legacy_holder = None;
                    }
                    Ok(())
                });
            }
            return;
        }
        let mut pr = self.pr.write();
        if pr.is_legacy_holder(n) {
            pr.legacy_holder = None;
        }
    }

    fn report_tpgs(&self, extended: bool, alloc: u32, out: &mut BytesMut) {
        let mut body = Vec::new();
        let remote = self.tpgs.remote();
        let local = self
            .tpgs
            .groups()
            .iter()
            .map(|g| (g.id, g.state(), &g.ports[..]));
        let others = remote
            .iter()
            .map(|(id, state)| (*id, *state, std::slice::from_ref(id)));
        for (id, state, ports) in local.chain(others) {
            // PREF=0, asymmetric access state; supported states: T, U, S, AN, AO.
            body.push(state as u8);
            body.push(0x80 | 0x08 | 0x04 | 0x02 | 0x01);
            body.extend_from_slice(&id.to_be_bytes());
            body.push(0);
            body.push(0); // status code
            body.push(0);
            body.push(ports.len().min(255) as u8);
            for p in ports.iter().take(255) {
                body.extend_from_slice(&[0, 0]);
                body.extend_from_slice(&p.to_be_bytes());
            }
        }
        let mut b = Vec::with_capacity(body.len() + 8);
        let len = u32::try_from(body.len() + if extended { 4 } else { 0 }).unwrap_or(u32::MAX);
        b.extend_from_slice(&len.to_be_bytes());
        if extended {
            // Format 1, implicit transition time 0.
            b.extend_from_slice(&[0x10, 0, 0, 0]);
        }
        b.extend_from_slice(&body);
        put_truncated(out, &b, alloc);
    }

    fn set_tpgs(&self, req: &ScsiRequest<'_>, param_len: u32) -> Result<(), Sense> {
        if param_len == 0 {
            return Ok(());
        }
        let data = crate::gather(req.data_out, param_len as usize);
        if data.len() < param_len as usize || param_len < 4 || (param_len - 4) & 3 != 0 {
            return Err(Sense::param_list_length());
        }
        let mut changes = Vec::new();
        for (i, d) in data
            .get(4..)
            .unwrap_or_default()
            .chunks_exact(4)
            .enumerate()
        {
            let at = 4 + i * 4;
            let (Some(&s), Some(&hi), Some(&lo)) = (d.first(), d.get(2), d.get(3)) else {
                continue;
            };
            let state = match s & 0x0F {
                0 => crate::AluaState::ActiveOptimized,
                1 => crate::AluaState::ActiveNonOptimized,
                2 => crate::AluaState::Standby,
                3 => crate::AluaState::Unavailable,
                _ => return Err(Sense::invalid_param(at, Some(3))),
            };
            let id = u16::from_be_bytes([hi, lo]);
            if !self.tpgs.groups().iter().any(|g| g.id == id) {
                return Err(Sense::invalid_param(at + 2, None));
            }
            changes.push((id, state));
        }
        for (id, state) in changes {
            self.tpgs.set_state(id, state);
        }
        // The nexus that asked does not get the UA (SPC-4 5.15.2.3); others do on next command.
        let g = self.tpgs.generation();
        if self.alua_seen.swap(g, Ordering::AcqRel) != g {
            self.ua.raise_all(0x2A, 0x06, Some(req.nexus.id));
        }
        Ok(())
    }
}
