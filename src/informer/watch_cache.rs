//! The first list of a cache from the API server's watch cache, then a
//! watch from it (see [`from_watch_cache`]); the informer hands over to
//! kube's watcher at the first error.

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// The first list of a cache on an API server without streaming lists:
/// read from the API server's watch cache (`resourceVersion=0`), in pages of
/// 500, then watched from the list's resourceVersion, as client-go's
/// reflector starts. A list from etcd (kube's watcher: no resourceVersion,
/// a consistent read) costs the API server a range read of etcd per page;
/// at 50,000 objects that doubled the time to the first provisioned volume.
///
/// Only at start-up: nothing has been seen yet, so the cache's view cannot
/// be older than something seen. The stream ends at the first error, a
/// `410 Gone` or any list or watch failure, and the caller's kube watcher
/// takes over: it lists again from etcd (consistent), and the informer
/// announces what that list lacks as deleted, as after any re-list. An API
/// server's watch cache answers with the whole list whatever the page size
/// (Kubernetes 1.36 does for cached resources), so the response is decoded
/// object by object as it arrives ([`crate::streamed_list`]): the list is
/// never held whole, raw or decoded.
pub(super) fn from_watch_cache<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl futures_util::Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    enum Phase<K> {
        Start,
        Page(String),
        /// Listing: the objects received and not yet passed on.
        Listing(Batches<K>, std::collections::VecDeque<K>),
        Watch(String),
        Watching(
            futures_util::stream::BoxStream<'static, Result<WatchEvent<K>, kube::Error>>,
            String,
        ),
        Done,
    }
    use crate::streamed_list;
    use kube::api::{ListParams, WatchEvent, WatchParams};
    type Batches<K> =
        tokio::sync::mpsc::Receiver<Result<streamed_list::Item<K>, streamed_list::ListError>>;

    let list_error = |e: streamed_list::ListError| match e {
        streamed_list::ListError::Request(e) => e,
        streamed_list::ListError::Decode(e) => kube::Error::SerdeError(e),
        other => kube::Error::SerdeError(serde::de::Error::custom(other)),
    };
    let open_page = {
        let api = api.clone();
        move |continue_token: Option<String>| {
            let api = api.clone();
            let params = ListParams {
                label_selector: config.label_selector.clone(),
                field_selector: config.field_selector.clone(),
                limit: Some(500),
                continue_token: continue_token.clone(),
                ..ListParams::default()
            };
            async move {
                let request = kube::core::Request::new(api.resource_url())
                    .list(&params)
                    .map_err(kube::Error::BuildRequest)?;
                // kube leaves `resourceVersion=0` out of a list with a page
                // size (older watch caches ignored the size); the first page
                // names it, later pages carry only the continue token.
                let request = if continue_token.is_none() {
                    let (mut parts, body) = request.into_parts();
                    let uri = format!("{}&resourceVersion=0", parts.uri);
                    parts.uri = uri.parse().map_err(|e: http::uri::InvalidUri| {
                        kube::Error::BuildRequest(kube::core::request::Error::Validation(
                            e.to_string(),
                        ))
                    })?;
                    http::Request::from_parts(parts, body)
                } else {
                    request
                };
                let client = api.into_client();
                streamed_list::open::<K>(&client, request)
                    .await
                    .map_err(list_error)
            }
        }
    };
    futures_util::stream::unfold(Phase::Start, move |phase| {
        let open_page = open_page.clone();
        let api = api.clone();
        async move {
            let mut phase = phase;
            loop {
                phase = match phase {
                    Phase::Done => return None,
                    Phase::Start => match open_page(None).await {
                        Ok(items) => {
                            return Some((
                                Ok(Event::Init),
                                Phase::Listing(items, Default::default()),
                            ));
                        }
                        Err(e) => {
                            tracing::debug!(kind = %K::kind(&()), error = %e, "list from the watch cache failed; listing from etcd instead");
                            return None;
                        }
                    },
                    Phase::Page(continue_token) => match open_page(Some(continue_token)).await {
                        Ok(items) => Phase::Listing(items, Default::default()),
                        // The next list's Init drops the partial one.
                        Err(e) => {
                            return Some((Err(watcher::Error::InitialListFailed(e)), Phase::Done));
                        }
                    },
                    Phase::Listing(mut items, mut received) => {
                        if let Some(obj) = received.pop_front() {
                            return Some((
                                Ok(Event::InitApply(obj)),
                                Phase::Listing(items, received),
                            ));
                        }
                        match items.recv().await {
                            Some(Ok(streamed_list::Item::Objects(batch))) => {
                                Phase::Listing(items, batch.into())
                            }
                            Some(Ok(streamed_list::Item::End {
                                resource_version,
                                continue_token,
                            })) => match continue_token {
                                Some(token) => Phase::Page(token),
                                None if resource_version.is_empty() => return None,
                                None => {
                                    return Some((
                                        Ok(Event::InitDone),
                                        Phase::Watch(resource_version),
                                    ));
                                }
                            },
                            Some(Err(e)) => {
                                return Some((
                                    Err(watcher::Error::InitialListFailed(list_error(e))),
                                    Phase::Done,
                                ));
                            }
                            None => return None,
                        }
                    }
                    Phase::Watch(version) => {
                        let params = WatchParams::default().timeout(290);
                        match api.watch(&params, &version).await {
                            Ok(stream) => Phase::Watching(stream.boxed(), version),
                            Err(e) => {
                                tracing::debug!(kind = %K::kind(&()), error = %e, "watch after the list from the watch cache failed; the watcher takes over");
                                return None;
                            }
                        }
                    }
                    Phase::Watching(mut stream, version) => match stream.next().await {
                        // The server's timeout: watch again from where we are.
                        None => Phase::Watch(version),
                        Some(Ok(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                            let version = ResourceExt::resource_version(&obj).unwrap_or(version);
                            return Some((Ok(Event::Apply(obj)), Phase::Watching(stream, version)));
                        }
                        Some(Ok(WatchEvent::Deleted(obj))) => {
                            let version = ResourceExt::resource_version(&obj).unwrap_or(version);
                            return Some((
                                Ok(Event::Delete(obj)),
                                Phase::Watching(stream, version),
                            ));
                        }
                        Some(Ok(WatchEvent::Bookmark(bookmark))) => {
                            Phase::Watching(stream, bookmark.metadata.resource_version)
                        }
                        // 410 Gone or any other: the watcher re-lists.
                        Some(Ok(WatchEvent::Error(status))) => {
                            tracing::debug!(kind = %K::kind(&()), code = status.code, "watch ended; the watcher takes over with a new list");
                            return None;
                        }
                        Some(Err(e)) => {
                            tracing::debug!(kind = %K::kind(&()), error = %e, "watch failed; the watcher takes over with a new list");
                            return None;
                        }
                    },
                };
            }
        }
    })
}
