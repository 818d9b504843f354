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
    Ok(config)
}

/// Builds the process's client: kube's default stack (auth, TLS, timeouts)
/// with the client-side rate limits of `--kube-api-qps` / `--kube-api-burst`
/// (and the capacity pair) in front, so every request of every loop shares
/// one budget as with client-go's rest config. Needs a Tokio runtime.
pub fn build_client(
    config: kube::Config,
    limits: crate::ratelimit::Limits,
) -> Result<kube::Client, ClientConfigError> {
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&crate::ratelimit::RateLimitLayer::new(limits))
        .build())
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
