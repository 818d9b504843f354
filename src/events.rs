//! Kubernetes Events on the objects we act on, written as core/v1 Events the
//! way client-go's recorder writes them (so `kubectl describe` shows them),
//! at most once per transition: a PVC whose provisioning keeps failing with
//! the same error gets one `ProvisioningFailed` event, not one per retry.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, Resource, ResourceExt};

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
        self.last
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(uid);
    }

    /// Objects remembered.
    pub fn len(&self) -> usize {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The reference to put in `involvedObject`.
pub fn object_reference<K>(obj: &K) -> ObjectReference
where
    K: Resource<DynamicType = ()>,
{
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: obj.meta().name.clone(),
        namespace: obj.meta().namespace.clone(),
        uid: obj.meta().uid.clone(),
        resource_version: obj.meta().resource_version.clone(),
        field_path: None,
    }
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
    host: &str,
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
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: Some(host.to_owned()).filter(|h| !h.is_empty()),
        }),
        reporting_component: Some(component.to_owned()),
        reporting_instance: Some(host.to_owned()),
        ..Event::default()
    }
}

/// Writes events; a failure to write one is logged and otherwise ignored,
/// because an event must never block or fail the operation it describes.
pub struct Recorder {
    client: Client,
    component: String,
    host: String,
    filter: TransitionFilter,
}

impl Recorder {
    pub fn new(client: Client, component: impl Into<String>, host: impl Into<String>) -> Self {
        Self {
            client,
            component: component.into(),
            host: host.into(),
            filter: TransitionFilter::default(),
        }
    }

    /// Records the event unless the same one was the last recorded for this
    /// object. Returns whether it was written.
    pub async fn record<K>(
        &self,
        obj: &K,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) -> bool
    where
        K: Resource<DynamicType = ()>,
    {
        let uid = obj.uid().unwrap_or_default();
        if !self.filter.should_record(&uid, reason, message) {
            return false;
        }
        let event = build_event(
            object_reference(obj),
            event_type,
            reason,
            message,
            &self.component,
            &self.host,
            Timestamp::now(),
        );
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    object = %obj.name_any(),
                    reason,
                    error = %e,
                    "could not record event"
                );
                // Let the next identical event try again.
                self.filter.unrecord(&uid, reason);
                false
            }
        }
    }

    /// Records one of the provisioning flow's notes (reason and wording as
    /// upstream's).
    pub async fn record_note<K>(&self, obj: &K, note: &crate::provision::events::EventNote) -> bool
    where
        K: Resource<DynamicType = ()>,
    {
        let event_type = match note.event_type {
            crate::provision::events::EventType::Normal => EventType::Normal,
            crate::provision::events::EventType::Warning => EventType::Warning,
        };
        self.record(obj, event_type, note.reason, &note.message)
            .await
    }

    /// Drops the memory of an object that is gone.
    pub fn forget(&self, uid: &str) {
        self.filter.forget(uid);
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
            "node-1",
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
            "",
            now,
        );
        assert_eq!(ev.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        assert_eq!(ev.source.and_then(|s| s.host), None);
    }
}
