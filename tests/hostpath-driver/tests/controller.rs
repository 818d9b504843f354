//! Identity and Controller volume calls over the socket.

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use csi_hostpath::{AccessType, TOPOLOGY_KEY, backend_volumes, volume_path};
use csi_proto::v1::{
    self as csi, controller_service_capability, plugin_capability,
    volume_capability::access_mode::Mode,
};
use tonic::Code;

#[tokio::test]
async fn identity_reports_name_capabilities_and_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| c.driver_name = "my.driver".to_owned()).await;
    let mut identity = server.identity();
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.name, "my.driver");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = identity
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .expect("caps")
        .into_inner()
        .capabilities;
    use plugin_capability::{Type, service, volume_expansion};
    let services: Vec<i32> = caps
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    assert_eq!(
        services,
        [
            service::Type::ControllerService as i32,
            service::Type::VolumeAccessibilityConstraints as i32
        ]
    );
    assert!(caps.iter().any(|c| matches!(&c.r#type,
        Some(Type::VolumeExpansion(e)) if e.r#type == volume_expansion::Type::Online as i32)));
    let probe = identity
        .probe(csi::ProbeRequest {})
        .await
        .expect("probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    server.stop().await.expect("clean stop");

    // Without topology, no accessibility constraints capability.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| c.enable_topology = false).await;
    let caps = server
        .identity()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .expect("caps")
        .into_inner()
        .capabilities;
    assert!(!caps.iter().any(|c| matches!(&c.r#type,
        Some(Type::Service(s)) if s.r#type == service::Type::VolumeAccessibilityConstraints as i32)));
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn controller_capabilities_are_the_documented_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let caps = server
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .expect("caps")
        .into_inner()
        .capabilities;
    use controller_service_capability::{Type, rpc::Type as R};
    let mut got: Vec<i32> = caps
        .iter()
        .filter_map(|c| c.r#type.as_ref().map(|Type::Rpc(r)| r.r#type))
        .collect();
    got.sort();
    let mut want: Vec<i32> = [
        R::CreateDeleteVolume,
        R::CreateDeleteSnapshot,
        R::ListSnapshots,
        R::CloneVolume,
        R::ExpandVolume,
        R::ListVolumes,
        R::GetCapacity,
        R::GetVolume,
        R::GetSnapshot,
        R::SingleNodeMultiWriter,
    ]
    .iter()
    .map(|t| *t as i32)
    .collect();
    want.sort();
    assert_eq!(got, want);
    // Not advertised, so not implemented.
    let mut c = server.controller();
    assert_eq!(
        code(
            c.controller_publish_volume(csi::ControllerPublishVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    assert_eq!(
        code(
            c.controller_modify_volume(csi::ControllerModifyVolumeRequest::default())
                .await
        ),
        Code::Unimplemented
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn create_is_idempotent_and_checks_compatibility() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let req = with_params(create_req("pvc-1", 10 * MIB), &[("foo", "bar")]);
    let first = create(&mut c, req.clone()).await.expect("create");
    assert_eq!(first.capacity_bytes, 10 * MIB);
    assert_eq!(
        first.volume_context,
        HashMap::from([("foo".to_owned(), "bar".to_owned())])
    );
    assert_eq!(first.accessible_topology.len(), 1);
    assert_eq!(
        first.accessible_topology[0].segments.get(TOPOLOGY_KEY),
        Some(&"test-node".to_owned())
    );
    assert!(volume_path(&server.config.state_dir, &first.volume_id).is_dir());

    let again = create(&mut c, req.clone()).await.expect("repeat");
    assert_eq!(again, first);

    // A compatible range (the existing size is inside it) is the same volume.
    let mut wider = req.clone();
    wider.capacity_range = Some(csi::CapacityRange {
        required_bytes: 5 * MIB,
        limit_bytes: 20 * MIB,
    });
    assert_eq!(
        create(&mut c, wider).await.expect("compatible").volume_id,
        first.volume_id
    );

    // Incompatible: larger, below the limit, other access type, other source.
    let bigger = create_req("pvc-1", 20 * MIB);
    assert_eq!(code(create(&mut c, bigger).await), Code::AlreadyExists);
    let mut limited = req.clone();
    limited.capacity_range = Some(csi::CapacityRange {
        required_bytes: MIB,
        limit_bytes: 5 * MIB,
    });
    assert_eq!(code(create(&mut c, limited).await), Code::AlreadyExists);
    let mut block = req.clone();
    block.volume_capabilities = vec![block_cap(Mode::SingleNodeWriter)];
    assert_eq!(code(create(&mut c, block).await), Code::AlreadyExists);

    let records = backend_volumes(&server.config.state_dir).expect("records");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].name, "pvc-1");
    assert_eq!(records[0].id, first.volume_id);
    assert_eq!(records[0].capacity_bytes, 10 << 20);
    assert_eq!(records[0].access_type, AccessType::Mount);
    assert_eq!(
        records[0].parameters,
        BTreeMap::from([("foo".to_owned(), "bar".to_owned())])
    );

    // Delete, idempotently; the data directory goes too.
    delete(&mut c, &first.volume_id).await.expect("delete");
    delete(&mut c, &first.volume_id)
        .await
        .expect("delete again");
    assert!(!volume_path(&server.config.state_dir, &first.volume_id).exists());
    assert!(
        backend_volumes(&server.config.state_dir)
            .expect("records")
            .is_empty()
    );
    assert_eq!(code(delete(&mut c, "").await), Code::InvalidArgument);
    // A new volume with the old name gets a new id.
    let fresh = create(&mut c, req).await.expect("recreate");
    assert_ne!(fresh.volume_id, first.volume_id);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn create_validates_arguments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| c.max_volume_size = 100 * (1 << 20)).await;
    let mut c = server.controller();
    let ok = create_req("v", MIB);

    let mut r = ok.clone();
    r.name.clear();
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    let mut r = ok.clone();
    r.volume_capabilities.clear();
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    let mut r = ok.clone();
    r.volume_capabilities = vec![csi::VolumeCapability {
        access_type: None,
        access_mode: rwo().access_mode,
    }];
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    let mut r = ok.clone();
    r.volume_capabilities = vec![csi::VolumeCapability {
        access_type: rwo().access_type,
        access_mode: None,
    }];
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    for mode in [
        Mode::MultiNodeReaderOnly,
        Mode::MultiNodeSingleWriter,
        Mode::MultiNodeMultiWriter,
        Mode::Unknown,
    ] {
        let mut r = ok.clone();
        r.volume_capabilities = vec![mount_cap(mode)];
        assert_eq!(
            code(create(&mut c, r).await),
            Code::InvalidArgument,
            "{mode:?}"
        );
    }
    let mut r = ok.clone();
    r.capacity_range = Some(csi::CapacityRange {
        required_bytes: 2 * MIB,
        limit_bytes: MIB,
    });
    assert_eq!(code(create(&mut c, r).await), Code::OutOfRange);
    let r = create_req("v", 101 * MIB);
    assert_eq!(code(create(&mut c, r).await), Code::OutOfRange);
    let mut r = ok.clone();
    r.capacity_range = Some(csi::CapacityRange {
        required_bytes: -1,
        limit_bytes: 0,
    });
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    let mut r = ok.clone();
    r.mutable_parameters = HashMap::from([("iops".to_owned(), "5".to_owned())]);
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    let mut r = ok.clone();
    r.volume_content_source = Some(csi::VolumeContentSource { r#type: None });
    assert_eq!(code(create(&mut c, r).await), Code::InvalidArgument);
    assert!(
        backend_volumes(&server.config.state_dir)
            .expect("records")
            .is_empty()
    );

    // Every single-node mode is fine; no required bytes → 1 GiB capped by
    // the limit or by the maximum volume size.
    for (i, mode) in [
        Mode::SingleNodeWriter,
        Mode::SingleNodeReaderOnly,
        Mode::SingleNodeSingleWriter,
        Mode::SingleNodeMultiWriter,
    ]
    .into_iter()
    .enumerate()
    {
        let mut r = create_req(&format!("mode-{i}"), MIB);
        r.volume_capabilities = vec![mount_cap(mode), mount_cap(Mode::SingleNodeWriter)];
        create(&mut c, r).await.expect("single-node mode");
    }
    let mut r = create_req("default-size", 0);
    r.capacity_range = None;
    assert_eq!(
        create(&mut c, r).await.expect("default").capacity_bytes,
        100 * MIB
    );
    let mut r = create_req("limited", 0);
    r.capacity_range = Some(csi::CapacityRange {
        required_bytes: 0,
        limit_bytes: 3 * MIB,
    });
    assert_eq!(
        create(&mut c, r).await.expect("limited").capacity_bytes,
        3 * MIB
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn default_size_is_one_gib() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let v = create(&mut c, create_req("d", 0)).await.expect("create");
    assert_eq!(v.capacity_bytes, GIB);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn capacity_per_kind_is_enforced_and_freed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| {
        c.capacity = BTreeMap::from([("fast".to_owned(), 10 << 20), ("slow".to_owned(), 20 << 20)]);
    })
    .await;
    let mut c = server.controller();
    let fast = |name: &str, mib: i64| with_params(create_req(name, mib * MIB), &[("kind", "fast")]);

    let a = create(&mut c, fast("a", 6)).await.expect("a");
    assert_eq!(
        code(create(&mut c, fast("b", 6)).await),
        Code::ResourceExhausted
    );
    let cap = |kind: Option<&str>| csi::GetCapacityRequest {
        parameters: kind
            .map(|k| HashMap::from([("kind".to_owned(), k.to_owned())]))
            .unwrap_or_default(),
        ..Default::default()
    };
    let fast_cap = c
        .get_capacity(cap(Some("fast")))
        .await
        .expect("cap")
        .into_inner();
    assert_eq!(fast_cap.available_capacity, 4 * MIB);
    assert_eq!(fast_cap.maximum_volume_size, Some(4 * MIB));
    let all = c.get_capacity(cap(None)).await.expect("cap").into_inner();
    assert_eq!(all.available_capacity, 24 * MIB);
    assert_eq!(all.maximum_volume_size, Some(20 * MIB));
    let unknown = c
        .get_capacity(cap(Some("gold")))
        .await
        .expect("cap")
        .into_inner();
    assert_eq!(unknown.available_capacity, 0);

    // Unknown kind is invalid.
    assert_eq!(
        code(
            create(
                &mut c,
                with_params(create_req("g", MIB), &[("kind", "gold")])
            )
            .await
        ),
        Code::InvalidArgument
    );
    // No kind: the first kind with room ("fast" has 4 MiB, "slow" 20).
    let any = create(&mut c, create_req("any", 8 * MIB))
        .await
        .expect("any kind");
    let records = backend_volumes(&server.config.state_dir).expect("records");
    let rec = records
        .iter()
        .find(|r| r.id == any.volume_id)
        .expect("record");
    assert_eq!(rec.kind, "slow");
    let small = create(&mut c, create_req("small", 2 * MIB))
        .await
        .expect("small");
    let records = backend_volumes(&server.config.state_dir).expect("records");
    let rec = records
        .iter()
        .find(|r| r.id == small.volume_id)
        .expect("record");
    assert_eq!(rec.kind, "fast");
    // Idempotent repeat does not take capacity again.
    create(&mut c, create_req("small", 2 * MIB))
        .await
        .expect("repeat");
    assert_eq!(
        code(create(&mut c, create_req("huge", 13 * MIB)).await),
        Code::ResourceExhausted
    );

    // Deleting frees the capacity.
    delete(&mut c, &a.volume_id).await.expect("delete");
    create(&mut c, fast("b", 6))
        .await
        .expect("fits after delete");

    // Expansion counts against the kind too.
    let slow = create(
        &mut c,
        with_params(create_req("s", MIB), &[("kind", "slow")]),
    )
    .await
    .expect("slow");
    let expand = |bytes: i64| csi::ControllerExpandVolumeRequest {
        volume_id: slow.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    assert_eq!(
        code(c.controller_expand_volume(expand(20 * MIB)).await),
        Code::ResourceExhausted
    );
    let grown = c
        .controller_expand_volume(expand(12 * MIB))
        .await
        .expect("expand")
        .into_inner();
    assert_eq!(grown.capacity_bytes, 12 * MIB);
    server.stop().await.expect("clean stop");
}

/// `--topology-key` (`Config::topology_key`): the driver reports and
/// honours another segment key, e.g. to stand in for the EBS driver in CSI
/// migration tests; the default key then means nothing to it.
#[tokio::test]
async fn topology_key_is_configurable() {
    const EBS_ZONE: &str = "topology.ebs.csi.aws.com/zone";
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| {
        c.node_id = "us-east-1a".to_owned();
        c.topology_key = EBS_ZONE.to_owned();
    })
    .await;
    let mut c = server.controller();
    let info = server
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    let zone = |value: &str| csi::Topology {
        segments: HashMap::from([(EBS_ZONE.to_owned(), value.to_owned())]),
    };
    assert_eq!(info.accessible_topology, Some(zone("us-east-1a")));
    let mut req = create_req("v", MIB);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![zone("us-east-1b"), zone("us-east-1a")],
        preferred: vec![],
    });
    let v = create(&mut c, req).await.expect("requisite matches");
    assert_eq!(v.accessible_topology, vec![zone("us-east-1a")]);
    assert_eq!(
        backend_volumes(&server.config.state_dir).expect("records")[0].accessible_topology,
        vec![BTreeMap::from([(
            EBS_ZONE.to_owned(),
            "us-east-1a".to_owned()
        )])]
    );
    // The default key does not name this node any more.
    let mut req = create_req("w", MIB);
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), "us-east-1a".to_owned())]),
        }],
        preferred: vec![],
    });
    assert_eq!(code(create(&mut c, req).await), Code::ResourceExhausted);
    let capacity = |t: csi::Topology| csi::GetCapacityRequest {
        accessible_topology: Some(t),
        ..Default::default()
    };
    let here = c
        .get_capacity(capacity(zone("us-east-1a")))
        .await
        .expect("capacity")
        .into_inner();
    assert!(here.available_capacity > 0);
    let there = c
        .get_capacity(capacity(zone("us-east-1b")))
        .await
        .expect("capacity")
        .into_inner();
    assert_eq!(there.available_capacity, 0);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn topology_requirements() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| c.node_id = "node-a".to_owned()).await;
    let mut c = server.controller();
    let topo = |node: &str| csi::Topology {
        segments: HashMap::from([(TOPOLOGY_KEY.to_owned(), node.to_owned())]),
    };
    let with_req = |name: &str, requisite: Vec<csi::Topology>, preferred: Vec<csi::Topology>| {
        let mut r = create_req(name, MIB);
        r.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite,
            preferred,
        });
        r
    };
    assert_eq!(
        code(create(&mut c, with_req("x", vec![topo("node-b")], vec![])).await),
        Code::ResourceExhausted
    );
    let v = create(
        &mut c,
        with_req(
            "y",
            vec![topo("node-b"), topo("node-a")],
            vec![topo("node-a")],
        ),
    )
    .await
    .expect("requisite matches");
    assert_eq!(v.accessible_topology, vec![topo("node-a")]);
    // Preferred alone does not restrict.
    create(&mut c, with_req("z", vec![], vec![topo("node-b")]))
        .await
        .expect("preferred only");

    let cap = |t: csi::Topology| csi::GetCapacityRequest {
        accessible_topology: Some(t),
        ..Default::default()
    };
    let here = c
        .get_capacity(cap(topo("node-a")))
        .await
        .expect("cap")
        .into_inner();
    assert_eq!(here.available_capacity, 1 << 40);
    assert_eq!(here.maximum_volume_size, Some(1 << 40));
    let there = c
        .get_capacity(cap(topo("node-b")))
        .await
        .expect("cap")
        .into_inner();
    assert_eq!(there.available_capacity, 0);
    server.stop().await.expect("clean stop");

    // Topology off: requirements are ignored and no topology is reported.
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| c.enable_topology = false).await;
    let mut c = server.controller();
    let v = create(&mut c, with_req("x", vec![topo("elsewhere")], vec![]))
        .await
        .expect("ignored");
    assert!(v.accessible_topology.is_empty());
    let info = server
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(info.accessible_topology, None);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn list_volumes_paginates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            create(&mut c, create_req(&format!("v{i}"), MIB))
                .await
                .expect("create")
                .volume_id,
        );
    }
    ids.sort();
    assert_eq!(list_volume_ids(&mut c).await, ids);

    let page = |max: i32, token: &str| csi::ListVolumesRequest {
        max_entries: max,
        starting_token: token.to_owned(),
    };
    let mut seen = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let resp = c
            .list_volumes(page(2, &token))
            .await
            .expect("page")
            .into_inner();
        assert!(resp.entries.len() <= 2);
        seen.extend(
            resp.entries
                .into_iter()
                .map(|e| e.volume.expect("volume").volume_id),
        );
        pages += 1;
        if resp.next_token.is_empty() {
            break;
        }
        token = resp.next_token;
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, ids);

    // A token stays valid when its volume is deleted.
    let first = c
        .list_volumes(page(2, ""))
        .await
        .expect("page")
        .into_inner();
    delete(&mut c, &ids[1]).await.expect("delete");
    let rest = c
        .list_volumes(page(0, &first.next_token))
        .await
        .expect("rest")
        .into_inner();
    let rest: Vec<String> = rest
        .entries
        .into_iter()
        .map(|e| e.volume.expect("volume").volume_id)
        .collect();
    assert_eq!(rest, ids[2..]);

    assert_eq!(
        code(c.list_volumes(page(1, "not-a-token")).await),
        Code::Aborted
    );
    assert_eq!(
        code(c.list_volumes(page(-1, "")).await),
        Code::InvalidArgument
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn validate_get_and_expand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| c.max_volume_size = 1 << 30).await;
    let mut c = server.controller();
    let v = create(&mut c, create_req("v", MIB)).await.expect("create");

    let validate =
        |id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id.to_owned(),
            volume_capabilities: caps,
            volume_context: HashMap::from([("a".to_owned(), "b".to_owned())]),
            ..Default::default()
        };
    let ok = c
        .validate_volume_capabilities(validate(&v.volume_id, vec![rwo()]))
        .await
        .expect("validate")
        .into_inner();
    let confirmed = ok.confirmed.expect("confirmed");
    assert_eq!(confirmed.volume_capabilities, vec![rwo()]);
    assert_eq!(
        confirmed.volume_context,
        HashMap::from([("a".to_owned(), "b".to_owned())])
    );
    for caps in [
        vec![mount_cap(Mode::MultiNodeMultiWriter)],
        vec![block_cap(Mode::SingleNodeWriter)],
    ] {
        let resp = c
            .validate_volume_capabilities(validate(&v.volume_id, caps))
            .await
            .expect("validate")
            .into_inner();
        assert!(resp.confirmed.is_none());
        assert!(!resp.message.is_empty());
    }
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate("", vec![rwo()]))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate(&v.volume_id, vec![]))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.validate_volume_capabilities(validate("nope", vec![rwo()]))
                .await
        ),
        Code::NotFound
    );

    let got = c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: v.volume_id.clone(),
        })
        .await
        .expect("get")
        .into_inner();
    assert_eq!(got.volume, Some(v.clone()));
    assert!(got.status.is_some());
    assert_eq!(
        code(
            c.controller_get_volume(csi::ControllerGetVolumeRequest {
                volume_id: "nope".to_owned()
            })
            .await
        ),
        Code::NotFound
    );

    let expand = |id: &str, bytes: i64| csi::ControllerExpandVolumeRequest {
        volume_id: id.to_owned(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let grown = c
        .controller_expand_volume(expand(&v.volume_id, 4 * MIB))
        .await
        .expect("expand")
        .into_inner();
    assert_eq!(grown.capacity_bytes, 4 * MIB);
    assert!(!grown.node_expansion_required);
    // Smaller request: the current size, unchanged.
    let same = c
        .controller_expand_volume(expand(&v.volume_id, 2 * MIB))
        .await
        .expect("shrink is a no-op")
        .into_inner();
    assert_eq!(same.capacity_bytes, 4 * MIB);
    assert_eq!(
        backend_volumes(&server.config.state_dir).expect("records")[0].capacity_bytes,
        4 << 20
    );
    assert_eq!(
        code(
            c.controller_expand_volume(expand(&v.volume_id, 2 * GIB))
                .await
        ),
        Code::OutOfRange
    );
    assert_eq!(
        code(c.controller_expand_volume(expand("nope", MIB)).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_expand_volume(expand("", MIB)).await),
        Code::InvalidArgument
    );
    let mut no_range = expand(&v.volume_id, MIB);
    no_range.capacity_range = None;
    assert_eq!(
        code(c.controller_expand_volume(no_range).await),
        Code::InvalidArgument
    );
    // Idempotent create sees the new size; asking for the old one is
    // incompatible only when it sets a limit below the new size.
    let again = create(&mut c, create_req("v", MIB)).await.expect("repeat");
    assert_eq!(again.capacity_bytes, 4 * MIB);
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn block_volumes_have_a_sparse_file_of_their_size() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |_| {}).await;
    let mut c = server.controller();
    let mut req = create_req("blk", 8 * MIB);
    req.volume_capabilities = vec![block_cap(Mode::SingleNodeWriter)];
    let v = create(&mut c, req).await.expect("create");
    let file = volume_path(&server.config.state_dir, &v.volume_id).join("block");
    assert_eq!(std::fs::metadata(&file).expect("block file").len(), 8 << 20);
    c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 16 * MIB,
            limit_bytes: 0,
        }),
        volume_capability: Some(block_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    })
    .await
    .expect("expand");
    assert_eq!(
        std::fs::metadata(&file).expect("block file").len(),
        16 << 20
    );
    // The capability must match the volume's access type.
    assert_eq!(
        code(
            c.controller_expand_volume(csi::ControllerExpandVolumeRequest {
                volume_id: v.volume_id.clone(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 32 * MIB,
                    limit_bytes: 0,
                }),
                volume_capability: Some(rwo()),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    server.stop().await.expect("clean stop");
}

#[tokio::test]
async fn concurrent_identical_creates_make_one_volume() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Server::start_in(dir.path(), |c| {
        c.capacity = BTreeMap::from([("k".to_owned(), 10 << 20)]);
    })
    .await;
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let mut c = server.controller();
        tasks.push(tokio::spawn(async move {
            create(&mut c, create_req("same", 6 * MIB)).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.expect("task").expect("create").volume_id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "all calls return the same volume");
    assert_eq!(
        backend_volumes(&server.config.state_dir)
            .expect("records")
            .len(),
        1
    );
    // Concurrent different names compete for capacity: exactly one of two fits.
    let mut a = server.controller();
    let mut b = server.controller();
    let (ra, rb) = tokio::join!(
        create(&mut a, create_req("a", 3 * MIB)),
        create(&mut b, create_req("b", 3 * MIB))
    );
    let codes = [code(ra), code(rb)];
    assert!(
        codes.contains(&Code::Ok) && codes.contains(&Code::ResourceExhausted),
        "{codes:?}"
    );
    server.stop().await.expect("clean stop");
}

/// `--enable-controller-publish`: the capability is advertised and the
/// calls follow the spec's error rules; without it they are unimplemented.
#[tokio::test]
async fn controller_publish_is_opt_in_and_follows_the_spec() {
    use csi_proto::v1::controller_service_capability::rpc::Type;
    for enabled in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = Server::start_in(dir.path(), |c| c.controller_publish = enabled).await;
        let mut client = server.controller();
        let caps = client
            .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
            .await
            .expect("caps")
            .into_inner();
        let advertised = caps.capabilities.iter().any(|c| {
            matches!(&c.r#type, Some(csi::controller_service_capability::Type::Rpc(rpc)) if rpc.r#type == Type::PublishUnpublishVolume as i32)
        });
        assert_eq!(advertised, enabled);
        let volume = client
            .create_volume(create_req("pub", 1 << 20))
            .await
            .expect("create")
            .into_inner()
            .volume
            .expect("volume");
        let node = server.config.node_id.clone();
        let publish = |node: &str, readonly: bool| csi::ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: node.to_owned(),
            volume_capability: Some(rwo()),
            readonly,
            ..Default::default()
        };
        let first = client
            .controller_publish_volume(publish(&node, false))
            .await;
        if !enabled {
            assert_eq!(
                first.expect_err("unimplemented").code(),
                Code::Unimplemented
            );
            continue;
        }
        first.expect("published");
        client
            .controller_publish_volume(publish(&node, false))
            .await
            .expect("idempotent");
        let code = |r: Result<
            tonic::Response<csi::ControllerPublishVolumeResponse>,
            tonic::Status,
        >| { r.expect_err("refused").code() };
        assert_eq!(
            code(client.controller_publish_volume(publish(&node, true)).await),
            Code::AlreadyExists
        );
        assert_eq!(
            code(
                client
                    .controller_publish_volume(publish("other-node", false))
                    .await
            ),
            Code::NotFound
        );
        let mut missing = publish(&node, false);
        missing.volume_id = "nope".into();
        assert_eq!(
            code(client.controller_publish_volume(missing).await),
            Code::NotFound
        );
        let mut no_cap = publish(&node, false);
        no_cap.volume_capability = None;
        assert_eq!(
            code(client.controller_publish_volume(no_cap).await),
            Code::InvalidArgument
        );
        for _ in 0..2 {
            client
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                    volume_id: volume.volume_id.clone(),
                    node_id: node.clone(),
                    ..Default::default()
                })
                .await
                .expect("unpublished (and again: idempotent)");
        }
    }
}
