//! VMware ESXi: the software iSCSI adapter with one bound vmkernel port per NIC, the portals
//! as send targets, and round robin switching paths after every I/O.

use std::fmt::Write as _;

use super::{portal_text, HostConfig};

/// esxcli in the ESXi shell.
pub fn esxcli(c: &HostConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# VMware ESXi: esxcli in the ESXi shell");
    let _ = writeln!(out, "esxcli iscsi software set --enabled=true");
    let _ = writeln!(
        out,
        "ADAPTER=$(esxcli iscsi adapter list | awk '/iscsi_vmk/ {{print $1; exit}}')"
    );
    let paths = c.targets.iter().map(|t| t.portals.len()).max().unwrap_or(1);
    let _ = writeln!(
        out,
        "# port binding: one vmkernel port per storage NIC (vmk1..vmk{paths}), each with exactly \
         one active uplink; skip binding when every path has a subnet of its own"
    );
    for k in 1..=paths {
        let _ = writeln!(
            out,
            "esxcli iscsi networkportal add --adapter=$ADAPTER --nic=vmk{k}"
        );
    }
    if let Some(user) = &c.chap_user {
        let file = c.chap_secret_file.as_deref().unwrap_or("/path/to/secret");
        let _ = writeln!(
            out,
            "esxcli iscsi adapter auth chap set --adapter=$ADAPTER --direction=uni \
             --level=required --authname='{}' --secret=\"$(cat '{}')\"",
            user.replace('\'', ""),
            file.replace('\'', "")
        );
    }
    for t in &c.targets {
        let _ = writeln!(out);
        let _ = writeln!(out, "# {}", t.name);
        for p in &t.portals {
            let _ = writeln!(
                out,
                "esxcli iscsi adapter discovery sendtarget add --adapter=$ADAPTER --address={}",
                portal_text(p)
            );
        }
        for p in &t.excluded {
            let _ = writeln!(
                out,
                "esxcli iscsi adapter discovery statictarget remove --adapter=$ADAPTER \
                 --address={} --name={}    # failed the checks: not a path",
                portal_text(p),
                t.name
            );
        }
    }
    let _ = writeln!(out, "esxcli storage core adapter rescan --adapter=$ADAPTER");
    let mut claimed: Vec<(String, String)> = Vec::new();
    for t in &c.targets {
        for lun in &t.luns {
            let key = (lun.vendor.clone(), lun.product.clone());
            if claimed.contains(&key) {
                continue;
            }
            claimed.push(key);
            let (satp, claim) = if t.alua {
                ("VMW_SATP_ALUA", " --claim-option=tpgs_on")
            } else {
                ("VMW_SATP_DEFAULT_AA", "")
            };
            let _ = writeln!(
                out,
                "esxcli storage nmp satp rule add --satp={satp} --vendor='{}' --model='{}' \
                 --psp=VMW_PSP_RR --psp-option=iops=1{claim} --description='lanes doctor'",
                lun.vendor.replace('\'', ""),
                lun.product.replace('\'', "")
            );
        }
    }
    for lun in c.targets.iter().flat_map(|t| &t.luns) {
        let _ = writeln!(
            out,
            "esxcli storage nmp device set --device={} --psp=VMW_PSP_RR",
            lun.id
        );
        let _ = writeln!(
            out,
            "esxcli storage nmp psp roundrobin deviceconfig set --device={} --type=iops --iops=1",
            lun.id
        );
        let _ = writeln!(out, "esxcli storage nmp device list --device={}", lun.id);
    }
    out
}
