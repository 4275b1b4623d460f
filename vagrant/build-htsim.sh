#!/usr/bin/env bash
# build-htsim.sh - pinned source build of UEC's htsim (htsim_uec), the reference NSCC that
# `mrclab bench nscc` runs beside mrclab's own (Debian 12 / Ubuntu 22.04+).
#
# Builds ultraethernet/uet-htsim at commit 40ccb0526bb6 (2025-08-13, "Clean up documentation"):
# only the htsim library and the htsim_uec binary (htsim/sim/datacenter/main_uec.cpp: UET's
# sender, receiver, NSCC, trimming switches), with CMake and g++ as its README says, and installs
# the binary as PREFIX/bin/htsim_uec. mrclab finds it there, on PATH, or where MRCLAB_HTSIM names.
#
# The source is fetched by `git init` + `git fetch --depth 1` of the pinned commit only, from
# --git-base (so snapshot mirrors without old history work); nothing is downloaded at build time
# (htsim's tests, which fetch GoogleTest, stay off).
#
# It never puts htsim's code into the repository: sources and build tree go to the workdir,
# outside it by default, and the binary to the prefix. Run as root (apt-get, install).
#
# Options:
#   --git-base TEMPLATE  clone URL template; {owner} becomes ultraethernet and {name} uet-htsim.
#                        Default: https://github.com/{owner}/{name}
#   --prefix DIR         install prefix (default /usr/local)
#   --workdir DIR        source and build tree, and the build log (default /var/cache/mrclab-htsim)
#   --jobs N             parallel build jobs (default: nproc)
#   --skip-deps          do not apt-get install cmake and g++
#   -h, --help           this help
#
# Example (a local bare mirror instead of GitHub):
#   bash vagrant/build-htsim.sh --git-base '/srv/mirror/{owner}+{name}/repo' --jobs 2
set -euo pipefail

readonly HTSIM_COMMIT=40ccb0526bb6297eeb22ab33f9934fb35278dbaf
readonly DEPS=(git ca-certificates g++ make cmake)

GIT_BASE='https://github.com/{owner}/{name}'
PREFIX=/usr/local
WORKDIR=/var/cache/mrclab-htsim
JOBS=$(nproc)
SKIP_DEPS=0

usage() { sed -n '2,/^set -euo pipefail$/{/^#/s/^# \{0,1\}//p}' "$0"; }
die() {
  echo "build-htsim: $*" >&2
  exit 1
}

while (($#)); do
  case $1 in
    --git-base) GIT_BASE=${2:?--git-base needs a TEMPLATE}; shift 2 ;;
    --prefix) PREFIX=${2:?--prefix needs a DIR}; shift 2 ;;
    --workdir) WORKDIR=${2:?--workdir needs a DIR}; shift 2 ;;
    --jobs) JOBS=${2:?--jobs needs N}; shift 2 ;;
    --skip-deps) SKIP_DEPS=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option: $1 (allowed: --git-base, --prefix, --workdir, --jobs, --skip-deps, --help)" ;;
  esac
done
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "--jobs: '$JOBS' is not a positive whole number"
[[ $(id -u) -eq 0 ]] || die "run as root (apt-get, install into $PREFIX)"

url=${GIT_BASE//\{owner\}/ultraethernet}
url=${url//\{name\}/uet-htsim}
src=$WORKDIR/src/uet-htsim
log=$WORKDIR/build.log
mkdir -p "$WORKDIR/src"
: >"$log"

if ((!SKIP_DEPS)); then
  echo "== apt packages: ${DEPS[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >>"$log" 2>&1
  apt-get install -y -qq --no-install-recommends "${DEPS[@]}" >>"$log" 2>&1 ||
    die "apt-get install failed (see $log)"
fi

echo "== source: $url at ${HTSIM_COMMIT:0:12}"
if [[ $(git -C "$src" rev-parse HEAD 2>/dev/null) != "$HTSIM_COMMIT" ]]; then
  rm -rf "$src"
  git init -q "$src"
  git -C "$src" fetch -q --depth 1 "$url" "$HTSIM_COMMIT" >>"$log" 2>&1 ||
    die "cannot fetch $HTSIM_COMMIT from $url (see $log)"
  git -C "$src" checkout -q FETCH_HEAD
fi

echo "== build: htsim_uec (cmake, $JOBS jobs; log: $log)"
cmake -S "$src/htsim/sim" -B "$WORKDIR/build" -DCMAKE_BUILD_TYPE=Release >>"$log" 2>&1 ||
  die "cmake configure failed (see $log)"
cmake --build "$WORKDIR/build" --target htsim_uec --parallel "$JOBS" >>"$log" 2>&1 ||
  die "build failed (see $log)"

bin=$(find "$WORKDIR/build" -type f -name htsim_uec -perm -u+x | head -n 1)
[[ -n $bin ]] || die "the build made no htsim_uec (see $log)"
install -D -m 0755 "$bin" "$PREFIX/bin/htsim_uec"
echo "== installed $PREFIX/bin/htsim_uec (uet-htsim ${HTSIM_COMMIT:0:12})"
