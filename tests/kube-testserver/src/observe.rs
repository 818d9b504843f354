//! Request log and counters.

use std::collections::BTreeMap;
use std::fmt;

/// The Kubernetes verb of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verb {
    /// GET of one object.
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH.
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
    /// Anything that is not a resource request (discovery, /version, ...).
    NonResource,
}

impl Verb {
    /// Whether the verb changes state.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }

    /// The lower-case name used by the API server (`get`, `list`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::NonResource => "nonresource",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a request came from: the in-process client (a test's own reads
/// and writes) or one of the HTTP listeners (a process under test), so a
/// test can count only the requests of the process it watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    InProcess,
    /// The listener's port.
    Http(u16),
}

/// One handled request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// Which client sent it.
    pub origin: Origin,
    /// The verb.
    pub verb: Verb,
    /// Plural resource, with `/subresource` appended for subresources
    /// (`"persistentvolumeclaims/status"`); `""` for non-resource requests.
    pub resource: String,
    /// Namespace from the URL (`""` if none).
    pub namespace: String,
    /// Object name from the URL (`""` if none).
    pub name: String,
    /// HTTP status answered (0 when the request was dropped by a partition).
    pub status: u16,
    /// Request path.
    pub path: String,
    /// The answer was an injected failure ([`crate::TestServer::fail_next`]),
    /// not the server's own.
    pub injected: bool,
    /// The request's place in the order the server received requests
    /// (0 for the first since the server started; never reset). The log is
    /// in the order requests were answered, which an injected latency
    /// changes: [`crate::TestServer::requests_received`] taken at an
    /// instant tells the requests received after it by this number.
    pub received: u64,
    /// When the server received it (its body read whole, before any
    /// injected latency): to place it against what a test did meanwhile.
    pub received_at: std::time::Instant,
}

/// Log and counters.
#[derive(Debug, Default)]
pub struct Observations {
    pub log: Vec<RequestRecord>,
    pub counters: BTreeMap<(Verb, String), u64>,
    /// Requests received so far (never reset).
    pub received: u64,
}

impl Observations {
    /// Numbers a request as it arrives (see [`RequestRecord::received`]).
    pub fn receive(&mut self) -> u64 {
        self.received += 1;
        self.received - 1
    }

    pub fn record(&mut self, r: RequestRecord) {
        *self
            .counters
            .entry((r.verb, r.resource.clone()))
            .or_default() += 1;
        self.log.push(r);
    }

    pub fn reset(&mut self) {
        self.log.clear();
        self.counters.clear();
    }
}
