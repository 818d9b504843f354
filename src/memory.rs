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
