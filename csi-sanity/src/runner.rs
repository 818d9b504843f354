//! Runs the checks: connects, discovers the driver's capabilities, runs each
//! selected check in its own task (so a panic or hang fails that check
//! only), cleans up what each check created and prints one line per check.

use std::future::Future;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_proto::v1::{
    self as csi, controller_client::ControllerClient, identity_client::IdentityClient,
    node_client::NodeClient,
};
use tonic::transport::Channel;

use crate::checks;
use crate::config::Config;
use crate::report::{CheckResult, Outcome, Report};

/// Why a check did not pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fail(String),
    Skip(String),
}

/// What a check body returns.
pub type CheckOutcome = Result<(), Verdict>;

/// A running check body.
pub type CheckFuture = Pin<Box<dyn Future<Output = CheckOutcome> + Send + 'static>>;

/// One named check.
#[derive(Clone, Copy)]
pub struct Check {
    pub name: &'static str,
    pub run: fn(T) -> CheckFuture,
}

impl std::fmt::Debug for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Check").field("name", &self.name).finish()
    }
}

/// The run could not start.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("cannot connect to the CSI driver at {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
    #[error("cannot create a working directory: {0}")]
    WorkDir(std::io::Error),
}

/// Something a check created and the suite must remove again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Volume(String),
    Snapshot(String),
    ControllerPublish {
        volume_id: String,
        node_id: String,
    },
    NodeStage {
        volume_id: String,
        staging_path: String,
    },
    NodePublish {
        volume_id: String,
        target_path: String,
    },
    /// A directory the suite made; removed only if empty (never
    /// recursively, so a mount left behind keeps its data).
    Dir(PathBuf),
}

impl Resource {
    /// Cleanup order: unpublish and unstage before deleting, snapshots
    /// before volumes, directories last.
    fn rank(&self) -> u8 {
        match self {
            Self::NodePublish { .. } => 0,
            Self::NodeStage { .. } => 1,
            Self::ControllerPublish { .. } => 2,
            Self::Snapshot(_) => 3,
            Self::Volume(_) => 4,
            Self::Dir(_) => 5,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Volume(id) => format!("volume {id:?}"),
            Self::Snapshot(id) => format!("snapshot {id:?}"),
            Self::ControllerPublish { volume_id, node_id } => {
                format!("controller publication of volume {volume_id:?} on node {node_id:?}")
            }
            Self::NodeStage {
                volume_id,
                staging_path,
            } => format!("staging of volume {volume_id:?} at {staging_path}"),
            Self::NodePublish {
                volume_id,
                target_path,
            } => format!("publication of volume {volume_id:?} at {target_path}"),
            Self::Dir(p) => format!("directory {}", p.display()),
        }
    }
}

/// Resources created by one check (or left over by all of them).
#[derive(Debug, Default)]
pub struct Registry {
    items: Mutex<Vec<Resource>>,
}

impl Registry {
    pub fn add(&self, r: Resource) {
        let mut items = self.items.lock().unwrap_or_else(|p| p.into_inner());
        if !items.contains(&r) {
            items.push(r);
        }
    }

    /// Forgets a resource the check removed itself.
    pub fn forget(&self, r: &Resource) {
        self.items
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|x| x != r);
    }

    fn take(&self) -> Vec<Resource> {
        std::mem::take(&mut *self.items.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn len(&self) -> usize {
        self.items.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the driver said about itself before the checks ran.
#[derive(Debug, Clone)]
pub struct Discovery {
    pub plugin_caps: Result<Vec<csi::PluginCapability>, String>,
    pub controller_caps: Result<Vec<csi::ControllerServiceCapability>, String>,
    pub node_caps: Result<Vec<csi::NodeServiceCapability>, String>,
    pub node_info: Result<csi::NodeGetInfoResponse, String>,
}

/// Shared state of one run.
#[derive(Debug)]
pub struct Ctx {
    pub config: Config,
    node_channel: Channel,
    controller_channel: Channel,
    pub discovery: Discovery,
    run_id: String,
    counter: AtomicU64,
    pub mount_dir: PathBuf,
    pub staging_dir: PathBuf,
    /// Every volume and snapshot any check created, for the final check.
    created: Registry,
    /// Resources whose cleanup failed after their check; retried at the end.
    leftovers: Registry,
}

/// The handle a check body gets: the run's context and the check's own
/// cleanup registry.
#[derive(Debug, Clone)]
pub struct T {
    pub cx: Arc<Ctx>,
    pub reg: Arc<Registry>,
}

impl T {
    pub fn config(&self) -> &Config {
        &self.cx.config
    }
    pub fn ident(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.cx.node_channel.clone())
    }
    pub fn ctrl(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.cx.controller_channel.clone())
    }
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.cx.node_channel.clone())
    }

    /// A name unique to this run: `sanity-<run>-<purpose>-<n>`.
    pub fn unique_name(&self, purpose: &str) -> String {
        let n = self.cx.counter.fetch_add(1, Ordering::Relaxed);
        format!("sanity-{}-{purpose}-{n}", self.cx.run_id)
    }

    /// The run id, a short hex string in every name the suite makes.
    pub fn run_id(&self) -> &str {
        &self.cx.run_id
    }

    /// Records a created resource for cleanup after the check.
    pub fn register(&self, r: Resource) {
        if matches!(r, Resource::Volume(_) | Resource::Snapshot(_)) {
            self.cx.created.add(r.clone());
        }
        self.reg.add(r);
    }

    /// Forgets a resource the check already removed.
    pub fn forget(&self, r: &Resource) {
        self.reg.forget(r);
    }

    /// A fresh directory under `base` for this check; removed (if empty)
    /// after the check.
    pub fn fresh_dir(&self, base: &Path, purpose: &str) -> Result<PathBuf, Verdict> {
        let dir = base.join(self.unique_name(purpose));
        std::fs::create_dir_all(&dir).map_err(|e| {
            Verdict::Fail(format!("cannot create directory {}: {e}", dir.display()))
        })?;
        self.reg.add(Resource::Dir(dir.clone()));
        Ok(dir)
    }
}

/// Sleeps between retries of cleanup calls.
const CLEANUP_RETRY: Duration = Duration::from_millis(200);
const CLEANUP_ATTEMPTS: usize = 3;

/// Name of the final check that verifies the suite left nothing behind.
pub const CLEANUP_CHECK: &str = "Cleanup should delete every volume and snapshot the suite created";

/// Runs every selected check, writing one line per check and the summary to
/// `out`. Returns the report; errors only when the driver cannot be reached
/// or the suite cannot set up its directories.
pub async fn run(config: Config, out: &mut (dyn Write + Send)) -> Result<Report, SuiteError> {
    run_until(config, out, std::future::pending::<()>()).await
}

/// Like [`run`], but stops starting checks once `interrupt` completes (the
/// running check is aborted and reported as failed); cleanup still runs.
pub async fn run_until(
    config: Config,
    out: &mut (dyn Write + Send),
    interrupt: impl Future<Output = ()> + Send,
) -> Result<Report, SuiteError> {
    let node_channel = connect(&config.endpoint, config.connect_timeout).await?;
    let controller_channel = match &config.controller_endpoint {
        Some(p) if p != &config.endpoint => connect(p, config.connect_timeout).await?,
        _ => node_channel.clone(),
    };
    let (mount_dir, own_mount) = work_dir(config.mount_dir.as_deref(), "csi-sanity-mount")?;
    let (staging_dir, own_staging) = work_dir(config.staging_dir.as_deref(), "csi-sanity-staging")?;
    let discovery = discover(&config, &node_channel, &controller_channel).await;
    let cx = Arc::new(Ctx {
        discovery,
        node_channel,
        controller_channel,
        run_id: run_id(),
        counter: AtomicU64::new(0),
        mount_dir: mount_dir.clone(),
        staging_dir: staging_dir.clone(),
        created: Registry::default(),
        leftovers: Registry::default(),
        config,
    });

    let mut report = Report::default();
    let mut interrupt = std::pin::pin!(interrupt);
    let mut interrupted = false;
    for check in checks::all() {
        if interrupted {
            break;
        }
        if !cx.config.selects(check.name) {
            emit(
                out,
                &mut report,
                CheckResult {
                    name: check.name.to_owned(),
                    outcome: Outcome::Skip("not selected by --focus/--skip".into()),
                    duration: Duration::ZERO,
                },
            );
            continue;
        }
        let reg = Arc::new(Registry::default());
        let t = T {
            cx: cx.clone(),
            reg: reg.clone(),
        };
        let started = Instant::now();
        let mut handle = tokio::spawn((check.run)(t));
        let timeout = tokio::time::sleep(cx.config.check_timeout);
        let mut outcome = tokio::select! {
            joined = &mut handle => match joined {
                Ok(Ok(())) => Outcome::Pass,
                Ok(Err(Verdict::Fail(m))) => Outcome::Fail(m),
                Ok(Err(Verdict::Skip(m))) => Outcome::Skip(m),
                Err(e) if e.is_panic() => Outcome::Fail(format!("check panicked: {}", panic_message(e.into_panic()))),
                Err(e) => Outcome::Fail(format!("check task ended abnormally: {e}")),
            },
            () = timeout => {
                handle.abort();
                Outcome::Fail(format!("timed out after {:?}", cx.config.check_timeout))
            }
            () = &mut interrupt => {
                handle.abort();
                interrupted = true;
                Outcome::Fail("interrupted".into())
            }
        };
        let problems = cleanup(&cx, &reg).await;
        if !problems.is_empty() {
            let text = problems.join("; ");
            outcome = match outcome {
                Outcome::Fail(m) => Outcome::Fail(format!("{m}; cleanup also failed: {text}")),
                _ => Outcome::Fail(format!("cleanup failed: {text}")),
            };
        }
        emit(
            out,
            &mut report,
            CheckResult {
                name: check.name.to_owned(),
                outcome,
                duration: started.elapsed(),
            },
        );
    }

    let started = Instant::now();
    let final_outcome = final_cleanup(&cx).await;
    // Not subject to --focus (a focused run must still report a leak), only
    // to an explicit --skip.
    if !cx
        .config
        .skip
        .as_ref()
        .is_some_and(|s| s.is_match(CLEANUP_CHECK))
    {
        emit(
            out,
            &mut report,
            CheckResult {
                name: CLEANUP_CHECK.to_owned(),
                outcome: final_outcome,
                duration: started.elapsed(),
            },
        );
    }
    if own_mount {
        let _ = std::fs::remove_dir(&mount_dir);
    }
    if own_staging {
        let _ = std::fs::remove_dir(&staging_dir);
    }
    let _ = writeln!(out, "{}", report.summary_line());
    let _ = out.flush();
    Ok(report)
}

fn emit(out: &mut (dyn Write + Send), report: &mut Report, result: CheckResult) {
    let _ = writeln!(out, "{}", result.line());
    let _ = out.flush();
    report.results.push(result);
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-text panic payload".to_owned()
    }
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 32);
    format!("{:08x}", mixed & 0xffff_ffff)
}

/// Uses `given` (created if missing) or makes a fresh temporary directory;
/// returns whether the suite owns (and should remove) it.
fn work_dir(given: Option<&Path>, prefix: &str) -> Result<(PathBuf, bool), SuiteError> {
    match given {
        Some(p) => {
            std::fs::create_dir_all(p).map_err(SuiteError::WorkDir)?;
            Ok((p.to_owned(), false))
        }
        None => {
            let dir = tempfile::Builder::new()
                .prefix(prefix)
                .tempdir()
                .map_err(SuiteError::WorkDir)?;
            // Kept, and removed later only if empty: a recursive removal
            // could reach into a mount a failed unpublish left behind.
            Ok((dir.keep(), true))
        }
    }
}

async fn connect(path: &Path, timeout: Duration) -> Result<Channel, SuiteError> {
    let deadline = Instant::now() + timeout;
    loop {
        match csi_proto::transport::connect_unix(path).await {
            Ok(channel) => return Ok(channel),
            Err(e) => {
                if Instant::now() >= deadline {
                    let mut reason = e.to_string();
                    let mut source = std::error::Error::source(&e);
                    while let Some(s) = source {
                        reason.push_str(": ");
                        reason.push_str(&s.to_string());
                        source = s.source();
                    }
                    return Err(SuiteError::Connect {
                        path: path.to_owned(),
                        reason,
                    });
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn with_timeout<F, R>(limit: Duration, f: F) -> Result<R, String>
where
    F: Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    match tokio::time::timeout(limit, f).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(crate::checks::util::status_text(&status)),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

async fn discover(config: &Config, node: &Channel, controller: &Channel) -> Discovery {
    let limit = config.check_timeout;
    let plugin_caps = with_timeout(
        limit,
        IdentityClient::new(node.clone())
            .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}),
    )
    .await
    .map(|r| r.capabilities)
    .map_err(|e| format!("GetPluginCapabilities failed: {e}"));
    let has_controller = match &plugin_caps {
        Ok(caps) => checks::util::has_plugin_service(
            caps,
            csi::plugin_capability::service::Type::ControllerService,
        ),
        // Unknown: ask anyway, the checks report the identity failure.
        Err(_) => true,
    };
    let controller_caps = if has_controller {
        with_timeout(
            limit,
            ControllerClient::new(controller.clone())
                .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}),
        )
        .await
        .map(|r| r.capabilities)
        .map_err(|e| format!("ControllerGetCapabilities failed: {e}"))
    } else {
        Ok(Vec::new())
    };
    let node_caps = with_timeout(
        limit,
        NodeClient::new(node.clone()).node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
    )
    .await
    .map(|r| r.capabilities)
    .map_err(|e| format!("NodeGetCapabilities failed: {e}"));
    let node_info = with_timeout(
        limit,
        NodeClient::new(node.clone()).node_get_info(csi::NodeGetInfoRequest {}),
    )
    .await
    .map_err(|e| format!("NodeGetInfo failed: {e}"));
    Discovery {
        plugin_caps,
        controller_caps,
        node_caps,
        node_info,
    }
}

/// Removes what one check registered, in dependency order; returns the
/// problems. Resources that could not be removed move to the leftovers.
async fn cleanup(cx: &Arc<Ctx>, reg: &Registry) -> Vec<String> {
    let mut items = reg.take();
    // Stable sort by rank, newest first within a rank (a clone is deleted
    // before its source).
    items.reverse();
    items.sort_by_key(Resource::rank);
    let mut problems = Vec::new();
    for item in items {
        if let Err(e) = remove(cx, &item).await {
            problems.push(format!("removing {}: {e}", item.describe()));
            if !matches!(item, Resource::Dir(_)) {
                cx.leftovers.add(item);
            }
        }
    }
    problems
}

async fn remove(cx: &Arc<Ctx>, item: &Resource) -> Result<(), String> {
    if let Resource::Dir(p) = item {
        return match std::fs::remove_dir(p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("{e} (left in place)")),
        };
    }
    let limit = cx.config.check_timeout;
    let secrets = &cx.config.secrets;
    let mut last = String::new();
    for attempt in 0..CLEANUP_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(CLEANUP_RETRY).await;
        }
        let ctrl = || ControllerClient::new(cx.controller_channel.clone());
        let node = || NodeClient::new(cx.node_channel.clone());
        let result: Result<(), tonic::Status> = match tokio::time::timeout(limit, async {
            match item {
                Resource::Volume(id) => ctrl()
                    .delete_volume(csi::DeleteVolumeRequest {
                        volume_id: id.clone(),
                        secrets: secrets.delete_volume_secret.clone(),
                    })
                    .await
                    .map(drop),
                Resource::Snapshot(id) => ctrl()
                    .delete_snapshot(csi::DeleteSnapshotRequest {
                        snapshot_id: id.clone(),
                        secrets: secrets.delete_snapshot_secret.clone(),
                    })
                    .await
                    .map(drop),
                Resource::ControllerPublish { volume_id, node_id } => ctrl()
                    .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                        volume_id: volume_id.clone(),
                        node_id: node_id.clone(),
                        secrets: secrets.controller_unpublish_volume_secret.clone(),
                    })
                    .await
                    .map(drop),
                Resource::NodeStage {
                    volume_id,
                    staging_path,
                } => node()
                    .node_unstage_volume(csi::NodeUnstageVolumeRequest {
                        volume_id: volume_id.clone(),
                        staging_target_path: staging_path.clone(),
                    })
                    .await
                    .map(drop),
                Resource::NodePublish {
                    volume_id,
                    target_path,
                } => node()
                    .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                        volume_id: volume_id.clone(),
                        target_path: target_path.clone(),
                    })
                    .await
                    .map(drop),
                Resource::Dir(_) => Ok(()),
            }
        })
        .await
        {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {limit:?}"
            ))),
        };
        match result {
            Ok(()) => return Ok(()),
            // Already gone: the goal of cleanup is reached.
            Err(s) if s.code() == tonic::Code::NotFound => return Ok(()),
            Err(s) => last = crate::checks::util::status_text(&s),
        }
    }
    Err(last)
}

/// Retries the leftovers and, where the driver can list, verifies that no
/// volume or snapshot the suite created is still there.
async fn final_cleanup(cx: &Arc<Ctx>) -> Outcome {
    let leftovers = cx.leftovers.take();
    let mut problems = Vec::new();
    let mut sorted = leftovers;
    sorted.reverse();
    sorted.sort_by_key(Resource::rank);
    for item in sorted {
        if let Err(e) = remove(cx, &item).await {
            problems.push(format!("{} still present: {e}", item.describe()));
        }
    }
    let created = cx.created.take();
    if created.is_empty() {
        return if problems.is_empty() {
            Outcome::Skip("the suite created no volumes or snapshots".into())
        } else {
            Outcome::Fail(problems.join("; "))
        };
    }
    let t = T {
        cx: cx.clone(),
        reg: Arc::new(Registry::default()),
    };
    use csi::controller_service_capability::rpc::Type as Rpc;
    if checks::util::controller_has(cx, Rpc::ListVolumes) {
        let limit = cx.config.check_timeout;
        let listed = tokio::time::timeout(limit, checks::util::list_all_volumes(&t, 0))
            .await
            .unwrap_or_else(|_| {
                Err(Verdict::Fail(format!(
                    "ListVolumes did not answer within {limit:?}; cannot verify the cleanup"
                )))
            });
        match listed {
            Ok(ids) => {
                for r in &created {
                    if let Resource::Volume(id) = r
                        && ids.contains(id)
                    {
                        problems.push(format!("volume {id:?} is still listed by ListVolumes"));
                    }
                }
            }
            Err(Verdict::Fail(m) | Verdict::Skip(m)) => problems.push(m),
        }
    }
    if checks::util::controller_has(cx, Rpc::ListSnapshots) {
        let limit = cx.config.check_timeout;
        let listed = tokio::time::timeout(
            limit,
            checks::util::list_all_snapshots(&t, csi::ListSnapshotsRequest::default()),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Verdict::Fail(format!(
                "ListSnapshots did not answer within {limit:?}; cannot verify the cleanup"
            )))
        });
        match listed {
            Ok(snaps) => {
                for r in &created {
                    if let Resource::Snapshot(id) = r
                        && snaps.iter().any(|s| &s.snapshot_id == id)
                    {
                        problems.push(format!("snapshot {id:?} is still listed by ListSnapshots"));
                    }
                }
            }
            Err(Verdict::Fail(m) | Verdict::Skip(m)) => problems.push(m),
        }
    }
    if problems.is_empty() {
        Outcome::Pass
    } else {
        Outcome::Fail(problems.join("; "))
    }
}
