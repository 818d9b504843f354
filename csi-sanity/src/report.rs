//! Results of a run: the per-check lines, the summary and the JUnit report.

use std::fmt::Write as _;
use std::time::Duration;

/// How one check ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    Skip(String),
}

impl Outcome {
    pub fn is_pass(&self) -> bool {
        matches!(self, Self::Pass)
    }
    pub fn is_fail(&self) -> bool {
        matches!(self, Self::Fail(_))
    }
    pub fn is_skip(&self) -> bool {
        matches!(self, Self::Skip(_))
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    pub name: String,
    pub outcome: Outcome,
    pub duration: Duration,
}

impl CheckResult {
    /// The line printed for this check: `PASS name`, `FAIL name: reason` or
    /// `SKIP name: reason`, always a single line.
    pub fn line(&self) -> String {
        match &self.outcome {
            Outcome::Pass => format!("PASS {}", self.name),
            Outcome::Fail(reason) => format!("FAIL {}: {}", self.name, one_line(reason)),
            Outcome::Skip(reason) => format!("SKIP {}: {}", self.name, one_line(reason)),
        }
    }
}

fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        out.push_str(line.trim_end());
    }
    out
}

/// All results of a run, in the order the checks ran.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub results: Vec<CheckResult>,
}

impl Report {
    pub fn passed(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_pass()).count()
    }
    pub fn failed(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_fail()).count()
    }
    pub fn skipped(&self) -> usize {
        self.results.iter().filter(|r| r.outcome.is_skip()).count()
    }

    /// `N passed, N failed, N skipped`.
    pub fn summary_line(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed(),
            self.failed(),
            self.skipped()
        )
    }

    /// The result of the check with exactly this name.
    pub fn get(&self, name: &str) -> Option<&CheckResult> {
        self.results.iter().find(|r| r.name == name)
    }

    /// The process exit code for this report: 1 when anything failed.
    pub fn exit_code(&self) -> i32 {
        if self.failed() > 0 { 1 } else { 0 }
    }

    /// A JUnit XML document in the layout Ginkgo's reporter writes (one
    /// `testsuite`, one `testcase` per check, `failure` and `skipped`
    /// children), which CI systems read.
    pub fn junit_xml(&self, suite_name: &str) -> String {
        let total: Duration = self.results.iter().map(|r| r.duration).sum();
        let mut xml = String::new();
        xml.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            xml,
            "<testsuites tests=\"{}\" failures=\"{}\" skipped=\"{}\" errors=\"0\" time=\"{:.3}\">",
            self.results.len(),
            self.failed(),
            self.skipped(),
            total.as_secs_f64()
        );
        let _ = writeln!(
            xml,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" errors=\"0\" time=\"{:.3}\">",
            escape(suite_name),
            self.results.len(),
            self.failed(),
            self.skipped(),
            total.as_secs_f64()
        );
        for r in &self.results {
            let classname = classname(&r.name);
            let head = format!(
                "    <testcase name=\"{}\" classname=\"{}\" time=\"{:.3}\"",
                escape(&r.name),
                escape(classname),
                r.duration.as_secs_f64()
            );
            match &r.outcome {
                Outcome::Pass => {
                    let _ = writeln!(xml, "{head}/>");
                }
                Outcome::Fail(reason) => {
                    let _ = writeln!(xml, "{head}>");
                    let _ = writeln!(
                        xml,
                        "      <failure message=\"{}\" type=\"failed\">{}</failure>",
                        escape(&one_line(reason)),
                        escape(reason)
                    );
                    let _ = writeln!(xml, "    </testcase>");
                }
                Outcome::Skip(reason) => {
                    let _ = writeln!(xml, "{head}>");
                    let _ = writeln!(
                        xml,
                        "      <skipped message=\"{}\"/>",
                        escape(&one_line(reason))
                    );
                    let _ = writeln!(xml, "    </testcase>");
                }
            }
        }
        xml.push_str("  </testsuite>\n</testsuites>\n");
        xml
    }
}

/// The first component of a hierarchical check name (`Controller Service`,
/// `Node Service`, `CreateSnapshot [Controller Server]`, ...).
fn classname(name: &str) -> &str {
    if let Some(end) = name.find(']') {
        return &name[..=end];
    }
    let mut words = name.splitn(3, ' ');
    match (words.next(), words.next()) {
        (Some(a), Some(b)) => &name[..a.len() + 1 + b.len()],
        _ => name,
    }
}

/// Escapes text for XML attribute values and character data, dropping
/// characters XML 1.0 cannot carry.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c if (c as u32) < 0x20 => {}
            '\u{FFFE}' | '\u{FFFF}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            results: vec![
                CheckResult {
                    name: "Identity Service Probe should return appropriate information".into(),
                    outcome: Outcome::Pass,
                    duration: Duration::from_millis(5),
                },
                CheckResult {
                    name: "Controller Service CreateVolume should fail when no name is provided"
                        .into(),
                    outcome: Outcome::Fail(
                        "CreateVolume returned OK <want> \"INVALID\"\nsecond".into(),
                    ),
                    duration: Duration::from_millis(7),
                },
                CheckResult {
                    name: "ListSnapshots [Controller Server] should return x".into(),
                    outcome: Outcome::Skip("driver does not advertise LIST_SNAPSHOTS".into()),
                    duration: Duration::ZERO,
                },
            ],
        }
    }

    #[test]
    fn lines_and_summary() {
        let r = sample();
        assert_eq!(
            r.results[1].line(),
            "FAIL Controller Service CreateVolume should fail when no name is provided: \
             CreateVolume returned OK <want> \"INVALID\" | second"
        );
        assert_eq!(r.summary_line(), "1 passed, 1 failed, 1 skipped");
        assert_eq!(r.exit_code(), 1);
        assert_eq!(Report::default().exit_code(), 0);
    }

    #[test]
    fn junit() {
        let xml = sample().junit_xml("CSI Driver Test Suite");
        assert!(xml.contains("tests=\"3\" failures=\"1\" skipped=\"1\""));
        assert!(xml.contains("classname=\"Controller Service\""));
        assert!(xml.contains("classname=\"ListSnapshots [Controller Server]\""));
        assert!(xml.contains("&lt;want&gt; &quot;INVALID&quot;"));
        assert!(xml.contains("<skipped message=\"driver does not advertise LIST_SNAPSHOTS\"/>"));
        // Balanced elements.
        assert_eq!(xml.matches("<testcase ").count(), 3);
        assert_eq!(xml.matches("</testcase>").count(), 2);
        assert_eq!(escape("a\u{1}b"), "ab");
    }
}
