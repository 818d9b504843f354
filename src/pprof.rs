//! `--enable-pprof`: the profiles of Go's `net/http/pprof` that tell where
//! CPU time and memory go, in the same format (gzip-compressed
//! `profile.proto`) and at the same paths, so that a Go runbook's
//! `go tool pprof http://HOST:PORT/debug/pprof/profile?seconds=30` and
//! `…/debug/pprof/heap` work unchanged against this sidecar.
//!
//! - CPU (`/debug/pprof/profile`): pprof-rs samples the stacks of every
//!   thread on `SIGPROF` at 100 Hz, Go's rate, for the requested seconds,
//!   and symbolizes them in-process.
//! - Heap (`/debug/pprof/heap`): jemalloc (the global allocator, see
//!   `src/memory.rs`) records the stack of one allocation per 512 KiB
//!   allocated on average (Go's `MemProfileRate` too) once
//!   [`start_heap_sampling`] has run; a request dumps the sampled
//!   allocations still live and converts them (`pprof_util`, in-process
//!   symbols). jemalloc reports in-use bytes only: the profile has the one
//!   sample type `inuse_space`, where Go's has four.
//!
//! The other Go profiles (goroutine, block, mutex, …) describe the Go
//! runtime and have no counterpart here: they answer 404, as Go answers an
//! unknown profile.
//!
//! HTTP routing stays in `src/http.rs`; this module answers one request as
//! a [`Reply`].

use std::io::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;

/// Go's default when `seconds` is absent.
pub const DEFAULT_CPU_SECONDS: u64 = 30;
/// A day: a longer request is almost certainly a mistake, and the profiler
/// serves one request at a time.
pub const MAX_CPU_SECONDS: u64 = 24 * 60 * 60;
/// Go's `runtime.SetCPUProfileRate` default.
const CPU_FREQUENCY_HZ: i32 = 100;
/// Libraries whose frames pprof-rs must not unwind from its signal handler:
/// unwinding through them can deadlock or crash (pprof-rs' own advice).
const UNWIND_BLOCKLIST: &[&str] = &["libc", "libgcc", "pthread", "vdso"];

#[derive(Debug, thiserror::Error)]
pub enum PprofError {
    /// Go's words, so that scripts which match them keep working.
    #[error("Could not enable CPU profiling: cpu profiling already in use")]
    CpuBusy,
    #[error("Could not enable CPU profiling: {0}")]
    CpuStart(::pprof::Error),
    #[error("could not build the CPU profile: {0}")]
    CpuReport(::pprof::Error),
    #[error(
        "heap profiling is not available: the allocator was started without profiling (is jemalloc the global allocator?)"
    )]
    HeapUnavailable,
    #[error("could not dump the heap profile: {0}")]
    HeapDump(String),
    #[error("could not compress the profile: {0}")]
    Compress(std::io::Error),
}

/// One answer under `/debug/pprof/`.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: &'static str,
    /// Go names a profile download `attachment; filename="profile"`.
    pub attachment: Option<&'static str>,
    pub body: Bytes,
}

impl Reply {
    fn text(status: StatusCode, message: impl Into<String>) -> Self {
        let mut message = message.into();
        if !message.ends_with('\n') {
            message.push('\n');
        }
        Reply {
            status,
            content_type: "text/plain; charset=utf-8",
            attachment: None,
            body: Bytes::from(message),
        }
    }

    fn profile(name: &'static str, body: Vec<u8>) -> Self {
        Reply {
            status: StatusCode::OK,
            content_type: "application/octet-stream",
            attachment: Some(name),
            body: Bytes::from(body),
        }
    }

    fn failed(error: &PprofError) -> Self {
        Reply::text(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
    }
}

/// Answers `path` (under `/debug/pprof`) with its query string.
pub async fn serve(path: &str, query: Option<&str>) -> Reply {
    let name = path
        .strip_prefix("/debug/pprof")
        .unwrap_or(path)
        .trim_start_matches('/');
    match name {
        "" => Reply {
            status: StatusCode::OK,
            content_type: "text/html; charset=utf-8",
            attachment: None,
            body: Bytes::from_static(INDEX.as_bytes()),
        },
        "profile" => {
            let seconds = match cpu_seconds(query) {
                Ok(seconds) => seconds,
                Err(message) => return Reply::text(StatusCode::BAD_REQUEST, message),
            };
            match cpu_profile(Duration::from_secs(seconds)).await {
                Ok(body) => Reply::profile("attachment; filename=\"profile\"", body),
                Err(e) => Reply::failed(&e),
            }
        }
        "heap" => {
            if let Some(message) = unsupported_heap_query(query) {
                return Reply::text(StatusCode::BAD_REQUEST, message);
            }
            match tokio::task::spawn_blocking(heap_profile).await {
                Ok(Ok(body)) => Reply::profile("attachment; filename=\"heap\"", body),
                Ok(Err(e)) => Reply::failed(&e),
                Err(e) => Reply::text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the heap profile failed: {e}"),
                ),
            }
        }
        _ => Reply::text(StatusCode::NOT_FOUND, "Unknown profile"),
    }
}

/// The value of `key` in a query string (the first one; no percent
/// decoding: the values read here are plain numbers).
fn query_value<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then_some(v)
    })
}

/// `seconds` of a CPU profile request. Go falls back to 30 on a value it
/// cannot read; a clear refusal is kinder to whoever mistyped it.
pub fn cpu_seconds(query: Option<&str>) -> Result<u64, String> {
    match query_value(query, "seconds") {
        None | Some("") => Ok(DEFAULT_CPU_SECONDS),
        Some(value) => match value.parse::<u64>() {
            Ok(seconds) if (1..=MAX_CPU_SECONDS).contains(&seconds) => Ok(seconds),
            _ => Err(format!(
                "invalid seconds {value:?}: want a whole number of seconds from 1 to {MAX_CPU_SECONDS} (default {DEFAULT_CPU_SECONDS})"
            )),
        },
    }
}

/// Go's heap handler also serves a delta over `seconds` and a legacy text
/// format (`debug=1`); neither exists here, and silently answering
/// something else would mislead.
fn unsupported_heap_query(query: Option<&str>) -> Option<String> {
    if query_value(query, "seconds").is_some() {
        return Some(
            "seconds is not supported for the heap profile: it is a snapshot of the memory in use; \
             compare two snapshots with `go tool pprof -base OLD NEW`"
                .into(),
        );
    }
    match query_value(query, "debug") {
        None | Some("") | Some("0") => None,
        Some(_) => Some(
            "debug=N (Go's legacy text format) is not supported: read the profile with `go tool pprof`"
                .into(),
        ),
    }
}

/// Samples CPU stacks for `duration`. The profiler is process-wide: a
/// second request while one runs fails, as in Go. Dropping the future (the
/// client went away) stops it.
pub async fn cpu_profile(duration: Duration) -> Result<Vec<u8>, PprofError> {
    let guard = ::pprof::ProfilerGuardBuilder::default()
        .frequency(CPU_FREQUENCY_HZ)
        .blocklist(UNWIND_BLOCKLIST)
        .build()
        .map_err(|e| match e {
            ::pprof::Error::Running => PprofError::CpuBusy,
            other => PprofError::CpuStart(other),
        })?;
    let _running = CpuProfileRunning::start();
    tokio::time::sleep(duration).await;
    // Symbolizing takes a while (tens of milliseconds and more): not on a
    // runtime worker.
    let profile = tokio::task::spawn_blocking(move || {
        let report = guard.report().build().map_err(PprofError::CpuReport)?;
        drop(guard);
        report.pprof().map_err(PprofError::CpuReport)
    })
    .await
    .map_err(|e| PprofError::CpuReport(::pprof::Error::IoError(std::io::Error::other(e))))??;
    let mut profile = profile;
    drop_sampler_frames(&mut profile, is_cpu_sampler_frame);
    gzip(&::pprof::protos::Message::encode_to_vec(&profile))
}

/// Whether a CPU profile is being taken (for a test that must ask for a
/// second one while the first runs, without guessing when it started).
pub fn cpu_profile_running() -> bool {
    CPU_PROFILE_RUNNING.load(std::sync::atomic::Ordering::SeqCst)
}

static CPU_PROFILE_RUNNING: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Marks a CPU profile as running until dropped (with the profile's
/// future, however it ends).
struct CpuProfileRunning;

impl CpuProfileRunning {
    fn start() -> Self {
        CPU_PROFILE_RUNNING.store(true, std::sync::atomic::Ordering::SeqCst);
        CpuProfileRunning
    }
}

impl Drop for CpuProfileRunning {
    fn drop(&mut self) {
        CPU_PROFILE_RUNNING.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// pprof-rs' unwinder, called in the signal handler: the leaf of every
/// CPU sample.
fn is_cpu_sampler_frame(name: &str) -> bool {
    name.starts_with("backtrace::backtrace::")
        || name.contains("pprof::backtrace")
        || name.contains("pprof::profiler::")
}

/// jemalloc's sampling, the global allocator and `alloc::alloc`'s entry
/// points: the leaf of every heap sample (Go's heap stacks start at the
/// allocating code too, below its runtime's `mallocgc`).
fn is_heap_sampler_frame(name: &str) -> bool {
    name == "alloc"
        || name.starts_with("alloc::alloc::")
        || name.starts_with("<alloc::alloc::Global")
        || [
            "_rjem_",
            "prof_",
            "imalloc",
            "ialloc",
            "irealloc",
            "iralloc",
            "do_rallocx",
            "__rg_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
        || name.contains("tikv_jemallocator")
        || name.contains("__rust_alloc")
        || name.contains("__rust_realloc")
}

/// Removes from the leaf end of each sample's stack the frames of the
/// machinery that took the sample, which would otherwise be every stack's
/// leaf: all of the profile's "flat" cost in one function.
fn drop_sampler_frames(profile: &mut ::pprof::protos::Profile, is_sampler: fn(&str) -> bool) {
    use std::collections::{HashMap, HashSet};
    let function_names: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| {
            let name = usize::try_from(f.name)
                .ok()
                .and_then(|i| profile.string_table.get(i))
                .map_or("", String::as_str);
            (f.id, name)
        })
        .collect();
    let sampler_locations: HashSet<u64> = profile
        .location
        .iter()
        .filter(|l| {
            l.line.iter().any(|line| {
                function_names
                    .get(&line.function_id)
                    .is_some_and(|name| is_sampler(name))
            })
        })
        .map(|l| l.id)
        .collect();
    for sample in &mut profile.sample {
        let own = sample
            .location_id
            .iter()
            .take_while(|id| sampler_locations.contains(id))
            .count();
        // A stack of nothing but the sampler keeps it rather than vanish.
        if own < sample.location_id.len() {
            sample.location_id.drain(..own);
        }
    }
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>, PprofError> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).map_err(PprofError::Compress)?;
    encoder.finish().map_err(PprofError::Compress)
}

/// Turns on jemalloc's allocation sampling (it is compiled in and
/// configured at start, `src/memory.rs`, but off until asked for, so a
/// sidecar without `--enable-pprof` pays nothing for it).
pub fn start_heap_sampling() -> Result<(), PprofError> {
    crate::memory::set_heap_sampling(true).map_err(|e| match e {
        crate::memory::MemoryError::NotProfiling => PprofError::HeapUnavailable,
        other => PprofError::HeapDump(other.to_string()),
    })
}

/// The sampled allocations still live, as a gzip-compressed pprof profile.
/// jemalloc writes its dump to a file name; an anonymous memory file keeps
/// that working on a read-only root file system, with no `/tmp`.
pub fn heap_profile() -> Result<Vec<u8>, PprofError> {
    let dump = crate::memory::heap_dump().map_err(|e| match e {
        crate::memory::MemoryError::NotProfiling => PprofError::HeapUnavailable,
        other => PprofError::HeapDump(other.to_string()),
    })?;
    let profile =
        pprof_util::parse_jeheap(std::io::BufReader::new(dump), mappings::MAPPINGS.as_deref())
            .map_err(|e| PprofError::HeapDump(format!("{e:#}")))?;
    let gzipped = profile.to_pprof(("inuse_space", "bytes"), ("space", "bytes"), None);
    // pprof_util's message types are its own: read back with pprof-rs'
    // (the same profile.proto) to drop the sampler's frames.
    let mut raw = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(gzipped.as_slice()),
        &mut raw,
    )
    .map_err(|e| PprofError::HeapDump(format!("reading back the profile: {e}")))?;
    let mut profile =
        <::pprof::protos::Profile as ::pprof::protos::Message>::decode(raw.as_slice())
            .map_err(|e| PprofError::HeapDump(format!("reading back the profile: {e}")))?;
    drop_sampler_frames(&mut profile, is_heap_sampler_frame);
    gzip(&::pprof::protos::Message::encode_to_vec(&profile))
}

/// Go's index page, cut to the profiles served here.
const INDEX: &str = "<html>
<head>
<title>/debug/pprof/</title>
</head>
<body>
/debug/pprof/
<br>
<p>Profiles are in pprof's format: read them with <code>go tool pprof</code>.</p>
Types of profiles available:
<table>
<thead><td>Profile</td></thead>
<tr><td><a href='heap'>heap</a></td></tr>
<tr><td><a href='profile'>profile</a></td></tr>
</table>
<br>
<p>
Profile Descriptions:
<ul>
<li><div class=profile-name>heap: </div> A sampling of memory allocations of live objects (jemalloc, one sample per 512 KiB allocated on average; in-use bytes only).</li>
<li><div class=profile-name>profile: </div> CPU profile. You can specify the duration in the seconds GET parameter (default 30). After you get the profile file, use the go tool pprof command to investigate the profile.</li>
</ul>
</p>
</body>
</html>
";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_and_bounds() {
        assert_eq!(cpu_seconds(None), Ok(30));
        assert_eq!(cpu_seconds(Some("")), Ok(30));
        assert_eq!(cpu_seconds(Some("debug=1")), Ok(30));
        assert_eq!(cpu_seconds(Some("seconds=")), Ok(30));
        assert_eq!(cpu_seconds(Some("seconds=5")), Ok(5));
        assert_eq!(cpu_seconds(Some("x=1&seconds=86400")), Ok(86400));
        for bad in ["0", "-1", "1.5", "abc", "86401", "99999999999999999999"] {
            let error = cpu_seconds(Some(&format!("seconds={bad}"))).expect_err(bad);
            assert!(error.contains("invalid seconds"), "{error}");
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn heap_queries_go_serves_but_this_does_not() {
        assert_eq!(unsupported_heap_query(None), None);
        assert_eq!(unsupported_heap_query(Some("gc=1")), None);
        assert_eq!(unsupported_heap_query(Some("debug=0")), None);
        assert!(unsupported_heap_query(Some("debug=1")).is_some());
        assert!(unsupported_heap_query(Some("seconds=10")).is_some());
    }

    #[tokio::test]
    async fn index_and_unknown_profiles() {
        let index = serve("/debug/pprof/", None).await;
        assert_eq!(index.status, StatusCode::OK);
        let body = String::from_utf8_lossy(&index.body).into_owned();
        assert!(
            body.contains("href='heap'") && body.contains("href='profile'"),
            "{body}"
        );
        assert_eq!(serve("/debug/pprof", None).await.status, StatusCode::OK);
        for unknown in ["goroutine", "allocs", "mutex", "nope", "heap/x"] {
            let reply = serve(&format!("/debug/pprof/{unknown}"), None).await;
            assert_eq!(reply.status, StatusCode::NOT_FOUND, "{unknown}");
        }
        let reply = serve("/debug/pprof/profile", Some("seconds=abc")).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    }
}
