//! The deployment artefacts stay true to the code.
//!
//! `deploy/kubernetes` is rendered with `kubectl kustomize` (the base, the
//! base with each component alone, and `overlays/all-gates`), and every
//! rendering is checked:
//! - every object deserializes into its k8s-openapi type and serializes back
//!   to the same JSON (a misspelled or misplaced field shows up as lost);
//! - the RBAC rules bound to the Deployment's ServiceAccount grant every
//!   (loop, group, resource, verb) of `csi_provisioner::startup::api_calls()`
//!   that is active in that rendering (ungated loops: the base; gated loops:
//!   their component), in the right scope, and nothing no active loop needs;
//! - the csi-provisioner container's arguments are flags `csi-provisioner
//!   --help` lists and parse with `Options::parse_from_args`, with the gates
//!   of the components applied; the hostpath driver's arguments parse with
//!   its own command line; both agree on the socket, which is on a shared
//!   volume;
//! - the manifests compose cleanly (with kubectl only; the base, every
//!   overlay, each component alone): no container has an env name twice,
//!   a single-value flag twice, more than one `--feature-gates`, or a gate
//!   twice in it;
//! - the pod is hardened (non-root, read-only root filesystem, no
//!   privilege escalation, no capabilities, seccomp, requests and limits),
//!   its probes hit the `--http-endpoint` port, and the downward-API
//!   variables are there;
//! - StorageClasses and the CSIDriver name the driver, and image tags
//!   follow the crate version.
//!
//! The Dockerfile is checked for what it refers to: COPY sources exist and
//! are not excluded by .dockerignore, every workspace member is copied,
//! packages and binaries exist, the Rust version is new enough, the runtime
//! user is a non-root uid.
//!
//! Without kubectl the test renders with its own small kustomize (and says
//! so); with kubectl it checks that this fallback renders exactly what
//! kubectl does.

#[path = "deploy/dockerfile.rs"]
mod dockerfile;
#[path = "deploy/rbac.rs"]
mod rbac;
#[path = "deploy/render.rs"]
mod render;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use clap::{ArgAction, CommandFactory as _, Parser as _};
use csi_provisioner::cli::Options;
use csi_provisioner::features::Feature;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use render::{COMPONENTS, Rendering};
use serde_json::Value;

const PROVISIONER_CONTAINER: &str = "csi-provisioner";
const DRIVER_CONTAINER: &str = "hostpath";

/// The renderings, made once for all tests: with `kubectl kustomize`, or,
/// without kubectl, with the test's own small renderer (which
/// `fallback_renderer_matches_kubectl` keeps equal to kubectl's output).
fn renderings() -> &'static [Rendering] {
    static CELL: OnceLock<Vec<Rendering>> = OnceLock::new();
    CELL.get_or_init(|| match render::kubectl_unavailable() {
        Some(why) => {
            eprintln!(
                "NOTE: {why}; rendering deploy/kubernetes with the test's fallback renderer \
                 (tests/deploy/render.rs, mini_kustomize) instead of kubectl kustomize"
            );
            render::all_renderings(&mini)
        }
        None => render::all_renderings(&render::kustomize),
    })
}

fn mini(dir: &Path) -> Vec<Value> {
    render::mini_kustomize(dir).unwrap_or_else(|e| panic!("fallback renderer: {e}"))
}

fn fail_if_any(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  - {}",
        problems.len(),
        problems.join("\n  - ")
    );
}

/// The pod template of the (single) Deployment.
fn pod(r: &Rendering) -> (Deployment, PodSpec) {
    let d: Deployment = render::the(&r.objects, "Deployment");
    let spec = d.spec.template.spec.clone().expect("pod spec");
    (d, spec)
}

fn container<'a>(spec: &'a PodSpec, name: &str) -> &'a Container {
    spec.containers
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// The container's arguments with `$(VAR)` expanded as the kubelet does
/// (downward-API fields get example values); an undefined variable is an
/// error, since the kubelet would pass it on literally.
fn expanded_args(c: &Container) -> Result<Vec<String>, String> {
    let mut vars = BTreeMap::new();
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => match from.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                Some("metadata.namespace") => "csi-provisioner".into(),
                Some("metadata.name") => "csi-hostpath-controller-abc12-xyz34".into(),
                Some("spec.nodeName") => "node-1".into(),
                other => format!("<{other:?}>"),
            },
            (None, None) => String::new(),
        };
        vars.insert(e.name.clone(), value);
    }
    let mut out = Vec::new();
    for arg in c.args.iter().flatten() {
        let mut s = arg.clone();
        while let Some(start) = s.find("$(") {
            let end = s[start..]
                .find(')')
                .ok_or_else(|| format!("{arg}: unclosed $("))?;
            let name = &s[start + 2..start + end];
            let value = vars.get(name).ok_or_else(|| {
                format!(
                    "{arg}: $({name}) is not an environment variable of container {}",
                    c.name
                )
            })?;
            s = format!("{}{}{}", &s[..start], value, &s[start + end + 1..]);
        }
        out.push(s);
    }
    Ok(out)
}

/// The long flags `csi-provisioner --help` lists.
fn help_flags() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .arg("--help")
        .output()
        .expect("run csi-provisioner --help");
    assert!(out.status.success(), "csi-provisioner --help failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut flags = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start();
        if !line.starts_with('-') {
            continue;
        }
        // `-v, --v <LEVEL>`, `--leader-election[=<BOOL>]`, `--timeout <DURATION>`
        for word in line.split([' ', ',']) {
            if let Some(flag) = word.strip_prefix("--") {
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if !name.is_empty() {
                    flags.insert(name);
                }
            }
        }
    }
    assert!(
        flags.contains("csi-address"),
        "--help output not understood:\n{text}"
    );
    flags
}

/// Every rendered object is a valid object of its k8s-openapi type.
#[test]
fn objects_are_valid_kubernetes_objects() {
    let renderings = renderings();
    let mut problems = Vec::new();
    for r in renderings {
        let mut seen = BTreeSet::new();
        for obj in &r.objects {
            for p in render::validate_typed(obj) {
                problems.push(format!("{}: {p}", r.name));
            }
            if !seen.insert(render::describe(obj)) {
                problems.push(format!("{}: {} twice", r.name, render::describe(obj)));
            }
        }
        for kind in [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "CSIDriver",
            "Deployment",
        ] {
            if !r.objects.iter().any(|o| render::kind(o) == kind) {
                problems.push(format!("{}: no {kind}", r.name));
            }
        }
    }
    // The raw files too, so that the fallback stays meaningful.
    problems.extend(render::raw_files_check());
    fail_if_any("typed validation", &problems);
    let counts: Vec<String> = renderings
        .iter()
        .map(|r| format!("{}: {} objects", r.name, r.objects.len()))
        .collect();
    eprintln!("validated {}", counts.join(", "));
}

/// Each namespaced object is in the Deployment's namespace, which is
/// deployed with the "restricted" Pod Security Standard enforced.
#[test]
fn everything_lives_in_one_restricted_namespace() {
    let renderings = renderings();
    let mut problems = Vec::new();
    for r in renderings {
        let (d, _) = pod(r);
        let ns_name = d.metadata.namespace.clone().unwrap_or_default();
        let ns: Namespace = render::the(&r.objects, "Namespace");
        if ns.metadata.name.as_deref() != Some(&ns_name) {
            problems.push(format!(
                "{}: Namespace {:?} is not the Deployment's {ns_name:?}",
                r.name, ns.metadata.name
            ));
        }
        let labels = ns.metadata.labels.unwrap_or_default();
        if labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str)
            != Some("restricted")
        {
            problems.push(format!(
                "{}: namespace does not enforce the restricted Pod Security Standard",
                r.name
            ));
        }
        for obj in &r.objects {
            let namespaced = matches!(
                render::kind(obj),
                "ServiceAccount" | "Role" | "RoleBinding" | "Deployment"
            );
            let has = obj["metadata"]["namespace"].as_str();
            if namespaced && has != Some(ns_name.as_str()) {
                problems.push(format!(
                    "{}: {} is not in {ns_name}",
                    r.name,
                    render::describe(obj)
                ));
            }
            if !namespaced && has.is_some() {
                problems.push(format!(
                    "{}: cluster-scoped {} has a namespace",
                    r.name,
                    render::describe(obj)
                ));
            }
        }
    }
    fail_if_any("namespaces", &problems);
}

/// The RBAC rules grant every API call of every active loop, in the right
/// scope. A failure names the rendering, the loop, and the (group,
/// resource, verb) that is not granted, so the manifests can be fixed.
#[test]
fn rbac_grants_every_api_call() {
    let renderings = renderings();
    let mut problems = Vec::new();
    let mut checked = 0;
    let mut mapping = Vec::new();
    for (loop_name, _) in csi_provisioner::startup::api_calls() {
        let target = rbac::component_of(loop_name)
            .map(|c| format!("components/{c}"))
            .unwrap_or_else(|| "base".into());
        if rbac::component_of(loop_name).is_none() && !rbac::KNOWN_BASE_LOOPS.contains(&loop_name) {
            eprintln!(
                "NOTE: loop {loop_name:?} is not in the loop-to-component table of \
                 tests/deploy/rbac.rs (component_of, KNOWN_BASE_LOOPS); it is checked \
                 against the base. If it is gated, map it to its component."
            );
        }
        mapping.push(format!("{loop_name} -> {target}"));
    }
    eprintln!("loops: {}", mapping.join(", "));
    for r in renderings {
        let (d, spec) = pod(r);
        let ns = d.metadata.namespace.clone().unwrap_or_default();
        let sa = spec.service_account_name.clone().unwrap_or_default();
        let _: ServiceAccount = render::the(&r.objects, "ServiceAccount");
        if !r
            .objects
            .iter()
            .any(|o| render::kind(o) == "ServiceAccount" && render::name(o) == sa)
        {
            problems.push(format!(
                "{}: the Deployment's serviceAccountName {sa:?} is not deployed",
                r.name
            ));
        }
        let (grants, binding_problems) = rbac::grants(&r.objects, &ns, &sa);
        problems.extend(
            binding_problems
                .into_iter()
                .map(|p| format!("{}: {p}", r.name)),
        );
        for need in rbac::needs(&r.components) {
            checked += 1;
            if !rbac::granted(&grants, &need) {
                let place = match rbac::component_of(need.loop_name) {
                    Some(c) => format!("components/{c}"),
                    None => "base/rbac.yaml".into(),
                };
                problems.push(format!(
                    "{}: NOT GRANTED {need} (add it to {place})",
                    r.name
                ));
            }
        }
    }
    fail_if_any("RBAC coverage", &problems);
    eprintln!("RBAC coverage: {checked} (rendering, loop, group, resource, verb) checks passed");
}

/// Nothing is granted that no active loop needs: the base only what the
/// ungated loops need, each component only what its loop adds, and the
/// all-gates overlay exactly the union of its components.
#[test]
fn rbac_is_least_privilege() {
    let renderings = renderings();
    let mut problems = Vec::new();
    // (what, group, resource, scope) → verbs, printed one line each.
    let mut notes: BTreeMap<(String, String, String, String), BTreeSet<String>> = BTreeMap::new();
    let mut note = |what: String, grant: &rbac::Grant| {
        notes
            .entry((
                what,
                grant.group.clone(),
                grant.resource.clone(),
                grant.scope.to_string(),
            ))
            .or_default()
            .insert(grant.verb.clone());
    };
    let all_needs = rbac::needs(&COMPONENTS.iter().map(|c| c.dir).collect::<Vec<_>>());
    let without_loops = rbac::components_without_loops();
    let grants_of = |r: &Rendering| {
        let (d, spec) = pod(r);
        rbac::grants(
            &r.objects,
            d.metadata.namespace.as_deref().unwrap_or(""),
            spec.service_account_name.as_deref().unwrap_or(""),
        )
        .0
    };
    let base = renderings
        .iter()
        .find(|r| r.components.is_empty())
        .expect("base rendering");
    let base_grants = grants_of(base);
    let mut union = base_grants.clone();
    for r in renderings {
        let grants = grants_of(r);
        if r.components.len() > 1 {
            if grants != union {
                let extra: Vec<_> = grants.difference(&union).map(|g| g.to_string()).collect();
                let lost: Vec<_> = union.difference(&grants).map(|g| g.to_string()).collect();
                problems.push(format!(
                    "{}: not the union of base and its components; extra {extra:?}, \
                     missing {lost:?}",
                    r.name
                ));
            }
            continue;
        }
        let needs = rbac::needs(&r.components);
        let own: Vec<_> = if r.components.is_empty() {
            grants.iter().collect()
        } else {
            union.extend(grants.iter().cloned());
            grants.difference(&base_grants).collect()
        };
        for grant in own {
            if rbac::needed(&needs, grant) {
                continue;
            }
            if let Some(why) = rbac::pending(&all_needs, grant) {
                note(format!("pending in base/rbac.yaml: {why}"), grant);
                continue;
            }
            if let [component] = r.components.as_slice()
                && without_loops.contains(component)
            {
                note(
                    format!(
                        "not checked yet in components/{component} (no loop of \
                         src/startup.rs api_calls() maps to it)"
                    ),
                    grant,
                );
                continue;
            }
            let place = r
                .components
                .first()
                .map(|c| format!("components/{c}"))
                .unwrap_or_else(|| "base/rbac.yaml".into());
            let hint = if all_needs.iter().any(|n| {
                n.group == grant.group && n.resource == grant.resource && n.verb == grant.verb
            }) {
                " (a loop needs it in the other scope, or a loop of another component needs it)"
            } else {
                ""
            };
            problems.push(format!(
                "{}: NOT NEEDED {grant} in {place}: no active loop of src/startup.rs api_calls() \
                 makes this call{hint}",
                r.name
            ));
        }
    }
    for ((what, group, resource, scope), verbs) in &notes {
        let verbs: Vec<_> = verbs.iter().map(String::as_str).collect();
        eprintln!(
            "NOTE: {what}: ({group:?}, {resource}, [{}]) {scope}",
            verbs.join(", ")
        );
    }
    fail_if_any("RBAC least privilege", &problems);
}

/// Whether the flags of the gateless component `dir` are on in `options`.
fn flag_component_on(dir: &str, options: &Options) -> bool {
    match dir {
        "capacity" => options.enable_capacity,
        "namespace-metadata" => {
            !csi_provisioner::provision::namespace_metadata::NamespaceMetadataKeys::new(
                &options.extra_create_metadata_namespace_labels,
                &options.extra_create_metadata_namespace_annotations,
            )
            .is_empty()
        }
        other => panic!("components/{other}: no gate and no flag known to tests/deploy.rs"),
    }
}

/// The provisioner's arguments are flags of the binary, they parse, and the
/// gates and flags of the components take effect.
#[test]
fn provisioner_arguments_parse() {
    let renderings = renderings();
    let known = help_flags();
    let mut problems = Vec::new();
    let mut notes = BTreeSet::new();
    for r in renderings {
        let (_, spec) = pod(r);
        if spec.containers.first().map(|c| c.name.as_str()) != Some(PROVISIONER_CONTAINER) {
            problems.push(format!(
                "{}: container 0 is not {PROVISIONER_CONTAINER}; the components patch \
                 /spec/template/spec/containers/0",
                r.name
            ));
            continue;
        }
        let c = container(&spec, PROVISIONER_CONTAINER);
        if c.command.is_some() {
            problems.push(format!(
                "{}: {PROVISIONER_CONTAINER} overrides the image's command",
                r.name
            ));
        }
        let args = match expanded_args(c) {
            Ok(a) => a,
            Err(e) => {
                problems.push(format!("{}: {e}", r.name));
                continue;
            }
        };
        for arg in &args {
            let Some(flag) = arg.strip_prefix('-') else {
                problems.push(format!("{}: {arg:?} is not a flag", r.name));
                continue;
            };
            let name = flag.trim_start_matches('-').split('=').next().unwrap_or("");
            if name != "v" && !known.contains(name) {
                problems.push(format!(
                    "{}: --{name} is not listed by csi-provisioner --help",
                    r.name
                ));
            }
        }
        let options = match Options::parse_from_args(
            std::iter::once("csi-provisioner".to_owned()).chain(args.iter().cloned()),
        ) {
            Ok(o) => o,
            Err(e) => {
                problems.push(format!("{}: arguments {args:?} refused: {e}", r.name));
                continue;
            }
        };
        for component in COMPONENTS {
            let active = r.components.contains(&component.dir);
            match component.gate {
                Some(gate) if options.gates().enabled(gate) != active => problems.push(format!(
                    "{}: gate {gate} is {} but components/{} is {}",
                    r.name,
                    options.gates().enabled(gate),
                    component.dir,
                    if active { "applied" } else { "not applied" }
                )),
                None if flag_component_on(component.dir, &options) != active => {
                    problems.push(format!(
                        "{}: the flags of components/{} are {} but the component is {}",
                        r.name,
                        component.dir,
                        if active { "off" } else { "on" },
                        if active { "applied" } else { "not applied" }
                    ))
                }
                _ => {}
            }
        }
        for gate in [
            Feature::HonorPVReclaimPolicy,
            Feature::Topology,
            Feature::VolumeAttributesClass,
        ] {
            if !options.gates().enabled(gate) {
                problems.push(format!("{}: default-on gate {gate} is off", r.name));
            }
        }
        if !options.leader_election {
            problems.push(format!("{}: --leader-election is off", r.name));
        }
        if options.enable_capacity {
            let env: BTreeSet<_> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
            for var in ["POD_NAME", "NAMESPACE"] {
                if !env.contains(var) {
                    problems.push(format!(
                        "{}: --enable-capacity needs {var} in the environment",
                        r.name
                    ));
                }
            }
        }
        let set: Vec<_> = options.set_but_not_implemented();
        if !set.is_empty() {
            notes.insert(format!(
                "flags set in the manifests but reported as not implemented yet by \
                 csi-provisioner: {}",
                set.join(", ")
            ));
        }
        let gates: Vec<_> = csi_provisioner::features::NOT_YET_IMPLEMENTED
            .iter()
            .filter(|g| options.gates().enabled(**g))
            .map(|g| g.name())
            .collect();
        if !gates.is_empty() {
            notes.insert(format!(
                "{}: gates on whose loops are not built yet: {}",
                r.name,
                gates.join(", ")
            ));
        }
    }
    for note in &notes {
        eprintln!("NOTE: {note}");
    }
    fail_if_any("csi-provisioner arguments", &problems);
}

/// The driver's arguments parse with csi-hostpath's command line, the socket
/// is the same path on a shared volume, and the state directory is on a
/// writable volume.
#[test]
fn driver_and_sidecar_share_the_socket() {
    let renderings = renderings();
    let mut problems = Vec::new();
    for r in renderings {
        let (_, spec) = pod(r);
        let provisioner = container(&spec, PROVISIONER_CONTAINER);
        let driver = container(&spec, DRIVER_CONTAINER);
        let p_args = expanded_args(provisioner).unwrap_or_default();
        let options = match Options::parse_from_args(
            std::iter::once("csi-provisioner".to_owned()).chain(p_args),
        ) {
            Ok(o) => o,
            Err(_) => continue, // reported by provisioner_arguments_parse
        };
        let d_args = match expanded_args(driver) {
            Ok(a) => a,
            Err(e) => {
                problems.push(format!("{}: {e}", r.name));
                continue;
            }
        };
        if d_args.iter().any(|a| a.contains("$(")) {
            problems.push(format!("{}: unexpanded variable in {d_args:?}", r.name));
        }
        let cli = match csi_hostpath::cli::Cli::try_parse_from(csi_hostpath::cli::normalize_args(
            std::iter::once("csi-hostpath".to_owned()).chain(d_args.iter().cloned()),
        )) {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!(
                    "{}: csi-hostpath refuses {d_args:?}: {}",
                    r.name,
                    e.render()
                ));
                continue;
            }
        };
        let socket = options.csi_socket();
        let endpoint = csi_proto::transport::parse_unix_address(&cli.endpoint)
            .unwrap_or_else(|_| cli.endpoint.clone().into());
        if socket != endpoint {
            problems.push(format!(
                "{}: the sidecar dials {} but the driver listens on {}",
                r.name,
                socket.display(),
                endpoint.display()
            ));
        }
        if cli.nodeid.as_deref().is_none_or(|n| n != "node-1") {
            problems.push(format!(
                "{}: the driver's --nodeid is not $(NODE_NAME) (spec.nodeName)",
                r.name
            ));
        }
        let volume_of = |c: &Container, path: &Path| -> Option<String> {
            c.volume_mounts
                .iter()
                .flatten()
                .filter(|m| path.starts_with(&m.mount_path))
                .max_by_key(|m| m.mount_path.len())
                .filter(|m| m.read_only != Some(true))
                .map(|m| m.name.clone())
        };
        let on_p = volume_of(provisioner, socket.parent().unwrap_or(Path::new("/")));
        let on_d = volume_of(driver, endpoint.parent().unwrap_or(Path::new("/")));
        match (&on_p, &on_d) {
            (Some(a), Some(b)) if a == b => {
                let vol = spec
                    .volumes
                    .iter()
                    .flatten()
                    .find(|v| &v.name == a)
                    .map(|v| v.empty_dir.is_some());
                if vol != Some(true) {
                    problems.push(format!(
                        "{}: the socket volume {a} is not an emptyDir of the pod",
                        r.name
                    ));
                }
            }
            _ => problems.push(format!(
                "{}: the socket directory is on volume {on_p:?} in the sidecar and {on_d:?} \
                 in the driver; it must be one shared writable volume",
                r.name
            )),
        }
        if volume_of(driver, &cli.statedir).is_none() {
            problems.push(format!(
                "{}: the driver's --statedir {} is not on a writable volume (the root \
                 filesystem is read-only)",
                r.name,
                cli.statedir.display()
            ));
        }
        let csidriver: CSIDriver = render::the(&r.objects, "CSIDriver");
        if csidriver.metadata.name.as_deref() != Some(cli.drivername.as_str()) {
            problems.push(format!(
                "{}: CSIDriver {:?} is not the driver's name {}",
                r.name, csidriver.metadata.name, cli.drivername
            ));
        }
        if csidriver.spec.storage_capacity != Some(options.enable_capacity) {
            problems.push(format!(
                "{}: CSIDriver storageCapacity {:?} but --enable-capacity={}",
                r.name, csidriver.spec.storage_capacity, options.enable_capacity
            ));
        }
        if csidriver.spec.attach_required != Some(false) {
            problems.push(format!(
                "{}: the hostpath driver has no ControllerPublishVolume: attachRequired \
                 must be false",
                r.name
            ));
        }
        let classes: Vec<StorageClass> = render::all_of(&r.objects, "StorageClass");
        let modes: BTreeSet<_> = classes
            .iter()
            .filter_map(|c| c.volume_binding_mode.clone())
            .collect();
        if modes != BTreeSet::from(["Immediate".to_owned(), "WaitForFirstConsumer".to_owned()]) {
            problems.push(format!(
                "{}: want one Immediate and one WaitForFirstConsumer class, got {modes:?}",
                r.name
            ));
        }
        for class in classes {
            if class.provisioner != cli.drivername {
                problems.push(format!(
                    "{}: StorageClass {:?} names provisioner {} instead of {}",
                    r.name, class.metadata.name, class.provisioner, cli.drivername
                ));
            }
        }
    }
    fail_if_any("driver and sidecar", &problems);
}

/// Whether this is a CI run (`CI=true`): there a check that needs a tool
/// fails without it instead of saying it was skipped.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The long flags a command line declares as lists, where each occurrence
/// adds to the list (clap's `Append` or `Count`: `--leader-election-labels`,
/// `--feature-gates`, the driver's `--capacity`). Any other flag takes one
/// value, so a second occurrence silently drops the first.
fn repeatable_flags(cmd: clap::Command) -> BTreeSet<String> {
    cmd.get_arguments()
        .filter(|a| matches!(a.get_action(), ArgAction::Append | ArgAction::Count))
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect()
}

/// The directories under `dir` holding a kustomization that is not a
/// Component: the base, `deploy/kubernetes` itself and every overlay, found
/// on disk so that a new overlay is checked without being listed here.
fn kustomizations(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for file in ["kustomization.yaml", "kustomization.yml", "Kustomization"] {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let kz: Value =
            serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if kz["kind"] != "Component" {
            out.push(dir.to_owned());
        }
        break;
    }
    let mut subdirs: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    subdirs.sort();
    for sub in subdirs {
        kustomizations(&sub, out);
    }
}

/// The manifests compose cleanly: rendered with `kubectl kustomize` (the
/// base, `deploy/kubernetes`, every overlay, and the base with each
/// component alone), no container has an env name twice (the API server
/// warns that the second "hides previous definition", and `kubectl apply`
/// may drop it), a flag twice (but the flags its binary declares as lists),
/// more than one `--feature-gates`, or a gate twice in that flag. Components
/// that need the same setting share the base's: one `--feature-gates` whose
/// variables they fill, one `--controller-id=$(CONTROLLER_ID)`.
///
/// Needs kubectl (the fallback renderer is no judge of what kustomize
/// does): skipped without it, a failure when `CI=true`.
#[test]
fn manifests_compose_without_duplicates() {
    if let Some(why) = render::kubectl_unavailable() {
        assert!(
            !in_ci(),
            "{why}: CI=true, and this check renders with kubectl kustomize only"
        );
        eprintln!("SKIPPED manifests compose without duplicates: {why}");
        return;
    }
    let repo = render::repo();
    let mut dirs = Vec::new();
    kustomizations(&render::kubernetes_dir(), &mut dirs);
    let names: Vec<String> = dirs
        .iter()
        .map(|d| d.strip_prefix(&repo).unwrap_or(d).display().to_string())
        .collect();
    for want in [
        "deploy/kubernetes/base",
        "deploy/kubernetes/overlays/all-gates",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} not found among {names:?}"
        );
    }
    let mut targets: Vec<(String, Vec<Value>)> = names
        .into_iter()
        .zip(&dirs)
        .map(|(name, dir)| (name, render::kustomize(dir)))
        .collect();
    // Each component alone on the base, as deploy/README.md offers them
    // (these renderings are kubectl's here).
    targets.extend(
        renderings()
            .iter()
            .filter(|r| r.components.len() == 1)
            .map(|r| (r.name.clone(), r.objects.clone())),
    );
    let repeatable = BTreeMap::from([
        (PROVISIONER_CONTAINER, repeatable_flags(Options::command())),
        (
            DRIVER_CONTAINER,
            repeatable_flags(csi_hostpath::cli::Cli::command()),
        ),
    ]);
    let none = BTreeSet::new();
    let mut problems = Vec::new();
    let mut containers = 0;
    for (name, objects) in &targets {
        for obj in objects {
            let spec = match render::kind(obj) {
                "Pod" => &obj["spec"],
                _ => &obj["spec"]["template"]["spec"],
            };
            for list in ["initContainers", "containers", "ephemeralContainers"] {
                for c in spec[list].as_array().into_iter().flatten() {
                    let c: Container = match serde_json::from_value(c.clone()) {
                        Ok(c) => c,
                        Err(e) => {
                            problems.push(format!("{name}: {}: {e}", render::describe(obj)));
                            continue;
                        }
                    };
                    containers += 1;
                    let at = format!("{name}: {} container {}", render::describe(obj), c.name);
                    let mut env = BTreeMap::<&str, usize>::new();
                    for e in c.env.iter().flatten() {
                        *env.entry(e.name.as_str()).or_default() += 1;
                    }
                    for (var, n) in env.into_iter().filter(|(_, n)| *n > 1) {
                        problems.push(format!(
                            "{at}: env {var} defined {n} times (the API server warns that the \
                             last hides the others, which `kubectl apply` may drop); components \
                             that need it must share one entry"
                        ));
                    }
                    let allowed = repeatable.get(c.name.as_str()).unwrap_or(&none);
                    let mut flags = BTreeMap::<&str, Vec<&str>>::new();
                    for arg in c.command.iter().flatten().chain(c.args.iter().flatten()) {
                        if arg == "--" {
                            break;
                        }
                        let Some(flag) = arg.strip_prefix('-') else {
                            continue; // the binary, or the value of `--flag VALUE`
                        };
                        let flag = flag.trim_start_matches('-');
                        let flag = flag.split('=').next().unwrap_or(flag);
                        flags.entry(flag).or_default().push(arg);
                    }
                    for (flag, given) in &flags {
                        if given.len() < 2 {
                            continue;
                        }
                        if *flag == "feature-gates" {
                            problems.push(format!(
                                "{at}: {} --feature-gates flags {given:?}; give one, listing \
                                 every gate (components fill the GATE_* variables of the \
                                 base's flag)",
                                given.len()
                            ));
                        } else if !allowed.contains(*flag) {
                            problems.push(format!(
                                "{at}: --{flag} given {} times {given:?}; it takes one value, so \
                                 all but the last are dropped; components that need it must \
                                 share one flag",
                                given.len()
                            ));
                        }
                    }
                    match expanded_args(&c) {
                        Err(e) => problems.push(format!("{at}: {e}")),
                        Ok(args) => {
                            for arg in &args {
                                let Some(list) =
                                    arg.trim_start_matches('-').strip_prefix("feature-gates=")
                                else {
                                    continue;
                                };
                                let mut gates = BTreeSet::new();
                                for entry in list.split(',').map(str::trim) {
                                    let gate = entry.split('=').next().unwrap_or(entry);
                                    if !entry.is_empty() && !gates.insert(gate) {
                                        problems.push(format!(
                                            "{at}: gate {gate} twice in --{} (expanded)",
                                            arg.trim_start_matches('-')
                                        ));
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    fail_if_any("manifests compose without duplicates", &problems);
    let lists: Vec<String> = repeatable
        .iter()
        .map(|(c, flags)| format!("{c}: {flags:?}"))
        .collect();
    eprintln!(
        "composition: {} renderings, {containers} containers without a duplicate env name or \
         flag (flags that are lists: {})",
        targets.len(),
        lists.join("; ")
    );
}

/// Non-root, read-only root filesystem, no privilege escalation, no
/// capabilities, RuntimeDefault seccomp, requests and limits, probes on the
/// --http-endpoint port, downward-API variables.
#[test]
fn pod_is_hardened_and_probed() {
    let renderings = renderings();
    let mut problems = Vec::new();
    for r in renderings {
        let (_, spec) = pod(r);
        let mut bad = |what: String| problems.push(format!("{}: {what}", r.name));
        let psc = spec.security_context.clone().unwrap_or_default();
        if psc.run_as_non_root != Some(true) {
            bad("pod securityContext.runAsNonRoot is not true".into());
        }
        if psc.run_as_user.is_none_or(|u| u == 0) {
            bad("pod securityContext.runAsUser is not a non-root uid".into());
        }
        if psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault") {
            bad("pod seccompProfile is not RuntimeDefault".into());
        }
        if spec.host_network == Some(true) || spec.host_pid == Some(true) {
            bad("host namespaces are used".into());
        }
        for v in spec.volumes.iter().flatten() {
            if v.host_path.is_some() {
                bad(format!("volume {} is a hostPath", v.name));
            }
        }
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            let sc = c.security_context.clone().unwrap_or_default();
            if sc.read_only_root_filesystem != Some(true) {
                bad(format!("{}: readOnlyRootFilesystem is not true", c.name));
            }
            if sc.allow_privilege_escalation != Some(false) {
                bad(format!("{}: allowPrivilegeEscalation is not false", c.name));
            }
            if sc.privileged == Some(true) {
                bad(format!("{}: privileged", c.name));
            }
            if sc.run_as_user == Some(0) || sc.run_as_non_root == Some(false) {
                bad(format!("{}: runs as root", c.name));
            }
            let caps = sc.capabilities.unwrap_or_default();
            if caps.drop.unwrap_or_default() != ["ALL"] || caps.add.is_some() {
                bad(format!(
                    "{}: capabilities must drop ALL and add none",
                    c.name
                ));
            }
            let res = c.resources.clone().unwrap_or_default();
            for (what, map) in [("requests", res.requests), ("limits", res.limits)] {
                let map = map.unwrap_or_default();
                for key in ["cpu", "memory"] {
                    if !map.contains_key(key) {
                        bad(format!("{}: no {key} in resources.{what}", c.name));
                    }
                }
            }
            match c.image.as_deref() {
                Some(img) if img.contains(':') && !img.ends_with(":latest") => {}
                other => bad(format!("{}: image {other:?} has no pinned tag", c.name)),
            }
        }
        let p = container(&spec, PROVISIONER_CONTAINER);
        let args = expanded_args(p).unwrap_or_default();
        let Ok(options) =
            Options::parse_from_args(std::iter::once("csi-provisioner".to_owned()).chain(args))
        else {
            continue;
        };
        if options.set_but_not_implemented().contains(&"http-endpoint") {
            eprintln!(
                "NOTE: {}: this build does not serve --http-endpoint yet; the probes would \
                 fail on a real cluster",
                r.name
            );
        }
        let port: Option<i32> = options
            .http_endpoint
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok());
        let Some(port) = port else {
            bad(format!(
                "--http-endpoint {:?} has no port",
                options.http_endpoint
            ));
            continue;
        };
        if !p.ports.iter().flatten().any(|cp| cp.container_port == port) {
            bad(format!("no containerPort {port} (--http-endpoint)"));
        }
        let resolve = |ios: &IntOrString| match ios {
            IntOrString::Int(i) => Some(*i),
            IntOrString::String(name) => p
                .ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name))
                .map(|cp| cp.container_port),
        };
        for (what, probe, path) in [
            (
                "livenessProbe",
                &p.liveness_probe,
                "/healthz/leader-election",
            ),
            ("readinessProbe", &p.readiness_probe, "/readyz"),
        ] {
            let get = probe.as_ref().and_then(|pr| pr.http_get.as_ref());
            match get {
                None => bad(format!("{PROVISIONER_CONTAINER}: no {what} httpGet")),
                Some(g) => {
                    if g.path.as_deref() != Some(path) {
                        bad(format!("{what} path {:?}, want {path}", g.path));
                    }
                    if resolve(&g.port) != Some(port) {
                        bad(format!(
                            "{what} port {:?} is not the --http-endpoint port {port}",
                            g.port
                        ));
                    }
                }
            }
        }
        let env: BTreeMap<_, _> = p
            .env
            .iter()
            .flatten()
            .map(|e| {
                (
                    e.name.as_str(),
                    e.value_from
                        .as_ref()
                        .and_then(|f| f.field_ref.as_ref())
                        .map(|f| f.field_path.as_str()),
                )
            })
            .collect();
        for (var, field) in [
            ("NAMESPACE", "metadata.namespace"),
            ("POD_NAME", "metadata.name"),
            ("NODE_NAME", "spec.nodeName"),
        ] {
            if env.get(var) != Some(&Some(field)) {
                bad(format!(
                    "{PROVISIONER_CONTAINER}: {var} is not from the downward API {field}"
                ));
            }
        }
    }
    fail_if_any("pod hardening", &problems);
}

/// The image tags in the base follow the crate version, and the images are
/// the ones the Dockerfile builds.
#[test]
fn image_tags_follow_the_crate_version() {
    let text = std::fs::read_to_string(render::kubernetes_dir().join("base/kustomization.yaml"))
        .expect("base kustomization");
    let kz: Value = serde_yaml_ng::from_str(&text).expect("parses");
    let want = format!("v{}", env!("CARGO_PKG_VERSION"));
    let images = kz["images"].as_array().expect("images");
    let names: BTreeSet<_> = images.iter().filter_map(|i| i["name"].as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["csi-provisioner", "csi-hostpath"]),
        "images: one per Dockerfile target"
    );
    for image in images {
        assert_eq!(
            image["newTag"].as_str(),
            Some(want.as_str()),
            "{image}: tag must be {want}"
        );
    }
    let (_, stages) = dockerfile::stages(&dockerfile::parse(
        &std::fs::read_to_string(render::repo().join("Dockerfile")).expect("Dockerfile"),
    ));
    for name in names {
        assert!(
            stages.iter().any(|s| s.name.as_deref() == Some(name)),
            "image {name} has no Dockerfile target of that name"
        );
    }
}

/// The workspace's packages, their binaries and the rust-version, from
/// `cargo metadata --no-deps`.
struct Workspace {
    /// package name → bin targets
    packages: BTreeMap<String, BTreeSet<String>>,
    /// member directories, relative to the repository root
    member_dirs: Vec<String>,
    rust_version: (u32, u32, u32),
}

fn workspace() -> Workspace {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version=1", "--offline"])
        .current_dir(render::repo())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let root = render::repo().canonicalize().expect("repo");
    let mut packages = BTreeMap::new();
    let mut member_dirs = Vec::new();
    let mut rust_version = (0, 0, 0);
    for p in meta["packages"].as_array().expect("packages") {
        let bins = p["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| {
                t["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
            })
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        packages.insert(p["name"].as_str().expect("name").to_owned(), bins);
        let manifest = Path::new(p["manifest_path"].as_str().expect("manifest_path"));
        let dir = manifest.parent().expect("dir");
        let rel = dir.strip_prefix(&root).unwrap_or(dir);
        member_dirs.push(rel.to_string_lossy().into_owned());
        if let Some(v) = p["rust_version"].as_str().and_then(dockerfile::version) {
            rust_version = rust_version.max(v);
        }
    }
    Workspace {
        packages,
        member_dirs,
        rust_version,
    }
}

/// The newest rust-version among the locked registry dependencies whose
/// sources are in the local Cargo cache (best effort: None when the cache
/// is elsewhere).
fn dependencies_rust_version() -> Option<((u32, u32, u32), String)> {
    let home = std::env::var_os("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    let registries: Vec<_> = std::fs::read_dir(home.join("registry/src"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .collect();
    let lock = std::fs::read_to_string(render::repo().join("Cargo.lock")).ok()?;
    let lock: Value = {
        // Cargo.lock is TOML; its [[package]] entries are simple enough to
        // read line by line.
        let mut pkgs = Vec::new();
        let mut name = None;
        for line in lock.lines() {
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_owned());
            } else if let Some(v) = line.strip_prefix("version = ")
                && let Some(n) = name.take()
            {
                pkgs.push(serde_json::json!([n, v.trim_matches('"')]));
            }
        }
        Value::Array(pkgs)
    };
    let mut best: Option<((u32, u32, u32), String)> = None;
    for p in lock.as_array()? {
        let (n, v) = (p[0].as_str()?, p[1].as_str()?);
        for reg in &registries {
            let manifest = reg.join(format!("{n}-{v}/Cargo.toml"));
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            let rv = text
                .lines()
                .find_map(|l| l.strip_prefix("rust-version = "))
                .and_then(|s| dockerfile::version(s.trim_matches('"')));
            if let Some(rv) = rv
                && best.as_ref().is_none_or(|(b, _)| rv > *b)
            {
                best = Some((rv, format!("{n} {v}")));
            }
            break;
        }
    }
    best
}

/// The Dockerfile's references stay true.
#[test]
fn dockerfile_references_stay_true() {
    let repo = render::repo();
    let text = std::fs::read_to_string(repo.join("Dockerfile")).expect("Dockerfile");
    let instructions = dockerfile::parse(&text);
    let (args, stages) = dockerfile::stages(&instructions);
    let ws = workspace();
    let ignore: Vec<String> = std::fs::read_to_string(repo.join(".dockerignore"))
        .expect(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('!'))
        .map(str::to_owned)
        .collect();
    let mut problems = Vec::new();

    // The Rust toolchain.
    let rust = args
        .get("RUST_VERSION")
        .and_then(|v| dockerfile::version(v));
    match rust {
        None => problems.push("no ARG RUST_VERSION=<major.minor> default".into()),
        Some(v) if v < ws.rust_version => problems.push(format!(
            "RUST_VERSION {v:?} is older than the workspace rust-version {:?}",
            ws.rust_version
        )),
        Some(v) => {
            if let Some((dep, who)) = dependencies_rust_version()
                && v < dep
            {
                problems.push(format!(
                    "RUST_VERSION {v:?} is older than the rust-version {dep:?} of {who}"
                ));
            }
        }
    }

    let names: BTreeMap<_, _> = stages
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.name.clone().map(|n| (n, i)))
        .collect();
    let mut built = BTreeSet::new();
    for stage in &stages {
        if stage.image.contains('$') {
            problems.push(format!(
                "line {}: FROM {} has an undefined variable",
                stage.line, stage.image
            ));
        }
        // Builder stages: `cargo build -p PKG --bin BIN` name real targets.
        for ins in &stage.instructions {
            if ins.keyword != "RUN" {
                continue;
            }
            for cmd in ins.args.split("&&") {
                let words: Vec<_> = cmd.split_whitespace().collect();
                let Some(pos) = words.windows(2).position(|w| w == ["cargo", "build"]) else {
                    continue;
                };
                let words = &words[pos..];
                let value = |flag: &str| {
                    words
                        .windows(2)
                        .find(|w| w[0] == flag)
                        .map(|w| w[1].to_owned())
                };
                let package = value("-p").or_else(|| value("--package"));
                let bin = value("--bin");
                if !words.contains(&"--locked") {
                    problems.push(format!("line {}: cargo build without --locked", ins.line));
                }
                match (&package, &bin) {
                    (Some(p), Some(b)) => match ws.packages.get(p) {
                        None => problems.push(format!(
                            "line {}: package {p} is not in the workspace",
                            ins.line
                        )),
                        Some(bins) if !bins.contains(b) => problems.push(format!(
                            "line {}: package {p} has no binary {b} (it has {bins:?})",
                            ins.line
                        )),
                        Some(_) => {
                            built.insert(b.clone());
                        }
                    },
                    _ => problems.push(format!(
                        "line {}: cargo build must name -p PACKAGE and --bin BINARY",
                        ins.line
                    )),
                }
            }
        }
    }
    let mut copied_dirs = Vec::new();
    for stage in &stages {
        for copy in dockerfile::copies(stage) {
            match &copy.from {
                None => {
                    for src in &copy.sources {
                        if !repo.join(src).exists() {
                            problems.push(format!(
                                "line {}: COPY source {src} does not exist",
                                copy.line
                            ));
                        }
                        if let Some(p) = dockerfile::ignored(src, &ignore) {
                            problems.push(format!(
                                "line {}: COPY source {src} is excluded by .dockerignore ({p})",
                                copy.line
                            ));
                        }
                        copied_dirs.push(src.trim_start_matches("./").to_owned());
                    }
                }
                Some(from) => {
                    if !names.contains_key(from) {
                        problems.push(format!(
                            "line {}: COPY --from={from}: no such stage",
                            copy.line
                        ));
                    }
                    for src in &copy.sources {
                        let file = src.rsplit('/').next().unwrap_or(src);
                        if !built.contains(file) {
                            problems.push(format!(
                                "line {}: copies {src}, which no cargo build produces",
                                copy.line
                            ));
                        }
                    }
                }
            }
        }
    }
    // Cargo loads the whole workspace: every member must be in the context.
    for dir in &ws.member_dirs {
        let in_context = dir.is_empty()
            || copied_dirs
                .iter()
                .any(|c| dir == c || dir.starts_with(&format!("{c}/")));
        if !in_context {
            problems.push(format!("workspace member {dir}/ is not copied"));
        }
    }
    for file in ["Cargo.toml", "Cargo.lock"] {
        if !copied_dirs.iter().any(|c| c == file) {
            problems.push(format!("{file} is not copied"));
        }
    }

    // Runtime stages: one per image, non-root numeric user, the entrypoint
    // is the binary they copy.
    for target in ["csi-provisioner", "csi-hostpath"] {
        let Some(&i) = names.get(target) else {
            problems.push(format!(
                "no stage {target} (docker build --target {target})"
            ));
            continue;
        };
        let stage = &stages[i];
        let user = stage
            .instructions
            .iter()
            .rev()
            .find(|i| i.keyword == "USER")
            .map(|i| i.args.clone());
        match user.as_deref().map(dockerfile::numeric_uid) {
            None => problems.push(format!("stage {target}: no USER (would run as root)")),
            Some(None) => problems.push(format!(
                "stage {target}: USER {user:?} is not numeric; runAsNonRoot cannot verify a name"
            )),
            Some(Some(0)) => problems.push(format!("stage {target}: USER is root")),
            Some(Some(uid)) if uid != 65532 => {
                problems.push(format!("stage {target}: USER {uid}, want 65532"))
            }
            Some(Some(_)) => {}
        }
        let entry = stage
            .instructions
            .iter()
            .rev()
            .find(|i| i.keyword == "ENTRYPOINT")
            .and_then(|i| serde_json::from_str::<Vec<String>>(&i.args).ok());
        let want = format!("/{target}");
        if entry.as_ref().and_then(|e| e.first()) != Some(&want) {
            problems.push(format!(
                "stage {target}: ENTRYPOINT {entry:?}, want [\"{want}\"] in exec form"
            ));
        }
        if !dockerfile::copies(stage).iter().any(|c| c.dest == want) {
            problems.push(format!("stage {target}: nothing is copied to {want}"));
        }
        if !built.contains(target) {
            problems.push(format!("stage {target}: no cargo build builds {target}"));
        }
        // glibc: the builder's Debian release must match distroless'.
        if let Some(release) = stage
            .image
            .split("-debian")
            .nth(1)
            .and_then(|r| r.split(':').next())
        {
            let codename = match release {
                "11" => "bullseye",
                "12" => "bookworm",
                "13" => "trixie",
                other => other,
            };
            let builders: Vec<_> = stages
                .iter()
                .filter(|s| s.image.contains("rust:"))
                .collect();
            if builders.is_empty() || builders.iter().any(|b| !b.image.contains(codename)) {
                problems.push(format!(
                    "stage {target}: runs on Debian {release} ({codename}); the rust builder \
                     must be the same release so the glibc matches"
                ));
            }
        }
    }
    if stages.last().and_then(|s| s.name.as_deref()) != Some("csi-provisioner") {
        problems.push("the last stage (the default target) must be csi-provisioner".into());
    }
    fail_if_any("Dockerfile", &problems);
}

/// The RBAC tables of deploy/README.md list exactly the rules of the base and
/// of each component (scope, group, resource, verbs).
#[test]
fn readme_rbac_tables_match_the_manifests() {
    let renderings = renderings();
    let readme =
        std::fs::read_to_string(render::repo().join("deploy/README.md")).expect("deploy/README.md");
    // (component or "base", scope, group, resource, verb) from the tables.
    let mut documented = BTreeSet::new();
    let mut section = None;
    let mut component = String::new();
    for line in readme.lines() {
        if let Some(h) = line.strip_prefix("### ") {
            section = Some(h.trim().to_owned());
            continue;
        }
        if line.starts_with("## ") {
            section = None;
        }
        let Some(sec) = &section else { continue };
        if !line.starts_with('|') || line.starts_with("|---") {
            continue;
        }
        let cells: Vec<_> = line.trim_matches('|').split('|').map(str::trim).collect();
        let (comp, scope, group, resources, verbs) = match (sec.as_str(), cells.as_slice()) {
            (s, [scope, group, resources, verbs, _why]) if s.starts_with("Base") => {
                ("base".to_owned(), *scope, *group, *resources, *verbs)
            }
            (s, [comp, _flag, scope, group, resources, verbs, _why])
                if s.starts_with("Per gate") =>
            {
                if !comp.is_empty() {
                    component = comp.to_string();
                }
                (component.clone(), *scope, *group, *resources, *verbs)
            }
            _ => continue,
        };
        if scope == "scope" {
            continue; // header
        }
        let scope = match scope {
            "cluster" => rbac::Scope::Cluster,
            "namespace" => rbac::Scope::OwnNamespace,
            other => panic!("deploy/README.md: unknown scope {other:?} in {line}"),
        };
        let group = group.trim_matches('`').trim_matches('"').to_owned();
        for resource in resources.split(',').map(str::trim) {
            for verb in verbs.split(',').map(str::trim) {
                documented.insert((
                    comp.clone(),
                    scope,
                    group.clone(),
                    resource.to_owned(),
                    verb.to_owned(),
                ));
            }
        }
    }
    // The same from the manifests: the base's rules, and the rules each
    // component appends (the rules past the base's).
    let rules_of =
        |r: &Rendering| -> Vec<(rbac::Scope, Vec<k8s_openapi::api::rbac::v1::PolicyRule>)> {
            let mut out = Vec::new();
            for cr in
                render::all_of::<k8s_openapi::api::rbac::v1::ClusterRole>(&r.objects, "ClusterRole")
            {
                out.push((rbac::Scope::Cluster, cr.rules.unwrap_or_default()));
            }
            for role in render::all_of::<k8s_openapi::api::rbac::v1::Role>(&r.objects, "Role") {
                out.push((rbac::Scope::OwnNamespace, role.rules.unwrap_or_default()));
            }
            out
        };
    let base = renderings
        .iter()
        .find(|r| r.components.is_empty())
        .expect("base");
    let base_rules = rules_of(base);
    let mut deployed = BTreeSet::new();
    let mut add =
        |comp: &str, scope: rbac::Scope, rules: &[k8s_openapi::api::rbac::v1::PolicyRule]| {
            for rule in rules {
                for g in rule.api_groups.iter().flatten() {
                    for res in rule.resources.iter().flatten() {
                        for v in &rule.verbs {
                            deployed.insert((
                                comp.to_owned(),
                                scope,
                                g.clone(),
                                res.clone(),
                                v.clone(),
                            ));
                        }
                    }
                }
            }
        };
    for (scope, rules) in &base_rules {
        add("base", *scope, rules);
    }
    for r in renderings.iter().filter(|r| r.components.len() == 1) {
        for (i, (scope, rules)) in rules_of(r).iter().enumerate() {
            let skip = base_rules.get(i).map_or(0, |(_, b)| b.len());
            add(r.components[0], *scope, &rules[skip.min(rules.len())..]);
        }
    }
    let undocumented: Vec<_> = deployed.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&deployed).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "deploy/README.md RBAC tables out of date:\n  granted but not documented: {undocumented:?}\n  \
         documented but not granted: {stale:?}"
    );
    eprintln!("README RBAC tables: {} rules documented", documented.len());
}

/// The fallback renderer (used without kubectl) renders exactly what
/// `kubectl kustomize` does, so the checks mean the same with or without it.
#[test]
fn fallback_renderer_matches_kubectl() {
    if let Some(why) = render::kubectl_unavailable() {
        eprintln!("NOTE: {why}; the fallback renderer cannot be compared with kubectl here");
        return;
    }
    let by_kubectl = renderings();
    let by_us = render::all_renderings(&mini);
    let mut problems = Vec::new();
    for (a, b) in by_kubectl.iter().zip(&by_us) {
        let index = |objs: &[Value]| -> BTreeMap<String, Value> {
            objs.iter()
                .map(|o| (render::describe(o), o.clone()))
                .collect()
        };
        let (ka, kb) = (index(&a.objects), index(&b.objects));
        for key in ka.keys().chain(kb.keys()).collect::<BTreeSet<_>>() {
            match (ka.get(key), kb.get(key)) {
                (Some(x), Some(y)) => {
                    let mut d = Vec::new();
                    render::diff(x, y, String::new(), &mut d);
                    render::diff(y, x, String::new(), &mut d);
                    for p in d {
                        problems.push(format!("{}: {key}: {p}", a.name));
                    }
                }
                (Some(_), None) => problems.push(format!("{}: {key} missing", a.name)),
                (None, _) => problems.push(format!("{}: {key} extra", a.name)),
            }
        }
    }
    fail_if_any("fallback renderer vs kubectl kustomize", &problems);
}

/// Loop names map to the component whose rules they are checked against.
#[test]
fn loop_names_map_to_components() {
    for (loop_name, want) in [
        ("provisioner", None),
        ("leader-election", None),
        ("cloning-protection", None),
        ("capacity", Some("capacity")),
        ("storage-capacity", Some("capacity")),
        ("pvc-protection", Some("pvc-protection")),
        ("PVCProtection", Some("pvc-protection")),
        ("protection", Some("pvc-protection")),
        ("statefulset-retention", Some("statefulset-auto-delete-pvc")),
        (
            "StatefulSetAutoDeletePVC",
            Some("statefulset-auto-delete-pvc"),
        ),
        ("retention", Some("statefulset-auto-delete-pvc")),
        ("pv-releaser", Some("pv-releaser")),
        ("releaser", Some("pv-releaser")),
        (
            "cross-namespace-data-source",
            Some("cross-namespace-data-source"),
        ),
        ("pod-pvc-provisioner", Some("pod-pvc-provisioner")),
        ("PodPVCProvisioner", Some("pod-pvc-provisioner")),
        ("namespace-metadata", Some("namespace-metadata")),
        (
            "CrossNamespaceVolumeDataSource",
            Some("cross-namespace-data-source"),
        ),
    ] {
        assert_eq!(rbac::component_of(loop_name), want, "{loop_name}");
    }
    // Every component on disk is known to the test.
    let on_disk: BTreeSet<String> = std::fs::read_dir(render::kubernetes_dir().join("components"))
        .expect("components dir")
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let known: BTreeSet<String> = COMPONENTS.iter().map(|c| c.dir.to_owned()).collect();
    assert_eq!(
        on_disk, known,
        "deploy/kubernetes/components vs render::COMPONENTS"
    );
    // Every component is reachable, and every component has a gate or flag.
    for c in COMPONENTS {
        assert_eq!(rbac::component_of(c.dir), Some(c.dir), "{}", c.dir);
        if let Some(gate) = c.gate {
            assert_eq!(rbac::component_of(gate.name()), Some(c.dir), "{gate}");
        }
    }
}

/// The end-to-end harness runs the sidecar on the real cluster with the
/// RBAC of [`render::base_with_components`]: it must be exactly what each
/// rendering of `deploy/` ships for the same components.
#[test]
fn the_rbac_of_real_cluster_tests_is_the_shipped_rbac() {
    let rbac = |objects: &[Value]| -> BTreeMap<String, Value> {
        objects
            .iter()
            .filter(|o| matches!(render::kind(o), "ClusterRole" | "Role"))
            .map(|o| (render::kind(o).to_owned(), o["rules"].clone()))
            .collect()
    };
    for rendering in renderings() {
        let harness = render::base_with_components(&rendering.components)
            .unwrap_or_else(|e| panic!("{}: {e}", rendering.name));
        assert_eq!(
            rbac(&harness),
            rbac(&rendering.objects),
            "{}: the harness's RBAC differs from deploy/",
            rendering.name
        );
    }
}

/// `deploy/kubernetes/snapshotter` (the upstream csi-snapshotter beside
/// the driver), rendered on the base with kubectl: its container is on the
/// socket the driver serves, as hardened as the base's containers and with
/// the pod's user; its ClusterRole is bound to the pod's service account,
/// whose Role in the pod's namespace already grants the leader-election
/// Lease; and its VolumeSnapshotClass names the CSIDriver. Needs kubectl
/// (kustomize Components are kubectl's to judge): skipped without it, a
/// failure when `CI=true`. `tests/parity/real_node.rs` runs it on the real node.
#[test]
fn the_snapshotter_component_shares_the_socket_and_the_service_account() {
    if let Some(why) = render::kubectl_unavailable() {
        assert!(!in_ci(), "{why}: CI=true, and this check needs kubectl");
        eprintln!("SKIPPED the snapshotter component: {why}");
        return;
    }
    let scratch = tempfile::Builder::new()
        .prefix("deploy-snapshotter")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("temporary directory");
    let dir = render::base_with_component_at(scratch.path(), Path::new("snapshotter"));
    let objects = render::kustomize(&dir);
    let mut problems = Vec::new();
    // The VolumeSnapshotClass is a custom resource (no k8s-openapi type):
    // its fields are checked at the end.
    for obj in objects
        .iter()
        .filter(|o| render::kind(o) != "VolumeSnapshotClass")
    {
        problems.extend(render::validate_typed(obj));
    }

    let d: Deployment = render::the(&objects, "Deployment");
    let namespace = d.metadata.namespace.clone().expect("namespace");
    let spec = d.spec.template.spec.clone().expect("pod spec");
    let snapshotter = container(&spec, "csi-snapshotter");
    let driver = container(&spec, DRIVER_CONTAINER);
    let args = snapshotter.args.clone().unwrap_or_default();
    let socket_mount = |c: &Container| {
        c.volume_mounts
            .iter()
            .flatten()
            .find(|m| m.name == "socket-dir")
            .map(|m| m.mount_path.clone())
    };
    if !args.contains(&"--csi-address=/csi/csi.sock".to_owned())
        || socket_mount(snapshotter).as_deref() != Some("/csi")
    {
        problems.push(format!(
            "csi-snapshotter is not on /csi/csi.sock of socket-dir: {args:?}"
        ));
    }
    if socket_mount(driver).as_deref() != Some("/csi")
        || !driver
            .args
            .iter()
            .flatten()
            .any(|a| a == "--endpoint=unix:///csi/csi.sock")
    {
        problems.push("the driver does not serve /csi/csi.sock of socket-dir".into());
    }
    if !args.contains(&"--leader-election".to_owned()) {
        problems.push("csi-snapshotter runs without --leader-election".into());
    }
    let hardened = snapshotter.security_context.as_ref().is_some_and(|s| {
        s.allow_privilege_escalation == Some(false)
            && s.read_only_root_filesystem == Some(true)
            && s.run_as_user.is_none()
            && s.capabilities
                .as_ref()
                .and_then(|c| c.drop.as_ref())
                .is_some_and(|d| d == &["ALL"])
    });
    if !hardened {
        problems.push(format!(
            "csi-snapshotter's securityContext: {:?}",
            snapshotter.security_context
        ));
    }
    if snapshotter
        .resources
        .as_ref()
        .is_none_or(|r| r.requests.is_none() || r.limits.is_none())
    {
        problems.push("csi-snapshotter has no requests and limits".into());
    }

    // Every binding of the rendering must bind the pod's account (the
    // problems rbac::grants reports otherwise), and the Lease of
    // --leader-election is granted in the pod's namespace.
    let account = spec.service_account_name.clone().expect("service account");
    let (granted, rbac_problems) = rbac::grants(&objects, &namespace, &account);
    problems.extend(rbac_problems);
    let snapshot_group = "snapshot.storage.k8s.io";
    let mut needed = vec![
        (rbac::Scope::Cluster, "", "events", "create"),
        (rbac::Scope::Cluster, "", "events", "patch"),
    ];
    for verb in ["get", "list", "watch"] {
        needed.push((
            rbac::Scope::Cluster,
            snapshot_group,
            "volumesnapshotclasses",
            verb,
        ));
    }
    for verb in ["create", "get", "list", "watch", "update", "patch"] {
        needed.push((
            rbac::Scope::Cluster,
            snapshot_group,
            "volumesnapshotcontents",
            verb,
        ));
    }
    for verb in ["update", "patch"] {
        needed.push((
            rbac::Scope::Cluster,
            snapshot_group,
            "volumesnapshotcontents/status",
            verb,
        ));
    }
    for verb in ["get", "create", "update"] {
        needed.push((
            rbac::Scope::OwnNamespace,
            "coordination.k8s.io",
            "leases",
            verb,
        ));
    }
    for (scope, group, resource, verb) in needed {
        let grant = rbac::Grant {
            scope,
            group: group.into(),
            resource: resource.into(),
            verb: verb.into(),
        };
        if !granted.contains(&grant) {
            problems.push(format!("{namespace}/{account} lacks {grant}"));
        }
    }

    let driver_name = render::the::<CSIDriver>(&objects, "CSIDriver")
        .metadata
        .name
        .expect("CSIDriver name");
    let class = objects
        .iter()
        .find(|o| render::kind(o) == "VolumeSnapshotClass")
        .expect("a VolumeSnapshotClass");
    if class["apiVersion"] != "snapshot.storage.k8s.io/v1"
        || class["driver"] != driver_name.as_str()
        || class["deletionPolicy"] != "Delete"
    {
        problems.push(format!("VolumeSnapshotClass: {class}"));
    }
    fail_if_any("deploy/kubernetes/snapshotter on the base", &problems);
}
