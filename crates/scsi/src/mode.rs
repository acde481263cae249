//! MODE SENSE / MODE SELECT (SPC-4 6.11-6.14) with the caching, control and informational
//! exceptions pages. Only WCE is changeable; saved parameters are not supported.

use crate::lun::LogicalUnit;
use crate::sense::Sense;
use crate::{gather, put_truncated, ScsiRequest};
use bytes::BytesMut;
use std::sync::atomic::Ordering;

const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0A;
const PAGE_IE: u8 = 0x1C;
const ALL_PAGES: u8 = 0x3F;

/// Page control field values.
const PC_CURRENT: u8 = 0;
const PC_CHANGEABLE: u8 = 1;
const PC_DEFAULT: u8 = 2;
const PC_SAVED: u8 = 3;

impl LogicalUnit {
    /// One mode page as seen through page control `pc`.
    fn mode_page(&self, page: u8, pc: u8) -> Option<Vec<u8>> {
        let wce = match pc {
            PC_CHANGEABLE => true,
            PC_DEFAULT => self.cfg.write_cache,
            _ => self.wce.load(Ordering::Relaxed),
        };
        Some(match page {
            PAGE_CACHING => {
                let mut p = [0u8; 20];
                p[0] = PAGE_CACHING;
                p[1] = 18;
                p[2] = if wce { 0x04 } else { 0 };
                p.to_vec()
            }
            PAGE_CONTROL => {
                let mut p = [0u8; 12];
                p[0] = PAGE_CONTROL;
                p[1] = 10;
                if pc != PC_CHANGEABLE {
                    p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
                    p[5] = 0x40; // TAS: aborted commands get TASK ABORTED
                    p[8] = 0xFF; // busy timeout: unlimited
                    p[9] = 0xFF;
                }
                p.to_vec()
            }
            PAGE_IE => {
                let mut p = [0u8; 12];
                p[0] = PAGE_IE;
                p[1] = 10;
                p.to_vec()
            }
            _ => return None,
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mode_sense(
        &self,
        ten: bool,
        dbd: bool,
        llbaa: bool,
        pc: u8,
        page: u8,
        subpage: u8,
        alloc: u32,
        out: &mut BytesMut,
    ) -> Result<(), Sense> {
        if pc == PC_SAVED {
            return Err(Sense::saving_not_supported());
        }
        let pages: Vec<u8> = match (page, subpage) {
            (ALL_PAGES, 0 | 0xFF) => [PAGE_CACHING, PAGE_CONTROL, PAGE_IE]
                .iter()
                .filter_map(|&p| self.mode_page(p, pc))
                .flatten()
                .collect(),
            (p, 0) => self
                .mode_page(p, pc)
                .ok_or(Sense::invalid_cdb(2, Some(5)))?,
            _ => return Err(Sense::invalid_cdb(3, None)),
        };
        let bs = self.cfg.block_size;
        let mut desc = Vec::new();
        if !dbd {
            if ten && llbaa {
                desc.extend_from_slice(&self.block_count().to_be_bytes());
                desc.extend_from_slice(&[0; 4]);
                desc.extend_from_slice(&bs.to_be_bytes());
            } else {
                desc.extend_from_slice(
                    &u32::try_from(self.block_count())
                        .unwrap_or(u32::MAX)
                        .to_be_bytes(),
                );
                desc.push(0);
                desc.extend_from_slice(&bs.to_be_bytes()[1..]);
            }
        }
        let dsp = 0x10 | if self.cfg.read_only { 0x80 } else { 0 }; // DPOFUA, WP
        let mut b = Vec::with_capacity(8 + desc.len() + pages.len());
        if ten {
            let len = (6 + desc.len() + pages.len()) as u16;
            b.extend_from_slice(&len.to_be_bytes());
            b.extend_from_slice(&[0, dsp, if llbaa && !dbd { 1 } else { 0 }, 0]);
            b.extend_from_slice(&(desc.len() as u16).to_be_bytes());
        } else {
            let len = u8::try_from(3 + desc.len() + pages.len()).unwrap_or(u8::MAX);
            b.extend_from_slice(&[len, 0, dsp, desc.len() as u8]);
        }
        b.extend_from_slice(&desc);
        b.extend_from_slice(&pages);
        put_truncated(out, &b, alloc);
        Ok(())
    }

    pub(crate) fn mode_select(
        &self,
        req: &ScsiRequest<'_>,
        ten: bool,
        pf: bool,
        sp: bool,
        param_len: u32,
    ) -> Result<(), Sense> {
        if sp {
            return Err(Sense::invalid_cdb(1, Some(0)));
        }
        if !pf && param_len > 0 {
            return Err(Sense::invalid_cdb(1, Some(4)));
        }
        let hdr = if ten { 8 } else { 4 };
        if param_len == 0 {
            return Ok(());
        }
        let data = gather(req.data_out, param_len as usize);
        if data.len() < param_len as usize || data.len() < hdr {
            return Err(Sense::param_list_length());
        }
        let bd_len = if ten {
            usize::from(u16::from_be_bytes([
                data.get(6).copied().unwrap_or(0),
                data.get(7).copied().unwrap_or(0),
            ]))
        } else {
            usize::from(data.get(3).copied().unwrap_or(0))
        };
        let mut at = hdr + bd_len;
        if at > data.len() {
            return Err(Sense::param_list_length());
        }
        // A block descriptor may restate the current block length; anything else is refused.
        if bd_len >= 8 {
            let bl = data.get(hdr + bd_len - 3..hdr + bd_len).unwrap_or_default();
            let len = bl.iter().fold(0u32, |a, &x| (a << 8) | u32::from(x));
            if len != 0 && len != self.cfg.block_size {
                return Err(Sense::invalid_param(hdr + bd_len - 3, None));
            }
        }
        let mut new_wce = None;
        while at < data.len() {
            let code = data.get(at).copied().unwrap_or(0);
            if code & 0x40 != 0 {
                return Err(Sense::invalid_param(at, Some(6)));
            }
            let plen = usize::from(data.get(at + 1).copied().unwrap_or(0));
            let page = code & 0x3F;
            let Some(cur) = self.mode_page(page, PC_CURRENT) else {
                return Err(Sense::invalid_param(at, Some(5)));
            };
            let changeable = self.mode_page(page, PC_CHANGEABLE).unwrap_or_default();
            if plen + 2 != cur.len() {
                return Err(Sense::invalid_param(at + 1, None));
            }
            let Some(given) = data.get(at..at + cur.len()) else {
                return Err(Sense::param_list_length());
            };
            for i in 2..cur.len() {
                let (g, c, m) = (given.get(i), cur.get(i), changeable.get(i));
                if let (Some(g), Some(c), Some(m)) = (g, c, m) {
                    if (g ^ c) & !m != 0 {
                        return Err(Sense::invalid_param(at + i, None));
                    }
                }
            }
            if page == PAGE_CACHING {
                new_wce = given.get(2).map(|b| b & 0x04 != 0);
            }
            at += cur.len();
        }
        if let Some(w) = new_wce {
            if self.wce.swap(w, Ordering::AcqRel) != w {
                // SPC-4 5.14: other nexuses learn that mode parameters changed.
                self.ua.raise_all(0x2A, 0x01, Some(req.nexus.id));
            }
        }
        Ok(())
    }
}
