//! The orphan audit (`--orphan-audit-interval`, every 6 hours by default; 0
//! turns it off): backend volumes that no PV of this cluster names,
//! **reported, never deleted** (docs/operations.md, "Orphan audit").
//!
//! Clusters that ran other provisioners leaked volumes: a crash in the
//! middle of `CreateVolume` with the claim deleted, a `DeleteVolume` given
//! up on, a PV deleted by hand without its finalizer. Every interval the
//! leader lists the driver's volumes (`ListVolumes`, in pages, with a pause
//! between pages), notes the operations in flight of this process (the
//! journal's entries: their CSI names), then lists every PV live, in pages
//! (one consistent read, never the cache), and keeps the volume handles of
//! this driver's PVs. A listed volume whose id or volume context shows only
//! names with another `--volume-name-prefix` was made by another sidecar
//! (another cluster sharing the backend) and is only counted
//! ([`decide::made_by`]). Any other listed volume that no PV names and
//! that no operation in flight may be making is a *suspect*; a suspect of
//! the previous audit that still is one is an *orphan* ([`decide::audit`]). So
//! a volume being provisioned right now (its PV saved a moment after the
//! list) or deleted right now is never reported. The first audit of a
//! process only notes its suspects.
//!
//! An orphan is reported three ways: the gauges
//! `csi_provisioner_orphaned_volumes` and
//! `csi_provisioner_orphaned_volume_bytes`, one log line per orphan (id,
//! capacity, volume context), and the ConfigMap
//! `<lease name>-orphan-audit` in the sidecar's namespace (where the
//! journal is), replaced at each audit and bounded in size
//! ([`decide::report_data`]). Deleting one is the user's act, through no
//! code of this loop: docs/operations.md, "Orphan audit".
//!
//! Only for drivers with `LIST_VOLUMES`; others get one log line and no
//! loop. A failed `ListVolumes` or list is logged with its cause and tried
//! again at the next interval.
//!
//! This file is the wiring (the timer, start and stop); [`worker`] makes
//! one audit's calls.

pub mod decide;
pub mod worker;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCap;
use kube::Client;

use crate::api_calls::{ApiCall, call, in_own_namespace};
use crate::csi::Driver;
use crate::shared::EmbeddedLoop;

pub use worker::AuditError;

/// The API calls of the audit (see [`crate::api_calls`]): the live list of
/// every PV, in pages; the report ConfigMap, created and then replaced.
pub const API_CALLS: &[ApiCall] = &[
    call("", "persistentvolumes", &["list"]),
    in_own_namespace("", "configmaps", &["create", "update"]),
];

/// The log line for a driver that cannot list its volumes.
pub const NOT_SUPPORTED: &str =
    "orphan audit not supported by this driver (no LIST_VOLUMES capability)";

/// The operations in flight of this process: the CSI names
/// (`CreateVolumeRequest.name`) of the journal's entries.
pub type InFlightNames = Arc<dyn Fn() -> BTreeSet<String> + Send + Sync>;

/// Where the report goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportPlace {
    pub namespace: String,
    pub name: String,
}

pub struct Audit {
    client: Client,
    driver: Driver,
    interval: Duration,
    report: ReportPlace,
    in_flight: InFlightNames,
    /// How this sidecar names its volumes: volumes named by sidecars with
    /// other prefixes are left out.
    naming: decide::Naming,
    /// The suspects of the last audit that completed; `None` before it.
    previous: Mutex<Option<BTreeSet<String>>>,
    /// The report was written once by this process (replaced from then on).
    written: std::sync::atomic::AtomicBool,
    /// The pause between two pages of a list.
    page_pause: Duration,
    stop: tokio::sync::watch::Sender<bool>,
}

impl EmbeddedLoop for Audit {
    /// Starts the periodic audit, the first one after one interval. Told
    /// to stop, it stops at once, an audit under way included (it writes
    /// nothing that a later audit does not write again).
    fn start(self: Arc<Self>) {
        let mut stopped = self.stop.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                () = self.every_interval() => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
    }

    fn shut_down(&self) {
        self.stop.send_replace(true);
    }
}

impl Audit {
    /// The audit, when `interval` is not 0 and the driver can list its
    /// volumes (else [`NOT_SUPPORTED`] is logged once and there is none).
    pub fn new(
        client: Client,
        driver: Driver,
        interval: Duration,
        report: ReportPlace,
        in_flight: InFlightNames,
        naming: decide::Naming,
    ) -> Option<Arc<Audit>> {
        if interval.is_zero() {
            return None;
        }
        if !driver.info().controller.has(ControllerCap::ListVolumes) {
            tracing::info!("{NOT_SUPPORTED}");
            return None;
        }
        tracing::info!(
            interval = %crate::duration::format_go_duration(interval),
            report = %format!("{}/{}", report.namespace, report.name),
            volume_name_prefix = %naming.prefix,
            "orphan audit on: backend volumes no PV names are reported, never deleted"
        );
        Some(Arc::new(Audit {
            client,
            driver,
            interval,
            report,
            in_flight,
            naming,
            previous: Mutex::new(None),
            written: std::sync::atomic::AtomicBool::new(false),
            page_pause: PAGE_PAUSE,
            stop: tokio::sync::watch::Sender::new(false),
        }))
    }

    /// An audit every interval, the first after one interval; a failed one
    /// is logged and the next comes at the next interval.
    async fn every_interval(&self) {
        loop {
            tokio::time::sleep(self.interval).await;
            if let Err(e) = self.audit_once().await {
                tracing::warn!(error = %e, "orphan audit failed; will try again next interval");
            }
        }
    }
}

/// The pause between two pages of `ListVolumes` and of the PV list: 100
/// pages (50,000 volumes) take 10 seconds of pauses each.
pub const PAGE_PAUSE: Duration = Duration::from_millis(100);

/// Entries asked for per page of `ListVolumes` and of the PV list.
pub const PAGE_SIZE: i32 = 500;

#[cfg(test)]
mod tests {
    use crate::cli::Options;

    #[test]
    fn the_interval_flag_defaults_to_six_hours_and_0_turns_it_off() {
        let parse = |args: &[&str]| {
            Options::parse_from_args(std::iter::once("csi-provisioner").chain(args.iter().copied()))
                .expect("parses")
                .orphan_audit_interval
        };
        assert_eq!(parse(&[]), std::time::Duration::from_secs(6 * 3600));
        assert_eq!(
            parse(&["--orphan-audit-interval=0"]),
            std::time::Duration::ZERO
        );
        assert_eq!(
            parse(&["--orphan-audit-interval=90s"]),
            std::time::Duration::from_secs(90)
        );
        assert!(
            Options::parse_from_args(["csi-provisioner", "--orphan-audit-interval=soon"]).is_err()
        );
    }
}
