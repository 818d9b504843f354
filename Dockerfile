# syntax=docker/dockerfile:1
#
# Images of csi-provisioner-rs. Two targets from one build stage:
#
#   docker build --target csi-provisioner -t csi-provisioner:v0.1.0 .
#   docker build --target csi-hostpath    -t csi-hostpath:v0.1.0 .
#
# (without --target you get csi-provisioner, the last stage). Both binaries
# are linked against glibc and run on distroless/cc, which carries glibc and
# CA certificates and nothing else: no shell, no package manager. The builder
# is Debian 12 (bookworm), the same glibc as distroless' debian12 images.
# They run as the numeric user 65532 ("nonroot"), so runAsNonRoot can verify
# it without an /etc/passwd lookup.
#
# tests/deploy.rs keeps this file true: COPY sources exist, binary and
# package names match Cargo.toml, RUST_VERSION is not older than the
# workspace's rust-version, the runtime user is not root.

ARG RUST_VERSION=1.89
ARG DEBIAN_RELEASE=bookworm
ARG DISTROLESS_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM docker.io/library/rust:${RUST_VERSION}-slim-${DEBIAN_RELEASE} AS build
# jemalloc, the allocator (src/memory.rs), is built from C sources with
# make, which the slim image lacks.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The commit `--version` prints after the crate version (build.rs): the
# context has no .git to describe, so pass it, e.g. --build-arg
# CSI_PROVISIONER_GIT_COMMIT=$(git describe --always --dirty --exclude='*');
# without it, the crate version alone.
ARG CSI_PROVISIONER_GIT_COMMIT=
# The whole workspace: Cargo needs every member's manifest to load it. No
# system protoc is needed (proto/ is compiled by the pure-Rust protox).
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY src ./src
COPY csi-sanity ./csi-sanity
COPY tests ./tests
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p csi-provisioner --bin csi-provisioner \
 && cargo build --release --locked -p csi-hostpath --bin csi-hostpath \
 && mkdir -p /out \
 && cp target/release/csi-provisioner target/release/csi-hostpath /out/

FROM ${DISTROLESS_IMAGE} AS csi-hostpath
COPY --from=build /out/csi-hostpath /csi-hostpath
LABEL org.opencontainers.image.title="csi-hostpath" \
      org.opencontainers.image.description="Hostpath CSI driver for tests and examples" \
      org.opencontainers.image.source="https://github.com/csi-provisioner-rs/csi-provisioner-rs" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/csi-hostpath"]

FROM ${DISTROLESS_IMAGE} AS csi-provisioner
COPY --from=build /out/csi-provisioner /csi-provisioner
LABEL org.opencontainers.image.title="csi-provisioner" \
      org.opencontainers.image.description="Kubernetes CSI external-provisioner sidecar (drop-in replacement for kubernetes-csi/external-provisioner)" \
      org.opencontainers.image.source="https://github.com/csi-provisioner-rs/csi-provisioner-rs" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
ENTRYPOINT ["/csi-provisioner"]
