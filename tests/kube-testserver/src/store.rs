//! The object store: objects per resource, the global resourceVersion
//! counter, the retained event history, registered watchers and indexes.
//! Every write goes through [`State::insert`], [`State::replace`] or
//! [`State::remove`], which bump the counter, record the event and notify
//! watchers while the state lock is held, so watchers see writes in order
//! (a watch lag, [`WatchLags`], holds each message of a lagged resource's
//! remote watch until its time: the order stays that of the writes).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::faults::WatchLags;
use crate::meta;
use crate::observe::Origin;
use crate::resources::Registry;
use crate::selectors::Selectors;

/// `(namespace, name)`; namespace is `""` for cluster-scoped objects.
pub type ObjKey = (String, String);

/// A watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One retained event.
#[derive(Debug, Clone)]
pub struct Event {
    pub rv: u64,
    pub res: usize,
    pub kind: EventType,
    pub obj: Arc<Value>,
    pub prev: Option<Arc<Value>>,
}

/// A message queued to one watch stream.
#[derive(Debug, Clone)]
pub enum WatchMsg {
    /// `ADDED` / `MODIFIED` / `DELETED` with the object.
    Event(EventType, Arc<Value>),
    /// `BOOKMARK` at a resourceVersion, optionally marking the end of initial events.
    Bookmark { rv: u64, initial_events_end: bool },
}

/// A message in a watch stream's queue, and when it may be sent (`None`:
/// at once; set by a watch lag). The stream sends its messages in queue
/// order, each not before its time: a message waits behind an earlier
/// one that is held, whatever its own time.
#[derive(Debug, Clone)]
pub struct Queued {
    pub msg: WatchMsg,
    pub due: Option<Instant>,
}

pub struct Watcher {
    pub id: u64,
    pub res: usize,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    /// Who asked for the watch: watch lags hold remote watches only.
    pub origin: Origin,
    pub tx: mpsc::UnboundedSender<Queued>,
}

impl Watcher {
    /// Queues `msg`, to be sent not before `due`. False when the stream
    /// is gone.
    pub fn send(&self, msg: WatchMsg, due: Option<Instant>) -> bool {
        self.tx.send(Queued { msg, due }).is_ok()
    }

    fn in_scope(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| meta::namespace(obj) == ns)
    }
}

/// An object that changed; reconciliation (GC, controller helpers) looks at it.
#[derive(Debug, Clone)]
pub struct Dirty {
    pub res: usize,
    pub key: ObjKey,
    /// Last state: the current object, or the removed one.
    pub last: Arc<Value>,
    /// The state before this change, if any.
    pub prev: Option<Arc<Value>>,
    pub removed: bool,
}

/// A consistent list snapshot for paginated lists.
pub struct Snapshot {
    pub id: u64,
    pub rv: u64,
    pub items: Arc<Vec<Arc<Value>>>,
}

pub struct State {
    pub registry: Registry,
    pub objects: Vec<BTreeMap<ObjKey, Arc<Value>>>,
    pub rv: u64,
    pub history: VecDeque<Event>,
    pub history_limit: usize,
    /// Watches may start from any resourceVersion >= this.
    pub compacted_rv: u64,
    pub watchers: Vec<Watcher>,
    pub next_id: u64,
    pub snapshots: VecDeque<Snapshot>,
    /// owner uid -> dependents.
    pub dependents: HashMap<String, BTreeSet<(usize, ObjKey)>>,
    /// (claim namespace, claim name) -> names of PVs whose claimRef names it.
    pub claim_index: HashMap<ObjKey, BTreeSet<String>>,
    pub dirty: Vec<Dirty>,
    pub gc_enabled: bool,
    pub controller_enabled: bool,
    /// Watch lags in force and the events they held.
    pub watch_lags: WatchLags,
    /// Resource → the state its `resourceVersion=0` lists answer with
    /// ([`crate::TestServer::serve_stale_lists`]).
    pub stale_lists: HashMap<usize, StaleList>,
}

/// A resource's objects and the revision as they were when
/// [`crate::TestServer::serve_stale_lists`] was called: what a lagging
/// watch cache of a real API server answers a `resourceVersion=0` list
/// with.
pub struct StaleList {
    pub rv: u64,
    pub objects: BTreeMap<ObjKey, Arc<Value>>,
}

const MAX_SNAPSHOTS: usize = 64;

impl State {
    pub fn new(registry: Registry, history_limit: usize) -> Self {
        let n = registry.all().len();
        Self {
            registry,
            objects: vec![BTreeMap::new(); n],
            rv: 0,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted_rv: 0,
            watchers: Vec::new(),
            next_id: 1,
            snapshots: VecDeque::new(),
            dependents: HashMap::new(),
            claim_index: HashMap::new(),
            dirty: Vec::new(),
            gc_enabled: true,
            controller_enabled: false,
            watch_lags: WatchLags::default(),
            stale_lists: HashMap::new(),
        }
    }

    pub fn get(&self, res: usize, key: &ObjKey) -> Option<&Arc<Value>> {
        self.objects.get(res)?.get(key)
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn with_rv(obj: &mut Value, rv: u64) {
        meta::set_meta(obj, "resourceVersion", json!(rv.to_string()));
    }

    /// Stores a new object, emitting ADDED.
    pub fn insert(&mut self, res: usize, key: ObjKey, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        Self::with_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        self.index(res, &key, None, Some(&obj));
        if let Some(m) = self.objects.get_mut(res) {
            m.insert(key.clone(), obj.clone());
        }
        self.record(res, EventType::Added, obj.clone(), None);
        self.dirty.push(Dirty {
            res,
            key,
            last: obj.clone(),
            prev: None,
            removed: false,
        });
        obj
    }

    /// Replaces an existing object, emitting MODIFIED.
    pub fn replace(&mut self, res: usize, key: ObjKey, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        Self::with_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        let prev = self
            .objects
            .get_mut(res)
            .and_then(|m| m.insert(key.clone(), obj.clone()));
        self.index(res, &key, prev.as_deref(), Some(&obj));
        self.record(res, EventType::Modified, obj.clone(), prev.clone());
        self.dirty.push(Dirty {
            res,
            key,
            last: obj.clone(),
            prev,
            removed: false,
        });
        obj
    }

    /// Removes an object, emitting DELETED with its last stored state carrying
    /// the deletion's resourceVersion.
    pub fn remove(&mut self, res: usize, key: &ObjKey) -> Option<Arc<Value>> {
        let prev = self.objects.get_mut(res)?.remove(key)?;
        let rv = self.next_rv();
        let mut last = (*prev).clone();
        Self::with_rv(&mut last, rv);
        let last = Arc::new(last);
        self.index(res, key, Some(&prev), None);
        self.record(res, EventType::Deleted, last.clone(), Some(prev.clone()));
        self.dirty.push(Dirty {
            res,
            key: key.clone(),
            last: last.clone(),
            prev: Some(prev),
            removed: true,
        });
        Some(last)
    }

    fn index(&mut self, res: usize, key: &ObjKey, old: Option<&Value>, new: Option<&Value>) {
        let old_refs: BTreeSet<String> = old
            .map(|o| meta::owner_refs(o).into_iter().map(|r| r.uid).collect())
            .unwrap_or_default();
        let new_refs: BTreeSet<String> = new
            .map(|o| meta::owner_refs(o).into_iter().map(|r| r.uid).collect())
            .unwrap_or_default();
        for uid in old_refs.difference(&new_refs) {
            if let Some(set) = self.dependents.get_mut(uid) {
                set.remove(&(res, key.clone()));
                if set.is_empty() {
                    self.dependents.remove(uid);
                }
            }
        }
        for uid in new_refs.difference(&old_refs) {
            self.dependents
                .entry(uid.clone())
                .or_default()
                .insert((res, key.clone()));
        }
        let is_pv = self
            .registry
            .get(res)
            .is_some_and(|r| r.group.is_empty() && r.kind == "PersistentVolume");
        if is_pv {
            let claim = |o: Option<&Value>| -> Option<ObjKey> {
                let c = o?.get("spec")?.get("claimRef")?;
                Some((
                    c.get("namespace")?.as_str()?.to_string(),
                    c.get("name")?.as_str()?.to_string(),
                ))
            };
            let (oc, nc) = (claim(old), claim(new));
            if oc != nc {
                if let Some(c) = oc
                    && let Some(set) = self.claim_index.get_mut(&c)
                {
                    set.remove(&key.1);
                    if set.is_empty() {
                        self.claim_index.remove(&c);
                    }
                }
                if let Some(c) = nc {
                    self.claim_index.entry(c).or_default().insert(key.1.clone());
                }
            }
        }
    }

    fn record(&mut self, res: usize, kind: EventType, obj: Arc<Value>, prev: Option<Arc<Value>>) {
        let ev = Event {
            rv: self.rv,
            res,
            kind,
            obj,
            prev,
        };
        let resource = self.plural(res);
        let lags = &self.watch_lags;
        let mut held = 0;
        self.watchers.retain(|w| {
            if w.res != res {
                return true;
            }
            match classify(w, &ev) {
                Some(msg) => {
                    let due = lags.due(resource, w.origin);
                    let sent = w.send(msg, due);
                    held += u64::from(sent && due.is_some());
                    sent
                }
                None => !w.tx.is_closed(),
            }
        });
        self.watch_lags.count_held(resource, held);
        self.history.push_back(ev);
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
    }

    /// Drops the retained history: watches from any earlier resourceVersion
    /// (and pending continue tokens) now get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
        self.snapshots.clear();
    }

    /// Ends every open watch (their streams end after queued events).
    pub fn close_watches(&mut self) {
        self.watchers.clear();
    }

    pub fn remove_watcher(&mut self, id: u64) {
        self.watchers.retain(|w| w.id != id);
    }

    /// The plural name of a served resource (`""` if unknown).
    pub fn plural(&self, res: usize) -> &'static str {
        self.registry.get(res).map_or("", |info| info.plural)
    }

    /// When a message queued now to `w` may be sent (its resource's watch
    /// lag, for a remote watch).
    pub fn watch_due(&self, w: &Watcher) -> Option<Instant> {
        self.watch_lags.due(self.plural(w.res), w.origin)
    }

    /// Index of a served kind.
    pub fn res_of(&self, group: &str, kind: &str) -> Option<usize> {
        self.registry.by_group_kind(group, kind)
    }

    pub fn alloc_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Stores a list snapshot for continue tokens and returns its id.
    pub fn store_snapshot(&mut self, items: Arc<Vec<Arc<Value>>>) -> u64 {
        let id = self.alloc_id();
        self.snapshots.push_back(Snapshot {
            id,
            rv: self.rv,
            items,
        });
        while self.snapshots.len() > MAX_SNAPSHOTS {
            self.snapshots.pop_front();
        }
        id
    }

    pub fn snapshot(&self, id: u64) -> Option<&Snapshot> {
        self.snapshots.iter().find(|s| s.id == id)
    }

    /// Objects of a resource in key order, optionally in one namespace.
    pub fn iter_scope<'a>(
        &'a self,
        res: usize,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Arc<Value>> + 'a {
        self.objects
            .get(res)
            .into_iter()
            .flat_map(
                move |m| -> Box<dyn Iterator<Item = (&ObjKey, &Arc<Value>)> + 'a> {
                    match namespace {
                        Some(ns) => Box::new(
                            m.range((ns.to_string(), String::new())..)
                                .take_while(move |(k, _)| k.0 == ns),
                        ),
                        None => Box::new(m.iter()),
                    }
                },
            )
            .map(|(_, v)| v)
    }
}

/// The message a watcher receives for an event, following the watch cache:
/// an object entering the selector is ADDED, one leaving it is DELETED
/// (with its previous state at the event's resourceVersion).
fn classify(w: &Watcher, ev: &Event) -> Option<WatchMsg> {
    let cur = w.in_scope(&ev.obj) && w.selectors.matches(&ev.obj);
    match ev.kind {
        EventType::Added => cur.then(|| WatchMsg::Event(EventType::Added, ev.obj.clone())),
        EventType::Deleted => {
            let was = ev
                .prev
                .as_deref()
                .is_none_or(|p| w.in_scope(p) && w.selectors.matches(p));
            (was && w.in_scope(&ev.obj))
                .then(|| WatchMsg::Event(EventType::Deleted, ev.obj.clone()))
        }
        EventType::Modified => {
            let was = ev
                .prev
                .as_deref()
                .is_some_and(|p| w.in_scope(p) && w.selectors.matches(p));
            match (was, cur) {
                (true, true) => Some(WatchMsg::Event(EventType::Modified, ev.obj.clone())),
                (false, true) => Some(WatchMsg::Event(EventType::Added, ev.obj.clone())),
                (true, false) => {
                    let mut old = ev.prev.as_deref().cloned().unwrap_or(Value::Null);
                    State::with_rv(&mut old, ev.rv);
                    Some(WatchMsg::Event(EventType::Deleted, Arc::new(old)))
                }
                (false, false) => None,
            }
        }
    }
}

/// Replays retained events after `from` for a new watcher.
pub fn replay(state: &State, w: &Watcher, from: u64) -> Vec<WatchMsg> {
    state
        .history
        .iter()
        .filter(|e| e.rv > from && e.res == w.res)
        .filter_map(|e| classify(w, e))
        .collect()
}
