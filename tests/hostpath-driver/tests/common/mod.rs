//! Shared harness: the driver served in-process on a temporary socket and
//! clients connected through `csi_proto::transport::connect_unix`.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use csi_hostpath::{Config, InProcess};
use csi_proto::v1::{
    self as csi, controller_client::ControllerClient, identity_client::IdentityClient,
    node_client::NodeClient, volume_capability,
};
use tonic::transport::Channel;

pub const GIB: i64 = 1 << 30;
pub const MIB: i64 = 1 << 20;

pub struct Server {
    pub config: Config,
    pub channel: Channel,
    driver: InProcess,
}

impl Server {
    /// Serves `config` and connects to it.
    pub async fn start(config: Config) -> Server {
        let driver = InProcess::spawn(config.clone());
        let channel = connect(&config.endpoint).await;
        Server {
            config,
            channel,
            driver,
        }
    }

    /// Serves `Config::for_tests(dir)` with `adjust` applied.
    pub async fn start_in(dir: &Path, adjust: impl FnOnce(&mut Config)) -> Server {
        let mut config = Config::for_tests(dir);
        adjust(&mut config);
        Server::start(config).await
    }

    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }

    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }

    /// Stops serving; returns what `serve` returned.
    pub async fn stop(self) -> Result<(), csi_hostpath::Error> {
        drop(self.channel);
        self.driver.stop().await
    }
}

/// Connects to a socket, waiting up to 10 s for it to appear.
pub async fn connect(socket: &Path) -> Channel {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match csi_proto::transport::connect_unix(socket).await {
            Ok(channel) => return channel,
            Err(e) if tokio::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("cannot connect to {}: {e}", socket.display()),
        }
    }
}

pub fn mount_cap(mode: volume_capability::access_mode::Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(
            volume_capability::MountVolume::default(),
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub fn block_cap(mode: volume_capability::access_mode::Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {},
        )),
        access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
    }
}

pub fn rwo() -> csi::VolumeCapability {
    mount_cap(volume_capability::access_mode::Mode::SingleNodeWriter)
}

/// A mount, single-node-writer CreateVolume request for `name` of `required` bytes.
pub fn create_req(name: &str, required: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![rwo()],
        ..Default::default()
    }
}

pub fn with_params(
    mut req: csi::CreateVolumeRequest,
    params: &[(&str, &str)],
) -> csi::CreateVolumeRequest {
    req.parameters = params
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect::<HashMap<_, _>>();
    req
}

pub async fn create(
    client: &mut ControllerClient<Channel>,
    req: csi::CreateVolumeRequest,
) -> Result<csi::Volume, tonic::Status> {
    client.create_volume(req).await.map(|r| {
        r.into_inner()
            .volume
            .expect("CreateVolumeResponse has a volume")
    })
}

pub async fn delete(client: &mut ControllerClient<Channel>, id: &str) -> Result<(), tonic::Status> {
    client
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .map(|_| ())
}

pub async fn snapshot(
    client: &mut ControllerClient<Channel>,
    name: &str,
    source: &str,
) -> Result<csi::Snapshot, tonic::Status> {
    client
        .create_snapshot(csi::CreateSnapshotRequest {
            name: name.to_owned(),
            source_volume_id: source.to_owned(),
            ..Default::default()
        })
        .await
        .map(|r| {
            r.into_inner()
                .snapshot
                .expect("CreateSnapshotResponse has a snapshot")
        })
}

pub async fn list_volume_ids(client: &mut ControllerClient<Channel>) -> Vec<String> {
    client
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries
        .into_iter()
        .map(|e| e.volume.expect("entry has a volume").volume_id)
        .collect()
}

pub fn code<T>(result: Result<T, tonic::Status>) -> tonic::Code {
    match result {
        Ok(_) => tonic::Code::Ok,
        Err(status) => status.code(),
    }
}

/// Mount points at or below `dir` in this process's mount namespace (a
/// test that published must leave none behind).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let info = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    info.lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|mp| mp.replace("\\040", " "))
        .filter(|mp| Path::new(mp).starts_with(&dir))
        .collect()
}

/// Lazily unmounts whatever is still mounted below its directory when
/// dropped, so that a failing test does not leave bind mounts on the
/// machine (and its temporary directory's removal does not reach into a
/// volume through one). Declare it after the `TempDir` so it drops first.
pub struct Unmounter(std::path::PathBuf);

impl Unmounter {
    pub fn new(dir: &Path) -> Unmounter {
        Unmounter(dir.to_path_buf())
    }
}

impl Drop for Unmounter {
    fn drop(&mut self) {
        for mount in mounts_under(&self.0).into_iter().rev() {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&mount)
                .status();
        }
        // Loop devices of block volumes a failed test left published.
        for device in loops_under(&self.0) {
            let _ = std::process::Command::new("losetup")
                .arg("-d")
                .arg(&device)
                .status();
        }
    }
}

/// `(device, backing file)` of every attached loop device.
fn attached_loops() -> Vec<(PathBuf, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            Some((
                Path::new("/dev").join(name),
                PathBuf::from(backing.trim_end()),
            ))
        })
        .collect()
}

/// The loop devices backed by `file`.
pub fn loops_backed_by(file: &Path) -> Vec<PathBuf> {
    let Ok(file) = file.canonicalize() else {
        return Vec::new();
    };
    attached_loops()
        .into_iter()
        .filter(|(_, backing)| *backing == file)
        .map(|(device, _)| device)
        .collect()
}

fn loops_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(dir) = dir.canonicalize() else {
        return Vec::new();
    };
    attached_loops()
        .into_iter()
        .filter(|(_, backing)| backing.starts_with(&dir))
        .map(|(device, _)| device)
        .collect()
}

/// Size in bytes of the block device numbered `rdev` (sysfs counts
/// 512-byte sectors).
pub fn block_device_size(rdev: u64) -> u64 {
    let path = format!(
        "/sys/dev/block/{}:{}/size",
        libc::major(rdev),
        libc::minor(rdev)
    );
    let sectors = std::fs::read_to_string(&path).expect("read the device size");
    sectors.trim().parse::<u64>().expect("a number of sectors") * 512
}
