//! Fault injection: failing or delaying requests that match a rule, a
//! switchable network partition, and watch lags: the watch events of one
//! resource reaching remote watchers late.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::observe::{Origin, Verb};

/// Which requests a fault rule applies to. Unset fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMatch {
    /// The verb (`Verb::Get`, `Verb::Update`, ...).
    pub verb: Option<Verb>,
    /// Plural resource name, e.g. `"persistentvolumes"`; a subresource is
    /// matched as `"persistentvolumes/status"`.
    pub resource: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// Namespace.
    pub namespace: Option<String>,
    /// Only requests over HTTP (the processes under test), not those of
    /// the in-process client (the test's own).
    pub remote_only: bool,
}

impl RequestMatch {
    /// Matches every request.
    pub fn any() -> Self {
        Self::default()
    }

    /// Matches `verb` on `resource` (plural, or `plural/subresource`).
    pub fn new(verb: Verb, resource: &str) -> Self {
        Self {
            verb: Some(verb),
            resource: Some(resource.to_string()),
            ..Self::default()
        }
    }

    /// Restricts to a verb.
    pub fn verb(mut self, verb: Verb) -> Self {
        self.verb = Some(verb);
        self
    }

    /// Restricts to a resource (plural, or `plural/subresource`).
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }

    /// Restricts to an object name.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Restricts to a namespace.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.namespace = Some(namespace.to_string());
        self
    }

    /// Restricts to requests over HTTP: the processes under test, not the
    /// test's own in-process client.
    pub fn remote(mut self) -> Self {
        self.remote_only = true;
        self
    }

    /// Whether a request matches.
    pub fn matches(&self, verb: Verb, resource: &str, namespace: &str, name: &str) -> bool {
        self.verb.is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.namespace.as_deref().is_none_or(|n| n == namespace)
            && self.name.as_deref().is_none_or(|n| n == name)
    }
}

#[derive(Debug, Clone)]
enum Action {
    Fail {
        code: u16,
        remaining: u32,
    },
    /// Each matching request waits; `hits` counts them.
    Delay {
        delay: Duration,
        hits: u64,
    },
}

#[derive(Debug, Clone)]
struct Rule {
    matcher: RequestMatch,
    action: Action,
}

/// What to do with a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Sleep this long before handling.
    pub delay: Duration,
    /// Answer with this error code instead of handling.
    pub fail: Option<u16>,
}

/// Active fault rules.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<Rule>,
    pub partitioned: bool,
}

impl Faults {
    pub fn fail_next(&mut self, n: u32, matcher: RequestMatch, code: u16) {
        if n > 0 {
            self.rules.push(Rule {
                matcher,
                action: Action::Fail { code, remaining: n },
            });
        }
    }

    pub fn add_latency(&mut self, matcher: RequestMatch, delay: Duration) {
        self.rules.push(Rule {
            matcher,
            action: Action::Delay { delay, hits: 0 },
        });
    }

    /// Removes the first latency rule added with `matcher` (others stay)
    /// and returns how many requests it delayed; `None` if there was none.
    pub fn remove_latency(&mut self, matcher: &RequestMatch) -> Option<u64> {
        let found = self
            .rules
            .iter()
            .position(|r| matches!(r.action, Action::Delay { .. }) && &r.matcher == matcher)?;
        match self.rules.remove(found).action {
            Action::Delay { hits, .. } => Some(hits),
            Action::Fail { .. } => None,
        }
    }

    pub fn clear(&mut self) {
        self.rules.clear();
        self.partitioned = false;
    }

    /// Decides for one request from `origin`, consuming one use of the
    /// first matching failure rule.
    pub fn decide(
        &mut self,
        origin: Origin,
        verb: Verb,
        resource: &str,
        namespace: &str,
        name: &str,
    ) -> Decision {
        let mut d = Decision::default();
        for rule in &mut self.rules {
            if !rule.matcher.matches(verb, resource, namespace, name)
                || (rule.matcher.remote_only && origin == Origin::InProcess)
            {
                continue;
            }
            match &mut rule.action {
                Action::Delay { delay, hits } => {
                    d.delay += *delay;
                    *hits += 1;
                }
                Action::Fail { code, remaining } if d.fail.is_none() && *remaining > 0 => {
                    *remaining -= 1;
                    d.fail = Some(*code);
                }
                Action::Fail { .. } => {}
            }
        }
        self.rules
            .retain(|r| !matches!(r.action, Action::Fail { remaining: 0, .. }));
        d
    }
}

/// Watch lags ([`crate::TestServer::set_watch_lag`]): per plural resource
/// name, how long every message queued to a remote watch of it is held
/// before it is sent, and how many watch events were held. Kept in the
/// store's state: messages are queued under its lock, so their delivery
/// times follow the order of the writes.
#[derive(Debug, Default)]
pub struct WatchLags {
    lags: HashMap<String, Duration>,
    held: HashMap<String, u64>,
}

impl WatchLags {
    /// Lags the watches of `resource` by `lag` (zero: no lag).
    pub fn set(&mut self, resource: &str, lag: Duration) {
        if lag.is_zero() {
            self.lags.remove(resource);
        } else {
            self.lags.insert(resource.to_string(), lag);
        }
    }

    /// Ends the lag of `resource` (messages already held keep their time).
    pub fn clear(&mut self, resource: &str) {
        self.lags.remove(resource);
    }

    /// Ends every lag.
    pub fn clear_all(&mut self) {
        self.lags.clear();
    }

    /// When a message queued now to a watch of `resource` may be sent:
    /// `None` for at once (no lag on it, or a watch of the in-process
    /// client).
    pub fn due(&self, resource: &str, origin: Origin) -> Option<Instant> {
        if origin == Origin::InProcess {
            return None;
        }
        self.lags.get(resource).map(|lag| Instant::now() + *lag)
    }

    /// Counts `n` watch events of `resource` held.
    pub fn count_held(&mut self, resource: &str, n: u64) {
        if n > 0 {
            *self.held.entry(resource.to_string()).or_default() += n;
        }
    }

    /// Watch events of `resource` held since the last reset.
    pub fn held(&self, resource: &str) -> u64 {
        self.held.get(resource).copied().unwrap_or(0)
    }

    /// Forgets the counts of held events.
    pub fn reset_counts(&mut self) {
        self.held.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_lag_holds_remote_watches_of_its_resource_only() {
        let mut lags = WatchLags::default();
        let lag = Duration::from_millis(300);
        lags.set("volumeattachments", lag);
        let before = Instant::now();
        let due = lags.due("volumeattachments", Origin::Http(1));
        assert!(due.is_some_and(|d| d >= before + lag), "{due:?}");
        assert_eq!(lags.due("volumeattachments", Origin::InProcess), None);
        assert_eq!(lags.due("persistentvolumes", Origin::Http(1)), None);
        lags.count_held("volumeattachments", 2);
        lags.count_held("volumeattachments", 0);
        assert_eq!((lags.held("volumeattachments"), lags.held("nodes")), (2, 0));
        lags.set("volumeattachments", Duration::ZERO);
        assert_eq!(lags.due("volumeattachments", Origin::Http(1)), None);
        lags.set("nodes", lag);
        lags.clear_all();
        assert_eq!(lags.due("nodes", Origin::Http(1)), None);
        assert_eq!(lags.held("volumeattachments"), 2, "counts outlive the lag");
        lags.reset_counts();
        assert_eq!(lags.held("volumeattachments"), 0);
    }

    #[test]
    fn a_removed_latency_rule_delays_no_more_and_leaves_the_others() {
        let mut faults = Faults::default();
        let pvs = RequestMatch::new(Verb::Create, "persistentvolumes").remote();
        let slow = Duration::from_millis(300);
        faults.add_latency(pvs.clone(), slow);
        faults.add_latency(RequestMatch::any(), slow);
        faults.fail_next(1, pvs.clone(), 500);
        let origin = Origin::Http(1);
        let decide = |f: &mut Faults| f.decide(origin, Verb::Create, "persistentvolumes", "", "a");
        assert_eq!(faults.remove_latency(&pvs), Some(0));
        assert_eq!(faults.remove_latency(&pvs), None, "only one rule was added");
        let d = decide(&mut faults);
        assert_eq!((d.delay, d.fail), (slow, Some(500)));
        // Not a remote request: the remote-only rule passes it by.
        faults.add_latency(pvs.clone(), slow);
        let local = faults.decide(
            Origin::InProcess,
            Verb::Create,
            "persistentvolumes",
            "",
            "a",
        );
        assert_eq!(local.delay, slow);
        assert_eq!(faults.remove_latency(&RequestMatch::any()), Some(2));
        assert_eq!(faults.remove_latency(&pvs), Some(0));
        assert_eq!(decide(&mut faults), Decision::default());
    }
}
