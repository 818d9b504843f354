//! CSI v1.12.0 wire types and gRPC stubs (package `csi.v1`).
//!
//! Generated at build time from `csi.proto` in this crate by `protox` and
//! `tonic-prost-build`; no system `protoc` is involved. Messages with fields
//! marked `(csi_secret) = true` have a `Debug` impl that prints
//! [`STRIPPED`] instead of the secret values.

/// What `Debug` prints in place of a secret field, as the Go `protosanitizer`
/// used by the upstream sidecars does.
pub const STRIPPED: Stripped = Stripped;

/// Stand-in for a redacted value in `Debug` output.
#[derive(Clone, Copy)]
pub struct Stripped;

impl core::fmt::Debug for Stripped {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("***stripped***")
    }
}

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    rustdoc::all,
    unused_qualifications
)]
pub mod v1 {
    tonic::include_proto!("csi.v1");
    include!(concat!(env!("OUT_DIR"), "/csi.v1.redact.rs"));
}

pub mod codes;
pub mod quantity;
pub mod transport;

pub use v1::*;

/// The compiled `csi.proto` (with its imports) as an encoded
/// `google.protobuf.FileDescriptorSet`, for reflection and conformance tests.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/csi_descriptor.bin"));
