//! What every loop gets: the API client, the shared caches, the event
//! recorder and the retry settings. Each loop lives in its own folder and
//! follows the same shape: `new(&Shared, ...)` registers its cache handlers
//! and asks for the kinds it reads; after the caches are filled, `run()`
//! starts its workers; `shut_down()` stops taking work.

use std::sync::Arc;

use kube::Client;

use crate::caches::Caches;
use crate::events::Recorder;
use crate::queue::Backoff;

#[derive(Clone)]
pub struct Shared {
    pub client: Client,
    /// The CSI driver name: the provisioner name on classes and PVs.
    pub driver_name: String,
    pub caches: Arc<Caches>,
    pub recorder: Arc<Recorder>,
    /// `--retry-interval-start` / `--retry-interval-max`.
    pub backoff: Backoff,
    /// `--worker-threads`.
    pub workers: usize,
}
