//! The documentation stays true to the code and to itself:
//!
//! - the flag reference of `docs/operations.md` is the binary's `--help`;
//! - every relative link of `README.md`, `docs/*.md` and `deploy/README.md`
//!   reaches a file of the repository, and a heading of it for a `#anchor`
//!   into a markdown file (GitHub's slugs);
//! - `README.md` stays short enough to read in five minutes (300 lines);
//! - the README's two commands are the ones CI runs (`.ci/run`), the quick
//!   start's script exists, and the tools those scripts look for are among
//!   the README's prerequisites.
//!
//! Each check is a function of the files' text, so the tests at the end run
//! it once against a broken copy and show that it can fail.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};
use std::process::Command;

const README_MAX_LINES: usize = 300;
const HELP_START: &str = "<!-- help:start -->\n```\n";
const HELP_END: &str = "\n```\n<!-- help:end -->";
const COMMANDS_START: &str = "<!-- commands:start -->";
const COMMANDS_END: &str = "<!-- commands:end -->";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The markdown files whose links are checked: README.md, docs/*.md and
/// deploy/README.md.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("deploy/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

fn fail_if_any(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// ---- the help block ---------------------------------------------------------

/// Why the help block of `markdown` is not `help`, if it is not.
fn help_block_problem(markdown: &str, help: &str) -> Option<String> {
    let Some(section) = markdown
        .split(HELP_START)
        .nth(1)
        .and_then(|rest| rest.split(HELP_END).next())
    else {
        return Some("no <!-- help:start --> / <!-- help:end --> block".into());
    };
    let (section, help) = (section.trim_end(), help.trim_end());
    if section == help {
        return None;
    }
    let first = section
        .lines()
        .zip(help.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| section.lines().count().min(help.lines().count()));
    Some(format!(
        "the help block differs from `csi-provisioner --help` from line {} on \
         (documented: {:?}, binary: {:?}); paste the output of `csi-provisioner --help`",
        first + 1,
        section.lines().nth(first).unwrap_or("<end>"),
        help.lines().nth(first).unwrap_or("<end>"),
    ))
}

fn binary_help() -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg("--help")
        .output()
        .expect("run csi-provisioner --help");
    assert!(output.status.success(), "csi-provisioner --help failed");
    String::from_utf8(output.stdout).expect("utf-8 help")
}

#[test]
fn operations_command_line_reference_matches_help() {
    let operations = read(&repo().join("docs/operations.md"));
    if let Some(problem) = help_block_problem(&operations, &binary_help()) {
        panic!("docs/operations.md, \"Command line reference\": {problem}");
    }
}

// ---- links --------------------------------------------------------------------

/// The lines of `markdown` outside fenced code blocks, with their numbers
/// (from 1).
fn prose_lines(markdown: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<(char, usize)> = None;
    let mut out = Vec::new();
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = trimmed.chars().next().filter(|c| *c == '`' || *c == '~');
        if let Some(c) = marker {
            let run = trimmed.chars().take_while(|x| *x == c).count();
            if run >= 3 {
                match fence {
                    None => fence = Some((c, run)),
                    Some((open, len)) if open == c && run >= len => fence = None,
                    Some(_) => {}
                }
                continue;
            }
        }
        if fence.is_none() {
            out.push((i + 1, line));
        }
    }
    out
}

/// `text` without its code spans (`` `…` ``), whose content is not markdown.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        // The closing run: the next run of exactly the same length.
        let mut j = i + run;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let other = chars[j..].iter().take_while(|c| **c == '`').count();
                if other == run {
                    close = Some(j + other);
                    break;
                }
                j += other;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => i = end,
            None => {
                out.extend(&chars[i..i + run]);
                i += run;
            }
        }
    }
    out
}

/// The text a heading shows: code spans keep their content, links their text.
fn heading_text(raw: &str) -> String {
    let mut text = raw.replace('`', "");
    // [text](target) -> text
    while let Some(open) = text.find("](") {
        let Some(start) = text[..open].rfind('[') else {
            break;
        };
        let Some(close) = text[open..].find(')') else {
            break;
        };
        let label = text[start + 1..open].to_owned();
        text.replace_range(start..open + close + 1, &label);
    }
    text
}

/// GitHub's anchor for a heading: lowercase; letters, digits, `-` and `_`
/// kept; spaces become `-`; everything else dropped.
fn slug(heading: &str) -> String {
    heading_text(heading)
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// Every anchor of `markdown`'s headings, repeated ones numbered as GitHub
/// numbers them (`name`, `name-1`, …).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(markdown) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let text = line[hashes..].trim().trim_end_matches('#').trim_end();
        let base = slug(text);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets of `markdown` outside code: inline links and images
/// (`[text](target "title")`) and reference definitions (`[name]: target`),
/// with their line numbers.
fn link_targets(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (number, line) in prose_lines(markdown) {
        let line = without_code_spans(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(end) = trimmed.find("]:")
            && !trimmed[1..end].contains(']')
        {
            if let Some(target) = trimmed[end + 2..].split_whitespace().next() {
                out.push((number, target.to_owned()));
            }
            continue;
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let target = match after.strip_prefix('<') {
                Some(angled) => angled.split('>').next().unwrap_or_default(),
                None => after
                    .split(|c: char| c == ')' || c.is_whitespace())
                    .next()
                    .unwrap_or_default(),
            };
            out.push((number, target.to_owned()));
            rest = after;
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.starts_with("//")
        || target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphabetic())
        })
}

/// `path` with `.` and `..` resolved without touching the file system;
/// `None` when it climbs above its first component.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    Some(out)
}

/// What is wrong with the relative links of `files` (paths under `root`).
fn link_problems(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut anchor_cache: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let name = file
            .strip_prefix(root)
            .unwrap_or(file)
            .display()
            .to_string();
        let text = read(file);
        let dir = file
            .strip_prefix(root)
            .unwrap_or(file)
            .parent()
            .unwrap_or(Path::new(""));
        for (line, target) in link_targets(&text) {
            if is_external(&target) {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let path = path.replace("%20", " ");
            let relative = if path.is_empty() {
                file.strip_prefix(root).unwrap_or(file).to_path_buf()
            } else if let Some(absolute) = path.strip_prefix('/') {
                PathBuf::from(absolute)
            } else {
                dir.join(&path)
            };
            let Some(relative) = normalize(&relative) else {
                problems.push(format!(
                    "{name}:{line}: {target} points outside the repository"
                ));
                continue;
            };
            let resolved = root.join(&relative);
            if !resolved.exists() {
                problems.push(format!(
                    "{name}:{line}: {target}: no such file or folder {}",
                    relative.display()
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if resolved.extension().is_some_and(|ext| ext == "md") && resolved.is_file() {
                let known = anchor_cache
                    .entry(resolved.clone())
                    .or_insert_with(|| anchors(&read(&resolved)));
                if !known.contains(anchor) {
                    problems.push(format!(
                        "{name}:{line}: {target}: {} has no heading with the anchor #{anchor}",
                        relative.display()
                    ));
                }
            } else if !is_line_anchor(anchor) {
                problems.push(format!(
                    "{name}:{line}: {target}: #{anchor} is neither a heading of a markdown file \
                     nor a line anchor (#L10, #L10-L20)"
                ));
            }
        }
    }
    problems
}

fn is_line_anchor(anchor: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    match anchor.split_once('-') {
        Some((a, b)) => {
            a.strip_prefix('L').is_some_and(digits) && b.strip_prefix('L').is_some_and(digits)
        }
        None => anchor.strip_prefix('L').is_some_and(digits),
    }
}

#[test]
fn relative_links_reach_files_and_headings() {
    let root = repo();
    let files = documents(&root);
    fail_if_any("broken relative links", &link_problems(&root, &files));
}

// ---- length -------------------------------------------------------------------

fn length_problem(readme: &str) -> Option<String> {
    let lines = readme.lines().count();
    (lines > README_MAX_LINES).then(|| {
        format!(
            "README.md has {lines} lines, more than {README_MAX_LINES}: move detail to \
             docs/operations.md, docs/design.md or docs/benchmarks.md"
        )
    })
}

#[test]
fn readme_is_at_most_300_lines() {
    if let Some(problem) = length_problem(&read(&repo().join("README.md"))) {
        panic!("{problem}");
    }
}

// ---- the two commands -------------------------------------------------------

/// The commands of the README's fenced blocks between the commands markers.
fn readme_commands(readme: &str) -> Result<Vec<String>, String> {
    let block = readme
        .split(COMMANDS_START)
        .nth(1)
        .and_then(|rest| rest.split(COMMANDS_END).next())
        .ok_or(format!(
            "README.md has no {COMMANDS_START} … {COMMANDS_END} block"
        ))?;
    let mut commands = Vec::new();
    let mut in_fence = false;
    for line in block.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if in_fence && !line.trim().is_empty() {
            commands.push(line.trim().to_owned());
        }
    }
    Ok(commands)
}

/// The lines of a shell script that are commands (not comments or blank).
fn script_lines(script: &str) -> Vec<&str> {
    script
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

/// The tools a script looks for (`command -v NAME`) or runs (`python3 …`).
fn tools_of(script: &str) -> BTreeSet<String> {
    let mut tools = BTreeSet::new();
    for line in script_lines(script) {
        let mut rest = line;
        while let Some(at) = rest.find("command -v ") {
            rest = &rest[at + "command -v ".len()..];
            if let Some(name) = rest.split_whitespace().next() {
                tools.insert(name.trim_matches(|c| c == '"' || c == '\'').to_owned());
            }
        }
        if line.starts_with("python3 ") {
            tools.insert("python3".to_owned());
        }
    }
    tools
}

/// The README's section `## {title}`, up to the next `## `.
fn section<'a>(markdown: &'a str, title: &str) -> Option<&'a str> {
    let start = markdown.find(&format!("\n## {title}\n"))? + 1;
    let body = &markdown[start..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 3);
    Some(&body[..end])
}

/// The files the commands check reads, by their path in the repository.
struct CommandFiles {
    readme: String,
    ci_run: String,
    cargo_toml: String,
    /// `bash PATH` commands of the README: PATH and the script's text
    /// (`None` when there is no such file).
    scripts: BTreeMap<String, Option<String>>,
}

impl CommandFiles {
    fn read_from(root: &Path) -> CommandFiles {
        let readme = read(&root.join("README.md"));
        let scripts = readme_commands(&readme)
            .unwrap_or_default()
            .iter()
            .filter_map(|c| c.strip_prefix("bash "))
            .map(|path| {
                let text = std::fs::read_to_string(root.join(path)).ok();
                (path.to_owned(), text)
            })
            .collect();
        CommandFiles {
            readme,
            ci_run: read(&root.join(".ci/run")),
            cargo_toml: read(&root.join("Cargo.toml")),
            scripts,
        }
    }
}

fn command_problems(files: &CommandFiles) -> Vec<String> {
    let mut problems = Vec::new();
    let commands = match readme_commands(&files.readme) {
        Ok(commands) => commands,
        Err(e) => return vec![e],
    };
    if commands.len() != 2 {
        problems.push(format!(
            "README.md: expected the two commands (quick start, whole test suite) between the \
             markers, found {commands:?}"
        ));
    }
    let ci = script_lines(&files.ci_run);
    // A line runs a command when it is the command, or the command followed
    // by shell plumbing (`cargo test … || tests_rc=$?` keeps CI going to
    // collect the benchmark's result before it fails).
    let runs = |line: &str, command: &str| {
        line == command
            || line.strip_prefix(command).is_some_and(|rest| {
                let rest = rest.trim_start();
                rest.len() < line.len() - command.len()
                    && ["||", "&&", "|", ";"].iter().any(|op| rest.starts_with(op))
            })
    };
    for command in &commands {
        if !ci.iter().any(|line| runs(line, command)) {
            problems.push(format!(
                "README.md's command `{command}` is not a command of .ci/run, which CI runs"
            ));
        }
    }
    if !commands.iter().any(|c| c.starts_with("cargo test ")) {
        problems.push("README.md: no `cargo test …` command between the markers".into());
    }
    let last_cargo = ci.iter().rev().find(|l| l.starts_with("cargo "));
    if !last_cargo
        .zip(commands.last())
        .is_some_and(|(line, command)| runs(line, command))
    {
        problems.push(format!(
            "README.md's last command {:?} is not the last cargo command of .ci/run",
            commands.last()
        ));
    }
    let prerequisites = section(&files.readme, "Prerequisites").unwrap_or_default();
    if prerequisites.is_empty() {
        problems.push("README.md has no \"## Prerequisites\" section".into());
    }
    let mut tools = tools_of(&files.ci_run);
    for (path, script) in &files.scripts {
        match script {
            Some(text) => tools.extend(tools_of(text)),
            None => problems.push(format!(
                "README.md runs `bash {path}`, which does not exist"
            )),
        }
    }
    for tool in tools {
        if !prerequisites.contains(&format!("`{tool}`")) {
            problems.push(format!(
                "README.md's prerequisites do not name `{tool}`, which .ci/run or the quick start \
                 looks for"
            ));
        }
    }
    let rust_version = files
        .cargo_toml
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_default();
    if rust_version.is_empty() || !prerequisites.contains(&format!("Rust {rust_version} or later"))
    {
        problems.push(format!(
            "README.md's prerequisites must say \"Rust {rust_version} or later\" (rust-version in \
             Cargo.toml)"
        ));
    }
    problems
}

#[test]
fn readme_commands_are_the_ones_ci_runs() {
    fail_if_any(
        "README.md's commands",
        &command_problems(&CommandFiles::read_from(&repo())),
    );
}

// ---- each check fails on a broken copy ----------------------------------------

#[test]
fn the_help_check_fails_on_a_changed_flag() {
    let operations = read(&repo().join("docs/operations.md"));
    let help = binary_help();
    let broken = operations.replace("--csi-address <PATH>", "--csi-adress <PATH>");
    assert!(
        broken != operations,
        "the copy must differ from docs/operations.md"
    );
    let problem = help_block_problem(&broken, &help).expect("a changed flag is found");
    assert!(problem.contains("--csi-adress"), "{problem}");
    let without_markers = operations.replace("<!-- help:start -->", "");
    assert!(help_block_problem(&without_markers, &help).is_some());
}

#[test]
fn the_length_check_fails_on_a_long_readme() {
    let readme = read(&repo().join("README.md"));
    let broken = format!("{readme}{}", "padding\n".repeat(README_MAX_LINES + 1));
    assert!(length_problem(&broken).is_some());
}

#[test]
fn the_command_check_fails_on_a_changed_command() {
    let good = CommandFiles::read_from(&repo());
    let broken = CommandFiles {
        readme: good
            .readme
            .replace("cargo test --workspace --locked", "cargo test --workspace"),
        ci_run: good.ci_run.clone(),
        cargo_toml: good.cargo_toml.clone(),
        scripts: good.scripts.clone(),
    };
    let problems = command_problems(&broken);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`cargo test --workspace`")),
        "{problems:?}"
    );
    // A quick start script that is gone, and a tool the prerequisites omit.
    let mut scripts = good.scripts.clone();
    for script in scripts.values_mut() {
        *script = None;
    }
    let broken = CommandFiles {
        readme: good.readme.replace("`python3`", "Python"),
        ci_run: good.ci_run.clone(),
        cargo_toml: good.cargo_toml.clone(),
        scripts,
    };
    let problems = command_problems(&broken);
    assert!(
        problems.iter().any(|p| p.contains("does not exist")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("`python3`")),
        "{problems:?}"
    );
}

#[test]
fn the_link_check_fails_on_broken_links() {
    let root = tempfile::tempdir().expect("temp dir");
    let root = root.path();
    std::fs::create_dir_all(root.join("docs")).expect("docs/");
    std::fs::create_dir_all(root.join("deploy")).expect("deploy/");
    std::fs::write(
        root.join("docs/guide.md"),
        "# Guide\n\n## Roll back to the Go image\n\n## Flags beyond the Go image's\n\n\
         ## Twice\n\n## Twice\n\n```\n## Not a heading\n```\n",
    )
    .expect("write");
    std::fs::write(root.join("deploy/README.md"), "# Deploy\n").expect("write");
    std::fs::write(root.join("LICENSE"), "").expect("write");
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n\
         [ok](docs/guide.md#roll-back-to-the-go-image) [ok](docs/guide.md#flags-beyond-the-go-images)\n\
         [ok](docs/guide.md#twice-1) [ok](#top) [ok](LICENSE) [ok](deploy/) [ok](https://example.com/x.md)\n\
         `[in code](missing-in-code.md)`\n\
         ```\n[in a fence](missing-in-fence.md)\n```\n\
         [gone](docs/missing.md)\n\
         [no anchor](docs/guide.md#not-a-heading)\n\
         [no anchor here](#nowhere)\n\
         [outside](../outside.md)\n\
         [ref]: docs/also-missing.md\n",
    )
    .expect("write");
    let files = documents(root);
    let problems = link_problems(root, &files);
    let expected = [
        "docs/missing.md",
        "#not-a-heading",
        "#nowhere",
        "../outside.md",
        "docs/also-missing.md",
    ];
    for broken in expected {
        assert!(
            problems.iter().any(|p| p.contains(broken)),
            "{broken} not found in {problems:#?}"
        );
    }
    assert_eq!(problems.len(), expected.len(), "{problems:#?}");
}

#[test]
fn slugs_follow_github() {
    let cases = [
        ("Quick start: two commands", "quick-start-two-commands"),
        ("1. Build the images", "1-build-the-images"),
        (
            "Flags and values beyond the Go image's",
            "flags-and-values-beyond-the-go-images",
        ),
        (
            "Memory at scale (`scale`), 2026-11-26, with projections",
            "memory-at-scale-scale-2026-11-26-with-projections",
        ),
        (
            "Claim metadata (gate `ClaimMetadataPropagation`)",
            "claim-metadata-gate-claimmetadatapropagation",
        ),
        (
            "Errors: final, non-final, retries",
            "errors-final-non-final-retries",
        ),
        (
            "A claim's path: from watch event to saved PV",
            "a-claims-path-from-watch-event-to-saved-pv",
        ),
        ("See [the guide](docs/x.md) — now", "see-the-guide--now"),
        (
            "`csi_sidecar_operations_seconds`",
            "csi_sidecar_operations_seconds",
        ),
    ];
    for (heading, want) in cases {
        assert_eq!(slug(heading), want, "{heading}");
    }
}
