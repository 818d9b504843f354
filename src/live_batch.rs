//! Live reads, batched: every caller that asks for `key` while no read of
//! `key` has been sent yet joins one batch, and the batch's single read is
//! sent after a short window. A read that was already sent is never
//! joined, because it may predate the change that made the caller ask:
//! each answer reflects the API server's state after the question was
//! asked, which is the point of asking it (docs/design.md, "Reading
//! current state").
//!
//! Used for the pods of a namespace (`protection::live`) and for this
//! driver's VolumeAttachments (`provisioner::attached`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;

type Answer<T> = Option<Result<Arc<T>, String>>;
type Reader<T> = Arc<dyn Fn(String) -> BoxFuture<'static, Result<T, String>> + Send + Sync>;

/// The batcher. Clones share batches.
pub struct LiveBatch<T> {
    reader: Reader<T>,
    window: Duration,
    open: Arc<Mutex<HashMap<String, watch::Receiver<Answer<T>>>>>,
}

impl<T> Clone for LiveBatch<T> {
    fn clone(&self) -> Self {
        Self {
            reader: Arc::clone(&self.reader),
            window: self.window,
            open: Arc::clone(&self.open),
        }
    }
}

impl<T: Send + Sync + 'static> LiveBatch<T> {
    /// Reads with `reader` (tests count the calls); its error is a message.
    pub fn with_reader(
        window: Duration,
        reader: impl Fn(String) -> BoxFuture<'static, Result<T, String>> + Send + Sync + 'static,
    ) -> Self {
        Self {
            reader: Arc::new(reader),
            window,
            open: Arc::default(),
        }
    }

    /// The answer for `key`, from a read sent after this call began.
    pub async fn read(&self, key: &str) -> Result<Arc<T>, String> {
        let mut answer = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            match open.get(key) {
                Some(batch) => batch.clone(),
                None => {
                    let (tx, rx) = watch::channel(None);
                    open.insert(key.to_owned(), rx.clone());
                    self.spawn_batch(key.to_owned(), tx);
                    rx
                }
            }
        };
        let abandoned = || "the read was abandoned".to_owned();
        let result = answer
            .wait_for(Option::is_some)
            .await
            .map_err(|_| abandoned())?
            .clone();
        result.ok_or_else(abandoned)?
    }

    fn spawn_batch(&self, key: String, tx: watch::Sender<Answer<T>>) {
        let this = self.clone();
        // A task of its own: a caller dropped at its `.await` (cancelled)
        // does not take the others' read with it.
        tokio::spawn(async move {
            tokio::time::sleep(this.window).await;
            // Close the batch before the request goes out: whoever asks from
            // now on gets a read of their own.
            this.open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            let result = (this.reader)(key).await.map(Arc::new);
            // Nobody waiting any more is fine.
            let _ = tx.send(Some(result));
        });
    }
}
