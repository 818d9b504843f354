//! Leader election on a `coordination.k8s.io/v1` Lease, with client-go's
//! protocol and csi-lib-utils' naming, so that during a rolling upgrade the
//! Go sidecar and this one contend for the same Lease and never both lead.
//!
//! Written here rather than taken from a crate: `kube-leader-election`
//! supports only kube 4, and `kube-lease-manager` (kube 5) locks with
//! server-side apply and its own timing model (no renew deadline), which a
//! Go replica using client-go's read–modify–update with resourceVersion
//! would not respect. The protocol is small:
//!
//! - a candidate reads the Lease every retry period; it takes the Lease
//!   when there is none, when nobody holds it (released), or when the
//!   record has not changed for the record's lease duration as measured on
//!   the candidate's own clock since it first saw that record (so clock
//!   skew between nodes does not matter);
//! - every write is an update with the read resourceVersion: of two
//!   candidates only one wins, the other gets 409;
//! - the leader renews every retry period; when it has not renewed
//!   successfully for the renew deadline (shorter than the lease duration)
//!   it declares the lease lost — before any other candidate can take over,
//!   because those wait a full lease duration after the last renewal they
//!   saw — and the process stops every loop and exits non-zero.
//!
//! The decision is the pure [`decide`], table-tested below; [`Elector`]
//! does the I/O.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::Retryable;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api_calls::{ApiCall, in_own_namespace};

/// The API calls of leader election (with `--leader-election`): the Lease
/// in the sidecar's namespace, read–modify–update as client-go does. See
/// [`crate::api_calls`].
pub const API_CALLS: &[ApiCall] = &[in_own_namespace(
    "coordination.k8s.io",
    "leases",
    &["get", "create", "update"],
)];

/// What a Lease request refused by RBAC (403) is told with: the Role and
/// verbs the sidecar needs (deploy/kubernetes/base/rbac.yaml). `None` for
/// any other error.
pub fn lease_forbidden_hint(error: &kube::Error, namespace: &str) -> Option<String> {
    match error {
        kube::Error::Api(status) if status.code == 403 => Some(format!(
            "RBAC refuses the Lease: the sidecar's service account needs a Role in namespace \
             {namespace:?} allowing get, create and update on leases (apiGroup \
             coordination.k8s.io), bound to it by a RoleBinding: the Role csi-provisioner-cfg of \
             deploy/kubernetes/base/rbac.yaml"
        )),
        _ => None,
    }
}

/// csi-lib-utils' `defaultHealthCheckTimeout`: how much later than the lease
/// duration a missed renewal makes `/healthz/leader-election` fail.
pub const HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// Settings from `--leader-election-*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
    /// `--leader-election-labels`, put on the Lease by the leader.
    pub labels: BTreeMap<String, String>,
    /// `ReleaseLeaderElectionOnExit`: give the Lease up on a clean exit so
    /// the next leader need not wait for it to expire.
    pub release_on_exit: bool,
}

/// The Lease name for a driver: csi-lib-utils' `sanitizeName` (every
/// character other than `[a-zA-Z0-9-]` becomes `-`, and a trailing `-` gets
/// an `X`), lowercased so that a driver name with capitals still gives a
/// valid object name (the Go sidecar would fail on it; for every name it
/// accepts the result is identical).
pub fn lease_name(driver: &str) -> String {
    let mut name: String = driver
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if name.is_empty() || name.ends_with('-') {
        name.push('x');
    }
    name
}

/// The holder identity: the pod name (hostname) and a random suffix, so a
/// restarted pod with the same name is a new candidate, not the old leader.
pub fn identity(hostname: &str) -> String {
    let host = if hostname.is_empty() {
        "csi-provisioner"
    } else {
        hostname
    };
    format!("{host}_{}", uuid::Uuid::new_v4())
}

/// The part of a Lease the protocol reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `None` (or empty on the wire) when released.
    pub holder: Option<String>,
    pub lease_duration: Option<Duration>,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
}

impl Record {
    pub fn of(lease: &Lease) -> Record {
        let spec = lease.spec.clone().unwrap_or_default();
        Record {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
        }
    }

    fn spec(&self) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.holder.clone().unwrap_or_default()),
            lease_duration_seconds: self
                .lease_duration
                .map(|d| i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)),
            acquire_time: self.acquire_time.map(MicroTime),
            renew_time: self.renew_time.map(MicroTime),
            lease_transitions: Some(self.transitions),
            ..LeaseSpec::default()
        }
    }
}

/// What a candidate or leader does after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No Lease yet: create it, holding it.
    Create(Record),
    /// Write this record (renewal, or takeover) with the read
    /// resourceVersion.
    Update(Record),
    /// Someone else holds a valid lease.
    Wait {
        holder: String,
        /// Until the record expires if it stays unchanged.
        expires_in: Duration,
    },
}

/// The protocol's decision. `current` is the Lease's record (None: no
/// Lease), `unchanged_since` when this process first saw that exact record
/// (its own monotonic clock), `wall` the time written into the record.
pub fn decide(
    current: Option<&Record>,
    unchanged_since: Instant,
    now: Instant,
    wall: Timestamp,
    me: &str,
    lease_duration: Duration,
) -> Decision {
    let mine = |acquire_time, transitions| Record {
        holder: Some(me.to_owned()),
        lease_duration: Some(lease_duration),
        acquire_time: Some(acquire_time),
        renew_time: Some(wall),
        transitions,
    };
    let Some(current) = current else {
        return Decision::Create(mine(wall, 0));
    };
    match current.holder.as_deref() {
        Some(holder) if holder == me => Decision::Update(mine(
            current.acquire_time.unwrap_or(wall),
            current.transitions,
        )),
        Some(holder) => {
            // The holder's own duration counts (a released or shortened
            // lease expires sooner); a record without one gets ours.
            let valid_for = current.lease_duration.unwrap_or(lease_duration);
            let expires = unchanged_since + valid_for;
            if expires > now {
                Decision::Wait {
                    holder: holder.to_owned(),
                    expires_in: expires - now,
                }
            } else {
                Decision::Update(mine(wall, current.transitions.saturating_add(1)))
            }
        }
        // Released: take it at once.
        None => Decision::Update(mine(wall, current.transitions.saturating_add(1))),
    }
}

/// The record written when a leader gives the Lease up (client-go's
/// `release`): no holder, a one-second duration.
pub fn released(current: &Record, wall: Timestamp) -> Record {
    Record {
        holder: None,
        lease_duration: Some(Duration::from_secs(1)),
        acquire_time: Some(wall),
        renew_time: Some(wall),
        transitions: current.transitions,
    }
}

/// Whether `/healthz/leader-election` passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Leader election is off.
    Disabled,
    /// Waiting to lead: healthy (a follower is fine).
    Candidate,
    Leading {
        last_renew: Instant,
    },
    /// Could not renew within the deadline; the process is stopping.
    Lost,
}

/// client-go's `HealthzAdaptor`: a leader that has not renewed for longer
/// than the lease duration plus `tolerance` is unhealthy; so is a lost
/// lease. Everyone else is healthy.
pub fn health(
    state: State,
    now: Instant,
    lease_duration: Duration,
    tolerance: Duration,
) -> Result<(), String> {
    match state {
        State::Disabled | State::Candidate => Ok(()),
        State::Lost => Err("leader election lost".to_owned()),
        State::Leading { last_renew } => {
            let since = now.saturating_duration_since(last_renew);
            if since > lease_duration + tolerance {
                Err(format!(
                    "failed election to renew leadership on lease: last renewal {}s ago",
                    since.as_secs()
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// The election's state for the HTTP health check. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Health {
    state: Arc<Mutex<State>>,
    lease_duration: Duration,
}

impl Health {
    /// For a process without leader election: always healthy.
    pub fn disabled() -> Health {
        Health {
            state: Arc::new(Mutex::new(State::Disabled)),
            lease_duration: Duration::ZERO,
        }
    }

    fn set(&self, state: State) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    pub fn state(&self) -> State {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn check(&self) -> Result<(), String> {
        health(
            self.state(),
            Instant::now(),
            self.lease_duration,
            HEALTH_CHECK_TIMEOUT,
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error(
        "leader election lost: lease {namespace}/{name} not renewed within {deadline:?}; another replica may lead now, this one exits and is restarted as a candidate. If it recurs, check the API server's latency, or raise --leader-election-renew-deadline (below --leader-election-lease-duration)"
    )]
    Lost {
        namespace: String,
        name: String,
        deadline: Duration,
    },
}

/// One process's participation in the election.
pub struct Elector {
    api: Api<Lease>,
    config: Config,
    health: Health,
    /// Opened while we lead, for as long as the last renewal allows.
    fence: crate::fence::Fence,
    /// The last record seen and when it was first seen unchanged.
    observed: Mutex<Option<(Record, Instant)>>,
}

/// The `name` label of `leader_election_master_status`. client-go reports
/// `LeaderElectionConfig.Name`, which csi-lib-utils (v0.24, in v6.3) leaves
/// empty, so the Go sidecar exports `name=""`: the same here, so queries
/// and alerts match both images.
const LEADER_METRIC_NAME: &str = "";

/// Outcome of one read–decide–write round.
enum Round {
    Holding,
    Waiting { holder: String },
}

/// Why a round (bounded in time) did not end holding the Lease: what the
/// retries of [`Elector::acquire`] and of a renewal decide on.
enum NotHeld {
    /// Another instance holds it.
    HeldBy(String),
    /// The API server answered with an error.
    Api(kube::Error),
    /// No answer within the round's bound.
    NoAnswer,
    /// A renewal's deadline passed before the round could start.
    Deadline,
}

impl Elector {
    pub fn new(client: kube::Client, config: Config) -> Arc<Elector> {
        Self::fencing(client, config, crate::fence::Fence::closed())
    }

    /// An elector that keeps `fence` open exactly while it leads (the
    /// process's client refuses writes otherwise: src/fence.rs).
    pub fn fencing(
        client: kube::Client,
        config: Config,
        fence: crate::fence::Fence,
    ) -> Arc<Elector> {
        crate::metrics::set_leader(LEADER_METRIC_NAME, false);
        let health = Health {
            state: Arc::new(Mutex::new(State::Candidate)),
            lease_duration: config.lease_duration,
        };
        Arc::new(Elector {
            api: Api::namespaced(client, &config.namespace),
            config,
            health,
            fence,
            observed: Mutex::new(None),
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn health(&self) -> Health {
        self.health.clone()
    }

    fn observe(&self, record: &Record, now: Instant) -> Instant {
        let mut observed = self.observed.lock().unwrap_or_else(|p| p.into_inner());
        match &*observed {
            Some((seen, since)) if seen == record => *since,
            _ => {
                *observed = Some((record.clone(), now));
                now
            }
        }
    }

    fn lease(&self, record: &Record, base: Option<Lease>) -> Lease {
        let mut lease = base.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        if record.holder.as_deref() == Some(self.config.identity.as_str())
            && !self.config.labels.is_empty()
        {
            lease
                .metadata
                .labels
                .get_or_insert_with(BTreeMap::new)
                .extend(self.config.labels.clone());
        }
        // Keep fields of newer protocols (preferred holder, strategy) that
        // we do not interpret.
        let old = lease.spec.take().unwrap_or_default();
        lease.spec = Some(LeaseSpec {
            preferred_holder: old.preferred_holder,
            strategy: old.strategy,
            ..record.spec()
        });
        lease
    }

    /// One round. API errors and lost races count as "not holding".
    async fn try_acquire_or_renew(&self) -> Result<Round, kube::Error> {
        let existing = self.api.get_opt(&self.config.name).await?;
        // Observed when the answer arrived, as client-go does: the record
        // may have been renewed while the request was under way, so a time
        // taken before it would age the lease by the request's latency and
        // let a slow candidate take over from a live leader.
        let now = Instant::now();
        let record = existing.as_ref().map(Record::of);
        let since = record.as_ref().map_or(now, |r| self.observe(r, now));
        let decision = decide(
            record.as_ref(),
            since,
            now,
            Timestamp::now(),
            &self.config.identity,
            self.config.lease_duration,
        );
        match decision {
            Decision::Wait { holder, .. } => Ok(Round::Waiting { holder }),
            Decision::Create(new) => {
                let created = self
                    .api
                    .create(&PostParams::default(), &self.lease(&new, None))
                    .await?;
                self.observe(&Record::of(&created), Instant::now());
                Ok(Round::Holding)
            }
            Decision::Update(new) => {
                let replaced = self
                    .api
                    .replace(
                        &self.config.name,
                        &PostParams::default(),
                        &self.lease(&new, existing),
                    )
                    .await?;
                self.observe(&Record::of(&replaced), Instant::now());
                Ok(Round::Holding)
            }
        }
    }

    /// Jittered retry period (client-go's factor 1.2), so candidates that
    /// started together do not keep colliding.
    fn jittered(&self) -> Duration {
        let random = (uuid::Uuid::new_v4().as_u128() & 0xffff) as f64 / 65_536.0;
        self.config.retry_period.mul_f64(1.0 + 1.2 * random)
    }

    /// Waits until this process holds the Lease, then renews it in the
    /// background. Caches may run meanwhile; writers start only after this
    /// returns.
    ///
    /// A retry on `backon`: a round that does not end holding the Lease is
    /// tried again after a jittered retry period, for ever.
    pub async fn acquire(self: &Arc<Self>) -> Leadership {
        let mut last_holder: Option<String> = None;
        let acquired = (|| async {
            let started = Instant::now();
            // A request that hangs (black-holed API server) must not stall
            // the candidate: each round is bounded like a renewal.
            let round =
                tokio::time::timeout(self.config.renew_deadline, self.try_acquire_or_renew()).await;
            match round {
                Ok(Ok(Round::Holding)) => Ok(started),
                Ok(Ok(Round::Waiting { holder })) => Err(NotHeld::HeldBy(holder)),
                Ok(Err(e)) => Err(NotHeld::Api(e)),
                Err(_) => Err(NotHeld::NoAnswer),
            }
        })
        .retry(std::iter::repeat_with(|| self.jittered()))
        .notify(|not_held, _| match not_held {
            NotHeld::HeldBy(holder) => {
                if last_holder.as_deref() != Some(holder.as_str()) {
                    tracing::info!(lease = %format!("{}/{}", self.config.namespace, self.config.name), %holder, "waiting to acquire the leader lease, currently held by another instance");
                    last_holder = Some(holder.clone());
                }
            }
            NotHeld::Api(e) => {
                let hint = lease_forbidden_hint(e, &self.config.namespace)
                    .map(|hint| format!(". {hint}"))
                    .unwrap_or_default();
                tracing::warn!(lease = %self.config.name, error = %e, "cannot acquire the leader lease; will retry{hint}");
            }
            NotHeld::NoAnswer => {
                tracing::warn!(lease = %self.config.name, "no answer from the API server about the leader lease; will retry");
            }
            NotHeld::Deadline => {}
        })
        .await;
        // The delays never run out: only a round that holds ends the retry.
        let started = match acquired {
            Ok(started) => started,
            Err(_) => unreachable!("acquire retries for ever"),
        };
        tracing::info!(lease = %format!("{}/{}", self.config.namespace, self.config.name), identity = %self.config.identity, "successfully acquired lease; became leader");
        self.lead(started)
    }

    fn lead(self: &Arc<Self>, renewed: Instant) -> Leadership {
        crate::metrics::set_leader(LEADER_METRIC_NAME, true);
        self.fence.lead_until(renewed + self.config.renew_deadline);
        self.health.set(State::Leading {
            last_renew: renewed,
        });
        let (lost_tx, lost_rx) = watch::channel(false);
        let elector = Arc::clone(self);
        let renewer = tokio::spawn(async move {
            let mut last_renew = renewed;
            loop {
                tokio::time::sleep(elector.config.retry_period).await;
                // The deadline counts from the start of the last successful
                // renewal, which is no later than the renew time others saw:
                // we give up before any follower can take over.
                let deadline = last_renew + elector.config.renew_deadline;
                // One renewal, retried on `backon` every retry period (the
                // last wait cut at the deadline) until it holds, the Lease
                // is taken, or the deadline passes. The periodic renewal
                // around it is no retry and stays a loop.
                let retry_period = elector.config.retry_period;
                let this = &elector;
                let mut rounds = 0u32;
                let renewed = (|| {
                    rounds += 1;
                    let again = rounds > 1;
                    async move {
                        let attempt = Instant::now();
                        if attempt >= deadline {
                            return Err(NotHeld::Deadline);
                        }
                        // client-go's slow path: a renewal round after a
                        // failed one (`leader_election_slowpath_total`).
                        if again {
                            crate::metrics::count_leader_slowpath(LEADER_METRIC_NAME);
                        }
                        match tokio::time::timeout_at(deadline, this.try_acquire_or_renew()).await
                        {
                            Ok(Ok(Round::Holding)) => Ok(attempt),
                            Ok(Ok(Round::Waiting { holder })) => Err(NotHeld::HeldBy(holder)),
                            Ok(Err(e)) => Err(NotHeld::Api(e)),
                            Err(_) => Err(NotHeld::NoAnswer),
                        }
                    }
                })
                .retry(std::iter::repeat_with(move || {
                    retry_period.min(deadline.saturating_duration_since(Instant::now()))
                }))
                .when(|not_held| matches!(not_held, NotHeld::Api(_) | NotHeld::NoAnswer))
                .notify(|not_held, _| {
                    if let NotHeld::Api(e) = not_held {
                        let hint = lease_forbidden_hint(e, &elector.config.namespace)
                            .map(|hint| format!(". {hint}"))
                            .unwrap_or_default();
                        tracing::warn!(lease = %elector.config.name, error = %e, "renewing the leader lease failed; retrying{hint}");
                    }
                })
                .await;
                match renewed {
                    Ok(attempt) => {
                        last_renew = attempt;
                        // Not `lead_until`: a renewal that lands after a
                        // step-down must leave the fence closed.
                        elector
                            .fence
                            .extend(attempt + elector.config.renew_deadline);
                        elector.health.set(State::Leading {
                            last_renew: attempt,
                        });
                    }
                    Err(not_held) => {
                        elector.fence.lose();
                        crate::metrics::set_leader(LEADER_METRIC_NAME, false);
                        elector.health.set(State::Lost);
                        match not_held {
                            // Someone else took the Lease: we are no longer
                            // leader, whatever the deadline says.
                            NotHeld::HeldBy(holder) => {
                                tracing::error!(lease = %elector.config.name, %holder, "the leader lease was taken by another instance; stopping");
                            }
                            _ => {
                                tracing::error!(lease = %elector.config.name, "failed to renew the leader lease within the renew deadline; stopping");
                            }
                        }
                        let _ = lost_tx.send(true);
                        return;
                    }
                }
            }
        });
        Leadership {
            elector: Arc::clone(self),
            lost: lost_rx,
            renewer,
        }
    }

    /// Gives the Lease up if we still hold it (client-go's `release`).
    async fn release(&self) -> Result<bool, kube::Error> {
        let Some(existing) = self.api.get_opt(&self.config.name).await? else {
            return Ok(false);
        };
        let record = Record::of(&existing);
        if record.holder.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(false);
        }
        let new = released(&record, Timestamp::now());
        self.api
            .replace(
                &self.config.name,
                &PostParams::default(),
                &self.lease(&new, Some(existing)),
            )
            .await?;
        Ok(true)
    }
}

/// Held while this process leads.
pub struct Leadership {
    elector: Arc<Elector>,
    lost: watch::Receiver<bool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Leadership {
    /// Completes when the Lease is lost. The caller must stop every writer
    /// and exit non-zero.
    pub async fn lost(&mut self) -> LeaderError {
        // A closed channel means the renewer ended, which it does only
        // after sending `true`.
        let _ = self.lost.wait_for(|lost| *lost).await;
        LeaderError::Lost {
            namespace: self.elector.config.namespace.clone(),
            name: self.elector.config.name.clone(),
            deadline: self.elector.config.renew_deadline,
        }
    }

    /// Stops writing and renewing; with `ReleaseLeaderElectionOnExit` also
    /// clears the holder so the next leader starts at once. Call only once
    /// every writer has stopped and nothing of ours can still be on the
    /// wire; otherwise [`Leadership::let_expire`].
    ///
    /// The fence closes first: a writer still running (an embedded loop's
    /// worker draining its queue, a worker past the shutdown grace) must not
    /// write once another replica may lead, and a released Lease is taken
    /// at once. The release's own Lease requests pass the closed fence.
    pub async fn step_down(self) {
        self.stop();
        if !self.elector.config.release_on_exit || *self.lost.borrow() {
            return;
        }
        // A renewal cut short by the abort may still land; the release is
        // guarded by the resourceVersion it read, so it then fails with a
        // conflict and the lease simply expires.
        // Bounded: an unreachable API server must not hold up the exit.
        let release =
            tokio::time::timeout(self.elector.config.renew_deadline, self.elector.release()).await;
        match release {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.elector.config.name, "released the leader lease");
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                let hint = lease_forbidden_hint(&e, &self.elector.config.namespace)
                    .map(|hint| format!(". {hint}"))
                    .unwrap_or_default();
                tracing::warn!(lease = %self.elector.config.name, error = %e, "cannot release the leader lease; it will expire{hint}");
            }
            Err(_) => {
                tracing::warn!(lease = %self.elector.config.name, "no answer while releasing the leader lease; it will expire");
            }
        }
    }

    /// Stops writing and renewing but keeps the Lease: it expires a lease
    /// duration after the last renewal, so a write of ours still under way
    /// (a worker past the shutdown grace, a journal write cut short) ends
    /// before another replica may write. Dropping a `Leadership` does the
    /// same.
    pub fn let_expire(self) {
        drop(self);
    }

    /// Closes the fence, then stops the renewer; a renewal that still lands
    /// leaves the fence closed ([`crate::fence::Fence::extend`]).
    fn stop(&self) {
        self.elector.fence.close();
        self.renewer.abort();
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        // A leadership nobody holds must not keep renewing the lease, nor
        // let writes out until the last renewal's deadline: whoever drops
        // it (an aborted start-up, a lost lease) has stopped leading.
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "pod-a_1";
    const LD: Duration = Duration::from_secs(15);

    fn wall(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).expect("timestamp")
    }

    fn held_by(holder: Option<&str>, duration: Option<u64>, transitions: i32) -> Record {
        Record {
            holder: holder.map(str::to_owned),
            lease_duration: duration.map(Duration::from_secs),
            acquire_time: Some(wall(-100)),
            renew_time: Some(wall(-1)),
            transitions,
        }
    }

    #[test]
    fn lease_names_follow_csi_lib_utils() {
        for (driver, want) in [
            ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
            ("ebs.csi.aws.com", "ebs-csi-aws-com"),
            ("my_driver/v1", "my-driver-v1"),
            ("ends.with.", "ends-with-x"),
            ("Upper.Case", "upper-case"),
            ("a-b", "a-b"),
            ("", "x"),
        ] {
            assert_eq!(lease_name(driver), want, "{driver}");
        }
    }

    #[test]
    fn identities_are_unique_per_start() {
        let a = identity("pod-0");
        let b = identity("pod-0");
        assert!(a.starts_with("pod-0_"), "{a}");
        assert_ne!(a, b);
        assert!(identity("").starts_with("csi-provisioner_"));
    }

    #[test]
    fn decisions() {
        let t0 = Instant::now();
        let later = |s| t0 + Duration::from_secs(s);
        let now_wall = wall(0);
        struct Case {
            name: &'static str,
            current: Option<Record>,
            unchanged_for: u64,
            want: Decision,
        }
        let mine = |acquire, transitions| Record {
            holder: Some(ME.to_owned()),
            lease_duration: Some(LD),
            acquire_time: Some(acquire),
            renew_time: Some(now_wall),
            transitions,
        };
        let cases = [
            Case {
                name: "no lease: create it",
                current: None,
                unchanged_for: 0,
                want: Decision::Create(mine(now_wall, 0)),
            },
            Case {
                name: "our own lease: renew, keeping acquire time and transitions",
                current: Some(held_by(Some(ME), Some(15), 3)),
                unchanged_for: 0,
                want: Decision::Update(mine(wall(-100), 3)),
            },
            Case {
                name: "another holder, freshly seen: wait the full duration",
                current: Some(held_by(Some("pod-b_2"), Some(15), 3)),
                unchanged_for: 0,
                want: Decision::Wait {
                    holder: "pod-b_2".into(),
                    expires_in: LD,
                },
            },
            Case {
                name: "another holder, unchanged for less than its duration",
                current: Some(held_by(Some("pod-b_2"), Some(15), 3)),
                unchanged_for: 14,
                want: Decision::Wait {
                    holder: "pod-b_2".into(),
                    expires_in: Duration::from_secs(1),
                },
            },
            Case {
                name: "another holder, unchanged for its duration: take over",
                current: Some(held_by(Some("pod-b_2"), Some(15), 3)),
                unchanged_for: 15,
                want: Decision::Update(mine(now_wall, 4)),
            },
            Case {
                name: "the record's duration counts, not ours",
                current: Some(held_by(Some("pod-b_2"), Some(1), 3)),
                unchanged_for: 1,
                want: Decision::Update(mine(now_wall, 4)),
            },
            Case {
                name: "a record without duration gets ours",
                current: Some(held_by(Some("pod-b_2"), None, 0)),
                unchanged_for: 14,
                want: Decision::Wait {
                    holder: "pod-b_2".into(),
                    expires_in: Duration::from_secs(1),
                },
            },
            Case {
                name: "released (no holder): take it at once",
                current: Some(held_by(None, Some(1), 7)),
                unchanged_for: 0,
                want: Decision::Update(mine(now_wall, 8)),
            },
        ];
        for case in cases {
            let got = decide(
                case.current.as_ref(),
                t0,
                later(case.unchanged_for),
                now_wall,
                ME,
                LD,
            );
            assert_eq!(got, case.want, "{}", case.name);
        }
    }

    #[test]
    fn records_round_trip_through_the_lease_and_empty_holder_is_released() {
        let record = held_by(Some(ME), Some(15), 2);
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(record.spec()),
        };
        assert_eq!(Record::of(&lease), record);
        let gone = released(&record, wall(5));
        let spec = gone.spec();
        assert_eq!(spec.holder_identity.as_deref(), Some(""));
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(2));
        let lease = Lease {
            metadata: ObjectMeta::default(),
            spec: Some(spec),
        };
        assert_eq!(Record::of(&lease).holder, None);
        assert_eq!(Record::of(&Lease::default()).holder, None);
    }

    fn config(identity: &str, release_on_exit: bool) -> Config {
        Config {
            namespace: "default".into(),
            name: "test-lease".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(1),
            renew_deadline: Duration::from_millis(600),
            retry_period: Duration::from_millis(100),
            labels: BTreeMap::from([("app".to_owned(), "csi".to_owned())]),
            release_on_exit,
        }
    }

    /// Against the API test server: of candidates racing for a missing
    /// Lease exactly one wins (the others get 409), and afterwards only the
    /// holder renews.
    #[tokio::test]
    async fn one_of_many_racing_candidates_wins() {
        let server = kube_testserver::TestServer::new();
        let electors: Vec<Arc<Elector>> = (0..5)
            .map(|i| Elector::new(server.client(), config(&format!("c{i}"), false)))
            .collect();
        for round in 0..3 {
            let results =
                futures_util::future::join_all(electors.iter().map(|e| e.try_acquire_or_renew()))
                    .await;
            let holding: Vec<usize> = results
                .iter()
                .enumerate()
                .filter(|(_, r)| matches!(r, Ok(Round::Holding)))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(holding.len(), 1, "round {round}: {holding:?}");
            let lease: Lease = server.get("default", "test-lease").expect("lease");
            let spec = lease.spec.expect("spec");
            assert_eq!(
                spec.holder_identity,
                Some(format!("c{}", holding[0])),
                "round {round}"
            );
            assert_eq!(spec.lease_duration_seconds, Some(1));
            assert_eq!(spec.lease_transitions, Some(0), "no takeover happened");
            assert_eq!(
                lease
                    .metadata
                    .labels
                    .unwrap_or_default()
                    .get("app")
                    .map(String::as_str),
                Some("csi")
            );
        }
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_at_once_an_abandoned_one_after_its_duration() {
        let server = kube_testserver::TestServer::new();
        let a = Elector::new(server.client(), config("a", true));
        let b = Elector::new(server.client(), config("b", false));
        let c = Elector::new(server.client(), config("c", false));
        let leading_a = a.acquire().await;
        assert!(matches!(a.health().state(), State::Leading { .. }));

        let b_task = tokio::spawn({
            let b = Arc::clone(&b);
            async move { b.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            !b_task.is_finished(),
            "b took over a lease that was renewed"
        );
        assert!(b.health().check().is_ok(), "a candidate is healthy");

        let released = Instant::now();
        leading_a.step_down().await;
        let leading_b = b_task.await.expect("b");
        let took = released.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "released lease taken after {took:?}"
        );
        let spec = server
            .get::<Lease>("default", "test-lease")
            .and_then(|l| l.spec)
            .expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));

        // b vanishes without releasing (no gate): c waits the duration.
        let c_task = tokio::spawn({
            let c = Arc::clone(&c);
            async move { c.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let abandoned = Instant::now();
        drop(leading_b);
        let _leading_c = c_task.await.expect("c");
        let took = abandoned.elapsed();
        assert!(
            took >= Duration::from_millis(600) && took < Duration::from_millis(2000),
            "abandoned lease taken after {took:?}"
        );
    }

    /// A leader that cannot reach the API server gives up within the renew
    /// deadline and says so.
    #[tokio::test]
    async fn a_leader_that_cannot_renew_loses_within_the_deadline() {
        let server = kube_testserver::TestServer::new();
        let a = Elector::new(server.client(), config("a", true));
        let mut leading = a.acquire().await;
        server.set_partitioned(true);
        let cut = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(3), leading.lost())
            .await
            .expect("lost in time");
        // Within the renew deadline (600ms) of the last renewal; what
        // matters for safety is that it is before the lease duration (1s)
        // after which another candidate may take over.
        assert!(
            cut.elapsed() < Duration::from_secs(1),
            "{:?}",
            cut.elapsed()
        );
        assert!(err.to_string().contains("test-lease"), "{err}");
        assert_eq!(a.health().state(), State::Lost);
        assert!(a.health().check().is_err());
        // A lost lease is not released: it is not ours to give.
        server.set_partitioned(false);
        leading.step_down().await;
        let spec = server
            .get::<Lease>("default", "test-lease")
            .and_then(|l| l.spec)
            .expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("a"));
    }

    /// A renewal that fails once is made again within the deadline (the
    /// retry on `backon`), and that round counts as client-go's slow path.
    #[tokio::test]
    async fn a_renewal_refused_once_is_made_again_and_counted_as_the_slow_path() {
        use kube_testserver::{RequestMatch, Verb};

        let slowpath = || {
            crate::metrics::encode()
                .lines()
                .find_map(|line| line.strip_prefix("leader_election_slowpath_total{name=\"\"} "))
                .map_or(0.0, |value| value.parse::<f64>().expect("a number"))
        };
        let server = kube_testserver::TestServer::new();
        let a = Elector::new(server.client(), config("a", false));
        let mut leading = a.acquire().await;
        let before = slowpath();
        server.fail_next(1, RequestMatch::new(Verb::Get, "leases"), 403);
        // Lost, it would be within the renew deadline (600 ms).
        let lost = tokio::time::timeout(Duration::from_millis(900), leading.lost()).await;
        assert!(lost.is_err(), "still leading");
        assert!(matches!(a.health().state(), State::Leading { .. }));
        assert!(slowpath() > before, "{}", crate::metrics::encode());
        leading.step_down().await;
    }

    /// Stepping down closes the fence before the Lease is released: the
    /// release (Lease requests) still goes out through the fenced client,
    /// a write of a worker still running does not. Dropping a leadership
    /// (a start-up cut short, a lost lease) closes it too, at once rather
    /// than at the last renewal's deadline.
    #[tokio::test]
    async fn stepping_down_closes_the_fence_and_still_releases_the_lease() {
        use k8s_openapi::api::core::v1::ConfigMap;

        let server = kube_testserver::TestServer::new();
        let fence = crate::fence::Fence::closed();
        let no_limits = crate::ratelimit::Limits {
            qps: 0.0,
            burst: 0,
            capacity_qps: 0.0,
            capacity_burst: 0,
        };
        let client = kube::Client::new(
            crate::kube_client::layers(no_limits, fence.clone()).service(server.service()),
            "default",
        );
        let elector = Elector::fencing(client.clone(), config("a", true), fence.clone());
        let configmaps: Api<ConfigMap> = Api::namespaced(client, "default");
        let write = |name: &'static str| {
            let configmaps = configmaps.clone();
            async move {
                let cm = ConfigMap {
                    metadata: ObjectMeta {
                        name: Some(name.to_owned()),
                        ..ObjectMeta::default()
                    },
                    ..ConfigMap::default()
                };
                match configmaps.create(&PostParams::default(), &cm).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Service(e))
                        if e.downcast_ref::<crate::fence::Fenced>().is_some() =>
                    {
                        Err("fenced".to_owned())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
        };
        assert_eq!(write("candidate").await, Err("fenced".to_owned()));

        let leading = elector.acquire().await;
        assert_eq!(write("leading").await, Ok(()));
        leading.step_down().await;
        assert_eq!(write("stepped-down").await, Err("fenced".to_owned()));
        let holder = server
            .get::<Lease>("default", "test-lease")
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        assert_eq!(
            holder.as_deref(),
            Some(""),
            "released through the closed fence"
        );

        let leading = elector.acquire().await;
        assert_eq!(write("leading-again").await, Ok(()));
        drop(leading);
        assert_eq!(write("dropped").await, Err("fenced".to_owned()));
        let holder = server
            .get::<Lease>("default", "test-lease")
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        assert_eq!(holder.as_deref(), Some("a"), "dropped: left to expire");
        for (name, written) in [
            ("candidate", false),
            ("leading", true),
            ("stepped-down", false),
            ("leading-again", true),
            ("dropped", false),
        ] {
            assert_eq!(
                server.get::<ConfigMap>("default", name).is_some(),
                written,
                "{name}"
            );
        }
    }

    #[test]
    fn a_lease_refused_by_rbac_is_told_with_the_role_it_needs() {
        let status = |code: u16| {
            kube::Error::Api(Box::new(kube::core::Status {
                code,
                message: "leases.coordination.k8s.io \"x\" is forbidden".to_owned(),
                ..kube::core::Status::default()
            }))
        };
        assert_eq!(
            lease_forbidden_hint(&status(403), "kube-system").as_deref(),
            Some(
                "RBAC refuses the Lease: the sidecar's service account needs a Role in namespace \
                 \"kube-system\" allowing get, create and update on leases (apiGroup \
                 coordination.k8s.io), bound to it by a RoleBinding: the Role csi-provisioner-cfg \
                 of deploy/kubernetes/base/rbac.yaml"
            )
        );
        assert_eq!(lease_forbidden_hint(&status(409), "kube-system"), None);
        assert_eq!(lease_forbidden_hint(&status(500), "kube-system"), None);
        // The verbs it names are the ones the elector declares.
        assert_eq!(API_CALLS[0].verbs, ["get", "create", "update"]);
        assert_eq!(API_CALLS[0].resource, "leases");
        // And the Role it names grants them.
        let rbac = include_str!("../deploy/kubernetes/base/rbac.yaml");
        let role = rbac
            .split("\n---\n")
            .find(|doc| doc.contains("kind: Role\n") && doc.contains("name: csi-provisioner-cfg"))
            .expect("the Role csi-provisioner-cfg in deploy/kubernetes/base/rbac.yaml");
        assert!(
            role.contains("resources: [\"leases\"]\n    verbs: [\"get\", \"create\", \"update\"]"),
            "{role}"
        );
    }

    #[test]
    fn a_lost_lease_says_what_follows_and_what_to_check() {
        let lost = LeaderError::Lost {
            namespace: "kube-system".into(),
            name: "hostpath-csi-k8s-io".into(),
            deadline: Duration::from_secs(10),
        };
        assert_eq!(
            lost.to_string(),
            "leader election lost: lease kube-system/hostpath-csi-k8s-io not renewed within 10s; \
             another replica may lead now, this one exits and is restarted as a candidate. If it \
             recurs, check the API server's latency, or raise --leader-election-renew-deadline \
             (below --leader-election-lease-duration)"
        );
    }

    #[test]
    fn health_verdicts() {
        let t0 = Instant::now();
        let tol = HEALTH_CHECK_TIMEOUT;
        let at = |s| t0 + Duration::from_secs(s);
        assert!(health(State::Disabled, at(1000), LD, tol).is_ok());
        assert!(health(State::Candidate, at(1000), LD, tol).is_ok());
        assert!(health(State::Lost, t0, LD, tol).is_err());
        let leading = State::Leading { last_renew: t0 };
        assert!(health(leading, at(35), LD, tol).is_ok());
        let err = health(leading, at(36), LD, tol).expect_err("late");
        assert!(err.contains("renew"), "{err}");
    }

    /// Hazard 8 (docs/design.md): a slow GET that returns a record renewed while it
    /// was under way must not age that record by the request's latency.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_read_of_a_fresh_renewal_does_not_shorten_the_lease() {
        use kube_testserver::{RequestMatch, TestServer, Verb};
        const LEASE: Duration = Duration::from_secs(2);
        let server = TestServer::new();
        let wall_now = || {
            k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
                .to_string()
        };
        server
            .create_object(serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "l", "namespace": "ns"},
                "spec": {"holderIdentity": "other", "leaseDurationSeconds": 2,
                         "acquireTime": wall_now(), "renewTime": wall_now(), "leaseTransitions": 0},
            }))
            .expect("lease");
        let elector = Elector::new(
            server.client(),
            Config {
                namespace: "ns".into(),
                name: "l".into(),
                identity: "me".into(),
                lease_duration: LEASE,
                renew_deadline: Duration::from_millis(1900),
                retry_period: Duration::from_millis(100),
                labels: BTreeMap::new(),
                release_on_exit: false,
            },
        );
        // The candidate's first read takes 1.5 s; 1 s in, the holder renews.
        server.add_latency(
            RequestMatch::new(Verb::Get, "leases"),
            Duration::from_millis(1500),
        );
        let started = Instant::now();
        let candidate = {
            let elector = Arc::clone(&elector);
            tokio::spawn(async move { elector.acquire().await })
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let mut lease = server
            .get_object("coordination.k8s.io/v1", "Lease", "ns", "l")
            .expect("lease");
        lease["spec"]["renewTime"] = serde_json::json!(wall_now());
        server.update_object(lease).expect("renewed");
        let renewed = started.elapsed();
        tokio::time::sleep(Duration::from_millis(600)).await;
        server.clear_faults();
        // The holder stops renewing now. The lease it renewed is valid for
        // LEASE after the renewal: nobody may take it over before.
        let _leadership = tokio::time::timeout(Duration::from_secs(10), candidate)
            .await
            .expect("taken over in the end")
            .expect("task");
        let took = started.elapsed();
        assert!(
            took >= renewed + LEASE,
            "took over {took:?} after start, but the lease was renewed {renewed:?} after start and lasts {LEASE:?}"
        );
    }
}
