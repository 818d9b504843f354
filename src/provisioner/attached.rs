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
//! - else the last live list of attachments if it was made at or past that
//!   revision, together with the cache (an attachment in either counts:
//!   the error is only ever a wait);
//! - else a live list of every VolumeAttachment, in pages, batched: the
//!   deletes that ask while no list is under way share one.
//!
//! The cache keeps only this driver's attachments ([`crate::relevance`]),
//! indexed by PV name ([`AttachmentIndex`]), so a check costs a lookup,
//! not a copy of the cache.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::api::{Api, ListParams};

use crate::informer::{Change, Informer};
use crate::live_batch::LiveBatch;
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

/// Page size of the live list, as the caches' own lists.
const PAGE: u32 = 500;

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

/// A live list's answer: the index of the attachments it held and the
/// revision it was read at.
#[derive(Debug, Default)]
pub struct ListedAttachments {
    pub revision: u64,
    pub index: AttachmentIndex,
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
/// lists and the last one's answer.
pub struct Attachments {
    index: Arc<Mutex<AttachmentIndex>>,
    live: LiveBatch<ListedAttachments>,
    last_list: Mutex<Option<Arc<ListedAttachments>>>,
}

impl Attachments {
    /// Feeds the index from `cache` (call before the caches start) and
    /// lists live through `client`, keeping `driver`'s attachments.
    pub fn new(cache: &Informer<VolumeAttachment>, client: Client, driver: &str) -> Self {
        let driver = driver.to_owned();
        Self::with_lister(cache, move || {
            let api: Api<VolumeAttachment> = Api::all(client.clone());
            let driver = driver.clone();
            Box::pin(async move { list_live(&api, &driver).await.map_err(|e| e.to_string()) })
        })
    }

    /// With any list function (tests count the calls).
    pub fn with_lister(
        cache: &Informer<VolumeAttachment>,
        lister: impl Fn() -> futures_util::future::BoxFuture<'static, Result<ListedAttachments, String>>
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
        Self {
            index,
            live: LiveBatch::with_reader(LIVE_WINDOW, move |_| lister())
                .at_most_every(LIVE_LIST_INTERVAL),
            last_list: Mutex::default(),
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
        let cached = self
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .node_of(pv)
            .map(str::to_owned);
        match from {
            AnswerFrom::Cache => Ok(cached),
            AnswerFrom::CacheAndLastList => {
                Ok(cached.or_else(|| last.and_then(|l| l.index.node_of(pv).map(str::to_owned))))
            }
            AnswerFrom::LiveList => {
                tracing::debug!(volume = %pv, ?revision, cache = cache.applied_revision(), "attachment cache behind the PV: listing VolumeAttachments live");
                crate::metrics::count_live_read("list volumeattachments");
                let listed = self.live.read("").await?;
                {
                    let mut last = self.last_list.lock().unwrap_or_else(|p| p.into_inner());
                    if last.as_ref().is_none_or(|l| l.revision < listed.revision) {
                        *last = Some(Arc::clone(&listed));
                    }
                }
                Ok(cached.or_else(|| listed.index.node_of(pv).map(str::to_owned)))
            }
        }
    }
}

/// Every VolumeAttachment of `driver`, listed in pages from a consistent
/// read, with the list's revision.
async fn list_live(
    api: &Api<VolumeAttachment>,
    driver: &str,
) -> Result<ListedAttachments, kube::Error> {
    let mut listed = ListedAttachments::default();
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
