//! csi-provisioner: the Kubernetes CSI external-provisioner sidecar.

pub mod api_calls;
pub mod caches;
pub mod cli;
pub mod csi;
pub mod duration;
pub mod events;
pub mod features;
pub mod informer;
pub mod kube_client;
pub mod provision;
pub mod queue;
pub mod retention;
pub mod shared;
pub mod startup;
pub mod wellknown;
