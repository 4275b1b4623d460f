#!/usr/bin/env bash
# Provisioning of the mrclab lab VM (Ubuntu 24.04): the P4 toolchain from p4lang's packages on
# the openSUSE Build Service, then mrclab's own setup.sh (Mininet, venv, mrclab).
#
# p4lang's packages break now and then (a release missing for a new Ubuntu, a key rotated).
# When this step fails, the toolchain is built from its sources at pinned releases by
# vagrant/build-toolchain.sh (about an hour on two cores; MRCLAB_NO_BUILD=1 skips it, and the
# VM comes up with the linux data plane only).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# shellcheck source=/dev/null
. /etc/os-release
repo="https://download.opensuse.org/repositories/home:/p4lang/xUbuntu_${VERSION_ID}"

apt-get update -qq
apt-get install -y -qq curl gnupg ca-certificates >/dev/null

if ! command -v simple_switch_grpc >/dev/null || ! command -v p4c >/dev/null; then
  if curl -fsSL "${repo}/Release.key" | gpg --dearmor --yes -o /etc/apt/trusted.gpg.d/home_p4lang.gpg \
     && echo "deb ${repo}/ /" > /etc/apt/sources.list.d/home:p4lang.list \
     && apt-get update -qq \
     && apt-get install -y -qq p4lang-p4c p4lang-bmv2 p4lang-pi >/dev/null; then
    echo "P4 toolchain installed from p4lang's packages"
  else
    echo "WARNING: p4lang's packages could not be installed." >&2
    rm -f /etc/apt/sources.list.d/home:p4lang.list
    apt-get update -qq
    if [ "${MRCLAB_NO_BUILD:-0}" = 1 ]; then
      echo "         MRCLAB_NO_BUILD=1: mrclab will use the linux data plane." >&2
    elif ! bash /vagrant/vagrant/build-toolchain.sh; then
      echo "WARNING: building the toolchain failed (log above); mrclab will use the linux data plane." >&2
    fi
  fi
fi

cd /vagrant
bash ./setup.sh
echo "mrclab is ready: vagrant ssh, then: sudo -i; cd /vagrant && .venv/bin/mrclab run"
