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
    /// The least time between the starts of two reads of one key (their
    /// cost bound: a batch waits out the rest, and gathers meanwhile).
    min_interval: Duration,
    open: Arc<Mutex<HashMap<String, watch::Receiver<Answer<T>>>>>,
    last_start: Arc<Mutex<HashMap<String, tokio::time::Instant>>>,
}

impl<T> Clone for LiveBatch<T> {
    fn clone(&self) -> Self {
        Self {
            reader: Arc::clone(&self.reader),
            window: self.window,
            min_interval: self.min_interval,
            open: Arc::clone(&self.open),
            last_start: Arc::clone(&self.last_start),
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
            min_interval: Duration::ZERO,
            open: Arc::default(),
            last_start: Arc::default(),
        }
    }

    /// Starts two reads of one key at least `interval` apart: the reads
    /// asked for meanwhile wait and share the next one.
    pub fn at_most_every(mut self, interval: Duration) -> Self {
        self.min_interval = interval;
        self
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
            let previous = this
                .last_start
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .copied();
            if let Some(previous) = previous {
                tokio::time::sleep_until(previous + this.min_interval).await;
            }
            this.last_start
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), tokio::time::Instant::now());
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Reads of one key start at least the interval apart; the askers of
    /// the meantime share one read, sent after they asked.
    #[tokio::test(start_paused = true)]
    async fn reads_of_a_key_are_spaced_and_shared() {
        let calls = Arc::new(AtomicUsize::new(0));
        let batch = {
            let calls = Arc::clone(&calls);
            LiveBatch::with_reader(Duration::from_millis(20), move |_| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                Box::pin(async move { Ok(n) })
            })
            .at_most_every(Duration::from_secs(1))
        };
        let started = tokio::time::Instant::now();
        assert_eq!(*batch.read("k").await.expect("first"), 0);
        let (a, b) = tokio::join!(batch.read("k"), batch.read("k"));
        assert_eq!(
            (*a.expect("a"), *b.expect("b")),
            (1, 1),
            "one read for both"
        );
        assert!(started.elapsed() >= Duration::from_secs(1), "spaced");
        assert_eq!(*batch.read("other").await.expect("other"), 2, "keys apart");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
