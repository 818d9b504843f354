//! CSI requests the tests send to a driver themselves (not through the
//! sidecar). Also a module of `tests/csi_client.rs`, which has no
//! `support` of its own.

use csi_proto::v1::{CapacityRange, CreateVolumeRequest, VolumeCapability, volume_capability};

/// `CreateVolume` of a single-node-writer filesystem volume of `bytes`.
pub fn mount_volume(name: &str, bytes: i64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.to_owned(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume::default(),
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }],
        ..CreateVolumeRequest::default()
    }
}
