//! Kubernetes API object types that `k8s-openapi` does not have: the
//! VolumeSnapshot and VolumeSnapshotContent of `snapshot.storage.k8s.io/v1`
//! ([`snapshot`]) and the ReferenceGrant of
//! `gateway.networking.k8s.io/v1beta1` ([`reference_grant`]).
//!
//! Plain serde types with the fields we read, and `kube::Resource`
//! implemented by hand so `kube::Api` and the watch caches
//! ([`crate::caches`]) serve them without a CRD code generator. Types only:
//! the decisions over them are in [`crate::provision`].

pub mod reference_grant;
pub mod snapshot;
