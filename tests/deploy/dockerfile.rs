//! A small Dockerfile reader: enough to check what the Dockerfile refers to.

use std::collections::BTreeMap;

/// One instruction, continuation lines joined, comments dropped.
#[derive(Debug, Clone)]
pub struct Instruction {
    pub line: usize,
    pub keyword: String,
    pub args: String,
}

pub fn parse(text: &str) -> Vec<Instruction> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        if current.is_none() && (trimmed.is_empty() || trimmed.starts_with('#')) {
            continue;
        }
        if current.is_some() && trimmed.starts_with('#') {
            continue;
        }
        let (start, mut buf) = current.take().unwrap_or((i + 1, String::new()));
        if let Some(body) = trimmed.strip_suffix('\\') {
            buf.push_str(body);
            buf.push(' ');
            current = Some((start, buf));
            continue;
        }
        buf.push_str(trimmed);
        let (keyword, args) = buf.split_once(char::is_whitespace).unwrap_or((&buf, ""));
        out.push(Instruction {
            line: start,
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_owned(),
        });
    }
    out
}

/// A build stage.
#[derive(Debug, Clone, Default)]
pub struct Stage {
    pub line: usize,
    pub name: Option<String>,
    /// The image, with global ARGs substituted.
    pub image: String,
    pub instructions: Vec<Instruction>,
}

/// The global ARG defaults (before the first FROM) and the stages.
pub fn stages(instructions: &[Instruction]) -> (BTreeMap<String, String>, Vec<Stage>) {
    let mut args = BTreeMap::new();
    let mut stages: Vec<Stage> = Vec::new();
    for ins in instructions {
        match ins.keyword.as_str() {
            "ARG" if stages.is_empty() => {
                if let Some((k, v)) = ins.args.split_once('=') {
                    args.insert(k.trim().to_owned(), v.trim().trim_matches('"').to_owned());
                }
            }
            "FROM" => {
                let words: Vec<_> = ins
                    .args
                    .split_whitespace()
                    .filter(|w| !w.starts_with("--"))
                    .collect();
                let image = substitute(words.first().copied().unwrap_or(""), &args);
                let name = match words.as_slice() {
                    [_, as_kw, name] if as_kw.eq_ignore_ascii_case("as") => {
                        Some((*name).to_owned())
                    }
                    _ => None,
                };
                stages.push(Stage {
                    line: ins.line,
                    name,
                    image,
                    instructions: Vec::new(),
                });
            }
            _ => {
                if let Some(stage) = stages.last_mut() {
                    stage.instructions.push(ins.clone());
                }
            }
        }
    }
    (args, stages)
}

/// `${NAME}` and `$NAME` from `args`.
pub fn substitute(text: &str, args: &BTreeMap<String, String>) -> String {
    let mut out = text.to_owned();
    for (k, v) in args {
        out = out.replace(&format!("${{{k}}}"), v);
        out = out.replace(&format!("${k}"), v);
    }
    out
}

/// A COPY/ADD: its `--from`, sources and destination.
#[derive(Debug, Clone)]
pub struct Copy {
    pub line: usize,
    pub from: Option<String>,
    pub sources: Vec<String>,
    pub dest: String,
}

pub fn copies(stage: &Stage) -> Vec<Copy> {
    stage
        .instructions
        .iter()
        .filter(|i| i.keyword == "COPY" || i.keyword == "ADD")
        .map(|i| {
            let mut from = None;
            let mut paths = Vec::new();
            for word in i.args.split_whitespace() {
                if let Some(f) = word.strip_prefix("--from=") {
                    from = Some(f.to_owned());
                } else if !word.starts_with("--") {
                    paths.push(word.to_owned());
                }
            }
            let dest = paths.pop().unwrap_or_default();
            Copy {
                line: i.line,
                from,
                sources: paths,
                dest,
            }
        })
        .collect()
}

/// The uid of a `USER` value (`65532`, `65532:65532`), None for a name.
pub fn numeric_uid(user: &str) -> Option<u32> {
    user.split(':').next()?.parse().ok()
}

/// `major.minor[.patch]` → comparable triple.
pub fn version(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = match parts.next() {
        Some(p) => p.parse().ok()?,
        None => 0,
    };
    Some((major, minor, patch))
}

/// Is `path` (relative to the build context) excluded by a .dockerignore
/// pattern? Plain patterns only (a directory or file, optionally with a
/// trailing `/`); glob patterns are matched by their literal suffix (`**/*.x`).
pub fn ignored(path: &str, patterns: &[String]) -> Option<String> {
    let path = path.trim_start_matches("./").trim_end_matches('/');
    patterns
        .iter()
        .find(|p| {
            let p = p.trim_start_matches('/').trim_end_matches('/');
            if let Some(suffix) = p.strip_prefix("**/*") {
                path.ends_with(suffix)
            } else if p.contains('*') {
                false
            } else {
                !p.is_empty() && (path == p || path.starts_with(&format!("{p}/")))
            }
        })
        .cloned()
}
