#!/usr/bin/env bash
# build-toolchain.sh - pinned, resumable source build of the P4 toolchain for mrclab (Debian 12).
#
# Builds and installs into a prefix (default /usr/local):
#   PI                p4lang/PI               v0.1.2     (--with-proto: P4Runtime gRPC server)
#   behavioral-model  p4lang/behavioral-model 1.15.5     (--with-pi --with-thrift: simple_switch,
#                                                         simple_switch_grpc, simple_switch_CLI),
#                                                         twice: a forwarding and a logging build
#   p4c               p4lang/p4c              v1.2.4.8   (bmv2 backend + p4test, `p4c` driver)
# with the P4Runtime protos from p4lang/p4runtime at the exact commits PI and p4c pin
# (PI v0.1.2 submodule: ec4eb5ef, p4c v1.2.4.8 FetchContent: 1e771c4e; both are between the
# v1.4.0 release candidates and v1.4.1, and fall back to tag v1.4.1 when a mirror lacks them)
# and gnmi.proto from openconfig/gnmi at the commit PI pins (9c8d9e96).
#
# Every source is fetched by `git init` + `git fetch --depth 1` of the pinned tag or commit only,
# from --git-base (so snapshot mirrors without old history work); no `git submodule update` and
# no download at build time: PI's submodules are filled from the p4runtime/gnmi clones above and
# from Debian's uthash-dev and googletest packages, and p4c's CMake FetchContent is pointed at
# the local p4runtime clone (FETCHCONTENT_FULLY_DISCONNECTED) with Debian's protobuf; p4c's
# backends that fetch more (ebpf, ubpf, p4tc, dpdk, graphs, p4tools, gtests) are switched off.
#
# BMv2 is built twice from the pinned source, each build in its own fresh copy of the tree:
#   forwarding  PREFIX/bin/simple_switch_grpc, simple_switch, simple_switch_CLI: the ones on PATH,
#               the ones mrclab runs. Configured as p4lang's docs/performance.md says for the
#               highest throughput: 'CXXFLAGS=-g -O3' 'CFLAGS=-g -O3' --disable-logging-macros
#               --disable-elogger. With the logging macros compiled in, every packet pays for its
#               debug and trace lines whatever --log-level says: their arguments are formatted
#               before the level is looked at, so every table lookup formats its key (and a hit its
#               entry) for a log nobody reads. The nanomsg event logger (--nanolog) goes with them.
#   logging     PREFIX/lib/mrclab/bmv2-logging/bin/simple_switch_grpc (and simple_switch,
#               simple_switch_CLI there): p4lang's default flags (-g -O2, logging macros and
#               event logger on), for debugging a P4 program (--log-console, --log-level trace,
#               --nanolog). Run it by its full path. It is a prefix of its own: its libraries
#               (libbmpi, libsimpleswitch_*, libruntimestubs, ...) have the same names as the
#               forwarding build's in PREFIX/lib, so they are not in ld.so.conf and are found by
#               the rpath (DT_RPATH, which also covers libraries loaded by libraries) of its
#               binaries and libraries. Both builds share PI from PREFIX/lib.
# Both are configured with --disable-static (libtool compiles each file once, not twice) and make
# and install only what mrclab runs: simple_switch, simple_switch_grpc, simple_switch_CLI and
# runtime_CLI (Thrift, Python) with the libraries they need, and the headers; not psa_switch,
# pna_nic, simple_router, l2_switch, bm_apps nor any test.
#
# Options:
#   --git-base TEMPLATE  clone URL template; {name} becomes the repository name (PI,
#                        behavioral-model, p4c, p4runtime, gnmi) and {owner} its GitHub owner
#                        (p4lang, or openconfig for gnmi).
#                        Default: https://github.com/p4lang/{name}
#   --gnmi-url URL       where to clone openconfig/gnmi from. Default: --git-base if it has
#                        {owner}, else https://github.com/openconfig/gnmi
#   --prefix DIR         install prefix (default /usr/local); the logging BMv2 goes to
#                        PREFIX/lib/mrclab/bmv2-logging
#   --workdir DIR        sources, build trees, logs and stamps (default /var/cache/mrclab-toolchain)
#   --jobs N             parallel make jobs (default: nproc)
#   --skip-deps          do not apt-get install the build dependencies
#   --only STEP...       run only these steps (or groups: pi, bmv2, bmv2-fwd, bmv2-log, p4c),
#                        even if already done
#   -h, --help           this help
#
# Steps: deps sources pi-configure pi-build bmv2-fwd-configure bmv2-fwd-build bmv2-log-configure
# bmv2-log-build p4c-configure p4c-build verify. Each step logs to WORKDIR/logs/<step>.log and
# leaves WORKDIR/stamps/<step>.done when it succeeds; a rerun skips finished steps (rerunning a
# step invalidates the steps after it), so after a failure fix the cause and run the same command
# again. The two BMv2 builds are made in WORKDIR/src/bmv2-forwarding and WORKDIR/src/bmv2-logging.
#
# It never puts toolchain code into the repository: everything goes to the workdir, which is
# outside it by default, and to the prefix. Run as root (apt-get, make install, ldconfig).
#
# Example (local bare mirrors instead of GitHub):
#   bash vagrant/build-toolchain.sh --git-base '/srv/mirror/{owner}+{name}/repo' --jobs 2
set -euo pipefail

readonly PI_REF=v0.1.2
readonly BMV2_REF=1.15.5
readonly P4C_REF=v1.2.4.8
readonly P4RUNTIME_TAG=v1.4.1
readonly P4RUNTIME_PI_COMMIT=ec4eb5ef70dbcbcbf2f8357a4b2b8c2f218845a5
readonly P4RUNTIME_P4C_COMMIT=1e771c4e05c4e7e250df00212b3ca02ee3202d71
readonly GNMI_COMMIT=9c8d9e965b3e854107ea02c12ab11b70717456f2

readonly DEPS_COMMON=(git ca-certificates build-essential g++ make pkg-config autoconf automake
  libtool cmake python3)
readonly DEPS_PI=(libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libgrpc++-dev
  libgrpc-dev libabsl-dev libjudy-dev libboost-dev libboost-thread-dev uthash-dev googletest)
readonly DEPS_BMV2=(thrift-compiler libthrift-dev python3-thrift libjudy-dev libgmp-dev
  libpcap-dev libboost-dev libboost-program-options-dev libboost-system-dev
  libboost-filesystem-dev libboost-thread-dev libnanomsg-dev libssl-dev libxxhash-dev
  libjsoncpp-dev)
readonly DEPS_P4C=(bison flex libfl-dev libgc-dev libboost-iostreams-dev)

# Files left out of every checkout (not needed to build).
readonly SPARSE_EXCLUDE=('*.pptx' '*.pdf')

# BMv2: configure arguments of both builds, then of each; the subdirectories made (in this order)
# and installed: only simple_switch, simple_switch_grpc, the CLIs and what they need.
readonly BMV2_CONFIGURE=(--with-pi --with-thrift --disable-static)
readonly BMV2_FWD_CONFIGURE=('CXXFLAGS=-g -O3' 'CFLAGS=-g -O3' --disable-logging-macros
  --disable-elogger)
readonly BMV2_MAKE_DIRS=(thrift_src proto src/BMI src/bm_sim src/bm_runtime PI services
  targets/simple_switch targets/simple_switch_grpc tools)
readonly BMV2_INSTALL_DIRS=(thrift_src include third_party/spdlog PI services
  targets/simple_switch targets/simple_switch_grpc tools)

readonly STEPS=(deps sources pi-configure pi-build bmv2-fwd-configure bmv2-fwd-build
  bmv2-log-configure bmv2-log-build p4c-configure p4c-build verify)

GIT_BASE='https://github.com/p4lang/{name}'
GNMI_URL=''
PREFIX=/usr/local
WORKDIR=/var/cache/mrclab-toolchain
JOBS=$(nproc)
SKIP_DEPS=0
ONLY=()
SYS_PYTHON=/usr/bin/python3

usage() { sed -n '2,/^set -euo pipefail$/{/^#/s/^# \{0,1\}//p}' "$0"; }
die() {
  echo "build-toolchain: $*" >&2
  exit 1
}

while (($#)); do
  case $1 in
    --git-base) GIT_BASE=${2:?--git-base needs a TEMPLATE}; shift 2 ;;
    --gnmi-url) GNMI_URL=${2:?--gnmi-url needs a URL}; shift 2 ;;
    --prefix) PREFIX=${2:?--prefix needs a DIR}; shift 2 ;;
    --workdir) WORKDIR=${2:?--workdir needs a DIR}; shift 2 ;;
    --jobs) JOBS=${2:?--jobs needs N}; shift 2 ;;
    --skip-deps) SKIP_DEPS=1; shift ;;
    --only)
      shift
      while (($#)) && [[ $1 != --* && $1 != -h ]]; do
        IFS=, read -ra parts <<<"$1"
        ONLY+=("${parts[@]}")
        shift
      done
      ((${#ONLY[@]})) || die "--only needs at least one step"
      ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option: $1 (see --help)" ;;
  esac
done

[[ $JOBS =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a positive number"
[[ $GIT_BASE == *'{name}'* ]] || die "--git-base must contain {name}"
[[ $(id -u) -eq 0 ]] || die "run as root (apt-get, make install, ldconfig)"
[[ -x $SYS_PYTHON ]] || SYS_PYTHON=$(command -v python3 || echo /usr/bin/python3)
PREFIX=$(realpath -m "$PREFIX")
WORKDIR=$(realpath -m "$WORKDIR")
SRC=$WORKDIR/src
LOGS=$WORKDIR/logs
STAMPS=$WORKDIR/stamps
BMV2_LOG_PREFIX=$PREFIX/lib/mrclab/bmv2-logging
BMV2_FWD_TREE=$SRC/bmv2-forwarding
BMV2_LOG_TREE=$SRC/bmv2-logging
mkdir -p "$SRC" "$LOGS" "$STAMPS"

# Expand the URL template for one repository.
repo_url() { # owner name
  local url=${GIT_BASE//\{owner\}/$1}
  echo "${url//\{name\}/$2}"
}
if [[ -z $GNMI_URL ]]; then
  if [[ $GIT_BASE == *'{owner}'* ]]; then
    GNMI_URL=$(repo_url openconfig gnmi)
  else
    GNMI_URL=https://github.com/openconfig/gnmi
  fi
fi

# The build environment: the prefix first, Debian's python (not a pyenv/venv one) for autotools.
export DEBIAN_FRONTEND=noninteractive
export PATH="$PREFIX/bin:$PATH"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig:$PREFIX/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PYTHON=$SYS_PYTHON
export CPPFLAGS="-I$PREFIX/include${CPPFLAGS:+ $CPPFLAGS}"
export LDFLAGS="-L$PREFIX/lib${LDFLAGS:+ $LDFLAGS}"

# ---------------------------------------------------------------------------------------------
# Helpers

# Fetch exactly one ref (tag or commit) into DEST and check it out detached. Skips the fetch when
# DEST is already at that commit.
git_checkout() { # url ref dest
  local url=$1 ref=$2 dest=$3 spec head='' pinned='' pin=''
  if [[ -d $dest/.git ]]; then
    head=$(git -C "$dest" rev-parse -q --verify 'HEAD^{commit}' 2>/dev/null || true)
    pinned=$(git -C "$dest" rev-parse -q --verify 'pinned^{commit}' 2>/dev/null || true)
    pin=$(git -C "$dest" config --get mrclab.pin 2>/dev/null || true)
  fi
  if [[ -n $head && $head == "$pinned" && $pin == "$url $ref" ]]; then
    echo "$dest: already at $ref ($(git -C "$dest" rev-parse --short HEAD))"
    return 0
  fi
  # Explicit `|| return 1`: callers may test this function, which switches errexit off in it.
  rm -rf "$dest"
  git init -q "$dest" || return 1
  git -C "$dest" remote add origin "$url" || return 1
  if [[ $url != *://* ]]; then
    # A local mirror serves partial fetches and fetches by commit id only when told to.
    git -C "$dest" config remote.origin.uploadpack \
      'git -c uploadpack.allowFilter=true -c uploadpack.allowAnySHA1InWant=true upload-pack' ||
      return 1
  fi
  if [[ $ref =~ ^[0-9a-f]{40}$ ]]; then spec=$ref; else spec="refs/tags/$ref"; fi
  echo "fetching $ref from $url"
  # Only the pinned commit, blobs on demand, and no large binary documents: snapshot mirrors may
  # lack old history and their largest files (p4c's docs/compiler-design.pptx).
  git -C "$dest" fetch -q --depth 1 --filter=blob:none origin "$spec" || return 1
  git -C "$dest" tag pinned FETCH_HEAD || return 1
  git -C "$dest" sparse-checkout set --no-cone '/*' "${SPARSE_EXCLUDE[@]/#/!}" || return 1
  git -C "$dest" -c advice.detachedHead=false checkout -q --detach pinned || return 1
  git -C "$dest" config mrclab.pin "$url $ref" || return 1
  echo "$dest: $ref = $(git -C "$dest" rev-parse HEAD)"
}

# P4Runtime at the commit a consumer pins, or the release tag when the mirror lacks that commit.
p4runtime_checkout() { # commit dest
  if ! git_checkout "$(repo_url p4lang p4runtime)" "$1" "$2"; then
    echo "p4runtime commit $1 not available; using tag $P4RUNTIME_TAG"
    git_checkout "$(repo_url p4lang p4runtime)" "$P4RUNTIME_TAG" "$2"
  fi
}

# Replace a directory (e.g. an empty submodule placeholder) by a symlink.
place_link() { # target linkpath
  rm -rf "$2"
  mkdir -p "$(dirname "$2")"
  ln -sfn "$1" "$2"
  echo "$2 -> $1"
}

install_ldconfig() {
  if [[ $PREFIX != /usr/local && $PREFIX != /usr ]]; then
    echo "$PREFIX/lib" >/etc/ld.so.conf.d/mrclab-toolchain.conf
  fi
  ldconfig
}

# A fresh copy of the pinned BMv2 checkout in DIR (p4lang: "do a fresh clone"), configured in
# place for PREFIX with the common and the given arguments. The checkout itself is never built in,
# so the two builds share no generated file (a VPATH build would: simple_switch_grpc's Makefile
# finds bm/config.h in the source tree only).
bmv2_configure() { # dir prefix configure-arg...
  local dir=$1 prefix=$2
  shift 2
  # Leftovers of an in-tree build by an earlier version of this script must not be copied.
  git -C "$SRC/behavioral-model" clean -fdxq
  rm -rf "$dir"
  cp -a "$SRC/behavioral-model" "$dir"
  cd "$dir"
  ./autogen.sh
  ./configure --prefix="$prefix" "${BMV2_CONFIGURE[@]}" "$@"
  grep -q '^#define THRIFT_ON' config.h || die "behavioral-model configured without Thrift"
  grep -q '^build_old_libs=no' libtool || die "behavioral-model configured with static libraries"
}

# Make and install only the parts of BMv2 in BMV2_MAKE_DIRS / BMV2_INSTALL_DIRS.
bmv2_build() { # dir
  local d
  for d in "${BMV2_MAKE_DIRS[@]}"; do
    make -C "$1/$d" -j"$JOBS"
  done
  for d in "${BMV2_INSTALL_DIRS[@]}"; do
    make -C "$1/$d" install
  done
}

# Every library BIN needs is found, and each one whose name is in LIBDIR is loaded from LIBDIR.
check_ldd() { # bin libdir
  local bin=$1 libdir=$2 out name arrow path own=0
  out=$(env -u LD_LIBRARY_PATH ldd "$bin") || die "ldd $bin failed"
  [[ $out != *'not found'* ]] || die "$bin: libraries not found:"$'\n'"$out"
  while read -r name arrow path _; do
    [[ $arrow == '=>' && -e $libdir/$name ]] || continue
    [[ $path -ef $libdir/$name ]] || die "$bin loads $name from $path, not from $libdir"
    echo "  $name => $path"
    own=$((own + 1))
  done <<<"$out"
  ((own > 0)) || die "$bin loads no library from $libdir"
}

fmt_secs() {
  local s=$1
  if ((s >= 3600)); then
    printf '%dh%02dm%02ds' $((s / 3600)) $((s % 3600 / 60)) $((s % 60))
  elif ((s >= 60)); then
    printf '%dm%02ds' $((s / 60)) $((s % 60))
  else
    printf '%ds' "$s"
  fi
}

# ---------------------------------------------------------------------------------------------
# Steps

step_deps() {
  apt-get update
  apt-get install -y --no-install-recommends \
    "${DEPS_COMMON[@]}" "${DEPS_PI[@]}" "${DEPS_BMV2[@]}" "${DEPS_P4C[@]}"
}

step_sources() {
  git_checkout "$(repo_url p4lang PI)" "$PI_REF" "$SRC/PI"
  git_checkout "$(repo_url p4lang behavioral-model)" "$BMV2_REF" "$SRC/behavioral-model"
  git_checkout "$(repo_url p4lang p4c)" "$P4C_REF" "$SRC/p4c"
  p4runtime_checkout "$P4RUNTIME_PI_COMMIT" "$SRC/p4runtime-for-PI"
  p4runtime_checkout "$P4RUNTIME_P4C_COMMIT" "$SRC/p4runtime-for-p4c"
  git_checkout "$GNMI_URL" "$GNMI_COMMIT" "$SRC/gnmi"

  # PI's submodules, without `git submodule update`.
  place_link "$SRC/p4runtime-for-PI" "$SRC/PI/proto/p4runtime"
  place_link "$SRC/gnmi" "$SRC/PI/proto/openconfig/gnmi"
  # googletest: configure insists on its sources with --with-proto (only `make check` builds it).
  place_link /usr/src/googletest "$SRC/PI/third_party/googletest"
  # uthash: header-only, from Debian's uthash-dev.
  rm -rf "$SRC/PI/third_party/uthash"
  mkdir -p "$SRC/PI/third_party/uthash/src"
  local h
  for h in utarray uthash utlist utringbuffer utstack utstring; do
    [[ -f /usr/include/$h.h ]] || die "/usr/include/$h.h missing: install uthash-dev"
    ln -sfn "/usr/include/$h.h" "$SRC/PI/third_party/uthash/src/$h.h"
  done
  [[ -f $SRC/PI/third_party/googletest/googletest/src/gtest.cc ]] ||
    die "/usr/src/googletest missing: install googletest"
  [[ -f $SRC/PI/proto/p4/v1/p4runtime.proto && -f $SRC/PI/proto/gnmi/gnmi.proto ]] ||
    die "PI's proto tree is incomplete"
}

step_pi_configure() {
  cd "$SRC/PI"
  ./autogen.sh
  ./configure --prefix="$PREFIX" --with-proto --without-internal-rpc --without-cli \
    --without-bmv2
}

step_pi_build() {
  cd "$SRC/PI"
  make -j"$JOBS"
  make install
  install_ldconfig
}

step_bmv2_fwd_configure() {
  bmv2_configure "$BMV2_FWD_TREE" "$PREFIX" "${BMV2_FWD_CONFIGURE[@]}"
  ! grep -Eq '^#define (LOG_DEBUG_ON|LOG_TRACE_ON|ELOG_ON)' config.h ||
    die "the forwarding build was configured with logging macros or the event logger"
}

step_bmv2_fwd_build() {
  bmv2_build "$BMV2_FWD_TREE"
  install_ldconfig
  [[ -x $PREFIX/bin/simple_switch_grpc ]] || die "simple_switch_grpc was not installed"
}

step_bmv2_log_configure() {
  # Its own lib first, for the links and libtool's relinks at install; DT_RPATH to it in every
  # binary and library, so they never load the forwarding build's libraries in PREFIX/lib.
  bmv2_configure "$BMV2_LOG_TREE" "$BMV2_LOG_PREFIX" \
    "LDFLAGS=-L$BMV2_LOG_PREFIX/lib -Wl,-rpath,$BMV2_LOG_PREFIX/lib -Wl,--disable-new-dtags $LDFLAGS"
  if ! grep -q '^#define LOG_DEBUG_ON' config.h || ! grep -q '^#define ELOG_ON' config.h; then
    die "the logging build was configured without logging macros or the event logger"
  fi
}

step_bmv2_log_build() {
  # The prefix is this build's alone: nothing stale from an earlier install stays in it.
  rm -rf "$BMV2_LOG_PREFIX"
  bmv2_build "$BMV2_LOG_TREE"
  [[ -x $BMV2_LOG_PREFIX/bin/simple_switch_grpc ]] ||
    die "the logging simple_switch_grpc was not installed"
}

step_p4c_configure() {
  rm -rf "$SRC/p4c/build"
  cmake -S "$SRC/p4c" -B "$SRC/p4c/build" \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    -DPYTHON_EXECUTABLE="$SYS_PYTHON" \
    -DENABLE_BMV2=ON -DENABLE_P4TEST=ON \
    -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_DPDK=OFF -DENABLE_P4TC=OFF \
    -DENABLE_P4C_GRAPHS=OFF -DENABLE_TEST_TOOLS=OFF -DENABLE_GTESTS=OFF -DENABLE_DOCS=OFF \
    -DP4C_USE_PREINSTALLED_PROTOBUF=ON -DENABLE_PROTOBUF_STATIC=OFF \
    -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
    -DFETCHCONTENT_SOURCE_DIR_P4RUNTIME="$SRC/p4runtime-for-p4c"
}

step_p4c_build() {
  cmake --build "$SRC/p4c/build" -j "$JOBS"
  cmake --install "$SRC/p4c/build"
  install_ldconfig
}

# One BMv2 build: its switches run and have Thrift, its CLI runs, its libraries are its own, and
# its installed bm/config.h says whether the logging macros are in (yes|no).
verify_bmv2() { # name bindir libdir includedir logging
  local name=$1 bindir=$2 libdir=$3 includedir=$4 logging=$5 sw help has
  echo "BMv2 $name build:"
  for sw in simple_switch simple_switch_grpc; do
    [[ -x $bindir/$sw ]] || die "$bindir/$sw missing"
    # Not `| grep -q`: with pipefail, grep leaving early would fail the pipeline by SIGPIPE.
    help=$("$bindir/$sw" --help 2>&1) || die "$bindir/$sw --help failed:"$'\n'"$help"
    [[ $help == *--thrift-port* ]] || die "$bindir/$sw lacks --thrift-port"
    echo "$bindir/$sw: --help lists --thrift-port"
    check_ldd "$bindir/$sw" "$libdir"
  done
  "$SYS_PYTHON" "$bindir/simple_switch_CLI" --help >/dev/null ||
    die "$bindir/simple_switch_CLI does not run with $SYS_PYTHON"
  echo "$bindir/simple_switch_CLI: runs"
  has=no
  grep -q '^#define BM_LOG_DEBUG_ON' "$includedir/bm/config.h" && has=yes
  [[ $has == "$logging" ]] || die "$includedir/bm/config.h: logging macros $has, expected $logging"
  echo "$includedir/bm/config.h: logging macros $has"
}

step_verify() {
  hash -r
  local p4c sswitch_grpc ss_cli
  p4c=$(command -v p4c) || die "p4c not on PATH"
  sswitch_grpc=$(command -v simple_switch_grpc) || die "simple_switch_grpc not on PATH"
  ss_cli=$(command -v simple_switch_CLI) || die "simple_switch_CLI not on PATH"
  echo "p4c: $p4c"
  "$p4c" --version
  echo "simple_switch_grpc on PATH: $sswitch_grpc, simple_switch_CLI on PATH: $ss_cli"
  [[ $sswitch_grpc -ef $PREFIX/bin/simple_switch_grpc ]] ||
    die "simple_switch_grpc on PATH is not the forwarding build's $PREFIX/bin/simple_switch_grpc"
  verify_bmv2 forwarding "$PREFIX/bin" "$PREFIX/lib" "$PREFIX/include" no
  verify_bmv2 logging "$BMV2_LOG_PREFIX/bin" "$BMV2_LOG_PREFIX/lib" "$BMV2_LOG_PREFIX/include" yes
  # A compile of a small v1model program with P4Runtime output, as mrclab does it.
  local t
  t=$(mktemp -d)
  cat >"$t/t.p4" <<'EOF'
#include <core.p4>
#include <v1model.p4>
struct metadata_t {}
struct headers_t {}
parser P(packet_in p, out headers_t h, inout metadata_t m, inout standard_metadata_t s) {
    state start { transition accept; }
}
control NoCk(inout headers_t h, inout metadata_t m) { apply {} }
control I(inout headers_t h, inout metadata_t m, inout standard_metadata_t s) {
    action fwd(bit<9> port) { s.egress_spec = port; }
    table t { actions = { fwd; NoAction; } default_action = NoAction(); }
    apply { t.apply(); }
}
control E(inout headers_t h, inout metadata_t m, inout standard_metadata_t s) { apply {} }
control D(packet_out p, in headers_t h) { apply {} }
V1Switch(P(), NoCk(), I(), E(), NoCk(), D()) main;
EOF
  "$p4c" --target bmv2 --arch v1model --p4runtime-files "$t/t.p4info.txt" -o "$t/out" "$t/t.p4"
  [[ -s $t/out/t.json && -s $t/t.p4info.txt ]] || die "p4c produced no bmv2 JSON / P4Info"
  rm -rf "$t"
  echo "verify: ok"
}

# ---------------------------------------------------------------------------------------------
# Runner

step_label() {
  case $1 in
    deps) echo "deps: apt-get install" ;;
    sources) echo "sources: fetch pinned commits" ;;
    pi-configure) echo "PI $PI_REF: autogen + configure" ;;
    pi-build) echo "PI $PI_REF: make + install" ;;
    bmv2-fwd-configure) echo "BMv2 $BMV2_REF forwarding: autogen + configure" ;;
    bmv2-fwd-build) echo "BMv2 $BMV2_REF forwarding: make + install" ;;
    bmv2-log-configure) echo "BMv2 $BMV2_REF logging: autogen + configure" ;;
    bmv2-log-build) echo "BMv2 $BMV2_REF logging: make + install" ;;
    p4c-configure) echo "p4c $P4C_REF: cmake" ;;
    p4c-build) echo "p4c $P4C_REF: make + install" ;;
    verify) echo "verify" ;;
  esac
}

step_key() { # step
  case $1 in
    deps) echo "${DEPS_COMMON[*]} ${DEPS_PI[*]} ${DEPS_BMV2[*]} ${DEPS_P4C[*]}" ;;
    sources) echo "$PI_REF $BMV2_REF $P4C_REF $P4RUNTIME_PI_COMMIT $P4RUNTIME_P4C_COMMIT $GNMI_COMMIT" ;;
    bmv2-fwd-*) echo "$PREFIX ${BMV2_CONFIGURE[*]} ${BMV2_FWD_CONFIGURE[*]} ${BMV2_MAKE_DIRS[*]}" ;;
    bmv2-log-*) echo "$BMV2_LOG_PREFIX ${BMV2_CONFIGURE[*]} ${BMV2_MAKE_DIRS[*]}" ;;
    *-configure | *-build) echo "$PREFIX" ;;
    *) echo "" ;;
  esac
}

selected() { # step
  local s
  if ((${#ONLY[@]} == 0)); then
    [[ $1 == deps && $SKIP_DEPS == 1 ]] && return 1
    return 0
  fi
  # A group is a step name's prefix up to a dash: pi, bmv2, bmv2-fwd, bmv2-log, p4c.
  for s in "${ONLY[@]}"; do
    [[ $1 == "$s" || $1 == "$s"-* ]] && return 0
  done
  return 1
}

if ((${#ONLY[@]})); then
  for o in "${ONLY[@]}"; do
    ok=0
    for s in "${STEPS[@]}"; do [[ $s == "$o" || $s == "$o"-* ]] && ok=1; done
    ((ok)) || die "unknown step: $o (steps: ${STEPS[*]}; groups: pi bmv2 bmv2-fwd bmv2-log p4c)"
  done
fi

# Killed or interrupted (the step's own processes get the signal too): say where, then stop.
on_signal() {
  echo
  echo "== interrupted during ${step:-startup}${log:+; log: $log}. Rerun the same command to resume."
  exit 130
}
trap on_signal INT TERM

total_start=$SECONDS
steps_total=0
n=${#STEPS[@]}
i=0
declare -a SUMMARY=()
echo "== P4 toolchain build: PI $PI_REF, behavioral-model $BMV2_REF, p4c $P4C_REF," \
  "p4runtime ${P4RUNTIME_PI_COMMIT:0:8}/${P4RUNTIME_P4C_COMMIT:0:8} (<= $P4RUNTIME_TAG)"
echo "== git base: $GIT_BASE  prefix: $PREFIX  workdir: $WORKDIR  jobs: $JOBS"
for step in "${STEPS[@]}"; do
  i=$((i + 1))
  label="[$i/$n] $(step_label "$step")"
  stamp=$STAMPS/$step.done
  log=$LOGS/$step.log
  if ! selected "$step"; then
    SUMMARY+=("$(printf '%-58s %s' "$label" "not selected")")
    continue
  fi
  # A stamp holds the time it was done and the step's key: the inputs that, changed, redo it.
  key=$(step_key "$step")
  if ((${#ONLY[@]} == 0)) && [[ -f $stamp ]] && [[ $(sed -n 2p "$stamp") == "$key" ]]; then
    took=$(sed -n 3p "$stamp")
    echo "== $(date +%T) $label ... skipped (done at $(head -n 1 "$stamp"))"
    SUMMARY+=("$(printf '%-58s %s' "$label" "skipped (took ${took:+$(fmt_secs "$took") }earlier)")")
    steps_total=$((steps_total + ${took:-0}))
    continue
  fi
  # A step that runs again makes the steps after it stale (new packages alone do not).
  if ((${#ONLY[@]} == 0)) && [[ $step != deps ]]; then
    for later in "${STEPS[@]:i}"; do rm -f "$STAMPS/$later.done"; done
  fi
  rm -f "$stamp"
  printf '== %s %s ... ' "$(date +%T)" "$label"
  t0=$SECONDS
  set +e
  (
    set -euo pipefail
    echo "### $(date '+%F %T') $step"
    "step_${step//-/_}"
  ) >"$log" 2>&1 </dev/null
  rc=$?
  set -e
  dt=$(fmt_secs $((SECONDS - t0)))
  if ((rc != 0)); then
    echo "FAILED after $dt (exit $rc)"
    echo "---- last 30 lines of $log:"
    tail -n 30 "$log"
    echo "---- full log: $log"
    echo "Fix the cause and run the same command again: finished steps are skipped."
    exit 1
  fi
  printf '%s\n%s\n%s\n' "$(date '+%F %T')" "$key" $((SECONDS - t0)) >"$stamp"
  steps_total=$((steps_total + SECONDS - t0))
  echo "done in $dt"
  SUMMARY+=("$(printf '%-58s %s' "$label" "$dt")")
done

echo
echo "== summary (logs in $LOGS)"
printf '  %s\n' "${SUMMARY[@]}"
echo "  total: $(fmt_secs $((SECONDS - total_start))) this run," \
  "$(fmt_secs "$steps_total") for all selected steps including earlier runs"
if selected verify; then
  echo "  $(p4c --version 2>/dev/null | head -n 2 | tr '\n' ' ')"
  echo "  forwarding BMv2 (on PATH): simple_switch_grpc: $(command -v simple_switch_grpc)," \
    "simple_switch_CLI: $(command -v simple_switch_CLI)"
  echo "  logging BMv2: $BMV2_LOG_PREFIX/bin/simple_switch_grpc"
fi
