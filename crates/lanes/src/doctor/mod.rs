//! `lanes doctor`: finds what is wrong with a multipath set-up and prints the host configuration
//! that works. Discovery on every given portal, one login per portal (and LUN), then a
//! checklist: reachability and round trip, a second session per initiator, the LUN identity,
//! size and ALUA state on every path, negotiated parameters, MTU and local interfaces, and a
//! throughput probe (each path alone, then together) that finds shared bottlenecks.
//!
//! Facts are gathered first (`gather`, `local`, `probe`), judged by pure functions (`checks`,
//! `bottleneck`), and turned into host configuration by pure generators (`config`).

mod args;
mod bottleneck;
pub(crate) mod checks;
pub(crate) mod config;
mod facts;
mod gather;
mod local;
mod probe;
mod report;
mod smb;

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use lanes_initiator::{resolve, ChapSecret};
use serde_json::json;

pub use args::DoctorArgs;
use args::{default_initiator_name, parse_url, DoctorUrl};
use config::{alias_for, make_aliases_unique, ConfigLun, HostConfig, TargetConfig};
use facts::{linux_wwid, login_failure, TargetFacts};
use gather::Settings;
use report::{Check, Report, Verdict};

/// Prints each check as it is made and keeps it for the summary and `--json`.
struct Out {
    report: Report,
}

impl Out {
    fn emit(&mut self, check: Check) {
        println!("{}", check.line());
        self.report.push(check);
    }

    fn emit_all(&mut self, checks: impl IntoIterator<Item = Check>) {
        for c in checks {
            self.emit(c);
        }
    }
}

pub async fn run(args: DoctorArgs) -> anyhow::Result<()> {
    if args.urls.iter().any(|u| u.starts_with("smb://")) {
        return smb::run(&args).await;
    }
    let urls: Vec<DoctorUrl> = args
        .urls
        .iter()
        .map(|u| parse_url(u))
        .collect::<Result<_, _>>()?;
    let chap = match (&args.chap_user, &args.chap_secret_file) {
        (Some(user), Some(file)) => {
            let secret = std::fs::read_to_string(file)
                .with_context(|| format!("reading the CHAP secret from {}", file.display()))?;
            Some(ChapSecret {
                user: user.clone(),
                secret: secret.trim_end_matches(['\r', '\n']).as_bytes().to_vec(),
            })
        }
        _ => urls
            .iter()
            .find_map(|u| u.chap.clone())
            .map(|(user, secret)| ChapSecret {
                user,
                secret: secret.into_bytes(),
            }),
    };
    let initiator_name = args
        .initiator_name
        .clone()
        .unwrap_or_else(default_initiator_name);
    let settings = Settings {
        initiator_name: initiator_name.clone(),
        chap: chap.clone(),
        timeout: args.timeout,
        lun: urls.iter().find_map(|u| u.lun),
    };
    let shown: Vec<String> = args.urls.iter().map(|u| redact(u)).collect();
    println!("lanes doctor: {} as {initiator_name}", shown.join(" "));
    let mut out = Out {
        report: Report::default(),
    };

    let targets = discover_targets(&urls, &settings, &mut out).await;
    let mut configs = Vec::new();
    for (name, portals) in targets {
        println!();
        println!(
            "Target {name} ({} portal{})",
            portals.len(),
            plural(portals.len())
        );
        let mut paths = Vec::new();
        for (portal, tpgt) in portals {
            paths.push(gather::path_facts(portal, tpgt, &name, &settings).await);
        }
        let facts = TargetFacts { name, paths };
        let assessment = checks::assess(&facts);
        out.emit_all(assessment.checks.clone());
        let good: Vec<&facts::PathFacts> = assessment
            .good
            .iter()
            .filter_map(|&i| facts.paths.get(i))
            .collect();
        let (Some(first), Some(lun)) = (good.first(), assessment.luns.first()) else {
            continue;
        };
        let second = good.get(1).unwrap_or(first);
        let sessions =
            gather::second_session(&facts.name, first.portal, second.portal, &settings).await;
        let sessions_ok = sessions.is_ok();
        out.emit(checks::second_session_check(
            &initiator_name,
            &sessions,
            settings.timeout,
        ));
        if args.quick || !sessions_ok {
            for p in &good {
                if let Some(a) = p.local.as_ref().and_then(|l| l.aggregate.as_ref()) {
                    out.emit(bottleneck::aggregate_check(
                        &p.portal.to_string(),
                        &a.kind,
                        a.members.len(),
                        None,
                    ));
                }
            }
        } else {
            let lun = lun.lun;
            println!(
                "probing throughput ({:.1} s per measurement)...",
                args.probe_time.as_secs_f64()
            );
            out.emit_all(
                probe::probe_target(&facts.name, lun, &good, args.probe_time, &settings).await,
            );
        }
        configs.push(target_config(&facts, &assessment));
    }

    let mut host = HostConfig {
        targets: configs,
        chap_user: chap.as_ref().map(|c| c.user.clone()),
        chap_secret_file: args.chap_secret_file.as_ref().map(|f| {
            std::path::absolute(f)
                .unwrap_or(f.clone())
                .display()
                .to_string()
        }),
    };
    make_aliases_unique(&mut host.targets);
    println!();
    println!("Summary: {}", out.report.summary());
    let generated = (!host.targets.is_empty()).then(|| config::generate(&host));
    match &generated {
        Some(g) => print_config(g, out.report.count(Verdict::Fail) > 0),
        None => println!("No host configuration: no path passed the checks."),
    }
    if let Some(path) = &args.json {
        write_json(
            path,
            &args,
            &initiator_name,
            &out.report,
            &host,
            generated.as_ref(),
        )?;
    }
    let failed = out.report.count(Verdict::Fail);
    if failed > 0 {
        bail!("{failed} check{} failed", plural(failed));
    }
    Ok(())
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// SendTargets on every URL's portal; targets merged by name, portals deduplicated. A URL that
/// names a target keeps only that one.
async fn discover_targets(
    urls: &[DoctorUrl],
    s: &Settings,
    out: &mut Out,
) -> Vec<(String, Vec<(SocketAddr, u16)>)> {
    let wanted: Vec<&str> = urls.iter().filter_map(|u| u.target.as_deref()).collect();
    let mut merged: Vec<(String, Vec<(SocketAddr, u16)>)> = Vec::new();
    let mut add = |name: &str, portal: SocketAddr, tpgt: u16| {
        if !wanted.is_empty() && !wanted.contains(&name) {
            return;
        }
        match merged.iter_mut().find(|(n, _)| n == name) {
            Some((_, portals)) => {
                if !portals.iter().any(|(p, _)| *p == portal) {
                    portals.push((portal, tpgt));
                }
            }
            None => merged.push((name.to_string(), vec![(portal, tpgt)])),
        }
    };
    for url in urls {
        let name = format!("discovery on {}", url.portal);
        let addr = match resolve(&url.portal).await {
            Ok(a) => a,
            Err(e) => {
                out.emit(Check::fail(
                    name,
                    format!("{e}."),
                    "check the host name or address in the URL",
                ));
                continue;
            }
        };
        match gather::discovery(addr, s).await {
            Ok(found) => {
                let portals: usize = found.iter().map(|(_, p)| p.len()).sum();
                let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
                if let Some(t) = &url.target {
                    if !names.contains(&t.as_str()) {
                        out.emit(Check::fail(
                            name,
                            format!(
                                "{addr} does not offer {t} to this initiator (it offers: {}).",
                                if names.is_empty() {
                                    "nothing".to_string()
                                } else {
                                    names.join(", ")
                                }
                            ),
                            "check the target name, and the target's access list for this \
                             initiator",
                        ));
                        continue;
                    }
                }
                out.emit(Check::ok(
                    name,
                    format!(
                        "{} target{} with {portals} portal{}.",
                        found.len(),
                        plural(found.len()),
                        plural(portals)
                    ),
                ));
                for (target, portals) in &found {
                    for (portal, tpgt) in portals {
                        add(target, *portal, *tpgt);
                    }
                }
            }
            Err(e) => {
                let f = login_failure(addr, &e, s.timeout);
                // A target that refuses discovery may still accept a login to a named target.
                let refused = matches!(e, lanes_initiator::Error::LoginRefused { .. });
                out.emit(Check::fail(name, format!("{}.", f.what), f.fix));
                if let (true, Some(t)) = (refused, &url.target) {
                    add(t, addr, 1);
                }
            }
        }
    }
    merged
}

fn target_config(facts: &TargetFacts, a: &checks::Assessment) -> TargetConfig {
    let portals: Vec<SocketAddr> = a
        .good
        .iter()
        .filter_map(|&i| facts.paths.get(i).map(|p| p.portal))
        .collect();
    let excluded = facts
        .paths
        .iter()
        .map(|p| p.portal)
        .filter(|p| !portals.contains(p))
        .collect();
    let luns = a
        .luns
        .iter()
        .filter_map(|l| {
            let id = l.id.clone()?;
            Some(ConfigLun {
                lun: l.lun,
                wwid: linux_wwid(&id)?,
                id,
                alias: alias_for(&facts.name, l.lun),
                vendor: l.vendor.clone(),
                product: l.product.clone(),
            })
        })
        .collect();
    let alua = a.good.iter().any(|&i| {
        facts
            .paths
            .get(i)
            .and_then(|p| p.info())
            .is_some_and(|info| info.alua.is_ok())
    });
    TargetConfig {
        name: facts.name.clone(),
        portals,
        excluded,
        luns,
        grouping: a.grouping,
        alua,
    }
}

fn print_config(g: &config::Generated, failures: bool) {
    println!();
    println!("Host configuration for the paths that passed the checks:");
    if failures {
        println!("(fix the FAIL lines above first: until then some paths or sessions are missing)");
    }
    for (title, text) in [
        ("Linux: commands", &g.linux_commands),
        ("Linux: /etc/multipath.conf", &g.multipath_conf),
        ("Linux: /etc/fstab", &g.fstab),
        ("Windows: PowerShell", &g.windows),
        ("VMware ESXi: esxcli", &g.esxi),
    ] {
        println!();
        println!("----- {title} -----");
        print!("{text}");
    }
}

fn write_json(
    path: &std::path::Path,
    args: &DoctorArgs,
    initiator_name: &str,
    report: &Report,
    host: &HostConfig,
    generated: Option<&config::Generated>,
) -> anyhow::Result<()> {
    let targets: Vec<_> = host
        .targets
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "portals": t.portals.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
                "excluded": t.excluded.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
                "luns": t.luns.iter().map(|l| json!({
                    "lun": l.lun, "id": l.id, "wwid": l.wwid, "alias": l.alias,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let doc = json!({
        "urls": args.urls.iter().map(|u| redact(u)).collect::<Vec<_>>(),
        "initiator_name": initiator_name,
        "quick": args.quick,
        "checks": report.checks_json(),
        "summary": {
            "ok": report.count(Verdict::Ok),
            "warn": report.count(Verdict::Warn),
            "fail": report.count(Verdict::Fail),
        },
        "targets": targets,
        "config": generated.map(|g| json!({
            "linux_commands": g.linux_commands,
            "multipath_conf": g.multipath_conf,
            "fstab": g.fstab,
            "windows": g.windows,
            "esxi": g.esxi,
        })),
    });
    let text = serde_json::to_string_pretty(&doc)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// A URL without the CHAP secret it may carry.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            let user = creds.split('%').next().unwrap_or("");
            format!("{}{user}%***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}
