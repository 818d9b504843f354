//! The allocator, and giving memory back to the system.
//!
//! The allocator is jemalloc rather than glibc's malloc because it can
//! sample allocations with their stacks, which is what the heap profile of
//! `--enable-pprof` (`src/pprof.rs`) is made of; the sampling is compiled
//! in but off unless the flag is given.
//!
//! The watch caches are filled by lists whose transient buffers (response
//! bodies, decoded pages, the previous store during a re-list) are freed at
//! once but stay in the allocator's arenas, so without the purges below
//! the resident size after start-up is the start-up peak, roughly twice
//! what the caches hold. And every thread that allocates would otherwise
//! spread over many arenas (jemalloc's default is four per core), each
//! keeping its own free memory; the runtime's worker threads all allocate.

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its first allocation (before `main`, so
/// they cannot follow a flag; hence sampling compiled in and inactive):
/// - `prof:true,prof_active:false,lg_prof_sample:19`: heap profiling
///   ready, one sample per 2^19 = 512 KiB allocated on average (Go's
///   `MemProfileRate`), off until [`set_heap_sampling`];
/// - `narenas:2`: the workers share two arenas, as glibc was held to two
///   (`M_ARENA_MAX`) before;
/// - the purges are ours ([`release_free_memory`]), as glibc's
///   `malloc_trim` was; jemalloc's own decay still returns dirty pages
///   after 10 s of allocator activity.
///
/// The name has `tikv-jemalloc-sys`' prefix, as all of jemalloc's symbols
/// here (Rust's allocations go to jemalloc, C code's stay with glibc); the
/// environment variable `_RJEM_MALLOC_CONF` overrides it.
#[used]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 56] = b"prof:true,prof_active:false,lg_prof_sample:19,narenas:2\0";

#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("the allocator has no heap profiling (opt.prof is off)")]
    NotProfiling,
    #[error("jemalloc {name}: {error}")]
    Jemalloc { name: &'static str, error: String },
    #[error("cannot create the heap dump's memory file: {0}")]
    DumpFile(std::io::Error),
    #[error("heap profiles need Linux (an anonymous memory file for the dump)")]
    Unsupported,
}

fn jemalloc_error(name: &'static str, error: tikv_jemalloc_ctl::Error) -> MemoryError {
    MemoryError::Jemalloc {
        name,
        error: error.to_string(),
    }
}

/// Whether jemalloc was started with heap profiling (the options above).
fn profiling_compiled_in() -> Result<bool, MemoryError> {
    // SAFETY: `opt.prof` is a documented read-only bool.
    unsafe { tikv_jemalloc_ctl::raw::read::<bool>(b"opt.prof\0") }
        .map_err(|e| jemalloc_error("opt.prof", e))
}

/// Starts (or stops) sampling allocations for the heap profile.
pub fn set_heap_sampling(active: bool) -> Result<(), MemoryError> {
    if !profiling_compiled_in()? {
        return Err(MemoryError::NotProfiling);
    }
    // SAFETY: `prof.active` is a documented read-write bool.
    unsafe { tikv_jemalloc_ctl::raw::write(b"prof.active\0", active) }
        .map_err(|e| jemalloc_error("prof.active", e))
}

/// jemalloc's heap dump (its text format) of the sampled allocations still
/// live, in an anonymous memory file: jemalloc writes to a file name, and a
/// file system may be read-only (as in `deploy/`), so the name given is the
/// memory file's `/proc/self/fd` link.
pub fn heap_dump() -> Result<std::fs::File, MemoryError> {
    #[cfg(target_os = "linux")]
    {
        use std::io::Seek as _;
        use std::os::fd::{AsRawFd as _, FromRawFd as _};
        if !profiling_compiled_in()? {
            return Err(MemoryError::NotProfiling);
        }
        // SAFETY: memfd_create takes a NUL-terminated name and flags; it
        // returns a new descriptor or -1.
        let fd = unsafe { libc::memfd_create(c"heap-profile".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(MemoryError::DumpFile(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let mut file = unsafe { std::fs::File::from_raw_fd(fd) };
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
            .map_err(|e| MemoryError::DumpFile(std::io::Error::other(e)))?;
        // SAFETY: `prof.dump` is a documented write-only C string: the
        // file name to write the dump to; `path` outlives the call.
        unsafe { tikv_jemalloc_ctl::raw::write(b"prof.dump\0", path.as_ptr()) }
            .map_err(|e| jemalloc_error("prof.dump", e))?;
        file.rewind().map_err(MemoryError::DumpFile)?;
        Ok(file)
    }
    #[cfg(not(target_os = "linux"))]
    Err(MemoryError::Unsupported)
}

/// Returns free heap memory to the system: every arena's unused pages
/// (jemalloc's `arena.<all>.purge`, what glibc's `malloc_trim(0)` did
/// here before). After the caches are filled, and after each re-list.
pub fn release_free_memory() {
    // MALLCTL_ARENAS_ALL (4096): every arena.
    // SAFETY: `arena.<i>.purge` is documented as a void control: no old or
    // new value; the name is NUL-terminated.
    let rc = unsafe {
        tikv_jemalloc_sys::mallctl(
            c"arena.4096.purge".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        tracing::debug!(errno = rc, "jemalloc arena purge failed");
    }
}
/// Returns free memory every `period`, for ever (after dropping the shared
/// strings no cached object holds any more), as the Go runtime's
/// scavenger does for the upstream sidecar. Memory freed after start-up
/// (every cached object queued by each loop at once, then drained) and by
/// each operation stays resident otherwise: about 4 MiB at 10,000 volumes.
/// The purge runs on a blocking thread.
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
