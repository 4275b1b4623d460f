#!/usr/bin/env bash
# Provisioning of the mrclab lab VM (Debian 12, as CI): the P4 toolchain built from its sources at
# pinned releases by vagrant/build-toolchain.sh (the path CI's Debian 12 and the toolchain script
# are proven on; it resumes where it stopped if provisioning runs again), then mrclab's own setup.sh
# (Mininet, clang and libbpf, the virtualenv). MRCLAB_NO_BUILD=1 skips the build: the VM then runs
# the linux data plane only.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if ! command -v simple_switch_grpc >/dev/null || ! command -v p4c >/dev/null; then
  if [ "${MRCLAB_NO_BUILD:-0}" = 1 ]; then
    echo "MRCLAB_NO_BUILD=1: no P4 toolchain; mrclab will use the linux data plane." >&2
  elif ! bash /vagrant/vagrant/build-toolchain.sh; then
    echo "WARNING: building the toolchain failed (log above); mrclab will use the linux data plane." >&2
  fi
fi

cd /vagrant
bash ./setup.sh
echo "mrclab is ready: vagrant ssh, then: sudo -i; cd /vagrant && .venv/bin/mrclab run"
