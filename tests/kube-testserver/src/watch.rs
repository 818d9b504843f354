//! Watch: registration from a resourceVersion and the newline-delimited JSON
//! event stream. A watch lag ([`crate::TestServer::set_watch_lag`]) holds
//! each queued message of a remote watch until its time, in queue order.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body::Frame;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::observe::Origin;
use crate::resources::ResourceInfo;
use crate::selectors::Selectors;
use crate::store::{EventType, Queued, State, WatchMsg, Watcher, replay};

/// Where a watch starts.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchStart {
    /// `resourceVersion` unset or `"0"`: synthetic ADDED for current objects first.
    Current,
    /// `sendInitialEvents=true`: synthetic ADDED, then a BOOKMARK marking the end.
    InitialEvents,
    /// Events after this resourceVersion.
    From(u64),
}

/// Parameters of a watch request.
#[derive(Debug, Clone)]
pub struct WatchParams {
    pub res: usize,
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub start: WatchStart,
    pub bookmarks: bool,
    pub timeout: Duration,
    /// Who asked: watch lags hold remote watches only.
    pub origin: Origin,
}

/// A registered watch: its queue, or the 410 to send as an ERROR event.
pub enum Registered {
    Stream {
        id: u64,
        rx: mpsc::UnboundedReceiver<Queued>,
    },
    Gone(ApiError),
}

/// Registers a watcher and queues its initial events, atomically with respect
/// to writes, so no event is lost or duplicated between replay and live events.
pub fn register(state: &mut State, p: &WatchParams) -> Registered {
    if let WatchStart::From(rv) = p.start
        && rv < state.compacted_rv
    {
        return Registered::Gone(ApiError::expired(format!(
            "too old resource version: {rv} ({})",
            state.compacted_rv
        )));
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let id = state.alloc_id();
    let w = Watcher {
        id,
        res: p.res,
        namespace: p.namespace.clone(),
        selectors: p.selectors.clone(),
        origin: p.origin,
        tx,
    };
    let initial: Vec<WatchMsg> = match p.start {
        WatchStart::From(rv) => replay(state, &w, rv),
        WatchStart::Current | WatchStart::InitialEvents => {
            let mut v: Vec<WatchMsg> = state
                .iter_scope(p.res, p.namespace.as_deref())
                .filter(|o| p.selectors.matches(o))
                .map(|o| WatchMsg::Event(EventType::Added, o.clone()))
                .collect();
            if p.start == WatchStart::InitialEvents {
                v.push(WatchMsg::Bookmark {
                    rv: state.rv,
                    initial_events_end: true,
                });
            }
            v
        }
    };
    // A watch started during a lag sees its initial state no sooner than
    // the events a lagged watch would have brought.
    let due = state.watch_due(&w);
    let mut held = 0;
    for m in initial {
        held += u64::from(due.is_some() && matches!(m, WatchMsg::Event(..)));
        // The receiver is alive: it is returned below.
        let _ = w.send(m, due);
    }
    let resource = state.plural(p.res);
    state.watch_lags.count_held(resource, held);
    state.watchers.push(w);
    Registered::Stream { id, rx }
}

/// Encodes one watch event line.
pub fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

fn bookmark_object(info: &ResourceInfo, rv: u64, initial_events_end: bool) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    json!({"kind": info.kind, "apiVersion": info.api_version(), "metadata": meta})
}

fn encode(info: &ResourceInfo, msg: &WatchMsg) -> Bytes {
    match msg {
        WatchMsg::Event(t, obj) => event_line(t.as_str(), obj),
        WatchMsg::Bookmark {
            rv,
            initial_events_end,
        } => event_line("BOOKMARK", &bookmark_object(info, *rv, *initial_events_end)),
    }
}

/// Removes the watcher when the stream is dropped (client went away).
struct Guard {
    state: Arc<Mutex<State>>,
    id: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock() {
            s.remove_watcher(self.id);
        }
    }
}

struct StreamState {
    rx: mpsc::UnboundedReceiver<Queued>,
    /// The next message, received but held until its time.
    next: Option<Queued>,
    info: ResourceInfo,
    bookmarks: bool,
    bookmark_every: Duration,
    deadline: tokio::time::Instant,
    /// kube-apiserver's bookmark two seconds before the timeout (when the
    /// watch lasts longer than that), not yet sent.
    heartbeat: Option<tokio::time::Instant>,
    guard: Guard,
}

/// The body stream of a watch: queued events as they come (each not before
/// its time), a BOOKMARK after `bookmark_every` without a message when
/// requested and one two seconds before the timeout (as kube-apiserver
/// sends, so that a short watch ends knowing the server's revision),
/// ending at the timeout or when the server closes the watch.
pub fn event_stream(
    state: Arc<Mutex<State>>,
    id: u64,
    rx: mpsc::UnboundedReceiver<Queued>,
    info: ResourceInfo,
    bookmarks: bool,
    bookmark_every: Duration,
    timeout: Duration,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send {
    let now = tokio::time::Instant::now();
    let deadline = now + timeout;
    let st = StreamState {
        rx,
        next: None,
        info,
        bookmarks,
        bookmark_every,
        deadline,
        heartbeat: deadline
            .checked_sub(HEARTBEAT_BEFORE_TIMEOUT)
            .filter(|at| *at > now),
        guard: Guard { state, id },
    };
    futures_util::stream::unfold(st, |mut st| async move {
        loop {
            // The next message goes out once its time has come; those
            // behind it wait (in the channel) however early theirs is.
            let held_until = match st.next.as_ref().map(|q| q.due) {
                Some(Some(due)) if due > tokio::time::Instant::now() => Some(due),
                Some(_) => {
                    let q = st.next.take()?;
                    let line = encode(&st.info, &q.msg);
                    return Some((Ok(Frame::data(line)), st));
                }
                None => None,
            };
            let tick = tokio::time::sleep(st.bookmark_every);
            let release = tokio::time::sleep_until(held_until.unwrap_or(st.deadline));
            let heartbeat = tokio::time::sleep_until(st.heartbeat.unwrap_or(st.deadline));
            tokio::select! {
                msg = st.rx.recv(), if held_until.is_none() => {
                    st.next = Some(msg?);
                }
                _ = release, if held_until.is_some() => {}
                _ = tick, if st.bookmarks => st.queue_bookmark(),
                _ = heartbeat, if st.bookmarks && st.heartbeat.is_some() => {
                    st.heartbeat = None;
                    st.queue_bookmark();
                }
                _ = tokio::time::sleep_until(st.deadline) => return None,
            }
        }
    })
}

/// kube-apiserver sends a watch with bookmarks one this long before its
/// timeout.
const HEARTBEAT_BEFORE_TIMEOUT: Duration = Duration::from_secs(2);

impl StreamState {
    fn queue_bookmark(&self) {
        // Queue the bookmark behind every event already sent to this
        // watcher, under the state lock (held as long, when its resource
        // lags: it never overtakes a held event).
        if let Ok(s) = self.guard.state.lock()
            && let Some(w) = s.watchers.iter().find(|w| w.id == self.guard.id)
        {
            let _ = w.send(
                WatchMsg::Bookmark {
                    rv: s.rv,
                    initial_events_end: false,
                },
                s.watch_due(w),
            );
        }
    }
}

/// A stream of one ERROR event (410 Gone for a too old resourceVersion).
pub fn error_stream(
    err: &ApiError,
) -> impl Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + use<> {
    let line = event_line("ERROR", &err.status_body());
    futures_util::stream::iter([Ok(Frame::data(line))])
}
