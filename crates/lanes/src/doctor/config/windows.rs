//! Windows: the MPIO feature claiming iSCSI disks, one persistent multipath-enabled connection
//! per portal, and the MSDSM load-balance policy.

use std::fmt::Write as _;

use super::HostConfig;
use crate::doctor::checks::Grouping;

/// PowerShell as Administrator.
pub fn powershell(c: &HostConfig) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Windows Server: PowerShell as Administrator");
    let _ = writeln!(
        out,
        "Install-WindowsFeature -Name Multipath-IO    # reboot if it asks"
    );
    let _ = writeln!(out, "Set-Service -Name MSiSCSI -StartupType Automatic");
    let _ = writeln!(out, "Start-Service -Name MSiSCSI");
    let _ = writeln!(out, "Enable-MSDSMAutomaticClaim -BusType iSCSI");
    // Round robin over equal paths; with ALUA states that differ, least queue depth keeps to
    // the optimized paths and still balances between them.
    let policy = if c
        .targets
        .iter()
        .any(|t| t.grouping == Grouping::GroupByPrio)
    {
        "LQD"
    } else {
        "RR"
    };
    let _ = writeln!(
        out,
        "Set-MSDSMGlobalDefaultLoadBalancePolicy -Policy {policy}"
    );
    let auth = match &c.chap_user {
        Some(user) => {
            let _ = writeln!(
                out,
                "$chapSecret = Read-Host -Prompt 'CHAP secret for {}'",
                user.replace('\'', "''")
            );
            format!(
                " -AuthenticationType ONEWAYCHAP -ChapUsername '{}' -ChapSecret $chapSecret",
                user.replace('\'', "''")
            )
        }
        None => String::new(),
    };
    for t in &c.targets {
        let _ = writeln!(out);
        let _ = writeln!(out, "# {}: one connection per portal", t.name);
        for p in &t.portals {
            let _ = writeln!(
                out,
                "New-IscsiTargetPortal -TargetPortalAddress {} -TargetPortalPortNumber {}{auth}",
                p.ip(),
                p.port()
            );
        }
        for p in &t.portals {
            let _ = writeln!(
                out,
                "Connect-IscsiTarget -NodeAddress {} -TargetPortalAddress {} \
                 -TargetPortalPortNumber {} -IsMultipathEnabled $true -IsPersistent $true{auth}",
                t.name,
                p.ip(),
                p.port()
            );
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "Get-IscsiSession | Format-Table TargetNodeAddress, InitiatorPortalAddress, IsConnected"
    );
    let _ = writeln!(out, "mpclaim -s -d    # every LUN once, with its paths");
    out
}
