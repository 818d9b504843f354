#!/usr/bin/env python3
"""Writes a one-layer OCI image archive (FROM scratch) from a root folder, for
`ctr images import` (deploy/images/build-oci.sh calls it).

    oci_archive.py ROOTFS REF OUT.tar --entrypoint /csi-provisioner --user 65532:65532 \
        [--label KEY=VALUE ...]

Unlike a `docker build`, nothing here needs a daemon: the layer is a tar of
ROOTFS (owned by root, modes kept, mtimes zeroed so that the same input gives
the same digests), the config carries Entrypoint, User, Env and Labels as the
Dockerfile's stages do, and the index names the image REF (annotation
io.containerd.image.name, which `ctr images import` uses as the image name).
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import tarfile

DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def layer_tar(root):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in dirnames + sorted(filenames):
                full = os.path.join(dirpath, name)
                info = tar.gettarinfo(full, arcname=os.path.relpath(full, root))
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rootfs")
    parser.add_argument("ref")
    parser.add_argument("out")
    parser.add_argument("--entrypoint", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--label", action="append", default=[])
    args = parser.parse_args()

    blobs = {}

    def blob(data):
        digest = hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return "sha256:" + digest, len(data)

    raw = layer_tar(args.rootfs)
    layer_digest, layer_size = blob(gzip.compress(raw, compresslevel=6, mtime=0))
    labels = dict(label.split("=", 1) for label in args.label)
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": [args.entrypoint],
            "User": args.user,
            "Env": [DEFAULT_PATH],
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]},
        "history": [{"created_by": "deploy/images/oci_archive.py (FROM scratch)"}],
    }
    config_digest, config_size = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config_size,
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": layer_digest,
                "size": layer_size,
            }
        ],
    }
    manifest_digest, manifest_size = blob(json.dumps(manifest, sort_keys=True).encode())
    last = args.ref.split("/")[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else "latest"
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": manifest_size,
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": args.ref,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    with tarfile.open(args.out, "w") as tar:

        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))

        add("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add("index.json", json.dumps(index).encode())
        for digest, data in blobs.items():
            add("blobs/sha256/" + digest, data)
    print(args.out, args.ref, manifest_digest)


if __name__ == "__main__":
    main()
