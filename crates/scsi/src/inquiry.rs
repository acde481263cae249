//! INQUIRY: standard data and the VPD pages (SPC-4 6.6, 7.8; SBC-3 6.6).

use crate::lun::{
    LogicalUnit, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS, MAX_WRITE_SAME_BLOCKS,
};
use crate::sense::Sense;
use crate::{put_truncated, Nexus};
use bytes::BytesMut;

fn padded(s: &str, n: usize) -> Vec<u8> {
    let mut v: Vec<u8> = s
        .bytes()
        .map(|b| if (0x20..0x7F).contains(&b) { b } else { b' ' })
        .take(n)
        .collect();
    v.resize(n, b' ');
    v
}

/// Standard INQUIRY data for a device that is not there (peripheral qualifier 011b).
pub(crate) fn missing_lun_inquiry(evpd: bool, alloc: u32, out: &mut BytesMut) {
    let mut b = [0u8; 36];
    b[0] = 0x7F;
    if !evpd {
        b[2] = 0x06;
        b[3] = 0x02;
        b[4] = 31;
    }
    put_truncated(out, if evpd { &b[..4] } else { &b }, alloc);
}

const VPD_PAGES: [u8; 8] = [0x00, 0x80, 0x83, 0x86, 0x8F, 0xB0, 0xB1, 0xB2];

impl LogicalUnit {
    pub(crate) fn inquiry(
        &self,
        n: &Nexus,
        evpd: bool,
        page: u8,
        alloc: u32,
        out: &mut BytesMut,
    ) -> Result<(), Sense> {
        if !evpd {
            put_truncated(out, &self.standard_inquiry(), alloc);
            return Ok(());
        }
        let mut body = Vec::with_capacity(64);
        match page {
            0x00 => body.extend_from_slice(&VPD_PAGES),
            0x80 => body.extend_from_slice(&padded(
                &self.cfg.serial,
                self.cfg.serial.len().clamp(1, 252),
            )),
            0x83 => self.device_identification(n, &mut body),
            0x86 => {
                // Extended INQUIRY: HEADSUP/ORDSUP/SIMPSUP, V_SUP off, LUICLR.
                body.resize(60, 0);
                if let Some(b) = body.get_mut(1) {
                    *b = 0x07;
                }
                if let Some(b) = body.get_mut(3) {
                    *b = 0x01;
                }
            }
            0x8F => {
                // Third-party copy: supported commands descriptor (SPC-4 7.8.17.3).
                let cmds: [u8; 7] = [0x83, 1, 0x00, 0x84, 2, 0x00, 0x03];
                let mut d = vec![0x00, 0x01, 0, 0, cmds.len() as u8];
                d.extend_from_slice(&cmds);
                while d.len() & 3 != 0 {
                    d.push(0);
                }
                let dlen = (d.len() - 4) as u16;
                crate::put(&mut d, 2, &dlen.to_be_bytes());
                body.extend_from_slice(&d);
            }
            0xB0 => self.block_limits(&mut body),
            0xB1 => {
                body.resize(60, 0);
                if let Some(b) = body.get_mut(1) {
                    *b = 1; // non-rotating medium
                }
            }
            0xB2 => {
                body.resize(4, 0);
                if self.cfg.thin {
                    let lbprz = if self.reports_lbprz() { 0x04 } else { 0 };
                    // LBPU, LBPWS, LBPWS10, LBPRZ; provisioning type thin.
                    crate::put(&mut body, 1, &[0x80 | 0x40 | 0x20 | lbprz, 0x02]);
                }
            }
            _ => return Err(Sense::invalid_cdb(2, None)),
        }
        let mut b = Vec::with_capacity(body.len() + 4);
        b.push(0x00);
        b.push(page);
        b.extend_from_slice(&(body.len() as u16).to_be_bytes());
        b.extend_from_slice(&body);
        put_truncated(out, &b, alloc);
        Ok(())
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut b = [0u8; 66];
        b[2] = 0x06; // SPC-4
        b[3] = 0x02 | 0x10; // response data format 2, HISUP
        b[4] = (b.len() - 5) as u8;
        b[5] = 0x30 | 0x08; // TPGS = 11b (implicit and explicit ALUA), 3PC
        b[7] = 0x02; // CMDQUE
        b[8..16].copy_from_slice(&padded(&self.cfg.vendor, 8));
        b[16..32].copy_from_slice(&padded(&self.cfg.product, 16));
        b[32..36].copy_from_slice(&padded(&self.cfg.revision, 4));
        // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
        for (i, v) in [0x00A0u16, 0x0960, 0x0460, 0x04C0].iter().enumerate() {
            crate::put(&mut b, 58 + 2 * i, &v.to_be_bytes());
        }
        b.to_vec()
    }

    fn device_identification(&self, n: &Nexus, b: &mut Vec<u8>) {
        // NAA: binary, association LU, type 3.
        b.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
        b.extend_from_slice(&self.cfg.naa_id);
        // T10 vendor id: ASCII, type 1: vendor (8) + serial.
        let mut t10 = padded(&self.cfg.vendor, 8);
        t10.extend_from_slice(&padded(
            &self.cfg.serial,
            self.cfg.serial.len().clamp(1, 200),
        ));
        b.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
        b.extend_from_slice(&t10);
        // Relative target port: PIV, association port, type 4; protocol iSCSI.
        b.extend_from_slice(&[0x51, 0x94, 0x00, 4, 0, 0]);
        b.extend_from_slice(&n.relative_target_port.to_be_bytes());
        // Target port group: type 5.
        b.extend_from_slice(&[0x51, 0x95, 0x00, 4, 0, 0]);
        b.extend_from_slice(&n.target_port_group.to_be_bytes());
    }

    fn block_limits(&self, b: &mut Vec<u8>) {
        b.resize(60, 0);
        let bs = u64::from(self.cfg.block_size);
        let max_xfer = (MAX_TRANSFER_BYTES / bs) as u32;
        let mut put32 = |at: usize, v: u32| {
            if let Some(d) = b.get_mut(at..at + 4) {
                d.copy_from_slice(&v.to_be_bytes());
            }
        };
        // Offsets are relative to the page body (page byte N is body byte N-4).
        put32(4, max_xfer); // maximum transfer length
        put32(8, (1 << 20) / self.cfg.block_size); // optimal transfer length
        if self.cfg.thin {
            put32(16, MAX_UNMAP_BLOCKS);
            put32(20, MAX_UNMAP_DESCRIPTORS);
            put32(24, 1); // optimal unmap granularity
        }
        if let Some(x) = b.get_mut(0) {
            *x = 0x01; // WSNZ: WRITE SAME with zero blocks is rejected
        }
        if let Some(x) = b.get_mut(1) {
            *x = self.max_caw_blocks() as u8;
        }
        if let Some(d) = b.get_mut(2..4) {
            d.copy_from_slice(&1u16.to_be_bytes()); // optimal transfer length granularity
        }
        if let Some(d) = b.get_mut(32..40) {
            d.copy_from_slice(&MAX_WRITE_SAME_BLOCKS.to_be_bytes());
        }
    }
}
