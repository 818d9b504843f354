//! What every loop gets: the API client, the shared caches, the event
//! recorder and the retry settings. Each loop lives in its own folder and
//! follows the same shape: `new(&Shared, ...)` registers its cache handlers
//! and asks for the kinds it reads; once this replica leads, `start()`
//! starts its workers ([`crate::queue::WorkQueue::run_workers`]);
//! `shut_down()` stops taking work. The embedded loops say so through
//! [`EmbeddedLoop`], so start-up holds them as one list.

use std::sync::{Arc, Mutex};

use crate::projection::PersistentVolume;
use kube::Client;

use crate::caches::Caches;
use crate::events::Recorder;
use crate::queue::Backoff;

/// A loop beside provisioning (protection, retention, releaser, pod/Job
/// PVCs, capacity, snapshot sweep), started and stopped with it.
pub trait EmbeddedLoop: Send + Sync {
    /// Starts the workers: call once, when this replica may write. A loop
    /// that must not decide from partial caches waits for them itself,
    /// unless its doc says the caller must.
    fn start(self: Arc<Self>);

    /// Stops taking work; what is under way finishes.
    fn shut_down(&self);
}

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
    /// Told of every volume provisioned or deleted (capacity tracking
    /// refreshes what it probably changed).
    pub volume_events: Arc<VolumeEvents>,
}

type VolumeListener = Box<dyn Fn(&PersistentVolume) + Send + Sync>;

/// Listeners of provisioned and deleted volumes, called in the worker that
/// did it; each must return at once (queue work, never wait).
#[derive(Default)]
pub struct VolumeEvents(Mutex<Vec<VolumeListener>>);

impl VolumeEvents {
    pub fn listen(&self, listener: impl Fn(&PersistentVolume) + Send + Sync + 'static) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(listener));
    }

    pub fn changed(&self, pv: &PersistentVolume) {
        for listener in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            listener(pv);
        }
    }
}
