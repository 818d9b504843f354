//! Registration with the kubelet's plugin registry (src/registration.rs),
//! seen from the kubelet's side: a client on the registration socket calls
//! `GetInfo` and `NotifyRegistrationStatus` as the kubelet's plugin watcher
//! does.

mod common;

use std::path::{Path, PathBuf};

use csi_hostpath::registration::v1::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use csi_hostpath::{Config, InProcess, NodeRegistration};
use tonic::transport::Channel;

fn config_with_registration(dir: &Path) -> Config {
    let mut config = Config::for_tests(dir);
    config.driver_name = "reg.hostpath.csi.k8s.io".to_owned();
    config.registration = Some(NodeRegistration {
        kubelet_registration_path: PathBuf::from(
            "/var/lib/kubelet/plugins/reg.hostpath.csi.k8s.io/csi.sock",
        ),
        plugin_registration_path: dir.join("plugins_registry"),
    });
    config
}

fn registration_socket(dir: &Path) -> PathBuf {
    dir.join("plugins_registry")
        .join("reg.hostpath.csi.k8s.io-reg.sock")
}

/// The driver with registration on, and a client on its registration
/// socket, as the kubelet's plugin watcher connects.
async fn start_registered(dir: &Path) -> (Config, InProcess, RegistrationClient<Channel>) {
    let config = config_with_registration(dir);
    let driver = InProcess::spawn(config.clone());
    let client = RegistrationClient::new(common::connect(&registration_socket(dir)).await);
    (config, driver, client)
}

#[tokio::test]
async fn get_info_names_the_csi_endpoint_and_the_socket_goes_at_shutdown() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, driver, mut client) = start_registered(dir.path()).await;
    let socket = registration_socket(dir.path());
    assert!(
        config.endpoint.exists(),
        "the CSI socket is up before the registration socket"
    );

    let info = client
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo")
        .into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "reg.hostpath.csi.k8s.io");
    assert_eq!(
        info.endpoint, "/var/lib/kubelet/plugins/reg.hostpath.csi.k8s.io/csi.sock",
        "the endpoint as the kubelet sees it, not --endpoint"
    );
    assert_eq!(info.supported_versions, ["1.0.0"]);

    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        })
        .await
        .expect("NotifyRegistrationStatus");
    // Still serving after a successful registration.
    client
        .get_info(InfoRequest {})
        .await
        .expect("GetInfo again");

    drop(client);
    driver.stop().await.expect("clean stop");
    assert!(
        !socket.exists(),
        "the registration socket is removed (the kubelet deregisters)"
    );
    assert!(!config.endpoint.exists(), "the CSI socket is removed");
}

#[tokio::test]
async fn a_refused_registration_ends_the_driver_with_the_kubelets_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, driver, mut client) = start_registered(dir.path()).await;
    let socket = registration_socket(dir.path());
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "no version of the plugin is supported".to_owned(),
        })
        .await
        .expect("NotifyRegistrationStatus is answered");
    drop(client);
    match driver.stop().await {
        Err(csi_hostpath::Error::RegistrationRefused(reason)) => {
            assert_eq!(reason, "no version of the plugin is supported");
        }
        other => panic!("want RegistrationRefused, got {other:?}"),
    }
    assert!(!socket.exists());
    assert!(!config.endpoint.exists());
}

#[tokio::test]
async fn without_registration_no_socket_is_made() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = Config::for_tests(dir.path());
    let driver = InProcess::spawn(config.clone());
    let _channel = common::connect(&config.endpoint).await;
    assert!(!dir.path().join("plugins_registry").exists());
    driver.stop().await.expect("clean stop");
}
