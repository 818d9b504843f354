//! The write-ahead journal of in-flight `CreateVolume` calls.
//!
//! Upstream leaks a backend volume when the sidecar dies after
//! `CreateVolume` started and the claim is deleted before it restarts
//! (kubernetes-csi/external-provisioner#486): "in progress" lived only in
//! memory. Here every claim uid is written to a ConfigMap owned by the
//! sidecar *before* its first `CreateVolume`, together with the frozen
//! request (without secrets) and the secret reference. After a restart every
//! journal entry is resumed: if the claim still exists provisioning simply
//! continues; if it is gone the same `CreateVolume` is repeated (the volume
//! name is deterministic, so a volume that was created is returned, one that
//! was not is created) and then deleted. An entry is removed once the PV is
//! saved or the volume is known not to exist.
//!
//! Cost: entries of concurrent claims share one write, and removals ride on
//! the next write or a short idle flush, so a burst of N claims costs far
//! fewer than N extra writes; a lone claim costs two (add, remove). A PVC
//! finalizer would cost two writes per claim always, and would touch users'
//! objects.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use base64::Engine as _;
use csi_proto::v1::CreateVolumeRequest;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::provision::SecretRef;

/// One in-flight claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    pub namespace: String,
    pub name: String,
    pub volume_name: String,
    /// The frozen `CreateVolumeRequest`, protobuf in base64, secrets empty.
    pub request: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_namespace: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal entry for claim uid {uid}: {reason}")]
    BadEntry { uid: String, reason: String },
    #[error("journal ConfigMap {namespace}/{name}: {source}")]
    Api {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("journal writer stopped")]
    Stopped,
}

impl JournalError {
    /// RBAC refuses access to the journal (the upstream sidecar's stock
    /// rules grant nothing on ConfigMaps).
    pub fn is_forbidden(&self) -> bool {
        matches!(self, JournalError::Api { source: kube::Error::Api(s), .. } if s.code == 403)
    }
}

impl JournalEntry {
    /// Freezes `request` (secrets stripped: they never leave memory).
    pub fn new(
        namespace: &str,
        name: &str,
        request: &CreateVolumeRequest,
        secret: Option<&SecretRef>,
    ) -> Self {
        let mut stored = request.clone();
        stored.secrets.clear();
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            volume_name: request.name.clone(),
            request: base64::engine::general_purpose::STANDARD.encode(stored.encode_to_vec()),
            secret_name: secret.map(|s| s.name.clone()),
            secret_namespace: secret.map(|s| s.namespace.clone()),
        }
    }

    pub fn request(&self) -> Result<CreateVolumeRequest, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.request)
            .map_err(|e| format!("request is not base64: {e}"))?;
        CreateVolumeRequest::decode(bytes.as_slice())
            .map_err(|e| format!("request does not decode: {e}"))
    }

    pub fn secret(&self) -> Option<SecretRef> {
        match (&self.secret_name, &self.secret_namespace) {
            (Some(name), Some(namespace)) => Some(SecretRef {
                name: name.clone(),
                namespace: namespace.clone(),
            }),
            _ => None,
        }
    }
}

/// Reads every entry of the ConfigMap's data. Entries that do not parse are
/// returned as errors so the caller can log them by uid; they are kept in
/// the ConfigMap (a human may need them to find a leaked volume).
pub fn parse_entries(
    data: &BTreeMap<String, String>,
) -> (BTreeMap<String, JournalEntry>, Vec<JournalError>) {
    let mut entries = BTreeMap::new();
    let mut errors = Vec::new();
    for (uid, json) in data {
        match serde_json::from_str::<JournalEntry>(json) {
            Ok(entry) => match entry.request() {
                Ok(_) => {
                    entries.insert(uid.clone(), entry);
                }
                Err(reason) => errors.push(JournalError::BadEntry {
                    uid: uid.clone(),
                    reason,
                }),
            },
            Err(e) => errors.push(JournalError::BadEntry {
                uid: uid.clone(),
                reason: e.to_string(),
            }),
        }
    }
    (entries, errors)
}

/// Applies additions and removals to the ConfigMap data. Returns whether
/// anything changed (an unchanged map needs no write).
pub fn apply_changes(
    data: &mut BTreeMap<String, String>,
    adds: &BTreeMap<String, JournalEntry>,
    removes: &[String],
) -> bool {
    let mut changed = false;
    for uid in removes {
        if !adds.contains_key(uid) {
            changed |= data.remove(uid).is_some();
        }
    }
    for (uid, entry) in adds {
        // Serialising a plain struct of strings cannot fail.
        let json = serde_json::to_string(entry).unwrap_or_default();
        if data.get(uid) != Some(&json) {
            data.insert(uid.clone(), json);
            changed = true;
        }
    }
    changed
}

/// A name for the journal ConfigMap derived from the driver name, valid as
/// a DNS subdomain.
pub fn journal_name(driver: &str) -> String {
    let sanitized: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let name = format!("{}-provisioner-journal", sanitized.trim_matches(['-', '.']));
    name.chars().take(253).collect()
}

enum Command {
    Add(String, JournalEntry, oneshot::Sender<Result<(), String>>),
    Remove(String),
}

/// The handle workers use. Cheap to clone.
#[derive(Clone)]
pub struct Journal {
    commands: mpsc::UnboundedSender<Command>,
}

impl Journal {
    /// Records `uid` and waits until it is stored. Only after this returns
    /// `Ok` may `CreateVolume` be called for the claim.
    pub async fn record(&self, uid: &str, entry: JournalEntry) -> Result<(), JournalError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Add(uid.to_owned(), entry, tx))
            .map_err(|_| JournalError::Stopped)?;
        match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(JournalError::BadEntry {
                uid: uid.to_owned(),
                reason,
            }),
            Err(_) => Err(JournalError::Stopped),
        }
    }

    /// Forgets `uid` (its PV is saved or its volume is gone). Flushed lazily:
    /// a stale entry only causes a harmless check after a restart.
    pub fn forget(&self, uid: &str) {
        let _ = self.commands.send(Command::Remove(uid.to_owned()));
    }
}

/// The writer's inbox until [`JournalStore::start_with`] runs it.
pub struct JournalInbox(mpsc::UnboundedReceiver<Command>);

/// A journal handle and the inbox its writer will read.
pub fn channel() -> (Journal, JournalInbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Journal { commands: tx }, JournalInbox(rx))
}

/// Owns the journal ConfigMap: loads it at start-up and serialises writes.
pub struct JournalStore {
    api: Api<ConfigMap>,
    name: String,
    namespace: String,
    current: Option<ConfigMap>,
}

/// Removals wait at most this long for a write to ride on.
const IDLE_FLUSH: Duration = Duration::from_secs(2);

impl JournalStore {
    pub fn new(client: kube::Client, namespace: &str, driver: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: journal_name(driver),
            namespace: namespace.to_owned(),
            current: None,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn api_error(&self, source: kube::Error) -> JournalError {
        JournalError::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// Reads the journal (creating nothing yet).
    pub async fn load(&mut self) -> Result<BTreeMap<String, JournalEntry>, JournalError> {
        self.current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.api_error(e))?;
        let data = self
            .current
            .as_ref()
            .and_then(|cm| cm.data.clone())
            .unwrap_or_default();
        let (entries, errors) = parse_entries(&data);
        for e in errors {
            tracing::error!(journal = %self.name, "{e}; kept for inspection");
        }
        Ok(entries)
    }

    /// Writes the changes, retrying on conflicts from a fresh read.
    async fn write(
        &mut self,
        adds: &BTreeMap<String, JournalEntry>,
        removes: &[String],
    ) -> Result<(), JournalError> {
        for _attempt in 0..5 {
            let mut cm = match self.current.clone() {
                Some(cm) => cm,
                None => ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        labels: Some(BTreeMap::from([(
                            "app.kubernetes.io/managed-by".to_owned(),
                            "csi-provisioner".to_owned(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                },
            };
            let mut data = cm.data.take().unwrap_or_default();
            if !apply_changes(&mut data, adds, removes) && cm.metadata.resource_version.is_some() {
                return Ok(());
            }
            cm.data = Some(data);
            let result = if cm.metadata.resource_version.is_some() {
                self.api
                    .replace(&self.name, &PostParams::default(), &cm)
                    .await
            } else {
                self.api.create(&PostParams::default(), &cm).await
            };
            match result {
                Ok(saved) => {
                    self.current = Some(saved);
                    return Ok(());
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    // Stale copy (or created meanwhile): re-read and retry.
                    self.current = self
                        .api
                        .get_opt(&self.name)
                        .await
                        .map_err(|e| self.api_error(e))?;
                }
                Err(e) => return Err(self.api_error(e)),
            }
        }
        Err(JournalError::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source: kube::Error::Api(Box::new(kube::core::Status::failure(
                "conflicts persisted after 5 attempts",
                "Conflict",
            ))),
        })
    }

    /// Starts the writer task and returns the handle for workers.
    pub fn start(self) -> Journal {
        let (journal, inbox) = channel();
        self.start_with(inbox);
        journal
    }

    /// Runs without a journal: every record is accepted at once and nothing
    /// is written. For a sidecar that may not read or write its ConfigMap;
    /// it then has the upstream sidecar's guarantees, no more (a claim
    /// deleted while its CreateVolume is in flight across a restart leaks
    /// the volume, upstream #486).
    pub fn start_disabled(inbox: JournalInbox) {
        let mut rx = inbox.0;
        tokio::spawn(async move {
            while let Some(command) = rx.recv().await {
                if let Command::Add(_, _, done) = command {
                    let _ = done.send(Ok(()));
                }
            }
        });
    }

    /// Starts the writer task on an inbox made earlier with [`channel`]
    /// (the handle can exist before the journal is loaded, e.g. while
    /// waiting for leadership).
    pub fn start_with(self, inbox: JournalInbox) {
        tokio::spawn(self.run(inbox.0));
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        let mut pending_removes: Vec<String> = Vec::new();
        loop {
            let first = if pending_removes.is_empty() {
                rx.recv().await
            } else {
                match tokio::time::timeout(IDLE_FLUSH, rx.recv()).await {
                    Ok(cmd) => cmd,
                    Err(_) => {
                        let removes = std::mem::take(&mut pending_removes);
                        if let Err(e) = self.write(&BTreeMap::new(), &removes).await {
                            tracing::warn!("{e}; will retry removing {} entries", removes.len());
                            pending_removes = removes;
                        }
                        continue;
                    }
                }
            };
            let Some(first) = first else { return };
            // Take everything already waiting: one write for the batch.
            let mut batch = vec![first];
            while let Ok(cmd) = rx.try_recv() {
                batch.push(cmd);
            }
            let mut adds = BTreeMap::new();
            let mut waiters: HashMap<String, Vec<oneshot::Sender<Result<(), String>>>> =
                HashMap::new();
            for cmd in batch {
                match cmd {
                    Command::Add(uid, entry, done) => {
                        pending_removes.retain(|r| r != &uid);
                        adds.insert(uid.clone(), entry);
                        waiters.entry(uid).or_default().push(done);
                    }
                    Command::Remove(uid) => {
                        adds.remove(&uid);
                        for done in waiters.remove(&uid).unwrap_or_default() {
                            // Removed before it was written: the caller gave
                            // up; it must not call CreateVolume.
                            let _ = done.send(Err("removed before it was stored".to_owned()));
                        }
                        pending_removes.push(uid);
                    }
                }
            }
            if adds.is_empty() {
                continue;
            }
            let removes = std::mem::take(&mut pending_removes);
            let result = self.write(&adds, &removes).await;
            if result.is_err() {
                pending_removes = removes;
            }
            let outcome = result.map_err(|e| e.to_string());
            for done in waiters.into_values().flatten() {
                let _ = done.send(outcome.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi_proto::v1::CapacityRange;

    fn request(name: &str) -> CreateVolumeRequest {
        CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            parameters: [("kind".to_owned(), "fast".to_owned())].into(),
            secrets: [("password".to_owned(), "hunter2".to_owned())].into(),
            ..CreateVolumeRequest::default()
        }
    }

    #[test]
    fn entries_freeze_the_request_without_secrets() {
        let secret = SecretRef {
            name: "creds".into(),
            namespace: "ns".into(),
        };
        let entry = JournalEntry::new("ns", "data", &request("pvc-1"), Some(&secret));
        assert_eq!(entry.volume_name, "pvc-1");
        let json = serde_json::to_string(&entry).expect("json");
        assert!(!json.contains("hunter2"), "{json}");
        let back = entry.request().expect("decodes");
        assert!(back.secrets.is_empty());
        assert_eq!(
            back.parameters.get("kind").map(String::as_str),
            Some("fast")
        );
        assert_eq!(entry.secret(), Some(secret));
        let no_secret = JournalEntry::new("ns", "data", &request("pvc-1"), None);
        assert_eq!(no_secret.secret(), None);
        assert!(
            !serde_json::to_string(&no_secret)
                .expect("json")
                .contains("secret")
        );
    }

    #[test]
    fn parse_keeps_good_entries_and_reports_bad_ones() {
        let good = serde_json::to_string(&JournalEntry::new("ns", "a", &request("pvc-a"), None))
            .expect("json");
        let mut bad_request = JournalEntry::new("ns", "b", &request("pvc-b"), None);
        bad_request.request = "!!!".into();
        let data = BTreeMap::from([
            ("uid-a".to_owned(), good),
            (
                "uid-b".to_owned(),
                serde_json::to_string(&bad_request).expect("json"),
            ),
            ("uid-c".to_owned(), "{not json".to_owned()),
        ]);
        let (entries, errors) = parse_entries(&data);
        assert_eq!(entries.keys().collect::<Vec<_>>(), vec!["uid-a"]);
        assert_eq!(errors.len(), 2);
        assert!(errors.iter().any(|e| e.to_string().contains("uid-b")));
    }

    #[test]
    fn changes_apply_and_report_whether_a_write_is_needed() {
        let entry = JournalEntry::new("ns", "a", &request("pvc-a"), None);
        let mut data = BTreeMap::new();
        let adds = BTreeMap::from([("uid-a".to_owned(), entry.clone())]);
        assert!(apply_changes(&mut data, &adds, &[]));
        assert!(!apply_changes(&mut data, &adds, &[]), "same entry again");
        assert!(
            !apply_changes(&mut data, &BTreeMap::new(), &["uid-x".into()]),
            "unknown removal"
        );
        // A removal and an add of the same uid in one batch: the add wins.
        assert!(!apply_changes(&mut data, &adds, &["uid-a".into()]));
        assert!(apply_changes(
            &mut data,
            &BTreeMap::new(),
            &["uid-a".into()]
        ));
        assert!(data.is_empty());
    }

    #[test]
    fn journal_names_are_valid() {
        assert_eq!(
            journal_name("hostpath.csi.k8s.io"),
            "hostpath.csi.k8s.io-provisioner-journal"
        );
        assert_eq!(
            journal_name("Weird_Driver"),
            "weird-driver-provisioner-journal"
        );
        assert!(journal_name(&"x".repeat(300)).len() <= 253);
    }
}
