//! The operations in flight: one owner for the in-memory map and the
//! [`journal`](super::journal) that makes it survive a restart.
//!
//! An operation is a `CreateVolume` that may have reached the backend and
//! whose volume is not yet recorded in a PV. Its [`Frozen`] part (the
//! request without secrets, the secret reference, Retain, CSI migration) is
//! what the journal keeps and what a retry or the cleanup of a gone claim
//! sends; it is taken from the [`ProvisionPlan`] once ([`Frozen::of`]) and
//! turned into a [`JournalEntry`] and back in one place each
//! ([`Frozen::entry`], [`Frozen::read`]). Every change goes through
//! [`Operations`]: an operation enters the map only once its entry is in
//! the journal ([`Operations::record`]), and leaves both together
//! ([`Operations::finish`]), so the two cannot diverge.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use csi_proto::v1::{CreateVolumeRequest, VolumeContentSource};

use super::ClaimKey;
use super::journal::{Journal, JournalEntry, JournalError};
use crate::provision::{ProvisionPlan, SecretRef};
use crate::queue::{Backoff, Taken, WorkQueue};

/// What the journal keeps of an operation: everything a retry sends and
/// everything the cleanup of a claim that is gone needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Frozen {
    /// The request every attempt sends (upstream lib #152, #1465: topology
    /// or parameters recomputed on a retry could create a second, different
    /// volume); `secrets` empty, filled from [`Frozen::secret`] per call.
    pub request: CreateVolumeRequest,
    pub secret: Option<SecretRef>,
    /// The class's reclaim policy is Retain: a volume of this operation
    /// whose claim is gone is kept, never deleted (its PV, if one was
    /// saved and then deleted, was meant to keep it: docs/design.md, hazard 10).
    pub retain: bool,
    /// The volume is an in-tree one served through CSI migration (the
    /// `migrated` label of its CSI calls, after a restart too).
    pub migrated: bool,
}

impl Frozen {
    /// The operation a plan starts.
    pub fn of(plan: &ProvisionPlan) -> Self {
        Frozen {
            request: plan.request.clone(),
            secret: plan.provisioner_secret.clone(),
            retain: plan.reclaim_policy == "Retain",
            migrated: plan.is_migrated(),
        }
    }

    /// The journal entry that records it for `claim`.
    pub fn entry(&self, claim: &ClaimKey) -> JournalEntry {
        JournalEntry::new(
            &claim.namespace,
            &claim.name,
            &self.request,
            self.secret.as_ref(),
        )
        .retained(self.retain)
        .migrated(self.migrated)
    }

    /// The operation a journal entry records.
    pub fn read(entry: &JournalEntry) -> Result<Self, String> {
        Ok(Frozen {
            request: entry.request()?,
            secret: entry.secret(),
            retain: entry.retain,
            migrated: entry.migrated,
        })
    }
}

/// An operation in flight.
#[derive(Debug, Clone)]
pub struct InFlight {
    pub frozen: Frozen,
    /// The plan of the first attempt in this process, whose request is
    /// the frozen one: retries reuse it instead of gathering the inputs
    /// again (live reads of snapshots and nodes) and planning anew, which
    /// could fail on a claim or class changed meanwhile and leave the
    /// operation unretried. `None` for an operation read back from the
    /// journal until its first pass plans once (keeping the journal's
    /// request).
    pub plan: Option<Arc<ProvisionPlan>>,
    /// A `CreateVolume` of this operation may have reached the driver: set
    /// just before the first call. Until then (the provisioner secret or
    /// the source's finalizer failed first) a claim deleted meanwhile has
    /// no volume to clean up, and the cleanup must not create one to learn
    /// its id. Entries read back from the journal count as sent.
    pub create_sent: bool,
    /// Final errors the cleanup's repeated `CreateVolume` has got so far
    /// (see [`crate::provision::CLEANUP_FINAL_ANSWERS`]); kept in memory only, so a restart
    /// asks again from zero.
    pub final_cleanup_answers: u32,
    /// When this process recorded it, or read it back from the journal
    /// (entries keep no time: the API server's clock is not ours): the age
    /// of `csi_provisioner_journal_oldest_entry_seconds`.
    pub since: tokio::time::Instant,
}

/// Forgets a journal entry when dropped armed (see [`Operations::record`]).
struct Withdraw<'a> {
    journal: &'a Journal,
    uid: &'a str,
    armed: bool,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.journal.forget(self.uid);
        }
    }
}

/// Claim uid → operation in flight, and the journal behind it.
pub struct Operations {
    in_flight: Mutex<HashMap<String, InFlight>>,
    journal: Journal,
    /// The operations whose volume was created but whose PV could not be
    /// saved yet, by claim uid: the Go image's `unsavedpvs` queue (its
    /// `workqueue_*` series), see [`SaveAttempt`].
    unsaved: WorkQueue<String>,
    /// Held while a source-protection finalizer is added for an operation
    /// in flight, and by the snapshot sweep while it decides and removes
    /// one: a restore that starts while the sweep removes the finalizer
    /// either is in flight when the sweep looks, or adds the finalizer
    /// back after the removal (`snapshot_sweep::worker`).
    source_finalizers: tokio::sync::Mutex<()>,
}

impl Operations {
    pub fn new(journal: Journal) -> Self {
        Operations {
            in_flight: Mutex::default(),
            journal,
            // Its retries are paced by the claim worker that owns the
            // operation (`claims::save_pv`), never by the queue's backoff.
            unsaved: WorkQueue::new(
                UNSAVED_PVS,
                Backoff {
                    start: Duration::ZERO,
                    max: Duration::ZERO,
                },
            ),
            source_finalizers: tokio::sync::Mutex::const_new(()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, InFlight>> {
        self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn get(&self, uid: &str) -> Option<InFlight> {
        self.map().get(uid).cloned()
    }

    /// The operations in flight and the oldest one's age in seconds (the
    /// journal's gauges).
    pub fn backlog(&self, now: tokio::time::Instant) -> crate::metrics::Backlog {
        let started: Vec<tokio::time::Instant> = self.map().values().map(|op| op.since).collect();
        let (_, oldest_seconds) = crate::metrics::unfinished_work(now, &started);
        crate::metrics::Backlog {
            count: started.len(),
            oldest_seconds,
        }
    }

    /// Starts the operation `plan` describes for `claim`: records it in the
    /// journal and waits until it is stored; only then is it in flight.
    /// On an error nothing is in flight and no `CreateVolume` may be sent.
    pub async fn record(
        &self,
        claim: &ClaimKey,
        plan: Arc<ProvisionPlan>,
    ) -> Result<InFlight, JournalError> {
        let frozen = Frozen::of(&plan);
        // Until the operation is in flight, an entry the writer stores is
        // withdrawn: dropped while waiting (or answered with an error), no
        // CreateVolume follows, and an entry no operation owns would never
        // be forgotten and be replayed at every start.
        let mut withdraw = Withdraw {
            journal: &self.journal,
            uid: &claim.uid,
            armed: true,
        };
        self.journal.record(&claim.uid, frozen.entry(claim)).await?;
        withdraw.armed = false;
        let op = InFlight {
            frozen,
            plan: Some(plan),
            create_sent: false,
            final_cleanup_answers: 0,
            since: tokio::time::Instant::now(),
        };
        self.insert(&claim.uid, op.clone());
        Ok(op)
    }

    /// Puts back what a previous run (or leader) left in the journal, each
    /// counted as sent; returns the claims to look at. An entry that cannot
    /// be read is logged and left in the journal for a human.
    pub fn resume(&self, recovered: BTreeMap<String, JournalEntry>) -> Vec<ClaimKey> {
        let mut claims = Vec::with_capacity(recovered.len());
        for (uid, entry) in recovered {
            match Frozen::read(&entry) {
                Ok(frozen) => {
                    tracing::info!(claim = %format!("{}/{}", entry.namespace, entry.name), volume = %entry.volume_name, "resuming provisioning recorded in the journal");
                    self.insert(
                        &uid,
                        InFlight {
                            frozen,
                            plan: None,
                            create_sent: true,
                            final_cleanup_answers: 0,
                            since: tokio::time::Instant::now(),
                        },
                    );
                    claims.push(ClaimKey {
                        namespace: entry.namespace,
                        name: entry.name,
                        uid,
                    });
                }
                Err(e) => tracing::error!(%uid, "journal entry unusable: {e}"),
            }
        }
        claims
    }

    fn insert(&self, uid: &str, op: InFlight) {
        let mut in_flight = self.map();
        in_flight.insert(uid.to_owned(), op);
        crate::metrics::set_remembered("in_flight", in_flight.len());
    }

    /// Changes the operation of `uid` in memory (what the journal keeps
    /// never changes); returns it changed, or `None` when none is in flight.
    pub fn update(&self, uid: &str, change: impl FnOnce(&mut InFlight)) -> Option<InFlight> {
        let mut in_flight = self.map();
        let op = in_flight.get_mut(uid)?;
        change(op);
        Some(op.clone())
    }

    /// The operation is over (PV saved, or no volume exists): forget it here
    /// and in the journal. Returns it, when one was in flight.
    pub fn finish(&self, uid: &str) -> Option<InFlight> {
        let mut in_flight = self.map();
        let removed = in_flight.remove(uid);
        crate::metrics::set_remembered("in_flight", in_flight.len());
        // Queued while the map is still locked (a send, no wait): whoever
        // sees the operation gone finds its removal ahead of anything it
        // sends the journal next, e.g. the flush of a shutdown. Queued
        // after the lock, a flush could overtake it and leave the entry
        // to be replayed (tests/cancellation.rs, "then continued", failed
        // once so under load).
        if removed.is_some() {
            self.journal.forget(uid);
        }
        self.unsaved.remove(&uid.to_owned());
        removed
    }

    /// Starts an attempt to save the PV of the operation of claim `uid`
    /// (see [`SaveAttempt`]).
    pub fn save_attempt(&self, uid: &str) -> SaveAttempt {
        let uid = uid.to_owned();
        SaveAttempt {
            retry: self.unsaved.take(&uid),
            queue: self.unsaved.clone(),
            uid,
        }
    }

    /// Whether an operation in flight clones or restores from `source`.
    pub fn source_in_use(&self, source: &Option<VolumeContentSource>) -> bool {
        source.is_some()
            && self
                .map()
                .values()
                .any(|op| &op.frozen.request.volume_content_source == source)
    }

    /// The backend snapshot ids that operations in flight restore from.
    pub fn snapshot_sources(&self) -> std::collections::BTreeSet<String> {
        use csi_proto::v1::volume_content_source::Type;
        self.map()
            .values()
            .filter_map(|op| match &op.frozen.request.volume_content_source {
                Some(VolumeContentSource {
                    r#type: Some(Type::Snapshot(snapshot)),
                }) => Some(snapshot.snapshot_id.clone()),
                _ => None,
            })
            .collect()
    }

    /// See the field `source_finalizers`.
    pub async fn lock_source_finalizers(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.source_finalizers.lock().await
    }

    /// The lock itself, for the snapshot sweep.
    pub fn source_finalizers(&self) -> &tokio::sync::Mutex<()> {
        &self.source_finalizers
    }

    /// Claim uid and volume name of every operation in flight.
    pub fn volume_names(&self) -> Vec<(String, String)> {
        self.map()
            .iter()
            .map(|(uid, op)| (uid.clone(), op.frozen.request.name.clone()))
            .collect()
    }

    /// Writes the journal's removals still waiting (see [`Journal::flush`]).
    pub async fn flush(&self) -> Result<(), JournalError> {
        self.journal.flush().await
    }
}

/// The name of the Go image's queue of PVs whose save is retried.
pub const UNSAVED_PVS: &str = "unsavedpvs";

/// One attempt to save an operation's PV, measured as the Go image's
/// `unsavedpvs` queue measures its saves: an operation enters the queue
/// when an attempt fails (an add), the next attempt takes it out (its wait
/// is the queue duration, the attempt itself the work duration), and a
/// failed retry puts it back (a retry and an add). It leaves when its PV is
/// saved or its operation finishes another way ([`Operations::finish`]).
/// The Go image's first save is not queue work either; its later ones are
/// its queue's workers', ours the claim worker's (within the pass, then at
/// the claim's next pass), so ours includes the wait between passes.
pub struct SaveAttempt {
    /// Taken from the queue: an earlier attempt failed.
    retry: Option<Taken<String>>,
    queue: WorkQueue<String>,
    uid: String,
}

impl SaveAttempt {
    /// The PV is saved: the operation leaves the queue.
    pub fn saved(self) {
        drop(self.retry);
        self.queue.remove(&self.uid);
    }

    /// The PV is not saved: the operation waits in the queue for the next
    /// attempt.
    pub fn failed(self) {
        let retry = self.retry.is_some();
        drop(self.retry);
        if retry {
            // client-go's AddRateLimited: a retry, then an add.
            self.queue.add_after(self.uid, Duration::ZERO);
        } else {
            self.queue.add(self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::fixtures::{
        claim, class, config, ebs_config, gp2_claim, gp2_class, map, planned,
    };

    fn key() -> ClaimKey {
        ClaimKey {
            namespace: "ns".to_owned(),
            name: "data".to_owned(),
            uid: "uid-1".to_owned(),
        }
    }

    #[test]
    fn the_journal_keeps_what_the_plan_froze() {
        let mut retained = class();
        retained.reclaim_policy = Some("Retain".to_owned());
        retained.parameters = Some(map(&[
            ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
            ("csi.storage.k8s.io/provisioner-secret-namespace", "vault"),
        ]));
        let cases = [
            (
                "retained, with a secret",
                planned(&claim(), &retained, &config()),
            ),
            ("plain", planned(&claim(), &class(), &config())),
            (
                "migrated",
                planned(&gp2_claim(), &gp2_class(), &ebs_config()),
            ),
        ];
        for (name, mut plan) in cases {
            plan.request.secrets = map(&[("password", "hunter2")]).into_iter().collect();
            let frozen = Frozen::of(&plan);
            assert_eq!(frozen.request, plan.request, "{name}");
            assert_eq!(frozen.secret, plan.provisioner_secret, "{name}");
            assert_eq!(frozen.retain, plan.reclaim_policy == "Retain", "{name}");
            assert_eq!(frozen.migrated, plan.is_migrated(), "{name}");

            let entry = frozen.entry(&key());
            assert_eq!(
                (entry.namespace.as_str(), entry.name.as_str()),
                ("ns", "data"),
                "{name}"
            );
            assert_eq!(entry.volume_name, plan.volume_name, "{name}");
            let json = serde_json::to_string(&entry).expect("json");
            assert!(!json.contains("hunter2"), "{name}: {json}");
            let back: JournalEntry = serde_json::from_str(&json).expect("parses");
            let read = Frozen::read(&back).expect("reads");
            let mut without_secrets = frozen.clone();
            without_secrets.request.secrets.clear();
            assert_eq!(read, without_secrets, "{name}");
        }
        // The cases above cover both values of each flag.
        let retained_plan = planned(&claim(), &retained, &config());
        assert!(Frozen::of(&retained_plan).retain);
        assert!(Frozen::of(&retained_plan).secret.is_some());
        assert!(Frozen::of(&planned(&gp2_claim(), &gp2_class(), &ebs_config())).migrated);
    }

    #[tokio::test]
    async fn a_record_dropped_before_it_is_stored_withdraws_its_entry() {
        use std::future::Future;
        let plan = Arc::new(planned(&claim(), &class(), &config()));
        let (journal, mut inbox) = super::super::journal::channel();
        let ops = Operations::new(journal);
        let claim_key = key();
        {
            let record = std::pin::pin!(ops.record(&claim_key, Arc::clone(&plan)));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(
                record.poll(&mut cx).is_pending(),
                "waits for the writer's answer"
            );
        }
        assert!(ops.get("uid-1").is_none(), "not in flight");
        // The writer gets the entry and, behind it, its withdrawal: it
        // never stays in the journal without an operation.
        assert_eq!(inbox.sent(), vec!["add uid-1", "remove uid-1"]);

        // Recorded: nothing is withdrawn.
        let (journal, inbox) = super::super::journal::channel();
        super::super::journal::JournalStore::start_disabled(inbox);
        let ops = Operations::new(journal);
        ops.record(&key(), Arc::clone(&plan))
            .await
            .expect("records");
        assert!(ops.get("uid-1").is_some());
    }

    #[tokio::test]
    async fn an_operation_is_in_flight_only_once_recorded_and_leaves_with_its_entry() {
        let plan = Arc::new(planned(&claim(), &class(), &config()));

        // No journal writer: the record fails and nothing is in flight.
        let (journal, inbox) = super::super::journal::channel();
        drop(inbox);
        let ops = Operations::new(journal);
        assert!(ops.record(&key(), Arc::clone(&plan)).await.is_err());
        assert!(ops.get("uid-1").is_none());
        assert!(ops.update("uid-1", |op| op.create_sent = true).is_none());
        assert!(ops.get("uid-1").is_none(), "an update adds nothing");

        // A journal that accepts every record.
        let (journal, inbox) = super::super::journal::channel();
        super::super::journal::JournalStore::start_disabled(inbox);
        let ops = Operations::new(journal);
        let op = ops
            .record(&key(), Arc::clone(&plan))
            .await
            .expect("records");
        assert!(!op.create_sent);
        assert_eq!(op.frozen, Frozen::of(&plan));
        let sent = ops.update("uid-1", |op| op.create_sent = true);
        assert!(sent.is_some_and(|op| op.create_sent));
        assert_eq!(
            ops.volume_names(),
            vec![("uid-1".to_owned(), plan.volume_name.clone())]
        );
        ops.finish("uid-1");
        assert!(ops.get("uid-1").is_none());
        assert!(ops.volume_names().is_empty());
    }

    #[test]
    fn resumed_entries_count_as_sent_and_unreadable_ones_are_left() {
        let (journal, _inbox) = super::super::journal::channel();
        let ops = Operations::new(journal);
        let plan = planned(&claim(), &class(), &config());
        let good = Frozen::of(&plan).entry(&key());
        let mut bad = good.clone();
        bad.request = "not base64!".to_owned();
        let claims = ops.resume(BTreeMap::from([
            ("uid-1".to_owned(), good),
            ("uid-2".to_owned(), bad),
        ]));
        assert_eq!(claims, vec![key()]);
        let op = ops.get("uid-1").expect("resumed");
        assert!(op.create_sent && op.plan.is_none());
        assert_eq!(op.frozen.request, plan.request);
        assert!(ops.get("uid-2").is_none());
    }
}
