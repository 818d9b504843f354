//! The top-level modules of a crate depend on each other without cycles: a
//! newcomer can read them bottom-up, and a module that imports "upward" is
//! caught here rather than in review.
//!
//! The module tree is walked from `src/lib.rs` along `mod` declarations
//! (with `#[path]`, and inline `mod x { ... }` blocks), so every file is
//! read as the module it is. In each, a path that starts with `crate::`
//! (`$crate::` in a macro) or with enough `super::` to reach the crate root
//! names a top-level module; grouped imports (`use crate::{a::X, b::Y}`)
//! name each. Every such reference from inside top-level module `A` to
//! another top-level module `B` is an edge `A → B`. A strongly connected
//! component of more than one module is a cycle; the test names its
//! modules, one path around it and the file and line of each edge.
//!
//! Code under `#[cfg(test)]` (a test module, inline or in its own file) is
//! left out: nothing imports a test module, so its imports cannot close a
//! cycle in the sidecar that is built, and a module's tests may well drive
//! it through a module above it (the metrics tests through a work queue).
//!
//! Cycles that are accepted are listed in [`ALLOWED`] with why; one listed
//! that no longer exists fails too, so the list does not outlive them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Cycles accepted, as the sorted set of their modules, per crate (the
/// directory of its `src/`, relative to this package), with why.
const ALLOWED: &[(&str, &[&str], &str)] = &[(
    // The runner calls the checks, and every check reports through the
    // runner's context (its client, its skip and fail helpers): one
    // conversation split over two modules for size. Parting them would mean
    // a third module for the context that only the two use.
    "csi-sanity",
    &["checks", "runner"],
    "a check reports through the runner's context; the runner calls the checks",
)];

#[test]
fn the_top_level_modules_of_the_sidecar_have_no_cycles() {
    check_crate("");
}

#[test]
fn the_top_level_modules_of_csi_sanity_have_no_cycles_but_the_allowed_one() {
    check_crate("csi-sanity");
}

fn check_crate(dir: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join("src");
    let graph = match Graph::of_crate(&root) {
        Ok(graph) => graph,
        Err(e) => panic!("{}: {e}", root.display()),
    };
    let allowed: BTreeSet<BTreeSet<String>> = ALLOWED
        .iter()
        .filter(|(krate, _, _)| *krate == dir)
        .map(|(_, modules, _)| modules.iter().map(|m| (*m).to_owned()).collect())
        .collect();
    let cycles = graph.cycles();
    let mut problems = Vec::new();
    for cycle in &cycles {
        if !allowed.contains(cycle) {
            problems.push(graph.describe(cycle));
        }
    }
    for stale in allowed.difference(&cycles.iter().cloned().collect()) {
        problems.push(format!(
            "ALLOWED lists the cycle {stale:?}, which no longer exists: remove it"
        ));
    }
    assert!(
        problems.is_empty(),
        "{}: import cycles between top-level modules (move what is in the wrong layer, \
         or list the cycle in ALLOWED of tests/module_cycles.rs with why):\n{}",
        root.display(),
        problems.join("\n")
    );
}

/// Edges between top-level modules, each with where it was seen first.
#[derive(Debug, Default)]
struct Graph {
    modules: BTreeSet<String>,
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

impl Graph {
    fn of_crate(src: &Path) -> Result<Graph, String> {
        let lib = src.join("lib.rs");
        let text = read(&lib)?;
        let tokens = lex(&text);
        let mut graph = Graph::default();
        // The crate root declares the top-level modules.
        for declared in module_declarations(&tokens) {
            graph.modules.insert(declared.name);
        }
        let mut files = vec![(lib, Vec::<String>::new())];
        while let Some((file, path)) = files.pop() {
            let text = read(&file)?;
            let tokens = lex(&text);
            for declared in module_declarations(&tokens) {
                if declared.test_only {
                    continue;
                }
                let module: Vec<String> = path
                    .iter()
                    .chain(&declared.inline_in)
                    .cloned()
                    .chain([declared.name.clone()])
                    .collect();
                if declared.inline {
                    continue;
                }
                files.push((child_file(&file, &declared)?, module));
            }
            for reference in references(&tokens, &path) {
                let Some(from) = reference.from.first() else {
                    continue; // the crate root itself
                };
                if reference.to != *from && graph.modules.contains(&reference.to) {
                    let at = format!(
                        "{}:{}",
                        file.strip_prefix(src.parent().unwrap_or(src))
                            .unwrap_or(&file)
                            .display(),
                        reference.line
                    );
                    graph
                        .edges
                        .entry(from.clone())
                        .or_default()
                        .entry(reference.to)
                        .or_insert(at);
                }
            }
        }
        Ok(graph)
    }

    /// The strongly connected components of more than one module.
    fn cycles(&self) -> Vec<BTreeSet<String>> {
        let reach = |start: &str| {
            let mut seen = BTreeSet::new();
            let mut todo = vec![start.to_owned()];
            while let Some(m) = todo.pop() {
                for next in self.edges.get(&m).into_iter().flat_map(BTreeMap::keys) {
                    if seen.insert(next.clone()) {
                        todo.push(next.clone());
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&String, BTreeSet<String>> =
            self.modules.iter().map(|m| (m, reach(m))).collect();
        let mut out: Vec<BTreeSet<String>> = Vec::new();
        for m in &self.modules {
            if out.iter().any(|c| c.contains(m)) {
                continue;
            }
            let component: BTreeSet<String> = reaches
                .get(m)
                .into_iter()
                .flatten()
                .filter(|other| reaches.get(other).is_some_and(|r| r.contains(m)))
                .cloned()
                .chain([m.clone()])
                .collect();
            if component.len() > 1 {
                out.push(component);
            }
        }
        out
    }

    /// One path around `cycle`, with where each edge is.
    fn describe(&self, cycle: &BTreeSet<String>) -> String {
        let Some(start) = cycle.first() else {
            return String::new();
        };
        // Breadth-first from `start` back to it, inside the cycle.
        let mut previous: BTreeMap<String, String> = BTreeMap::new();
        let mut frontier = vec![start.clone()];
        'search: while !frontier.is_empty() {
            let mut next_frontier = Vec::new();
            for m in frontier {
                for (next, _) in self.edges.get(&m).into_iter().flatten() {
                    if !cycle.contains(next) || previous.contains_key(next) {
                        continue;
                    }
                    previous.insert(next.clone(), m.clone());
                    if next == start {
                        break 'search;
                    }
                    next_frontier.push(next.clone());
                }
            }
            frontier = next_frontier;
        }
        let mut path = vec![start.clone()];
        let mut at = start.clone();
        while let Some(before) = previous.get(&at) {
            path.push(before.clone());
            if before == start {
                break;
            }
            at = before.clone();
        }
        path.reverse();
        let steps: Vec<String> = path
            .windows(2)
            .map(|w| format!("  {} → {} ({})", w[0], w[1], self.edges[&w[0]][&w[1]]))
            .collect();
        let inside: Vec<String> = cycle
            .iter()
            .flat_map(|from| {
                self.edges
                    .get(from)
                    .into_iter()
                    .flatten()
                    .filter(|(to, _)| cycle.contains(*to))
                    .map(move |(to, at)| format!("  {from} → {to} ({at})"))
            })
            .collect();
        format!(
            "cycle {cycle:?}, for example:\n{}\nevery edge inside it (the first place each is made):\n{}",
            steps.join("\n"),
            inside.join("\n")
        )
    }
}

fn read(file: &Path) -> Result<String, String> {
    std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))
}

/// The file of a `mod name;` declared in `file`.
fn child_file(file: &Path, declared: &Declared) -> Result<PathBuf, String> {
    let dir = file.parent().ok_or("a file without a directory")?;
    if let Some(path) = &declared.path_attribute {
        // A `#[path]` outside inline modules is relative to the declaring
        // file's directory (the only use in these crates).
        return Ok(dir.join(path));
    }
    let stem = file.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let mut base = if matches!(stem, "mod" | "lib" | "main") {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    for inline in &declared.inline_in {
        base = base.join(inline);
    }
    let flat = base.join(format!("{}.rs", declared.name));
    if flat.exists() {
        return Ok(flat);
    }
    let nested = base.join(&declared.name).join("mod.rs");
    if nested.exists() {
        return Ok(nested);
    }
    Err(format!(
        "mod {} declared in {}: neither {} nor {} exists",
        declared.name,
        file.display(),
        flat.display(),
        nested.display()
    ))
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Ident(String),
    /// A string literal's contents (raw or not, escapes left as written).
    Str(String),
    Punct(char),
    /// `::`
    PathSep,
}

/// The tokens of Rust source with their line, comments dropped and
/// literals kept whole, so braces and `::` inside them do not count.
fn lex(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if (c == 'r' || (c == 'b' && at(i + 1) == 'r'))
            && matches!(at(i + 1 + usize::from(c == 'b')), '"' | '#')
            && {
                // A raw string: r"..." or r#"..."#.
                let mut j = i + 1 + usize::from(c == 'b');
                while at(j) == '#' {
                    j += 1;
                }
                at(j) == '"'
            }
        {
            let mut j = i + 1 + usize::from(c == 'b');
            let mut hashes = 0;
            while at(j) == '#' {
                hashes += 1;
                j += 1;
            }
            j += 1; // the opening quote
            let start = j;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (1..=hashes).all(|k| at(j + k) == '#') {
                    break;
                }
                if chars[j] == '\n' {
                    line += 1;
                }
                j += 1;
            }
            let contents: String = chars[start..j.min(chars.len())].iter().collect();
            out.push((Token::Str(contents), line));
            i = j + 1 + hashes;
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            let mut j = i + 1 + usize::from(c == 'b');
            let start = j;
            let first_line = line;
            while j < chars.len() && chars[j] != '"' {
                if chars[j] == '\\' {
                    j += 1;
                }
                if at(j) == '\n' {
                    line += 1;
                }
                j += 1;
            }
            let contents: String = chars[start..j.min(chars.len())].iter().collect();
            out.push((Token::Str(contents), first_line));
            i = j + 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                // Past the backslash and the escaped character.
                let mut j = i + 3;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            // `r#ident`
            let word = word.strip_prefix("r#").map(str::to_owned).unwrap_or(word);
            out.push((Token::Ident(word), line));
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((Token::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// A `mod name;` or `mod name { ... }`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Declared {
    name: String,
    inline: bool,
    /// The inline modules (of the same file) it is declared in.
    inline_in: Vec<String>,
    path_attribute: Option<String>,
    /// Under `#[cfg(test)]`.
    test_only: bool,
}

fn ident(token: Option<&(Token, usize)>) -> Option<&str> {
    match token {
        Some((Token::Ident(name), _)) => Some(name),
        _ => None,
    }
}

/// Every module a file declares, and the inline modules around each
/// token (by brace depth).
fn module_declarations(tokens: &[(Token, usize)]) -> Vec<Declared> {
    walk(tokens).0
}

/// The inline modules around one token.
#[derive(Debug, Clone, Default)]
struct Scope {
    modules: Vec<String>,
    /// Inside a `#[cfg(test)]` one.
    test_only: bool,
}

/// (declarations, the inline modules around each token).
fn walk(tokens: &[(Token, usize)]) -> (Vec<Declared>, Vec<Scope>) {
    let mut declared = Vec::new();
    let mut scopes: Vec<Scope> = Vec::with_capacity(tokens.len());
    // (name, brace depth inside it, under #[cfg(test)])
    let mut open: Vec<(String, usize, bool)> = Vec::new();
    let mut depth = 0usize;
    let mut pending_path: Option<String> = None;
    let mut pending_test = false;
    let mut pending_inline: Option<(String, bool)> = None;
    for (i, (token, _)) in tokens.iter().enumerate() {
        scopes.push(Scope {
            modules: open.iter().map(|(name, _, _)| name.clone()).collect(),
            test_only: open.iter().any(|(_, _, test)| *test),
        });
        match token {
            Token::Punct('#') => {
                // #[cfg(test)]
                if let (
                    Some((Token::Punct('['), _)),
                    Some("cfg"),
                    Some((Token::Punct('('), _)),
                    Some("test"),
                    Some((Token::Punct(')'), _)),
                ) = (
                    tokens.get(i + 1),
                    ident(tokens.get(i + 2)),
                    tokens.get(i + 3),
                    ident(tokens.get(i + 4)),
                    tokens.get(i + 5),
                ) {
                    pending_test = true;
                }
                // #[path = "file.rs"]
                if let (Some((Token::Punct('['), _)), Some("path"), Some((Token::Punct('='), _))) = (
                    tokens.get(i + 1),
                    ident(tokens.get(i + 2)),
                    tokens.get(i + 3),
                ) && let Some((Token::Str(path), _)) = tokens.get(i + 4)
                {
                    pending_path = Some(path.clone());
                }
            }
            Token::Ident(word) if word == "mod" => {
                if let Some(name) = ident(tokens.get(i + 1)) {
                    let inline = matches!(tokens.get(i + 2), Some((Token::Punct('{'), _)));
                    let test_only = pending_test || open.iter().any(|(_, _, test)| *test);
                    declared.push(Declared {
                        name: name.to_owned(),
                        inline,
                        inline_in: open.iter().map(|(name, _, _)| name.clone()).collect(),
                        path_attribute: pending_path.take(),
                        test_only,
                    });
                    pending_test = false;
                    if inline {
                        pending_inline = Some((name.to_owned(), test_only));
                    }
                }
            }
            Token::Punct('{') => {
                depth += 1;
                pending_path = None;
                pending_test = false;
                if let Some((name, test)) = pending_inline.take() {
                    open.push((name, depth, test));
                }
            }
            Token::Punct('}') => {
                if open.last().is_some_and(|(_, d, _)| *d == depth) {
                    open.pop();
                }
                depth = depth.saturating_sub(1);
                pending_path = None;
                pending_test = false;
            }
            Token::Punct(';') => {
                pending_path = None;
                pending_test = false;
            }
            _ => {}
        }
    }
    (declared, scopes)
}

/// A reference to a top-level module (or, from the crate root, to any).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reference {
    /// The module path it is made from (file and inline modules).
    from: Vec<String>,
    /// The top-level module it names.
    to: String,
    line: usize,
}

/// The references to top-level modules in a file of module `path`:
/// `crate::x`, `$crate::x`, `super::…::x` reaching the root, and each item
/// of a group after either (`crate::{x::A, y}`).
fn references(tokens: &[(Token, usize)], path: &[String]) -> Vec<Reference> {
    let (_, scopes) = walk(tokens);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if scopes[i].test_only {
            i += 1;
            continue;
        }
        let module: Vec<String> = path.iter().chain(&scopes[i].modules).cloned().collect();
        // `x::crate::y` is no path from the root; `$crate::y` is.
        let starts_path = !matches!(tokens.get(i.wrapping_sub(1)), Some((Token::PathSep, _)));
        let root_after = match ident(tokens.get(i)) {
            Some("crate") if starts_path => Some(i + 1),
            Some("super") if starts_path => {
                // super::super::…: each pops one level.
                let mut level = module.len();
                let mut j = i;
                while ident(tokens.get(j)) == Some("super")
                    && matches!(tokens.get(j + 1), Some((Token::PathSep, _)))
                {
                    level = level.saturating_sub(1);
                    j += 2;
                }
                (level == 0).then_some(j - 1)
            }
            _ => None,
        };
        let Some(sep) = root_after else {
            i += 1;
            continue;
        };
        if !matches!(tokens.get(sep), Some((Token::PathSep, _))) {
            i += 1;
            continue;
        }
        let line = tokens[i].1;
        let mut push = |to: &str| {
            out.push(Reference {
                from: module.clone(),
                to: to.to_owned(),
                line,
            })
        };
        match tokens.get(sep + 1) {
            Some((Token::Ident(name), _)) => push(name),
            Some((Token::Punct('{'), _)) => {
                // The first segment of each item of the group.
                let mut depth = 0;
                let mut expect_item = true;
                let mut j = sep + 1;
                while j < tokens.len() {
                    match &tokens[j].0 {
                        Token::Punct('{') => {
                            depth += 1;
                            expect_item = depth == 1;
                        }
                        Token::Punct('}') => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        Token::Punct(',') if depth == 1 => expect_item = true,
                        Token::Ident(name) if expect_item && depth == 1 => {
                            if name != "self" {
                                push(name);
                            }
                            expect_item = false;
                        }
                        _ => {}
                    }
                    j += 1;
                }
            }
            _ => {}
        }
        i = sep + 1;
    }
    out
}

#[cfg(test)]
mod parsing {
    use super::*;

    /// The top-level modules `source` (of module `path`) refers to.
    fn to(source: &str, path: &[&str]) -> Vec<String> {
        let path: Vec<String> = path.iter().map(|s| (*s).to_owned()).collect();
        references(&lex(source), &path)
            .into_iter()
            .map(|r| r.to)
            .collect()
    }

    #[test]
    fn references_to_top_level_modules() {
        let cases: &[(&str, &str, &[&str], &[&str])] = &[
            ("a use", "use crate::caches::Caches;", &["a"], &["caches"]),
            (
                "an inline path",
                "let x = crate::writes::merge_patch(&api);",
                &["a"],
                &["writes"],
            ),
            (
                "a group",
                "use crate::{caches::Caches, events::{self, Recorder}, self};",
                &["a"],
                &["caches", "events"],
            ),
            ("a macro", "$crate::metrics::inc()", &["a"], &["metrics"]),
            (
                "super reaching the root",
                "use super::super::queue::WorkQueue;",
                &["a", "b"],
                &["queue"],
            ),
            (
                "super inside the module",
                "use super::decide::Verdict;",
                &["a", "b"],
                &[],
            ),
            (
                "super from an inline test module of a top-level file",
                "mod tests { use super::*; use super::helper; }",
                &["a"],
                &[],
            ),
            (
                "super from an inline module of the root's child",
                "mod tests { use super::super::queue; }",
                &["a"],
                &["queue"],
            ),
            (
                "a string or a comment is no path",
                "// crate::x::y\nlet s = \"crate::z::w\"; /* crate::v:: */",
                &["a"],
                &[],
            ),
            ("visibility is no path", "pub(crate) fn f() {}", &["a"], &[]),
            (
                "a nested path is no crate path",
                "use kube::crate_like::x; other::crate::y",
                &["a"],
                &[],
            ),
            (
                "test code is left out",
                "#[cfg(test)]\nmod tests { use crate::a::X; }\n#[cfg(test)]\nfn helper() {}\nmod m { use crate::b::Y; }",
                &["c"],
                &["b"],
            ),
            (
                "braces in char and raw string literals",
                "let c = '{'; let r = r#\"{\"#; mod m { use super::super::z; }",
                &["a"],
                &["z"],
            ),
        ];
        for (what, source, path, want) in cases {
            assert_eq!(to(source, path), *want, "{what}");
        }
    }

    #[test]
    fn module_declarations_with_path_and_inline() {
        let tokens = lex(
            "#[cfg(test)]\n#[path = \"decide_tests.rs\"]\nmod tests;\npub mod worker;\nmod inline { mod inner; }",
        );
        let declared = module_declarations(&tokens);
        // (name, inline, inline in, #[path], under #[cfg(test)])
        type Summary<'a> = (&'a str, bool, Vec<String>, Option<&'a str>, bool);
        let summary: Vec<Summary> = declared
            .iter()
            .map(|d| {
                (
                    d.name.as_str(),
                    d.inline,
                    d.inline_in.clone(),
                    d.path_attribute.as_deref(),
                    d.test_only,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("tests", false, vec![], Some("decide_tests.rs"), true),
                ("worker", false, vec![], None, false),
                ("inline", true, vec![], None, false),
                ("inner", false, vec!["inline".to_owned()], None, false),
            ]
        );
    }

    #[test]
    fn cycles_are_the_components_of_more_than_one_module() {
        let mut graph = Graph::default();
        for m in ["a", "b", "c", "d"] {
            graph.modules.insert(m.to_owned());
        }
        for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
            graph
                .edges
                .entry(from.to_owned())
                .or_default()
                .insert(to.to_owned(), format!("{from}.rs:1"));
        }
        let cycles = graph.cycles();
        let want: BTreeSet<String> = ["a", "b", "c"].iter().map(|s| (*s).to_owned()).collect();
        assert_eq!(cycles, vec![want.clone()]);
        let text = graph.describe(&want);
        assert!(text.contains("a → b (a.rs:1)"), "{text}");
        assert!(text.contains("c → a (c.rs:1)"), "{text}");
    }
}
