//! Storage capacity tracking (`--enable-capacity`, KEP-1472), as upstream's
//! `pkg/capacity`: one `storage.k8s.io/v1` CSIStorageCapacity object per
//! (topology segment, StorageClass) in the sidecar's namespace, with the
//! capacity the driver's `GetCapacity` reports, so that the scheduler places
//! WaitForFirstConsumer pods where their volumes fit.
//!
//! - [`decide`]: the pure decisions — the segments ([`decide::segments`]:
//!   the driver's topology keys on the nodes whose CSINode lists it, or one
//!   empty segment without topology), the wanted pairs ([`decide::wanted`]:
//!   WaitForFirstConsumer classes of this driver, Immediate ones too with
//!   `--capacity-for-immediate-binding`), the `GetCapacity` request, and the
//!   diff between wanted pairs, published objects and reported capacities
//!   ([`decide::reconcile`]: create / update only on change / keep / delete
//!   stale or duplicate, adopting objects of a previous run).
//! - [`owner`]: `--capacity-ownerref-level`: the owner of the objects, found
//!   by walking the controller chain from `POD_NAME` in `NAMESPACE`.
//! - this file: the wiring, and [`worker`]: the I/O. A work queue
//!   (`csistoragecapacity`, the Go image's name) of two kinds of keys,
//!   handled by `--capacity-threads` workers:
//!   - `Key::Pair(pair)` calls `GetCapacity` for one pair and creates or
//!     updates its object (only this pair's actions of the diff). Every
//!     pair is queued each `--capacity-poll-interval`.
//!   - `Key::Sweep` deletes objects no wanted pair needs and queues the
//!     pairs without a known capacity, without an object, or whose object
//!     shows other values (someone deleted or edited it). Queued by changes
//!     of StorageClasses and of our CSIStorageCapacity objects, at each
//!     poll, and when the segments change: Node and CSINode changes go to
//!     a second queue (`csitopology`, not in node mode), whose one worker
//!     computes the segments again and queues a sweep when one was added
//!     or removed, as the Go image's topology informer. An object deleted
//!     because its pair is not wanted is first confirmed by one live read
//!     of what that rests on (the class, or the segment's CSINode or Node,
//!     or the nodes carrying the segment's labels:
//!     [`decide::obsolete_because`]), read once per
//!     sweep for all the objects that share it, and the pair decided again
//!     with it ([`decide::still_obsolete`]): the class, Node and CSINode
//!     watches are not ordered with each other, and a class or CSINode
//!     whose event has not arrived must not unpublish a segment the
//!     scheduler needs.
//!
//!   Only one worker handles a given key at a time, and only `Key::Pair`
//!   creates, so a pair's object is never created twice; the objects we
//!   write are remembered at once (`objects`), before the watch reports
//!   them. A failed `GetCapacity` or write retries the key with the
//!   `--retry-interval-*` backoff; the published object stays as it is
//!   meanwhile.
//!
//! Ownership follows upstream: an object is ours when it carries our
//! driver and managed-by labels; with an owner, one lacking our owner
//! reference gets it added (adoption after turning owner references on).
//! Objects without a nodeTopology we would write (absent, or with
//! expressions) are deleted. A driver without topology gets one object per
//! class with an empty nodeTopology selector, which the scheduler reads as
//! "all nodes" (an absent one would mean "no node").
//!
//! A volume provisioned or deleted refreshes the pairs it probably
//! changed at once ([`Capacity::volume_changed`], fed by
//! `Shared::volume_events`), as upstream's provision wrapper.
//!
//! The gauges `csistoragecapacities_desired_goal`, `_desired_current` and
//! `csistoragecapacities_obsolete` follow each diff, as upstream's.
//!
//! Life cycle, as every loop: [`check_driver`] and [`Settings::from_options`]
//! at start-up (a driver without GET_CAPACITY, or missing `NAMESPACE` /
//! `POD_NAME`, stops the sidecar); [`new`] (before the caches start) resolves
//! the owner, registers the handlers and starts the watch of our objects
//! (label selector `csi.storage.k8s.io/drivername=<driver>,
//! csi.storage.k8s.io/managed-by=external-provisioner`, or
//! `external-provisioner-<node>` with `--node-deployment`, where only the
//! node's own segment is published: [`decide::managed_by`]; namespace
//! only);
//! [`Capacity::start`] (once this replica leads) starts the workers and the
//! poll; [`Capacity::shut_down`] stops them. Every decision is logged with
//! the object's name.

pub mod decide;
#[cfg(test)]
mod decide_tests;
pub mod owner;
pub mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::projection::{CSINode, CSIStorageCapacity, Node, StorageClass};
use csi_proto::v1::controller_service_capability::rpc::Type as ControllerCap;
use kube::Client;
use kube::api::Api;

use crate::api_calls::{ApiCall, call, in_own_namespace};
use crate::caches::{Caches, Kind};
use crate::cli::Options;
use crate::csi::{Driver, DriverInfo};
use crate::informer::{Change, Informer};
use crate::queue::WorkQueue;
use crate::shared::{EmbeddedLoop, Shared};

use decide::{Pair, Publisher, Reported, Wants};

/// The API calls of this loop (see [`crate::api_calls`]).
pub const API_CALLS: &[ApiCall] = &[
    // The shared caches it decides from (also the provisioner's); each is
    // also read live (get; nodes also a label-selected list) before an
    // object they no longer want is deleted ([`decide::LiveRead`]).
    call(
        "storage.k8s.io",
        "storageclasses",
        &["get", "list", "watch"],
    ),
    call("", "nodes", &["get", "list", "watch"]),
    call("storage.k8s.io", "csinodes", &["get", "list", "watch"]),
    // Its objects, in the sidecar's namespace: watched (by label), created,
    // replaced when a value changes, deleted when stale.
    in_own_namespace(
        "storage.k8s.io",
        "csistoragecapacities",
        &["list", "watch", "create", "update", "delete"],
    ),
    // `--capacity-ownerref-level`: the owner chain from POD_NAME, read once
    // at start ([`owner`]).
    in_own_namespace("", "pods", &["get"]),
    in_own_namespace("apps", "replicasets", &["get"]),
    in_own_namespace("apps", "statefulsets", &["get"]),
    in_own_namespace("apps", "daemonsets", &["get"]),
    in_own_namespace("apps", "deployments", &["get"]),
];

/// Settings of the loop, from the flags and the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `--capacity-threads`.
    pub threads: usize,
    /// `--capacity-poll-interval`.
    pub poll_interval: Duration,
    /// `--capacity-for-immediate-binding`.
    pub immediate_binding: bool,
    /// Segments from node topology (driver has VOLUME_ACCESSIBILITY_CONSTRAINTS
    /// and the Topology gate is on), else one object per class.
    pub topology: bool,
    /// `NAMESPACE`: where the objects live.
    pub namespace: String,
    /// `POD_NAME` and `--capacity-ownerref-level`, when the level is >= 0.
    pub owner: Option<OwnerSpec>,
    /// `--node-deployment`: this node's name and its segment (the driver's
    /// `NodeGetInfo` topology; empty without one). Its objects are labelled
    /// for this node and only this segment is published, as upstream's
    /// fixed node topology, so the sidecars of different nodes never touch
    /// each other's objects.
    pub node: Option<NodeCapacity>,
}

/// The node a node-local sidecar publishes capacity for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCapacity {
    pub name: String,
    pub segment: BTreeMap<String, String>,
}

/// Where the owner chain starts and how far up it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerSpec {
    pub pod: String,
    pub level: u32,
}

/// Why capacity tracking cannot start; the sidecar exits.
#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error(
        "--enable-capacity: the CSI driver {driver} does not report the GET_CAPACITY controller \
capability, so there is no capacity to publish; remove --enable-capacity"
    )]
    NoGetCapacity { driver: String },
    #[error(
        "--enable-capacity needs the {var} environment variable ({why}); set it from the \
downward API (fieldRef {field})"
    )]
    MissingEnv {
        var: &'static str,
        why: &'static str,
        field: &'static str,
    },
    #[error("--capacity-ownerref-level={level}: {source}")]
    Owner {
        level: u32,
        #[source]
        source: Box<owner::OwnerError>,
    },
}

/// Refuses `--enable-capacity` with a driver that cannot report capacity.
pub fn check_driver(info: &DriverInfo) -> Result<(), CapacityError> {
    if info.controller.has(ControllerCap::GetCapacity) {
        Ok(())
    } else {
        Err(CapacityError::NoGetCapacity {
            driver: info.name.clone(),
        })
    }
}

impl Settings {
    /// The settings for `options`; `env` reads an environment variable.
    pub fn from_options(
        options: &Options,
        topology: bool,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Settings, CapacityError> {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        let namespace = var("NAMESPACE").ok_or(CapacityError::MissingEnv {
            var: "NAMESPACE",
            why: "the namespace of the CSIStorageCapacity objects",
            field: "metadata.namespace",
        })?;
        let owner = match u32::try_from(options.capacity_ownerref_level) {
            Err(_) => None,
            Ok(level) => Some(OwnerSpec {
                pod: var("POD_NAME").ok_or(CapacityError::MissingEnv {
                    var: "POD_NAME",
                    why: "--capacity-ownerref-level >= 0 starts the owner chain at this pod",
                    field: "metadata.name",
                })?,
                level,
            }),
        };
        Ok(Settings {
            threads: options.capacity_threads.max(1) as usize,
            poll_interval: options.capacity_poll_interval,
            immediate_binding: options.capacity_for_immediate_binding,
            topology,
            namespace,
            owner,
            node: None,
        })
    }
}

/// A unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// Delete what is not wanted; queue pairs that need a poll or an object.
    Sweep,
    /// Poll one pair and publish its capacity.
    Pair(Pair),
}

/// The running loop.
pub struct Capacity {
    client: Client,
    driver: Driver,
    caches: Arc<Caches>,
    publisher: Publisher,
    /// How the wanted pairs are derived from the caches.
    wants: Wants,
    settings: Settings,
    informer: Arc<Informer<CSIStorageCapacity>>,
    /// Our objects by name: the watch's view, overlaid with our own writes
    /// as soon as they are answered.
    objects: Arc<Mutex<BTreeMap<String, Arc<CSIStorageCapacity>>>>,
    /// The last capacity reported per pair.
    reported: Mutex<HashMap<Pair, Reported>>,
    /// `csistoragecapacity`: pairs to poll and sweeps.
    queue: WorkQueue<Key>,
    /// `csitopology` (not in node mode, whose segment is fixed): Node and
    /// CSINode changes, whose one worker computes the segments again and
    /// queues a sweep when one was added or removed, as the Go image's
    /// topology informer.
    topology: Option<WorkQueue<()>>,
    /// The segments the topology worker computed last.
    segments: Mutex<Option<BTreeSet<decide::Segment>>>,
    stopped: AtomicBool,
}

/// The Go image's names of the two queues of this loop.
pub const CAPACITY_QUEUE: &str = "csistoragecapacity";
pub const TOPOLOGY_QUEUE: &str = "csitopology";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether `new` is at least as recent as `old` (resourceVersions compared
/// as numbers when both are; otherwise the newcomer wins).
fn newer(new: &CSIStorageCapacity, old: &CSIStorageCapacity) -> bool {
    let rv = |o: &CSIStorageCapacity| {
        o.metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok())
    };
    match (rv(new), rv(old)) {
        (Some(n), Some(o)) => n >= o,
        _ => true,
    }
}

fn remember(
    objects: &Mutex<BTreeMap<String, Arc<CSIStorageCapacity>>>,
    object: &CSIStorageCapacity,
) {
    let Some(name) = object.metadata.name.clone() else {
        return;
    };
    let mut objects = lock(objects);
    if objects.get(&name).is_none_or(|old| newer(object, old)) {
        objects.insert(name, Arc::new(object.clone()));
    }
}

/// Resolves the owner, registers the cache handlers and starts the watch of
/// our objects. Call before the caches start; then [`Capacity::start`].
pub async fn new(
    shared: &Shared,
    driver: Driver,
    settings: Settings,
) -> Result<Arc<Capacity>, CapacityError> {
    let owner = match &settings.owner {
        None => None,
        Some(spec) => {
            let found = owner::lookup(&shared.client, &settings.namespace, &spec.pod, spec.level)
                .await
                .map_err(|source| CapacityError::Owner {
                    level: spec.level,
                    source: Box::new(source),
                })?;
            tracing::info!(owner = %format!("{}/{} {} ({})", found.api_version, found.kind, found.name, found.uid), level = spec.level, "CSIStorageCapacity objects will be owned by this object");
            Some(found)
        }
    };
    let wants = Wants {
        driver: shared.driver_name.clone(),
        topology: settings.topology,
        immediate: settings.immediate_binding,
        fixed_segment: settings
            .node
            .as_ref()
            .map(|node| decide::Segment(node.segment.clone())),
    };
    let publisher = Publisher {
        driver: shared.driver_name.clone(),
        managed_by: decide::managed_by(settings.node.as_ref().map(|n| n.name.as_str())),
        namespace: settings.namespace.clone(),
        owner,
    };
    let caches = Arc::clone(&shared.caches);
    // A node-local sidecar publishes its own segment: no Node or CSINode
    // cache (upstream does not watch them there either).
    if settings.node.is_some() {
        caches.want(&[Kind::Classes]);
    } else {
        caches.want(&[Kind::Classes, Kind::Nodes, Kind::CsiNodes]);
    }
    let queue: WorkQueue<Key> = WorkQueue::new(CAPACITY_QUEUE, shared.backoff);
    {
        let queue = queue.clone();
        caches.classes.on_change(move |_| queue.add(Key::Sweep));
    }
    let topology = settings
        .node
        .is_none()
        .then(|| WorkQueue::new(TOPOLOGY_QUEUE, shared.backoff));
    if let Some(topology) = &topology {
        let nodes = topology.clone();
        caches.nodes.on_change(move |_| nodes.add(()));
        let csi_nodes = topology.clone();
        caches.csi_nodes.on_change(move |_| csi_nodes.add(()));
    }
    let informer: Arc<Informer<CSIStorageCapacity>> = Arc::new(Informer::new());
    let objects: Arc<Mutex<BTreeMap<String, Arc<CSIStorageCapacity>>>> = Arc::default();
    {
        let queue = queue.clone();
        let objects = Arc::clone(&objects);
        informer.on_change(move |change| {
            match change {
                Change::Applied(object) => remember(&objects, object),
                Change::Deleted(object) => {
                    if let Some(name) = &object.metadata.name {
                        lock(&objects).remove(name);
                    }
                }
            }
            queue.add(Key::Sweep);
        });
    }
    {
        let informer = Arc::clone(&informer);
        let api: Api<CSIStorageCapacity> =
            Api::namespaced(shared.client.clone(), &settings.namespace);
        let config = crate::caches::list_watch_config().labels(&publisher.label_selector());
        tokio::spawn(async move { informer.run(api, config, None).await });
    }
    let capacity = Arc::new(Capacity {
        client: shared.client.clone(),
        driver,
        caches,
        publisher,
        wants,
        settings,
        informer,
        objects,
        reported: Mutex::default(),
        queue,
        topology,
        segments: Mutex::default(),
        stopped: AtomicBool::new(false),
    });
    {
        let capacity = Arc::clone(&capacity);
        shared
            .volume_events
            .listen(move |pv| capacity.volume_changed(pv));
    }
    Ok(capacity)
}

impl EmbeddedLoop for Capacity {
    /// Starts the workers and the poll, once our objects are listed. Call
    /// once this replica leads and the shared caches are filled.
    fn start(self: Arc<Self>) {
        let this = Arc::clone(&self);
        tokio::spawn(async move {
            this.informer.wait_until_ready().await;
            if this.stopped.load(Ordering::Relaxed) {
                return;
            }
            tracing::info!(
                namespace = %this.settings.namespace,
                workers = this.settings.threads,
                poll_interval = %crate::duration::format_go_duration(this.settings.poll_interval),
                topology = this.settings.topology,
                immediate_binding = this.settings.immediate_binding,
                "capacity loop running"
            );
            let ctx = Arc::clone(&this);
            this.queue.run_workers(this.settings.threads, move |key| {
                let ctx = Arc::clone(&ctx);
                async move { ctx.process(&key).await }
            });
            if let Some(topology) = &this.topology {
                // Once at start, as the Go image's first sync.
                topology.add(());
                let ctx = Arc::clone(&this);
                topology.run_workers(1, move |()| {
                    let ctx = Arc::clone(&ctx);
                    async move { ctx.sync_topology() }
                });
            }
            let mut tick = tokio::time::interval(this.settings.poll_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if this.stopped.load(Ordering::Relaxed) {
                    return;
                }
                this.poll_all();
            }
        });
    }

    /// Stops taking work; a key being handled finishes.
    fn shut_down(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        self.queue.shut_down();
        if let Some(topology) = &self.topology {
            topology.shut_down();
        }
    }
}

impl Capacity {
    /// A volume was provisioned or deleted: refresh the capacities it
    /// probably changed now rather than at the next poll (upstream's
    /// provision wrapper).
    pub fn volume_changed(&self, pv: &crate::projection::PersistentVolume) {
        if self.stopped.load(Ordering::Relaxed) {
            return;
        }
        let spec = pv.spec.as_ref();
        let affinity = spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref());
        let class = spec
            .and_then(|s| s.storage_class_name.as_deref())
            .unwrap_or_default();
        for pair in decide::pairs_touched_by(&self.wanted(), affinity, class) {
            self.queue.add(Key::Pair(pair));
        }
    }

    /// The `csitopology` work: the segments from the Node and CSINode
    /// caches, and a sweep when one was added or removed (a Node or
    /// CSINode change that moves no segment changes no wanted pair).
    fn sync_topology(&self) {
        let cached = self.cached();
        let (_, nodes, csi_nodes) = cached.refs();
        let now = self.wants.segments(&nodes, &csi_nodes);
        let mut last = lock(&self.segments);
        let (added, removed) = decide::segment_changes(last.as_ref(), &now);
        if added.is_empty() && removed.is_empty() {
            tracing::trace!("topology unchanged");
            return;
        }
        let list = |segments: &[&decide::Segment]| {
            segments
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        };
        tracing::debug!(added = %list(&added), removed = %list(&removed), "topology changed");
        *last = Some(now);
        drop(last);
        self.queue.add(Key::Sweep);
    }

    fn poll_all(&self) {
        self.queue.add(Key::Sweep);
        for pair in self.wanted() {
            self.queue.add(Key::Pair(pair));
        }
    }

    /// The wanted pairs, from the shared caches.
    fn wanted(&self) -> BTreeSet<Pair> {
        self.cached().wanted(&self.wants)
    }

    /// What the shared caches hold of the objects the wanted pairs come
    /// from.
    fn cached(&self) -> Cached {
        Cached {
            classes: self.caches.classes.store().state(),
            nodes: self.caches.nodes.store().state(),
            csi_nodes: self.caches.csi_nodes.store().state(),
        }
    }
}

/// One read of the class, Node and CSINode caches.
struct Cached {
    classes: Vec<Arc<StorageClass>>,
    nodes: Vec<Arc<Node>>,
    csi_nodes: Vec<Arc<CSINode>>,
}

impl Cached {
    fn refs(&self) -> (Vec<&StorageClass>, Vec<&Node>, Vec<&CSINode>) {
        (
            self.classes.iter().map(|c| &**c).collect(),
            self.nodes.iter().map(|n| &**n).collect(),
            self.csi_nodes.iter().map(|n| &**n).collect(),
        )
    }

    fn wanted(&self, wants: &Wants) -> BTreeSet<Pair> {
        let (classes, nodes, csi_nodes) = self.refs();
        wants.pairs(&classes, &nodes, &csi_nodes)
    }
}
