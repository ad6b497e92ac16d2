#!/usr/bin/env bash
# ompi_bundle.sh DIR [PROGRAM...]: copies this machine's Open MPI (Debian's 4.1.x, found through
# ompi_info/orterun) into DIR/ompi as a self-contained, relocatable tree for a machine that has no
# Open MPI (the GPU machine of tests/gpu/gpt_gpu.sh --prepare), and writes DIR/ompi/env.sh; a
# caller sources it (bash: `. DIR/ompi/env.sh`, wherever DIR was moved to) and then runs
# `mpirun -np 2 ./prog` on that machine, shared memory only (btl self,vader, pml ob1; no
# InfiniBand/UCX/libfabric/PSM: the MCA plugins that need them are left out).
# PROGRAM...: also copy these programs' shared libraries (those not in the bundle yet and not
# part of a base system, see SKIP) into DIR/ompi/lib, which env.sh puts on LD_LIBRARY_PATH.
# tests/gpu/ompi_bundle_check.sh proves the bundle works with the system's Open MPI hidden.
#
# Layout (no symlinks: transfers to the GPU machine may drop them):
#   bin/       orterun, and copies of it named mpirun and mpiexec; orted; ompi_info
#   lib/       libmpi, libopen-rte, libopen-pal, libpmix, hwloc, libevent, libudev, libmunge,
#              libmca_common_* ... under their sonames (the dependency closure, by ldd)
#   lib/openmpi3/  Open MPI's MCA plugins (the pkglibdir) minus those that need a network stack
#   lib/pmix/  PMIx's MCA plugins (Debian builds Open MPI against an external PMIx 4)
#   lib/hwloc/ empty but for a note: HWLOC_PLUGINS_PATH points here, so that no hwloc plugin
#              of another hwloc version on the target machine gets loaded
#   share/openmpi/, share/pmix/   help texts (show_help needs them for every error message)
#   etc/       openmpi-mca-params.conf (Debian's defaults), openmpi-default-hostfile,
#              pmix-mca-params.conf (empty: Debian's names an absolute plugin dir)
#   env.sh     the settings (see the comments in it)
set -eu
fail() { echo "ompi_bundle.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] || fail "usage: ompi_bundle.sh DIR [PROGRAM...]"
dest=$1
shift
command -v ldd >/dev/null || fail "ldd not found"
orterun=$(command -v orterun || true)
[ -n "$orterun" ] || orterun=$(readlink -f "$(command -v mpirun || true)" 2>/dev/null || true)
if [ -z "$orterun" ] || [ ! -x "$orterun" ]; then fail "no orterun/mpirun on PATH: install Open MPI (openmpi-bin) here"; fi
orterun=$(readlink -f "$orterun")
bindir=$(dirname "$orterun")

# Open MPI's own directories, as this installation reports them
opath() { ompi_info --parsable --path "$1" 2>/dev/null | awk -F: -v k="$1" '$2 == k {print $3; exit}'; }
pkglibdir=$(opath pkglibdir)
pkgdatadir=$(opath pkgdatadir)
sysconfdir=$(opath sysconfdir)
[ -d "$pkglibdir" ] || fail "ompi_info does not name a plugin dir (pkglibdir '$pkglibdir')"
[ -d "$pkgdatadir" ] || fail "ompi_info does not name a help-text dir (pkgdatadir '$pkgdatadir')"

# SKIP: libraries every Debian/Ubuntu system (a container image included) has, and must use its
# own of: glibc's (libc, libm, libmvec, libpthread, libdl, librt, libresolv, libutil, libanl,
# the loader ld-linux and the kernel's vdso): a second glibc next to the system's loader breaks;
# libz (zlib1g, Priority: required in Debian and Ubuntu), libstdc++ and libgcc_s (the compiler
# runtime, there for any C++ program; a newer system copy is backward compatible).  NEVER: the
# GPU driver's libraries (libcuda, libnvidia-*), which must match the target's kernel driver.
# All else (hwloc, libevent, libudev, libmunge, libpmix ...) is copied.  The copies need the
# target's glibc to be at least as new as the newest GLIBC_2.x symbol version they use, which
# env.sh checks (Debian 12's libevent uses 2.36's arc4random).
SKIP='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libz\.so|libstdc\+\+\.so|libgcc_s\.so)'
NEVER='^(libcuda\.so|libnvidia-)'
# plugins that need one of these are left out: network stacks a loopback run does not use
# (UCX, libfabric, verbs/RDMA, PSM, netlink) and OpenSHMEM; their load errors would be noise
# and their libraries many MB
NET='^(libuc[mpst]\.so|libfabric\.so|libibverbs\.so|librdmacm\.so|libpsm|libinfinipath\.so|libnl-|libefa\.so|libnuma\.so|liboshmem\.so|libmca_common_(ucx|ofi|verbs)\.so)'

out=$dest/ompi
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/openmpi3" "$out/lib/pmix" "$out/lib/hwloc" "$out/share/openmpi" "$out/share/pmix" "$out/etc"
out=$(cd "$out" && pwd)

# deps FILE: "soname path" of every library FILE needs (transitively), "soname -" if not found
deps() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" { print $1, ($3 == "not" ? "-" : $3) }'
}
# need FILE: copy what FILE needs into lib/ (skipping SKIP and NEVER); fails on a missing one
need() {
  local f=$1 name path
  while read -r name path; do
    if [[ $name =~ $SKIP || $name =~ $NEVER ]]; then continue; fi
    [ "$path" != - ] || fail "$f needs $name, which is not found here"
    [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
  done < <(deps "$f")
}
# needs_net FILE: true when FILE needs a NET library (or one that is missing here)
needs_net() {
  local name path
  while read -r name path; do
    if [[ $name =~ $NET ]] || [ "$path" = - ]; then return 0; fi
  done < <(deps "$1")
  return 1
}

for b in orterun orted ompi_info; do
  [ -x "$bindir/$b" ] || { [ $b = orterun ] && fail "no $bindir/$b"; continue; }
  cp -L "$bindir/$b" "$out/bin/$b"
  need "$bindir/$b"
done
cp "$out/bin/orterun" "$out/bin/mpirun"
cp "$out/bin/orterun" "$out/bin/mpiexec"
libmpi=$(deps "$out/bin/ompi_info" | awk '$1 ~ /^libmpi\.so/ {print $2}')
[ -n "$libmpi" ] || libmpi=$(ldconfig -p | awk '$1 ~ /^libmpi\.so\.[0-9]+$/ {print $NF; exit}')
[ -n "$libmpi" ] || fail "libmpi.so not found"
cp -L "$libmpi" "$out/lib/$(basename "$libmpi")"
need "$libmpi"

dropped=
for p in "$pkglibdir"/*.so; do
  if needs_net "$p"; then dropped="$dropped $(basename "$p" .so)"; continue; fi
  cp -L "$p" "$out/lib/openmpi3/"
  need "$p"
done

# PMIx: an external one when libpmix is in the closure; its plugin and help dirs lie beside it
pmixlib=$(for f in "$out"/lib/openmpi3/mca_pmix_*.so; do deps "$f"; done | awk '$1 ~ /^libpmix\.so/ {print $2; exit}')
if [ -n "$pmixlib" ]; then
  pmixroot=$(dirname "$(dirname "$(readlink -f "$pmixlib")")") # .../pmix2 (lib/libpmix.so.2)
  if [ -d "$pmixroot/lib/pmix" ]; then
    for p in "$pmixroot"/lib/pmix/*.so; do
      [ -e "$p" ] || continue
      if needs_net "$p"; then dropped="$dropped $(basename "$p" .so)"; continue; fi
      cp -L "$p" "$out/lib/pmix/"
      need "$p"
    done
  fi
  [ -d "$pmixroot/share/pmix" ] && cp -rL "$pmixroot/share/pmix/." "$out/share/pmix/"
fi
: >"$out/etc/pmix-mca-params.conf"

cp -rL "$pkgdatadir/." "$out/share/openmpi/"
for f in openmpi-mca-params.conf openmpi-default-hostfile; do
  if [ -f "$sysconfdir/$f" ]; then cp -L "$sysconfdir/$f" "$out/etc/"; else : >"$out/etc/$f"; fi
done
echo "hwloc plugins: none (HWLOC_PLUGINS_PATH points here so the target's are not loaded)" >"$out/lib/hwloc/README"

for p in "$@"; do
  [ -f "$p" ] || fail "$p: no such program"
  need "$p"
done

# nothing copied may still need something this machine lacks or the bundle leaves out
for f in "$out"/bin/* "$out"/lib/*.so* "$out"/lib/openmpi3/*.so "$out"/lib/pmix/*.so; do
  [ -e "$f" ] || continue
  if deps "$f" | grep -q ' -$'; then fail "$f: $(deps "$f" | awk '$2 == "-" {print $1}' | tr '\n' ' ')not found"; fi
done
glibc=$(for f in "$out"/bin/* "$out"/lib/*.so* "$out"/lib/openmpi3/*.so "$out"/lib/pmix/*.so; do
  [ -e "$f" ] && objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_2\.[0-9]*'; done | sed 's/GLIBC_//' | sort -V -u | tail -1)
[ -n "$glibc" ] || glibc=2.0
version=$("$orterun" --version 2>/dev/null | head -1)

cat >"$out/env.sh" <<'EOF'
# env.sh: source this (bash: `. /path/to/ompi/env.sh`; another shell: set OMPI_BUNDLE=/path/to/ompi
# first) to use the Open MPI bundle made by cplan's tests/gpu/ompi_bundle.sh on a machine that has
# no Open MPI installed.  Relocatable: every path is derived from where this file lies.
if [ -n "${BASH_VERSION:-}" ]; then
  eval '_ob=${BASH_SOURCE[0]}'
  _ob=$(dirname "$_ob")
elif [ -n "${OMPI_BUNDLE:-}" ]; then
  _ob=$OMPI_BUNDLE
else
  _ob=
fi
[ -z "$_ob" ] || _ob=$(cd "$_ob" 2>/dev/null && pwd)
# a copy that lost the executable bits (some transfers do)
[ -z "$_ob" ] || [ -x "$_ob/bin/orterun" ] || chmod u+x "$_ob"/bin/* 2>/dev/null
if [ -z "$_ob" ] || [ ! -x "$_ob/bin/orterun" ] || [ ! -f "$_ob/env.sh" ] || [ ! -d "$_ob/lib/openmpi3" ]; then
  echo "ompi env.sh: cannot find the bundle ('${_ob:-?}' holds no bin/orterun, env.sh, lib/openmpi3); source it from bash or set OMPI_BUNDLE=DIR/ompi" >&2
  unset _ob
  return 1 2>/dev/null || exit 1
fi
_ob_need=@GLIBC@
_ob_have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
if [ -n "$_ob_have" ] && [ "$(printf '%s\n%s\n' "$_ob_need" "$_ob_have" | sort -V | head -1)" != "$_ob_need" ]; then
  echo "ompi env.sh: warning: the bundle needs glibc >= $_ob_need, this machine has $_ob_have: its libraries will not load" >&2
fi
export OMPI_BUNDLE=$_ob
export PATH=$_ob/bin${PATH:+:$PATH}
export LD_LIBRARY_PATH=$_ob/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Open MPI 4's installdirs "env" component (opal/mca/installdirs/env): each OPAL_*DIR replaces the
# path compiled in (Debian's /usr/..., /etc/openmpi); OPAL_PREFIX alone relocates only the
# ${prefix}-relative ones, and Debian's sysconfdir is absolute, so all are set
export OPAL_PREFIX=$_ob OPAL_EXEC_PREFIX=$_ob
export OPAL_BINDIR=$_ob/bin OPAL_SBINDIR=$_ob/bin OPAL_LIBEXECDIR=$_ob/bin
export OPAL_LIBDIR=$_ob/lib OPAL_PKGLIBDIR=$_ob/lib/openmpi3
export OPAL_DATAROOTDIR=$_ob/share OPAL_DATADIR=$_ob/share OPAL_PKGDATADIR=$_ob/share/openmpi
export OPAL_SYSCONFDIR=$_ob/etc OPAL_SHAREDSTATEDIR=$_ob/share OPAL_LOCALSTATEDIR=$_ob/share
export OPAL_INCLUDEDIR=$_ob/include OPAL_PKGINCLUDEDIR=$_ob/include OPAL_INFODIR=$_ob/share OPAL_MANDIR=$_ob/share
export OMPI_MCA_mca_base_component_path=$_ob/lib/openmpi3
# PMIx 4's installdirs "env" component (src/mca/pinstalldirs/env): the same, PMIX_ prefixed; the
# plugin path is set as an MCA param too (Debian's pmix-mca-params.conf names it absolutely)
export PMIX_PREFIX=$_ob PMIX_EXEC_PREFIX=$_ob
export PMIX_BINDIR=$_ob/bin PMIX_SBINDIR=$_ob/bin PMIX_LIBEXECDIR=$_ob/bin
export PMIX_LIBDIR=$_ob/lib PMIX_PKGLIBDIR=$_ob/lib/pmix
export PMIX_DATAROOTDIR=$_ob/share PMIX_DATADIR=$_ob/share PMIX_PKGDATADIR=$_ob/share/pmix
export PMIX_SYSCONFDIR=$_ob/etc PMIX_SHAREDSTATEDIR=$_ob/share PMIX_LOCALSTATEDIR=$_ob/share
export PMIX_INCLUDEDIR=$_ob/include PMIX_PKGINCLUDEDIR=$_ob/include PMIX_INFODIR=$_ob/share PMIX_MANDIR=$_ob/share
export PMIX_MCA_mca_base_component_path=$_ob/lib/pmix
# no hwloc plugins (pci, opencl, gl, xml) from the target machine: they may be of another hwloc
export HWLOC_PLUGINS_PATH=$_ob/lib/hwloc
# the plugins left out (network stacks) would only be noise if a path named them
export OMPI_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_mca_base_component_show_load_errors=0
# root, as in containers
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one node, shared memory: vader (and self) over the ob1 PML, no UCX/OFI/openib; no single-copy
# (CMA's process_vm_readv needs ptrace rights containers often deny); one-sided: not UCX or
# pt2pt (as Debian's openmpi-mca-params.conf); only the local launcher: plm isolated (the default,
# rsh, stops mpirun with "plm_rsh_agent ... could not be found" where there is no ssh)
export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 OMPI_MCA_mtl=^ofi OMPI_MCA_osc=^ucx,pt2pt
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_plm=isolated
export OMPI_MCA_btl_base_warn_component_unused=0
unset _ob _ob_need _ob_have
EOF
sed -i "s/@GLIBC@/$glibc/" "$out/env.sh"

size=$(du -sh "$out" | cut -f1)
echo "ompi_bundle.sh: copied ${version:-Open MPI} into $out ($size; needs glibc >= $glibc)"
[ -z "$dropped" ] || echo "ompi_bundle.sh: plugins left out (network stacks/OpenSHMEM):$dropped"
echo "ompi_bundle.sh: to use it (bash): . $out/env.sh && mpirun -np 2 ./prog   (after a move: . NEWDIR/ompi/env.sh)"
