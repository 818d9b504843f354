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
//! - `workqueue_depth`, `workqueue_adds_total`, `workqueue_retries_total`
//!   (client-go workqueue metrics), label `name` (`claims`, `volumes`).
//! - `csistoragecapacities_desired_goal`, `csistoragecapacities_desired_current`,
//!   `csistoragecapacities_obsolete` (upstream's `pkg/capacity`), with
//!   `--enable-capacity` only.
//!
//! One process-wide registry: the call sites (CSI calls, queues, workers)
//! are many and deep, and threading a handle through each would touch every
//! loop for no gain — there is exactly one sidecar per process.

use std::sync::{LazyLock, RwLock};
use std::time::Duration;

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

/// csi-lib-utils' driver name before `GetPluginInfo` answered.
pub const UNKNOWN_DRIVER: &str = "unknown-driver";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CsiLabels {
    driver_name: String,
    method_name: String,
    grpc_status_code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassSourceLabels {
    class: String,
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    name: String,
}

/// No labels; a family so that the metric is absent until first set (the
/// capacity gauges exist only with `--enable-capacity`, as upstream). It is
/// encoded `name{} value`, which Prometheus reads as no labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NoLabels {}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

struct Metrics {
    registry: Registry,
    driver_name: RwLock<String>,
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
    capacity_goal: Family<NoLabels, Gauge>,
    capacity_current: Family<NoLabels, Gauge>,
    capacity_obsolete: Family<NoLabels, Gauge>,
}

fn csi_histogram() -> Histogram {
    Histogram::new(CSI_BUCKETS)
}

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    let mut registry = Registry::default();
    let csi_operations: Histograms<CsiLabels> = Family::new_with_constructor(csi_histogram);
    let provision_duration: Histograms<ClassSourceLabels> =
        Family::new_with_constructor(default_histogram);
    let delete_duration: Histograms<ClassLabels> = Family::new_with_constructor(default_histogram);
    let m = Metrics {
        registry: Registry::default(),
        driver_name: RwLock::new(UNKNOWN_DRIVER.to_owned()),
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
        capacity_goal: Family::default(),
        capacity_current: Family::default(),
        capacity_obsolete: Family::default(),
    };
    // Counters get their `_total` suffix from the encoder.
    registry.register(
        "csi_sidecar_operations_seconds",
        "Container Storage Interface operation duration with gRPC error code status total",
        m.csi_operations.clone(),
    );
    registry.register(
        "controller_persistentvolumeclaim_provision",
        "Total number of persistent volumes provisioned succesfully. Broken down by storage class name.",
        m.provision_total.clone(),
    );
    registry.register(
        "controller_persistentvolumeclaim_provision_failed",
        "Total number of persistent volume provision failed attempts. Broken down by storage class name.",
        m.provision_failed.clone(),
    );
    registry.register(
        "controller_persistentvolumeclaim_provision_duration_seconds",
        "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name.",
        m.provision_duration.clone(),
    );
    registry.register(
        "controller_persistentvolume_delete",
        "Total number of persistent volumes deleted succesfully. Broken down by storage class name.",
        m.delete_total.clone(),
    );
    registry.register(
        "controller_persistentvolume_delete_failed",
        "Total number of persistent volume delete failed attempts. Broken down by storage class name.",
        m.delete_failed.clone(),
    );
    registry.register(
        "controller_persistentvolume_delete_duration_seconds",
        "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
        m.delete_duration.clone(),
    );
    registry.register(
        "workqueue_depth",
        "Current depth of workqueue",
        m.queue_depth.clone(),
    );
    registry.register(
        "workqueue_adds",
        "Total number of adds handled by workqueue",
        m.queue_adds.clone(),
    );
    registry.register(
        "workqueue_retries",
        "Total number of retries handled by workqueue",
        m.queue_retries.clone(),
    );
    registry.register(
        "csistoragecapacities_desired_goal",
        "Number of CSIStorageCapacity objects that are supposed to be managed automatically",
        m.capacity_goal.clone(),
    );
    registry.register(
        "csistoragecapacities_desired_current",
        "Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically",
        m.capacity_current.clone(),
    );
    registry.register(
        "csistoragecapacities_obsolete",
        "Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value",
        m.capacity_obsolete.clone(),
    );
    registry.register_collector(Box::new(ProcessCollector));
    Metrics { registry, ..m }
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
        if let Some(v) = stats.cpu_seconds {
            ConstCounter::new(v).encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                MetricType::Counter,
            )?)?;
        }
        let gauges_f64 = [(
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            stats.start_time_seconds,
        )];
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

/// Names the driver in `driver_name` once `GetPluginInfo` answered.
pub fn set_driver_name(name: &str) {
    *METRICS
        .driver_name
        .write()
        .unwrap_or_else(|p| p.into_inner()) = name.to_owned();
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

/// grpc-go's `codes.Code.String()`: the label values dashboards match on
/// (the same names as in event messages).
pub use crate::provision::go_code_name;

/// One finished CSI call.
pub fn observe_csi_call(method: &str, code: tonic::Code, took: Duration) {
    let driver_name = METRICS
        .driver_name
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    METRICS
        .csi_operations
        .get_or_create(&CsiLabels {
            driver_name,
            method_name: csi_method_name(method),
            grpc_status_code: go_code_name(code).to_owned(),
        })
        .observe(took.as_secs_f64());
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

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric in the OpenMetrics text format (which Prometheus scrapes).
pub fn encode() -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &METRICS.registry);
    out
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
    fn code_names_are_grpc_go_spellings() {
        assert_eq!(go_code_name(tonic::Code::Ok), "OK");
        assert_eq!(go_code_name(tonic::Code::Cancelled), "Canceled");
        assert_eq!(
            go_code_name(tonic::Code::DeadlineExceeded),
            "DeadlineExceeded"
        );
        assert_eq!(go_code_name(tonic::Code::Unavailable), "Unavailable");
        // Every code maps to a distinct name.
        let names: std::collections::BTreeSet<&str> = (0..17)
            .map(|i| go_code_name(tonic::Code::from_i32(i)))
            .collect();
        assert_eq!(names.len(), 17);
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
        let text = encode();
        for needle in [
            r#"csi_sidecar_operations_seconds_bucket{le="0.5",driver_name="test.csi.example.com",method_name="/csi.v1.Controller/CreateVolume",grpc_status_code="DeadlineExceeded"} 1"#,
            r#"csi_sidecar_operations_seconds_bucket{le="0.25",driver_name="test.csi.example.com",method_name="/csi.v1.Controller/CreateVolume",grpc_status_code="DeadlineExceeded"} 0"#,
            r#"controller_persistentvolumeclaim_provision_total{class="unit-fast",source=""} 1"#,
            r#"controller_persistentvolumeclaim_provision_failed_total{class="unit-fast",source="VolumeSnapshot"} 1"#,
            r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="unit-fast",source=""} 1"#,
            r#"controller_persistentvolume_delete_total{class="unit-fast"} 1"#,
            r#"controller_persistentvolume_delete_failed_total{class="unit-slow"} 1"#,
            r#"controller_persistentvolume_delete_duration_seconds_bucket{le="0.025",class="unit-fast"} 1"#,
            r#"workqueue_depth{name="unit-claims"} 3"#,
            r#"workqueue_retries_total{name="unit-claims"} 1"#,
            "\ncsistoragecapacities_desired_goal{} 4\n",
            "\ncsistoragecapacities_desired_current{} 3\n",
            "\ncsistoragecapacities_obsolete{} 1\n",
            "process_resident_memory_bytes ",
            "process_start_time_seconds ",
            "process_cpu_seconds_total ",
        ] {
            assert!(text.contains(needle), "missing {needle}\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
