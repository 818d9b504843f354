//! Logging as the upstream sidecar's component-base flags configure it:
//! `-v`, `--vmodule`, `--logging-format=text|json` and the split-stream
//! options, so a Deployment written for the Go image starts unchanged.
//!
//! - `text` (the default) is klog's text format, as the Go image writes it
//!   ([`encode_text_line`]): the header `Lmmdd hh:mm:ss.uuuuuu pid
//!   file:line] `, then the quoted message and `key="value"` pairs, so
//!   log pipelines and greps written for the Go sidecar keep working;
//! - `json` is one object per line with klog's JSON keys (`ts` in epoch
//!   milliseconds, `caller`, `msg`, `v` for non-errors, `err`, then the
//!   structured fields), which log pipelines written for the Go sidecar
//!   parse;
//! - `human`, beyond the Go image, is tracing's format for reading at a
//!   terminal (in color there);
//! - `-v` and `--vmodule` choose what is written (a decision per call site,
//!   [`max_level`]); `RUST_LOG`, when set, replaces both. Both, and the
//!   split stream, apply to every format.
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
    /// klog's text format.
    #[default]
    Text,
    Json,
    /// tracing's format, for a terminal (not in the Go image).
    Human,
}

/// Parses `--logging-format` (component-base's wording on error).
pub fn parse_log_format(value: &str) -> Result<LogFormat, String> {
    match value {
        "text" => Ok(LogFormat::Text),
        "json" => Ok(LogFormat::Json),
        "human" => Ok(LogFormat::Human),
        other => Err(format!(
            "format: Invalid value: {other:?}: Unsupported log format (use \"text\", \"json\" or \"human\")"
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

/// klog's severity letter: `E` for errors, `W` for warnings, `I` for the
/// rest (klog has no debug or trace severity: they are `I` at a higher
/// `-v`).
pub fn klog_severity(level: Level) -> char {
    match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// klog's `file:line` of the header: the file's base name (`claims.rs`),
/// or `???` and line 1 where the call site is unknown, as klog writes when
/// Go's `runtime.Caller` fails.
pub fn klog_file(file: Option<&str>, line: Option<u32>) -> (&str, u32) {
    match file {
        Some(file) => (file.rsplit('/').next().unwrap_or(file), line.unwrap_or(0)),
        None => ("???", 1),
    }
}

/// The wall clock of klog's header, in local time (as klog's `time.Now()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClockTime {
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    pub micros: u32,
}

/// The local time of `now`, as the C library reads the zone (`TZ`, else
/// `/etc/localtime`, as Go); UTC where it cannot tell.
pub fn local_clock(now: SystemTime) -> ClockTime {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = libc::time_t::try_from(since.as_secs()).unwrap_or(libc::time_t::MAX);
    // SAFETY: `localtime_r` only writes the `tm` it is given, which is
    // plain data; a null return (out of range) leaves it zeroed.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call's duration.
    let converted = !unsafe { libc::localtime_r(&secs, &mut tm) }.is_null();
    let field = |v: libc::c_int| u32::try_from(v).unwrap_or(0);
    ClockTime {
        month: if converted { field(tm.tm_mon) + 1 } else { 1 },
        day: if converted { field(tm.tm_mday) } else { 1 },
        hour: field(tm.tm_hour),
        minute: field(tm.tm_min),
        second: field(tm.tm_sec),
        micros: since.subsec_micros(),
    }
}

/// klog's header: `Lmmdd hh:mm:ss.uuuuuu ppppppp file:line] `, the pid
/// right-aligned in 7 columns (klog keeps its last 7 digits).
pub fn klog_header(severity: char, time: &ClockTime, pid: u32, file: &str, line: u32) -> String {
    let pid = if pid >= 10_000_000 {
        format!("{:07}", pid % 10_000_000)
    } else if pid == 0 {
        " ".repeat(7)
    } else {
        format!("{pid:>7}")
    };
    format!(
        "{severity}{:02}{:02} {:02}:{:02}:{:02}.{:06} {pid} {file}:{line}] ",
        time.month % 100,
        time.day % 100,
        time.hour % 100,
        time.minute % 100,
        time.second % 100,
        time.micros % 1_000_000,
    )
}

/// Go's `strconv.Quote`: double quotes around the text, `\"` and `\\`,
/// the C escapes (`\a \b \f \n \r \t \v`), `\xNN` for the other ASCII
/// controls and DEL, `\uNNNN` / `\UNNNNNNNN` for the non-printable
/// characters beyond ASCII (spaces other than U+0020, controls, format
/// characters, private use, noncharacters); printable text as it is.
pub fn go_quote(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            ' '..='~' => out.push(c),
            c if c.is_ascii() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if go_printable(c) => out.push(c),
            c if u32::from(c) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\U{:08x}", u32::from(c));
            }
        }
    }
    out.push('"');
    out
}

/// Go's `unicode.IsPrint` beyond ASCII, as far as Rust can tell without
/// Unicode's category tables: not controls, not spaces (other than U+0020,
/// which is ASCII), not format characters, private use or noncharacters.
/// Unassigned code points pass (Go escapes them).
fn go_printable(c: char) -> bool {
    let n = u32::from(c);
    let format = matches!(
        n,
        0xAD | 0x600..=0x605
            | 0x61C
            | 0x6DD
            | 0x70F
            | 0x890..=0x891
            | 0x8E2
            | 0x180E
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x2064
            | 0x2066..=0x206F
            | 0xFEFF
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0001
            | 0xE0020..=0xE007F
    );
    let private = matches!(n, 0xE000..=0xF8FF | 0xF0000..=0xFFFFD | 0x100000..=0x10FFFD);
    let noncharacter = matches!(n, 0xFDD0..=0xFDEF) || n & 0xFFFE == 0xFFFE;
    !(c.is_control() || c.is_whitespace() || format || private || noncharacter)
}

/// One value of klog's key/value pairs, `=` included: a string quoted
/// ([`go_quote`]), or, when it holds a line break, klog's multi-line form
/// (`=<`, each line after a tab, ` >` on a line of its own); numbers and
/// booleans bare, as Go's `%+v` (floats as Go's shortest form).
fn klog_value(out: &mut String, value: &serde_json::Value) {
    match value {
        serde_json::Value::String(s) if s.contains('\n') => {
            out.push_str("=<\n");
            let mut rest = s.as_str();
            while let Some(i) = rest.find('\n') {
                out.push('\t');
                out.push_str(&rest[..=i]);
                rest = &rest[i + 1..];
            }
            if rest.is_empty() {
                out.push_str(" >");
            } else {
                out.push('\t');
                out.push_str(rest);
                out.push_str("\n >");
            }
        }
        serde_json::Value::String(s) => {
            out.push('=');
            out.push_str(&go_quote(s));
        }
        serde_json::Value::Number(n) if n.is_f64() => {
            out.push('=');
            out.push_str(&crate::metrics::go_float(n.as_f64().unwrap_or_default()));
        }
        // As the Go image writes a nil value (`err=null`).
        serde_json::Value::Null => out.push_str("=null"),
        other => {
            let _ = write!(out, "={other}");
        }
    }
}

/// One line of klog's text format (without the newline; a multi-line
/// value makes it several): [`klog_header`], the quoted message, then
/// ` key=value` for each field in the order given, the conventional
/// `error` field written as klog's `err`.
pub fn encode_text_line(
    level: Level,
    time: &ClockTime,
    pid: u32,
    (file, line): (&str, u32),
    message: &str,
    fields: &[(String, serde_json::Value)],
) -> String {
    let mut out = klog_header(klog_severity(level), time, pid, file, line);
    out.push_str(&go_quote(message));
    for (key, value) in fields {
        out.push(' ');
        out.push_str(if key == "error" { "err" } else { key });
        klog_value(&mut out, value);
    }
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

/// klog's event formats: `--logging-format=text` ([`encode_text_line`])
/// and `json` ([`encode_json_line`]).
#[derive(Debug, Clone, Copy)]
pub struct Klog {
    json: bool,
    /// The header's pid (text).
    pid: u32,
}

impl Klog {
    pub fn text() -> Self {
        Klog {
            json: false,
            pid: std::process::id(),
        }
    }

    pub fn json() -> Self {
        Klog {
            json: true,
            pid: std::process::id(),
        }
    }
}

impl<S, N> FormatEvent<S, N> for Klog
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
        let now = SystemTime::now();
        let line = if self.json {
            let ts = now
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64() * 1000.0)
                .unwrap_or_default();
            let caller = klog_caller(meta.file(), meta.line());
            encode_json_line(
                ts,
                *meta.level(),
                caller.as_deref(),
                &fields.message,
                &fields.fields,
            )
        } else {
            encode_text_line(
                *meta.level(),
                &local_clock(now),
                self.pid,
                klog_file(meta.file(), meta.line()),
                &fields.message,
                &fields.fields,
            )
        };
        writeln!(writer, "{line}")
    }
}

/// What the logging flags ask for.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    pub format: LogFormat,
    pub verbosity: u8,
    pub vmodule: VModule,
    /// Errors to stderr, everything else to stdout
    /// (`--log-text-split-stream` for `text` and `human`,
    /// `--log-json-split-stream` for `json`).
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
            .event_format(Klog::text())
            .with_writer(writer)
            .with_ansi(false)
            .boxed(),
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_target(false)
            .with_ansi(ansi)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .event_format(Klog::json())
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
        assert_eq!(parse_log_format("human"), Ok(LogFormat::Human));
        assert_eq!(LogFormat::default(), LogFormat::Text);
        for bad in ["", "JSON", "Text", "xml", "klog"] {
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

    fn clock(month: u32, day: u32, hour: u32, minute: u32, second: u32, micros: u32) -> ClockTime {
        ClockTime {
            month,
            day,
            hour,
            minute,
            second,
            micros,
        }
    }

    #[test]
    fn klog_headers() {
        let t = clock(11, 29, 8, 50, 32, 13_368);
        for (severity, time, pid, file, line, want) in [
            // As the Go image wrote it.
            (
                'I',
                t,
                7672,
                "csi-provisioner.go",
                156,
                "I1129 08:50:32.013368    7672 csi-provisioner.go:156] ",
            ),
            (
                'E',
                clock(1, 2, 3, 4, 5, 6),
                1,
                "claims.rs",
                7,
                "E0102 03:04:05.000006       1 claims.rs:7] ",
            ),
            (
                'W',
                clock(12, 31, 23, 59, 59, 999_999),
                1_234_567,
                "mod.rs",
                0,
                "W1231 23:59:59.999999 1234567 mod.rs:0] ",
            ),
            // More than 7 digits: klog keeps the last 7, zeros included.
            (
                'I',
                t,
                10_000_001,
                "a.rs",
                1,
                "I1129 08:50:32.013368 0000001 a.rs:1] ",
            ),
            (
                'I',
                t,
                41_943_040,
                "a.rs",
                1,
                "I1129 08:50:32.013368 1943040 a.rs:1] ",
            ),
            ('I', t, 0, "???", 1, "I1129 08:50:32.013368         ???:1] "),
            (
                'I',
                clock(0, 0, 0, 0, 0, 0),
                99,
                "a.rs",
                4_294_967_295,
                "I0000 00:00:00.000000      99 a.rs:4294967295] ",
            ),
        ] {
            assert_eq!(klog_header(severity, &time, pid, file, line), want);
        }
        for (level, want) in [
            (Level::ERROR, 'E'),
            (Level::WARN, 'W'),
            (Level::INFO, 'I'),
            (Level::DEBUG, 'I'),
            (Level::TRACE, 'I'),
        ] {
            assert_eq!(klog_severity(level), want, "{level}");
        }
        assert_eq!(
            klog_file(Some("src/provisioner/claims.rs"), Some(42)),
            ("claims.rs", 42)
        );
        assert_eq!(
            klog_file(
                Some("/root/.cargo/registry/src/x/kube-client/src/client/mod.rs"),
                Some(3)
            ),
            ("mod.rs", 3)
        );
        assert_eq!(klog_file(Some("main.rs"), None), ("main.rs", 0));
        assert_eq!(klog_file(None, Some(9)), ("???", 1));
    }

    #[test]
    fn local_clock_keeps_the_microseconds() {
        let t = local_clock(UNIX_EPOCH + std::time::Duration::from_micros(1_500_250));
        assert_eq!(t.micros, 500_250);
        assert!(
            (1..=12).contains(&t.month) && (1..=31).contains(&t.day),
            "{t:?}"
        );
        assert!(t.hour < 24 && t.minute < 60 && t.second < 61, "{t:?}");
        let now = local_clock(SystemTime::now());
        assert!((1..=12).contains(&now.month), "{now:?}");
    }

    /// Go's `strconv.Unquote` for what [`go_quote`] writes.
    fn go_unquote(quoted: &str) -> String {
        let inner = quoted
            .strip_prefix('"')
            .and_then(|q| q.strip_suffix('"'))
            .expect("quoted");
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            assert!(c != '"', "bare quote in {quoted}");
            if c != '\\' {
                out.push(c);
                continue;
            }
            let hex = |chars: &mut std::str::Chars<'_>, n: usize| -> char {
                let digits: String = chars.take(n).collect();
                char::from_u32(u32::from_str_radix(&digits, 16).expect("hex")).expect("char")
            };
            out.push(match chars.next().expect("escape") {
                'a' => '\u{7}',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'n' => '\n',
                'r' => '\r',
                't' => '\t',
                'v' => '\u{b}',
                '"' => '"',
                '\\' => '\\',
                'x' => hex(&mut chars, 2),
                'u' => hex(&mut chars, 4),
                'U' => hex(&mut chars, 8),
                other => panic!("unknown escape \\{other} in {quoted}"),
            });
        }
        out
    }

    #[test]
    fn quoting_follows_go_strconv_quote() {
        for (text, want) in [
            ("", r#""""#),
            ("calling CreateVolume", r#""calling CreateVolume""#),
            (r#"a "b" \c"#, r#""a \"b\" \\c""#),
            ("\u{0}\u{1}\u{1f}\u{7f}", r#""\x00\x01\x1f\x7f""#),
            ("\u{7}\u{8}\u{c}\n\r\t\u{b}", r#""\a\b\f\n\r\t\v""#),
            ("line 1\nline 2", r#""line 1\nline 2""#),
            ("it's {ok} <1> ~`", r#""it's {ok} <1> ~`""#),
            // Printable beyond ASCII stays as it is...
            ("é ü 日本 🙂 ∑", r#""é ü 日本 🙂 ∑""#),
            // ...the rest is escaped.
            ("\u{a0}", r#""\u00a0""#),
            ("\u{85}", r#""\u0085""#),
            ("\u{9f}", r#""\u009f""#),
            ("\u{ad}", r#""\u00ad""#),
            ("\u{200b}", r#""\u200b""#),
            ("\u{2028}\u{2029}", r#""\u2028\u2029""#),
            ("\u{3000}", r#""\u3000""#),
            ("\u{feff}", r#""\ufeff""#),
            ("\u{e000}", r#""\ue000""#),
            ("\u{fffe}", r#""\ufffe""#),
            ("\u{f0000}", r#""\U000f0000""#),
            ("\u{e0001}", r#""\U000e0001""#),
            ("\u{10ffff}", r#""\U0010ffff""#),
        ] {
            assert_eq!(go_quote(text), want, "{text:?}");
            assert_eq!(go_unquote(want), text, "{want}");
        }
        // Every ASCII character: printable ones as they are (but `"` and
        // `\`), the others escaped; and the first planes round-trip, with
        // nothing but printable ASCII or unescaped printable text left.
        for n in 0u32..=0x7f {
            let c = char::from_u32(n).expect("ascii");
            let quoted = go_quote(&c.to_string());
            let kept = (0x20..=0x7e).contains(&n) && c != '"' && c != '\\';
            assert_eq!(quoted == format!("\"{c}\""), kept, "{n:#x}: {quoted}");
            assert_eq!(go_unquote(&quoted), c.to_string(), "{n:#x}");
        }
        for n in (0x80u32..0x3_0000).chain(0xE_0000..0x11_0000).step_by(7) {
            let Some(c) = char::from_u32(n) else { continue };
            let quoted = go_quote(&c.to_string());
            assert_eq!(go_unquote(&quoted), c.to_string(), "{n:#x}");
            assert!(
                quoted.chars().all(|q| q == c || (' '..='~').contains(&q)),
                "{n:#x}: {quoted}"
            );
        }
    }

    fn values(pairs: &[(&str, serde_json::Value)]) -> Vec<(String, serde_json::Value)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn text_lines_are_klogs() {
        let t = clock(11, 29, 8, 50, 32, 13_368);
        // The Go image's own line, rebuilt.
        assert_eq!(
            encode_text_line(
                Level::INFO,
                &t,
                7672,
                ("csi-provisioner.go", 156),
                "Version",
                &values(&[("version", serde_json::json!("v6.3.0-56-g0688604fa"))]),
            ),
            r#"I1129 08:50:32.013368    7672 csi-provisioner.go:156] "Version" version="v6.3.0-56-g0688604fa""#
        );
        for (level, message, fields, want) in [
            (
                Level::INFO,
                "provisioned",
                vec![],
                r#"I1129 08:50:32.013368      42 claims.rs:7] "provisioned""#,
            ),
            (
                Level::WARN,
                "saving the PV failed",
                values(&[
                    ("claim", serde_json::json!("ns/data")),
                    ("attempt", serde_json::json!(3)),
                    ("error", serde_json::json!("boom \"quoted\"")),
                ]),
                r#"W1129 08:50:32.013368      42 claims.rs:7] "saving the PV failed" claim="ns/data" attempt=3 err="boom \"quoted\"""#,
            ),
            (
                Level::ERROR,
                "lost\nline \"x\"",
                values(&[
                    ("ok", serde_json::json!(true)),
                    ("negative", serde_json::json!(-5)),
                    ("big", serde_json::json!(u64::MAX)),
                    ("ratio", serde_json::json!(2.5)),
                    ("million", serde_json::json!(1e6)),
                    ("small", serde_json::json!(0.00001)),
                    ("whole", serde_json::json!(3.0)),
                    ("none", serde_json::Value::Null),
                    ("empty", serde_json::json!("")),
                    ("spaced", serde_json::json!("a b=c")),
                ]),
                r#"E1129 08:50:32.013368      42 claims.rs:7] "lost\nline \"x\"" ok=true negative=-5 big=18446744073709551615 ratio=2.5 million=1e+06 small=1e-05 whole=3 none=null empty="" spaced="a b=c""#,
            ),
            // klog's multi-line values: each line after a tab, then ` >`.
            (
                Level::INFO,
                "m",
                values(&[
                    ("v", serde_json::json!("a\nb")),
                    ("k", serde_json::json!(1)),
                ]),
                "I1129 08:50:32.013368      42 claims.rs:7] \"m\" v=<\n\ta\n\tb\n > k=1",
            ),
            (
                Level::INFO,
                "m",
                values(&[("v", serde_json::json!("a\n"))]),
                "I1129 08:50:32.013368      42 claims.rs:7] \"m\" v=<\n\ta\n >",
            ),
            (
                Level::INFO,
                "m",
                values(&[("v", serde_json::json!("\n\n"))]),
                "I1129 08:50:32.013368      42 claims.rs:7] \"m\" v=<\n\t\n\t\n >",
            ),
            (
                Level::INFO,
                "m",
                values(&[("v", serde_json::json!("x\ty \"q\"\nz"))]),
                "I1129 08:50:32.013368      42 claims.rs:7] \"m\" v=<\n\tx\ty \"q\"\n\tz\n >",
            ),
        ] {
            assert_eq!(
                encode_text_line(level, &t, 42, ("claims.rs", 7), message, &fields),
                want
            );
        }
    }

    /// What `format` writes for the events `emit` sends, through a real
    /// subscriber at `-v 0` with `vmodule`.
    fn written<E>(format: E, vmodule: VModule, emit: impl FnOnce()) -> String
    where
        E: FormatEvent<Registry, tracing_subscriber::fmt::format::DefaultFields>
            + Send
            + Sync
            + 'static,
    {
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
                .event_format(format)
                .with_writer(move || writer.clone())
                .with_filter(VerbosityFilter {
                    verbosity: 0,
                    vmodule,
                }),
        );
        tracing::subscriber::with_default(subscriber, emit);
        let bytes = buffer.0.lock().expect("lock").clone();
        String::from_utf8(bytes).expect("utf-8")
    }

    /// The text format end to end through a real subscriber.
    #[test]
    fn text_format_through_a_subscriber() {
        let text = written(
            Klog::text(),
            parse_vmodule("logging=2").expect("valid"),
            || {
                let e = std::io::Error::other("disk full");
                tracing::info!(claim = %"ns/a", retries = 2u64, ok = true, delay = ?std::time::Duration::from_millis(1500), "provisioned {}", "pvc-1");
                tracing::debug!("written: --vmodule raises this file");
                tracing::trace!("not written");
                tracing::warn!(error = %e, "retrying");
                tracing::error!("stopping");
            },
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let pid = std::process::id();
        for (line, severity, rest) in [
            (
                lines[0],
                'I',
                r#""provisioned pvc-1" claim="ns/a" retries=2 ok=true delay="1.5s""#,
            ),
            (lines[1], 'I', r#""written: --vmodule raises this file""#),
            (lines[2], 'W', r#""retrying" err="disk full""#),
            (lines[3], 'E', r#""stopping""#),
        ] {
            let (header, body) = line.split_once("] ").expect("header");
            assert!(header.starts_with(severity), "{line}");
            let (start, line_number) = header.split_at(30);
            assert!(start.ends_with(&format!(" {pid:>7} ")), "{line}");
            let digits = line_number.strip_prefix("logging.rs:").expect("file");
            assert!(digits.parse::<u32>().is_ok(), "{line}");
            assert_eq!(body, rest, "{line}");
        }
    }

    /// The formatter end to end through a real subscriber: one parseable
    /// object per line, fields typed.
    #[test]
    fn json_format_through_a_subscriber() {
        let text = written(Klog::json(), VModule::default(), || {
            let e = std::io::Error::other("disk full");
            tracing::info!(claim = %"ns/a", retries = 2u64, ok = true, "provisioned {}", "pvc-1");
            tracing::debug!("not written at -v 0");
            tracing::warn!(error = %e, "retrying");
            tracing::error!("stopping");
        });
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
