//! Which process published a gateway's client, so that a gateway restarted on the same machine
//! (systemd after a crash, an admin after kill -9) can fence the client its dead predecessor
//! left behind at once, instead of every other gateway waiting out the predecessor's watch.
//!
//! A process is named by the machine's boot, its pid namespace, its pid and its start time
//! (clock ticks after boot, `/proc/PID/stat` field 22): a pid that was reused, or one seen from
//! another container, is never taken for the predecessor. A process is called gone only when
//! this process can see for certain that it no longer runs; when in doubt it is left to the
//! watch timeout.

use std::fmt;

/// A gateway process, as published beside its client's address in `lanes.gw.IMAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incarnation {
    boot: String,
    pid_ns: String,
    pid: u32,
    start: u64,
}

/// What this process can tell about a published one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Same boot and pid namespace, and no process with that pid and start time runs.
    Gone,
    /// It runs here.
    Running,
    /// Another machine, boot or container: only its watch can tell.
    Elsewhere,
}

impl Incarnation {
    /// This process; None where `/proc` does not say (then nothing is published or fenced).
    pub fn this() -> Option<Incarnation> {
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pid_ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
        let pid = std::process::id();
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        Some(Incarnation {
            boot: boot.trim().to_string(),
            pid_ns: pid_ns.to_string_lossy().into_owned(),
            pid,
            start: start_time(&stat)?,
        })
    }

    /// Parses what [`fmt::Display`] wrote; None for anything else.
    pub fn parse(text: &str) -> Option<Incarnation> {
        let (mut boot, mut pid_ns, mut pid, mut start) = (None, None, None, None);
        for field in text.split_whitespace() {
            let (key, value) = field.split_once('=')?;
            match key {
                "boot" => boot = Some(value.to_string()),
                "pidns" => pid_ns = Some(value.to_string()),
                "pid" => pid = value.parse().ok(),
                "start" => start = value.parse().ok(),
                _ => {}
            }
        }
        Some(Incarnation {
            boot: boot.filter(|b| !b.is_empty())?,
            pid_ns: pid_ns.filter(|n| !n.is_empty())?,
            pid: pid?,
            start: start?,
        })
    }

    /// Whether `self` still runs, as seen from `me` (with `/proc/PID/stat` read by `stat_of`).
    pub fn liveness_with(
        &self,
        me: &Incarnation,
        stat_of: impl Fn(u32) -> std::io::Result<String>,
    ) -> Liveness {
        if self.boot != me.boot || self.pid_ns != me.pid_ns {
            return Liveness::Elsewhere;
        }
        if self.pid == me.pid && self.start == me.start {
            return Liveness::Running;
        }
        match stat_of(self.pid) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Liveness::Gone,
            // Unreadable for another reason: cannot tell.
            Err(_) => Liveness::Elsewhere,
            Ok(stat) => match start_time(&stat) {
                Some(start) if start == self.start => Liveness::Running,
                Some(_) => Liveness::Gone,
                None => Liveness::Elsewhere,
            },
        }
    }

    /// [`Incarnation::liveness_with`] on this machine's `/proc`.
    pub fn liveness(&self, me: &Incarnation) -> Liveness {
        self.liveness_with(me, |pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "boot={} pidns={} pid={} start={}",
            self.boot, self.pid_ns, self.pid, self.start
        )
    }
}

/// Field 22 of `/proc/PID/stat` (the process's start time), counted after the command name,
/// which is in parentheses and may itself hold spaces and parentheses.
fn start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts with field 3 (state); field 22 is the 20th after the name.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pid: u32, comm: &str, start: u64) -> String {
        let mut fields = vec!["S".to_string()];
        fields.extend((4..22).map(|n| n.to_string()));
        fields.push(start.to_string());
        fields.extend((23..30).map(|n| n.to_string()));
        format!("{pid} ({comm}) {}", fields.join(" "))
    }

    fn me() -> Incarnation {
        Incarnation {
            boot: "b1".into(),
            pid_ns: "pid:[4026531836]".into(),
            pid: 100,
            start: 5000,
        }
    }

    #[test]
    fn start_time_is_field_22_whatever_the_command_name() {
        assert_eq!(start_time(&stat(7, "lanes", 123)), Some(123));
        assert_eq!(start_time(&stat(7, "a) b (c", 456)), Some(456));
        assert_eq!(start_time("7 (lanes) S 1 2"), None);
        assert_eq!(start_time("garbage"), None);
    }

    #[test]
    fn what_is_published_reads_back() {
        let text = me().to_string();
        assert_eq!(Incarnation::parse(&text), Some(me()));
        assert_eq!(Incarnation::parse("127.0.0.1:0/123"), None);
        assert_eq!(Incarnation::parse("boot= pidns=x pid=1 start=2"), None);
        assert_eq!(Incarnation::parse("boot=b pidns=x pid=one start=2"), None);
        assert_eq!(
            Incarnation::this().map(|i| i.pid()),
            Some(std::process::id())
        );
    }

    #[test]
    fn only_a_process_seen_to_be_gone_here_is_gone() {
        let me = me();
        let other = |pid, start| Incarnation {
            pid,
            start,
            ..me.clone()
        };
        let missing = |_| Err(std::io::Error::from(std::io::ErrorKind::NotFound));
        let denied = |_| Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        let running = |pid| Ok(stat(pid, "lanes", 7000));
        // The pid no longer exists, or was reused by a process that started later.
        assert_eq!(other(200, 7000).liveness_with(&me, missing), Liveness::Gone);
        assert_eq!(other(200, 6000).liveness_with(&me, running), Liveness::Gone);
        // Still the same process, or this very one.
        assert_eq!(
            other(200, 7000).liveness_with(&me, running),
            Liveness::Running
        );
        assert_eq!(me.liveness_with(&me, missing), Liveness::Running);
        // Cannot tell: another boot, another container, or /proc would not say.
        let rebooted = Incarnation {
            boot: "b0".into(),
            ..other(200, 6000)
        };
        assert_eq!(rebooted.liveness_with(&me, missing), Liveness::Elsewhere);
        let contained = Incarnation {
            pid_ns: "pid:[4026532001]".into(),
            ..other(200, 6000)
        };
        assert_eq!(contained.liveness_with(&me, missing), Liveness::Elsewhere);
        assert_eq!(
            other(200, 6000).liveness_with(&me, denied),
            Liveness::Elsewhere
        );
        assert_eq!(
            other(200, 6000).liveness_with(&me, |_| Ok("nonsense".into())),
            Liveness::Elsewhere
        );
    }
}
