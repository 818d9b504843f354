//! One audit's I/O: the pages of `ListVolumes`, the operations in flight,
//! the live pages of PVs, then the report (gauges, log lines, ConfigMap)
//! of what [`decide`](super::decide) finds. Volumes that a sidecar with
//! another `--volume-name-prefix` made are only counted.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, PostParams};

use super::decide::{self, Inputs, Listed, Outcome, ReportHeader, ReportLimits};
use super::{Audit, PAGE_SIZE};
use crate::csi::CsiError;
use crate::projection::{PersistentVolume, Wire};

/// Pages of one list at most: a driver that hands out the same token again
/// and again would otherwise keep the audit for ever.
const MAX_PAGES: usize = 100_000;

/// The report's labels (not the journal's `managed-by`: the journal lists
/// its segments by that label, and need not read the report).
const LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/part-of", "csi-provisioner"),
    ("app.kubernetes.io/component", "orphan-audit"),
];

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("cannot list the driver's volumes: {0}")]
    ListVolumes(#[source] CsiError),
    #[error("the driver's ListVolumes {0}")]
    BadPages(String),
    #[error("cannot list the PersistentVolumes: {0}")]
    ListPersistentVolumes(#[source] kube::Error),
}

impl Audit {
    /// Every volume the driver lists, page by page.
    async fn list_volumes(&self) -> Result<Vec<Listed>, AuditError> {
        let mut listed = Vec::new();
        let mut token = String::new();
        let mut seen_tokens = BTreeSet::new();
        for page in 0.. {
            if page >= MAX_PAGES {
                return Err(AuditError::BadPages(format!(
                    "gave more than {MAX_PAGES} pages"
                )));
            }
            if page > 0 {
                tokio::time::sleep(self.page_pause).await;
            }
            let answer = self
                .driver
                .list_volumes(PAGE_SIZE, token.clone())
                .await
                .map_err(AuditError::ListVolumes)?;
            listed.extend(answer.entries.into_iter().filter_map(|entry| {
                let volume = entry.volume?;
                Some(Listed {
                    volume_id: volume.volume_id,
                    capacity_bytes: volume.capacity_bytes,
                    volume_context: volume.volume_context.into_iter().collect(),
                })
            }));
            if answer.next_token.is_empty() {
                break;
            }
            if !seen_tokens.insert(answer.next_token.clone()) {
                return Err(AuditError::BadPages(format!(
                    "gave the token {:?} twice",
                    answer.next_token
                )));
            }
            token = answer.next_token;
        }
        Ok(listed)
    }

    /// The volume handles this driver's PVs name, from a live list of every
    /// PV in pages (the pages of one list are one consistent read).
    async fn named_handles(&self) -> Result<BTreeSet<String>, kube::Error> {
        let api: Api<Wire<PersistentVolume>> = Api::all(self.client.clone());
        let driver = self.driver.name();
        let mut named = BTreeSet::new();
        let limit = u32::try_from(PAGE_SIZE).unwrap_or(500);
        let mut params = ListParams::default().limit(limit);
        for page in 0..MAX_PAGES {
            if page > 0 {
                tokio::time::sleep(self.page_pause).await;
            }
            let list = api.list(&params).await?;
            named.extend(
                list.items
                    .iter()
                    .filter_map(|pv| decide::named_handle(&pv.object, driver)),
            );
            match list.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(named),
            }
        }
        Ok(named)
    }

    /// One audit: lists, decides, reports. Returns what it found.
    pub async fn audit_once(&self) -> Result<Outcome, AuditError> {
        let started = std::time::Instant::now();
        let listed = self.list_volumes().await?;
        // After ListVolumes, before the PVs: an operation that ends between
        // the two has saved its PV, which the list then holds.
        let in_flight = (self.in_flight)();
        let named = self
            .named_handles()
            .await
            .map_err(AuditError::ListPersistentVolumes)?;
        let previous = self
            .previous
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let outcome = decide::audit(Inputs {
            listed: &listed,
            named: &named,
            in_flight: &in_flight,
            previous: previous.as_ref(),
            naming: &self.naming,
        });
        *self.previous.lock().unwrap_or_else(|p| p.into_inner()) = Some(outcome.suspects.clone());
        self.report(&outcome, started.elapsed()).await;
        Ok(outcome)
    }

    /// Gauges, a log line per orphan, the ConfigMap; at a process's first
    /// audit (nothing confirmed yet) only a log line.
    /// `took`: the lists and the decision (its pages and their pauses), so
    /// an operator sees what an audit costs at this cluster's size.
    async fn report(&self, outcome: &Outcome, took: std::time::Duration) {
        let took = crate::duration::format_go_duration(took);
        if !outcome.confirmed {
            tracing::info!(
                took = %took,
                listed = outcome.listed,
                named = outcome.named,
                in_flight = outcome.in_flight,
                made_by_other_prefixes = outcome.other_prefix,
                suspects = outcome.suspects.len(),
                "orphan audit: first audit of this process; volumes no PV names are reported if still so at the next audit"
            );
            return;
        }
        let bytes = decide::total_bytes(&outcome.orphans);
        crate::metrics::set_orphaned_volumes(outcome.orphans.len(), bytes);
        for volume in &outcome.orphans {
            tracing::warn!(
                volume_id = %volume.volume_id,
                capacity_bytes = volume.capacity_bytes,
                volume_context = ?volume.volume_context,
                "orphaned volume: the driver lists it and no PersistentVolume of this cluster names it (reported, not deleted)"
            );
        }
        tracing::info!(
            took = %took,
            listed = outcome.listed,
            named = outcome.named,
            in_flight = outcome.in_flight,
            made_by_other_prefixes = outcome.other_prefix,
            orphans = outcome.orphans.len(),
            awaiting_confirmation = outcome.awaiting_confirmation,
            report = %format!("{}/{}", self.report.namespace, self.report.name),
            "orphan audit done"
        );
        let audited_at = k8s_openapi::jiff::Timestamp::now().to_string();
        let interval = crate::duration::format_go_duration(self.interval);
        let data = decide::report_data(
            &ReportHeader {
                driver: self.driver.name(),
                volume_name_prefix: &self.naming.prefix,
                audited_at: &audited_at,
                interval: &interval,
            },
            outcome,
            ReportLimits::default(),
        );
        if let Err(e) = self.write_report(data).await {
            let hint = match &e {
                kube::Error::Api(s) if s.code == 403 => {
                    " (grant create and update on configmaps in this namespace: deploy/kubernetes/base/rbac.yaml)"
                }
                _ => "",
            };
            tracing::warn!(
                report = %format!("{}/{}", self.report.namespace, self.report.name),
                error = %e,
                "cannot write the orphan audit report{hint}; the gauges and log lines above hold the same"
            );
        }
    }

    /// Creates the report, or replaces it whole (unconditionally: only the
    /// leader writes it).
    async fn write_report(&self, data: BTreeMap<String, String>) -> Result<(), kube::Error> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.report.namespace);
        let name = &self.report.name;
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.report.namespace.clone()),
                labels: Some(BTreeMap::from(LABELS.map(|(k, v)| (k.into(), v.into())))),
                ..ObjectMeta::default()
            },
            data: Some(data),
            ..ConfigMap::default()
        };
        let written = self.written.load(Ordering::Relaxed);
        let first = if written {
            api.replace(name, &PostParams::default(), &cm).await
        } else {
            api.create(&PostParams::default(), &cm).await
        };
        let result = match first {
            Ok(_) => Ok(()),
            // Left by an earlier process or leader.
            Err(kube::Error::Api(s)) if !written && s.code == 409 => api
                .replace(name, &PostParams::default(), &cm)
                .await
                .map(|_| ()),
            // Deleted by someone since.
            Err(kube::Error::Api(s)) if written && s.code == 404 => {
                api.create(&PostParams::default(), &cm).await.map(|_| ())
            }
            Err(e) => Err(e),
        };
        if result.is_ok() {
            self.written.store(true, Ordering::Relaxed);
        }
        result
    }
}
