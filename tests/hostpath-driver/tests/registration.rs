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

/// How a raw HTTP/2 call ended.
#[derive(Debug, PartialEq)]
enum RawOutcome {
    /// The response's DATA (the gRPC message, unframed) and `grpc-status`.
    Answered {
        message: Vec<u8>,
        grpc_status: String,
    },
    /// RST_STREAM with this error code.
    Reset(u32),
}

/// One unary gRPC call written as raw HTTP/2 frames, with the `:authority`
/// the kubelet's plugin watcher sends (the socket's path, URL-escaped):
/// h2's client refuses to send it at all.
async fn raw_call(socket: &Path, path: &str, message: &[u8]) -> RawOutcome {
    use csi_hostpath::authority::encode_integer;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = u32::try_from(payload.len()).expect("small").to_be_bytes();
        let mut out = len[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }
    let authority = socket.display().to_string().replace('/', "%2F");
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority.as_str()),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0);
        encode_integer(name.len(), 7, 0, &mut block);
        block.extend(name.as_bytes());
        encode_integer(value.len(), 7, 0, &mut block);
        block.extend(value.as_bytes());
    }
    let mut grpc = vec![0];
    grpc.extend(u32::try_from(message.len()).expect("small").to_be_bytes());
    grpc.extend(message);
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &grpc));
    let mut conn = tokio::net::UnixStream::connect(socket)
        .await
        .expect("connect");
    conn.write_all(&out).await.expect("request written");

    let mut decoder = loona_hpack::Decoder::new();
    let mut data = Vec::new();
    let deadline = std::time::Duration::from_secs(10);
    loop {
        let mut header = [0u8; 9];
        tokio::time::timeout(deadline, conn.read_exact(&mut header))
            .await
            .expect("a frame within 10 s")
            .expect("the connection stays open until the call ends");
        let len =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
        let mut payload = vec![0; len];
        conn.read_exact(&mut payload).await.expect("payload");
        match (kind, stream) {
            (0x4, 0) if flags & 1 == 0 => {
                conn.write_all(&frame(0x4, 1, 0, &[])).await.expect("ack");
            }
            (0x0, 1) => data.extend(payload),
            (0x3, 1) => {
                return RawOutcome::Reset(u32::from_be_bytes(
                    payload[..4].try_into().expect("RST_STREAM has a code"),
                ));
            }
            (0x1, 1) => {
                let fields = decoder.decode(&payload).expect("response headers decode");
                if flags & 1 != 0 {
                    let grpc_status = fields
                        .iter()
                        .find(|(n, _)| n == b"grpc-status")
                        .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
                        .expect("grpc-status in the trailers");
                    let message = data.get(5..).unwrap_or_default().to_vec();
                    return RawOutcome::Answered {
                        message,
                        grpc_status,
                    };
                }
            }
            (0x7, _) => panic!("GOAWAY: {payload:02x?}"),
            _ => {}
        }
    }
}

/// The kubelet 1.36's plugin watcher names the registration socket's
/// escaped path as `:authority`: through the driver's rewrite
/// (src/authority.rs) its `GetInfo` is answered, while the same request on
/// the CSI socket (tonic without the rewrite) is reset with
/// PROTOCOL_ERROR, as the registration socket's was before.
#[tokio::test]
async fn the_kubelets_escaped_authority_is_answered() {
    use prost::Message;
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, driver, _client) = start_registered(dir.path()).await;
    let socket = registration_socket(dir.path());

    let outcome = raw_call(&socket, "/pluginregistration.Registration/GetInfo", &[]).await;
    let RawOutcome::Answered {
        message,
        grpc_status,
    } = outcome
    else {
        panic!("GetInfo through the rewrite: {outcome:?}");
    };
    assert_eq!(grpc_status, "0");
    let info = csi_hostpath::registration::v1::PluginInfo::decode(message.as_slice())
        .expect("a PluginInfo");
    assert_eq!(info.name, "reg.hostpath.csi.k8s.io");
    assert_eq!(info.r#type, "CSIPlugin");

    const PROTOCOL_ERROR: u32 = 1;
    assert_eq!(
        raw_call(&config.endpoint, "/csi.v1.Identity/GetPluginInfo", &[]).await,
        RawOutcome::Reset(PROTOCOL_ERROR),
        "tonic without the rewrite refuses the escaped authority"
    );
    driver.stop().await.expect("clean stop");
}
