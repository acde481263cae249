//! Unit tests of the reload diff: configurations parsed from text, compared in memory.

use super::diff::{diff, Change, NotLive};
use crate::config::{AluaStateConfig, ServeConfig};

const TARGET: &str = "iqn.2026-11.io.lanes:t";
const OTHER: &str = "iqn.2026-11.io.lanes:u";

const BASE: &str = r#"
[server]
data-dir = "/srv/lanes"

[[portal-group]]
tag = 1
portals = ["127.0.0.1:3260"]

[[portal-group]]
tag = 2
portals = ["127.0.0.2:3260"]

[[target]]
name = "iqn.2026-11.io.lanes:t"
acl = ["iqn.2005-03.org.open-iscsi:a"]

[target.chap]
user = "a"
secret = "secret of a host"

[[target.lun]]
path = "/srv/lanes/t0.img"
size = "16M"

[[target.lun]]
path = "/srv/lanes/t1.img"
size = "16M"

[[target]]
name = "iqn.2026-11.io.lanes:u"

[[target.lun]]
path = "/srv/lanes/u0.img"
size = "16M"
"#;

fn parse(text: &str) -> ServeConfig {
    ServeConfig::from_toml_str(text, "/etc/lanes.toml".as_ref())
        .unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The diff from BASE to BASE with `from` replaced by `to` (which must occur).
fn edit(from: &str, to: &str) -> Result<Vec<Change>, NotLive> {
    assert!(BASE.contains(from), "{from:?} not in BASE");
    diff(&parse(BASE), &parse(&BASE.replacen(from, to, 1)))
}

fn refused(from: &str, to: &str) -> NotLive {
    match edit(from, to) {
        Ok(changes) => panic!("{from:?} -> {to:?} accepted: {changes:?}"),
        Err(e) => e,
    }
}

#[test]
fn nothing_changed() {
    assert_eq!(diff(&parse(BASE), &parse(BASE)), Ok(vec![]));
}

#[test]
fn luns_added_removed_and_grown() {
    let added = edit(
        "[[target]]\nname = \"iqn.2026-11.io.lanes:u\"",
        "[[target.lun]]\nlun = 7\npath = \"/srv/lanes/t7.img\"\nsize = \"1M\"\n\n\
         [[target]]\nname = \"iqn.2026-11.io.lanes:u\"",
    );
    assert_eq!(
        added,
        Ok(vec![Change::LunAdded {
            target: TARGET.into(),
            lun: 7,
            path: "/srv/lanes/t7.img".into(),
        }])
    );
    let removed = edit(
        "[[target.lun]]\npath = \"/srv/lanes/t1.img\"\nsize = \"16M\"\n",
        "",
    );
    assert_eq!(
        removed,
        Ok(vec![Change::LunRemoved {
            target: TARGET.into(),
            lun: 1,
        }])
    );
    let grown = edit(
        "path = \"/srv/lanes/u0.img\"\nsize = \"16M\"",
        "path = \"/srv/lanes/u0.img\"\nsize = \"32M\"",
    );
    assert_eq!(
        grown,
        Ok(vec![Change::LunGrown {
            target: OTHER.into(),
            lun: 0,
            size: 32 << 20,
        }])
    );
    // Removing the size keeps the file as it is: nothing to do.
    assert_eq!(
        edit(
            "path = \"/srv/lanes/u0.img\"\nsize = \"16M\"",
            "path = \"/srv/lanes/u0.img\""
        ),
        Ok(vec![])
    );
}

#[test]
fn renumbering_is_a_removal_and_an_addition_in_lun_order() {
    let changes = edit(
        "[[target.lun]]\npath = \"/srv/lanes/t1.img\"",
        "[[target.lun]]\nlun = 3\npath = \"/srv/lanes/t3.img\"",
    )
    .unwrap();
    assert_eq!(
        changes,
        vec![
            Change::LunRemoved {
                target: TARGET.into(),
                lun: 1
            },
            Change::LunAdded {
                target: TARGET.into(),
                lun: 3,
                path: "/srv/lanes/t3.img".into()
            },
        ]
    );
}

#[test]
fn what_a_lun_is_cannot_change_under_its_number() {
    let e = refused(
        "path = \"/srv/lanes/t1.img\"\nsize = \"16M\"",
        "path = \"/srv/lanes/t1.img\"\nsize = \"8M\"",
    );
    assert_eq!(e.key, "target[0].lun[1].size");
    assert!(e.message.contains("shrink"), "{e}");
    let e = refused(
        "path = \"/srv/lanes/t1.img\"\nsize = \"16M\"",
        "path = \"/srv/lanes/t1.img\"\nsize = \"16M\"\nblock-size = 4096",
    );
    assert_eq!(e.key, "target[0].lun[1].block-size");
    assert!(e.message.contains("512 -> 4096"), "{e}");
    let e = refused("/srv/lanes/t1.img", "/srv/lanes/other.img");
    assert_eq!(e.key, "target[0].lun[1].path");
    let e = refused(
        "path = \"/srv/lanes/u0.img\"",
        "path = \"/srv/lanes/u0.img\"\nserial = \"x1\"",
    );
    assert_eq!(e.key, "target[1].lun[0].serial");
    let e = refused(
        "path = \"/srv/lanes/u0.img\"",
        "path = \"/srv/lanes/u0.img\"\nread-only = true",
    );
    assert_eq!(e.key, "target[1].lun[0].read-only");
}

#[test]
fn targets_and_server_settings_that_need_a_restart() {
    let e = refused(
        "name = \"iqn.2026-11.io.lanes:u\"",
        "name = \"iqn.2026-11.io.lanes:v\"",
    );
    assert_eq!(e.key, "target[1].name");
    assert!(e.message.contains("renaming"), "{e}");
    let e = refused("data-dir = \"/srv/lanes\"", "data-dir = \"/srv/other\"");
    assert_eq!(e.key, "server.data-dir");
    let e = refused("[server]\n", "[server]\nmetrics = \"127.0.0.1:9000\"\n");
    assert_eq!(e.key, "server.metrics");
    let e = refused(
        "[[target]]\nname = \"iqn.2026-11.io.lanes:u\"",
        "[[target]]\nname = \"iqn.2026-11.io.lanes:u\"\nportal-groups = [2]",
    );
    assert_eq!(e.key, "target[1].portal-groups");
    let e = refused("tag = 2\n", "tag = 3\n");
    assert_eq!(e.key, "portal-group");
}

#[test]
fn access_changes() {
    assert_eq!(
        edit("open-iscsi:a\"", "open-iscsi:a\", \"127.0.0.0/8\""),
        Ok(vec![Change::AclChanged {
            target: TARGET.into()
        }])
    );
    assert_eq!(
        edit("secret of a host", "new secret of a host"),
        Ok(vec![Change::ChapChanged {
            target: TARGET.into()
        }])
    );
    assert_eq!(
        edit(
            "name = \"iqn.2026-11.io.lanes:u\"",
            "name = \"iqn.2026-11.io.lanes:u\"\nmax-burst-length = \"512K\"\nimmediate-data = false"
        ),
        Ok(vec![Change::LoginKeysChanged {
            target: OTHER.into(),
            keys: vec!["max-burst-length", "immediate-data"],
        }])
    );
}

#[test]
fn portals_and_alua() {
    assert_eq!(
        edit(
            "[\"127.0.0.2:3260\"]",
            "[\"127.0.0.3:3260\"]\nalua = \"standby\""
        ),
        Ok(vec![
            Change::PortalAdded {
                group: 2,
                addr: "127.0.0.3:3260".parse().unwrap()
            },
            Change::PortalRemoved {
                group: 2,
                addr: "127.0.0.2:3260".parse().unwrap()
            },
            Change::AluaChanged {
                group: 2,
                from: AluaStateConfig::ActiveOptimized,
                to: AluaStateConfig::Standby
            },
        ])
    );
    let moved = BASE
        .replacen("[\"127.0.0.2:3260\"]", "[\"127.0.0.9:3260\"]", 1)
        .replacen(
            "[\"127.0.0.1:3260\"]",
            "[\"127.0.0.1:3260\", \"127.0.0.2:3260\"]",
            1,
        );
    let e = diff(&parse(BASE), &parse(&moved)).unwrap_err();
    assert_eq!(e.key, "portal-group[0].portals[1]");
    assert!(e.message.contains("moves from portal group 2"), "{e}");
}

#[test]
fn changes_print_what_happened() {
    let lines: Vec<String> = edit(
        "[\"127.0.0.2:3260\"]",
        "[\"127.0.0.2:3260\"]\nalua = \"unavailable\"",
    )
    .unwrap()
    .iter()
    .map(ToString::to_string)
    .collect();
    assert_eq!(
        lines,
        ["portal group 2: ALUA active-optimized -> unavailable"]
    );
}
