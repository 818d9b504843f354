//! The upstream storage e2e suite (`e2e.test` of the node folder, its
//! "External Storage" suite) against `deploy/` on the real node, with the
//! driver definition `tests/e2e/csi-hostpath.yaml`.
//!
//! By default the real-node test runs the specs pinned in
//! `tests/e2e/pinned.txt` (specs that pass with the Go sidecar's image) with
//! our image, and fails when one of them does not pass. With
//! `REAL_NODE_E2E=full` it runs the whole selection (focus
//! [`FOCUS`], skip [`SKIP`]) and then the snapshot specs ([`SNAPSHOTS`];
//! `REAL_NODE_E2E=snapshots` those alone) once with our image and once with
//! the Go image, and only prints the counts (deploy/README.md, section "The upstream storage e2e suite", has
//! the table).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use controlplane::ControlPlane;
use controlplane::node::Node;

/// Chooses the run: unset for the pinned specs, `full` for the selection.
pub const MODE_VAR: &str = "REAL_NODE_E2E";
pub const FOCUS: &str = r"External.Storage";
/// The node folder's README.md, section "e2e.test": the selection that
/// runs on one node without SSH. Snapshot specs carry `[Feature:`, and run
/// as [`SNAPSHOTS`].
pub const SKIP: &str = r"Disruptive|Serial|Slow|\[Feature:|disruptive|LinuxOnly.*Windows";

/// The snapshot specs (the snapshot CRDs and snapshot-controller run beside
/// the control plane, deploy/kubernetes/snapshotter in the controller pod):
/// focus and skip. Not the Windows ones, nor volume group snapshots and
/// snapshot metadata, which the driver does not have.
pub const SNAPSHOTS: (&str, &str) = (
    r"External.Storage.*\[Feature:VolumeSnapshotDataSource\]",
    r"Disruptive|Serial|Slow|disruptive|Feature:Windows",
);

/// The skip of a pinned run: its focus names each spec, and nothing
/// pinned may need SSH to the node.
pub const PINNED_SKIP: &str = r"Disruptive|Serial|Slow|disruptive";

/// What `REAL_NODE_E2E` runs instead of the flows: `full` the whole
/// selection and then the snapshot specs, `snapshots` only those; either
/// with both images, or with `-rs` ours, `-go` the Go image's. `None` for
/// the default run (the pinned specs).
pub fn full() -> Option<Full> {
    let value = std::env::var(MODE_VAR).ok()?;
    if value.is_empty() {
        return None;
    }
    let (selection, only) = match value.rsplit_once('-') {
        Some((selection, "rs")) => (selection, Some("rs")),
        Some((selection, "go")) => (selection, Some("go")),
        _ => (value.as_str(), None),
    };
    let runs = match selection {
        "full" => vec![("", FOCUS, SKIP), ("-snapshots", SNAPSHOTS.0, SNAPSHOTS.1)],
        "snapshots" => vec![("-snapshots", SNAPSHOTS.0, SNAPSHOTS.1)],
        _ => panic!("{MODE_VAR}={value}: expected full or snapshots, alone or with -rs or -go"),
    };
    Some(Full { only, runs })
}

/// The flows (`rs`, `go`) a full run covers (`only`: `None` for both), and
/// its `e2e.test` runs: a report folder suffix, focus and skip each.
pub struct Full {
    only: Option<&'static str>,
    pub runs: Vec<(&'static str, &'static str, &'static str)>,
}

impl Full {
    pub fn includes(&self, flow: &str) -> bool {
        self.only.is_none_or(|only| only == flow)
    }
}

/// What one run reports (its JUnit file).
#[derive(Debug, Default)]
pub struct Outcome {
    pub passed: Vec<String>,
    pub failed: Vec<(String, String)>,
    /// The External Storage specs not run: filtered out by [`SKIP`] or
    /// skipped by the suite for a capability the driver lacks.
    pub skipped: usize,
    pub took: Duration,
    pub junit: PathBuf,
}

impl Outcome {
    pub fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped in {:?} ({})",
            self.passed.len(),
            self.failed.len(),
            self.skipped,
            self.took,
            self.junit.display()
        )
    }
}

/// The pinned spec names (`tests/e2e/pinned.txt`, one a line, `#`
/// comments).
pub fn pinned(workspace: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(workspace.join("tests/e2e/pinned.txt"))
        .expect("tests/e2e/pinned.txt");
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// A focus matching exactly the given spec names.
pub fn focus_of(names: &[String]) -> String {
    let escaped: Vec<String> = names
        .iter()
        .map(|n| {
            let mut out = String::new();
            for c in n.chars() {
                if "\\.+*?()|[]{}^$".contains(c) {
                    out.push('\\');
                }
                out.push(c);
            }
            format!("{out}$")
        })
        .collect();
    escaped.join("|")
}

/// Runs `e2e.test` with `focus` and `skip` into `out` (its JUnit and
/// log), against the driver deploy/ runs now.
pub fn run(
    plane: &ControlPlane,
    node: &Node,
    workspace: &Path,
    out: &Path,
    focus: &str,
    skip: &str,
) -> Outcome {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).expect("e2e report folder");
    let log = std::fs::File::create(out.join("e2e.log")).expect("e2e log");
    let started = Instant::now();
    let status = Command::new(node.bin("e2e.test"))
        .arg(format!(
            "--kubeconfig={}",
            plane.admin_kubeconfig().display()
        ))
        .arg("--provider=local")
        .arg(format!(
            "-storage.testdriver={}",
            workspace.join("tests/e2e/csi-hostpath.yaml").display()
        ))
        // The suite's pods and the hostexec checks look below the kubelet's
        // root, which is not /var/lib/kubelet on this node.
        .arg(format!(
            "--kubelet-root-dir={}",
            node.kubelet_root().display()
        ))
        .arg(format!("--ginkgo.focus={focus}"))
        .arg(format!("--ginkgo.skip={skip}"))
        .arg("--ginkgo.no-color")
        .arg(format!("--report-dir={}", out.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("e2e log"))
        .stderr(log)
        .status()
        .expect("run e2e.test");
    let took = started.elapsed();
    let junit = out.join("junit_01.xml");
    let text = std::fs::read_to_string(&junit).unwrap_or_else(|e| {
        panic!(
            "e2e.test ({status}) wrote no {}: {e}; see {}",
            junit.display(),
            out.join("e2e.log").display()
        )
    });
    let mut outcome = parse_junit(&text);
    outcome.took = took;
    outcome.junit = junit;
    outcome
}

/// The test cases of a Ginkgo JUnit report: `<testcase name=".." ...
/// status="passed|failed|skipped|pending">`, a failure's message in its
/// `<failure message="..">`.
pub fn parse_junit(text: &str) -> Outcome {
    let mut outcome = Outcome::default();
    for case in text.split("<testcase ").skip(1) {
        let head = case.split('>').next().unwrap_or_default();
        let name = attribute(head, "name");
        // Ginkgo's own suite-level nodes (BeforeSuite, ...) are cases too.
        let Some(name) = name.strip_prefix("[It] ") else {
            continue;
        };
        let name = name.to_owned();
        match attribute(head, "status").as_str() {
            "passed" => outcome.passed.push(name),
            "failed" | "panicked" | "interrupted" | "aborted" | "timedout" => {
                let message = case
                    .split("<failure ")
                    .nth(1)
                    .map(|f| attribute(f.split('>').next().unwrap_or_default(), "message"))
                    .unwrap_or_default();
                outcome.failed.push((name, message));
            }
            // Every spec of the binary is a case, most filtered out by the
            // focus: only the suite's own count as skipped.
            _ if name.starts_with("External Storage ") => outcome.skipped += 1,
            _ => {}
        }
    }
    outcome
}

fn attribute(head: &str, key: &str) -> String {
    let needle = format!(" {key}=\"");
    let Some(start) = format!(" {head}").find(&needle) else {
        return String::new();
    };
    let rest = &format!(" {head}")[start + needle.len()..];
    let value = rest.split('"').next().unwrap_or_default();
    value
        .replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#xA;", "\n")
        .replace("&amp;", "&")
}
