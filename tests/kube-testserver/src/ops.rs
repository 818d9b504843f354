//! Verb semantics on top of the store: create, update, patch, delete, get, list.

use std::sync::Arc;

use base64::Engine;
use serde_json::{Value, json};

use crate::defaults;
use crate::error::ApiError;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::resources::ResourceInfo;
use crate::selectors::Selectors;
use crate::store::{ObjKey, State};

/// `propagationPolicy` of a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    /// Delete the owner now, dependents in the background.
    Background,
    /// Keep the owner (with `foregroundDeletion`) until blocking dependents are gone.
    Foreground,
    /// Keep dependents, removing their owner references (`orphan` finalizer).
    Orphan,
}

/// Options of a DELETE (from the DeleteOptions body and query).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeleteOptions {
    pub propagation: Option<Propagation>,
    pub orphan_dependents: Option<bool>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
}

/// Result of a DELETE.
#[derive(Debug, Clone)]
pub enum DeleteOutcome {
    /// Still present with deletionTimestamp (finalizers pending).
    Pending(Arc<Value>),
    /// Removed.
    Deleted(Arc<Value>),
}

/// A page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

pub const FINALIZER_ORPHAN: &str = "orphan";
pub const FINALIZER_FOREGROUND: &str = "foregroundDeletion";

const GENERATE_CHARS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn generate_suffix() -> String {
    let bytes = uuid::Uuid::new_v4().into_bytes();
    bytes
        .iter()
        .take(5)
        .map(|b| GENERATE_CHARS[(*b as usize) % GENERATE_CHARS.len()] as char)
        .collect()
}

/// Everything but metadata, status and type fields differs.
fn spec_changed(old: &Value, new: &Value) -> bool {
    const SKIP: [&str; 4] = ["metadata", "status", "apiVersion", "kind"];
    let empty = serde_json::Map::new();
    let o = old.as_object().unwrap_or(&empty);
    let n = new.as_object().unwrap_or(&empty);
    let keys = o
        .keys()
        .chain(n.keys())
        .filter(|k| !SKIP.contains(&k.as_str()));
    for k in keys {
        if o.get(k) != n.get(k) {
            return true;
        }
    }
    false
}

impl State {
    pub fn info(&self, res: usize) -> Result<ResourceInfo, ApiError> {
        self.registry
            .get(res)
            .cloned()
            .ok_or_else(ApiError::path_not_found)
    }

    /// Storage key of an object of `res` named `name` in `ns`.
    pub fn key_for(info: &ResourceInfo, ns: &str, name: &str) -> ObjKey {
        if info.namespaced {
            (ns.to_string(), name.to_string())
        } else {
            (String::new(), name.to_string())
        }
    }

    /// Checks kind/apiVersion of a body and fills them in.
    fn check_type(info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
        let Value::Object(m) = obj else {
            return Err(ApiError::bad_request(
                "the body of the request was not an object",
            ));
        };
        let av = info.api_version();
        if let Some(k) = m.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != info.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind of the object ({k}) does not match the kind of the resource ({})",
                info.kind
            )));
        }
        if let Some(v) = m.get("apiVersion").and_then(Value::as_str)
            && !v.is_empty()
            && v != av
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({av})"
            )));
        }
        m.insert("kind".into(), json!(info.kind));
        m.insert("apiVersion".into(), json!(av));
        Ok(())
    }

    /// Namespace of the body versus the URL.
    fn check_namespace(
        info: &ResourceInfo,
        url_ns: &str,
        obj: &mut Value,
    ) -> Result<String, ApiError> {
        if !info.namespaced {
            meta::set_meta(obj, "namespace", Value::Null);
            return Ok(String::new());
        }
        let body_ns = meta::namespace(obj).to_string();
        let ns = match (body_ns.is_empty(), url_ns.is_empty()) {
            (true, true) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            (true, false) => url_ns.to_string(),
            (false, true) => body_ns,
            (false, false) if body_ns == url_ns => body_ns,
            (false, false) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        };
        meta::set_meta(obj, "namespace", json!(ns));
        Ok(ns)
    }

    /// POST: creates an object.
    pub fn create(
        &mut self,
        res: usize,
        url_ns: &str,
        mut obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let info = self.info(res)?;
        Self::check_type(&info, &mut obj)?;
        let ns = Self::check_namespace(&info, url_ns, &mut obj)?;
        if !meta::resource_version(&obj).is_empty() {
            return Err(ApiError::new(
                500,
                "InternalError",
                "Internal error occurred: resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = meta::name(&obj).to_string();
        if name.is_empty() {
            match meta::meta_str(&obj, "generateName") {
                Some(prefix) if !prefix.is_empty() => {
                    name = format!("{prefix}{}", generate_suffix());
                    meta::set_meta(&mut obj, "name", json!(name));
                }
                _ => {
                    return Err(ApiError::invalid(
                        &info,
                        "",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    ));
                }
            }
        }
        let key = Self::key_for(&info, &ns, &name);
        if self.get(res, &key).is_some() {
            return Err(ApiError::already_exists(&info, &name));
        }
        meta::set_meta(&mut obj, "uid", json!(uuid::Uuid::new_v4().to_string()));
        meta::set_meta(&mut obj, "creationTimestamp", json!(meta::now_rfc3339()));
        meta::set_meta(&mut obj, "deletionTimestamp", Value::Null);
        meta::set_meta(&mut obj, "deletionGracePeriodSeconds", Value::Null);
        meta::set_meta(&mut obj, "selfLink", Value::Null);
        meta::set_meta(
            &mut obj,
            "generation",
            if info.generation {
                json!(1)
            } else {
                Value::Null
            },
        );
        defaults::initial_status(&info, &mut obj);
        defaults::apply_defaults(&info, &mut obj);
        self.admit_default_storage_class(&info, &mut obj);
        Ok(self.insert(res, key, obj))
    }

    /// The DefaultStorageClass admission plugin: a claim created without
    /// `spec.storageClassName` (absent, not `""`) gets the default class, the
    /// newest one if several are marked default.
    fn admit_default_storage_class(&self, info: &ResourceInfo, obj: &mut Value) {
        if !(info.group.is_empty() && info.kind == "PersistentVolumeClaim") {
            return;
        }
        if obj
            .get("spec")
            .and_then(|s| s.get("storageClassName"))
            .is_some_and(|c| !c.is_null())
        {
            return;
        }
        let Some(sc_res) = self.res_of("storage.k8s.io", "StorageClass") else {
            return;
        };
        let is_default = |c: &Value| {
            [
                "storageclass.kubernetes.io/is-default-class",
                "storageclass.beta.kubernetes.io/is-default-class",
            ]
            .iter()
            .any(|a| meta::annotation(c, a) == Some("true"))
        };
        let newest = self
            .iter_scope(sc_res, None)
            .filter(|c| is_default(c))
            .max_by(|a, b| {
                let ka = (
                    meta::meta_str(a, "creationTimestamp").unwrap_or(""),
                    meta::resource_version(a).parse::<u64>().unwrap_or(0),
                );
                let kb = (
                    meta::meta_str(b, "creationTimestamp").unwrap_or(""),
                    meta::resource_version(b).parse::<u64>().unwrap_or(0),
                );
                ka.cmp(&kb)
            });
        if let Some(c) = newest {
            meta::set_path(obj, "spec.storageClassName", json!(meta::name(c)));
        }
    }

    /// Builds the object an update stores, enforcing what the server enforces.
    pub fn prepare_update(
        &self,
        info: &ResourceInfo,
        old: &Value,
        mut new: Value,
        status_only: bool,
    ) -> Result<Value, ApiError> {
        let name = meta::name(old).to_string();
        Self::check_type(info, &mut new)?;
        let body_name = meta::name(&new).to_string();
        if body_name.is_empty() {
            meta::set_meta(&mut new, "name", json!(name));
        } else if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        Self::check_namespace(info, meta::namespace(old), &mut new)?;
        let rv = meta::resource_version(&new);
        if !rv.is_empty() && rv != meta::resource_version(old) {
            return Err(ApiError::stale(info, &name));
        }
        let body_uid = meta::uid(&new);
        if !body_uid.is_empty() && body_uid != meta::uid(old) {
            return Err(ApiError::invalid(
                info,
                &name,
                "metadata.uid",
                &format!("Invalid value: \"{body_uid}\": field is immutable"),
            ));
        }
        if status_only {
            let mut merged = old.clone();
            if let (Value::Object(m), Some(s)) = (&mut merged, new.get("status")) {
                m.insert("status".into(), s.clone());
            } else if let Value::Object(m) = &mut merged {
                m.remove("status");
            }
            new = merged;
        } else if info.status_subresource
            && let Value::Object(m) = &mut new
        {
            match old.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            let v = old
                .get("metadata")
                .and_then(|m| m.get(field))
                .cloned()
                .unwrap_or(Value::Null);
            meta::set_meta(&mut new, field, v);
        }
        meta::set_meta(&mut new, "selfLink", Value::Null);
        meta::set_meta(
            &mut new,
            "resourceVersion",
            json!(meta::resource_version(old)),
        );
        if meta::is_deleting(old) {
            let old_f = meta::finalizers(old);
            let added: Vec<String> = meta::finalizers(&new)
                .into_iter()
                .filter(|f| !old_f.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    info,
                    &name,
                    "metadata.finalizers",
                    &format!(
                        "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                    ),
                ));
            }
        }
        if !status_only {
            defaults::apply_defaults(info, &mut new);
        }
        if info.generation && spec_changed(old, &new) {
            meta::set_meta(&mut new, "generation", json!(meta::generation(old) + 1));
        }
        Ok(new)
    }

    /// Stores an updated object. A no-op update keeps the resourceVersion and
    /// emits nothing; removing the last finalizer of a deleting object removes
    /// it (DELETED carries the last stored state).
    pub fn commit_update(
        &mut self,
        res: usize,
        key: &ObjKey,
        old: &Arc<Value>,
        mut new: Value,
    ) -> Arc<Value> {
        meta::set_meta(
            &mut new,
            "resourceVersion",
            json!(meta::resource_version(old)),
        );
        if new == **old {
            return old.clone();
        }
        if meta::is_deleting(old) && meta::finalizers(&new).is_empty() {
            let rv = self
                .remove(res, key)
                .map(|d| meta::resource_version(&d).to_string())
                .unwrap_or_default();
            meta::set_meta(&mut new, "resourceVersion", json!(rv));
            return Arc::new(new);
        }
        self.replace(res, key.clone(), new)
    }

    fn existing(
        &self,
        info: &ResourceInfo,
        res: usize,
        ns: &str,
        name: &str,
    ) -> Result<(ObjKey, Arc<Value>), ApiError> {
        let key = Self::key_for(info, ns, name);
        let obj = self
            .get(res, &key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(info, name))?;
        Ok((key, obj))
    }

    /// GET one object.
    pub fn get_one(&self, res: usize, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let info = self.info(res)?;
        Ok(self.existing(&info, res, ns, name)?.1)
    }

    /// PUT (main resource or `/status`).
    pub fn update(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        body: Value,
        status_only: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let info = self.info(res)?;
        let (key, old) = self.existing(&info, res, ns, name)?;
        let new = self.prepare_update(&info, &old, body, status_only)?;
        Ok(self.commit_update(res, &key, &old, new))
    }

    /// PATCH (main resource or `/status`); server-side apply creates missing
    /// objects. Returns the object and whether it was created.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        ptype: PatchType,
        body: &[u8],
        status_only: bool,
        field_manager: Option<&str>,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let info = self.info(res)?;
        let patch: Value = match ptype {
            PatchType::Apply => {
                if field_manager.is_none_or(str::is_empty) {
                    return Err(ApiError::new(
                        422,
                        "Invalid",
                        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                    ));
                }
                serde_yaml_ng::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
            }
            _ => serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        };
        if ptype == PatchType::Strategic && info.custom {
            return Err(ApiError::unsupported_media_type(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ));
        }
        if ptype == PatchType::Apply {
            for f in ["apiVersion", "kind"] {
                if patch
                    .get(f)
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
                {
                    return Err(ApiError::bad_request(format!("{f} must be set")));
                }
            }
        }
        let key = Self::key_for(&info, ns, name);
        let Some(old) = self.get(res, &key).cloned() else {
            if ptype == PatchType::Apply && !status_only {
                let mut obj = patch;
                let body_name = meta::name(&obj).to_string();
                if !body_name.is_empty() && body_name != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({body_name}) does not match the name on the URL ({name})"
                    )));
                }
                meta::set_meta(&mut obj, "name", json!(name));
                return Ok((self.create(res, ns, obj)?, true));
            }
            return Err(ApiError::not_found(&info, name));
        };
        let mut cur = (*old).clone();
        match ptype {
            PatchType::Merge => patch::merge_patch(&mut cur, &patch),
            PatchType::Json => patch::json_patch(&mut cur, &patch)?,
            PatchType::Strategic => patch::strategic_merge(&mut cur, &patch)?,
            PatchType::Apply => patch::apply_merge(&mut cur, &patch)?,
        }
        let new = self.prepare_update(&info, &old, cur, status_only)?;
        Ok((self.commit_update(res, &key, &old, new), false))
    }

    /// DELETE one object.
    pub fn delete(
        &mut self,
        res: usize,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<DeleteOutcome, ApiError> {
        let info = self.info(res)?;
        let (key, old) = self.existing(&info, res, ns, name)?;
        if let Some(uid) = &opts.precondition_uid
            && uid != meta::uid(&old)
        {
            return Err(ApiError::conflict(
                &info,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta::uid(&old)
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_rv
            && rv != meta::resource_version(&old)
        {
            return Err(ApiError::conflict(
                &info,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta::resource_version(&old)
                ),
            ));
        }
        let policy = opts.propagation.or(match opts.orphan_dependents {
            Some(true) => Some(Propagation::Orphan),
            Some(false) => Some(Propagation::Background),
            None => None,
        });
        let mut fins = meta::finalizers(&old);
        let add = |fins: &mut Vec<String>, f: &str| {
            if !fins.iter().any(|x| x == f) {
                fins.push(f.to_string());
            }
        };
        match policy {
            Some(Propagation::Orphan) => {
                fins.retain(|f| f != FINALIZER_FOREGROUND);
                add(&mut fins, FINALIZER_ORPHAN);
            }
            Some(Propagation::Foreground) => {
                fins.retain(|f| f != FINALIZER_ORPHAN);
                add(&mut fins, FINALIZER_FOREGROUND);
            }
            Some(Propagation::Background) => {
                fins.retain(|f| f != FINALIZER_ORPHAN && f != FINALIZER_FOREGROUND)
            }
            None => {}
        }
        let outcome = if fins.is_empty() {
            let gone = self.remove(res, &key).unwrap_or(old);
            DeleteOutcome::Deleted(gone)
        } else {
            let mut new = (*old).clone();
            meta::set_finalizers(&mut new, &fins);
            if !meta::is_deleting(&old) {
                let generation = meta::generation(&old);
                if generation > 0 {
                    meta::set_meta(&mut new, "generation", json!(generation + 1));
                }
                meta::set_meta(&mut new, "deletionTimestamp", json!(meta::now_rfc3339()));
                meta::set_meta(&mut new, "deletionGracePeriodSeconds", json!(0));
            }
            DeleteOutcome::Pending(self.commit_update(res, &key, &old, new))
        };
        if info.group.is_empty() && info.kind == "Namespace" {
            self.delete_namespace_contents(name);
        }
        Ok(outcome)
    }

    fn delete_namespace_contents(&mut self, ns: &str) {
        let targets: Vec<(usize, String)> = (0..self.objects.len())
            .filter(|r| self.registry.get(*r).is_some_and(|i| i.namespaced))
            .flat_map(|r| {
                self.iter_scope(r, Some(ns))
                    .map(move |o| (r, meta::name(o).to_string()))
                    .collect::<Vec<_>>()
            })
            .collect();
        for (r, name) in targets {
            // Already-deleting objects keep waiting for their finalizers.
            let _ = self.delete(r, ns, &name, &DeleteOptions::default());
        }
    }

    /// LIST with selectors and pagination. Pages after the first come from a
    /// snapshot taken by the first page, so a paginated list is consistent.
    /// `from_watch_cache` (`resourceVersion=0`): the answer may be the stale
    /// state of [`crate::TestServer::serve_stale_lists`].
    pub fn list(
        &mut self,
        res: usize,
        ns: Option<&str>,
        selectors: &Selectors,
        limit: Option<usize>,
        continue_token: Option<&str>,
        from_watch_cache: bool,
    ) -> Result<ListPage, ApiError> {
        let (snapshot_id, snap_rv, items, start) = match continue_token {
            Some(token) => {
                let (id, start) = decode_continue(token)?;
                let snap = self.snapshot(id).ok_or_else(|| {
                    ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    )
                })?;
                (snap.id, snap.rv, snap.items.clone(), start)
            }
            None => match self.stale_lists.get(&res).filter(|_| from_watch_cache) {
                Some(stale) => {
                    let items: Vec<Arc<Value>> = stale
                        .objects
                        .iter()
                        .filter(|(key, _)| ns.is_none_or(|ns| key.0 == ns))
                        .map(|(_, o)| o)
                        .filter(|o| selectors.matches(o))
                        .cloned()
                        .collect();
                    (0, stale.rv, Arc::new(items), 0)
                }
                None => {
                    let items: Vec<Arc<Value>> = self
                        .iter_scope(res, ns)
                        .filter(|o| selectors.matches(o))
                        .cloned()
                        .collect();
                    (0, self.rv, Arc::new(items), 0)
                }
            },
        };
        let limit = limit.filter(|l| *l > 0);
        let end = limit.map_or(items.len(), |l| (start + l).min(items.len()));
        let page: Vec<Arc<Value>> = items.get(start..end).map(<[_]>::to_vec).unwrap_or_default();
        let (continue_token, remaining) = if end < items.len() {
            let id = if snapshot_id == 0 {
                self.store_snapshot(items.clone())
            } else {
                snapshot_id
            };
            (
                Some(encode_continue(id, end, snap_rv)),
                Some(items.len() - end),
            )
        } else {
            (None, None)
        };
        Ok(ListPage {
            items: page,
            rv: snap_rv,
            continue_token,
            remaining,
        })
    }
}

fn encode_continue(id: u64, start: usize, rv: u64) -> String {
    let v = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start, "snapshot": id});
    base64::engine::general_purpose::STANDARD.encode(v.to_string())
}

fn decode_continue(token: &str) -> Result<(u64, usize), ApiError> {
    let bad = || ApiError::bad_request(format!("continue key is not valid: {token}"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let id = v.get("snapshot").and_then(Value::as_u64).ok_or_else(bad)?;
    let start = v
        .get("start")
        .and_then(Value::as_u64)
        .and_then(|s| usize::try_from(s).ok())
        .ok_or_else(bad)?;
    Ok((id, start))
}
