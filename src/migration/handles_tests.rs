use super::*;

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|value| (*value).to_owned()).collect()
}

#[test]
fn ebs_volume_ids() {
    let invalid = |id: &str, reason| {
        Err(MigrationError::InvalidEbsVolumeId {
            id: id.to_owned(),
            reason,
        })
    };
    let form = "is not of the form aws://<zone>/vol-<id>";
    let cases: Vec<(&str, Result<String, MigrationError>)> = vec![
        ("aws://us-east-1a/vol-0123", Ok("vol-0123".to_owned())),
        ("aws:///vol-0123", Ok("vol-0123".to_owned())),
        ("aws://us-east-1a/vol-0123/", Ok("vol-0123".to_owned())),
        ("aws://us-east-1a//vol-0123", Ok("vol-0123".to_owned())),
        ("vol-0123", Ok("vol-0123".to_owned())),
        // Bare ids are taken as they are, as upstream does.
        (
            "some-other-partition-id",
            Ok("some-other-partition-id".to_owned()),
        ),
        (
            "",
            Err(MigrationError::EmptyVolumeId {
                plugin: InTreePlugin::AwsEbs,
            }),
        ),
        ("aws://vol-0123", invalid("aws://vol-0123", form)),
        ("aws://us-east-1a/", invalid("aws://us-east-1a/", form)),
        ("aws://", invalid("aws://", form)),
        (
            "aws://us-east-1a/snap-0123",
            invalid("aws://us-east-1a/snap-0123", form),
        ),
        (
            "aws://us-east-1a/extra/vol-0123",
            invalid("aws://us-east-1a/extra/vol-0123", form),
        ),
        (
            "aws://us-east-1a/vol-1?x=1",
            invalid(
                "aws://us-east-1a/vol-1?x=1",
                "is not of the form aws://<zone>/<vol-id>",
            ),
        ),
        (
            "aws://us-east-1a/vol-%31",
            invalid(
                "aws://us-east-1a/vol-%31",
                "is not of the form aws://<zone>/<vol-id>",
            ),
        ),
    ];
    for (id, expected) in cases {
        assert_eq!(ebs_volume_id(id), expected, "{id:?}");
    }
}

#[test]
fn gce_handles() {
    let ok = |handle: &str, name: &str| (handle.to_owned(), Ok(name.to_owned()));
    let bad = |handle: &str| {
        (
            handle.to_owned(),
            Err(MigrationError::InvalidGcePdHandle {
                handle: handle.to_owned(),
            }),
        )
    };
    let cases = vec![
        ok("projects/p/zones/us-central1-a/disks/pvc-1", "pvc-1"),
        ok("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d", "d"),
        ok("projects/p/regions/us-central1/disks/d", "d"),
        bad("pvc-1"),
        bad("projects/p/zones/z/disks"),
        bad("projects/p/zones/z/disks/"),
        bad("projects//zones/z/disks/d"),
        bad("projects/p/zones//disks/d"),
        bad("projects/p/locations/z/disks/d"),
        bad("folders/p/zones/z/disks/d"),
        bad("projects/p/zones/z/snapshots/d"),
        bad("projects/p/zones/z/disks/d/extra"),
        bad(""),
    ];
    for (handle, expected) in cases {
        assert_eq!(
            gce_pd_name(&handle).map(str::to_owned),
            expected,
            "{handle:?}"
        );
    }
}

#[test]
fn gce_handles_from_zones() {
    let cases: Vec<(&[&str], Result<String, MigrationError>)> = vec![
        (
            &[],
            Ok("projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d".to_owned()),
        ),
        (
            &["europe-west1-b"],
            Ok("projects/UNSPECIFIED/zones/europe-west1-b/disks/d".to_owned()),
        ),
        (
            &["europe-west1-b", "europe-west1-c"],
            Ok("projects/UNSPECIFIED/regions/europe-west1/disks/d".to_owned()),
        ),
        (
            &["europe-west1-b", "us-central1-a"],
            Err(MigrationError::Region(RegionError::NotOneRegion(strings(
                &["europe-west1", "us-central1"],
            )))),
        ),
        (
            &["europe-west1-b", "weird"],
            Err(MigrationError::Region(RegionError::UnexpectedZone {
                plugin: InTreePlugin::GcePd,
                zone: "weird".to_owned(),
            })),
        ),
    ];
    for (zones, expected) in cases {
        assert_eq!(
            gce_volume_handle(&strings(zones), "d"),
            expected,
            "{zones:?}"
        );
    }
}

#[test]
fn aws_regions() {
    let cases: Vec<(&[&str], Result<&str, RegionError>)> = vec![
        (&["us-west-2a"], Ok("us-west-2")),
        (&["us-gov-east-1a"], Ok("us-gov-east-1")),
        (&["us-west-2-lax-1a"], Ok("us-west-2")),
        (&["us-east-1-wl1-bos-wlz-1"], Ok("us-east-1")),
        (
            &["us-west-2a", "us-west-2b", "us-west-2-lax-1a"],
            Ok("us-west-2"),
        ),
        (&[], Err(RegionError::NoZones)),
        (
            &["us-west-2a", "us-east-1a"],
            Err(RegionError::NotOneRegion(strings(&[
                "us-east-1",
                "us-west-2",
            ]))),
        ),
        (
            &["us-west-2"],
            Err(RegionError::UnexpectedZone {
                plugin: InTreePlugin::AwsEbs,
                zone: "us-west-2".to_owned(),
            }),
        ),
        (
            &["zone"],
            Err(RegionError::UnexpectedZone {
                plugin: InTreePlugin::AwsEbs,
                zone: "zone".to_owned(),
            }),
        ),
        // A two-byte character where the zone letter should be: refused, not sliced.
        (
            &["us-west-é"],
            Err(RegionError::UnexpectedZone {
                plugin: InTreePlugin::AwsEbs,
                zone: "us-west-é".to_owned(),
            }),
        ),
    ];
    for (zones, expected) in cases {
        assert_eq!(
            aws_region(&strings(zones)),
            expected.map(str::to_owned),
            "{zones:?}"
        );
    }
}

#[test]
fn gce_regions() {
    assert_eq!(
        gce_region(&strings(&["europe-west1-b", "europe-west1-c"])),
        Ok("europe-west1".to_owned())
    );
    assert_eq!(gce_region(&[]), Err(RegionError::NoZones));
    assert_eq!(
        gce_region(&strings(&["us-central1-a-x"])),
        Err(RegionError::UnexpectedZone {
            plugin: InTreePlugin::GcePd,
            zone: "us-central1-a-x".to_owned(),
        })
    );
}

#[test]
fn azure_disk_uris() {
    let managed = "/subscriptions/sub-1/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-1";
    let cases: Vec<(&str, Option<&str>)> = vec![
        (managed, Some("pvc-1")),
        (
            "/subscriptions/sub-1/resourcegroups/rg/providers/microsoft.compute/disks/pvc-1",
            Some("pvc-1"),
        ),
        (
            "https://account.blob.core.windows.net/vhds/pvc-1.vhd",
            Some("pvc-1.vhd"),
        ),
        (
            "http://account.blob.core.windows.net/vhds/pvc-1.vhd",
            Some("pvc-1.vhd"),
        ),
        ("pvc-1", None),
        ("", None),
        (
            "/subscriptions/sub-1/resourceGroups/rg/providers/Microsoft.Compute/disks/",
            None,
        ),
        (
            "/subscriptions/sub-1/providers/Microsoft.Compute/disks/pvc-1",
            None,
        ),
        (
            "/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-1",
            None,
        ),
        (
            "/subscriptions/sub-1/resourceGroups/rg/providers/Microsoft.Storage/disks/pvc-1",
            None,
        ),
        (
            "https://account.blob.core.windows.net/containers/pvc-1.vhd",
            None,
        ),
        ("https://account.blob.core.windows.net/vhds/", None),
        ("http", None),
        ("httpx", None),
    ];
    for (uri, expected) in cases {
        let expected =
            expected
                .map(str::to_owned)
                .ok_or_else(|| MigrationError::InvalidAzureDiskUri {
                    uri: uri.to_owned(),
                });
        assert_eq!(azure_disk_name(uri).map(str::to_owned), expected, "{uri:?}");
    }
}

#[test]
fn azure_file_ids() {
    assert_eq!(
        azure_file_id("rg#account#share#pv-1#ns"),
        Ok(AzureFileId {
            resource_group: "rg",
            account: "account",
            share: "share",
        })
    );
    assert_eq!(
        azure_file_id("#account#share"),
        Ok(AzureFileId {
            resource_group: "",
            account: "account",
            share: "share",
        })
    );
    for bad in ["", "account#share", "no-separators"] {
        assert_eq!(
            azure_file_id(bad),
            Err(MigrationError::InvalidAzureFileHandle {
                handle: bad.to_owned(),
            }),
            "{bad:?}"
        );
    }
}

#[test]
fn azure_account_secrets() {
    assert_eq!(
        azure_account_secret_name("acct"),
        "azure-storage-account-acct-secret"
    );
    let cases = [
        ("azure-storage-account-acct-secret", Some("acct")),
        ("azure-storage-account-my-acct-secret", Some("my-acct")),
        ("prefix-azure-storage-account-acct-secret-x", Some("acct")),
        ("azure-storage-account--secret", None),
        ("my-secret", None),
        ("", None),
    ];
    for (secret, expected) in cases {
        assert_eq!(azure_account_of_secret(secret), expected, "{secret:?}");
    }
}
