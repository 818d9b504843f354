use super::*;
use crate::provision::fixtures::{claim, map};

const PV: &str = "pvc-0a1b";

fn context(annotations: Option<&crate::projection::Map>) -> TemplateContext<'_> {
    TemplateContext {
        pv_name: PV,
        pvc_name: "data",
        pvc_namespace: "team-a",
        pvc_annotations: annotations,
        pvc_labels: Some(&LABELS),
    }
}

static LABELS: std::sync::LazyLock<crate::projection::Map> = std::sync::LazyLock::new(|| {
    crate::projection::Map::from(map(&[
        ("team", "storage"),
        ("example.com/tier", "gold"),
        ("cost-center", "from-label"),
    ]))
});

#[test]
fn template_resolution() {
    let annotations = map(&[
        ("cost-center", "cc-42"),
        ("example.com/owner", "alice"),
        ("empty", ""),
    ]);
    let annotations = crate::projection::Map::from(annotations);
    let ctx = context(Some(&annotations));
    let malformed = |template: &str, problem| {
        Err(ClaimMetadataError::MalformedTemplate {
            key: "p".into(),
            template: template.into(),
            problem,
        })
    };
    let unknown = |token: &str| {
        Err(ClaimMetadataError::UnknownToken {
            key: "p".into(),
            token: token.into(),
        })
    };
    let cases: &[(&str, Result<String, ClaimMetadataError>)] = &[
        ("plain", Ok("plain".into())),
        ("", Ok("".into())),
        ("${pvc.name}", Ok("data".into())),
        ("${pvc.namespace}/${pvc.name}", Ok("team-a/data".into())),
        ("${pv.name}", Ok(PV.into())),
        (
            "cost-center=${pvc.annotations['cost-center']}",
            Ok("cost-center=cc-42".into()),
        ),
        (
            "${pvc.annotations['example.com/owner']}",
            Ok("alice".into()),
        ),
        ("x${pvc.annotations['empty']}y", Ok("xy".into())),
        ("${pvc.name}${pvc.name}", Ok("datadata".into())),
        // `$$` is a literal `$`, also before a brace.
        ("price$$", Ok("price$".into())),
        ("$${pvc.name}", Ok("${pvc.name}".into())),
        ("{pvc.name}", Ok("{pvc.name}".into())),
        // Unknown tokens, including the drivers' own template spellings.
        ("${pvc.metadata.name}", unknown("pvc.metadata.name")),
        ("a-${pvc.labels['team']}", Ok("a-storage".into())),
        ("${pvc.labels['example.com/tier']}", Ok("gold".into())),
        // Labels and annotations are separate maps.
        (
            "${pvc.labels['cost-center']}/${pvc.annotations['cost-center']}",
            Ok("from-label/cc-42".into()),
        ),
        ("${pvc.labels['']}", unknown("pvc.labels['']")),
        ("${pvc.labels[\"team\"]}", unknown("pvc.labels[\"team\"]")),
        (
            "${pvc.metadata.labels['team']}",
            unknown("pvc.metadata.labels['team']"),
        ),
        ("${PVC.NAME}", unknown("PVC.NAME")),
        (
            "${pvc.annotations[\"cost-center\"]}",
            unknown("pvc.annotations[\"cost-center\"]"),
        ),
        ("${pvc.annotations['']}", unknown("pvc.annotations['']")),
        ("${1}", unknown("1")),
        ("${$}", unknown("$")),
        // Malformed.
        (
            "${pvc.name",
            malformed("${pvc.name", Malformed::Unterminated),
        ),
        ("a/${", malformed("a/${", Malformed::Unterminated)),
        ("${}", malformed("${}", Malformed::EmptyBraces)),
        ("$pvc.name", malformed("$pvc.name", Malformed::StrayDollar)),
        ("cost$", malformed("cost$", Malformed::StrayDollar)),
        ("a$.b", malformed("a$.b", Malformed::StrayDollar)),
        ("$1", malformed("$1", Malformed::StrayDollar)),
        // The first problem is reported.
        ("${bogus}/${pvc.name", unknown("bogus")),
    ];
    for (template, want) in cases {
        assert_eq!(&resolve_template("p", template, &ctx), want, "{template:?}");
    }
}

#[test]
fn missing_annotations_name_the_key() {
    let annotations = crate::projection::Map::from(map(&[("other", "x")]));
    for annotations in [None, Some(&annotations)] {
        assert_eq!(
            resolve_template(
                "tags",
                "cc=${pvc.annotations['cost-center']}",
                &context(annotations)
            ),
            Err(ClaimMetadataError::MissingAnnotation {
                key: "tags".into(),
                annotation: "cost-center".into(),
            })
        );
    }
}

/// A label the claim lacks fails the plan naming the parameter and the
/// label, whether the claim has other labels, none, or has the key as an
/// annotation only.
#[test]
fn missing_labels_name_the_key() {
    let other = crate::projection::Map::from(map(&[("other", "x")]));
    let as_annotation = crate::projection::Map::from(map(&[("tier", "gold")]));
    for labels in [None, Some(&other)] {
        let ctx = TemplateContext {
            pvc_labels: labels,
            ..context(Some(&as_annotation))
        };
        assert_eq!(
            resolve_template("pool", "pool-${pvc.labels['tier']}", &ctx),
            Err(ClaimMetadataError::MissingLabel {
                key: "pool".into(),
                label: "tier".into(),
            })
        );
    }
}

#[test]
fn error_messages() {
    let cases = [
        (
            ClaimMetadataError::MalformedTemplate {
                key: "subDir".into(),
                template: "${pvc.namespace".into(),
                problem: Malformed::Unterminated,
            },
            r#"failed to resolve StorageClass parameter "subDir": malformed template "${pvc.namespace": "${" without a closing "}""#,
        ),
        (
            ClaimMetadataError::MalformedTemplate {
                key: "subDir".into(),
                template: "${}".into(),
                problem: Malformed::EmptyBraces,
            },
            r#"failed to resolve StorageClass parameter "subDir": malformed template "${}": empty "${}""#,
        ),
        (
            ClaimMetadataError::MalformedTemplate {
                key: "subDir".into(),
                template: "a$b".into(),
                problem: Malformed::StrayDollar,
            },
            r#"failed to resolve StorageClass parameter "subDir": malformed template "a$b": "$" must start a token such as "${pvc.name}" (write "$$" for a literal "$")"#,
        ),
        (
            ClaimMetadataError::UnknownToken {
                key: "subDir".into(),
                token: "pvc.metadata.name".into(),
            },
            r#"failed to resolve StorageClass parameter "subDir": unknown token "${pvc.metadata.name}" (known: ${pv.name}, ${pvc.name}, ${pvc.namespace}, ${pvc.annotations['KEY']}, ${pvc.labels['KEY']})"#,
        ),
        (
            ClaimMetadataError::MissingAnnotation {
                key: "tags".into(),
                annotation: "cost-center".into(),
            },
            r#"failed to resolve StorageClass parameter "tags": the claim has no annotation "cost-center" (for "${pvc.annotations['cost-center']}")"#,
        ),
        (
            ClaimMetadataError::MissingLabel {
                key: "pool".into(),
                label: "tier".into(),
            },
            r#"failed to resolve StorageClass parameter "pool": the claim has no label "tier" (for "${pvc.labels['tier']}")"#,
        ),
        (
            ClaimMetadataError::NotAParameter {
                key: "subdir".into(),
            },
            r#"StorageClass annotation csi-provisioner-rs.io/parameter-templates lists "subdir", which is not a parameter of the class"#,
        ),
        (
            ClaimMetadataError::ReservedParameter {
                key: "csi.storage.k8s.io/fstype".into(),
            },
            r#"StorageClass annotation csi-provisioner-rs.io/parameter-templates lists "csi.storage.k8s.io/fstype", which the provisioner reads itself; it is not templated"#,
        ),
        (
            ClaimMetadataError::InvalidKey {
                annotation: ANN_COPY_CLAIM_LABELS,
                what: "label",
                key: "cost center".into(),
                reason: "the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
            },
            r#"StorageClass annotation csi-provisioner-rs.io/copy-claim-labels lists "cost center", which is not a valid label key: the name must consist of alphanumerics, "-", "_" or ".", and start and end with an alphanumeric"#,
        ),
        (
            ClaimMetadataError::ReservedKey {
                annotation: ANN_COPY_CLAIM_ANNOTATIONS,
                key: "volume.beta.kubernetes.io/storage-class".into(),
            },
            r#"StorageClass annotation csi-provisioner-rs.io/copy-claim-annotations lists "volume.beta.kubernetes.io/storage-class", which belongs to Kubernetes' volume machinery and is never copied"#,
        ),
        (
            ClaimMetadataError::AnnotationsTooLarge { bytes: 300_000 },
            "the claim annotations to copy onto the PV take 300000 bytes, more than the 245760 a PV can hold besides the provisioner's own",
        ),
    ];
    for (error, want) in cases {
        assert_eq!(error.to_string(), want);
    }
}

#[test]
fn only_listed_parameters_are_templates() {
    let params = map(&[
        ("subDir", "${pvc.namespace}/${pvc.name}"),
        // A driver's own template (csi-driver-smb/nfs resolve these from
        // --extra-create-metadata): not listed, so passed on as it is.
        ("driverTemplate", "${pvc.metadata.name}"),
        ("literal", "$not-a-template"),
        (wk::PARAM_FSTYPE, "ext4"),
    ]);
    let class = |list: &str| map(&[(ANN_PARAMETER_TEMPLATES, list)]);
    let ctx = context(None);
    let resolve = |annotations: Option<&BTreeMap<String, String>>| {
        resolve_parameter_templates(annotations, &params, &ctx)
    };

    // No annotation, an empty list: untouched.
    assert_eq!(resolve(None), Ok(params.clone()));
    assert_eq!(resolve(Some(&class(""))), Ok(params.clone()));
    assert_eq!(resolve(Some(&class(" , ,"))), Ok(params.clone()));

    let mut want = params.clone();
    want.insert("subDir".into(), "team-a/data".into());
    assert_eq!(resolve(Some(&class("subDir"))), Ok(want.clone()));
    assert_eq!(resolve(Some(&class(" subDir , subDir,"))), Ok(want));

    let cases = [
        (
            "subDir,driverTemplate",
            ClaimMetadataError::UnknownToken {
                key: "driverTemplate".into(),
                token: "pvc.metadata.name".into(),
            },
        ),
        (
            "literal",
            ClaimMetadataError::MalformedTemplate {
                key: "literal".into(),
                template: "$not-a-template".into(),
                problem: Malformed::StrayDollar,
            },
        ),
        (
            "subdir",
            ClaimMetadataError::NotAParameter {
                key: "subdir".into(),
            },
        ),
        (
            wk::PARAM_FSTYPE,
            ClaimMetadataError::ReservedParameter {
                key: wk::PARAM_FSTYPE.into(),
            },
        ),
        (
            "csi.storage.k8s.io/whatever",
            ClaimMetadataError::ReservedParameter {
                key: "csi.storage.k8s.io/whatever".into(),
            },
        ),
        (
            "FsType",
            ClaimMetadataError::ReservedParameter {
                key: "FsType".into(),
            },
        ),
        (
            wk::PARAM_LEGACY_PROVISIONER_SECRET_NAME,
            ClaimMetadataError::ReservedParameter {
                key: wk::PARAM_LEGACY_PROVISIONER_SECRET_NAME.into(),
            },
        ),
    ];
    for (list, want) in cases {
        assert_eq!(resolve(Some(&class(list))), Err(want), "{list:?}");
    }
}

#[test]
fn label_and_annotation_keys() {
    let long_prefix = format!("{}/a", "a".repeat(254));
    let long_name = "a".repeat(64);
    let ok = [
        "team",
        "cost-center",
        "a",
        "A_b.c-D",
        "example.com/cost-center",
        "app.kubernetes.io/name",
        &"a".repeat(63),
    ];
    for key in ok {
        assert_eq!(qualified_name_problem(key), None, "{key:?}");
    }
    let bad = [
        "",
        "cost center",
        "-team",
        "team-",
        "team/",
        "/team",
        "a/b/c",
        "Example.com/team",
        "example_com/team",
        &long_prefix,
        &long_name,
        "tëam",
    ];
    for key in bad {
        assert!(qualified_name_problem(key).is_some(), "{key:?}");
    }
}

#[test]
fn copies_only_listed_keys_the_claim_has() {
    let mut claim = claim();
    claim.metadata.labels = Some(
        map(&[
            ("team", "storage"),
            ("cost-center", "cc-42"),
            ("unlisted", "x"),
        ])
        .into(),
    );
    claim
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .extend(map(&[("example.com/ticket", "T-1"), ("note", "keep")]));
    let class = |pairs: &[(&str, &str)]| map(pairs);

    // Nothing listed, nothing copied.
    assert_eq!(
        copied_claim_metadata(None, &claim),
        Ok(CopiedMetadata::default())
    );
    let listed = class(&[
        (ANN_COPY_CLAIM_LABELS, "team, cost-center, absent"),
        (ANN_COPY_CLAIM_ANNOTATIONS, "example.com/ticket,note,absent"),
    ]);
    assert_eq!(
        copied_claim_metadata(Some(&listed), &claim),
        Ok(CopiedMetadata {
            labels: map(&[("team", "storage"), ("cost-center", "cc-42")]),
            annotations: map(&[("example.com/ticket", "T-1"), ("note", "keep")]),
        })
    );
    // Labels and annotations are separate lists.
    let labels_only = class(&[(ANN_COPY_CLAIM_LABELS, "note,team")]);
    assert_eq!(
        copied_claim_metadata(Some(&labels_only), &claim),
        Ok(CopiedMetadata {
            labels: map(&[("team", "storage")]),
            annotations: BTreeMap::new(),
        })
    );
    // A claim without labels copies none.
    let mut bare = claim.clone();
    bare.metadata.labels = None;
    assert_eq!(
        copied_claim_metadata(Some(&labels_only), &bare),
        Ok(CopiedMetadata::default())
    );
}

#[test]
fn bad_copy_lists() {
    let claim = claim();
    let cases = [
        (
            ANN_COPY_CLAIM_LABELS,
            "team,cost center",
            ClaimMetadataError::InvalidKey {
                annotation: ANN_COPY_CLAIM_LABELS,
                what: "label",
                key: "cost center".into(),
                reason: "the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
            },
        ),
        (
            ANN_COPY_CLAIM_ANNOTATIONS,
            "a/b/c",
            ClaimMetadataError::InvalidKey {
                annotation: ANN_COPY_CLAIM_ANNOTATIONS,
                what: "annotation",
                key: "a/b/c".into(),
                reason: "it has more than one \"/\"",
            },
        ),
        (
            ANN_COPY_CLAIM_ANNOTATIONS,
            "volume.beta.kubernetes.io/storage-class",
            ClaimMetadataError::ReservedKey {
                annotation: ANN_COPY_CLAIM_ANNOTATIONS,
                key: "volume.beta.kubernetes.io/storage-class".into(),
            },
        ),
        (
            ANN_COPY_CLAIM_ANNOTATIONS,
            "pv.kubernetes.io/bound-by-controller",
            ClaimMetadataError::ReservedKey {
                annotation: ANN_COPY_CLAIM_ANNOTATIONS,
                key: "pv.kubernetes.io/bound-by-controller".into(),
            },
        ),
        (
            ANN_COPY_CLAIM_LABELS,
            "external-provisioner.volume.kubernetes.io/x",
            ClaimMetadataError::ReservedKey {
                annotation: ANN_COPY_CLAIM_LABELS,
                key: "external-provisioner.volume.kubernetes.io/x".into(),
            },
        ),
    ];
    for (annotation, list, want) in cases {
        assert_eq!(
            copied_claim_metadata(Some(&map(&[(annotation, list)])), &claim),
            Err(want),
            "{annotation}: {list}"
        );
    }
    // Only whole domains: lookalikes are fine.
    for key in [
        "app.kubernetes.io/name",
        "myvolume.kubernetes.io/x",
        "pv.kubernetes.io.example.com/x",
    ] {
        assert!(!is_volume_machinery_key(key), "{key}");
    }
}

#[test]
fn copied_annotations_must_fit_on_a_pv() {
    let mut claim = claim();
    let big = "x".repeat(MAX_COPIED_ANNOTATION_BYTES);
    claim
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("big", big);
    let class = map(&[(ANN_COPY_CLAIM_ANNOTATIONS, "big")]);
    assert_eq!(
        copied_claim_metadata(Some(&class), &claim),
        Err(ClaimMetadataError::AnnotationsTooLarge {
            bytes: MAX_COPIED_ANNOTATION_BYTES + 3
        })
    );
}

const UID: &str = "0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d";

fn named(namespace: &'static str, name: &'static str) -> NamedClaim<'static> {
    NamedClaim {
        namespace,
        name,
        uid: UID,
    }
}

fn name_template(template: &str) -> BTreeMap<String, String> {
    map(&[(ANN_VOLUME_NAME_TEMPLATE, template)])
}

#[test]
fn volume_name_templates() {
    let claim = named("team-a", "data");
    let malformed = |template: &str, problem| {
        Err(ClaimMetadataError::MalformedNameTemplate {
            template: template.into(),
            problem,
        })
    };
    let unknown = |template: &str, token: &str| {
        Err(ClaimMetadataError::UnknownNameToken {
            template: template.into(),
            token: token.into(),
        })
    };
    let without_uid = |template: &str| {
        Err(ClaimMetadataError::NameTemplateWithoutUid {
            template: template.into(),
        })
    };
    const NOT_A_SUBDOMAIN: &str = "it must be a DNS subdomain: lowercase alphanumerics, \"-\" and \".\", each part between dots starting and ending with an alphanumeric";
    let invalid = |name: &str| {
        Err(ClaimMetadataError::InvalidVolumeName {
            name: name.into(),
            reason: NOT_A_SUBDOMAIN.into(),
        })
    };
    let cases: &[(&str, Result<Option<String>, ClaimMetadataError>)] = &[
        (
            "${pvc.namespace}-${pvc.name}-${pvc.uid}",
            Ok(Some(format!("team-a-data-{UID}"))),
        ),
        ("${pvc.uid}", Ok(Some(UID.into()))),
        ("vol.${pvc.uid}", Ok(Some(format!("vol.{UID}")))),
        (
            "${pvc.name}.${pvc.namespace}.${pvc.uid}",
            Ok(Some(format!("data.team-a.{UID}"))),
        ),
        // Twice is allowed; the uid is there.
        ("${pvc.uid}-${pvc.uid}", Ok(Some(format!("{UID}-{UID}")))),
        // No uid: two claims could share the name.
        (
            "${pvc.namespace}-${pvc.name}",
            without_uid("${pvc.namespace}-${pvc.name}"),
        ),
        ("fixed", without_uid("fixed")),
        ("", without_uid("")),
        // Only the whole uid is a uid part.
        ("${pvc.uid[:8]}", unknown("${pvc.uid[:8]}", "pvc.uid[:8]")),
        (
            "${pvc.shortuid}",
            unknown("${pvc.shortuid}", "pvc.shortuid"),
        ),
        // Other tokens of parameter templates are not offered.
        ("${pv.name}", unknown("${pv.name}", "pv.name")),
        (
            "${pvc.labels['team']}-${pvc.uid}",
            unknown("${pvc.labels['team']}-${pvc.uid}", "pvc.labels['team']"),
        ),
        (
            "${pvc.annotations['a']}-${pvc.uid}",
            unknown("${pvc.annotations['a']}-${pvc.uid}", "pvc.annotations['a']"),
        ),
        ("${PVC.UID}", unknown("${PVC.UID}", "PVC.UID")),
        // Malformed, read strictly as parameter templates.
        ("${pvc.uid", malformed("${pvc.uid", Malformed::Unterminated)),
        (
            "${}${pvc.uid}",
            malformed("${}${pvc.uid}", Malformed::EmptyBraces),
        ),
        ("$pvc.uid", malformed("$pvc.uid", Malformed::StrayDollar)),
        (
            "v$-${pvc.uid}",
            malformed("v$-${pvc.uid}", Malformed::StrayDollar),
        ),
        // A result that is no PV name.
        ("$$${pvc.uid}", invalid(&format!("${UID}"))),
        ("Vol-${pvc.uid}", invalid(&format!("Vol-{UID}"))),
        ("-${pvc.uid}", invalid(&format!("-{UID}"))),
        ("${pvc.uid}.", invalid(&format!("{UID}."))),
        ("a..${pvc.uid}", invalid(&format!("a..{UID}"))),
        ("a_${pvc.uid}", invalid(&format!("a_{UID}"))),
        ("a/${pvc.uid}", invalid(&format!("a/{UID}"))),
    ];
    for (template, want) in cases {
        assert_eq!(
            &templated_volume_name(Some(&name_template(template)), claim),
            want,
            "{template:?}"
        );
    }
    // No template: the default name is the caller's.
    assert_eq!(templated_volume_name(None, claim), Ok(None));
    assert_eq!(
        templated_volume_name(Some(&map(&[(ANN_COPY_CLAIM_LABELS, "a")])), claim),
        Ok(None)
    );
}

/// A name of 253 characters is a PV name; one more is refused, saying how
/// long it is. Claim names may be that long, namespaces 63.
#[test]
fn volume_names_longer_than_a_pv_name_are_refused() {
    let template = name_template("${pvc.name}-${pvc.uid}");
    let fits: &'static str = "a".repeat(253 - 1 - UID.len()).leak();
    assert_eq!(
        templated_volume_name(Some(&template), named("ns", fits)),
        Ok(Some(format!("{fits}-{UID}")))
    );
    let long: &'static str = "a".repeat(253 - UID.len()).leak();
    assert_eq!(
        templated_volume_name(Some(&template), named("ns", long)),
        Err(ClaimMetadataError::InvalidVolumeName {
            name: format!("{long}-{UID}"),
            reason: "it has 254 characters, more than 253".into(),
        })
    );
}

#[test]
fn volume_name_error_messages() {
    let cases = [
        (
            ClaimMetadataError::MalformedNameTemplate {
                template: "${pvc.uid".into(),
                problem: Malformed::Unterminated,
            },
            r#"StorageClass annotation csi-provisioner-rs.io/volume-name-template is malformed ("${pvc.uid"): "${" without a closing "}""#,
        ),
        (
            ClaimMetadataError::UnknownNameToken {
                template: "${pvc.uid[:8]}".into(),
                token: "pvc.uid[:8]".into(),
            },
            r#"StorageClass annotation csi-provisioner-rs.io/volume-name-template ("${pvc.uid[:8]}") has an unknown token "${pvc.uid[:8]}" (known: ${pvc.namespace}, ${pvc.name}, ${pvc.uid})"#,
        ),
        (
            ClaimMetadataError::NameTemplateWithoutUid {
                template: "${pvc.namespace}-${pvc.name}".into(),
            },
            r#"StorageClass annotation csi-provisioner-rs.io/volume-name-template ("${pvc.namespace}-${pvc.name}") must contain "${pvc.uid}", so that no two claims share a volume name"#,
        ),
        (
            ClaimMetadataError::InvalidVolumeName {
                name: "Data-1".into(),
                reason: "it has 254 characters, more than 253".into(),
            },
            r#"the volume name "Data-1" made from StorageClass annotation csi-provisioner-rs.io/volume-name-template is not a valid PV name: it has 254 characters, more than 253"#,
        ),
    ];
    for (error, want) in cases {
        assert_eq!(error.to_string(), want);
    }
}

fn keys(labels: &[&str], annotations: &[&str]) -> VolumeContextKeys {
    let owned = |keys: &[&str]| keys.iter().map(|k| (*k).to_owned()).collect();
    VolumeContextKeys {
        labels: owned(labels),
        annotations: owned(annotations),
    }
}

/// The lists are read with the copy lists' rules and texts; sorted, once
/// each.
#[test]
fn volume_context_lists() {
    let class = |labels: &str, annotations: &str| {
        map(&[
            (ANN_VOLUME_CONTEXT_LABELS, labels),
            (ANN_VOLUME_CONTEXT_ANNOTATIONS, annotations),
        ])
    };
    assert_eq!(volume_context_keys(None), Ok(VolumeContextKeys::default()));
    assert_eq!(
        volume_context_keys(Some(&class(" zone, example.com/pool,zone,, ", "tier"))),
        Ok(keys(&["example.com/pool", "zone"], &["tier"]))
    );
    let cases = [
        (
            class("cost center", ""),
            ClaimMetadataError::InvalidKey {
                annotation: ANN_VOLUME_CONTEXT_LABELS,
                what: "label",
                key: "cost center".into(),
                reason: "the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
            },
        ),
        (
            class("zone", "Example.com/x"),
            ClaimMetadataError::InvalidKey {
                annotation: ANN_VOLUME_CONTEXT_ANNOTATIONS,
                what: "annotation",
                key: "Example.com/x".into(),
                reason: "the prefix before \"/\" must be a DNS subdomain: lowercase alphanumerics, \"-\" and \".\", at most 253 characters",
            },
        ),
        (
            class(
                "topology.kubernetes.io/zone,pv.kubernetes.io/provisioned-by",
                "",
            ),
            ClaimMetadataError::ReservedKey {
                annotation: ANN_VOLUME_CONTEXT_LABELS,
                key: "pv.kubernetes.io/provisioned-by".into(),
            },
        ),
        (
            class("", "x.csi.storage.k8s.io/pvc-name"),
            ClaimMetadataError::ReservedKey {
                annotation: ANN_VOLUME_CONTEXT_ANNOTATIONS,
                key: "x.csi.storage.k8s.io/pvc-name".into(),
            },
        ),
    ];
    for (class, want) in cases {
        assert_eq!(
            volume_context_keys(Some(&class)),
            Err(want.clone()),
            "{class:?}"
        );
    }
    // The same text as the copy list's.
    assert_eq!(
        ClaimMetadataError::ReservedKey {
            annotation: ANN_VOLUME_CONTEXT_LABELS,
            key: "volume.kubernetes.io/selected-node".into(),
        }
        .to_string(),
        "StorageClass annotation csi-provisioner-rs.io/volume-context-labels lists \"volume.kubernetes.io/selected-node\", which belongs to Kubernetes' volume machinery and is never copied"
    );
}

#[test]
fn label_values() {
    let bad_chars = Some(
        "it must be empty or consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
    );
    let cases = [
        ("", None),
        ("a", None),
        ("us-east-1a", None),
        ("Gold_2.x", None),
        ("x".repeat(63).leak() as &str, None),
        (
            "x".repeat(64).leak() as &str,
            Some("it must be at most 63 characters"),
        ),
        ("-a", bad_chars),
        ("a.", bad_chars),
        ("a b", bad_chars),
        ("a/b", bad_chars),
        ("é", bad_chars),
    ];
    for (value, want) in cases {
        assert_eq!(label_value_problem(value), want, "{value:?}");
    }
}

#[test]
fn volume_context_entries_for_the_pv() {
    let context: std::collections::HashMap<String, String> = [
        ("zone", "us-east-1a"),
        ("tier", "Gold Tier"),
        ("pool", "p1"),
        ("example.com/detail", "a long story"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let (taken, skipped) = volume_context_metadata(
        &keys(
            &["absent", "tier", "zone"],
            &["absent", "example.com/detail", "pool"],
        ),
        &context,
        0,
    );
    assert_eq!(
        taken,
        CopiedMetadata {
            labels: map(&[("zone", "us-east-1a")]),
            annotations: map(&[("example.com/detail", "a long story"), ("pool", "p1")]),
        },
        "a key the context lacks is skipped quietly"
    );
    assert_eq!(
        skipped,
        [SkippedEntry {
            key: "tier".into(),
            what: "a label",
            why: Skipped::InvalidLabelValue {
                value: "Gold Tier".into(),
                reason: "it must be empty or consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric",
            },
        }]
    );
    assert_eq!(
        volume_context_metadata(&VolumeContextKeys::default(), &context, 0),
        (CopiedMetadata::default(), vec![]),
        "nothing listed, nothing taken"
    );
}

/// Annotations from the context fit beside the claim's copies within
/// [`MAX_COPIED_ANNOTATION_BYTES`], taken in key order; what does not fit
/// is left off, labels are not affected.
#[test]
fn volume_context_annotations_share_the_room() {
    let big = "v".repeat(1000);
    let context: std::collections::HashMap<String, String> = [
        ("a", big.as_str()),
        ("b", big.as_str()),
        ("c", "small"),
        ("zone", "z1"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let listed = keys(&["zone"], &["a", "b", "c"]);
    // Room for "a" (1001 bytes) and "c" (6) but not "b".
    let copied = MAX_COPIED_ANNOTATION_BYTES - 1001 - 6 - 500;
    let (taken, skipped) = volume_context_metadata(&listed, &context, copied);
    assert_eq!(
        taken.annotations.keys().collect::<Vec<_>>(),
        ["a", "c"],
        "{skipped:?}"
    );
    assert_eq!(taken.labels, map(&[("zone", "z1")]));
    assert_eq!(
        skipped,
        [SkippedEntry {
            key: "b".into(),
            what: "an annotation",
            why: Skipped::NoRoom,
        }]
    );
    // Exactly full is allowed.
    let (taken, skipped) = volume_context_metadata(
        &keys(&[], &["a"]),
        &context,
        MAX_COPIED_ANNOTATION_BYTES - 1001,
    );
    assert_eq!(taken.annotations.len(), 1);
    assert!(skipped.is_empty());
    assert_eq!(
        Skipped::NoRoom.to_string(),
        "the PV's annotations from the claim and the volume context would take more than 245760 bytes"
    );
}
