//! What a multipath device needs of one path beyond reads and writes: liveness pings, an
//! abortive close, task management, cache flushes, unmap and zeroing, and ALUA state.

use bytes::Bytes;
use iscsi_proto::pdu::*;
use std::time::{Duration, Instant};

use crate::cdb;
use crate::identify::{
    parse_device_identification, parse_target_port_groups, DeviceIdentity, PortGroupState,
};
use crate::session::{encode_lun, Session};
use crate::Error;

impl Session {
    /// One NOP-Out ping (immediate, so it needs no CmdSN window slot); the round-trip time.
    pub async fn ping(&self) -> Result<Duration, Error> {
        let start = Instant::now();
        let out = self
            .issue(true, None, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::NopOut(NopOut {
                    immediate: true,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn,
                    data: Bytes::new(),
                })]
            })
            .await?;
        if out.response != 0 {
            return Err(Error::Protocol("NOP-In with a response code".into()));
        }
        Ok(start.elapsed())
    }

    /// Ends the connection at once and abortively: the socket closes with a reset, so whatever
    /// the kernel still holds to send (a write's data included) is discarded and can never reach
    /// the target later; every outstanding command ends with `ConnectionLost`.
    ///
    /// This alone does not stop the target from executing commands it already received: fence
    /// with session reinstatement or a LOGICAL UNIT RESET before replaying writes elsewhere.
    ///
    /// Returns the CmdSNs its lost commands had taken (also when the connection had already
    /// ended on its own), for MC/S to fill the holes they leave.
    pub fn kill(&self) -> Vec<u32> {
        // Drain first: the reader, woken by the shutdown below, must find nothing to lose.
        self.shared.end();
        let socket = self
            .shared
            .socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(fd) = socket {
            let _ = rustix::net::sockopt::set_socket_linger(&fd, Some(Duration::ZERO));
            let _ = rustix::net::shutdown(&fd, rustix::net::Shutdown::Read);
        }
        self.reader.abort();
        self.writer.abort();
        self.shared.take_lost()
    }

    /// MC/S: asks the target, on this connection, to close connection `cid` of the session
    /// (Logout reason 1, RFC 7143 11.14). lanes serve answers once that connection and its
    /// tasks are gone.
    pub async fn logout_connection(&self, cid: u16) -> Result<(), Error> {
        let out = self
            .issue(true, None, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::LogoutRequest(LogoutRequest {
                    immediate: true,
                    reason: 1,
                    itt,
                    cid,
                    cmd_sn,
                    exp_stat_sn,
                })]
            })
            .await?;
        match out.response {
            0 => Ok(()),
            1 => Err(Error::Protocol(format!(
                "the target knows no connection {cid}"
            ))),
            r => Err(Error::Protocol(format!(
                "logout of connection {cid}: response {r}"
            ))),
        }
    }

    /// MC/S: fills the CmdSN `cmd_sn` that a lost connection had taken with a NOP-Out, so the
    /// target's command order moves past it (RFC 7143 3.2.2.1); returns once answered.
    pub async fn plug(&self, cmd_sn: u32) -> Result<(), Error> {
        self.issue(
            false,
            Some(cmd_sn),
            Bytes::new(),
            0,
            |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::NopOut(NopOut {
                    immediate: false,
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn,
                    data: Bytes::new(),
                })]
            },
        )
        .await
        .map(|_| ())
    }

    /// The session's ExpCmdSN as the target last reported it: CmdSNs from here on may not
    /// have arrived.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.shared.window.lock().exp_cmd_sn
    }

    /// False once the connection has ended (lost, killed or logged out).
    pub fn is_alive(&self) -> bool {
        self.shared.lock().tx.is_some()
    }

    /// Number of commands waiting for an answer.
    pub fn outstanding(&self) -> usize {
        self.shared.lock().pending.len()
    }

    /// A task management function on this session's LUN; the TMF response code.
    pub async fn task_management(&self, function: u8) -> Result<u8, Error> {
        let lun = encode_lun(self.lun);
        let out = self
            .issue(true, None, Bytes::new(), 0, |cmd_sn, itt, exp_stat_sn| {
                vec![Pdu::TaskMgmtRequest(TaskMgmtRequest {
                    immediate: true,
                    function,
                    lun,
                    itt,
                    referenced_task_tag: RESERVED_TAG,
                    cmd_sn,
                    exp_stat_sn,
                    ref_cmd_sn: cmd_sn,
                    exp_data_sn: 0,
                })]
            })
            .await?;
        Ok(out.response)
    }

    /// LOGICAL UNIT RESET: the target aborts every task of the LUN from every initiator and
    /// answers once they have ended (SAM-5 6.3).
    pub async fn lun_reset(&self) -> Result<(), Error> {
        match self.task_management(tmf::LOGICAL_UNIT_RESET).await? {
            tmf_response::COMPLETE => Ok(()),
            other => Err(Error::Protocol(format!(
                "LOGICAL UNIT RESET answered with response {other}"
            ))),
        }
    }

    /// WRITE(16) with the FUA bit as asked: with FUA the target makes the data durable first.
    pub async fn write_fua(&self, lba: u64, data: Bytes, fua: bool) -> Result<(), Error> {
        let blocks = self.whole_blocks(data.len(), "write")?;
        let mut c = cdb::write16(lba, blocks);
        if fua {
            c[1] |= 0x08;
        }
        self.execute_retrying("WRITE(16)", c, 0, Some(data))
            .await
            .map(|_| ())
    }

    /// SYNCHRONIZE CACHE(16) of the whole LUN.
    pub async fn synchronize_cache(&self) -> Result<(), Error> {
        let mut c = [0u8; 16];
        c[0] = 0x91;
        self.execute_retrying("SYNCHRONIZE CACHE(16)", c, 0, None)
            .await
            .map(|_| ())
    }

    /// WRITE SAME(16) of zeros over `blocks` blocks; with `unmap` the target may deallocate.
    pub async fn write_zeroes(&self, lba: u64, blocks: u32, unmap: bool) -> Result<(), Error> {
        let mut c = cdb::write16(lba, blocks);
        c[0] = 0x93;
        if unmap {
            c[1] |= 0x08;
        }
        let zero = Bytes::from(vec![0u8; self.block_size() as usize]);
        self.execute_retrying("WRITE SAME(16)", c, 0, Some(zero))
            .await
            .map(|_| ())
    }

    /// UNMAP of one extent.
    pub async fn unmap(&self, lba: u64, blocks: u32) -> Result<(), Error> {
        let mut param = Vec::with_capacity(24);
        param.extend_from_slice(&22u16.to_be_bytes());
        param.extend_from_slice(&16u16.to_be_bytes());
        param.extend_from_slice(&[0; 4]);
        param.extend_from_slice(&lba.to_be_bytes());
        param.extend_from_slice(&blocks.to_be_bytes());
        param.extend_from_slice(&[0; 4]);
        let mut c = [0u8; 16];
        c[0] = 0x42;
        c[7..9].copy_from_slice(&24u16.to_be_bytes());
        self.execute_retrying("UNMAP", c, 0, Some(Bytes::from(param)))
            .await
            .map(|_| ())
    }

    /// INQUIRY page 0x83: the LUN identifier and the port this path goes through.
    pub async fn device_identity(&self) -> Result<DeviceIdentity, Error> {
        let page = self.inquiry(Some(0x83)).await?;
        parse_device_identification(&page)
            .ok_or_else(|| Error::Protocol("malformed Device Identification VPD page".into()))
    }

    /// REPORT TARGET PORT GROUPS: the ALUA state of every target port group.
    pub async fn report_target_port_groups(&self) -> Result<Vec<PortGroupState>, Error> {
        let mut c = [0u8; 16];
        c[0] = 0xa3;
        c[1] = 0x0a;
        c[6..10].copy_from_slice(&4096u32.to_be_bytes());
        let out = self
            .execute_retrying("REPORT TARGET PORT GROUPS", c, 4096, None)
            .await?;
        parse_target_port_groups(&out.data)
            .ok_or_else(|| Error::Protocol("malformed REPORT TARGET PORT GROUPS data".into()))
    }

    fn whole_blocks(&self, len: usize, what: &str) -> Result<u32, Error> {
        let bs = self.block_size() as usize;
        if len == 0 || !len.is_multiple_of(bs) {
            return Err(Error::InvalidRequest(format!(
                "{what} of {len} bytes is not a whole number of {bs}-byte blocks"
            )));
        }
        u32::try_from(len / bs).map_err(|_| Error::InvalidRequest(format!("{what} too large")))
    }
}

impl Error {
    /// True when the failure is the path's (connection, timeout, protocol), so the command may
    /// be tried on another path; false for the LUN's own answers (SCSI status) and misuse.
    pub fn is_path_error(&self) -> bool {
        !matches!(self, Error::Scsi { .. } | Error::InvalidRequest(_))
    }
}
