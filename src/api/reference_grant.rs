//! Minimal `gateway.networking.k8s.io/v1beta1` ReferenceGrant: the fields
//! the cross-namespace data source decision
//! ([`crate::provision::reference_grant::is_granted`]) reads, with
//! `kube::Resource` implemented by hand like the snapshot types.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::TypeMeta;
use serde::{Deserialize, Serialize};

/// The API group of ReferenceGrants.
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";
const VERSION: &str = "v1beta1";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrant {
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub types: Option<TypeMeta>,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<ReferenceGrantFrom>,
    #[serde(default)]
    pub to: Vec<ReferenceGrantTo>,
}

/// Who may refer: objects of `group`/`kind` in `namespace`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub namespace: String,
}

/// What may be referred to in the grant's namespace: objects of
/// `group`/`kind`, all of them or the one named.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl kube::Resource for ReferenceGrant {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("ReferenceGrant")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GATEWAY_API_GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("referencegrants")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
