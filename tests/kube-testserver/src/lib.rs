//! An in-memory Kubernetes API server for tests.
//!
//! It speaks the real REST and watch protocol for the kinds in
//! [`builtin_resources`], in-process as a `tower::Service` behind
//! `kube::Client` ([`TestServer::client`]) or over plain HTTP on 127.0.0.1
//! with a generated kubeconfig ([`TestServer::serve_http`]); both go through
//! the same request handler. See the crate README for the behaviour covered.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kube_testserver::Error> {
//! let server = kube_testserver::TestServer::new();
//! let client = server.client();
//! let http = server.serve_http().await?;
//! println!("{} {}", http.url(), http.kubeconfig_path().display());
//! # drop(client);
//! # Ok(())
//! # }
//! ```

mod api;
mod controller;
mod defaults;
mod discovery;
mod error;
mod faults;
mod gc;
mod http;
mod meta;
mod observe;
mod openapi;
mod ops;
mod patch;
mod resources;
mod selectors;
mod server;
mod store;
mod table;
mod watch;

pub use api::ResponseBody;
pub use controller::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_BIND_COMPLETED, ANN_BOUND_BY_CONTROLLER, ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
};
pub use error::{ApiError, Error};
pub use faults::RequestMatch;
pub use http::kubeconfig_yaml;
pub use observe::{Origin, RequestRecord, Verb};
pub use resources::{ResourceInfo, builtin_resources};
pub use server::{
    HttpOptions, HttpServer, ServiceError, TestServer, TestServerBuilder, TestService,
};
