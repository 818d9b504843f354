//! Provisioning and deletion decisions: plain data in, plans out, no I/O.
//!
//! This is the core of upstream's split between the generic provisioning loop
//! (sig-storage-lib-external-provisioner) and the CSI-specific provisioner:
//! the loop (watch caches, work queues, API writes, CSI calls, in
//! [`crate::provisioner`]) calls these functions at each step.
//!
//! The contract of this module: decisions only. Nothing here awaits, reads
//! a cache, calls the API server or the driver, or keeps state between
//! calls; everything it needs comes in as arguments (objects read by the
//! loop, the [`ProvisionerConfig`]), and what it decides goes out as data
//! (plans, patches, [`crate::events::EventNote`]s, errors) for the loop to carry
//! out. The API object types it reads that `k8s-openapi` lacks (snapshots,
//! ReferenceGrants) are in [`crate::api`].
//!
//! # Provisioning a claim
//!
//! 1. [`should_provision`]`(claim, class, config)` — ours, now? Skips bound
//!    claims, claims being deleted, other provisioners' claims,
//!    `WaitForFirstConsumer` claims without a selected node and (node
//!    deployment) other nodes' claims; says [`ProvisionDecision::BecomeOwner`]
//!    when a node-local instance should try to take an Immediate claim.
//! 2. The loop checks its PV cache for [`volume_name`]`(prefix, uid, length)`:
//!    an existing PV means the work is done.
//! 3. [`data_source_ref`] and [`volume_attributes_class_name`] say which
//!    extra objects to read (source PVC + PV, or VolumeSnapshot + content;
//!    the VolumeAttributesClass); with the selected Node/CSINode and all
//!    Nodes/CSINodes they form the [`ProvisionInputs`].
//! 4. [`plan_provision`] validates everything and returns a [`ProvisionPlan`]:
//!    the complete `CreateVolumeRequest` (with [`accessibility_requirements`]
//!    from `topology`, the content source, parameters without
//!    `csi.storage.k8s.io/` keys, mutable parameters) and the secret
//!    references resolved from the class templates ([`resolve_secret_ref`]).
//!    Secrets are not read here: the loop fetches `plan.provisioner_secret`
//!    into `request.secrets`. The loop freezes the plan per claim uid while
//!    the operation is in flight, so retries send the identical request.
//!    Errors: [`ProvisionError::wants_reschedule`] → remove the selected-node
//!    annotation; [`ProvisionError::is_ignored`] → external populator, stop
//!    quietly; otherwise record `ProvisioningFailed` and retry with backoff.
//! 5. Before `CreateVolume`, the loop puts `plan.source_finalizer` on the
//!    clone source or snapshot.
//! 6. A failed `CreateVolume` is classified by
//!    [`classify_create_volume_error`] into final / infeasible / in
//!    background (keep retrying the frozen request even if the claim goes
//!    away) / reschedule.
//! 7. On success, [`build_pv`]`(plan, response, config)` makes the PV, or says
//!    why the returned volume is unusable ([`PvBuildError`]: the loop deletes
//!    that backend volume and retries).
//!
//! # Claim metadata
//!
//! With the `ClaimMetadataPropagation` gate on (off by default),
//! [`plan_provision`] also resolves the parameters a class lists as
//! templates (`${pvc.name}`, `${pvc.annotations['KEY']}`, ...) into the
//! request, and collects the claim labels and annotations the class copies
//! onto the PV (`plan.copied_metadata`, added by [`build_pv`] without
//! overwriting the PV's own keys). The class annotations, the token rules
//! and every error are in [`claim_metadata`]; the one template parser,
//! shared with the secret templates, in `template`.
//!
//! # Deleting a volume
//!
//! [`should_delete`]`(pv, config)` — ours, Released, reclaim policy Delete,
//! and not already handled (deletion timestamp without our finalizer) — then
//! [`plan_delete`]`(pv, class)` gives the volume id and the secret
//! ([`deletion_secret_ref`]: PV annotations first, class templates second).
//! `provisioner::attached` says when to wait for a detach instead.
//!
//! # CSI migration
//!
//! When our driver took over an in-tree plugin ([`crate::migration`]), it
//! also serves that plugin's classes: [`should_provision`] accepts claims
//! annotated for our driver whose class names the in-tree plugin, and the
//! older form (the in-tree name plus `pv.kubernetes.io/migrated-to`; the
//! watch filter for both is [`is_annotated_for_us`]); [`plan_provision`]
//! plans from the translated class and sets `plan.migrated_from`;
//! [`build_pv`] then saves the in-tree form. [`is_our_volume`] knows such
//! PVs, [`plan_delete`] translates them for the volume handle and sets
//! `plan.migrated_from`. `ProvisionPlan::is_migrated` and
//! `DeletePlan::is_migrated` are what upstream's `migrated` metric label says.
//!
//! # Node deployment
//!
//! [`node_deployment`] has the decisions of `--node-deployment`: the local
//! Node/CSINode planned with, the jittered backoff before taking an
//! Immediate claim, whether the class's allowedTopologies admit this node,
//! the capacity check and the guarded selected-node patch.
//!
//! # Finalizers
//!
//! [`pv_finalizer_change`] keeps our PV finalizer in line with the
//! HonorPVReclaimPolicy gate and the reclaim policy;
//! [`remove_finalizer_patch`] / [`add_finalizer_patch`] build JSON patches
//! guarded by a `test` of the current list, so stale caches cannot clobber.
//!
//! # Events
//!
//! [`events`] has the messages with upstream's wording; the reasons and every
//! other well-known string are in [`crate::wellknown`].

pub mod claim_metadata;
mod config;
mod content_source;
mod delete;
mod error;
pub mod events;
mod finalizer;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod namespace_metadata;
pub mod node_deployment;
mod ours;
mod outcome;
mod plan;
mod pv;
pub mod quantity;
pub mod reference_grant;
mod secrets;
mod should_provision;
mod template;
mod topology;

pub use config::{DriverCapabilities, NodeDeployment, ProvisionerConfig, provisioner_identity};
pub use content_source::{
    DataSourceKind, DataSourceObjects, DataSourceRef, SourceFinalizer, content_source,
    data_source_ref,
};
pub use delete::{
    DeleteDecision, DeleteError, DeletePlan, DeleteSkipReason, deletion_secret_ref, is_our_volume,
    plan_delete, should_delete, still_attached_message, volume_id_of, volume_on_this_node,
};
pub use error::{DataSourceError, ProvisionError};
pub use finalizer::{
    FinalizerChange, add_finalizer_patch, guard_uid, pv_finalizer_change, remove_finalizer_patch,
};
pub use ours::is_our_claim;
pub use outcome::{
    CLEANUP_FINAL_ANSWERS, CleanupAfterError, CreateVolumeOutcome, classify_create_volume_error,
    cleanup_after_error, may_reschedule,
};
pub use plan::{
    ClaimIdentity, ProvisionInputs, ProvisionPlan, PvSecretRefs, claim_class_name, csi_access_mode,
    driver_parameters, migrated_class_plugin, plan_provision, selected_node_name,
    volume_attributes_class_name, volume_name,
};
pub use pv::{
    PvBuildError, build_pv, records_same_volume, retained_volume_pv, skipped_volume_context,
    topology_outside_requisite,
};
pub use secrets::{SecretError, SecretKind, SecretRef, resolve_secret_ref};
pub use should_provision::{
    ProvisionDecision, SkipReason, annotated_provisioner, is_annotated_for_us, should_provision,
};
pub use template::TemplateContext;
pub use topology::{
    SelectedNodeTopology, TopologyError, TopologyInputs, accessibility_requirements,
    node_affinity_matches, pvc_name_hash_and_index, satisfies_requisite, topology_keys,
    volume_node_affinity,
};
