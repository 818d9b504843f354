//! A CSI conformance suite in the spirit of kubernetes-csi/csi-test's
//! `csi-sanity`: it connects to a driver's unix socket, asks which
//! capabilities the driver advertises and runs the checks of the CSI
//! specification's MUST rules that apply, printing one line per check
//! (`PASS`/`FAIL`/`SKIP`) and a `N passed, N failed, N skipped` summary.
//!
//! Library use:
//!
//! ```no_run
//! # async fn demo() -> Result<(), csi_sanity::SuiteError> {
//! let mut config = csi_sanity::Config::new("/run/csi/csi.sock");
//! config.test_volume_size = 1 << 20;
//! let report = csi_sanity::run(config, &mut std::io::stdout()).await?;
//! assert_eq!(report.failed(), 0);
//! # Ok(()) }
//! ```

pub mod checks;
pub mod cli;
pub mod config;
pub mod quantity;
pub mod report;
pub mod runner;

pub use config::{AccessType, Config, Secrets};
pub use report::{CheckResult, Outcome, Report};
pub use runner::{CLEANUP_CHECK, SuiteError, run, run_until};
