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
}

/// Log and counters.
#[derive(Debug, Default)]
pub struct Observations {
    pub log: Vec<RequestRecord>,
    pub counters: BTreeMap<(Verb, String), u64>,
}

impl Observations {
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
