//! Fencing: with leader election, no API write leaves this process unless
//! it holds the Lease by its own clock.
//!
//! Losing the Lease is noticed by the renewer ([`crate::leader`]), which
//! then stops every loop and the process exits. That is not enough on its
//! own: a process that was frozen (SIGSTOP, a stalled VM, a long GC-like
//! pause of the node) wakes up with work in hand, say a `CreateVolume`
//! answer that arrived meanwhile, and a worker may run before the renewer
//! does, writing although another replica leads by now. So every mutating
//! request is checked here, at the client, against the time until which
//! the last renewal makes us leader (`renew deadline` after its start: the
//! renewer gives up then, before any follower can take over); past it, the
//! request fails without being sent. The Lease's own requests pass: they
//! are how the Lease is held.
//!
//! The check is made where the request leaves the process: the layer is the
//! innermost of ours ([`crate::kube_client::layers`]), below the rate
//! limiter and its buffer. Checked on entry instead, a write admitted just
//! before a pause would still sleep in the limiter (seconds, under a burst
//! at a low `--kube-api-qps`) and be sent after the wake-up, past the lease.
//!
//! Below that, hyper writes a request's bytes from its own connection
//! task, after the layer's last check: every connection of the client is a
//! [`FencedIo`], which writes nothing past the deadline or once the Lease
//! is lost ([`Fence::allows_bytes`]).
//!
//! Stepping down closes the fence before the Lease is released
//! ([`crate::leader::Leadership::step_down`]), and a closed fence stays
//! closed until the next acquisition: a renewal that was under way then
//! does not reopen it ([`Fence::extend`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::time::Instant;
use tower::{Layer, Service};

use crate::ratelimit::{Budget, budget_of};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Until when this process may write. Shared by the elector, which moves it
/// on with each renewal, and the client layer, which reads it.
#[derive(Debug, Clone, Default)]
pub struct Fence {
    /// `None`: not leading (a candidate, or the Lease is lost).
    until: Arc<Mutex<Option<Instant>>>,
    /// The Lease was lost (not given up): no byte leaves on the client's
    /// connections any more ([`Fence::allows_bytes`]).
    lost: Arc<std::sync::atomic::AtomicBool>,
    /// Writes whose bytes may have left after the fence closed
    /// ([`Fence::wrote_late`]).
    late_writes: Arc<std::sync::atomic::AtomicU64>,
    /// Without leader election: every write passes.
    disabled: bool,
}

/// The error of a write refused by the fence.
#[derive(Debug, thiserror::Error)]
#[error("not sent: this replica does not hold the leader Lease (it was lost or not yet acquired)")]
pub struct Fenced;

impl Fence {
    /// A fence that lets no write through until [`Fence::lead_until`].
    pub fn closed() -> Fence {
        Fence::default()
    }

    /// For a process without leader election: lets every write through.
    pub fn disabled() -> Fence {
        Fence {
            disabled: true,
            ..Fence::default()
        }
    }

    /// Leading until `until` (the acquisition's start plus the renew
    /// deadline).
    pub fn lead_until(&self, until: Instant) {
        let mut current = self.until.lock().unwrap_or_else(|p| p.into_inner());
        *current = Some(until);
        self.lost.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// A renewal: leading until `until` (its start plus the renew
    /// deadline), if still leading. A closed fence stays closed: the
    /// renewer may finish a renewal on another thread just after the
    /// leader stepped down, and must not let writes out again. Decided
    /// under the lock that [`Fence::close`] takes, so there is no window.
    pub fn extend(&self, until: Instant) {
        let mut current = self.until.lock().unwrap_or_else(|p| p.into_inner());
        if current.is_some() {
            *current = Some(until);
        }
    }

    /// Not leading any more.
    pub fn close(&self) {
        *self.until.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// The Lease was lost (the renewal failed, or another holder took
    /// it): closed, and no byte leaves on the client's connections until
    /// the Lease is acquired again ([`Fence::allows_bytes`]). Not for a
    /// step-down, whose release must still go out.
    pub fn lose(&self) {
        let mut current = self.until.lock().unwrap_or_else(|p| p.into_inner());
        *current = None;
        self.lost.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether bytes may be written on the client's connections now
    /// ([`FencedIo`]): not once the Lease is lost, nor while leading past
    /// the last renewal's deadline. The request layer checks each write
    /// before it is handed to the connection, but hyper writes the bytes
    /// later, from its connection task; a pause between the two would let
    /// them out on waking, after another replica took over (chaos seed
    /// 60003). Reads are stopped too: the connection cannot tell them
    /// apart, and the process is about to exit.
    pub fn allows_bytes(&self) -> bool {
        if self.disabled {
            return true;
        }
        if self.lost.load(std::sync::atomic::Ordering::SeqCst) {
            return false;
        }
        self.until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|until| Instant::now() < until)
    }

    /// Bytes that the connection let out ([`Fence::allows_bytes`] said
    /// yes) but that, by the time the write returned, the fence would have
    /// refused: the process was paused (or not scheduled) between the check
    /// and the write's system call, and the pause outlasted the deadline.
    /// No check in the process closes that gap (Kubernetes has no fencing
    /// token an API server would check), so it is said: an error naming
    /// the request, which may reach the API server although another
    /// replica leads by now. Chaos seed 67061 (test server, 2026-11-30): a
    /// PV patch of a leader frozen just then arrived on its wake-up.
    pub fn wrote_late(&self, written: &[u8], len: usize) {
        self.late_writes
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tracing::error!(
            request = %request_line(written),
            bytes = len,
            "{LATE_WRITE}: this process was paused between the fence's last check and the write until past its renew deadline (or the Lease was lost meanwhile); another replica may lead already, and this request may still reach the API server"
        );
    }

    /// How many writes [`Fence::wrote_late`] has reported.
    pub fn late_writes(&self) -> u64 {
        self.late_writes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether a write may be sent now.
    pub fn allows_writes(&self) -> bool {
        self.disabled
            || self
                .until
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some_and(|until| Instant::now() < until)
    }
}

/// The words of the log line of [`Fence::wrote_late`] (the chaos harness
/// looks for them).
pub const LATE_WRITE: &str =
    "bytes of a request left after this replica stopped holding the leader Lease";

/// What a log line names written bytes by: the request line they begin
/// with (`PATCH /api/v1/persistentvolumes/pv-1`, without the query and the
/// protocol), or their length when they begin none (a body, a TLS record).
pub fn request_line(written: &[u8]) -> String {
    let line = written
        .split(|b| *b == b'\r' || *b == b'\n')
        .next()
        .unwrap_or_default();
    let mut words = line.split(|b| *b == b' ');
    let method = words.next().unwrap_or_default();
    let target = words.next().unwrap_or_default();
    let is_method = !method.is_empty() && method.iter().all(u8::is_ascii_uppercase);
    let path = target.split(|b| *b == b'?').next().unwrap_or_default();
    match (
        is_method,
        std::str::from_utf8(method),
        std::str::from_utf8(path),
    ) {
        (true, Ok(method), Ok(path)) if path.starts_with('/') => format!("{method} {path}"),
        _ => format!("{} bytes that begin no request", written.len()),
    }
}

/// Whether a request changes something on the API server.
fn is_write(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::POST | http::Method::PUT | http::Method::PATCH | http::Method::DELETE
    )
}

/// Whether the fence lets `request` through now.
pub fn admits<B>(fence: &Fence, request: &http::Request<B>) -> bool {
    !is_write(request.method())
        || budget_of(request.uri()) == Budget::Election
        || fence.allows_writes()
}

/// The client layer ([`crate::kube_client::build_client`]): the innermost
/// of ours, so that a write is checked when it is sent, not when it starts
/// waiting for its rate-limit slot.
#[derive(Debug, Clone)]
pub struct FenceLayer(pub Fence);

impl<S> Layer<S> for FenceLayer {
    type Service = FencedService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FencedService {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// The service of [`FenceLayer`].
#[derive(Debug, Clone)]
pub struct FencedService<S> {
    inner: S,
    fence: Fence,
}

impl<S, B> Service<http::Request<B>> for FencedService<S>
where
    S: Service<http::Request<B>>,
    S::Error: Into<BoxError>,
    S::Response: Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !admits(&self.fence, &request) {
            tracing::warn!(method = %request.method(), path = %request.uri().path(), "write refused: this replica no longer holds the leader Lease");
            return Box::pin(std::future::ready(Err(Box::new(Fenced) as BoxError)));
        }
        // Checked again at every poll until the answer is in: below us a
        // write may still wait for a connection (a TLS handshake, the
        // pool) across a pause; woken past the deadline, it is dropped
        // before it is handed to the connection, which then skips it.
        // Found by the chaos harness's frozen leader on the real cluster:
        // a journal update admitted before the pause arrived 2.5 ms after
        // the wake-up.
        let fence = (is_write(request.method()) && budget_of(request.uri()) != Budget::Election)
            .then(|| self.fence.clone());
        let path = request.uri().path().to_owned();
        Box::pin(FencedCall {
            call: Box::pin(self.inner.call(request)),
            fence,
            path,
        })
    }
}

/// A write under way: fails (dropping the request) at the first poll at
/// which the fence no longer lets writes out.
struct FencedCall<F> {
    call: Pin<Box<F>>,
    /// `None` for a read or the Lease's own request.
    fence: Option<Fence>,
    path: String,
}

impl<F, T, E> Future for FencedCall<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self
            .fence
            .as_ref()
            .is_some_and(|fence| !fence.allows_writes())
        {
            tracing::warn!(path = %self.path, "write dropped: this replica no longer holds the leader Lease; nothing more of it is sent");
            return Poll::Ready(Err(Box::new(Fenced)));
        }
        self.call.as_mut().poll(cx).map_err(Into::into)
    }
}

/// Wraps a connector so that every connection it makes is a [`FencedIo`]
/// (`crate::kube_client::build_client`).
#[derive(Debug, Clone)]
pub struct FencedConnector<C> {
    pub inner: C,
    pub fence: Fence,
}

impl<C> Service<http::Uri> for FencedConnector<C>
where
    C: Service<http::Uri>,
    C::Future: Send + 'static,
    C::Response: 'static,
{
    type Response = FencedIo<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let fence = self.fence.clone();
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            Ok(FencedIo {
                io: connecting.await?,
                fence,
            })
        })
    }
}

/// A connection that writes nothing once [`Fence::allows_bytes`] says no:
/// the check made where hyper writes a request's bytes.
#[derive(Debug)]
pub struct FencedIo<T> {
    io: T,
    fence: Fence,
}

impl<T> FencedIo<T> {
    fn refused() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::BrokenPipe, Fenced)
    }

    /// After a write the fence let through: bytes written although the
    /// fence would refuse them now left late ([`Fence::wrote_late`]).
    /// `first` is the start of what was offered, to name the request.
    fn account(&self, written: &Poll<std::io::Result<usize>>, first: &[u8]) {
        if let Poll::Ready(Ok(len)) = written
            && *len > 0
            && !self.fence.allows_bytes()
        {
            self.fence.wrote_late(first, *len);
        }
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for FencedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for FencedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if !self.fence.allows_bytes() {
            return Poll::Ready(Err(Self::refused()));
        }
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.account(&written, buf);
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        if !self.fence.allows_bytes() {
            return Poll::Ready(Err(Self::refused()));
        }
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &b[..]);
        self.account(&written, first);
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    /// Fenced too: below us a TLS stream may hold ciphertext that a
    /// write accepted (the socket was full) and sends it on the flush.
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if !self.fence.allows_bytes() {
            return Poll::Ready(Err(Self::refused()));
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<T: hyper_util::client::legacy::connect::Connection>
    hyper_util::client::legacy::connect::Connection for FencedIo<T>
{
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.io.connected()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn request(method: http::Method, path: &str) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .expect("request")
    }

    #[tokio::test(start_paused = true)]
    async fn writes_pass_only_while_the_last_renewal_holds() {
        let fence = Fence::closed();
        let pv = "/api/v1/persistentvolumes/pv-1";
        let lease = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/x";
        let cases = |fence: &Fence| {
            [
                admits(fence, &request(http::Method::GET, pv)),
                admits(fence, &request(http::Method::PATCH, pv)),
                admits(
                    fence,
                    &request(http::Method::POST, "/api/v1/persistentvolumes"),
                ),
                admits(fence, &request(http::Method::DELETE, pv)),
                admits(fence, &request(http::Method::PUT, lease)),
                admits(
                    fence,
                    &request(http::Method::GET, &format!("{pv}?watch=true")),
                ),
            ]
        };
        // A candidate: reads and the Lease only.
        assert_eq!(cases(&fence), [true, false, false, false, true, true]);
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        assert_eq!(cases(&fence), [true; 6]);
        // Frozen past the renew deadline: the clock moved on, no renewal.
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(cases(&fence), [true, false, false, false, true, true]);
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        assert!(fence.allows_writes());
        fence.close();
        assert_eq!(cases(&fence), [true, false, false, false, true, true]);
        assert_eq!(cases(&Fence::disabled()), [true; 6]);
    }

    /// A write admitted while leading that is still waiting below the
    /// fence (for a connection) when the deadline passes is dropped at its
    /// next poll, not sent.
    #[tokio::test(start_paused = true)]
    async fn a_write_still_waiting_when_the_deadline_passes_is_dropped() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let sent = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let inner = {
            let sent = Arc::clone(&sent);
            tower::service_fn(move |_request: http::Request<()>| {
                let sent = Arc::clone(&sent);
                let mut released = released.clone();
                async move {
                    // Waiting for a connection until released.
                    let _ = released.wait_for(|r| *r).await;
                    sent.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(())
                }
            })
        };
        let fence = Fence::closed();
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        let mut service = FenceLayer(fence.clone()).layer(inner);
        let pv = "/api/v1/persistentvolumes/pv-1";
        let write = tokio::spawn(service.call(request(http::Method::PATCH, pv)));
        let read = tokio::spawn(service.call(request(http::Method::GET, pv)));
        tokio::task::yield_now().await;
        // Frozen past the renew deadline, then the connection is there.
        tokio::time::advance(Duration::from_secs(11)).await;
        let _ = release.send(true);
        let write = write.await.expect("write task");
        assert!(
            write.is_err_and(|e| e.is::<Fenced>()),
            "the write is refused"
        );
        assert!(read.await.expect("read task").is_ok(), "a read goes on");
        assert_eq!(sent.load(Ordering::SeqCst), 1, "only the read was sent");
    }

    /// The connection-level check: bytes go while leading within the
    /// deadline, as a candidate and after a step-down (the release goes
    /// out); none past the deadline, nor once the Lease is lost.
    #[tokio::test(start_paused = true)]
    async fn a_connection_writes_nothing_past_the_deadline_or_once_the_lease_is_lost() {
        use hyper::rt::Write as _;
        let (ours, _theirs) = tokio::io::duplex(1024);
        let fence = Fence::closed();
        let mut io = FencedIo {
            io: hyper_util::rt::TokioIo::new(ours),
            fence: fence.clone(),
        };
        let write = async |io: &mut FencedIo<_>| {
            std::future::poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, b"GET"))
                .await
                .is_ok()
        };
        assert!(write(&mut io).await, "a candidate reads");
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        assert!(write(&mut io).await, "leading");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!write(&mut io).await, "woken past the deadline");
        assert!(
            std::future::poll_fn(|cx| Pin::new(&mut io).poll_flush(cx))
                .await
                .is_err(),
            "nor flushed (what a TLS stream below holds would go)"
        );
        fence.extend(Instant::now() + Duration::from_secs(10));
        assert!(write(&mut io).await, "a late renewal still counts");
        fence.close();
        assert!(write(&mut io).await, "stepped down: the release goes out");
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        fence.lose();
        assert!(!write(&mut io).await, "the Lease lost");
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        assert!(write(&mut io).await, "acquired again");
        let (unfenced, _other_end) = tokio::io::duplex(1024);
        let mut open = FencedIo {
            io: hyper_util::rt::TokioIo::new(unfenced),
            fence: Fence::disabled(),
        };
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(write(&mut open).await, "no leader election");
    }

    /// The gap no check in the process closes: a pause between the
    /// connection's check and the write's system call lets the bytes out
    /// after the deadline. They are reported, named by the request they
    /// begin; the next write is refused as ever.
    #[tokio::test(start_paused = true)]
    async fn bytes_let_out_across_a_pause_are_reported() {
        use hyper::rt::Write as _;
        /// A socket whose write, when `pause` is set, happens after the
        /// fence's deadline went by (the process stopped in between).
        struct PausedBeforeWrite {
            fence: Fence,
            pause: bool,
            sent: Vec<u8>,
        }
        impl hyper::rt::Write for PausedBeforeWrite {
            fn poll_write(
                mut self: Pin<&mut Self>,
                _cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<std::io::Result<usize>> {
                if self.pause {
                    self.fence.lead_until(Instant::now());
                }
                self.sent.extend_from_slice(buf);
                Poll::Ready(Ok(buf.len()))
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<std::io::Result<()>> {
                Poll::Ready(Ok(()))
            }
        }
        let fence = Fence::closed();
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        let mut io = FencedIo {
            io: PausedBeforeWrite {
                fence: fence.clone(),
                pause: false,
                sent: Vec::new(),
            },
            fence: fence.clone(),
        };
        let patch = b"PATCH /api/v1/persistentvolumes/pv-1?fieldManager=x HTTP/1.1\r\n\r\n";
        let write = async |io: &mut FencedIo<PausedBeforeWrite>, vectored: bool| {
            std::future::poll_fn(|cx| {
                if vectored {
                    let slices = [std::io::IoSlice::new(&[]), std::io::IoSlice::new(patch)];
                    Pin::new(&mut *io).poll_write_vectored(cx, &slices)
                } else {
                    Pin::new(&mut *io).poll_write(cx, patch)
                }
            })
            .await
            .is_ok()
        };
        assert!(write(&mut io, false).await);
        assert_eq!(fence.late_writes(), 0, "written within the deadline");
        io.io.pause = true;
        assert!(write(&mut io, false).await, "checked in time, so written");
        assert_eq!(fence.late_writes(), 1, "and reported as late");
        assert_eq!(io.io.sent.len(), 2 * patch.len());
        assert!(!write(&mut io, false).await, "the next write is refused");
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        assert!(write(&mut io, true).await);
        assert_eq!(fence.late_writes(), 2, "a vectored write too");
    }

    #[test]
    fn late_bytes_are_named_by_the_request_they_begin() {
        for (bytes, want) in [
            (
                &b"PATCH /api/v1/persistentvolumes/pv-1?fieldManager=x HTTP/1.1\r\nhost: a\r\n"[..],
                "PATCH /api/v1/persistentvolumes/pv-1",
            ),
            (
                b"DELETE /api/v1/namespaces/ns/configmaps/j HTTP/1.1\r\n",
                "DELETE /api/v1/namespaces/ns/configmaps/j",
            ),
            (
                b"POST /api/v1/namespaces/ns/events",
                "POST /api/v1/namespaces/ns/events",
            ),
            (b"{\"metadata\":{}}", "15 bytes that begin no request"),
            (b"patch /x HTTP/1.1", "17 bytes that begin no request"),
            (b"PUT x HTTP/1.1", "14 bytes that begin no request"),
            (b"", "0 bytes that begin no request"),
            (
                &[0x17, 0x03, 0x03, 0x00][..],
                "4 bytes that begin no request",
            ),
        ] {
            assert_eq!(request_line(bytes), want, "{bytes:?}");
        }
    }

    /// A renewal that completes after the leader stepped down (the renewer
    /// runs on its own task) must not let writes out again; one that
    /// completes while leading moves the deadline on, even past a deadline
    /// that has just gone by.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_extends_an_open_fence_and_never_reopens_a_closed_one() {
        let fence = Fence::closed();
        fence.extend(Instant::now() + Duration::from_secs(10));
        assert!(!fence.allows_writes(), "a candidate is not leading");
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(11)).await;
        assert!(!fence.allows_writes());
        fence.extend(Instant::now() + Duration::from_secs(10));
        assert!(fence.allows_writes(), "a late renewal still counts");
        fence.close();
        fence.extend(Instant::now() + Duration::from_secs(10));
        assert!(!fence.allows_writes(), "stepped down: stays closed");
        fence.lead_until(Instant::now() + Duration::from_secs(10));
        assert!(fence.allows_writes(), "acquired again");
    }
}
