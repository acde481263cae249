//! What a pattern costs and how far it is: the process's CPU time, per-task byte counters that
//! a progress bar on stderr reads while the pattern runs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// User and system CPU seconds of this process (every thread), from `/proc/self/stat`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    pub user_s: f64,
    pub sys_s: f64,
}

impl CpuTimes {
    /// Now; zero where `/proc` cannot be read (the column then shows 0 %, nothing fails).
    pub fn now() -> CpuTimes {
        std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s))
            .unwrap_or_default()
    }

    pub fn since(self, earlier: CpuTimes) -> CpuTimes {
        CpuTimes {
            user_s: (self.user_s - earlier.user_s).max(0.0),
            sys_s: (self.sys_s - earlier.sys_s).max(0.0),
        }
    }

    pub fn total_s(self) -> f64 {
        self.user_s + self.sys_s
    }
}

/// utime and stime (fields 14 and 15) of a `/proc/PID/stat` line, in seconds. The command name
/// (field 2) may hold spaces and parentheses, so fields are counted from the last ')'.
fn parse_stat(line: &str) -> Option<CpuTimes> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: f64 = fields.next()?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    let tick = clock_ticks_per_second();
    Some(CpuTimes {
        user_s: utime / tick,
        sys_s: stime / tick,
    })
}

fn clock_ticks_per_second() -> f64 {
    // USER_HZ is 100 on every Linux architecture that reports it through /proc.
    rustix::param::clock_ticks_per_second() as f64
}

/// Bytes one task has moved so far: a cache line of its own, so counting costs one uncontended
/// store per I/O and no task ever writes another's line.
#[repr(align(128))]
#[derive(Default)]
pub struct TaskCounter(AtomicU64);

impl TaskCounter {
    pub fn set(&self, bytes: u64) {
        self.0.store(bytes, Ordering::Relaxed);
    }
}

/// The counters of one pattern's tasks.
pub type Counters = Arc<[TaskCounter]>;

pub fn counters(n: usize) -> Counters {
    (0..n).map(|_| TaskCounter::default()).collect()
}

fn sum(counters: &Counters) -> u64 {
    counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
}

/// A progress bar on stderr while a pattern runs (none when stderr is not a terminal, so logs
/// and pipes stay clean): pattern name, elapsed of total, MB/s over the last update.
pub struct Progress {
    bar: Option<ProgressBar>,
    counters: Counters,
    last: (Instant, u64),
}

/// How often the bar and its rate are refreshed.
pub const TICK: Duration = Duration::from_millis(250);

impl Progress {
    pub fn start(name: &str, duration: Duration, counters: Counters) -> Progress {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let bar = ProgressBar::with_draw_target(
                Some(duration.as_millis() as u64),
                ProgressDrawTarget::stderr(),
            );
            bar.set_style(
                ProgressStyle::with_template("{prefix:>16} [{bar:30}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            bar.set_prefix(name.to_string());
            bar
        });
        Progress {
            bar,
            counters,
            last: (Instant::now(), 0),
        }
    }

    /// Redraws with the time elapsed since `began`.
    pub fn tick(&mut self, began: Instant, duration: Duration) {
        let Some(bar) = &self.bar else { return };
        let now = Instant::now();
        let bytes = sum(&self.counters);
        let dt = now.duration_since(self.last.0).as_secs_f64();
        let rate = if dt > 0.0 {
            bytes.saturating_sub(self.last.1) as f64 / dt / 1e6
        } else {
            0.0
        };
        self.last = (now, bytes);
        let elapsed = now.duration_since(began).min(duration);
        bar.set_position(elapsed.as_millis() as u64);
        bar.set_message(format!(
            "{:.1}/{:.1} s  {rate:.1} MB/s",
            elapsed.as_secs_f64(),
            duration.as_secs_f64()
        ));
    }

    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let hz = clock_ticks_per_second();
        let line = "4242 (a (weird) name) R 1 2 3 4 5 6 7 8 9 10 250 75 0 0 20 0 8 0 100";
        let t = parse_stat(line).unwrap();
        assert!((t.user_s - 250.0 / hz).abs() < 1e-9, "{t:?}");
        assert!((t.sys_s - 75.0 / hz).abs() < 1e-9, "{t:?}");
        assert!(parse_stat("12 (x) R 1 2").is_none());
    }

    #[test]
    fn own_cpu_time_grows_with_work() {
        let before = CpuTimes::now();
        let began = Instant::now();
        let mut x = 1u64;
        // Spin (mostly user-mode arithmetic, a /proc read now and then) until the kernel's
        // tick-granular accounting has seen at least 50 ms of user time.
        while CpuTimes::now().since(before).user_s < 0.05 {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "no user CPU time seen"
            );
        }
        assert_ne!(x, 0);
        assert!(CpuTimes::now().since(before).total_s() >= 0.05);
    }

    #[test]
    fn counters_sum() {
        let c = counters(3);
        c[0].set(5);
        c[2].set(7);
        assert_eq!(sum(&c), 12);
    }
}
