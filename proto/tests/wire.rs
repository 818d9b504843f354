//! Wire-level checks: the compiled schema matches the CSI v1.12.0 wire table
//! (`csi-wire.tsv`, copied from the specification's facts), encoding matches
//! hand-computed protobuf bytes, and secrets never reach `Debug` output.

use std::collections::HashMap;

use csi_proto::v1::{
    CapacityRange, CreateVolumeRequest, Topology, TopologyRequirement, VolumeCapability,
    VolumeContentSource, volume_capability, volume_content_source,
};
use prost::Message;
use prost_reflect::{Cardinality, DescriptorPool, Kind};

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn full_create_volume_request() -> CreateVolumeRequest {
    let zone = Topology {
        segments: map(&[("z", "a")]),
    };
    CreateVolumeRequest {
        name: "pvc-1".into(),
        capacity_range: Some(CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 1 << 31,
        }),
        volume_capabilities: vec![VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: "ext4".into(),
                    mount_flags: vec![],
                    volume_mount_group: String::new(),
                },
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
            }),
        }],
        parameters: map(&[("type", "fast")]),
        secrets: map(&[("k", "v")]),
        volume_content_source: Some(VolumeContentSource {
            r#type: Some(volume_content_source::Type::Snapshot(
                volume_content_source::SnapshotSource {
                    snapshot_id: "s1".into(),
                },
            )),
        }),
        accessibility_requirements: Some(TopologyRequirement {
            requisite: vec![zone.clone()],
            preferred: vec![zone],
        }),
        mutable_parameters: map(&[("iops", "100")]),
    }
}

#[test]
fn create_volume_request_encodes_to_hand_computed_bytes() {
    // Every field set, maps with one entry so the byte order is fixed.
    // Tag byte = (field number << 3) | wire type (2 = length-delimited).
    #[rustfmt::skip]
    let expected: Vec<u8> = [
        // 1 name "pvc-1"
        &[0x0a, 0x05][..], b"pvc-1",
        // 2 capacity_range { 1 required_bytes 2^30, 2 limit_bytes 2^31 } as varints
        &[0x12, 0x0c, 0x08, 0x80, 0x80, 0x80, 0x80, 0x04, 0x10, 0x80, 0x80, 0x80, 0x80, 0x08],
        // 3 volume_capabilities [{ 2 mount { 1 fs_type "ext4" }, 3 access_mode { 1 mode 1 } }]
        &[0x1a, 0x0c, 0x12, 0x06, 0x0a, 0x04], b"ext4", &[0x1a, 0x02, 0x08, 0x01],
        // 4 parameters { "type": "fast" } (map entry: 1 key, 2 value)
        &[0x22, 0x0c, 0x0a, 0x04], b"type", &[0x12, 0x04], b"fast",
        // 5 secrets { "k": "v" }
        &[0x2a, 0x06, 0x0a, 0x01], b"k", &[0x12, 0x01], b"v",
        // 6 volume_content_source { 1 snapshot { 1 snapshot_id "s1" } }
        &[0x32, 0x06, 0x0a, 0x04, 0x0a, 0x02], b"s1",
        // 7 accessibility_requirements { 1 requisite [{ 1 segments {z: a} }], 2 preferred [same] }
        &[0x3a, 0x14,
          0x0a, 0x08, 0x0a, 0x06, 0x0a, 0x01], b"z", &[0x12, 0x01], b"a",
        &[0x12, 0x08, 0x0a, 0x06, 0x0a, 0x01], b"z", &[0x12, 0x01], b"a",
        // 8 mutable_parameters { "iops": "100" }
        &[0x42, 0x0b, 0x0a, 0x04], b"iops", &[0x12, 0x03], b"100",
    ]
    .concat();
    let encoded = full_create_volume_request().encode_to_vec();
    assert_eq!(encoded, expected);

    let decoded = CreateVolumeRequest::decode(expected.as_slice()).expect("decodes");
    assert_eq!(decoded, full_create_volume_request());
}

#[test]
fn debug_output_strips_secrets_but_keeps_other_fields() {
    let mut req = full_create_volume_request();
    req.secrets = map(&[("password", "hunter2-secret-value")]);
    let text = format!("{req:?}");
    assert!(!text.contains("hunter2-secret-value"), "{text}");
    assert!(!text.contains("password"), "{text}");
    assert!(text.contains("***stripped***"), "{text}");
    assert!(text.contains("pvc-1") && text.contains("fast"), "{text}");

    let del = csi_proto::v1::DeleteVolumeRequest {
        volume_id: "vol".into(),
        secrets: map(&[("token", "s3cr3t")]),
    };
    let text = format!("{del:#?}");
    assert!(!text.contains("s3cr3t") && text.contains("vol"), "{text}");
}

/// Every row of the wire table must be present in the compiled descriptor with
/// the same number, type and label, and every secret field must carry the
/// `csi_secret` option; nothing may be in the descriptor that the table lacks.
#[test]
fn compiled_schema_matches_the_wire_table() {
    let pool = DescriptorPool::decode(csi_proto::FILE_DESCRIPTOR_SET).expect("descriptor");
    let table = include_str!("../csi-wire.tsv");
    let secret_ext = pool
        .get_extension_by_name("csi.v1.csi_secret")
        .expect("csi_secret option");
    let alpha_field_ext = pool
        .get_extension_by_name("csi.v1.alpha_field")
        .expect("alpha_field option");
    let alpha_value_ext = pool
        .get_extension_by_name("csi.v1.alpha_enum_value")
        .expect("alpha_enum_value option");
    let flag = |opts: &prost_reflect::DynamicMessage, ext: &prost_reflect::ExtensionDescriptor| {
        opts.has_extension(ext) && opts.get_extension(ext).as_bool() == Some(true)
    };

    let mut fields_in_table = 0usize;
    let mut values_in_table = 0usize;
    let mut rpcs_in_table = 0usize;
    for (line_no, line) in table.lines().enumerate().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        assert_eq!(cols.len(), 6, "line {}: {line}", line_no + 1);
        let (kind, parent, name, number, ty, label) =
            (cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]);
        let full = |n: &str| {
            if parent == "-" {
                format!("csi.v1.{n}")
            } else {
                format!("csi.v1.{parent}.{n}")
            }
        };
        let labels: Vec<&str> = label.split_whitespace().collect();
        match kind {
            "service" => {
                pool.get_service_by_name(&full(name))
                    .unwrap_or_else(|| panic!("service {name} missing"));
            }
            "rpc" => {
                rpcs_in_table += 1;
                let svc = pool
                    .get_service_by_name(&format!("csi.v1.{parent}"))
                    .expect("service");
                let m = svc
                    .methods()
                    .find(|m| m.name() == name)
                    .unwrap_or_else(|| panic!("rpc {parent}.{name} missing"));
                let (req, resp) = ty.split_once(" -> ").expect("rpc type");
                assert_eq!(m.input().name(), req, "{parent}.{name} input");
                let streaming = resp.starts_with("stream ");
                assert_eq!(m.is_server_streaming(), streaming, "{parent}.{name}");
                assert_eq!(m.output().name(), resp.trim_start_matches("stream "));
            }
            "message" => {
                pool.get_message_by_name(&full(name))
                    .unwrap_or_else(|| panic!("message {} missing", full(name)));
            }
            "enum" => {
                pool.get_enum_by_name(&full(name))
                    .unwrap_or_else(|| panic!("enum {} missing", full(name)));
            }
            "enumvalue" => {
                values_in_table += 1;
                let e = pool
                    .get_enum_by_name(&format!("csi.v1.{parent}"))
                    .expect("enum");
                let v = e
                    .get_value_by_name(name)
                    .unwrap_or_else(|| panic!("{parent}.{name} missing"));
                assert_eq!(v.number().to_string(), number, "{parent}.{name}");
                assert_eq!(
                    flag(&v.options(), &alpha_value_ext),
                    labels.contains(&"alpha"),
                    "{parent}.{name} alpha marker"
                );
            }
            "oneof" => {
                let m = pool
                    .get_message_by_name(&format!("csi.v1.{parent}"))
                    .expect("message");
                assert!(
                    m.oneofs().any(|o| o.name() == name),
                    "{parent} oneof {name}"
                );
            }
            "field" => {
                fields_in_table += 1;
                let m = pool
                    .get_message_by_name(&format!("csi.v1.{parent}"))
                    .expect("message");
                let f = m
                    .get_field_by_name(name)
                    .unwrap_or_else(|| panic!("{parent}.{name} missing"));
                assert_eq!(f.number().to_string(), number, "{parent}.{name} number");
                assert_eq!(type_name(&f), ty, "{parent}.{name} type");
                let repeated = f.cardinality() == Cardinality::Repeated && !f.is_map();
                assert_eq!(repeated, labels.contains(&"repeated"), "{parent}.{name}");
                let oneof = labels.iter().find_map(|l| l.strip_prefix("oneof:"));
                assert_eq!(
                    f.containing_oneof().map(|o| o.name().to_owned()).as_deref(),
                    oneof,
                    "{parent}.{name} oneof"
                );
                assert_eq!(
                    flag(&f.options(), &secret_ext),
                    labels.contains(&"secret"),
                    "{parent}.{name} secret marker"
                );
                assert_eq!(
                    flag(&f.options(), &alpha_field_ext),
                    labels.contains(&"alpha"),
                    "{parent}.{name} alpha marker"
                );
            }
            other => panic!("line {}: unknown kind {other}", line_no + 1),
        }
    }

    // Nothing extra in the compiled package.
    let compiled_fields: usize = pool
        .all_messages()
        .filter(|m| m.package_name() == "csi.v1" && !m.is_map_entry())
        .map(|m| m.fields().len())
        .sum();
    let compiled_values: usize = pool
        .all_enums()
        .filter(|e| e.package_name() == "csi.v1")
        .map(|e| e.values().len())
        .sum();
    let compiled_rpcs: usize = pool.services().map(|s| s.methods().len()).sum();
    assert_eq!(compiled_fields, fields_in_table);
    assert_eq!(compiled_values, values_in_table);
    assert_eq!(compiled_rpcs, rpcs_in_table);
}

fn scalar_name(kind: &Kind) -> String {
    match kind {
        Kind::Double => "double".into(),
        Kind::Float => "float".into(),
        Kind::Int32 => "int32".into(),
        Kind::Int64 => "int64".into(),
        Kind::Uint32 => "uint32".into(),
        Kind::Uint64 => "uint64".into(),
        Kind::Sint32 => "sint32".into(),
        Kind::Sint64 => "sint64".into(),
        Kind::Fixed32 => "fixed32".into(),
        Kind::Fixed64 => "fixed64".into(),
        Kind::Sfixed32 => "sfixed32".into(),
        Kind::Sfixed64 => "sfixed64".into(),
        Kind::Bool => "bool".into(),
        Kind::String => "string".into(),
        Kind::Bytes => "bytes".into(),
        Kind::Message(m) => relative_name(m.full_name(), m.parent_message().is_some()),
        Kind::Enum(e) => relative_name(e.full_name(), e.parent_message().is_some()),
    }
}

/// The table names types the way the proto source spells them: nested types
/// by their short name, well-known types fully qualified.
fn relative_name(full: &str, nested: bool) -> String {
    if let Some(rest) = full.strip_prefix("csi.v1.") {
        if nested {
            return rest.rsplit('.').next().unwrap_or(rest).to_owned();
        }
        return rest.to_owned();
    }
    full.to_owned()
}

fn type_name(f: &prost_reflect::FieldDescriptor) -> String {
    if let (true, Kind::Message(entry)) = (f.is_map(), f.kind()) {
        let k = entry.map_entry_key_field().kind();
        let v = entry.map_entry_value_field().kind();
        return format!("map<{},{}>", scalar_name(&k), scalar_name(&v));
    }
    scalar_name(&f.kind())
}

/// Every request with a secret field, `{:?}` and `{:#?}`: the value and the
/// key never show.
#[test]
fn debug_of_every_request_with_secrets_is_redacted() {
    macro_rules! check {
        ($($t:ident),+ $(,)?) => {$(
            let message = csi_proto::v1::$t {
                secrets: map(&[("api-key", "v4lue-never-shown")]),
                ..Default::default()
            };
            for text in [format!("{message:?}"), format!("{message:#?}")] {
                assert!(
                    !text.contains("v4lue-never-shown") && !text.contains("api-key"),
                    "{}: {text}",
                    stringify!($t)
                );
                assert!(text.contains("***stripped***"), "{}: {text}", stringify!($t));
            }
        )+};
    }
    check!(
        ControllerExpandVolumeRequest,
        ControllerModifyVolumeRequest,
        ControllerPublishVolumeRequest,
        ControllerUnpublishVolumeRequest,
        CreateSnapshotRequest,
        CreateVolumeGroupSnapshotRequest,
        CreateVolumeRequest,
        DeleteSnapshotRequest,
        DeleteVolumeGroupSnapshotRequest,
        DeleteVolumeRequest,
        GetMetadataAllocatedRequest,
        GetMetadataDeltaRequest,
        GetSnapshotRequest,
        GetVolumeGroupSnapshotRequest,
        ListSnapshotsRequest,
        NodeExpandVolumeRequest,
        NodePublishVolumeRequest,
        NodeStageVolumeRequest,
        ValidateVolumeCapabilitiesRequest,
    );
}
