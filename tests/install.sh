#!/bin/sh
# What `make install` puts under a prefix, checked in a temporary one:
#
#   - lib/libvipl.so -> libvipl.so.1 -> libvipl.so.1.VERSION, whose SONAME is
#     libvipl.so.1 and which exports exactly the functions of vipl.h (and the
#     version node VIPL_1.0), each in that node;
#   - bin/viad, bin/viabench, bin/viainfo, each answering --version;
#   - the manual pages vipl(7), viad(8), viabench(1), viainfo(1), which
#     render (and pass groff's warnings, where groff is installed);
#   - lib/pkgconfig/vipl.pc without an rpath: a program built with it
#     records libvipl.so.1 and no rpath, runs with LD_LIBRARY_PATH, finds
#     the installed viad beside the library, and is told why an unknown
#     device name is refused;
#   - lib/systemd/system/viad.service, which starts the installed viad
#     (and passes systemd-analyze verify, where systemd is installed);
#   - `make uninstall` leaves no file behind.
#
# Run from the top of the tree after `make` (the Makefile's test-install).
# Environment: MAKE, CC, PKG_CONFIG.
set -u

make=${MAKE:-make}
cc=${CC:-cc}
pkg_config=${PKG_CONFIG:-pkg-config}
version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n 1)

work=$(mktemp -d "${TMPDIR:-/tmp}/openvia-install.XXXXXX")
prefix=$work/usr
socket=openvia-install-$$-$(date +%s%N)
trap '"$prefix/bin/viad" --stop --socket "$socket" >/dev/null 2>&1; rm -rf "$work"' EXIT

failed=0
checks=0
ok() { checks=$((checks + 1)); }
fail() {
    checks=$((checks + 1))
    failed=$((failed + 1))
    echo "FAIL install: $*"
}

if ! $make --no-print-directory install PREFIX="$prefix" DESTDIR= >"$work/install.log" 2>&1; then
    tail -n 30 "$work/install.log"
    echo "install-tests: make install failed"
    exit 1
fi

# ---- the library
lib=$prefix/lib
[ -f "$lib/libvipl.so.1.$version" ] && ok || fail "no lib/libvipl.so.1.$version"
[ "$(readlink "$lib/libvipl.so.1")" = "libvipl.so.1.$version" ] && ok || fail "lib/libvipl.so.1 does not point at libvipl.so.1.$version"
[ "$(readlink "$lib/libvipl.so")" = "libvipl.so.1" ] && ok || fail "lib/libvipl.so does not point at libvipl.so.1"
[ -f "$lib/libvipl.a" ] && ok || fail "no lib/libvipl.a"

soname=$(readelf -d "$lib/libvipl.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libvipl.so.1" ] && ok || fail "SONAME is '$soname', not libvipl.so.1"

grep -oE '\bVip[A-Za-z]+ *\(' include/vipl.h | tr -d ' (' | sort -u >"$work/api"
nm -D --defined-only "$lib/libvipl.so" | awk '{print $3}' | sort -u >"$work/exports"
grep -v '^VIPL_1.0$' "$work/exports" | sed 's/@.*//' | sort -u >"$work/exported"
if cmp -s "$work/api" "$work/exported"; then
    ok
else
    fail "the exports are not the functions of vipl.h:"
    diff "$work/api" "$work/exported" | sed 's/^/    /' | head -n 20
fi
grep -qx 'VIPL_1.0' "$work/exports" && ok || fail "no version node VIPL_1.0 in the exports"
unversioned=$(grep -v '^VIPL_1.0$' "$work/exports" | grep -vc '@@VIPL_1.0$')
[ "$unversioned" -eq 0 ] && ok || fail "$unversioned exports outside the version node VIPL_1.0"
[ "$(wc -l <"$work/api")" -gt 30 ] && ok || fail "vipl.h declares only $(wc -l <"$work/api") functions?"

# ---- the tools
for t in viad viabench viainfo; do
    if [ -x "$prefix/bin/$t" ]; then
        out=$("$prefix/bin/$t" --version 2>&1)
        [ "$out" = "$t $version" ] && ok || fail "$t --version says '$out', not '$t $version'"
    else
        fail "no bin/$t"
    fi
done

# ---- the agent's service unit
unit=$prefix/lib/systemd/system/viad.service
if [ -f "$unit" ]; then
    ok
    exec_start=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$unit")
    [ "$exec_start" = "$prefix/bin/viad" ] && [ -x "$exec_start" ] && ok \
        || fail "viad.service starts '$exec_start', not the installed $prefix/bin/viad"
    grep -q '^ExecStart=.* --idle-timeout 0' "$unit" && ok || fail "viad.service's agent would exit when idle"
    if command -v systemd-analyze >/dev/null 2>&1; then
        out=$(systemd-analyze verify --man=no "$unit" 2>&1) && ok || fail "systemd-analyze verify viad.service: $out"
    fi
else
    fail "no lib/systemd/system/viad.service"
fi

# ---- the manual pages
for page in man1/viabench.1 man1/viainfo.1 man7/vipl.7 man8/viad.8; do
    f=$prefix/share/man/$page
    if [ ! -f "$f" ]; then
        fail "no share/man/$page"
        continue
    fi
    ok
    if command -v groff >/dev/null 2>&1; then
        warnings=$(groff -man -Tutf8 -z -ww "$f" 2>&1)
        [ -z "$warnings" ] && ok || fail "groff warns about $page: $warnings"
        name=$(basename "$page" | sed 's/\..*//')
        # Plain text: no overstriking for bold and underline.
        groff -man -Tutf8 -P-bou "$f" >"$work/page" 2>&1
        grep -qx 'NAME' "$work/page" && ok || fail "$page renders no NAME section"
        grep -Eq "^ +$name +- " "$work/page" && ok || fail "$page does not begin '$name - '"
    fi
done

# ---- vipl.pc and a program built with it
pc="PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_LIBDIR=$lib/pkgconfig"
# shellcheck disable=SC2086 # two assignments
libs=$(env $pc "$pkg_config" --libs vipl)
# shellcheck disable=SC2086
cflags=$(env $pc "$pkg_config" --cflags vipl)
case "$libs" in
*rpath*) fail "vipl.pc forces an rpath: $libs" ;;
*) ok ;;
esac
cat >"$work/prog.c" <<'EOF'
#include <vipl.h>
#include <stdio.h>
int main(void)
{
    VIP_NIC_HANDLE nic = NULL;
    VIP_RETURN r = VipOpenNic("/dev/via_lo", &nic);
    if (r != VIP_SUCCESS) {
        printf("VipOpenNic(/dev/via_lo): %d\n", (int)r);
        return 1;
    }
    if (VipCloseNic(nic) != VIP_SUCCESS)
        return 2;
    r = VipOpenNic("/dev/nosuchdevice7", &nic);
    if (r != VIP_INVALID_PARAMETER) {
        printf("VipOpenNic(/dev/nosuchdevice7): %d\n", (int)r);
        return 3;
    }
    printf("ok\n");
    return 0;
}
EOF
# shellcheck disable=SC2086 # flag lists
if $cc -std=c11 -Wall -Werror $cflags -o "$work/prog" "$work/prog.c" $libs; then
    ok
    readelf -d "$work/prog" | grep -q 'NEEDED.*\[libvipl.so.1\]' && ok || fail "the program does not record libvipl.so.1"
    if readelf -d "$work/prog" | grep -Eq 'RPATH|RUNPATH'; then fail "the program has an rpath"; else ok; fi
    # No VIA_VIAD: the library starts the viad installed beside it.
    out=$(env -u VIA_VIAD LD_LIBRARY_PATH="$lib" VIA_AGENT_SOCKET="$socket" VIA_VIAD_IDLE=2 \
        timeout 60 "$work/prog" 2>"$work/prog.err")
    [ "$out" = ok ] && ok || fail "the program says '$out': $(cat "$work/prog.err")"
    grep -q 'nosuchdevice7.*valid names: .*via_lo' "$work/prog.err" && ok ||
        fail "an unknown device is not explained on stderr: $(cat "$work/prog.err")"
else
    fail "cannot build a program with pkg-config --cflags --libs vipl"
fi

# ---- uninstall
"$prefix/bin/viad" --stop --socket "$socket" >/dev/null 2>&1
if $make --no-print-directory uninstall PREFIX="$prefix" DESTDIR= >"$work/uninstall.log" 2>&1; then
    left=$(find "$prefix" -type f -o -type l)
    [ -z "$left" ] && ok || fail "make uninstall left: $left"
else
    fail "make uninstall failed: $(tail -n 5 "$work/uninstall.log")"
fi

echo "install-tests: $((checks - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
