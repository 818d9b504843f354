//! Merge patches that also work where RBAC grants `update` but not `patch`.
//!
//! The upstream sidecar updates claims and VolumeSnapshots (its stock
//! `rbac.yaml` grants `update`, not `patch`, on both); this sidecar patches
//! them (one request, no read). A user who swaps the image keeps the stock
//! rules, so a `403` on a patch is answered by reading the object and
//! replacing it with the patch applied. The first `403` is remembered per
//! resource, so later writes go straight to read + update, and it is logged
//! once, not per write.
//!
//! The read and the update are of the raw object (`DynamicObject`), never of
//! `K`: `K` may be a projection ([`crate::projection`]) or another type that
//! holds only some fields, and writing it back whole would drop the rest.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use kube::Resource;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api_calls::{ApiCall, call};

/// The calls [`merge_patch`] makes instead of a refused patch, under the
/// stock upstream rules (they grant `update` where ours grant `patch`, on
/// the resources the loops merge-patch: claims and VolumeSnapshots). Not
/// needs of the manifests in `deploy/`, which grant the patch; the audit
/// check of the real-cluster tests accepts them ([`crate::api_calls`]).
pub const FALLBACK_API_CALLS: &[ApiCall] = &[
    call("", "persistentvolumeclaims", &["get", "update"]),
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["get", "update"],
    ),
];

/// Resources (plural) on which `patch` was refused.
fn patch_forbidden() -> &'static Mutex<HashSet<String>> {
    static FORBIDDEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    FORBIDDEN.get_or_init(Mutex::default)
}

fn is_patch_forbidden(resource: &str) -> bool {
    patch_forbidden()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(resource)
}

/// Attempts of read + update when updates conflict with other writers
/// (only for patches not guarded by a resourceVersion: a guarded one
/// returns its conflict at once, as a patch would).
const UPDATE_ATTEMPTS: usize = 5;

/// JSON merge patch (RFC 7386) of `name`, or, where `patch` is forbidden,
/// the same change by read + update. A patch that sets
/// `metadata.resourceVersion` stays guarded by it either way.
pub async fn merge_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let resource = K::plural(&()).into_owned();
    if !is_patch_forbidden(&resource) {
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Err(kube::Error::Api(status)) if status.code == 403 => {
                let first = patch_forbidden()
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(resource.clone());
                if first {
                    tracing::warn!(
                        %resource,
                        "RBAC does not allow patch on {resource}; using get and update instead (as with the upstream sidecar's rules). Grant patch to save one request per write"
                    );
                }
            }
            other => return other,
        }
    }
    update_with_merge_patch(api, name, patch).await
}

/// Read, apply the merge patch locally, update; all on the raw object.
async fn update_with_merge_patch<K>(
    api: &Api<K>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let guarded = patch
        .pointer("/metadata/resourceVersion")
        .is_some_and(|v| !v.is_null());
    let resource = ApiResource::erase::<K>(&());
    let raw: Api<DynamicObject> = match api.namespace() {
        Some(namespace) => Api::namespaced_with(api.clone().into_client(), namespace, &resource),
        None => Api::all_with(api.clone().into_client(), &resource),
    };
    let mut last = None;
    for _ in 0..UPDATE_ATTEMPTS {
        let current = raw.get(name).await?;
        let mut object = serde_json::to_value(&current).map_err(kube::Error::SerdeError)?;
        json_patch::merge(&mut object, patch);
        let object: DynamicObject =
            serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
        match raw.replace(name, &PostParams::default(), &object).await {
            Err(kube::Error::Api(status)) if status.code == 409 && !guarded => {
                last = Some(kube::Error::Api(status));
            }
            Ok(saved) => {
                let saved = serde_json::to_value(&saved).map_err(kube::Error::SerdeError)?;
                return serde_json::from_value(saved).map_err(kube::Error::SerdeError);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        kube::Error::Api(Box::new(kube::core::Status::failure(
            "conflicts persisted",
            "Conflict",
        )))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_testserver::{RequestMatch, TestServer, Verb};
    use serde_json::json;

    #[tokio::test]
    async fn the_update_fallback_keeps_fields_the_callers_type_does_not_hold() {
        let server = TestServer::new();
        server
            .create_object(json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n1", "labels": {"a": "1"}},
                "spec": {"podCIDR": "10.0.0.0/24"}}))
            .expect("node");
        // The projection has no spec: a read + update of it would drop it.
        // (Nodes: no other test of this process patches them, and the 403
        // is remembered per resource.)
        let api: Api<crate::projection::Node> = Api::all(server.client());
        server.fail_next(1, RequestMatch::new(Verb::Patch, "nodes"), 403);
        let done = merge_patch(&api, "n1", &json!({"metadata": {"labels": {"b": "2"}}}))
            .await
            .expect("written by update");
        assert_eq!(server.request_count(Verb::Update, "nodes"), 1);
        assert_eq!(done.metadata.labels.map(|l| l.len()), Some(2));
        let full: Api<k8s_openapi::api::core::v1::Node> = Api::all(server.client());
        let now = full.get("n1").await.expect("get");
        let cidr = now.spec.and_then(|s| s.pod_cidr);
        assert_eq!(cidr.as_deref(), Some("10.0.0.0/24"), "spec kept");
    }

    #[tokio::test]
    async fn a_forbidden_patch_becomes_get_and_update_and_is_remembered() {
        let server = TestServer::new();
        server
            .create_object(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "c", "namespace": "default"}, "data": {"a": "1"}}))
            .expect("configmap");
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
        server.fail_next(1, RequestMatch::new(Verb::Patch, "configmaps"), 403);
        let done = merge_patch(&api, "c", &json!({"data": {"b": "2"}}))
            .await
            .expect("written by update");
        let data = done.data.unwrap_or_default();
        assert_eq!(data.get("a").map(String::as_str), Some("1"));
        assert_eq!(data.get("b").map(String::as_str), Some("2"));
        assert_eq!(server.request_count(Verb::Update, "configmaps"), 1);

        // Remembered: the next write does not try patch again.
        server.reset_counters();
        merge_patch(&api, "c", &json!({"data": {"a": null}}))
            .await
            .expect("written by update");
        assert_eq!(server.request_count(Verb::Patch, "configmaps"), 0);
        assert_eq!(server.request_count(Verb::Update, "configmaps"), 1);
        let now = api.get("c").await.expect("get");
        assert_eq!(now.data.unwrap_or_default().len(), 1, "null removes a key");

        // A guarded write keeps its guard: a stale resourceVersion conflicts.
        let err = merge_patch(
            &api,
            "c",
            &json!({"metadata": {"resourceVersion": "1"}, "data": {"x": "y"}}),
        )
        .await
        .expect_err("stale resourceVersion");
        assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
    }
}
