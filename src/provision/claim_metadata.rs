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
//! | [`ANN_VOLUME_NAME_TEMPLATE`] | a template of `${pvc.namespace}`, `${pvc.name}` and (required) `${pvc.uid}` | the PV and CSI volume name of each claim, instead of `<prefix>-<uid>`; decided once per claim and journalled |
//! | [`ANN_VOLUME_CONTEXT_LABELS`] | label keys, comma separated | those entries of `CreateVolume`'s `volume_context` are put on the PV as labels |
//! | [`ANN_VOLUME_CONTEXT_ANNOTATIONS`] | annotation keys, comma separated | those entries of `CreateVolume`'s `volume_context` are put on the PV as annotations |
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
//! **Volume names** ([`templated_volume_name`]) are read strictly like
//! parameter templates, from the tokens `${pvc.namespace}`, `${pvc.name}`
//! and `${pvc.uid}`; a template without `${pvc.uid}` is refused, and so is
//! a result that is not a DNS subdomain of at most 253 characters. The name
//! is decided by the claim's first plan and is the frozen request's `name`:
//! journalled with it, it is what every retry, a restart and the cleanup of
//! a deleted claim use (`src/provisioner/claims.rs` plans with the
//! operation's name), whatever the class says later.
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
//!
//! **Volume context** entries ([`volume_context_metadata`]) are what the
//! driver said about the volume it made (zone, pool, tier). The lists are
//! checked by the plan, with the copy lists' rules and texts, before
//! `CreateVolume`. When the PV is built, a listed key the response lacks is
//! skipped; a value that is not a valid label value, or annotations that
//! would not fit beside the claim's copies, are left off and the claim gets
//! a `VolumeContextSkipped` warning naming the key: the PV is saved all
//! the same. Neither replaces a key the PV already has, a copy of the
//! claim's included.

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

/// StorageClass annotation: the template of the PV (and CSI volume) name of
/// the class's claims, instead of `<--volume-name-prefix>-<claim uid>`.
pub const ANN_VOLUME_NAME_TEMPLATE: &str = "csi-provisioner-rs.io/volume-name-template";

/// The tokens of volume name templates, as a user writes them.
pub const VOLUME_NAME_TOKENS: &str = "${pvc.namespace}, ${pvc.name}, ${pvc.uid}";

/// The most characters of a PV name (a DNS subdomain).
pub const MAX_VOLUME_NAME_LENGTH: usize = 253;

/// StorageClass annotation: the keys of `CreateVolume`'s `volume_context`
/// to put on the PV as labels.
pub const ANN_VOLUME_CONTEXT_LABELS: &str = "csi-provisioner-rs.io/volume-context-labels";
/// StorageClass annotation: the keys of `CreateVolume`'s `volume_context`
/// to put on the PV as annotations.
pub const ANN_VOLUME_CONTEXT_ANNOTATIONS: &str = "csi-provisioner-rs.io/volume-context-annotations";

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
        "StorageClass annotation {ann} is malformed ({template:?}): {problem}",
        ann = ANN_VOLUME_NAME_TEMPLATE
    )]
    MalformedNameTemplate {
        template: String,
        problem: Malformed,
    },
    #[error(
        "StorageClass annotation {ann} ({template:?}) has an unknown token \"${{{token}}}\" (known: {known})",
        ann = ANN_VOLUME_NAME_TEMPLATE,
        known = VOLUME_NAME_TOKENS
    )]
    UnknownNameToken { template: String, token: String },
    #[error(
        "StorageClass annotation {ann} ({template:?}) must contain \"${{pvc.uid}}\", so that no two claims share a volume name",
        ann = ANN_VOLUME_NAME_TEMPLATE
    )]
    NameTemplateWithoutUid { template: String },
    #[error(
        "the volume name {name:?} made from StorageClass annotation {ann} is not a valid PV name: {reason}",
        ann = ANN_VOLUME_NAME_TEMPLATE
    )]
    InvalidVolumeName { name: String, reason: String },
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

/// The claim a volume name is made for.
#[derive(Clone, Copy, Debug)]
pub struct NamedClaim<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// The PV (and CSI volume) name the class's [`ANN_VOLUME_NAME_TEMPLATE`]
/// makes for the claim; `None` when the class has no template.
///
/// The template must contain `${pvc.uid}`, the claim's whole uid, random
/// and unique: for two claims to get one name, the name or namespace of
/// each would have to hold part of the other's uid, and the uid of the
/// later one did not exist when the earlier was named. So a name's
/// `CreateVolume` answers for this claim's volume only. A shorter part of the uid is not offered: the driver answers a
/// `CreateVolume` of an existing name with that volume, and a PV of the
/// name recording another claim makes the sidecar delete what it was
/// answered (the orphan rule of `src/provisioner/claims.rs`), so a
/// collision would delete the other claim's volume.
pub fn templated_volume_name(
    class_annotations: Option<&BTreeMap<String, String>>,
    claim: NamedClaim<'_>,
) -> Result<Option<String>, ClaimMetadataError> {
    let Some(template) = class_annotations.and_then(|a| a.get(ANN_VOLUME_NAME_TEMPLATE)) else {
        return Ok(None);
    };
    let malformed = |problem| ClaimMetadataError::MalformedNameTemplate {
        template: template.clone(),
        problem,
    };
    let mut name = String::with_capacity(template.len() + claim.uid.len());
    let mut has_uid = false;
    for piece in pieces(template) {
        match piece {
            Piece::Literal(text) => name.push_str(text),
            Piece::Token {
                name: "$",
                braced: false,
            } => name.push('$'),
            Piece::Token {
                name: token,
                braced: true,
            } => name.push_str(match token {
                "pvc.namespace" => claim.namespace,
                "pvc.name" => claim.name,
                "pvc.uid" => {
                    has_uid = true;
                    claim.uid
                }
                _ => {
                    return Err(ClaimMetadataError::UnknownNameToken {
                        template: template.clone(),
                        token: token.to_owned(),
                    });
                }
            }),
            Piece::Token { braced: false, .. } | Piece::LoneDollar => {
                return Err(malformed(Malformed::StrayDollar));
            }
            Piece::EmptyBraces => return Err(malformed(Malformed::EmptyBraces)),
            Piece::Unterminated => return Err(malformed(Malformed::Unterminated)),
        }
    }
    if !has_uid {
        return Err(ClaimMetadataError::NameTemplateWithoutUid {
            template: template.clone(),
        });
    }
    if let Some(reason) = volume_name_problem(&name) {
        return Err(ClaimMetadataError::InvalidVolumeName { name, reason });
    }
    Ok(Some(name))
}

/// Why `name` cannot name a PV (a DNS subdomain), or `None` when it can.
fn volume_name_problem(name: &str) -> Option<String> {
    if name.len() > MAX_VOLUME_NAME_LENGTH {
        return Some(format!(
            "it has {} characters, more than {MAX_VOLUME_NAME_LENGTH}",
            name.len()
        ));
    }
    (!is_dns1123_subdomain(name)).then(|| {
        "it must be a DNS subdomain: lowercase alphanumerics, \"-\" and \".\", each part between dots starting and ending with an alphanumeric".to_owned()
    })
}

/// The claim labels and annotations to put on its PV.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CopiedMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// The label (`what`) or annotation keys the class annotation `annotation`
/// lists for the PV: each a valid key, none of Kubernetes' volume
/// machinery. One rule for the copies of claim metadata and the keys of
/// the volume context.
fn keys_for_the_pv<'a>(
    class_annotations: Option<&'a BTreeMap<String, String>>,
    annotation: &'static str,
    what: &'static str,
) -> Result<Vec<&'a str>, ClaimMetadataError> {
    let keys = listed(class_annotations, annotation);
    for key in &keys {
        if let Some(reason) = qualified_name_problem(key) {
            return Err(ClaimMetadataError::InvalidKey {
                annotation,
                what,
                key: (*key).to_owned(),
                reason,
            });
        }
        if is_volume_machinery_key(key) {
            return Err(ClaimMetadataError::ReservedKey {
                annotation,
                key: (*key).to_owned(),
            });
        }
    }
    Ok(keys)
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
        for key in keys_for_the_pv(class_annotations, annotation, what)? {
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

/// The keys of `CreateVolume`'s `volume_context` that the class puts on the
/// PV ([`ANN_VOLUME_CONTEXT_LABELS`], [`ANN_VOLUME_CONTEXT_ANNOTATIONS`]),
/// sorted, each once; checked by the plan: the volume does not exist yet,
/// so a bad list creates nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeContextKeys {
    pub labels: Vec<String>,
    pub annotations: Vec<String>,
}

/// The class's [`VolumeContextKeys`]; a key that is not a valid label
/// (annotation) key or that belongs to the volume machinery is refused
/// with the copy lists' texts.
pub fn volume_context_keys(
    class_annotations: Option<&BTreeMap<String, String>>,
) -> Result<VolumeContextKeys, ClaimMetadataError> {
    // Sorted and once each: the annotations' room is shared in key order.
    let owned = |keys: Vec<&str>| {
        let keys: std::collections::BTreeSet<&str> = keys.into_iter().collect();
        keys.into_iter().map(str::to_owned).collect()
    };
    Ok(VolumeContextKeys {
        labels: owned(keys_for_the_pv(
            class_annotations,
            ANN_VOLUME_CONTEXT_LABELS,
            "label",
        )?),
        annotations: owned(keys_for_the_pv(
            class_annotations,
            ANN_VOLUME_CONTEXT_ANNOTATIONS,
            "annotation",
        )?),
    })
}

/// Why a listed volume context entry is not put on the PV.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Skipped {
    #[error("its value {value:?} is not a valid label value: {reason}")]
    InvalidLabelValue { value: String, reason: &'static str },
    #[error(
        "the PV's annotations from the claim and the volume context would take more than {limit} bytes",
        limit = MAX_COPIED_ANNOTATION_BYTES
    )]
    NoRoom,
}

/// A listed volume context entry left off the PV (the volume is recorded
/// all the same: metadata never costs a created volume).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedEntry {
    pub key: String,
    /// `"a label"` or `"an annotation"`.
    pub what: &'static str,
    pub why: Skipped,
}

/// The labels and annotations the class takes from the driver's
/// `volume_context`, and the entries left off: a listed key the context
/// lacks is skipped quietly; a label value that is not a valid label value
/// is left off; annotations are taken in key order while, with the claim's
/// copied annotations (`copied_annotation_bytes`), they stay within
/// [`MAX_COPIED_ANNOTATION_BYTES`] (a PV the API server refuses would keep
/// its volume in flight).
pub fn volume_context_metadata(
    keys: &VolumeContextKeys,
    volume_context: &std::collections::HashMap<String, String>,
    copied_annotation_bytes: usize,
) -> (CopiedMetadata, Vec<SkippedEntry>) {
    let mut taken = CopiedMetadata::default();
    let mut skipped = Vec::new();
    for key in &keys.labels {
        let Some(value) = volume_context.get(key) else {
            continue;
        };
        match label_value_problem(value) {
            None => {
                taken.labels.insert(key.clone(), value.clone());
            }
            Some(reason) => skipped.push(SkippedEntry {
                key: key.clone(),
                what: "a label",
                why: Skipped::InvalidLabelValue {
                    value: value.clone(),
                    reason,
                },
            }),
        }
    }
    let mut bytes = copied_annotation_bytes;
    for key in &keys.annotations {
        let Some(value) = volume_context.get(key) else {
            continue;
        };
        let size = key.len() + value.len();
        if bytes + size > MAX_COPIED_ANNOTATION_BYTES {
            skipped.push(SkippedEntry {
                key: key.clone(),
                what: "an annotation",
                why: Skipped::NoRoom,
            });
            continue;
        }
        bytes += size;
        taken.annotations.insert(key.clone(), value.clone());
    }
    (taken, skipped)
}

/// Why `value` is not a Kubernetes label value, or `None` when it is one.
pub fn label_value_problem(value: &str) -> Option<&'static str> {
    if value.len() > 63 {
        return Some("it must be at most 63 characters");
    }
    let bytes = value.as_bytes();
    let valid = bytes.is_empty()
        || (bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric());
    (!valid).then_some(
        "it must be empty or consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
    )
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
