use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::projection::{VolumeAttachmentSource, VolumeAttachmentSpec};

fn attachment(name: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: Some("1".to_owned()),
            ..ObjectMeta::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: "driver".to_owned(),
            node_name: node.to_owned(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_owned()),
            },
        },
    }
}

#[test]
fn the_index_follows_attachments_by_volume() {
    let mut index = AttachmentIndex::default();
    assert_eq!(index.node_of("pv"), None);
    index.applied(&attachment("b", "pv", "node-b"));
    index.applied(&attachment("a", "pv", "node-a"));
    index.applied(&attachment("c", "other", "node-c"));
    assert_eq!(index.node_of("pv"), Some("node-a"), "first by name: stable");
    assert_eq!(index.len(), 2);
    index.deleted(&attachment("a", "pv", "node-a"));
    assert_eq!(index.node_of("pv"), Some("node-b"));
    index.deleted(&attachment("b", "pv", "node-b"));
    assert_eq!(index.node_of("pv"), None);
    assert_eq!(
        index.len(),
        1,
        "a volume without attachments leaves no entry"
    );
    // An inline (migrated) attachment names no PV: nothing to index.
    let mut inline = attachment("d", "x", "node-d");
    inline.spec.source.persistent_volume_name = None;
    index.applied(&inline);
    assert_eq!(index.len(), 1);
}

#[test]
fn the_answer_comes_from_whatever_is_current_for_the_revision() {
    use AnswerFrom::*;
    // (revision of the PV, cache's applied revision, last list's) → source.
    let table = [
        (Some(10), 10, None, Cache),
        (Some(10), 11, None, Cache),
        (Some(10), 11, Some(5), Cache),
        (Some(10), 9, None, LiveList),
        (Some(10), 9, Some(9), LiveList),
        (Some(10), 9, Some(10), CacheAndLastList),
        (Some(10), 0, Some(12), CacheAndLastList),
        (Some(1), 0, None, LiveList),
        // Not a number: never taken as covered.
        (None, u64::MAX, Some(u64::MAX), LiveList),
    ];
    for (revision, cache, last, want) in table {
        assert_eq!(
            answer_from(revision, cache, last),
            want,
            "revision {revision:?}, cache {cache}, last list {last:?}"
        );
    }
}

fn counting(
    calls: Arc<AtomicUsize>,
    listed: Vec<VolumeAttachment>,
    at: u64,
) -> (Informer<VolumeAttachment>, Attachments) {
    let cache: Informer<VolumeAttachment> = Informer::new();
    let attachments = Attachments::with_lister(&cache, move |_base| {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut index = AttachmentIndex::default();
        for a in &listed {
            index.applied(a);
        }
        Box::pin(async move {
            Ok(ListedAttachments {
                revision: at,
                index,
                whole: true,
            })
        })
    });
    (cache, attachments)
}

/// The race CI found: the PV's release (revision 20) arrives while the
/// attachment made at revision 15 is still on its way to the cache (which
/// has applied nothing past 10). The cache alone says "not attached"; the
/// check must not believe it.
#[tokio::test(start_paused = true)]
async fn an_attachment_still_on_its_way_to_the_cache_is_found_live() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (cache, attachments) = counting(calls.clone(), vec![attachment("va", "pv", "node-1")], 21);
    let node = attachments
        .attached_node(&cache, "pv", Some(20))
        .await
        .expect("listed");
    assert_eq!(node.as_deref(), Some("node-1"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Another PV released before that list: answered by it, no new list.
    let other = attachments
        .attached_node(&cache, "other", Some(19))
        .await
        .expect("covered by the last list");
    assert_eq!(other, None);
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the last list covers it");
    // A PV released after it: listed again.
    attachments
        .attached_node(&cache, "later", Some(22))
        .await
        .expect("listed");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn concurrent_checks_share_one_live_list() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (cache, attachments) = counting(calls.clone(), vec![attachment("va", "a", "n")], 50);
    let (a, b, c) = tokio::join!(
        attachments.attached_node(&cache, "a", Some(40)),
        attachments.attached_node(&cache, "b", Some(41)),
        attachments.attached_node(&cache, "c", Some(42)),
    );
    assert_eq!(a.expect("a").as_deref(), Some("n"));
    assert_eq!(b.expect("b"), None);
    assert_eq!(c.expect("c"), None);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failed_live_list_is_an_error_not_a_detach() {
    let cache: Informer<VolumeAttachment> = Informer::new();
    let attachments =
        Attachments::with_lister(&cache, |_| Box::pin(async { Err("forbidden".to_owned()) }));
    let answer = attachments.attached_node(&cache, "pv", Some(3)).await;
    assert_eq!(answer, Err("forbidden".to_owned()));
}

/// Once the cache has applied the PV's revision, its index answers: no
/// request at all.
#[tokio::test(start_paused = true)]
async fn a_current_cache_answers_without_a_request() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (cache, attachments) = counting(calls.clone(), Vec::new(), 99);
    attachments
        .index
        .lock()
        .expect("index")
        .applied(&attachment("va", "pv", "node-1"));
    cache.set_applied_revision_for_tests(30);
    let node = attachments
        .attached_node(&cache, "pv", Some(30))
        .await
        .expect("cached");
    assert_eq!(node.as_deref(), Some("node-1"));
    assert_eq!(
        attachments.attached_node(&cache, "other", Some(25)).await,
        Ok(None)
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

/// The wait for the cache is bounded, and an event that arrives within it
/// saves the live list.
#[tokio::test(start_paused = true)]
async fn the_check_waits_briefly_for_the_cache() {
    let calls = Arc::new(AtomicUsize::new(0));
    let (cache, attachments) = counting(calls.clone(), Vec::new(), 99);
    let cache = Arc::new(cache);
    let late = {
        let cache = Arc::clone(&cache);
        tokio::spawn(async move {
            tokio::time::sleep(CACHE_WAIT / 2).await;
            cache.set_applied_revision_for_tests(40);
        })
    };
    let answer = attachments.attached_node(&cache, "pv", Some(40)).await;
    late.await.expect("task");
    assert_eq!(answer, Ok(None));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the cache got there in time"
    );
}

fn at(mut attachment: VolumeAttachment, revision: u64) -> VolumeAttachment {
    attachment.metadata.resource_version = Some(revision.to_string());
    attachment
}

fn bookmark(revision: &str) -> WatchEvent<VolumeAttachment> {
    WatchEvent::Bookmark(kube::core::watch::Bookmark {
        types: kube::core::TypeMeta::default(),
        metadata: kube::core::watch::BookmarkMeta {
            resource_version: revision.to_owned(),
            annotations: BTreeMap::new(),
        },
    })
}

/// A catch-up from revision 10 to the collection's 20: this driver's
/// attachments created or changed on the way are kept, another driver's
/// are not, a deletion is not applied (an attachment in either the cache
/// or the catch-up counts), and it ends at the first event or bookmark at
/// or past 20, with that revision.
#[test]
fn a_catch_up_keeps_this_drivers_attachments_up_to_the_collections_revision() {
    let mut fold = CatchUp::new("driver", 20, 10, None);
    assert!(!fold.reached());
    let mut theirs = at(attachment("theirs", "pv-t", "node-t"), 11);
    theirs.spec.attacher = "other".to_owned();
    let steps = [
        fold.on_event(WatchEvent::Added(at(attachment("va-1", "pv-1", "n1"), 12))),
        fold.on_event(WatchEvent::Added(theirs)),
        fold.on_event(WatchEvent::Modified(at(
            attachment("va-2", "pv-2", "n2"),
            13,
        ))),
        fold.on_event(WatchEvent::Deleted(at(
            attachment("va-2", "pv-2", "n2"),
            14,
        ))),
    ];
    assert!(steps.iter().all(|s| *s == Step::More), "{steps:?}");
    assert_eq!(fold.on_event(bookmark("21")), Step::Reached);
    let listed = fold.into_listed();
    assert_eq!(listed.revision, 21);
    assert_eq!(listed.index.node_of("pv-1"), Some("n1"));
    assert_eq!(
        listed.index.node_of("pv-2"),
        Some("n2"),
        "deleted: still counted"
    );
    assert_eq!(listed.index.node_of("pv-t"), None, "another driver's");

    // An event at the revision ends it as well as a bookmark does.
    let mut fold = CatchUp::new("driver", 20, 10, None);
    assert_eq!(
        fold.on_event(WatchEvent::Added(at(attachment("va", "pv", "n"), 20))),
        Step::Reached
    );
    assert_eq!(fold.into_listed().index.node_of("pv"), Some("n"));

    // A cache already at the revision needs no watch.
    assert!(CatchUp::new("driver", 20, 20, None).reached());
}

/// A watch that cannot go on (410 Gone: the server no longer has the
/// cache's revision) ends the catch-up; a bookmark below the target (a
/// watch cache that its consistent list did not bring up to date: etcd
/// without progress requests) and a revision that is not a number end it
/// short at once, saying how far it got: the check then lists.
#[test]
fn a_catch_up_ends_short_on_an_error_a_bookmark_below_its_target_or_no_number() {
    let mut fold = CatchUp::new("driver", 20, 10, None);
    assert_eq!(
        fold.on_event(WatchEvent::Added(at(attachment("va", "pv", "n"), 15))),
        Step::More
    );
    let gone = WatchEvent::Error(Box::new(
        kube::core::Status::failure("too old resource version", "Expired").with_code(410),
    ));
    assert_eq!(
        fold.on_event(gone),
        Step::Ended("410 too old resource version".to_owned())
    );
    assert_eq!(
        fold.short(),
        CatchUpShort {
            target: 20,
            reached: Some(15)
        }
    );
    let mut fold = CatchUp::new("driver", 20, 10, None);
    assert_eq!(fold.on_event(bookmark("abc")), Step::Short);

    let mut fold = CatchUp::new("driver", 20, 10, None);
    assert_eq!(fold.on_event(bookmark("19")), Step::Short);
    assert_eq!(
        fold.short(),
        CatchUpShort {
            target: 20,
            reached: Some(19)
        }
    );
}

/// A delete waits on a catch-up only where one has reached its target;
/// unknown (at the start, or once a pause after a short one runs out), a
/// read lists and one catch-up at a time learns beside it; never from a
/// cache that has applied nothing.
#[test]
fn a_delete_waits_on_a_catch_up_only_where_one_has_reached() {
    use CatchUpSupport::{Reaches, Short, Unknown};
    use LivePlan::{CatchUp, List, ListAndLearn};
    let now = tokio::time::Instant::now();
    let later = now + Duration::from_secs(1);
    let earlier = now - Duration::from_secs(1);
    for (from, support, learning, plan) in [
        (0, Reaches, false, List),
        (0, Unknown, false, List),
        (7, Reaches, false, CatchUp),
        (7, Reaches, true, CatchUp),
        (7, Unknown, false, ListAndLearn),
        (7, Unknown, true, List),
        (7, Short { until: later }, false, List),
        (7, Short { until: now }, false, ListAndLearn),
        (7, Short { until: earlier }, false, ListAndLearn),
        (7, Short { until: earlier }, true, List),
    ] {
        assert_eq!(
            plan_live_read(from, support, learning, now),
            plan,
            "from {from}, {support:?}, learning {learning}"
        );
    }
}

/// Reached, the server gets there; short, it does not for the pause from
/// the catch-up's start; a 410 (about its start, which the list made then
/// replaces) or a failed request (about the moment) changes nothing.
#[test]
fn what_a_catch_ups_end_says_of_the_server() {
    use CatchUpSupport::{Reaches, Short, Unknown};
    let now = tokio::time::Instant::now();
    let short = || {
        Ok(CatchUpEnd::Short(CatchUpShort {
            target: 20,
            reached: Some(19),
        }))
    };
    let reached = || Ok(CatchUpEnd::Reached(ListedAttachments::default()));
    let gone = || Ok(CatchUpEnd::Ended("410 too old resource version".to_owned()));
    let failed = || {
        Err(kube::Error::Service(Box::new(std::io::Error::other(
            "connection reset",
        ))))
    };
    let paused = Short {
        until: now + CATCH_UP_PAUSE,
    };
    for before in [Unknown, Reaches, paused] {
        assert_eq!(support_after(&reached(), before, now), Reaches);
        assert_eq!(support_after(&short(), before, now), paused);
        assert_eq!(support_after(&gone(), before, now), before);
        assert_eq!(support_after(&failed(), before, now), before);
    }
}

/// The cache's answer is read *after* the live read: a catch-up holds only
/// what came after the cache's revision when it began, so an attachment
/// the cache applied while the check waited for its read (here at
/// revision 15, before the read began from 15) is in neither a read of
/// the cache taken before nor in the catch-up. Reading it before was
/// right for a list, which holds everything.
#[tokio::test(start_paused = true)]
async fn the_cache_is_read_after_a_catch_up_that_starts_from_it() {
    let cache = Arc::new(Informer::<VolumeAttachment>::new());
    let froms = Arc::new(Mutex::new(Vec::new()));
    let attachments = {
        let froms = Arc::clone(&froms);
        Arc::new(Attachments::with_lister(&cache, move |base| {
            froms.lock().expect("froms").push(base.start().0);
            // Nothing changed after the start: the catch-up saw nothing.
            Box::pin(async move {
                Ok(ListedAttachments {
                    revision: 25,
                    index: AttachmentIndex::default(),
                    whole: false,
                })
            })
        }))
    };
    cache.set_applied_revision_for_tests(10);
    let arrives = {
        let cache = Arc::clone(&cache);
        let attachments = Arc::clone(&attachments);
        tokio::spawn(async move {
            // Past the cache wait, within the batch's window.
            tokio::time::sleep(CACHE_WAIT + LIVE_WINDOW / 2).await;
            attachments
                .index
                .lock()
                .expect("index")
                .applied(&attachment("va", "pv", "node-1"));
            cache.set_applied_revision_for_tests(15);
        })
    };
    let node = attachments
        .attached_node(&cache, "pv", Some(20))
        .await
        .expect("read");
    arrives.await.expect("task");
    assert_eq!(
        *froms.lock().expect("froms"),
        vec![15],
        "the read began from the cache's revision"
    );
    assert_eq!(node.as_deref(), Some("node-1"));
}

/// A catch-up started from a whole list (the cache older than it) brings
/// the list forward: deletions apply, and the answer stays whole.
#[test]
fn a_catch_up_from_a_whole_list_applies_deletions() {
    let mut listed = AttachmentIndex::default();
    listed.applied(&attachment("va-1", "pv-1", "n1"));
    listed.applied(&attachment("va-2", "pv-2", "n2"));
    let mut fold = CatchUp::new("driver", 30, 20, Some(listed));
    assert_eq!(
        fold.on_event(WatchEvent::Deleted(at(
            attachment("va-1", "pv-1", "n1"),
            22
        ))),
        Step::More
    );
    assert_eq!(
        fold.on_event(WatchEvent::Added(at(attachment("va-3", "pv-3", "n3"), 23))),
        Step::More
    );
    assert_eq!(fold.on_event(bookmark("30")), Step::Reached);
    let listed = fold.into_listed();
    assert!(listed.whole);
    assert_eq!(listed.index.node_of("pv-1"), None, "detached on the way");
    assert_eq!(listed.index.node_of("pv-2"), Some("n2"));
    assert_eq!(listed.index.node_of("pv-3"), Some("n3"));
}

/// Where a catch-up starts: a whole last read newer than the cache (after
/// the API server's restart a watch from the cache's revision is 410 Gone
/// until an attachment changes; the list made then is the next start),
/// else the cache.
#[test]
fn a_catch_up_starts_from_the_newer_of_the_cache_and_a_whole_last_read() {
    let read = |revision: u64, whole: bool| {
        let mut index = AttachmentIndex::default();
        index.applied(&attachment("va", "pv", "n"));
        Some(Arc::new(ListedAttachments {
            revision,
            index,
            whole,
        }))
    };
    let start = |cache: u64, last| ReadBase { cache, last }.start();
    assert_eq!(start(10, None), (10, None));
    let (from, seed) = start(10, read(40, true));
    assert_eq!(from, 40);
    assert_eq!(seed.expect("seeded").node_of("pv"), Some("n"));
    assert_eq!(start(50, read(40, true)), (50, None), "the cache is newer");
    assert_eq!(
        start(10, read(40, false)),
        (10, None),
        "changes only: not a start"
    );
}
