//! Stalls of the machine, as the test process sees them: a thread sleeps
//! [`TICK`] at a time and records each wake-up at least [`RECORDED`] later
//! than it asked for. A seed's failure report lists the stalls of its
//! span, and a run's summary their count and the longest.
//!
//! Why: the seeds run the sidecar with a `--timeout` of one second, and a
//! start-up call that misses it ends the process by design. Seed 61694 did
//! so on `GetPluginInfo` with no fault on the call, beside a build; its
//! output could not tell a machine that stood still (a paused virtual CPU,
//! a blocked disk) from a call that hung. A sleeping thread that wakes a
//! quarter of a second late on an otherwise busy but running machine is
//! rare (the scheduler favours a thread waking from sleep), so a stall
//! recorded here around a deadline names the deadline's cause, and none
//! recorded points at the processes themselves.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long the watching thread sleeps at a time.
const TICK: Duration = Duration::from_millis(10);

/// How late a wake-up must be to count as a stall.
pub const RECORDED: Duration = Duration::from_millis(250);

/// A wake-up `late` past its time, at `woke`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub woke: Instant,
    pub late: Duration,
}

impl Stall {
    /// When the machine stopped running the thread (about).
    fn began(&self) -> Instant {
        self.woke.checked_sub(self.late).unwrap_or(self.woke)
    }
}

static STALLS: OnceLock<Mutex<Vec<Stall>>> = OnceLock::new();

/// Starts watching (once per process; later calls do nothing).
pub fn watch() {
    STALLS.get_or_init(|| {
        let spawned = std::thread::Builder::new()
            .name("stall-watch".to_owned())
            .spawn(|| {
                loop {
                    let asked = Instant::now();
                    std::thread::sleep(TICK);
                    let woke = Instant::now();
                    let late = woke.duration_since(asked).saturating_sub(TICK);
                    if late >= RECORDED
                        && let Some(stalls) = STALLS.get()
                    {
                        stalls
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(Stall { woke, late });
                    }
                }
            });
        if let Err(e) = spawned {
            eprintln!("chaos: cannot watch for stalls of the machine: {e}");
        }
        Mutex::default()
    });
}

/// Every stall recorded so far.
pub fn all() -> Vec<Stall> {
    STALLS
        .get()
        .map(|stalls| stalls.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .unwrap_or_default()
}

/// The stalls that overlap `from..=to`.
pub fn overlapping(stalls: &[Stall], from: Instant, to: Instant) -> Vec<Stall> {
    stalls
        .iter()
        .filter(|stall| stall.woke >= from && stall.began() <= to)
        .copied()
        .collect()
}

/// What a failed seed's report says of the stalls since `from` (its start).
pub fn report(stalls: &[Stall], from: Instant) -> String {
    if stalls.is_empty() {
        return format!(
            "the machine did not stall during the seed (no wake-up of the test process {} ms or more late)",
            RECORDED.as_millis()
        );
    }
    let each: Vec<String> = stalls
        .iter()
        .map(|stall| {
            format!(
                "{:.2} s from {:.2} s into the seed",
                stall.late.as_secs_f64(),
                stall.began().saturating_duration_since(from).as_secs_f64()
            )
        })
        .collect();
    format!(
        "the machine stalled during the seed (the test process woke late): {}",
        each.join(", ")
    )
}

/// The run summary's line: how many stalls, and the longest.
pub fn summary(stalls: &[Stall]) -> String {
    match stalls.iter().map(|stall| stall.late).max() {
        None => format!(
            "no stall of the machine (no wake-up of the test process {} ms or more late)",
            RECORDED.as_millis()
        ),
        Some(longest) => format!(
            "{} stall(s) of the machine (a wake-up of the test process {} ms or more late), the longest {:.2} s",
            stalls.len(),
            RECORDED.as_millis(),
            longest.as_secs_f64()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, woke_ms: u64, late_ms: u64) -> Stall {
        Stall {
            woke: base + Duration::from_millis(woke_ms),
            late: Duration::from_millis(late_ms),
        }
    }

    #[test]
    fn a_stall_counts_for_a_span_it_overlaps() {
        let base = Instant::now();
        let stalls = [
            at(base, 1_000, 300),  // 0.7 to 1.0 s: before the span
            at(base, 2_200, 500),  // 1.7 to 2.2 s: ends in it
            at(base, 3_000, 400),  // inside
            at(base, 5_500, 1000), // 4.5 to 5.5 s: begins in it
            at(base, 7_000, 300),  // after
        ];
        let span = overlapping(
            &stalls,
            base + Duration::from_millis(2_000),
            base + Duration::from_millis(5_000),
        );
        assert_eq!(span, vec![stalls[1], stalls[2], stalls[3]]);
    }

    #[test]
    fn the_report_places_each_stall_in_the_seed() {
        let base = Instant::now();
        let text = report(&[at(base, 13_500, 1_250)], base);
        assert!(text.contains("1.25 s from 12.25 s into the seed"), "{text}");
        assert!(report(&[], base).contains("did not stall"));
        assert!(summary(&[at(base, 10, 300), at(base, 900, 600)]).contains("2 stall(s)"));
        assert!(summary(&[at(base, 900, 600)]).contains("the longest 0.60 s"));
    }
}
