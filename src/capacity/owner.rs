//! `--capacity-ownerref-level`: the owner of the CSIStorageCapacity objects,
//! as upstream's `pkg/owner`. Starting at the pod `POD_NAME` in `NAMESPACE`,
//! follow the controller reference `level` times and name the object
//! reached: 0 the pod, 1 its ReplicaSet / StatefulSet / DaemonSet, 2 the
//! Deployment above a ReplicaSet. Each object on the way is read (so the
//! reference carries the uid the garbage collector checks); only the kinds
//! below can be read, which is what the RBAC of the `capacity` component
//! grants.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::Api;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::decide::{controller_of, reference_to};

/// Why no owner was found.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("cannot read {kind} {namespace}/{name}: {source}")]
    Get {
        kind: String,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{kind} {namespace}/{name} has no controlling owner, cannot unwind the ownership further \
(lower --capacity-ownerref-level)"
    )]
    NoController {
        kind: String,
        namespace: String,
        name: String,
    },
    #[error(
        "{kind} {name} ({api_version}) is not a kind the owner lookup reads (Pod, ReplicaSet, \
StatefulSet, DaemonSet, Deployment); lower --capacity-ownerref-level"
    )]
    UnsupportedKind {
        api_version: String,
        kind: String,
        name: String,
    },
    #[error("{kind} {namespace}/{name} has no uid")]
    NoUid {
        kind: String,
        namespace: String,
        name: String,
    },
}

async fn meta_of<K>(client: &Client, namespace: &str, name: &str) -> Result<ObjectMeta, kube::Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    Ok(api.get(name).await?.meta().clone())
}

async fn read(
    client: &Client,
    namespace: &str,
    api_version: &str,
    kind: &str,
    name: &str,
) -> Result<ObjectMeta, OwnerError> {
    let result = match (api_version, kind) {
        ("v1", "Pod") => meta_of::<Pod>(client, namespace, name).await,
        ("apps/v1", "ReplicaSet") => meta_of::<ReplicaSet>(client, namespace, name).await,
        ("apps/v1", "StatefulSet") => meta_of::<StatefulSet>(client, namespace, name).await,
        ("apps/v1", "DaemonSet") => meta_of::<DaemonSet>(client, namespace, name).await,
        ("apps/v1", "Deployment") => meta_of::<Deployment>(client, namespace, name).await,
        _ => {
            return Err(OwnerError::UnsupportedKind {
                api_version: api_version.to_owned(),
                kind: kind.to_owned(),
                name: name.to_owned(),
            });
        }
    };
    result.map_err(|source| OwnerError::Get {
        kind: kind.to_owned(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source,
    })
}

/// The owner reference `level` controllers above pod `pod`.
pub async fn lookup(
    client: &Client,
    namespace: &str,
    pod: &str,
    level: u32,
) -> Result<OwnerReference, OwnerError> {
    let (mut api_version, mut kind, mut name) = ("v1".to_owned(), "Pod".to_owned(), pod.to_owned());
    let mut remaining = level;
    loop {
        let meta = read(client, namespace, &api_version, &kind, &name).await?;
        if remaining == 0 {
            return reference_to(&api_version, &kind, &meta).ok_or(OwnerError::NoUid {
                kind,
                namespace: namespace.to_owned(),
                name,
            });
        }
        let Some(controller) = controller_of(&meta) else {
            return Err(OwnerError::NoController {
                kind,
                namespace: namespace.to_owned(),
                name,
            });
        };
        api_version = controller.api_version.clone();
        kind = controller.kind.clone();
        name = controller.name.clone();
        remaining -= 1;
    }
}
