//! Prometheus metrics with the upstream sidecar's names and labels, so
//! existing dashboards and alerts keep working after the switch:
//!
//! - `csi_sidecar_operations_seconds` (csi-lib-utils `metrics`): every CSI
//!   call, labels `driver_name`, `method_name` (`/csi.v1.Controller/CreateVolume`)
//!   and `grpc_status_code` (Go's code names: `OK`, `DeadlineExceeded`, …).
//! - `controller_persistentvolumeclaim_provision_{total,failed_total,duration_seconds}`
//!   and `controller_persistentvolume_delete_{total,failed_total,duration_seconds}`
//!   (sig-storage-lib-external-provisioner `controller/metrics`), label `class`,
//!   and `source` (the claim's data source kind) on the provisioning ones.
//! - the client-go workqueue family (`workqueue_depth`, `_adds_total`,
//!   `_retries_total`, `_queue_duration_seconds`, `_work_duration_seconds`,
//!   `_unfinished_work_seconds`, `_longest_running_processor_seconds`),
//!   label `name` (`claims`, `volumes`, …), with client-go's buckets.
//! - `leader_election_master_status` (client-go leaderelection), label `name`.
//! - `csistoragecapacities_desired_goal`, `csistoragecapacities_desired_current`,
//!   `csistoragecapacities_obsolete` (upstream's `pkg/capacity`), with
//!   `--enable-capacity` only.
//!
//! - extras of this sidecar, named `csi_provisioner_*` (docs/operations.md,
//!   "Metrics"), among them the per-StorageClass service levels: claim
//!   creation to PV saved and release to volume deleted (histograms), the
//!   claims and volumes waiting and the oldest one's age (gauges), driver
//!   call latency by class, and the journal's entries in flight.
//!
//! Help texts carry component-base's stability prefix (`[ALPHA] `, `[BETA] `)
//! where upstream registers through component-base, exactly as its scrape
//! shows them. The endpoint serves Prometheus' text format 0.0.4, as
//! upstream does, and OpenMetrics only to a scraper that asks for it
//! ([`negotiate`]).
//!
//! One process-wide registry: the call sites (CSI calls, queues, workers)
//! are many and deep, and threading a handle through each would touch every
//! loop for no gain — there is exactly one sidecar per process.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::{LazyLock, Mutex, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use csi_proto::codes::go_code_name;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// csi-lib-utils' buckets for `csi_sidecar_operations_seconds`.
const CSI_BUCKETS: [f64; 13] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0,
];
/// Prometheus' `DefBuckets`, which the provisioner library uses.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Service-level histograms (claim creation to PV saved, release to
/// volume deleted): from a second (an Immediate claim on a fast driver) to
/// a day (a claim whose pod waited for a node, a driver that retried for
/// hours), dense where alerts are usually set (minutes).
const SLO_BUCKETS: [f64; 17] = [
    1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0,
    14400.0, 28800.0, 86400.0,
];

/// client-go's workqueue buckets: `ExponentialBuckets(10e-9, 10, 10)`,
/// computed by the same repeated multiplication, so the `le` values are the
/// same floats (`9.999999999999999e-06`, not `1e-05`).
fn workqueue_buckets() -> Vec<f64> {
    let mut buckets = Vec::with_capacity(10);
    let mut bound = 10e-9;
    for _ in 0..10 {
        buckets.push(bound);
        bound *= 10.0;
    }
    buckets
}

/// The drivers csi-translation-lib migrates in-tree volumes to: only for
/// these does upstream add the `migrated` label to
/// `csi_sidecar_operations_seconds` (csi-lib-utils `WithMigration`).
pub const MIGRATION_DRIVERS: [&str; 7] = [
    "pd.csi.storage.gke.io",
    "ebs.csi.aws.com",
    "cinder.csi.openstack.org",
    "disk.csi.azure.com",
    "file.csi.azure.com",
    "csi.vsphere.vmware.com",
    "pxd.portworx.com",
];

/// csi-lib-utils' driver name before `GetPluginInfo` answered.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

/// `driver_name`, `grpc_status_code`, `method_name` and, for migration
/// drivers only, `migrated`: a list because the last label exists for some
/// drivers and not others (in client_golang's order, sorted by name).
type CsiLabels = Vec<(&'static str, String)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassSourceLabels {
    class: String,
    source: String,
}

/// The extras' class label: named `storage_class`, not upstream's `class`,
/// so that a query joining them with upstream's families says which is
/// which.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct StorageClassLabels {
    storage_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DriverCallLabels {
    storage_class: String,
    /// `CreateVolume`, `DeleteVolume`.
    method: String,
    grpc_status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WhatLabels {
    what: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapabilityLabels {
    capability: String,
}

/// No labels; a family so that the metric is absent until first set (the
/// capacity gauges exist only with `--enable-capacity`, as upstream). It is
/// encoded `name{} value`, which Prometheus reads as no labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLabels {}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// A queue's items in processing, with their start times (`None` once the
/// queue is gone).
type ProcessingProbe = Box<dyn Fn() -> Option<Vec<Instant>> + Send + Sync>;

/// The claims, volumes and journal entries waiting, as [`Backlogs`] (`None`
/// once what they were read from is gone).
pub type BacklogProbe = Box<dyn Fn() -> Option<Backlogs> + Send + Sync>;

/// How many wait and since how long the oldest one does.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Backlog {
    pub count: usize,
    /// 0 with none waiting, or none whose start is known.
    pub oldest_seconds: f64,
}

/// What the backlog gauges show at a scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backlogs {
    /// StorageClass name → claims waiting for their volume.
    pub claims: BTreeMap<String, Backlog>,
    /// StorageClass name → volumes waiting for deletion.
    pub volumes: BTreeMap<String, Backlog>,
    /// Operations in flight, each with its journal entry.
    pub journal: Backlog,
}

/// The backlog probe and the classes it reported at the last scrape (a
/// class it no longer reports is removed; one it still reports is set, never
/// removed and added again, so that a concurrent scrape cannot miss it and
/// reset an alert's `for`).
#[derive(Default)]
struct BacklogState {
    probe: Option<BacklogProbe>,
    claim_classes: Vec<StorageClassLabels>,
    volume_classes: Vec<StorageClassLabels>,
}

struct Metrics {
    registry: Registry,
    /// Family name → upstream's help text.
    help: BTreeMap<&'static str, &'static str>,
    driver_name: RwLock<String>,
    /// Whether `driver_name` is a migration driver (adds `migrated`).
    migration_driver: RwLock<bool>,
    csi_operations: Histograms<CsiLabels>,
    provision_total: Family<ClassSourceLabels, Counter>,
    provision_failed: Family<ClassSourceLabels, Counter>,
    provision_duration: Histograms<ClassSourceLabels>,
    delete_total: Family<ClassLabels, Counter>,
    delete_failed: Family<ClassLabels, Counter>,
    delete_duration: Histograms<ClassLabels>,
    queue_depth: Family<QueueLabels, Gauge>,
    queue_adds: Family<QueueLabels, Counter>,
    queue_retries: Family<QueueLabels, Counter>,
    queue_latency: Histograms<QueueLabels>,
    queue_work_duration: Histograms<QueueLabels>,
    queue_unfinished: Family<QueueLabels, FloatGauge>,
    queue_longest: Family<QueueLabels, FloatGauge>,
    queue_probes: Mutex<Vec<(&'static str, ProcessingProbe)>>,
    leader: Family<QueueLabels, Gauge>,
    capability: Family<CapabilityLabels, Gauge>,
    events_dropped: Family<NoLabels, Counter>,
    remembered: Family<WhatLabels, Gauge>,
    events_coalesced: Family<NoLabels, Counter>,
    patches_refused: Family<WhatLabels, Counter>,
    live_reads: Family<WhatLabels, Counter>,
    driver_reachable: Family<NoLabels, Gauge>,
    driver_concurrency_limit: Family<NoLabels, Gauge>,
    capacity_goal: Family<NoLabels, Gauge>,
    capacity_current: Family<NoLabels, Gauge>,
    capacity_obsolete: Family<NoLabels, Gauge>,
    claim_provisioning: Histograms<StorageClassLabels>,
    claims_pending: Family<StorageClassLabels, Gauge>,
    claims_pending_oldest: Family<StorageClassLabels, FloatGauge>,
    volume_deletion: Histograms<StorageClassLabels>,
    volumes_pending: Family<StorageClassLabels, Gauge>,
    volumes_pending_oldest: Family<StorageClassLabels, FloatGauge>,
    driver_calls: Histograms<DriverCallLabels>,
    journal_entries: Family<NoLabels, Gauge>,
    journal_oldest: Family<NoLabels, FloatGauge>,
    backlog: Mutex<BacklogState>,
    scrapes_in_flight: Gauge,
    scrapes: Family<CodeLabels, Counter>,
}

fn csi_histogram() -> Histogram {
    Histogram::new(CSI_BUCKETS)
}

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

fn slo_histogram() -> Histogram {
    Histogram::new(SLO_BUCKETS)
}

fn workqueue_histogram() -> Histogram {
    Histogram::new(workqueue_buckets())
}

/// Registers `metric` under `name` with upstream's exact `help_text`,
/// noted for the text exposition (prometheus-client appends a full stop to
/// every help text, which upstream's do not all have).
fn register(
    registry: &mut Registry,
    help: &mut BTreeMap<&'static str, &'static str>,
    name: &'static str,
    help_text: &'static str,
    metric: impl prometheus_client::registry::Metric,
) {
    registry.register(
        name,
        help_text.strip_suffix('.').unwrap_or(help_text),
        metric,
    );
    help.insert(name, help_text);
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::default();
    let mut help = BTreeMap::new();
    let csi_operations: Histograms<CsiLabels> = Family::new_with_constructor(csi_histogram);
    let provision_duration: Histograms<ClassSourceLabels> =
        Family::new_with_constructor(default_histogram);
    let delete_duration: Histograms<ClassLabels> = Family::new_with_constructor(default_histogram);
    let m = Metrics {
        registry: Registry::default(),
        help: BTreeMap::new(),
        driver_name: RwLock::new(UNKNOWN_DRIVER.to_owned()),
        migration_driver: RwLock::new(false),
        csi_operations,
        provision_total: Family::default(),
        provision_failed: Family::default(),
        provision_duration,
        delete_total: Family::default(),
        delete_failed: Family::default(),
        delete_duration,
        queue_depth: Family::default(),
        queue_adds: Family::default(),
        queue_retries: Family::default(),
        queue_latency: Family::new_with_constructor(workqueue_histogram),
        queue_work_duration: Family::new_with_constructor(workqueue_histogram),
        queue_unfinished: Family::default(),
        queue_longest: Family::default(),
        queue_probes: Mutex::default(),
        leader: Family::default(),
        capability: Family::default(),
        events_dropped: Family::default(),
        patches_refused: Family::default(),
        live_reads: Family::default(),
        driver_reachable: Family::default(),
        driver_concurrency_limit: Family::default(),
        remembered: Family::default(),
        events_coalesced: Family::default(),
        capacity_goal: Family::default(),
        capacity_current: Family::default(),
        capacity_obsolete: Family::default(),
        claim_provisioning: Family::new_with_constructor(slo_histogram),
        claims_pending: Family::default(),
        claims_pending_oldest: Family::default(),
        volume_deletion: Family::new_with_constructor(slo_histogram),
        volumes_pending: Family::default(),
        volumes_pending_oldest: Family::default(),
        driver_calls: Family::new_with_constructor(csi_histogram),
        journal_entries: Family::default(),
        journal_oldest: Family::default(),
        backlog: Mutex::default(),
        scrapes_in_flight: Gauge::default(),
        scrapes: Family::default(),
    };
    // Counters get their `_total` suffix from the encoder.
    register(
        &mut registry,
        &mut help,
        "csi_sidecar_operations_seconds",
        "[ALPHA] Container Storage Interface operation duration with gRPC error code status total",
        m.csi_operations.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "controller_persistentvolumeclaim_provision",
        "Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.",
        m.provision_total.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "controller_persistentvolumeclaim_provision_failed",
        "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim.",
        m.provision_failed.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "controller_persistentvolumeclaim_provision_duration_seconds",
        "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim.",
        m.provision_duration.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "controller_persistentvolume_delete",
        "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
        m.delete_total.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "controller_persistentvolume_delete_failed",
        "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
        m.delete_failed.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "controller_persistentvolume_delete_duration_seconds",
        "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
        m.delete_duration.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_depth",
        "[BETA] Current depth of workqueue",
        m.queue_depth.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_adds",
        "[BETA] Total number of adds handled by workqueue",
        m.queue_adds.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_retries",
        "[BETA] Total number of retries handled by workqueue",
        m.queue_retries.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_queue_duration_seconds",
        "[BETA] How long in seconds an item stays in workqueue before being requested.",
        m.queue_latency.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_work_duration_seconds",
        "[BETA] How long in seconds processing an item from workqueue takes.",
        m.queue_work_duration.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_unfinished_work_seconds",
        "[BETA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
        m.queue_unfinished.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "workqueue_longest_running_processor_seconds",
        "[BETA] How many seconds has the longest running processor for workqueue been running.",
        m.queue_longest.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "leader_election_master_status",
        "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
        m.leader.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "leader_election_slowpath",
        "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
        LEADER_SLOWPATH.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_capability_enabled",
        "Whether an optional capability of this sidecar is in use (1) or was turned off at start because the cluster does not serve or RBAC does not allow what it needs (0): journal (the write-ahead journal ConfigMap), volume_attributes_class.",
        m.capability.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_remembered_objects",
        "Objects remembered between events, by what for: event_filter (the last event of each object), deleted_volumes (PVs whose backend volume is deleted), finalizer_writes (finalizer changes the cache has not seen yet), in_flight (operations whose volume may exist without a PV). Each must fall back as objects go.",
        m.remembered.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_events_dropped",
        "Events dropped because the queue of events waiting for spare API budget was full.",
        m.events_dropped.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_driver_reachable",
        "Whether the CSI driver's socket answers (1) or not (0: its connection is refused or broke, and the sidecar re-dials it instead of exiting as the Go image does). Updated by every CSI call and a Probe every 10 s.",
        m.driver_reachable.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_driver_concurrency_limit",
        "How many CreateVolume and DeleteVolume calls may be in flight to the CSI driver at once (--adaptive-concurrency): halved when the driver answers RESOURCE_EXHAUSTED or ABORTED, raised again by its successful calls, at most twice --worker-threads. Absent with --adaptive-concurrency=false.",
        m.driver_concurrency_limit.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_patches_refused",
        "JSON patches the API server refused (422) although their tests still held on the live object, by what they did: an invalid patch, not a stale cache, so they are not retried until the object changes.",
        m.patches_refused.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_live_reads",
        "Reads sent to the API server because a watch cache could not be shown current for a decision that deletes, releases or exposes data (docs/design.md, \"Reading current state\"), by what was read.",
        m.live_reads.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_events_coalesced",
        "Events replaced in the queue by a newer event of the same object (a Provisioning note by its outcome, or a repeat of the same reason).",
        m.events_coalesced.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_claim_provisioning_seconds",
        "Time from a claim's creation (metadata.creationTimestamp) to its PersistentVolume saved by this sidecar, by StorageClass: observed once per claim, when its PV is saved. Includes the time a WaitForFirstConsumer claim waited for its pod to be scheduled.",
        m.claim_provisioning.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_claims_pending",
        "Claims of this driver's provisioner waiting for their volume (no spec.volumeName, not being deleted), by StorageClass. Reported by the leader only; aggregate with max by (storage_class).",
        m.claims_pending.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_claims_pending_oldest_seconds",
        "Age in seconds (since metadata.creationTimestamp) of the oldest claim counted by csi_provisioner_claims_pending, 0 with none, by StorageClass. Reported by the leader only.",
        m.claims_pending_oldest.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_volume_deletion_seconds",
        "Time from a PersistentVolume becoming Released (status.lastPhaseTransitionTime) to its backend volume deleted by this sidecar, by StorageClass: observed once per volume. Not observed where the API server does not set lastPhaseTransitionTime (before Kubernetes 1.29).",
        m.volume_deletion.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_volumes_pending_deletion",
        "PersistentVolumes of this driver that are Released with reclaim policy Delete and whose backend volume is not deleted yet, by StorageClass. Reported by the leader only; aggregate with max by (storage_class).",
        m.volumes_pending.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_volumes_pending_deletion_oldest_seconds",
        "Seconds since the oldest volume counted by csi_provisioner_volumes_pending_deletion became Released (status.lastPhaseTransitionTime), 0 with none or none whose time is known, by StorageClass. Reported by the leader only.",
        m.volumes_pending_oldest.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_driver_call_seconds",
        "Duration of the CreateVolume and DeleteVolume calls made for a claim or volume of a StorageClass, by class, method and gRPC status code (csi_sidecar_operations_seconds has no class). Calls made to clean up after a claim that is gone are not counted here.",
        m.driver_calls.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_journal_entries",
        "Provisioning operations in flight (a CreateVolume that may have reached the driver and whose volume is not recorded in a PersistentVolume yet), each with its entry in the write-ahead journal. Reported by the leader only.",
        m.journal_entries.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_journal_oldest_entry_seconds",
        "Age in seconds of the oldest operation counted by csi_provisioner_journal_entries, 0 with none; an entry read back from the journal at start counts from then. Reported by the leader only.",
        m.journal_oldest.clone(),
    );
    // The orphan audit's gauges (src/orphan_audit, ORPHANED below).
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_orphaned_volumes",
        "Backend volumes the driver lists (ListVolumes) that no PersistentVolume of this cluster names, at two orphan audits in a row; reported, never deleted. Absent until the leader's second audit.",
        ORPHANED.0.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csi_provisioner_orphaned_volume_bytes",
        "Total capacity in bytes of the volumes counted by csi_provisioner_orphaned_volumes, as the driver gave it; absent when it gave none.",
        ORPHANED.1.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csistoragecapacities_desired_goal",
        "[ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
        m.capacity_goal.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csistoragecapacities_desired_current",
        "[ALPHA] Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically.",
        m.capacity_current.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "csistoragecapacities_obsolete",
        "[ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.",
        m.capacity_obsolete.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "promhttp_metric_handler_requests_in_flight",
        "Current number of scrapes being served.",
        m.scrapes_in_flight.clone(),
    );
    register(
        &mut registry,
        &mut help,
        "promhttp_metric_handler_requests",
        "Total number of scrapes by HTTP status code.",
        m.scrapes.clone(),
    );
    // client_golang's instrumented handler starts the codes it can answer
    // at zero.
    for code in ["200", "500", "503"] {
        let _ = m.scrapes.get_or_create(&CodeLabels {
            code: code.to_owned(),
        });
    }
    registry.register_collector(Box::new(ProcessCollector));
    Metrics {
        registry,
        help,
        ..m
    }
});

/// The `process_*` metrics Go's default registry exports for the upstream
/// sidecar (dashboards alert on memory and restarts), read from `/proc` at
/// each scrape. Absent where `/proc` is not available.
#[derive(Debug)]
struct ProcessCollector;

/// The kernel reports CPU times and start time in USER_HZ, which is 100 on
/// every architecture Kubernetes nodes run.
const USER_HZ: f64 = 100.0;

/// Figures parsed from `/proc`.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProcessStats {
    pub cpu_seconds: Option<f64>,
    pub start_time_seconds: Option<f64>,
    pub resident_memory_bytes: Option<i64>,
    pub virtual_memory_bytes: Option<i64>,
    pub open_fds: Option<i64>,
    pub max_fds: Option<i64>,
    /// The address-space limit; "unlimited" is Go's `math.MaxUint64`.
    pub virtual_memory_max_bytes: Option<f64>,
    /// Bytes received and sent on every interface of the process's network
    /// namespace (`/proc/self/net/dev`, as Go's procfs sums it).
    pub network_receive_bytes: Option<f64>,
    pub network_transmit_bytes: Option<f64>,
}

/// Sums the receive and transmit byte columns of `/proc/self/net/dev`.
pub fn parse_net_dev(net_dev: &str) -> Option<(f64, f64)> {
    let mut totals: Option<(f64, f64)> = None;
    for line in net_dev.lines().skip(2) {
        let Some((_, counters)) = line.split_once(':') else {
            continue;
        };
        let columns: Vec<f64> = counters
            .split_whitespace()
            .filter_map(|c| c.parse().ok())
            .collect();
        if let (Some(rx), Some(tx)) = (columns.first(), columns.get(8)) {
            let (r, t) = totals.get_or_insert((0.0, 0.0));
            *r += rx;
            *t += tx;
        }
    }
    totals
}

/// Parses `/proc/self/stat` (CPU ticks and start ticks), `/proc/stat`
/// (boot time), `/proc/self/status` (memory) and `/proc/self/limits`.
pub fn parse_process_stats(stat: &str, boot: &str, status: &str, limits: &str) -> ProcessStats {
    // The command name (field 2) may contain spaces; fields resume after
    // its closing parenthesis, at field 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let btime = boot
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<i64>().ok())
            .map(|v| v.saturating_mul(1024))
    };
    let max_fds = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse::<i64>().ok());
    let virtual_memory_max_bytes = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| match v {
            "unlimited" => Some(u64::MAX as f64),
            v => v.parse::<f64>().ok(),
        });
    ProcessStats {
        cpu_seconds: field(14)
            .zip(field(15))
            .map(|(user, system)| (user + system) / USER_HZ),
        start_time_seconds: field(22)
            .zip(btime)
            .map(|(ticks, boot)| boot + ticks / USER_HZ),
        resident_memory_bytes: kib("VmRSS:"),
        virtual_memory_bytes: kib("VmSize:"),
        open_fds: None,
        max_fds,
        virtual_memory_max_bytes,
        network_receive_bytes: None,
        network_transmit_bytes: None,
    }
}

fn read_process_stats() -> ProcessStats {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let mut stats = parse_process_stats(
        &read("/proc/self/stat"),
        &read("/proc/stat"),
        &read("/proc/self/status"),
        &read("/proc/self/limits"),
    );
    stats.open_fds = std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|d| i64::try_from(d.count()).unwrap_or(i64::MAX));
    if let Some((rx, tx)) = parse_net_dev(&read("/proc/self/net/dev")) {
        stats.network_receive_bytes = Some(rx);
        stats.network_transmit_bytes = Some(tx);
    }
    stats
}

impl prometheus_client::collector::Collector for ProcessCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let stats = read_process_stats();
        let counters = [
            (
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                stats.cpu_seconds,
            ),
            (
                "process_network_receive_bytes",
                "Number of bytes received by the process over the network.",
                stats.network_receive_bytes,
            ),
            (
                "process_network_transmit_bytes",
                "Number of bytes sent by the process over the network.",
                stats.network_transmit_bytes,
            ),
        ];
        for (name, help, value) in counters {
            if let Some(v) = value {
                ConstCounter::new(v).encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    MetricType::Counter,
                )?)?;
            }
        }
        let gauges_f64 = [
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                stats.start_time_seconds,
            ),
            (
                "process_virtual_memory_max_bytes",
                "Maximum amount of virtual memory available in bytes.",
                stats.virtual_memory_max_bytes,
            ),
        ];
        for (name, help, value) in gauges_f64 {
            if let Some(v) = value {
                ConstGauge::new(v).encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    MetricType::Gauge,
                )?)?;
            }
        }
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                stats.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                stats.virtual_memory_bytes,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                stats.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                stats.max_fds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                ConstGauge::new(v).encode(encoder.encode_descriptor(
                    name,
                    help,
                    None,
                    MetricType::Gauge,
                )?)?;
            }
        }
        Ok(())
    }
}

/// Names the driver in `driver_name` once `GetPluginInfo` answered. For a
/// migration driver, upstream replaces its metrics manager by one with the
/// `migrated` label at this point, so the calls recorded before (without
/// the label) are no longer exported: the same happens here.
pub fn set_driver_name(name: &str) {
    let migration = MIGRATION_DRIVERS.contains(&name);
    *METRICS
        .driver_name
        .write()
        .unwrap_or_else(|p| p.into_inner()) = name.to_owned();
    let mut current = METRICS
        .migration_driver
        .write()
        .unwrap_or_else(|p| p.into_inner());
    if migration && !*current {
        METRICS.csi_operations.clear();
    }
    *current = migration;
}

/// The full gRPC method of a CSI call, as Go's interceptor reports it.
pub fn csi_method_name(method: &str) -> String {
    let service = match method {
        "Probe" | "GetPluginInfo" | "GetPluginCapabilities" => "Identity",
        m if m.starts_with("Node") => "Node",
        _ => "Controller",
    };
    format!("/csi.v1.{service}/{method}")
}

/// One finished CSI call that is not part of a CSI migration.
pub fn observe_csi_call(method: &str, code: tonic::Code, took: Duration) {
    observe_csi_call_migrated(method, code, took, false);
}

/// One finished CSI call; `migrated` says whether it serves an in-tree
/// volume migrated to CSI (upstream's `markAsMigrated`). The label is
/// written only for migration drivers, as upstream.
pub fn observe_csi_call_migrated(method: &str, code: tonic::Code, took: Duration, migrated: bool) {
    let driver_name = METRICS
        .driver_name
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let migration_driver = *METRICS
        .migration_driver
        .read()
        .unwrap_or_else(|p| p.into_inner());
    METRICS
        .csi_operations
        .get_or_create(&csi_labels(
            driver_name,
            method,
            code,
            migration_driver.then_some(migrated),
        ))
        .observe(took.as_secs_f64());
}

fn csi_labels(
    driver_name: String,
    method: &str,
    code: tonic::Code,
    migrated: Option<bool>,
) -> CsiLabels {
    let mut labels = vec![
        ("driver_name", driver_name),
        // grpc-go's `codes.Code.String()`: the label values dashboards
        // match on (the same names as in event messages).
        ("grpc_status_code", go_code_name(code).to_owned()),
        ("method_name", csi_method_name(method)),
    ];
    if let Some(migrated) = migrated {
        labels.push(("migrated", migrated.to_string()));
    }
    labels
}

fn class(name: &str) -> ClassLabels {
    ClassLabels {
        class: name.to_owned(),
    }
}

fn class_source(class: &str, source: &str) -> ClassSourceLabels {
    ClassSourceLabels {
        class: class.to_owned(),
        source: source.to_owned(),
    }
}

/// A provisioning attempt that ended with the PV saved. `source` is the
/// kind of the claim's data source (`VolumeSnapshot`, …), empty without.
pub fn provision_succeeded(class_name: &str, source: &str, took: Duration) {
    let labels = class_source(class_name, source);
    METRICS.provision_total.get_or_create(&labels).inc();
    METRICS
        .provision_duration
        .get_or_create(&labels)
        .observe(took.as_secs_f64());
}

/// A provisioning attempt that failed (each attempt counts, as upstream).
pub fn provision_failed(class_name: &str, source: &str) {
    METRICS
        .provision_failed
        .get_or_create(&class_source(class_name, source))
        .inc();
}

/// A PV whose backend volume was deleted.
pub fn delete_succeeded(class_name: &str, took: Duration) {
    METRICS.delete_total.get_or_create(&class(class_name)).inc();
    METRICS
        .delete_duration
        .get_or_create(&class(class_name))
        .observe(took.as_secs_f64());
}

/// A failed deletion attempt.
pub fn delete_failed(class_name: &str) {
    METRICS
        .delete_failed
        .get_or_create(&class(class_name))
        .inc();
}

fn storage_class(name: &str) -> StorageClassLabels {
    StorageClassLabels {
        storage_class: name.to_owned(),
    }
}

/// A claim of `class_name` whose PV this sidecar saved, `since_created`
/// after the claim was created (once per claim: see the metric's help).
pub fn claim_provisioned(class_name: &str, since_created: Duration) {
    METRICS
        .claim_provisioning
        .get_or_create(&storage_class(class_name))
        .observe(since_created.as_secs_f64());
}

/// A PV of `class_name` whose backend volume this sidecar deleted,
/// `since_released` after it became Released.
pub fn volume_deleted(class_name: &str, since_released: Duration) {
    METRICS
        .volume_deletion
        .get_or_create(&storage_class(class_name))
        .observe(since_released.as_secs_f64());
}

/// One `CreateVolume` or `DeleteVolume` call made for a claim or volume
/// of `class_name`.
pub fn observe_driver_call(class_name: &str, method: &str, code: tonic::Code, took: Duration) {
    METRICS
        .driver_calls
        .get_or_create(&DriverCallLabels {
            storage_class: class_name.to_owned(),
            method: method.to_owned(),
            grpc_status_code: go_code_name(code).to_owned(),
        })
        .observe(took.as_secs_f64());
}

/// Where the backlog gauges are read from at each scrape (the provisioning
/// loop, once this process leads). Replaces an earlier probe.
pub fn set_backlog_probe(probe: BacklogProbe) {
    METRICS
        .backlog
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .probe = Some(probe);
}

/// Sets the backlog gauges from the probe; without one, or once it
/// reports nothing (not leading, the loop gone), they are absent rather
/// than 0: a replica that does not provision does not know, and a 0 would
/// read as "nothing waiting".
fn refresh_backlog_gauges() {
    let mut state = METRICS.backlog.lock().unwrap_or_else(|p| p.into_inner());
    let backlogs = state.probe.as_ref().and_then(|probe| probe());
    if backlogs.is_none() {
        state.probe = None;
    }
    let backlogs = backlogs.unwrap_or_default();
    let leading = state.probe.is_some();
    state.claim_classes = set_class_gauges(
        &METRICS.claims_pending,
        &METRICS.claims_pending_oldest,
        &backlogs.claims,
        &state.claim_classes,
    );
    state.volume_classes = set_class_gauges(
        &METRICS.volumes_pending,
        &METRICS.volumes_pending_oldest,
        &backlogs.volumes,
        &state.volume_classes,
    );
    if leading {
        METRICS
            .journal_entries
            .get_or_create(&NoLabels {})
            .set(i64::try_from(backlogs.journal.count).unwrap_or(i64::MAX));
        METRICS
            .journal_oldest
            .get_or_create(&NoLabels {})
            .set(backlogs.journal.oldest_seconds);
    } else {
        METRICS.journal_entries.clear();
        METRICS.journal_oldest.clear();
    }
}

/// Sets a count and an oldest-age gauge per class of `now`, removes the
/// classes of `before` that `now` lacks; returns the classes set.
fn set_class_gauges(
    count: &Family<StorageClassLabels, Gauge>,
    oldest: &Family<StorageClassLabels, FloatGauge>,
    now: &BTreeMap<String, Backlog>,
    before: &[StorageClassLabels],
) -> Vec<StorageClassLabels> {
    let labels: Vec<StorageClassLabels> = now.keys().map(|class| storage_class(class)).collect();
    for (label, backlog) in labels.iter().zip(now.values()) {
        count
            .get_or_create(label)
            .set(i64::try_from(backlog.count).unwrap_or(i64::MAX));
        oldest.get_or_create(label).set(backlog.oldest_seconds);
    }
    for gone in before.iter().filter(|label| !labels.contains(label)) {
        count.remove(gone);
        oldest.remove(gone);
    }
    labels
}

fn queue(name: &str) -> QueueLabels {
    QueueLabels {
        name: name.to_owned(),
    }
}

/// The number of keys waiting in queue `name`.
pub fn set_queue_depth(name: &str, depth: usize) {
    METRICS
        .queue_depth
        .get_or_create(&queue(name))
        .set(i64::try_from(depth).unwrap_or(i64::MAX));
}

pub fn queue_added(name: &str) {
    METRICS.queue_adds.get_or_create(&queue(name)).inc();
}

pub fn queue_retried(name: &str) {
    METRICS.queue_retries.get_or_create(&queue(name)).inc();
}

/// A new queue: its series exist from the start, at zero, as client-go's
/// (a dashboard shows a quiet queue, not a missing one). `processing`
/// reports the start times of the items being processed, for the
/// unfinished-work gauges, which are computed at each scrape.
pub fn queue_created(name: &'static str, processing: ProcessingProbe) {
    let labels = queue(name);
    let _ = METRICS.queue_depth.get_or_create(&labels);
    let _ = METRICS.queue_adds.get_or_create(&labels);
    let _ = METRICS.queue_retries.get_or_create(&labels);
    let _ = METRICS.queue_latency.get_or_create(&labels);
    let _ = METRICS.queue_work_duration.get_or_create(&labels);
    let _ = METRICS.queue_unfinished.get_or_create(&labels);
    let _ = METRICS.queue_longest.get_or_create(&labels);
    METRICS
        .queue_probes
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((name, processing));
}

/// How long an item waited in queue `name` before a worker took it.
pub fn queue_waited(name: &str, took: Duration) {
    METRICS
        .queue_latency
        .get_or_create(&queue(name))
        .observe(took.as_secs_f64());
}

/// How long a worker processed an item of queue `name`.
pub fn queue_worked(name: &str, took: Duration) {
    METRICS
        .queue_work_duration
        .get_or_create(&queue(name))
        .observe(took.as_secs_f64());
}

/// client-go's unfinished-work figures from the start times of the items
/// in processing: their summed age and the oldest one's, in seconds.
pub fn unfinished_work(now: Instant, started: &[Instant]) -> (f64, f64) {
    started.iter().fold((0.0, 0.0), |(total, oldest), start| {
        let age = now.saturating_duration_since(*start).as_secs_f64();
        (total + age, f64::max(oldest, age))
    })
}

/// Sets the unfinished-work gauges of every live queue (queues sharing a
/// name add up); forgets queues that are gone.
fn refresh_queue_gauges() {
    let now = Instant::now();
    let mut per_name: BTreeMap<&'static str, (f64, f64)> = BTreeMap::new();
    let mut probes = METRICS
        .queue_probes
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    probes.retain(|(name, probe)| match probe() {
        Some(started) => {
            let (total, oldest) = unfinished_work(now, &started);
            let entry = per_name.entry(name).or_insert((0.0, 0.0));
            entry.0 += total;
            entry.1 = entry.1.max(oldest);
            true
        }
        None => false,
    });
    drop(probes);
    for (name, (total, oldest)) in per_name {
        METRICS
            .queue_unfinished
            .get_or_create(&queue(name))
            .set(total);
        METRICS
            .queue_longest
            .get_or_create(&queue(name))
            .set(oldest);
    }
}

/// client-go's `leader_election_slowpath_total{name}`: it counts the
/// renewals a leader makes the slow way (read, then write) after its write
/// from its last copy of the Lease failed. Every renewal of ours reads
/// first, so ours counts the like: each renewal round a leader makes again
/// after a failed one ([`crate::leader`]). As client-go's, absent until the
/// first.
static LEADER_SLOWPATH: LazyLock<Family<QueueLabels, Counter>> = LazyLock::new(Family::default);

/// One more renewal round of the lease `name` after a failed one.
pub fn count_leader_slowpath(name: &str) {
    LEADER_SLOWPATH.get_or_create(&queue(name)).inc();
}

/// client-go's leader-election gauge: 1 while this process leads the lease
/// `name`, 0 while it is a candidate or after it lost.
pub fn set_leader(name: &str, leading: bool) {
    METRICS
        .leader
        .get_or_create(&queue(name))
        .set(i64::from(leading));
}

/// How many objects a map of `what` remembers now.
pub fn set_remembered(what: &str, count: usize) {
    METRICS
        .remembered
        .get_or_create(&WhatLabels {
            what: what.to_owned(),
        })
        .set(i64::try_from(count).unwrap_or(i64::MAX));
}

pub fn count_event_dropped() {
    METRICS.events_dropped.get_or_create(&NoLabels {}).inc();
}

/// Whether the driver answers (see the metric's help).
/// The adaptive concurrency limit of the driver's volume calls
/// (`src/csi/adaptive.rs`).
pub fn set_driver_concurrency_limit(limit: usize) {
    METRICS
        .driver_concurrency_limit
        .get_or_create(&NoLabels {})
        .set(i64::try_from(limit).unwrap_or(i64::MAX));
}

pub fn set_driver_reachable(reachable: bool) {
    METRICS
        .driver_reachable
        .get_or_create(&NoLabels {})
        .set(i64::from(reachable));
}

/// A JSON patch refused although its tests held (see the metric's help).
pub fn count_patch_refused(what: &str) {
    METRICS
        .patches_refused
        .get_or_create(&WhatLabels {
            what: what.to_owned(),
        })
        .inc();
}

/// A live read made for a decision whose cache could not be shown current
/// (see the metric's help); `what` is e.g. `list volumeattachments`.
pub fn count_live_read(what: &str) {
    METRICS
        .live_reads
        .get_or_create(&WhatLabels {
            what: what.to_owned(),
        })
        .inc();
}

pub fn count_event_coalesced() {
    METRICS.events_coalesced.get_or_create(&NoLabels {}).inc();
}

/// Whether an optional capability is in use (see the metric's help).
pub fn set_capability(capability: &str, enabled: bool) {
    METRICS
        .capability
        .get_or_create(&CapabilityLabels {
            capability: capability.to_owned(),
        })
        .set(i64::from(enabled));
}

/// The capacity loop's object counts (upstream's `csistoragecapacities_*`
/// gauges): wanted pairs, wanted pairs that have an object, and objects
/// that are about to be deleted.
pub fn set_capacity_objects(goal: usize, current: usize, obsolete: usize) {
    let set = |family: &Family<NoLabels, Gauge>, value: usize| {
        family
            .get_or_create(&NoLabels {})
            .set(i64::try_from(value).unwrap_or(i64::MAX));
    };
    set(&METRICS.capacity_goal, goal);
    set(&METRICS.capacity_current, current);
    set(&METRICS.capacity_obsolete, obsolete);
}

/// The orphan audit's gauges: orphaned volumes, and their bytes.
static ORPHANED: LazyLock<(Family<NoLabels, Gauge>, Family<NoLabels, Gauge>)> =
    LazyLock::new(Default::default);

/// What the orphan audit found (src/orphan_audit): `bytes` `None` when the
/// driver gave the capacity of no orphan (the bytes gauge is removed).
pub fn set_orphaned_volumes(count: usize, bytes: Option<u64>) {
    ORPHANED
        .0
        .get_or_create(&NoLabels {})
        .set(i64::try_from(count).unwrap_or(i64::MAX));
    match bytes {
        Some(bytes) => {
            ORPHANED
                .1
                .get_or_create(&NoLabels {})
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        None => ORPHANED.1.clear(),
    }
}

/// The content type of the OpenMetrics exposition.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The content type of the Prometheus text exposition, as upstream's
/// client_golang sends it.
pub const PROMETHEUS_CONTENT_TYPE: &str =
    "text/plain; version=0.0.4; charset=utf-8; escaping=underscores";

/// The two text expositions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposition {
    /// Prometheus text format 0.0.4: what upstream always serves.
    Prometheus,
    OpenMetrics,
}

impl Exposition {
    pub fn content_type(self) -> &'static str {
        match self {
            Exposition::Prometheus => PROMETHEUS_CONTENT_TYPE,
            Exposition::OpenMetrics => CONTENT_TYPE,
        }
    }
}

/// Chooses the exposition from an `Accept` header: OpenMetrics when the
/// client asks for `application/openmetrics-text` at least as much as for
/// plain text (by `q`), the Prometheus text format otherwise (no header,
/// `*/*`, `text/plain`, anything else).
pub fn negotiate(accept: Option<&str>) -> Exposition {
    let Some(accept) = accept else {
        return Exposition::Prometheus;
    };
    let (mut openmetrics, mut text) = (0.0f64, 0.0f64);
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("").to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.strip_prefix("q="))
            .find_map(|q| q.trim().parse::<f64>().ok())
            .unwrap_or(1.0);
        match media.as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(q),
            "text/plain" | "text/*" | "*/*" => text = text.max(q),
            _ => {}
        }
    }
    if openmetrics > 0.0 && openmetrics >= text {
        Exposition::OpenMetrics
    } else {
        Exposition::Prometheus
    }
}

/// Every metric in the OpenMetrics text format.
pub fn encode() -> String {
    refresh_queue_gauges();
    refresh_backlog_gauges();
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry);
    out
}

/// One scrape of the metrics endpoint, counted as client_golang's
/// instrumented handler counts it (`promhttp_metric_handler_requests_*`):
/// in flight while encoded, then counted by status code. Ours always
/// answers 200: encoding into a string cannot fail, and scrapes are not
/// limited (client_golang's 500 and 503).
pub fn scrape(exposition: Exposition) -> String {
    METRICS.scrapes_in_flight.inc();
    let body = encode_as(exposition);
    METRICS.scrapes_in_flight.dec();
    METRICS
        .scrapes
        .get_or_create(&CodeLabels {
            code: "200".to_owned(),
        })
        .inc();
    body
}

/// Every metric in the requested exposition.
pub fn encode_as(exposition: Exposition) -> String {
    match exposition {
        Exposition::OpenMetrics => encode(),
        Exposition::Prometheus => {
            openmetrics_to_prometheus(&encode(), &|family| METRICS.help.get(family).copied())
        }
    }
}

/// Rewrites prometheus-client's OpenMetrics text as Prometheus text 0.0.4,
/// as client_golang writes it: counters are named with `_total` in `HELP`
/// and `TYPE`, `# UNIT` and `# EOF` go, an empty label set is no braces,
/// `le` comes last and numbers are Go's shortest floats (`1`, not `1.0`;
/// `5.8200064e+07`).
/// `help` gives the exact help text of a family where it is known.
pub fn openmetrics_to_prometheus(
    openmetrics: &str,
    help: &dyn Fn(&str) -> Option<&'static str>,
) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut pending_help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (name, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "unknown" => (name.to_owned(), "untyped"),
                other => (name.to_owned(), other),
            };
            let family = rest.split(' ').next().unwrap_or(rest);
            if let Some((help_name, text)) = pending_help.take()
                && help_name == family
            {
                let text = help(family).unwrap_or(text);
                let _ = writeln!(out, "# HELP {name} {text}");
            }
            let _ = writeln!(out, "# TYPE {name} {kind}");
            continue;
        }
        if line.starts_with('#') {
            // `# UNIT`, `# EOF`: not in 0.0.4.
            continue;
        }
        if line.is_empty() {
            continue;
        }
        out.push_str(&prometheus_sample(line));
        out.push('\n');
    }
    out
}

/// One sample line in 0.0.4 spelling (see [`openmetrics_to_prometheus`]).
fn prometheus_sample(line: &str) -> String {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let (labels, rest) = if line[name_end..].starts_with('{') {
        match label_block_end(&line[name_end..]) {
            Some(end) => (
                split_labels(&line[name_end + 1..name_end + end]),
                &line[name_end + end + 1..],
            ),
            None => return line.to_owned(),
        }
    } else {
        (Vec::new(), &line[name_end..])
    };
    let mut labels = labels;
    if let Some(i) = labels.iter().position(|l| l.starts_with("le=\"")) {
        let le = labels.remove(i);
        let value = le
            .strip_prefix("le=\"")
            .and_then(|v| v.strip_suffix('"'))
            .and_then(parse_sample_value)
            .map_or(le.clone(), |v| format!("le=\"{}\"", go_float(v)));
        labels.push(value);
    }
    let mut values = rest.split_whitespace();
    let value = values
        .next()
        .map(|v| parse_sample_value(v).map_or_else(|| v.to_owned(), go_float))
        .unwrap_or_default();
    let mut out = String::from(name);
    if !labels.is_empty() {
        out.push('{');
        out.push_str(&labels.join(","));
        out.push('}');
    }
    out.push(' ');
    out.push_str(&value);
    // A timestamp, if any (none are written here), stays as it is.
    for extra in values {
        out.push(' ');
        out.push_str(extra);
    }
    out
}

/// The index of the `}` closing the label block that `block` starts with,
/// skipping braces inside quoted values.
fn label_block_end(block: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in block.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// `a="x",b="y,z"` → `["a=\"x\"", "b=\"y,z\""]`.
fn split_labels(inner: &str) -> Vec<String> {
    let mut labels = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in inner.chars() {
        match c {
            _ if escaped => {
                escaped = false;
                current.push(c);
            }
            '\\' if quoted => {
                escaped = true;
                current.push(c);
            }
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            ',' if !quoted => {
                if !current.is_empty() {
                    labels.push(std::mem::take(&mut current));
                }
            }
            _ => current.push(c),
        }
    }
    if !current.is_empty() {
        labels.push(current);
    }
    labels
}

fn parse_sample_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => v.parse().ok(),
    }
}

/// Go's `strconv.FormatFloat(v, 'g', -1, 64)` with Prometheus' spellings
/// of the infinities: the shortest digits that read back as `v`, in
/// exponent form when the exponent is below -4 or at least 6
/// (`1e-08`, `9.999999999999999e-06`, `0.0001`, `100000`, `1e+06`).
pub fn go_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_owned();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits.
    let sci = format!("{:e}", v.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if v < 0.0 { "-" } else { "" };
    if !(-4..6).contains(&exponent) {
        let (first, rest) = digits.split_at(1);
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        return format!("{sign}{first}{fraction}e{exp_sign}{:02}", exponent.abs());
    }
    if exponent < 0 {
        let zeros = "0".repeat(usize::try_from(-exponent - 1).unwrap_or(0));
        return format!("{sign}0.{zeros}{digits}");
    }
    let point = usize::try_from(exponent).unwrap_or(0) + 1;
    if digits.len() <= point {
        format!("{sign}{digits}{}", "0".repeat(point - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_carry_the_service() {
        for (method, want) in [
            ("CreateVolume", "/csi.v1.Controller/CreateVolume"),
            ("DeleteVolume", "/csi.v1.Controller/DeleteVolume"),
            (
                "ControllerGetCapabilities",
                "/csi.v1.Controller/ControllerGetCapabilities",
            ),
            ("GetCapacity", "/csi.v1.Controller/GetCapacity"),
            ("Probe", "/csi.v1.Identity/Probe"),
            ("GetPluginInfo", "/csi.v1.Identity/GetPluginInfo"),
            (
                "GetPluginCapabilities",
                "/csi.v1.Identity/GetPluginCapabilities",
            ),
            ("NodeGetInfo", "/csi.v1.Node/NodeGetInfo"),
        ] {
            assert_eq!(csi_method_name(method), want);
        }
    }

    #[test]
    fn process_stats_from_proc() {
        let stat = "4242 (csi provisioner) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 125 0 0 20 0 8 0 5000 123456789 2048 18446744073709551615";
        let boot = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let status = "Name:\tcsi-provisioner\nVmSize:\t  120000 kB\nVmRSS:\t   20480 kB\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1048576              1048576              files\n";
        let stats = parse_process_stats(stat, boot, status, limits);
        assert_eq!(stats.cpu_seconds, Some(3.75));
        assert_eq!(stats.start_time_seconds, Some(1_700_000_050.0));
        assert_eq!(stats.resident_memory_bytes, Some(20480 * 1024));
        assert_eq!(stats.virtual_memory_bytes, Some(120_000 * 1024));
        assert_eq!(stats.max_fds, Some(1_048_576));
        assert_eq!(stats.virtual_memory_max_bytes, None);
        let limits = "Max open files            1024                 4096                 files\nMax address space         unlimited            unlimited            bytes\n";
        assert_eq!(
            parse_process_stats("", "", "", limits).virtual_memory_max_bytes,
            Some(1.8446744073709552e19)
        );
        let limits = "Max address space         4294967296           unlimited            bytes\n";
        assert_eq!(
            parse_process_stats("", "", "", limits).virtual_memory_max_bytes,
            Some(4_294_967_296.0)
        );
        let net_dev = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo: 1000      10    0    0    0     0          0         0     1000      10    0    0    0     0       0          0\n  eth0: 234 3 0 0 0 0 0 0 56 2 0 0 0 0 0 0\n";
        assert_eq!(parse_net_dev(net_dev), Some((1234.0, 1056.0)));
        assert_eq!(parse_net_dev(""), None);
        assert_eq!(parse_net_dev("garbage\nmore\n x: a b"), None);
        // Garbage or missing files give no figures, not wrong ones.
        assert_eq!(
            parse_process_stats("", "", "", "garbage"),
            ProcessStats::default()
        );
        assert_eq!(
            parse_process_stats("1 (x) S", "btime x", "VmRSS: many", "").cpu_seconds,
            None
        );
    }

    /// client_golang's handler metrics: the scrape sees itself in flight,
    /// and is counted once answered.
    #[test]
    fn scrapes_are_counted_as_client_golangs_handler() {
        let value = |text: &str, series: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
        };
        let first = scrape(Exposition::Prometheus);
        for needle in [
            "# HELP promhttp_metric_handler_requests_in_flight Current number of scrapes being served.\n# TYPE promhttp_metric_handler_requests_in_flight gauge\n",
            "# HELP promhttp_metric_handler_requests_total Total number of scrapes by HTTP status code.\n# TYPE promhttp_metric_handler_requests_total counter\n",
            "promhttp_metric_handler_requests_total{code=\"500\"} 0\n",
            "promhttp_metric_handler_requests_total{code=\"503\"} 0\n",
        ] {
            assert!(first.contains(needle), "missing {needle}\n{first}");
        }
        assert!(value(&first, "promhttp_metric_handler_requests_in_flight") >= 1.0);
        let ok = r#"promhttp_metric_handler_requests_total{code="200"}"#;
        let second = scrape(Exposition::Prometheus);
        assert!(value(&second, ok) >= value(&first, ok) + 1.0, "{second}");
    }

    #[test]
    fn encoded_metrics_use_upstream_names_and_labels() {
        set_driver_name("test.csi.example.com");
        observe_csi_call(
            "CreateVolume",
            tonic::Code::DeadlineExceeded,
            Duration::from_millis(300),
        );
        provision_succeeded("unit-fast", "", Duration::from_millis(20));
        provision_failed("unit-fast", "VolumeSnapshot");
        delete_succeeded("unit-fast", Duration::from_millis(20));
        delete_failed("unit-slow");
        set_queue_depth("unit-claims", 3);
        queue_retried("unit-claims");
        set_capacity_objects(4, 3, 1);
        set_leader("unit-lease", true);
        set_leader("unit-lease-lost", false);
        count_leader_slowpath("unit-lease");
        let _queue: crate::queue::WorkQueue<u8> = crate::queue::WorkQueue::new(
            "unit-encode",
            crate::queue::Backoff {
                start: Duration::from_secs(1),
                max: Duration::from_secs(1),
            },
        );
        // The Prometheus text format, as upstream's scrape shows it.
        let text = encode_as(Exposition::Prometheus);
        for needle in [
            "# HELP csi_sidecar_operations_seconds [ALPHA] Container Storage Interface operation duration with gRPC error code status total\n# TYPE csi_sidecar_operations_seconds histogram\n",
            r#"csi_sidecar_operations_seconds_bucket{driver_name="test.csi.example.com",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume",le="0.5"} 1"#,
            r#"csi_sidecar_operations_seconds_bucket{driver_name="test.csi.example.com",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume",le="0.25"} 0"#,
            r#"csi_sidecar_operations_seconds_bucket{driver_name="test.csi.example.com",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Controller/CreateVolume",le="1"} 1"#,
            "# HELP controller_persistentvolumeclaim_provision_total Total number of persistent volumes provisioned succesfully. Broken down by storage class name and source of the claim.\n# TYPE controller_persistentvolumeclaim_provision_total counter\n",
            r#"controller_persistentvolumeclaim_provision_total{class="unit-fast",source=""} 1"#,
            r#"controller_persistentvolumeclaim_provision_failed_total{class="unit-fast",source="VolumeSnapshot"} 1"#,
            r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="unit-fast",source=""} 1"#,
            r#"controller_persistentvolume_delete_total{class="unit-fast"} 1"#,
            r#"controller_persistentvolume_delete_failed_total{class="unit-slow"} 1"#,
            r#"controller_persistentvolume_delete_duration_seconds_bucket{class="unit-fast",le="0.025"} 1"#,
            // As the Go image exposes it once a renewal took the slow path.
            "# HELP leader_election_slowpath_total [ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.\n# TYPE leader_election_slowpath_total counter\n",
            r#"leader_election_slowpath_total{name="unit-lease"} 1"#,
            "# HELP workqueue_depth [BETA] Current depth of workqueue\n# TYPE workqueue_depth gauge\n",
            r#"workqueue_depth{name="unit-claims"} 3"#,
            "# HELP workqueue_retries_total [BETA] Total number of retries handled by workqueue\n# TYPE workqueue_retries_total counter\n",
            r#"workqueue_retries_total{name="unit-claims"} 1"#,
            "# HELP workqueue_queue_duration_seconds [BETA] How long in seconds an item stays in workqueue before being requested.\n",
            r#"workqueue_queue_duration_seconds_bucket{name="unit-encode",le="9.999999999999999e-06"} 0"#,
            r#"workqueue_unfinished_work_seconds{name="unit-encode"} 0"#,
            "# HELP workqueue_unfinished_work_seconds [BETA] How many seconds of work has done that is in progress",
            "# HELP workqueue_longest_running_processor_seconds [BETA] How many seconds has the longest running processor for workqueue been running.\n# TYPE workqueue_longest_running_processor_seconds gauge\n",
            "# HELP leader_election_master_status [ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.\n# TYPE leader_election_master_status gauge\n",
            r#"leader_election_master_status{name="unit-lease"} 1"#,
            r#"leader_election_master_status{name="unit-lease-lost"} 0"#,
            "\ncsistoragecapacities_desired_goal 4\n",
            "\ncsistoragecapacities_desired_current 3\n",
            "\ncsistoragecapacities_obsolete 1\n",
            "# HELP csistoragecapacities_obsolete [ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value.\n",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total ",
            "# HELP process_virtual_memory_max_bytes Maximum amount of virtual memory available in bytes.\n",
            "# TYPE process_network_receive_bytes_total counter\n",
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
        for absent in ["# EOF", "# UNIT", "{}", "le=\"1.0\"", "..\n"] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
        // Every line is a comment or `name[{labels}] value`.
        for line in text.lines() {
            if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
                continue;
            }
            let value = line.rsplit(' ').next().unwrap_or_default();
            assert!(parse_sample_value(value).is_some(), "bad sample {line}");
        }
        // OpenMetrics on request.
        let open = encode_as(Exposition::OpenMetrics);
        assert!(open.ends_with("# EOF\n"), "{open}");
        assert!(open.contains("# TYPE workqueue_adds counter"), "{open}");
    }

    /// The backlog gauges follow the probe: a class it stops reporting
    /// goes, and with no probe (not leading) every one is absent, not 0.
    /// The only test that sets the probe (it is process-wide).
    #[test]
    fn backlog_gauges_follow_the_probe_and_are_absent_without_one() {
        let backlog = |count, oldest_seconds| Backlog {
            count,
            oldest_seconds,
        };
        let report = |classes: &[(&str, Backlog)], journal: Backlog| Backlogs {
            claims: classes
                .iter()
                .map(|(class, b)| ((*class).to_owned(), *b))
                .collect(),
            volumes: classes
                .iter()
                .map(|(class, b)| ((*class).to_owned(), *b))
                .collect(),
            journal,
        };
        let first = report(
            &[("unit-a", backlog(2, 61.5)), ("unit-b", backlog(0, 0.0))],
            backlog(1, 4.0),
        );
        set_backlog_probe(Box::new(move || Some(first.clone())));
        let text = encode_as(Exposition::Prometheus);
        for needle in [
            "# TYPE csi_provisioner_claims_pending gauge\n",
            r#"csi_provisioner_claims_pending{storage_class="unit-a"} 2"#,
            r#"csi_provisioner_claims_pending_oldest_seconds{storage_class="unit-a"} 61.5"#,
            r#"csi_provisioner_claims_pending{storage_class="unit-b"} 0"#,
            r#"csi_provisioner_volumes_pending_deletion{storage_class="unit-a"} 2"#,
            r#"csi_provisioner_volumes_pending_deletion_oldest_seconds{storage_class="unit-b"} 0"#,
            "\ncsi_provisioner_journal_entries 1\n",
            "\ncsi_provisioner_journal_oldest_entry_seconds 4\n",
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
        let second = report(&[("unit-a", backlog(1, 2.0))], backlog(0, 0.0));
        set_backlog_probe(Box::new(move || Some(second.clone())));
        let text = encode_as(Exposition::Prometheus);
        assert!(
            text.contains(r#"csi_provisioner_claims_pending{storage_class="unit-a"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("unit-b"),
            "a class no longer reported\n{text}"
        );
        assert!(
            text.contains("\ncsi_provisioner_journal_entries 0\n"),
            "{text}"
        );
        // The loop gone (or never started: not leading).
        set_backlog_probe(Box::new(|| None));
        let text = encode_as(Exposition::Prometheus);
        for absent in [
            "csi_provisioner_claims_pending{",
            "csi_provisioner_claims_pending_oldest_seconds{",
            "csi_provisioner_volumes_pending_deletion{",
            "csi_provisioner_volumes_pending_deletion_oldest_seconds{",
            "\ncsi_provisioner_journal_entries ",
            "\ncsi_provisioner_journal_oldest_entry_seconds ",
        ] {
            assert!(!text.contains(absent), "{absent} in\n{text}");
        }
    }

    #[test]
    fn service_level_histograms_are_per_class_with_buckets_up_to_a_day() {
        claim_provisioned("unit-slo-hist", Duration::from_secs(90));
        volume_deleted("unit-slo-hist", Duration::from_secs(4));
        let text = encode_as(Exposition::Prometheus);
        for needle in [
            "# TYPE csi_provisioner_claim_provisioning_seconds histogram\n",
            r#"csi_provisioner_claim_provisioning_seconds_bucket{storage_class="unit-slo-hist",le="60"} 0"#,
            r#"csi_provisioner_claim_provisioning_seconds_bucket{storage_class="unit-slo-hist",le="120"} 1"#,
            r#"csi_provisioner_claim_provisioning_seconds_bucket{storage_class="unit-slo-hist",le="86400"} 1"#,
            r#"csi_provisioner_claim_provisioning_seconds_count{storage_class="unit-slo-hist"} 1"#,
            r#"csi_provisioner_volume_deletion_seconds_bucket{storage_class="unit-slo-hist",le="2.5"} 0"#,
            r#"csi_provisioner_volume_deletion_seconds_bucket{storage_class="unit-slo-hist",le="5"} 1"#,
            r#"csi_provisioner_volume_deletion_seconds_sum{storage_class="unit-slo-hist"} 4"#,
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
        assert!(SLO_BUCKETS.windows(2).all(|w| w[0] < w[1]), "increasing");
    }

    #[test]
    fn workqueue_buckets_are_client_gos_floats() {
        let le: Vec<String> = workqueue_buckets().into_iter().map(go_float).collect();
        assert_eq!(
            le,
            [
                "1e-08",
                "1e-07",
                "1e-06",
                "9.999999999999999e-06",
                "9.999999999999999e-05",
                "0.001",
                "0.01",
                "0.1",
                "1",
                "10"
            ]
        );
    }

    #[test]
    fn go_floats() {
        for (v, want) in [
            (0.0, "0"),
            (1.0, "1"),
            (10.0, "10"),
            (2.5, "2.5"),
            (600.0, "600"),
            (0.005, "0.005"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (100_000.0, "100000"),
            (1_000_000.0, "1e+06"),
            (58_200_064.0, "5.8200064e+07"),
            (1_795_474_203.78, "1.79547420378e+09"),
            (18_446_744_073_709_551_615.0, "1.8446744073709552e+19"),
            (0.008_446_888_999_999_999, "0.008446888999999999"),
            (1e-100, "1e-100"),
            (-3.5, "-3.5"),
            (-1e7, "-1e+07"),
            (f64::INFINITY, "+Inf"),
            (f64::NEG_INFINITY, "-Inf"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(go_float(v), want, "{v}");
        }
    }

    #[test]
    fn content_negotiation() {
        use Exposition::*;
        for (accept, want) in [
            (None, Prometheus),
            (Some(""), Prometheus),
            (Some("*/*"), Prometheus),
            (Some("text/plain"), Prometheus),
            (Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"), Prometheus),
            (Some("application/openmetrics-text"), OpenMetrics),
            // Prometheus' own default.
            (
                Some(
                    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
                ),
                OpenMetrics,
            ),
            (
                Some("text/plain;q=0.9, application/openmetrics-text;q=0.5"),
                Prometheus,
            ),
            (Some("application/openmetrics-text;q=0"), Prometheus),
            (
                Some("APPLICATION/OpenMetrics-Text; version=1.0.0"),
                OpenMetrics,
            ),
            (Some("application/json"), Prometheus),
        ] {
            assert_eq!(negotiate(accept), want, "{accept:?}");
        }
        assert!(
            Prometheus
                .content_type()
                .starts_with("text/plain; version=0.0.4")
        );
        assert!(
            OpenMetrics
                .content_type()
                .starts_with("application/openmetrics-text")
        );
    }

    #[test]
    fn openmetrics_text_is_rewritten_as_prometheus_text() {
        let open = "# HELP x_seconds Duration.\n# TYPE x_seconds histogram\n# UNIT x_seconds seconds\nx_seconds_sum{a=\"1\"} 0.5\nx_seconds_count{a=\"1\"} 1\nx_seconds_bucket{le=\"1.0\",a=\"1\"} 1\nx_seconds_bucket{le=\"+Inf\",a=\"1\"} 1\n# HELP c Things.\n# TYPE c counter\nc_total{v=\"a,b}c\\\"d\"} 3\n# HELP g Gauge.\n# TYPE g gauge\ng{} 5.8200064e7\n# EOF\n";
        let help = |family: &str| (family == "c").then_some("Things");
        let want = "# HELP x_seconds Duration.\n# TYPE x_seconds histogram\nx_seconds_sum{a=\"1\"} 0.5\nx_seconds_count{a=\"1\"} 1\nx_seconds_bucket{a=\"1\",le=\"1\"} 1\nx_seconds_bucket{a=\"1\",le=\"+Inf\"} 1\n# HELP c_total Things\n# TYPE c_total counter\nc_total{v=\"a,b}c\\\"d\"} 3\n# HELP g Gauge.\n# TYPE g gauge\ng 5.8200064e+07\n";
        assert_eq!(openmetrics_to_prometheus(open, &help), want);
    }

    #[test]
    fn migrated_label_only_for_migration_drivers() {
        let plain = csi_labels("hostpath.csi.k8s.io".into(), "Probe", tonic::Code::Ok, None);
        assert_eq!(
            plain,
            vec![
                ("driver_name", "hostpath.csi.k8s.io".to_owned()),
                ("grpc_status_code", "OK".to_owned()),
                ("method_name", "/csi.v1.Identity/Probe".to_owned()),
            ]
        );
        let migrated = csi_labels(
            "ebs.csi.aws.com".into(),
            "CreateVolume",
            tonic::Code::Internal,
            Some(true),
        );
        assert_eq!(migrated.last(), Some(&("migrated", "true".to_owned())));
        assert!(MIGRATION_DRIVERS.contains(&"pd.csi.storage.gke.io"));
        assert!(!MIGRATION_DRIVERS.contains(&"hostpath.csi.k8s.io"));
    }

    #[test]
    fn unfinished_work_sums_ages_and_finds_the_oldest() {
        let now = Instant::now();
        let ago = |s: u64| now.checked_sub(Duration::from_secs(s)).unwrap_or(now);
        assert_eq!(unfinished_work(now, &[]), (0.0, 0.0));
        let (total, oldest) = unfinished_work(now, &[ago(4), ago(1), ago(0)]);
        assert_eq!((total.round(), oldest.round()), (5.0, 4.0));
    }
}
