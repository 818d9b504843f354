//! Compiles `proto/pluginregistration.proto` (the kubelet's plugin
//! registration API, which the driver serves to register itself as a node
//! plugin; see `src/registration.rs`) with the pure-Rust `protox`, as
//! `proto/build.rs` does for `csi.proto`: no system `protoc`.

use std::path::PathBuf;

const PROTO_FILE: &str = "pluginregistration.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let include = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    println!(
        "cargo:rerun-if-changed={}",
        include.join(PROTO_FILE).display()
    );
    println!("cargo:rerun-if-changed=build.rs");
    let mut compiler = protox::Compiler::new([&include])?;
    compiler.open_file(PROTO_FILE)?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
