//! Claim metadata for the volume, gate `ClaimMetadataPropagation` (alpha, off
//! by default; upstream external-provisioner #86, #760, #107). With the gate
//! off none of this runs and a class is read exactly as the Go image reads
//! it; with the gate on, only a class whose author opted in, key by key,
//! behaves differently:
//!
//! | StorageClass annotation | value | effect |
//! |---|---|---|
//! | [`ANN_PARAMETER_TEMPLATES`] | parameter keys, comma separated | those parameters' values are templates, resolved per claim before `CreateVolume` |
//! | [`ANN_COPY_CLAIM_LABELS`] | label keys, comma separated | those labels of the claim are put on its PV |
//! | [`ANN_COPY_CLAIM_ANNOTATIONS`] | annotation keys, comma separated | those annotations of the claim are put on its PV |
//! | [`ANN_CLAIM_STORAGE_LIMIT`] | `true` or `false` | `true`: the claim's `resources.limits.storage` is sent as `CreateVolume`'s `limit_bytes` (upstream #616), and a limit below the request is refused; otherwise limits are ignored, as by the Go image |
//!
//! **Templates** use the tokens of secret templates ([`super::template`]):
//! `${pv.name}`, `${pvc.name}`, `${pvc.namespace}`,
//! `${pvc.annotations['KEY']}`, and `${pvc.labels['KEY']}` (parameter
//! templates only: secret templates keep upstream's tokens), read
//! strictly: `$$` is a literal `$`, and any other `$`, `${}` or an
//! unclosed `${` is a malformed template. An unknown token, a malformed
//! template or an annotation or label the claim does not have fails the
//! plan (a `ProvisioningFailed` event naming the parameter,
//! retried with backoff and at once when the claim changes); nothing is
//! sent to the driver. Keys the provisioner reads itself (every
//! `csi.storage.k8s.io/` key, `fstype`, the legacy secret keys) keep their
//! meaning and cannot be listed. The resolved values are part of the
//! request, which is frozen per claim and journalled: a retry, a restart
//! and a cleanup send the values of the first attempt.
//!
//! **Copies** take the values the claim has when its PV is built. A listed
//! key the claim does not have is skipped. A listed key that is not a valid
//! label (annotation) key, or that belongs to Kubernetes' volume machinery
//! (`pv.kubernetes.io`, `volume.kubernetes.io`, `volume.beta.kubernetes.io`,
//! `volume.alpha.kubernetes.io`, `storage.kubernetes.io`,
//! `csi.storage.k8s.io` and their subdomains: a claim's
//! `volume.beta.kubernetes.io/storage-class` on a PV would change its
//! class) fails the plan. The PV's own keys (`pv.kubernetes.io/provisioned-by`,
//! the deletion-secret annotations, ...) are never overwritten.

use std::collections::BTreeMap;

use crate::projection::PersistentVolumeClaim;

use super::secrets::is_dns1123_subdomain;
use super::template::{
    PARAMETER_TOKENS, Piece, TemplateContext, Token, parse_parameter_token, pieces,
};
use crate::wellknown as wk;

/// StorageClass annotation: the parameters whose values are templates.
pub const ANN_PARAMETER_TEMPLATES: &str = "csi-provisioner-rs.io/parameter-templates";
/// StorageClass annotation: the claim labels to copy onto the PV.
pub const ANN_COPY_CLAIM_LABELS: &str = "csi-provisioner-rs.io/copy-claim-labels";
/// StorageClass annotation: the claim annotations to copy onto the PV.
pub const ANN_COPY_CLAIM_ANNOTATIONS: &str = "csi-provisioner-rs.io/copy-claim-annotations";

/// StorageClass annotation: `"true"` sends the claim's storage limit as
/// `limit_bytes` (the Go image sends only `required_bytes`).
pub const ANN_CLAIM_STORAGE_LIMIT: &str = "csi-provisioner-rs.io/claim-storage-limit";

/// Whether the class opted in to sending the claim's storage limit
/// ([`ANN_CLAIM_STORAGE_LIMIT`]); a value other than `true` or `false` is
/// refused, naming the annotation.
pub fn sends_claim_limit(
    class_annotations: Option<&BTreeMap<String, String>>,
) -> Result<bool, ClaimMetadataError> {
    match class_annotations.and_then(|a| a.get(ANN_CLAIM_STORAGE_LIMIT)) {
        None => Ok(false),
        Some(value) => match value.trim() {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(ClaimMetadataError::NotABool {
                annotation: ANN_CLAIM_STORAGE_LIMIT,
                value: value.clone(),
            }),
        },
    }
}

/// The most bytes (keys and values) of copied annotations: the API server
/// refuses an object whose annotations exceed 256 KiB, and a PV that can
/// never be saved would keep its volume in flight for ever; the rest is
/// left for the provisioner's own annotations.
pub const MAX_COPIED_ANNOTATION_BYTES: usize = 240 * 1024;

/// Domains (and their subdomains) of keys that Kubernetes' volume
/// machinery reads on PVs and claims: never copied.
const VOLUME_MACHINERY_DOMAINS: &[&str] = &[
    "pv.kubernetes.io",
    "volume.kubernetes.io",
    "volume.beta.kubernetes.io",
    "volume.alpha.kubernetes.io",
    "storage.kubernetes.io",
    "csi.storage.k8s.io",
];

/// Unprefixed parameters the provisioner reads itself (besides every
/// `csi.storage.k8s.io/` key): not templated.
const LEGACY_PARAMETERS: &[&str] = &[
    wk::PARAM_LEGACY_PROVISIONER_SECRET_NAME,
    wk::PARAM_LEGACY_PROVISIONER_SECRET_NAMESPACE,
    wk::PARAM_LEGACY_CONTROLLER_PUBLISH_SECRET_NAME,
    wk::PARAM_LEGACY_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
    wk::PARAM_LEGACY_NODE_STAGE_SECRET_NAME,
    wk::PARAM_LEGACY_NODE_STAGE_SECRET_NAMESPACE,
    wk::PARAM_LEGACY_NODE_PUBLISH_SECRET_NAME,
    wk::PARAM_LEGACY_NODE_PUBLISH_SECRET_NAMESPACE,
];

/// What is wrong with a template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("\"${{\" without a closing \"}}\"")]
    Unterminated,
    #[error("empty \"${{}}\"")]
    EmptyBraces,
    #[error(
        "\"$\" must start a token such as \"${{pvc.name}}\" (write \"$$\" for a literal \"$\")"
    )]
    StrayDollar,
}

/// A class or claim that cannot be planned with the gate on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimMetadataError {
    #[error("StorageClass annotation {annotation} is {value:?}; it must be \"true\" or \"false\"")]
    NotABool {
        annotation: &'static str,
        value: String,
    },
    #[error(
        "failed to resolve StorageClass parameter {key:?}: malformed template {template:?}: {problem}"
    )]
    MalformedTemplate {
        key: String,
        template: String,
        problem: Malformed,
    },
    #[error(
        "failed to resolve StorageClass parameter {key:?}: unknown token \"${{{token}}}\" (known: {known})",
        known = PARAMETER_TOKENS
    )]
    UnknownToken { key: String, token: String },
    #[error(
        "failed to resolve StorageClass parameter {key:?}: the claim has no annotation {annotation:?} (for \"${{pvc.annotations['{annotation}']}}\")"
    )]
    MissingAnnotation { key: String, annotation: String },
    #[error(
        "failed to resolve StorageClass parameter {key:?}: the claim has no label {label:?} (for \"${{pvc.labels['{label}']}}\")"
    )]
    MissingLabel { key: String, label: String },
    #[error(
        "StorageClass annotation {ann} lists {key:?}, which is not a parameter of the class",
        ann = ANN_PARAMETER_TEMPLATES
    )]
    NotAParameter { key: String },
    #[error(
        "StorageClass annotation {ann} lists {key:?}, which the provisioner reads itself; it is not templated",
        ann = ANN_PARAMETER_TEMPLATES
    )]
    ReservedParameter { key: String },
    #[error(
        "StorageClass annotation {annotation} lists {key:?}, which is not a valid {what} key: {reason}"
    )]
    InvalidKey {
        annotation: &'static str,
        what: &'static str,
        key: String,
        reason: &'static str,
    },
    #[error(
        "StorageClass annotation {annotation} lists {key:?}, which belongs to Kubernetes' volume machinery and is never copied"
    )]
    ReservedKey {
        annotation: &'static str,
        key: String,
    },
    #[error(
        "the claim annotations to copy onto the PV take {bytes} bytes, more than the {limit} a PV can hold besides the provisioner's own",
        limit = MAX_COPIED_ANNOTATION_BYTES
    )]
    AnnotationsTooLarge { bytes: usize },
}

/// The keys a class annotation lists: comma separated, blanks around items
/// ignored, empty items skipped.
fn listed<'a>(class_annotations: Option<&'a BTreeMap<String, String>>, name: &str) -> Vec<&'a str> {
    class_annotations
        .and_then(|annotations| annotations.get(name))
        .map(|list| {
            list.split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether the provisioner reads the parameter itself.
fn read_by_the_provisioner(key: &str) -> bool {
    key.starts_with(wk::CSI_PARAMETER_PREFIX)
        || key.eq_ignore_ascii_case(wk::PARAM_LEGACY_FSTYPE)
        || LEGACY_PARAMETERS.contains(&key)
}

/// The class parameters with the values of the parameters the class lists
/// in [`ANN_PARAMETER_TEMPLATES`] resolved for the claim; the others as
/// they are.
pub fn resolve_parameter_templates(
    class_annotations: Option<&BTreeMap<String, String>>,
    params: &BTreeMap<String, String>,
    context: &TemplateContext<'_>,
) -> Result<BTreeMap<String, String>, ClaimMetadataError> {
    let mut resolved = params.clone();
    for key in listed(class_annotations, ANN_PARAMETER_TEMPLATES) {
        if read_by_the_provisioner(key) {
            return Err(ClaimMetadataError::ReservedParameter {
                key: key.to_owned(),
            });
        }
        let Some(template) = params.get(key) else {
            return Err(ClaimMetadataError::NotAParameter {
                key: key.to_owned(),
            });
        };
        let value = resolve_template(key, template, context)?;
        resolved.insert(key.to_owned(), value);
    }
    Ok(resolved)
}

/// One parameter's value, read strictly (see the module documentation).
pub fn resolve_template(
    key: &str,
    template: &str,
    context: &TemplateContext<'_>,
) -> Result<String, ClaimMetadataError> {
    let malformed = |problem| ClaimMetadataError::MalformedTemplate {
        key: key.to_owned(),
        template: template.to_owned(),
        problem,
    };
    let mut out = String::with_capacity(template.len());
    for piece in pieces(template) {
        match piece {
            Piece::Literal(text) => out.push_str(text),
            Piece::Token {
                name: "$",
                braced: false,
            } => out.push('$'),
            Piece::Token { name, braced: true } => {
                let token = parse_parameter_token(name).ok_or_else(|| {
                    ClaimMetadataError::UnknownToken {
                        key: key.to_owned(),
                        token: name.to_owned(),
                    }
                })?;
                let value = context.value(token).ok_or_else(|| match token {
                    Token::PvcAnnotation(annotation) => ClaimMetadataError::MissingAnnotation {
                        key: key.to_owned(),
                        annotation: annotation.to_owned(),
                    },
                    Token::PvcLabel(label) => ClaimMetadataError::MissingLabel {
                        key: key.to_owned(),
                        label: label.to_owned(),
                    },
                    // The others always have a value.
                    _ => ClaimMetadataError::UnknownToken {
                        key: key.to_owned(),
                        token: name.to_owned(),
                    },
                })?;
                out.push_str(value);
            }
            Piece::Token { braced: false, .. } | Piece::LoneDollar => {
                return Err(malformed(Malformed::StrayDollar));
            }
            Piece::EmptyBraces => return Err(malformed(Malformed::EmptyBraces)),
            Piece::Unterminated => return Err(malformed(Malformed::Unterminated)),
        }
    }
    Ok(out)
}

/// The claim labels and annotations to put on its PV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopiedMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The claim's labels and annotations that the class lists in
/// [`ANN_COPY_CLAIM_LABELS`] and [`ANN_COPY_CLAIM_ANNOTATIONS`], with the
/// claim's current values; keys the claim lacks are skipped.
pub fn copied_claim_metadata(
    class_annotations: Option<&BTreeMap<String, String>>,
    claim: &PersistentVolumeClaim,
) -> Result<CopiedMetadata, ClaimMetadataError> {
    let copy = |annotation: &'static str,
                what: &'static str,
                from: Option<&crate::projection::Map>|
     -> Result<BTreeMap<String, String>, ClaimMetadataError> {
        let mut out = BTreeMap::new();
        for key in listed(class_annotations, annotation) {
            if let Some(reason) = qualified_name_problem(key) {
                return Err(ClaimMetadataError::InvalidKey {
                    annotation,
                    what,
                    key: key.to_owned(),
                    reason,
                });
            }
            if is_volume_machinery_key(key) {
                return Err(ClaimMetadataError::ReservedKey {
                    annotation,
                    key: key.to_owned(),
                });
            }
            if let Some(value) = from.and_then(|from| from.get(key)) {
                out.insert(key.to_owned(), value.to_string());
            }
        }
        Ok(out)
    };
    let labels = copy(
        ANN_COPY_CLAIM_LABELS,
        "label",
        claim.metadata.labels.as_ref(),
    )?;
    let annotations = copy(
        ANN_COPY_CLAIM_ANNOTATIONS,
        "annotation",
        claim.metadata.annotations.as_ref(),
    )?;
    let bytes = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if bytes > MAX_COPIED_ANNOTATION_BYTES {
        return Err(ClaimMetadataError::AnnotationsTooLarge { bytes });
    }
    Ok(CopiedMetadata {
        labels,
        annotations,
    })
}

/// Whether the key's prefix is one of [`VOLUME_MACHINERY_DOMAINS`] or a
/// subdomain of one.
fn is_volume_machinery_key(key: &str) -> bool {
    let Some((domain, _)) = key.split_once('/') else {
        return false;
    };
    VOLUME_MACHINERY_DOMAINS.iter().any(|reserved| {
        domain == *reserved
            || domain
                .strip_suffix(reserved)
                .is_some_and(|sub| sub.ends_with('.'))
    })
}

/// Why `key` is not a Kubernetes qualified name (what label and annotation
/// keys must be), or `None` when it is one.
pub fn qualified_name_problem(key: &str) -> Option<&'static str> {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if name.contains('/') {
                return Some("it has more than one \"/\"");
            }
            if prefix.is_empty() {
                return Some("the prefix before \"/\" is empty");
            }
            if !is_dns1123_subdomain(prefix) {
                return Some(
                    "the prefix before \"/\" must be a DNS subdomain: lowercase alphanumerics, \"-\" and \".\", at most 253 characters",
                );
            }
            name
        }
        None => key,
    };
    if name.is_empty() {
        return Some("the name is empty");
    }
    if name.len() > 63 {
        return Some("the name (after any prefix and \"/\") must be at most 63 characters");
    }
    let bytes = name.as_bytes();
    let valid = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    if !valid {
        return Some(
            "the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
        );
    }
    None
}

#[cfg(test)]
#[path = "claim_metadata_tests.rs"]
mod tests;
