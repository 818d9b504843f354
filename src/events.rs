//! Kubernetes Events on the objects we act on, written as core/v1 Events the
//! way client-go's recorder writes them (so `kubectl describe` shows them),
//! at most once per transition: a PVC whose provisioning keeps failing with
//! the same error gets one `ProvisioningFailed` event, not one per retry.
//!
//! Events never delay the work they describe. Recording one only queues it
//! ([`EventQueue`]); background senders write them with what is left of the
//! client's rate budget ([`crate::ratelimit`]: PV creates and journal writes
//! go first). In the queue a newer event of an object replaces an older one
//! of the same reason, and a `Provisioning` note waits
//! [`PROVISIONING_NOTE_DELAY`] and is superseded by the outcome when that
//! comes first: a volume made in a second gets one event
//! (`ProvisioningSucceeded`), not two, and a claim whose CreateVolume takes
//! longer still shows that it is being worked on. When the queue is full
//! the oldest event is dropped and counted
//! (`csi_provisioner_events_dropped_total`), as client-go's broadcaster
//! drops events under pressure.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// An event to record on the object at hand: the decisions (e.g.
/// `src/provision/events.rs`) word it, [`Recorder::record_note`] sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventNote {
    pub event_type: EventType,
    pub reason: &'static str,
    pub message: String,
}

/// Remembers, per object uid and reason, the last message recorded, so a
/// repeat of the same event is suppressed even when other reasons are
/// recorded in between (each retry of a failing provisioning records
/// `Provisioning` and `ProvisioningFailed`; neither repeats). A different
/// message for a reason is a transition and is recorded. Bounded by the
/// number of live objects: callers [`forget`](Self::forget) an object when
/// it is gone.
#[derive(Debug, Default)]
pub struct TransitionFilter {
    last: Mutex<HashMap<String, HashMap<String, String>>>,
}

impl TransitionFilter {
    /// True when `message` differs from the last one recorded for `uid` and
    /// `reason` (and remembers it).
    pub fn should_record(&self, uid: &str, reason: &str, message: &str) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let by_reason = last.entry(uid.to_owned()).or_default();
        if by_reason.get(reason).is_some_and(|m| m == message) {
            return false;
        }
        by_reason.insert(reason.to_owned(), message.to_owned());
        crate::metrics::set_remembered("event_filter", last.len());
        true
    }

    /// Lets the next `reason` event of `uid` through (its write failed).
    fn unrecord(&self, uid: &str, reason: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(by_reason) = last.get_mut(uid) {
            by_reason.remove(reason);
        }
    }

    pub fn forget(&self, uid: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.remove(uid);
        crate::metrics::set_remembered("event_filter", last.len());
    }

    /// Objects remembered.
    pub fn len(&self) -> usize {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An object events can be about: any API type, and the cached volumes and
/// claims (whose metadata is a [`crate::projection::Meta`]).
pub trait Involved {
    /// The reference to put in `involvedObject`.
    fn involved(&self) -> ObjectReference;
}

impl<K: Resource<DynamicType = ()>> Involved for K {
    fn involved(&self) -> ObjectReference {
        object_reference(self)
    }
}

fn cached_reference<S: crate::projection::Cached>(obj: &S) -> ObjectReference {
    use k8s_openapi::Resource as _;
    let meta = obj.cached_meta();
    reference(
        S::Object::API_VERSION,
        S::Object::KIND,
        [
            meta.name.as_deref(),
            meta.namespace.as_deref(),
            meta.uid.as_deref(),
            meta.resource_version.as_deref(),
        ],
    )
}

impl Involved for crate::projection::PersistentVolume {
    fn involved(&self) -> ObjectReference {
        cached_reference(self)
    }
}

impl Involved for crate::projection::PersistentVolumeClaim {
    fn involved(&self) -> ObjectReference {
        cached_reference(self)
    }
}

/// The reference to put in `involvedObject`.
pub fn object_reference<K>(obj: &K) -> ObjectReference
where
    K: Resource<DynamicType = ()>,
{
    let meta = obj.meta();
    reference(
        &K::api_version(&()),
        &K::kind(&()),
        [
            meta.name.as_deref(),
            meta.namespace.as_deref(),
            meta.uid.as_deref(),
            meta.resource_version.as_deref(),
        ],
    )
}

/// `involvedObject` from the type and the object's name, namespace, uid
/// and resourceVersion.
fn reference(api_version: &str, kind: &str, identity: [Option<&str>; 4]) -> ObjectReference {
    let [name, namespace, uid, resource_version] = identity.map(|field| field.map(str::to_owned));
    ObjectReference {
        api_version: Some(api_version.to_owned()),
        kind: Some(kind.to_owned()),
        name,
        namespace,
        uid,
        resource_version,
        field_path: None,
    }
}

/// The event source of the Go sidecar (sig-storage-lib-external-provisioner):
/// `<driver>_<host>_<uuid>`, a new uuid per process so two replicas on one
/// host tell apart. The Go recorder sets no host: the whole identity is in
/// the component (and `reportingController`), `reportingInstance` is empty.
pub fn source_component(driver: &str, host: &str, instance: uuid::Uuid) -> String {
    format!("{driver}_{host}_{instance}")
}

/// Builds the Event object client-go would write for one occurrence.
/// Cluster-scoped objects (PVs) get their events in `default`, as client-go
/// does.
pub fn build_event(
    involved: ObjectReference,
    event_type: EventType,
    reason: &str,
    message: &str,
    component: &str,
    now: Timestamp,
) -> Event {
    let namespace = involved
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let base = involved
        .name
        .clone()
        .unwrap_or_else(|| "unknown".to_owned());
    let nanos = now.as_nanosecond();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{base}.{nanos:x}")),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: involved,
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(event_type.as_str().to_owned()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: None::<MicroTime>,
        // As the Go recorder: the whole identity is in the component (see
        // [`source_component`]), no host, an empty reporting instance.
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: None,
        }),
        reporting_component: Some(component.to_owned()),
        reporting_instance: Some(String::new()),
        ..Event::default()
    }
}

/// How long a `Provisioning` note waits in the queue: long enough that a
/// fast provisioning reports only its outcome.
pub const PROVISIONING_NOTE_DELAY: Duration = Duration::from_secs(2);

/// The reason superseded by any later event of the same object.
const SUPERSEDED_REASON: &str = "Provisioning";

/// Events waiting to be sent; the most `client-go` keeps queued too.
pub const QUEUE_CAPACITY: usize = 1000;

/// Events written at once.
const SENDERS: usize = 4;

/// One event waiting to be written.
#[derive(Debug, Clone)]
pub struct Queued {
    pub uid: String,
    pub reason: String,
    pub event: Event,
    /// Not sent before this instant.
    pub not_before: Instant,
}

/// What [`EventQueue::push`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    Queued,
    /// It replaced one or more queued events of the same object.
    Coalesced,
    /// The queue was full: the oldest event (its object's uid and reason)
    /// was dropped to make room.
    DroppedOldest {
        uid: String,
        reason: String,
    },
}

/// The queue of events to write: pure, so its rules are tested alone.
#[derive(Debug)]
pub struct EventQueue {
    items: VecDeque<Queued>,
    capacity: usize,
    /// How many of `items` each object has: a push scans the queue for
    /// events to replace only when its object has some, and only as far
    /// back as it takes to meet them all. Under a backlog the queue holds
    /// hundreds of other objects' events, and a scan of all of them per
    /// push compared every one of their uids.
    per_object: HashMap<String, usize>,
}

impl EventQueue {
    pub fn new(capacity: usize) -> Self {
        Self {
            items: VecDeque::new(),
            capacity: capacity.max(1),
            per_object: HashMap::new(),
        }
    }

    /// Counts `uid`'s events down by `n` (they left the queue).
    fn left(&mut self, uid: &str, n: usize) {
        if let Some(count) = self.per_object.get_mut(uid) {
            *count = count.saturating_sub(n);
            if *count == 0 {
                self.per_object.remove(uid);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Queues `item`; a queued event of the same object with the same
    /// reason, or a `Provisioning` note of it, is replaced.
    pub fn push(&mut self, item: Queued) -> Pushed {
        let mut coalesced = false;
        if let Some(&queued_of_object) = self.per_object.get(&item.uid) {
            // From the newest back, and only until every queued event of the
            // object is found: the ones to replace were mostly queued a
            // moment ago (the `Provisioning` note of a claim whose outcome
            // this is), behind hundreds of older events under a backlog.
            let mut replaced: Vec<usize> = Vec::new();
            let mut seen = 0;
            for (index, queued) in self.items.iter().enumerate().rev() {
                if queued.uid != item.uid {
                    continue;
                }
                if queued.reason == item.reason || queued.reason == SUPERSEDED_REASON {
                    replaced.push(index);
                }
                seen += 1;
                if seen == queued_of_object {
                    break;
                }
            }
            // Indices in descending order: each removal leaves the indices
            // still to remove where they were.
            for &index in &replaced {
                self.items.remove(index);
            }
            self.left(&item.uid, replaced.len());
            coalesced = !replaced.is_empty();
        }
        let mut pushed = if coalesced {
            Pushed::Coalesced
        } else {
            Pushed::Queued
        };
        if self.items.len() >= self.capacity
            && let Some(dropped) = self.items.pop_front()
        {
            self.left(&dropped.uid, 1);
            pushed = Pushed::DroppedOldest {
                uid: dropped.uid,
                reason: dropped.reason,
            };
        }
        *self.per_object.entry(item.uid.clone()).or_default() += 1;
        self.items.push_back(item);
        pushed
    }

    /// Takes the oldest event that may be sent at `now`.
    pub fn pop_ready(&mut self, now: Instant) -> Option<Queued> {
        let index = self.items.iter().position(|q| q.not_before <= now)?;
        let taken = self.items.remove(index)?;
        self.left(&taken.uid, 1);
        Some(taken)
    }

    /// When the next held event becomes sendable (`None`: nothing queued).
    pub fn next_ready_at(&self) -> Option<Instant> {
        self.items.iter().map(|q| q.not_before).min()
    }
}

/// Writes events in the background; a failure to write one is logged and
/// otherwise ignored, because an event must never block or fail the
/// operation it describes.
pub struct Recorder {
    client: Client,
    component: String,
    filter: Arc<TransitionFilter>,
    queue: Arc<Mutex<EventQueue>>,
    /// Events taken from the queue whose write has not returned yet.
    sending: Arc<AtomicUsize>,
    wake: Arc<Notify>,
    /// The senders, started with the first event (a recorder may be made
    /// outside a runtime).
    senders: OnceLock<()>,
}

impl Recorder {
    pub fn new(client: Client, component: impl Into<String>) -> Self {
        Self {
            client,
            component: component.into(),
            filter: Arc::default(),
            queue: Arc::new(Mutex::new(EventQueue::new(QUEUE_CAPACITY))),
            sending: Arc::default(),
            wake: Arc::default(),
            senders: OnceLock::new(),
        }
    }

    /// Queues the event unless the same one was the last recorded for this
    /// object. Returns whether it was queued.
    pub async fn record<K>(
        &self,
        obj: &K,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> bool
    where
        K: Involved,
    {
        let involved = obj.involved();
        let uid = involved.uid.clone().unwrap_or_default();
        if !self.filter.should_record(&uid, reason, message) {
            return false;
        }
        let name = involved.name.clone().unwrap_or_default();
        let event = build_event(
            involved,
            event_type,
            reason,
            message,
            &self.component,
            Timestamp::now(),
        );
        let delay = if reason == SUPERSEDED_REASON {
            PROVISIONING_NOTE_DELAY
        } else {
            Duration::ZERO
        };
        let pushed = self
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Queued {
                uid,
                reason: reason.to_owned(),
                event,
                not_before: Instant::now() + delay,
            });
        match pushed {
            Pushed::Queued => {}
            Pushed::Coalesced => crate::metrics::count_event_coalesced(),
            Pushed::DroppedOldest {
                uid: dropped_uid,
                reason: dropped_reason,
            } => {
                crate::metrics::count_event_dropped();
                // Never written: the same event next time is a transition
                // to show, not a repeat to suppress.
                self.filter.unrecord(&dropped_uid, &dropped_reason);
                tracing::debug!(object = %name, reason, "event queue full: dropped the oldest event");
            }
        }
        self.start_senders();
        self.wake.notify_one();
        true
    }

    fn start_senders(&self) {
        self.senders.get_or_init(|| {
            for _ in 0..SENDERS {
                let client = self.client.clone();
                let queue = Arc::clone(&self.queue);
                let wake = Arc::clone(&self.wake);
                let filter = Arc::clone(&self.filter);
                let sending = Arc::clone(&self.sending);
                tokio::spawn(send_events(client, queue, sending, wake, filter));
            }
        });
    }

    /// Waits (at most `timeout`) for the queued events to be sent, and for
    /// those being written: at shutdown, so the outcome of the last
    /// operations is not lost (an event taken from the queue is counted as
    /// sending in the same critical section, so none falls between).
    pub async fn flush(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.unsent() > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Events queued or being written.
    fn unsent(&self) -> usize {
        let queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.len() + self.sending.load(Ordering::SeqCst)
    }

    /// Events queued and not yet sent.
    pub fn queued(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Records one of the provisioning flow's notes (reason and wording as
    /// upstream's).
    pub async fn record_note<K>(&self, obj: &K, note: &EventNote) -> bool
    where
        K: Involved,
    {
        self.record(obj, note.event_type, note.reason, &note.message)
            .await
    }

    /// Drops the memory of an object that is gone.
    pub fn forget(&self, uid: &str) {
        self.filter.forget(uid);
    }
}

/// An event being written (see [`Recorder::flush`]).
struct Sending<'a>(&'a AtomicUsize);

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One sender: takes the next sendable event, writes it (the client's rate
/// limiter gives events only spare slots), repeats.
async fn send_events(
    client: Client,
    queue: Arc<Mutex<EventQueue>>,
    sending: Arc<AtomicUsize>,
    wake: Arc<Notify>,
    filter: Arc<TransitionFilter>,
) {
    loop {
        let (next, held_until) = {
            let mut queue = queue.lock().unwrap_or_else(|p| p.into_inner());
            let next = queue.pop_ready(Instant::now());
            if next.is_some() {
                sending.fetch_add(1, Ordering::SeqCst);
            }
            (next, queue.next_ready_at())
        };
        let Some(item) = next else {
            match held_until {
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        () = wake.notified() => {}
                    }
                }
                None => wake.notified().await,
            }
            continue;
        };
        // Counted until the write returns, however it ends.
        let _sending = Sending(&sending);
        // Another sender may find more work.
        wake.notify_one();
        let namespace = item.event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
        if let Err(e) = api.create(&PostParams::default(), &item.event).await {
            tracing::warn!(
                object = %item.event.involved_object.name.as_deref().unwrap_or_default(),
                reason = %item.reason,
                error = %e,
                "could not record event"
            );
            // Let the next identical event try again.
            filter.unrecord(&item.uid, &item.reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

    #[test]
    fn only_transitions_pass_the_filter() {
        let f = TransitionFilter::default();
        assert!(f.should_record("u1", "Provisioning", "started"));
        assert!(f.should_record("u1", "ProvisioningFailed", "boom"));
        // Each retry records both again: both suppressed.
        for _ in 0..5 {
            assert!(!f.should_record("u1", "Provisioning", "started"), "retry");
            assert!(
                !f.should_record("u1", "ProvisioningFailed", "boom"),
                "retry"
            );
        }
        assert!(f.should_record("u1", "ProvisioningFailed", "other error"));
        assert!(
            f.should_record("u1", "ProvisioningFailed", "boom"),
            "changed back"
        );
        assert!(f.should_record("u1", "ProvisioningSucceeded", "ok"));
        assert!(
            f.should_record("u2", "ProvisioningFailed", "boom"),
            "per object"
        );
        assert_eq!(f.len(), 2);
        f.unrecord("u2", "ProvisioningFailed");
        assert!(
            f.should_record("u2", "ProvisioningFailed", "boom"),
            "after a failed write"
        );
        f.forget("u1");
        assert_eq!(f.len(), 1);
        assert!(f.should_record("u1", "ProvisioningFailed", "boom"));
    }

    #[test]
    fn events_look_like_client_go_ones() {
        let pvc = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("apps".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolumeClaim::default()
        };
        let now = Timestamp::from_second(1_700_000_000).expect("time");
        let ev = build_event(
            object_reference(&pvc),
            EventType::Normal,
            "Provisioning",
            "External provisioner is provisioning volume for claim \"apps/data\"",
            "hostpath.csi.k8s.io_node-1",
            now,
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("apps"));
        assert!(
            ev.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("data."))
        );
        assert_eq!(
            ev.involved_object.kind.as_deref(),
            Some("PersistentVolumeClaim")
        );
        assert_eq!(ev.involved_object.api_version.as_deref(), Some("v1"));
        assert_eq!(ev.involved_object.uid.as_deref(), Some("uid-1"));
        assert_eq!(ev.type_.as_deref(), Some("Normal"));
        assert_eq!(ev.count, Some(1));
        assert_eq!(
            ev.source.and_then(|s| s.component).as_deref(),
            Some("hostpath.csi.k8s.io_node-1")
        );

        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                ..ObjectMeta::default()
            },
            ..PersistentVolume::default()
        };
        let ev = build_event(
            object_reference(&pv),
            EventType::Warning,
            "VolumeFailedDelete",
            "x",
            "c",
            now,
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.reporting_component.as_deref(), Some("c"));
        assert_eq!(ev.reporting_instance.as_deref(), Some(""));
        assert_eq!(ev.source.and_then(|s| s.host), None);
    }

    #[test]
    fn the_source_is_the_go_sidecars() {
        let instance = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(
            source_component("hostpath.csi.k8s.io", "node-1", instance),
            "hostpath.csi.k8s.io_node-1_01234567-89ab-cdef-0123-456789abcdef"
        );
    }

    fn queued(uid: &str, reason: &str, at: Instant) -> Queued {
        Queued {
            uid: uid.to_owned(),
            reason: reason.to_owned(),
            event: Event::default(),
            not_before: at,
        }
    }

    #[test]
    fn the_outcome_supersedes_a_provisioning_note_still_queued() {
        let t0 = Instant::now();
        let mut q = EventQueue::new(10);
        assert_eq!(
            q.push(queued("u1", "Provisioning", t0 + PROVISIONING_NOTE_DELAY)),
            Pushed::Queued
        );
        assert_eq!(
            q.push(queued("u2", "Provisioning", t0 + PROVISIONING_NOTE_DELAY)),
            Pushed::Queued
        );
        assert_eq!(
            q.push(queued("u1", "ProvisioningSucceeded", t0)),
            Pushed::Coalesced
        );
        assert_eq!(q.len(), 2);
        // u1's outcome goes at once; u2's note is held.
        assert_eq!(
            q.pop_ready(t0).map(|i| i.reason),
            Some("ProvisioningSucceeded".to_owned())
        );
        assert!(q.pop_ready(t0).is_none());
        assert_eq!(q.next_ready_at(), Some(t0 + PROVISIONING_NOTE_DELAY));
        // A slow provisioning shows its note once the delay passed.
        let later = t0 + PROVISIONING_NOTE_DELAY;
        assert_eq!(q.pop_ready(later).map(|i| i.uid), Some("u2".to_owned()));
        assert!(q.is_empty());
    }

    #[test]
    fn a_newer_event_of_the_same_reason_replaces_the_queued_one_others_stay() {
        let t0 = Instant::now();
        let mut q = EventQueue::new(10);
        q.push(queued("u1", "ProvisioningFailed", t0));
        q.push(queued("u1", "VolumeFailedDelete", t0));
        assert_eq!(
            q.push(queued("u1", "ProvisioningFailed", t0)),
            Pushed::Coalesced
        );
        let reasons: Vec<String> = std::iter::from_fn(|| q.pop_ready(t0))
            .map(|i| i.reason)
            .collect();
        assert_eq!(reasons, ["VolumeFailedDelete", "ProvisioningFailed"]);
    }

    /// The per-object counts only decide whether a push scans the queue:
    /// over a long mixed sequence of pushes, drops and pops the queue
    /// answers exactly as one that scans on every push, and the counts
    /// match what it holds.
    #[test]
    fn pushes_and_pops_answer_as_a_queue_that_scans_on_every_push() {
        let t0 = Instant::now();
        let mut q = EventQueue::new(7);
        let mut model: VecDeque<Queued> = VecDeque::new();
        let reasons = [
            "Provisioning",
            "ProvisioningSucceeded",
            "ProvisioningFailed",
        ];
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for step in 0..5_000 {
            if next(4) == 0 {
                let now = t0 + Duration::from_millis(next(3));
                let expected = model
                    .iter()
                    .position(|i| i.not_before <= now)
                    .and_then(|at| model.remove(at));
                let got = q.pop_ready(now);
                assert_eq!(
                    got.map(|i| (i.uid, i.reason)),
                    expected.map(|i| (i.uid, i.reason)),
                    "step {step}"
                );
            } else {
                let item = queued(
                    &format!("u{}", next(5)),
                    reasons[next(3) as usize],
                    t0 + Duration::from_millis(next(3)),
                );
                let before = model.len();
                model.retain(|i| {
                    !(i.uid == item.uid
                        && (i.reason == item.reason || i.reason == SUPERSEDED_REASON))
                });
                let mut expected = if model.len() < before {
                    Pushed::Coalesced
                } else {
                    Pushed::Queued
                };
                if model.len() >= 7
                    && let Some(dropped) = model.pop_front()
                {
                    expected = Pushed::DroppedOldest {
                        uid: dropped.uid,
                        reason: dropped.reason,
                    };
                }
                model.push_back(item.clone());
                assert_eq!(q.push(item), expected, "step {step}");
            }
            let mut counts: HashMap<String, usize> = HashMap::new();
            for i in &q.items {
                *counts.entry(i.uid.clone()).or_default() += 1;
            }
            assert_eq!(q.per_object, counts, "step {step}");
            assert_eq!(q.len(), model.len(), "step {step}");
        }
    }

    #[test]
    fn a_full_queue_drops_its_oldest_event() {
        let t0 = Instant::now();
        let mut q = EventQueue::new(2);
        q.push(queued("u1", "A", t0));
        q.push(queued("u2", "A", t0));
        assert_eq!(
            q.push(queued("u3", "A", t0)),
            Pushed::DroppedOldest {
                uid: "u1".to_owned(),
                reason: "A".to_owned()
            }
        );
        let uids: Vec<String> = std::iter::from_fn(|| q.pop_ready(t0))
            .map(|i| i.uid)
            .collect();
        assert_eq!(uids, ["u2", "u3"]);
    }
}
