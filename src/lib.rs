//! csi-provisioner: the Kubernetes CSI external-provisioner sidecar.

pub mod api_calls;
pub mod caches;
pub mod capacity;
pub mod cli;
pub mod csi;
pub mod duration;
pub mod events;
pub mod features;
pub mod http;
pub mod informer;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod migration;
pub mod protection;
pub mod provision;
pub mod queue;
pub mod ratelimit;
pub mod releaser;
pub mod retention;
pub mod shared;
pub mod startup;
pub mod trim;
pub mod wellknown;
pub mod writes;
