//! Keeps `deploy/monitoring/` true: every metric its PrometheusRule and
//! Grafana dashboard query must be one the sidecar exports, and every
//! alert's runbook link must reach a heading of `docs/operations.md`.
//!
//! The names come from a scrape of the real binary (the caller's, in
//! `metrics_and_health_checks_over_http`, after a claim was provisioned and
//! one deleted): every family of its `# TYPE` lines, a histogram's with its
//! `_bucket`, `_sum` and `_count` series. The queries are read by a small
//! PromQL tokenizer ([`metric_names`]): an identifier is a metric unless it
//! is a function (followed by `(`), a keyword or aggregation modifier, a
//! label name (inside `{}` or the lists of `by`, `without`, `on`,
//! `ignoring`, `group_left`, `group_right`), inside a string, a range
//! (`[5m]`, `[$__rate_interval]`) or a Grafana variable. It lives in this
//! binary, which already starts the sidecar and scrapes it: a test binary
//! of its own would cost a link of the whole crate in CI for one scrape.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// PromQL's functions (Prometheus 3), and `start`/`end` of the `@` modifier.
const FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "absent_over_time",
    "acos",
    "acosh",
    "asin",
    "asinh",
    "atan",
    "atanh",
    "avg_over_time",
    "ceil",
    "changes",
    "clamp",
    "clamp_max",
    "clamp_min",
    "cos",
    "cosh",
    "count_over_time",
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "deg",
    "delta",
    "deriv",
    "double_exponential_smoothing",
    "end",
    "exp",
    "floor",
    "histogram_avg",
    "histogram_count",
    "histogram_fraction",
    "histogram_quantile",
    "histogram_stddev",
    "histogram_stdvar",
    "histogram_sum",
    "holt_winters",
    "hour",
    "idelta",
    "increase",
    "info",
    "irate",
    "label_join",
    "label_replace",
    "last_over_time",
    "ln",
    "log10",
    "log2",
    "mad_over_time",
    "max_over_time",
    "min_over_time",
    "minute",
    "month",
    "pi",
    "predict_linear",
    "present_over_time",
    "quantile_over_time",
    "rad",
    "rate",
    "resets",
    "round",
    "scalar",
    "sgn",
    "sin",
    "sinh",
    "sort",
    "sort_by_label",
    "sort_by_label_desc",
    "sort_desc",
    "sqrt",
    "start",
    "stddev_over_time",
    "stdvar_over_time",
    "sum_over_time",
    "tan",
    "tanh",
    "time",
    "timestamp",
    "vector",
    "year",
];

/// Aggregation operators: followed by `(` or by a `by`/`without` list.
const AGGREGATIONS: &[&str] = &[
    "avg",
    "bottomk",
    "count",
    "count_values",
    "group",
    "limit_ratio",
    "limitk",
    "max",
    "min",
    "quantile",
    "stddev",
    "stdvar",
    "sum",
    "topk",
];

/// Modifiers followed by a parenthesized list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Binary operators and modifiers spelled as words, and the number words.
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "atan2", "bool", "offset", "inf", "nan",
];

/// What a query names: its metrics, and the calls of unknown functions
/// (a typo in a function name is as wrong as one in a metric's).
#[derive(Debug, Default, PartialEq)]
pub struct Names {
    pub metrics: BTreeSet<String>,
    pub unknown_functions: BTreeSet<String>,
}

/// The index just past the string literal opening at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    chars.len()
}

/// The index just past the bracket closing the one at `start` (`{`, `(`,
/// `[`), strings skipped.
fn skip_group(chars: &[char], start: usize) -> usize {
    let (open, close) = match chars[start] {
        '{' => ('{', '}'),
        '(' => ('(', ')'),
        _ => ('[', ']'),
    };
    let mut depth = 0usize;
    let mut i = start;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => {
                i = skip_string(chars, i);
                continue;
            }
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    chars.len()
}

fn is_identifier_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_identifier_part(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The metric a matcher block names with `__name__="…"`, if any.
fn name_matcher(block: &str) -> Option<String> {
    let rest = block.split("__name__").nth(1)?.trim_start();
    let rest = rest.strip_prefix('=')?.trim_start();
    let quote = rest.chars().next()?;
    let value = rest.get(1..)?;
    value.find(quote).map(|end| value[..end].to_owned())
}

/// The metrics and unknown functions of one PromQL expression.
pub fn metric_names(expr: &str) -> Names {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = Names::default();
    let next_non_space = |from: usize| {
        (from..chars.len())
            .find(|&j| !chars[j].is_whitespace())
            .map(|j| (j, chars[j]))
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => i = skip_string(&chars, i),
            // Ranges, subqueries and durations: `[5m]`, `[$__rate_interval]`.
            '[' => i = skip_group(&chars, i),
            // Label matchers: label names, values in strings.
            '{' => {
                let end = skip_group(&chars, i);
                let block: String = chars[i..end].iter().collect();
                names.metrics.extend(name_matcher(&block));
                i = end;
            }
            // A Grafana variable: `$x`, `${x}`, `$__rate_interval`.
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    i = skip_group(&chars, i);
                } else {
                    while i < chars.len() && is_identifier_part(chars[i]) {
                        i += 1;
                    }
                }
            }
            // Numbers and durations (`0.99`, `1e3`, `5m`, `0x1f`).
            c if c.is_ascii_digit()
                || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            c if is_identifier_start(c) => {
                let start = i;
                while i < chars.len() && is_identifier_part(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let lower = word.to_ascii_lowercase();
                let next = next_non_space(i);
                if LABEL_LISTS.contains(&lower.as_str()) {
                    if let Some((j, '(')) = next {
                        i = skip_group(&chars, j);
                    }
                } else if KEYWORDS.contains(&lower.as_str())
                    || AGGREGATIONS.contains(&lower.as_str())
                {
                    // An operator, not a metric; an aggregation's `by` or
                    // `without` list is the next word's.
                } else if let Some((_, '(')) = next {
                    if !FUNCTIONS.contains(&word.as_str()) {
                        names.unknown_functions.insert(word);
                    }
                } else {
                    names.metrics.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

/// Every metric name a scrape exports: each family of a `# TYPE` line (a
/// histogram's and a summary's with their series' suffixes), and each
/// sample's name.
pub fn exported_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            names.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["_sum", "_count"],
                _ => &[],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') && !line.is_empty() {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            names.insert(name.to_owned());
        }
    }
    names
}

/// What `expr` (found at `place`) names that `exported` lacks.
pub fn problems_of(place: &str, expr: &str, exported: &BTreeSet<String>) -> Vec<String> {
    let names = metric_names(expr);
    let mut problems: Vec<String> = names
        .metrics
        .iter()
        .filter(|name| !exported.contains(*name))
        .map(|name| format!("{place}: the metric {name} is not exported; in {expr:?}"))
        .collect();
    problems.extend(
        names
            .unknown_functions
            .iter()
            .map(|f| format!("{place}: {f}( is no PromQL function; in {expr:?}")),
    );
    if names.metrics.is_empty() {
        problems.push(format!("{place}: no metric found in {expr:?}"));
    }
    problems
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The alerting and recording rules of `deploy/monitoring/prometheusrule.yaml`.
fn rules() -> Vec<serde_yaml_ng::Value> {
    let path = repo().join("deploy/monitoring/prometheusrule.yaml");
    let rule: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read(&path)).expect("the PrometheusRule parses");
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    let groups = rule["spec"]["groups"].as_sequence().expect("spec.groups");
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .collect()
}

/// Every `expr` of the dashboard, wherever it is (panels in rows too).
fn dashboard_exprs(value: &Value, place: &str, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            let title = map.get("title").and_then(Value::as_str);
            let place = title.map_or_else(|| place.to_owned(), |t| format!("{place} / {t}"));
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => out.push((place.clone(), expr.clone())),
                    _ => dashboard_exprs(value, &place, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_exprs(v, place, out)),
        _ => {}
    }
}

/// Every query of `deploy/monitoring/`, with where it is.
pub fn monitoring_exprs() -> Vec<(String, String)> {
    let mut exprs: Vec<(String, String)> = rules()
        .iter()
        .map(|rule| {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .unwrap_or("?");
            let expr = rule["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: no expr"));
            (format!("prometheusrule.yaml {name}"), expr.to_owned())
        })
        .collect();
    let path = repo().join("deploy/monitoring/dashboard.json");
    let dashboard: Value = serde_json::from_str(&read(&path)).expect("the dashboard parses");
    let before = exprs.len();
    dashboard_exprs(&dashboard, "dashboard.json", &mut exprs);
    assert!(exprs.len() > before, "the dashboard has no expr");
    exprs
}

/// GitHub's anchor of a heading: lower case, spaces to `-`, punctuation
/// but `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Each alert has a summary, a description and a runbook link to a
/// heading of docs/operations.md.
pub fn runbook_problems() -> Vec<String> {
    let operations = read(&repo().join("docs/operations.md"));
    let anchors: BTreeSet<String> = operations
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect();
    let mut problems = Vec::new();
    for rule in rules() {
        let Some(alert) = rule["alert"].as_str() else {
            continue;
        };
        let annotations = &rule["annotations"];
        for key in ["summary", "description", "runbook_url"] {
            if annotations[key].as_str().is_none_or(str::is_empty) {
                problems.push(format!("{alert}: no {key} annotation"));
            }
        }
        let url = annotations["runbook_url"].as_str().unwrap_or_default();
        match url.split_once("/docs/operations.md#") {
            Some((_, anchor)) if anchors.contains(anchor) => {}
            _ => problems.push(format!(
                "{alert}: runbook_url {url:?} is not a heading of docs/operations.md"
            )),
        }
    }
    problems
}

/// Panics naming every metric `deploy/monitoring/` queries that `scrape`
/// does not export, every unknown function, and every broken runbook link.
/// The histogram families of `unobservable` are taken as exported: the
/// caller knows its backend cannot make them observed.
pub fn assert_monitoring_matches(scrape: &str, unobservable: &[&str]) {
    let mut exported = exported_names(scrape);
    for family in unobservable {
        exported
            .extend(["", "_bucket", "_sum", "_count"].map(|suffix| format!("{family}{suffix}")));
    }
    let mut problems: Vec<String> = monitoring_exprs()
        .iter()
        .flat_map(|(place, expr)| problems_of(place, expr, &exported))
        .collect();
    problems.extend(runbook_problems());
    assert!(
        problems.is_empty(),
        "deploy/monitoring/ is out of date:\n  {}\nexported: {exported:?}",
        problems.join("\n  ")
    );
}

#[test]
fn the_tokenizer_finds_metrics_and_skips_functions_labels_strings_and_ranges() {
    let metrics = |expr: &str| -> Vec<String> { metric_names(expr).metrics.into_iter().collect() };
    assert_eq!(
        metrics(
            r#"sum by (method_name, grpc_status_code) (rate(x_total{container="c", grpc_status_code!="OK"}[5m])) > 0"#
        ),
        ["x_total"]
    );
    assert_eq!(
        metrics(
            "histogram_quantile(0.99, sum by (storage_class, le) (rate(h_seconds_bucket[$__rate_interval])))"
        ),
        ["h_seconds_bucket"]
    );
    assert_eq!(
        metrics(
            "a / on(pod) group_left(node, zone) b offset 5m and ignoring(x) c unless d bool > 1e3"
        ),
        ["a", "b", "c", "d"]
    );
    assert_eq!(
        metrics(r#"label_replace(up, "dst", "$1", "src", "(rate|sum).*")"#),
        ["up"]
    );
    assert_eq!(metrics(r#"{__name__="by_name", job='j'}"#), ["by_name"]);
    assert_eq!(
        metrics("sum without (pod) (g) * on () group_right vector(1) + Inf - NaN"),
        ["g"]
    );
    assert_eq!(metrics("max(m{a=\"}\"}[1h:5m]) @ start()"), ["m"]);
    assert_eq!(metrics("count(x{l=~\"${var}\"}) > .5"), ["x"]);
    assert_eq!(
        metrics("rate(ns:recorded:rate5m[5m])"),
        ["ns:recorded:rate5m"]
    );
    assert!(metric_names("rate(x[5m])").unknown_functions.is_empty());
}

/// The check fails when it should: a made-up metric, a misspelled function,
/// a query with no metric, a histogram series of a gauge.
#[test]
fn a_made_up_metric_or_function_is_reported() {
    let scrape = "# HELP real_seconds A histogram.\n# TYPE real_seconds histogram\nreal_seconds_bucket{le=\"1\"} 0\n# HELP up_now A gauge.\n# TYPE up_now gauge\nup_now 1\n# TYPE empty_total counter\n";
    let exported = exported_names(scrape);
    for name in [
        "real_seconds",
        "real_seconds_bucket",
        "real_seconds_sum",
        "real_seconds_count",
        "up_now",
        "empty_total",
    ] {
        assert!(exported.contains(name), "{name} in {exported:?}");
    }
    assert!(problems_of("ok", "rate(real_seconds_count[5m]) * up_now", &exported).is_empty());
    let made_up = problems_of(
        "t",
        "sum(rate(csi_provisioner_made_up_total[5m])) > 0",
        &exported,
    );
    assert_eq!(made_up.len(), 1, "{made_up:?}");
    assert!(
        made_up[0].contains("csi_provisioner_made_up_total"),
        "{made_up:?}"
    );
    let gauge_bucket = problems_of("t", "up_now_bucket", &exported);
    assert!(
        gauge_bucket[0].contains("up_now_bucket"),
        "{gauge_bucket:?}"
    );
    let typo = problems_of("t", "rte(real_seconds_count[5m])", &exported);
    assert!(typo.iter().any(|p| p.contains("rte(")), "{typo:?}");
    let constant = problems_of("t", "vector(1)", &exported);
    assert!(
        constant.iter().any(|p| p.contains("no metric")),
        "{constant:?}"
    );
}

/// The files themselves parse and every alert links its runbook; the
/// metric names are checked against a live scrape by the caller.
#[test]
fn the_monitoring_files_parse_and_every_alert_has_a_runbook() {
    let exprs = monitoring_exprs();
    assert!(
        exprs
            .iter()
            .any(|(place, _)| place.starts_with("prometheusrule.yaml"))
    );
    for (place, expr) in &exprs {
        let names = metric_names(expr);
        assert!(names.unknown_functions.is_empty(), "{place}: {names:?}");
        assert!(!names.metrics.is_empty(), "{place}: {expr}");
    }
    let problems = runbook_problems();
    assert!(problems.is_empty(), "{problems:#?}");
    assert_eq!(slug("CSIProvisionerNoLeader"), "csiprovisionernoleader");
    assert_eq!(slug("Alerts: what `x` means"), "alerts-what-x-means");
}
