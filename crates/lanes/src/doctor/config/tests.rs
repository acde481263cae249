//! The generated host configuration, parsed: multipath.conf syntax and keys, one login per
//! portal, fstab with `_netdev`, and the Windows and ESXi commands per path.

use super::*;

/// Sections and the keys each may hold (multipath.conf(5)).
const SECTIONS: &[(&str, &[&str])] = &[
    ("devices", &[]),
    (
        "device",
        &[
            "vendor",
            "product",
            "path_checker",
            "fast_io_fail_tmo",
            "hardware_handler",
            "prio",
        ],
    ),
    ("multipaths", &[]),
    (
        "multipath",
        &[
            "wwid",
            "alias",
            "path_grouping_policy",
            "path_selector",
            "prio",
            "failback",
            "no_path_retry",
        ],
    ),
];

/// A multipath.conf as (section path, key, value) triples; errors on unbalanced braces,
/// unknown sections or keys, sections in the wrong place and unquoted values with blanks.
pub fn parse_multipath_conf(text: &str) -> Result<Vec<(String, String, String)>, String> {
    let mut stack: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |m: &str| format!("line {}: {m}: {raw:?}", n + 1);
        if line == "}" {
            stack.pop().ok_or_else(|| at("unbalanced }"))?;
            continue;
        }
        if let Some(section) = line.strip_suffix('{').map(str::trim) {
            let parent = stack.last().copied();
            let allowed = matches!(
                (parent, section),
                (None, "devices")
                    | (None, "multipaths")
                    | (Some("devices"), "device")
                    | (Some("multipaths"), "multipath")
            );
            if !allowed {
                return Err(at("section not allowed here"));
            }
            stack.push(
                SECTIONS
                    .iter()
                    .find(|(s, _)| *s == section)
                    .map(|(s, _)| *s)
                    .ok_or_else(|| at("unknown section"))?,
            );
            continue;
        }
        let section = *stack.last().ok_or_else(|| at("key outside a section"))?;
        let (key, value) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| at("key without value"))?;
        let keys = SECTIONS
            .iter()
            .find(|(s, _)| *s == section)
            .map(|(_, k)| *k)
            .unwrap_or(&[]);
        if !keys.contains(&key) {
            return Err(at("unknown key"));
        }
        let value = value.trim();
        let value = if let Some(inner) = value.strip_prefix('"') {
            inner
                .strip_suffix('"')
                .ok_or_else(|| at("unterminated quote"))?
                .to_string()
        } else if value.contains(char::is_whitespace) {
            return Err(at("a value with blanks must be quoted"));
        } else {
            value.to_string()
        };
        out.push((stack.join("/"), key.to_string(), value));
    }
    if !stack.is_empty() {
        return Err(format!("unclosed sections: {stack:?}"));
    }
    Ok(out)
}

fn lun(wwid_hex: &str) -> ConfigLun {
    ConfigLun {
        lun: 0,
        id: format!("naa.{wwid_hex}"),
        wwid: format!("3{wwid_hex}"),
        alias: alias_for("iqn.2026-11.io.lanes:store", 0),
        vendor: "LANES".into(),
        product: "disk".into(),
    }
}

fn config(alua: bool) -> HostConfig {
    HostConfig {
        targets: vec![TargetConfig {
            name: "iqn.2026-11.io.lanes:store".into(),
            portals: vec![
                "10.0.1.2:3260".parse().unwrap(),
                "10.0.2.2:3260".parse().unwrap(),
            ],
            excluded: vec!["10.0.3.2:3260".parse().unwrap()],
            luns: vec![lun("60a6c61aaaabbbbccccddddeeeeffff0")],
            grouping: if alua {
                Grouping::GroupByPrio
            } else {
                Grouping::Multibus
            },
            alua,
        }],
        chap_user: None,
        chap_secret_file: None,
    }
}

#[test]
fn multipath_conf_parses_and_names_the_wwid() {
    let g = generate(&config(false));
    let entries = parse_multipath_conf(&g.multipath_conf)
        .unwrap_or_else(|e| panic!("{e}\n{}", g.multipath_conf));
    let get = |section: &str, key: &str| -> Vec<String> {
        entries
            .iter()
            .filter(|(s, k, _)| s == section && k == key)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    assert_eq!(
        get("multipaths/multipath", "wwid"),
        vec!["360a6c61aaaabbbbccccddddeeeeffff0"]
    );
    assert_eq!(get("multipaths/multipath", "alias"), vec!["store-lun0"]);
    assert_eq!(
        get("multipaths/multipath", "path_selector"),
        vec!["service-time 0"]
    );
    assert_eq!(
        get("multipaths/multipath", "path_grouping_policy"),
        vec!["multibus"]
    );
    assert_eq!(get("multipaths/multipath", "no_path_retry"), vec!["12"]);
    assert_eq!(get("devices/device", "fast_io_fail_tmo"), vec!["1"]);
    assert!(get("devices/device", "hardware_handler").is_empty());

    let g = generate(&config(true));
    let entries = parse_multipath_conf(&g.multipath_conf).unwrap();
    assert!(entries.contains(&(
        "multipaths/multipath".into(),
        "path_grouping_policy".into(),
        "group_by_prio".into()
    )));
    assert!(entries.contains(&(
        "devices/device".into(),
        "hardware_handler".into(),
        "1 alua".into()
    )));
    // ALUA with every state equal still groups by priority (one group now, and it follows a
    // later standby).
    let mut equal = config(true);
    equal.targets[0].grouping = Grouping::Multibus;
    let entries = parse_multipath_conf(&generate(&equal).multipath_conf).unwrap();
    assert!(entries.contains(&(
        "multipaths/multipath".into(),
        "path_grouping_policy".into(),
        "group_by_prio".into()
    )));
    assert!(entries.contains(&("multipaths/multipath".into(), "prio".into(), "alua".into())));
}

#[test]
fn the_parser_catches_broken_files() {
    assert!(parse_multipath_conf("multipaths {\n multipath {\n wwid 3x\n }\n").is_err());
    assert!(parse_multipath_conf("multipaths {\n}\n}\n").is_err());
    assert!(parse_multipath_conf("multipaths {\n wwid 3x\n}\n").is_err());
    assert!(parse_multipath_conf("devices {\n device {\n colour red\n }\n}\n").is_err());
    assert!(parse_multipath_conf(
        "multipaths {\n multipath {\n path_selector service-time 0\n }\n}\n"
    )
    .is_err());
    assert!(parse_multipath_conf("multipath {\n}\n").is_err());
}

/// The portals named in `iscsiadm ... -p PORTAL --login` lines.
pub fn login_portals(commands: &str) -> Vec<String> {
    commands
        .lines()
        .filter(|l| l.starts_with("iscsiadm -m node") && l.trim_end().ends_with("--login"))
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "-p")?;
            words.get(at + 1).map(|p| p.to_string())
        })
        .collect()
}

#[test]
fn one_login_per_portal_and_never_an_excluded_one() {
    let g = generate(&config(false));
    assert_eq!(
        login_portals(&g.linux_commands),
        vec!["10.0.1.2:3260", "10.0.2.2:3260"]
    );
    for p in ["10.0.1.2:3260", "10.0.2.2:3260"] {
        let startup = format!("-p {p} -o update -n node.startup -v automatic");
        assert_eq!(
            g.linux_commands.matches(&startup).count(),
            1,
            "{}",
            g.linux_commands
        );
    }
    assert!(g.linux_commands.contains("-p 10.0.3.2:3260 -o delete"));
    assert!(!g.linux_commands.contains("-p 10.0.3.2:3260 --login"));
    assert!(g
        .linux_commands
        .contains("apt-get install -y open-iscsi multipath-tools"));
    assert!(g
        .linux_commands
        .contains("multipath -a 360a6c61aaaabbbbccccddddeeeeffff0"));
    let fstab: Vec<&str> = g.fstab.lines().collect();
    assert_eq!(fstab.len(), 1);
    let fields: Vec<&str> = fstab[0].split_whitespace().collect();
    assert_eq!(fields.len(), 6, "{fstab:?}");
    assert_eq!(fields[0], "/dev/mapper/store-lun0");
    assert!(fields[3].split(',').any(|o| o == "_netdev"), "{fstab:?}");
}

#[test]
fn chap_reads_the_secret_file_and_never_prints_a_secret() {
    let mut c = config(false);
    c.chap_user = Some("host1".into());
    c.chap_secret_file = Some("/etc/lanes/chap secret".into());
    let g = generate(&c);
    assert!(g
        .linux_commands
        .contains("node.session.auth.username -v 'host1'"));
    assert!(
        g.linux_commands
            .contains("-v \"$(cat '/etc/lanes/chap secret')\""),
        "{}",
        g.linux_commands
    );
    assert!(g
        .windows
        .contains("-ChapUsername 'host1' -ChapSecret $chapSecret"));
}

#[test]
fn windows_and_esxi_have_one_connection_per_path() {
    let g = generate(&config(false));
    assert_eq!(
        g.windows
            .matches("New-IscsiTargetPortal -TargetPortalAddress")
            .count(),
        2
    );
    let connects: Vec<&str> = g
        .windows
        .lines()
        .filter(|l| l.starts_with("Connect-IscsiTarget"))
        .collect();
    assert_eq!(connects.len(), 2);
    for c in &connects {
        assert!(
            c.contains("-IsMultipathEnabled $true -IsPersistent $true"),
            "{c}"
        );
        assert!(c.contains("-NodeAddress iqn.2026-11.io.lanes:store"), "{c}");
    }
    assert!(!g.windows.contains("10.0.3.2"));
    assert!(g
        .windows
        .contains("Enable-MSDSMAutomaticClaim -BusType iSCSI"));
    assert!(g
        .windows
        .contains("Set-MSDSMGlobalDefaultLoadBalancePolicy -Policy RR"));
    assert_eq!(g.esxi.matches("networkportal add").count(), 2);
    assert_eq!(g.esxi.matches("sendtarget add").count(), 2);
    assert!(g
        .esxi
        .contains("--device=naa.60a6c61aaaabbbbccccddddeeeeffff0 --psp=VMW_PSP_RR"));
    assert!(g.esxi.contains("--type=iops --iops=1"));
    assert!(g.esxi.contains("--satp=VMW_SATP_DEFAULT_AA"));
    let g = generate(&config(true));
    assert!(g.esxi.contains("--satp=VMW_SATP_ALUA"));
    assert!(g.windows.contains("-Policy LQD"));
}

#[test]
fn aliases_are_clean_and_unique() {
    assert_eq!(alias_for("iqn.2026-11.io.lanes:Store_1", 2), "store-1-lun2");
    assert_eq!(alias_for("naa.6001405abcdef", 0), "6001405abcdef-lun0");
    assert_eq!(alias_for("iqn.x:::", 0), "lanes-lun0");
    let mut targets = vec![
        config(false).targets[0].clone(),
        config(false).targets[0].clone(),
    ];
    make_aliases_unique(&mut targets);
    assert_eq!(targets[0].luns[0].alias, "store-lun0");
    assert_eq!(targets[1].luns[0].alias, "store-lun0-2");
}
