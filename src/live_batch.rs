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
    /// How far apart two reads of one key start (their cost bound: a
    /// batch waits out the rest, and gathers meanwhile).
    spacing: Spacing,
    open: Arc<Mutex<HashMap<String, watch::Receiver<Answer<T>>>>>,
    last_read: Arc<Mutex<HashMap<String, LastRead>>>,
}

/// The least time between the starts of two reads of one key: `most`, or
/// with `per_took`, that many times the last read's duration when that is
/// shorter. A read that is cheap for the API server (one page of a list)
/// may then follow its predecessor sooner; one that takes long keeps the
/// full spacing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spacing {
    pub most: Duration,
    pub per_took: Option<u32>,
}

impl Spacing {
    /// No spacing: a read may start as soon as the previous one has.
    pub const NONE: Spacing = Spacing::every(Duration::ZERO);

    /// Always `most` apart.
    pub const fn every(most: Duration) -> Spacing {
        Spacing {
            most,
            per_took: None,
        }
    }

    /// The spacing after a read that took `took` (`None`: still under
    /// way, or never timed).
    pub fn after(self, took: Option<Duration>) -> Duration {
        match (took, self.per_took) {
            (Some(took), Some(per_took)) => took.saturating_mul(per_took).min(self.most),
            _ => self.most,
        }
    }
}

/// When the last read of a key started, and how long it took once done.
#[derive(Debug, Clone, Copy)]
struct LastRead {
    start: tokio::time::Instant,
    took: Option<Duration>,
}

impl<T> Clone for LiveBatch<T> {
    fn clone(&self) -> Self {
        Self {
            reader: Arc::clone(&self.reader),
            window: self.window,
            spacing: self.spacing,
            open: Arc::clone(&self.open),
            last_read: Arc::clone(&self.last_read),
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
            spacing: Spacing::NONE,
            open: Arc::default(),
            last_read: Arc::default(),
        }
    }

    /// Starts two reads of one key as far apart as `spacing` says: the
    /// reads asked for meanwhile wait and share the next one.
    pub fn spaced(mut self, spacing: Spacing) -> Self {
        self.spacing = spacing;
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
                .last_read
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&key)
                .copied();
            if let Some(previous) = previous {
                tokio::time::sleep_until(previous.start + this.spacing.after(previous.took)).await;
            }
            let start = tokio::time::Instant::now();
            this.last_read
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), LastRead { start, took: None });
            // Close the batch before the request goes out: whoever asks from
            // now on gets a read of their own.
            this.open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            let result = (this.reader)(key.clone()).await.map(Arc::new);
            // Timed only when it answered (a quick failure, a 429 or a
            // 403, must not bring the next read sooner: it keeps the whole
            // spacing) and while it is still the last read of the key (one
            // started meanwhile spaces the next by its own).
            if result.is_ok()
                && let Some(last) = this
                    .last_read
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_mut(&key)
                    .filter(|last| last.start == start)
            {
                last.took = Some(start.elapsed());
            }
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
            .spaced(Spacing::every(Duration::from_secs(1)))
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

    #[test]
    fn spacing_follows_the_last_reads_duration_up_to_its_most() {
        let spacing = Spacing {
            most: Duration::from_secs(1),
            per_took: Some(10),
        };
        let ms = Duration::from_millis;
        for (took, want) in [
            (None, ms(1000)),
            (Some(ms(0)), ms(0)),
            (Some(ms(20)), ms(200)),
            (Some(ms(99)), ms(990)),
            (Some(ms(100)), ms(1000)),
            (Some(ms(3000)), ms(1000)),
            (Some(Duration::MAX), ms(1000)),
        ] {
            assert_eq!(spacing.after(took), want, "after {took:?}");
        }
        assert_eq!(Spacing::NONE.after(None), Duration::ZERO);
        assert_eq!(Spacing::NONE.after(Some(ms(5))), Duration::ZERO);
        let every = Spacing::every(ms(1000));
        assert_eq!(every.after(None), ms(1000));
        assert_eq!(every.after(Some(ms(5))), ms(1000), "whatever the read took");
    }

    /// A quick read is followed sooner than a slow one, and a read still
    /// under way keeps the whole spacing.
    #[tokio::test(start_paused = true)]
    async fn a_quick_read_is_followed_sooner() {
        let ms = Duration::from_millis;
        let took = Arc::new(Mutex::new(ms(20)));
        let batch = {
            let took = Arc::clone(&took);
            // Answers when it started.
            LiveBatch::with_reader(Duration::ZERO, move |_| {
                let took = *took.lock().expect("took");
                Box::pin(async move {
                    let start = tokio::time::Instant::now();
                    tokio::time::sleep(took).await;
                    Ok(start)
                })
            })
            .spaced(Spacing {
                most: Duration::from_secs(1),
                per_took: Some(10),
            })
        };
        let first = *batch.read("k").await.expect("first");
        let second = *batch.read("k").await.expect("second");
        assert_eq!(second - first, ms(200), "ten times 20 ms");
        *took.lock().expect("took") = ms(300);
        let third = *batch.read("k").await.expect("third");
        assert_eq!(third - second, ms(200));
        *took.lock().expect("took") = ms(20);
        let fourth = *batch.read("k").await.expect("fourth");
        assert_eq!(fourth - third, ms(1000), "at most a second after 300 ms");
        // A read asked for while the last one is under way: the whole
        // second, since how long that one takes is not known yet.
        *took.lock().expect("took") = ms(1500);
        let slow = tokio::spawn({
            let batch = batch.clone();
            async move { *batch.read("k").await.expect("slow") }
        });
        tokio::time::sleep(ms(300)).await;
        *took.lock().expect("took") = ms(20);
        let sixth = *batch.read("k").await.expect("sixth");
        let fifth = slow.await.expect("slow task");
        assert_eq!(fifth - fourth, ms(200));
        assert_eq!(sixth - fifth, ms(1000), "the fifth was still under way");
    }

    /// A read that failed, however quickly, keeps the whole spacing.
    #[tokio::test(start_paused = true)]
    async fn a_failed_read_keeps_the_whole_spacing() {
        let ms = Duration::from_millis;
        let fail = Arc::new(Mutex::new(true));
        let batch = {
            let fail = Arc::clone(&fail);
            LiveBatch::with_reader(Duration::ZERO, move |_| {
                let fail = *fail.lock().expect("fail");
                Box::pin(async move {
                    let start = tokio::time::Instant::now();
                    tokio::time::sleep(ms(2)).await;
                    if fail {
                        Err(format!("{start:?}"))
                    } else {
                        Ok(start)
                    }
                })
            })
            .spaced(Spacing {
                most: Duration::from_secs(1),
                per_took: Some(10),
            })
        };
        let started = tokio::time::Instant::now();
        assert!(batch.read("k").await.is_err());
        *fail.lock().expect("fail") = false;
        let second = *batch.read("k").await.expect("second");
        assert_eq!(second - started, ms(1000), "not 20 ms after a failure");
        let third = *batch.read("k").await.expect("third");
        assert_eq!(third - second, ms(20), "ten times 2 ms after an answer");
    }
}
