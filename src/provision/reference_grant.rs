//! Cross-namespace data sources (gate `CrossNamespaceVolumeDataSource`):
//! a claim may restore or clone from an object in another namespace only
//! when a `gateway.networking.k8s.io/v1beta1` ReferenceGrant
//! ([`crate::api::reference_grant::ReferenceGrant`]) in the source's
//! namespace allows it, as upstream's `IsGranted` decides.

use crate::api::reference_grant::ReferenceGrant;

/// The source a claim in `claim_namespace` refers to in another namespace.
#[derive(Clone, Copy, Debug)]
pub struct CrossNamespaceSource<'a> {
    pub claim_namespace: &'a str,
    /// `dataSourceRef.apiGroup`; `None` for the core group.
    pub api_group: Option<&'a str>,
    pub kind: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
}

/// Whether one of `grants` allows the reference (upstream's `IsGranted`): a
/// grant in the source's namespace whose `from` names PersistentVolumeClaims
/// of the core group in the claim's namespace, and whose `to` names the
/// source's group and kind, with no name or the source's name.
pub fn is_granted(source: &CrossNamespaceSource<'_>, grants: &[&ReferenceGrant]) -> bool {
    grants.iter().any(|grant| {
        grant.metadata.namespace.as_deref() == Some(source.namespace)
            && grant.spec.from.iter().any(|from| {
                from.group.is_empty()
                    && from.kind == crate::wellknown::PVC_KIND
                    && from.namespace == source.claim_namespace
            })
            && grant.spec.to.iter().any(|to| {
                to.group == source.api_group.unwrap_or("")
                    && to.kind == source.kind
                    && to
                        .name
                        .as_deref()
                        .is_none_or(|name| name.is_empty() || name == source.name)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::reference_grant::{ReferenceGrantFrom, ReferenceGrantSpec, ReferenceGrantTo};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn grant(
        namespace: &str,
        from: (&str, &str, &str),
        to: (&str, &str, Option<&str>),
    ) -> ReferenceGrant {
        ReferenceGrant {
            types: None,
            metadata: ObjectMeta {
                name: Some("g".to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec: ReferenceGrantSpec {
                from: vec![ReferenceGrantFrom {
                    group: from.0.to_owned(),
                    kind: from.1.to_owned(),
                    namespace: from.2.to_owned(),
                }],
                to: vec![ReferenceGrantTo {
                    group: to.0.to_owned(),
                    kind: to.1.to_owned(),
                    name: to.2.map(str::to_owned),
                }],
            },
        }
    }

    const SNAP_GROUP: &str = "snapshot.storage.k8s.io";

    #[test]
    fn grants_as_upstream_decides_them() {
        let snapshot = CrossNamespaceSource {
            claim_namespace: "dev",
            api_group: Some(SNAP_GROUP),
            kind: "VolumeSnapshot",
            name: "golden",
            namespace: "prod",
        };
        let claim_source = CrossNamespaceSource {
            claim_namespace: "dev",
            api_group: None,
            kind: "PersistentVolumeClaim",
            name: "data",
            namespace: "prod",
        };
        let pvc_from = ("", "PersistentVolumeClaim", "dev");
        let cases: Vec<(&str, CrossNamespaceSource<'_>, Vec<ReferenceGrant>, bool)> = vec![
            ("no grant", snapshot, vec![], false),
            (
                "all snapshots of prod for claims of dev",
                snapshot,
                vec![grant(
                    "prod",
                    pvc_from,
                    (SNAP_GROUP, "VolumeSnapshot", None),
                )],
                true,
            ),
            (
                "the snapshot by name",
                snapshot,
                vec![grant(
                    "prod",
                    pvc_from,
                    (SNAP_GROUP, "VolumeSnapshot", Some("golden")),
                )],
                true,
            ),
            (
                "an empty name is every name",
                snapshot,
                vec![grant(
                    "prod",
                    pvc_from,
                    (SNAP_GROUP, "VolumeSnapshot", Some("")),
                )],
                true,
            ),
            (
                "another snapshot by name",
                snapshot,
                vec![grant(
                    "prod",
                    pvc_from,
                    (SNAP_GROUP, "VolumeSnapshot", Some("other")),
                )],
                false,
            ),
            (
                "grant in another namespace than the source's",
                snapshot,
                vec![grant("dev", pvc_from, (SNAP_GROUP, "VolumeSnapshot", None))],
                false,
            ),
            (
                "from another namespace",
                snapshot,
                vec![grant(
                    "prod",
                    ("", "PersistentVolumeClaim", "test"),
                    (SNAP_GROUP, "VolumeSnapshot", None),
                )],
                false,
            ),
            (
                "from another kind",
                snapshot,
                vec![grant(
                    "prod",
                    ("", "Pod", "dev"),
                    (SNAP_GROUP, "VolumeSnapshot", None),
                )],
                false,
            ),
            (
                "from a group other than core",
                snapshot,
                vec![grant(
                    "prod",
                    ("example.com", "PersistentVolumeClaim", "dev"),
                    (SNAP_GROUP, "VolumeSnapshot", None),
                )],
                false,
            ),
            (
                "to another group",
                snapshot,
                vec![grant(
                    "prod",
                    pvc_from,
                    ("example.com", "VolumeSnapshot", None),
                )],
                false,
            ),
            (
                "to another kind",
                snapshot,
                vec![grant(
                    "prod",
                    pvc_from,
                    (SNAP_GROUP, "VolumeSnapshotContent", None),
                )],
                false,
            ),
            (
                "a claim source: core group in the grant",
                claim_source,
                vec![grant(
                    "prod",
                    pvc_from,
                    ("", "PersistentVolumeClaim", Some("data")),
                )],
                true,
            ),
            (
                "a claim source: a grant for a group does not cover the core group",
                claim_source,
                vec![grant(
                    "prod",
                    pvc_from,
                    (SNAP_GROUP, "PersistentVolumeClaim", None),
                )],
                false,
            ),
            (
                "one matching grant among others",
                snapshot,
                vec![
                    grant(
                        "prod",
                        pvc_from,
                        (SNAP_GROUP, "VolumeSnapshot", Some("other")),
                    ),
                    grant(
                        "prod",
                        pvc_from,
                        (SNAP_GROUP, "VolumeSnapshot", Some("golden")),
                    ),
                ],
                true,
            ),
        ];
        for (what, source, grants, want) in cases {
            let refs: Vec<&ReferenceGrant> = grants.iter().collect();
            assert_eq!(is_granted(&source, &refs), want, "{what}");
        }
    }
}
