# syntax=docker/dockerfile:1
# One image with the three service binaries and the operator's provisioner-ctl; each
# Deployment in deploy/ picks its binary with `command:` (provision-svc, pv-writer,
# reclaim-svc); provisioner-ctl is the runbook's tool (deploy/README.md, "Runbook").
#
#   docker build -t split-provisioner:dev .
#
# Builder: the workspace's toolchain on Debian 12, so the binaries link against
# the same glibc as the runtime image.
FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target dir between builds; the binaries are
# copied out of the cached target dir in the same step. Profile `dist` (Cargo.toml):
# release with LTO, one codegen unit, size-optimised: a smaller resident binary.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --profile dist --locked -p provision-svc -p pv-writer -p reclaim-svc -p provisioner-ctl \
 && mkdir -p /out \
 && cp target/dist/provision-svc target/dist/pv-writer target/dist/reclaim-svc target/dist/provisioner-ctl /out/

# Runtime: glibc, libgcc, CA certificates and nothing else (no shell, no
# package manager). Default user is "nonroot" (65532); provision-svc and
# reclaim-svc override it to uid 0 in their Deployments for the hostpath base
# dir (see deploy/README.md, "Security context").
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/provision-svc /usr/local/bin/provision-svc
COPY --from=builder /out/pv-writer /usr/local/bin/pv-writer
COPY --from=builder /out/reclaim-svc /usr/local/bin/reclaim-svc
COPY --from=builder /out/provisioner-ctl /usr/local/bin/provisioner-ctl
USER 65532:65532
# HTTP (/metrics, /healthz, /readyz) of provision-svc, pv-writer, reclaim-svc.
EXPOSE 9101 9102 9103
ENTRYPOINT []
CMD ["provision-svc", "--help"]
