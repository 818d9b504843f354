//! The audit's decisions, with plain values in: which backend volumes no
//! PV names (suspects), which of them are orphans (suspects at two audits
//! in a row), which a sidecar with another `--volume-name-prefix` made (left
//! out), what the metric shows and what the report holds.

use std::collections::{BTreeMap, BTreeSet};

use crate::migration::{InTreePlugin, translate_in_tree_pv_to_csi};
use crate::projection::{PersistentVolume, Projection};

/// One volume of the driver's `ListVolumes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub volume_id: String,
    /// `capacity_bytes`; 0 (or less) when the driver did not give it.
    pub capacity_bytes: i64,
    pub volume_context: BTreeMap<String, String>,
}

/// What one audit compares.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// Every page of `ListVolumes`, in the driver's order.
    pub listed: &'a [Listed],
    /// The volume handles of this driver's PVs (one consistent list).
    pub named: &'a BTreeSet<String>,
    /// The CSI names (`CreateVolumeRequest.name`) of the operations in
    /// flight, read after `ListVolumes` and before the PV list.
    pub in_flight: &'a BTreeSet<String>,
    /// The suspects of the previous audit of this process; `None` at its
    /// first audit.
    pub previous: Option<&'a BTreeSet<String>>,
    /// How this sidecar names its volumes.
    pub naming: &'a Naming,
}

/// How this sidecar names its volumes (`volume_name` in
/// src/provision/plan.rs): `<prefix>-<claim uid>`, or with a uuid length
/// `<prefix>-<the uid without dashes, cut to that length>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// `--volume-name-prefix`.
    pub prefix: String,
    /// `--volume-name-uuid-length`, when set.
    pub uuid_length: Option<usize>,
    /// The gate `ClaimMetadataPropagation` is on: a StorageClass's
    /// `csi-provisioner-rs.io/volume-name-template` may give this sidecar's
    /// volumes names with any prefix, so another prefix proves nothing.
    pub templates: bool,
}

impl Naming {
    /// The naming of the provisioner's configuration.
    pub fn of(config: &crate::provision::ProvisionerConfig) -> Naming {
        Naming {
            prefix: config.volume_name_prefix.clone(),
            uuid_length: config.volume_name_uuid_length,
            templates: config.claim_metadata_propagation,
        }
    }

    /// Names with other prefixes mean another sidecar made the volume:
    /// this sidecar's names are found (its prefix is made of characters a
    /// PV name may have, else no token holds it) and always carry its
    /// prefix (no name templates).
    fn other_prefixes_decide(&self) -> bool {
        !self.templates && !self.prefix.is_empty() && self.prefix.chars().all(pv_name_char)
    }
}

/// Who made a listed volume, by the PV-style names its id and volume
/// context show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadeBy {
    /// A name with this sidecar's prefix.
    OurPrefix,
    /// Names with other prefixes only: a sidecar with another
    /// `--volume-name-prefix` (another cluster sharing the backend).
    OtherPrefixes,
    /// No name shown (a generated id, as the hostpath driver's), or names
    /// that prove nothing (see [`Naming::other_prefixes_decide`]).
    Unknown,
}

/// A character a PV name (a DNS subdomain) may have.
fn pv_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'
}

/// A claim uid as the API server writes it: 8-4-4-4-12 lowercase hex.
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// The prefix of `token` when it is a volume name: `<prefix>-<uuid>` (any
/// non-empty prefix; a bare uuid is no name), or, with a uuid length N,
/// `<our prefix>-<N lowercase hex digits>` (the uid cut to N after its
/// dashes are dropped, at most 32; other sidecars' lengths are unknown).
fn name_prefix<'t>(token: &'t str, naming: &Naming) -> Option<&'t str> {
    if let Some(prefix) = token
        .len()
        .checked_sub(37)
        .filter(|&at| at > 0 && token.is_char_boundary(at))
        .and_then(|at| {
            let (prefix, rest) = token.split_at(at);
            rest.strip_prefix('-')
                .filter(|uuid| is_uuid(uuid))
                .map(|_| prefix)
        })
    {
        return Some(prefix);
    }
    let length = naming.uuid_length.filter(|n| (1..=32).contains(n))?;
    let short = token
        .strip_prefix(naming.prefix.as_str())?
        .strip_prefix('-')?;
    (short.len() == length
        && short
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)))
    .then(|| &token[..naming.prefix.len()])
}

/// Who made `volume`: the names in its id and in its volume context's
/// values, split into tokens at every character a PV name cannot have
/// (csi-driver-nfs: `server#share#pvc-<uid>#`; democratic-csi: the name
/// itself; drivers that echo `csi.storage.k8s.io/pv/name` in the context).
pub fn made_by(volume: &Listed, naming: &Naming) -> MadeBy {
    let mut other = false;
    let texts = std::iter::once(&volume.volume_id).chain(volume.volume_context.values());
    for token in texts.flat_map(|text| text.split(|c| !pv_name_char(c))) {
        match name_prefix(token, naming) {
            Some(prefix) if prefix == naming.prefix => return MadeBy::OurPrefix,
            Some(_) => other = true,
            None => {}
        }
    }
    if other && naming.other_prefixes_decide() {
        MadeBy::OtherPrefixes
    } else {
        MadeBy::Unknown
    }
}

/// What one audit found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Volume ids no PV names and no operation in flight made: the next
    /// audit's `previous`.
    pub suspects: BTreeSet<String>,
    /// Suspects that were suspects at the previous audit too, by volume id.
    pub orphans: Vec<Listed>,
    /// Suspects seen for the first time (reported at the next audit if
    /// still suspects).
    pub awaiting_confirmation: usize,
    /// There was a previous audit: `orphans` is a finding. At a process's
    /// first audit nothing can be confirmed, and nothing is reported.
    pub confirmed: bool,
    /// Distinct volumes listed (entries without an id not counted).
    pub listed: usize,
    /// Listed volumes a PV names.
    pub named: usize,
    /// Listed volumes no PV names that an operation in flight may be making.
    pub in_flight: usize,
    /// Listed volumes no PV names and no operation in flight may be making
    /// whose names show only other prefixes ([`MadeBy::OtherPrefixes`]):
    /// neither suspects nor reported.
    pub other_prefix: usize,
}

/// Whether an operation in flight of CSI name `name` may have made `volume`:
/// its id is the name, or its volume context carries the name (drivers that
/// expose it). Drivers with generated ids show neither, and rest on the
/// two-audit rule alone.
fn made_in_flight(volume: &Listed, in_flight: &BTreeSet<String>) -> bool {
    in_flight.contains(&volume.volume_id)
        || volume
            .volume_context
            .values()
            .any(|value| in_flight.contains(value))
}

/// The audit: a listed volume no PV names, no operation in flight may have
/// made and no sidecar with another prefix made ([`made_by`]) is a suspect;
/// a suspect of the previous audit that is still one is an orphan. A volume
/// being provisioned right now (its PV saved a moment after the PV list) or
/// deleted right now (its PV gone, its `DeleteVolume` not yet done) is a
/// suspect once, never an orphan, as long as the interval is longer than the
/// provisioning or deletion.
pub fn audit(inputs: Inputs<'_>) -> Outcome {
    let mut seen = BTreeSet::new();
    let mut out = Outcome {
        confirmed: inputs.previous.is_some(),
        ..Outcome::default()
    };
    let mut orphans = Vec::new();
    for volume in inputs.listed {
        // No id: nothing can name it, nor hand it over.
        if volume.volume_id.is_empty() || !seen.insert(volume.volume_id.as_str()) {
            continue;
        }
        out.listed += 1;
        if inputs.named.contains(&volume.volume_id) {
            out.named += 1;
            continue;
        }
        if made_in_flight(volume, inputs.in_flight) {
            out.in_flight += 1;
            continue;
        }
        if made_by(volume, inputs.naming) == MadeBy::OtherPrefixes {
            out.other_prefix += 1;
            continue;
        }
        out.suspects.insert(volume.volume_id.clone());
        match inputs.previous {
            Some(previous) if previous.contains(&volume.volume_id) => orphans.push(volume.clone()),
            _ => out.awaiting_confirmation += 1,
        }
    }
    orphans.sort_by(|a, b| a.volume_id.cmp(&b.volume_id));
    out.orphans = orphans;
    out
}

/// The orphans' total size for the bytes gauge: the sum of the capacities
/// the driver gave; `None` when there are orphans and the driver gave the
/// capacity of none of them (the gauge is then absent, not 0).
pub fn total_bytes(orphans: &[Listed]) -> Option<u64> {
    let known: Vec<u64> = orphans
        .iter()
        .filter_map(|v| u64::try_from(v.capacity_bytes).ok().filter(|b| *b > 0))
        .collect();
    if known.is_empty() && !orphans.is_empty() {
        return None;
    }
    Some(known.into_iter().fold(0u64, u64::saturating_add))
}

/// The volume handle this driver's PV names: its CSI source's, or, for an
/// in-tree PV whose plugin migrated to this driver, the handle of its CSI
/// translation (the volume is the same). `None` for another driver's PV.
pub fn named_handle(pv: &PersistentVolume, driver: &str) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    if let Some(csi) = &spec.csi {
        return (&*csi.driver == driver && !csi.volume_handle.is_empty())
            .then(|| csi.volume_handle.clone());
    }
    let plugin = InTreePlugin::of_in_tree_volume(pv)?;
    if plugin.csi_driver() != driver {
        return None;
    }
    let translated = translate_in_tree_pv_to_csi(&pv.to_object()).ok()?;
    translated
        .spec?
        .csi
        .map(|csi| csi.volume_handle)
        .filter(|h| !h.is_empty())
}

/// The report's name: `<lease name>-orphan-audit`, and with
/// `--node-deployment` (one audit per node) `-<node>` after it (a Node's
/// name is a DNS subdomain, as a ConfigMap's); at most 253 characters.
pub fn report_name(driver: &str, node: Option<&str>) -> String {
    let name = match node.filter(|n| !n.is_empty()) {
        Some(node) => format!("{}-orphan-audit-{node}", crate::leader::lease_name(driver)),
        None => format!("{}-orphan-audit", crate::leader::lease_name(driver)),
    };
    let name: String = name.chars().take(253).collect();
    name.trim_end_matches(['-', '.']).to_owned()
}

/// Bounds of the report: a ConfigMap holds at most 1 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReportLimits {
    /// At most this many volumes listed.
    pub max_entries: usize,
    /// At most this many bytes of volume lines.
    pub max_bytes: usize,
}

impl Default for ReportLimits {
    fn default() -> Self {
        ReportLimits {
            max_entries: 500,
            max_bytes: 256 * 1024,
        }
    }
}

/// The facts the report's summary states besides the outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportHeader<'a> {
    pub driver: &'a str,
    /// `--volume-name-prefix`.
    pub volume_name_prefix: &'a str,
    /// RFC 3339.
    pub audited_at: &'a str,
    pub interval: &'a str,
}

/// One orphan as a report line: a JSON object, capacity left out when the
/// driver did not give it.
pub fn report_line(volume: &Listed) -> String {
    let mut line = serde_json::Map::new();
    line.insert("volumeId".into(), volume.volume_id.clone().into());
    if volume.capacity_bytes > 0 {
        line.insert("capacityBytes".into(), volume.capacity_bytes.into());
    }
    line.insert(
        "volumeContext".into(),
        serde_json::to_value(&volume.volume_context).unwrap_or_default(),
    );
    serde_json::Value::Object(line).to_string()
}

/// The report ConfigMap's data: `summary` (one `key: value` a line, YAML)
/// and `orphans` (one JSON object a line, by volume id), the latter cut at
/// `limits` with the number left out in the summary (`notShown`).
pub fn report_data(
    header: &ReportHeader<'_>,
    outcome: &Outcome,
    limits: ReportLimits,
) -> BTreeMap<String, String> {
    let mut lines = String::new();
    let mut shown = 0;
    for volume in &outcome.orphans {
        if shown >= limits.max_entries {
            break;
        }
        let line = report_line(volume);
        if lines.len() + line.len() + 1 > limits.max_bytes {
            break;
        }
        lines.push_str(&line);
        lines.push('\n');
        shown += 1;
    }
    let bytes = match total_bytes(&outcome.orphans) {
        Some(bytes) => bytes.to_string(),
        None => "unknown".to_owned(),
    };
    let quoted = |s: &str| serde_json::Value::from(s).to_string();
    let summary = [
        ("driver", quoted(header.driver)),
        ("volumeNamePrefix", quoted(header.volume_name_prefix)),
        ("auditedAt", quoted(header.audited_at)),
        ("interval", quoted(header.interval)),
        ("listed", outcome.listed.to_string()),
        ("namedByPVs", outcome.named.to_string()),
        ("inFlight", outcome.in_flight.to_string()),
        ("madeByOtherPrefixes", outcome.other_prefix.to_string()),
        ("orphans", outcome.orphans.len().to_string()),
        ("orphanBytes", bytes),
        ("shown", shown.to_string()),
        ("notShown", (outcome.orphans.len() - shown).to_string()),
        (
            "awaitingConfirmation",
            outcome.awaiting_confirmation.to_string(),
        ),
        (
            "howToDelete",
            quoted(
                "nothing is deleted automatically; see docs/operations.md, \"Orphan audit\": \
                 apply a PV naming the volume",
            ),
        ),
    ]
    .into_iter()
    .map(|(key, value)| format!("{key}: {value}\n"))
    .collect::<String>();
    BTreeMap::from([
        ("summary".to_owned(), summary),
        ("orphans".to_owned(), lines),
    ])
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
