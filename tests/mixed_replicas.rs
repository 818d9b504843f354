//! A rolling update from the upstream Go `csi-provisioner` to ours, back,
//! and forward again: both replicas share one Lease (same name, client-go's
//! protocol), exactly one of them writes at any time, claims are provisioned
//! by whichever leads, none gets two volumes, and deletion works across the
//! hand-overs; claims ours left in flight at the rollback are finished by
//! the Go image or, deleted meanwhile, cleaned up by ours when it is back
//! (its journal), and nothing leaks. Real cluster only (the rolling update needs the upstream
//! binary of `../shared/k8s`; the fencing test runs ours alone without it).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_hostpath::faults::{Fault, Faults};
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;
use support::sidecar::Sidecar;
use support::{Backend, ClusterConfig, Env};

e2e_real!(ClusterConfig::standard();
    a_rolling_update_from_the_go_sidecar_and_back_hands_over_the_lease,
    a_leader_frozen_past_its_lease_writes_nothing_when_it_wakes_up,
);

/// Leader election timings: lease duration, renew deadline, retry period.
type Timings = [&'static str; 3];

/// The rolling update's: upstream's lease duration and renew deadline, and
/// client-go's retry period. A leader must renew within its deadline; with
/// a lease of seconds, a renewal late on a busy machine loses the Lease
/// and the replicas hand over when the test did not ask them to. A
/// hand-over after a replica is killed waits the lease out (about 17 s).
const ROLLOUT: Timings = ["15s", "10s", "2s"];

/// The fencing test's: short, since the frozen leader must lose its Lease
/// while frozen (what that test is about), and each image's first replica
/// waits for the previous image's Lease to expire.
const FENCING: Timings = ["2s", "1s", "500ms"];

/// Leader election with `timings` (on top of the harness's flags, which
/// both images take).
fn election_flags(namespace: &str, [lease, renew, retry]: Timings) -> Vec<String> {
    vec![
        "--leader-election".to_owned(),
        format!("--leader-election-namespace={namespace}"),
        format!("--leader-election-lease-duration={lease}"),
        format!("--leader-election-renew-deadline={renew}"),
        format!("--leader-election-retry-period={retry}"),
        "--v=5".to_owned(),
    ]
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Image {
    Go,
    Rust,
}

struct Replica {
    image: Image,
    sidecar: Sidecar,
}

impl Replica {
    fn start(
        env: &Env,
        image: Image,
        run: u32,
        timings: Timings,
        kubeconfig: &Path,
        bin: &Path,
    ) -> Replica {
        let log = env.dir.path().join(format!("{image:?}-{run}.log"));
        let sidecar = env
            .launch(kubeconfig)
            .binary(bin)
            .args(election_flags(&env.ns, timings))
            .start(&format!("{image:?}"), &log);
        Replica { image, sidecar }
    }

    fn log(&self) -> String {
        self.sidecar.log()
    }

    fn kill(&mut self) {
        self.sidecar.kill();
    }
}

/// The test namespace's Lease's spec, as the API server has it.
async fn lease(env: &Env) -> Option<LeaseSpec> {
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    leases
        .list(&Default::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find_map(|l| l.spec)
}

/// Whether a holder identity is one of ours: `<hostname>_<uuid>` (README),
/// where the Go image's is the bare hostname.
fn held_by_ours(holder: &str) -> bool {
    holder
        .rsplit_once('_')
        .is_some_and(|(_, id)| uuid::Uuid::parse_str(id).is_ok())
}

/// How long a replica may take to lead: the rolling update's lease
/// waited out, then a retry period, with room for a busy machine.
const LEAD_WITHIN: Duration = Duration::from_secs(60);

/// Waits until a replica of `replica`'s image holds the Lease, told by
/// its `holderIdentity` as the API server has it (the tests keep at most
/// one live replica of each image when they call this), and returns that
/// identity.
async fn wait_image_leads(env: &Env, replica: &Replica) -> String {
    let image = replica.image;
    let started = std::time::Instant::now();
    let mut holder = None;
    while started.elapsed() < LEAD_WITHIN {
        holder = env.lease_holder().await;
        if let Some(holder) = &holder
            && held_by_ours(holder) == (image == Image::Rust)
        {
            return holder.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no replica of the {image:?} image held the Lease within {LEAD_WITHIN:?} (holder: \
         {holder:?})\n{}",
        replica.sidecar.dump()
    );
}

/// PVs `user` created (successfully), from the audit log.
fn pv_creates_by(env: &Env, user: &str) -> usize {
    env.plane()
        .map(|plane| {
            plane
                .audit()
                .iter()
                .filter(|r| {
                    r.user.username == user
                        && r.verb == "create"
                        && r.resource() == "persistentvolumes"
                        && r.code() < 300
                })
                .count()
        })
        .unwrap_or_default()
}

/// The Lease's spec as JSON, with the holder's per-process uuid and the
/// times replaced by their shape.
async fn lease_spec(env: &Env) -> serde_json::Value {
    let mut spec = serde_json::to_value(lease(env).await.expect("a Lease")).expect("json");
    if let Some(map) = spec.as_object_mut() {
        for time in ["acquireTime", "renewTime"] {
            if map.contains_key(time) {
                map.insert(time.to_owned(), json!("TIME"));
            }
        }
        if let Some(holder) = map.get_mut("holderIdentity")
            && let Some((host, id)) = holder.as_str().and_then(|h| h.rsplit_once('_'))
            && uuid::Uuid::parse_str(id).is_ok()
        {
            *holder = json!(format!("{host}_UUID"));
        }
    }
    spec
}

async fn provision(env: &Env, names: &[&str]) {
    for name in names {
        env.create_pvc(&env.ns, name, "fast", "5Mi", json!({}))
            .await;
    }
    for name in names {
        env.wait_bound(&env.ns, name).await;
    }
}

/// A real-cluster test's `Env` with class `fast` and its control plane
/// (`None` off the real cluster).
async fn set_up(backend: Backend) -> Option<(Env, &'static controlplane::ControlPlane)> {
    let env = Env::new(backend).await;
    let plane = env.plane()?;
    env.storage_class("fast", "Immediate", "Delete", json!({}))
        .await;
    Some((env, plane))
}

/// A user `<name>-<test id>` bound to deploy/'s rules (leader election
/// included) and its kubeconfig: each replica its own, so the audit log
/// tells their writes apart.
async fn replica_user(
    env: &Env,
    plane: &controlplane::ControlPlane,
    name: &str,
) -> (String, PathBuf) {
    let user = format!("{name}-{}", env.id);
    env.grant_deploy_rbac(&user, &[]).await;
    let kubeconfig = plane.kubeconfig_for(&user, None).expect("kubeconfig");
    (user, kubeconfig)
}

/// The names of the test's PVs.
async fn pv_names(env: &Env) -> Vec<String> {
    env.pvs()
        .await
        .into_iter()
        .filter_map(|pv| pv.metadata.name)
        .collect()
}

/// Every PV has one backend volume of its name and every backend volume
/// its PV: the backend's records are keyed by volume id, so a claim
/// provisioned twice shows as two records of one name.
async fn assert_one_volume_per_pv(env: &Env, image: Image) {
    let pvs: BTreeSet<String> = pv_names(env).await.into_iter().collect();
    let volumes = env.backend_volumes();
    let names: BTreeSet<String> = volumes.iter().map(|v| v.name.clone()).collect();
    assert_eq!(
        names.len(),
        volumes.len(),
        "{image:?}: two backend volumes of one name: {volumes:#?}"
    );
    assert_eq!(names, pvs, "{image:?}: backend volumes | PVs");
}

async fn a_rolling_update_from_the_go_sidecar_and_back_hands_over_the_lease(backend: Backend) {
    let Some((env, plane)) = set_up(backend).await else {
        return;
    };
    let Some(go_bin) = env.upstream_binary("csi-provisioner") else {
        return;
    };
    let rust_bin = support::sidecar::sidecar_binary();
    // Each image as its own user, both bound to deploy/'s rules (leader
    // election included), so the audit log tells their writes apart.
    let (go_user, go_config) = replica_user(&env, plane, "go").await;
    let (rust_user, rust_config) = replica_user(&env, plane, "rust").await;
    // Our replica is started here, not by the harness: its refused
    // requests fail the test all the same.
    env.check_refusals_of(&rust_user);

    // The Go image leads; ours joins as the new replica of the rollout.
    let mut go = Replica::start(&env, Image::Go, 1, ROLLOUT, &go_config, &go_bin);
    wait_image_leads(&env, &go).await;
    let go_lease = lease_spec(&env).await;
    let mut rust = Replica::start(&env, Image::Rust, 1, ROLLOUT, &rust_config, &rust_bin);
    provision(&env, &["a1", "a2", "a3"]).await;
    assert_eq!(
        pv_creates_by(&env, &go_user),
        3,
        "the Go leader provisioned"
    );
    assert_eq!(
        pv_creates_by(&env, &rust_user),
        0,
        "our follower wrote no PV"
    );

    // The old pod goes: ours takes the Lease over (once it expires) and
    // provisions.
    go.kill();
    wait_image_leads(&env, &rust).await;
    // The Lease as ours writes it is the Go image's, one transition on.
    let mut our_lease = lease_spec(&env).await;
    let transitions = |lease: &serde_json::Value| lease["leaseTransitions"].as_i64().unwrap_or(0);
    assert_eq!(
        transitions(&our_lease),
        transitions(&go_lease) + 1,
        "{our_lease}"
    );
    our_lease["leaseTransitions"] = go_lease["leaseTransitions"].clone();
    // README: ours is `<hostname>_<uuid>` where the Go image's is the bare
    // hostname (the pod's name), so that replicas sharing a hostname are
    // still two candidates.
    let go_holder = go_lease["holderIdentity"].as_str().unwrap_or_default();
    assert_eq!(
        our_lease["holderIdentity"],
        json!(format!("{go_holder}_UUID"))
    );
    our_lease["holderIdentity"] = go_lease["holderIdentity"].clone();
    assert_eq!(our_lease, go_lease, "the Lease of ours | of the Go image");
    provision(&env, &["b1", "b2", "b3"]).await;
    assert_eq!(
        pv_creates_by(&env, &rust_user),
        3,
        "our new leader provisioned"
    );
    assert_eq!(pv_creates_by(&env, &go_user), 3);
    assert_one_volume_per_pv(&env, Image::Rust).await;

    // Rolled back with claims in flight: `CreateVolume` is slow, ours has
    // journalled two claims' operations when its pod is killed, and one of
    // the two claims is deleted while nobody leads. A Go replica leads
    // again (once our Lease expires), provisions the claim still there,
    // and deletes volumes ours created.
    env.set_faults(vec![Fault::delay("CreateVolume", Duration::from_secs(4))]);
    let mut go = Replica::start(&env, Image::Go, 2, ROLLOUT, &go_config, &go_bin);
    env.create_pvc(&env.ns, "d1", "fast", "5Mi", json!({}))
        .await;
    env.create_pvc(&env.ns, "d2", "fast", "5Mi", json!({}))
        .await;
    env.wait_for(
        "our leader's journal holds both claims in flight",
        Duration::from_secs(30),
        || async { (env.journal().await.len() == 2).then_some(()) },
    )
    .await;
    rust.kill();
    // The driver may still make d2's volume (its call was under way).
    let claims: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let d2_volume = format!(
        "pvc-{}",
        claims
            .get("d2")
            .await
            .expect("claim d2")
            .metadata
            .uid
            .expect("d2's uid")
    );
    env.delete_pvc(&env.ns, "d2").await;
    env.clear_faults();
    wait_image_leads(&env, &go).await;
    provision(&env, &["c1"]).await;
    env.wait_bound(&env.ns, "d1").await;
    assert_eq!(
        pv_creates_by(&env, &go_user),
        5,
        "the Go leader saved c1 and d1"
    );
    for name in ["a1", "a2", "a3", "b1", "b2", "b3", "c1"] {
        env.delete_pvc(&env.ns, name).await;
    }
    let d1 = env.wait_bound(&env.ns, "d1").await;
    let d1_pv = d1.metadata.name.clone().expect("d1's PV name");
    env.wait_for(
        "every volume but d1's deleted by the Go leader",
        Duration::from_secs(60),
        || async {
            let pvs = pv_names(&env).await;
            let volumes = env.backend_volumes();
            (pvs == [d1_pv.clone()]
                && volumes
                    .iter()
                    .all(|v| v.name == d1_pv || v.name == d2_volume))
            .then_some(())
        },
    )
    .await;
    // The Go image does not read our journal: its two entries are still
    // there (docs/operations.md, rollback: leftover journal ConfigMaps).
    assert_eq!(env.journal().await.len(), 2, "the journal left by ours");

    // Forward again: ours leads and replays its journal. d1 was finished
    // by the Go leader with the volume ours started: kept. d2 is gone:
    // whatever the driver made for it is deleted. Nothing else is touched.
    let mut rust = Replica::start(&env, Image::Rust, 2, ROLLOUT, &rust_config, &rust_bin);
    go.kill();
    wait_image_leads(&env, &rust).await;
    env.wait_for(
        "our journal emptied by the replay",
        Duration::from_secs(60),
        || async { env.journal().await.is_empty().then_some(()) },
    )
    .await;
    env.wait_for(
        "d2's volume, if the driver made one, deleted",
        Duration::from_secs(30),
        || async {
            let volumes = env.backend_volumes();
            (volumes.len() == 1 && volumes[0].name == d1_pv).then_some(())
        },
    )
    .await;
    assert_one_volume_per_pv(&env, Image::Rust).await;
    assert_eq!(
        env.wait_bound(&env.ns, "d1").await.metadata.uid,
        d1.metadata.uid,
        "d1 still bound to the PV the Go leader saved"
    );
    env.delete_pvc(&env.ns, "d1").await;
    env.wait_for(
        "d1 deleted by our leader",
        Duration::from_secs(60),
        || async { (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(()) },
    )
    .await;
    rust.kill();
    let logs = format!("--- go ---\n{}\n--- rust ---\n{}", go.log(), rust.log());
    assert!(
        !rust.log().contains("forbidden"),
        "our replica was refused something\n{logs}"
    );
}

/// The writes (create, update, patch, delete) `user` sent after the audit
/// log's first `mark` records, but of the Lease (renewing it is how a
/// replica learns it lost it), as (verb, resource, HTTP status).
fn writes_by_after(env: &Env, user: &str, mark: usize) -> Vec<(String, String, u16)> {
    env.plane()
        .map(|plane| {
            plane.audit()[mark..]
                .iter()
                .filter(|r| {
                    r.user.username == user
                        && ["create", "update", "patch", "delete"].contains(&r.verb.as_str())
                        && r.resource() != "leases"
                })
                .map(|r| (r.verb.clone(), r.resource(), r.code()))
                .collect()
        })
        .unwrap_or_default()
}

/// The fencing test's delay of `CreateVolume`, counted: each call that
/// takes it uses one of these.
const DELAYED: u32 = 1000;

/// The `CreateVolume` calls that reached the driver since the delay was
/// set (read from the faults file, where the driver counts its rule down
/// as each call takes it, before the delay).
fn create_volume_calls(env: &Env) -> u32 {
    Faults::load(&env.driver.faults_file)
        .ok()
        .and_then(|faults| faults.rules.first()?.count)
        .map_or(0, |left| DELAYED - left)
}

/// Fencing (issue 22): the leader is frozen (SIGSTOP) with `CreateVolume`
/// calls in flight, for longer than its lease; the other replica takes
/// the Lease over and provisions; then the frozen one is let go (SIGCONT),
/// its CSI answers waiting. It must send no API write after it lost the
/// Lease. Ours holds it to that (src/fence.rs); the same run against the
/// Go image (when its binary is there) is printed for the record, not
/// asserted: the Go sidecar has no such fence. Either way each claim ends
/// with one PV and one volume.
async fn a_leader_frozen_past_its_lease_writes_nothing_when_it_wakes_up(backend: Backend) {
    let Some((env, plane)) = set_up(backend).await else {
        return;
    };
    let mut report = Vec::new();
    let mut images = vec![(Image::Rust, support::sidecar::sidecar_binary())];
    // For the record only: without the Go image, ours runs alone.
    let go_bin = plane.binaries().path("csi-provisioner");
    let go_missing = !plane.binaries().has("csi-provisioner");
    if !go_missing {
        images.push((Image::Go, go_bin.clone()));
    }
    for (image, bin) in &images {
        let image = *image;
        let mut replicas = Vec::new();
        for role in ["a", "b"] {
            let name = format!("{image:?}-{role}").to_lowercase();
            replicas.push(replica_user(&env, plane, &name).await);
        }
        // Every CreateVolume answers 3 s late: the leader's are still in
        // the driver when it is frozen, and answer while it is.
        env.set_faults(vec![
            Fault::delay("CreateVolume", Duration::from_secs(3)).times(DELAYED),
        ]);
        let frozen_user = replicas[0].0.clone();
        let mut a = Replica::start(&env, image, 10, FENCING, &replicas[0].1, bin);
        // a's identity, as the API has it: only a runs yet (the previous
        // image's replicas are gone, their Lease waited out here).
        let a_holder = wait_image_leads(&env, &a).await;
        let mut b = Replica::start(&env, image, 11, FENCING, &replicas[1].1, bin);
        let names: Vec<String> = (1..=3)
            .map(|i| format!("{image:?}-f{i}").to_lowercase())
            .collect();
        for name in &names {
            env.create_pvc(&env.ns, name, "fast", "5Mi", json!({}))
                .await;
        }
        // The leader's CreateVolume calls are in the driver (each took the
        // delay; none can have answered yet).
        let calls = names.len() as u32;
        env.wait_for(
            &format!("{image:?}: the leader's {calls} CreateVolume calls in the driver"),
            Duration::from_secs(30),
            || async { (create_volume_calls(&env) >= calls).then_some(()) },
        )
        .await;
        a.sidecar.signal("STOP");
        let frozen_at = Timestamp::now();
        let pvs_before_freeze = pv_creates_by(&env, &frozen_user);
        // Another replica leads, by the Lease as the API server has it.
        // Ours: b's identity is not a's. The Go image names both replicas
        // after the host, one identity: there, a renewal later than the
        // freeze is b's (a cannot renew while frozen).
        let started = std::time::Instant::now();
        let b_holder = loop {
            let spec = lease(&env).await;
            let holder = spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty());
            let renewed = spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0);
            let b_leads = match image {
                Image::Rust => holder.as_ref().is_some_and(|h| *h != a_holder),
                Image::Go => holder.is_some() && renewed.is_some_and(|t| t > frozen_at),
            };
            if b_leads && let Some(holder) = holder {
                break holder;
            }
            assert!(
                started.elapsed() < LEAD_WITHIN,
                "{image:?}: no other replica took the Lease from the frozen leader ({a_holder}) \
                 within {LEAD_WITHIN:?}: {spec:?}\n{}",
                b.sidecar.dump()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // From here on, the frozen replica is not the leader.
        let mark = plane.audit().len();
        a.sidecar.signal("CONT");
        let exited = a.sidecar.wait_exit(Duration::from_secs(15));
        for name in &names {
            env.wait_bound(&env.ns, name).await;
        }
        let writes = writes_by_after(&env, &frozen_user, mark);
        report.push(format!(
            "{image:?}: frozen with {pvs_before_freeze} PV(s) of its own written; {b_holder} \
             led next; the woken leader exited with {exited:?} and sent {} write(s) after losing \
             the Lease: {writes:?}",
            writes.len()
        ));
        // One PV and one backend volume per claim, whoever wrote.
        assert_eq!(env.pvs().await.len(), names.len(), "{image:?}");
        assert_one_volume_per_pv(&env, image).await;
        if image == Image::Rust {
            assert!(
                writes.is_empty(),
                "ours wrote after losing the Lease: {writes:?}\n{}",
                a.log()
            );
            assert_eq!(exited, Some(1), "ours exits non-zero\n{}", a.log());
        }
        env.clear_faults();
        for name in &names {
            env.delete_pvc(&env.ns, name).await;
        }
        env.wait_for(
            "every volume deleted by the new leader",
            Duration::from_secs(60),
            || async {
                (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(())
            },
        )
        .await;
        a.kill();
        b.kill();
        // The next image's first replica takes the Lease once it expires.
    }
    if go_missing {
        report.push(format!("Go: not run, no {}", go_bin.display()));
    }
    eprintln!("fencing:\n{}", report.join("\n"));
}
