//! Fault injection, driven by a JSON file that the driver reads at every
//! call (`Config::faults_file`, `--faults-file`). A missing file means no
//! faults; an empty path disables the mechanism.
//!
//! ```json
//! {
//!   "probe_ready": false,
//!   "rules": [
//!     { "method": "CreateVolume", "code": "UNAVAILABLE", "message": "backend busy", "count": 2 },
//!     { "method": "DeleteVolume", "delay_ms": 3000 },
//!     { "method": "CreateVolume", "target": "pvc-1234", "exit_after_backend_change": true, "count": 1 }
//!   ]
//! }
//! ```
//!
//! Semantics, per gRPC call:
//! * `probe_ready: false` makes `Probe` answer `ready = false` (default true).
//! * The first rule that matches the call fires; at most one rule per call.
//!   A rule matches when `method` is the RPC's name as in csi.proto
//!   (`CreateVolume`, `NodePublishVolume`, ...) or `*`, when `target` is
//!   absent or equals the call's object (the `name` of CreateVolume and
//!   CreateSnapshot; the volume id or snapshot id of other calls), and when
//!   its `count` is absent (unlimited) or above 0.
//! * A firing rule first sleeps `delay_ms` milliseconds; then, with `code`,
//!   the call fails with that gRPC status (`message`, default "injected
//!   fault") without touching the backend; with
//!   `exit_after_backend_change`, the call runs normally and, once it has
//!   succeeded and its backend change is on disk, the process exits with
//!   code [`EXIT_CODE`] (75) before replying. A call that fails on its own
//!   does not exit and does not consume the rule.
//! * With `reply`, the call runs normally and its answer is then altered
//!   as a misbehaving driver's would be (see [`Reply`]): the backend holds
//!   what the call did, the caller learns something else.
//! * `work_ms` (`CreateVolume` only; other methods ignore it) makes the
//!   backend work itself slow: once the volume's name is locked, the call
//!   waits that long before it creates the volume. Unlike `delay_ms`, which
//!   ends with the call when the caller gives up (a deadline passed: tonic
//!   drops the handler), the work goes on and the volume is created all the
//!   same, as by a backend that does not watch the caller's deadline; a
//!   repeated call for the same name waits for it (or see `name_busy`).
//! * `wire_message` (with `code`) is the status message exactly as it goes
//!   on the wire, the value of the `grpc-message` header: percent-encoded
//!   bytes, as gRPC encodes a message there, sent unchanged, so that `%FF`
//!   puts a byte on the wire that is not UTF-8 once decoded. A tonic `Status`
//!   holds its message as a `String` and cannot carry one;
//!   [`WireMessage`] writes the header. It replaces `message`.
//! * `count` is decremented in the file (atomic rewrite) each time the rule
//!   fires, so a restarted driver sees what is left; a rule at 0 stays in
//!   the file and is inert.
//! * `code` takes the gRPC code name in any case, with or without
//!   underscores (`UNAVAILABLE`, `DeadlineExceeded`, `resource_exhausted`),
//!   or its number. `code` excludes `exit_after_backend_change` and `reply`.
//! * `busy_above: {"limit": N, "code": "ABORTED"}` refuses `CreateVolume`
//!   and `DeleteVolume` while N of them are running (code default
//!   `RESOURCE_EXHAUSTED`), before any rule: a backend that takes only so
//!   many operations at once.
//! * `name_busy: "ALREADY_EXISTS"` answers a `CreateVolume` at once with
//!   that code while an earlier call for the same name (or its content
//!   source) still runs, instead of waiting for it, as drivers do that
//!   answer a repeat after a timeout with "already exists", or with ABORTED
//!   "operation locked" (docs/driver-habits.md, rows 5 and 4).
//! * A malformed file (bad JSON, unknown field or method, bad code) fails
//!   every call with `INTERNAL` naming the problem, so that a typo is not
//!   silently ignored.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tonic::codegen::http::{self, HeaderMap, HeaderValue};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};

use crate::Error;

/// Exit code of the process when an `exit_after_backend_change` rule fires.
pub const EXIT_CODE: i32 = 75;

/// The RPC names a rule may name (besides `*`).
pub const METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "GetSnapshot",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "ControllerModifyVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

/// The content of a faults file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    /// `Probe` answers this as `ready` (default true).
    #[serde(default = "default_true")]
    pub probe_ready: bool,
    /// Rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Fault>,
    /// A backend that chokes: `CreateVolume` and `DeleteVolume` calls
    /// beyond this many running at once are refused (before any rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_above: Option<BusyAbove>,
    /// A `CreateVolume` for a name whose earlier call still runs is
    /// answered at once with this code (name or number) instead of waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_busy: Option<String>,
}

/// Refuses `CreateVolume` and `DeleteVolume` calls while `limit` of them
/// are running, with `code` (default `RESOURCE_EXHAUSTED`), as a backend
/// that takes only so many operations at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BusyAbove {
    pub limit: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

fn default_true() -> bool {
    true
}

impl Default for Faults {
    fn default() -> Faults {
        Faults {
            probe_ready: true,
            rules: Vec::new(),
            busy_above: None,
            name_busy: None,
        }
    }
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// RPC name as in csi.proto (see [`METHODS`]) or `*`.
    pub method: String,
    /// Only calls about this object: CreateVolume/CreateSnapshot name, or the
    /// volume/snapshot id of other calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// gRPC code to fail with (name or number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Status message of the injected error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Status message of the injected error as its `grpc-message` header
    /// carries it: percent-encoded, sent unchanged (may decode to bytes
    /// that are not UTF-8). Replaces `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_message: Option<String>,
    /// Delay before the call is handled (or fails).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
    /// `CreateVolume`: time its backend work takes, with the name locked;
    /// the work finishes even when the caller has gone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub work_ms: u64,
    /// Run the call, then exit with [`EXIT_CODE`] instead of replying.
    #[serde(default, skip_serializing_if = "is_false")]
    pub exit_after_backend_change: bool,
    /// Remaining firings; `None` = unlimited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Alter the (successful) answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<Reply>,
}

/// How a `reply` rule alters an answer; fields that do not apply to the
/// call's answer are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    /// CreateVolume: this volume id instead (e.g. empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
    /// CreateVolume: this capacity instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<i64>,
    /// CreateVolume: these topology segments instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accessible_topology: Option<Vec<std::collections::BTreeMap<String, String>>>,
    /// CreateVolume: a volume context entry of this many bytes added (an
    /// oversized message).
    #[serde(default, skip_serializing_if = "is_zero_usize")]
    pub padding_bytes: usize,
    /// ControllerGetCapabilities, GetPluginCapabilities: a capability with
    /// this enum value (unknown to the caller) added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_capability: Option<i32>,
}

fn is_zero_usize(v: &usize) -> bool {
    *v == 0
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Fault {
    fn new(method: &str) -> Fault {
        Fault {
            method: method.to_owned(),
            target: None,
            code: None,
            message: None,
            wire_message: None,
            delay_ms: 0,
            work_ms: 0,
            exit_after_backend_change: false,
            reply: None,
            count: None,
        }
    }

    /// Fails `method` with `code`.
    pub fn error(method: &str, code: Code) -> Fault {
        Fault {
            code: Some(code_name(code).to_owned()),
            ..Fault::new(method)
        }
    }

    /// Delays `method` by `delay` (then handles it normally).
    pub fn delay(method: &str, delay: Duration) -> Fault {
        Fault {
            delay_ms: millis(delay),
            ..Fault::new(method)
        }
    }

    /// Makes the backend work of `method` (`CreateVolume`) take `work`,
    /// and go on when the caller has gone.
    pub fn work(method: &str, work: Duration) -> Fault {
        Fault {
            work_ms: millis(work),
            ..Fault::new(method)
        }
    }

    /// Runs `method` and exits with [`EXIT_CODE`] once it succeeded.
    pub fn exit_after_backend_change(method: &str) -> Fault {
        Fault {
            exit_after_backend_change: true,
            ..Fault::new(method)
        }
    }

    /// Limits the rule to `n` firings.
    pub fn times(mut self, n: u32) -> Fault {
        self.count = Some(n);
        self
    }

    /// Limits the rule to calls about `target` (a name or an id).
    pub fn on(mut self, target: &str) -> Fault {
        self.target = Some(target.to_owned());
        self
    }

    /// Sets the status message of an error rule.
    pub fn with_message(mut self, message: &str) -> Fault {
        self.message = Some(message.to_owned());
        self
    }

    /// Sets the status message of an error rule as it goes on the wire
    /// (percent-encoded `grpc-message`; see [`Fault::wire_message`]).
    pub fn with_wire_message(mut self, encoded: &str) -> Fault {
        self.wire_message = Some(encoded.to_owned());
        self
    }

    /// Adds a delay to the rule.
    pub fn with_delay(mut self, delay: Duration) -> Fault {
        self.delay_ms = millis(delay);
        self
    }

    /// Alters the next answers of `method` as `reply` says.
    pub fn reply(method: &str, reply: Reply) -> Fault {
        Fault {
            reply: Some(reply),
            ..Fault::new(method)
        }
    }

    fn validate(&self) -> Result<(), String> {
        if self.method != "*" && !METHODS.contains(&self.method.as_str()) {
            return Err(format!("unknown method {:?}", self.method));
        }
        if let Some(code) = &self.code {
            let parsed = parse_code(code)?;
            if parsed == Code::Ok {
                return Err("code OK is not a fault".to_owned());
            }
            if self.exit_after_backend_change {
                return Err("code and exit_after_backend_change are exclusive".to_owned());
            }
            if self.reply.is_some() {
                return Err("code and reply are exclusive".to_owned());
            }
        }
        if let Some(encoded) = &self.wire_message {
            if self.code.is_none() {
                return Err("wire_message needs a code".to_owned());
            }
            HeaderValue::from_str(encoded)
                .map_err(|_| format!("wire_message {encoded:?} is not a valid header value"))?;
        }
        Ok(())
    }

    fn matches(&self, method: &str, target: Option<&str>) -> bool {
        (self.method == "*" || self.method == method)
            && self
                .target
                .as_deref()
                .is_none_or(|want| target == Some(want))
            && self.count != Some(0)
    }
}

pub use csi_proto::codes::{code_name, parse_code};

impl Faults {
    /// Reads a faults file; a missing file is [`Faults::default`] (no faults).
    pub fn load(path: &Path) -> Result<Faults, Error> {
        let bad = |reason: String| Error::Faults {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Faults::default()),
            Err(e) => return Err(bad(e.to_string())),
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Faults::default());
        }
        let faults: Faults = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        faults.validate().map_err(bad)?;
        Ok(faults)
    }

    fn validate(&self) -> Result<(), String> {
        for (i, rule) in self.rules.iter().enumerate() {
            rule.validate().map_err(|r| format!("rule {i}: {r}"))?;
        }
        if let Some(code) = &self.name_busy
            && parse_code(code).map_err(|e| format!("name_busy: {e}"))? == Code::Ok
        {
            return Err("name_busy: code OK is not a fault".to_owned());
        }
        Ok(())
    }

    /// Writes the file atomically (temporary file + rename), so that a
    /// running driver never reads a partial file.
    pub fn write(&self, path: &Path) -> Result<(), Error> {
        self.validate().map_err(|reason| Error::Faults {
            path: path.to_path_buf(),
            reason,
        })?;
        crate::store::write_json_atomic(path, self)
    }

    /// Faults with the given rules and a ready probe.
    pub fn with_rules(rules: Vec<Fault>) -> Faults {
        Faults {
            probe_ready: true,
            rules,
            busy_above: None,
            name_busy: None,
        }
    }
}

/// Removes a faults file (no faults from the next call on).
pub fn clear(path: &Path) -> Result<(), Error> {
    crate::store::remove_file_if_exists(path)
}

/// Applies the faults file to calls.
pub(crate) struct Injector {
    path: PathBuf,
    // Serializes read-modify-write of the file between concurrent calls.
    lock: Mutex<()>,
    /// `CreateVolume` and `DeleteVolume` calls running now (`busy_above`).
    volume_calls: Arc<AtomicUsize>,
}

/// Calls refused by `busy_above` in this process, for benchmarks.
static BUSY_REFUSALS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many calls `busy_above` has refused in this process so far.
pub fn busy_refusals() -> u64 {
    BUSY_REFUSALS.load(Ordering::SeqCst)
}

/// A running `CreateVolume` or `DeleteVolume`, counted while it lives.
pub(crate) struct VolumeCall(Arc<AtomicUsize>);

impl Drop for VolumeCall {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a matched rule asks of the call after its delay and error.
pub(crate) struct Pending {
    exit: Option<(usize, Fault)>,
    /// How to alter the answer.
    pub(crate) reply: Option<Reply>,
    /// How long the call's backend work takes (`work_ms`).
    pub(crate) work: Duration,
}

impl Pending {
    fn none() -> Pending {
        Pending {
            exit: None,
            reply: None,
            work: Duration::ZERO,
        }
    }
}

tokio::task_local! {
    /// The `work_ms` of the rule that matched the running call; set around
    /// the call's body by `Driver::call` and carried into the task of
    /// `Driver::to_completion`, so that it survives the caller's going.
    static WORK: Duration;
}

/// Runs `body` with `work` as its backend work time ([`slow_work`]).
pub(crate) async fn with_work<F: Future>(work: Duration, body: F) -> F::Output {
    WORK.scope(work, body).await
}

/// The backend work time of the running call (zero outside a call).
pub(crate) fn current_work() -> Duration {
    WORK.try_with(|work| *work).unwrap_or_default()
}

/// The backend work of a `work_ms` rule: called by the handler once its
/// object is locked, it waits that long (nothing without the rule).
pub(crate) async fn slow_work(method: &str, target: &str) {
    let work = current_work();
    if !work.is_zero() {
        tracing::info!(method, target, ?work, "fault injected: slow backend work");
        tokio::time::sleep(work).await;
    }
}

/// The metadata key that carries a `wire_message` from the injector to
/// [`WireMessage`], which moves it into `grpc-message`.
pub(crate) const WIRE_MESSAGE_METADATA: &str = "x-hostpath-wire-message";

/// The header that carries a gRPC status message.
const GRPC_MESSAGE: &str = "grpc-message";

/// Moves the value of [`WIRE_MESSAGE_METADATA`] (set by a `wire_message`
/// rule) into `grpc-message`, unchanged. tonic answers an error with
/// headers only ("Trailers-Only"), so the response headers hold both.
pub fn put_wire_message(headers: &mut HeaderMap) {
    if let Some(encoded) = headers.remove(WIRE_MESSAGE_METADATA) {
        headers.insert(http::HeaderName::from_static(GRPC_MESSAGE), encoded);
    }
}

/// A gRPC service whose error responses may carry a `wire_message`: the
/// status message as its bytes go on the wire (see [`put_wire_message`]).
#[derive(Clone)]
pub struct WireMessage<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for WireMessage<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<http::Request<B>> for WireMessage<S>
where
    S: tonic::codegen::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.0.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            put_wire_message(response.headers_mut());
            Ok(response)
        })
    }
}

/// The status of an error rule: `message`, or a `wire_message` in the
/// metadata for [`WireMessage`] to send.
fn injected_status(rule: &Fault) -> Result<Status, Status> {
    let code = parse_code(rule.code.as_deref().unwrap_or_default()).map_err(Status::internal)?;
    let message = rule
        .message
        .clone()
        .unwrap_or_else(|| "injected fault".to_owned());
    let Some(encoded) = &rule.wire_message else {
        return Ok(Status::new(code, message));
    };
    let value = MetadataValue::try_from(encoded.as_str())
        .map_err(|e| Status::internal(format!("wire_message {encoded:?}: {e}")))?;
    let mut metadata = MetadataMap::new();
    metadata.insert(WIRE_MESSAGE_METADATA, value);
    Ok(Status::with_metadata(code, message, metadata))
}

impl Injector {
    pub(crate) fn new(path: PathBuf) -> Injector {
        Injector {
            path,
            lock: Mutex::new(()),
            volume_calls: Arc::default(),
        }
    }

    /// Counts a `CreateVolume` or `DeleteVolume` as running, or refuses it
    /// when `busy_above` says the backend is full; other calls pass.
    pub(crate) fn admit(&self, method: &str) -> Result<Option<VolumeCall>, Status> {
        if !matches!(method, "CreateVolume" | "DeleteVolume") {
            return Ok(None);
        }
        let busy = if self.enabled() {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.load()?.busy_above
        } else {
            None
        };
        let running = self.volume_calls.fetch_add(1, Ordering::SeqCst);
        let call = VolumeCall(Arc::clone(&self.volume_calls));
        if let Some(busy) = busy
            && running >= busy.limit as usize
        {
            let code = match &busy.code {
                Some(code) => parse_code(code).map_err(Status::internal)?,
                None => Code::ResourceExhausted,
            };
            BUSY_REFUSALS.fetch_add(1, Ordering::SeqCst);
            tracing::info!(method, running, limit = busy.limit, "backend busy: refused");
            return Err(Status::new(
                code,
                format!(
                    "backend busy: {running} volume operations running, at most {} at once",
                    busy.limit
                ),
            ));
        }
        Ok(Some(call))
    }

    fn enabled(&self) -> bool {
        !self.path.as_os_str().is_empty()
    }

    fn load(&self) -> Result<Faults, Status> {
        Faults::load(&self.path).map_err(|e| {
            tracing::error!(error = %e, "faults file is invalid");
            Status::internal(e.to_string())
        })
    }

    /// The code `name_busy` answers a call for a busy name with (`None`:
    /// the call waits for the name).
    pub(crate) fn name_busy(&self) -> Result<Option<Code>, Status> {
        if !self.enabled() {
            return Ok(None);
        }
        let name_busy = {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.load()?.name_busy
        };
        name_busy
            .map(|code| parse_code(&code).map_err(Status::internal))
            .transpose()
    }

    /// Whether `Probe` should report ready.
    pub(crate) fn probe_ready(&self) -> Result<bool, Status> {
        if !self.enabled() {
            return Ok(true);
        }
        let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        Ok(self.load()?.probe_ready)
    }

    /// Applies the first matching rule: delay, then error (consumed), or a
    /// pending exit (consumed when it happens).
    pub(crate) async fn before(
        &self,
        method: &str,
        target: Option<&str>,
    ) -> Result<Pending, Status> {
        if !self.enabled() {
            return Ok(Pending::none());
        }
        let matched = {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            let mut faults = self.load()?;
            let Some(index) = faults.rules.iter().position(|r| r.matches(method, target)) else {
                return Ok(Pending::none());
            };
            let rule = faults.rules[index].clone();
            if !rule.exit_after_backend_change
                && let Some(count) = faults.rules[index].count.as_mut()
            {
                *count -= 1;
                faults
                    .write(&self.path)
                    .map_err(|e| Status::internal(e.to_string()))?;
            }
            (index, rule)
        };
        let (index, rule) = matched;
        tracing::info!(method, target, rule = ?rule, "fault injected");
        if rule.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(rule.delay_ms)).await;
        }
        if rule.code.is_some() {
            return Err(injected_status(&rule)?);
        }
        Ok(Pending {
            reply: rule.reply.clone(),
            work: Duration::from_millis(rule.work_ms),
            exit: rule.exit_after_backend_change.then_some((index, rule)),
        })
    }

    /// Called once the call has succeeded: exits the process when the
    /// matched rule asks for it, after consuming the rule in the file.
    pub(crate) fn after_success(&self, pending: Pending, method: &str) {
        let Some((index, rule)) = pending.exit else {
            return;
        };
        {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            match Faults::load(&self.path) {
                Ok(mut faults) => {
                    if let Some(current) = faults.rules.get_mut(index) {
                        let same_rule = Fault {
                            count: current.count,
                            ..rule.clone()
                        } == *current;
                        if same_rule && let Some(count) = current.count.as_mut() {
                            *count = count.saturating_sub(1);
                            if let Err(e) = faults.write(&self.path) {
                                tracing::error!(error = %e, "cannot consume the exit rule");
                            }
                        }
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot consume the exit rule"),
            }
        }
        tracing::warn!(
            method,
            code = EXIT_CODE,
            "fault injected: exiting after the backend change, before replying"
        );
        std::process::exit(EXIT_CODE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_validates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("faults.json");
        assert_eq!(Faults::load(&path).expect("missing"), Faults::default());
        std::fs::write(&path, "  \n").expect("write");
        assert_eq!(Faults::load(&path).expect("empty"), Faults::default());
        for bad in [
            r#"{"rules":[{"method":"CreateVolumes"}]}"#,
            r#"{"rules":[{"method":"CreateVolume","code":"NOPE"}]}"#,
            r#"{"rules":[{"method":"CreateVolume","code":"OK"}]}"#,
            r#"{"rules":[{"method":"CreateVolume","code":"UNAVAILABLE","exit_after_backend_change":true}]}"#,
            r#"{"rules":[{"method":"CreateVolume","cnt":1}]}"#,
            r#"{"rules":[{"method":"CreateVolume","code":"INTERNAL","reply":{"volume_id":""}}]}"#,
            r#"{"rules":[{"method":"CreateVolume","reply":{"volume":""}}]}"#,
            r#"{"ready":false}"#,
            r#"{"rules":"#,
            r#"{"name_busy":"NOPE"}"#,
            r#"{"name_busy":"OK"}"#,
            r#"{"rules":[{"method":"CreateVolume","wire_message":"caf%E9"}]}"#,
            "{\"rules\":[{\"method\":\"CreateVolume\",\"code\":\"INTERNAL\",\"wire_message\":\"a\\nb\"}]}",
        ] {
            std::fs::write(&path, bad).expect("write");
            assert!(
                matches!(Faults::load(&path), Err(Error::Faults { .. })),
                "{bad}"
            );
        }
        let faults = Faults {
            probe_ready: false,
            rules: vec![
                Fault::error("CreateVolume", Code::Unavailable)
                    .times(2)
                    .on("pvc-1")
                    .with_message("busy"),
                Fault::delay("*", Duration::from_millis(5)),
                Fault::work("CreateVolume", Duration::from_millis(7)).times(1),
                Fault::error("CreateVolume", Code::Internal).with_wire_message("caf%E9"),
                Fault::exit_after_backend_change("DeleteVolume").times(1),
                Fault::reply(
                    "CreateVolume",
                    Reply {
                        volume_id: Some(String::new()),
                        capacity_bytes: Some(1),
                        accessible_topology: Some(vec![std::collections::BTreeMap::from([(
                            "k".to_owned(),
                            "v".to_owned(),
                        )])]),
                        padding_bytes: 10,
                        extra_capability: Some(999),
                    },
                )
                .times(1),
            ],
            busy_above: Some(BusyAbove {
                limit: 3,
                code: Some("ABORTED".to_owned()),
            }),
            name_busy: Some("ALREADY_EXISTS".to_owned()),
        };
        faults.write(&path).expect("write");
        assert_eq!(Faults::load(&path).expect("load"), faults);
        let bad = Faults::with_rules(vec![Fault::error("Nope", Code::Internal)]);
        assert!(bad.write(&path).is_err());
        clear(&path).expect("clear");
        clear(&path).expect("clear twice");
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn counts_targets_and_first_match() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("faults.json");
        Faults::with_rules(vec![
            Fault::error("CreateVolume", Code::Aborted).on("a").times(1),
            Fault::error("CreateVolume", Code::Unavailable).times(2),
        ])
        .write(&path)
        .expect("write");
        let injector = Injector::new(path.clone());
        let code = |r: Result<Pending, Status>| r.err().map(|s| s.code());
        assert_eq!(
            code(injector.before("CreateVolume", Some("a")).await),
            Some(Code::Aborted)
        );
        assert_eq!(
            code(injector.before("CreateVolume", Some("a")).await),
            Some(Code::Unavailable)
        );
        assert_eq!(code(injector.before("DeleteVolume", Some("a")).await), None);
        assert_eq!(
            code(injector.before("CreateVolume", Some("b")).await),
            Some(Code::Unavailable)
        );
        assert_eq!(code(injector.before("CreateVolume", Some("b")).await), None);
        let left = Faults::load(&path).expect("load");
        assert_eq!(left.rules[0].count, Some(0));
        assert_eq!(left.rules[1].count, Some(0));
        assert!(injector.probe_ready().expect("probe"));

        std::fs::write(&path, "{oops").expect("write");
        assert_eq!(
            code(injector.before("Probe", None).await),
            Some(Code::Internal)
        );
        assert!(injector.probe_ready().is_err());

        let disabled = Injector::new(PathBuf::new());
        assert!(disabled.before("CreateVolume", None).await.is_ok());
        assert!(disabled.probe_ready().expect("probe"));
    }

    #[tokio::test]
    async fn work_and_wire_message_and_name_busy_reach_the_call() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("faults.json");
        Faults {
            name_busy: Some("already_exists".to_owned()),
            ..Faults::with_rules(vec![
                Fault::work("CreateVolume", Duration::from_millis(300)).times(1),
                Fault::error("CreateVolume", Code::Internal)
                    .with_message("readable")
                    .with_wire_message("caf%E9")
                    .times(1),
            ])
        }
        .write(&path)
        .expect("write");
        let injector = Injector::new(path);
        assert_eq!(
            injector.name_busy().expect("name_busy"),
            Some(Code::AlreadyExists)
        );
        let pending = injector
            .before("CreateVolume", Some("a"))
            .await
            .expect("a work rule is no error");
        assert_eq!(pending.work, Duration::from_millis(300));
        assert_eq!(current_work(), Duration::ZERO, "outside a call");
        assert_eq!(
            with_work(pending.work, async { current_work() }).await,
            Duration::from_millis(300)
        );
        let status = injector
            .before("CreateVolume", Some("a"))
            .await
            .err()
            .expect("the error rule");
        assert_eq!(status.code(), Code::Internal);
        // The wire message rides in the metadata, and the service wrapper
        // puts it in grpc-message byte for byte (0xE9 alone: not UTF-8).
        let mut headers = status.into_http::<()>().into_parts().0.headers;
        put_wire_message(&mut headers);
        assert!(headers.get(WIRE_MESSAGE_METADATA).is_none());
        let sent = headers.get(GRPC_MESSAGE).expect("grpc-message");
        assert_eq!(sent.as_bytes(), b"caf%E9");
        let decoded = Status::from_header_map(&headers).expect("a status");
        assert_eq!(decoded.code(), Code::Unknown, "tonic cannot read it");
        assert!(
            decoded
                .message()
                .starts_with("Error deserializing status message header"),
            "{}",
            decoded.message()
        );
        // Without a wire message the header is the readable message.
        let mut headers = Status::internal("plain")
            .into_http::<()>()
            .into_parts()
            .0
            .headers;
        put_wire_message(&mut headers);
        assert_eq!(
            headers.get(GRPC_MESSAGE).map(HeaderValue::as_bytes),
            Some(&b"plain"[..])
        );
    }
}
