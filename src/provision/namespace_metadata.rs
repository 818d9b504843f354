//! The claim's namespace's labels and annotations as `CreateVolume`
//! parameters: beyond the Go image, as an upstream pull request
//! proposes (`--extra-create-metadata-namespace-labels` and
//! `--extra-create-metadata-namespace-annotations`). Only the keys listed
//! on the command line are sent, each under its prefix, and only when the
//! namespace has it; nothing is sent (and the namespace is not read) when
//! neither flag lists a key, as the Go image. Independent of
//! `--extra-create-metadata`, as in the pull request.
//!
//! The I/O layer reads the namespace live (`crate::provisioner`), never from
//! a cache: what the driver is told must be the namespace's metadata of now.

use std::collections::BTreeMap;

/// The prefix of a namespace label's parameter: `<prefix><label key>`.
pub const NAMESPACE_LABELS_PREFIX: &str = "csi.storage.k8s.io/namespace/labels/";
/// The prefix of a namespace annotation's parameter.
pub const NAMESPACE_ANNOTATIONS_PREFIX: &str = "csi.storage.k8s.io/namespace/annotations/";

/// The namespace label and annotation keys to send, as listed on the
/// command line (blank entries dropped, each key once, in order).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceMetadataKeys {
    pub labels: Vec<String>,
    pub annotations: Vec<String>,
}

impl NamespaceMetadataKeys {
    pub fn new(labels: &[String], annotations: &[String]) -> Self {
        let clean = |keys: &[String]| {
            let mut out: Vec<String> = Vec::new();
            for key in keys.iter().map(|k| k.trim()).filter(|k| !k.is_empty()) {
                if !out.iter().any(|seen| seen == key) {
                    out.push(key.to_owned());
                }
            }
            out
        };
        NamespaceMetadataKeys {
            labels: clean(labels),
            annotations: clean(annotations),
        }
    }

    /// No key listed: the namespace is not read, nothing is added.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The parameters for a namespace with `labels` and `annotations`: each
/// listed key the namespace has, under its prefix, with its value.
pub fn namespace_parameters(
    keys: &NamespaceMetadataKeys,
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (listed, present, prefix) in [
        (&keys.labels, labels, NAMESPACE_LABELS_PREFIX),
        (&keys.annotations, annotations, NAMESPACE_ANNOTATIONS_PREFIX),
    ] {
        for key in listed {
            if let Some(value) = present.and_then(|map| map.get(key)) {
                out.insert(format!("{prefix}{key}"), value.clone());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::fixtures::map;

    fn strings(keys: &[&str]) -> Vec<String> {
        keys.iter().map(|k| (*k).to_owned()).collect()
    }

    #[test]
    fn keys_drop_blanks_and_repeats() {
        let keys = NamespaceMetadataKeys::new(
            &strings(&["tier", " ", "", "tier", " team "]),
            &strings(&[""]),
        );
        assert_eq!(keys.labels, strings(&["tier", "team"]));
        assert!(keys.annotations.is_empty());
        assert!(!keys.is_empty());
        assert!(NamespaceMetadataKeys::new(&strings(&["", " "]), &[]).is_empty());
        assert!(NamespaceMetadataKeys::default().is_empty());
    }

    /// The pull request's own case: a label and an annotation present, an
    /// annotation listed that the namespace lacks.
    #[test]
    fn listed_keys_present_on_the_namespace_are_sent_under_their_prefix() {
        let keys = NamespaceMetadataKeys::new(
            &strings(&["example.com/tier"]),
            &strings(&["example.com/account-id", "example.com/absent"]),
        );
        let labels = map(&[("example.com/tier", "gold"), ("unlisted", "x")]);
        let annotations = map(&[("example.com/account-id", "acct-123"), ("unlisted", "y")]);
        assert_eq!(
            namespace_parameters(&keys, Some(&labels), Some(&annotations)),
            map(&[
                (
                    "csi.storage.k8s.io/namespace/labels/example.com/tier",
                    "gold"
                ),
                (
                    "csi.storage.k8s.io/namespace/annotations/example.com/account-id",
                    "acct-123"
                ),
            ])
        );
    }

    #[test]
    fn a_key_listed_as_label_is_not_read_from_the_annotations() {
        let keys = NamespaceMetadataKeys::new(&strings(&["team"]), &[]);
        let annotations = map(&[("team", "storage")]);
        assert!(namespace_parameters(&keys, None, Some(&annotations)).is_empty());
        let keys = NamespaceMetadataKeys::new(&[], &strings(&["team"]));
        let labels = map(&[("team", "storage")]);
        assert!(namespace_parameters(&keys, Some(&labels), None).is_empty());
    }

    #[test]
    fn the_same_key_in_both_lists_gives_two_parameters() {
        let keys = NamespaceMetadataKeys::new(&strings(&["team"]), &strings(&["team"]));
        let labels = map(&[("team", "a")]);
        let annotations = map(&[("team", "b")]);
        assert_eq!(
            namespace_parameters(&keys, Some(&labels), Some(&annotations)),
            map(&[
                ("csi.storage.k8s.io/namespace/labels/team", "a"),
                ("csi.storage.k8s.io/namespace/annotations/team", "b"),
            ])
        );
    }

    #[test]
    fn empty_values_are_sent_and_no_keys_send_nothing() {
        let keys = NamespaceMetadataKeys::new(&strings(&["flag"]), &[]);
        let labels = map(&[("flag", "")]);
        assert_eq!(
            namespace_parameters(&keys, Some(&labels), None),
            map(&[("csi.storage.k8s.io/namespace/labels/flag", "")])
        );
        assert!(
            namespace_parameters(&NamespaceMetadataKeys::default(), Some(&labels), None).is_empty()
        );
    }

    /// A class cannot set these keys itself: they are under the reserved
    /// prefix, which refuses keys it does not know (as the Go image).
    #[test]
    fn the_prefixes_are_reserved_for_the_sidecar() {
        for prefix in [NAMESPACE_LABELS_PREFIX, NAMESPACE_ANNOTATIONS_PREFIX] {
            assert!(prefix.starts_with(crate::wellknown::CSI_PARAMETER_PREFIX));
            let class = BTreeMap::from([(format!("{prefix}team"), "x".to_owned())]);
            assert!(super::super::driver_parameters(&class).is_err());
        }
    }
}
