#!/usr/bin/env python3
"""Pack directories into an OCI image archive that `ctr images import` reads (no registry).

  oci-image.py --name REF --out ARCHIVE.tar [--user U] [--cmd JSON] [--entrypoint JSON]
               [--env K=V ...] [--workdir DIR] [--label K=V ...] DIR [DIR ...]

Each DIR becomes one uncompressed layer (in order, later over earlier), packed by GNU tar
with numeric owners, sorted names and mtime 0, so the same tree gives the same digests.
REF is the full reference (e.g. docker.io/library/split-provisioner:node-test).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--user", default="")
    p.add_argument("--cmd", default="null")
    p.add_argument("--entrypoint", default="null")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--workdir", default="/")
    p.add_argument("--label", action="append", default=[])
    p.add_argument("dirs", nargs="+")
    a = p.parse_args()

    work = tempfile.mkdtemp(prefix="oci-", dir=os.path.dirname(os.path.abspath(a.out)))
    try:
        blobs = os.path.join(work, "blobs", "sha256")
        os.makedirs(blobs)
        layers = []
        for d in a.dirs:
            tmp = os.path.join(work, "layer.tar")
            subprocess.run(
                ["tar", "--numeric-owner", "--sort=name", "--mtime=@0", "--xattrs",
                 "-C", d, "-cf", tmp, "."],
                check=True,
            )
            digest = sha256_file(tmp)
            size = os.path.getsize(tmp)
            os.replace(tmp, os.path.join(blobs, digest))
            layers.append((digest, size))

        def put(obj):
            data = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
            digest = hashlib.sha256(data).hexdigest()
            with open(os.path.join(blobs, digest), "wb") as f:
                f.write(data)
            return digest, len(data)

        env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + a.env
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "User": a.user,
                "Env": env,
                "Cmd": json.loads(a.cmd),
                "Entrypoint": json.loads(a.entrypoint),
                "WorkingDir": a.workdir,
                "Labels": dict(kv.split("=", 1) for kv in a.label) or None,
            },
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + d for d, _ in layers]},
            "history": [{"created_by": "tools/node/oci-image.py"} for _ in layers],
        }
        cfg_digest, cfg_size = put(config)
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": "sha256:" + cfg_digest, "size": cfg_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": "sha256:" + d, "size": s} for d, s in layers],
        }
        man_digest, man_size = put(manifest)
        tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": "sha256:" + man_digest,
                "size": man_size,
                "annotations": {"io.containerd.image.name": a.name,
                                "org.opencontainers.image.ref.name": tag},
            }],
        }
        with open(os.path.join(work, "index.json"), "w") as f:
            json.dump(index, f)
        with open(os.path.join(work, "oci-layout"), "w") as f:
            json.dump({"imageLayoutVersion": "1.0.0"}, f)
        tmp_out = a.out + ".tmp"
        with tarfile.open(tmp_out, "w") as t:
            for name in ["oci-layout", "index.json", "blobs"]:
                t.add(os.path.join(work, name), arcname=name)
        os.replace(tmp_out, a.out)
        print("sha256:" + man_digest)
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
