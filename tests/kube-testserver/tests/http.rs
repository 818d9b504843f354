//! HTTP mode: kube client over TCP, the generated kubeconfig, kubectl, and
//! the `kube-testserver` binary.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_testserver::TestServer;
use serde_json::json;

fn kubectl_available() -> bool {
    let ok = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIPPED: kubectl is not installed");
    }
    ok
}

fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig").arg(kubeconfig).args(args);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn kubectl");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_client_over_http_and_kubeconfig() {
    let s = TestServer::new();
    let http = s.serve_http().await.unwrap();
    assert!(http.url().starts_with("http://127.0.0.1:"));
    // The kubeconfig is readable by kube-rs and points at the listener.
    let kc = Kubeconfig::read_from(http.kubeconfig_path()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(
        cfg.cluster_url.to_string().trim_end_matches('/'),
        http.url()
    );
    assert_eq!(cfg.default_namespace, "default");

    let client = http.client().unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "a"}})).unwrap(),
    )
    .await
    .unwrap();
    // Same state as the in-process client.
    assert!(s.get::<ConfigMap>("default", "a").is_some());
    // Watch over HTTP.
    let stream = api
        .watch(&kube::api::WatchParams::default().timeout(5), "0")
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    use futures_util::StreamExt;
    match stream.next().await.unwrap().unwrap() {
        kube::api::WatchEvent::Added(c) => assert_eq!(c.metadata.name.as_deref(), Some("a")),
        other => panic!("{other:?}"),
    }
    // A partition closes connections.
    s.set_partitioned(true);
    assert!(api.list(&ListParams::default()).await.is_err());
    s.set_partitioned(false);
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    let dir = http.kubeconfig_path().parent().unwrap().to_path_buf();
    drop(http);
    assert!(!dir.exists(), "temporary kubeconfig removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_create_patch_label_annotate_delete() {
    if !kubectl_available() {
        return;
    }
    let s = TestServer::new();
    let http = s.serve_http().await.unwrap();
    let kc = http.kubeconfig_path().to_path_buf();
    let pv = "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv1\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  csi: {driver: d, volumeHandle: h}\n";
    let run = move |args: Vec<String>, stdin: Option<String>| {
        let kc = kc.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                kubectl(&kc, &a, stdin.as_deref())
            })
            .await
            .unwrap()
        }
    };
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let (ok, out) = run(v(&["get", "pv"]), None).await;
    assert!(ok, "{out}");
    assert!(out.contains("No resources found"), "{out}");
    let (ok, out) = run(v(&["create", "-f", "-"]), Some(pv.to_string())).await;
    assert!(ok, "{out}");
    assert!(out.contains("persistentvolume/pv1 created"), "{out}");
    let (ok, out) = run(v(&["get", "pv"]), None).await;
    assert!(ok && out.contains("pv1"), "{out}");
    let (ok, out) = run(
        v(&[
            "patch",
            "pv",
            "pv1",
            "--type=merge",
            "-p",
            r#"{"spec":{"storageClassName":"fast"}}"#,
        ]),
        None,
    )
    .await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["label", "pv", "pv1", "team=storage"]), None).await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["annotate", "pv", "pv1", "note=hello"]), None).await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["get", "pv", "-l", "team=storage", "-o", "name"]), None).await;
    assert!(ok && out.trim() == "persistentvolume/pv1", "{out}");
    let got = s.get::<PersistentVolume>("", "pv1").unwrap();
    assert_eq!(
        got.spec.unwrap().storage_class_name.as_deref(),
        Some("fast")
    );
    assert_eq!(got.metadata.labels.unwrap()["team"], "storage");
    assert_eq!(got.metadata.annotations.unwrap()["note"], "hello");
    let (ok, out) = run(
        v(&["get", "pv", "pv1", "-o", "jsonpath={.metadata.name}"]),
        None,
    )
    .await;
    assert!(ok && out == "pv1", "{out}");
    // delete waits for the object to be gone by watching it.
    let (ok, out) = run(v(&["delete", "pv", "pv1", "--timeout=20s"]), None).await;
    assert!(ok, "{out}");
    assert!(s.get::<PersistentVolume>("", "pv1").is_none());
    let (ok, out) = run(v(&["get", "pv", "pv1"]), None).await;
    assert!(!ok && out.contains("NotFound"), "{out}");
    // Namespaced resources, short names and custom resources.
    // Typed generators (`kubectl create configmap ...`) send protobuf, which
    // is refused with 415; manifests are sent as JSON.
    let (ok, out) = run(
        v(&["create", "configmap", "c0", "--from-literal=a=b"]),
        None,
    )
    .await;
    assert!(!ok && out.contains("protobuf"), "{out}");
    let c1 = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c1, namespace: kube-system}\ndata: {a: b}\n";
    let (ok, out) = run(v(&["create", "-f", "-"]), Some(c1.to_string())).await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["get", "cm", "-A"]), None).await;
    assert!(
        ok && out.contains("kube-system") && out.contains("c1"),
        "{out}"
    );
    let vsc = "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshotClass\nmetadata:\n  name: snap\ndriver: d\ndeletionPolicy: Delete\n";
    let (ok, out) = run(v(&["create", "-f", "-"]), Some(vsc.to_string())).await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["label", "vsclass", "snap", "x=y"]), None).await;
    assert!(ok, "{out}");
    let (ok, out) = run(v(&["get", "volumesnapshotclasses", "--show-labels"]), None).await;
    assert!(ok && out.contains("x=y"), "{out}");
}

#[test]
fn binary_serves_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kc");
    let objects = dir.path().join("objects.yaml");
    std::fs::write(
        &objects,
        "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: loaded}\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  csi: {driver: d, volumeHandle: h}\nstatus: {phase: Released}\n---\napiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: fromlist, namespace: kube-system}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-testserver"))
        .args(["--port", "0", "--gc=true", "--kubeconfig-out"])
        .arg(&kubeconfig)
        .arg("--load")
        .arg(&objects)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .strip_prefix("listening on ")
        .expect(&first)
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{first}");
    let second = lines.next().unwrap().unwrap();
    assert!(second.contains(kubeconfig.to_str().unwrap()), "{second}");
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(text.contains(&url), "{text}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        let pvs: Api<PersistentVolume> = Api::all(client.clone());
        let loaded = pvs.get("loaded").await.unwrap();
        assert_eq!(
            loaded.status.unwrap().phase.as_deref(),
            Some("Released"),
            "status kept from the file"
        );
        let cms: Api<ConfigMap> = Api::namespaced(client, "kube-system");
        assert!(cms.get("fromlist").await.is_ok());
    });
    // SIGTERM ends it cleanly.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
