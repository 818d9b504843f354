//! Drop at every await: one provisioning, one deletion and one clone (with
//! its source's finalizer edits) are run by the sidecar's own steps
//! (`claims::process`, `volumes::process`) in-process, and dropped after
//! their N-th poll, for N = 1, 2, … until one completes. After each drop the
//! invariants that must hold at every instant are checked (no two backend
//! volumes of one name; every backend volume has a PV or a journal entry),
//! then the work is finished two ways, each from its own drop:
//!
//! - **continue**: the same process goes on (a future dropped by a timeout,
//!   a `select!` or an abort, while the process lives);
//! - **restart**: the process is killed there (its runtime dropped with
//!   every task) and a new one starts from the API server and the journal.
//!
//! Then the work must be whole: one backend volume per claim, every volume
//! with its PV and every PV with its volume, no journal entry left once the
//! journal is flushed, no finalizer of ours left on a clone source.
//! docs/design.md ("Cancellation") lists the await points and what holds
//! at each. Test server only: the same code runs against the real API
//! server everywhere else.

mod support;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use clap::Parser;
use csi_provisioner::caches::Caches;
use csi_provisioner::cli::Options;
use csi_provisioner::csi::Driver;
use csi_provisioner::csi::connection::connect_and_probe;
use csi_provisioner::events::Recorder;
use csi_provisioner::provisioner::{self, ClaimKey, Context, claims, volumes};
use csi_provisioner::queue::Backoff;
use csi_provisioner::shared::Shared;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use support::{Backend, Env};
use tokio::runtime::Runtime;

/// The most polls tried: a step that has not completed by then fails.
const MOST_POLLS: usize = 400;
const CLONE_PROTECTION: &str = "provisioner.storage.kubernetes.io/cloning-protection";

/// Polls a future at most `polls` times (each time it is woken), then
/// drops it: `None` when it had not completed.
struct DropAfter<F: Future> {
    inner: Pin<Box<F>>,
    left: usize,
}

impl<F: Future> DropAfter<F> {
    fn new(inner: F, polls: usize) -> Self {
        DropAfter {
            inner: Box::pin(inner),
            left: polls,
        }
    }
}

impl<F: Future> Future for DropAfter<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        match self.inner.as_mut().poll(cx) {
            Poll::Ready(value) => Poll::Ready(Some(value)),
            Poll::Pending if self.left == 0 => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// One run of the sidecar's provisioning loop without workers, on a
/// runtime of its own: dropping it is killing the process.
struct Sidecar {
    runtime: Runtime,
    ctx: Arc<Context>,
}

impl Sidecar {
    /// Builds the loop as `startup::run` does (options, driver discovery,
    /// caches, provisioner, journal), with no worker: the test runs its
    /// steps.
    fn start(env: &Env) -> Sidecar {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let service = env.api().service();
        let socket = env.driver.endpoint.clone();
        let namespace = env.ns.clone();
        let ctx = runtime.block_on(async move {
            let client = kube::Client::new(service, "default");
            let options = Options::try_parse_from([
                "csi-provisioner".to_owned(),
                format!("--csi-address={}", socket.display()),
                "--timeout=10s".to_owned(),
            ])
            .expect("options");
            let channel = connect_and_probe(&socket, options.timeout)
                .await
                .expect("driver");
            let driver = Driver::discover(channel, options.timeout)
                .await
                .expect("discover the driver");
            let config = csi_provisioner::startup::provisioner_config(&options, &driver);
            let shared = Shared {
                client: client.clone(),
                driver_name: config.driver_name.clone(),
                caches: Arc::new(Caches::for_driver(&config)),
                recorder: Arc::new(Recorder::new(client.clone(), "cancellation-harness")),
                backoff: Backoff {
                    start: Duration::from_millis(10),
                    max: Duration::from_secs(1),
                },
                workers: 1,
                volume_events: Default::default(),
            };
            let ctx = provisioner::new(&shared, driver, config, &namespace)
                .await
                .expect("provisioning loop");
            shared.caches.start(&client);
            shared.caches.wait_until_ready().await;
            ctx.resume().await.expect("journal loaded");
            ctx
        });
        Sidecar { runtime, ctx }
    }

    /// As [`Sidecar::start`], with the workers running: a restarted sidecar.
    fn start_running(env: &Env) -> Sidecar {
        let sidecar = Sidecar::start(env);
        {
            let _runtime = sidecar.runtime.enter();
            sidecar.ctx.start_workers();
        }
        sidecar
    }

    /// The process goes on after the drop: its workers take over (the
    /// dropped key is queued again, as its next event would).
    fn continue_with(self, claim: Option<&ClaimKey>, volume: Option<&str>) -> Sidecar {
        {
            let _runtime = self.runtime.enter();
            self.ctx.start_workers();
        }
        if let Some(claim) = claim {
            self.ctx.claims.add(claim.clone());
        }
        if let Some(volume) = volume {
            self.ctx.volumes.add(volume.to_owned());
        }
        self
    }

    /// After the drop: go on, or be killed and start again.
    fn then(
        self,
        then: Then,
        env: &Env,
        claim: Option<&ClaimKey>,
        volume: Option<&str>,
    ) -> Sidecar {
        match then {
            Then::Continue => self.continue_with(claim, volume),
            Then::Restart => {
                self.kill();
                Sidecar::start_running(env)
            }
        }
    }

    /// A graceful stop: workers finish their key, then the process ends.
    fn stop(self) {
        self.ctx.shut_down();
        self.block_on(self.ctx.drained());
        self.kill();
    }

    fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    /// Waits until the cache holds what `ready` looks for.
    fn wait_cached(&self, what: &str, ready: impl Fn(&Context) -> bool) {
        self.block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            while !ready(&self.ctx) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: not cached within 20 s"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
    }

    /// Kills the process: every task of its runtime is dropped where it is.
    fn kill(self) {
        let Sidecar { runtime, ctx } = self;
        drop(ctx);
        runtime.shutdown_background();
    }
}

/// What finishes the work after the drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Continue,
    Restart,
}

/// The test's own runtime (the API test server's listener, the driver) and
/// environment.
struct Harness {
    runtime: Runtime,
    env: Option<Env>,
}

impl Harness {
    fn new() -> Harness {
        // The sidecar's log, with RUST_LOG set (it runs in this process).
        if std::env::var_os("RUST_LOG").is_some() {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let env = runtime.block_on(async {
            let env = Env::new(Backend::TestServer).await;
            env.storage_class("fast", "Immediate", "Delete", json!({}))
                .await;
            env
        });
        Harness {
            runtime,
            env: Some(env),
        }
    }

    fn env(&self) -> &Env {
        self.env.as_ref().expect("env until dropped")
    }

    fn block_on<T>(&self, future: impl Future<Output = T>) -> T {
        self.runtime.block_on(future)
    }

    fn create_claim(&self, name: &str, extra: serde_json::Value) -> ClaimKey {
        let env = self.env();
        let claim = self.block_on(env.create_pvc(&env.ns, name, "fast", "1Mi", extra));
        ClaimKey {
            namespace: env.ns.clone(),
            name: name.to_owned(),
            uid: claim.metadata.uid.expect("claim uid"),
        }
    }

    /// Every backend volume name appears once, and each volume has a PV or
    /// a journal entry: what must hold at every instant.
    fn assert_nothing_doubled_or_unrecorded(&self, what: &str) {
        let env = self.env();
        let volumes = env.backend_volumes();
        let mut names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(
            names.len(),
            before,
            "{what}: two backend volumes of one name: {volumes:#?}"
        );
        let (pvs, journal) =
            self.block_on(async { (env.pvs().await, env.journal_entries().await) });
        for volume in &volumes {
            let has_pv = pvs.iter().any(|pv| {
                pv.spec
                    .as_ref()
                    .and_then(|s| s.csi.as_ref())
                    .is_some_and(|csi| csi.volume_handle == volume.id)
            });
            let journaled = journal
                .values()
                .any(|(entry, _)| entry.volume_name == volume.name);
            assert!(
                has_pv || journaled,
                "{what}: backend volume {} ({}) has neither a PV nor a journal entry",
                volume.name,
                volume.id
            );
        }
    }

    /// The end state: backend and API agree, the journal (flushed) holds
    /// nothing of these claims.
    fn assert_whole(&self, sidecar: &Sidecar, what: &str, claims: &[&ClaimKey]) {
        let env = self.env();
        sidecar
            .block_on(sidecar.ctx.flush_journal())
            .expect("journal flushed");
        self.assert_nothing_doubled_or_unrecorded(what);
        self.block_on(env.assert_consistent());
        let journal = self.block_on(env.journal());
        for claim in claims {
            assert!(
                !journal.contains_key(&claim.uid),
                "{what}: the journal still holds claim {}",
                claim.name
            );
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(env) = self.env.take() {
            self.runtime.block_on(async move { drop(env) });
        }
    }
}

/// Runs `process` for `claim` (no workers) until its operation is over and
/// its PV saved.
fn provision_to_the_end(sidecar: &Sidecar, claim: &ClaimKey, what: &str) {
    let volume_name = format!("pvc-{}", claim.uid);
    sidecar.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            claims::process(&sidecar.ctx, claim).await;
            let saved = sidecar
                .ctx
                .caches
                .volumes
                .store()
                .get(&ObjectRef::new(&volume_name))
                .is_some();
            if saved && sidecar.ctx.operations.get(&claim.uid).is_none() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: claim {} not provisioned within 30 s",
                claim.name
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

fn claim_cached(claim: &ClaimKey) -> impl Fn(&Context) -> bool + '_ {
    move |ctx| {
        ctx.caches
            .claims
            .store()
            .get(&ObjectRef::new(&claim.name).within(&claim.namespace))
            .is_some_and(|c| c.metadata.uid.as_deref() == Some(claim.uid.as_str()))
    }
}

/// Waits (the workers working) until `done` holds, at most 30 s.
fn wait_until<F, Fut>(harness: &Harness, what: &str, done: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = bool>,
{
    harness.block_on(async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not done within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

/// Whether the claim's PV is saved.
async fn pv_saved(env: &Env, claim: &ClaimKey) -> bool {
    env.pv(&format!("pvc-{}", claim.uid)).await.is_some()
}

/// Drops `claims::process` of a fresh claim after N polls for every N,
/// finishing each way; returns once a pass that was not dropped saved the
/// PV.
fn provisioning_dropped_after_every_poll(then: Then) {
    let harness = Harness::new();
    let env = harness.env();
    for polls in 1..=MOST_POLLS {
        let what = format!("provisioning dropped after poll {polls}, then {then:?}");
        let sidecar = Sidecar::start(env);
        let claim = harness.create_claim(&format!("c{polls}"), json!({}));
        sidecar.wait_cached(&what, claim_cached(&claim));
        let completed =
            sidecar.block_on(DropAfter::new(claims::process(&sidecar.ctx, &claim), polls));
        harness.assert_nothing_doubled_or_unrecorded(&what);
        let whole_pass = completed.is_some() && harness.block_on(pv_saved(env, &claim));
        let sidecar = sidecar.then(then, env, Some(&claim), None);
        wait_until(&harness, &what, || pv_saved(env, &claim));
        sidecar.wait_cached(&what, |ctx| ctx.operations.get(&claim.uid).is_none());
        harness.assert_whole(&sidecar, &what, &[&claim]);
        sidecar.stop();
        if whole_pass {
            eprintln!("provisioning ({then:?}): one pass took {polls} polls");
            return;
        }
    }
    panic!("provisioning did not complete within {MOST_POLLS} polls");
}

#[test]
fn provisioning_dropped_after_every_poll_then_continued() {
    provisioning_dropped_after_every_poll(Then::Continue);
}

#[test]
fn provisioning_dropped_after_every_poll_then_restarted() {
    provisioning_dropped_after_every_poll(Then::Restart);
}

/// Drops `volumes::process` of a Released PV after N polls for every N.
fn deletion_dropped_after_every_poll(then: Then) {
    let harness = Harness::new();
    let env = harness.env();
    for polls in 1..=MOST_POLLS {
        let what = format!("deletion dropped after poll {polls}, then {then:?}");
        let sidecar = Sidecar::start(env);
        let claim = harness.create_claim(&format!("d{polls}"), json!({}));
        sidecar.wait_cached(&what, claim_cached(&claim));
        provision_to_the_end(&sidecar, &claim, &what);
        let pv = format!("pvc-{}", claim.uid);
        harness.block_on(env.delete_pvc(&env.ns, &claim.name));
        sidecar.wait_cached(&what, |ctx| {
            ctx.caches
                .volumes
                .store()
                .get(&ObjectRef::new(&pv))
                .is_some_and(|pv| {
                    pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
                })
        });
        let completed =
            sidecar.block_on(DropAfter::new(volumes::process(&sidecar.ctx, &pv), polls));
        harness.assert_nothing_doubled_or_unrecorded(&what);
        let whole_pass = completed.is_some() && harness.block_on(env.pv(&pv)).is_none();
        let sidecar = sidecar.then(then, env, None, Some(&pv));
        wait_until(&harness, &what, || async { env.pv(&pv).await.is_none() });
        // A crash may leave the claim's entry in the journal (its lazy
        // removal unwritten): the restarted sidecar finishes it too.
        sidecar.wait_cached(&what, |ctx| ctx.operations.get(&claim.uid).is_none());
        harness.assert_whole(&sidecar, &what, &[&claim]);
        assert!(
            !env.backend_volumes().iter().any(|v| v.name == pv),
            "{what}: the backend volume outlived its PV"
        );
        sidecar.stop();
        if whole_pass {
            eprintln!("deletion ({then:?}): one pass took {polls} polls");
            return;
        }
    }
    panic!("deletion did not complete within {MOST_POLLS} polls");
}

#[test]
fn deletion_dropped_after_every_poll_then_continued() {
    deletion_dropped_after_every_poll(Then::Continue);
}

#[test]
fn deletion_dropped_after_every_poll_then_restarted() {
    deletion_dropped_after_every_poll(Then::Restart);
}

/// Whether the live source claim still carries the cloning protection.
async fn source_protected(env: &Env) -> bool {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), &env.ns);
    let live = claims.get("source").await.expect("source claim");
    live.metadata
        .finalizers
        .unwrap_or_default()
        .iter()
        .any(|f| f == CLONE_PROTECTION)
}

/// Drops the provisioning of a clone (which puts the cloning-protection
/// finalizer on its source before `CreateVolume` and takes it off after)
/// after N polls for every N; at the end the source carries no finalizer of
/// ours.
fn clone_dropped_after_every_poll(then: Then) {
    let harness = Harness::new();
    let env = harness.env();
    let source = {
        let sidecar = Sidecar::start(env);
        let source = harness.create_claim("source", json!({}));
        sidecar.wait_cached("source", claim_cached(&source));
        provision_to_the_end(&sidecar, &source, "source");
        sidecar.stop();
        source
    };
    for polls in 1..=MOST_POLLS {
        let what = format!("clone dropped after poll {polls}, then {then:?}");
        let sidecar = Sidecar::start(env);
        let clone = harness.create_claim(
            &format!("k{polls}"),
            json!({"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "source"}}}),
        );
        sidecar.wait_cached(&what, claim_cached(&clone));
        let completed =
            sidecar.block_on(DropAfter::new(claims::process(&sidecar.ctx, &clone), polls));
        harness.assert_nothing_doubled_or_unrecorded(&what);
        let whole_pass = completed.is_some() && harness.block_on(pv_saved(env, &clone));
        let sidecar = sidecar.then(then, env, Some(&clone), None);
        // The source's protection goes by its own pass, queued when the
        // clone's PV is saved (or at a restart's initial list).
        wait_until(&harness, &what, || async {
            pv_saved(env, &clone).await && !source_protected(env).await
        });
        sidecar.wait_cached(&what, |ctx| ctx.operations.get(&clone.uid).is_none());
        harness.assert_whole(&sidecar, &what, &[&source, &clone]);
        sidecar.stop();
        if whole_pass {
            eprintln!("clone ({then:?}): one pass took {polls} polls");
            return;
        }
    }
    panic!("clone provisioning did not complete within {MOST_POLLS} polls");
}

#[test]
fn clone_dropped_after_every_poll_then_continued() {
    clone_dropped_after_every_poll(Then::Continue);
}

#[test]
fn clone_dropped_after_every_poll_then_restarted() {
    clone_dropped_after_every_poll(Then::Restart);
}
