//! Secret references from StorageClass templates.
//!
//! A class names, per operation, a Secret by a name template and a namespace
//! template (`csi.storage.k8s.io/<kind>-secret-name` / `-namespace`), with
//! `csi.storage.k8s.io/secret-name` / `-namespace` as the default for every
//! kind that has none. The templates may use tokens that are resolved against
//! the PV and PVC. As upstream (since external-provisioner 4.0.2/5.0) the token
//! sets are the same for every kind but differ per field: the namespace may
//! only use values the PVC's user does not control, the name may use the PVC
//! name and annotations too.
//!
//! | field | tokens |
//! |---|---|
//! | namespace | `${pv.name}`, `${pvc.namespace}` |
//! | name | `${pv.name}`, `${pvc.namespace}`, `${pvc.name}`, `${pvc.annotations['KEY']}` |
//!
//! Expansion follows Go's `os.Expand` (also `$name` without braces; the
//! parser, shared with parameter templates, is [`super::template`]), and any
//! name it produces that is not a token is an error. No Secret is read here:
//! the I/O layer fetches the Secret a [`SecretRef`] points to.

use std::collections::{BTreeMap, BTreeSet};

pub use super::template::TemplateContext;
use super::template::{Piece, parse_token, pieces};
use crate::wellknown as wk;

/// Which CSI call a Secret is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SecretKind {
    /// `CreateVolume` / `DeleteVolume`.
    Provisioner,
    ControllerPublish,
    NodeStage,
    NodePublish,
    ControllerExpand,
    NodeExpand,
    ControllerModify,
}

impl SecretKind {
    pub const ALL: [SecretKind; 7] = [
        SecretKind::Provisioner,
        SecretKind::ControllerPublish,
        SecretKind::NodeStage,
        SecretKind::NodePublish,
        SecretKind::ControllerExpand,
        SecretKind::NodeExpand,
        SecretKind::ControllerModify,
    ];

    /// Upstream's name of the kind, used in error messages.
    pub fn display_name(self) -> &'static str {
        match self {
            SecretKind::Provisioner => "Provisioner",
            SecretKind::ControllerPublish => "ControllerPublish",
            SecretKind::NodeStage => "NodeStage",
            SecretKind::NodePublish => "NodePublish",
            SecretKind::ControllerExpand => "ControllerExpand",
            SecretKind::NodeExpand => "NodeExpand",
            SecretKind::ControllerModify => "ControllerModify",
        }
    }

    fn keys(self) -> ParamKeys {
        let (name, namespace, legacy) = match self {
            SecretKind::Provisioner => (
                wk::PARAM_PROVISIONER_SECRET_NAME,
                wk::PARAM_PROVISIONER_SECRET_NAMESPACE,
                Some((
                    wk::PARAM_LEGACY_PROVISIONER_SECRET_NAME,
                    wk::PARAM_LEGACY_PROVISIONER_SECRET_NAMESPACE,
                )),
            ),
            SecretKind::ControllerPublish => (
                wk::PARAM_CONTROLLER_PUBLISH_SECRET_NAME,
                wk::PARAM_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
                Some((
                    wk::PARAM_LEGACY_CONTROLLER_PUBLISH_SECRET_NAME,
                    wk::PARAM_LEGACY_CONTROLLER_PUBLISH_SECRET_NAMESPACE,
                )),
            ),
            SecretKind::NodeStage => (
                wk::PARAM_NODE_STAGE_SECRET_NAME,
                wk::PARAM_NODE_STAGE_SECRET_NAMESPACE,
                Some((
                    wk::PARAM_LEGACY_NODE_STAGE_SECRET_NAME,
                    wk::PARAM_LEGACY_NODE_STAGE_SECRET_NAMESPACE,
                )),
            ),
            SecretKind::NodePublish => (
                wk::PARAM_NODE_PUBLISH_SECRET_NAME,
                wk::PARAM_NODE_PUBLISH_SECRET_NAMESPACE,
                Some((
                    wk::PARAM_LEGACY_NODE_PUBLISH_SECRET_NAME,
                    wk::PARAM_LEGACY_NODE_PUBLISH_SECRET_NAMESPACE,
                )),
            ),
            SecretKind::ControllerExpand => (
                wk::PARAM_CONTROLLER_EXPAND_SECRET_NAME,
                wk::PARAM_CONTROLLER_EXPAND_SECRET_NAMESPACE,
                None,
            ),
            SecretKind::NodeExpand => (
                wk::PARAM_NODE_EXPAND_SECRET_NAME,
                wk::PARAM_NODE_EXPAND_SECRET_NAMESPACE,
                None,
            ),
            SecretKind::ControllerModify => (
                wk::PARAM_CONTROLLER_MODIFY_SECRET_NAME,
                wk::PARAM_CONTROLLER_MODIFY_SECRET_NAMESPACE,
                None,
            ),
        };
        ParamKeys {
            kind_name: self.display_name(),
            name,
            namespace,
            legacy,
        }
    }
}

struct ParamKeys {
    kind_name: &'static str,
    name: &'static str,
    namespace: &'static str,
    legacy: Option<(&'static str, &'static str)>,
}

const DEFAULT_KEYS: ParamKeys = ParamKeys {
    kind_name: "Default",
    name: wk::PARAM_DEFAULT_SECRET_NAME,
    namespace: wk::PARAM_DEFAULT_SECRET_NAMESPACE,
    legacy: None,
};

/// A resolved Secret reference (the Secret may or may not exist).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
}

impl From<&SecretRef> for k8s_openapi::api::core::v1::SecretReference {
    fn from(secret: &SecretRef) -> Self {
        k8s_openapi::api::core::v1::SecretReference {
            name: Some(secret.name.clone()),
            namespace: Some(secret.namespace.clone()),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error(
        "failed to get name and namespace template from params: {kind} secrets specified in parameters with both \"csi\" and \"csi.storage.k8s.io/\" keys"
    )]
    DoublySpecified { kind: &'static str },
    #[error(
        "failed to get name and namespace template from params: either name and namespace for {kind} secrets specified, Both must be specified"
    )]
    HalfSpecified { kind: &'static str },
    #[error(
        "failed to get name and namespace template from params: {kind} secrets specified in parameters but value of either namespace or name is empty"
    )]
    EmptyTemplate { kind: &'static str },
    /// Upstream's words, with the StorageClass parameter they come from
    /// and the tokens that field may use.
    #[error(
        "error resolving value {template:?} of StorageClass parameter {key:?}: invalid tokens: {tokens:?}; {}",
        field.valid_tokens()
    )]
    InvalidTokens {
        key: &'static str,
        field: Field,
        template: String,
        tokens: Vec<String>,
    },
    #[error("{template:?} resolved to {resolved:?} which is not a valid namespace name")]
    InvalidResolvedNamespace { template: String, resolved: String },
    #[error("{template:?} is not a valid namespace name")]
    InvalidNamespace { template: String },
    #[error("{template:?} resolved to {resolved:?} which is not a valid secret name")]
    InvalidResolvedName { template: String, resolved: String },
    #[error("{template:?} is not a valid secret name")]
    InvalidName { template: String },
}

/// A template and the StorageClass parameter it is the value of.
type Template = (&'static str, String);

/// Finds the name and namespace templates of one key family.
fn templates(
    keys: &ParamKeys,
    params: &BTreeMap<String, String>,
) -> Result<Option<(Template, Template)>, SecretError> {
    let mut names = Vec::new();
    let mut namespaces = Vec::new();
    let found = |key: &'static str| params.get(key).map(|value| (key, value));
    if let Some((legacy_name, legacy_namespace)) = keys.legacy {
        names.extend(found(legacy_name));
        namespaces.extend(found(legacy_namespace));
    }
    names.extend(found(keys.name));
    namespaces.extend(found(keys.namespace));
    let kind = keys.kind_name;
    match (names.as_slice(), namespaces.as_slice()) {
        ([], []) => Ok(None),
        ([(name_key, name)], [(namespace_key, namespace)]) => {
            if name.is_empty() || namespace.is_empty() {
                Err(SecretError::EmptyTemplate { kind })
            } else {
                Ok(Some((
                    (*name_key, (*name).clone()),
                    (*namespace_key, (*namespace).clone()),
                )))
            }
        }
        _ if names.len() > 1 || namespaces.len() > 1 => Err(SecretError::DoublySpecified { kind }),
        _ => Err(SecretError::HalfSpecified { kind }),
    }
}

/// Resolves the Secret of `kind` from class parameters; `None` when the class
/// names no Secret for it (nor a default one).
pub fn resolve_secret_ref(
    kind: SecretKind,
    params: &BTreeMap<String, String>,
    context: &TemplateContext<'_>,
) -> Result<Option<SecretRef>, SecretError> {
    let found = match templates(&kind.keys(), params)? {
        Some(found) => Some(found),
        None => templates(&DEFAULT_KEYS, params)?,
    };
    let Some(((name_key, name_template), (namespace_key, namespace_template))) = found else {
        return Ok(None);
    };

    // The namespace may only use values outside the PVC user's control, so a
    // user cannot point the sidecar at another tenant's Secret.
    let namespace = expand(
        namespace_key,
        &namespace_template,
        context,
        Field::Namespace,
    )?;
    if !is_dns1123_label(&namespace) {
        return Err(if namespace != namespace_template {
            SecretError::InvalidResolvedNamespace {
                template: namespace_template,
                resolved: namespace,
            }
        } else {
            SecretError::InvalidNamespace {
                template: namespace_template,
            }
        });
    }

    let name = expand(name_key, &name_template, context, Field::Name)?;
    if !is_dns1123_subdomain(&name) {
        return Err(if name != name_template {
            SecretError::InvalidResolvedName {
                template: name_template,
                resolved: name,
            }
        } else {
            SecretError::InvalidName {
                template: name_template,
            }
        });
    }
    Ok(Some(SecretRef { name, namespace }))
}

/// Which field of a Secret reference a template names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Name,
    Namespace,
}

impl Field {
    /// What a template of this field may use, for the error that names a
    /// token it may not.
    fn valid_tokens(self) -> &'static str {
        match self {
            Field::Name => {
                "a secret name template may use ${pv.name}, ${pvc.namespace}, ${pvc.name} and ${pvc.annotations['KEY']} (of an annotation the claim has)"
            }
            Field::Namespace => {
                "a secret namespace template may use only ${pv.name} and ${pvc.namespace}"
            }
        }
    }
}

/// Go's `os.Expand` over the tokens `field` may use; every name it meets
/// that is not one of them (or an annotation the claim lacks) is collected
/// and reported.
fn expand(
    key: &'static str,
    template: &str,
    context: &TemplateContext<'_>,
    field: Field,
) -> Result<String, SecretError> {
    let mut out = String::with_capacity(template.len());
    let mut missing = BTreeSet::new();
    for piece in pieces(template) {
        match piece {
            Piece::Literal(text) => out.push_str(text),
            Piece::Token { name, .. } => {
                let value = parse_token(name)
                    .filter(|token| field == Field::Name || token.outside_claim_users_control())
                    .and_then(|token| context.value(token));
                match value {
                    Some(value) => out.push_str(value),
                    None => {
                        missing.insert(name.to_owned());
                    }
                }
            }
            // `$` not followed by a name stays, bad syntax is eaten.
            Piece::LoneDollar => out.push('$'),
            Piece::EmptyBraces | Piece::Unterminated => {}
        }
    }
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(SecretError::InvalidTokens {
            key,
            field,
            template: template.to_owned(),
            tokens: missing.into_iter().collect(),
        })
    }
}

/// RFC 1123 label: what a namespace name must be.
pub fn is_dns1123_label(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
}

/// RFC 1123 subdomain: what a Secret name must be.
pub fn is_dns1123_subdomain(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= 253
        && value.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn context(annotations: Option<&crate::projection::Map>) -> TemplateContext<'_> {
        TemplateContext {
            pv_name: "pvc-1234",
            pvc_name: "data",
            pvc_namespace: "team-a",
            pvc_annotations: annotations,
            // A claim's labels, known to the context, are still not a
            // token of secret templates (upstream has none).
            pvc_labels: Some(&LABELS),
        }
    }

    static LABELS: std::sync::LazyLock<crate::projection::Map> = std::sync::LazyLock::new(|| {
        crate::projection::Map::from(BTreeMap::from([("team".to_owned(), "a".to_owned())]))
    });

    fn secret(name: &str, namespace: &str) -> SecretRef {
        SecretRef {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        }
    }

    #[test]
    fn resolves_every_kind_from_its_own_keys() {
        for kind in SecretKind::ALL {
            let keys = kind.keys();
            let class = params(&[
                (keys.name, "s-${pvc.name}"),
                (keys.namespace, "${pvc.namespace}"),
            ]);
            assert_eq!(
                resolve_secret_ref(kind, &class, &context(None)),
                Ok(Some(secret("s-data", "team-a"))),
                "{kind:?}"
            );
            // Other kinds do not see this kind's keys.
            for other in SecretKind::ALL.into_iter().filter(|other| *other != kind) {
                assert_eq!(resolve_secret_ref(other, &class, &context(None)), Ok(None));
            }
        }
    }

    #[test]
    fn default_pair_applies_to_kinds_without_their_own() {
        let class = params(&[
            (wk::PARAM_DEFAULT_SECRET_NAME, "default"),
            (wk::PARAM_DEFAULT_SECRET_NAMESPACE, "kube-system"),
            (wk::PARAM_NODE_STAGE_SECRET_NAME, "stage"),
            (wk::PARAM_NODE_STAGE_SECRET_NAMESPACE, "storage"),
        ]);
        for kind in SecretKind::ALL {
            let expected = if kind == SecretKind::NodeStage {
                secret("stage", "storage")
            } else {
                secret("default", "kube-system")
            };
            assert_eq!(
                resolve_secret_ref(kind, &class, &context(None)),
                Ok(Some(expected))
            );
        }
    }

    #[test]
    fn legacy_keys_count_and_clash_with_prefixed_ones() {
        let legacy = params(&[
            ("csiProvisionerSecretName", "old"),
            ("csiProvisionerSecretNamespace", "ns"),
        ]);
        assert_eq!(
            resolve_secret_ref(SecretKind::Provisioner, &legacy, &context(None)),
            Ok(Some(secret("old", "ns")))
        );
        let both = params(&[
            ("csiProvisionerSecretName", "old"),
            ("csiProvisionerSecretNamespace", "ns"),
            (wk::PARAM_PROVISIONER_SECRET_NAME, "new"),
            (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
        ]);
        assert_eq!(
            resolve_secret_ref(SecretKind::Provisioner, &both, &context(None)),
            Err(SecretError::DoublySpecified {
                kind: "Provisioner"
            })
        );
        // Expand secrets have no legacy keys, so these are not theirs.
        let legacy_publish = params(&[
            ("csiNodePublishSecretName", "old"),
            ("csiNodePublishSecretNamespace", "ns"),
        ]);
        assert_eq!(
            resolve_secret_ref(SecretKind::NodeExpand, &legacy_publish, &context(None)),
            Ok(None)
        );
    }

    #[test]
    fn bad_template_pairs() {
        let cases: &[(&[(&str, &str)], SecretError)] = &[
            (
                &[(wk::PARAM_PROVISIONER_SECRET_NAME, "name")],
                SecretError::HalfSpecified {
                    kind: "Provisioner",
                },
            ),
            (
                &[(wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns")],
                SecretError::HalfSpecified {
                    kind: "Provisioner",
                },
            ),
            (
                &[
                    (wk::PARAM_PROVISIONER_SECRET_NAME, ""),
                    (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
                ],
                SecretError::EmptyTemplate {
                    kind: "Provisioner",
                },
            ),
            (
                &[(wk::PARAM_DEFAULT_SECRET_NAME, "name")],
                SecretError::HalfSpecified { kind: "Default" },
            ),
            (
                &[
                    ("csiProvisionerSecretName", "a"),
                    (wk::PARAM_PROVISIONER_SECRET_NAME, "b"),
                    (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
                ],
                SecretError::DoublySpecified {
                    kind: "Provisioner",
                },
            ),
        ];
        for (pairs, expected) in cases {
            assert_eq!(
                resolve_secret_ref(SecretKind::Provisioner, &params(pairs), &context(None))
                    .as_ref(),
                Err(expected),
                "{pairs:?}"
            );
        }
    }

    #[test]
    fn tokens_per_field() {
        let annotations = BTreeMap::from([
            ("example.com/key".to_owned(), "from-annotation".to_owned()),
            ("bad".to_owned(), "Not_A_Name".to_owned()),
        ]);
        let annotations = crate::projection::Map::from(annotations);
        let ctx = context(Some(&annotations));
        let resolve = |name: &str, namespace: &str| {
            resolve_secret_ref(
                SecretKind::Provisioner,
                &params(&[
                    (wk::PARAM_PROVISIONER_SECRET_NAME, name),
                    (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, namespace),
                ]),
                &ctx,
            )
        };
        let ok = |name: &str, namespace: &str| Ok(Some(secret(name, namespace)));
        let invalid_in = |field: Field, template: &str, tokens: &[&str]| {
            Err(SecretError::InvalidTokens {
                key: match field {
                    Field::Name => wk::PARAM_PROVISIONER_SECRET_NAME,
                    Field::Namespace => wk::PARAM_PROVISIONER_SECRET_NAMESPACE,
                },
                field,
                template: template.to_owned(),
                tokens: tokens.iter().map(|t| (*t).to_owned()).collect(),
            })
        };
        let invalid = |template: &str, tokens: &[&str]| invalid_in(Field::Name, template, tokens);
        let invalid_namespace =
            |template: &str, tokens: &[&str]| invalid_in(Field::Namespace, template, tokens);
        assert_eq!(
            resolve("${pv.name}", "${pv.name}"),
            ok("pvc-1234", "pvc-1234")
        );
        assert_eq!(
            resolve("${pvc.namespace}-x", "${pvc.namespace}"),
            ok("team-a-x", "team-a")
        );
        assert_eq!(
            resolve("${pvc.name}.${pvc.annotations['example.com/key']}", "fixed"),
            ok("data.from-annotation", "fixed")
        );
        assert_eq!(
            resolve("literal", "literal-ns"),
            ok("literal", "literal-ns")
        );
        // Labels are a token of parameter templates only.
        assert_eq!(
            resolve("s-${pvc.labels['team']}", "fixed"),
            invalid("s-${pvc.labels['team']}", &["pvc.labels['team']"])
        );
        // The namespace must not depend on what the PVC's user controls.
        assert_eq!(
            resolve("x", "${pvc.name}"),
            invalid_namespace("${pvc.name}", &["pvc.name"])
        );
        assert_eq!(
            resolve("x", "${pvc.annotations['example.com/key']}"),
            invalid_namespace(
                "${pvc.annotations['example.com/key']}",
                &["pvc.annotations['example.com/key']"]
            )
        );
        assert_eq!(
            resolve("${pvc.annotations['missing']}", "ns"),
            invalid(
                "${pvc.annotations['missing']}",
                &["pvc.annotations['missing']"]
            )
        );
        assert_eq!(
            resolve("${unknown}-${pv.name}-$other", "ns"),
            invalid("${unknown}-${pv.name}-$other", &["other", "unknown"])
        );
        assert_eq!(resolve("$1", "ns"), invalid("$1", &["1"]));
        assert_eq!(
            resolve("${}x", "ns"),
            ok("x", "ns"),
            "bad syntax is eaten as by os.Expand"
        );
        assert_eq!(
            resolve("a${", "ns"),
            ok("a", "ns"),
            "an unterminated brace is eaten as by os.Expand"
        );
        assert_eq!(
            resolve("a$", "ns"),
            Err(SecretError::InvalidName {
                template: "a$".to_owned()
            }),
            "a trailing dollar stays and is not a valid name"
        );
        assert_eq!(
            resolve("a$.b", "ns"),
            Err(SecretError::InvalidName {
                template: "a$.b".to_owned()
            })
        );
        assert_eq!(
            resolve("${pvc.annotations['bad']}", "ns"),
            Err(SecretError::InvalidResolvedName {
                template: "${pvc.annotations['bad']}".to_owned(),
                resolved: "Not_A_Name".to_owned()
            })
        );
        assert_eq!(
            resolve("x", "Bad_NS"),
            Err(SecretError::InvalidNamespace {
                template: "Bad_NS".to_owned()
            })
        );
        assert_eq!(
            resolve("x", "${pv.name}.dots"),
            Err(SecretError::InvalidResolvedNamespace {
                template: "${pv.name}.dots".to_owned(),
                resolved: "pvc-1234.dots".to_owned()
            })
        );
        assert_eq!(
            resolve("Upper", "ns"),
            Err(SecretError::InvalidName {
                template: "Upper".into()
            })
        );
    }

    #[test]
    fn a_bad_token_is_told_with_its_parameter_and_the_valid_tokens() {
        let resolve = |pairs: &[(&str, &str)]| {
            resolve_secret_ref(SecretKind::Provisioner, &params(pairs), &context(None))
                .expect_err("a bad token")
                .to_string()
        };
        assert_eq!(
            resolve(&[
                (wk::PARAM_PROVISIONER_SECRET_NAME, "${pvc.foo}"),
                (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
            ]),
            "error resolving value \"${pvc.foo}\" of StorageClass parameter \"csi.storage.k8s.io/provisioner-secret-name\": invalid tokens: [\"pvc.foo\"]; a secret name template may use ${pv.name}, ${pvc.namespace}, ${pvc.name} and ${pvc.annotations['KEY']} (of an annotation the claim has)"
        );
        assert_eq!(
            resolve(&[
                (wk::PARAM_PROVISIONER_SECRET_NAME, "x"),
                (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "${pvc.name}"),
            ]),
            "error resolving value \"${pvc.name}\" of StorageClass parameter \"csi.storage.k8s.io/provisioner-secret-namespace\": invalid tokens: [\"pvc.name\"]; a secret namespace template may use only ${pv.name} and ${pvc.namespace}"
        );
        // The key the class really used: a legacy one, or the default pair.
        assert!(
            resolve(&[
                ("csiProvisionerSecretName", "${x}"),
                ("csiProvisionerSecretNamespace", "ns"),
            ])
            .contains("of StorageClass parameter \"csiProvisionerSecretName\"")
        );
        assert!(
            resolve(&[
                (wk::PARAM_DEFAULT_SECRET_NAME, "x"),
                (wk::PARAM_DEFAULT_SECRET_NAMESPACE, "$y"),
            ])
            .contains("of StorageClass parameter \"csi.storage.k8s.io/secret-namespace\"")
        );
    }

    #[test]
    fn deletion_context_has_no_annotations() {
        let class = params(&[
            (wk::PARAM_PROVISIONER_SECRET_NAME, "${pvc.annotations['k']}"),
            (wk::PARAM_PROVISIONER_SECRET_NAMESPACE, "ns"),
        ]);
        assert!(matches!(
            resolve_secret_ref(SecretKind::Provisioner, &class, &context(None)),
            Err(SecretError::InvalidTokens { .. })
        ));
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("a"));
        assert!(is_dns1123_label("kube-system"));
        assert!(is_dns1123_label(&"a".repeat(63)));
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(is_dns1123_subdomain(&"a".repeat(253)));
        for bad in ["", ".a", "a.", "a..b", "a.-b", "A", "a_b", &"a".repeat(254)] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }
}
