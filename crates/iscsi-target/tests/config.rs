//! Configuration file tests: a full example resolves, and every class of error names the file,
//! line and key an administrator has to fix.

use std::path::Path;
use std::time::Duration;

use lanes_iscsi_target::config::{
    naa_id, wwid_string, AclRule, AluaStateConfig, ChapAlgorithm, CliOverrides, ConfigError,
    DigestConfig, ServeConfig,
};

const FULL: &str = r#"
[server]
nop-interval = "10s"
nop-timeout = 30
metrics = "127.0.0.1:9260"
data-dir = "state"

[discovery-auth]
user = "discovery"
secret = "0x00112233445566778899aabbccddeeff"

[[portal-group]]
tag = 1
name = "lan-a"
portals = ["192.0.2.10:3260", "[2001:db8::10]:3260"]

[[portal-group]]
tag = 2
name = "lan-b"
portals = ["198.51.100.10"]
alua = "active-non-optimized"

[[target]]
name = "iqn.2026-11.io.lanes:store"
alias = "store"
portal-groups = [2]
acl = ["iqn.2005-03.org.open-iscsi:host1", "10.0.0.0/24"]
max-connections = 4
header-digest = "CRC32C,None"
first-burst-length = "128K"
max-burst-length = "1M"

[target.chap]
user = "host1"
secret = "twelve bytes!"
mutual-user = "lanes"
mutual-secret = "0bAAECAwQFBgcICQoL"
algorithms = ["sha256", "md5"]

[[target.lun]]
path = "disk0.img"
size = "1.5G"
block-size = 4096

[[target.lun]]
lun = 5
path = "/dev/null"
read-only = true
write-cache = false
serial = "disk5"

[[target]]
name = "eui.02004567A425678D"

[[target.lun]]
path = "other.img"
size = 1048576
"#;

fn parse(text: &str) -> Result<ServeConfig, ConfigError> {
    ServeConfig::from_toml_str(text, Path::new("/etc/lanes/lanes.toml"))
}

#[test]
fn full_example_resolves() {
    let config = parse(FULL).unwrap();
    assert_eq!(config.nop_interval, Duration::from_secs(10));
    assert_eq!(config.nop_timeout, Duration::from_secs(30));
    assert_eq!(config.metrics_addr.unwrap().to_string(), "127.0.0.1:9260");
    assert_eq!(config.data_dir, Path::new("/etc/lanes/state"));
    assert_eq!(
        config
            .discovery_auth
            .as_ref()
            .unwrap()
            .secret
            .expose()
            .len(),
        16
    );
    assert_eq!(config.portal_groups.len(), 2);
    assert_eq!(
        config.portal_groups[1].portals[0].to_string(),
        "198.51.100.10:3260"
    );
    assert_eq!(
        config.portal_groups[1].alua_state,
        AluaStateConfig::ActiveNonOptimized
    );

    let store = &config.targets[0];
    assert_eq!(store.portal_groups, vec![2]);
    assert_eq!(store.acl.len(), 2);
    assert!(matches!(store.acl[1], AclRule::Network(_)));
    assert_eq!(store.max_connections, 4);
    assert_eq!(
        store.header_digest,
        vec![DigestConfig::Crc32c, DigestConfig::None]
    );
    assert_eq!(
        store.data_digest,
        vec![DigestConfig::None, DigestConfig::Crc32c]
    );
    assert_eq!(
        (store.first_burst_length, store.max_burst_length),
        (131072, 1 << 20)
    );
    let chap = store.chap.as_ref().unwrap();
    assert_eq!(
        chap.algorithms,
        vec![ChapAlgorithm::Sha256, ChapAlgorithm::Md5]
    );
    assert!(chap.mutual_secret.is_some());
    assert_eq!(store.luns[0].path, Path::new("/etc/lanes/disk0.img"));
    assert_eq!(store.luns[0].size, Some(3 << 29));
    assert_eq!(store.luns[0].block_size, 4096);
    assert_eq!(store.luns[1].lun, 5);
    assert_eq!(store.luns[1].serial.as_deref(), Some("disk5"));
    assert!(store.luns[1].read_only && !store.luns[1].write_cache);

    let other = &config.targets[1];
    assert_eq!(other.portal_groups, vec![1, 2], "absent = every group");
    assert_eq!(other.luns[0].lun, 0);
    assert!(other.luns[0].serial.is_some(), "default serial filled in");
    let wwid = wwid_string(&naa_id(&other.name, &other.luns[0]));
    assert!(wwid.starts_with("36"), "{wwid}");
}

#[test]
fn minimal_file_gets_default_portal_group() {
    let config =
        parse("[[target]]\nname = \"iqn.2026-11.io.lanes:a\"\n[[target.lun]]\npath = \"a.img\"\n")
            .unwrap();
    assert_eq!(config.portal_groups[0].tag, 1);
    assert_eq!(
        config.portal_groups[0].portals[0].to_string(),
        "0.0.0.0:3260"
    );
    assert_eq!(config.targets[0].portal_groups, vec![1]);
}

/// Replaces `needle` (which must occur once) in FULL, parses, and checks the error names the
/// file, the expected line and the key.
fn assert_error(needle: &str, replacement: &str, key: &str, message: &str) {
    assert_eq!(
        FULL.matches(needle).count(),
        1,
        "{needle:?} must occur once"
    );
    let text = FULL.replacen(needle, replacement, 1);
    let line = FULL[..FULL.find(needle).unwrap()].matches('\n').count() + 1;
    let err = parse(&text).expect_err(&format!("{replacement:?} accepted"));
    let shown = err.to_string();
    let prefix = format!("/etc/lanes/lanes.toml:{line}:");
    assert!(
        shown.starts_with(&prefix),
        "{shown:?} does not start with {prefix:?}"
    );
    assert!(
        shown.contains(&format!(": {key}: ")),
        "{shown:?} does not name key {key:?}"
    );
    assert!(
        shown.contains(message),
        "{shown:?} does not say {message:?}"
    );
    assert_eq!(err.location().unwrap().line, line);
}

#[test]
fn error_bad_block_size() {
    assert_error(
        "block-size = 4096",
        "block-size = 1000",
        "target[0].lun[0].block-size",
        "must be 512 or 4096, got 1000",
    );
}

#[test]
fn error_bad_iqn() {
    assert_error(
        "\"eui.02004567A425678D\"",
        "\"iqn.2026-11.io.Lanes:x\"",
        "target[1].name",
        "uppercase",
    );
    assert_error(
        "\"eui.02004567A425678D\"",
        "\"target0\"",
        "target[1].name",
        "iqn.",
    );
}

#[test]
fn error_duplicate_lun() {
    assert_error(
        "lun = 5",
        "lun = 0",
        "target[0].lun[1].lun",
        "duplicate LUN 0",
    );
}

#[test]
fn error_unknown_portal_group() {
    assert_error(
        "portal-groups = [2]",
        "portal-groups = [2, 7]",
        "target[0].portal-groups[1]",
        "unknown portal-group tag 7",
    );
}

#[test]
fn error_bad_cidr() {
    assert_error(
        "\"10.0.0.0/24\"",
        "\"10.0.0.1/24\"",
        "target[0].acl[1]",
        "host bits",
    );
    assert_error(
        "\"10.0.0.0/24\"",
        "\"10.0.0.0/40\"",
        "target[0].acl[1]",
        "prefix length",
    );
}

#[test]
fn error_bad_size() {
    assert_error(
        "size = \"1.5G\"",
        "size = \"12Q\"",
        "target[0].lun[0].size",
        "unknown size suffix",
    );
    assert_error(
        "size = \"1.5G\"",
        "size = \"1000\"",
        "target[0].lun[0].size",
        "4096-byte blocks",
    );
}

#[test]
fn error_short_secret() {
    assert_error(
        "\"twelve bytes!\"",
        "\"short\"",
        "target[0].chap.secret",
        "at least 12 bytes",
    );
}

#[test]
fn error_bad_portal() {
    assert_error(
        "\"198.51.100.10\"",
        "\"lan-b.example:3260\"",
        "portal-group[1].portals[0]",
        "not ADDR:PORT",
    );
    assert_error(
        "\"198.51.100.10\"",
        "\"192.0.2.10:3260\"",
        "portal-group[1].portals[0]",
        "already listed",
    );
}

#[test]
fn error_bad_alua_state() {
    assert_error(
        "\"active-non-optimized\"",
        "\"sideways\"",
        "portal-group[1].alua",
        "not an ALUA state",
    );
}

#[test]
fn error_unknown_key() {
    assert_error(
        "write-cache = false",
        "write-caching = false",
        "target[0].lun[1].write-caching",
        "unknown field",
    );
}

#[test]
fn error_wrong_type() {
    assert_error(
        "read-only = true",
        "read-only = \"yes\"",
        "target[0].lun[1].read-only",
        "invalid type",
    );
}

#[test]
fn error_syntax() {
    let text = FULL.replacen("max-connections = 4", "max-connections = = 4", 1);
    let err = parse(&text).unwrap_err().to_string();
    let line = text[..text.find("= = 4").unwrap()].matches('\n').count() + 1;
    assert!(
        err.starts_with(&format!("/etc/lanes/lanes.toml:{line}:")),
        "{err}"
    );
}

#[test]
fn error_missing_lun() {
    let err = parse("[[target]]\nname = \"iqn.2026-11.io.lanes:a\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("target[0].lun") && err.contains("no LUN"),
        "{err}"
    );
}

#[test]
fn a_target_without_a_name_takes_the_hosts() {
    let config = parse("[[target]]\n[[target.lun]]\npath = \"disk0.img\"\nsize = \"1G\"\n")
        .expect("a target without a name");
    let name = lanes_iscsi_target::config::default_target_name();
    assert_eq!(config.targets[0].name, name);
    // Two such targets would have the same name: the second is refused.
    let err = parse(
        "[[target]]\n[[target.lun]]\npath = \"a\"\n[[target]]\n[[target.lun]]\npath = \"b\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("target[1].name") && err.contains("duplicate"),
        "{err}"
    );
}

#[test]
fn error_secret_file_missing() {
    assert_error(
        "secret = \"twelve bytes!\"",
        "secret-file = \"nope.secret\"",
        "target[0].chap.secret-file",
        "cannot read",
    );
}

#[test]
fn secret_file_is_read_relative_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("host1.secret"), "from a file, 24 bytes..\n").unwrap();
    let text = FULL.replacen(
        "secret = \"twelve bytes!\"",
        "secret-file = \"host1.secret\"",
        1,
    );
    let config = ServeConfig::from_toml_str(&text, &dir.path().join("lanes.toml")).unwrap();
    let chap = config.targets[0].chap.as_ref().unwrap();
    assert_eq!(chap.secret.expose(), b"from a file, 24 bytes..");
    assert!(
        !format!("{config:?}").contains("from a file"),
        "secrets must not print"
    );
}

#[test]
fn cli_flags_extend_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lanes.toml");
    std::fs::write(&path, FULL).unwrap();
    let cli = CliOverrides {
        config: Some(path),
        portals: vec!["127.0.0.1:3260".parse().unwrap()],
        luns: vec!["/tmp/extra.img,size=1M".parse().unwrap()],
        metrics: Some("127.0.0.1:9999".parse().unwrap()),
        allow_multiple_sessions: Some(false),
        ..CliOverrides::default()
    };
    let config = ServeConfig::from_cli(&cli).unwrap();
    assert_eq!(
        config.portal_groups[0].portals,
        vec!["127.0.0.1:3260".parse().unwrap()]
    );
    assert_eq!(
        config.portal_groups[1].portals.len(),
        1,
        "other groups untouched"
    );
    let store = &config.targets[0];
    assert_eq!(
        store.luns.last().unwrap().lun,
        6,
        "appended after the highest LUN"
    );
    assert!(config.targets.iter().all(|t| !t.allow_multiple_sessions));
    assert_eq!(config.metrics_addr.unwrap().port(), 9999);
}

#[test]
fn backing_files_are_created_sparse_and_never_shrunk() {
    let dir = tempfile::tempdir().unwrap();
    let cli = CliOverrides {
        data_dir: Some(dir.path().join("data")),
        luns: vec![format!("{}/sub/a.img,size=4M", dir.path().display())
            .parse()
            .unwrap()],
        ..CliOverrides::default()
    };
    let mut config = ServeConfig::from_cli(&cli).unwrap();
    config.prepare_storage().unwrap();
    let lun = &mut config.targets[0].luns[0];
    assert_eq!(std::fs::metadata(&lun.path).unwrap().len(), 4 << 20);
    lun.size = Some(8 << 20);
    assert_eq!(lun.ensure_backing_file().unwrap(), 8 << 20, "grown");
    lun.size = Some(1 << 20);
    assert!(lun.ensure_backing_file().is_err(), "never shrunk");
    assert!(dir.path().join("data").is_dir());
}

#[test]
fn an_rbd_lun_names_its_pool_and_image_and_errors_name_the_key() {
    let base = "[[target]]\nname = \"iqn.2026-11.io.lanes:ceph\"\n\n[[target.lun]]\n";
    let ok = parse(&format!(
        "{base}backend = \"rbd\"\npool = \"rbd\"\nimage = \"vol1\"\nceph-conf = \"ceph/ceph.conf\"\n"
    ))
    .unwrap();
    let lun = &ok.targets[0].luns[0];
    let rbd = lun.rbd.as_ref().expect("an RBD LUN");
    assert_eq!((rbd.pool.as_str(), rbd.image.as_str()), ("rbd", "vol1"));
    assert_eq!(rbd.ceph_conf, Path::new("/etc/lanes/ceph/ceph.conf"));
    assert_eq!(rbd.client, "admin");
    assert_eq!(rbd.watch_timeout_s, lanes_rbd::DEFAULT_WATCH_TIMEOUT_S);
    assert_eq!(lun.path, Path::new("rbd:rbd/vol1"));
    // `lanes config show` writes it back the same way.
    let shown = ok.to_toml();
    assert!(
        shown.contains("backend = \"rbd\"") && shown.contains("image = \"vol1\""),
        "{shown}"
    );
    assert_eq!(parse(&shown).unwrap().targets, ok.targets);
    let quick = parse(&format!(
        "{base}backend = \"rbd\"\npool = \"rbd\"\nimage = \"vol1\"\nwatch-timeout = 3\n"
    ))
    .unwrap();
    let rbd = quick.targets[0].luns[0].rbd.as_ref().unwrap();
    assert_eq!(rbd.watch_timeout_s, 3);
    assert!(quick.to_toml().contains("watch-timeout = 3"));

    for (body, key, message) in [
        (
            "backend = \"rbd\"\npool = \"rbd\"\nimage = \"v\"\nwatch-timeout = 1\n",
            "target[0].lun[0].watch-timeout",
            "from 2 to 60, got 1",
        ),
        (
            "path = \"x.img\"\nwatch-timeout = 5\n",
            "target[0].lun[0].watch-timeout",
            "only for backend",
        ),
        (
            "backend = \"rbd\"\npool = \"rbd\"\n",
            "target[0].lun[0].image",
            "required",
        ),
        (
            "backend = \"rbd\"\npool = \"rbd\"\nimage = \"a/b\"\n",
            "target[0].lun[0].image",
            "without '/'",
        ),
        (
            "backend = \"rbd\"\npool = \"rbd\"\nimage = \"v\"\nsize = \"1G\"\n",
            "target[0].lun[0].size",
            "rbd resize",
        ),
        (
            "backend = \"rbd\"\npool = \"rbd\"\nimage = \"v\"\npath = \"x.img\"\n",
            "target[0].lun[0].path",
            "not a path",
        ),
        ("backend = \"nfs\"\n", "target[0].lun[0].backend", "must be"),
        (
            "path = \"x.img\"\npool = \"rbd\"\n",
            "target[0].lun[0].pool",
            "only for backend",
        ),
        ("lun = 3\n", "target[0].lun[0].path", "required"),
    ] {
        let err = parse(&format!("{base}{body}")).expect_err(body);
        let text = err.to_string();
        assert!(text.starts_with("/etc/lanes/lanes.toml:"), "{text}");
        assert!(
            text.contains(&format!(": {key}: ")) && text.contains(message),
            "{body:?}: {text}"
        );
    }
}
