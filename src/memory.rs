//! Giving memory back to the system. The watch caches are filled by lists
//! whose transient buffers (response bodies, decoded pages, the previous
//! store during a re-list) are freed at once but stay in glibc's heaps, so
//! without this the resident size after start-up is the start-up peak,
//! roughly twice what the caches hold. And glibc gives each thread that
//! allocates its own arena (up to 8 per core), each keeping its own free
//! memory; the runtime's worker threads all allocate.

/// Caps glibc's malloc arenas at two: the workers then share heaps instead
/// of each keeping free memory of its own. Call first thing in `main`.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning; M_ARENA_MAX with a
    // positive value is documented for any time, and we call it before
    // other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Returns free heap memory to the system (`malloc_trim(0)`): after the
/// caches are filled, and after each re-list.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own
    // heaps; it is thread-safe (it takes each arena's lock).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Returns free memory every `period`, for ever (after dropping the shared
/// strings no cached object holds any more), as the Go runtime's
/// scavenger does for the upstream sidecar. Memory freed after start-up
/// (every cached object queued by each loop at once, then drained) and by
/// each operation stays resident otherwise: about 4 MiB at 10,000 volumes.
/// A trim of a heap of that size takes a few milliseconds, on a blocking
/// thread.
/// Stopped when the returned guard is dropped.
pub fn release_free_memory_every(period: std::time::Duration) -> Trimmer {
    Trimmer(tokio::spawn(trim_every(period)))
}

/// The periodic trim of [`release_free_memory_every`]; stops when dropped.
pub struct Trimmer(tokio::task::JoinHandle<()>);

impl Drop for Trimmer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn trim_every(period: std::time::Duration) {
    let mut timer = tokio::time::interval(period);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the caches just trimmed.
    timer.tick().await;
    loop {
        timer.tick().await;
        let _ = tokio::task::spawn_blocking(|| {
            // Strings of deleted or changed objects, before the trim
            // returns their memory.
            crate::projection::forget_unused_strings();
            release_free_memory();
        })
        .await;
    }
}
