//! The checklist `lanes doctor` prints: one line per check with a verdict, one sentence of what
//! was found and, for WARN and FAIL, what to do; the same checks as JSON for `--json`.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    Ok,
    Warn,
    Fail,
}

impl Verdict {
    pub fn label(self) -> &'static str {
        match self {
            Verdict::Ok => "OK",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
        }
    }
}

/// One line of the checklist.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Short stable name, such as `portal 10.0.0.1:3260 reachable`.
    pub name: String,
    pub verdict: Verdict,
    /// What was found, one sentence.
    pub detail: String,
    /// What to do (empty for OK).
    pub fix: String,
    /// Numbers behind the verdict (MB/s, milliseconds, bytes), for `--json`.
    pub measurements: Map<String, Value>,
}

impl Check {
    pub fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check::new(name, Verdict::Ok, detail, "")
    }

    pub fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::new(name, Verdict::Warn, detail, fix)
    }

    pub fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check::new(name, Verdict::Fail, detail, fix)
    }

    fn new(
        name: impl Into<String>,
        verdict: Verdict,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name: name.into(),
            verdict,
            detail: detail.into(),
            fix: fix.into(),
            measurements: Map::new(),
        }
    }

    /// Adds one measurement (builder style).
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Check {
        self.measurements.insert(key.to_string(), value.into());
        self
    }

    /// The checklist line: `[WARN] name: detail Fix: what to do.`
    pub fn line(&self) -> String {
        let mut line = format!(
            "[{:<4}] {}: {}",
            self.verdict.label(),
            self.name,
            self.detail
        );
        if self.verdict != Verdict::Ok && !self.fix.is_empty() {
            let _ = write!(line, " Fix: {}", self.fix);
        }
        line
    }

    pub fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "verdict": self.verdict.label(),
            "detail": self.detail,
            "fix": self.fix,
            "measurements": Value::Object(self.measurements.clone()),
        })
    }
}

/// Every check of a run, in the order they were made.
#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn push(&mut self, check: Check) {
        self.checks.push(check);
    }

    pub fn count(&self, verdict: Verdict) -> usize {
        self.checks.iter().filter(|c| c.verdict == verdict).count()
    }

    /// The closing line: how many checks passed, warned and failed.
    pub fn summary(&self) -> String {
        format!(
            "{} OK, {} WARN, {} FAIL",
            self.count(Verdict::Ok),
            self.count(Verdict::Warn),
            self.count(Verdict::Fail)
        )
    }

    pub fn checks_json(&self) -> Value {
        Value::Array(self.checks.iter().map(Check::to_json).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_carry_the_fix_only_when_something_is_wrong() {
        let ok = Check::ok("portal a", "reachable").with("rtt_ms", 0.1);
        assert_eq!(ok.line(), "[OK  ] portal a: reachable");
        let warn = Check::warn("mtu", "paths differ.", "set 9000 everywhere.");
        assert_eq!(
            warn.line(),
            "[WARN] mtu: paths differ. Fix: set 9000 everywhere."
        );
        let mut r = Report::default();
        r.push(ok.clone());
        r.push(warn);
        r.push(Check::fail("x", "y", "z"));
        assert_eq!(r.summary(), "1 OK, 1 WARN, 1 FAIL");
        let j = r.checks_json();
        assert_eq!(j[0]["measurements"]["rtt_ms"], 0.1);
        assert_eq!(j[2]["verdict"], "FAIL");
    }
}
