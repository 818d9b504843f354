#!/usr/bin/env bash
# Installs etcd 3.5 into DEST (DEST/etcd) for the real-cluster tests that need
# etcd's progress requests (3.5.13 and later): kube-apiserver brings its watch
# cache up to date with them for a consistent read, which the attachment
# check's catch-up relies on (src/provisioner/attached.rs). The etcd of
# ../shared/k8s/install.sh is Debian bookworm's 3.4.23, which has none.
#
# Takes Debian trixie's etcd-server package from the Debian archive (its
# binary needs only libc 2.34 or later) and checks its SHA-256. Idempotent.
set -euo pipefail

dest=${1:?usage: install-etcd-3.5.sh DEST}
version=3.5.16-4
sha256=0875921bb0d023f2af9b8e15cdfbe417a03e65731345fb832c40f9c2dd72967b
url="${DEBIAN_MIRROR:-http://deb.debian.org/debian}/pool/main/e/etcd/etcd-server_${version}_amd64.deb"

# No `etcd --version | grep -q` or `| head` under pipefail: the reader exits
# at its first line, etcd writes three more and dies of SIGPIPE, and the
# pipeline fails with 141 (CI failed so after 7 s, at the `head` below).
installed=""
if [ -x "$dest/etcd" ]; then
  installed=$("$dest/etcd" --version 2>/dev/null || true)
fi
if [[ $installed == "etcd Version: 3.5."* ]]; then
  echo "etcd 3.5 already in $dest" >&2
  exit 0
fi
mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "downloading $url ..." >&2
curl -fsSL --retry 3 -o "$work/etcd.deb" "$url"
echo "$sha256  $work/etcd.deb" | sha256sum -c --quiet -
dpkg-deb -x "$work/etcd.deb" "$work/root"
install -m 0755 "$work/root/usr/bin/etcd" "$dest/etcd"
installed=$("$dest/etcd" --version)
printf '%s\n' "${installed%%$'\n'*}" >&2
