//! Linux: open-iscsi with one login per portal that comes back at boot, dm-multipath with a
//! `multipaths` entry per WWID, and an fstab line that waits for the network.

use std::fmt::Write as _;

use super::{portal_text, HostConfig};
use crate::doctor::checks::Grouping;

/// How long open-iscsi holds I/O on a broken session before failing it up to dm-multipath,
/// which then sends it down another path (the iSCSI default of 120 s would stall the device).
/// multipathd sets the same value (its `fast_io_fail_tmo`) as the session's recovery timeout.
const REPLACEMENT_TIMEOUT_S: u32 = 1;
/// A connection that received nothing for this long is pinged (NOP-Out)...
const NOOP_OUT_INTERVAL_S: u32 = 1;
/// ...and failed when the ping is not answered within this. A silent link (a pulled cable, a
/// dead switch) is then noticed within interval + timeout and its I/O moves to another path
/// after the replacement timeout: at most 1 + 2 + 1 = 4 s of stalled I/O, where open-iscsi's
/// defaults (5 + 5 s, then the replacement timeout) stall it for 15 s. The price: a path whose
/// target does not answer a ping for 2 s (a hung target, a saturated link with deep queues) is
/// failed and retried, which dm-multipath does without an I/O error while another path is up.
const NOOP_OUT_TIMEOUT_S: u32 = 2;
/// With every path down, dm-multipath queues I/O for this many checker intervals (5 s each,
/// one minute) before failing it: long enough for a target reboot, short enough not to hang.
const NO_PATH_RETRY: u32 = 12;
/// Seconds before I/O on a failed transport is failed rather than held.
const FAST_IO_FAIL_TMO_S: u32 = REPLACEMENT_TIMEOUT_S;

/// Package installation, discovery and one login per portal.
pub fn commands(c: &HostConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Linux: open-iscsi + dm-multipath (as root)");
    let _ = writeln!(
        out,
        "apt-get install -y open-iscsi multipath-tools    # Debian, Ubuntu"
    );
    let _ = writeln!(
        out,
        "# dnf install -y iscsi-initiator-utils device-mapper-multipath    # RHEL, Fedora"
    );
    let _ = writeln!(out, "systemctl enable --now iscsid multipathd");
    for t in &c.targets {
        let name = &t.name;
        let _ = writeln!(out);
        let _ = writeln!(out, "# {name}: one login per portal, at every boot");
        let _ = writeln!(
            out,
            "# a silent path is pinged after {NOOP_OUT_INTERVAL_S} s, failed after {NOOP_OUT_TIMEOUT_S} s more \
             and its I/O moved after {REPLACEMENT_TIMEOUT_S} s: at most {} s of stalled I/O \
             (open-iscsi's defaults: 15 s); a target that cannot answer a ping within {NOOP_OUT_TIMEOUT_S} s \
             loses the path for a retry",
            NOOP_OUT_INTERVAL_S + NOOP_OUT_TIMEOUT_S + REPLACEMENT_TIMEOUT_S
        );
        for p in &t.portals {
            let _ = writeln!(
                out,
                "iscsiadm -m discovery -t sendtargets -p {}",
                portal_text(p)
            );
        }
        for p in &t.excluded {
            let _ = writeln!(
                out,
                "iscsiadm -m node -T {name} -p {} -o delete    # failed the checks: not a path",
                portal_text(p)
            );
        }
        for p in &t.portals {
            let node = format!("iscsiadm -m node -T {name} -p {}", portal_text(p));
            let _ = writeln!(out, "{node} -o update -n node.startup -v automatic");
            let _ = writeln!(
                out,
                "{node} -o update -n node.session.timeo.replacement_timeout -v {REPLACEMENT_TIMEOUT_S}"
            );
            let _ = writeln!(
                out,
                "{node} -o update -n node.conn[0].timeo.noop_out_interval -v {NOOP_OUT_INTERVAL_S}"
            );
            let _ = writeln!(
                out,
                "{node} -o update -n node.conn[0].timeo.noop_out_timeout -v {NOOP_OUT_TIMEOUT_S}"
            );
            if let Some(user) = &c.chap_user {
                let file = sh_quote(c.chap_secret_file.as_deref().unwrap_or("/path/to/secret"));
                let user = sh_quote(user);
                let _ = writeln!(
                    out,
                    "{node} -o update -n node.session.auth.authmethod -v CHAP"
                );
                let _ = writeln!(
                    out,
                    "{node} -o update -n node.session.auth.username -v {user}"
                );
                let _ = writeln!(
                    out,
                    "{node} -o update -n node.session.auth.password -v \"$(cat {file})\""
                );
            }
            let _ = writeln!(out, "{node} --login");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "# dm-multipath: install the multipath.conf below as /etc/multipath.conf (merge it into \
         an existing one), then"
    );
    for lun in c.targets.iter().flat_map(|t| &t.luns) {
        let _ = writeln!(out, "multipath -a {}", lun.wwid);
    }
    let _ = writeln!(out, "systemctl reload multipathd");
    for lun in c.targets.iter().flat_map(|t| &t.luns) {
        let _ = writeln!(out, "multipath -ll {}", lun.alias);
    }
    let _ = writeln!(
        out,
        "# a file system, once (mkfs erases the LUN), then the fstab line below and mount:"
    );
    for lun in c.targets.iter().flat_map(|t| &t.luns) {
        let _ = writeln!(
            out,
            "# mkfs.xfs /dev/mapper/{a} && mkdir -p /mnt/{a} && mount /mnt/{a}",
            a = lun.alias
        );
    }
    out
}

/// Quotes a word for sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Regex-escapes an INQUIRY string for a `device` section.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for ch in s.chars() {
        if "\\.^$|?*+()[]{}\"".contains(ch) {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// /etc/multipath.conf: a `devices` entry per vendor/product (transport timeouts, ALUA
/// handler) and a `multipaths` entry per WWID with its alias and policies.
pub fn multipath_conf(c: &HostConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# /etc/multipath.conf for lanes");
    let _ = writeln!(out, "devices {{");
    let mut seen: Vec<(String, String)> = Vec::new();
    for t in &c.targets {
        for lun in &t.luns {
            let key = (lun.vendor.clone(), lun.product.clone());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let _ = writeln!(out, "\tdevice {{");
            let _ = writeln!(out, "\t\tvendor \"{}\"", regex_escape(&lun.vendor));
            let _ = writeln!(out, "\t\tproduct \"{}\"", regex_escape(&lun.product));
            let _ = writeln!(out, "\t\tpath_checker tur");
            let _ = writeln!(out, "\t\tfast_io_fail_tmo {FAST_IO_FAIL_TMO_S}");
            if t.alua {
                let _ = writeln!(out, "\t\thardware_handler \"1 alua\"");
                let _ = writeln!(out, "\t\tprio alua");
            }
            let _ = writeln!(out, "\t}}");
        }
    }
    let _ = writeln!(out, "}}");
    let _ = writeln!(out);
    let _ = writeln!(out, "multipaths {{");
    for t in &c.targets {
        // With ALUA, group by priority even while every state is equal (one group then, the
        // same as multibus): the map keeps following the target when a port group later
        // goes standby, where multibus would send I/O to the standby paths.
        let policy = match t.grouping {
            _ if t.alua => "group_by_prio",
            Grouping::Multibus => "multibus",
            Grouping::GroupByPrio => "group_by_prio",
        };
        for lun in &t.luns {
            let _ = writeln!(out, "\tmultipath {{");
            let _ = writeln!(out, "\t\twwid {}", lun.wwid);
            let _ = writeln!(out, "\t\talias {}", lun.alias);
            let _ = writeln!(out, "\t\tpath_grouping_policy {policy}");
            let _ = writeln!(out, "\t\tpath_selector \"service-time 0\"");
            if t.alua {
                let _ = writeln!(out, "\t\tprio alua");
            }
            let _ = writeln!(out, "\t\tfailback immediate");
            let _ = writeln!(out, "\t\tno_path_retry {NO_PATH_RETRY}");
            let _ = writeln!(out, "\t}}");
        }
    }
    let _ = writeln!(out, "}}");
    out
}

/// /etc/fstab: `_netdev` so the mount waits for the network and iSCSI logins, `nofail` so a
/// missing LUN does not stop the boot.
pub fn fstab(c: &HostConfig) -> String {
    let mut out = String::new();
    for lun in c.targets.iter().flat_map(|t| &t.luns) {
        let _ = writeln!(
            out,
            "/dev/mapper/{a}  /mnt/{a}  xfs  defaults,_netdev,nofail  0  0",
            a = lun.alias
        );
    }
    out
}
