//! Every Kubernetes API call the sidecar makes, per loop. The deploy tests
//! check that the RBAC rules in `deploy/` grant each of them (and nothing a
//! loop does not need), so a new call without its rule fails CI instead of
//! failing in a user's cluster. Keep these lists next to the code that makes
//! the calls in sync.

/// One (group, resource, verbs) a loop uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    /// API group, `""` for core.
    pub group: &'static str,
    /// Plural resource name, with `/subresource` when it is one.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
    /// True when the call is made only in the sidecar's own namespace (a
    /// Role suffices); false for cluster-wide access (ClusterRole).
    pub namespaced_only: bool,
}

const fn call(
    group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
) -> ApiCall {
    ApiCall {
        group,
        resource,
        verbs,
        namespaced_only: false,
    }
}

const WATCH: &[&str] = &["get", "list", "watch"];

/// The provisioning loop (`src/provisioner`).
pub const PROVISIONER: &[ApiCall] = &[
    call(
        "",
        "persistentvolumes",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    // Watched; patched to drop the selected-node annotation (reschedule),
    // for the clone-source finalizer, and (--node-deployment) to set the
    // selected-node annotation to this node, guarded by resourceVersion
    // (upstream uses update; a guarded patch needs no extra verb).
    call(
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "patch"],
    ),
    call("storage.k8s.io", "storageclasses", WATCH),
    // Not watched with --node-deployment (the driver's NodeGetInfo instead).
    call("", "nodes", WATCH),
    call("storage.k8s.io", "csinodes", WATCH),
    call("storage.k8s.io", "volumeattributesclasses", WATCH),
    call("storage.k8s.io", "volumeattachments", WATCH),
    call("", "secrets", &["get"]),
    call("", "events", &["create", "patch"]),
    // get and patch: the source-protection finalizer of a restore; list:
    // the sweep of orphaned finalizers (src/snapshot_sweep).
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshots",
        &["get", "list", "patch"],
    ),
    call(
        "snapshot.storage.k8s.io",
        "volumesnapshotcontents",
        &["get"],
    ),
    // The write-ahead journal, in the sidecar's namespace.
    ApiCall {
        group: "",
        resource: "configmaps",
        verbs: &["list", "create", "update", "delete"],
        namespaced_only: true,
    },
];

/// Leader election (`src/leader.rs`, with `--leader-election`): the Lease
/// in the sidecar's namespace, read–modify–update as client-go does.
pub const LEADER_ELECTION: &[ApiCall] = &[ApiCall {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "update"],
    namespaced_only: true,
}];

const LIST_WATCH: &[&str] = &["list", "watch"];

/// The PVC-protection loop (`src/protection`): watches (the shared caches
/// only list and watch), live lists of a namespace's pods, and JSON patches
/// of claim finalizers.
pub const PVC_PROTECTION: &[ApiCall] = &[
    call("", "persistentvolumeclaims", &["list", "watch", "patch"]),
    call("", "pods", LIST_WATCH),
    call("", "persistentvolumes", LIST_WATCH),
    call("storage.k8s.io", "storageclasses", LIST_WATCH),
];

/// The PV-releaser loop (`src/releaser`): watches, and merge patches of PV
/// labels and claim references; events on PVs.
pub const PV_RELEASER: &[ApiCall] = &[
    call("", "persistentvolumes", &["list", "watch", "patch"]),
    call("", "persistentvolumeclaims", LIST_WATCH),
    call("storage.k8s.io", "storageclasses", LIST_WATCH),
    // The shared recorder (`src/events.rs`), as for the provisioner.
    call("", "events", &["create", "patch"]),
];

/// The StatefulSet PVC retention loop (`src/retention`, gate
/// `StatefulSetAutoDeletePVC`).
pub const STATEFULSET_RETENTION: &[ApiCall] = &[
    // Watched; `get` re-reads a set live before deleting a condemned claim.
    call("apps", "statefulsets", WATCH),
    call("", "pods", WATCH),
    // Owner references are patched; condemned claims whose pod is gone are
    // deleted.
    call(
        "",
        "persistentvolumeclaims",
        &["get", "list", "watch", "patch", "delete"],
    ),
    call("storage.k8s.io", "storageclasses", WATCH),
];

/// Storage capacity tracking (`src/capacity`, `--enable-capacity`).
pub const CAPACITY: &[ApiCall] = &[
    // The shared caches it decides from (also the provisioner's).
    call("storage.k8s.io", "storageclasses", LIST_WATCH),
    call("", "nodes", LIST_WATCH),
    call("storage.k8s.io", "csinodes", LIST_WATCH),
    // Its objects, in the sidecar's namespace: watched (by label), created,
    // replaced when a value changes, deleted when stale.
    ApiCall {
        group: "storage.k8s.io",
        resource: "csistoragecapacities",
        verbs: &["list", "watch", "create", "update", "delete"],
        namespaced_only: true,
    },
    // `--capacity-ownerref-level`: the owner chain from POD_NAME, read once
    // at start (`src/capacity/owner.rs`).
    ApiCall {
        group: "",
        resource: "pods",
        verbs: &["get"],
        namespaced_only: true,
    },
    ApiCall {
        group: "apps",
        resource: "replicasets",
        verbs: &["get"],
        namespaced_only: true,
    },
    ApiCall {
        group: "apps",
        resource: "statefulsets",
        verbs: &["get"],
        namespaced_only: true,
    },
    ApiCall {
        group: "apps",
        resource: "daemonsets",
        verbs: &["get"],
        namespaced_only: true,
    },
    ApiCall {
        group: "apps",
        resource: "deployments",
        verbs: &["get"],
        namespaced_only: true,
    },
];

/// The pod/Job PVC provisioner (`src/pod_pvc`, gate `PodPVCProvisioner`):
/// pods and Jobs watched (and read live before a cleanup), PVCs created
/// and deleted, events on pods and Jobs.
pub const POD_PVC_PROVISIONER: &[ApiCall] = &[
    call("", "pods", WATCH),
    call("batch", "jobs", WATCH),
    call(
        "",
        "persistentvolumeclaims",
        &["list", "watch", "create", "delete"],
    ),
    call("", "events", &["create", "patch"]),
];

/// Cross-namespace data sources (gate `CrossNamespaceVolumeDataSource`):
/// ReferenceGrants watched in every namespace.
pub const CROSS_NAMESPACE_DATA_SOURCE: &[ApiCall] =
    &[call("gateway.networking.k8s.io", "referencegrants", WATCH)];

/// Every loop's calls, with the loop's name (for messages).
pub fn all() -> Vec<(&'static str, &'static [ApiCall])> {
    vec![
        ("provisioner", PROVISIONER),
        ("leader-election", LEADER_ELECTION),
        ("pvc-protection", PVC_PROTECTION),
        ("pv-releaser", PV_RELEASER),
        ("statefulset-retention", STATEFULSET_RETENTION),
        ("capacity", CAPACITY),
        ("cross-namespace-data-source", CROSS_NAMESPACE_DATA_SOURCE),
        ("pod-pvc-provisioner", POD_PVC_PROVISIONER),
    ]
}
