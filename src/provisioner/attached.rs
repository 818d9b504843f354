//! Whether a Released PV is still attached to a node: the check before
//! `DeleteVolume` on a driver that attaches volumes (upstream #1574).
//!
//! The PV comes on the PV watch and the VolumeAttachments on their own;
//! nothing orders the two. An attachment created a moment before the
//! claim was deleted can still be on its way to the cache when the PV's
//! release arrives (CI saw exactly that). So the answer is made current
//! for the PV's own revision (docs/design.md, "Reading current state"):
//! - the attachment cache, once it has applied an event at or past the
//!   PV's revision (it then holds every attachment made before the
//!   release), waiting for that at most [`CACHE_WAIT`];
//! - else the last live read if it was made at or past that revision,
//!   together with the cache (an attachment in either counts: the error
//!   is only ever a wait);
//! - else a live read, batched: the deletes that ask while none is under
//!   way share one. Where this server is known to get there, it is a
//!   *catch-up* ([`catch_up`]): the attachment events since the cache's
//!   revision, up to a bookmark at or past the collection's current
//!   revision. That costs two small requests whatever the number of
//!   attachments, but only an API server whose watch cache can be brought
//!   up to date on demand (etcd's progress requests, etcd 3.5.13 and
//!   later) gets there; on another a catch-up waits out its whole watch.
//!   Else a list of every VolumeAttachment, in pages, with a catch-up
//!   beside it that learns whether the server gets there
//!   ([`plan_live_read`]); one that does not is not tried again for
//!   [`CATCH_UP_PAUSE`].
//!
//! The cache keeps only this driver's attachments ([`crate::relevance`]),
//! indexed by PV name ([`AttachmentIndex`]), so a check costs a lookup,
//! not a copy of the cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use kube::Client;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use crate::informer::{Change, Informer};
use crate::live_batch::{LiveBatch, Spacing};
use crate::projection::VolumeAttachment;

/// How long a check waits for the attachment cache to reach the PV's
/// revision before it lists live: an event in flight arrives in
/// milliseconds, but a kind with no change since never gets there.
pub const CACHE_WAIT: Duration = Duration::from_millis(200);

/// How long the first asker of a live list waits for others to join.
const LIVE_WINDOW: Duration = Duration::from_millis(20);

/// The least time between two live lists: while the attachment watch is
/// quiet every delete needs one (its PV is newer than any list before it),
/// so during a wave of deletes they would run back to back, each a read of
/// every VolumeAttachment. Spaced, the deletes of the meantime share one,
/// each waiting a second at most.
pub const LIVE_LIST_INTERVAL: Duration = Duration::from_secs(1);

/// A live read that took less than a tenth of [`LIVE_LIST_INTERVAL`] is
/// followed after ten times its duration instead: live reads then keep
/// the API server busy a tenth of the time at most, and a small cluster's
/// deletes (a list of one page, a few milliseconds) do not each wait out
/// the second (10 deletes took 1.3 s so, against the Go image's 0.16 s,
/// which checks no attachments: docs/benchmarks.md). At 25,000
/// attachments (50 pages) a list takes longer, and the spacing stays.
pub const LIVE_READ_SPACING: Spacing = Spacing {
    most: LIVE_LIST_INTERVAL,
    per_took: Some(10),
};

/// Page size of the live list, as the caches' own lists.
const PAGE: u32 = 500;

/// The timeout of a catch-up's watch. kube-apiserver sends a watch's
/// bookmark two seconds before its timeout (at most once a minute
/// otherwise), so this one comes about a second in; measured against
/// kube-apiserver 1.36 on etcd 3.5.16, 1.0 to 1.7 s.
const CATCH_UP_TIMEOUT_SECONDS: u32 = 3;

/// After a catch-up that did not reach the collection's revision (an API
/// server whose watch cache only moves with its own events, as on etcd
/// 3.4), how long live reads are lists without trying one again: a
/// catch-up that does not get there holds a watch for its whole timeout.
pub const CATCH_UP_PAUSE: Duration = Duration::from_secs(300);

/// This driver's VolumeAttachments by the PV they attach: PV name →
/// attachment name → node.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AttachmentIndex(HashMap<String, BTreeMap<String, String>>);

impl AttachmentIndex {
    /// Records an attachment (created or changed; its source never changes).
    pub fn applied(&mut self, attachment: &VolumeAttachment) {
        let (Some(pv), Some(name)) = (
            attachment.spec.source.persistent_volume_name.as_deref(),
            attachment.metadata.name.as_deref(),
        ) else {
            return;
        };
        self.0
            .entry(pv.to_owned())
            .or_default()
            .insert(name.to_owned(), attachment.spec.node_name.clone());
    }

    /// Forgets a deleted attachment.
    pub fn deleted(&mut self, attachment: &VolumeAttachment) {
        let (Some(pv), Some(name)) = (
            attachment.spec.source.persistent_volume_name.as_deref(),
            attachment.metadata.name.as_deref(),
        ) else {
            return;
        };
        if let Some(by_name) = self.0.get_mut(pv) {
            by_name.remove(name);
            if by_name.is_empty() {
                self.0.remove(pv);
            }
        }
    }

    /// A node the PV `pv` is attached to, if any (the first by attachment
    /// name, so that the reported node is stable across retries).
    pub fn node_of(&self, pv: &str) -> Option<&str> {
        self.0.get(pv)?.values().next().map(String::as_str)
    }

    /// How many PVs have an attachment.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

/// A live read's answer: the attachments it saw and the revision it is
/// current at, always read together with the cache (an attachment in
/// either counts: the error is only ever a wait).
/// - `whole`: every attachment at `revision` (a list, or a list brought
///   forward by a catch-up, deletions applied);
/// - not `whole`: only those created or changed after the cache's
///   revision when the read began (a catch-up from the cache), so the
///   cache must be read after the read (it has only moved on since);
///   deletions are not applied.
#[derive(Debug, Default, PartialEq)]
pub struct ListedAttachments {
    pub revision: u64,
    pub index: AttachmentIndex,
    pub whole: bool,
}

/// What a live read starts from: the cache's revision when it began, and
/// the last live read's answer.
#[derive(Debug, Default)]
pub struct ReadBase {
    pub cache: u64,
    pub last: Option<Arc<ListedAttachments>>,
}

impl ReadBase {
    /// Where a catch-up starts: from a whole last read newer than the
    /// cache (a copy of it, brought forward), else from the cache (what
    /// changed since, only). The former is what keeps catch-ups working
    /// when the cache's revision is older than the API server keeps (after
    /// its restart, a watch from there is `410 Gone` until an attachment
    /// changes): the list made then is the next catch-up's start.
    pub fn start(&self) -> (u64, Option<AttachmentIndex>) {
        match &self.last {
            Some(last) if last.whole && last.revision > self.cache => {
                (last.revision, Some(last.index.clone()))
            }
            _ => (self.cache, None),
        }
    }
}

/// Where the answer for a PV at some revision comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFrom {
    /// The cache has applied the revision.
    Cache,
    /// The last live list was read at or past the revision: it and the
    /// cache together.
    CacheAndLastList,
    /// Neither is current: list live.
    LiveList,
}

/// Decides where the answer for a PV at `revision` comes from, given the
/// revision the cache has applied and the last live list's. An unknown
/// revision (a resourceVersion that is not a number: not an etcd-backed
/// server) is never taken as covered.
pub fn answer_from(revision: Option<u64>, cache: u64, last_list: Option<u64>) -> AnswerFrom {
    let Some(revision) = revision else {
        return AnswerFrom::LiveList;
    };
    if cache >= revision {
        AnswerFrom::Cache
    } else if last_list.is_some_and(|listed| listed >= revision) {
        AnswerFrom::CacheAndLastList
    } else {
        AnswerFrom::LiveList
    }
}

/// The attachment check's state: the index the cache feeds, the live
/// reads and the last one's answer.
pub struct Attachments {
    index: Arc<Mutex<AttachmentIndex>>,
    live: LiveBatch<ListedAttachments>,
    last_list: Arc<Mutex<Option<Arc<ListedAttachments>>>>,
}

impl Attachments {
    /// Feeds the index from `cache` (call before the caches start) and
    /// reads live through `client`, keeping `driver`'s attachments.
    pub fn new(cache: &Informer<VolumeAttachment>, client: Client, driver: &str) -> Self {
        let driver = driver.to_owned();
        let catch_ups: Arc<Mutex<CatchUps>> = Arc::default();
        Self::with_lister(cache, move |base| {
            let api: Api<VolumeAttachment> = Api::all(client.clone());
            let driver = driver.clone();
            let catch_ups = Arc::clone(&catch_ups);
            Box::pin(async move { read_live(&api, &driver, base, &catch_ups).await })
        })
    }

    /// With any read function, given what the read starts from (tests
    /// count the calls).
    pub fn with_lister(
        cache: &Informer<VolumeAttachment>,
        lister: impl Fn(
            ReadBase,
        )
            -> futures_util::future::BoxFuture<'static, Result<ListedAttachments, String>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        let index: Arc<Mutex<AttachmentIndex>> = Arc::default();
        {
            let index = Arc::clone(&index);
            cache.on_change(move |change| {
                let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
                match change {
                    Change::Applied(attachment) => index.applied(attachment),
                    Change::Deleted(attachment) => index.deleted(attachment),
                }
                crate::metrics::set_remembered("attached_volumes", index.len());
            });
        }
        let last_list: Arc<Mutex<Option<Arc<ListedAttachments>>>> = Arc::default();
        Self {
            index,
            live: {
                let applied = cache.applied_revisions();
                let last_list = Arc::clone(&last_list);
                LiveBatch::with_reader(LIVE_WINDOW, move |_| {
                    let last = last_list.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    lister(ReadBase {
                        cache: *applied.borrow(),
                        last,
                    })
                })
                .spaced(LIVE_READ_SPACING)
            },
            last_list,
        }
    }

    /// The node the PV `pv` (read at `revision`) is attached to, if any,
    /// as of that revision or later; an error when the live list failed.
    pub async fn attached_node(
        &self,
        cache: &Informer<VolumeAttachment>,
        pv: &str,
        revision: Option<u64>,
    ) -> Result<Option<String>, String> {
        if let Some(revision) = revision {
            cache.wait_for_revision(revision, CACHE_WAIT).await;
        }
        let last = self
            .last_list
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let from = answer_from(
            revision,
            cache.applied_revision(),
            last.as_ref().map(|l| l.revision),
        );
        // Read after any live read below: a catch-up holds only what came
        // after the cache's revision when it began.
        let cached = || {
            self.index
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .node_of(pv)
                .map(str::to_owned)
        };
        match from {
            AnswerFrom::Cache => Ok(cached()),
            AnswerFrom::CacheAndLastList => {
                Ok(cached().or_else(|| last.and_then(|l| l.index.node_of(pv).map(str::to_owned))))
            }
            AnswerFrom::LiveList => {
                tracing::debug!(volume = %pv, ?revision, cache = cache.applied_revision(), "attachment cache behind the PV: reading VolumeAttachments live");
                let listed = self.live.read("").await?;
                {
                    let mut last = self.last_list.lock().unwrap_or_else(|p| p.into_inner());
                    if last.as_ref().is_none_or(|l| l.revision < listed.revision) {
                        *last = Some(Arc::clone(&listed));
                    }
                }
                Ok(cached().or_else(|| listed.index.node_of(pv).map(str::to_owned)))
            }
        }
    }
}

/// What this process knows of the API server's catch-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUpSupport {
    /// Not known yet, or a pause ran out.
    #[default]
    Unknown,
    /// A catch-up reached its target: this server's watch cache can be
    /// brought up to date on demand.
    Reaches,
    /// A catch-up ended short: not tried on a delete's way until `until`.
    Short { until: tokio::time::Instant },
}

/// The catch-up state shared by the live reads.
#[derive(Debug, Default)]
struct CatchUps {
    support: CatchUpSupport,
    /// A catch-up that learns the support is under way.
    learning: bool,
}

/// What a live read does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LivePlan {
    /// Catch up; list only if it does not get there.
    CatchUp,
    /// List.
    List,
    /// List, and start a catch-up beside it, off the deletes' way, to
    /// learn whether this server gets there.
    ListAndLearn,
}

/// What a live read from revision `from` does. Never from 0 (a cache
/// that has applied nothing: a watch from 0 starts with every attachment,
/// no cheaper than a list). A delete waits on a catch-up only where one
/// has reached its target: on a server that cannot get there (etcd 3.4) a
/// catch-up waits out its whole watch (3 s; kube-apiserver sends no
/// bookmark at the revision the watch started from), which CI's benchmark
/// smoke run showed as 10 deletes beside attachments taking 4.3 to 4.8 s.
/// Unknown, the read lists and one catch-up at a time learns beside it.
fn plan_live_read(
    from: u64,
    support: CatchUpSupport,
    learning: bool,
    now: tokio::time::Instant,
) -> LivePlan {
    if from == 0 {
        return LivePlan::List;
    }
    match support {
        CatchUpSupport::Reaches => LivePlan::CatchUp,
        CatchUpSupport::Short { until } if now < until => LivePlan::List,
        _ if learning => LivePlan::List,
        _ => LivePlan::ListAndLearn,
    }
}

/// What a catch-up's end (begun at `now`) says of the server: reached, it
/// gets there; short, it does not, for [`CATCH_UP_PAUSE`]; a 410 (about
/// its start) or a failed request (about the moment) says nothing.
fn support_after(
    end: &Result<CatchUpEnd, kube::Error>,
    before: CatchUpSupport,
    now: tokio::time::Instant,
) -> CatchUpSupport {
    match end {
        Ok(CatchUpEnd::Reached(_)) => CatchUpSupport::Reaches,
        Ok(CatchUpEnd::Short(_)) => CatchUpSupport::Short {
            until: now + CATCH_UP_PAUSE,
        },
        Ok(CatchUpEnd::Ended(_)) | Err(_) => before,
    }
}

/// One live read, as [`plan_live_read`] says.
async fn read_live(
    api: &Api<VolumeAttachment>,
    driver: &str,
    base: ReadBase,
    catch_ups: &Arc<Mutex<CatchUps>>,
) -> Result<ListedAttachments, String> {
    let now = tokio::time::Instant::now();
    let (from, seed) = base.start();
    let plan = {
        let mut state = catch_ups.lock().unwrap_or_else(|p| p.into_inner());
        let plan = plan_live_read(from, state.support, state.learning, now);
        if plan == LivePlan::ListAndLearn {
            state.learning = true;
        }
        plan
    };
    match plan {
        LivePlan::CatchUp => {
            let end = catch_up_and_learn(api, driver, from, seed, catch_ups).await;
            if let Ok(CatchUpEnd::Reached(listed)) = end {
                return Ok(listed);
            }
        }
        LivePlan::ListAndLearn => {
            let (api, driver, catch_ups) = (api.clone(), driver.to_owned(), Arc::clone(catch_ups));
            // A task of its own: its end is only learnt, never waited for.
            tokio::spawn(async move {
                let _ = catch_up_and_learn(&api, &driver, from, seed, &catch_ups).await;
                catch_ups.lock().unwrap_or_else(|p| p.into_inner()).learning = false;
            });
        }
        LivePlan::List => {}
    }
    crate::metrics::count_live_read("list volumeattachments");
    list_live(api, driver).await.map_err(|e| e.to_string())
}

/// A catch-up, counted, logged, and learnt from ([`support_after`]).
async fn catch_up_and_learn(
    api: &Api<VolumeAttachment>,
    driver: &str,
    from: u64,
    seed: Option<AttachmentIndex>,
    catch_ups: &Mutex<CatchUps>,
) -> Result<CatchUpEnd, kube::Error> {
    let now = tokio::time::Instant::now();
    crate::metrics::count_live_read("catch up volumeattachments");
    let end = catch_up(api, driver, from, seed).await;
    let (before, after) = {
        let mut state = catch_ups.lock().unwrap_or_else(|p| p.into_inner());
        let before = state.support;
        state.support = support_after(&end, before, now);
        (before, state.support)
    };
    match &end {
        Ok(CatchUpEnd::Reached(_)) if before != after => {
            tracing::info!(
                from,
                "the API server's VolumeAttachment watch reached its current revision: checking attachments with catch-ups, not lists"
            );
        }
        Ok(CatchUpEnd::Reached(_)) => {}
        Ok(CatchUpEnd::Short(short)) => {
            tracing::info!(from, reached = ?short.reached, target = short.target, pause = ?CATCH_UP_PAUSE, "the API server's VolumeAttachment watch did not reach its current revision (its watch cache moves only with its own events, as on etcd without progress requests): checking attachments with lists of every VolumeAttachment for a while");
        }
        Ok(CatchUpEnd::Ended(status)) => {
            tracing::debug!(from, %status, "the API server ended the VolumeAttachment catch-up (410 Gone: it no longer has that revision); listing them");
        }
        // A list reports an error that persists.
        Err(e) => {
            tracing::debug!(from, error = %e, "catching up with VolumeAttachments failed; listing them");
        }
    }
    end
}

/// How a catch-up ended.
#[derive(Debug, PartialEq)]
enum CatchUpEnd {
    Reached(ListedAttachments),
    /// The watch ended before the revision: the server's watch cache
    /// does not get there on demand.
    Short(CatchUpShort),
    /// The server ended the watch with an error (410 Gone for a revision
    /// it no longer has, or another): this start cannot be caught up from.
    Ended(String),
}

/// Where a catch-up stopped short: the collection's revision it aimed at
/// and the highest it saw.
#[derive(Debug, PartialEq, Eq)]
pub struct CatchUpShort {
    pub target: u64,
    pub reached: Option<u64>,
}

/// The attachment events since revision `from` up to the collection's
/// current one: a consistent `LIST ?limit=1` names that revision (and
/// brings an API server's watch cache up to it when the server can ask
/// etcd for progress), then a watch from `from` with bookmarks carries
/// every change since, until an event or bookmark at or past it. `seed`:
/// every attachment at `from` (the answer is then whole).
async fn catch_up(
    api: &Api<VolumeAttachment>,
    driver: &str,
    from: u64,
    seed: Option<AttachmentIndex>,
) -> Result<CatchUpEnd, kube::Error> {
    let current = api.list(&ListParams::default().limit(1)).await?;
    let Some(target) = current
        .metadata
        .resource_version
        .as_deref()
        .and_then(|rv| rv.parse::<u64>().ok())
    else {
        return Ok(CatchUpEnd::Short(CatchUpShort {
            target: 0,
            reached: None,
        }));
    };
    let mut fold = CatchUp::new(driver, target, from, seed);
    if fold.reached() {
        return Ok(CatchUpEnd::Reached(fold.into_listed()));
    }
    let params = WatchParams::default().timeout(CATCH_UP_TIMEOUT_SECONDS);
    let mut events = api.watch(&params, &from.to_string()).await?.boxed();
    while let Some(event) = events.next().await {
        match fold.on_event(event?) {
            Step::More => {}
            Step::Reached => return Ok(CatchUpEnd::Reached(fold.into_listed())),
            Step::Ended(status) => return Ok(CatchUpEnd::Ended(status)),
            Step::Short => break,
        }
    }
    Ok(CatchUpEnd::Short(fold.short()))
}

/// What a catch-up does after an event.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    More,
    Reached,
    /// An ERROR event, described.
    Ended(String),
    /// It will not get there: a bookmark below the target (the server's
    /// watch cache is behind what its consistent list read), or a revision
    /// that is not a number (not an etcd-backed server).
    Short,
}

/// A catch-up's fold over watch events (pure: tested with plain events).
#[derive(Debug)]
struct CatchUp {
    driver: String,
    target: u64,
    seen: u64,
    index: AttachmentIndex,
    /// Started from every attachment at `from`: deletions apply.
    whole: bool,
}

impl CatchUp {
    fn new(driver: &str, target: u64, from: u64, seed: Option<AttachmentIndex>) -> Self {
        Self {
            driver: driver.to_owned(),
            target,
            seen: from,
            whole: seed.is_some(),
            index: seed.unwrap_or_default(),
        }
    }

    fn reached(&self) -> bool {
        self.seen >= self.target
    }

    fn on_event(&mut self, event: WatchEvent<VolumeAttachment>) -> Step {
        let revision = match &event {
            WatchEvent::Added(a) | WatchEvent::Modified(a) | WatchEvent::Deleted(a) => {
                a.metadata.resource_version.as_deref()
            }
            WatchEvent::Bookmark(b) => Some(b.metadata.resource_version.as_str()),
            WatchEvent::Error(status) => {
                return Step::Ended(format!("{} {}", status.code, status.message));
            }
        };
        match &event {
            WatchEvent::Added(a) | WatchEvent::Modified(a) if a.spec.attacher == self.driver => {
                self.index.applied(a);
            }
            WatchEvent::Deleted(a) if self.whole && a.spec.attacher == self.driver => {
                self.index.deleted(a);
            }
            _ => {}
        }
        // A watch is ordered: past an event at a revision, every change
        // up to it has come.
        match revision.and_then(|rv| rv.parse::<u64>().ok()) {
            Some(rv) => self.seen = self.seen.max(rv),
            None => return Step::Short,
        }
        if self.reached() {
            Step::Reached
        } else if matches!(event, WatchEvent::Bookmark(_)) {
            // kube-apiserver sends a watch's bookmark with its watch
            // cache's revision, two seconds before the timeout. A server
            // that can bring that cache up to date on demand has done so
            // for the consistent list that named the target, before the
            // watch began: a bookmark below it says this server cannot, and
            // waiting out the timeout would only add two seconds.
            Step::Short
        } else {
            Step::More
        }
    }

    fn into_listed(self) -> ListedAttachments {
        ListedAttachments {
            revision: self.seen,
            index: self.index,
            whole: self.whole,
        }
    }

    fn short(&self) -> CatchUpShort {
        CatchUpShort {
            target: self.target,
            reached: (self.seen > 0).then_some(self.seen),
        }
    }
}

/// Every VolumeAttachment of `driver`, listed in pages from a consistent
/// read, with the list's revision.
async fn list_live(
    api: &Api<VolumeAttachment>,
    driver: &str,
) -> Result<ListedAttachments, kube::Error> {
    let mut listed = ListedAttachments {
        whole: true,
        ..ListedAttachments::default()
    };
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = api.list(&params).await?;
        if let Some(revision) = page
            .metadata
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
        {
            listed.revision = listed.revision.max(revision);
        }
        for attachment in page.items.iter().filter(|a| a.spec.attacher == driver) {
            listed.index.applied(attachment);
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(listed),
        }
    }
}

#[cfg(test)]
#[path = "attached_tests.rs"]
mod tests;
