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
//! Storage and cost ([`segments`]): the entries live in ConfigMaps of
//! bounded size, *segments* `<driver>-provisioner-journal-<n>`. Entries of
//! concurrent claims share one write of the open segment; removals ride on
//! its next write or a flush at most [`IDLE_FLUSH`] after the first one
//! waiting; a full segment is closed, not rewritten while running, and
//! deleted once none of its entries is needed. A graceful shutdown
//! ([`Journal::flush`]) writes every removal still waiting and rewrites the
//! closed segments that hold entries no longer needed: an entry that
//! outlives its PV is replayed by every later start. So a write
//! costs the same however many claims are in flight (up to
//! [`Limits::max_entries`]; beyond that a claim gets an event and waits),
//! and a burst of N claims costs far fewer than N extra writes. A PVC
//! finalizer would cost two writes per claim always, and would touch users'
//! objects. The single ConfigMap `<driver>-provisioner-journal` of earlier
//! versions is read as a closed segment, so an upgrade loses nothing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use backon::RetryableWithContext as _;
use base64::Engine as _;
use csi_proto::v1::CreateVolumeRequest;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::provision::SecretRef;

pub mod segments;

pub use segments::{Limits, Rejection};
use segments::{Plan, Segments, Write};

/// One in-flight claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    pub namespace: String,
    pub name: String,
    pub volume_name: String,
    /// The frozen `CreateVolumeRequest`, protobuf in base64, secrets empty;
    /// deflated first when [`JournalEntry::compressed`].
    pub request: String,
    /// The request is deflated (large requests: a topology that lists
    /// thousands of nodes compresses to a small fraction).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub compressed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_namespace: Option<String>,
    /// The class's reclaim policy was Retain (see `Frozen::retain` in
    /// `src/provisioner/operations.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retain: bool,
    /// CSI migration (see `Frozen::migrated` in
    /// `src/provisioner/operations.rs`); absent in entries of earlier
    /// versions, which read as false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub migrated: bool,
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
    #[error("journal entry for claim uid {uid} not recorded: {rejection}")]
    Rejected { uid: String, rejection: Rejection },
    #[error("journal writer stopped")]
    Stopped,
    #[error("cannot write the journal's pending removals: {0}")]
    NotFlushed(String),
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
        let bytes = stored.encode_to_vec();
        let deflated = (bytes.len() > COMPRESS_ABOVE)
            .then(|| deflate(&bytes))
            .flatten()
            .filter(|d| d.len() < bytes.len());
        let compressed = deflated.is_some();
        let bytes = deflated.unwrap_or(bytes);
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            volume_name: request.name.clone(),
            request: base64::engine::general_purpose::STANDARD.encode(bytes),
            compressed,
            secret_name: secret.map(|s| s.name.clone()),
            secret_namespace: secret.map(|s| s.namespace.clone()),
            retain: false,
            migrated: false,
        }
    }

    /// Marks the operation as one of CSI migration.
    pub fn migrated(mut self, migrated: bool) -> Self {
        self.migrated = migrated;
        self
    }

    /// Marks the operation's volume as one to keep when its claim is gone.
    pub fn retained(mut self, retain: bool) -> Self {
        self.retain = retain;
        self
    }

    pub fn request(&self) -> Result<CreateVolumeRequest, String> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.request)
            .map_err(|e| format!("request is not base64: {e}"))?;
        let bytes = if self.compressed {
            inflate(&bytes).map_err(|e| format!("request does not inflate: {e}"))?
        } else {
            bytes
        };
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

/// Requests larger than this (protobuf bytes) are deflated.
const COMPRESS_ABOVE: usize = 4096;

fn deflate(bytes: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder =
        flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).ok()?;
    encoder.finish().ok()
}

fn inflate(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    // A frozen request is at most a few MiB; refuse to inflate a bomb.
    flate2::read::DeflateDecoder::new(bytes)
        .take(64 << 20)
        .read_to_end(&mut out)?;
    Ok(out)
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
    Add(String, JournalEntry, oneshot::Sender<Result<(), AddError>>),
    Remove(String),
    /// Write every removal now (graceful shutdown).
    Flush(oneshot::Sender<Result<(), String>>),
}

/// Why an entry was not recorded.
#[derive(Debug, Clone)]
enum AddError {
    Rejected(Rejection),
    Failed(String),
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
            Ok(Err(AddError::Rejected(rejection))) => Err(JournalError::Rejected {
                uid: uid.to_owned(),
                rejection,
            }),
            Ok(Err(AddError::Failed(reason))) => Err(JournalError::BadEntry {
                uid: uid.to_owned(),
                reason,
            }),
            Err(_) => Err(JournalError::Stopped),
        }
    }

    /// Forgets `uid` (its PV is saved or its volume is gone). Written
    /// lazily (with the next record, or [`IDLE_FLUSH`] later), and at the
    /// latest by [`Journal::flush`]: an entry left behind is replayed after
    /// a restart.
    pub fn forget(&self, uid: &str) {
        let _ = self.commands.send(Command::Remove(uid.to_owned()));
    }

    /// Writes every removal forgotten before this call, and rewrites the
    /// closed segments that still hold entries no longer needed; completes
    /// once they are written. For a graceful shutdown, after the workers
    /// have stopped: what the journal then holds is exactly what is still
    /// in flight.
    pub async fn flush(&self) -> Result<(), JournalError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Flush(tx))
            .map_err(|_| JournalError::Stopped)?;
        rx.await
            .map_err(|_| JournalError::Stopped)?
            .map_err(JournalError::NotFlushed)
    }
}

/// The writer's inbox until [`JournalStore::start_with`] runs it.
pub struct JournalInbox(mpsc::UnboundedReceiver<Command>);

#[cfg(test)]
impl JournalInbox {
    /// What was sent to the writer so far, as `add UID`, `remove UID` or
    /// `flush` (tests of the senders).
    pub(crate) fn sent(&mut self) -> Vec<String> {
        let mut sent = Vec::new();
        while let Ok(command) = self.0.try_recv() {
            sent.push(match command {
                Command::Add(uid, ..) => format!("add {uid}"),
                Command::Remove(uid) => format!("remove {uid}"),
                Command::Flush(_) => "flush".to_owned(),
            });
        }
        sent
    }
}

/// A journal handle and the inbox its writer will read.
pub fn channel() -> (Journal, JournalInbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Journal { commands: tx }, JournalInbox(rx))
}

/// The label every segment carries (and the single journal ConfigMap of
/// earlier versions carried): what [`JournalStore::load`] lists.
const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "csi-provisioner");

/// Owns the journal's ConfigMaps ([`segments`]): loads them at start-up
/// and serialises writes.
pub struct JournalStore {
    api: Api<ConfigMap>,
    name: String,
    namespace: String,
    segments: Segments,
    /// Segments to delete whose deletion failed: retried with the next
    /// write or idle flush.
    pending_deletes: BTreeSet<String>,
    /// How many claims wait for a worker; none known: never a backlog.
    backlog: Option<Backlog>,
}

/// Removals wait at most this long for a write to ride on (counted from the
/// first removal waiting, however many follow).
pub const IDLE_FLUSH: Duration = Duration::from_secs(2);

/// After the first record of a batch, how long more may join it while
/// claims wait for a worker (a backlog). Each of them already waits for a
/// whole provisioning to end before a worker takes it, so holding the
/// records a little longer costs them next to nothing,
/// while the API server, which is what paces a backlog, is spared most of
/// the journal's writes (docs/design.md, "The journal's writes").
const BACKLOG_WINDOW: Duration = Duration::from_millis(250);

/// A backlog's batch is written as soon as it holds this many records:
/// past this a longer wait saves little (a write per this many volumes)
/// and holds workers back from the driver.
const BACKLOG_BATCH: usize = 50;

/// How many claims wait for a worker now ([`backlog_of`] of the
/// provisioning queue): the writer's one view of the load.
pub type Backlog = std::sync::Arc<dyn Fn() -> usize + Send + Sync>;

/// The backlog of a queue holding `queued` claims while `busy` of its
/// `workers` process one: a claim queued while a worker is free is taken at
/// once and is no backlog. Counted as one, a claim caught between its add
/// and a free worker's take held the next records for the whole
/// [`BACKLOG_WINDOW`] (p99 233 ms against the Go image's 32 ms at 50
/// claims/s, docs/benchmarks.md).
pub fn backlog_of(queued: usize, busy: usize, workers: usize) -> usize {
    if busy >= workers.max(1) { queued } else { 0 }
}

/// How long a batch that started with a record stays open, and how many
/// records close it early, given `waiting` claims without a worker.
/// Without a backlog there is no window: the record is written at once,
/// and those that arrive while that write is under way share the next
/// one (group commit). A window there only added its length to every
/// claim's latency at a steady rate (docs/benchmarks.md).
fn batch_bounds(waiting: usize) -> (Duration, usize) {
    if waiting == 0 {
        (Duration::ZERO, 1)
    } else {
        (BACKLOG_WINDOW, BACKLOG_BATCH)
    }
}

impl JournalStore {
    pub fn new(client: kube::Client, namespace: &str, driver: &str) -> Self {
        Self::with_limits(client, namespace, driver, Limits::default())
    }

    pub fn with_limits(
        client: kube::Client,
        namespace: &str,
        driver: &str,
        limits: Limits,
    ) -> Self {
        let name = journal_name(driver);
        Self {
            api: Api::namespaced(client, namespace),
            segments: Segments::new(&name, limits),
            name,
            namespace: namespace.to_owned(),
            pending_deletes: BTreeSet::new(),
            backlog: None,
        }
    }

    /// Tells the writer how many claims wait for a worker, so that it
    /// batches longer under a backlog ([`BACKLOG_WINDOW`]).
    pub fn with_backlog(mut self, backlog: Backlog) -> Self {
        self.backlog = Some(backlog);
        self
    }

    /// The base name: segments are `<name>-<n>`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    fn api_error(&self, name: &str, source: kube::Error) -> JournalError {
        JournalError::Api {
            namespace: self.namespace.clone(),
            name: name.to_owned(),
            source,
        }
    }

    /// Reads every segment (one list; creating nothing yet) and returns the
    /// entries to resume.
    pub async fn load(&mut self) -> Result<BTreeMap<String, JournalEntry>, JournalError> {
        let list = self
            .api
            .list(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
            .await
            .map_err(|e| self.api_error(&self.name.clone(), e))?;
        let mut found: Vec<(u64, ConfigMap)> = list
            .items
            .into_iter()
            .filter_map(|cm| {
                let seq = self.segments.sequence_of(cm.metadata.name.as_deref()?)?;
                Some((seq, cm))
            })
            .collect();
        // Older segments first: a uid written twice resumes its latest entry.
        found.sort_by_key(|(seq, _)| *seq);
        let mut recovered = BTreeMap::new();
        for (_, cm) in found {
            let name = cm.metadata.name.clone().unwrap_or_default();
            let data = cm.data.unwrap_or_default();
            let (entries, errors) = parse_entries(&data);
            for e in errors {
                tracing::error!(journal = %name, "{e}; kept for inspection");
            }
            // Unparsable entries keep their segment alive (a human may need
            // them to find a leaked volume).
            self.segments.load(&name, data.keys().cloned());
            recovered.extend(entries);
        }
        Ok(recovered)
    }

    /// Creates or replaces one segment (unconditionally: only the leader
    /// writes the journal, and a segment is only ever written by the
    /// process that planned it).
    async fn put(
        &self,
        name: &str,
        data: &BTreeMap<String, String>,
        exists: bool,
    ) -> Result<(), JournalError> {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_owned(),
                    MANAGED_BY.1.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(data.clone()),
            ..ConfigMap::default()
        };
        let first = if exists {
            self.api.replace(name, &PostParams::default(), &cm).await
        } else {
            self.api.create(&PostParams::default(), &cm).await
        };
        let second = match first {
            Ok(_) => return Ok(()),
            // Deleted by someone: write it again, whole, so its entries are
            // durable again (docs/design.md, hazard 5).
            Err(kube::Error::Api(s)) if exists && s.code == 404 => {
                tracing::warn!(journal = %name, "journal segment was deleted by someone; writing it again");
                self.api.create(&PostParams::default(), &cm).await
            }
            // Left by an attempt whose reply was lost.
            Err(kube::Error::Api(s)) if !exists && s.code == 409 => {
                self.api.replace(name, &PostParams::default(), &cm).await
            }
            Err(e) => return Err(self.api_error(name, e)),
        };
        second.map(|_| ()).map_err(|e| self.api_error(name, e))
    }

    async fn delete(&self, name: &str) -> Result<(), JournalError> {
        match self.api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(self.api_error(name, e)),
        }
    }

    /// Writes a batch. `Ok` once every add is durable (refused adds are in
    /// the returned plan); the segment layout is adopted only then.
    async fn write(
        &mut self,
        adds: &BTreeMap<String, String>,
        removes: &BTreeSet<String>,
    ) -> Result<Plan, JournalError> {
        let (plan, next) = self.segments.plan(adds, removes);
        for write in &plan.writes {
            match write {
                Write::Create { name, data } => self.put(name, data, false).await?,
                Write::Replace { name, data } => self.put(name, data, true).await?,
                Write::Delete { .. } => {}
            }
        }
        self.segments = next;
        for write in &plan.writes {
            if let Write::Delete { name } = write {
                self.pending_deletes.insert(name.clone());
            }
        }
        self.delete_pending().await;
        Ok(plan)
    }

    /// Writes `removes` (and any deletion still owed), then rewrites each
    /// closed segment holding entries no longer needed with only those
    /// still needed. One list of the segments (the journal may list and
    /// write ConfigMaps, not get them), one write per stale segment.
    async fn flush(&mut self, removes: &BTreeSet<String>) -> Result<(), JournalError> {
        self.write(&BTreeMap::new(), removes).await?;
        let stale = self.segments.stale_segments();
        if !stale.is_empty() {
            let list = self
                .api
                .list(&ListParams::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)))
                .await
                .map_err(|e| self.api_error(&self.name.clone(), e))?;
            for cm in list.items {
                let Some(name) = cm.metadata.name else {
                    continue;
                };
                let data = cm.data.unwrap_or_default();
                let Some(kept) = self.segments.compacted(&name, &data) else {
                    continue;
                };
                if kept.len() < data.len() {
                    if kept.is_empty() {
                        self.delete(&name).await?;
                    } else {
                        self.put(&name, &kept, true).await?;
                    }
                    tracing::debug!(journal = %name, removed = data.len() - kept.len(), "journal segment rewritten without the entries that are done");
                }
                self.segments.mark_compacted(&name);
            }
            // Not listed: gone, nothing stale left in it.
            for name in stale {
                self.segments.mark_compacted(&name);
            }
        }
        Ok(())
    }

    async fn delete_pending(&mut self) {
        for name in std::mem::take(&mut self.pending_deletes) {
            if let Err(e) = self.delete(&name).await {
                tracing::warn!("{e}; will delete it later");
                self.pending_deletes.insert(name);
            }
        }
    }

    /// Starts the writer task and returns the handle for workers.
    pub fn start(self) -> Journal {
        let (journal, inbox) = channel();
        self.start_with(inbox);
        journal
    }

    /// Runs without a journal: every record is accepted at once and nothing
    /// is written. For a sidecar that may not read or write its ConfigMaps;
    /// it then has the upstream sidecar's guarantees, no more (a claim
    /// deleted while its CreateVolume is in flight across a restart leaks
    /// the volume, upstream #486).
    pub fn start_disabled(inbox: JournalInbox) {
        let mut rx = inbox.0;
        tokio::spawn(async move {
            while let Some(command) = rx.recv().await {
                match command {
                    Command::Add(_, _, done) => {
                        let _ = done.send(Ok(()));
                    }
                    Command::Flush(done) => {
                        let _ = done.send(Ok(()));
                    }
                    Command::Remove(_) => {}
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
        let mut pending_removes: BTreeSet<String> = BTreeSet::new();
        // When the removals (and segment deletions) waiting now are written
        // at the latest: counted from the first one, so that a steady
        // stream of removals without records cannot put them off.
        let mut flush_at: Option<tokio::time::Instant> = None;
        loop {
            let waiting = !pending_removes.is_empty()
                || !self.pending_deletes.is_empty()
                || self.segments.has_unneeded();
            if !waiting {
                flush_at = None;
            } else if flush_at.is_none() {
                flush_at = Some(tokio::time::Instant::now() + IDLE_FLUSH);
            }
            let first = match flush_at {
                None => rx.recv().await,
                Some(at) => match tokio::time::timeout_at(at, rx.recv()).await {
                    Ok(cmd) => cmd,
                    Err(_) => {
                        flush_at = None;
                        let removes = std::mem::take(&mut pending_removes);
                        if let Err(e) = self.write(&BTreeMap::new(), &removes).await {
                            tracing::warn!("{e}; will retry removing {} entries", removes.len());
                            pending_removes = removes;
                        }
                        continue;
                    }
                },
            };
            let first = match first {
                None => return,
                // A removal alone is no reason to write: it waits for the
                // next record's write, or `flush_at`. Written at once, it
                // would close the batch that the next record opens (a
                // worker forgets one claim just before it records its next
                // one) after no window at all.
                Some(Command::Remove(uid)) => {
                    pending_removes.insert(uid);
                    continue;
                }
                Some(command) => command,
            };
            let mut batch = vec![first];
            if matches!(batch[0], Command::Add(..)) {
                let waiting = self.backlog.as_ref().map_or(0, |backlog| backlog());
                let (window, enough) = batch_bounds(waiting);
                let until = tokio::time::Instant::now() + window;
                let mut adds = 1;
                while adds < enough {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(cmd)) => {
                            adds += usize::from(matches!(cmd, Command::Add(..)));
                            batch.push(cmd);
                        }
                        // Closed: what came is written, the next turn ends.
                        Ok(None) | Err(_) => break,
                    }
                }
            }
            // Take everything already waiting: one write for the batch.
            while let Ok(cmd) = rx.try_recv() {
                batch.push(cmd);
            }
            let mut adds: BTreeMap<String, String> = BTreeMap::new();
            let mut waiters: HashMap<String, Vec<oneshot::Sender<Result<(), AddError>>>> =
                HashMap::new();
            let mut flushes = Vec::new();
            // Uids recorded again whose earlier entry was to be removed: if
            // the new entry is not written, the earlier one must still go
            // (its operation is over; left, the next start replays it).
            let mut superseded: BTreeSet<String> = BTreeSet::new();
            for cmd in batch {
                match cmd {
                    Command::Add(uid, entry, done) => {
                        if pending_removes.remove(&uid) {
                            superseded.insert(uid.clone());
                        }
                        // Serialising a plain struct of strings cannot fail.
                        adds.insert(
                            uid.clone(),
                            serde_json::to_string(&entry).unwrap_or_default(),
                        );
                        waiters.entry(uid).or_default().push(done);
                    }
                    Command::Remove(uid) => {
                        adds.remove(&uid);
                        superseded.remove(&uid);
                        for done in waiters.remove(&uid).unwrap_or_default() {
                            // Removed before it was written: the caller gave
                            // up; it must not call CreateVolume.
                            let _ = done.send(Err(AddError::Failed(
                                "removed before it was stored".to_owned(),
                            )));
                        }
                        pending_removes.insert(uid);
                    }
                    Command::Flush(done) => flushes.push(done),
                }
            }
            if !adds.is_empty() {
                let removes = std::mem::take(&mut pending_removes);
                let written = self.write(&adds, &removes).await;
                tracing::debug!(
                    records = adds.len(),
                    removals = removes.len(),
                    ok = written.is_ok(),
                    "journal batch written"
                );
                match written {
                    Ok(plan) => {
                        for (uid, rejection) in plan.rejected {
                            if superseded.contains(&uid) {
                                pending_removes.insert(uid.clone());
                            }
                            for done in waiters.remove(&uid).unwrap_or_default() {
                                let _ = done.send(Err(AddError::Rejected(rejection.clone())));
                            }
                        }
                        for done in waiters.into_values().flatten() {
                            let _ = done.send(Ok(()));
                        }
                    }
                    Err(e) => {
                        pending_removes = removes;
                        pending_removes.extend(superseded);
                        let reason = e.to_string();
                        for done in waiters.into_values().flatten() {
                            let _ = done.send(Err(AddError::Failed(reason.clone())));
                        }
                    }
                }
            }
            if !flushes.is_empty() {
                // Asked again while anyone waits (the caller bounds the
                // wait: the shutdown grace), so that a write failing once
                // does not leave the entries behind. A retry on `backon`;
                // the journal and its pending removals go into each attempt
                // and come back out, whole, with its result.
                let ((journal, removals), flushed) =
                    (|(mut journal, mut pending): (Self, BTreeSet<String>)| async move {
                        let removes = std::mem::take(&mut pending);
                        let attempt = match journal.flush(&removes).await {
                            Ok(()) => match journal.pending_deletes.first() {
                                // Emptied but still there: its entries
                                // would be replayed.
                                Some(name) => {
                                    Err(format!("journal segment {name} could not be deleted"))
                                }
                                None => Ok(()),
                            },
                            Err(e) => {
                                pending.extend(removes);
                                Err(e.to_string())
                            }
                        };
                        ((journal, pending), attempt)
                    })
                    .retry(flush_retry_delays())
                    .context((self, std::mem::take(&mut pending_removes)))
                    .when(|_| flushes.iter().any(|done| !done.is_closed()))
                    .notify(|e, delay| {
                        tracing::warn!(error = %e, ?delay, "cannot write the journal's removals; trying again");
                    })
                    .await;
                self = journal;
                pending_removes = removals;
                for done in flushes {
                    let _ = done.send(flushed.clone());
                }
            }
        }
    }
}

/// The first wait before a failed [`Journal::flush`] is tried again.
const FLUSH_RETRY: Duration = Duration::from_millis(50);

/// The waits between tries of a failed [`Journal::flush`]: from
/// [`FLUSH_RETRY`], doubling, at most a second, without end (the caller
/// bounds the wait). Exact, as `backon` takes any iterator of waits: its
/// `ExponentialBuilder` multiplies in `f32`, off by nanoseconds.
fn flush_retry_delays() -> impl backon::Backoff {
    std::iter::successors(Some(FLUSH_RETRY), |delay| {
        Some((*delay * 2).min(Duration::from_secs(1)))
    })
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
    fn a_failed_flush_is_tried_again_after_doubling_waits_up_to_a_second() {
        let ms = Duration::from_millis;
        assert_eq!(
            flush_retry_delays().take(8).collect::<Vec<_>>(),
            [
                ms(50),
                ms(100),
                ms(200),
                ms(400),
                ms(800),
                ms(1000),
                ms(1000),
                ms(1000)
            ]
        );
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
    fn large_requests_are_stored_deflated_and_read_back() {
        // A topology of 6,000 nodes: ~1 MiB as protobuf.
        let mut big = request("pvc-big");
        big.accessibility_requirements = Some(csi_proto::v1::TopologyRequirement {
            requisite: (0..6000)
                .map(|i| csi_proto::v1::Topology {
                    segments: [(
                        "topology.hostpath.csi/node".to_owned(),
                        format!("node-{i:05}"),
                    )]
                    .into(),
                })
                .collect(),
            preferred: Vec::new(),
        });
        let entry = JournalEntry::new("ns", "big", &big, None);
        assert!(entry.compressed);
        let json = serde_json::to_string(&entry).expect("json");
        assert!(json.len() < 100 * 1024, "{} bytes", json.len());
        let mut expected = big.clone();
        expected.secrets.clear();
        assert_eq!(entry.request().expect("decodes"), expected);
        // Small ones stay plain.
        assert!(!JournalEntry::new("ns", "a", &request("pvc-a"), None).compressed);
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
    fn a_backlog_is_claims_queued_while_every_worker_is_busy() {
        // (queued, busy, workers) -> backlog
        for ((queued, busy, workers), backlog) in [
            ((0, 0, 100), 0),
            ((1, 0, 100), 0),
            ((1, 99, 100), 0),
            ((0, 100, 100), 0),
            ((1, 100, 100), 1),
            ((1400, 100, 100), 1400),
            ((3, 1, 0), 3),
        ] {
            assert_eq!(
                backlog_of(queued, busy, workers),
                backlog,
                "{queued} queued, {busy} of {workers} busy"
            );
        }
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

    mod store {
        use super::*;
        use kube_testserver::{TestServer, Verb};

        const DRIVER: &str = "hostpath.csi.k8s.io";

        fn entry(i: usize) -> JournalEntry {
            JournalEntry::new(
                "ns",
                &format!("claim-{i}"),
                &request(&format!("pvc-{i}")),
                None,
            )
        }

        /// A journal on `server` with `limits`, loaded (empty) and started.
        async fn started(server: &TestServer, limits: Limits) -> Journal {
            let mut store = JournalStore::with_limits(server.client(), "ns", DRIVER, limits);
            assert!(store.load().await.expect("load").is_empty());
            store.start()
        }

        /// A started journal on `server` holding `uid-0`, with `uid-1`
        /// recorded and forgotten: one removal waiting for its write.
        async fn with_a_waiting_removal(server: &TestServer) -> Journal {
            let journal = started(server, Limits::default()).await;
            journal.record("uid-0", entry(0)).await.expect("recorded");
            journal.record("uid-1", entry(1)).await.expect("recorded");
            journal.forget("uid-1");
            journal
        }

        fn segments(server: &TestServer) -> BTreeMap<String, usize> {
            server
                .list::<ConfigMap>(Some("ns"))
                .into_iter()
                .map(|cm| {
                    let len = cm.data.as_ref().map_or(0, BTreeMap::len);
                    (cm.metadata.name.unwrap_or_default(), len)
                })
                .collect()
        }

        /// A journal on `server` whose provisioning queue always holds
        /// `waiting` claims, loaded (empty) and started.
        async fn started_with_backlog(server: &TestServer, waiting: usize) -> Journal {
            let mut store = JournalStore::new(server.client(), "ns", DRIVER)
                .with_backlog(std::sync::Arc::new(move || waiting));
            assert!(store.load().await.expect("load").is_empty());
            store.start()
        }

        fn journal_writes(server: &TestServer) -> u64 {
            server.request_count(Verb::Create, "configmaps")
                + server.request_count(Verb::Update, "configmaps")
        }

        /// Records `n` claims from `first`, one every `every`, and waits
        /// until each is stored.
        async fn record_spaced(journal: &Journal, first: usize, n: usize, every: Duration) {
            let mut tasks = Vec::new();
            for i in first..first + n {
                let journal = journal.clone();
                tasks.push(tokio::spawn(async move {
                    journal.record(&format!("uid-{i}"), entry(i)).await
                }));
                tokio::time::sleep(every).await;
            }
            for task in tasks {
                task.await.expect("task").expect("recorded");
            }
        }

        /// Records 100 ms apart: without claims waiting for a worker each
        /// is written alone as soon as its short window ends; with a
        /// backlog they share one write.
        #[tokio::test(start_paused = true)]
        async fn a_backlog_holds_a_batch_open_for_the_records_that_follow() {
            for (waiting, writes) in [(0, 3), (7, 1)] {
                let server = TestServer::new();
                let journal = started_with_backlog(&server, waiting).await;
                record_spaced(&journal, 0, 3, Duration::from_millis(100)).await;
                assert_eq!(journal_writes(&server), writes, "{waiting} claims waiting");
                assert_eq!(entries(&server).len(), 3);
            }
        }

        /// Without a backlog a record is written at once, with no window,
        /// and the records that arrive while that write is under way
        /// share the next write (group commit): a lone claim at a steady
        /// rate waits for one write, no more.
        #[tokio::test(start_paused = true)]
        async fn without_a_backlog_a_record_is_written_at_once_and_those_during_its_write_share_the_next()
         {
            use kube_testserver::RequestMatch;
            const WRITE: Duration = Duration::from_millis(20);
            let server = TestServer::new();
            let journal = started_with_backlog(&server, 0).await;
            server.add_latency(RequestMatch::new(Verb::Create, "configmaps"), WRITE);
            server.add_latency(RequestMatch::new(Verb::Update, "configmaps"), WRITE);
            let started = tokio::time::Instant::now();
            let first = {
                let journal = journal.clone();
                tokio::spawn(async move { journal.record("uid-0", entry(0)).await })
            };
            tokio::time::sleep(Duration::from_millis(1)).await;
            let during = tokio::spawn({
                let journal = journal.clone();
                async move { record_spaced(&journal, 1, 9, Duration::from_millis(1)).await }
            });
            first.await.expect("task").expect("recorded");
            assert_eq!(
                started.elapsed(),
                WRITE,
                "the first record waited for its write only"
            );
            during.await.expect("task");
            assert_eq!(journal_writes(&server), 2);
            assert_eq!(entries(&server).len(), 10);
        }

        /// Under a backlog a batch is written once it holds
        /// [`BACKLOG_BATCH`] records, without waiting out its window:
        /// 120 records 1 ms apart make batches of 50, 50 and 20.
        #[tokio::test(start_paused = true)]
        async fn a_backlog_batch_is_written_once_it_is_full() {
            let server = TestServer::new();
            let journal = started_with_backlog(&server, 1).await;
            let started = tokio::time::Instant::now();
            record_spaced(&journal, 0, 120, Duration::from_millis(1)).await;
            assert_eq!(journal_writes(&server), 3);
            // The last batch (records 100 to 119) waited out its window.
            let elapsed = started.elapsed();
            assert!(
                elapsed >= Duration::from_millis(100) + BACKLOG_WINDOW
                    && elapsed < Duration::from_millis(120) + BACKLOG_WINDOW,
                "{elapsed:?}"
            );
            assert_eq!(entries(&server).len(), 120);
        }

        /// A backlog's pipeline: 100 workers each record a claim, work on
        /// it a while, forget it and record the next, 1,500 claims in all.
        /// A forget arrives just before each record; it must not close
        /// the batch that record opens (it did: a write per one to ten
        /// records, 0.10 to 0.19 journal writes per volume on a real API
        /// server). At most one write per [`BACKLOG_BATCH`] records and a
        /// few more.
        #[tokio::test(start_paused = true)]
        async fn a_backlog_of_workers_shares_writes() {
            let server = TestServer::new();
            let journal = started_with_backlog(&server, 1000).await;
            let mut tasks = Vec::new();
            for worker in 0..100usize {
                let journal = journal.clone();
                tasks.push(tokio::spawn(async move {
                    for k in 0..15usize {
                        let i = worker * 100 + k;
                        let uid = format!("uid-{i}");
                        journal.record(&uid, entry(i)).await.expect("recorded");
                        let work = 20 + (i * 7919 % 60) as u64;
                        tokio::time::sleep(Duration::from_millis(work)).await;
                        journal.forget(&uid);
                    }
                }));
            }
            for task in tasks {
                task.await.expect("worker");
            }
            let writes = journal_writes(&server);
            assert!(
                writes <= (1500 / BACKLOG_BATCH as u64) + 5,
                "{writes} writes for 1,500 records"
            );
        }

        /// Hazard 4 (docs/design.md): 10,000 claims in flight; every
        /// write stays small (a bounded segment), none fails at the API's
        /// 1 MiB limit, and an entry too large alone is refused, not the
        /// batch it rides in.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn ten_thousand_in_flight_with_bounded_writes_and_oversized_entries_refused() {
            let server = TestServer::new();
            let journal = started(&server, Limits::default()).await;
            let mut tasks = Vec::new();
            for i in 0..10_000 {
                let journal = journal.clone();
                tasks.push(tokio::spawn(async move {
                    journal.record(&format!("uid-{i}"), entry(i)).await
                }));
            }
            // One entry too large for any ConfigMap, in the same burst.
            let mut huge = entry(99_999);
            huge.request = "x".repeat(600 * 1024);
            let refused = journal.record("uid-huge", huge).await;
            assert!(
                matches!(
                    &refused,
                    Err(JournalError::Rejected {
                        rejection: Rejection::TooLarge { .. },
                        ..
                    })
                ),
                "{refused:?}"
            );
            for task in tasks {
                task.await.expect("task").expect("recorded");
            }
            let layout = segments(&server);
            let total: usize = layout.values().sum();
            assert_eq!(total, 10_000, "{layout:?}");
            assert!(
                layout
                    .values()
                    .all(|n| *n <= Limits::default().segment_entries)
            );
            let largest = server
                .list::<ConfigMap>(Some("ns"))
                .iter()
                .map(|cm| serde_json::to_vec(cm).map_or(0, |v| v.len()))
                .max()
                .unwrap_or(0);
            assert!(largest < 1024 * 1024, "a segment of {largest} bytes");
            let writes = server.request_count(Verb::Create, "configmaps")
                + server.request_count(Verb::Update, "configmaps");
            assert!(writes < 2_000, "{writes} writes for 10,000 entries");

            // Everything done: the segments go.
            for i in 0..10_000 {
                journal.forget(&format!("uid-{i}"));
            }
            tokio::time::timeout(Duration::from_secs(20), async {
                while !segments(&server).is_empty() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("every segment deleted");
        }

        /// Hazard 5 (docs/design.md): someone deletes the journal; later records are
        /// written (durably: a restart still resumes them).
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deleted_journal_is_written_again() {
            let server = TestServer::new();
            let journal = started(&server, Limits::default()).await;
            journal.record("uid-1", entry(1)).await.expect("recorded");
            for name in segments(&server).keys() {
                server
                    .delete_object("v1", "ConfigMap", "ns", name)
                    .expect("delete");
            }
            journal
                .record("uid-2", entry(2))
                .await
                .expect("recorded after the deletion");
            let mut again = JournalStore::new(server.client(), "ns", DRIVER);
            let recovered = again.load().await.expect("load");
            assert!(recovered.contains_key("uid-2"), "{recovered:?}");
        }

        /// The entries held by the segments (uid → segment).
        fn entries(server: &TestServer) -> BTreeMap<String, String> {
            server
                .list::<ConfigMap>(Some("ns"))
                .into_iter()
                .flat_map(|cm| {
                    let name = cm.metadata.name.unwrap_or_default();
                    cm.data
                        .unwrap_or_default()
                        .into_keys()
                        .map(move |uid| (uid, name.clone()))
                })
                .collect()
        }

        /// Hazard 14 (docs/design.md): a graceful shutdown writes the removals still waiting
        /// for their lazy write at once, and rewrites the closed segments
        /// that hold entries no longer needed (they were only forgotten in
        /// memory): afterwards the journal holds exactly what is in flight,
        /// and a restart replays nothing else.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_flush_writes_every_removal_and_rewrites_stale_closed_segments() {
            let server = TestServer::new();
            let limits = Limits {
                segment_entries: 2,
                ..Limits::default()
            };
            let journal = started(&server, limits).await;
            // a, b fill segment 1 (closed); c, d in segment 2; e, f in
            // segment 3 (open).
            for i in 0..6 {
                journal
                    .record(&format!("uid-{i}"), entry(i))
                    .await
                    .expect("recorded");
            }
            assert_eq!(entries(&server).len(), 6);
            for uid in ["uid-0", "uid-2", "uid-3", "uid-5"] {
                journal.forget(uid);
            }
            journal.flush().await.expect("flushed");
            let left = entries(&server);
            assert_eq!(
                left.keys().collect::<Vec<_>>(),
                ["uid-1", "uid-4"],
                "{left:?}"
            );
            // Segment 2 emptied: deleted.
            assert_eq!(segments(&server).len(), 2, "{:?}", segments(&server));
            let mut again = JournalStore::with_limits(server.client(), "ns", DRIVER, limits);
            let recovered = again.load().await.expect("load");
            assert_eq!(recovered.keys().collect::<Vec<_>>(), ["uid-1", "uid-4"]);

            // Segments of a previous run (all closed) too.
            let journal = again.start();
            journal.forget("uid-1");
            journal.flush().await.expect("flushed");
            assert_eq!(entries(&server).keys().collect::<Vec<_>>(), ["uid-4"]);
            // Nothing waiting: a flush writes nothing.
            let writes = |s: &TestServer| {
                s.request_count(Verb::Create, "configmaps")
                    + s.request_count(Verb::Update, "configmaps")
                    + s.request_count(Verb::Delete, "configmaps")
            };
            let before = writes(&server);
            journal.flush().await.expect("flushed");
            assert_eq!(writes(&server), before);
        }

        /// A claim recorded again after its entry was forgotten (a worker
        /// that saw the claim before its PV, from a stale cache), whose new
        /// entry cannot be written: the earlier entry's removal used to be
        /// dropped with it, and the entry stayed for every later start to
        /// replay (chaos seed 28). It still goes.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_failed_record_again_does_not_keep_the_entry_it_replaced() {
            let server = TestServer::new();
            let journal = with_a_waiting_removal(&server).await;
            server.fail_next(
                1,
                kube_testserver::RequestMatch::new(Verb::Update, "configmaps"),
                409,
            );
            let again = journal.record("uid-1", entry(1)).await;
            assert!(again.is_err(), "{again:?}");
            journal.flush().await.expect("flushed");
            assert_eq!(entries(&server).keys().collect::<Vec<_>>(), ["uid-0"]);
        }

        /// A flush asks again while its caller waits: a write failing once
        /// (a conflict, an API server busy) does not leave the entries.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_flush_tries_again_while_its_caller_waits() {
            let server = TestServer::new();
            let journal = with_a_waiting_removal(&server).await;
            server.fail_next(
                3,
                kube_testserver::RequestMatch::new(Verb::Update, "configmaps"),
                500,
            );
            tokio::time::timeout(Duration::from_secs(5), journal.flush())
                .await
                .expect("in time")
                .expect("flushed");
            assert_eq!(entries(&server).keys().collect::<Vec<_>>(), ["uid-0"]);
        }

        /// Removals are written at most [`IDLE_FLUSH`] after the first one,
        /// however many follow: a steady stream of removals (PVs saved one
        /// after another, no new record) used to put them all off until a
        /// quiet moment.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_stream_of_removals_does_not_put_off_their_write() {
            let server = TestServer::new();
            let journal = started(&server, Limits::default()).await;
            for i in 0..8 {
                journal
                    .record(&format!("uid-{i}"), entry(i))
                    .await
                    .expect("recorded");
            }
            let started = tokio::time::Instant::now();
            for i in 0..8 {
                journal.forget(&format!("uid-{i}"));
                tokio::time::sleep(Duration::from_millis(500)).await;
                if started.elapsed() > IDLE_FLUSH + Duration::from_millis(700) {
                    assert!(
                        !entries(&server).contains_key("uid-0"),
                        "the first removal still waits after {:?}",
                        started.elapsed()
                    );
                    return;
                }
            }
            panic!("the stream ended too early");
        }

        /// The single ConfigMap of earlier versions is resumed and deleted
        /// when done.
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn the_journal_of_an_earlier_version_is_resumed() {
            let server = TestServer::new();
            let old = serde_json::to_string(&entry(7)).expect("json");
            server
                .create_object(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": journal_name(DRIVER), "namespace": "ns",
                        "labels": {"app.kubernetes.io/managed-by": "csi-provisioner"}},
                    "data": {"uid-7": old}}))
                .expect("old journal");
            let mut store = JournalStore::new(server.client(), "ns", DRIVER);
            let recovered = store.load().await.expect("load");
            assert_eq!(recovered.keys().collect::<Vec<_>>(), ["uid-7"]);
            let journal = store.start();
            journal.record("uid-8", entry(8)).await.expect("recorded");
            journal.forget("uid-7");
            tokio::time::timeout(Duration::from_secs(10), async {
                while segments(&server).contains_key(&journal_name(DRIVER)) {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
            .await
            .expect("the old journal deleted once its entry is done");
        }
    }
}
