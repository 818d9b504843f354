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
