//! `lanes serve` configuration files for tests: one target, its portal groups and LUNs, with the
//! defaults most tests want (one portal group on 127.0.0.1:0, one 16 MiB LUN) and room for extra
//! lines where a test needs them.

use std::fmt::Write as _;

/// A configuration file under construction. `dir` is written into paths as given, so it can be
/// a real directory or a placeholder such as `{dir}` that the caller replaces later.
#[derive(Debug, Clone)]
pub struct ConfigToml {
    dir: String,
    target: String,
    server_extra: Vec<String>,
    target_extra: Vec<String>,
    groups: Vec<(u16, Vec<String>)>,
    luns: Vec<(String, String, String)>,
}

impl ConfigToml {
    pub fn new(dir: impl std::fmt::Display, target: &str) -> Self {
        ConfigToml {
            dir: dir.to_string(),
            target: target.to_string(),
            server_extra: Vec::new(),
            target_extra: Vec::new(),
            groups: Vec::new(),
            luns: Vec::new(),
        }
    }

    /// Extra lines in `[server]`.
    pub fn server(mut self, lines: &str) -> Self {
        self.server_extra.push(lines.to_string());
        self
    }

    /// A portal group; without any, group 1 on 127.0.0.1:0.
    pub fn portal_group(mut self, tag: u16, portals: &[&str]) -> Self {
        self.groups
            .push((tag, portals.iter().map(|p| p.to_string()).collect()));
        self
    }

    /// Extra lines in `[[target]]` (acl, chap, max-connections, ...).
    pub fn target_lines(mut self, lines: &str) -> Self {
        self.target_extra.push(lines.to_string());
        self
    }

    /// A LUN backed by `DIR/file`, created sparse at `size`, with extra lines (`serial = ...`);
    /// without any, `disk0.img` of 16M.
    pub fn lun(mut self, file: &str, size: &str, lines: &str) -> Self {
        self.luns
            .push((file.to_string(), size.to_string(), lines.to_string()));
        self
    }

    pub fn build(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "[server]\ndata-dir = \"{}/data\"", self.dir);
        for lines in &self.server_extra {
            let _ = writeln!(out, "{lines}");
        }
        let default_group = [(1, vec!["127.0.0.1:0".to_string()])];
        let groups = if self.groups.is_empty() {
            &default_group[..]
        } else {
            &self.groups[..]
        };
        for (tag, portals) in groups {
            let list: Vec<String> = portals.iter().map(|p| format!("\"{p}\"")).collect();
            let _ = writeln!(
                out,
                "\n[[portal-group]]\ntag = {tag}\nportals = [{}]",
                list.join(", ")
            );
        }
        let _ = writeln!(out, "\n[[target]]\nname = \"{}\"", self.target);
        for lines in &self.target_extra {
            let _ = writeln!(out, "{lines}");
        }
        let default_lun = [("disk0.img".to_string(), "16M".to_string(), String::new())];
        let luns = if self.luns.is_empty() {
            &default_lun[..]
        } else {
            &self.luns[..]
        };
        for (file, size, lines) in luns {
            let _ = writeln!(
                out,
                "\n[[target.lun]]\npath = \"{}/{file}\"\nsize = \"{size}\"",
                self.dir
            );
            if !lines.is_empty() {
                let _ = writeln!(out, "{lines}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_one_group_and_one_lun() {
        let text = ConfigToml::new("{dir}", "iqn.2026-11.test:t").build();
        assert!(text.contains("data-dir = \"{dir}/data\""));
        assert!(text.contains("tag = 1\nportals = [\"127.0.0.1:0\"]"));
        assert!(text.contains("path = \"{dir}/disk0.img\"\nsize = \"16M\""));
        assert_eq!(text.matches("[[target]]").count(), 1);
    }

    #[test]
    fn groups_luns_and_extra_lines_replace_the_defaults() {
        let text = ConfigToml::new("/d", "iqn.2026-11.test:t")
            .server("nop-interval = \"0s\"")
            .portal_group(1, &["127.0.0.1:0"])
            .portal_group(2, &["127.0.0.2:0"])
            .target_lines("max-connections = 4")
            .lun("a.img", "64M", "serial = \"s1\"")
            .build();
        assert!(text.contains("[server]\ndata-dir = \"/d/data\"\nnop-interval = \"0s\""));
        assert!(text.contains("tag = 2\nportals = [\"127.0.0.2:0\"]"));
        assert!(text.contains("name = \"iqn.2026-11.test:t\"\nmax-connections = 4"));
        assert!(text.contains("path = \"/d/a.img\"\nsize = \"64M\"\nserial = \"s1\""));
        assert!(!text.contains("disk0.img"));
    }
}
