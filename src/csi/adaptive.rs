//! Adaptive concurrency of the calls that make and remove volumes
//! (`CreateVolume`, `DeleteVolume`), beyond the Go image.
//!
//! The Go image sends as many of these at once as it has workers
//! (`--worker-threads`, 100 per queue), and driver projects tell users to
//! cut that number by hand when their backend chokes. Here a driver that
//! answers `RESOURCE_EXHAUSTED` or `ABORTED` gets fewer calls at once:
//! the limit is halved (multiplicative decrease), then grows again by about
//! one per limit's worth of successful calls (additive increase), up to the
//! ceiling, which is what the workers could send anyway. A healthy driver
//! never sees the limit below the ceiling, so it is called as the Go image
//! would call it. `--adaptive-concurrency=false` turns this off.
//!
//! The arithmetic is [`Aimd`], a pure state machine; [`ConcurrencyLimit`]
//! holds it with the count of calls in flight and hands out [`Permit`]s.
//! A permit whose call is dropped (its future cancelled) gives its slot back
//! without feedback.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// How a call that held a permit ended, as far as the limit is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// The driver answered OK.
    Succeeded,
    /// The driver refused for load: `RESOURCE_EXHAUSTED` or `ABORTED`.
    Overloaded,
    /// Anything else (an error that says nothing about load).
    Other,
}

impl CallOutcome {
    /// The outcome of a call's result.
    pub fn of<T>(result: &Result<T, super::CsiError>) -> CallOutcome {
        match result {
            Ok(_) => CallOutcome::Succeeded,
            Err(e)
                if matches!(
                    e.code(),
                    tonic::Code::ResourceExhausted | tonic::Code::Aborted
                ) =>
            {
                CallOutcome::Overloaded
            }
            Err(_) => CallOutcome::Other,
        }
    }
}

/// Additive increase, multiplicative decrease of a concurrency limit.
///
/// A refusal halves the limit once per *generation*: the calls that started
/// before the last decrease saw the old load, so their refusals do not cut
/// the limit again (otherwise one burst of refusals would take it to 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Aimd {
    limit: f64,
    ceiling: f64,
    generation: u64,
}

impl Aimd {
    /// Starts at the ceiling (at least 1).
    pub fn new(ceiling: u32) -> Aimd {
        let ceiling = f64::from(ceiling.max(1));
        Aimd {
            limit: ceiling,
            ceiling,
            generation: 0,
        }
    }

    /// How many calls may be in flight now (at least 1).
    pub fn allowed(&self) -> usize {
        // The limit lies in [1, ceiling], a u32: the cast is exact.
        self.limit.floor().max(1.0) as usize
    }

    /// The generation a call starting now belongs to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Records the end of a call that started in generation `started_in`.
    pub fn ended(&mut self, started_in: u64, outcome: CallOutcome) {
        match outcome {
            CallOutcome::Succeeded => {
                self.limit = (self.limit + 1.0 / self.limit).min(self.ceiling);
            }
            CallOutcome::Overloaded if started_in == self.generation => {
                self.limit = (self.limit / 2.0).max(1.0);
                self.generation += 1;
            }
            CallOutcome::Overloaded | CallOutcome::Other => {}
        }
    }
}

#[derive(Debug)]
struct State {
    aimd: Aimd,
    in_flight: usize,
}

/// The limit shared by every `CreateVolume` and `DeleteVolume` call to one
/// driver.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    state: Mutex<State>,
    freed: Notify,
}

impl ConcurrencyLimit {
    /// A limit starting at (and never above) `ceiling`.
    pub fn new(ceiling: u32) -> Arc<ConcurrencyLimit> {
        let aimd = Aimd::new(ceiling);
        crate::metrics::set_driver_concurrency_limit(aimd.allowed());
        Arc::new(ConcurrencyLimit {
            state: Mutex::new(State { aimd, in_flight: 0 }),
            freed: Notify::new(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many calls may be in flight now.
    pub fn allowed(&self) -> usize {
        self.state().aimd.allowed()
    }

    /// How many calls hold a permit now.
    pub fn in_flight(&self) -> usize {
        self.state().in_flight
    }

    /// Waits for a free slot. Cancel-safe: a future dropped while waiting
    /// holds nothing.
    pub async fn acquire(self: &Arc<Self>) -> Permit {
        loop {
            // Registered before the check, so that a slot freed between the
            // check and the wait still wakes this waiter.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.state();
                if state.in_flight < state.aimd.allowed() {
                    state.in_flight += 1;
                    return Permit {
                        limit: Arc::clone(self),
                        generation: state.aimd.generation(),
                        released: false,
                    };
                }
            }
            freed.await;
        }
    }

    fn release(&self, feedback: Option<(u64, CallOutcome)>) {
        let allowed = {
            let mut state = self.state();
            state.in_flight = state.in_flight.saturating_sub(1);
            if let Some((generation, outcome)) = feedback {
                state.aimd.ended(generation, outcome);
            }
            state.aimd.allowed()
        };
        crate::metrics::set_driver_concurrency_limit(allowed);
        // Every waiter checks again: a grown limit may admit several.
        self.freed.notify_waiters();
    }
}

/// One call's slot; give it back with [`Permit::finish`] (or drop it).
#[derive(Debug)]
pub struct Permit {
    limit: Arc<ConcurrencyLimit>,
    generation: u64,
    released: bool,
}

impl Permit {
    /// Gives the slot back and tells the limit how the call ended.
    pub fn finish(mut self, outcome: CallOutcome) {
        self.released = true;
        self.limit.release(Some((self.generation, outcome)));
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.released {
            self.limit.release(None);
        }
    }
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
