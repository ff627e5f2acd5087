#!/usr/bin/env bash
# make install: clowder into $DESTDIR$PREFIX (default PREFIX /usr/local), from a built tree
# (make build). Binaries in bin, the LWK in lib/clowder (where clowderd looks first, relative to
# itself), libxpmem and libdex with their headers (xemem/ and dex/ install rules), man pages made
# from each program's --help, the systemd unit, and the commented default configuration in
# share/doc/clowder and, unless one is already there, $DESTDIR$SYSCONFDIR/clowder/clowderd.toml.
# Nothing installed names the source tree: debug information is stripped, and the LWK is built
# once more with its source paths remapped (its panic messages carry them).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
DESTDIR=${DESTDIR:-}
SYSCONFDIR=${SYSCONFDIR:-/etc}
case $PREFIX in /*) ;; *) echo "install: PREFIX must be an absolute path, not '$PREFIX'" >&2; exit 2 ;; esac
root=$DESTDIR$PREFIX
version=$(sed -n 's/^version = "\(.*\)"/\1/p' node/clowderd/Cargo.toml)

install -d "$root/bin" "$root/lib/clowder" "$root/lib/systemd/system" "$root/share/man/man1" \
    "$root/share/man/man8" "$root/share/doc/clowder" "$DESTDIR$SYSCONFDIR/clowder"
for program in clowderd clowder clowder-vmm; do
    objcopy --strip-debug "target/release/$program" "$root/bin/$program"
done

top=$PWD
(cd kernels && cargo build --release --quiet -p lwk --target-dir ../build/install/kernels \
    --config "build.rustflags=[\"--remap-path-prefix=$top=clowder\"]")
install -m 0644 build/install/kernels/x86_64-unknown-none/release/lwk "$root/lib/clowder/lwk"

make -s -C xemem all && make -s -C xemem install PREFIX="$PREFIX" DESTDIR="$DESTDIR"
make -s -C dex all && make -s -C dex install PREFIX="$PREFIX" DESTDIR="$DESTDIR"

# help2man runs each installed program with --help and --version (clowderd's section is 8).
man_page() { # section program description
    help2man --no-info --section "$1" --name "$3" --output "$root/share/man/man$1/$2.$1" "$root/bin/$2"
}
man_page 1 clowder "enclaves and jobs on a clowder node"
man_page 8 clowderd "the clowder node daemon"
man_page 1 clowder-vmm "one KVM virtual machine per process"
man_page 1 dexrun "run a DEX program over several nodes"
man_page 1 dexnode "start DEX nodes on this host for dexrun --hosts"
man_page 1 dexcc "compile and link a program for DEX"

sed "s|@PREFIX@|$PREFIX|g" packaging/clowderd.service.in >"$root/lib/systemd/system/clowderd.service"
install -m 0644 packaging/clowderd.toml "$root/share/doc/clowder/clowderd.toml"
config=$DESTDIR$SYSCONFDIR/clowder/clowderd.toml
if [ -e "$config" ]; then
    echo "install: keeping the existing $config (the default is in $PREFIX/share/doc/clowder)" >&2
else
    install -m 0644 packaging/clowderd.toml "$config"
fi
echo "install: clowder $version in $root" >&2
