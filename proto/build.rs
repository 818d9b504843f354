//! Compiles `csi.proto` with the pure-Rust `protox` compiler (no system
//! `protoc`, `PROTOC` is never consulted) and generates tonic clients and
//! servers for every CSI service. Server traits get default methods that
//! answer `UNIMPLEMENTED` (as the CSI spec asks for an RPC a plugin does not
//! offer), so a driver or a test wrapper implements only what it serves.
//!
//! Messages that carry a field marked `(csi_secret) = true` do not get prost's
//! derived `Debug`; this script writes a `Debug` impl for them that prints
//! `***stripped***` in place of every secret field (the same marker as the Go
//! `protosanitizer`), so a request can be logged with `{:?}` without leaking
//! credentials. The set of such messages is read from the descriptor, not
//! listed by hand, so a secret field added to the proto is redacted
//! automatically.

use std::fmt::Write as _;
use std::path::PathBuf;

use prost_reflect::{MessageDescriptor, Value};

const PROTO_DIR: &str = "proto";
const PROTO_FILE: &str = "csi.proto";
const PACKAGE: &str = "csi.v1";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    // The crate lives in `proto/`, the schema next to its Cargo.toml.
    let include = if manifest_dir.join(PROTO_FILE).exists() {
        manifest_dir.clone()
    } else {
        manifest_dir.join(PROTO_DIR)
    };
    println!(
        "cargo:rerun-if-changed={}",
        include.join(PROTO_FILE).display()
    );

    let mut compiler = protox::Compiler::new([&include])?;
    compiler.include_imports(true).include_source_info(true);
    compiler.open_file(PROTO_FILE)?;
    let pool = compiler.descriptor_pool();
    let fds = compiler.file_descriptor_set();
    println!("cargo:rerun-if-changed=build.rs");

    let secret_ext = pool
        .get_extension_by_name(&format!("{PACKAGE}.csi_secret"))
        .ok_or("csi.proto must declare the csi_secret field option")?;

    let mut redacted_messages = Vec::new();
    let mut impls = String::new();
    for message in pool.all_messages() {
        if message.package_name() != PACKAGE {
            continue;
        }
        let secret_fields: Vec<String> = message
            .fields()
            .filter(|f| {
                let opts = f.options();
                opts.has_extension(&secret_ext)
                    && matches!(opts.get_extension(&secret_ext).as_ref(), Value::Bool(true))
            })
            .map(|f| f.name().to_owned())
            .collect();
        if secret_fields.is_empty() {
            continue;
        }
        redacted_messages.push(format!(".{}", message.full_name()));
        write_redacted_debug(&mut impls, &message, &secret_fields)?;
    }
    if redacted_messages.is_empty() {
        return Err("no csi_secret fields found: the option is not being read".into());
    }

    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .generate_default_stubs(true)
        .skip_debug(redacted_messages)
        .compile_fds(fds)?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("csi.v1.redact.rs"), impls)?;
    std::fs::write(
        out_dir.join("csi_descriptor.bin"),
        compiler.encode_file_descriptor_set(),
    )?;
    Ok(())
}

/// Rust path of a message relative to the package module, following prost's
/// naming (`Outer.Inner` becomes `outer::Inner`).
fn rust_path(message: &MessageDescriptor) -> String {
    let relative = message
        .full_name()
        .strip_prefix(&format!("{PACKAGE}."))
        .unwrap_or(message.full_name());
    let parts: Vec<&str> = relative.split('.').collect();
    let mut path = String::new();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 < parts.len() {
            path.push_str(&snake_case(part));
            path.push_str("::");
        } else {
            path.push_str(part);
        }
    }
    path
}

fn snake_case(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn rust_ident(name: &str) -> String {
    match name {
        "type" | "match" | "ref" | "self" | "mod" | "fn" | "use" | "in" => format!("r#{name}"),
        _ => name.to_owned(),
    }
}

fn write_redacted_debug(
    out: &mut String,
    message: &MessageDescriptor,
    secret_fields: &[String],
) -> std::fmt::Result {
    let path = rust_path(message);
    let short = message.name();
    writeln!(out, "impl ::core::fmt::Debug for {path} {{")?;
    writeln!(
        out,
        "    fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {{"
    )?;
    writeln!(out, "        f.debug_struct(\"{short}\")")?;
    let mut seen_oneofs = Vec::new();
    for field in message.fields() {
        // Real oneofs are one Rust field named after the oneof; proto3
        // `optional` fields use synthetic oneofs but stay plain fields.
        if let Some(oneof) = field.containing_oneof().filter(|o| !o.is_synthetic()) {
            let name = oneof.name().to_owned();
            if !seen_oneofs.contains(&name) {
                writeln!(
                    out,
                    "            .field(\"{name}\", &self.{})",
                    rust_ident(&name)
                )?;
                seen_oneofs.push(name);
            }
            continue;
        }
        let name = field.name();
        if secret_fields.iter().any(|s| s == name) {
            writeln!(out, "            .field(\"{name}\", &crate::STRIPPED)")?;
        } else {
            writeln!(
                out,
                "            .field(\"{name}\", &self.{})",
                rust_ident(name)
            )?;
        }
    }
    writeln!(out, "            .finish()")?;
    writeln!(out, "    }}")?;
    writeln!(out, "}}")?;
    Ok(())
}
