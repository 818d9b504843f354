//! Identity service: GetPluginInfo, GetPluginCapabilities, Probe.

use csi_proto::v1 as csi;

use super::util::{Must, ensure, fail};
use crate::runner::{Check, CheckOutcome, T};

pub const INFO: &str = "Identity Service GetPluginInfo should return appropriate information";
pub const INFO_NAME: &str = "Identity Service GetPluginInfo should return a name in domain-name notation of at most 63 characters";
pub const CAPS: &str =
    "Identity Service GetPluginCapabilities should return appropriate capabilities";
pub const PROBE: &str = "Identity Service Probe should return appropriate information";

pub fn checks() -> Vec<Check> {
    vec![
        check!(CAPS, plugin_capabilities),
        check!(PROBE, probe),
        check!(INFO, plugin_info),
        check!(INFO_NAME, plugin_name),
    ]
}

async fn plugin_info(t: T) -> CheckOutcome {
    let info = t
        .ident()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .must("GetPluginInfo")?;
    ensure!(
        !info.name.is_empty(),
        "GetPluginInfo returned an empty name"
    );
    ensure!(
        !info.vendor_version.is_empty(),
        "GetPluginInfo returned an empty vendor_version (the field is REQUIRED)"
    );
    Ok(())
}

/// The spec: "MUST be 63 characters or less, beginning and ending with an
/// alphanumeric character ([a-z0-9A-Z]) with dashes (-), dots (.), and
/// alphanumerics between", in domain name notation.
pub fn name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("the name is empty".into());
    }
    if name.len() > 63 {
        return Some(format!(
            "the name has {} characters, more than 63",
            name.len()
        ));
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !name.starts_with(alnum) || !name.ends_with(alnum) {
        return Some("the name must begin and end with [a-z0-9A-Z]".into());
    }
    if let Some(c) = name.chars().find(|&c| !(alnum(c) || c == '-' || c == '.')) {
        return Some(format!(
            "the name contains {c:?}; only [a-z0-9A-Z], '-' and '.' are allowed"
        ));
    }
    if name.contains("..") {
        return Some("the name has an empty domain label (\"..\")".into());
    }
    None
}

async fn plugin_name(t: T) -> CheckOutcome {
    let info = t
        .ident()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .must("GetPluginInfo")?;
    if let Some(problem) = name_problem(&info.name) {
        fail!("GetPluginInfo name {:?}: {problem}", info.name);
    }
    Ok(())
}

async fn plugin_capabilities(t: T) -> CheckOutcome {
    use csi::plugin_capability::{Type, service, volume_expansion};
    let resp = t
        .ident()
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .must("GetPluginCapabilities")?;
    for (i, cap) in resp.capabilities.iter().enumerate() {
        match &cap.r#type {
            None => fail!("capability {i} has no type"),
            Some(Type::Service(s)) => match service::Type::try_from(s.r#type) {
                Ok(service::Type::Unknown) => fail!("capability {i} is service type UNKNOWN"),
                Ok(_) => {}
                Err(_) => fail!("capability {i} has unknown service type {}", s.r#type),
            },
            Some(Type::VolumeExpansion(v)) => match volume_expansion::Type::try_from(v.r#type) {
                Ok(volume_expansion::Type::Unknown) => {
                    fail!("capability {i} is volume expansion type UNKNOWN")
                }
                Ok(_) => {}
                Err(_) => fail!(
                    "capability {i} has unknown volume expansion type {}",
                    v.r#type
                ),
            },
        }
    }
    Ok(())
}

async fn probe(t: T) -> CheckOutcome {
    let resp = t.ident().probe(csi::ProbeRequest {}).await.must("Probe")?;
    if let Some(ready) = resp.ready {
        ensure!(
            ready,
            "Probe answered ready=false although the driver is serving the suite"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::name_problem;

    #[test]
    fn plugin_names() {
        assert_eq!(name_problem("hostpath.csi.k8s.io"), None);
        assert_eq!(name_problem("a"), None);
        assert_eq!(name_problem("csi-driver.example.com"), None);
        assert!(name_problem("").is_some());
        assert!(name_problem(&"a".repeat(64)).is_some());
        assert_eq!(name_problem(&"a".repeat(63)), None);
        assert!(name_problem("-driver").is_some());
        assert!(name_problem("driver.").is_some());
        assert!(name_problem("my_driver").is_some());
        assert!(name_problem("my driver").is_some());
        assert!(name_problem("a..b").is_some());
    }
}
