//! The banner's host configuration read by the real parser: Debian's multipath-tools merges the
//! printed /etc/multipath.conf (`multipath -t`, with the file placed over /etc by an overlay in
//! a private mount namespace, so the machine's own /etc is never touched) and shows lanes'
//! device section and WWID entry, with the host's `defaults` left exactly as they were.

mod served;

use std::path::Path;
use std::process::Command;

/// The indented lines after the heading that starts with `heading`, up to the next heading.
fn section(banner: &str, heading: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in banner.lines() {
        if line.starts_with(heading) {
            inside = true;
            continue;
        }
        if inside && !line.is_empty() && !line.starts_with("  ") {
            break;
        }
        if inside {
            out.push_str(line.strip_prefix("  ").unwrap_or(line));
            out.push('\n');
        }
    }
    out
}

/// `multipath -t` with `conf` (None: no file at all) as /etc/multipath.conf: (stdout, stderr).
fn merged(dir: &Path, conf: Option<&str>) -> (String, String) {
    let upper = dir.join("upper");
    let work = dir.join("work");
    let _ = std::fs::remove_dir_all(&upper);
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::create_dir_all(&work).unwrap();
    if let Some(conf) = conf {
        std::fs::write(upper.join("multipath.conf"), conf).unwrap();
    }
    let script = format!(
        "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && \
         {{ [ -n \"$WITH_FILE\" ] || rm -f /etc/multipath.conf; }} && exec multipath -t",
        upper.display(),
        work.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("WITH_FILE", if conf.is_some() { "1" } else { "" })
        .output()
        .expect("unshare + multipath -t (multipath-tools, util-linux)");
    assert!(out.status.success(), "multipath -t: {out:?}");
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The `NAME { ... }` block that starts at a line equal to `NAME {` (top level only).
fn block(text: &str, name: &str) -> String {
    let open = format!("{name} {{");
    let mut out = String::new();
    let mut depth = 0usize;
    for line in text.lines() {
        if depth == 0 && line.trim_end() != open {
            continue;
        }
        depth += line.matches('{').count();
        depth -= line.matches('}').count().min(depth);
        out.push_str(line);
        out.push('\n');
        if depth == 0 {
            break;
        }
    }
    out
}

#[test]
fn banner_multipath_conf_is_merged_by_multipath_tools_without_touching_defaults() {
    lanes_test_support::require_root();
    let dir = tempfile::tempdir().unwrap();
    let served = served::command()
        .portals(&["127.0.0.1:0"])
        .disk(dir.path(), "disk.img", "16M")
        .start();
    let banner = &served.banner;
    let conf = section(banner, "/etc/multipath.conf");
    assert!(
        conf.contains("devices {"),
        "no multipath.conf in the banner:\n{banner}"
    );
    let wwid = served.wwid().to_string();

    let (plain, _) = merged(dir.path(), None);
    let (with_lanes, warnings) = merged(dir.path(), Some(&conf));
    // Every keyword is known to the parser: it names the file for anything it does not take
    // (an invalid keyword, a device section without vendor or product).
    assert!(
        !warnings.contains("multipath.conf") && !warnings.to_lowercase().contains("invalid"),
        "multipath -t complained:\n{warnings}\n{conf}"
    );

    // lanes' device section is merged into the built-in device table, matched to lanes'
    // INQUIRY strings, with the ALUA handler.
    let devices = block(&with_lanes, "devices");
    let lanes_device = devices
        .split("\tdevice {")
        .find(|d| d.contains("vendor \"LANES\""))
        .unwrap_or_else(|| panic!("no LANES device in the merged table:\n{devices}"));
    for line in [
        "product \"lanes volume\"",
        "hardware_handler \"1 alua\"",
        "prio \"alua\"",
        "path_checker \"tur\"",
    ] {
        assert!(
            lanes_device.contains(line),
            "{line} missing:\n{lanes_device}"
        );
    }
    assert!(!block(&plain, "devices").contains("\"LANES\""));

    // The LUN's own entry.
    let multipaths = block(&with_lanes, "multipaths");
    assert!(
        multipaths.contains(&format!("wwid \"{wwid}\"")),
        "{multipaths}"
    );
    assert!(multipaths.contains("alias \""), "{multipaths}");

    // The host's defaults, for every other array it has, are what they were.
    let defaults = block(&plain, "defaults");
    assert!(defaults.contains("path_selector"), "{plain}");
    assert_eq!(block(&with_lanes, "defaults"), defaults);
}
