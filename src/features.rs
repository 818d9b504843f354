//! `--feature-gates` in the Kubernetes syntax (`A=true,B=false`), with the
//! gates, their maturity and defaults (the README's "Feature gates" table;
//! docs/design.md, "The embedded loops and their gates").

use std::collections::BTreeMap;
use std::fmt;

/// Every gate this sidecar knows, with its maturity and default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// KEP-2644: the PV deletion-protection finalizer, so that a PV deleted
    /// before its claim cannot leak its volume.
    HonorPVReclaimPolicy,
    /// Embedded PVC-protection loop ([`crate::protection`]).
    PVCProtection,
    /// Embedded StatefulSet PVC retention loop ([`crate::retention`]).
    StatefulSetAutoDeletePVC,
    /// Embedded PV releaser loop ([`crate::releaser`]), needs `--controller-id`.
    PVReleaser,
    /// Topology-aware provisioning.
    Topology,
    /// Pass VolumeAttributesClass parameters to CreateVolume.
    VolumeAttributesClass,
    /// Data sources in other namespaces (with ReferenceGrants).
    CrossNamespaceVolumeDataSource,
    /// Give up the Lease on a clean exit so a successor need not wait.
    ReleaseLeaderElectionOnExit,
    /// Embedded pod/Job-annotation PVC provisioner, the releaser's
    /// companion; needs `--controller-id`.
    PodPVCProvisioner,
    /// StorageClasses may opt in, key by key, to parameter templates
    /// resolved from the claim (`${pvc.name}`, `${pvc.annotations['KEY']}`,
    /// ...) and to claim labels and annotations copied onto the PV
    /// ([`crate::provision::claim_metadata`]).
    ClaimMetadataPropagation,
}

/// Gates the upstream binary accepts because the Kubernetes libraries it
/// links register them (client-go, apiserver, component-base: see its
/// `--help`). None of them changes the sidecar's behaviour there either;
/// here they are accepted, kept for the start-up report and ignored, so a
/// command line written for the Go image still starts.
pub const UPSTREAM_LIBRARY_GATES: &[&str] = &[
    "APIResponseCompression",
    "APIServerIdentity",
    "APIServingWithRoutine",
    "AllowParsingUserUIDFromCertAuth",
    "AllowUnsafeMalformedObjectDeletion",
    "CBORServingAndStorage",
    "ComponentFlagz",
    "ComponentStatusz",
    "ConcurrentWatchObjectDecode",
    "ConstrainedImpersonation",
    "CoordinatedLeaderElection",
    "DeclarativeValidationBeta",
    "DetectCacheInconsistency",
    "ListFromCacheSnapshot",
    "ManifestBasedAdmissionControlConfig",
    "NativeHistograms",
    "OpenAPIEnums",
    "RemoteRequestHeaderUID",
    "ShardedListAndWatch",
    "SizeBasedListCostEstimate",
    "StorageVersionAPI",
    "StorageVersionHash",
    "StructuredAuthenticationConfigurationEgressSelector",
    "StructuredAuthenticationConfigurationJWKSMetrics",
    "TokenRequestServiceAccountUIDValidation",
    "UnauthenticatedHTTP2DOSMitigation",
    "UnknownVersionInteroperabilityProxy",
    "WatchCacheInitializationPostStartHook",
    "WatchList",
];

/// Gates that parse but whose loops are not built yet; enabling one is
/// reported at start-up so nobody believes it took effect.
pub const NOT_YET_IMPLEMENTED: &[Feature] = &[];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    Ga,
}

impl Feature {
    pub const ALL: [Feature; 10] = [
        Feature::HonorPVReclaimPolicy,
        Feature::PVCProtection,
        Feature::StatefulSetAutoDeletePVC,
        Feature::PVReleaser,
        Feature::Topology,
        Feature::VolumeAttributesClass,
        Feature::CrossNamespaceVolumeDataSource,
        Feature::ReleaseLeaderElectionOnExit,
        Feature::PodPVCProvisioner,
        Feature::ClaimMetadataPropagation,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Feature::HonorPVReclaimPolicy => "HonorPVReclaimPolicy",
            Feature::PVCProtection => "PVCProtection",
            Feature::StatefulSetAutoDeletePVC => "StatefulSetAutoDeletePVC",
            Feature::PVReleaser => "PVReleaser",
            Feature::Topology => "Topology",
            Feature::VolumeAttributesClass => "VolumeAttributesClass",
            Feature::CrossNamespaceVolumeDataSource => "CrossNamespaceVolumeDataSource",
            Feature::ReleaseLeaderElectionOnExit => "ReleaseLeaderElectionOnExit",
            Feature::PodPVCProvisioner => "PodPVCProvisioner",
            Feature::ClaimMetadataPropagation => "ClaimMetadataPropagation",
        }
    }

    pub fn default_enabled(self) -> bool {
        matches!(
            self,
            Feature::HonorPVReclaimPolicy | Feature::Topology | Feature::VolumeAttributesClass
        )
    }

    pub fn stage(self) -> Stage {
        match self {
            Feature::HonorPVReclaimPolicy | Feature::Topology | Feature::VolumeAttributesClass => {
                Stage::Ga
            }
            Feature::PVCProtection
            | Feature::StatefulSetAutoDeletePVC
            | Feature::PVReleaser
            | Feature::CrossNamespaceVolumeDataSource
            | Feature::ReleaseLeaderElectionOnExit
            | Feature::PodPVCProvisioner
            | Feature::ClaimMetadataPropagation => Stage::Alpha,
        }
    }

    /// Whether the upstream sidecar has this gate. `AllAlpha` / `AllBeta`
    /// reach only these: a command line written for the Go image that says
    /// `AllAlpha=true` must not switch on our embedded loops, which write
    /// to objects the Go sidecar never touches (and one of which needs a
    /// flag the Go image does not have), nor change what a class means.
    pub fn upstream(self) -> bool {
        !matches!(
            self,
            Feature::PVCProtection
                | Feature::StatefulSetAutoDeletePVC
                | Feature::PVReleaser
                | Feature::PodPVCProvisioner
                | Feature::ClaimMetadataPropagation
        )
    }

    fn from_name(name: &str) -> Option<Feature> {
        Feature::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FeatureGateError {
    /// Upstream's words, then what was perhaps meant and the gates there
    /// are.
    #[error(
        "unrecognized feature gate: {0}{hint}; the gates are {gates} (the Kubernetes library gates the Go image accepts, such as WatchList, are accepted and ignored)",
        hint = did_you_mean(.0),
        gates = known_gates()
    )]
    Unknown(String),
    #[error("missing bool value for {0}")]
    MissingValue(String),
    #[error(
        "invalid value of {gate}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax"
    )]
    BadValue { gate: String, value: String },
}

/// Every gate name `--feature-gates` takes that changes something here,
/// for the error about one it does not know: ours, then `AllAlpha` and
/// `AllBeta`.
fn known_gates() -> String {
    let mut names: Vec<&str> = Feature::ALL.into_iter().map(Feature::name).collect();
    names.extend(["AllAlpha", "AllBeta"]);
    let (last, rest) = names.split_last().expect("gates");
    format!("{} and {last}", rest.join(", "))
}

/// ` (did you mean X?)` for a name that is a known gate's but for case.
fn did_you_mean(name: &str) -> String {
    Feature::ALL
        .into_iter()
        .map(Feature::name)
        .chain(["AllAlpha", "AllBeta"])
        .chain(UPSTREAM_LIBRARY_GATES.iter().copied())
        .find(|gate| !name.is_empty() && gate.eq_ignore_ascii_case(name))
        .map(|gate| format!(" (did you mean {gate}?)"))
        .unwrap_or_default()
}

/// The resolved gates: defaults overridden by what the command line set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<Feature, bool>,
    /// Gates named on the command line (not through `AllAlpha`/`AllBeta`):
    /// component-base's `ExplicitlySet`.
    explicit: std::collections::BTreeSet<Feature>,
    /// Upstream library gates that were set ([`UPSTREAM_LIBRARY_GATES`]).
    ignored: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    fn default() -> Self {
        Self {
            enabled: Feature::ALL
                .into_iter()
                .map(|f| (f, f.default_enabled()))
                .collect(),
            explicit: Default::default(),
            ignored: BTreeMap::new(),
        }
    }
}

impl FeatureGates {
    pub fn enabled(&self, feature: Feature) -> bool {
        self.enabled
            .get(&feature)
            .copied()
            .unwrap_or(feature.default_enabled())
    }

    /// Whether the command line named the gate (upstream decides some
    /// defaults only for gates the user did not set, e.g. #1425).
    pub fn explicitly_set(&self, feature: Feature) -> bool {
        self.explicit.contains(&feature)
    }

    pub fn set(&mut self, feature: Feature, value: bool) {
        self.enabled.insert(feature, value);
    }

    /// Applies one `--feature-gates` value. Like Kubernetes: comma separated
    /// `Name=bool` pairs, spaces around items ignored, empty items skipped,
    /// `AllAlpha` / `AllBeta` set every gate of that stage (explicit gates in
    /// the same value win regardless of order).
    pub fn apply(&mut self, spec: &str) -> Result<(), FeatureGateError> {
        let mut explicit = Vec::new();
        let mut ignored = Vec::new();
        let mut all_alpha = None;
        let mut all_beta = None;
        for item in spec.split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let Some((name, value)) = item.split_once('=') else {
                return Err(FeatureGateError::MissingValue(item.to_owned()));
            };
            let (name, value) = (name.trim(), value.trim());
            let parsed = parse_go_bool(value).ok_or_else(|| FeatureGateError::BadValue {
                gate: name.to_owned(),
                value: value.to_owned(),
            })?;
            match name {
                "AllAlpha" => all_alpha = Some(parsed),
                "AllBeta" => all_beta = Some(parsed),
                _ => {
                    if let Some(library) = UPSTREAM_LIBRARY_GATES.iter().find(|g| **g == name) {
                        ignored.push((*library, parsed));
                        continue;
                    }
                    let feature = Feature::from_name(name)
                        .ok_or_else(|| FeatureGateError::Unknown(name.to_owned()))?;
                    explicit.push((feature, parsed));
                }
            }
        }
        for feature in Feature::ALL.into_iter().filter(|f| f.upstream()) {
            match (feature.stage(), all_alpha, all_beta) {
                (Stage::Alpha, Some(v), _) | (Stage::Beta, _, Some(v)) => self.set(feature, v),
                _ => {}
            }
        }
        for (feature, value) in explicit {
            self.set(feature, value);
            self.explicit.insert(feature);
        }
        self.ignored.extend(ignored);
        Ok(())
    }

    /// Upstream library gates set on the command line, which have no
    /// effect here (named at start-up).
    pub fn ignored(&self) -> impl Iterator<Item = (&'static str, bool)> + '_ {
        self.ignored.iter().map(|(name, value)| (*name, *value))
    }

    /// `Name=bool` for every gate, for the start-up log line.
    pub fn summary(&self) -> String {
        Feature::ALL
            .into_iter()
            .map(|f| format!("{}={}", f.name(), self.enabled(f)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Go's `strconv.ParseBool`: the spellings a Go flag accepts for booleans.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_design_table() {
        let gates = FeatureGates::default();
        assert!(gates.enabled(Feature::HonorPVReclaimPolicy));
        assert!(gates.enabled(Feature::Topology));
        assert!(gates.enabled(Feature::VolumeAttributesClass));
        assert!(!gates.enabled(Feature::PVCProtection));
        assert!(!gates.enabled(Feature::StatefulSetAutoDeletePVC));
        assert!(!gates.enabled(Feature::PVReleaser));
        assert!(!gates.enabled(Feature::CrossNamespaceVolumeDataSource));
        assert!(!gates.enabled(Feature::ReleaseLeaderElectionOnExit));
        assert!(!gates.enabled(Feature::ClaimMetadataPropagation));
    }

    #[test]
    fn claim_metadata_gate_is_alpha_ours_and_named() {
        let feature = Feature::ClaimMetadataPropagation;
        assert_eq!(feature.stage(), Stage::Alpha);
        assert!(!feature.default_enabled());
        assert!(
            !feature.upstream(),
            "AllAlpha must not change what a class means"
        );
        let mut gates = FeatureGates::default();
        gates.apply("ClaimMetadataPropagation=true").expect("valid");
        assert!(gates.enabled(feature));
        assert!(
            gates.summary().ends_with(",ClaimMetadataPropagation=true"),
            "{}",
            gates.summary()
        );
        assert!(
            FeatureGates::default()
                .summary()
                .contains("ClaimMetadataPropagation=false")
        );
        // Only by name: AllAlpha leaves it off, and a misspelling is an error.
        let mut gates = FeatureGates::default();
        gates.apply("AllAlpha=true").expect("valid");
        assert!(!gates.enabled(feature));
        assert_eq!(
            FeatureGates::default().apply("ClaimMetadataInParameters=true"),
            Err(FeatureGateError::Unknown(
                "ClaimMetadataInParameters".into()
            ))
        );
    }

    #[test]
    fn parses_kubernetes_syntax() {
        let mut gates = FeatureGates::default();
        gates
            .apply(" PVCProtection=true, HonorPVReclaimPolicy=false,,PVReleaser=T ")
            .expect("valid");
        assert!(gates.enabled(Feature::PVCProtection));
        assert!(!gates.enabled(Feature::HonorPVReclaimPolicy));
        assert!(gates.enabled(Feature::PVReleaser));
        // A later flag value merges with the earlier one.
        gates.apply("PVReleaser=0").expect("valid");
        assert!(!gates.enabled(Feature::PVReleaser));
        assert!(gates.enabled(Feature::PVCProtection));
        gates.apply("").expect("empty is fine");
    }

    #[test]
    fn all_alpha_and_explicit_override() {
        let mut gates = FeatureGates::default();
        gates
            .apply("ReleaseLeaderElectionOnExit=false,AllAlpha=true")
            .expect("valid");
        assert!(gates.enabled(Feature::CrossNamespaceVolumeDataSource));
        assert!(
            !gates.enabled(Feature::ReleaseLeaderElectionOnExit),
            "explicit gate wins"
        );
        assert!(gates.enabled(Feature::HonorPVReclaimPolicy), "GA untouched");
        // Named gates are explicitly set; AllAlpha sets none explicitly.
        assert!(gates.explicitly_set(Feature::ReleaseLeaderElectionOnExit));
        assert!(!gates.explicitly_set(Feature::CrossNamespaceVolumeDataSource));
        assert!(!gates.explicitly_set(Feature::VolumeAttributesClass));
        assert!(!FeatureGates::default().explicitly_set(Feature::VolumeAttributesClass));
        // Our embedded loops are switched on by name only.
        assert!(!gates.enabled(Feature::PVCProtection));
        assert!(!gates.enabled(Feature::StatefulSetAutoDeletePVC));
        assert!(!gates.enabled(Feature::PVReleaser));
        gates
            .apply("AllAlpha=true,PVCProtection=true")
            .expect("valid");
        assert!(gates.enabled(Feature::PVCProtection));
        gates.apply("AllBeta=false").expect("valid, no beta gates");
    }

    #[test]
    fn every_bad_input_names_the_gate() {
        let cases = [
            ("Bogus=true", FeatureGateError::Unknown("Bogus".into())),
            (
                "pvcprotection=true",
                FeatureGateError::Unknown("pvcprotection".into()),
            ),
            (
                "PVCProtection",
                FeatureGateError::MissingValue("PVCProtection".into()),
            ),
            (
                "PVCProtection=yes",
                FeatureGateError::BadValue {
                    gate: "PVCProtection".into(),
                    value: "yes".into(),
                },
            ),
            (
                "Topology=",
                FeatureGateError::BadValue {
                    gate: "Topology".into(),
                    value: "".into(),
                },
            ),
            ("=true", FeatureGateError::Unknown("".into())),
        ];
        for (spec, want) in cases {
            let mut gates = FeatureGates::default();
            assert_eq!(gates.apply(spec), Err(want.clone()), "{spec}");
            assert_eq!(gates, FeatureGates::default(), "{spec}: nothing applied");
        }
        assert!(
            FeatureGateError::Unknown("Bogus".into())
                .to_string()
                .contains("Bogus")
        );
    }

    #[test]
    fn an_unknown_gate_is_told_with_the_known_ones() {
        assert_eq!(
            FeatureGateError::Unknown("Foo".into()).to_string(),
            "unrecognized feature gate: Foo; the gates are HonorPVReclaimPolicy, PVCProtection, \
             StatefulSetAutoDeletePVC, PVReleaser, Topology, VolumeAttributesClass, \
             CrossNamespaceVolumeDataSource, ReleaseLeaderElectionOnExit, PodPVCProvisioner, \
             ClaimMetadataPropagation, AllAlpha and AllBeta (the Kubernetes library gates the Go \
             image accepts, such as WatchList, are accepted and ignored)"
        );
        // Every gate of ours is in the list.
        let told = FeatureGateError::Unknown("Foo".into()).to_string();
        for feature in Feature::ALL {
            assert!(told.contains(feature.name()), "{feature}");
        }
        // A name that is a gate's but for case says which.
        assert!(
            FeatureGateError::Unknown("pvcprotection".into())
                .to_string()
                .starts_with(
                    "unrecognized feature gate: pvcprotection (did you mean PVCProtection?); the gates are "
                )
        );
        assert!(
            FeatureGateError::Unknown("watchlist".into())
                .to_string()
                .contains("(did you mean WatchList?)")
        );
        assert!(
            !FeatureGateError::Unknown("".into())
                .to_string()
                .contains("did you mean")
        );
    }

    #[test]
    fn upstream_library_gates_are_accepted_and_ignored() {
        let mut gates = FeatureGates::default();
        gates
            .apply("WatchList=false,PVCProtection=true,CoordinatedLeaderElection=true")
            .expect("library gates parse");
        assert!(gates.enabled(Feature::PVCProtection));
        assert_eq!(
            gates.ignored().collect::<Vec<_>>(),
            vec![("CoordinatedLeaderElection", true), ("WatchList", false)]
        );
        // Still validated like any gate.
        assert!(gates.apply("WatchList=maybe").is_err());
        // AllAlpha does not reach them.
        let mut gates = FeatureGates::default();
        gates.apply("AllAlpha=true").expect("valid");
        assert_eq!(gates.ignored().count(), 0);
        for name in UPSTREAM_LIBRARY_GATES {
            assert!(Feature::from_name(name).is_none(), "{name} is one of ours");
        }
    }

    #[test]
    fn go_bool_spellings() {
        for v in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_go_bool(v), Some(true), "{v}");
        }
        for v in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_go_bool(v), Some(false), "{v}");
        }
        for v in ["", "yes", "no", "tRUE", "2", " true"] {
            assert_eq!(parse_go_bool(v), None, "{v}");
        }
    }
}
