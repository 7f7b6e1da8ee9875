#!/usr/bin/env bash
# build.sh - build (idempotently, cached) everything needed to boot a Debian
# kernel with the SoftiWARP (siw) RDMA driver under qemu/TCG:
#
#   $CACHE/vmlinuz              Debian linux-image-<KREL> kernel
#   $CACHE/initramfs.cpio.gz    busybox init + modules + siw.ko variants +
#                               rdma-core userspace (rping, perftest, ...) + tcpdump
#
# Debian does NOT enable CONFIG_RDMA_SIW (neither 6.1 nor 6.12), so siw.ko is
# compiled out-of-tree from the matching Debian linux-source-X.Y package against
# the matching Debian linux-headers-<KREL> package (same gcc-12 as the kernel).
# siw's MPA knobs are compile-time constants in 6.1 (no module params), so a few
# variants are built; the guest picks one with boot.sh --variant:
#   stock     pristine Debian source (MPA rev 2, no CRC, no markers, no P2P)
#   crc       mpa_crc_required = true  (requests/accepts MPA CRC32c)
#   p2p       peer_to_peer = true      (MPA v2 P2P + RTR offer: zero-len WRITE|READ)
#   crc_p2p   both
#   *_fix / fix   same + patches/siw-fix-rx-race.patch (lost-wakeup fix for a peer
#             FPDU/RTR that arrives right after the MPA reply; see README)
#
# Env: SIWVM_CACHE (default /var/tmp/siw-vm-cache)
#      SIWVM_KREL   (kernel release, e.g. 6.1.0-56-amd64; default: what
#                    linux-image-amd64 depends on at first build, then pinned
#                    in $CACHE/krel). Second kernel: 6.12.117+deb12-amd64 (what
#                    linux-image-6.12-amd64 depends on), with its own cache, e.g.
#                    SIWVM_CACHE=/var/tmp/siw-vm-cache-612 (see README)
#      SIWVM_FORCE=1 rebuild the initramfs even if inputs did not change
#      SIWVM_PYVERBS=1 also build $CACHE/initramfs-pyverbs.cpio.gz: the same
#                    with python3 and python3-pyverbs and rdma-core's Python
#                    tests appended (boot.sh --pyverbs; see README)
# Needs root (apt-get install of host build tools/headers).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SIWVM_CACHE:-/var/tmp/siw-vm-cache}
DEBS=$CACHE/debs
PKGROOT=$CACHE/pkgroot
ROOTFS=$CACHE/rootfs
VARIANTS="stock crc p2p crc_p2p fix crc_fix p2p_fix crc_p2p_fix"
LIBDIRS="lib/x86_64-linux-gnu usr/lib/x86_64-linux-gnu lib64"

log() { echo "[build] $*" >&2; }
die() { echo "[build] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (needs apt-get)"
mkdir -p "$CACHE" "$DEBS"
export DEBIAN_FRONTEND=noninteractive

APT_UPDATED=0
apt_update() {
    if [ $APT_UPDATED = 0 ]; then
        log "apt-get update"
        apt-get update -qq >/dev/null
        APT_UPDATED=1
    fi
}

# ---------------------------------------------------------------- host tools
host_need=()
for pair in qemu-system-x86_64:qemu-system-x86 cpio:cpio depmod:kmod \
            readelf:binutils gzip:gzip xz:xz-utils make:make ldconfig:libc-bin; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || host_need+=("${pair#*:}")
done
if [ ${#host_need[@]} -gt 0 ]; then
    apt_update
    log "installing host tools: ${host_need[*]}"
    apt-get install -y -qq --no-install-recommends "${host_need[@]}" >/dev/null
fi

# ---------------------------------------------------------------- kernel choice
if [ -n "${SIWVM_KREL:-}" ]; then
    KREL=$SIWVM_KREL
elif [ -s "$CACHE/krel" ]; then
    KREL=$(cat "$CACHE/krel")
else
    apt_update
    KREL=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{sub("linux-image-","",$2); print $2; exit}')
    [ -n "$KREL" ] || die "cannot resolve linux-image-amd64"
fi
echo "$KREL" > "$CACHE/krel"
KMM=$(echo "$KREL" | cut -d. -f1,2)          # 6.1
log "kernel release $KREL (linux-source-$KMM)"

# ---------------------------------------------------------------- debs
GUEST_PKGS="linux-image-$KREL busybox-static libibverbs1 ibverbs-providers librdmacm1
 rdmacm-utils perftest ibverbs-utils iproute2 tcpdump ethtool
 libc6 libgcc-s1 libbpf1 libbsd0 libmd0 libcap2 libssl3 libelf1 zlib1g libibumad3
 libmnl0 libnl-3-200 libnl-route-3-200 libpcap0.8 libdbus-1-3 libpci3 libudev1
 libselinux1 libpcre2-8-0 libsystemd0 liblzma5 libzstd1 liblz4-1 libgcrypt20
 libgpg-error0 libcap-ng0 libxtables12"

have_deb() { compgen -G "$DEBS/${1}_*.deb" >/dev/null; }

missing=()
for p in $GUEST_PKGS; do have_deb "$p" || missing+=("$p"); done
KVER_PKG=""
if ! have_deb "linux-source-$KMM"; then
    apt_update
    KVER_PKG=$(apt-cache show --no-all-versions "linux-image-$KREL" | awk '/^Version:/{print $2; exit}')
    missing+=("linux-source-$KMM=$KVER_PKG")
fi
if [ ${#missing[@]} -gt 0 ]; then
    apt_update
    log "apt-get download ${missing[*]}"
    (cd "$DEBS" && apt-get download -q "${missing[@]}" 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true)
    for p in $GUEST_PKGS; do have_deb "$p" || die "download of $p failed"; done
fi

# ---------------------------------------------------------------- extract
deb_files() { for p in $GUEST_PKGS; do ls "$DEBS/${p}"_*.deb | sort | tail -1; done; }
EXTRACT_KEY=$(deb_files | xargs -n1 basename | sha256sum | cut -c1-16)
if [ "$(cat "$PKGROOT.stamp" 2>/dev/null)" != "$EXTRACT_KEY" ]; then
    log "extracting $(deb_files | wc -l) debs into $PKGROOT"
    rm -rf "$PKGROOT"; mkdir -p "$PKGROOT"
    for d in $(deb_files); do dpkg-deb -x "$d" "$PKGROOT"; done
    echo "$EXTRACT_KEY" > "$PKGROOT.stamp"
fi
[ -f "$PKGROOT/boot/vmlinuz-$KREL" ] || die "no vmlinuz in linux-image-$KREL"
install -m 644 "$PKGROOT/boot/vmlinuz-$KREL" "$CACHE/vmlinuz"

# ---------------------------------------------------------------- siw.ko
SIWSRC=$CACHE/siw-src/$KREL
HDRS=/usr/src/linux-headers-$KREL
LHDRS=$CACHE/headers/usr/src/linux-headers-$KREL   # unpacked (not installed) headers, see below
[ ! -f "$HDRS/Makefile" ] && [ -f "$LHDRS/Makefile" ] && HDRS=$LHDRS
if [ ! -f "$HDRS/Makefile" ]; then
    apt_update
    if apt-cache depends "linux-headers-$KREL" | grep -q 'Depends: linux-image-'; then
        # 6.12 (bookworm-security): linux-headers-<KREL> depends on the kernel image,
        # so installing it would put a kernel on this host. Unpack the headers,
        # the common headers and kbuild into $CACHE/headers instead and install
        # only their non-kernel dependencies (gcc-12, pahole for module BTF).
        mapfile -t hp < <(echo "linux-headers-$KREL"
            apt-cache depends "linux-headers-$KREL" | awk '$1=="Depends:" && $2 ~ /^linux-(headers|kbuild)-/ {print $2}')
        hdeps=$(apt-cache depends "${hp[@]}" | awk '$1=="Depends:" && $2 !~ /^<?linux-/ {print $2}' | sort -u)
        log "unpacking ${hp[*]} into $CACHE/headers (host deps: $(echo $hdeps))"
        apt-get install -y -qq --no-install-recommends $hdeps >/dev/null
        (cd "$DEBS" && apt-get download -q "${hp[@]}" 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true)
        rm -rf "$CACHE/headers"; mkdir -p "$CACHE/headers"
        for p in "${hp[@]}"; do dpkg-deb -x "$(ls "$DEBS/${p}"_*.deb | sort | tail -1)" "$CACHE/headers"; done
        sed -i "s#/usr/src/#$CACHE/headers/usr/src/#" "$LHDRS/Makefile"   # include .../linux-headers-*-common/Makefile
        HDRS=$LHDRS
    else
        log "installing linux-headers-$KREL (gcc-12 toolchain for out-of-tree siw.ko)"
        apt-get install -y -qq --no-install-recommends "linux-headers-$KREL" >/dev/null
    fi
    [ -f "$HDRS/Makefile" ] || die "no kernel headers for $KREL"
fi
if [ ! -f "$SIWSRC/siw_main.c" ]; then
    log "extracting drivers/infiniband/sw/siw from linux-source-$KMM"
    tmp=$(mktemp -d "$CACHE/src.XXXX")
    dpkg-deb --fsys-tarfile "$(ls "$DEBS"/linux-source-"$KMM"_*.deb | sort | tail -1)" \
        | tar -xO "./usr/src/linux-source-$KMM.tar.xz" | xz -dc \
        | tar -x -C "$tmp" --wildcards "linux-source-$KMM/drivers/infiniband/sw/siw/*"
    mkdir -p "$(dirname "$SIWSRC")"; rm -rf "$SIWSRC"
    mv "$tmp/linux-source-$KMM/drivers/infiniband/sw/siw" "$SIWSRC"; rm -rf "$tmp"
fi
for v in $VARIANTS; do
    out=$CACHE/siw/$KREL/$v
    key=$(cat "$HERE/patches/"*.patch | sha256sum | cut -c1-16)
    [ -f "$out/siw.ko" ] && [ "$(cat "$out/key" 2>/dev/null)" = "$key" ] && continue
    log "building siw.ko variant '$v'"
    b=$CACHE/siw-build/$KREL/$v
    rm -rf "$b"; mkdir -p "$b"; cp "$SIWSRC"/* "$b"/
    case $v in
        *crc*) sed -i 's/^const bool mpa_crc_required;/const bool mpa_crc_required = true;/' "$b/siw_main.c"
               grep -q 'mpa_crc_required = true' "$b/siw_main.c" || die "crc patch failed" ;;
    esac
    case $v in
        *p2p*) sed -i 's/^const bool peer_to_peer;/const bool peer_to_peer = true;/' "$b/siw_main.c"
               grep -q 'peer_to_peer = true' "$b/siw_main.c" || die "p2p patch failed" ;;
    esac
    case $v in
        *fix*) patch -s -d "$b" -p1 < "$HERE/patches/siw-fix-rx-race.patch" || die "fix patch failed" ;;
    esac
    make -s -C "$HDRS" M="$b" CONFIG_RDMA_SIW=m modules >"$b/build.log" 2>&1 \
        || { cat "$b/build.log" >&2; die "siw build failed"; }
    mkdir -p "$out"
    strip --strip-debug -o "$out/siw.ko" "$b/siw.ko"
    echo "$key" > "$out/key"
done

# ---------------------------------------------------------------- initramfs
build_initramfs() {
log "assembling rootfs in $ROOTFS"
rm -rf "$ROOTFS"
mkdir -p "$ROOTFS"/{bin,sbin,usr/bin,usr/sbin,lib64,lib/x86_64-linux-gnu,usr/lib/x86_64-linux-gnu/libibverbs,etc/libibverbs.d,proc,sys,dev,tmp,run,host,root,var/run,siwvm}

# busybox + applet links
install -m 755 "$PKGROOT/bin/busybox" "$ROOTFS/bin/busybox"
for a in $("$ROOTFS/bin/busybox" --list); do
    [ "$a" = busybox ] && continue
    ln -sf /bin/busybox "$ROOTFS/bin/$a"
done

# real tools (override busybox applets of the same name)
BINS="usr/bin/rping usr/bin/ucmatose usr/bin/udaddy usr/bin/mckey usr/bin/rdma_server
 usr/bin/rdma_client usr/bin/rdma_xserver usr/bin/rdma_xclient usr/bin/rstream usr/bin/riostream
 usr/bin/rcopy usr/bin/cmtime usr/bin/udpong
 usr/bin/ib_write_bw usr/bin/ib_read_bw usr/bin/ib_send_bw usr/bin/ib_atomic_bw
 usr/bin/ib_write_lat usr/bin/ib_read_lat usr/bin/ib_send_lat usr/bin/ib_atomic_lat
 usr/bin/ibv_devices usr/bin/ibv_devinfo usr/bin/ibv_rc_pingpong usr/bin/ibv_srq_pingpong
 usr/bin/ibv_uc_pingpong usr/bin/ibv_ud_pingpong usr/bin/ibv_asyncwatch
 usr/bin/rdma usr/bin/tcpdump bin/ip sbin/ethtool sbin/tc
 usr/lib/x86_64-linux-gnu/libibverbs/libsiw-rdmav34.so"
for f in $BINS; do
    [ -e "$PKGROOT/$f" ] || die "missing $f in packages"
    mkdir -p "$ROOTFS/$(dirname "$f")"
    rm -f "$ROOTFS/$f"; cp -L "$PKGROOT/$f" "$ROOTFS/$f"
done
# ip in both /bin and /sbin paths (busybox links in /bin/sbin were replaced above)
ln -sf /bin/ip "$ROOTFS/sbin/ip"
cp "$PKGROOT/etc/libibverbs.d/siw.driver" "$ROOTFS/etc/libibverbs.d/"
mkdir -p "$ROOTFS/etc/iproute2"; cp -r "$PKGROOT/etc/iproute2/." "$ROOTFS/etc/iproute2/" 2>/dev/null || true

# shared library closure (by DT_NEEDED), resolved from the package tree only
find_lib() {
    local d
    for d in $LIBDIRS; do [ -e "$PKGROOT/$d/$1" ] && { echo "$d/$1"; return 0; }; done
    return 1
}
declare -A seen=()
queue=()
for f in $BINS; do queue+=("$ROOTFS/$f"); done
while [ ${#queue[@]} -gt 0 ]; do
    f=${queue[0]}; queue=("${queue[@]:1}")
    for so in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        [ -n "${seen[$so]:-}" ] && continue
        seen[$so]=1
        rel=$(find_lib "$so") || die "unresolved shared library $so (needed by ${f#$ROOTFS/}); add its package to GUEST_PKGS"
        mkdir -p "$ROOTFS/$(dirname "$rel")"
        cp -L "$PKGROOT/$rel" "$ROOTFS/$rel"
        queue+=("$ROOTFS/$rel")
    done
done
cp -L "$PKGROOT/lib64/ld-linux-x86-64.so.2" "$ROOTFS/lib64/"
# dlopen()ed by glibc for pthread_exit/cancel unwinding (rping needs it)
cp -L "$PKGROOT/lib/x86_64-linux-gnu/libgcc_s.so.1" "$ROOTFS/lib/x86_64-linux-gnu/"
printf '/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n' > "$ROOTFS/etc/ld.so.conf"
ldconfig -r "$ROOTFS" 2>/dev/null || ldconfig -r "$ROOTFS"
log "libraries: ${!seen[*]}"

# kernel modules: closure via modules.dep of the Debian tree
[ -f "$PKGROOT/lib/modules/$KREL/modules.dep" ] || depmod -b "$PKGROOT" "$KREL"
WANT_MODS="virtio_pci virtio_net virtio_rng 9p 9pnet_virtio ib_core ib_uverbs ib_umad rdma_ucm
 rdma_cm iw_cm ib_cm libcrc32c crc32c_generic crc32c_intel sch_netem"
for m in $WANT_MODS; do
    modprobe -d "$PKGROOT" -S "$KREL" --show-depends --ignore-install "$m" \
        | awk '$1=="insmod"{print $2}'
done | sort -u | while read -r ko; do
    rel=${ko#$PKGROOT/}
    mkdir -p "$ROOTFS/$(dirname "$rel")"
    # 6.12 ships .ko.xz; busybox would first try finit_module on it (kernel logs
    # "Invalid ELF header magic") and then unpack it itself, so unpack it here
    case $ko in *.ko.xz) xz -dc "$ko" > "$ROOTFS/${rel%.xz}" ;; *) cp "$ko" "$ROOTFS/$rel" ;; esac
done
cp "$PKGROOT/lib/modules/$KREL"/modules.{order,builtin,builtin.modinfo} "$ROOTFS/lib/modules/$KREL/" 2>/dev/null || true
depmod -b "$ROOTFS" "$KREL"
for v in $VARIANTS; do
    mkdir -p "$ROOTFS/lib/siw/$v"; cp "$CACHE/siw/$KREL/$v/siw.ko" "$ROOTFS/lib/siw/$v/"
done

# misc /etc
cat > "$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
tcpdump:x:104:110::/nonexistent:/bin/false
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
printf 'root:x:0:\ntcpdump:x:110:\nnogroup:x:65534:\n' > "$ROOTFS/etc/group"
printf '127.0.0.1 localhost\n10.77.0.1 host\n10.77.0.2 siwvm\n10.77.0.3 sitap\n' > "$ROOTFS/etc/hosts"
echo siwvm > "$ROOTFS/etc/hostname"
cat > "$ROOTFS/etc/siwvm-release" <<EOF
kernel=$KREL
kernel_pkg=$(dpkg-deb -f "$(ls "$DEBS"/linux-image-"$KREL"_*.deb | tail -1)" Version)
rdma_core=$(dpkg-deb -f "$(ls "$DEBS"/ibverbs-providers_*.deb | tail -1)" Version)
perftest=$(dpkg-deb -f "$(ls "$DEBS"/perftest_*.deb | tail -1)" Version)
tcpdump=$(dpkg-deb -f "$(ls "$DEBS"/tcpdump_*.deb | tail -1)" Version)
siw=out-of-tree build of drivers/infiniband/sw/siw from linux-source-$KMM $(dpkg-deb -f "$(ls "$DEBS"/linux-source-"$KMM"_*.deb | sort | tail -1)" Version)
siw_variants=$VARIANTS
EOF

# guest scripts
install -m 755 "$HERE/guest/init" "$ROOTFS/init"
install -m 755 "$HERE/guest/siwvm.sh" "$ROOTFS/siwvm/siwvm.sh"

log "packing initramfs"
(cd "$ROOTFS" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) \
    | gzip -6 > "$CACHE/initramfs.cpio.gz.tmp"
mv "$CACHE/initramfs.cpio.gz.tmp" "$CACHE/initramfs.cpio.gz"
echo "$INPUT_KEY" > "$CACHE/initramfs.stamp"
log "done: $CACHE/vmlinuz $CACHE/initramfs.cpio.gz ($(du -h "$CACHE/initramfs.cpio.gz" | cut -f1))"
}

# ---------------------------------------------------------------- pyverbs variant
# SIWVM_PYVERBS=1: $CACHE/initramfs-pyverbs.cpio.gz, the initramfs above with
# a second cpio archive appended (the kernel unpacks both, the second over the
# first): python3.11 and its standard library (without test, idlelib,
# tkinter, ...), python3-pyverbs, rdma-core's Python tests unpacked in
# /siwvm/pyverbs/tests, guest/pyverbs.sh as /siwvm/pyverbs.sh, their shared
# libraries and an ld.so.cache of both. The .py files are compiled on the
# host when it has python3.11 (unchecked-hash .pyc: TCG compiles slowly).
PY_PKGS="python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11 python3-pyverbs
 libexpat1 libffi8 libbz2-1.0 libuuid1 libcrypt1"
PY_DROP="test idlelib tkinter turtledemo ensurepip lib2to3 pydoc_data config-3.11-x86_64-linux-gnu"
build_pyverbs() {
    local PYPKGROOT=$CACHE/pypkgroot PYROOT=$CACHE/pyroot p missing=()
    for p in $PY_PKGS; do have_deb "$p" || missing+=("$p"); done
    if [ ${#missing[@]} -gt 0 ]; then
        apt_update
        log "apt-get download ${missing[*]}"
        (cd "$DEBS" && apt-get download -q "${missing[@]}" 2>&1 | grep -v -e unsandboxed -e '^Get:' >&2 || true)
        for p in $PY_PKGS; do have_deb "$p" || die "download of $p failed"; done
    fi
    local debs key
    debs=$(for p in $PY_PKGS; do ls "$DEBS/${p}"_*.deb | sort | tail -1; done)
    key=$(echo "$debs" | xargs -n1 basename | sha256sum | cut -c1-16)
    if [ "$(cat "$PYPKGROOT.stamp" 2>/dev/null)" != "$key" ]; then
        log "extracting $(echo "$debs" | wc -l) debs into $PYPKGROOT"
        rm -rf "$PYPKGROOT"; mkdir -p "$PYPKGROOT"
        for d in $debs; do dpkg-deb -x "$d" "$PYPKGROOT"; done
        echo "$key" > "$PYPKGROOT.stamp"
    fi
    local pykey
    pykey=$( { echo "$key $INPUT_KEY $PY_DROP"; command -v python3.11 || true; } | sha256sum | cut -c1-16)
    if [ -z "${SIWVM_FORCE:-}" ] && [ -f "$CACHE/initramfs-pyverbs.cpio.gz" ] \
       && [ "$(cat "$CACHE/initramfs-pyverbs.stamp" 2>/dev/null)" = "$pykey" ]; then
        log "pyverbs initramfs up to date ($CACHE/initramfs-pyverbs.cpio.gz)"
        return 0
    fi

    log "assembling the pyverbs overlay in $PYROOT"
    rm -rf "$PYROOT"
    mkdir -p "$PYROOT"/usr/bin "$PYROOT"/usr/lib/python3/dist-packages "$PYROOT"/etc "$PYROOT"/siwvm/pyverbs/tests
    cp -L "$PYPKGROOT/usr/bin/python3.11" "$PYROOT/usr/bin/"
    ln -s python3.11 "$PYROOT/usr/bin/python3"
    local excl=() x
    for x in $PY_DROP; do excl+=(--exclude="./$x"); done
    tar -C "$PYPKGROOT/usr/lib/python3.11" "${excl[@]}" -cf - . | tar -C "$PYROOT/usr/lib" --one-top-level=python3.11 -xf -
    cp -a "$PYPKGROOT/usr/lib/python3/dist-packages/pyverbs" "$PYROOT/usr/lib/python3/dist-packages/"
    cp -a "$PYPKGROOT/etc/python3.11" "$PYROOT/etc/"
    local tests=$PYPKGROOT/usr/share/doc/rdma-core/tests
    [ -f "$tests/run_tests.py" ] || die "no run_tests.py in python3-pyverbs"
    cp "$tests"/* "$PYROOT/siwvm/pyverbs/tests/"
    gunzip -f "$PYROOT"/siwvm/pyverbs/tests/*.gz
    install -m 755 "$HERE/guest/pyverbs.sh" "$PYROOT/siwvm/pyverbs.sh"

    # shared libraries: what the base initramfs lacks, from either package tree;
    # an extension module of the standard library whose library is in neither
    # (curses, dbm, sqlite3, readline, nis) is left out
    find_pylib() {
        local d r
        for r in "$PYPKGROOT" "$PKGROOT"; do
            for d in $LIBDIRS; do [ -e "$r/$d/$1" ] && { echo "$r/$d/$1"; return 0; }; done
        done
        return 1
    }
    have_lib() { local d; for d in $LIBDIRS; do [ -e "$1/$d/$2" ] && return 0; done; return 1; }
    closure() { # file: prints the libraries to add, fails if one is missing
        local f so src q=("$1")
        while [ ${#q[@]} -gt 0 ]; do
            f=${q[0]}; q=("${q[@]:1}")
            for so in $(readelf -d "$f" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
                have_lib "$ROOTFS" "$so" && continue
                src=$(find_pylib "$so") || { echo "missing $so"; return 1; }
                echo "$src"; q+=("$src")
            done
        done
    }
    local f out libs=() dropped=()
    while read -r f; do
        if out=$(closure "$f"); then
            libs+=($out)
        else
            case $f in
                */lib-dynload/*) dropped+=("$(basename "$f" | cut -d. -f1)"); rm -f "$f" ;;
                *) die "${f#$PYROOT/}: $out" ;;
            esac
        fi
    done < <(find "$PYROOT" -name '*.so' -o -path '*/usr/bin/python3.11')
    for f in $(printf '%s\n' "${libs[@]}" | sort -u); do
        local rel=${f#$PYPKGROOT/}; rel=${rel#$PKGROOT/}
        mkdir -p "$PYROOT/$(dirname "$rel")"; cp -L "$f" "$PYROOT/$rel"
    done
    log "pyverbs libraries: $(printf '%s\n' "${libs[@]}" | sort -u | xargs -rn1 basename | tr '\n' ' ')"
    log "left out (library missing): ${dropped[*]:-none}"
    # one ld.so.cache for both archives
    local both; both=$(mktemp -d "$CACHE/both.XXXX")
    cp -al "$ROOTFS/." "$both/"; cp -a "$PYROOT/." "$both/"
    ldconfig -r "$both" 2>/dev/null || ldconfig -r "$both"
    cp "$both/etc/ld.so.cache" "$PYROOT/etc/"; rm -rf "$both"

    if command -v python3.11 >/dev/null; then
        log "compiling the .py files (host python3.11)"
        python3.11 -m compileall -q -j0 --invalidation-mode unchecked-hash -s "$PYROOT" -p / \
            "$PYROOT/usr/lib/python3.11" "$PYROOT/usr/lib/python3/dist-packages" "$PYROOT/siwvm/pyverbs/tests" >/dev/null \
            || die "compileall failed"
    else
        log "no python3.11 on the host: the guest compiles the .py files as it imports them"
    fi

    log "packing the pyverbs overlay"
    (cd "$PYROOT" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc --quiet -R 0:0) \
        | gzip -6 > "$CACHE/pyverbs-overlay.cpio.gz"
    cat "$CACHE/initramfs.cpio.gz" "$CACHE/pyverbs-overlay.cpio.gz" > "$CACHE/initramfs-pyverbs.cpio.gz.tmp"
    mv "$CACHE/initramfs-pyverbs.cpio.gz.tmp" "$CACHE/initramfs-pyverbs.cpio.gz"
    echo "$pykey" > "$CACHE/initramfs-pyverbs.stamp"
    log "done: $CACHE/initramfs-pyverbs.cpio.gz ($(du -h "$CACHE/initramfs-pyverbs.cpio.gz" | cut -f1))"
}

# ---------------------------------------------------------------- initramfs
# Rebuild only when an input changed.
INPUT_KEY=$( { echo "$EXTRACT_KEY $KREL $VARIANTS"; cat "$0" "$HERE"/guest/* "$HERE"/patches/*;
               for v in $VARIANTS; do sha256sum "$CACHE/siw/$KREL/$v/siw.ko"; done; } | sha256sum | cut -c1-16)
if [ -z "${SIWVM_FORCE:-}" ] && [ -f "$CACHE/initramfs.cpio.gz" ] \
   && [ "$(cat "$CACHE/initramfs.stamp" 2>/dev/null)" = "$INPUT_KEY" ]; then
    log "initramfs up to date ($CACHE/initramfs.cpio.gz)"
else
    build_initramfs
fi
[ -n "${SIWVM_PYVERBS:-}" ] || exit 0
build_pyverbs

