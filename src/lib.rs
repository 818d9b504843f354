//! csi-provisioner: the Kubernetes CSI external-provisioner sidecar.

pub mod api;
pub mod api_calls;
pub mod caches;
pub mod capacity;
pub mod cli;
pub mod csi;
pub mod duration;
pub mod events;
pub mod features;
pub mod fence;
pub mod http;
pub mod informer;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod migration;
pub mod pod_pvc;
pub mod pprof;
pub mod projection;
pub mod protection;
pub mod provision;
pub mod provisioner;
pub mod queue;
pub mod ratelimit;
pub mod releaser;
pub mod relevance;
pub mod retention;
pub mod shared;
pub mod snapshot_sweep;
pub mod startup;
pub mod streamed_list;

pub mod wellknown;
pub mod writes;
