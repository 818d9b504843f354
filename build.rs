//! Embeds the version `--version` prints and the start-up log names: the
//! crate version and the commit it was built from,
//! `v0.1.0 (git 3dd1527)`. (The Go image's release tooling stamps `git
//! describe` alone, `csi-provisioner v6.3.0-56-g0688604fa`; ours has a
//! version of its own besides the commit.) The commit is:
//!
//! 1. `CSI_PROVISIONER_GIT_COMMIT`, when set and not empty: for builds
//!    that have no repository (the Dockerfile's build argument of that
//!    name; its context leaves `.git` out);
//! 2. else `git describe --always --dirty --exclude=*` of this checkout:
//!    the short commit, `-dirty` when the tree had changes;
//! 3. else none: `v0.1.0` alone (no git, or not a checkout).
//!
//! The script runs again only when the override changes or the commit
//! does (`HEAD`, the branch it points to, `packed-refs`), not at every
//! build: a `-dirty` suffix is as of the last commit change, not of the
//! last edit.

use std::path::{Path, PathBuf};
use std::process::Command;

const OVERRIDE: &str = "CSI_PROVISIONER_GIT_COMMIT";

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_owned())
}

/// Asks Cargo to run this script again when `path` changes; only for a
/// path that exists, as Cargo reruns every time for a missing one.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// Watches what moves when the commit changes: `HEAD`, the branch it
/// names (in the common directory of a worktree) and `packed-refs`.
fn watch_commit(manifest: &Path) {
    let absolute = |p: String| {
        let p = PathBuf::from(p);
        if p.is_absolute() { p } else { manifest.join(p) }
    };
    let Some(git_dir) = git(manifest, &["rev-parse", "--git-dir"]).map(absolute) else {
        return;
    };
    let common = git(manifest, &["rev-parse", "--git-common-dir"])
        .map(absolute)
        .unwrap_or_else(|| git_dir.clone());
    let head = git_dir.join("HEAD");
    watch(&head);
    if let Some(branch) = std::fs::read_to_string(&head)
        .ok()
        .and_then(|h| h.trim().strip_prefix("ref: ").map(str::to_owned))
    {
        watch(&git_dir.join(&branch));
        if common != git_dir {
            watch(&common.join(&branch));
        }
    }
    watch(&common.join("packed-refs"));
}

fn main() {
    println!("cargo:rerun-if-env-changed={OVERRIDE}");
    println!("cargo:rerun-if-changed=build.rs");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default());
    watch_commit(&manifest);
    let commit = std::env::var(OVERRIDE)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .or_else(|| {
            git(
                &manifest,
                &["describe", "--always", "--dirty", "--exclude=*"],
            )
        });
    let crate_version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let version = match commit {
        Some(commit) => format!("v{crate_version} (git {commit})"),
        None => format!("v{crate_version}"),
    };
    println!("cargo:rustc-env=CSI_PROVISIONER_BUILD_VERSION={version}");
}
