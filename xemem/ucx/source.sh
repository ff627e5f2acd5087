# Sourced by build.sh and build-xpmem.sh: Debian's UCX source package, unpacked.
#
# ucx_source_version: the version apt would fetch (a deb-src entry mirroring the machine's
#   archive is added first when there is none; needs root).
# ucx_source DIR: unpacks that source into DIR (Debian's patches applied, as Debian ships it)
#   unless DIR/source.stamp says it is there.

ucx_source_version() {
    if [ -z "$(apt-cache showsrc ucx 2>/dev/null)" ]; then
        local suite mirror
        suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
        # The same archive the machine's binary packages come from.
        mirror=$(grep -h '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | grep -v security | head -1)
        [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
        [ -n "$mirror" ] || { echo "ucx source: no Debian archive configured in apt's sources" >&2; return 1; }
        echo "ucx source: adding a deb-src entry for $suite" >&2
        cat >/etc/apt/sources.list.d/clowder-deb-src.sources <<SRC
Types: deb-src
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
        apt-get update -qq >&2
    fi
    apt-cache showsrc ucx | awk '/^Version:/ {print $2}' | sort -V | tail -1
}

ucx_source() {
    local dir=$1 unpacked
    [ -e "$dir/source.stamp" ] && return 0
    ucx_source_version >/dev/null || return 1
    rm -rf "$dir/apt" && mkdir -p "$dir/apt"
    # Its progress goes to stderr: callers print only their result on stdout.
    (cd "$dir/apt" && apt-get source -qq ucx) >&2 || return 1
    unpacked=$(find "$dir/apt" -mindepth 1 -maxdepth 1 -type d -name 'ucx-*' | head -1)
    [ -n "$unpacked" ] || { echo "ucx source: apt-get source ucx unpacked nothing" >&2; return 1; }
    rm -rf "$dir/source" && mv "$unpacked" "$dir/source"
    # Release tarballs ship a generated configure; regenerate it (autoconf, automake, libtool)
    # only when it is missing.
    if [ ! -x "$dir/source/configure" ]; then
        if ! command -v autoreconf >/dev/null || ! command -v libtoolize >/dev/null; then
            echo "ucx source: installing autoconf, automake, libtool" >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq autoconf automake libtool >/dev/null
        fi
        (cd "$dir/source" && ./autogen.sh) >"$dir/autogen.log" 2>&1 || { tail -20 "$dir/autogen.log" >&2; return 1; }
    fi
    touch "$dir/source.stamp"
}
