//! The worker: for a pod or Job, creates the PVCs its annotations ask for
//! ([`decide::plan`](super::decide::plan)) and records its events; for a
//! managed PVC, deletes it once a live read says its claimant is gone.

use crate::projection::Job;
use crate::projection::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::ObjectRef;

use super::decide::{self, Claimant, ClaimedBy, OwnerKind, Step};
use super::{Key, PodPvcProvisioner};
use crate::events::EventType;

/// Why a key is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum PodPvcError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl PodPvcProvisioner {
    pub(super) async fn process(&self, key: &Key) {
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
        let (pod, job) = match kind {
            OwnerKind::Pod => {
                let key = ObjectRef::new(name).within(namespace);
                (self.caches.pods.store().get(&key), None)
            }
            OwnerKind::Job => {
                let key = ObjectRef::new(name).within(namespace);
                (None, self.caches.jobs.store().get(&key))
            }
        };
        // A Job's volumes are its pod template's.
        let (meta, volumes): (&ObjectMeta, &[_]) = if let Some(pod) = pod.as_deref() {
            let spec = pod.spec.as_ref();
            (
                &pod.metadata,
                spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default(),
            )
        } else if let Some(job) = job.as_deref() {
            let spec = job.spec.as_ref().and_then(|s| s.template.spec.as_ref());
            (
                &job.metadata,
                spec.and_then(|s| s.volumes.as_deref()).unwrap_or_default(),
            )
        } else {
            return Ok(());
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
        // The cache may lag behind the claimant's deletion: a live read
        // says whether it is still there before anything is created.
        if steps
            .iter()
            .any(|(_, step)| matches!(step, Step::Create(_)))
        {
            let live = self.live_claimant(kind, namespace, name).await?;
            if !decide::claimant_current(claimant.uid, live.as_ref()) {
                tracing::info!(
                    kind = kind.label(),
                    namespace,
                    name,
                    "gone or being deleted (the cache is behind): no PVC created"
                );
                return Ok(());
            }
        }
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
        meta: &ObjectMeta,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        // The recorder needs the object's kind; the metadata says the rest.
        let metadata = meta.clone();
        let recorder = &self.recorder;
        match kind {
            OwnerKind::Pod => {
                let pod = Pod {
                    metadata,
                    ..Pod::default()
                };
                recorder.record(&pod, event_type, reason, message).await
            }
            OwnerKind::Job => {
                let job = Job {
                    metadata,
                    ..Job::default()
                };
                recorder.record(&job, event_type, reason, message).await
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
        let live = self.live_claimant(by.kind, &by.namespace, &by.name).await?;
        Ok(live.map(|live| live.uid))
    }

    /// The claimant as the API server has it now, `None` when it does not
    /// exist.
    async fn live_claimant(
        &self,
        kind: OwnerKind,
        namespace: &str,
        name: &str,
    ) -> Result<Option<decide::LiveClaimant>, PodPvcError> {
        let live = match kind {
            OwnerKind::Pod => Api::<Pod>::namespaced(self.client.clone(), namespace)
                .get_metadata_opt(name)
                .await
                .map(live_identity),
            OwnerKind::Job => Api::<Job>::namespaced(self.client.clone(), namespace)
                .get_metadata_opt(name)
                .await
                .map(live_identity),
        };
        live.map_err(|source| PodPvcError::Api {
            what: format!("get {} {namespace}/{name}", kind.label()),
            source,
        })
    }
}

/// What a live metadata read says of a claimant.
fn live_identity<K>(
    meta: Option<kube::core::PartialObjectMeta<K>>,
) -> Option<decide::LiveClaimant> {
    let meta = meta?.metadata;
    Some(decide::LiveClaimant {
        uid: meta.uid?,
        deleting: meta.deletion_timestamp.is_some(),
    })
}
