//! The driver served on a task of the caller's tokio runtime: how tests
//! and benchmarks of every crate in this workspace run it in-process (the
//! sidecar's end-to-end harness, the CSI sanity suite's tests and this
//! crate's own tests), so that none of them writes the start and the stop
//! again.

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::{Config, Error, serve};

/// How long [`InProcess::stop`] waits for [`serve`] to return: the
/// driver's own [`SHUTDOWN_GRACE`](crate::SHUTDOWN_GRACE) and some slack.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// A running [`serve`] of one configuration. Dropping it asks the driver
/// to stop without waiting; [`InProcess::stop`] waits for it.
pub struct InProcess {
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), Error>>>,
}

impl InProcess {
    /// Starts serving `config` (the socket appears shortly after: a client
    /// connects with a retry). Must be called within a tokio runtime.
    pub fn spawn(config: Config) -> InProcess {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(config, async {
            let _ = stopped.await;
        }));
        InProcess {
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Asks the driver to stop and waits for it; returns what [`serve`]
    /// returned. Panics when it does not end within 10 s or panicked.
    pub async fn stop(mut self) -> Result<(), Error> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().expect("task present until stopped");
        tokio::time::timeout(STOP_TIMEOUT, task)
            .await
            .expect("the in-process driver stops within 10 s")
            .expect("the in-process driver task does not panic")
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
