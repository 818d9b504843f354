//! Client-side rate limiting of Kubernetes API requests, as client-go's
//! `flowcontrol` token bucket (`--kube-api-qps` / `--kube-api-burst`), with a
//! separate bucket for CSIStorageCapacity requests
//! (`--kube-api-capacity-qps` / `--kube-api-capacity-burst`), as upstream
//! gives the capacity controller its own client.
//!
//! Watches are not limited: a watch is one long request, and client-go
//! does not charge its reconnects against the budget of writes either.
//!
//! Events get what is left of the general budget: an event request is sent
//! only when a token is free *now*, never by reserving a future slot, so a
//! queue of PV creates (which reserve slots ahead) is never delayed by
//! events. Under pressure events wait in the recorder's queue, where they
//! are coalesced or dropped ([`crate::events`]).
//!
//! Lease requests (leader election) have a bucket of their own with the
//! same rate and burst, as upstream gives leader election its own clientset:
//! a leader busy provisioning must not miss its renew deadline because its
//! renewal waits behind queued writes (it would lose the lease under load
//! and restart). Leader election makes at most two requests per retry
//! period, so this adds no meaningful load.
//!
//! The bucket is written here rather than taken from `tower::limit::RateLimit`
//! or `governor`: tower's limiter is a fixed window (a burst of `num` per
//! period, then a full period of silence) and cannot route by request, and
//! governor would be a new dependency for twenty lines. The guarantee the
//! benchmarks rely on — N requests at rate Q with burst B take at least
//! (N − B)/Q — is proven by the tests below with tokio's paused clock.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service};

/// A token bucket in its GCRA form: the *theoretical arrival time* of the
/// next request advances by one interval per request; a request waits until
/// that time is no more than `burst` intervals ahead of now. Integer
/// nanoseconds (the interval rounded up) keep the lower bound exact, where
/// floating-point tokens could come out a few nanoseconds short.
#[derive(Debug)]
pub struct TokenBucket {
    interval: Duration,
    /// How far ahead of now the theoretical arrival time may run: `burst`
    /// intervals (a full bucket).
    tolerance: Duration,
    tat: Mutex<Option<Instant>>,
}

impl TokenBucket {
    /// `None` when `qps` is not positive: no limit (client-go treats a
    /// negative QPS the same way).
    pub fn new(qps: f32, burst: u32) -> Option<TokenBucket> {
        if !(qps.is_finite() && qps > 0.0) {
            return None;
        }
        let nanos = (1e9 / f64::from(qps)).ceil();
        // At least 1ns; a qps so small that the interval overflows is
        // capped at a day per request.
        let interval = if nanos >= 86_400e9 {
            Duration::from_secs(86_400)
        } else {
            Duration::from_nanos((nanos as u64).max(1))
        };
        Some(TokenBucket {
            interval,
            tolerance: interval.saturating_mul(burst.max(1)),
            tat: Mutex::new(None),
        })
    }

    /// The time between two requests once the burst is spent.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Reserves the next slot and returns how long the caller must wait for
    /// it. Reserving (rather than retrying later) keeps the order of
    /// callers and makes each wait exact.
    pub fn reserve(&self, now: Instant) -> Duration {
        let mut tat = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        let base = match *tat {
            Some(t) if t > now => t,
            _ => now,
        };
        let next = base + self.interval;
        *tat = Some(next);
        // Allowed at `next - tolerance`: with a full bucket that is ≤ now.
        (next - self.tolerance).saturating_duration_since(now)
    }

    /// Takes a slot only if one is free now (nobody waits for the next
    /// slots and the burst is not spent); never reserves ahead.
    pub fn try_acquire_now(&self, now: Instant) -> bool {
        let mut tat = self.tat.lock().unwrap_or_else(|p| p.into_inner());
        let base = match *tat {
            Some(t) if t > now => t,
            _ => now,
        };
        let next = base + self.interval;
        if next.saturating_duration_since(now) > self.tolerance {
            return false;
        }
        *tat = Some(next);
        true
    }

    /// Waits until a slot is free now, leaving every reserved slot to its
    /// owner (for requests of lower priority than the ones that reserve).
    pub async fn acquire_spare(&self) {
        while !self.try_acquire_now(Instant::now()) {
            tokio::time::sleep(self.interval).await;
        }
    }

    /// Waits for the next slot.
    pub async fn acquire(&self) {
        let wait = self.reserve(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Which budget a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Watches: never limited.
    Watch,
    /// CSIStorageCapacity objects.
    Capacity,
    /// Leases (leader election).
    Election,
    /// Events: the general budget's spare slots only.
    Events,
    /// Everything else.
    General,
}

/// Classifies a request by its URL: `watch=true|1` in the query is a watch;
/// CSIStorageCapacity requests are charged to the capacity budget, Lease
/// requests to leader election's.
pub fn budget_of(uri: &http::Uri) -> Budget {
    let watch = uri.query().is_some_and(|q| {
        q.split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1" | "watch=True"))
    });
    if watch {
        return Budget::Watch;
    }
    match group_and_resource(uri.path()) {
        Some(("storage.k8s.io", "csistoragecapacities")) => Budget::Capacity,
        Some(("coordination.k8s.io", "leases")) => Budget::Election,
        Some(("" | "events.k8s.io", "events")) => Budget::Events,
        _ => Budget::General,
    }
}

/// The API group and plural resource of a Kubernetes REST path
/// (`/api/v1/...` is the core group `""`).
fn group_and_resource(path: &str) -> Option<(&str, &str)> {
    let mut segments = path.trim_start_matches('/').split('/');
    let group = match segments.next()? {
        "api" => "",
        "apis" => segments.next()?,
        _ => return None,
    };
    let _version = segments.next()?;
    let first = segments.next()?;
    if first == "namespaces" {
        let _namespace = segments.next();
        // `/namespaces/<ns>` alone is the namespace object itself.
        return Some((group, segments.next().unwrap_or("namespaces")));
    }
    Some((group, first))
}

/// The limits of the process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub qps: f32,
    pub burst: u32,
    pub capacity_qps: f32,
    pub capacity_burst: u32,
}

/// A tower layer for `kube::client::ClientBuilder`: every request waits for
/// its bucket before it is sent.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    general: Option<Arc<TokenBucket>>,
    capacity: Option<Arc<TokenBucket>>,
    election: Option<Arc<TokenBucket>>,
}

impl RateLimitLayer {
    pub fn new(limits: Limits) -> Self {
        Self {
            general: TokenBucket::new(limits.qps, limits.burst).map(Arc::new),
            capacity: TokenBucket::new(limits.capacity_qps, limits.capacity_burst).map(Arc::new),
            election: TokenBucket::new(limits.qps, limits.burst).map(Arc::new),
        }
    }

    fn bucket(&self, budget: Budget) -> Option<Arc<TokenBucket>> {
        match budget {
            Budget::Watch => None,
            Budget::Capacity => self.capacity.clone(),
            Budget::Election => self.election.clone(),
            Budget::General | Budget::Events => self.general.clone(),
        }
    }
}

/// Requests queued in front of the inner service; the same depth kube's
/// own client uses.
const BUFFER: usize = 1024;

impl<S> Layer<S> for RateLimitLayer
where
    S: Service<http::Request<kube::client::Body>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send + Sync,
    S::Response: Send + 'static,
{
    type Service = RateLimited<S>;

    fn layer(&self, inner: S) -> Self::Service {
        // kube's stack is a `BoxService`, which cannot be cloned; a buffer
        // makes it shareable so that a request can wait for its slot
        // without holding the service. Must be built inside a runtime.
        RateLimited {
            inner: Buffer::new(inner, BUFFER),
            limits: self.clone(),
        }
    }
}

pub struct RateLimited<S>
where
    S: Service<http::Request<kube::client::Body>>,
{
    inner: Buffer<http::Request<kube::client::Body>, S::Future>,
    limits: RateLimitLayer,
}

impl<S> Service<http::Request<kube::client::Body>> for RateLimited<S>
where
    S: Service<http::Request<kube::client::Body>> + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError> + Send + Sync,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness of the buffer is checked in the call, after the wait,
        // so a waiting request does not hold a buffer slot.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let budget = budget_of(request.uri());
        let bucket = self.limits.bucket(budget);
        let mut inner = self.inner.clone();
        Box::pin(async move {
            match (bucket, budget) {
                (Some(bucket), Budget::Events) => bucket.acquire_spare().await,
                (Some(bucket), _) => bucket.acquire().await,
                (None, _) => {}
            }
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            inner.call(request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, millis: u64) -> Instant {
        base + Duration::from_millis(millis)
    }

    #[test]
    fn burst_is_free_then_one_interval_per_request() {
        let bucket = TokenBucket::new(10.0, 3).expect("limited");
        let t0 = Instant::now();
        let waits: Vec<u128> = (0..6).map(|_| bucket.reserve(t0).as_millis()).collect();
        assert_eq!(waits, [0, 0, 0, 100, 200, 300]);
    }

    #[test]
    fn spare_slots_go_only_where_nobody_reserved() {
        let bucket = TokenBucket::new(10.0, 2).expect("limited");
        let t0 = Instant::now();
        assert!(bucket.try_acquire_now(t0), "a full bucket has a spare slot");
        assert_eq!(bucket.reserve(t0), Duration::ZERO, "the burst's last token");
        // Writers queue up: the next slots are theirs.
        assert_eq!(bucket.reserve(t0), Duration::from_millis(100));
        assert_eq!(bucket.reserve(t0), Duration::from_millis(200));
        assert!(
            !bucket.try_acquire_now(t0),
            "nothing spare while writers wait"
        );
        assert!(!bucket.try_acquire_now(at(t0, 150)));
        // Once the queue is served and the bucket refilled, events flow.
        assert!(bucket.try_acquire_now(at(t0, 1_000)));
        // A spare take does not delay the next writer beyond a full bucket.
        assert_eq!(bucket.reserve(at(t0, 1_000)), Duration::ZERO);
    }

    #[test]
    fn the_bucket_refills_while_idle_but_never_above_burst() {
        let bucket = TokenBucket::new(10.0, 2).expect("limited");
        let t0 = Instant::now();
        assert_eq!(bucket.reserve(t0), Duration::ZERO);
        assert_eq!(bucket.reserve(t0), Duration::ZERO);
        assert_eq!(bucket.reserve(t0), Duration::from_millis(100));
        // Ten seconds idle: the bucket is full again (2), not 100 tokens.
        let later = at(t0, 10_000);
        assert_eq!(bucket.reserve(later), Duration::ZERO);
        assert_eq!(bucket.reserve(later), Duration::ZERO);
        assert_eq!(bucket.reserve(later), Duration::from_millis(100));
        // Half an interval later, one slot further.
        assert_eq!(bucket.reserve(at(t0, 10_050)), Duration::from_millis(150));
    }

    #[test]
    fn bad_rates_mean_no_limit_and_burst_zero_means_one() {
        assert!(TokenBucket::new(0.0, 10).is_none());
        assert!(TokenBucket::new(-1.0, 10).is_none());
        assert!(TokenBucket::new(f32::NAN, 10).is_none());
        let bucket = TokenBucket::new(1.0, 0).expect("limited");
        let t0 = Instant::now();
        assert_eq!(bucket.reserve(t0), Duration::ZERO);
        assert_eq!(bucket.reserve(t0), Duration::from_secs(1));
        let slow = TokenBucket::new(1e-12, 1).expect("limited");
        assert_eq!(slow.interval(), Duration::from_secs(86_400));
        let fast = TokenBucket::new(3.0, 1).expect("limited");
        assert_eq!(
            fast.interval(),
            Duration::from_nanos(333_333_334),
            "rounded up"
        );
    }

    /// The benchmark's promise: N requests at qps Q with burst B take at
    /// least (N − B)/Q, and not much more.
    #[tokio::test(start_paused = true)]
    async fn n_requests_take_at_least_n_minus_burst_over_qps() {
        for (qps, burst, n) in [
            (5.0f32, 10u32, 60u32),
            (3.0, 1, 10),
            (50.0, 7, 200),
            (1.0, 5, 5),
        ] {
            let bucket = Arc::new(TokenBucket::new(qps, burst).expect("limited"));
            let start = Instant::now();
            let mut tasks = Vec::new();
            for _ in 0..n {
                let bucket = Arc::clone(&bucket);
                tasks.push(tokio::spawn(async move { bucket.acquire().await }));
            }
            for t in tasks {
                t.await.expect("task");
            }
            let took = start.elapsed();
            let bound =
                Duration::from_secs_f64(f64::from(n.saturating_sub(burst)) / f64::from(qps));
            assert!(
                took >= bound,
                "qps {qps} burst {burst} n {n}: {took:?} < {bound:?}"
            );
            assert!(
                took <= bound + Duration::from_millis(1),
                "qps {qps} burst {burst} n {n}: {took:?} much more than {bound:?}"
            );
        }
    }

    #[test]
    fn requests_are_charged_to_the_right_budget() {
        let cases = [
            ("/api/v1/persistentvolumes", Budget::General),
            (
                "/api/v1/persistentvolumes?watch=true&resourceVersion=5",
                Budget::Watch,
            ),
            ("/api/v1/pods?resourceVersion=5&watch=1", Budget::Watch),
            ("/api/v1/pods?watch=false", Budget::General),
            ("/api/v1/pods?labelSelector=watch%3Dtrue", Budget::General),
            (
                "/apis/storage.k8s.io/v1/namespaces/kube-system/csistoragecapacities/csisc-1",
                Budget::Capacity,
            ),
            (
                "/apis/storage.k8s.io/v1/namespaces/ns/csistoragecapacities?watch=true",
                Budget::Watch,
            ),
            (
                "/apis/storage.k8s.io/v1/csistoragecapacitiesx",
                Budget::General,
            ),
            (
                "/apis/coordination.k8s.io/v1/namespaces/default/leases/hostpath-csi-k8s-io",
                Budget::Election,
            ),
            (
                "/api/v1/namespaces/default/configmaps/leases",
                Budget::General,
            ),
            ("/api/v1/namespaces/leases", Budget::General),
            ("/apis/other.io/v1/csistoragecapacities", Budget::General),
            ("/version", Budget::General),
            ("/api/v1/namespaces/ns/events", Budget::Events),
            (
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                Budget::Events,
            ),
            ("/apis/other.io/v1/namespaces/ns/events", Budget::General),
        ];
        for (uri, want) in cases {
            let uri: http::Uri = uri.parse().expect("uri");
            assert_eq!(budget_of(&uri), want, "{uri}");
        }
    }

    /// Through the layer as the kube client uses it: general requests
    /// wait, watches and capacity requests use their own budgets.
    #[tokio::test(start_paused = true)]
    async fn the_layer_routes_requests_to_their_buckets() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let served = Arc::new(AtomicUsize::new(0));
        let inner = {
            let served = Arc::clone(&served);
            tower::service_fn(move |_req: http::Request<kube::client::Body>| {
                served.fetch_add(1, Ordering::SeqCst);
                async { Ok::<_, BoxError>(http::Response::new(())) }
            })
        };
        let layer = RateLimitLayer::new(Limits {
            qps: 2.0,
            burst: 1,
            capacity_qps: 1.0,
            capacity_burst: 1,
        });
        let mut svc = layer.layer(inner);
        let request = |uri: &str| {
            http::Request::builder()
                .uri(uri)
                .body(kube::client::Body::empty())
                .expect("request")
        };
        let start = Instant::now();
        let mut calls = Vec::new();
        for _ in 0..3 {
            calls.push(svc.call(request("/api/v1/persistentvolumes")));
            calls.push(svc.call(request("/api/v1/persistentvolumes?watch=true")));
        }
        calls.push(svc.call(request(
            "/apis/storage.k8s.io/v1/namespaces/a/csistoragecapacities",
        )));
        for call in calls {
            call.await.expect("served");
        }
        assert_eq!(served.load(Ordering::SeqCst), 7);
        // Three general requests at 2/s with burst 1: 1s. The watches and
        // the capacity request did not add to it.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
