//! Child processes that never outlive the test process.
//!
//! A test binary that panics, is killed by a timeout or exits early must not
//! leave an etcd, an API server or a sidecar running: the next run would find
//! its ports, sockets and volumes taken. Each child gets a watchdog (`sh`)
//! that reads its standard input from a pipe held by this process; when this
//! process ends, however it ends, the kernel closes the pipe, the watchdog's
//! `read` returns and it terminates the child. No signal handler and no
//! `unsafe` (`PR_SET_PDEATHSIG`) is needed.

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process with its watchdog.
pub struct GuardedChild {
    name: String,
    child: Child,
    /// The watchdog and the write end of its pipe; dropping the pipe (or this
    /// process exiting) makes it terminate `child`.
    watchdog: Option<(Child, ChildStdin)>,
}

impl GuardedChild {
    /// Spawns `command` with stdout and stderr appended to `log` and stdin
    /// closed.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> io::Result<GuardedChild> {
        let out = File::options().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("cannot start {name}: {e}")))?;
        GuardedChild::guard(name, child)
    }

    /// Puts an already spawned child under a watchdog.
    pub fn guard(name: &str, child: Child) -> io::Result<GuardedChild> {
        let mut watchdog = Command::new("sh")
            .arg("-c")
            // $0 is the child's pid. `read` returns on EOF, i.e. when the
            // test process is gone or dropped us.
            .arg("read _; kill -TERM \"$0\" 2>/dev/null; sleep 2; kill -KILL \"$0\" 2>/dev/null")
            .arg(child.id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let pipe = watchdog
            .stdin
            .take()
            .ok_or_else(|| io::Error::other("watchdog without stdin"))?;
        Ok(GuardedChild {
            name: name.to_owned(),
            child,
            watchdog: Some((watchdog, pipe)),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The exit status, if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM, then SIGKILL after `grace`; returns the exit status.
    pub fn stop(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.disarm();
        if let Some(status) = self.try_wait() {
            return Some(status);
        }
        signal(self.child.id(), "TERM");
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        self.child.wait().ok()
    }

    /// SIGKILL, as in a node crash.
    pub fn kill(&mut self) {
        self.disarm();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, ...).
    pub fn signal(&self, name: &str) {
        signal(self.child.id(), name);
    }

    /// Waits up to `timeout` for the child to exit by itself.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                self.disarm();
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the watchdog without touching the child: once the child is
    /// reaped, its pid may be reused and must not be signalled any more.
    fn disarm(&mut self) {
        if let Some((mut watchdog, pipe)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
            drop(pipe);
        }
    }
}

impl Drop for GuardedChild {
    fn drop(&mut self) {
        self.kill();
    }
}

/// kill(1): keeps this crate free of `unsafe` and of a libc dependency.
fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Removes `dir` when this process ends, however it ends (the same pipe
/// trick as [`GuardedChild`]); the returned handle keeps it armed.
pub fn remove_on_exit(dir: &Path) -> io::Result<(Child, ChildStdin)> {
    let mut watchdog = Command::new("sh")
        .arg("-c")
        .arg("read _; sleep 3; rm -rf \"$0\"")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let pipe = watchdog
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("watchdog without stdin"))?;
    Ok((watchdog, pipe))
}
