//! The start-up banner of `lanes serve`: what is exported where, and the exact Linux host
//! commands (open-iscsi + dm-multipath) that use every path.

use std::fmt::Write as _;
use std::net::SocketAddr;

use crate::doctor::checks::Grouping;
use crate::doctor::config::{alias_for, make_aliases_unique, ConfigLun, HostConfig, TargetConfig};

/// Everything the banner shows, gathered from the config and the driver's ready report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Banner {
    pub targets: Vec<BannerTarget>,
    pub status_socket: String,
    pub metrics: Option<SocketAddr>,
    /// Wildcard-expanded addresses on an interface holding a default route.
    pub management: Vec<SocketAddr>,
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

/// `text` indented by two spaces (blank lines stay empty).
fn indented(out: &mut String, text: &str) -> std::fmt::Result {
    for line in text.lines() {
        if line.is_empty() {
            writeln!(out)?;
        } else {
            writeln!(out, "  {line}")?;
        }
    }
    Ok(())
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
            let left_out = self.left_out(target);
            for (tag, portal) in &target.portals {
                if left_out.contains(portal) {
                    writeln!(
                        out,
                        "  portal  {portal:<40} TPGT {tag}  (default route: management, not in \
                         the host commands below)"
                    )?;
                } else {
                    writeln!(out, "  portal  {portal:<40} TPGT {tag}")?;
                }
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
        let host = self.host_config();
        let generated = crate::doctor::config::generate(&host);
        writeln!(out)?;
        writeln!(
            out,
            "On a Linux host, as root, log in on every path (the same lines as `lanes doctor`):"
        )?;
        writeln!(out)?;
        indented(out, &generated.linux_commands)?;
        writeln!(out)?;
        writeln!(
            out,
            "/etc/multipath.conf (a device section for lanes, so the host's defaults for other \
             arrays stay as they are):"
        )?;
        writeln!(out)?;
        indented(out, &generated.multipath_conf)?;
        writeln!(out)?;
        writeln!(out, "/etc/fstab:")?;
        writeln!(out)?;
        indented(out, &generated.fstab)?;
        writeln!(out)?;
        writeln!(
            out,
            "Check with `multipath -ll`: one device per LUN, one path per portal."
        )
    }

    /// The management addresses of `target` that the host commands leave out: those of a
    /// wildcard portal on the interface holding the default route, when at least two other
    /// addresses a remote host can reach remain (a machine with storage links of its own; on
    /// a one- or two-NIC machine every address stays a path).
    fn left_out(&self, target: &BannerTarget) -> Vec<SocketAddr> {
        let remote = |p: &SocketAddr| !p.ip().is_loopback();
        let others = target
            .portals
            .iter()
            .filter(|(_, p)| remote(p) && !self.management.contains(p))
            .count();
        if others < 2 {
            return Vec::new();
        }
        target
            .portals
            .iter()
            .map(|(_, p)| *p)
            .filter(|p| self.management.contains(p))
            .collect()
    }

    /// What a host should use, for the doctor's generators: every portal a remote host can
    /// reach (loopback only when there is nothing else) but a management address (see
    /// `left_out`), every LUN with lanes' INQUIRY strings.
    pub fn host_config(&self) -> HostConfig {
        let mut targets: Vec<TargetConfig> = self
            .targets
            .iter()
            .map(|t| {
                let left_out = self.left_out(t);
                let remote: Vec<SocketAddr> = t
                    .portals
                    .iter()
                    .map(|(_, p)| *p)
                    .filter(|p| !p.ip().is_loopback() && !left_out.contains(p))
                    .collect();
                let portals = if remote.is_empty() {
                    t.portals.iter().map(|(_, p)| *p).collect()
                } else {
                    remote
                };
                let luns = t
                    .luns
                    .iter()
                    .map(|l| ConfigLun {
                        lun: l.lun,
                        id: format!("naa.{}", l.wwid.strip_prefix('3').unwrap_or(&l.wwid)),
                        wwid: l.wwid.clone(),
                        alias: alias_for(&t.name, l.lun),
                        vendor: lanes_iscsi_target::INQUIRY_VENDOR.to_string(),
                        product: lanes_iscsi_target::INQUIRY_PRODUCT.to_string(),
                    })
                    .collect();
                TargetConfig {
                    name: t.name.clone(),
                    portals,
                    excluded: Vec::new(),
                    luns,
                    // lanes reports ALUA: the host groups paths by priority, so a port group
                    // that goes standby later is followed (one group while all are equal).
                    grouping: Grouping::GroupByPrio,
                    alua: true,
                }
            })
            .collect();
        make_aliases_unique(&mut targets);
        HostConfig {
            targets,
            chap_user: None,
            chap_secret_file: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(portals: &[&str]) -> Banner {
        Banner {
            targets: vec![BannerTarget {
                name: "iqn.2026-11.io.lanes:nas".into(),
                portals: portals.iter().map(|p| (1, p.parse().unwrap())).collect(),
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
            management: Vec::new(),
        }
    }

    fn nas() -> Banner {
        example(&["192.0.2.10:3260", "[2001:db8::10]:3260"])
    }

    #[test]
    fn banner_lists_target_portals_and_luns() {
        let text = nas().render();
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
        let text = nas().render();
        assert!(text.contains("iscsiadm -m discovery -t sendtargets -p 192.0.2.10:3260\n"));
        assert!(text
            .contains("iscsiadm -m node -T iqn.2026-11.io.lanes:nas -p 192.0.2.10:3260 --login\n"));
        assert!(text.contains(
            "iscsiadm -m node -T iqn.2026-11.io.lanes:nas -p [2001:db8::10]:3260 --login\n"
        ));
        assert!(text.contains(
            "iscsiadm -m node -T iqn.2026-11.io.lanes:nas -p 192.0.2.10:3260 -o update -n node.startup -v automatic"
        ));
        assert_eq!(text.matches("--login").count(), 2);
    }

    #[test]
    fn loopback_is_a_path_only_when_there_is_nothing_else() {
        // A wildcard portal expands to every local address, loopback last: a remote host must
        // not be told to log in to 127.0.0.1.
        let text = example(&["192.0.2.10:3260", "127.0.0.1:3260"]).render();
        assert_eq!(text.matches("--login").count(), 1, "{text}");
        assert!(!text.contains("-p 127.0.0.1:3260"), "{text}");
        // The listing still shows what is bound.
        assert!(text.contains("portal  127.0.0.1:3260"));

        let text = example(&["127.0.0.1:3260", "[::1]:3260"]).render();
        assert!(text.contains("-p 127.0.0.1:3260 --login"), "{text}");
        assert!(text.contains("-p [::1]:3260 --login"), "{text}");
    }

    #[test]
    fn a_management_address_is_left_out_only_beside_two_storage_links() {
        let mut banner = example(&[
            "10.0.1.1:3260",
            "10.0.2.1:3260",
            "192.0.2.5:3260",
            "127.0.0.1:3260",
        ]);
        banner.management = vec!["192.0.2.5:3260".parse().unwrap()];
        let text = banner.render();
        assert_eq!(text.matches("--login").count(), 2, "{text}");
        assert!(!text.contains("-p 192.0.2.5:3260"), "{text}");
        assert!(text.contains("192.0.2.5:3260") && text.contains("default route: management"));
        // One storage link beside it: the management address is a path too.
        let mut banner = example(&["10.0.1.1:3260", "192.0.2.5:3260"]);
        banner.management = vec!["192.0.2.5:3260".parse().unwrap()];
        let text = banner.render();
        assert_eq!(text.matches("--login").count(), 2, "{text}");
        assert!(!text.contains("default route"), "{text}");
    }

    #[test]
    fn multipath_conf_is_the_doctor_s_device_and_multipaths_sections() {
        let banner = nas();
        let text = banner.render();
        let generated = crate::doctor::config::generate(&banner.host_config());
        for line in generated.multipath_conf.lines().filter(|l| !l.is_empty()) {
            assert!(text.contains(&format!("  {line}\n")), "missing {line:?}");
        }
        // Matched to lanes' INQUIRY strings, never the host-wide defaults section.
        assert!(text.contains("vendor \"LANES\""));
        assert!(text.contains("product \"lanes volume\""));
        assert!(text.contains("hardware_handler \"1 alua\""));
        assert!(!text.contains("defaults {"), "{text}");
        assert!(text.contains("wwid 360a6c610123456789abcdef012345678"));
        assert!(text.contains("alias nas-lun0"));
        assert!(text.contains("path_grouping_policy group_by_prio"));
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
