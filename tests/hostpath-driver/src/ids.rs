//! Volume id formats on the wire. Records always hold the driver's own id
//! (a UUID); what the CO sees can take another driver's form, so that this
//! driver stands in for it where the form matters: under CSI migration the
//! GCE PD translation reads the disk name out of a handle
//! `projects/<project>/zones/<zone>/disks/<name>` and, for an in-tree PV,
//! writes it back as `projects/UNSPECIFIED/zones/<zone>/disks/<name>`.
//!
//! Every request passes [`VolumeIds::map_volume_ids`] with
//! [`VolumeIdFormat::internal`] before its handler, every response with
//! [`VolumeIdFormat::external`] after it, so the handlers know one form.

use csi_proto::v1 as csi;

/// How volume ids look on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VolumeIdFormat {
    /// The record's id as is.
    #[default]
    Plain,
    /// `projects/csi-hostpath/zones/<node id>/disks/<id>`, as the GCE PD
    /// driver's handles; any project, zone or region is accepted back.
    GcePd,
    /// `<id>~xxx…`, [`LONG_ID_BYTES`] bytes in all: twice the 128 bytes
    /// the CSI spec's "Size Limits" ask a plugin to stay within, for a CO
    /// that must not cut or reject a longer id.
    Long,
}

/// The length of an id in the [`VolumeIdFormat::Long`] form.
pub const LONG_ID_BYTES: usize = 256;

/// The project in the handles this driver hands out (GCE form).
const PROJECT: &str = "csi-hostpath";

impl VolumeIdFormat {
    /// Parses `plain` or `gce-pd`.
    pub fn parse(value: &str) -> Result<VolumeIdFormat, String> {
        match value {
            "plain" => Ok(VolumeIdFormat::Plain),
            "gce-pd" => Ok(VolumeIdFormat::GcePd),
            "long" => Ok(VolumeIdFormat::Long),
            other => Err(format!("{other:?} is not one of plain, gce-pd, long")),
        }
    }

    /// The spelling [`VolumeIdFormat::parse`] reads.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeIdFormat::Plain => "plain",
            VolumeIdFormat::GcePd => "gce-pd",
            VolumeIdFormat::Long => "long",
        }
    }

    /// The wire form of the record id `id`; `zone` is this driver's node id
    /// (its topology segment).
    pub fn external(self, id: &str, zone: &str) -> String {
        match self {
            VolumeIdFormat::GcePd if !id.is_empty() => {
                format!("projects/{PROJECT}/zones/{zone}/disks/{id}")
            }
            VolumeIdFormat::Long if !id.is_empty() => {
                let padding = LONG_ID_BYTES.saturating_sub(id.len() + 1);
                format!("{id}~{}", "x".repeat(padding))
            }
            _ => id.to_owned(),
        }
    }

    /// The record id a wire id names. A malformed GCE handle is kept as
    /// given: it names no record, which the handler reports as for any
    /// unknown id.
    pub fn internal(self, id: &str) -> String {
        match self {
            VolumeIdFormat::Plain => id.to_owned(),
            VolumeIdFormat::GcePd => match id.split('/').collect::<Vec<_>>()[..] {
                [
                    "projects",
                    project,
                    "zones" | "regions",
                    location,
                    "disks",
                    name,
                ] if !project.is_empty() && !location.is_empty() && !name.is_empty() => {
                    name.to_owned()
                }
                _ => id.to_owned(),
            },
            VolumeIdFormat::Long => id.split_once('~').map_or(id, |(id, _)| id).to_owned(),
        }
    }
}

/// A CSI message that carries volume ids.
pub(crate) trait VolumeIds {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String);

    /// Alters the answer as a `reply` fault says (most answers have nothing
    /// a fault alters).
    fn tamper(&mut self, _reply: &crate::faults::Reply) {}
}

fn map_id(id: &mut String, map: &dyn Fn(&str) -> String) {
    if !id.is_empty() {
        *id = map(id);
    }
}

fn map_source(source: &mut Option<csi::VolumeContentSource>, map: &dyn Fn(&str) -> String) {
    if let Some(csi::volume_content_source::Type::Volume(v)) =
        source.as_mut().and_then(|s| s.r#type.as_mut())
    {
        map_id(&mut v.volume_id, map);
    }
}

fn map_volume(volume: &mut Option<csi::Volume>, map: &dyn Fn(&str) -> String) {
    if let Some(v) = volume.as_mut() {
        map_id(&mut v.volume_id, map);
        map_source(&mut v.content_source, map);
    }
}

fn map_snapshot(snapshot: &mut Option<csi::Snapshot>, map: &dyn Fn(&str) -> String) {
    if let Some(s) = snapshot.as_mut() {
        map_id(&mut s.source_volume_id, map);
    }
}

/// Messages whose `volume_id` field is their only id.
macro_rules! volume_id_field {
    ($($t:ty),+ $(,)?) => {$(
        impl VolumeIds for $t {
            fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
                map_id(&mut self.volume_id, map);
            }
        }
    )+};
}

/// Messages without volume ids.
macro_rules! no_volume_ids {
    ($($t:ty),+ $(,)?) => {$(
        impl VolumeIds for $t {
            fn map_volume_ids(&mut self, _: &dyn Fn(&str) -> String) {}
        }
    )+};
}

volume_id_field!(
    csi::DeleteVolumeRequest,
    csi::ControllerPublishVolumeRequest,
    csi::ControllerUnpublishVolumeRequest,
    csi::ValidateVolumeCapabilitiesRequest,
    csi::ControllerExpandVolumeRequest,
    csi::ControllerGetVolumeRequest,
    csi::ControllerModifyVolumeRequest,
    csi::NodeStageVolumeRequest,
    csi::NodeUnstageVolumeRequest,
    csi::NodePublishVolumeRequest,
    csi::NodeUnpublishVolumeRequest,
    csi::NodeGetVolumeStatsRequest,
    csi::NodeExpandVolumeRequest,
);

no_volume_ids!(
    csi::DeleteVolumeResponse,
    csi::ControllerPublishVolumeResponse,
    csi::ControllerUnpublishVolumeResponse,
    csi::ValidateVolumeCapabilitiesResponse,
    csi::ListVolumesRequest,
    csi::GetCapacityRequest,
    csi::GetCapacityResponse,
    csi::ControllerGetCapabilitiesRequest,
    csi::DeleteSnapshotRequest,
    csi::DeleteSnapshotResponse,
    csi::GetSnapshotRequest,
    csi::ControllerExpandVolumeResponse,
    csi::ControllerModifyVolumeResponse,
    csi::NodeStageVolumeResponse,
    csi::NodeUnstageVolumeResponse,
    csi::NodePublishVolumeResponse,
    csi::NodeUnpublishVolumeResponse,
    csi::NodeGetVolumeStatsResponse,
    csi::NodeExpandVolumeResponse,
    csi::NodeGetCapabilitiesRequest,
    csi::NodeGetCapabilitiesResponse,
    csi::NodeGetInfoRequest,
    csi::NodeGetInfoResponse,
    csi::GetPluginInfoRequest,
    csi::GetPluginInfoResponse,
    csi::GetPluginCapabilitiesRequest,
    csi::ProbeRequest,
    csi::ProbeResponse,
);

impl VolumeIds for csi::CreateVolumeRequest {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_source(&mut self.volume_content_source, map);
    }
}

impl VolumeIds for csi::CreateVolumeResponse {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_volume(&mut self.volume, map);
    }

    fn tamper(&mut self, reply: &crate::faults::Reply) {
        let Some(volume) = self.volume.as_mut() else {
            return;
        };
        if let Some(id) = &reply.volume_id {
            volume.volume_id = id.clone();
        }
        if let Some(bytes) = reply.capacity_bytes {
            volume.capacity_bytes = bytes;
        }
        if let Some(topology) = &reply.accessible_topology {
            volume.accessible_topology = topology
                .iter()
                .map(|segments| csi::Topology {
                    segments: segments.clone().into_iter().collect(),
                })
                .collect();
        }
        if reply.padding_bytes > 0 {
            volume
                .volume_context
                .insert("padding".to_owned(), "x".repeat(reply.padding_bytes));
        }
    }
}

impl VolumeIds for csi::ListVolumesResponse {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        for entry in &mut self.entries {
            map_volume(&mut entry.volume, map);
        }
    }
}

impl VolumeIds for csi::ControllerGetVolumeResponse {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_volume(&mut self.volume, map);
    }
}

impl VolumeIds for csi::CreateSnapshotRequest {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_id(&mut self.source_volume_id, map);
    }
}

impl VolumeIds for csi::CreateSnapshotResponse {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_snapshot(&mut self.snapshot, map);
    }
}

impl VolumeIds for csi::ListSnapshotsRequest {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_id(&mut self.source_volume_id, map);
    }
}

impl VolumeIds for csi::ListSnapshotsResponse {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        for entry in &mut self.entries {
            map_snapshot(&mut entry.snapshot, map);
        }
    }
}

impl VolumeIds for csi::GetSnapshotResponse {
    fn map_volume_ids(&mut self, map: &dyn Fn(&str) -> String) {
        map_snapshot(&mut self.snapshot, map);
    }
}

impl VolumeIds for csi::ControllerGetCapabilitiesResponse {
    fn map_volume_ids(&mut self, _: &dyn Fn(&str) -> String) {}

    fn tamper(&mut self, reply: &crate::faults::Reply) {
        use csi::controller_service_capability::{Rpc, Type};
        if let Some(value) = reply.extra_capability {
            self.capabilities.push(csi::ControllerServiceCapability {
                r#type: Some(Type::Rpc(Rpc { r#type: value })),
            });
        }
    }
}

impl VolumeIds for csi::GetPluginCapabilitiesResponse {
    fn map_volume_ids(&mut self, _: &dyn Fn(&str) -> String) {}

    fn tamper(&mut self, reply: &crate::faults::Reply) {
        use csi::plugin_capability::{Service, Type};
        if let Some(value) = reply.extra_capability {
            self.capabilities.push(csi::PluginCapability {
                r#type: Some(Type::Service(Service { r#type: value })),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gce_handles_round_trip_and_accept_any_project_and_location() {
        let gce = VolumeIdFormat::GcePd;
        let wire = gce.external("3f2a", "us-central1-a");
        assert_eq!(wire, "projects/csi-hostpath/zones/us-central1-a/disks/3f2a");
        for (given, record) in [
            (wire.as_str(), "3f2a"),
            // What the translation writes back for an in-tree PV.
            ("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/3f2a", "3f2a"),
            ("projects/p/regions/us-central1/disks/3f2a", "3f2a"),
            // Not a handle: kept, so it names no record.
            ("3f2a", "3f2a"),
            (
                "projects//zones/z/disks/3f2a",
                "projects//zones/z/disks/3f2a",
            ),
            ("projects/p/zones/z/disks/", "projects/p/zones/z/disks/"),
            (
                "projects/p/zones/z/disks/a/b",
                "projects/p/zones/z/disks/a/b",
            ),
        ] {
            assert_eq!(gce.internal(given), record, "{given}");
        }
        // An empty id stays empty: the handler's own check reports it.
        assert_eq!(gce.external("", "z"), "");
    }

    #[test]
    fn long_ids_are_256_bytes_and_round_trip() {
        let long = VolumeIdFormat::Long;
        let wire = long.external("3f2a", "z");
        assert_eq!(wire.len(), LONG_ID_BYTES);
        assert!(wire.starts_with("3f2a~x"));
        assert_eq!(long.internal(&wire), "3f2a");
        // An id without the padding names its record as is.
        assert_eq!(long.internal("3f2a"), "3f2a");
        assert_eq!(long.external("", "z"), "");
        assert_eq!(VolumeIdFormat::parse("long"), Ok(long));
        assert_eq!(long.as_str(), "long");
    }

    #[test]
    fn plain_ids_are_untouched() {
        let plain = VolumeIdFormat::Plain;
        assert_eq!(plain.external("3f2a", "z"), "3f2a");
        assert_eq!(
            plain.internal("projects/p/zones/z/disks/3f2a"),
            "projects/p/zones/z/disks/3f2a"
        );
        assert_eq!(VolumeIdFormat::parse("gce-pd"), Ok(VolumeIdFormat::GcePd));
        assert_eq!(VolumeIdFormat::parse("plain"), Ok(VolumeIdFormat::Plain));
        assert!(VolumeIdFormat::parse("gce").is_err());
    }

    #[test]
    fn messages_map_every_volume_id_and_leave_empty_ones() {
        let mut response = csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                volume_id: "a".to_owned(),
                content_source: Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Volume(
                        csi::volume_content_source::VolumeSource {
                            volume_id: "b".to_owned(),
                        },
                    )),
                }),
                ..csi::Volume::default()
            }),
        };
        response.map_volume_ids(&|id| format!("x/{id}"));
        let volume = response.volume.expect("volume");
        assert_eq!(volume.volume_id, "x/a");
        assert!(matches!(
            volume.content_source.and_then(|s| s.r#type),
            Some(csi::volume_content_source::Type::Volume(v)) if v.volume_id == "x/b"
        ));
        let mut delete = csi::DeleteVolumeRequest::default();
        delete.map_volume_ids(&|id| format!("x/{id}"));
        assert_eq!(delete.volume_id, "");
    }
}
