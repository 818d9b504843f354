//! The driver object: configuration, in-memory index of the on-disk
//! records, per-object locks, fault injector.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tonic::{Response, Status};

use crate::authority::AuthorityRewrite;
use crate::faults::{Injector, WireMessage};
use crate::ids::VolumeIds;
use crate::locks::KeyedLocks;
use crate::registration::{self, NodeRegistration, RegistrationService};
use crate::store::{self, SNAPSHOTS_DIR, SnapshotRecord, VOLUMES_DIR, VolumeRecord};
use crate::{Config, Error};

/// How long [`Driver::serve`] waits, after its shutdown future completed,
/// for in-flight calls to finish and clients to close their connections.
pub const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The hostpath CSI driver. Cheap to clone (shared state); implements
/// `csi_proto::v1::identity_server::Identity`,
/// `controller_server::Controller` and `node_server::Node`.
#[derive(Clone)]
pub struct Driver {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: Config,
    pub(crate) state: Mutex<State>,
    pub(crate) locks: KeyedLocks,
    pub(crate) faults: Injector,
    pub(crate) volumes_dir: PathBuf,
    pub(crate) snapshots_dir: PathBuf,
}

/// A registration socket being served (see [`Driver::start_registration`]).
struct Registration {
    socket: PathBuf,
    stop: tokio::sync::oneshot::Sender<()>,
    refusal: Arc<std::sync::OnceLock<String>>,
    refused: Arc<tokio::sync::Notify>,
}

impl Registration {
    /// Removes the socket (the kubelet deregisters the driver) and stops
    /// serving it.
    fn stop(self) {
        registration::remove_socket(&self.socket);
        let _ = self.stop.send(());
    }
}

/// In-memory mirror of the records on disk, plus capacity being reserved by
/// creations in flight.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) volumes: BTreeMap<String, VolumeRecord>,
    pub(crate) volume_names: HashMap<String, String>,
    pub(crate) snapshots: BTreeMap<String, SnapshotRecord>,
    pub(crate) snapshot_names: HashMap<String, String>,
    pub(crate) reserved: BTreeMap<String, u64>,
    /// `--enable-controller-publish`: volume id → node id → readonly.
    pub(crate) controller_published: BTreeMap<String, BTreeMap<String, bool>>,
}

impl State {
    pub(crate) fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volume_names
            .get(name)
            .and_then(|id| self.volumes.get(id))
    }

    pub(crate) fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshot_names
            .get(name)
            .and_then(|id| self.snapshots.get(id))
    }

    pub(crate) fn insert_volume(&mut self, record: VolumeRecord) {
        self.volume_names
            .insert(record.name.clone(), record.id.clone());
        self.volumes.insert(record.id.clone(), record);
    }

    pub(crate) fn remove_volume(&mut self, id: &str) {
        if let Some(record) = self.volumes.remove(id) {
            self.volume_names.remove(&record.name);
        }
    }

    pub(crate) fn insert_snapshot(&mut self, record: SnapshotRecord) {
        self.snapshot_names
            .insert(record.name.clone(), record.id.clone());
        self.snapshots.insert(record.id.clone(), record);
    }

    pub(crate) fn remove_snapshot(&mut self, id: &str) {
        if let Some(record) = self.snapshots.remove(id) {
            self.snapshot_names.remove(&record.name);
        }
    }

    /// Bytes of `kind` taken by volumes and by creations in flight.
    pub(crate) fn used(&self, kind: &str) -> u64 {
        let committed: u64 = self
            .volumes
            .values()
            .filter(|v| v.kind == kind)
            .map(|v| v.capacity_bytes)
            .fold(0, u64::saturating_add);
        committed.saturating_add(self.reserved.get(kind).copied().unwrap_or(0))
    }

    /// Free bytes of `kind` given its total.
    pub(crate) fn free(&self, kind: &str, total: u64) -> u64 {
        total.saturating_sub(self.used(kind))
    }
}

/// Checks that `key` is a Kubernetes label key (topology keys are node
/// labels): an optional prefix, a lowercase DNS subdomain of at most 253
/// characters, and `/`, then a name of 1 to 63 characters of `[A-Za-z0-9]`,
/// `-`, `_` and `.` that starts and ends with a letter or digit.
pub(crate) fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if name.is_empty() || name.len() > 63 {
        return Err("the name part must have 1 to 63 characters".to_owned());
    }
    if !name.chars().all(|c| alnum(c) || "-_.".contains(c))
        || !name.starts_with(alnum)
        || !name.ends_with(alnum)
    {
        return Err(
            "the name part must be [A-Za-z0-9-_.], starting and ending with a letter or digit"
                .to_owned(),
        );
    }
    if let Some(prefix) = prefix {
        let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| lower(c) || c == '-')
                && l.starts_with(lower)
                && l.ends_with(lower)
        };
        if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("the prefix must be a lowercase DNS subdomain".to_owned());
        }
    }
    Ok(())
}

fn check_config(config: &Config) -> Result<(), Error> {
    let bad = |msg: String| Err(Error::Config(msg));
    if config.driver_name.is_empty() {
        return bad("the driver name is empty".to_owned());
    }
    if config.node_id.is_empty() {
        return bad("the node id is empty".to_owned());
    }
    if config.state_dir.as_os_str().is_empty() {
        return bad("the state directory is empty".to_owned());
    }
    if let Err(e) = check_label_key(&config.topology_key) {
        return bad(format!("topology key {:?}: {e}", config.topology_key));
    }
    let i64_max = i64::MAX as u64;
    if config.max_volume_size == 0 || config.max_volume_size > i64_max {
        return bad(format!(
            "the maximum volume size {} must be between 1 and {i64_max}",
            config.max_volume_size
        ));
    }
    for (kind, bytes) in &config.capacity {
        if kind.is_empty() {
            return bad("a capacity kind is empty".to_owned());
        }
        if *bytes > i64_max {
            return bad(format!("capacity of kind {kind:?} exceeds {i64_max} bytes"));
        }
    }
    Ok(())
}

impl Driver {
    /// Checks `config`, creates the state directory if needed, loads the
    /// existing volume and snapshot records and removes leftovers of an
    /// interrupted operation (data directories without a record, temporary
    /// files).
    pub fn new(config: Config) -> Result<Driver, Error> {
        check_config(&config)?;
        let volumes_dir = config.state_dir.join(VOLUMES_DIR);
        let snapshots_dir = config.state_dir.join(SNAPSHOTS_DIR);
        for dir in [&volumes_dir, &snapshots_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        }
        let volumes = store::backend_volumes(&config.state_dir)?;
        let snapshots = store::backend_snapshots(&config.state_dir)?;
        let volume_ids: Vec<&str> = volumes.iter().map(|v| v.id.as_str()).collect();
        let snapshot_ids: Vec<&str> = snapshots.iter().map(|s| s.id.as_str()).collect();
        for (dir, ids) in [(&volumes_dir, &volume_ids), (&snapshots_dir, &snapshot_ids)] {
            let removed = store::clean_dir(dir, ids)?;
            if !removed.is_empty() {
                tracing::info!(dir = %dir.display(), ?removed, "removed leftovers of interrupted operations");
            }
        }
        let mut state = State::default();
        for volume in volumes {
            if state.volume_names.contains_key(&volume.name) {
                return Err(Error::Config(format!(
                    "two volume records have the name {:?}",
                    volume.name
                )));
            }
            state.insert_volume(volume);
        }
        for snapshot in snapshots {
            if state.snapshot_names.contains_key(&snapshot.name) {
                return Err(Error::Config(format!(
                    "two snapshot records have the name {:?}",
                    snapshot.name
                )));
            }
            state.insert_snapshot(snapshot);
        }
        for (kind, total) in &config.capacity {
            let used = state.used(kind);
            if used > *total {
                tracing::warn!(
                    kind,
                    used,
                    total,
                    "existing volumes exceed the configured capacity"
                );
            }
        }
        tracing::info!(
            state_dir = %config.state_dir.display(),
            volumes = state.volumes.len(),
            snapshots = state.snapshots.len(),
            "state loaded"
        );
        let faults = Injector::new(config.faults_file.clone());
        Ok(Driver {
            inner: Arc::new(Inner {
                config,
                state: Mutex::new(state),
                locks: KeyedLocks::default(),
                faults,
                volumes_dir,
                snapshots_dir,
            }),
        })
    }

    /// The configuration the driver runs with.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// Binds `config().endpoint` and serves the three services until
    /// `shutdown` completes; removes the socket file on return.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let endpoint = self.inner.config.endpoint.clone();
        self.serve_on(&endpoint, shutdown).await
    }

    pub(crate) async fn serve_on(
        self,
        endpoint: &Path,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        use csi_proto::v1::{
            controller_server::ControllerServer, identity_server::IdentityServer,
            node_server::NodeServer,
        };
        let incoming = csi_proto::transport::bind_unix(endpoint)
            .map_err(|e| Error::io(format!("listening on {}", endpoint.display()), e))?;
        // Read-write for the socket's group too: a sidecar of another user
        // in the driver's group (a pod's runAsGroup or fsGroup) connects when
        // the driver runs as root (deploy/kubernetes/node-plugin).
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(endpoint, std::fs::Permissions::from_mode(0o660))
                .map_err(|e| Error::io(format!("chmod {}", endpoint.display()), e))?;
        }
        tracing::info!(
            endpoint = %endpoint.display(),
            driver = %self.inner.config.driver_name,
            node = %self.inner.config.node_id,
            "serving CSI"
        );
        // Registered after the CSI socket is up: the kubelet dials the
        // endpoint as soon as it has the plugin info.
        let registration = match &self.inner.config.registration {
            Some(registration) => match self.start_registration(registration) {
                Ok(registration) => Some(registration),
                Err(e) => {
                    if let Err(e) = store::remove_file_if_exists(endpoint) {
                        tracing::warn!(error = %e, "cannot remove the socket");
                    }
                    return Err(e);
                }
            },
            None => None,
        };
        let refusal = registration.as_ref().map(|r| r.refusal.clone());
        let refused = registration.as_ref().map(|r| r.refused.clone());
        let (signalled, on_signal) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            match &refused {
                Some(refused) => tokio::select! {
                    () = shutdown => {}
                    () = refused.notified() => {}
                },
                None => shutdown.await,
            }
            // Deregistered first, so that the kubelet stops sending node
            // calls before the CSI socket goes.
            if let Some(registration) = registration {
                registration.stop();
            }
            let _ = signalled.send(());
        };
        let server = tonic::transport::Server::builder()
            // WireMessage: an injected status message that is not UTF-8
            // (tests/hostpath-driver/src/faults.rs, `wire_message`).
            .add_service(WireMessage(IdentityServer::new(self.clone())))
            .add_service(WireMessage(ControllerServer::new(self.clone())))
            .add_service(WireMessage(NodeServer::new(self)))
            .serve_with_incoming_shutdown(incoming, shutdown);
        // After the shutdown signal, in-flight calls get SHUTDOWN_GRACE to
        // finish and clients to close their connections; a client that keeps
        // an idle connection open does not hold the driver up beyond that.
        let grace = async move {
            if on_signal.await.is_ok() {
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        let result = tokio::select! {
            result = server => result,
            () = grace => {
                tracing::warn!(grace = ?SHUTDOWN_GRACE, "connections still open after the grace period; stopping anyway");
                Ok(())
            }
        };
        if let Err(e) = store::remove_file_if_exists(endpoint) {
            tracing::warn!(error = %e, "cannot remove the socket");
        }
        tracing::info!("stopped serving");
        result.map_err(Error::from)?;
        match refusal.and_then(|r| r.get().cloned()) {
            Some(reason) => Err(Error::RegistrationRefused(reason)),
            None => Ok(()),
        }
    }

    /// Binds the registration socket and serves the `Registration` service
    /// on a task of its own until [`Registration::stop`].
    fn start_registration(&self, registration: &NodeRegistration) -> Result<Registration, Error> {
        use crate::registration::v1::registration_server::RegistrationServer;
        use tokio_stream::StreamExt;
        let driver_name = &self.inner.config.driver_name;
        let socket = registration.socket(driver_name);
        // Each connection goes through the :authority rewrite: the
        // kubelet's requests name the socket's escaped path, which tonic
        // refuses (src/authority.rs).
        let incoming = csi_proto::transport::bind_unix(&socket)
            .map_err(|e| Error::io(format!("listening on {}", socket.display()), e))?
            .map(|accepted| accepted.map(AuthorityRewrite::new));
        let service = RegistrationService {
            info: registration.plugin_info(driver_name),
            refusal: Arc::default(),
            refused: Arc::default(),
        };
        let (refusal, refused) = (service.refusal.clone(), service.refused.clone());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(service))
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            });
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(error = %e, "the registration server failed");
            }
        });
        tracing::info!(socket = %socket.display(), "serving the kubelet's plugin registration");
        Ok(Registration {
            socket,
            stop,
            refusal,
            refused,
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one RPC: fault injection before, the body, the exit fault after
    /// success, logging.
    pub(crate) async fn call<T: VolumeIds>(
        &self,
        method: &'static str,
        target: Option<&str>,
        body: impl Future<Output = Result<T, Status>>,
    ) -> Result<Response<T>, Status> {
        // At arrival too: with the "ok" below, the log shows how long the
        // driver took over a call (a caller's deadline passing first).
        tracing::debug!(method, target, "call");
        let _running = self.inner.faults.admit(method)?;
        let pending = self.inner.faults.before(method, target).await?;
        let reply = pending.reply.clone();
        let mut result = crate::faults::with_work(pending.work, body).await;
        if let (Ok(message), Some(reply)) = (result.as_mut(), reply.as_ref()) {
            message.tamper(reply);
        }
        match &result {
            Ok(_) => {
                tracing::debug!(method, target, "ok");
                self.inner.faults.after_success(pending, method);
            }
            Err(status) => tracing::info!(
                method,
                target,
                code = ?status.code(),
                message = status.message(),
                "failed"
            ),
        }
        result.map(|mut message| {
            let format = self.inner.config.volume_id_format;
            let zone = &self.inner.config.node_id;
            message.map_volume_ids(&|id| format.external(id, zone));
            Response::new(message)
        })
    }

    /// Runs the body of a request that awaits (and so could stop half-way)
    /// on a task of its own, and waits for it. tonic drops a handler when
    /// its caller goes (a deadline passed, the connection closed); the task
    /// is not dropped with it, so a record written is always indexed, a
    /// record removed always unindexed, and the name locks are held until
    /// both are done: a request either never started or finishes whole,
    /// like a Go handler that does not watch its context.
    pub(crate) async fn to_completion<T, F, Fut>(&self, body: F) -> Result<T, Status>
    where
        F: FnOnce(Driver) -> Fut,
        Fut: Future<Output = Result<T, Status>> + Send + 'static,
        T: Send + 'static,
    {
        // A `work_ms` rule's work goes on in the task when the caller goes.
        let work = crate::faults::current_work();
        let task = crate::faults::with_work(work, body(self.clone()));
        match tokio::spawn(task).await {
            Ok(result) => result,
            Err(e) => Err(Status::internal(format!("request task failed: {e}"))),
        }
    }

    /// A request's message with its volume ids in the records' form.
    pub(crate) fn incoming<T: VolumeIds>(&self, request: tonic::Request<T>) -> T {
        let mut message = request.into_inner();
        let format = self.inner.config.volume_id_format;
        message.map_volume_ids(&|id| format.internal(id));
        message
    }
}

/// Runs blocking file system work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Status> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "backend operation failed");
            Err(Status::internal(e.to_string()))
        }
        Err(e) => Err(Status::internal(format!("backend task failed: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::check_label_key;

    #[test]
    fn label_keys() {
        for good in [
            "topology.hostpath.csi/node",
            "topology.ebs.csi.aws.com/zone",
            "topology.kubernetes.io/zone",
            "zone",
            "a",
            "Z_9.x-y",
            "example.com/A_b",
        ] {
            assert_eq!(check_label_key(good), Ok(()), "{good}");
        }
        let long_name = "x".repeat(64);
        let long_prefix = format!("{}/zone", vec!["a".repeat(63); 5].join("."));
        for bad in [
            "",
            "/zone",
            "example.com/",
            "a/b/c",
            "zone with spaces",
            "-zone",
            "zone-",
            "Upper.Case/zone",
            "ex_ample.com/zone",
            "example..com/zone",
            "-example.com/zone",
            long_name.as_str(),
            long_prefix.as_str(),
        ] {
            assert!(check_label_key(bad).is_err(), "{bad:?} must be rejected");
        }
    }
}
