use std::sync::atomic::{AtomicUsize, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::projection::{VolumeAttachmentSource, VolumeAttachmentSpec};

fn attachment(name: &str, pv: &str, node: &str) -> VolumeAttachment {
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
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
    let attachments = Attachments::with_lister(&cache, move || {
        calls.fetch_add(1, Ordering::SeqCst);
        let mut index = AttachmentIndex::default();
        for a in &listed {
            index.applied(a);
        }
        Box::pin(async move {
            Ok(ListedAttachments {
                revision: at,
                index,
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
        Attachments::with_lister(&cache, || Box::pin(async { Err("forbidden".to_owned()) }));
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
