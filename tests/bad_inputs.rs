//! The bad-input catalogue: every way a user, an object
//! or a driver can hand the sidecar something wrong, each with the exact
//! text the user is told (exit message, Event) and each its own test. Every
//! case must end cleanly: the message, no panic, and nothing leaked (no
//! backend volume without a PV, no PV without its volume).
//!
//! Objects and drivers run on our API test server (fresh per case) with the
//! `csi-hostpath` driver; `{ns}`, `{claim}`, `{class}`, `{node}` in texts
//! stand for the case's names.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use csi_hostpath::faults::{Fault, Reply};
use serde_json::{Value, json};
use support::{Backend, Env};

const CLAIM: &str = "bad";

/// The flags of the `ClaimMetadataPropagation` cases.
const CLAIM_METADATA: &[&str] = &["--feature-gates=ClaimMetadataPropagation=true"];

const SNAPSHOT_SOURCE: &str = r#"{"spec": {"dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}, "dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"}}}"#;

/// What is wrong.
enum Input {
    /// Command-line flags (besides a valid `--csi-address`/`--kubeconfig`).
    Flags(&'static [&'static str]),
    /// A claim (JSON merged into a 1Mi RWO claim of the case's class) of a
    /// class with these parameters (JSON merged into the class object).
    Claim {
        class: &'static str,
        claim: &'static str,
    },
    /// As `Claim`, with the sidecar started with these flags.
    ClaimWithFlags {
        flags: &'static [&'static str],
        class: &'static str,
        claim: &'static str,
    },
    /// As `Claim`, once these objects (a JSON array) exist.
    ClaimAfter {
        objects: &'static str,
        class: &'static str,
        claim: &'static str,
    },
    /// Objects as given (JSON array, nulls kept), no claim.
    Objects(&'static str),
    /// A valid claim; the driver's first `CreateVolume` answers are altered.
    CreateReply {
        reply: fn(&Env) -> Reply,
        times: u32,
    },
    /// The driver's capability answers carry an enum value nobody knows.
    UnknownCapability,
    /// A valid claim; the driver's first `CreateVolume` calls fail with
    /// `code` and a message of `bytes` bytes.
    CreateError {
        code: tonic::Code,
        bytes: usize,
        times: u32,
    },
}

/// What the user must be told.
enum Expect {
    /// The sidecar exits with this code and this line on stderr.
    Exit { code: i32, stderr: &'static str },
    /// This Event (reason, exact message) on the claim; nothing provisioned.
    Event {
        reason: &'static str,
        message: &'static str,
    },
    /// This Event on the claim, whose message contains the text (for
    /// messages with parts that are not ours: a gRPC library's wording).
    EventContaining {
        reason: &'static str,
        text: &'static str,
    },
    /// This Event first, then the claim is provisioned once the input is
    /// fixed (the driver answers right again).
    EventThenBound {
        reason: &'static str,
        message: &'static str,
    },
    /// Ignored with a log line containing this; provisioning works.
    LogThenBound { log: &'static str },
    /// This Event (reason, exact message) on the PV `pv`, which stays.
    PvEvent {
        pv: &'static str,
        reason: &'static str,
        message: &'static str,
    },
}

struct Case {
    input: Input,
    expect: Expect,
}

/// Declares the catalogue: one test per case, and a test that counts them.
macro_rules! catalogue {
    ($($name:ident: $case:expr;)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                run(stringify!($name), $case).await;
            }
        )+

        #[test]
        fn the_catalogue_has_at_least_thirty_cases() {
            let names = [$(stringify!($name)),+];
            assert!(names.len() >= 30, "{} cases", names.len());
        }
    };
}

catalogue! {
    // Flags and gates.
    flag_unknown_gate: Case {
        input: Input::Flags(&["--feature-gates=Foo=true"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value 'Foo=true' for '--feature-gates <NAME=BOOL,...>': unrecognized feature gate: Foo; the gates are HonorPVReclaimPolicy, PVCProtection, StatefulSetAutoDeletePVC, PVReleaser, Topology, VolumeAttributesClass, CrossNamespaceVolumeDataSource, ReleaseLeaderElectionOnExit, PodPVCProvisioner, ClaimMetadataPropagation, AllAlpha and AllBeta (the Kubernetes library gates the Go image accepts, such as WatchList, are accepted and ignored)" },
    };
    flag_claim_metadata_gate_misspelled: Case {
        input: Input::Flags(&["--feature-gates=ClaimMetadataInParameters=true"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value 'ClaimMetadataInParameters=true' for '--feature-gates <NAME=BOOL,...>': unrecognized feature gate: ClaimMetadataInParameters; the gates are HonorPVReclaimPolicy, PVCProtection, StatefulSetAutoDeletePVC, PVReleaser, Topology, VolumeAttributesClass, CrossNamespaceVolumeDataSource, ReleaseLeaderElectionOnExit, PodPVCProvisioner, ClaimMetadataPropagation, AllAlpha and AllBeta (the Kubernetes library gates the Go image accepts, such as WatchList, are accepted and ignored)" },
    };
    flag_gate_without_value: Case {
        input: Input::Flags(&["--feature-gates=Topology"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value 'Topology' for '--feature-gates <NAME=BOOL,...>': missing bool value for Topology" },
    };
    flag_gate_not_a_bool: Case {
        input: Input::Flags(&["--feature-gates=Topology=maybe"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value 'Topology=maybe' for '--feature-gates <NAME=BOOL,...>': invalid value of Topology=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax" },
    };
    flag_duration_without_unit: Case {
        input: Input::Flags(&["--timeout=5"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value '5' for '--timeout <DURATION>': invalid duration \"5\": missing unit in \"5\" (use ns, us, ms, s, m or h)" },
    };
    flag_negative_duration: Case {
        input: Input::Flags(&["--retry-interval-max=-1s"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value '-1s' for '--retry-interval-max <DURATION>': invalid duration \"-1s\": negative durations are not allowed here" },
    };
    flag_unknown: Case {
        input: Input::Flags(&["--no-such-flag"]),
        expect: Expect::Exit { code: 2, stderr: "error: unexpected argument '--no-such-flag' found" },
    };
    flag_not_a_bool: Case {
        input: Input::Flags(&["--extra-create-metadata=maybe"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value 'maybe' for '--extra-create-metadata[=<BOOL>]': strconv.ParseBool: parsing \"maybe\": invalid syntax (use true or false)" },
    };
    flag_not_a_number: Case {
        input: Input::Flags(&["--kube-api-qps=abc"]),
        expect: Expect::Exit { code: 2, stderr: "error: invalid value 'abc' for '--kube-api-qps <FLOAT>': invalid float literal" },
    };
    flag_zero_workers: Case {
        input: Input::Flags(&["--worker-threads=0"]),
        expect: Expect::Exit { code: 2, stderr: "csi-provisioner: invalid argument \"0\" for \"--worker-threads\" flag: must be at least 1" },
    };
    flag_empty_volume_name_prefix: Case {
        input: Input::Flags(&["--volume-name-prefix="]),
        expect: Expect::Exit { code: 2, stderr: "csi-provisioner: invalid argument \"\" for \"--volume-name-prefix\" flag: must not be empty" },
    };
    flag_gate_needing_another_flag: Case {
        input: Input::Flags(&["--feature-gates=PodPVCProvisioner=true"]),
        expect: Expect::Exit { code: 2, stderr: "csi-provisioner: --feature-gates=PodPVCProvisioner=true needs --controller-id (the managed-by label of the PVCs it creates)" },
    };

    // StorageClass parameters.
    class_unknown_reserved_key: Case {
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/colour": "blue"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/colour\" with reserved namespace csi.storage.k8s.io/" },
    };
    class_fstype_twice: Case {
        input: Input::Claim { class: r#"{"parameters": {"fstype": "ext4", "csi.storage.k8s.io/fstype": "xfs"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys" },
    };
    class_secret_name_without_namespace: Case {
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "creds"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to get name and namespace template from params: either name and namespace for Provisioner secrets specified, Both must be specified" },
    };
    class_secret_template_with_unknown_token: Case {
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "${pvc.colour}", "csi.storage.k8s.io/provisioner-secret-namespace": "{ns}"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "error resolving value \"${pvc.colour}\" of StorageClass parameter \"csi.storage.k8s.io/provisioner-secret-name\": invalid tokens: [\"pvc.colour\"]; a secret name template may use ${pv.name}, ${pvc.namespace}, ${pvc.name} and ${pvc.annotations['KEY']} (of an annotation the claim has)" },
    };
    class_secret_template_forbidden_for_provisioning: Case {
        // A claim's annotations may pick a secret's name (upstream #1148),
        // never the namespace it is read from.
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "creds", "csi.storage.k8s.io/provisioner-secret-namespace": "${pvc.annotations['team']}"}}"#, claim: r#"{"metadata": {"annotations": {"team": "a"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "error resolving value \"${pvc.annotations['team']}\" of StorageClass parameter \"csi.storage.k8s.io/provisioner-secret-namespace\": invalid tokens: [\"pvc.annotations['team']\"]; a secret namespace template may use only ${pv.name} and ${pvc.namespace}" },
    };
    class_secret_name_not_a_name: Case {
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "Not_A_Name", "csi.storage.k8s.io/provisioner-secret-namespace": "{ns}"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "\"Not_A_Name\" is not a valid secret name" },
    };
    class_secret_in_a_namespace_that_does_not_exist: Case {
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/provisioner-secret-name": "creds", "csi.storage.k8s.io/provisioner-secret-namespace": "nowhere"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "error getting secret creds in namespace nowhere: secrets \"creds\" not found" },
    };
    class_fstype_on_a_block_claim: Case {
        // Upstream provisions and ignores the fsType for a block volume; the
        // PV must carry none.
        input: Input::Claim { class: r#"{"parameters": {"csi.storage.k8s.io/fstype": "ext4"}}"#, claim: r#"{"spec": {"volumeMode": "Block"}}"# },
        expect: Expect::LogThenBound { log: "provisioned" },
    };

    // StorageClasses of the ClaimMetadataPropagation gate: parameter
    // templates and claim labels and annotations copied onto the PV.
    class_parameter_template_malformed: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "subDir"}}, "parameters": {"subDir": "${pvc.namespace"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to resolve StorageClass parameter \"subDir\": malformed template \"${pvc.namespace\": \"${\" without a closing \"}\"" },
    };
    class_parameter_template_stray_dollar: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "subDir"}}, "parameters": {"subDir": "$HOME/${pvc.name}"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to resolve StorageClass parameter \"subDir\": malformed template \"$HOME/${pvc.name}\": \"$\" must start a token such as \"${pvc.name}\" (write \"$$\" for a literal \"$\")" },
    };
    class_parameter_template_unknown_token: Case {
        // The spelling csi-driver-smb/nfs resolve themselves: not ours.
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "subDir"}}, "parameters": {"subDir": "${pvc.metadata.namespace}/${pvc.metadata.name}"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to resolve StorageClass parameter \"subDir\": unknown token \"${pvc.metadata.namespace}\" (known: ${pv.name}, ${pvc.name}, ${pvc.namespace}, ${pvc.annotations['KEY']}, ${pvc.labels['KEY']})" },
    };
    class_parameter_template_missing_annotation: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "tags"}}, "parameters": {"tags": "cost-center=${pvc.annotations['cost-center']}"}}"#, claim: r#"{"metadata": {"annotations": {"cost_center": "typo"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to resolve StorageClass parameter \"tags\": the claim has no annotation \"cost-center\" (for \"${pvc.annotations['cost-center']}\")" },
    };
    class_parameter_template_missing_label: Case {
        // The key is an annotation of the claim, not a label: labels and
        // annotations are separate maps.
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "pool"}}, "parameters": {"pool": "pool-${pvc.labels['tier']}"}}"#, claim: r#"{"metadata": {"labels": {"team": "a"}, "annotations": {"tier": "gold"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to resolve StorageClass parameter \"pool\": the claim has no label \"tier\" (for \"${pvc.labels['tier']}\")" },
    };
    class_parameter_template_of_a_reserved_key: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "csi.storage.k8s.io/fstype"}}, "parameters": {"csi.storage.k8s.io/fstype": "${pvc.name}"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/parameter-templates lists \"csi.storage.k8s.io/fstype\", which the provisioner reads itself; it is not templated" },
    };
    class_parameter_template_of_no_parameter: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "subdir"}}, "parameters": {"subDir": "${pvc.name}"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/parameter-templates lists \"subdir\", which is not a parameter of the class" },
    };
    class_copy_of_a_key_that_is_not_a_label_key: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/copy-claim-labels": "team,cost center"}}}"#, claim: r#"{"metadata": {"labels": {"team": "a"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/copy-claim-labels lists \"cost center\", which is not a valid label key: the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric" },
    };
    class_copy_of_a_volume_machinery_key: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/copy-claim-annotations": "volume.beta.kubernetes.io/storage-class"}}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/copy-claim-annotations lists \"volume.beta.kubernetes.io/storage-class\", which belongs to Kubernetes' volume machinery and is never copied" },
    };
    class_volume_name_template_without_uid: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-name-template": "${pvc.namespace}-${pvc.name}"}}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/volume-name-template (\"${pvc.namespace}-${pvc.name}\") must contain \"${pvc.uid}\", so that no two claims share a volume name" },
    };
    class_volume_name_template_with_part_of_the_uid: Case {
        // Only the whole uid keeps two claims' names apart.
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-name-template": "${pvc.name}-${pvc.uid[:8]}"}}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/volume-name-template (\"${pvc.name}-${pvc.uid[:8]}\") has an unknown token \"${pvc.uid[:8]}\" (known: ${pvc.namespace}, ${pvc.name}, ${pvc.uid})" },
    };
    class_volume_name_template_malformed: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-name-template": "${pvc.name}-${pvc.uid"}}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/volume-name-template is malformed (\"${pvc.name}-${pvc.uid\"): \"${\" without a closing \"}\"" },
    };
    class_volume_name_not_a_pv_name: Case {
        // The uid is in the name: the text is matched from after it.
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-name-template": "Data-${pvc.uid}"}}}"#, claim: "{}" },
        expect: Expect::EventContaining { reason: "ProvisioningFailed", text: "\" made from StorageClass annotation csi-provisioner-rs.io/volume-name-template is not a valid PV name: it must be a DNS subdomain: lowercase alphanumerics, \"-\" and \".\", each part between dots starting and ending with an alphanumeric" },
    };
    class_volume_name_too_long: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-name-template": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa-${pvc.uid}"}}}"#, claim: "{}" },
        expect: Expect::EventContaining { reason: "ProvisioningFailed", text: "\" made from StorageClass annotation csi-provisioner-rs.io/volume-name-template is not a valid PV name: it has 257 characters, more than 253" },
    };
    class_volume_context_key_that_is_not_a_label_key: Case {
        // Refused by the plan: no volume is made.
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-context-labels": "zone,Zone Name"}}, "parameters": {"zone": "z1"}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/volume-context-labels lists \"Zone Name\", which is not a valid label key: the name must consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric" },
    };
    class_volume_context_volume_machinery_key: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-context-annotations": "pv.kubernetes.io/provisioned-by"}}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/volume-context-annotations lists \"pv.kubernetes.io/provisioned-by\", which belongs to Kubernetes' volume machinery and is never copied" },
    };
    class_volume_context_value_that_is_not_a_label_value: Case {
        // The volume exists by then: the entry is left off, the PV saved.
        // The hostpath driver answers with the parameters as the context.
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/volume-context-labels": "tier"}}, "parameters": {"tier": "Gold Tier"}}"#, claim: "{}" },
        expect: Expect::EventThenBound { reason: "VolumeContextSkipped", message: "volume context key \"tier\" is not put on the PV of claim \"{ns}/{claim}\" as a label: its value \"Gold Tier\" is not a valid label value: it must be empty or consist of alphanumerics, \"-\", \"_\" or \".\", and start and end with an alphanumeric" },
    };
    class_claim_metadata_without_the_gate: Case {
        // Gate off: the same class is the Go image's class, `${` and all.
        input: Input::Claim { class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/parameter-templates": "subDir", "csi-provisioner-rs.io/copy-claim-labels": "not a key"}}, "parameters": {"subDir": "${pvc.namespace"}}"#, claim: "{}" },
        expect: Expect::EventThenBound { reason: "ProvisioningSucceeded", message: "Successfully provisioned volume pvc-" },
    };

    // Claims.
    // A real API server refuses a claim without a size or of size 0; one
    // that gets through is provisioned as upstream does: CreateVolume with
    // no required size, the driver's default.
    claim_without_size: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"resources": {"requests": {}}}}"# },
        expect: Expect::EventThenBound { reason: "ProvisioningSucceeded", message: "Successfully provisioned volume pvc-" },
    };
    claim_of_zero_size: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"resources": {"requests": {"storage": "0"}}}}"# },
        expect: Expect::EventThenBound { reason: "ProvisioningSucceeded", message: "Successfully provisioned volume pvc-" },
    };
    claim_of_absurd_size: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"resources": {"requests": {"storage": "9Ei"}}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "invalid storage request of the claim: quantity \"9Ei\" does not fit into 63 bits of bytes" },
    };
    claim_larger_than_the_backend_allows: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"resources": {"requests": {"storage": "2Ti"}}}}"# },
        expect: Expect::EventContaining { reason: "ProvisioningFailed", text: "rpc error: code = OutOfRange desc = " },
    };
    claim_of_unparsable_size: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"resources": {"requests": {"storage": "12 parsecs"}}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "invalid storage request of the claim: quantity \"12 parsecs\" has an unknown suffix \" parsecs\"" },
    };
    claim_limit_below_request: Case {
        // Only a class that sends limits reads them (the Go image never does).
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/claim-storage-limit": "true"}}}"#, claim: r#"{"spec": {"resources": {"requests": {"storage": "2Mi"}, "limits": {"storage": "1Mi"}}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "storage limit 1048576 of the claim is below its request 2097152" },
    };
    claim_limit_below_request_without_the_opt_in: Case {
        // As the Go image: the limit is not read, the request is provisioned.
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"resources": {"requests": {"storage": "2Mi"}, "limits": {"storage": "1Mi"}}}}"# },
        expect: Expect::EventThenBound { reason: "ProvisioningSucceeded", message: "Successfully provisioned volume pvc-" },
    };
    class_claim_storage_limit_not_a_bool: Case {
        input: Input::ClaimWithFlags { flags: CLAIM_METADATA, class: r#"{"metadata": {"annotations": {"csi-provisioner-rs.io/claim-storage-limit": "yes"}}}"#, claim: "{}" },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "StorageClass annotation csi-provisioner-rs.io/claim-storage-limit is \"yes\"; it must be \"true\" or \"false\"" },
    };
    claim_without_access_modes: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"accessModes": []}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "claim has no access modes" },
    };
    claim_unknown_access_mode: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"accessModes": ["ReadWriteSometimes"]}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "unsupported AccessMode combination: [ReadWriteSometimes]" },
    };
    claim_access_modes_the_driver_cannot_serve: Case {
        // The driver's refusal, with upstream's prefix for a final error.
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"accessModes": ["ReadWriteOncePod", "ReadWriteMany"]}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = access mode MULTI_NODE_MULTI_WRITER is not supported by this single-node driver" },
    };
    claim_with_selector: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"selector": {"matchLabels": {"disk": "fast"}}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "claim Selector is not supported" },
    };
    claim_data_source_of_the_wrong_kind: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"dataSource": {"apiGroup": "example.com", "kind": "Backup", "name": "b"}, "dataSourceRef": {"apiGroup": "example.com", "kind": "Backup", "name": "b"}}}"# },
        expect: Expect::Event { reason: "Provisioning", message: "Assuming an external populator will provision the volume" },
    };
    claim_snapshot_source_of_the_wrong_group: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"dataSource": {"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "s"}, "dataSourceRef": {"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "s"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got example.com" },
    };
    claim_source_in_another_namespace_without_the_gate: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "src", "namespace": "elsewhere"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled" },
    };
    claim_clone_source_missing: Case {
        input: Input::Claim { class: "{}", claim: r#"{"spec": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "nothing"}, "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "nothing"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "error getting handle for DataSource Type PersistentVolumeClaim by Name nothing: error getting PVC nothing (namespace \"{ns}\") from api server: persistentvolumeclaim \"nothing\" not found" },
    };
    claim_snapshot_missing: Case {
        input: Input::Claim { class: "{}", claim: SNAPSHOT_SOURCE },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "error getting handle for DataSource Type VolumeSnapshot by Name snap: error getting snapshot snap from api server: volumesnapshots.snapshot.storage.k8s.io \"snap\" not found" },
    };
    claim_snapshot_not_ready: Case {
        input: Input::ClaimAfter {
            objects: r#"[{"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot", "metadata": {"name": "snap", "namespace": "{ns}"}, "spec": {"source": {"persistentVolumeClaimName": "elsewhere"}}}]"#,
            class: "{}",
            claim: SNAPSHOT_SOURCE,
        },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "error getting handle for DataSource Type VolumeSnapshot by Name snap: snapshot snap not bound" },
    };
    claim_selected_node_that_does_not_exist: Case {
        input: Input::Claim { class: r#"{"volumeBindingMode": "WaitForFirstConsumer"}"#, claim: r#"{"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "no-such-node"}}}"# },
        expect: Expect::Event { reason: "ProvisioningFailed", message: "failed to get target node: node \"no-such-node\" not found" },
    };

    // API objects with unexpected nulls.
    object_class_with_null_fields: Case {
        // What an API server would default is read as its default: Delete,
        // Immediate, no parameters, no mount options.
        input: Input::ClaimAfter {
            objects: r#"[{"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "nullish-{ns}"}, "provisioner": "{driver}", "parameters": null, "reclaimPolicy": null, "volumeBindingMode": null, "mountOptions": null, "allowedTopologies": null}]"#,
            class: "{}",
            claim: r#"{"spec": {"storageClassName": "nullish-{ns}"}}"#,
        },
        expect: Expect::EventThenBound { reason: "ProvisioningSucceeded", message: "Successfully provisioned volume pvc-" },
    };
    object_released_pv_of_ours_without_a_csi_source: Case {
        // Annotated as ours, but nothing says what to delete: kept, and said.
        input: Input::Objects(r#"[{"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "no-source-{ns}", "annotations": {"pv.kubernetes.io/provisioned-by": "{driver}"}}, "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Mi"}, "persistentVolumeReclaimPolicy": "Delete", "csi": null, "claimRef": {"namespace": "{ns}", "name": "gone", "uid": "00000000-0000-0000-0000-000000000000"}}}]"#),
        expect: Expect::PvEvent { pv: "no-source-{ns}", reason: "VolumeFailedDelete", message: "invalid CSI PV" },
    };

    // Driver answers.
    driver_empty_volume_id: Case {
        input: Input::CreateReply { reply: |_| Reply { volume_id: Some(String::new()), ..Reply::default() }, times: 1 },
        expect: Expect::EventThenBound { reason: "ProvisioningFailed", message: "CreateVolume returned an empty volume id" },
    };
    driver_capacity_below_the_request: Case {
        input: Input::CreateReply { reply: |_| Reply { capacity_bytes: Some(1), ..Reply::default() }, times: 1 },
        expect: Expect::EventThenBound { reason: "ProvisioningFailed", message: "created volume capacity 1 less than requested capacity 1048576" },
    };
    driver_topology_not_requested: Case {
        input: Input::CreateReply {
            reply: |_| Reply {
                accessible_topology: Some(vec![BTreeMap::from([(csi_hostpath::TOPOLOGY_KEY.to_owned(), "elsewhere".to_owned())])]),
                ..Reply::default()
            },
            times: 1,
        },
        // Recorded as the driver answered, as the Go image does (a driver
        // that always answers its own node would otherwise be asked again
        // for ever: docs/driver-habits.md, row 3), with a warning.
        expect: Expect::LogThenBound { log: "created volume is accessible from [{\"topology.hostpath.csi/node\": \"elsewhere\"}], outside the requested topology [{\"topology.hostpath.csi/node\": \"{node}\"}]; recorded on the PV as the driver answered" },
    };
    driver_oversized_answer: Case {
        input: Input::CreateReply { reply: |_| Reply { padding_bytes: 5 << 20, ..Reply::default() }, times: 1 },
        expect: Expect::EventThenBound { reason: "ProvisioningFailed", message: "rpc error: code = ResourceExhausted desc = Error, decoded message length too large: found " },
    };
    driver_error_with_a_huge_message: Case {
        // Longer than HTTP/2's default header list limit (16 KiB): the
        // driver's code must still come through, or a non-final error
        // could be taken as final (docs/driver-habits.md, row 12).
        input: Input::CreateError { code: tonic::Code::Unavailable, bytes: 20_000, times: 1 },
        expect: Expect::EventThenBound { reason: "ProvisioningFailed", message: "rpc error: code = Unavailable desc = mmmm" },
    };
    driver_unknown_capability_enums: Case {
        input: Input::UnknownCapability,
        expect: Expect::LogThenBound { log: "detected CSI driver" },
    };
}

async fn run(name: &str, case: Case) {
    let mut env = Env::new(Backend::TestServer).await;
    let fill = |env: &Env, text: &str| {
        text.replace("{ns}", &env.ns)
            .replace("{driver}", &env.driver_name)
            .replace("{claim}", CLAIM)
            .replace("{class}", &env.class("bad"))
            .replace("{node}", &env.node)
    };
    if let Input::Flags(flags) = case.input {
        let Expect::Exit { code, stderr } = case.expect else {
            panic!("{name}: flags end in an exit");
        };
        env.start_sidecar(flags).await;
        let mut child = env.sidecar.take().expect("sidecar");
        let status = child
            .wait_timeout(Duration::from_secs(20))
            .expect("the sidecar exits on a bad flag");
        let log = std::fs::read_to_string(env.log_path(1)).unwrap_or_default();
        assert_eq!(status.code(), Some(code), "{name}: exit code\n{log}");
        assert!(
            log.lines().any(|line| line == stderr),
            "{name}: want the line\n  {stderr}\ngot\n{log}"
        );
        assert!(!log.contains("panicked"), "{name}: panicked\n{log}");
        return;
    }
    if let Input::Objects(objects) = case.input {
        let Expect::PvEvent {
            pv,
            reason,
            message,
        } = case.expect
        else {
            panic!("{name}: objects end in an event on them");
        };
        let objects: Vec<Value> = serde_json::from_str(&fill(&env, objects)).expect("objects JSON");
        for object in objects {
            env.create(object).await;
        }
        env.start_sidecar(&[]).await;
        let pv = fill(&env, pv);
        let want = fill(&env, message);
        env.wait_for(
            &format!("event {reason} on PV {pv}"),
            Duration::from_secs(30),
            || async {
                env.pv_events(&pv)
                    .await
                    .into_iter()
                    .find(|(r, m)| r == reason && *m == want)
            },
        )
        .await;
        assert!(env.pv(&pv).await.is_some(), "{name}: the PV stays");
        assert!(
            !env.logs().contains("panicked"),
            "{name}: panicked\n{}",
            env.logs()
        );
        return;
    }
    let mut flags: &[&str] = &[];
    let (class_extra, claim_extra, reply, times) = match &case.input {
        Input::Claim { class, claim } => (fill(&env, class), fill(&env, claim), None, 0),
        Input::ClaimWithFlags {
            flags: extra,
            class,
            claim,
        } => {
            flags = extra;
            (fill(&env, class), fill(&env, claim), None, 0)
        }
        Input::ClaimAfter {
            objects,
            class,
            claim,
        } => {
            let objects: Vec<Value> =
                serde_json::from_str(&fill(&env, objects)).expect("objects JSON");
            for object in objects {
                env.create(object).await;
            }
            (fill(&env, class), fill(&env, claim), None, 0)
        }
        Input::CreateReply { reply, times } => {
            ("{}".to_owned(), "{}".to_owned(), Some(reply(&env)), *times)
        }
        Input::UnknownCapability | Input::CreateError { .. } => {
            ("{}".to_owned(), "{}".to_owned(), None, 0)
        }
        Input::Flags(_) | Input::Objects(_) => unreachable!("handled above"),
    };
    let class_extra: Value = serde_json::from_str(&class_extra).expect("class JSON");
    let claim_extra: Value = serde_json::from_str(&claim_extra).expect("claim JSON");
    let binding = class_extra["volumeBindingMode"]
        .as_str()
        .unwrap_or("Immediate")
        .to_owned();
    env.storage_class_with("bad", &binding, "Delete", json!({}), class_extra)
        .await;
    if let Some(reply) = reply {
        env.set_faults(vec![Fault::reply("CreateVolume", reply).times(times)]);
    }
    if let Input::CreateError { code, bytes, times } = case.input {
        let message = "m".repeat(bytes);
        env.set_faults(vec![
            Fault::error("CreateVolume", code)
                .with_message(&message)
                .times(times),
        ]);
    }
    if let Input::UnknownCapability = case.input {
        env.set_faults(vec![
            Fault::reply(
                "ControllerGetCapabilities",
                Reply {
                    extra_capability: Some(9999),
                    ..Reply::default()
                },
            ),
            Fault::reply(
                "GetPluginCapabilities",
                Reply {
                    extra_capability: Some(9999),
                    ..Reply::default()
                },
            ),
        ]);
    }
    env.start_sidecar(flags).await;
    env.create_pvc(&env.ns, CLAIM, "bad", "1Mi", claim_extra)
        .await;
    match case.expect {
        Expect::Exit { .. } | Expect::PvEvent { .. } => {
            panic!("{name}: only flags end in an exit, only objects in a PV event")
        }
        Expect::Event { reason, message } => {
            let want = fill(&env, message);
            let got = wait_event_with(&env, reason, |m| m == want).await;
            assert_eq!(got, want, "{name}");
            assert!(env.pvs().await.is_empty(), "{name}: nothing is provisioned");
        }
        Expect::EventContaining { reason, text } => {
            let want = fill(&env, text);
            wait_event_with(&env, reason, |m| m.contains(&want)).await;
        }
        Expect::EventThenBound { reason, message } => {
            let want = fill(&env, message);
            wait_event_with(&env, reason, |m| m.starts_with(&want)).await;
            env.wait_bound(&env.ns, CLAIM).await;
        }
        Expect::LogThenBound { log } => {
            env.wait_bound(&env.ns, CLAIM).await;
            let log = fill(&env, log);
            // A line of the text format quotes its message.
            let quoted = log.replace('"', "\\\"");
            env.wait_for(
                &format!("{name}: {log:?} in the logs"),
                Duration::from_secs(10),
                || async {
                    let logs = env.logs();
                    (logs.contains(&log) || logs.contains(&quoted)).then_some(())
                },
            )
            .await;
        }
    }
    // Nothing lost and nothing leaked, with the claim there and once gone.
    env.assert_consistent().await;
    env.delete_pvc(&env.ns, CLAIM).await;
    env.wait_for(
        "the claim's volume and PV gone",
        Duration::from_secs(30),
        || async { (env.pvs().await.is_empty() && env.backend_volumes().is_empty()).then_some(()) },
    )
    .await;
    assert!(
        !env.logs().contains("panicked"),
        "{name}: panicked\n{}",
        env.logs()
    );
}

/// The message of the first event `reason` on the case's claim that
/// `wanted` accepts (after 30 s: the claim's events, for the failure).
async fn wait_event_with(env: &Env, reason: &str, wanted: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let events = env.events(&env.ns, CLAIM).await;
        if let Some((_, message)) = events.iter().find(|(r, m)| r == reason && wanted(m)) {
            return message.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no matching {reason} event on {}/{CLAIM}; events: {events:#?}\n{}",
            env.ns,
            env.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
