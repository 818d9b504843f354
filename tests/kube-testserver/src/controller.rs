//! The small parts of kube-controller-manager's PV controller our flows rely
//! on, switchable per test: the storage-provisioner annotation on claims of
//! external provisioners, binding a claim to the PV whose claimRef names it,
//! `Released` / `Available` PV phases. They run synchronously after every
//! write (see [`State::reconcile`]).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta;
use crate::store::{Dirty, ObjKey, State};

/// Annotation naming the provisioner that should provision a claim.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Deprecated beta form of [`ANN_STORAGE_PROVISIONER`], still set by the controller.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Annotation set by the scheduler on WaitForFirstConsumer claims.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set on a claim once binding is complete.
pub const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Set when the controller (not the user) chose the binding.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

fn claim_ref(pv: &Value) -> Option<(String, String, String)> {
    let c = pv.get("spec")?.get("claimRef")?;
    Some((
        c.get("namespace")?.as_str()?.to_string(),
        c.get("name")?.as_str()?.to_string(),
        c.get("uid")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
    ))
}

fn phase(obj: &Value) -> &str {
    obj.get("status")
        .and_then(|s| s.get("phase"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn volume_name(pvc: &Value) -> &str {
    pvc.get("spec")
        .and_then(|s| s.get("volumeName"))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn class_name(pvc: &Value) -> Option<&str> {
    pvc.get("spec")
        .and_then(|s| s.get("storageClassName"))
        .and_then(Value::as_str)
        .or_else(|| meta::annotation(pvc, "volume.beta.kubernetes.io/storage-class"))
        .filter(|c| !c.is_empty())
}

impl State {
    fn mutate(&mut self, res: usize, key: &ObjKey, f: impl FnOnce(&mut Value)) {
        let Some(old) = self.get(res, key).cloned() else {
            return;
        };
        let mut new = (*old).clone();
        f(&mut new);
        self.commit_update(res, key, &old, new);
    }

    pub(crate) fn controller_process(&mut self, d: &Dirty) {
        let (Some(pv_res), Some(pvc_res)) = (
            self.res_of("", "PersistentVolume"),
            self.res_of("", "PersistentVolumeClaim"),
        ) else {
            return;
        };
        if d.res == pv_res {
            self.sync_pv(pv_res, pvc_res, &d.key.1);
        } else if d.res == pvc_res {
            if !d.removed {
                self.sync_claim(pv_res, pvc_res, &d.key);
            }
            let pvs: Vec<String> = self
                .claim_index
                .get(&d.key)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
            for pv in pvs {
                self.sync_pv(pv_res, pvc_res, &pv);
            }
        } else if self.res_of("storage.k8s.io", "StorageClass") == Some(d.res) && !d.removed {
            let claims: Vec<ObjKey> = self
                .iter_scope(pvc_res, None)
                .filter(|c| class_name(c) == Some(d.key.1.as_str()) && volume_name(c).is_empty())
                .map(|c| (meta::namespace(c).to_string(), meta::name(c).to_string()))
                .collect();
            for c in claims {
                self.sync_claim(pv_res, pvc_res, &c);
            }
        }
    }

    fn sync_claim(&mut self, pv_res: usize, pvc_res: usize, key: &ObjKey) {
        let Some(pvc) = self.get(pvc_res, key).cloned() else {
            return;
        };
        let vol = volume_name(&pvc).to_string();
        if vol.is_empty() {
            let candidate = self.claim_index.get(key).and_then(|names| {
                names.iter().find(|n| {
                    self.get(pv_res, &(String::new(), (*n).clone()))
                        .and_then(|pv| claim_ref(pv))
                        .is_some_and(|(_, _, uid)| uid.is_empty() || uid == meta::uid(&pvc))
                })
            });
            if let Some(pv_name) = candidate.cloned() {
                self.bind(pv_res, pvc_res, &pv_name, key);
            } else if !meta::is_deleting(&pvc) {
                self.annotate_provisioner(pvc_res, key, &pvc);
            }
            return;
        }
        let Some(pv) = self.get(pv_res, &(String::new(), vol.clone())).cloned() else {
            return;
        };
        match claim_ref(&pv) {
            None => {
                // Claim pre-bound to a free volume: the controller claims it.
                let uid = meta::uid(&pvc).to_string();
                let (ns, name) = key.clone();
                self.mutate(pv_res, &(String::new(), vol.clone()), |pv| {
                    meta::set_path(
                        pv,
                        "spec.claimRef",
                        json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                               "namespace": ns, "name": name, "uid": uid}),
                    );
                    meta::set_annotation(pv, ANN_BOUND_BY_CONTROLLER, "yes");
                });
                self.bind(pv_res, pvc_res, &vol, key);
            }
            Some((ns, name, uid))
                if ns == key.0 && name == key.1 && (uid.is_empty() || uid == meta::uid(&pvc)) =>
            {
                self.bind(pv_res, pvc_res, &vol, key);
            }
            Some(_) => {}
        }
    }

    /// Sets the storage-provisioner annotations on an unbound claim whose class
    /// names an external provisioner. As in the PV controller, a claim of a
    /// WaitForFirstConsumer class gets them only once a node is selected.
    fn annotate_provisioner(&mut self, pvc_res: usize, key: &ObjKey, pvc: &Arc<Value>) {
        let Some(class) = class_name(pvc) else {
            return;
        };
        let Some(sc_res) = self.res_of("storage.k8s.io", "StorageClass") else {
            return;
        };
        let Some(sc) = self
            .get(sc_res, &(String::new(), class.to_string()))
            .cloned()
        else {
            return;
        };
        let provisioner = sc.get("provisioner").and_then(Value::as_str).unwrap_or("");
        if provisioner.is_empty() || provisioner.starts_with("kubernetes.io/") {
            return;
        }
        let wffc =
            sc.get("volumeBindingMode").and_then(Value::as_str) == Some("WaitForFirstConsumer");
        if wffc && meta::annotation(pvc, ANN_SELECTED_NODE).is_none() {
            return;
        }
        let provisioner = provisioner.to_string();
        self.mutate(pvc_res, key, |c| {
            meta::set_annotation(c, ANN_STORAGE_PROVISIONER, &provisioner);
            meta::set_annotation(c, ANN_BETA_STORAGE_PROVISIONER, &provisioner);
        });
    }

    fn bind(&mut self, pv_res: usize, pvc_res: usize, pv_name: &str, key: &ObjKey) {
        let pv_key = (String::new(), pv_name.to_string());
        let (Some(pv), Some(pvc)) = (
            self.get(pv_res, &pv_key).cloned(),
            self.get(pvc_res, key).cloned(),
        ) else {
            return;
        };
        let pvc_uid = meta::uid(&pvc).to_string();
        self.mutate(pv_res, &pv_key, |v| {
            if claim_ref(v).is_some_and(|(_, _, uid)| uid.is_empty()) {
                meta::set_path(v, "spec.claimRef.uid", json!(pvc_uid));
            }
            meta::set_path(v, "status.phase", json!("Bound"));
        });
        let capacity = pv.get("spec").and_then(|s| s.get("capacity")).cloned();
        let modes = pv.get("spec").and_then(|s| s.get("accessModes")).cloned();
        let pv_name = pv_name.to_string();
        self.mutate(pvc_res, key, |c| {
            if volume_name(c).is_empty() {
                meta::set_path(c, "spec.volumeName", json!(pv_name));
                meta::set_annotation(c, ANN_BOUND_BY_CONTROLLER, "yes");
            }
            meta::set_annotation(c, ANN_BIND_COMPLETED, "yes");
            meta::set_path(c, "status.phase", json!("Bound"));
            if let Some(cap) = capacity {
                meta::set_path(c, "status.capacity", cap);
            }
            if let Some(m) = modes {
                meta::set_path(c, "status.accessModes", m);
            }
        });
    }

    fn sync_pv(&mut self, pv_res: usize, pvc_res: usize, name: &str) {
        let pv_key = (String::new(), name.to_string());
        let Some(pv) = self.get(pv_res, &pv_key).cloned() else {
            return;
        };
        let new_phase = match claim_ref(&pv) {
            None => Some("Available"),
            Some((ns, cname, uid)) => {
                let claim_key = (ns, cname);
                match self.get(pvc_res, &claim_key).cloned() {
                    None if uid.is_empty() => Some("Available"),
                    Some(c) if !uid.is_empty() && meta::uid(&c) != uid => Some("Released"),
                    None => Some("Released"),
                    Some(c) => {
                        let vol = volume_name(&c);
                        if vol.is_empty() || vol == name {
                            self.sync_claim(pv_res, pvc_res, &claim_key);
                        }
                        None
                    }
                }
            }
        };
        let Some(p) = new_phase else {
            return;
        };
        let current = phase(&pv);
        let keep = match p {
            "Released" => current == "Released" || current == "Failed",
            _ => current == p,
        };
        if !keep {
            self.mutate(pv_res, &pv_key, |v| {
                meta::set_path(v, "status.phase", json!(p))
            });
        }
    }
}
