//! Start-up: reach the driver, learn what it is, refuse one that cannot
//! provision, and run until SIGTERM/SIGINT.

use std::future::Future;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCap;

use crate::api::reference_grant::ReferenceGrant;
use crate::api_calls::ApiCall;
use crate::caches::Caches;
use crate::cli::Options;
use crate::csi::connection::{ConnectError, connect_and_probe};
use crate::csi::{Driver, StartupError};
use crate::events::Recorder;
use crate::features::Feature;
use crate::http::{self, HttpError};
use crate::kube_client::{ClientConfigError, build_client, load_config};
use crate::leader;
use crate::provision::node_deployment::{
    NodeDeploymentError, NodeDeploymentFlags, node_deployment, node_identity,
};
use crate::provision::{DriverCapabilities, ProvisionerConfig, provisioner_identity};
use crate::provisioner;
use crate::queue::Backoff;
use crate::shared::{EmbeddedLoop, Shared};

/// Why the process stops with a non-zero exit code.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Startup(#[from] StartupError),
    #[error(transparent)]
    KubeConfig(#[from] ClientConfigError),
    #[error("cannot start provisioning: {0}")]
    Journal(#[from] provisioner::journal::JournalError),
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
    #[error(transparent)]
    Capacity(#[from] crate::capacity::CapacityError),
    #[error(transparent)]
    NodeDeployment(#[from] NodeDeploymentError),
    #[error("failed to get node info from CSI driver: {0}")]
    NodeInfo(#[source] crate::csi::CsiError),
}

/// How the run ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// A termination signal arrived.
    Signal,
}

/// Connects to the driver and checks it can provision. Stops early, without
/// an error, when `shutdown` completes first (a pod deleted while its driver
/// never came up must still terminate promptly).
pub async fn connect_driver(
    options: &Options,
    shutdown: impl Future<Output = ()>,
) -> Result<Option<Driver>, RunError> {
    let socket = options.csi_socket();
    tracing::info!(address = %socket.display(), timeout = %crate::duration::format_go_duration(options.timeout), "connecting to the CSI driver");
    let connect = async {
        let channel = connect_and_probe(&socket, options.timeout).await?;
        let mut driver = Driver::discover(channel, options.timeout).await?;
        if options.adaptive_concurrency {
            // The claim workers and the volume workers, --worker-threads
            // each, could all be in a call at once.
            let ceiling = options.worker_threads.saturating_mul(2);
            driver = driver
                .with_adaptive_concurrency(crate::csi::adaptive::ConcurrencyLimit::new(ceiling));
        }
        Ok::<_, RunError>(driver)
    };
    let driver = tokio::select! {
        driver = connect => driver?,
        () = shutdown => return Ok(None),
    };
    let info = driver.info();
    tracing::info!(
        driver = %info.name,
        version = %info.vendor_version,
        controller_service = info.plugin.controller_service,
        topology = info.plugin.volume_accessibility_constraints,
        controller_capabilities = ?info.controller.names(),
        "detected CSI driver {}",
        info.name
    );
    info.require_provisioning()?;
    Ok(Some(driver))
}

/// The whole run: start-up, then serve until `shutdown`.
pub async fn run(
    options: Options,
    shutdown: impl Future<Output = ()> + Clone,
) -> Result<Stopped, RunError> {
    tracing::info!(
        version = crate::cli::VERSION,
        feature_gates = %options.gates().summary(),
        "csi-provisioner starting"
    );
    for flag in options.set_but_not_implemented() {
        tracing::warn!(flag = %format!("--{flag}"), "flag accepted but not supported yet by this version; it has no effect");
    }
    for (flag, reason) in options.set_without_effect() {
        tracing::warn!(flag = %format!("--{flag}"), "flag accepted for compatibility with the upstream sidecar but has no effect: {reason}");
    }
    for (gate, value) in options.gates().ignored() {
        tracing::warn!(gate = %format!("{gate}={value}"), "feature gate of the upstream sidecar's Kubernetes libraries accepted but has no effect here");
    }
    for gate in crate::features::NOT_YET_IMPLEMENTED {
        if options.gates().enabled(*gate) {
            tracing::warn!(gate = %gate, "feature gate enabled but not supported yet by this version; it has no effect");
        }
    }
    // Checked before anything else, as upstream does.
    let node_name = if options.node_deployment {
        let name = crate::provision::node_deployment::node_name(
            std::env::var("NODE_NAME").ok().as_deref(),
        )?;
        if options.leader_election {
            // Upstream allows it: every node's sidecar then competes for the
            // one Lease of the driver, and only one node provisions.
            tracing::warn!(node = %name, "--leader-election with --node-deployment: the sidecars of all nodes compete for one Lease, so only one node is active at a time");
        }
        Some(name)
    } else {
        None
    };
    // The Kubernetes client first, as upstream: a broken kubeconfig or
    // credential is reported at once, not after the driver came up.
    let kube_config = load_config(&options.kubeconfig, &options.master).await?;
    let namespace = own_namespace(&options, &kube_config.default_namespace);
    // With leader election, nothing is written until the Lease is ours,
    // and nothing once it may not be (src/fence.rs).
    let fence = if options.leader_election {
        crate::fence::Fence::closed()
    } else {
        crate::fence::Fence::disabled()
    };
    let client = build_client(kube_config, options.rate_limits(), fence.clone())?;
    let Some(driver) = connect_driver(&options, shutdown.clone()).await? else {
        tracing::info!("termination signal received before the driver was ready, exiting");
        return Ok(Stopped::Signal);
    };
    // Unlike the Go image, a lost driver is re-dialled, not a reason to
    // exit (docs/design.md, "Deliberate differences"): said by /readyz and
    // csi_provisioner_driver_reachable.
    driver.watch_reachability();
    let mut capacity_settings = capacity_settings(&options, &driver)?;
    let mut config = provisioner_config(&options, &driver);
    if config.volume_attributes_class_enabled {
        let probe =
            probe_list::<k8s_openapi::api::storage::v1::VolumeAttributesClass>(&client).await;
        let explicit = options
            .gates()
            .explicitly_set(Feature::VolumeAttributesClass);
        let (gate, why) = volume_attributes_class_gate(&probe, explicit);
        if let Some(why) = why {
            tracing::warn!(gate = "VolumeAttributesClass", "{why}");
        }
        config.volume_attributes_class_enabled = gate != VacGate::Off;
        config.volume_attributes_classes_watched = gate == VacGate::Watched;
        crate::metrics::set_capability("volume_attributes_class", gate != VacGate::Off);
    }
    if config.cross_namespace_data_source {
        config.reference_grants_readable = match probe_list::<ReferenceGrant>(&client).await {
            ListProbe::Served => true,
            ListProbe::NotServed => {
                tracing::error!(
                    gate = "CrossNamespaceVolumeDataSource",
                    "the API server does not serve gateway.networking.k8s.io/v1beta1 ReferenceGrant (install the Gateway API CRDs): every data source in another namespace is refused as not granted"
                );
                false
            }
            ListProbe::Forbidden(message) => {
                tracing::error!(
                    gate = "CrossNamespaceVolumeDataSource",
                    "RBAC does not allow list/watch of referencegrants ({message}); grant the rule of deploy/kubernetes/components/cross-namespace-data-source: every data source in another namespace is refused as not granted"
                );
                false
            }
            // Watched anyway: the cache names its error in /readyz.
            ListProbe::Unknown(error) => {
                tracing::warn!(
                    gate = "CrossNamespaceVolumeDataSource",
                    "cannot tell whether ReferenceGrants can be read ({error}); watching them"
                );
                true
            }
        };
    }
    if let Some(node_name) = &node_name {
        let info = tokio::select! {
            info = driver.node_info() => info.map_err(RunError::NodeInfo)?,
            () = shutdown.clone() => {
                tracing::info!("termination signal received during start-up, exiting");
                return Ok(Stopped::Signal);
            }
        };
        let node = node_deployment(node_name, node_deployment_flags(&options), &info);
        tracing::info!(
            node = %node.node_name,
            node_id = %node.node_id,
            topology = ?node.accessible_topology,
            immediate_binding = node.immediate_binding,
            base_delay = %crate::duration::format_go_duration(node.base_delay),
            max_delay = %crate::duration::format_go_duration(node.max_delay),
            "node deployment: provisioning volumes of node {}",
            node.node_name
        );
        config.provisioner_identity = node_identity(&config.provisioner_identity, Some(&node));
        if let Some(settings) = capacity_settings.as_mut() {
            settings.node = Some(crate::capacity::NodeCapacity {
                name: node.node_name.clone(),
                segment: node.accessible_topology.clone().unwrap_or_default(),
            });
        }
        config.node_deployment = Some(node);
    }
    let host = hostname();
    let shared = Shared {
        client: client.clone(),
        driver_name: config.driver_name.clone(),
        caches: Arc::new(Caches::for_driver(&config)),
        recorder: Arc::new(Recorder::new(
            client.clone(),
            crate::events::source_component(&config.driver_name, &host, uuid::Uuid::new_v4()),
        )),
        backoff: Backoff {
            start: options.retry_interval_start,
            max: options.retry_interval_max,
        },
        workers: options.worker_threads as usize,
        volume_events: Default::default(),
    };
    let elector = options.leader_election.then(|| {
        leader::Elector::fencing(
            client.clone(),
            leader_config(&options, &config.driver_name, &namespace, &host),
            fence.clone(),
        )
    });
    let health = elector
        .as_ref()
        .map_or_else(leader::Health::disabled, |e| e.health());
    start_http(&options, health, &driver, caches_ready(&shared.caches)).await?;

    tracing::info!(driver = %config.driver_name, journal_namespace = %namespace, workers = shared.workers, "starting the provisioning loop");
    // Caches fill while we wait for leadership, so a new leader starts
    // from warm caches; nothing is written before the lease is ours.
    let capacity_driver = driver.clone();
    let restores_snapshots = config.capabilities.create_delete_snapshot;
    let audit_driver = driver.clone();
    let audit_naming = crate::orphan_audit::decide::Naming::of(&config);
    let audit_report = crate::orphan_audit::ReportPlace {
        namespace: namespace.clone(),
        name: crate::orphan_audit::decide::report_name(
            &config.driver_name,
            config
                .node_deployment
                .as_ref()
                .map(|n| n.node_name.as_str()),
        ),
    };
    // Outside `start`, which a signal during start-up drops: a Lease won by
    // then is stepped down from (released with ReleaseLeaderElectionOnExit)
    // instead of left to expire. Safe, as no writer has run before `start`
    // completes: the journal's load only reads, and the workers, the
    // journal's writer and the embedded loops start in `start`'s last poll.
    let mut leadership: Option<leader::Leadership> = None;
    let start = async {
        let provisioning = provisioner::new(&shared, driver, config, &namespace).await?;
        // The embedded loops (protection, retention, releaser, pod/Job
        // PVCs, capacity, snapshot sweep) register their cache handlers and
        // kinds now; they start working only with the provisioning loop,
        // after the lease is ours.
        let mut embedded = EmbeddedLoops::new(&shared, &options);
        // Made in this order, started and stopped capacity first.
        let sweep =
            (!options.snapshot_orphan_sweep_interval.is_zero() && restores_snapshots).then(|| {
                crate::snapshot_sweep::Sweep::new(
                    shared.client.clone(),
                    Arc::clone(&shared.caches),
                    options.snapshot_orphan_sweep_interval,
                    Arc::clone(&provisioning) as Arc<dyn crate::snapshot_sweep::RestoresInFlight>,
                )
            });
        if let Some(settings) = capacity_settings {
            embedded.push(crate::capacity::new(&shared, capacity_driver, settings).await?);
        }
        if let Some(sweep) = sweep {
            embedded.push(sweep);
        }
        let operations = Arc::clone(&provisioning);
        if let Some(audit) = crate::orphan_audit::Audit::new(
            shared.client.clone(),
            audit_driver,
            options.orphan_audit_interval,
            audit_report,
            Arc::new(move || {
                let names = operations.operations.volume_names();
                names.into_iter().map(|(_, name)| name).collect()
            }),
            audit_naming,
        ) {
            embedded.push(audit);
        }
        shared.caches.start(&shared.client);
        match &elector {
            Some(elector) => {
                // Kept as soon as won, not when the caches are ready too;
                // and watched from then on: a lease lost before the caches
                // are ready ends the process as it would later. Once lost,
                // the fence lets no byte out (`crate::fence`), so those
                // caches would never get ready and the process, neither
                // leader nor candidate, would wait for ever (chaos seed
                // 63423: no replica could take over from a frozen leader).
                let ready = shared.caches.wait_until_ready();
                let acquire = elector.acquire();
                tokio::pin!(ready, acquire);
                tokio::select! {
                    won = &mut acquire => {
                        leadership = Some(won);
                        tokio::select! {
                            () = &mut ready => {}
                            lost = lease_lost(&mut leadership) => return Err(lost.into()),
                        }
                    }
                    () = &mut ready => leadership = Some(acquire.await),
                }
            }
            None => shared.caches.wait_until_ready().await,
        }
        // Loaded only now: a previous leader may have written the journal
        // until it stopped. Its read waits out an unreachable API server,
        // but never past the lease.
        tokio::select! {
            ran = provisioning.run() => ran?,
            lost = lease_lost(&mut leadership) => return Err(lost.into()),
        }
        embedded.start();
        Ok::<_, RunError>((provisioning, embedded))
    };
    let (provisioning, embedded) = tokio::select! {
        started = start => started?,
        () = shutdown.clone() => {
            tracing::info!("termination signal received during start-up, exiting");
            if let Some(leadership) = leadership.take() {
                leadership.step_down().await;
            }
            return Ok(Stopped::Signal);
        }
    };
    tracing::info!("provisioning loop running");
    let _trimmer = crate::memory::release_free_memory_every(std::time::Duration::from_secs(15));
    tokio::select! {
        () = shutdown => {}
        lost = lease_lost(&mut leadership) => {
            // Never two writers: stop at once, without draining; the
            // process exits non-zero and the pod restarts as a candidate.
            provisioning.shut_down();
            embedded.shut_down();
            return Err(lost.into());
        }
    }
    tracing::info!("termination signal received, finishing operations in progress");
    provisioning.shut_down();
    embedded.shut_down();
    // In-flight CSI calls have their own --timeout; a worker may still have
    // API writes to do after one, so allow the CSI timeout plus a little.
    // Losing the lease meanwhile still stops everything at once.
    let grace = options.timeout + SHUTDOWN_SLACK;
    let deadline = tokio::time::Instant::now() + grace;
    let drained = tokio::select! {
        drained = tokio::time::timeout_at(deadline, provisioning.drained()) => {
            if drained.is_err() {
                tracing::warn!(grace = %crate::duration::format_go_duration(grace), "operations still running at shutdown; exiting anyway (their state is in the journal)");
            }
            drained.is_ok()
        }
        lost = lease_lost(&mut leadership) => return Err(lost.into()),
    };
    // The journal writes removals lazily (with its next write, or up to
    // IDLE_FLUSH later): an entry whose PV was saved just before the
    // signal would outlive the process, and every later start would
    // replay it (docs/design.md, hazard 14). Written now, in what is left
    // of the grace (at least JOURNAL_FLUSH_MIN), and again as long as
    // workers past the grace still save PVs meanwhile; a lost lease still
    // stops at once, writing nothing.
    let flush_until = deadline.max(tokio::time::Instant::now() + JOURNAL_FLUSH_MIN);
    let journal = tokio::select! {
        flushed = tokio::time::timeout_at(flush_until, flush_after_workers(&provisioning, drained)) => match flushed {
            Ok(Ok(())) => {
                tracing::debug!("journal removals written");
                JournalFlush::Written
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the journal's last removals were not written; the next start checks those claims again");
                JournalFlush::Failed
            }
            Err(_) => {
                tracing::warn!("the journal's last removals were not written within the shutdown grace; the next start checks those claims again");
                JournalFlush::TimedOut
            }
        },
        lost = lease_lost(&mut leadership) => return Err(lost.into()),
    };
    shared.recorder.flush(EVENT_FLUSH).await;
    if let Some(leadership) = leadership {
        // Workers past the grace may have ended during the flush.
        let drained = {
            use futures_util::FutureExt as _;
            drained || provisioning.drained().now_or_never().is_some()
        };
        match lease_at_exit(drained, journal) {
            LeaseAtExit::StepDown => leadership.step_down().await,
            LeaseAtExit::Expire(why) => {
                // Without the gate it expires anyway: nothing to explain.
                if elector.as_ref().is_some_and(|e| e.config().release_on_exit) {
                    tracing::warn!("not releasing the leader lease, it expires instead: {why}");
                }
                leadership.let_expire();
            }
        }
    }
    tracing::info!("exiting");
    Ok(Stopped::Signal)
}

/// How the journal's last flush at shutdown ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JournalFlush {
    Written,
    /// An error: the write may still have been applied, or be applied
    /// later (a timeout of the request is an error too).
    Failed,
    /// Cut short by the shutdown grace: a write may be on the wire.
    TimedOut,
}

/// What a clean exit does with the Lease it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseAtExit {
    /// [`leader::Leadership::step_down`]: with ReleaseLeaderElectionOnExit
    /// the Lease is released and another replica leads at once.
    StepDown,
    /// [`leader::Leadership::let_expire`], for the reason given: another
    /// replica leads a lease duration after our last renewal, once what we
    /// may still have on the wire has landed.
    Expire(&'static str),
}

/// Releasing hands over at once, so only when nothing of ours can still
/// be under way: every worker ended and the journal's last write answered.
/// (Either way the fence closes first: nothing more leaves the process.)
fn lease_at_exit(workers_drained: bool, journal: JournalFlush) -> LeaseAtExit {
    match (workers_drained, journal) {
        (true, JournalFlush::Written) => LeaseAtExit::StepDown,
        (false, _) => LeaseAtExit::Expire(
            "workers were still running at exit; an API write of theirs may still be under way",
        ),
        (true, JournalFlush::Failed) => LeaseAtExit::Expire(
            "the journal's last write failed; it may still be applied after the hand-over",
        ),
        (true, JournalFlush::TimedOut) => LeaseAtExit::Expire(
            "the journal's last write was cut short by the shutdown grace; it may still be applied after the hand-over",
        ),
    }
}

/// Writes the journal's removals, and once more each time workers still
/// running past the shutdown grace have finished (`drained`: they already
/// have): a worker that saves its PV while a flush is being written
/// forgets its entry too late for that flush (chaos seed 21 of
/// tests/chaos.rs: two PVs saved 0.1 s and 0.3 s into the last flush, their
/// entries left behind). Bounded by the caller.
async fn flush_after_workers(
    provisioning: &provisioner::Context,
    drained: bool,
) -> Result<(), provisioner::journal::JournalError> {
    let mut drained = drained;
    loop {
        provisioning.flush_journal().await?;
        if drained {
            return Ok(());
        }
        drained = tokio::time::timeout(WORKERS_POLL, provisioning.drained())
            .await
            .is_ok();
    }
}

/// How often the journal's last flush is repeated while workers past the
/// shutdown grace still run.
const WORKERS_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Completes when the lease is lost; never without leader election.
async fn lease_lost(leadership: &mut Option<leader::Leadership>) -> leader::LeaderError {
    match leadership.as_mut() {
        Some(leadership) => leadership.lost().await,
        None => std::future::pending().await,
    }
}

/// How long a clean exit waits for queued events to be written.
const EVENT_FLUSH: std::time::Duration = std::time::Duration::from_secs(1);

/// At shutdown, the journal's last removals may take this long even when
/// draining the workers used up the grace (`--timeout` + [`SHUTDOWN_SLACK`]).
///
/// Three seconds: one write to a slow API server must fit (chaos seed 57
/// of tests/chaos.rs: under 1.1 s per request, one second was not enough
/// and the entries outlived the exit), and the whole shutdown must stay
/// inside Kubernetes' default termination grace of 30 s: `--timeout`
/// (10 s) + [`SHUTDOWN_SLACK`] + this + the event flush (1 s) + the Lease
/// release (at most the renew deadline, 10 s) is 26 s.
const JOURNAL_FLUSH_MIN: std::time::Duration = std::time::Duration::from_secs(3);

/// Extra time after `--timeout` for workers to record the outcome of their
/// last CSI call.
const SHUTDOWN_SLACK: std::time::Duration = std::time::Duration::from_secs(2);

/// Leader election settings from the flags.
fn leader_config(options: &Options, driver: &str, namespace: &str, host: &str) -> leader::Config {
    leader::Config {
        namespace: namespace.to_owned(),
        name: leader::lease_name(driver),
        identity: leader::identity(host),
        lease_duration: options.leader_election_lease_duration,
        renew_deadline: options.leader_election_renew_deadline,
        retry_period: options.leader_election_retry_period,
        labels: options
            .leader_election_labels
            .iter()
            .flatten()
            .cloned()
            .collect(),
        release_on_exit: options
            .gates()
            .enabled(Feature::ReleaseLeaderElectionOnExit),
    }
}

/// Starts `--http-endpoint` (metrics and health) or `--metrics-address`
/// (metrics only) when set.
async fn start_http(
    options: &Options,
    health: leader::Health,
    driver: &Driver,
    ready: http::ReadyFn,
) -> Result<(), HttpError> {
    let (flag, address, health) = if !options.http_endpoint.is_empty() {
        let probe_driver = driver.clone();
        let probe: http::ProbeFn = Arc::new(move || {
            let driver = probe_driver.clone();
            Box::pin(async move {
                match driver.probe(http::PROBE_TIMEOUT).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err("Probe answered ready=false".to_owned()),
                    Err(e) => Err(e.to_string()),
                }
            })
        });
        (
            "--http-endpoint",
            &options.http_endpoint,
            Some((health, probe)),
        )
    } else if !options.metrics_address.is_empty() {
        ("--metrics-address", &options.metrics_address, None)
    } else {
        return Ok(());
    };
    // Upstream serves pprof on --http-endpoint only.
    let pprof = options.enable_pprof && health.is_some();
    if pprof {
        // From here on allocations are sampled for /debug/pprof/heap; a
        // failure leaves the CPU profile working.
        if let Err(e) = crate::pprof::start_heap_sampling() {
            tracing::warn!(error = %e, "heap profiling is not available");
        }
    }
    http::serve(
        flag,
        address,
        http::Routes {
            metrics_path: options.metrics_path.clone(),
            pprof,
            health,
            ready: Some(ready),
        },
    )
    .await?;
    Ok(())
}

/// What a list of some kind answered.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ListProbe {
    Served,
    /// 404: the kind is not served (an API too old, a CRD not installed).
    NotServed,
    /// 403: RBAC does not allow listing it.
    Forbidden(String),
    /// Any other failure: cannot tell now.
    Unknown(String),
}

async fn probe_list<K>(client: &kube::Client) -> ListProbe
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: kube::Api<K> = kube::Api::all(client.clone());
    match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => ListProbe::Served,
        Err(kube::Error::Api(s)) if s.code == 404 => ListProbe::NotServed,
        Err(kube::Error::Api(s)) if s.code == 403 => ListProbe::Forbidden(s.message.clone()),
        Err(e) => ListProbe::Unknown(e.to_string()),
    }
}

/// What becomes of the VolumeAttributesClass gate at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VacGate {
    /// On, the classes watched.
    Watched,
    /// On (set on the command line), but the classes can be neither
    /// watched nor read: a claim naming one reads it from the API server
    /// at each attempt and fails with the API server's answer, as in the Go
    /// image, which never watches them (upstream
    /// `pkg/controller/controller.go`, `prepareProvision`: a `Get` per
    /// claim); other claims are provisioned.
    ReadPerClaim,
    /// Off: claims are provisioned without their class's parameters.
    Off,
}

/// Upstream 6.0 turns the VolumeAttributesClass gate off by itself when
/// the v1 kind is not served, and only then. When the classes cannot be
/// watched (not served with the gate set, or RBAC refusing the list), they
/// are read per claim as the Go image always reads them: a cache of them
/// would never fill and nothing would be provisioned.
/// Returns what becomes of the gate, and the line to log when it is not
/// simply watched (or when that cannot be told).
fn volume_attributes_class_gate(probe: &ListProbe, explicit: bool) -> (VacGate, Option<String>) {
    // As upstream (#1425): a gate the user set is never turned off.
    if explicit {
        return match probe {
            ListProbe::Served | ListProbe::Unknown(_) => (VacGate::Watched, None),
            ListProbe::NotServed => (
                VacGate::ReadPerClaim,
                Some("kept on because --feature-gates sets it, although the API server does not serve storage.k8s.io/v1 VolumeAttributesClass: a claim naming one fails with the API server's answer, as in the Go image; other claims are provisioned; remove the gate to provision claims without their VolumeAttributesClass".to_owned()),
            ),
            ListProbe::Forbidden(message) => (
                VacGate::ReadPerClaim,
                Some(format!("kept on because --feature-gates sets it, although RBAC does not allow list/watch of volumeattributesclasses ({message}): a claim naming one is read at each attempt and fails while RBAC refuses it, as in the Go image; other claims are provisioned; grant the rule of deploy/kubernetes/base/rbac.yaml")),
            ),
        };
    }
    match probe {
        ListProbe::Served => (VacGate::Watched, None),
        ListProbe::NotServed => (
            VacGate::Off,
            Some("turned off: the API server does not serve storage.k8s.io/v1 VolumeAttributesClass (Kubernetes 1.33 or older); claims naming a VolumeAttributesClass are provisioned without its parameters".to_owned()),
        ),
        // The Go image decides by discovery alone (upstream
        // cmd/csi-provisioner/csi-provisioner.go): RBAC does not turn its
        // gate off, and its per-claim read of the class then fails (its
        // stock rules grant none). Off here would provision such a claim
        // without the class it names, silently.
        ListProbe::Forbidden(message) => (
            VacGate::ReadPerClaim,
            Some(format!("kept on, as the Go image keeps it, although RBAC does not allow list/watch of volumeattributesclasses ({message}): a claim naming one is read at each attempt and fails while RBAC refuses it; other claims are provisioned; grant the rule of deploy/kubernetes/base/rbac.yaml")),
        ),
        ListProbe::Unknown(error) => (
            VacGate::Watched,
            Some(format!("cannot tell whether VolumeAttributesClasses can be read ({error}); keeping the gate on")),
        ),
    }
}

/// `/readyz`: ready once every watch cache is filled; else which are not
/// and why (a forbidden list names itself here, not only in the log).
fn caches_ready(caches: &Arc<Caches>) -> http::ReadyFn {
    let caches = Arc::clone(caches);
    Arc::new(move || {
        let waiting = caches.not_ready();
        if waiting.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = waiting
            .iter()
            .map(|(kind, why)| match why {
                crate::informer::Waiting::Listing => format!("{kind:?}: listing"),
                crate::informer::Waiting::Failing(e) => format!("{kind:?}: {e}"),
            })
            .collect();
        Err(format!("waiting for the watch caches: {}", list.join("; ")))
    })
}

/// The loops behind feature gates (each present only when its gate is on),
/// `--enable-capacity` and the snapshot sweep, in the order they start and
/// stop.
struct EmbeddedLoops(Vec<Arc<dyn EmbeddedLoop>>);

impl EmbeddedLoops {
    /// Registers the gated loops' cache handlers; call before the caches
    /// start. Capacity and the sweep are added by `run`, which needs the
    /// driver for them.
    fn new(shared: &Shared, options: &Options) -> Self {
        let gates = options.gates();
        let mut loops: Vec<Arc<dyn EmbeddedLoop>> = Vec::new();
        if gates.enabled(Feature::PVCProtection) {
            loops.push(crate::protection::new(shared));
        }
        if gates.enabled(Feature::PVReleaser) {
            loops.push(crate::releaser::new(
                shared,
                crate::releaser::Settings {
                    controller_id: options.controller_id.clone(),
                    disable_automatic_association: options.disable_automatic_association,
                    resync_period: options.releaser_resync_period,
                },
            ));
        }
        if gates.enabled(Feature::StatefulSetAutoDeletePVC) {
            loops.push(crate::retention::new(
                shared,
                crate::retention::Settings::default(),
            ));
        }
        if gates.enabled(Feature::PodPVCProvisioner) {
            loops.push(crate::pod_pvc::new(
                shared,
                crate::pod_pvc::Settings {
                    controller_id: options.controller_id.clone(),
                    resync_period: options.pvc_provisioner_resync_period,
                },
            ));
        }
        Self(loops)
    }

    fn push(&mut self, embedded: Arc<dyn EmbeddedLoop>) {
        self.0.push(embedded);
    }

    /// Starts the workers: only once this replica may write.
    fn start(&self) {
        for embedded in &self.0 {
            Arc::clone(embedded).start();
        }
    }

    fn shut_down(&self) {
        for embedded in &self.0 {
            embedded.shut_down();
        }
    }
}

/// Every loop's API calls (each declares them next to its code), with the
/// loop's name: the deploy tests map a name to the component of `deploy/`
/// whose RBAC rules must grant them (tests/deploy/rbac.rs). Gathered here,
/// where the loops are wired, so that `crate::api_calls` stays below them.
pub fn api_calls() -> Vec<(&'static str, &'static [ApiCall])> {
    vec![
        ("provisioner", crate::provisioner::API_CALLS),
        ("leader-election", crate::leader::API_CALLS),
        ("snapshot-sweep", crate::snapshot_sweep::API_CALLS),
        ("orphan-audit", crate::orphan_audit::API_CALLS),
        ("pvc-protection", crate::protection::API_CALLS),
        ("pv-releaser", crate::releaser::API_CALLS),
        ("statefulset-retention", crate::retention::API_CALLS),
        ("capacity", crate::capacity::API_CALLS),
        (
            "cross-namespace-data-source",
            crate::provisioner::CROSS_NAMESPACE_API_CALLS,
        ),
        ("pod-pvc-provisioner", crate::pod_pvc::API_CALLS),
        (
            "namespace-metadata",
            crate::provisioner::NAMESPACE_METADATA_API_CALLS,
        ),
    ]
}

/// The loops that declare `verb` on `resource` (with `/subresource`) of
/// `group`; empty when none does (the real-cluster tests' audit check).
/// Besides [`api_calls`], the read + update that stands in for a patch the
/// stock upstream rules refuse ([`crate::writes::FALLBACK_API_CALLS`])
/// counts as declared.
pub fn declaring_api_call(verb: &str, group: &str, resource: &str) -> Vec<&'static str> {
    let mut loops = api_calls();
    loops.push(("patch-fallback", crate::writes::FALLBACK_API_CALLS));
    crate::api_calls::declaring(&loops, verb, group, resource)
}

/// `--enable-capacity`: refuses a driver without GET_CAPACITY and a pod
/// without the environment the loop needs, before anything else starts.
fn capacity_settings(
    options: &Options,
    driver: &Driver,
) -> Result<Option<crate::capacity::Settings>, crate::capacity::CapacityError> {
    if !options.enable_capacity {
        return Ok(None);
    }
    let info = driver.info();
    crate::capacity::check_driver(info)?;
    let topology =
        options.gates().enabled(Feature::Topology) && info.plugin.volume_accessibility_constraints;
    crate::capacity::Settings::from_options(options, topology, |var| std::env::var(var).ok())
        .map(Some)
}

/// The provisioning decisions' configuration, from flags, gates and what the
/// driver can do.
pub fn provisioner_config(options: &Options, driver: &Driver) -> ProvisionerConfig {
    let info = driver.info();
    let gates = options.gates();
    let mut config = ProvisionerConfig::with_defaults(info.name.clone());
    // Recorded in each PV's volume attributes so a restarted provisioner can
    // tell its own PVs; unique per process start.
    let start_unix_millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or_default();
    config.provisioner_identity =
        provisioner_identity(start_unix_millis, std::process::id(), &info.name);
    config.volume_name_prefix = options.volume_name_prefix.clone();
    config.volume_name_uuid_length = usize::try_from(options.volume_name_uuid_length).ok();
    config.default_fstype = options.default_fstype.clone();
    config.extra_create_metadata = options.extra_create_metadata;
    config.strict_topology = options.strict_topology;
    config.immediate_topology = options.immediate_topology;
    config.immediate_topology_per_key_set = options.immediate_topology_per_key_set;
    config.namespace_metadata = crate::provision::namespace_metadata::NamespaceMetadataKeys::new(
        &options.extra_create_metadata_namespace_labels,
        &options.extra_create_metadata_namespace_annotations,
    );
    config.topology_enabled =
        gates.enabled(Feature::Topology) && info.plugin.volume_accessibility_constraints;
    config.controller_publish_readonly = options.controller_publish_readonly;
    config.prevent_volume_mode_conversion = options.prevent_volume_mode_conversion;
    config.honor_pv_reclaim_policy = gates.enabled(Feature::HonorPVReclaimPolicy);
    config.volume_attributes_class_enabled = gates.enabled(Feature::VolumeAttributesClass);
    config.cross_namespace_data_source = gates.enabled(Feature::CrossNamespaceVolumeDataSource);
    config.claim_metadata_propagation = gates.enabled(Feature::ClaimMetadataPropagation);
    config.capabilities = DriverCapabilities {
        clone_volume: info.controller.has(ControllerCap::CloneVolume),
        create_delete_snapshot: info.controller.has(ControllerCap::CreateDeleteSnapshot),
        modify_volume: info.controller.has(ControllerCap::ModifyVolume),
        single_node_multi_writer: info.controller.has(ControllerCap::SingleNodeMultiWriter),
        publish_unpublish_volume: info.controller.has(ControllerCap::PublishUnpublishVolume),
    };
    config
}

/// The node deployment flags.
fn node_deployment_flags(options: &Options) -> NodeDeploymentFlags {
    NodeDeploymentFlags {
        immediate_binding: options.node_deployment_immediate_binding,
        base_delay: options.node_deployment_base_delay,
        max_delay: options.node_deployment_max_delay,
    }
}

/// The namespace of the journal: `--leader-election-namespace`, else the
/// pod's namespace (`NAMESPACE` / `POD_NAMESPACE` env or the service-account
/// file), else the kubeconfig's namespace.
fn own_namespace(options: &Options, kubeconfig_namespace: &str) -> String {
    if !options.leader_election_namespace.is_empty() {
        return options.leader_election_namespace.clone();
    }
    for var in ["NAMESPACE", "POD_NAMESPACE"] {
        if let Ok(ns) = std::env::var(var)
            && !ns.is_empty()
        {
            return ns;
        }
    }
    if let Ok(ns) =
        std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    {
        let ns = ns.trim();
        if !ns.is_empty() {
            return ns.to_owned();
        }
    }
    kubeconfig_namespace.to_owned()
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Completes on SIGTERM or SIGINT. The handlers are installed by this
/// call, not when the future is first polled: from then on a signal no
/// longer ends the process at once, and a SIGTERM during start-up is a
/// clean exit (0). Call it first thing, inside the runtime's context.
pub fn termination_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    );
    async move {
        match handlers {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "cannot install signal handlers; only Ctrl-C will stop the process");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

#[cfg(test)]
mod api_call_tests {
    use super::*;

    #[test]
    fn every_declared_verb_is_an_rbac_verb_and_every_loop_declares_something() {
        const VERBS: &[&str] = &[
            "get", "list", "watch", "create", "update", "patch", "delete",
        ];
        for (name, calls) in api_calls() {
            assert!(!calls.is_empty(), "{name} declares no call");
            for c in calls {
                for verb in c.verbs {
                    assert!(VERBS.contains(verb), "{name}: {verb} on {}", c.resource);
                }
            }
        }
    }

    #[test]
    fn the_patch_fallback_counts_as_declared_only_for_what_it_reads_and_updates() {
        let cases: &[(&str, &str, &str, &[&str])] = &[
            ("update", "", "persistentvolumeclaims", &["patch-fallback"]),
            (
                "patch",
                "",
                "persistentvolumeclaims",
                &["provisioner", "pvc-protection", "statefulset-retention"],
            ),
            ("update", "", "persistentvolumes", &[]),
            ("get", "", "pods/log", &[]),
        ];
        for (verb, group, resource, want) in cases {
            assert_eq!(
                declaring_api_call(verb, group, resource),
                *want,
                "{verb} {resource}"
            );
        }
    }
}

#[cfg(test)]
mod shutdown_tests {
    use super::*;

    #[test]
    fn the_lease_is_released_only_when_nothing_of_ours_is_under_way() {
        use JournalFlush::*;
        let cases = [
            (true, Written, None),
            (true, Failed, Some("journal's last write failed")),
            (true, TimedOut, Some("cut short by the shutdown grace")),
            (false, Written, Some("workers were still running")),
            (false, Failed, Some("workers were still running")),
            (false, TimedOut, Some("workers were still running")),
        ];
        for (drained, journal, expire) in cases {
            let got = lease_at_exit(drained, journal);
            match expire {
                None => assert_eq!(got, LeaseAtExit::StepDown, "{drained} {journal:?}"),
                Some(why) => assert!(
                    matches!(got, LeaseAtExit::Expire(w) if w.contains(why)),
                    "{drained} {journal:?}: {got:?}"
                ),
            }
        }
    }
}

#[cfg(test)]
mod vac_tests {
    use super::*;

    #[test]
    fn the_gate_follows_what_the_cluster_allows() {
        use ListProbe as P;
        use VacGate as G;
        // (probe, not set explicitly, set explicitly, what the line says)
        let cases = [
            (P::Served, G::Watched, G::Watched, None),
            (
                P::NotServed,
                G::Off,
                G::ReadPerClaim,
                Some("does not serve storage.k8s.io/v1"),
            ),
            (
                P::Forbidden("forbidden: user x".into()),
                G::ReadPerClaim,
                G::ReadPerClaim,
                Some("RBAC does not allow"),
            ),
            (
                P::Unknown("connection reset".into()),
                G::Watched,
                G::Watched,
                Some("keeping the gate on"),
            ),
        ];
        for (probe, implicit, explicit, message) in cases {
            // Set on the command line: never turned off (upstream #1425).
            let (kept, why) = volume_attributes_class_gate(&probe, true);
            assert_eq!(kept, explicit, "{probe:?}: set explicitly");
            if explicit == G::ReadPerClaim {
                assert!(
                    why.as_deref().is_some_and(
                        |w| w.contains("kept on") && w.contains("other claims are provisioned")
                    ),
                    "{probe:?}: {why:?}"
                );
            }
            let (gate, why) = volume_attributes_class_gate(&probe, false);
            assert_eq!(gate, implicit, "{probe:?}");
            match message {
                None => assert!(why.is_none(), "{probe:?}: {why:?}"),
                Some(m) => assert!(
                    why.as_deref().is_some_and(|w| w.contains(m)),
                    "{probe:?}: {why:?}"
                ),
            }
        }
    }
}
