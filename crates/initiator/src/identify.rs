//! Reading what identifies a LUN and a path: the Device Identification VPD page (SPC-4
//! 7.8.6, page 0x83) and REPORT TARGET PORT GROUPS data (SPC-4 6.37). Paths are grouped into one
//! multipath device only when their LUN identifiers are identical.

/// What page 0x83 says about the LUN and the port it was read through.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIdentity {
    /// The LUN's identifier, as text: `naa.<hex>`, `eui.<hex>`, `t10.<ascii>` or `name.<string>`,
    /// the strongest designator the page has (NAA, then EUI-64, then SCSI name, then T10).
    pub lun: Option<String>,
    /// Target port group of the path (designator type 5).
    pub target_port_group: Option<u16>,
    /// Relative target port of the path (designator type 4).
    pub relative_port: Option<u16>,
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Parses page 0x83 data (with its 4-byte header). None when the page is malformed.
pub fn parse_device_identification(page: &[u8]) -> Option<DeviceIdentity> {
    if page.get(1).copied()? != 0x83 {
        return None;
    }
    let len = usize::from(u16::from_be_bytes([*page.get(2)?, *page.get(3)?]));
    let body = page.get(4..4 + len.min(page.len().saturating_sub(4)))?;
    let mut out = DeviceIdentity::default();
    let mut best_rank = 0u8;
    let mut at = 0usize;
    while let Some(&[b0, b1, _, b3]) = body.get(at..at + 4) {
        let (code_set, association, kind, n) =
            (b0 & 0x0f, (b1 >> 4) & 0x03, b1 & 0x0f, usize::from(b3));
        let value = body.get(at + 4..at + 4 + n)?;
        at += 4 + n;
        match (association, kind) {
            // Designators of the logical unit itself.
            (0, 3) if best_rank < 4 => {
                out.lun = Some(format!("naa.{}", hex(value)));
                best_rank = 4;
            }
            (0, 2) if best_rank < 3 => {
                out.lun = Some(format!("eui.{}", hex(value)));
                best_rank = 3;
            }
            (0, 8) if best_rank < 2 && code_set == 3 => {
                let text = String::from_utf8_lossy(value);
                out.lun = Some(format!("name.{}", text.trim_end_matches('\0')));
                best_rank = 2;
            }
            // T10 vendor ID: 8 bytes of vendor, then the vendor's own identifier. A vendor with
            // nothing after it (LIO without a unit serial pads with NULs) names no LU at all:
            // every LU of that vendor would share it, and mixing LUs corrupts data.
            (0, 1) if best_rank < 1 => {
                let printable = |bytes: &[u8]| -> String {
                    String::from_utf8_lossy(bytes)
                        .trim_matches(|c: char| c == '\0' || c.is_whitespace())
                        .replace('\0', " ")
                };
                let vendor = printable(value.get(..8).unwrap_or(value));
                let id = printable(value.get(8..).unwrap_or_default());
                if !id.is_empty() {
                    out.lun = Some(format!("t10.{vendor} {id}"));
                    best_rank = 1;
                }
            }
            // Designators of the target port the page was read through.
            (1, 4) => {
                if let Some(&[_, _, hi, lo]) = value.get(..4) {
                    out.relative_port = Some(u16::from_be_bytes([hi, lo]));
                }
            }
            (1, 5) => {
                if let Some(&[_, _, hi, lo]) = value.get(..4) {
                    out.target_port_group = Some(u16::from_be_bytes([hi, lo]));
                }
            }
            _ => {}
        }
    }
    Some(out)
}

/// One target port group and its ALUA state (SPC-4 6.37: 0 active/optimized, 1
/// active/non-optimized, 2 standby, 3 unavailable, 0xe offline, 0xf transitioning).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortGroupState {
    pub group: u16,
    pub state: u8,
}

impl PortGroupState {
    /// The selector tier of this state: 0 optimized, 1 non-optimized, 2 not usable for I/O.
    pub fn tier(&self) -> u8 {
        match self.state {
            0 => 0,
            1 => 1,
            _ => 2,
        }
    }
}

/// Parses REPORT TARGET PORT GROUPS data (length format). None when malformed.
pub fn parse_target_port_groups(data: &[u8]) -> Option<Vec<PortGroupState>> {
    let len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    let body = data.get(4..4 + len.min(data.len().saturating_sub(4)))?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(&[b0, _, g_hi, g_lo, _, _, _, count]) = body.get(at..at + 8) {
        let state = b0 & 0x0f;
        let group = u16::from_be_bytes([g_hi, g_lo]);
        let ports = usize::from(count);
        out.push(PortGroupState { group, state });
        at += 8 + 4 * ports;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn designator(code_set: u8, association: u8, kind: u8, value: &[u8]) -> Vec<u8> {
        let mut d = vec![code_set, (association << 4) | kind, 0, value.len() as u8];
        d.extend_from_slice(value);
        d
    }

    fn page(designators: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = designators.concat();
        let mut p = vec![0, 0x83];
        p.extend_from_slice(&(body.len() as u16).to_be_bytes());
        p.extend_from_slice(&body);
        p
    }

    #[test]
    fn naa_wins_and_port_designators_are_read() {
        let p = page(&[
            designator(2, 0, 1, b"LANES   disk0"),
            designator(1, 0, 3, &[0x60, 0x01, 0x40, 0x5a, 1, 2, 3, 4]),
            designator(1, 1, 4, &[0, 0, 0, 2]),
            designator(1, 1, 5, &[0, 0, 0, 7]),
        ]);
        let id = parse_device_identification(&p).unwrap();
        assert_eq!(id.lun.as_deref(), Some("naa.6001405a01020304"));
        assert_eq!(id.relative_port, Some(2));
        assert_eq!(id.target_port_group, Some(7));
    }

    #[test]
    fn t10_only_and_truncated_pages() {
        let p = page(&[designator(2, 0, 1, b"VENDOR  serial ")]);
        let id = parse_device_identification(&p).unwrap();
        assert_eq!(id.lun.as_deref(), Some("t10.VENDOR serial"));
        // LIO without a unit serial: the vendor and NUL padding, no identifier of the LU.
        let lio = page(&[designator(2, 0, 1, b"LIO-ORG \0\0\0\0\0\0")]);
        assert_eq!(parse_device_identification(&lio).unwrap().lun, None);
        let mut bad = page(&[designator(1, 0, 3, &[1, 2, 3, 4, 5, 6, 7, 8])]);
        bad[7] = 40; // designator longer than the page
        assert_eq!(parse_device_identification(&bad), None);
        assert_eq!(parse_device_identification(&[0, 0x80, 0, 0]), None);
        assert_eq!(parse_device_identification(&[]), None);
    }

    #[test]
    fn port_groups_parse() {
        let mut d = vec![0, 0, 0, 24];
        d.extend_from_slice(&[0x80, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1]);
        d.extend_from_slice(&[0x02, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2]);
        let g = parse_target_port_groups(&d).unwrap();
        assert_eq!(
            g,
            vec![
                PortGroupState { group: 1, state: 0 },
                PortGroupState { group: 2, state: 2 }
            ]
        );
        assert_eq!(g[1].tier(), 2);
        assert_eq!(parse_target_port_groups(&[0, 0]), None);
    }
}
