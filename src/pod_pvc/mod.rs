//! The pod/Job-annotation PVC provisioner (gate `PodPVCProvisioner`,
//! `--controller-id`), the PV releaser's companion from the seed project
//! kubernetes-dynamic-reclaimable-pvc-controllers ("whenever it says Pod it
//! means it can also be a Job").
//!
//! A pod asks for a PVC for its volume `<v>` with the annotations
//! `dynamic-pvc-provisioner.kubernetes.io/<v>.enabled: "true"` and
//! `dynamic-pvc-provisioner.kubernetes.io/<v>.pvc: <one PVC, YAML or JSON>`;
//! a Job with the same annotations on itself gets them from its pod
//! template's volumes, shared by all its pods. The PVC is created under the
//! volume's `claimName`, labelled `claimed-by` (+ `claimed-by-kind`) and
//! `managed-by=<controller id>` (which the releaser reads), and owned by the
//! pod or Job, so the garbage collector removes it with its owner. Events
//! on the pod or Job: `PVCProvisioned`, `ErrMissingPVC`, `ErrInvalidPVC`,
//! `ErrMissingVolume`, `ErrPVCProvisionFailed`.
//!
//! Cleanup, for clusters whose garbage collector lags or is off: when a pod
//! or Job goes, and every `--pvc-provisioner-resync-period`, each PVC
//! managed by our id whose claimant is gone — checked with a live GET, never
//! from the cache alone — is deleted (guarded by its uid). A PVC without our
//! managed-by label is never touched.
//!
//! The PVCs are created with the sidecar's RBAC, not the pod author's:
//! anyone who may create pods may have PVCs made of any class.
//!
//! Decisions are pure ([`decide`]); this file reads the caches (pods and
//! Jobs are cached trimmed: metadata with our annotations, volumes) and
//! writes.

pub mod decide;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::projection::Job;
use crate::projection::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};

use crate::caches::{Caches, Kind};
use crate::events::{EventType, Recorder};
use crate::informer::Change;
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};
use decide::{Claimant, ClaimedBy, OwnerKind, Step};

/// The loop's flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `--controller-id` (not empty: the command line refuses that).
    pub controller_id: String,
    /// `--pvc-provisioner-resync-period`; zero disables the resync.
    pub resync_period: Duration,
}

/// A unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// A pod or Job that may ask for PVCs.
    Claimant(OwnerKind, String, String),
    /// A managed PVC whose claimant may be gone.
    Claim(String, String),
}

/// The running loop.
pub struct PodPvcProvisioner {
    client: Client,
    caches: Arc<Caches>,
    recorder: Arc<Recorder>,
    controller_id: String,
    resync_period: Duration,
    queue: WorkQueue<Key>,
    stopped: AtomicBool,
    workers: usize,
}

/// Registers the cache handlers and asks for pods, Jobs and claims. Call
/// before the caches start; then [`PodPvcProvisioner::start`].
pub fn new(shared: &Shared, settings: Settings) -> Arc<PodPvcProvisioner> {
    let caches = Arc::clone(&shared.caches);
    caches.want(&[Kind::Pods, Kind::Jobs, Kind::Claims]);
    let queue: WorkQueue<Key> = WorkQueue::new("pod-pvc-provisioner", shared.backoff);
    let id = settings.controller_id.clone();
    {
        let queue = queue.clone();
        let claims = caches.claims.store();
        let id = id.clone();
        caches.pods.on_change(move |change| {
            on_claimant(&queue, &claims, &id, OwnerKind::Pod, change_parts(change));
        });
    }
    {
        let queue = queue.clone();
        let claims = caches.claims.store();
        let id = id.clone();
        caches.jobs.on_change(move |change| {
            on_claimant(&queue, &claims, &id, OwnerKind::Job, change_parts(change));
        });
    }
    {
        // A managed claim deleted by hand (or whose claimant asks again)
        // lets the claimant be looked at again.
        let queue = queue.clone();
        caches.claims.on_change(move |change| {
            let (Change::Applied(claim) | Change::Deleted(claim)) = change;
            if let Some(by) = decide::claimed_by(claim, &id) {
                queue.add(Key::Claimant(by.kind, by.namespace, by.name));
            }
        });
    }
    Arc::new(PodPvcProvisioner {
        client: shared.client.clone(),
        caches,
        recorder: Arc::clone(&shared.recorder),
        controller_id: settings.controller_id,
        resync_period: settings.resync_period,
        queue,
        stopped: AtomicBool::new(false),
        workers: shared.workers.max(1),
    })
}

/// (deleted?, namespace, name, annotated?) of a pod or Job change.
fn change_parts<K: kube::Resource>(change: Change<'_, K>) -> (bool, String, String, bool) {
    let (deleted, obj) = match change {
        Change::Applied(obj) => (false, obj),
        Change::Deleted(obj) => (true, obj),
    };
    let meta = obj.meta();
    (
        deleted,
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
        decide::is_annotated(meta.annotations.as_ref()),
    )
}

fn on_claimant(
    queue: &WorkQueue<Key>,
    claims: &kube::runtime::reflector::Store<PersistentVolumeClaim>,
    id: &str,
    kind: OwnerKind,
    (deleted, namespace, name, annotated): (bool, String, String, bool),
) {
    if !deleted {
        if annotated {
            queue.add(Key::Claimant(kind, namespace, name));
        }
        return;
    }
    // Gone: its claims, if any, are checked (live) for deletion.
    for claim in claims.state() {
        if let Some(by) = decide::claimed_by(&claim, id)
            && by.kind == kind
            && by.namespace == namespace
            && by.name == name
        {
            queue.add(Key::Claim(namespace.clone(), claim.name_any()));
        }
    }
}

/// Why a key is retried with backoff.
#[derive(Debug, thiserror::Error)]
enum PodPvcError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl EmbeddedLoop for PodPvcProvisioner {
    /// Starts the workers and the resync once the caches are filled.
    fn start(self: Arc<Self>) {
        let this = Arc::clone(&self);
        tokio::spawn(async move {
            this.caches.wait_until_ready().await;
            tracing::info!(
                controller_id = %this.controller_id,
                resync = ?this.resync_period,
                workers = this.workers,
                "pod/Job PVC provisioner running"
            );
            let ctx = Arc::clone(&this);
            this.queue.run_workers(this.workers, move |key| {
                let ctx = Arc::clone(&ctx);
                async move { ctx.process(&key).await }
            });
            if !this.resync_period.is_zero() {
                this.resync().await;
            }
        });
    }

    /// Stops taking work; writes under way finish.
    fn shut_down(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.queue.shut_down();
    }
}

impl PodPvcProvisioner {
    /// Every period: every managed claim (its claimant may be gone without
    /// an event we saw) and every annotated pod and Job.
    async fn resync(&self) {
        let mut timer = tokio::time::interval(self.resync_period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            if self.stopped.load(Ordering::Relaxed) {
                return;
            }
            for claim in self.caches.claims.store().state() {
                if let Some(by) = decide::claimed_by(&claim, &self.controller_id) {
                    self.queue.add(Key::Claim(by.namespace, claim.name_any()));
                }
            }
            for pod in self.caches.pods.store().state() {
                if decide::is_annotated(pod.metadata.annotations.as_ref()) {
                    self.queue.add(Key::Claimant(
                        OwnerKind::Pod,
                        pod.namespace().unwrap_or_default(),
                        pod.name_any(),
                    ));
                }
            }
            for job in self.caches.jobs.store().state() {
                if decide::is_annotated(job.metadata.annotations.as_ref()) {
                    self.queue.add(Key::Claimant(
                        OwnerKind::Job,
                        job.namespace().unwrap_or_default(),
                        job.name_any(),
                    ));
                }
            }
        }
    }

    async fn process(&self, key: &Key) {
        let result = match key {
            Key::Claimant(kind, namespace, name) => self.claimant(*kind, namespace, name).await,
            Key::Claim(namespace, name) => self.cleanup(namespace, name).await,
        };
        match result {
            Ok(()) => self.queue.forget(key),
            Err(e) => {
                let delay = self.queue.add_rate_limited(key.clone());
                tracing::warn!(?key, error = %e, retry_in = ?delay, "pod/Job PVC provisioner: retrying");
            }
        }
    }

    async fn claimant(
        &self,
        kind: OwnerKind,
        namespace: &str,
        name: &str,
    ) -> Result<(), PodPvcError> {
        let (pod, job);
        let (meta, volumes): (
            &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            &[_],
        ) = match kind {
            OwnerKind::Pod => {
                pod = self
                    .caches
                    .pods
                    .store()
                    .get(&ObjectRef::new(name).within(namespace));
                let Some(pod) = pod.as_deref() else {
                    return Ok(());
                };
                (
                    &pod.metadata,
                    pod.spec
                        .as_ref()
                        .and_then(|s| s.volumes.as_deref())
                        .unwrap_or_default(),
                )
            }
            OwnerKind::Job => {
                job = self
                    .caches
                    .jobs
                    .store()
                    .get(&ObjectRef::new(name).within(namespace));
                let Some(job) = job.as_deref() else {
                    return Ok(());
                };
                (
                    &job.metadata,
                    job.spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .and_then(|s| s.volumes.as_deref())
                        .unwrap_or_default(),
                )
            }
        };
        // Being deleted: no new claims for it.
        if meta.deletion_timestamp.is_some() {
            return Ok(());
        }
        let claimant = Claimant {
            kind,
            namespace,
            name,
            uid: meta.uid.as_deref().unwrap_or_default(),
            annotations: meta.annotations.as_ref(),
            volumes,
        };
        let claims = self.caches.claims.store();
        let steps = decide::plan(&claimant, &self.controller_id, |claim| {
            claims
                .get(&ObjectRef::new(claim).within(namespace))
                .is_some()
        });
        let mut failed = None;
        for (volume, step) in steps {
            match step {
                Step::Exists { claim } => {
                    tracing::debug!(namespace, name, volume, claim, "PVC exists already");
                }
                Step::Refuse { reason, message } => {
                    tracing::warn!(
                        kind = kind.label(),
                        namespace,
                        name,
                        volume,
                        reason,
                        "{message}"
                    );
                    self.event(kind, meta, EventType::Warning, reason, &message)
                        .await;
                }
                Step::Create(claim) => {
                    let claim_name = claim.name_any();
                    // Created whole: the full API type, not the projection.
                    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
                        Api::namespaced(self.client.clone(), namespace);
                    let object = crate::projection::Projection::to_object(&*claim);
                    match api.create(&PostParams::default(), &object).await {
                        Ok(_) => {
                            tracing::info!(kind = kind.label(), namespace, name, volume, claim = %claim_name, "PVC created");
                            let message = format!("created PVC {claim_name} for volume {volume}");
                            self.event(
                                kind,
                                meta,
                                EventType::Normal,
                                decide::REASON_PROVISIONED,
                                &message,
                            )
                            .await;
                        }
                        Err(e) => {
                            let status = match &e {
                                kube::Error::Api(s) => Some(s.code),
                                _ => None,
                            };
                            let failure = decide::create_failure(status);
                            if failure == decide::CreateFailure::AlreadyThere {
                                continue;
                            }
                            let detail = match &e {
                                kube::Error::Api(s) => s.message.clone(),
                                other => other.to_string(),
                            };
                            let message = format!(
                                "creating PVC {claim_name} for volume {volume} failed: {detail}"
                            );
                            tracing::warn!(kind = kind.label(), namespace, name, "{message}");
                            self.event(
                                kind,
                                meta,
                                EventType::Warning,
                                decide::REASON_PROVISION_FAILED,
                                &message,
                            )
                            .await;
                            if failure == decide::CreateFailure::Refused {
                                continue;
                            }
                            failed = Some(PodPvcError::Api {
                                what: format!("create PVC {namespace}/{claim_name}"),
                                source: e,
                            });
                        }
                    }
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    async fn event(
        &self,
        kind: OwnerKind,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        match kind {
            OwnerKind::Pod => {
                let pod = Pod {
                    metadata: meta.clone(),
                    ..Pod::default()
                };
                self.recorder
                    .record(&pod, event_type, reason, message)
                    .await;
            }
            OwnerKind::Job => {
                let job = Job {
                    metadata: meta.clone(),
                    ..Job::default()
                };
                self.recorder
                    .record(&job, event_type, reason, message)
                    .await;
            }
        };
    }

    /// Deletes a managed claim whose claimant is gone (a live read says so).
    async fn cleanup(&self, namespace: &str, name: &str) -> Result<(), PodPvcError> {
        let Some(claim) = self
            .caches
            .claims
            .store()
            .get(&ObjectRef::new(name).within(namespace))
        else {
            return Ok(());
        };
        let Some(by) = decide::claimed_by(&claim, &self.controller_id) else {
            return Ok(());
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let live_uid = self.live_uid(&by).await?;
        if !decide::claimant_gone(&by, live_uid.as_deref()) {
            return Ok(());
        }
        let api: Api<crate::projection::Wire<PersistentVolumeClaim>> =
            Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: claim.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => {
                tracing::info!(claim = %format!("{namespace}/{name}"), claimed_by = %format!("{} {}", by.kind.label(), by.name), "deleted the PVC of a {} that is gone", by.kind.label());
                Ok(())
            }
            // Gone already, or replaced by a claim of the same name.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
            Err(source) => Err(PodPvcError::Api {
                what: format!("delete PVC {namespace}/{name}"),
                source,
            }),
        }
    }

    /// The uid of the claimant now, `None` when it does not exist.
    async fn live_uid(&self, by: &ClaimedBy) -> Result<Option<String>, PodPvcError> {
        let uid = match by.kind {
            OwnerKind::Pod => Api::<Pod>::namespaced(self.client.clone(), &by.namespace)
                .get_metadata_opt(&by.name)
                .await
                .map(|o| o.and_then(|o| o.metadata.uid)),
            OwnerKind::Job => Api::<Job>::namespaced(self.client.clone(), &by.namespace)
                .get_metadata_opt(&by.name)
                .await
                .map(|o| o.and_then(|o| o.metadata.uid)),
        };
        uid.map_err(|source| PodPvcError::Api {
            what: format!("get {} {}/{}", by.kind.label(), by.namespace, by.name),
            source,
        })
    }
}
