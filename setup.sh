#!/usr/bin/env bash
# Installs what mrclab needs on Debian 12 / Ubuntu 22.04+ (run as root, from the repository):
# Mininet and iproute2 from the distribution, a virtualenv in .venv that sees Mininet's Python
# module (--system-site-packages), and mrclab itself with its test extras. Idempotent.
# The P4 toolchain (p4c, simple_switch_grpc) is not installed here: mrclab uses it when it is on
# PATH (see README, "The bmv2 data plane") and runs on the kernel's SRv6 otherwise.
set -euo pipefail
cd "$(dirname "$0")"

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (it installs packages and mrclab builds network namespaces)" >&2
  exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "== apt packages: mininet iproute2 ethtool tcpdump python3-venv python3-thrift, clang and libbpf-dev"
echo "   (the linux data plane's tc eBPF queue program), tshark (captures), openssh and sudo (servers:"
echo "   Mininet's cluster edition runs ssh and mnexec through sudo), ruby and shellcheck (for the tests)"
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  mininet iproute2 ethtool tcpdump procps python3 python3-venv python3-pip python3-thrift \
  clang libbpf-dev tshark openssh-client openssh-server sudo ruby shellcheck >/dev/null

PY=/usr/bin/python3
if [ ! -x .venv/bin/python ]; then
  echo "== virtualenv .venv (system site packages, for Mininet)"
  "$PY" -m venv --system-site-packages .venv
fi
echo "== pip install -e .[test]"
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'

if command -v p4c >/dev/null && command -v simple_switch_grpc >/dev/null; then
  echo "== P4 toolchain found: the bmv2 data plane is available"
else
  echo "== P4 toolchain not found: mrclab will use the linux data plane (kernel SRv6)"
fi
echo "== done: .venv/bin/mrclab --help"
