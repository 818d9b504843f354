//! Logging as the upstream sidecar's component-base flags configure it:
//! `-v`, `--vmodule`, `--logging-format=text|json` and the split-stream
//! options, so a Deployment written for the Go image starts unchanged.
//!
//! - `text` is tracing's human format (not klog's header, which nothing
//!   parses by machine);
//! - `json` is one object per line with klog's JSON keys (`ts` in epoch
//!   milliseconds, `caller`, `msg`, `v` for non-errors, `err`, then the
//!   structured fields), which log pipelines written for the Go sidecar
//!   parse;
//! - `-v` and `--vmodule` choose what is written (a decision per call site,
//!   [`max_level`]); `RUST_LOG`, when set, replaces both.
//!
//! Everything is written unbuffered, line by line, so the flush and buffer
//! options have nothing to do here (they are accepted and named at start).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::registry::LookupSpan;

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Parses `--logging-format` (component-base's wording on error).
pub fn parse_log_format(value: &str) -> Result<LogFormat, String> {
    match value {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        other => Err(format!(
            "format: Invalid value: {other:?}: Unsupported log format (use \"text\" or \"json\")"
        )),
    }
}

/// One `pattern=N` of `--vmodule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VModuleRule {
    pub pattern: String,
    pub level: u8,
}

/// `--vmodule`: per-file verbosity, first matching pattern wins (klog).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VModule(pub Vec<VModuleRule>);

/// Parses `--vmodule` like klog: comma-separated `pattern=N`, empty items
/// skipped, `N = 0` dropped (it cannot lower the global `-v`).
pub fn parse_vmodule(value: &str) -> Result<VModule, String> {
    const SYNTAX: &str = "syntax error: expect comma-separated list of filename=N";
    let mut rules = Vec::new();
    for item in value.split(',') {
        if item.is_empty() {
            continue;
        }
        let Some((pattern, level)) = item.split_once('=') else {
            return Err(format!("{SYNTAX} (got {item:?})"));
        };
        if pattern.is_empty() || level.is_empty() || level.contains('=') {
            return Err(format!("{SYNTAX} (got {item:?})"));
        }
        let level: i64 = level
            .parse()
            .map_err(|_| format!("{SYNTAX} (got {item:?})"))?;
        if level < 0 {
            return Err(format!("negative value for vmodule level (got {item:?})"));
        }
        if level == 0 {
            continue;
        }
        rules.push(VModuleRule {
            pattern: pattern.to_owned(),
            level: u8::try_from(level).unwrap_or(u8::MAX),
        });
    }
    Ok(VModule(rules))
}

impl VModule {
    /// The verbosity `--vmodule` gives the source file `file` (as tracing
    /// reports it: `src/provisioner/claims.rs`, or an absolute
    /// path for dependencies). A pattern without `/` is matched against the
    /// file name without `.rs`; one with `/` against the path without `.rs`,
    /// or any part of it that starts after a `/` (our paths are relative, a
    /// full path cannot be known in advance).
    pub fn level_for(&self, file: &str) -> Option<u8> {
        let path = file.strip_suffix(".rs").unwrap_or(file);
        let name = path.rsplit('/').next().unwrap_or(path);
        self.0.iter().find_map(|rule| {
            let matched = if rule.pattern.contains('/') {
                glob_match(&rule.pattern, path)
                    || path
                        .match_indices('/')
                        .any(|(i, _)| glob_match(&rule.pattern, &path[i + 1..]))
            } else {
                glob_match(&rule.pattern, name)
            };
            matched.then_some(rule.level)
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Go's `filepath.Match` for `*` and `?` (neither crosses a `/`); every
/// other character is literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // matches[j]: pattern prefix matches text prefix of length j.
    let mut matches = vec![false; t.len() + 1];
    matches[0] = true;
    for &pc in &p {
        let mut next = vec![false; t.len() + 1];
        match pc {
            '*' => {
                for j in 0..=t.len() {
                    next[j] = matches[j] || (j > 0 && next[j - 1] && t[j - 1] != '/');
                }
            }
            _ => {
                for j in 1..=t.len() {
                    let one = if pc == '?' {
                        t[j - 1] != '/'
                    } else {
                        t[j - 1] == pc
                    };
                    next[j] = matches[j - 1] && one;
                }
            }
        }
        matches = next;
    }
    matches[t.len()]
}

/// The tracing level klog's `-v N` shows: 0–1 info, 2–4 debug, 5+ trace.
pub fn level_of(verbosity: u8) -> LevelFilter {
    match verbosity {
        0..=1 => LevelFilter::INFO,
        2..=4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The most verbose level written for a call site. `-v` applies to the
/// sidecar's own logs; libraries (HTTP, gRPC) stay at info until `-v 8`,
/// as klog's verbosity only affects the program's own messages. A
/// `--vmodule` match raises (never lowers) the level of its files, as in
/// klog, where the global `-v` is checked first.
pub fn max_level(
    target: &str,
    file: Option<&str>,
    verbosity: u8,
    vmodule: &VModule,
) -> LevelFilter {
    let ours = target == "csi_provisioner" || target.starts_with("csi_provisioner::");
    let global = if ours {
        level_of(verbosity)
    } else if verbosity >= 8 {
        LevelFilter::DEBUG
    } else {
        LevelFilter::INFO
    };
    match file.and_then(|f| vmodule.level_for(f)) {
        Some(level) => global.max(level_of(level)),
        None => global,
    }
}

/// The per-call-site filter of `-v` and `--vmodule`.
#[derive(Debug, Clone)]
pub struct VerbosityFilter {
    pub verbosity: u8,
    pub vmodule: VModule,
}

impl<S> Filter<S> for VerbosityFilter {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        *meta.level() <= max_level(meta.target(), meta.file(), self.verbosity, &self.vmodule)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        let vmodule = self.vmodule.0.iter().map(|r| level_of(r.level));
        let libraries = if self.verbosity >= 8 {
            LevelFilter::DEBUG
        } else {
            LevelFilter::INFO
        };
        Some(
            vmodule
                .chain([level_of(self.verbosity), libraries])
                .max()
                .unwrap_or(LevelFilter::INFO),
        )
    }
}

/// klog's `v` of an event: the lowest `-v` that shows it. Errors have none
/// (klog writes `Error` entries without `v`); warnings show at `-v 0`.
pub fn klog_v(level: Level) -> Option<u8> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(2),
        Level::TRACE => Some(5),
    }
}

/// klog's `caller`: the file's directory and name, with the line.
pub fn klog_caller(file: Option<&str>, line: Option<u32>) -> Option<String> {
    let file = file?;
    let mut parts = file.rsplit('/');
    let name = parts.next().unwrap_or(file);
    let short = match parts.next() {
        Some(dir) if !dir.is_empty() => format!("{dir}/{name}"),
        _ => name.to_owned(),
    };
    Some(match line {
        Some(line) => format!("{short}:{line}"),
        None => short,
    })
}

/// One JSON log line (without the newline), keys in klog's order: `ts`,
/// `caller`, `msg`, `v` (not for errors), then the fields in the order
/// they were given. The conventional `error` field is written as klog's
/// `err`.
pub fn encode_json_line(
    ts_millis: f64,
    level: Level,
    caller: Option<&str>,
    message: &str,
    fields: &[(String, serde_json::Value)],
) -> String {
    let mut out = String::with_capacity(128);
    let _ = write!(out, "{{\"ts\":{}", json_number(ts_millis));
    if let Some(caller) = caller {
        let _ = write!(out, ",\"caller\":{}", json_string(caller));
    }
    let _ = write!(out, ",\"msg\":{}", json_string(message));
    if let Some(v) = klog_v(level) {
        let _ = write!(out, ",\"v\":{v}");
    }
    for (key, value) in fields {
        let key = if key == "error" { "err" } else { key.as_str() };
        let _ = write!(out, ",{}:{}", json_string(key), value);
    }
    out.push('}');
    out
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

fn json_number(n: f64) -> String {
    serde_json::Number::from_f64(n).map_or_else(|| "0".to_owned(), |n| n.to_string())
}

/// Collects an event's message and fields as JSON values.
#[derive(Default)]
struct JsonFields {
    message: String,
    fields: Vec<(String, serde_json::Value)>,
}

impl JsonFields {
    fn push(&mut self, field: &Field, value: serde_json::Value) {
        if field.name() == "message" {
            self.message = match value {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.push((field.name().to_owned(), value));
        }
    }
}

impl Visit for JsonFields {
    fn record_f64(&mut self, field: &Field, value: f64) {
        let value = serde_json::Number::from_f64(value)
            .map_or_else(|| value.to_string().into(), serde_json::Value::Number);
        self.push(field, value);
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.into());
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `%x` fields arrive here too, formatted with Display.
        self.push(field, format!("{value:?}").into());
    }
}

/// The `--logging-format=json` event format.
#[derive(Debug, Clone, Copy, Default)]
pub struct KlogJson;

impl<S, N> FormatEvent<S, N> for KlogJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        let mut fields = JsonFields::default();
        event.record(&mut fields);
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or_default();
        let caller = klog_caller(meta.file(), meta.line());
        writeln!(
            writer,
            "{}",
            encode_json_line(
                ts,
                *meta.level(),
                caller.as_deref(),
                &fields.message,
                &fields.fields
            )
        )
    }
}

/// What the logging flags ask for.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    pub format: LogFormat,
    pub verbosity: u8,
    pub vmodule: VModule,
    /// Errors to stderr, everything else to stdout
    /// (`--log-text-split-stream` / `--log-json-split-stream` for the
    /// format in use).
    pub split_stream: bool,
}

/// Installs the process's subscriber. `RUST_LOG`, when set, replaces `-v`
/// and `--vmodule`.
pub fn init(settings: &LogSettings) {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer, Registry};

    let (writer, ansi) = if settings.split_stream {
        (
            BoxMakeWriter::new(
                std::io::stderr
                    .with_max_level(Level::ERROR)
                    .and(std::io::stdout.with_min_level(Level::WARN)),
            ),
            false,
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    };
    let layer: Box<dyn Layer<Registry> + Send + Sync> = match settings.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_target(false)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .event_format(KlogJson)
            .with_writer(writer)
            .with_ansi(false)
            .boxed(),
    };
    let layer = match EnvFilter::try_from_default_env() {
        Ok(env) => layer.with_filter(env).boxed(),
        Err(_) => layer
            .with_filter(VerbosityFilter {
                verbosity: settings.verbosity,
                vmodule: settings.vmodule.clone(),
            })
            .boxed(),
    };
    tracing_subscriber::registry().with(layer).init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(parse_log_format("text"), Ok(LogFormat::Text));
        assert_eq!(parse_log_format("json"), Ok(LogFormat::Json));
        for bad in ["", "JSON", "xml"] {
            let err = parse_log_format(bad).expect_err(bad);
            assert!(err.contains("Unsupported log format"), "{err}");
        }
    }

    #[test]
    fn vmodule_syntax_follows_klog() {
        let rule = |p: &str, l: u8| VModuleRule {
            pattern: p.to_owned(),
            level: l,
        };
        assert_eq!(parse_vmodule(""), Ok(VModule::default()));
        assert_eq!(
            parse_vmodule("claims=5,,leader*=3,volumes=0"),
            Ok(VModule(vec![rule("claims", 5), rule("leader*", 3)]))
        );
        assert_eq!(
            parse_vmodule("provisioner/claims=9"),
            Ok(VModule(vec![rule("provisioner/claims", 9)]))
        );
        for bad in ["claims", "=3", "claims=", "claims=x", "a=1=2", "claims=-1"] {
            assert!(parse_vmodule(bad).is_err(), "{bad} accepted");
        }
        assert!(
            parse_vmodule("claims=-1")
                .expect_err("negative")
                .contains("negative")
        );
    }

    #[test]
    fn globs_like_filepath_match() {
        for (pattern, text, want) in [
            ("claims", "claims", true),
            ("claims", "claims2", false),
            ("cl*", "claims", true),
            ("*s", "claims", true),
            ("c?aims", "claims", true),
            ("*", "", true),
            ("?", "", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("provisioner/*", "provisioner/claims", true),
            ("*", "provisioner/claims", false),
            ("*/claims", "provisioner/claims", true),
        ] {
            assert_eq!(glob_match(pattern, text), want, "{pattern} ~ {text}");
        }
    }

    #[test]
    fn vmodule_matches_file_names_and_paths() {
        let vm = parse_vmodule("claims=5,provisioner/vol*=3,leader=2").expect("valid");
        for (file, want) in [
            ("src/provisioner/claims.rs", Some(5)),
            ("src/provisioner/volumes.rs", Some(3)),
            ("src/leader.rs", Some(2)),
            ("src/provision/claims.rs", Some(5)),
            ("src/provision/volumes.rs", None),
            (
                "/root/.cargo/registry/src/x/kube-client-5.0.0/src/client/mod.rs",
                None,
            ),
            ("src/metrics.rs", None),
        ] {
            assert_eq!(vm.level_for(file), want, "{file}");
        }
    }

    #[test]
    fn levels_per_call_site() {
        let none = VModule::default();
        let vm = parse_vmodule("claims=5,mod=8").expect("valid");
        let ours = "csi_provisioner::provisioner::claims";
        let claims = Some("src/provisioner/claims.rs");
        let other = Some("src/metrics.rs");
        let kube = Some("/x/kube-client/src/client/mod.rs");
        for (target, file, v, vmodule, want) in [
            (ours, claims, 0, &none, LevelFilter::INFO),
            (ours, claims, 2, &none, LevelFilter::DEBUG),
            (ours, claims, 4, &none, LevelFilter::DEBUG),
            (ours, claims, 5, &none, LevelFilter::TRACE),
            ("csi_provisioner", None, 3, &none, LevelFilter::DEBUG),
            ("kube_client::client", kube, 5, &none, LevelFilter::INFO),
            ("kube_client::client", kube, 8, &none, LevelFilter::DEBUG),
            ("csi_provisioner_x", None, 5, &none, LevelFilter::INFO),
            // --vmodule raises the matched files only...
            (ours, claims, 0, &vm, LevelFilter::TRACE),
            ("csi_provisioner::metrics", other, 0, &vm, LevelFilter::INFO),
            ("kube_client::client", kube, 0, &vm, LevelFilter::TRACE),
            // ...and never lowers the global -v.
            (
                ours,
                claims,
                9,
                &parse_vmodule("claims=1").expect("valid"),
                LevelFilter::TRACE,
            ),
        ] {
            assert_eq!(
                max_level(target, file, v, vmodule),
                want,
                "{target} {file:?} -v {v} {vmodule:?}"
            );
        }
        let hint = <VerbosityFilter as Filter<Registry>>::max_level_hint(&VerbosityFilter {
            verbosity: 0,
            vmodule: vm,
        });
        assert_eq!(hint, Some(LevelFilter::TRACE));
    }

    use tracing_subscriber::Registry;

    #[test]
    fn json_lines_have_klogs_keys() {
        let fields = vec![
            ("claim".to_owned(), serde_json::json!("ns/data")),
            ("attempt".to_owned(), serde_json::json!(3)),
            ("error".to_owned(), serde_json::json!("boom \"quoted\"")),
        ];
        let line = encode_json_line(
            1_795_474_048_749.593_3,
            Level::INFO,
            Some("provisioner/claims.rs:42"),
            "calling CreateVolume",
            &fields,
        );
        assert_eq!(
            line,
            r#"{"ts":1795474048749.5933,"caller":"provisioner/claims.rs:42","msg":"calling CreateVolume","v":0,"claim":"ns/data","attempt":3,"err":"boom \"quoted\""}"#
        );
        let error = encode_json_line(1.5, Level::ERROR, None, "lost\nline", &[]);
        assert_eq!(error, r#"{"ts":1.5,"msg":"lost\nline"}"#);
        for (level, v) in [
            (Level::WARN, Some(0)),
            (Level::INFO, Some(0)),
            (Level::DEBUG, Some(2)),
            (Level::TRACE, Some(5)),
            (Level::ERROR, None),
        ] {
            assert_eq!(klog_v(level), v, "{level}");
        }
        assert_eq!(
            klog_caller(Some("src/provisioner/claims.rs"), Some(7)).as_deref(),
            Some("provisioner/claims.rs:7")
        );
        assert_eq!(
            klog_caller(Some("main.rs"), None).as_deref(),
            Some("main.rs")
        );
        assert_eq!(klog_caller(None, Some(1)), None);
    }

    /// The formatter end to end through a real subscriber: one parseable
    /// object per line, fields typed.
    #[test]
    fn json_format_through_a_subscriber() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;

        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().expect("lock").extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .event_format(KlogJson)
                .with_writer(move || writer.clone())
                .with_filter(VerbosityFilter {
                    verbosity: 0,
                    vmodule: VModule::default(),
                }),
        );
        tracing::subscriber::with_default(subscriber, || {
            let e = std::io::Error::other("disk full");
            tracing::info!(claim = %"ns/a", retries = 2u64, ok = true, "provisioned {}", "pvc-1");
            tracing::debug!("not written at -v 0");
            tracing::warn!(error = %e, "retrying");
            tracing::error!("stopping");
        });
        let text = String::from_utf8(buffer.0.lock().expect("lock").clone()).expect("utf-8");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0]["msg"], "provisioned pvc-1");
        assert_eq!(lines[0]["v"], 0);
        assert_eq!(lines[0]["claim"], "ns/a");
        assert_eq!(lines[0]["retries"], 2);
        assert_eq!(lines[0]["ok"], true);
        assert!(lines[0]["ts"].as_f64().is_some_and(|ts| ts > 1.6e12));
        assert!(
            lines[0]["caller"]
                .as_str()
                .is_some_and(|c| c.starts_with("src/logging.rs:")),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1]["err"], "disk full");
        assert_eq!(lines[2]["msg"], "stopping");
        assert!(lines[2].get("v").is_none(), "errors carry no v");
    }
}
