//! Live lists of a namespace's pods, batched: every worker that asks for
//! namespace `ns` while no list of `ns` has been sent yet joins one batch,
//! and the batch's single list is sent after a short window. A list that
//! was already sent is never joined, because it may predate the pod that
//! makes the asker's claim busy: each answer reflects the API server's state
//! after the question was asked, which is the point of asking it.

use std::sync::Arc;
use std::time::Duration;

use crate::live_batch::LiveBatch;
use crate::projection::Pod;
use futures_util::future::BoxFuture;
use kube::Client;
use kube::api::{Api, ListParams};

/// Why a live list gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot list the pods of namespace {namespace}: {message}")]
pub struct LiveListError {
    pub namespace: String,
    pub message: String,
}

/// The batcher. Clones share batches.
#[derive(Clone)]
pub struct LivePods {
    batch: LiveBatch<Vec<Pod>>,
}

impl LivePods {
    /// Lists through the API (`GET /api/v1/namespaces/<ns>/pods`).
    pub fn new(client: Client, window: Duration) -> Self {
        Self::with_lister(window, move |namespace| {
            let api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
            Box::pin(async move {
                api.list(&ListParams::default())
                    .await
                    .map(|list| list.items)
                    .map_err(|e| e.to_string())
            })
        })
    }

    /// With any list function (tests count the calls).
    pub fn with_lister(
        window: Duration,
        lister: impl Fn(String) -> BoxFuture<'static, Result<Vec<Pod>, String>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            batch: LiveBatch::with_reader(window, lister),
        }
    }

    /// The pods of `namespace`, from a list sent after this call began.
    pub async fn list(&self, namespace: &str) -> Result<Arc<Vec<Pod>>, LiveListError> {
        self.batch
            .read(namespace)
            .await
            .map_err(|message| LiveListError {
                namespace: namespace.to_owned(),
                message,
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn pod(ns: &str, name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn counting(calls: Arc<AtomicUsize>, fail_ns: &'static str) -> LivePods {
        LivePods::with_lister(Duration::from_millis(20), move |ns| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                if ns == fail_ns {
                    Err("boom".to_owned())
                } else {
                    Ok(vec![pod(&ns, &format!("list-{n}"))])
                }
            })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_askers_share_one_list_per_namespace() {
        let calls = Arc::new(AtomicUsize::new(0));
        let live = counting(calls.clone(), "bad");
        let (a, b, c) = tokio::join!(live.list("ns"), live.list("ns"), live.list("other"));
        let (a, b, c) = (a.expect("a"), b.expect("b"), c.expect("c"));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "one per namespace");
        assert!(Arc::ptr_eq(&a, &b), "same answer for the same namespace");
        assert_eq!(c[0].metadata.namespace.as_deref(), Some("other"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_list_already_sent_is_not_joined() {
        let calls = Arc::new(AtomicUsize::new(0));
        let live = counting(calls.clone(), "bad");
        let first = live.list("ns").await.expect("first");
        let second = live.list("ns").await.expect("second");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_ne!(first[0].metadata.name, second[0].metadata.name);
    }

    #[tokio::test(start_paused = true)]
    async fn errors_reach_every_asker_and_name_the_namespace() {
        let calls = Arc::new(AtomicUsize::new(0));
        let live = counting(calls.clone(), "bad");
        let (a, b) = tokio::join!(live.list("bad"), live.list("bad"));
        let want = LiveListError {
            namespace: "bad".to_owned(),
            message: "boom".to_owned(),
        };
        assert_eq!(a.expect_err("a"), want);
        assert_eq!(b.expect_err("b"), want);
        assert!(want.to_string().contains("namespace bad"));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // The failed batch is closed: the next ask lists again.
        live.list("bad").await.expect_err("again");
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
