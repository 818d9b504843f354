//! The chaos scenario of one seed, as plain data: a workload of claims,
//! pods and deletions interleaved with faults at random instants. Pure and
//! deterministic (a seed always gives the same plan), so that a failing
//! seed reproduces its scenario exactly; only the timing of the processes
//! it runs against varies.

/// SplitMix64: small, seedable, and the same on every platform.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    Immediate,
    WaitForFirstConsumer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    Delete,
    Retain,
}

/// One of the four StorageClasses of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Class {
    pub binding: Binding,
    pub reclaim: Reclaim,
}

impl Class {
    pub const ALL: [Class; 4] = [
        Class::new(Binding::Immediate, Reclaim::Delete),
        Class::new(Binding::Immediate, Reclaim::Retain),
        Class::new(Binding::WaitForFirstConsumer, Reclaim::Delete),
        Class::new(Binding::WaitForFirstConsumer, Reclaim::Retain),
    ];

    pub const fn new(binding: Binding, reclaim: Reclaim) -> Class {
        Class { binding, reclaim }
    }

    /// The class's short name (see `Env::class`).
    pub fn short(self) -> &'static str {
        match (self.binding, self.reclaim) {
            (Binding::Immediate, Reclaim::Delete) => "imm-del",
            (Binding::Immediate, Reclaim::Retain) => "imm-ret",
            (Binding::WaitForFirstConsumer, Reclaim::Delete) => "wffc-del",
            (Binding::WaitForFirstConsumer, Reclaim::Retain) => "wffc-ret",
        }
    }
}

/// The API verbs a fault may hit (mapped onto the test server's `Verb` by
/// the runner, so that the plan stays free of the servers' types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiVerb {
    Create,
    Update,
    Patch,
    Delete,
    /// A watch's start (the caches' streaming lists and re-watches).
    Watch,
}

/// Where the faults come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Our API test server: injected API answers, dropped watches, compaction.
    TestServer,
    /// The real control plane: restarts of kube-apiserver (every watch ends
    /// and resumes with 410 Gone) and of kube-controller-manager.
    Real,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of sidecar replica `replica`, restarted after `down_ms`.
    KillSidecar {
        replica: usize,
        down_ms: u64,
    },
    /// SIGKILL of the replica holding the Lease (two replicas only).
    KillLeader {
        down_ms: u64,
    },
    /// SIGTERM of sidecar replica `replica` (the graceful path: it
    /// finishes what it does, writes the journal's removals and exits 0),
    /// restarted after `down_ms`.
    TermSidecar {
        replica: usize,
        down_ms: u64,
    },
    /// SIGTERM of the replica holding the Lease (two replicas only).
    TermLeader {
        down_ms: u64,
    },
    /// Fencing (two replicas only): the fault makes `claims` new claims of
    /// `class` (the plan's claims `first_claim..first_claim + claims`)
    /// while every `CreateVolume` is held `delay_ms` in the driver; once
    /// the leader's calls are in the driver (its faults file's count, not
    /// a guess), the leader is frozen (SIGSTOP) until another replica holds
    /// the Lease, then woken (SIGCONT). It must write nothing to the API
    /// after that (the server's request log, the audit log), and exit.
    FreezeLeader {
        first_claim: usize,
        claims: usize,
        class: Class,
        delay_ms: u64,
    },
    /// The next `count` calls of `method` fail with gRPC `code`. On
    /// `Probe`: every call fails for `count` rounds of `/healthz` requests
    /// to each replica (the runner's own, see `Run::probe_fault` in
    /// `tests/chaos.rs`), then none.
    DriverError {
        method: &'static str,
        code: &'static str,
        count: u32,
    },
    /// The next `count` calls of `method` take `delay_ms` (beyond the
    /// sidecar's `--timeout`, and beyond the 1 s `/healthz` gives `Probe`)
    /// and then succeed in the backend. On `Probe`: every call, for `count`
    /// rounds of `/healthz`, as `DriverError`.
    DriverSlow {
        method: &'static str,
        delay_ms: u64,
        count: u32,
    },
    /// The next call of `method` changes the backend (if the call changes
    /// anything) and the driver exits before replying; it is restarted
    /// after `down_ms`.
    DriverExit {
        method: &'static str,
        down_ms: u64,
    },
    /// The next `count` requests `verb` on `resource` answer HTTP `status`.
    Api {
        verb: ApiVerb,
        resource: &'static str,
        status: u16,
        count: u32,
    },
    /// Every request of the sidecar on `resource` (all of them: `None`)
    /// waits `delay_ms` before it is handled, for `for_ms`; then the API
    /// is fast again while the workload goes on.
    ApiLatency {
        resource: Option<&'static str>,
        delay_ms: u64,
        for_ms: u64,
    },
    /// A network partition of the test server for `ms`: every request is
    /// dropped without an answer and every watch ends; then it heals.
    /// With two replicas (a 2 s Lease) the leader may lose its Lease and
    /// exit: the one exit allowed.
    Partition {
        ms: u64,
    },
    /// Every message of the sidecar's watches of `resource` (events,
    /// bookmarks, a new watch's initial events) reaches it `lag_ms` late,
    /// in order, while the lag is in force (`hold_ms`); its watches of
    /// every other resource, and every LIST and GET, go on at once: the
    /// watches of different kinds are not ordered with each other on a
    /// real API server either. On the real cluster the sidecars talk
    /// through a `controlplane::LagProxy` in such seeds, which holds the
    /// events of their watches the same way.
    WatchLag {
        resource: &'static str,
        lag_ms: u64,
        hold_ms: u64,
    },
    /// Every watch stream ends (clients re-watch from their resourceVersion).
    CloseWatches,
    /// Watch history forgotten and watches ended: every re-watch gets 410.
    Compact,
    RestartApiServer,
    /// etcd compacted to its current revision, then kube-apiserver
    /// restarted: every watch resumes into 410 Gone and a re-list.
    CompactEtcd,
    RestartControllerManager,
    /// SIGKILL of etcd, restarted on its data after `down_ms`:
    /// kube-apiserver answers errors meanwhile, then resumes its watches.
    KillEtcd {
        down_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    CreateClaim {
        claim: usize,
        class: Class,
    },
    /// Deletes the claim (whatever its state).
    DeleteClaim {
        claim: usize,
    },
    /// Deletes the claim once it is Bound (waiting a while for it): what a
    /// fault aimed at a deletion needs to meet (`DeleteVolume`, the PV's
    /// delete and finalizer patches).
    DeleteBoundClaim {
        claim: usize,
    },
    /// Deletes the claim's PV first, then the claim (KEP-2644).
    DeletePvThenClaim {
        claim: usize,
    },
    /// A pod on the run's node that uses the claim.
    StartPod {
        claim: usize,
    },
    StopPod {
        claim: usize,
    },
    /// A StatefulSet (the runner plays its controller: claims from the
    /// template of class Immediate/Delete, pods, scaling) with this
    /// `persistentVolumeClaimRetentionPolicy`.
    CreateSet {
        set: usize,
        replicas: u32,
        when_scaled: Reclaim,
        when_deleted: Reclaim,
    },
    ScaleSet {
        set: usize,
        replicas: u32,
    },
    /// Deleted with background propagation (its pods go by GC).
    DeleteSet {
        set: usize,
    },
    Fault(Fault),
    Pause {
        ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub seed: u64,
    pub backend: Backend,
    /// 1, or 2 with leader election.
    pub replicas: usize,
    /// Capacity tracking on (`--enable-capacity`, the driver with a
    /// capacity pool): the sidecar calls `GetCapacity`, and once quiet its
    /// CSIStorageCapacity objects must show the driver's capacity.
    pub capacity: bool,
    /// The driver call outside the volumes' that this seed faults
    /// ([`FOCUS_METHODS`]), once with each kind of driver fault.
    pub focus: &'static str,
    pub steps: Vec<Step>,
}

/// Every gRPC status code but OK (the first of the numerically ordered
/// table); faults name a code as csi.proto does.
pub const GRPC_CODES: &[(tonic::Code, &str, &str)] = csi_proto::codes::CODES.split_at(1).1;

/// The sidecar's `--timeout` in a chaos run; slow calls take longer.
pub const SIDECAR_TIMEOUT_MS: u64 = 1000;

/// Requests the sidecar makes (on the test server), which faults may hit:
/// each must be one the sidecar really sends during a run, or its rule
/// never fires (a run of enough seeds fails on such a rule). The journal
/// lists its ConfigMaps at start only and then creates, replaces and
/// deletes them; a PV is only replaced after a 403, which the test server
/// never answers. The caches of PVs, claims and classes start with a
/// streaming list (a WATCH with `sendInitialEvents`, which the test server
/// serves) and re-watch when a watch ends: they send no LIST, so only
/// their WATCH is a target (aimed at a re-watch: [`AimedAt::Rewatch`]).
const API_TARGETS: [(ApiVerb, &str); 11] = [
    (ApiVerb::Create, "persistentvolumes"),
    (ApiVerb::Patch, "persistentvolumes"),
    (ApiVerb::Delete, "persistentvolumes"),
    (ApiVerb::Patch, "persistentvolumeclaims"),
    (ApiVerb::Create, "events"),
    (ApiVerb::Create, "configmaps"),
    (ApiVerb::Update, "configmaps"),
    (ApiVerb::Delete, "configmaps"),
    (ApiVerb::Watch, "persistentvolumes"),
    (ApiVerb::Watch, "persistentvolumeclaims"),
    (ApiVerb::Watch, "storageclasses"),
];

/// What the answers of a faulted request are: a write may meet a conflict,
/// a watch's start a 410 Gone (resourceVersion too old: a new list).
fn api_statuses(verb: ApiVerb) -> &'static [u16] {
    match verb {
        ApiVerb::Watch => &[500, 429, 410],
        _ => &[409, 500, 429],
    }
}

/// The resources whose requests [`Fault::ApiLatency`] delays (`None`: all),
/// each met by a new claim's provisioning (the PV's create, the journal's
/// write).
const LATENCY_TARGETS: [Option<&str>; 3] = [None, Some("persistentvolumes"), Some("configmaps")];

/// The resources whose watches [`Fault::WatchLag`] holds, each aimed at
/// what brings its watch events ([`Fault::aimed_at`]): PVs at a new
/// claim's provisioning (the sidecar writes the PV and must not count on
/// seeing it at once), claims at a deletion (the claim's DELETED behind
/// its PV's release), classes at a sidecar's start (they never change
/// during a run: only a new process's streaming list brings their
/// events). Not VolumeAttachments: no run makes one (and a run's driver
/// does not attach, so the sidecar does not watch them); not Nodes and
/// CSINodes: made once before the sidecars start, and watched with
/// capacity tracking only, so a lag on them would never strike.
const WATCH_LAG_TARGETS: [&str; 3] = [
    "persistentvolumes",
    "persistentvolumeclaims",
    "storageclasses",
];

/// The Lease is renewed only with leader election: two-replica seeds.
const LEASE_TARGETS: [(ApiVerb, &str); 1] = [(ApiVerb::Update, "leases")];

impl Fault {
    /// The fault's rule: what the per-rule summary counts (firings of one
    /// rule over a run), without the fault's parameters (code, count,
    /// delay, replica).
    pub fn rule(&self) -> String {
        match self {
            Fault::DriverError { method, .. } => format!("DriverError {method}"),
            Fault::DriverSlow { method, .. } => format!("DriverSlow {method}"),
            Fault::DriverExit { method, .. } => format!("DriverExit {method}"),
            Fault::Api { verb, resource, .. } => api_rule(*verb, resource),
            Fault::ApiLatency { resource, .. } => latency_rule(*resource),
            Fault::WatchLag { resource, .. } => watch_lag_rule(resource),
            other => format!("{other:?}")
                .split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned(),
        }
    }
}

/// The workload a fault is aimed at, which the plan makes follow it: a
/// driver or API fault stays armed until used up, but one injected when
/// nothing it hits is left to do would never strike, and a rule that never
/// strikes tests nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AimedAt {
    /// Anything (leases are renewed all the time; process and watch
    /// faults strike at once).
    Anything,
    /// A claim's deletion: `DeleteVolume`, the PV's delete and the
    /// finalizer patches of the PV and of the claim.
    Deletion,
    /// A new claim: `CreateVolume`, the PV's create, events and the
    /// journal's writes.
    Provisioning,
    /// A new claim after a restart: the journal's write that makes a new
    /// segment (a new process never writes to the segments it found).
    FirstProvisioning,
    /// A re-watch of every cache: the plan ends every watch right after.
    Rewatch,
    /// A sidecar's start-up (`GetPluginInfo` and the capability calls are
    /// made then only; its caches' first lists): the plan restarts the
    /// leader right after.
    Restart,
    /// New claims that the fault makes itself, at its own moment
    /// ([`Fault::FreezeLeader`]): the plan counts them as its claims.
    ItsOwnClaims,
}

impl Fault {
    pub fn aimed_at(&self) -> AimedAt {
        match self {
            Fault::DriverError { method, .. }
            | Fault::DriverSlow { method, .. }
            | Fault::DriverExit { method, .. } => match *method {
                "DeleteVolume" => AimedAt::Deletion,
                "CreateVolume" => AimedAt::Provisioning,
                // Probe: the runner's /healthz requests, in the fault's own
                // step; GetCapacity: polled every second.
                "Probe" | "GetCapacity" => AimedAt::Anything,
                _ => AimedAt::Restart,
            },
            Fault::Api { verb, resource, .. } => match (verb, *resource) {
                (ApiVerb::Watch, _) => AimedAt::Rewatch,
                (ApiVerb::Create, "configmaps") => AimedAt::FirstProvisioning,
                (ApiVerb::Delete | ApiVerb::Patch, _) => AimedAt::Deletion,
                (_, "leases") => AimedAt::Anything,
                _ => AimedAt::Provisioning,
            },
            Fault::ApiLatency { .. } => AimedAt::Provisioning,
            Fault::WatchLag { resource, .. } => match *resource {
                "persistentvolumeclaims" => AimedAt::Deletion,
                "storageclasses" => AimedAt::Restart,
                _ => AimedAt::Provisioning,
            },
            Fault::FreezeLeader { .. } => AimedAt::ItsOwnClaims,
            _ => AimedAt::Anything,
        }
    }
}

/// The rule of an API fault on `verb` `resource`.
pub fn api_rule(verb: ApiVerb, resource: &str) -> String {
    format!("Api {verb:?} {resource}")
}

/// The rule of an API latency on `resource` (`None`: every request).
pub fn latency_rule(resource: Option<&str>) -> String {
    format!("ApiLatency {}", resource.unwrap_or("all"))
}

/// The rule of a watch lag on `resource`.
pub fn watch_lag_rule(resource: &str) -> String {
    format!("WatchLag {resource}")
}

/// Every rule a plan against `backend` may hold.
pub fn rules(backend: Backend) -> Vec<String> {
    let mut rules = Vec::new();
    for method in VOLUME_METHODS.iter().chain(&FOCUS_METHODS) {
        for kind in ["DriverError", "DriverSlow", "DriverExit"] {
            rules.push(format!("{kind} {method}"));
        }
    }
    for process in [
        "KillSidecar",
        "KillLeader",
        "TermSidecar",
        "TermLeader",
        "FreezeLeader",
    ] {
        rules.push(process.to_owned());
    }
    match backend {
        Backend::TestServer => {
            rules.extend(["CloseWatches", "Compact", "Partition"].map(str::to_owned));
            rules.extend(LATENCY_TARGETS.map(latency_rule));
            rules.extend(WATCH_LAG_TARGETS.map(watch_lag_rule));
            for (verb, resource) in API_TARGETS.iter().chain(&LEASE_TARGETS) {
                rules.push(api_rule(*verb, resource));
            }
        }
        Backend::Real => {
            rules.extend(
                [
                    "RestartApiServer",
                    "CompactEtcd",
                    "RestartControllerManager",
                    "KillEtcd",
                ]
                .map(str::to_owned),
            );
            rules.extend(WATCH_LAG_TARGETS.map(watch_lag_rule));
        }
    }
    rules
}

/// The driver calls of the workload's claims, faulted in every seed (aimed
/// at a provisioning or a deletion).
const VOLUME_METHODS: [&str; 2] = ["CreateVolume", "DeleteVolume"];

/// The sidecar's other driver calls, each faulted (once with each kind of
/// fault) in every fifth seed, its focus: seeds 1 to 5 of either backend
/// plan every rule. `Probe` is called at start-up and by `/healthz` (every
/// replica serves `--http-endpoint`, which the runner polls while a Probe
/// fault lasts); `GetCapacity` with capacity tracking, which a seed of
/// that focus turns on; `GetPluginInfo` and the capability calls at
/// start-up only (`Driver::discover` in `src/csi/driver.rs`): the plan
/// restarts the leader right after such a fault.
pub const FOCUS_METHODS: [&str; 5] = [
    "Probe",
    "GetCapacity",
    "GetPluginInfo",
    "GetPluginCapabilities",
    "ControllerGetCapabilities",
];

/// The calls a sidecar makes before it works, whose failure (as the Go
/// image's) ends it: `Probe` with a code that waiting cannot fix, any
/// failure of the others.
pub const STARTUP_METHODS: [&str; 4] = [
    "Probe",
    "GetPluginInfo",
    "GetPluginCapabilities",
    "ControllerGetCapabilities",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum ClaimState {
    Live(Class),
    Gone,
}

/// The seeds' schedule repeats every `PERIOD` seeds: any `PERIOD`
/// consecutive seeds plan every rule of [`rules`] in at least two seeds
/// (each focus call in two, every other rule in the two seeds of
/// [`schedule`]), so that a run of that many seeds, CI's sample of the
/// test server, can tell a rule that never strikes (dead) from one that
/// was not planned.
pub const PERIOD: u64 = 10;

/// The seeds (by `seed % PERIOD`) that run two replicas with leader
/// election, the rest one: the leader's rules are scheduled in these.
const TWO_REPLICAS: [u64; 4] = [1, 3, 6, 8];

/// A fault rule, whose parameters (code, count, delay, replica) the
/// seed's rng draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 0: error, 1: slowness, 2: exit ([`driver_fault`]).
    Driver(u64, &'static str),
    KillSidecar,
    KillLeader,
    TermSidecar,
    TermLeader,
    FreezeLeader,
    CloseWatches,
    Compact,
    Partition,
    Latency(Option<&'static str>),
    WatchLag(&'static str),
    Api(ApiVerb, &'static str),
    RestartApiServer,
    CompactEtcd,
    RestartControllerManager,
    KillEtcd,
}

impl Kind {
    fn draw(self, rng: &mut Rng, replicas: usize) -> Fault {
        match self {
            Kind::Driver(kind, method) => driver_fault(rng, kind, method),
            Kind::KillSidecar => Fault::KillSidecar {
                replica: rng.below(replicas as u64) as usize,
                down_ms: rng.between(0, 1500),
            },
            Kind::KillLeader => Fault::KillLeader {
                down_ms: rng.between(0, 1500),
            },
            Kind::TermSidecar => Fault::TermSidecar {
                replica: rng.below(replicas as u64) as usize,
                down_ms: rng.between(0, 1500),
            },
            Kind::TermLeader => Fault::TermLeader {
                down_ms: rng.between(0, 1500),
            },
            // Its claims are numbered by `aim`. Held shorter than the
            // freeze (answers waiting when it wakes) or longer (answered
            // after), both beyond `--timeout`.
            Kind::FreezeLeader => Fault::FreezeLeader {
                first_claim: 0,
                claims: rng.between(1, 3) as usize,
                class: rng.pick(&Class::ALL),
                delay_ms: rng.between(SIDECAR_TIMEOUT_MS + 200, SIDECAR_TIMEOUT_MS * 4),
            },
            Kind::CloseWatches => Fault::CloseWatches,
            Kind::Compact => Fault::Compact,
            Kind::Partition => Fault::Partition {
                ms: rng.between(500, 5000),
            },
            Kind::Latency(resource) => Fault::ApiLatency {
                resource,
                delay_ms: rng.between(100, 1500),
                for_ms: rng.between(1000, 4000),
            },
            // Held long enough to meet what it is aimed at: the classes'
            // lag (aimed at a restart) may wait for a graceful shutdown
            // (`--timeout` and a 2 s drain) and a start-up first.
            Kind::WatchLag(resource) => Fault::WatchLag {
                resource,
                lag_ms: rng.between(100, 1500),
                hold_ms: match resource {
                    "storageclasses" => rng.between(5000, 8000),
                    _ => rng.between(1000, 4000),
                },
            },
            Kind::Api(verb, resource) => Fault::Api {
                verb,
                resource,
                status: rng.pick(api_statuses(verb)),
                count: rng.between(1, 3) as u32,
            },
            Kind::RestartApiServer => Fault::RestartApiServer,
            Kind::CompactEtcd => Fault::CompactEtcd,
            Kind::RestartControllerManager => Fault::RestartControllerManager,
            Kind::KillEtcd => Fault::KillEtcd {
                down_ms: rng.between(500, 3000),
            },
        }
    }
}

/// The rules [`schedule`] spreads over every `PERIOD` seeds: those that
/// need a leader (two replicas), and the others; the focus calls' rules
/// are each seed's focus instead.
fn scheduled_kinds(backend: Backend) -> (Vec<Kind>, Vec<Kind>) {
    // FreezeLeader first: seeds 1 and 3, in the real cluster's sample too.
    let mut leader = vec![Kind::FreezeLeader, Kind::KillLeader, Kind::TermLeader];
    let mut others: Vec<Kind> = VOLUME_METHODS
        .iter()
        .flat_map(|&method| (0..3).map(move |kind| Kind::Driver(kind, method)))
        .collect();
    others.extend([Kind::KillSidecar, Kind::TermSidecar]);
    match backend {
        Backend::TestServer => {
            leader.extend(LEASE_TARGETS.map(|(verb, resource)| Kind::Api(verb, resource)));
            others.extend([Kind::CloseWatches, Kind::Compact, Kind::Partition]);
            others.extend(LATENCY_TARGETS.map(Kind::Latency));
            others.extend(API_TARGETS.map(|(verb, resource)| Kind::Api(verb, resource)));
            others.extend(WATCH_LAG_TARGETS.map(Kind::WatchLag));
        }
        Backend::Real => {
            others.extend([
                Kind::RestartApiServer,
                Kind::CompactEtcd,
                Kind::RestartControllerManager,
                Kind::KillEtcd,
            ]);
            others.extend(WATCH_LAG_TARGETS.map(Kind::WatchLag));
        }
    }
    (leader, others)
}

/// The rules `seed` injects for sure (beyond its focus and its random
/// faults): each rule of [`scheduled_kinds`] in two of every `PERIOD`
/// seeds, a leader's in two of the [`TWO_REPLICAS`] seeds.
fn schedule(seed: u64, backend: Backend) -> Vec<Kind> {
    let residue = seed % PERIOD;
    let (leader, others) = scheduled_kinds(backend);
    let mut out = Vec::new();
    let spread = TWO_REPLICAS.len();
    for (j, kind) in leader.into_iter().enumerate() {
        if [TWO_REPLICAS[j % spread], TWO_REPLICAS[(j + 1) % spread]].contains(&residue) {
            out.push(kind);
        }
    }
    for (i, kind) in others.into_iter().enumerate() {
        let i = i as u64;
        // Two residues, never the same: 3i + 7 - i is odd.
        if [i % PERIOD, (3 * i + 7) % PERIOD].contains(&residue) {
            out.push(kind);
        }
    }
    out
}

/// What a step chosen to be a fault injects.
#[derive(Debug, Clone, Copy)]
enum Slot {
    /// The focus call, with a kind of driver fault ([`driver_fault`]).
    Focus(u64),
    Scheduled(Kind),
}

/// The plan of `seed` against `backend`.
pub fn plan(seed: u64, backend: Backend) -> Plan {
    let mut rng = Rng::new(seed);
    let replicas = if TWO_REPLICAS.contains(&(seed % PERIOD)) {
        2
    } else {
        1
    };
    let focus = FOCUS_METHODS[(seed % FOCUS_METHODS.len() as u64) as usize];
    let capacity = focus == "GetCapacity" || rng.chance(40);
    let mut claims: Vec<ClaimState> = Vec::new();
    let mut pods = std::collections::BTreeSet::new();
    // Set index → alive.
    let mut sets: Vec<bool> = Vec::new();
    let mut steps = Vec::new();
    let mut slots: Vec<Slot> = (0..3).map(Slot::Focus).collect();
    slots.extend(schedule(seed, backend).into_iter().map(Slot::Scheduled));
    // The real cluster's faults take longer (restarts of its processes):
    // fewer steps around them.
    let length = match backend {
        Backend::TestServer => rng.between(10, 18),
        Backend::Real => rng.between(6, 12),
    }
    .max(slots.len() as u64 + 3);
    // The steps (by index) that inject the focus's and the schedule's
    // faults, in a random order.
    let mut fault_at = std::collections::BTreeMap::new();
    for slot in slots {
        loop {
            let at = rng.below(length);
            if let std::collections::btree_map::Entry::Vacant(free) = fault_at.entry(at) {
                free.insert(slot);
                break;
            }
        }
    }
    for index in 0..length {
        let live: Vec<usize> = (0..claims.len())
            .filter(|&i| matches!(claims[i], ClaimState::Live(_)))
            .collect();
        // A step of the focus or of the schedule is a fault step; of the
        // others, one in ten (the schedule's make most of a seed's faults).
        let slot = fault_at.get(&index).copied();
        let roll = match rng.below(100) {
            _ if slot.is_some() => 68,
            roll @ 68..=89 if !rng.chance(45) => roll - 68,
            roll => roll,
        };
        let step = match roll {
            0..=34 => {
                let class = rng.pick(&Class::ALL);
                claims.push(ClaimState::Live(class));
                Step::CreateClaim {
                    claim: claims.len() - 1,
                    class,
                }
            }
            35..=49 if !live.is_empty() => {
                let claim = rng.pick(&live);
                // A claim in use is deleted as users do: its PV stays
                // until the pod ends (PVC protection).
                let pv_first = !pods.contains(&claim)
                    && matches!(claims[claim], ClaimState::Live(class) if class.reclaim == Reclaim::Delete)
                    && rng.chance(40);
                claims[claim] = ClaimState::Gone;
                if pv_first {
                    Step::DeletePvThenClaim { claim }
                } else {
                    Step::DeleteClaim { claim }
                }
            }
            50..=54 if live.iter().any(|c| !pods.contains(c)) => {
                let free: Vec<usize> = live.into_iter().filter(|c| !pods.contains(c)).collect();
                let claim = rng.pick(&free);
                pods.insert(claim);
                Step::StartPod { claim }
            }
            55..=59 if !pods.is_empty() => {
                let running: Vec<usize> = pods.iter().copied().collect();
                let claim = rng.pick(&running);
                pods.remove(&claim);
                Step::StopPod { claim }
            }
            60..=67 => {
                let live_sets: Vec<usize> = (0..sets.len()).filter(|&s| sets[s]).collect();
                let policy = |rng: &mut Rng| {
                    if rng.chance(50) {
                        Reclaim::Delete
                    } else {
                        Reclaim::Retain
                    }
                };
                if live_sets.is_empty() || (sets.len() < 2 && rng.chance(15)) {
                    sets.push(true);
                    Step::CreateSet {
                        set: sets.len() - 1,
                        replicas: rng.between(1, 3) as u32,
                        when_scaled: policy(&mut rng),
                        when_deleted: policy(&mut rng),
                    }
                } else {
                    let set = rng.pick(&live_sets);
                    if rng.chance(25) {
                        sets[set] = false;
                        Step::DeleteSet { set }
                    } else {
                        Step::ScaleSet {
                            set,
                            replicas: rng.between(0, 3) as u32,
                        }
                    }
                }
            }
            68..=89 => {
                let fault = match slot {
                    Some(Slot::Focus(kind)) => driver_fault(&mut rng, kind, focus),
                    Some(Slot::Scheduled(kind)) => kind.draw(&mut rng, replicas),
                    None => random_kind(&mut rng, backend, replicas).draw(&mut rng, replicas),
                };
                aim(
                    fault,
                    &mut rng,
                    replicas,
                    &mut claims,
                    &live,
                    &pods,
                    &mut steps,
                )
            }
            _ => Step::Pause {
                ms: rng.between(100, 800),
            },
        };
        steps.push(step);
        if rng.chance(50) {
            steps.push(Step::Pause {
                ms: rng.between(20, 300),
            });
        }
    }
    // Pods end with the workload; claims still in use keep their
    // protection until then (checked while they run).
    steps.extend(pods.into_iter().map(|claim| Step::StopPod { claim }));
    Plan {
        seed,
        backend,
        replicas,
        capacity,
        focus,
        steps,
    }
}

/// The steps that bring `fault` what it is aimed at: pushed to `steps`,
/// but for the last, which is returned.
fn aim(
    fault: Fault,
    rng: &mut Rng,
    replicas: usize,
    claims: &mut Vec<ClaimState>,
    live: &[usize],
    pods: &std::collections::BTreeSet<usize>,
    steps: &mut Vec<Step>,
) -> Step {
    let aimed_at = fault.aimed_at();
    match aimed_at {
        AimedAt::Deletion => {
            // A claim of a Delete class not in use (one made for it when
            // there is none, given time to be bound first).
            let deletable: Vec<usize> = live
                .iter()
                .copied()
                .filter(|c| {
                    !pods.contains(c)
                        && matches!(claims[*c], ClaimState::Live(class) if class.reclaim == Reclaim::Delete)
                })
                .collect();
            let claim = if deletable.is_empty() {
                let class = Class::new(Binding::Immediate, Reclaim::Delete);
                claims.push(ClaimState::Live(class));
                steps.push(Step::CreateClaim {
                    claim: claims.len() - 1,
                    class,
                });
                steps.push(Step::Pause {
                    ms: rng.between(300, 800),
                });
                claims.len() - 1
            } else {
                rng.pick(&deletable)
            };
            claims[claim] = ClaimState::Gone;
            steps.push(Step::Fault(fault));
            steps.push(Step::Pause {
                ms: rng.between(200, 600),
            });
            Step::DeleteBoundClaim { claim }
        }
        AimedAt::Anything => Step::Fault(fault),
        AimedAt::ItsOwnClaims => match fault {
            Fault::FreezeLeader {
                claims: count,
                class,
                delay_ms,
                ..
            } => {
                let first_claim = claims.len();
                claims.extend((0..count).map(|_| ClaimState::Live(class)));
                Step::Fault(Fault::FreezeLeader {
                    first_claim,
                    claims: count,
                    class,
                    delay_ms,
                })
            }
            other => Step::Fault(other),
        },
        AimedAt::Rewatch => {
            steps.push(Step::Fault(fault));
            Step::Fault(Fault::CloseWatches)
        }
        AimedAt::Restart => {
            steps.push(Step::Fault(fault));
            let down_ms = rng.between(0, 500);
            let term = rng.chance(50);
            Step::Fault(match (replicas, term) {
                (2, false) => Fault::KillLeader { down_ms },
                (2, true) => Fault::TermLeader { down_ms },
                (_, false) => Fault::KillSidecar {
                    replica: 0,
                    down_ms,
                },
                (_, true) => Fault::TermSidecar {
                    replica: 0,
                    down_ms,
                },
            })
        }
        AimedAt::Provisioning | AimedAt::FirstProvisioning => {
            steps.push(Step::Fault(fault));
            if aimed_at == AimedAt::FirstProvisioning {
                let down_ms = rng.between(0, 500);
                steps.push(Step::Fault(if replicas == 2 {
                    Fault::TermLeader { down_ms }
                } else {
                    Fault::TermSidecar {
                        replica: 0,
                        down_ms,
                    }
                }));
            }
            steps.push(Step::Pause {
                ms: rng.between(20, 300),
            });
            let class = rng.pick(&Class::ALL);
            claims.push(ClaimState::Live(class));
            Step::CreateClaim {
                claim: claims.len() - 1,
                class,
            }
        }
    }
}

/// A driver fault of `kind` (0: error, 1: slowness, 2: exit) on `method`.
fn driver_fault(rng: &mut Rng, kind: u64, method: &'static str) -> Fault {
    match kind {
        0 => Fault::DriverError {
            method,
            code: rng.pick(GRPC_CODES).1,
            count: rng.between(1, 3) as u32,
        },
        1 => Fault::DriverSlow {
            method,
            delay_ms: rng.between(SIDECAR_TIMEOUT_MS + 200, SIDECAR_TIMEOUT_MS * 3),
            count: rng.between(1, 2) as u32,
        },
        _ => Fault::DriverExit {
            method,
            down_ms: rng.between(0, 500),
        },
    }
}

/// A fault step's rule beyond the schedule, at random.
fn random_kind(rng: &mut Rng, backend: Backend, replicas: usize) -> Kind {
    match rng.below(11) {
        kind @ 0..=3 => Kind::Driver(kind.saturating_sub(1), rng.pick(&VOLUME_METHODS)),
        4 if replicas == 2 && rng.chance(25) => Kind::FreezeLeader,
        4 if replicas == 2 => Kind::KillLeader,
        4 | 5 => Kind::KillSidecar,
        6 if replicas == 2 && rng.chance(50) => Kind::TermLeader,
        6 => Kind::TermSidecar,
        _ => match backend {
            Backend::TestServer => match rng.below(7) {
                0 => Kind::CloseWatches,
                1 => Kind::Compact,
                2 => Kind::Latency(rng.pick(&LATENCY_TARGETS)),
                3 => Kind::Partition,
                4 => Kind::WatchLag(rng.pick(&WATCH_LAG_TARGETS)),
                _ => {
                    let (verb, resource) = if replicas == 2 && rng.chance(30) {
                        rng.pick(&LEASE_TARGETS)
                    } else {
                        rng.pick(&API_TARGETS)
                    };
                    Kind::Api(verb, resource)
                }
            },
            Backend::Real => match rng.below(7) {
                0 | 1 => Kind::RestartApiServer,
                2 => Kind::CompactEtcd,
                3 | 4 => Kind::RestartControllerManager,
                5 => Kind::WatchLag(rng.pick(&WATCH_LAG_TARGETS)),
                _ => Kind::KillEtcd,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_gives_the_same_plan() {
        for seed in 0..200 {
            assert_eq!(
                plan(seed, Backend::TestServer),
                plan(seed, Backend::TestServer)
            );
        }
    }

    #[test]
    fn the_plans_cover_every_fault_and_workload_step() {
        let mut seen = std::collections::BTreeSet::new();
        for backend in [Backend::TestServer, Backend::Real] {
            for seed in 0..300 {
                for step in plan(seed, backend).steps {
                    let name = match step {
                        Step::Fault(fault) => format!("{fault:?}"),
                        other => format!("{other:?}"),
                    };
                    seen.insert(name.split([' ', '{', '(']).next().unwrap_or("").to_owned());
                }
            }
        }
        for want in [
            "CreateClaim",
            "DeleteClaim",
            "DeleteBoundClaim",
            "DeletePvThenClaim",
            "StartPod",
            "StopPod",
            "Pause",
            "CreateSet",
            "ScaleSet",
            "DeleteSet",
            "KillSidecar",
            "KillLeader",
            "TermSidecar",
            "TermLeader",
            "FreezeLeader",
            "DriverError",
            "DriverSlow",
            "DriverExit",
            "Api",
            "CloseWatches",
            "Compact",
            "RestartApiServer",
            "CompactEtcd",
            "RestartControllerManager",
            "ApiLatency",
            "WatchLag",
            "Partition",
            "KillEtcd",
        ] {
            assert!(seen.contains(want), "no plan has {want}: {seen:?}");
        }
    }

    /// Every rule of the catalogue is planned by some seed, and no plan
    /// holds a rule outside it (the summary would not count it).
    #[test]
    fn the_plans_cover_every_rule_of_the_catalogue() {
        for backend in [Backend::TestServer, Backend::Real] {
            let catalogue: std::collections::BTreeSet<String> =
                rules(backend).into_iter().collect();
            let mut seen = std::collections::BTreeSet::new();
            for seed in 0..500 {
                for step in plan(seed, backend).steps {
                    if let Step::Fault(fault) = step {
                        let rule = fault.rule();
                        assert!(catalogue.contains(&rule), "{rule} not in {catalogue:?}");
                        seen.insert(rule);
                    }
                }
            }
            let missing: Vec<&String> = catalogue.difference(&seen).collect();
            assert!(missing.is_empty(), "{backend:?}: never planned {missing:?}");
        }
    }

    /// Any `PERIOD` consecutive seeds (CI's sample of the test server)
    /// plan every rule of the catalogue in at least two seeds: a run of
    /// them can call a rule that never struck dead.
    #[test]
    fn every_period_of_seeds_plans_every_rule_in_two_seeds() {
        for backend in [Backend::TestServer, Backend::Real] {
            for first in 0..2 * PERIOD + 1 {
                let mut seeds_of: std::collections::BTreeMap<String, u64> = Default::default();
                for seed in first..first + PERIOD {
                    let rules: std::collections::BTreeSet<String> = plan(seed, backend)
                        .steps
                        .iter()
                        .filter_map(|step| match step {
                            Step::Fault(fault) => Some(fault.rule()),
                            _ => None,
                        })
                        .collect();
                    for rule in rules {
                        *seeds_of.entry(rule).or_default() += 1;
                    }
                }
                for rule in rules(backend) {
                    let n = seeds_of.get(&rule).copied().unwrap_or(0);
                    assert!(
                        n >= 2,
                        "{backend:?}: seeds {first}..{}: {rule} planned in {n} seeds",
                        first + PERIOD
                    );
                }
            }
        }
    }

    /// Fencing is planned in the real cluster's sample (seeds 1 to 4) and
    /// in CI's sample of the test server.
    #[test]
    fn the_default_samples_freeze_a_leader() {
        for backend in [Backend::TestServer, Backend::Real] {
            let frozen = (1..=4)
                .filter(|&seed| {
                    plan(seed, backend)
                        .steps
                        .iter()
                        .any(|step| matches!(step, Step::Fault(Fault::FreezeLeader { .. })))
                })
                .count();
            assert!(frozen >= 2, "{backend:?}: {frozen} of seeds 1..=4");
        }
    }

    /// The Lease is only renewed with two replicas: a fault on it in a
    /// single-replica seed could never fire.
    #[test]
    fn lease_faults_only_strike_two_replicas() {
        for seed in 0..500 {
            let plan = plan(seed, Backend::TestServer);
            for step in &plan.steps {
                if let Step::Fault(
                    fault @ (Fault::Api {
                        resource: "leases", ..
                    }
                    | Fault::KillLeader { .. }
                    | Fault::TermLeader { .. }
                    | Fault::FreezeLeader { .. }),
                ) = step
                {
                    assert_eq!(plan.replicas, 2, "seed {seed}: {fault:?}");
                }
            }
        }
    }

    /// A watch lag is planned on both backends, on every target, and held
    /// long enough for what it is aimed at; CI's sample of the real
    /// cluster (seeds 1 to 4) meets one.
    #[test]
    fn watch_lags_strike_both_backends() {
        for backend in [Backend::TestServer, Backend::Real] {
            let mut resources = std::collections::BTreeSet::new();
            for seed in 0..500 {
                for step in plan(seed, backend).steps {
                    let Step::Fault(
                        fault @ Fault::WatchLag {
                            resource, hold_ms, ..
                        },
                    ) = step
                    else {
                        continue;
                    };
                    let at_least = match fault.aimed_at() {
                        AimedAt::Restart => 5000,
                        _ => 1000,
                    };
                    assert!(hold_ms >= at_least, "seed {seed}: {fault:?}");
                    resources.insert(resource);
                }
            }
            assert_eq!(resources, WATCH_LAG_TARGETS.into(), "{backend:?}");
        }
        let sampled = (1..=4).any(|seed| {
            plan(seed, Backend::Real)
                .steps
                .iter()
                .any(|step| matches!(step, Step::Fault(Fault::WatchLag { .. })))
        });
        assert!(sampled, "no watch lag in the real cluster's CI sample");
    }

    /// A fault is followed by the work it is aimed at.
    #[test]
    fn faults_are_followed_by_what_they_aim_at() {
        for seed in 0..300 {
            let steps = plan(seed, Backend::TestServer).steps;
            for (i, step) in steps.iter().enumerate() {
                let Step::Fault(fault) = step else {
                    continue;
                };
                let mut next = steps.get(i + 2);
                if fault.aimed_at() == AimedAt::FirstProvisioning {
                    assert!(
                        matches!(
                            steps.get(i + 1),
                            Some(Step::Fault(
                                Fault::TermSidecar { .. } | Fault::TermLeader { .. }
                            ))
                        ),
                        "seed {seed}: {fault:?} then {:?}",
                        steps.get(i + 1)
                    );
                    next = steps.get(i + 3);
                }
                let followed = match fault.aimed_at() {
                    AimedAt::Anything | AimedAt::ItsOwnClaims => true,
                    AimedAt::Rewatch => {
                        matches!(steps.get(i + 1), Some(Step::Fault(Fault::CloseWatches)))
                    }
                    AimedAt::Restart => matches!(
                        steps.get(i + 1),
                        Some(Step::Fault(
                            Fault::KillSidecar { .. }
                                | Fault::KillLeader { .. }
                                | Fault::TermSidecar { .. }
                                | Fault::TermLeader { .. }
                        ))
                    ),
                    AimedAt::Deletion => matches!(next, Some(Step::DeleteBoundClaim { .. })),
                    AimedAt::Provisioning | AimedAt::FirstProvisioning => {
                        matches!(next, Some(Step::CreateClaim { .. }))
                    }
                };
                assert!(followed, "seed {seed}: {fault:?} then {next:?}");
            }
        }
    }

    /// Every seed faults its focus call once with each kind of driver
    /// fault, and seeds 1 to 5 (of the real cluster's sample, the
    /// smallest) together plan every rule of every focus call.
    #[test]
    fn every_seed_faults_its_focus_and_five_seeds_cover_every_call() {
        for backend in [Backend::TestServer, Backend::Real] {
            let mut planned = std::collections::BTreeSet::new();
            for seed in 0..300 {
                let plan = plan(seed, backend);
                let mut kinds = std::collections::BTreeSet::new();
                for step in &plan.steps {
                    if let Step::Fault(fault) = step {
                        let rule = fault.rule();
                        if let Some((kind, method)) = rule.split_once(' ')
                            && method == plan.focus
                        {
                            kinds.insert(kind.to_owned());
                        }
                        if (1..=5).contains(&seed) {
                            planned.insert(rule);
                        }
                    }
                }
                assert_eq!(kinds.len(), 3, "seed {seed}: {kinds:?}");
            }
            for method in FOCUS_METHODS {
                for kind in ["DriverError", "DriverSlow", "DriverExit"] {
                    let rule = format!("{kind} {method}");
                    assert!(planned.contains(&rule), "{backend:?}: {rule} not planned");
                }
            }
        }
    }

    /// `GetCapacity` is only called with capacity tracking: a fault on it
    /// in a seed without would never fire.
    #[test]
    fn capacity_faults_only_strike_seeds_that_track_capacity() {
        let mut tracked = 0;
        for seed in 0..500 {
            let plan = plan(seed, Backend::TestServer);
            tracked += u32::from(plan.capacity);
            for step in &plan.steps {
                if let Step::Fault(
                    fault @ (Fault::DriverError {
                        method: "GetCapacity",
                        ..
                    }
                    | Fault::DriverSlow {
                        method: "GetCapacity",
                        ..
                    }
                    | Fault::DriverExit {
                        method: "GetCapacity",
                        ..
                    }),
                ) = step
                {
                    assert!(plan.capacity, "seed {seed}: {fault:?}");
                }
            }
        }
        // And some seeds track it without a fault on it.
        assert!(tracked > 150, "{tracked} of 500 seeds track capacity");
    }

    /// A watch's start answers 500, 429 or 410 (each planned), a write 409,
    /// 500 or 429.
    #[test]
    fn watch_faults_answer_what_a_watch_may_meet() {
        let mut watch_statuses = std::collections::BTreeSet::new();
        for seed in 0..500 {
            for step in plan(seed, Backend::TestServer).steps {
                if let Step::Fault(Fault::Api { verb, status, .. }) = step {
                    assert!(api_statuses(verb).contains(&status), "seed {seed}");
                    if verb == ApiVerb::Watch {
                        watch_statuses.insert(status);
                    }
                }
            }
        }
        assert_eq!(watch_statuses, [410, 429, 500].into());
    }

    #[test]
    fn every_grpc_code_is_injected_by_some_seed() {
        let mut codes = std::collections::BTreeSet::new();
        for seed in 0..500 {
            for step in plan(seed, Backend::TestServer).steps {
                if let Step::Fault(Fault::DriverError { code, .. }) = step {
                    codes.insert(code);
                }
            }
        }
        assert_eq!(codes.len(), GRPC_CODES.len(), "{codes:?}");
    }

    #[test]
    fn claims_are_deleted_only_once_and_only_after_creation() {
        for seed in 0..300 {
            let mut created = std::collections::BTreeSet::new();
            let mut deleted = std::collections::BTreeSet::new();
            for step in plan(seed, Backend::TestServer).steps {
                match step {
                    Step::CreateClaim { claim, .. } => assert!(created.insert(claim)),
                    Step::Fault(Fault::FreezeLeader {
                        first_claim,
                        claims,
                        ..
                    }) => {
                        for claim in first_claim..first_claim + claims {
                            assert!(created.insert(claim), "seed {seed}");
                        }
                    }
                    Step::DeleteClaim { claim }
                    | Step::DeleteBoundClaim { claim }
                    | Step::DeletePvThenClaim { claim } => {
                        assert!(
                            created.contains(&claim) && deleted.insert(claim),
                            "seed {seed}"
                        );
                    }
                    Step::StartPod { claim } | Step::StopPod { claim } => {
                        assert!(created.contains(&claim), "seed {seed}");
                    }
                    _ => {}
                }
            }
        }
    }
}
