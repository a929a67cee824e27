#!/bin/bash
# Build the memlend Debian package from the release build (`make deb` builds
# first) into target/debian/memlend_<version>_<arch>.deb, and print its path.
#
# The tree is staged under target/debian/root; binaries and libraries are
# stripped of debug info (the release profile keeps it for profiling). Man
# pages and completions come from the binaries themselves (generate-docs),
# so they match their flags. libc6's minimum version is the newest GLIBC_
# symbol version the binaries import.
set -euo pipefail
cd "$(dirname "$0")/.."
REL=target/release
OUT=target/debian
ROOT=$OUT/root

for f in memlend memlendd libmemlend_preload.so libmemlend.so; do
    [ -f "$REL/$f" ] || { echo "deb.sh: $REL/$f is missing; run 'make build' (or 'make deb')" >&2; exit 1; }
done

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
ARCH=$(dpkg --print-architecture)
MULTIARCH=$(gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")

rm -rf "$OUT"
mkdir -p "$ROOT/DEBIAN"
install_to() { # mode file dest-dir [name]
    install -D -m "$1" "$2" "$ROOT/$3/${4:-$(basename "$2")}"
}
install_to 0755 $REL/memlend usr/bin
install_to 0755 $REL/memlendd usr/bin
install_to 0644 $REL/libmemlend_preload.so usr/lib/memlend
install_to 0644 $REL/libmemlend.so "usr/lib/$MULTIARCH"
install_to 0644 include/memlend.h usr/include
install_to 0644 python/memlend/__init__.py usr/lib/python3/dist-packages/memlend
install_to 0644 packaging/memlendd.service usr/lib/systemd/system
install_to 0644 packaging/60-memlend-userfaultfd.rules usr/lib/udev/rules.d
install_to 0644 packaging/memlendd.toml etc/memlend
install_to 0644 README.md usr/share/doc/memlend
for d in docs/*.md; do install_to 0644 "$d" usr/share/doc/memlend/docs; done
sed -e "s|@MULTIARCH@|$MULTIARCH|" -e "s|@VERSION@|$VERSION|" packaging/memlend.pc.in \
    > "$OUT/memlend.pc"
install_to 0644 "$OUT/memlend.pc" "usr/lib/$MULTIARCH/pkgconfig"
cat > "$OUT/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: memlend

Files: *
Copyright: the memlend developers
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
install_to 0644 "$OUT/copyright" usr/share/doc/memlend

strip --strip-debug "$ROOT"/usr/bin/memlend "$ROOT"/usr/bin/memlendd \
    "$ROOT"/usr/lib/memlend/libmemlend_preload.so "$ROOT/usr/lib/$MULTIARCH/libmemlend.so"

# Man pages and completions, from the binaries' own clap definitions.
"$REL/memlend" generate-docs "$OUT/docs"
"$REL/memlendd" --generate-docs "$OUT/docs"
for page in "$OUT"/docs/man1/*.1; do
    gzip -9n < "$page" > "$OUT/$(basename "$page").gz"
    install_to 0644 "$OUT/$(basename "$page").gz" usr/share/man/man1
done
for bin in memlend memlendd; do
    install_to 0644 "$OUT/docs/completions/bash/$bin" usr/share/bash-completion/completions
    install_to 0644 "$OUT/docs/completions/zsh/_$bin" usr/share/zsh/vendor-completions
    install_to 0644 "$OUT/docs/completions/fish/$bin.fish" usr/share/fish/vendor_completions.d
done

GLIBC=$(objdump -T "$ROOT"/usr/bin/* "$ROOT"/usr/lib/memlend/*.so "$ROOT/usr/lib/$MULTIARCH"/*.so \
    | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
SIZE_KIB=$(du -sk --exclude=DEBIAN "$ROOT" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@GLIBC@|$GLIBC|" -e "s|@SIZE_KIB@|$SIZE_KIB|" \
    packaging/debian/control.in > "$ROOT/DEBIAN/control"
for f in conffiles triggers; do install -m 0644 "packaging/debian/$f" "$ROOT/DEBIAN/$f"; done
for f in postinst prerm postrm; do install -m 0755 "packaging/debian/$f" "$ROOT/DEBIAN/$f"; done

DEB="$OUT/memlend_${VERSION}_${ARCH}.deb"
dpkg-deb --root-owner-group -Zxz --build "$ROOT" "$DEB" >/dev/null
echo "$DEB"
