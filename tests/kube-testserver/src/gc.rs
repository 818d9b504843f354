//! Garbage collector, following kube-controller-manager's: dependents whose
//! owners are all gone are deleted, `orphan` and `foregroundDeletion`
//! finalizers are processed. It runs synchronously after every write (see
//! [`State::reconcile`]), so its effects are visible when a request returns.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::meta::{self, OwnerRef};
use crate::ops::{DeleteOptions, FINALIZER_FOREGROUND, FINALIZER_ORPHAN, Propagation};
use crate::resources::split_api_version;
use crate::store::{Dirty, ObjKey, State};

/// Upper bound on reconcile steps after one write (guards against loops).
const MAX_STEPS: usize = 1_000_000;

enum OwnerState {
    Solid,
    Dangling,
    WaitingForDependents,
}

impl State {
    /// Processes pending changes (garbage collection and controller-manager
    /// helpers) until nothing changes any more.
    pub fn reconcile(&mut self) {
        let mut steps = 0;
        while !self.dirty.is_empty() && steps < MAX_STEPS {
            let batch = std::mem::take(&mut self.dirty);
            for d in batch {
                steps += 1;
                if self.gc_enabled {
                    self.gc_process(&d);
                }
                if self.controller_enabled {
                    self.controller_process(&d);
                }
            }
        }
    }

    /// Marks every object as changed (after turning GC or helpers on).
    pub fn mark_all_dirty(&mut self) {
        for res in 0..self.objects.len() {
            let items: Vec<(ObjKey, Arc<Value>)> = self.objects[res]
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            for (key, last) in items {
                self.dirty.push(Dirty {
                    res,
                    key,
                    last,
                    prev: None,
                    removed: false,
                });
            }
        }
    }

    fn gc_process(&mut self, d: &Dirty) {
        let uid = meta::uid(&d.last).to_string();
        // Owners of this object (now or before the change) waiting in
        // foreground deletion re-check whether they are still blocked.
        let mut refs = meta::owner_refs(&d.last);
        if let Some(p) = &d.prev {
            refs.extend(meta::owner_refs(p));
        }
        for r in refs {
            if let Some((res, key)) = self.resolve_owner(d.res, &d.key, &r)
                && let Some(owner) = self.get(res, &key).cloned()
                && meta::uid(&owner) == r.uid
                && meta::finalizers(&owner)
                    .iter()
                    .any(|f| f == FINALIZER_FOREGROUND)
            {
                self.process_foreground(res, &key, &owner);
            }
        }
        if d.removed {
            self.attempt_dependents(&uid);
            return;
        }
        let Some(cur) = self.get(d.res, &d.key).cloned() else {
            self.attempt_dependents(&uid);
            return;
        };
        if meta::uid(&cur) != uid {
            return;
        }
        if meta::is_deleting(&cur) {
            let fins = meta::finalizers(&cur);
            if fins.iter().any(|f| f == FINALIZER_ORPHAN) {
                self.process_orphan(d.res, &d.key, &cur);
                return;
            }
            if fins.iter().any(|f| f == FINALIZER_FOREGROUND) {
                self.attempt_dependents(&uid);
                if let Some(cur) = self.get(d.res, &d.key).cloned() {
                    self.process_foreground(d.res, &d.key, &cur);
                }
                return;
            }
        }
        self.attempt_to_delete(d.res, &d.key);
    }

    fn attempt_dependents(&mut self, owner_uid: &str) {
        let deps: Vec<(usize, ObjKey)> = self
            .dependents
            .get(owner_uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for (res, key) in deps {
            self.attempt_to_delete(res, &key);
        }
    }

    /// Where an owner reference points: the owner kind must be served; a
    /// namespaced owner is looked up in the dependent's namespace.
    fn resolve_owner(
        &self,
        dep_res: usize,
        dep_key: &ObjKey,
        r: &OwnerRef,
    ) -> Option<(usize, ObjKey)> {
        let (group, _) = split_api_version(&r.api_version);
        let res = self.registry.by_group_kind(group, &r.kind)?;
        let info = self.registry.get(res)?;
        let dep_namespaced = self.registry.get(dep_res).is_some_and(|i| i.namespaced);
        if info.namespaced && !dep_namespaced {
            return None;
        }
        Some((res, State::key_for(info, &dep_key.0, &r.name)))
    }

    fn owner_state(&self, dep_res: usize, dep_key: &ObjKey, r: &OwnerRef) -> OwnerState {
        let Some((res, key)) = self.resolve_owner(dep_res, dep_key, r) else {
            // Unknown kinds cannot be checked; the real GC leaves them alone too.
            return OwnerState::Solid;
        };
        match self.get(res, &key) {
            Some(o) if meta::uid(o) == r.uid => {
                if meta::is_deleting(o)
                    && meta::finalizers(o)
                        .iter()
                        .any(|f| f == FINALIZER_FOREGROUND)
                {
                    OwnerState::WaitingForDependents
                } else {
                    OwnerState::Solid
                }
            }
            _ => OwnerState::Dangling,
        }
    }

    fn attempt_to_delete(&mut self, res: usize, key: &ObjKey) {
        let Some(obj) = self.get(res, key).cloned() else {
            return;
        };
        if meta::is_deleting(&obj) {
            return;
        }
        let refs = meta::owner_refs(&obj);
        if refs.is_empty() {
            return;
        }
        let mut solid = 0;
        let mut gone_uids = Vec::new();
        let mut waiting = 0;
        for r in &refs {
            match self.owner_state(res, key, r) {
                OwnerState::Solid => solid += 1,
                OwnerState::Dangling => gone_uids.push(r.uid.clone()),
                OwnerState::WaitingForDependents => {
                    waiting += 1;
                    gone_uids.push(r.uid.clone());
                }
            }
        }
        if solid > 0 {
            if !gone_uids.is_empty() {
                self.remove_owner_refs(res, key, &gone_uids);
            }
            return;
        }
        let has_dependents = self
            .dependents
            .get(meta::uid(&obj))
            .is_some_and(|s| !s.is_empty());
        let policy = if waiting > 0 && has_dependents {
            Propagation::Foreground
        } else {
            Propagation::Background
        };
        let opts = DeleteOptions {
            propagation: Some(policy),
            precondition_uid: Some(meta::uid(&obj).to_string()),
            ..DeleteOptions::default()
        };
        let _ = self.delete(res, &key.0, &key.1, &opts);
    }

    fn remove_owner_refs(&mut self, res: usize, key: &ObjKey, uids: &[String]) {
        let Some(old) = self.get(res, key).cloned() else {
            return;
        };
        let mut new = (*old).clone();
        let kept: Vec<Value> = new
            .get("metadata")
            .and_then(|m| m.get("ownerReferences"))
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|r| {
                        !r.get("uid")
                            .and_then(Value::as_str)
                            .is_some_and(|u| uids.iter().any(|x| x == u))
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        meta::set_meta(
            &mut new,
            "ownerReferences",
            if kept.is_empty() {
                Value::Null
            } else {
                json!(kept)
            },
        );
        self.commit_update(res, key, &old, new);
    }

    fn remove_finalizer(&mut self, res: usize, key: &ObjKey, finalizer: &str) {
        let Some(old) = self.get(res, key).cloned() else {
            return;
        };
        let mut new = (*old).clone();
        let fins: Vec<String> = meta::finalizers(&old)
            .into_iter()
            .filter(|f| f != finalizer)
            .collect();
        meta::set_finalizers(&mut new, &fins);
        self.commit_update(res, key, &old, new);
    }

    fn process_orphan(&mut self, res: usize, key: &ObjKey, owner: &Arc<Value>) {
        let uid = meta::uid(owner).to_string();
        let deps: Vec<(usize, ObjKey)> = self
            .dependents
            .get(&uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        for (dres, dkey) in deps {
            self.remove_owner_refs(dres, &dkey, std::slice::from_ref(&uid));
        }
        self.remove_finalizer(res, key, FINALIZER_ORPHAN);
    }

    /// Removes `foregroundDeletion` once no dependent blocks the owner.
    fn process_foreground(&mut self, res: usize, key: &ObjKey, owner: &Arc<Value>) {
        let uid = meta::uid(owner).to_string();
        let blocked = self.dependents.get(&uid).is_some_and(|deps| {
            deps.iter().any(|(dres, dkey)| {
                self.get(*dres, dkey).is_some_and(|d| {
                    meta::owner_refs(d)
                        .iter()
                        .any(|r| r.uid == uid && r.block_owner_deletion)
                })
            })
        });
        if !blocked {
            self.remove_finalizer(res, key, FINALIZER_FOREGROUND);
        }
    }
}
