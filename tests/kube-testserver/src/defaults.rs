//! Defaulting the real API server applies when it decodes request bodies,
//! for the fields our flows read, and the status objects get on creation.

use serde_json::{Value, json};

use crate::meta;
use crate::resources::ResourceInfo;

fn default_at(obj: &mut Value, path: &str, value: Value) {
    if meta::get_path(obj, path).is_none_or(Value::is_null) {
        meta::set_path(obj, path, value);
    }
}

/// Field defaults applied to every create and update body.
pub fn apply_defaults(res: &ResourceInfo, obj: &mut Value) {
    match (res.group, res.kind) {
        ("", "PersistentVolume") => {
            default_at(obj, "spec.persistentVolumeReclaimPolicy", json!("Retain"));
            default_at(obj, "spec.volumeMode", json!("Filesystem"));
        }
        ("", "PersistentVolumeClaim") => {
            default_at(obj, "spec.volumeMode", json!("Filesystem"));
        }
        ("storage.k8s.io", "StorageClass") => {
            default_at(obj, "reclaimPolicy", json!("Delete"));
            default_at(obj, "volumeBindingMode", json!("Immediate"));
        }
        ("storage.k8s.io", "CSIDriver") => {
            default_at(obj, "spec.attachRequired", json!(true));
            default_at(obj, "spec.podInfoOnMount", json!(false));
            default_at(obj, "spec.storageCapacity", json!(false));
            default_at(obj, "spec.requiresRepublish", json!(false));
            default_at(obj, "spec.seLinuxMount", json!(false));
            default_at(obj, "spec.fsGroupPolicy", json!("ReadWriteOnceWithFSType"));
            default_at(obj, "spec.volumeLifecycleModes", json!(["Persistent"]));
        }
        ("apps", "StatefulSet") => {
            default_at(obj, "spec.replicas", json!(1));
            default_at(obj, "spec.podManagementPolicy", json!("OrderedReady"));
            default_at(obj, "spec.revisionHistoryLimit", json!(10));
            default_at(
                obj,
                "spec.persistentVolumeClaimRetentionPolicy",
                json!({"whenDeleted": "Retain", "whenScaled": "Retain"}),
            );
        }
        _ => {}
    }
}

/// Status a new object gets: the server drops status sent on create for kinds
/// with a status subresource (except Node, whose status the kubelet creates)
/// and initialises a few phases.
pub fn initial_status(res: &ResourceInfo, obj: &mut Value) {
    if !res.status_subresource {
        return;
    }
    let keep = res.group.is_empty() && res.kind == "Node";
    if let Value::Object(m) = obj
        && !keep
    {
        m.remove("status");
    }
    match (res.group, res.kind) {
        ("", "PersistentVolume") | ("", "PersistentVolumeClaim") | ("", "Pod") => {
            meta::set_path(obj, "status.phase", json!("Pending"));
        }
        ("", "Namespace") => meta::set_path(obj, "status.phase", json!("Active")),
        _ => {}
    }
}
