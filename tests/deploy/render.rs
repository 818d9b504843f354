//! Rendering the kustomizations of `deploy/kubernetes` and validating every
//! object against the k8s-openapi types.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The repository root (the csi-provisioner package).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn kubernetes_dir() -> PathBuf {
    repo().join("deploy/kubernetes")
}

/// The kustomize components, with what each one turns on.
pub struct Component {
    /// Directory under `deploy/kubernetes/components`.
    pub dir: &'static str,
    /// The feature gate it enables, or None for a flag (`--enable-capacity`,
    /// `--extra-create-metadata-namespace-labels` / `-annotations`).
    pub gate: Option<csi_provisioner::features::Feature>,
}

pub const COMPONENTS: &[Component] = &[
    Component {
        dir: "pvc-protection",
        gate: Some(csi_provisioner::features::Feature::PVCProtection),
    },
    Component {
        dir: "statefulset-auto-delete-pvc",
        gate: Some(csi_provisioner::features::Feature::StatefulSetAutoDeletePVC),
    },
    Component {
        dir: "pv-releaser",
        gate: Some(csi_provisioner::features::Feature::PVReleaser),
    },
    Component {
        dir: "capacity",
        gate: None,
    },
    Component {
        dir: "pod-pvc-provisioner",
        gate: Some(csi_provisioner::features::Feature::PodPVCProvisioner),
    },
    Component {
        dir: "cross-namespace-data-source",
        gate: Some(csi_provisioner::features::Feature::CrossNamespaceVolumeDataSource),
    },
    Component {
        dir: "namespace-metadata",
        gate: None,
    },
];

/// One rendered kustomization.
pub struct Rendering {
    /// What was rendered, for messages: `base`, `base+pvc-protection`, ...
    pub name: String,
    /// The components applied on top of the base (all of them for the
    /// all-gates overlay).
    pub components: Vec<&'static str>,
    pub objects: Vec<Value>,
}

/// Why the renderings could not be made with kubectl (then only the raw
/// files are checked).
pub fn kubectl_unavailable() -> Option<String> {
    match Command::new("kubectl")
        .args(["version", "--client"])
        .output()
    {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "`kubectl version --client` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("kubectl is not runnable: {e}")),
    }
}

/// `kubectl kustomize DIR`, parsed.
pub fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_documents(&String::from_utf8(out.stdout).expect("utf-8 output"))
        .unwrap_or_else(|e| panic!("kubectl kustomize {}: {e}", dir.display()))
}

/// Every YAML document of `text` as JSON (empty documents skipped).
pub fn parse_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(doc).map_err(|e| format!("document {i}: {e}"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// A path relative to `from` (a directory) leading to `to`; kustomize
/// refuses absolute paths to bases and components.
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for c in &to[common..] {
        path.push(c);
    }
    path
}

/// Renders the base, the base with each component alone, and the all-gates
/// overlay with `render` ([`kustomize`] or [`mini_kustomize`]).
pub fn all_renderings(render: &dyn Fn(&Path) -> Vec<Value>) -> Vec<Rendering> {
    let k = kubernetes_dir();
    let mut out = vec![Rendering {
        name: "deploy/kubernetes".into(),
        components: Vec::new(),
        objects: render(&k),
    }];
    let scratch = tempfile::Builder::new()
        .prefix("deploy-kustomize")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary directory");
    for c in COMPONENTS {
        let dir = base_with_component_at(
            &scratch.path().join(c.dir),
            &Path::new("components").join(c.dir),
        );
        out.push(Rendering {
            name: format!("base+components/{}", c.dir),
            components: vec![c.dir],
            objects: render(&dir),
        });
    }
    out.push(Rendering {
        name: "overlays/all-gates".into(),
        components: COMPONENTS.iter().map(|c| c.dir).collect(),
        objects: render(&k.join("overlays/all-gates")),
    });
    out
}

/// Writes into `dir` (made if missing) a kustomization of the base with the
/// Component at `component` (relative to `deploy/kubernetes`), as an
/// overlay of users would, and returns `dir`'s canonical path.
pub fn base_with_component_at(dir: &Path, component: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    let dir = dir.canonicalize().expect("canonical tmp");
    let k = kubernetes_dir()
        .canonicalize()
        .expect("canonical deploy/kubernetes");
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{}]\ncomponents: [{}]\n",
            relative(&dir, &k.join("base")).display(),
            relative(&dir, &k.join(component)).display()
        ),
    )
    .expect("write kustomization");
    dir
}

pub fn kind(obj: &Value) -> &str {
    obj["kind"].as_str().unwrap_or("")
}

pub fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

pub fn describe(obj: &Value) -> String {
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{} {ns}/{}", kind(obj), name(obj)),
        None => format!("{} {}", kind(obj), name(obj)),
    }
}

/// The single object of a kind (panics when there is not exactly one).
pub fn the<T: DeserializeOwned>(objects: &[Value], wanted: &str) -> T {
    let found: Vec<_> = objects.iter().filter(|o| kind(o) == wanted).collect();
    assert_eq!(found.len(), 1, "expected exactly one {wanted}");
    serde_json::from_value(found[0].clone()).expect("typed object")
}

pub fn all_of<T: DeserializeOwned>(objects: &[Value], wanted: &str) -> Vec<T> {
    objects
        .iter()
        .filter(|o| kind(o) == wanted)
        .map(|o| serde_json::from_value(o.clone()).expect("typed object"))
        .collect()
}

/// Deserializes `obj` into its k8s-openapi type, serializes it back and
/// reports every difference: a field the type does not know (a misspelling
/// that the API server would drop or refuse), a value of the wrong type, a
/// null. Returns the problems (empty when the object is faithful).
pub fn validate_typed(obj: &Value) -> Vec<String> {
    use k8s_openapi::api::{apps, core, rbac, storage};
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let typed: Result<Value, String> = match (api_version, kind(obj)) {
        ("v1", "Namespace") => round_trip::<core::v1::Namespace>(obj),
        ("v1", "ServiceAccount") => round_trip::<core::v1::ServiceAccount>(obj),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac::v1::ClusterRole>(obj),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<rbac::v1::ClusterRoleBinding>(obj)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac::v1::Role>(obj),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac::v1::RoleBinding>(obj),
        ("storage.k8s.io/v1", "CSIDriver") => round_trip::<storage::v1::CSIDriver>(obj),
        ("storage.k8s.io/v1", "StorageClass") => round_trip::<storage::v1::StorageClass>(obj),
        ("apps/v1", "Deployment") => round_trip::<apps::v1::Deployment>(obj),
        (v, k) => Err(format!(
            "{k} ({v}) is not a kind this test knows; add it to validate_typed"
        )),
    };
    let mut problems = Vec::new();
    match typed {
        Err(e) => problems.push(format!("{}: {e}", describe(obj))),
        Ok(back) => diff(obj, &back, String::new(), &mut problems),
    }
    if name(obj).is_empty() {
        problems.push(format!("{}: no metadata.name", describe(obj)));
    }
    problems
        .into_iter()
        .map(|p| {
            if p.starts_with(kind(obj)) {
                p
            } else {
                format!("{}: {p}", describe(obj))
            }
        })
        .collect()
}

fn round_trip<T: DeserializeOwned + serde::Serialize>(obj: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(obj.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

pub fn diff(orig: &Value, back: &Value, path: String, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let p = format!("{path}.{key}");
                match b.get(key) {
                    None if value.is_null() => out.push(format!("{p} is null (empty YAML value?)")),
                    None => out.push(format!("{p}: unknown field (misspelled?)")),
                    Some(v) => diff(value, v, p, out),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(x, y, format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a == b => {}
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) => out.push(format!("{path}: {a} reads back as {b}")),
    }
}

/// Without kubectl: the raw YAML files of the base (listed in its
/// kustomization) and of each component, parsed and checked against the
/// typed structs where they are whole objects.
pub fn raw_files_check() -> Vec<String> {
    let mut problems = Vec::new();
    let base = kubernetes_dir().join("base");
    let kz = std::fs::read_to_string(base.join("kustomization.yaml")).expect("base kustomization");
    let kz: Value = serde_yaml_ng::from_str(&kz).expect("base kustomization parses");
    for file in kz["resources"].as_array().expect("resources") {
        let file = file.as_str().expect("resource path");
        let text = std::fs::read_to_string(base.join(file))
            .unwrap_or_else(|e| panic!("base/{file} listed but unreadable: {e}"));
        match parse_documents(&text) {
            Err(e) => problems.push(format!("base/{file}: {e}")),
            Ok(docs) => {
                for doc in docs {
                    problems.extend(validate_typed(&doc));
                }
            }
        }
    }
    for c in COMPONENTS {
        let path = kubernetes_dir()
            .join("components")
            .join(c.dir)
            .join("kustomization.yaml");
        let text = std::fs::read_to_string(&path).expect("component kustomization");
        let v: Value = match serde_yaml_ng::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        if v["kind"] != "Component" {
            problems.push(format!("{}: kind is not Component", path.display()));
        }
        for patch in v["patches"].as_array().into_iter().flatten() {
            if let Some(p) = patch["patch"].as_str()
                && let Err(e) = serde_yaml_ng::from_str::<json_patch::Patch>(p)
            {
                problems.push(format!(
                    "{}: a patch is not a JSON patch: {e}",
                    path.display()
                ));
            }
        }
    }
    problems
}

/// Cluster-scoped kinds (no namespace set by the namespace transformer).
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CSIDriver",
    "StorageClass",
];

/// A small kustomize for the features `deploy/kubernetes` uses (resources,
/// components, JSON 6902 patches with a kind/name target, namespace,
/// labels without selectors, images), used when kubectl is missing; the
/// tests compare it with `kubectl kustomize` wherever kubectl exists, so it
/// cannot drift. Anything else in a kustomization is refused.
pub fn mini_kustomize(dir: &Path) -> Result<Vec<Value>, String> {
    let (kz, mut objects) = accumulate(dir)?;
    apply_transformers(&kz, &mut objects, dir)?;
    Ok(objects)
}

/// A kustomization's resources and components, before its own transformers.
fn accumulate(dir: &Path) -> Result<(Value, Vec<Value>), String> {
    let path = dir.join("kustomization.yaml");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let kz: Value =
        serde_yaml_ng::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let fields = kz
        .as_object()
        .ok_or(format!("{}: not a mapping", path.display()))?;
    for key in fields.keys() {
        if ![
            "apiVersion",
            "kind",
            "resources",
            "components",
            "patches",
            "namespace",
            "labels",
            "images",
        ]
        .contains(&key.as_str())
        {
            return Err(format!(
                "{}: the fallback renderer does not support `{key}`",
                path.display()
            ));
        }
    }
    let mut objects = Vec::new();
    for res in kz["resources"].as_array().into_iter().flatten() {
        let res = dir.join(res.as_str().ok_or("resource is not a string")?);
        if res.is_dir() {
            objects.extend(mini_kustomize(&res)?);
        } else {
            let text =
                std::fs::read_to_string(&res).map_err(|e| format!("{}: {e}", res.display()))?;
            objects.extend(parse_documents(&text).map_err(|e| format!("{}: {e}", res.display()))?);
        }
    }
    for comp in kz["components"].as_array().into_iter().flatten() {
        let comp = dir.join(comp.as_str().ok_or("component is not a string")?);
        // A component's resources join the parent's, then its
        // transformations apply to everything accumulated so far.
        let (ckz, own) = accumulate(&comp)?;
        if ckz["kind"] != "Component" {
            return Err(format!("{}: not a Component", comp.display()));
        }
        objects.extend(own);
        apply_transformers(&ckz, &mut objects, &comp)?;
    }
    Ok((kz, objects))
}

fn apply_transformers(kz: &Value, objects: &mut [Value], dir: &Path) -> Result<(), String> {
    for patch in kz["patches"].as_array().into_iter().flatten() {
        let target = &patch["target"];
        let ops: json_patch::Patch = serde_yaml_ng::from_str(patch["patch"].as_str().ok_or(
            format!("{}: only inline patches are supported", dir.display()),
        )?)
        .map_err(|e| {
            format!(
                "{}: only JSON 6902 patches are supported: {e}",
                dir.display()
            )
        })?;
        let mut hit = false;
        for obj in objects.iter_mut() {
            let matches = ["kind", "name"].iter().all(|k| match target[*k].as_str() {
                None => true,
                Some(want) if *k == "kind" => kind(obj) == want,
                Some(want) => name(obj) == want,
            });
            if matches {
                json_patch::patch(obj, &ops)
                    .map_err(|e| format!("{}: patch on {}: {e}", dir.display(), describe(obj)))?;
                hit = true;
            }
        }
        if !hit {
            return Err(format!("{}: a patch matches no object", dir.display()));
        }
    }
    if let Some(ns) = kz["namespace"].as_str() {
        for obj in objects.iter_mut() {
            if !CLUSTER_SCOPED.contains(&kind(obj)) {
                obj["metadata"]["namespace"] = Value::from(ns);
            }
            if kind(obj).ends_with("RoleBinding") {
                for s in obj["subjects"].as_array_mut().into_iter().flatten() {
                    let default = matches!(s["namespace"].as_str(), None | Some("default"));
                    if s["kind"] == "ServiceAccount" && default {
                        s["namespace"] = Value::from(ns);
                    }
                }
            }
        }
    }
    for label in kz["labels"].as_array().into_iter().flatten() {
        if label["includeSelectors"].as_bool() == Some(true)
            || label["includeTemplates"].as_bool() == Some(true)
        {
            return Err(format!(
                "{}: the fallback renderer supports labels on metadata only",
                dir.display()
            ));
        }
        for (k, v) in label["pairs"].as_object().into_iter().flatten() {
            for obj in objects.iter_mut() {
                obj["metadata"]["labels"][k] = v.clone();
            }
        }
    }
    for image in kz["images"].as_array().into_iter().flatten() {
        let from = image["name"].as_str().unwrap_or("");
        let new_name = image["newName"].as_str().unwrap_or(from);
        let new = match image["newTag"].as_str() {
            Some(tag) => format!("{new_name}:{tag}"),
            None => new_name.to_owned(),
        };
        for obj in objects.iter_mut() {
            let Some(spec) = obj.pointer_mut("/spec/template/spec") else {
                continue;
            };
            for list in ["containers", "initContainers"] {
                let Some(list) = spec.get_mut(list).and_then(Value::as_array_mut) else {
                    continue;
                };
                for c in list {
                    if c["image"].as_str() == Some(from) {
                        c["image"] = Value::from(new.clone());
                    }
                }
            }
        }
    }
    Ok(())
}

/// The base with `components` (directory names under
/// `deploy/kubernetes/components`) applied, rendered by [`mini_kustomize`]:
/// e.g. the RBAC rules of the gates a test turns on.
pub fn base_with_components(components: &[&str]) -> Result<Vec<Value>, String> {
    let k = kubernetes_dir();
    let scratch = tempfile::Builder::new()
        .prefix("deploy-components")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let list: Vec<String> = components
        .iter()
        .map(|c| format!("{:?}", k.join("components").join(c).display().to_string()))
        .collect();
    std::fs::write(
        scratch.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{:?}]\ncomponents: [{}]\n",
            k.join("base").display().to_string(),
            list.join(", ")
        ),
    )
    .map_err(|e| format!("write kustomization: {e}"))?;
    mini_kustomize(scratch.path())
}
