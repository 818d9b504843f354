//! Fault injection: failing or delaying requests that match a rule, and a
//! switchable network partition.

use std::time::Duration;

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

#[cfg(test)]
mod tests {
    use super::*;

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
