#!/bin/sh
# Builds a local stand-in for the public debian:bookworm-slim image from Debian's packages, for
# machines that reach Debian's package mirror but no image registry (this project's CI):
#   deploy/debian-base.sh [TAG]      (default TAG: shiftlog-base:bookworm; root, debootstrap, docker)
# It does nothing when an image with that tag exists already (delete it to rebuild). The rootfs is
# made with `debootstrap --variant=minbase`, gets the host's CA bundle (a machine whose HTTPS goes
# through an inspecting proxy needs it for pip inside the build; kept when the Dockerfile installs
# ca-certificates, from /usr/local/share/ca-certificates) and apt's security suite, and is imported
# with `docker import`. Then:
#   docker build --build-arg BASE_IMAGE=shiftlog-base:bookworm -t shiftlog .
set -eu
TAG="${1:-shiftlog-base:bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
if docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG exists; not rebuilt"
  exit 0
fi
command -v debootstrap >/dev/null 2>&1 || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 3; }
ROOTFS="$(mktemp -d /var/tmp/shiftlog-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "debootstrap --variant=minbase bookworm from $MIRROR (a minute or two)..."
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
  tail -20 "$ROOTFS.log" >&2; rm -f "$ROOTFS.log"; exit 1; }
rm -f "$ROOTFS.log"
cat >"$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb ${MIRROR%/debian}/debian-security bookworm-security main
SOURCES
# As the official image: no package caches, no docs for what is installed later.
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$ROOTFS/usr/local/share/ca-certificates"
  cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/usr/local/share/ca-certificates/host-bundle.crt"
  mkdir -p "$ROOTFS/etc/ssl/certs"
  cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
fi
tar -C "$ROOTFS" -c . | docker import --change 'CMD ["bash"]' - "$TAG" >/dev/null
echo "imported $TAG"
