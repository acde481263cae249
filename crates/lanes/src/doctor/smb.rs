//! `lanes doctor smb://USER@HOST/SHARE`: prints what `lanes_smb_client::doctor` found (the
//! negotiation, the interfaces the server advertises and which ones took a channel) as checks,
//! and the advice when a client would stay on one connection.

use anyhow::Context as _;
use lanes_smb_client::doctor::{advise, gather, speed};
use lanes_smb_client::url::SmbUrl;
use serde_json::json;

use super::report::{Check, Report, Verdict};
use super::DoctorArgs;
use crate::bench::smb::password as smb_password;

pub async fn run(args: &DoctorArgs) -> anyhow::Result<()> {
    let [url] = args.urls.as_slice() else {
        anyhow::bail!("give one smb:// URL");
    };
    let url = SmbUrl::parse(url)?;
    let password = smb_password(args.password_file.as_ref())?;
    println!(
        "lanes doctor: smb://{}@{}:{}/{}",
        url.user, url.host, url.port, url.share
    );
    let facts = tokio::time::timeout(
        args.timeout.saturating_mul(4),
        gather(&url, &password, args.encrypt),
    )
    .await
    .context("the SMB checks timed out")??;
    let mut report = Report::default();
    let mut emit = |c: Check| {
        println!("{}", c.line());
        report.push(c);
    };
    emit(
        Check::ok(
            "negotiate",
            format!(
                "SMB {}.{}.{} with {}, MaxRead {} KiB, MaxWrite {} KiB",
                facts.dialect >> 8,
                (facts.dialect >> 4) & 0xF,
                facts.dialect & 0xF,
                facts.server,
                facts.max_read >> 10,
                facts.max_write >> 10
            ),
        )
        .with("dialect", format!("{:#06x}", facts.dialect)),
    );
    emit(Check::ok(
        "signing",
        format!(
            "{} (server {} signing)",
            facts.signing,
            if facts.server_requires_signing {
                "requires"
            } else {
                "allows"
            }
        ),
    ));
    emit(match (&facts.cipher, facts.encrypted, args.encrypt) {
        (Some(c), true, _) => Check::ok("encryption", format!("on, {c}")),
        (Some(c), false, _) => Check::ok("encryption", format!("offered ({c}), not asked for")),
        (None, _, true) => Check::fail(
            "encryption",
            "asked for, but the server chose no cipher.",
            "enable SMB encryption on the server.",
        ),
        (None, _, false) => Check::ok("encryption", "off (not asked for)"),
    });
    emit(if facts.multichannel {
        Check::ok(
            "multichannel",
            "the server offers SMB2_GLOBAL_CAP_MULTI_CHANNEL",
        )
    } else {
        Check::fail(
            "multichannel",
            "the server does not offer SMB2_GLOBAL_CAP_MULTI_CHANNEL.",
            "enable multichannel on the server.",
        )
    });
    match &facts.interfaces {
        Ok(list) => {
            for c in list {
                let n = &c.interface;
                let caps = match (n.capability & 1 != 0, n.capability & 2 != 0) {
                    (true, true) => "RSS, RDMA",
                    (true, false) => "RSS",
                    (false, true) => "RDMA",
                    (false, false) => "no RSS",
                };
                let name = format!("interface {}", n.address);
                let detail = format!("{}, {caps}, ifindex {}", speed(n.link_speed), n.if_index);
                emit(match &c.bind {
                    Ok(()) => Check::ok(name, format!("{detail}; channel bound"))
                        .with("link_speed", n.link_speed),
                    Err(e) => Check::warn(
                        name,
                        format!("{detail}; no channel: {e}."),
                        "make the address reachable from clients, or stop advertising it.",
                    )
                    .with("link_speed", n.link_speed),
                });
            }
        }
        Err(e) => emit(Check::warn(
            "interfaces",
            format!("FSCTL_QUERY_NETWORK_INTERFACE_INFO failed: {e}."),
            "clients cannot discover more channels.",
        )),
    }
    let advice = advise(&facts);
    let channels = facts
        .interfaces
        .as_ref()
        .map_or(0, |l| l.iter().filter(|c| c.bind.is_ok()).count());
    println!();
    if advice.is_empty() {
        println!(
            "Multichannel will be used: {} channel{} bound beside the first.",
            channels,
            if channels == 1 { "" } else { "s" }
        );
    } else {
        println!("Why clients may not use several connections:");
        for a in &advice {
            println!("  - {a}");
        }
    }
    println!("Summary: {}", report.summary());
    if let Some(path) = &args.json {
        let doc = json!({
            "url": format!("smb://{}@{}:{}/{}", url.user, url.host, url.port, url.share),
            "checks": report.checks_json(),
            "advice": advice,
            "channels_bound": channels,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let failed = report.count(Verdict::Fail);
    if failed > 0 {
        anyhow::bail!(
            "{failed} check{} failed",
            if failed == 1 { "" } else { "s" }
        );
    }
    Ok(())
}
