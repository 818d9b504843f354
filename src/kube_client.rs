//! Where the Kubernetes API is, resolved as the upstream sidecar resolves it:
//! a set `KUBECONFIG` environment variable wins (an upstream quirk we keep so
//! existing deployments behave the same), then `--kubeconfig`, then the
//! in-cluster service account; `--master` overrides the server URL.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};

#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    #[error("cannot read kubeconfig {path}: {source}")]
    Kubeconfig {
        path: String,
        source: kube::config::KubeconfigError,
    },
    #[error(
        "cannot use the in-cluster configuration (not running in a pod? use --kubeconfig): {0}"
    )]
    InCluster(#[from] kube::config::InClusterError),
    #[error("invalid --master URL {url:?}: {reason}")]
    Master { url: String, reason: String },
    #[error("cannot build the Kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error(
        "the client certificate in {source_name} is an X.509 version {version} certificate, \
which the TLS library of this sidecar (rustls) refuses: it accepts X.509 v3 client certificates \
only (the Go sidecar accepted it). Re-issue the certificate as v3 by signing the same request \
with an extension file, for example:\n\
\x20 printf 'basicConstraints=CA:FALSE\\nkeyUsage=digitalSignature,keyEncipherment\\nextendedKeyUsage=clientAuth\\n' > client-ext.cnf\n\
\x20 openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile client-ext.cnf -out client.crt\n\
(`openssl x509 -req` without -extfile writes a version 1 certificate), then put client.crt in the kubeconfig"
    )]
    CertificateVersion { source_name: String, version: u8 },
    #[error("cannot read the client certificate in {source_name}: {reason}")]
    Certificate { source_name: String, reason: String },
}

/// Which source the configuration comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// `KUBECONFIG` (may list several files, merged as kubectl does).
    Environment(String),
    /// `--kubeconfig`.
    Flag(PathBuf),
    /// Only `--master`: that URL, no credentials.
    MasterOnly,
    InCluster,
}

/// Decides the source from the flag values and `KUBECONFIG`.
pub fn config_source(kubeconfig_flag: &str, master: &str, env: Option<&str>) -> ConfigSource {
    match env.filter(|v| !v.is_empty()) {
        Some(v) => ConfigSource::Environment(v.to_owned()),
        None if !kubeconfig_flag.is_empty() => ConfigSource::Flag(PathBuf::from(kubeconfig_flag)),
        None if !master.is_empty() => ConfigSource::MasterOnly,
        None => ConfigSource::InCluster,
    }
}

/// Loads the client configuration.
pub async fn load_config(
    kubeconfig_flag: &str,
    master: &str,
) -> Result<kube::Config, ClientConfigError> {
    let env = std::env::var("KUBECONFIG").ok();
    let source = config_source(kubeconfig_flag, master, env.as_deref());
    tracing::debug!(?source, "Kubernetes client configuration");
    let master_url = || -> Result<http::Uri, ClientConfigError> {
        master
            .parse::<http::Uri>()
            .map_err(|e| ClientConfigError::Master {
                url: master.to_owned(),
                reason: e.to_string(),
            })
    };
    let mut config = match &source {
        ConfigSource::Environment(paths) => {
            let kubeconfig = Kubeconfig::from_env()
                .map_err(|source| ClientConfigError::Kubeconfig {
                    path: paths.clone(),
                    source,
                })?
                .unwrap_or_default();
            from_kubeconfig(kubeconfig, paths).await?
        }
        ConfigSource::Flag(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| ClientConfigError::Kubeconfig {
                    path: path.display().to_string(),
                    source,
                })?;
            from_kubeconfig(kubeconfig, &path.display().to_string()).await?
        }
        ConfigSource::MasterOnly => kube::Config::new(master_url()?),
        ConfigSource::InCluster => kube::Config::incluster()?,
    };
    if !master.is_empty() {
        config.cluster_url = master_url()?;
    }
    check_client_certificate(&config)?;
    Ok(config)
}

/// Why a certificate's version could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    #[error("no PEM CERTIFICATE block")]
    NoPem,
    #[error("the PEM CERTIFICATE block is not valid base64")]
    Base64,
    #[error("not a DER X.509 certificate")]
    NotDer,
}

/// The DER bytes of the first `CERTIFICATE` block of a PEM text.
pub fn first_pem_certificate(pem: &str) -> Result<Vec<u8>, CertificateError> {
    use base64::Engine as _;
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find(BEGIN).ok_or(CertificateError::NoPem)? + BEGIN.len();
    let len = pem[start..].find(END).ok_or(CertificateError::NoPem)?;
    let body: String = pem[start..start + len]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| CertificateError::Base64)
}

/// Reads one DER header at the start of `der`: (tag, header length,
/// content length).
fn der_header(der: &[u8]) -> Option<(u8, usize, usize)> {
    let tag = *der.first()?;
    let first = *der.get(1)?;
    if first < 0x80 {
        return Some((tag, 2, usize::from(first)));
    }
    let count = usize::from(first & 0x7f);
    if count == 0 || count > 4 {
        return None;
    }
    let bytes = der.get(2..2 + count)?;
    let len = bytes
        .iter()
        .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
    Some((tag, 2 + count, len))
}

/// The X.509 version (1, 2 or 3) of a DER certificate: `version` is the
/// optional first field, `[0] EXPLICIT INTEGER`, of the to-be-signed
/// SEQUENCE inside the certificate SEQUENCE; absent means version 1.
pub fn x509_version(der: &[u8]) -> Result<u8, CertificateError> {
    const SEQUENCE: u8 = 0x30;
    const VERSION_TAG: u8 = 0xa0;
    const INTEGER: u8 = 0x02;
    let (tag, header, _) = der_header(der).ok_or(CertificateError::NotDer)?;
    if tag != SEQUENCE {
        return Err(CertificateError::NotDer);
    }
    let tbs = &der[header..];
    let (tag, header, _) = der_header(tbs).ok_or(CertificateError::NotDer)?;
    if tag != SEQUENCE {
        return Err(CertificateError::NotDer);
    }
    let fields = &tbs[header..];
    let (tag, header, _) = der_header(fields).ok_or(CertificateError::NotDer)?;
    if tag != VERSION_TAG {
        return Ok(1);
    }
    let version = &fields[header..];
    match der_header(version) {
        Some((INTEGER, header, 1)) => version
            .get(header)
            .and_then(|v| v.checked_add(1))
            .ok_or(CertificateError::NotDer),
        _ => Err(CertificateError::NotDer),
    }
}

/// Refuses, with what to do, a kubeconfig client certificate that rustls
/// cannot use: X.509 v1 (kube would otherwise fail with "invalid private
/// key: invalid peer certificate: UnsupportedCertVersion"). Certificates
/// that cannot be read are left to kube, which reports them itself.
pub fn check_client_certificate(config: &kube::Config) -> Result<(), ClientConfigError> {
    use base64::Engine as _;
    let auth = &config.auth_info;
    let (source_name, pem) = if let Some(data) = &auth.client_certificate_data {
        let pem = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|_| ClientConfigError::Certificate {
                source_name: "client-certificate-data".into(),
                reason: CertificateError::Base64.to_string(),
            })?;
        ("client-certificate-data".to_owned(), pem)
    } else if let Some(path) = &auth.client_certificate {
        match std::fs::read(path) {
            Ok(pem) => (format!("client-certificate {path}"), pem),
            // kube reads it again and names the problem.
            Err(_) => return Ok(()),
        }
    } else {
        return Ok(());
    };
    let der = match first_pem_certificate(&String::from_utf8_lossy(&pem)) {
        Ok(der) => der,
        Err(_) => return Ok(()),
    };
    match x509_version(&der) {
        Ok(version) if version < 3 => Err(ClientConfigError::CertificateVersion {
            source_name,
            version,
        }),
        _ => Ok(()),
    }
}

/// The layers [`build_client`] puts on kube's stack, outermost first: the
/// client-side rate limits of `--kube-api-qps` / `--kube-api-burst` (and
/// the capacity pair), so every request of every loop shares one budget as
/// with client-go's rest config; then the fence ([`crate::fence`]).
///
/// The fence is innermost so that a write is checked when it leaves the
/// process, after its wait for a rate-limit slot and in the limiter's
/// buffer: checked before that wait, a write admitted just before a pause
/// (SIGSTOP, a stalled node) would be sent after the wake-up, past the
/// lease. (`ServiceBuilder`'s first layer is the outermost.)
pub type Layers = tower::ServiceBuilder<
    tower::layer::util::Stack<
        crate::fence::FenceLayer,
        tower::layer::util::Stack<crate::ratelimit::RateLimitLayer, tower::layer::util::Identity>,
    >,
>;

/// See [`Layers`].
pub fn layers(limits: crate::ratelimit::Limits, fence: crate::fence::Fence) -> Layers {
    tower::ServiceBuilder::new()
        .layer(crate::ratelimit::RateLimitLayer::new(limits))
        .layer(crate::fence::FenceLayer(fence))
}

/// Builds the process's client: kube's default stack (auth, TLS, timeouts)
/// under our [`layers`]. Needs a Tokio runtime.
pub fn build_client(
    mut config: kube::Config,
    limits: crate::ratelimit::Limits,
    fence: crate::fence::Fence,
) -> Result<kube::Client, ClientConfigError> {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let agent = user_agent(
        &argv0.to_string_lossy(),
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH,
    );
    // Built from our own binary name and version: only a name that is not
    // a valid header (never, in practice) is dropped, and kube sends none.
    if let Ok(value) = http::HeaderValue::from_str(&agent) {
        config.headers.push((http::header::USER_AGENT, value));
    }
    // A proxy or an exec credential plugin: kube's own stack (its proxy
    // connectors, the expiry of an exec plugin's certificate), fenced at
    // our request layer only.
    if config.proxy_url.is_some() || config.auth_info.exec.is_some() {
        let builder = kube::client::ClientBuilder::try_from(config)?;
        return Ok(builder.with_layer(&layers(limits, fence)).build());
    }
    let service = fenced_stack(&config, fence.clone())?;
    let builder = kube::client::ClientBuilder::new(service, config.default_namespace.clone());
    Ok(builder.with_layer(&layers(limits, fence)).build())
}

/// The service under our [`layers`]: kube's requests in, boxed bodies out
/// (as kube's own `GenericService`).
type ClientStack = tower::util::BoxService<
    http::Request<kube::client::Body>,
    http::Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

/// The stack kube's `ClientBuilder::try_from` builds (TLS, the
/// connection timeouts, base URI, retries of the server's 429/503, auth,
/// extra headers; not its tracing layer), with each connection wrapped in
/// a [`crate::fence::FencedIo`]: a write checked by the fence layer but
/// handed to hyper's connection task before a pause is not written after
/// the wake-up (src/fence.rs, [`crate::fence::Fence::allows_bytes`]).
fn fenced_stack(
    config: &kube::Config,
    fence: crate::fence::Fence,
) -> Result<ClientStack, kube::Error> {
    use http_body_util::BodyExt as _;
    use kube::client::ConfigExt as _;
    use tower::ServiceExt as _;

    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(crate::fence::FencedConnector {
        inner: https,
        fence,
    });
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(client);
    Ok(service
        .map_response(|response: http::Response<hyper::body::Incoming>| {
            response.map(|body| {
                Box::new(body.map_err(tower::BoxError::from)) as Box<kube::client::DynBody>
            })
        })
        .boxed())
}

/// The User-Agent client-go sends by default (`rest.DefaultKubernetesUserAgent`):
/// `<binary>/<version> (<os>/<arch>) kubernetes/<commit>`. The API server
/// names the field manager of every write without one after the part before
/// the first `/`, so our PVs, claims and events show `csi-provisioner` in
/// `managedFields` as the Go sidecar's do, and API audit and throttling by
/// user agent see the same client.
pub fn user_agent(argv0: &str, version: &str, os: &str, arch: &str) -> String {
    let command = argv0
        .rsplit(['/', '\\'])
        .next()
        .map(|name| name.strip_suffix(".exe").unwrap_or(name))
        .filter(|name| !name.is_empty())
        .unwrap_or("unknown");
    // Go's names for the architectures a sidecar image is built for.
    let arch = match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    let version = version.split('-').next().unwrap_or(version);
    format!("{command}/v{version} ({os}/{arch}) csi-provisioner-rs")
}

async fn from_kubeconfig(
    kubeconfig: Kubeconfig,
    path: &str,
) -> Result<kube::Config, ClientConfigError> {
    kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|source| ClientConfigError::Kubeconfig {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_agent_is_client_gos_default() {
        for (argv0, version, os, arch, expected) in [
            (
                "/csi-provisioner",
                "0.1.0",
                "linux",
                "x86_64",
                "csi-provisioner/v0.1.0 (linux/amd64) csi-provisioner-rs",
            ),
            (
                "target/debug/csi-provisioner",
                "1.2.3-rc.1",
                "linux",
                "aarch64",
                "csi-provisioner/v1.2.3 (linux/arm64) csi-provisioner-rs",
            ),
            (
                "C:\\bin\\csi-provisioner.exe",
                "0.1.0",
                "windows",
                "x86_64",
                "csi-provisioner/v0.1.0 (windows/amd64) csi-provisioner-rs",
            ),
            (
                "",
                "0.1.0",
                "linux",
                "riscv64",
                "unknown/v0.1.0 (linux/riscv64) csi-provisioner-rs",
            ),
        ] {
            assert_eq!(user_agent(argv0, version, os, arch), expected, "{argv0}");
        }
    }

    #[test]
    fn source_precedence_follows_upstream() {
        assert_eq!(
            config_source("/flag", "", Some("/env")),
            ConfigSource::Environment("/env".into()),
            "KUBECONFIG wins over --kubeconfig"
        );
        assert_eq!(
            config_source("/flag", "http://m", None),
            ConfigSource::Flag("/flag".into())
        );
        assert_eq!(
            config_source("", "http://m", Some("")),
            ConfigSource::MasterOnly
        );
        assert_eq!(config_source("", "", None), ConfigSource::InCluster);
    }

    const V1: &str = include_str!("../tests/fixtures/tls/client-v1.crt");
    const V3: &str = include_str!("../tests/fixtures/tls/client-v3.crt");
    const CA: &str = include_str!("../tests/fixtures/tls/ca.crt");
    const KEY: &str = include_str!("../tests/fixtures/tls/client.key");

    #[test]
    fn certificate_versions() {
        let der = |pem: &str| first_pem_certificate(pem).expect("pem");
        assert_eq!(x509_version(&der(V1)), Ok(1));
        assert_eq!(x509_version(&der(V3)), Ok(3));
        assert_eq!(x509_version(&der(CA)), Ok(3));
        // Bad input of every kind is an error, never a panic.
        assert_eq!(first_pem_certificate(""), Err(CertificateError::NoPem));
        assert_eq!(
            first_pem_certificate(KEY),
            Err(CertificateError::NoPem),
            "a key is not a certificate"
        );
        assert_eq!(
            first_pem_certificate("-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----"),
            Err(CertificateError::Base64)
        );
        let v3 = der(V3);
        for bad in [
            &[][..],
            &[0x30][..],
            &[0x31, 0x00][..],
            &[0x30, 0x03, 0x31, 0x01, 0x00][..],
            &[0x30, 0x85, 1, 2, 3, 4, 5][..],
            &[0x30, 0x06, 0x30, 0x04, 0xa0, 0x02, 0x04, 0x00][..],
            &v3[..8],
        ] {
            assert_eq!(
                x509_version(bad),
                Err(CertificateError::NotDer),
                "{bad:02x?}"
            );
        }
        // Version 2 (a [0] with INTEGER 1).
        assert_eq!(
            x509_version(&[0x30, 0x07, 0x30, 0x05, 0xa0, 0x03, 0x02, 0x01, 0x01]),
            Ok(2)
        );
    }

    const LIMITS: crate::ratelimit::Limits = crate::ratelimit::Limits {
        qps: 5.0,
        burst: 10,
        capacity_qps: 1.0,
        capacity_burst: 5,
    };

    fn kubeconfig_with(cert: &str) -> Kubeconfig {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\n\
contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n\
users:\n- name: u\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(CA),
            b64(cert),
            b64(KEY)
        ))
        .expect("kubeconfig")
    }

    /// rustls refuses the v1 certificate with an unhelpful message; the
    /// check says what is wrong and how to fix it, and lets v3 through,
    /// which rustls accepts.
    #[tokio::test]
    async fn x509_v1_client_certificates_are_refused_with_the_fix() {
        let v1 = from_kubeconfig(kubeconfig_with(V1), "test")
            .await
            .expect("config");
        let Err(unchecked) = build_client(v1.clone(), LIMITS, crate::fence::Fence::disabled())
        else {
            panic!("rustls accepted a v1 certificate: the check is no longer needed");
        };
        assert!(
            format!("{unchecked:?}").contains("UnsupportedCertVersion"),
            "{unchecked:?}"
        );
        let err = check_client_certificate(&v1).expect_err("v1 refused");
        let text = err.to_string();
        for needle in [
            "client-certificate-data",
            "X.509 version 1",
            "v3",
            "-extfile client-ext.cnf",
            "extendedKeyUsage=clientAuth",
        ] {
            assert!(text.contains(needle), "{needle} missing: {text}");
        }

        let v3 = from_kubeconfig(kubeconfig_with(V3), "test")
            .await
            .expect("config");
        check_client_certificate(&v3).expect("v3 accepted");
        if let Err(e) = build_client(v3, LIMITS, crate::fence::Fence::disabled()) {
            panic!("rustls refuses v3: {e}");
        }

        // From a file named in the kubeconfig too.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("client.crt");
        std::fs::write(&path, V1).expect("write");
        let mut config = from_kubeconfig(kubeconfig_with(V3), "test")
            .await
            .expect("config");
        config.auth_info.client_certificate_data = None;
        config.auth_info.client_certificate = Some(path.display().to_string());
        let err = check_client_certificate(&config).expect_err("v1 file refused");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
        // No client certificate at all: nothing to check.
        let mut config = from_kubeconfig(kubeconfig_with(V3), "test")
            .await
            .expect("config");
        config.auth_info.client_certificate_data = None;
        check_client_certificate(&config).expect("token users pass");
    }

    /// A write is checked against the fence when it leaves the process,
    /// not when it starts waiting for its rate-limit slot: writes queued in
    /// the limiter when the lead ends (closed, or its deadline passed while
    /// the process was paused) are refused and none reaches the API server.
    /// Reads and the Lease's own requests still go out.
    #[tokio::test(start_paused = true)]
    async fn writes_waiting_for_a_rate_limit_slot_are_fenced_when_sent() {
        use std::sync::{Arc, Mutex};
        use std::time::Duration;

        use tokio::time::Instant;
        use tower::Service as _;

        use crate::fence::{Fence, Fenced};

        #[derive(Debug, Clone, Copy)]
        enum End {
            /// Stepped down or lost while the writes wait.
            Closed,
            /// The last renewal's deadline passes while they wait.
            Expired,
        }
        const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l";
        for end in [End::Closed, End::Expired] {
            let sent = Arc::new(Mutex::new(Vec::<String>::new()));
            let inner = {
                let sent = Arc::clone(&sent);
                tower::service_fn(move |req: http::Request<kube::client::Body>| {
                    sent.lock().unwrap_or_else(|p| p.into_inner()).push(format!(
                        "{} {}",
                        req.method(),
                        req.uri().path()
                    ));
                    async { Ok::<_, tower::BoxError>(http::Response::new(())) }
                })
            };
            let fence = Fence::closed();
            let lead = match end {
                End::Closed => Duration::from_secs(60),
                End::Expired => Duration::from_millis(500),
            };
            fence.lead_until(Instant::now() + lead);
            // One general request a second, burst 1: the first write goes
            // at once, the next ones wait 1 s, 2 s, ...
            let limits = crate::ratelimit::Limits {
                qps: 1.0,
                burst: 1,
                capacity_qps: 1.0,
                capacity_burst: 1,
            };
            let mut client = layers(limits, fence.clone()).service(inner);
            let request = |method: http::Method, uri: &str| {
                http::Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(kube::client::Body::empty())
                    .expect("request")
            };
            let mut calls = Vec::new();
            for i in 0..4 {
                let uri = format!("/api/v1/namespaces/ns/configmaps/c{i}");
                calls.push(tokio::spawn(client.call(request(http::Method::PUT, &uri))));
            }
            calls.push(tokio::spawn(client.call(request(
                http::Method::GET,
                "/api/v1/namespaces/ns/configmaps/c0",
            ))));
            calls.push(tokio::spawn(client.call(request(http::Method::PUT, LEASE))));
            tokio::time::sleep(Duration::from_millis(400)).await;
            let sent_before = sent.lock().unwrap_or_else(|p| p.into_inner()).clone();
            assert_eq!(
                sent_before,
                [
                    "PUT /api/v1/namespaces/ns/configmaps/c0",
                    &format!("PUT {LEASE}")
                ],
                "{end:?}: the burst's write and the Lease's renewal go at once"
            );
            if let End::Closed = end {
                fence.close();
            }
            let mut outcomes = Vec::new();
            for call in calls {
                outcomes.push(match call.await.expect("task") {
                    Ok(_) => "sent",
                    Err(e) if e.downcast_ref::<Fenced>().is_some() => "fenced",
                    Err(_) => "failed",
                });
            }
            assert_eq!(
                outcomes,
                ["sent", "fenced", "fenced", "fenced", "sent", "sent"],
                "{end:?}"
            );
            let sent = sent.lock().unwrap_or_else(|p| p.into_inner()).clone();
            assert_eq!(
                sent,
                [
                    "PUT /api/v1/namespaces/ns/configmaps/c0",
                    &format!("PUT {LEASE}"),
                    "GET /api/v1/namespaces/ns/configmaps/c0"
                ],
                "{end:?}: no refused write reached the server"
            );
        }
    }

    #[tokio::test]
    async fn kubeconfig_file_and_master_override() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1234\n\
contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: team\ncurrent-context: x\n\
users:\n- name: u\n  user:\n    token: t\n",
        )
        .expect("write");
        let flag = path.display().to_string();
        // The test must not depend on the caller's KUBECONFIG.
        if std::env::var_os("KUBECONFIG").is_some() {
            eprintln!("KUBECONFIG is set in the environment; checking only config_source");
            return;
        }
        let config = load_config(&flag, "").await.expect("load");
        assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:1234/");
        assert_eq!(config.default_namespace, "team");
        let config = load_config(&flag, "http://10.0.0.1:6443")
            .await
            .expect("load");
        assert_eq!(config.cluster_url.to_string(), "http://10.0.0.1:6443/");
        let err = load_config("/does/not/exist", "")
            .await
            .expect_err("missing file");
        assert!(err.to_string().contains("/does/not/exist"), "{err}");
        let err = load_config(&flag, "http://bad url")
            .await
            .expect_err("bad master");
        assert!(err.to_string().contains("--master"), "{err}");
    }
}
