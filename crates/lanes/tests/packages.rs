//! The test command's package list (scripts/packages.txt, installed by scripts/test.sh) covers
//! every external program the tests and the scripts the test command runs call: a test that
//! starts a program nobody installs would fail only on a fresh machine.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Programs whose package is checked by package (`-` lines), not by the program being on PATH:
/// a non-static busybox on PATH does not do for the guest's initramfs.
const BY_PACKAGE: [(&str, &str); 1] = [("busybox", "busybox-static")];

/// Programs listed in scripts/packages.txt.
fn listed() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("scripts/packages.txt")).unwrap();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let mut out: BTreeSet<String> = lines
        .iter()
        .filter_map(|l| l.first())
        .filter(|p| **p != "-")
        .map(|p| p.to_string())
        .collect();
    for (program, package) in BY_PACKAGE {
        if lines.iter().any(|l| l.as_slice() == ["-", package]) {
            out.insert(program.to_string());
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The word after `marker` up to the closing quote, for each occurrence.
fn quoted_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    text.match_indices(marker)
        .filter_map(|(i, _)| {
            let rest = &text[i + marker.len()..];
            let end = rest.find('"')?;
            let word = &rest[..end];
            word.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
                .then_some(word)
        })
        .collect()
}

/// Programs started from Rust (`Command::new` with a literal, a lab namespace's `.command(ns, &[PROGRAM, ...`)
/// and the tools the test command's scripts check for (`for tool in x y z; do`, `command -v x`).
fn called() -> BTreeSet<String> {
    let mut files = Vec::new();
    rust_files(&repo().join("crates"), &mut files);
    let mut out = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        out.extend(
            quoted_after(&text, "Command::new(\"")
                .into_iter()
                .map(String::from),
        );
        for call in [".command(", ".output(", ".exec("] {
            for (i, _) in text.match_indices(call) {
                let rest = &text[i..];
                let Some(open) = rest.find("&[\"") else {
                    continue;
                };
                // Only the argument list of this call (before its closing parenthesis).
                if rest[..open].contains(')') || rest[..open].contains(';') {
                    continue;
                }
                out.extend(
                    quoted_after(&rest[open..open + 40.min(rest.len() - open)], "&[\"")
                        .into_iter()
                        .map(String::from),
                );
            }
        }
    }
    let mut scripts: Vec<std::path::PathBuf> = [
        "scripts/test.sh",
        "scripts/interop.sh",
        "scripts/readme-check.sh",
        "scripts/package-check.sh",
        "scripts/build-deb.sh",
        "scripts/ceph-cluster",
        "vm/lib.sh",
        "vm/build-guest",
        "vm/boot",
    ]
    .iter()
    .map(|s| repo().join(s))
    .collect();
    for entry in std::fs::read_dir(repo().join("vm/tests")).unwrap() {
        scripts.push(entry.unwrap().path());
    }
    for script in scripts {
        let text = std::fs::read_to_string(&script).unwrap();
        for line in text.lines().map(str::trim) {
            if let Some(list) = line
                .strip_prefix("for tool in ")
                .and_then(|l| l.split(';').next())
            {
                out.extend(list.split_whitespace().map(String::from));
            }
            for (i, _) in line.match_indices("command -v ") {
                if let Some(word) = line[i + 11..].split_whitespace().next() {
                    if !word.starts_with('"') && !word.starts_with('$') {
                        out.insert(word.to_string());
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_program_the_tests_call_is_installed_by_the_test_command() {
    let listed = listed();
    let called = called();
    // The scan itself works: it finds programs we know the tests use.
    for known in [
        "ip",
        "tgtd",
        "qemu-img",
        "iperf3",
        "iscsi-test-cu",
        "losetup",
    ] {
        assert!(called.contains(known), "scan missed {known}: {called:?}");
    }
    // Programs that are not external: the shell's own, cargo's, and the binaries we build.
    let ours = ["cargo", "lanes", "lanes-lab-relay", "true", "false"];
    let missing: Vec<&String> = called
        .iter()
        .filter(|p| !listed.contains(*p) && !ours.contains(&p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "called by tests but not in scripts/packages.txt: {missing:?}"
    );
}
