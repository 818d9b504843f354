//! CSI endpoints are unix sockets. This module parses the address spellings
//! the Kubernetes sidecars accept and builds tonic channels and servers on
//! top of a tokio `UnixStream`.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Uri};

/// A CSI address that is not a unix socket path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    #[error("CSI address is empty")]
    Empty,
    #[error(
        "CSI address {0:?} is not a unix socket: use /path/to/socket, unix:/path or unix:///path"
    )]
    NotUnix(String),
    #[error("CSI address {0:?} must name an absolute socket path")]
    Relative(String),
}

/// Accepts `/path`, `unix:/path`, `unix://path` (a host-less form some tools
/// write) and `unix:///path`; returns the socket path.
pub fn parse_unix_address(address: &str) -> Result<PathBuf, AddressError> {
    let address = address.trim();
    if address.is_empty() {
        return Err(AddressError::Empty);
    }
    let path = if let Some(rest) = address.strip_prefix("unix://") {
        // `unix:///abs` leaves `/abs`; `unix://abs` (non-standard) leaves `abs`.
        rest
    } else if let Some(rest) = address.strip_prefix("unix:") {
        rest
    } else if address.contains("://") {
        return Err(AddressError::NotUnix(address.to_owned()));
    } else {
        address
    };
    if path.is_empty() {
        return Err(AddressError::Empty);
    }
    if !path.starts_with('/') {
        return Err(AddressError::Relative(address.to_owned()));
    }
    Ok(PathBuf::from(path))
}

/// The largest header list (metadata, and a status's `grpc-message`) a
/// channel accepts: grpc-go's default (16 MiB), which the Go sidecars and
/// drivers live with. HTTP/2's default, 16 KiB, made an error whose
/// message is longer (a driver quoting a command's output) a protocol
/// error, `Internal` and final, whatever code the driver sent.
pub const MAX_HEADER_LIST_SIZE: u32 = 16 << 20;

/// A channel whose connections are made to `socket`. Nothing is dialled until
/// the first call, and a broken connection is re-dialled on the next call, so
/// a driver restart does not need a new channel.
pub fn lazy_unix_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    // The URI is required by tonic but never resolved: the connector below
    // ignores it and dials the socket.
    Endpoint::from_static("http://csi.local")
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
}

/// Connects to `socket` now; fails when nothing listens there.
pub async fn connect_unix(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let socket = socket.to_path_buf();
    Endpoint::from_static("http://csi.local")
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
}

/// Binds a unix listener at `socket` for a tonic server, removing a stale
/// socket file left by a previous run (a live listener is not affected: the
/// bind would fail only for a non-socket file, which is reported).
pub fn bind_unix(socket: &Path) -> std::io::Result<UnixListenerStream> {
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        use std::os::unix::fs::FileTypeExt;
        if meta.file_type().is_socket() {
            std::fs::remove_file(socket)?;
        }
    }
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    Ok(UnixListenerStream::new(UnixListener::bind(socket)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_spellings() {
        for (input, want) in [
            ("/run/csi/socket", "/run/csi/socket"),
            ("unix:/run/csi/socket", "/run/csi/socket"),
            ("unix:///run/csi/socket", "/run/csi/socket"),
            ("  unix:///csi/csi.sock ", "/csi/csi.sock"),
        ] {
            assert_eq!(
                parse_unix_address(input),
                Ok(PathBuf::from(want)),
                "{input}"
            );
        }
    }

    #[test]
    fn rejected_spellings() {
        assert_eq!(parse_unix_address(""), Err(AddressError::Empty));
        assert_eq!(parse_unix_address("unix://"), Err(AddressError::Empty));
        assert_eq!(parse_unix_address("unix:"), Err(AddressError::Empty));
        assert!(matches!(
            parse_unix_address("tcp://127.0.0.1:10000"),
            Err(AddressError::NotUnix(_))
        ));
        assert!(matches!(
            parse_unix_address("csi.sock"),
            Err(AddressError::Relative(_))
        ));
        assert!(matches!(
            parse_unix_address("unix://csi.sock"),
            Err(AddressError::Relative(_))
        ));
    }
}
