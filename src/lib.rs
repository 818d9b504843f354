//! csi-provisioner: the Kubernetes CSI external-provisioner sidecar.

pub mod cli;
pub mod csi;
pub mod duration;
pub mod features;
pub mod startup;
