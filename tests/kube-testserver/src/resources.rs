//! The table of served kinds. Adding a kind is one line in [`builtin_resources`].

/// Description of one served resource (one REST collection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group, `""` for the core group.
    pub group: &'static str,
    /// API version, e.g. `"v1"`.
    pub version: &'static str,
    /// Kind, e.g. `"PersistentVolume"`.
    pub kind: &'static str,
    /// Plural resource name used in URLs, e.g. `"persistentvolumes"`.
    pub plural: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// kubectl short names, e.g. `["pv"]`.
    pub short_names: &'static [&'static str],
    /// Whether the kind has a `/status` subresource (status is then ignored on
    /// writes to the main resource and only status is taken from `/status` writes).
    pub status_subresource: bool,
    /// Whether the server maintains `metadata.generation` for this kind
    /// (Pods, StatefulSets, custom resources do; most built-in storage kinds do not).
    pub generation: bool,
    /// Registered like a CustomResourceDefinition: strategic merge patch is
    /// rejected with 415 as for real custom resources.
    pub custom: bool,
    /// DELETE answers with the object (true) or with a `Status` (false) when the
    /// object is removed at once.
    pub returns_deleted_object: bool,
    /// Field selector labels accepted besides `metadata.name` / `metadata.namespace`.
    pub extra_fields: &'static [&'static str],
}

impl ResourceInfo {
    /// `apiVersion` string, e.g. `v1` or `storage.k8s.io/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Lower-case singular name, as discovery reports it.
    pub fn singular(&self) -> String {
        self.kind.to_ascii_lowercase()
    }

    /// `plural` or `plural.group`, as used in error messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

const NONE: &[&str] = &[];
const POD_FIELDS: &[&str] = &[
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
];
const EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

#[allow(clippy::too_many_arguments)]
const fn r(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status_subresource: bool,
    generation: bool,
    returns_deleted_object: bool,
    extra_fields: &'static [&'static str],
) -> ResourceInfo {
    ResourceInfo {
        group,
        version,
        kind,
        plural,
        namespaced,
        short_names,
        status_subresource,
        generation,
        custom: false,
        returns_deleted_object,
        extra_fields,
    }
}

/// A custom resource (CRD-registered): generation maintained, SMP rejected.
const fn crd(
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    status_subresource: bool,
) -> ResourceInfo {
    ResourceInfo {
        group,
        version,
        kind,
        plural,
        namespaced,
        short_names,
        status_subresource,
        generation: true,
        custom: true,
        returns_deleted_object: true,
        extra_fields: NONE,
    }
}

/// The kinds served by default.
#[rustfmt::skip]
pub fn builtin_resources() -> Vec<ResourceInfo> {
    const NS: bool = true;
    const CLUSTER: bool = false;
    vec![
        //  group, version, kind, plural, namespaced, short names, status, generation, returns object, fields
        r("", "v1", "PersistentVolume", "persistentvolumes", CLUSTER, &["pv"], true, false, true, NONE),
        r("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", NS, &["pvc"], true, false, true, NONE),
        r("", "v1", "Pod", "pods", NS, &["po"], true, true, true, POD_FIELDS),
        r("", "v1", "Node", "nodes", CLUSTER, &["no"], true, false, true, &["spec.unschedulable"]),
        r("", "v1", "Namespace", "namespaces", CLUSTER, &["ns"], true, false, true, &["status.phase"]),
        r("", "v1", "Secret", "secrets", NS, NONE, false, false, false, &["type"]),
        r("", "v1", "ConfigMap", "configmaps", NS, &["cm"], false, false, false, NONE),
        r("", "v1", "Event", "events", NS, &["ev"], false, false, false, EVENT_FIELDS),
        r("storage.k8s.io", "v1", "StorageClass", "storageclasses", CLUSTER, &["sc"], false, false, true, NONE),
        r("storage.k8s.io", "v1", "CSINode", "csinodes", CLUSTER, NONE, false, false, true, NONE),
        r("storage.k8s.io", "v1", "CSIDriver", "csidrivers", CLUSTER, NONE, false, false, true, NONE),
        r("storage.k8s.io", "v1", "CSIStorageCapacity", "csistoragecapacities", NS, NONE, false, false, true, NONE),
        r("storage.k8s.io", "v1", "VolumeAttachment", "volumeattachments", CLUSTER, NONE, true, false, true, NONE),
        r("storage.k8s.io", "v1", "VolumeAttributesClass", "volumeattributesclasses", CLUSTER, &["vac"], false, false, true, NONE),
        r("apps", "v1", "StatefulSet", "statefulsets", NS, &["sts"], true, true, true, NONE),
        r("batch", "v1", "Job", "jobs", NS, NONE, true, true, true, NONE),
        r("coordination.k8s.io", "v1", "Lease", "leases", NS, NONE, false, false, false, NONE),
        r("events.k8s.io", "v1", "Event", "events", NS, &["ev"], false, false, false, NONE),
        crd("snapshot.storage.k8s.io", "v1", "VolumeSnapshot", "volumesnapshots", NS, &["vs"], true),
        crd("snapshot.storage.k8s.io", "v1", "VolumeSnapshotContent", "volumesnapshotcontents", CLUSTER, &["vsc", "vscs"], true),
        crd("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass", "volumesnapshotclasses", CLUSTER, &["vsclass", "vsclasses"], false),
        crd("gateway.networking.k8s.io", "v1beta1", "ReferenceGrant", "referencegrants", NS, &["refgrant"], false),
    ]
}

/// Lookup structure over the served resources.
#[derive(Debug, Clone)]
pub struct Registry {
    resources: Vec<ResourceInfo>,
}

impl Registry {
    /// Builds a registry from a list of resources.
    pub fn new(resources: Vec<ResourceInfo>) -> Self {
        Self { resources }
    }

    /// All resources, in table order.
    pub fn all(&self) -> &[ResourceInfo] {
        &self.resources
    }

    /// Resource by index.
    pub fn get(&self, idx: usize) -> Option<&ResourceInfo> {
        self.resources.get(idx)
    }

    /// Index of the resource served at `group/version/plural`.
    pub fn by_plural(&self, group: &str, version: &str, plural: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// Index of the resource for an `apiVersion` + `kind` pair.
    pub fn by_kind(&self, api_version: &str, kind: &str) -> Option<usize> {
        let (group, version) = split_api_version(api_version);
        self.resources
            .iter()
            .position(|r| r.group == group && r.version == version && r.kind == kind)
    }

    /// Index of the resource for a `kind` in a group, ignoring the version.
    pub fn by_group_kind(&self, group: &str, kind: &str) -> Option<usize> {
        self.resources
            .iter()
            .position(|r| r.group == group && r.kind == kind)
    }

    /// Distinct groups (excluding core) with their versions, in table order.
    pub fn groups(&self) -> Vec<(&'static str, Vec<&'static str>)> {
        let mut out: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for r in self.resources.iter().filter(|r| !r.group.is_empty()) {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, versions)) => {
                    if !versions.contains(&r.version) {
                        versions.push(r.version);
                    }
                }
                None => out.push((r.group, vec![r.version])),
            }
        }
        out
    }

    /// Whether any resource is served under `group/version`.
    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.resources
            .iter()
            .any(|r| r.group == group && r.version == version)
    }
}

/// Splits `group/version` (or `version` for core) into `(group, version)`.
pub fn split_api_version(api_version: &str) -> (&str, &str) {
    match api_version.rsplit_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    }
}
