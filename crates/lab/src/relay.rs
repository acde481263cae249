//! The delay relay: a small process inside one lab namespace that owns a TUN device per
//! delayed NIC, holds every packet the kernel hands it for the delay and gives it back (see
//! [`crate::delay`] for how packets get there and why). Also how `fail` starts a relay and how
//! `restore` stops it.
//!
//! The relay is the `lanes` binary (`lanes lab relay ...`, hidden) or, for this crate's tests,
//! `lanes-lab-relay`; both call [`main`]. It prints `ready` once its TUN devices exist and
//! afterwards never writes to stdout or stderr, so its starter may go away.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::indexing_slicing))]

use std::fs::File;
use std::io::{self, BufRead as _, BufReader, Read as _, Write};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use rustix::event::{poll, PollFd, PollFlags};
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};

use crate::delay_line::{DelayLine, MAX_PACKET};
use crate::run::LabError;

/// What one relay does: which TUN devices it owns and how it delays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayArgs {
    /// The lab (so that `restore` can tell its relays from any other process).
    pub lab: String,
    /// Short name of the namespace the relay runs in (for messages).
    pub namespace: String,
    pub delay: Duration,
    pub jitter: Duration,
    /// Bound on the bytes held per device.
    pub queue_bytes: usize,
    /// TUN devices to create, one per delayed NIC.
    pub devices: Vec<String>,
}

impl RelayArgs {
    /// The command-line form, read back by [`RelayArgs::parse`].
    pub fn to_args(&self) -> Vec<String> {
        let mut args = vec![
            "--lab".to_string(),
            self.lab.clone(),
            "--namespace".into(),
            self.namespace.clone(),
            "--delay-us".into(),
            self.delay.as_micros().to_string(),
            "--jitter-us".into(),
            self.jitter.as_micros().to_string(),
            "--queue-bytes".into(),
            self.queue_bytes.to_string(),
        ];
        for device in &self.devices {
            args.extend(["--device".to_string(), device.clone()]);
        }
        args
    }

    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut parsed = Self {
            lab: String::new(),
            namespace: String::new(),
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            queue_bytes: 0,
            devices: Vec::new(),
        };
        let mut iter = args.iter();
        while let Some(flag) = iter.next() {
            let value = iter
                .next()
                .ok_or_else(|| format!("relay: {flag} needs a value"))?;
            let number = || {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("relay: {flag} {value:?} is not a number"))
            };
            match flag.as_str() {
                "--lab" => parsed.lab = value.clone(),
                "--namespace" => parsed.namespace = value.clone(),
                "--delay-us" => parsed.delay = Duration::from_micros(number()?),
                "--jitter-us" => parsed.jitter = Duration::from_micros(number()?),
                "--queue-bytes" => {
                    parsed.queue_bytes = usize::try_from(number()?).map_err(|e| e.to_string())?
                }
                "--device" => parsed.devices.push(value.clone()),
                other => return Err(format!("relay: unknown argument {other:?}")),
            }
        }
        if parsed.lab.is_empty() || parsed.devices.is_empty() || parsed.delay.is_zero() {
            return Err("relay: needs --lab, --delay-us and at least one --device".into());
        }
        Ok(parsed)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("{0}")]
    Args(String),
    #[error("TUN device {device}: {source}")]
    Tun {
        device: String,
        #[source]
        source: io::Error,
    },
    #[error("relay: {0}")]
    Io(#[from] io::Error),
}

/// The relay process: parses ARGS, creates the TUN devices, says `ready` on `ready`, then
/// relays until killed. Returns only on error.
pub fn main(args: &[String], mut ready: impl Write) -> Result<(), RelayError> {
    let args = RelayArgs::parse(args).map_err(RelayError::Args)?;
    let mut files = Vec::with_capacity(args.devices.len());
    for device in &args.devices {
        let file = open_tun(device).map_err(|source| RelayError::Tun {
            device: device.clone(),
            source,
        })?;
        files.push(file);
    }
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id());
    let mut lines: Vec<DelayLine> = (0..files.len() as u64)
        .map(|k| DelayLine::new(args.queue_bytes, args.delay, args.jitter, seed + k))
        .collect();
    writeln!(ready, "ready")?;
    ready.flush()?;
    drop(ready);
    relay(&files, &mut lines)
}

/// Packets read from one device per wake-up before the due ones are written: bounded work,
/// so a flood on one device cannot hold back the others' releases.
const READ_BATCH: usize = 64;

fn relay(files: &[File], lines: &mut [DelayLine]) -> Result<(), RelayError> {
    // A timerfd wakes the loop when the next packet is due, to the microsecond (poll's own
    // timeout counts whole milliseconds, which would add up to 1 ms per direction).
    let timer = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )
    .map_err(io::Error::from)?;
    let mut armed: Option<Instant> = None;
    let mut fds: Vec<PollFd<'_>> = std::iter::once(PollFd::new(&timer, PollFlags::IN))
        .chain(files.iter().map(|f| PollFd::new(f, PollFlags::IN)))
        .collect();
    let mut scratch = vec![0u8; MAX_PACKET].into_boxed_slice();
    let mut ticks = [0u8; 8];
    loop {
        let next = lines.iter().filter_map(DelayLine::next_due).min();
        if next != armed {
            let wait = next.map_or(Duration::ZERO, |due| {
                // Zero would disarm the timer: a packet already due fires it at once.
                due.saturating_duration_since(Instant::now())
                    .max(Duration::from_nanos(1))
            });
            arm(&timer, wait)?;
            armed = next;
        }
        match poll(&mut fds, -1) {
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(RelayError::Io(e.into())),
        }
        let Some((timer_fd, tun_fds)) = fds.split_first() else {
            return Ok(());
        };
        if timer_fd.revents().contains(PollFlags::IN) {
            // Reading the expiry count re-arms the timer's readiness.
            let _ = rustix::io::read(&timer, &mut ticks);
            armed = None;
        }
        let now = Instant::now();
        for ((fd, mut file), line) in tun_fds.iter().zip(files).zip(lines.iter_mut()) {
            let events = fd.revents();
            if events.intersects(PollFlags::ERR | PollFlags::HUP | PollFlags::NVAL) {
                return Err(RelayError::Io(io::Error::other("TUN device went away")));
            }
            if !events.contains(PollFlags::IN) {
                continue;
            }
            for _ in 0..READ_BATCH {
                let (buffer, keep) = match line.space() {
                    Some(space) => (space, true),
                    None => (&mut *scratch, false),
                };
                match file.read(buffer) {
                    Ok(len) if keep => line.commit(now, len),
                    Ok(_) => line.drop_one(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(RelayError::Io(e)),
                }
            }
        }
        let now = Instant::now();
        for (mut file, line) in files.iter().zip(lines.iter_mut()) {
            while let Some(packet) = line.pop_due(now) {
                // A packet the kernel refuses (say, a buffer shortage) is lost, as on a wire.
                let _ = file.write(packet);
            }
        }
    }
}

/// Sets the timer to fire once after `wait` (zero: disarmed).
fn arm(timer: &OwnedFd, wait: Duration) -> Result<(), RelayError> {
    let value = Timespec {
        tv_sec: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(wait.subsec_nanos()),
    };
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let spec = Itimerspec {
        it_interval: zero,
        it_value: value,
    };
    timerfd_settime(timer, TimerfdTimerFlags::empty(), &spec).map_err(io::Error::from)?;
    Ok(())
}

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags, padded to 40 bytes.
#[repr(C)]
struct TunRequest {
    name: [u8; 16],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Creates TUN device NAME in the current network namespace (IP packets without a header);
/// the device lives as long as the returned file.
#[allow(unsafe_code)]
fn open_tun(name: &str) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")?;
    let mut request = TunRequest {
        name: [0; 16],
        flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    if name.is_empty() || name.len() > 15 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "device names are 1 to 15 bytes",
        ));
    }
    for (to, from) in request.name.iter_mut().zip(name.bytes()) {
        *to = from;
    }
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq` (40 bytes on Linux) at the pointer;
    // `request` is that size, NUL-terminated, initialised and outlives the call, and the fd is
    // an open /dev/net/tun owned by `file`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut request) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(file)
}

/// How to start a relay: a program and its leading arguments (`lanes lab relay`), to which
/// the [`RelayArgs`] are appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayCommand(pub Vec<String>);

/// Starts a relay inside namespace REAL and waits until its TUN devices exist; returns its pid.
/// The relay gets its own process group, so a Ctrl-C meant for the starter does not stop it.
pub(crate) fn spawn(command: &RelayCommand, real: &str, args: &RelayArgs) -> Result<u32, LabError> {
    let mut argv = vec!["netns".to_string(), "exec".into(), real.to_string()];
    argv.extend(command.0.iter().cloned());
    argv.extend(args.to_args());
    let shown = format!("ip {}", argv.join(" "));
    let mut child = Command::new("ip")
        .args(&argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|source| LabError::Spawn {
            command: shown.clone(),
            source,
        })?;
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        // The relay either says `ready` or exits (closing the pipe) with its error on stderr.
        let _ = BufReader::new(stdout).read_line(&mut line);
    }
    if line.trim_end() == "ready" {
        // `ip netns exec` execs the relay, so this is the relay's pid. The relay is not
        // waited for: it outlives this call, and `restore` or `down` stops it.
        return Ok(child.id());
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = child
        .wait()
        .map_or_else(|e| e.to_string(), |s| s.to_string());
    Err(LabError::Command {
        command: shown,
        status,
        stderr: stderr.trim().replace('\n', "; "),
    })
}

/// Whether PID is a live process (not gone, not a zombie).
pub fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold anything.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Whether PID is a relay of lab LAB (a pid can be reused once the relay is gone).
fn is_relay_of(pid: u32, lab: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(2)
        .any(|pair| matches!(pair, [flag, name] if *flag == b"--lab" && *name == lab.as_bytes()))
        && args.iter().any(|a| a.ends_with(b"relay"))
}

/// Stops a relay of lab LAB: SIGTERM, then SIGKILL if it is still there after 2 s. Its TUN
/// devices vanish with it. A pid that is no longer such a relay is left alone.
pub(crate) fn stop(pid: u32, lab: &str) {
    if !is_running(pid) || !is_relay_of(pid, lab) {
        return;
    }
    let Some(target) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let _ = rustix::process::kill_process(target, rustix::process::Signal::Term);
    let deadline = Instant::now() + Duration::from_secs(2);
    while is_running(pid) {
        if Instant::now() > deadline {
            let _ = rustix::process::kill_process(target, rustix::process::Signal::Kill);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_round_trip() {
        let args = RelayArgs {
            lab: "demo".into(),
            namespace: "host".into(),
            delay: Duration::from_millis(50),
            jitter: Duration::from_millis(5),
            queue_bytes: 1 << 24,
            devices: vec!["dly-link1".into(), "dly-link2".into()],
        };
        assert_eq!(RelayArgs::parse(&args.to_args()), Ok(args));
        let bad = |list: &[&str]| {
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            RelayArgs::parse(&list).is_err()
        };
        assert!(bad(&[]));
        assert!(bad(&["--lab", "x", "--delay-us", "5"]));
        assert!(bad(&["--lab", "x", "--delay-us", "soon", "--device", "d"]));
        assert!(bad(&["--lab", "x", "--delay-us", "5", "--device"]));
        assert!(bad(&["--what", "x"]));
    }

    #[test]
    fn process_states_are_read() {
        assert!(is_running(std::process::id()));
        assert!(!is_relay_of(std::process::id(), "demo"));
        assert!(!is_running(u32::MAX));
    }
}
