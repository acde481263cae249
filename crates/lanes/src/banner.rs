//! The start-up banner of `lanes serve`: what is exported where, and the exact Linux host
//! commands (open-iscsi + dm-multipath) that use every path.

use std::fmt::Write as _;
use std::net::SocketAddr;

/// Everything the banner shows, gathered from the config and the driver's ready report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    pub targets: Vec<BannerTarget>,
    pub status_socket: String,
    pub metrics: Option<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BannerTarget {
    pub name: String,
    /// (TPGT, bound portal) with wildcards already expanded.
    pub portals: Vec<(u16, SocketAddr)>,
    pub luns: Vec<BannerLun>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BannerLun {
    pub lun: u64,
    pub size: u64,
    pub block_size: u32,
    pub wwid: String,
    pub path: String,
}

/// `1 GiB`, `512 MiB`, `1.5 GiB`, `4096 B`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value.fract() == 0.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

impl Banner {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) -> std::fmt::Result {
        writeln!(out, "lanes serve is ready.")?;
        for target in &self.targets {
            writeln!(out)?;
            writeln!(out, "Target {}", target.name)?;
            for (tag, portal) in &target.portals {
                writeln!(out, "  portal  {portal:<40} TPGT {tag}")?;
            }
            for lun in &target.luns {
                writeln!(
                    out,
                    "  LUN {:<3} {:>10}  {}-byte blocks  WWID {}  {}",
                    lun.lun,
                    human_size(lun.size),
                    lun.block_size,
                    lun.wwid,
                    lun.path
                )?;
            }
        }
        writeln!(out)?;
        writeln!(out, "Status: lanes status --socket {}", self.status_socket)?;
        if let Some(metrics) = self.metrics {
            writeln!(out, "Metrics: http://{metrics}/metrics")?;
        }
        self.write_host_commands(out)
    }

    fn write_host_commands(&self, out: &mut String) -> std::fmt::Result {
        writeln!(out)?;
        writeln!(
            out,
            "On a Linux host (apt-get install open-iscsi multipath-tools), log in on every path:"
        )?;
        writeln!(out)?;
        let mut discovered = Vec::new();
        for target in &self.targets {
            if let Some((_, first)) = target.portals.first() {
                if !discovered.contains(first) {
                    discovered.push(*first);
                    writeln!(out, "  iscsiadm -m discovery -t sendtargets -p {first}")?;
                }
            }
        }
        for target in &self.targets {
            for (_, portal) in &target.portals {
                writeln!(
                    out,
                    "  iscsiadm -m node -T {} -p {portal} --login",
                    target.name
                )?;
            }
            writeln!(
                out,
                "  iscsiadm -m node -T {} -o update -n node.startup -v automatic",
                target.name
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "Then add to /etc/multipath.conf and run `systemctl reload multipathd`:"
        )?;
        writeln!(out)?;
        writeln!(out, "defaults {{")?;
        for line in [
            "path_selector \"service-time 0\"",
            "path_grouping_policy group_by_prio",
            "prio alua",
            "failback immediate",
            "no_path_retry 12",
            "fast_io_fail_tmo 5",
        ] {
            writeln!(out, "    {line}")?;
        }
        writeln!(out, "}}")?;
        writeln!(out, "multipaths {{")?;
        let mut index = 0;
        for target in &self.targets {
            for lun in &target.luns {
                writeln!(out, "    multipath {{")?;
                writeln!(out, "        wwid {}", lun.wwid)?;
                writeln!(out, "        alias lanes-disk{index}")?;
                writeln!(out, "    }}")?;
                index += 1;
            }
        }
        writeln!(out, "}}")?;
        writeln!(out)?;
        writeln!(
            out,
            "Check with `multipath -ll`: one device per LUN, one path per portal."
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> Banner {
        Banner {
            targets: vec![BannerTarget {
                name: "iqn.2026-11.io.lanes:nas".into(),
                portals: vec![
                    (1, "192.0.2.10:3260".parse().unwrap()),
                    (1, "[2001:db8::10]:3260".parse().unwrap()),
                ],
                luns: vec![BannerLun {
                    lun: 0,
                    size: 1 << 30,
                    block_size: 512,
                    wwid: "360a6c610123456789abcdef012345678".into(),
                    path: "lanes-data/disk0.img".into(),
                }],
            }],
            status_socket: "lanes-data/lanes.sock".into(),
            metrics: None,
        }
    }

    #[test]
    fn banner_lists_target_portals_and_luns() {
        let text = example().render();
        assert!(text.contains("Target iqn.2026-11.io.lanes:nas"));
        assert!(text.contains("192.0.2.10:3260"));
        assert!(text.contains("TPGT 1"));
        assert!(text.contains("1 GiB"));
        assert!(text.contains("512-byte blocks"));
        assert!(text.contains("WWID 360a6c610123456789abcdef012345678"));
        assert!(!text.contains("Metrics"));
    }

    #[test]
    fn banner_prints_one_login_per_portal() {
        let text = example().render();
        assert!(text.contains("iscsiadm -m discovery -t sendtargets -p 192.0.2.10:3260\n"));
        assert!(text
            .contains("iscsiadm -m node -T iqn.2026-11.io.lanes:nas -p 192.0.2.10:3260 --login\n"));
        assert!(text.contains(
            "iscsiadm -m node -T iqn.2026-11.io.lanes:nas -p [2001:db8::10]:3260 --login\n"
        ));
        assert!(text.contains(
            "iscsiadm -m node -T iqn.2026-11.io.lanes:nas -o update -n node.startup -v automatic"
        ));
        assert_eq!(text.matches("--login").count(), 2);
    }

    #[test]
    fn banner_prints_multipath_stanza() {
        let text = example().render();
        for line in [
            "path_selector \"service-time 0\"",
            "path_grouping_policy group_by_prio",
            "prio alua",
            "failback immediate",
            "no_path_retry 12",
            "fast_io_fail_tmo 5",
            "wwid 360a6c610123456789abcdef012345678",
            "alias lanes-disk0",
        ] {
            assert!(text.contains(line), "missing {line:?}");
        }
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_size(1 << 30), "1 GiB");
        assert_eq!(human_size(3 << 29), "1.5 GiB");
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(1000), "1000 B");
    }
}
