#!/usr/bin/env bash
# Builds OCI image archives of csi-provisioner and csi-hostpath without Docker,
# with the layout of the Dockerfile's runtime stages: the binary at
# /csi-provisioner (/csi-hostpath), that path as the entrypoint, the numeric
# user 65532:65532, and the image names and tags of
# deploy/kubernetes/base/kustomization.yaml. Optionally it also archives the
# upstream Go csi-provisioner (the baseline the tests compare against) and
# imports everything into a containerd.
#
#   deploy/images/build-oci.sh [--out DIR] [--bin-dir DIR] [--go-provisioner PATH]
#                              [--go-snapshotter PATH] [--import]
#
#   --out DIR              where the archives go (default target/oci)
#   --bin-dir DIR          take csi-provisioner and csi-hostpath from DIR as
#                          they are (e.g. target/debug, which `cargo test`
#                          built already) instead of the release build
#   --go-provisioner PATH  also archive this Go csi-provisioner binary as
#                          $GO_IMAGE (default
#                          localhost/csi-provisioner-go:<its --version>)
#   --go-snapshotter PATH  also archive this upstream csi-snapshotter binary
#                          (kubernetes-csi/external-snapshotter, for
#                          deploy/kubernetes/snapshotter where no registry
#                          is reachable) as $SNAPSHOTTER_IMAGE (default
#                          localhost/csi-snapshotter:<its --version>)
#   --import               import the archives with
#                          `ctr -a $CTRD_SOCK -n k8s.io images import`
#                          (CTR=ctr, CTRD_SOCK=/run/containerd/containerd.sock)
#
# The binaries are the release builds (`cargo build --release --locked`;
# the test bed, tests/parity/real_node.rs, gives the debug builds with --bin-dir),
# dynamically linked against the build host's glibc, as in the Dockerfile
# (which runs them on distroless/cc, i.e. glibc). The image carries what
# `ldd` lists for each binary, at the same paths, plus the dynamic loader:
# the libraries are the ones the binary was linked against, so there is no
# glibc version skew, and no musl target or static jemalloc build is needed.
# /etc/passwd and /etc/group name the users root and nonroot (65532) as
# distroless does, and /tmp is there (mode 1777). The Go binary is static and
# gets only itself and those files.
#
# The layer and the image config are written by deploy/images/oci_archive.py
# (the config needs `User`, for runAsNonRoot to check without a lookup).
# Prints one line per archive: path, image name, manifest digest.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/target/oci
go_provisioner=
go_snapshotter=
bin_dir=
import=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a folder}; shift 2 ;;
    --go-provisioner) go_provisioner=${2:?--go-provisioner needs a path}; shift 2 ;;
    --go-snapshotter) go_snapshotter=${2:?--go-snapshotter needs a path}; shift 2 ;;
    --import) import=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-oci.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# sed itself stops at the first match: `sed | head -n 1` fails under pipefail
# (141) when head exits before sed has finished writing.
version=$(sed -n '/^version = "/{s/^version = "\(.*\)"$/\1/p;q;}' "$repo/Cargo.toml")
[ -n "$version" ] || { echo "build-oci.sh: no version in Cargo.toml" >&2; exit 1; }
registry=ghcr.io/csi-provisioner-rs
source_url=https://github.com/csi-provisioner-rs/csi-provisioner-rs

if [ -z "$bin_dir" ]; then
  (cd "$repo" && cargo build --release --locked -p csi-provisioner -p csi-hostpath --bins >&2)
  bin_dir=$(cd "$repo" && cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release
fi
for binary in csi-provisioner csi-hostpath; do
  [ -x "$bin_dir/$binary" ] || { echo "build-oci.sh: no $binary in $bin_dir" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# rootfs DIR NAME BINARY: DIR/ becomes a root folder with BINARY at /NAME
# and what it needs.
rootfs() {
  local root=$work/$1 name=$2 binary=$3
  mkdir -p "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  install -m 0755 "$binary" "$root/$name"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
    >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
  # ldd prints "name => /path (addr)" for libraries and "/path (addr)" for
  # the loader; a static binary prints "not a dynamic executable" and fails.
  local libs
  if libs=$(ldd "$binary" 2>/dev/null); then
    local lib
    for lib in $(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$libs"); do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
    if grep -q 'not found' <<<"$libs"; then
      echo "build-oci.sh: $binary misses libraries:" >&2
      grep 'not found' <<<"$libs" >&2
      exit 1
    fi
  fi
  echo "$root"
}

# archive NAME BINARY REF DESCRIPTION
archive() {
  local name=$1 binary=$2 ref=$3 description=$4 root
  root=$(rootfs "$name" "$name" "$binary")
  python3 "$repo/deploy/images/oci_archive.py" "$root" "$ref" "$out/$name.tar" \
    --entrypoint "/$name" --user 65532:65532 \
    --label "org.opencontainers.image.title=$name" \
    --label "org.opencontainers.image.description=$description" \
    --label "org.opencontainers.image.source=$source_url" \
    --label "org.opencontainers.image.licenses=Apache-2.0"
}

archive csi-provisioner "$bin_dir/csi-provisioner" "$registry/csi-provisioner:v$version" \
  "Kubernetes CSI external-provisioner sidecar (drop-in replacement for kubernetes-csi/external-provisioner)"
archive csi-hostpath "$bin_dir/csi-hostpath" "$registry/csi-hostpath:v$version" \
  "Hostpath CSI driver for tests and examples"
archives=("$out/csi-provisioner.tar" "$out/csi-hostpath.tar")

# go_archive NAME ARCHIVE BINARY REF DESCRIPTION: a static Go binary at
# /NAME (its entrypoint) as out/ARCHIVE.tar.
go_archive() {
  local name=$1 tar=$out/$2.tar binary=$3 ref=$4 description=$5 root
  root=$(rootfs "go-$name" "$name" "$binary")
  python3 "$repo/deploy/images/oci_archive.py" "$root" "$ref" "$tar" \
    --entrypoint "/$name" --user 65532:65532 \
    --label "org.opencontainers.image.title=$name" \
    --label "org.opencontainers.image.description=$description"
  archives+=("$tar")
}

if [ -n "$go_provisioner" ]; then
  go_version=$("$go_provisioner" --version | awk '{print $2}')
  go_archive csi-provisioner csi-provisioner-go "$go_provisioner" \
    "${GO_IMAGE:-localhost/csi-provisioner-go:$go_version}" \
    "upstream kubernetes-csi/external-provisioner $go_version (baseline)"
fi
if [ -n "$go_snapshotter" ]; then
  snapshotter_version=$("$go_snapshotter" --version | awk '{print $2}')
  go_archive csi-snapshotter csi-snapshotter "$go_snapshotter" \
    "${SNAPSHOTTER_IMAGE:-localhost/csi-snapshotter:$snapshotter_version}" \
    "upstream kubernetes-csi/external-snapshotter $snapshotter_version"
fi

if [ "$import" = 1 ]; then
  for tar in "${archives[@]}"; do
    "${CTR:-ctr}" -a "${CTRD_SOCK:-/run/containerd/containerd.sock}" -n k8s.io \
      images import --platform linux/amd64 "$tar" >&2
  done
fi
