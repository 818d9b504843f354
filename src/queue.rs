//! A work queue with the semantics of client-go's rate-limited workqueue,
//! which the upstream sidecar's loops are built on:
//!
//! - a key is queued at most once, however often it is added;
//! - a key being processed is never handed to a second worker; adding it
//!   meanwhile marks it dirty and it is queued again when the first worker
//!   calls [`WorkQueue::done`];
//! - [`WorkQueue::add_rate_limited`] delays a key exponentially per key
//!   (`--retry-interval-start` doubling up to `--retry-interval-max`) until
//!   [`WorkQueue::forget`] resets it after a success;
//! - [`WorkQueue::shut_down`] makes [`WorkQueue::get`] return `None` once the
//!   queue is empty, so workers drain and stop.
//!
//! It reports client-go's workqueue metrics with client-go's semantics:
//! `adds` and `depth` count keys that become pending (also while being
//! processed), every delayed add counts as a retry, the queue latency runs
//! from the first pending add to the hand-out, the work duration from the
//! hand-out to [`WorkQueue::done`].

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Exponential per-key backoff: `start * 2^failures`, capped at `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub start: Duration,
    pub max: Duration,
}

impl Backoff {
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.start.saturating_mul(factor).min(self.max)
    }
}

#[derive(Debug)]
struct State<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    /// Keys handed to a worker, with the time they were handed out.
    processing: HashMap<K, Instant>,
    /// Keys added while being processed: queued again at `done`.
    dirty: HashSet<K>,
    /// When each pending key was first added (queue latency).
    added: HashMap<K, Instant>,
    failures: HashMap<K, u32>,
    /// Keys waiting for a delayed add, with the earliest time they are due.
    waiting: HashMap<K, Instant>,
    shutting_down: bool,
}

/// A clonable handle to one queue.
#[derive(Debug)]
pub struct WorkQueue<K> {
    name: &'static str,
    backoff: Backoff,
    state: Arc<Mutex<State<K>>>,
    notify: Arc<Notify>,
}

/// A key handed to a worker: marked done when dropped, so that whatever
/// ends the work (completion, a panic, the future dropped) releases it.
struct Processing<'a, K>
where
    K: Clone + Eq + Hash + Send + 'static,
{
    queue: &'a WorkQueue<K>,
    key: Option<K>,
}

impl<K> Drop for Processing<'_, K>
where
    K: Clone + Eq + Hash + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.queue.done(&key);
        }
    }
}

/// A key taken with [`WorkQueue::take`]: marked done when dropped.
pub struct Taken<K>
where
    K: Clone + Eq + Hash + Send + 'static,
{
    queue: WorkQueue<K>,
    key: Option<K>,
}

impl<K> Drop for Taken<K>
where
    K: Clone + Eq + Hash + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.queue.done(&key);
        }
    }
}

impl<K> Clone for WorkQueue<K> {
    fn clone(&self) -> Self {
        Self {
            name: self.name,
            backoff: self.backoff,
            state: Arc::clone(&self.state),
            notify: Arc::clone(&self.notify),
        }
    }
}

impl<K> WorkQueue<K>
where
    K: Clone + Eq + Hash + Send + 'static,
{
    pub fn new(name: &'static str, backoff: Backoff) -> Self {
        let state = Arc::new(Mutex::new(State {
            queue: VecDeque::new(),
            queued: HashSet::new(),
            processing: HashMap::new(),
            dirty: HashSet::new(),
            added: HashMap::new(),
            failures: HashMap::new(),
            waiting: HashMap::new(),
            shutting_down: false,
        }));
        let weak = Arc::downgrade(&state);
        crate::metrics::queue_created(
            name,
            Box::new(move || {
                let state = weak.upgrade()?;
                let s = state.lock().unwrap_or_else(|p| p.into_inner());
                Some(s.processing.values().copied().collect())
            }),
        );
        Self {
            name,
            backoff,
            state,
            notify: Arc::new(Notify::new()),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        // A panic while holding the lock leaves consistent sets behind (every
        // method mutates them in one step), so poisoning carries no meaning.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` now (no-op if already queued; marks it dirty if being
    /// processed).
    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.shutting_down {
            return;
        }
        s.waiting.remove(&key);
        let newly_pending = if s.processing.contains_key(&key) {
            s.dirty.insert(key.clone())
        } else if s.queued.insert(key.clone()) {
            s.queue.push_back(key.clone());
            true
        } else {
            false
        };
        if !newly_pending {
            return;
        }
        s.added.entry(key).or_insert_with(Instant::now);
        let depth = s.queue.len() + s.dirty.len();
        let queued = !s.queue.is_empty();
        drop(s);
        crate::metrics::queue_added(self.name);
        crate::metrics::set_queue_depth(self.name, depth);
        if queued {
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`. An earlier pending delayed add wins.
    pub fn add_after(&self, key: K, delay: Duration) {
        {
            if self.lock().shutting_down {
                return;
            }
        }
        // client-go counts every delayed add as a retry, even without delay.
        crate::metrics::queue_retried(self.name);
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let due = Instant::now() + delay;
        {
            let mut s = self.lock();
            if s.shutting_down {
                return;
            }
            match s.waiting.get(&key) {
                Some(existing) if *existing <= due => return,
                _ => {
                    s.waiting.insert(key.clone(), due);
                }
            }
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(due).await;
            let still_due = {
                let mut s = queue.lock();
                // Only the add that set the current due time fires; a later,
                // earlier-due add has its own timer.
                if s.waiting.get(&key) == Some(&due) {
                    s.waiting.remove(&key);
                    true
                } else {
                    false
                }
            };
            if still_due {
                queue.add(key);
            }
        });
    }

    /// Queues `key` after its next backoff delay and counts a failure.
    /// Returns the delay used.
    pub fn add_rate_limited(&self, key: K) -> Duration {
        let delay = {
            let mut s = self.lock();
            let failures = s.failures.entry(key.clone()).or_insert(0);
            let delay = self.backoff.delay(*failures);
            *failures = failures.saturating_add(1);
            delay
        };
        self.add_after(key, delay);
        delay
    }

    /// How many failures `key` has had since the last [`forget`](Self::forget).
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Resets the backoff of `key` (after a success, or when it is gone).
    pub fn forget(&self, key: &K) {
        self.lock().failures.remove(key);
    }

    /// Waits for the next key. `None` once shut down and drained.
    pub async fn get(&self) -> Option<K> {
        loop {
            // Register interest before checking, so an add between the check
            // and the wait is not missed.
            let notified = self.notify.notified();
            {
                let mut s = self.lock();
                if let Some(key) = s.queue.pop_front() {
                    s.queued.remove(&key);
                    let now = Instant::now();
                    s.processing.insert(key.clone(), now);
                    let waited = s.added.remove(&key).map(|added| now - added);
                    let depth = s.queue.len() + s.dirty.len();
                    drop(s);
                    crate::metrics::set_queue_depth(self.name, depth);
                    if let Some(waited) = waited {
                        crate::metrics::queue_waited(self.name, waited);
                    }
                    return Some(key);
                }
                if s.shutting_down {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Starts `workers` tasks that take keys until the queue is shut down
    /// and drained, run `work` on each and mark it done: the worker loop of
    /// every loop of the sidecar.
    pub fn run_workers<F, Fut>(&self, workers: usize, work: F)
    where
        K: Sync,
        F: Fn(K) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.run_workers_until(workers, || false, work);
    }

    /// [`run_workers`](Self::run_workers) for a loop that stops at once
    /// instead of draining the queue: a worker that takes a key once
    /// `stopped()` holds marks it done without working on it and ends.
    /// Returns the workers' tasks, to wait for them.
    pub fn run_workers_until<S, F, Fut>(
        &self,
        workers: usize,
        stopped: S,
        work: F,
    ) -> Vec<tokio::task::JoinHandle<()>>
    where
        K: Sync,
        S: Fn() -> bool + Clone + Send + Sync + 'static,
        F: Fn(K) -> Fut + Clone + Send + Sync + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        (0..workers)
            .map(|_| {
                let queue = self.clone();
                let stopped = stopped.clone();
                let work = work.clone();
                tokio::spawn(async move {
                    while let Some(key) = queue.get().await {
                        if stopped() {
                            queue.done(&key);
                            break;
                        }
                        // Done when the work ends, however it ends: a
                        // panic (caught here, so the worker lives on) or
                        // the work dropped must not leave the key
                        // "processing", or every later add of it would
                        // only mark it dirty and it would never run again.
                        let processing = Processing {
                            queue: &queue,
                            key: Some(key.clone()),
                        };
                        // Boxed: inline, the largest operation's state
                        // (16 KB for provisioning) would be part of every
                        // idle worker, a hundred of them by default.
                        let work = std::panic::AssertUnwindSafe(Box::pin(work(key.clone())));
                        let panicked =
                            futures_util::FutureExt::catch_unwind(work).await.is_err();
                        drop(processing);
                        if panicked {
                            let delay = queue.add_rate_limited(key.clone());
                            tracing::error!(queue = queue.name, retry_in = ?delay, "worker panicked on a key; retrying it with backoff");
                        }
                    }
                })
            })
            .collect()
    }

    /// Marks `key` as processed; queues it again if it was added meanwhile.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        let worked = s.processing.remove(key).map(|started| started.elapsed());
        // Still pending (and counted in the depth): it only moves from the
        // dirty set to the queue.
        let requeued = s.dirty.remove(key) && s.queued.insert(key.clone());
        if requeued {
            s.queue.push_back(key.clone());
        }
        drop(s);
        if let Some(worked) = worked {
            crate::metrics::queue_worked(self.name, worked);
        }
        if requeued {
            self.notify.notify_one();
        }
    }

    /// Takes `key` for processing if it is queued, as [`get`](Self::get)
    /// would hand it out (its queue latency observed); `None` when it is
    /// not queued. For a queue whose keys are worked on by the code that
    /// added them rather than by workers taking the next key (`unsavedpvs`:
    /// the claim worker retrying its own PV's save). Done when the returned
    /// guard is dropped, however the work ends.
    pub fn take(&self, key: &K) -> Option<Taken<K>> {
        let mut s = self.lock();
        if !s.queued.remove(key) {
            return None;
        }
        s.queue.retain(|k| k != key);
        let now = Instant::now();
        s.processing.insert(key.clone(), now);
        let waited = s.added.remove(key).map(|added| now - added);
        let depth = s.queue.len() + s.dirty.len();
        drop(s);
        crate::metrics::set_queue_depth(self.name, depth);
        if let Some(waited) = waited {
            crate::metrics::queue_waited(self.name, waited);
        }
        Some(Taken {
            queue: self.clone(),
            key: Some(key.clone()),
        })
    }

    /// Drops `key` without working on it: its work ended elsewhere (the
    /// operation of an unsaved PV finished another way). Queued, dirty or
    /// waiting, it is no longer pending and its backoff is reset; a worker
    /// processing it meanwhile finishes without queuing it again.
    pub fn remove(&self, key: &K) {
        let mut s = self.lock();
        let queued = s.queued.remove(key);
        if queued {
            s.queue.retain(|k| k != key);
        }
        let dirty = s.dirty.remove(key);
        s.added.remove(key);
        s.waiting.remove(key);
        s.failures.remove(key);
        let depth = s.queue.len() + s.dirty.len();
        drop(s);
        if queued || dirty {
            crate::metrics::set_queue_depth(self.name, depth);
        }
    }

    /// Queued keys (not counting those being processed or waiting).
    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keys currently being processed.
    pub fn in_flight(&self) -> usize {
        self.lock().processing.len()
    }

    /// Stops accepting keys; `get` returns `None` once the queue is empty.
    /// Delayed adds that have not fired are dropped.
    pub fn shut_down(&self) {
        let mut s = self.lock();
        s.shutting_down = true;
        s.waiting.clear();
        drop(s);
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn workers_take_every_key_once_and_stop_after_shutdown() {
        let queue: WorkQueue<u32> = WorkQueue::new(
            "run-workers-test",
            Backoff {
                start: Duration::from_millis(1),
                max: Duration::from_millis(10),
            },
        );
        let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
        {
            let seen = Arc::clone(&seen);
            queue.run_workers(3, move |key| {
                let seen = Arc::clone(&seen);
                async move {
                    seen.lock().unwrap_or_else(|p| p.into_inner()).push(key);
                }
            });
        }
        for key in 0..20 {
            queue.add(key);
        }
        tokio::time::timeout(Duration::from_secs(5), async {
            while seen.lock().unwrap_or_else(|p| p.into_inner()).len() < 20 || queue.in_flight() > 0
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("every key processed");
        queue.shut_down();
        queue.add(99);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..20).collect::<Vec<_>>(),
            "once each, nothing after shutdown"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_key_is_released_and_retried_and_the_worker_lives_on() {
        let queue: WorkQueue<u32> = WorkQueue::new(
            "panic-test",
            Backoff {
                start: Duration::from_millis(1),
                max: Duration::from_millis(10),
            },
        );
        let attempts: Arc<Mutex<Vec<u32>>> = Arc::default();
        {
            let attempts = Arc::clone(&attempts);
            // One worker: if the panic ended it, nothing after would run.
            queue.run_workers(1, move |key| {
                let attempts = Arc::clone(&attempts);
                async move {
                    let first = {
                        let mut attempts = attempts.lock().unwrap_or_else(|p| p.into_inner());
                        attempts.push(key);
                        attempts.iter().filter(|k| **k == key).count() == 1
                    };
                    assert!(!(key == 1 && first), "first attempt at key 1 panics");
                }
            });
        }
        queue.add(1);
        queue.add(2);
        tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                let done = {
                    let attempts = attempts.lock().unwrap_or_else(|p| p.into_inner());
                    attempts.iter().filter(|k| **k == 1).count() == 2 && attempts.contains(&2)
                };
                if done && queue.in_flight() == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("key 1 retried after its panic, key 2 processed by the same worker");
        // Released: adding it again runs it again (not only marks it dirty).
        queue.add(1);
        tokio::time::timeout(Duration::from_secs(5), async {
            while attempts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .filter(|k| **k == 1)
                .count()
                < 3
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("key 1 runs again when added");
        queue.shut_down();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stopped_workers_end_without_working_or_draining() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let queue: WorkQueue<u32> = WorkQueue::new(
            "run-workers-until-test",
            Backoff {
                start: Duration::from_millis(1),
                max: Duration::from_millis(10),
            },
        );
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
        let tasks = {
            let stop = Arc::clone(&stop);
            let seen = Arc::clone(&seen);
            queue.run_workers_until(
                2,
                move || stop.load(Ordering::SeqCst),
                move |key| {
                    let seen = Arc::clone(&seen);
                    async move {
                        seen.lock().unwrap_or_else(|p| p.into_inner()).push(key);
                    }
                },
            )
        };
        queue.add(1);
        tokio::time::timeout(Duration::from_secs(5), async {
            while seen.lock().unwrap_or_else(|p| p.into_inner()).is_empty() || queue.in_flight() > 0
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("key processed");
        stop.store(true, Ordering::SeqCst);
        for key in 2..10 {
            queue.add(key);
        }
        queue.shut_down();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .expect("worker ends")
                .expect("worker does not panic");
        }
        assert_eq!(*seen.lock().unwrap_or_else(|p| p.into_inner()), vec![1]);
        assert!(queue.len() >= 6, "at most one key per worker taken");
    }

    /// The queue's metrics, from the encoded registry.
    fn metric(name: &str, queue: &str) -> Option<f64> {
        let needle = format!("{name}{{name=\"{queue}\"}} ");
        crate::metrics::encode()
            .lines()
            .find_map(|l| l.strip_prefix(&needle))
            .and_then(|v| v.parse().ok())
    }

    #[tokio::test(start_paused = true)]
    async fn metrics_follow_client_go() {
        let q: WorkQueue<&'static str> = WorkQueue::new(
            "unit-metrics",
            Backoff {
                start: Duration::from_secs(1),
                max: Duration::from_secs(8),
            },
        );
        // Every series exists from the start.
        for name in [
            "workqueue_depth",
            "workqueue_adds_total",
            "workqueue_retries_total",
            "workqueue_unfinished_work_seconds",
            "workqueue_longest_running_processor_seconds",
            "workqueue_queue_duration_seconds_count",
            "workqueue_work_duration_seconds_count",
        ] {
            assert_eq!(metric(name, "unit-metrics"), Some(0.0), "{name}");
        }
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(metric("workqueue_adds_total", "unit-metrics"), Some(2.0));
        assert_eq!(metric("workqueue_depth", "unit-metrics"), Some(2.0));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(metric("workqueue_depth", "unit-metrics"), Some(1.0));
        assert_eq!(
            metric("workqueue_queue_duration_seconds_sum", "unit-metrics"),
            Some(2.0)
        );
        // Added while processing: pending again, counted as an add.
        q.add("a");
        assert_eq!(metric("workqueue_adds_total", "unit-metrics"), Some(3.0));
        assert_eq!(metric("workqueue_depth", "unit-metrics"), Some(2.0));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(q.get().await, Some("b"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        // a for 4s, b for 1s.
        assert_eq!(
            metric("workqueue_unfinished_work_seconds", "unit-metrics"),
            Some(5.0)
        );
        assert_eq!(
            metric(
                "workqueue_longest_running_processor_seconds",
                "unit-metrics"
            ),
            Some(4.0)
        );
        q.done(&"a");
        q.done(&"b");
        assert_eq!(
            metric("workqueue_work_duration_seconds_count", "unit-metrics"),
            Some(2.0)
        );
        assert_eq!(
            metric("workqueue_work_duration_seconds_sum", "unit-metrics"),
            Some(5.0)
        );
        assert_eq!(
            metric("workqueue_unfinished_work_seconds", "unit-metrics"),
            Some(0.0)
        );
        assert_eq!(
            metric("workqueue_depth", "unit-metrics"),
            Some(1.0),
            "a requeued"
        );
        q.add_after("c", Duration::ZERO);
        q.add_rate_limited("d");
        assert_eq!(metric("workqueue_retries_total", "unit-metrics"), Some(2.0));
    }

    /// `take` and `remove`, for keys worked on by the code that added them
    /// (`unsavedpvs`): the same figures as a worker's `get` and `done`.
    #[tokio::test(start_paused = true)]
    async fn a_key_taken_by_its_owner_is_measured_as_a_workers() {
        let q: WorkQueue<&'static str> = WorkQueue::new(
            "unit-take",
            Backoff {
                start: Duration::from_secs(1),
                max: Duration::from_secs(8),
            },
        );
        assert!(q.take(&"a").is_none(), "not queued");
        q.add("a");
        q.add("b");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let taken = q.take(&"a").expect("queued");
        assert!(q.take(&"a").is_none(), "already taken");
        assert_eq!(metric("workqueue_depth", "unit-take"), Some(1.0));
        assert_eq!(
            metric("workqueue_queue_duration_seconds_sum", "unit-take"),
            Some(2.0)
        );
        assert_eq!(q.in_flight(), 1);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            metric("workqueue_longest_running_processor_seconds", "unit-take"),
            Some(3.0)
        );
        drop(taken);
        assert_eq!(q.in_flight(), 0);
        assert_eq!(
            metric("workqueue_work_duration_seconds_sum", "unit-take"),
            Some(3.0)
        );
        // A failed retry: counted as a retry and pending again.
        q.add_after("a", Duration::ZERO);
        assert_eq!(metric("workqueue_retries_total", "unit-take"), Some(1.0));
        assert_eq!(metric("workqueue_adds_total", "unit-take"), Some(3.0));
        assert_eq!(metric("workqueue_depth", "unit-take"), Some(2.0));
        // Its work ended elsewhere: gone, and never handed out.
        q.remove(&"a");
        assert_eq!(metric("workqueue_depth", "unit-take"), Some(1.0));
        assert!(q.take(&"a").is_none());
        assert_eq!(q.get().await, Some("b"));
        // Removed while processed and added meanwhile: not queued again.
        q.add("b");
        q.remove(&"b");
        q.done(&"b");
        assert!(q.is_empty());
        assert_eq!(metric("workqueue_depth", "unit-take"), Some(0.0));
        // The order of the others is kept.
        for key in ["x", "y", "z"] {
            q.add(key);
        }
        drop(q.take(&"y"));
        assert_eq!(q.get().await, Some("x"));
        assert_eq!(q.get().await, Some("z"));
    }

    fn queue() -> WorkQueue<&'static str> {
        WorkQueue::new(
            "test",
            Backoff {
                start: Duration::from_secs(1),
                max: Duration::from_secs(300),
            },
        )
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Backoff {
            start: Duration::from_secs(1),
            max: Duration::from_secs(300),
        };
        let delays: Vec<u64> = (0..12).map(|f| b.delay(f).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(300));
        let tiny = Backoff {
            start: Duration::from_millis(5),
            max: Duration::from_millis(5),
        };
        assert_eq!(tiny.delay(3), Duration::from_millis(5));
    }

    #[tokio::test]
    async fn a_key_is_queued_once() {
        let q = queue();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await, Some("a"));
        assert_eq!(q.get().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_in_processing_is_not_handed_out_twice() {
        let q = queue();
        q.add("a");
        let first = q.get().await;
        assert_eq!(first, Some("a"));
        // Added again while processing: held back, not queued.
        q.add("a");
        assert_eq!(q.len(), 0);
        assert_eq!(q.in_flight(), 1);
        q.done(&"a");
        assert_eq!(q.len(), 1, "dirty key queued after done");
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        assert_eq!(q.len(), 0, "not dirty any more");
        assert_eq!(q.in_flight(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limited_adds_back_off_per_key_until_forgotten() {
        let q = queue();
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(1));
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(2));
        assert_eq!(q.add_rate_limited("b"), Duration::from_secs(1));
        assert_eq!(q.failures(&"a"), 2);
        assert!(q.is_empty());
        tokio::time::sleep(Duration::from_millis(1_001)).await;
        // "a" keeps its earlier due time (1s), "b" is due at 1s too.
        let mut got = vec![q.get().await, q.get().await];
        got.sort();
        assert_eq!(got, vec![Some("a"), Some("b")]);
        q.forget(&"a");
        assert_eq!(q.failures(&"a"), 0);
        assert_eq!(q.add_rate_limited("a"), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_delayed_add_wins_and_a_direct_add_cancels_the_wait() {
        let q = queue();
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(2));
        q.add_after("a", Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(2_001)).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await, Some("a"));
        q.done(&"a");
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(q.len(), 0, "later timers of a fired key do nothing");

        q.add_after("b", Duration::from_secs(3));
        q.add("b");
        assert_eq!(q.get().await, Some("b"));
        q.done(&"b");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(q.len(), 0, "the direct add replaced the delayed one");
    }

    #[tokio::test]
    async fn get_waits_for_an_add() {
        let q = queue();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.add("late");
        assert_eq!(waiter.await.expect("join"), Some("late"));
    }

    #[tokio::test]
    async fn shutdown_drains_then_stops_workers() {
        let q = queue();
        q.add("a");
        let idle = tokio::spawn({
            let q = q.clone();
            async move {
                let first = q.get().await;
                let second = q.get().await;
                (first, second)
            }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        q.add("ignored");
        let (first, second) = idle.await.expect("join");
        assert_eq!(first, Some("a"));
        assert_eq!(second, None);
        assert_eq!(q.get().await, None);
    }

    #[tokio::test]
    async fn many_workers_never_share_a_key() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let q: WorkQueue<u32> = WorkQueue::new(
            "test",
            Backoff {
                start: Duration::from_millis(1),
                max: Duration::from_millis(1),
            },
        );
        let active: Arc<Mutex<HashSet<u32>>> = Arc::default();
        let processed = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..8 {
            let (q, active, processed) = (q.clone(), active.clone(), processed.clone());
            workers.push(tokio::spawn(async move {
                while let Some(key) = q.get().await {
                    assert!(
                        active.lock().expect("lock").insert(key),
                        "key {key} processed twice at once"
                    );
                    tokio::task::yield_now().await;
                    active.lock().expect("lock").remove(&key);
                    processed.fetch_add(1, Ordering::SeqCst);
                    q.done(&key);
                }
            }));
        }
        for round in 0..50u32 {
            for key in 0..10 {
                q.add(key);
            }
            if round % 5 == 0 {
                tokio::task::yield_now().await;
            }
        }
        while !(q.is_empty() && q.in_flight() == 0) {
            tokio::task::yield_now().await;
        }
        q.shut_down();
        for w in workers {
            w.await.expect("worker");
        }
        assert!(processed.load(Ordering::SeqCst) >= 10);
    }
}
