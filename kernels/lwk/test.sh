#!/usr/bin/env bash
# Differential tests of the lightweight kernel. Every C program in tests/programs is built
# statically against musl (musl-gcc) and glibc (gcc), run on the host and as the LWK's job,
# and its output (stdout and stderr together) and exit status are compared. A representative
# set (dynamic_programs below) is also built the default way, dynamically linked ("libc" dynamic):
# its archive holds the interpreter, the libraries ldd names and /etc/ld.so.cache.
#
#   kernels/lwk/test.sh                     # all programs, both libcs, under QEMU TCG
#   kernels/lwk/test.sh hello memory        # some programs
#   LIBCS=musl kernels/lwk/test.sh          # one libc (musl, glibc or dynamic)
#   RUNNER=vmm kernels/lwk/test.sh          # under clowder-vmm on /dev/kvm instead of QEMU
#   CLOWDER_VMM=path/to/clowder-vmm RUNNER=vmm kernels/lwk/test.sh   # a prebuilt VMM
#   QEMU_CPUS=2 kernels/lwk/test.sh         # two CPUs under QEMU (xAPIC, INIT/SIPI)
#   VMM_ARGS="--cpus 2" RUNNER=vmm kernels/lwk/test.sh   # two vCPUs (PVH: x2APIC, INIT/SIPI)
#   VMM_ARGS="--protocol direct64 --cpus 2" RUNNER=vmm kernels/lwk/test.sh   # every vCPU
#                                           # starts at the entry
#   LWK_ARGS=lwk.fpu=ring3 kernels/lwk/test.sh   # kernel options before the job's (here: the
#                                           # vector state switched in ring 3, as on PVM)
#
# A program that cannot run under clowder-vmm names the reason in a comment,
# "lwk-test-skip-vmm: REASON"; RUNNER=vmm prints it and skips the program.
#
# The job gets the command line `lwk.env=GREETING=hello -- NAME one "two words"`; the host
# run gets the same argv and environment.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kernels=$(dirname "$here")
repo=$(dirname "$kernels")
work="$kernels/target/lwk-tests"
runner=${RUNNER:-qemu}
qemu_cpus=${QEMU_CPUS:-1}
libcs=${LIBCS:-musl glibc dynamic}
# Built dynamically too: start-up, files, threads, signals, processes (execve of a dynamic
# image), C++, Fortran, dlopen and LD_LIBRARY_PATH, the auxiliary vector.
dynamic_programs=" hello files threads signals processes iostream fortran dlopen auxv "
mkdir -p "$work"

(cd "$kernels" && cargo build --release -p lwk --quiet) || exit 1
kernel="$kernels/target/x86_64-unknown-none/release/lwk"
if [ "$runner" = vmm ]; then
    vmm=${CLOWDER_VMM:-}
    if [ -z "$vmm" ]; then
        (cd "$repo" && cargo build --release -p clowder-vmm --quiet) || exit 1
        vmm="$repo/target/release/clowder-vmm"
    fi
fi

# make_archive OUTPUT NAME=PATH...: a newc cpio archive (the job's file system), each PATH
# stored as NAME, its data page aligned (the name padded with NULs) so that the kernel maps
# read-only segments of executables from the archive without copying them.
make_archive() {
    python3 - "$@" <<'PYTHON'
import os, sys
output, members = sys.argv[1], sys.argv[2:]
with open(output, "wb") as archive:
    def entry(name, mode, data, inode):
        name_field = name.encode() + b"\0"
        if data:
            name_field += b"\0" * (-(archive.tell() + 110 + len(name_field)) % 4096)
        header = "070701" + "".join("%08x" % field for field in
            (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name_field), 0))
        archive.write(header.encode() + name_field)
        archive.write(b"\0" * (-(110 + len(name_field)) % 4) + data + b"\0" * (-len(data) % 4))
    for inode, member in enumerate(members, 1):
        name, path = member.split("=", 1)
        mode = 0o100755 if os.access(path, os.X_OK) else 0o100644
        entry(name, mode, open(path, "rb").read(), inode)
    entry("TRAILER!!!", 0, b"", 0)
PYTHON
}

# dynamic_members BINARY: NAME=PATH for what a dynamically linked BINARY needs at run time: its
# interpreter and libraries as ldd names them, and /etc/ld.so.cache, stored under the names
# the loader looks for (the file's own contents where that name is a symlink).
dynamic_members() {
    ldd "$1" | sed -n 's|^[[:space:]]*\([^ ]*\) => \(/[^ ]*\) .*|\2|p; s|^[[:space:]]*\(/[^ ]*\) (.*|\1|p' |
        while read -r path; do echo "$path=$(readlink -f "$path")"; done
    echo "/etc/ld.so.cache=/etc/ld.so.cache"
}

# cached_library NAME: where /etc/ld.so.cache puts the x86-64 library NAME (for libraries a
# program opens with dlopen, which ldd does not list), as NAME=PATH for make_archive.
cached_library() {
    local path
    path=$(ldconfig -p | sed -n "s|^[[:space:]]*$1 (libc6,x86-64) => \(.*\)|\1|p" | head -1)
    [ -n "$path" ] && echo "$path=$(readlink -f "$path")"
}

# Every job's archive: the program, and tests/programs/files as files/ (the host runs each
# program in a directory holding the same files/).
rm -rf "$work/files" && cp -r "$here/tests/programs/files" "$work/files"
# For the dynamic programs (dlopen.c): a library found through LD_LIBRARY_PATH, one cut short
# inside its ELF header, one that is not ELF at all.
mkdir -p "$work/files/lib"
gcc -O2 -shared -fPIC -o "$work/files/lib/libclowderplugin.so" "$here/tests/dynamic/plugin.c" || exit 1
head -c 60 "$work/files/lib/libclowderplugin.so" >"$work/files/lib/libtruncated.so"
printf '%0200d\n' 0 >"$work/files/lib/libtext.so"
input_members=$(cd "$work" && find files -type f | sort | sed "s|.*|&=$work/&|")

# run_in_lwk BINARY NAME OUTPUT [raw [ARGV]]: runs the job (from an archive with the input
# files and, for a dynamically linked BINARY, what it needs to run; or with `raw` BINARY
# itself as the module) with argv `NAME one "two words"` (or
# ARGV), writes its output to OUTPUT, the kernel's lines to OUTPUT.kernel, and prints the
# job's exit status as the kernel reported it.
run_in_lwk() {
    local binary=$1 name=$2 output=$3 console="$3.console" machine_status
    if [ "${4:-}" != raw ]; then
        local archive="$output.cpio"
        local needs= library
        if readelf -lW "$binary" 2>/dev/null | grep -q 'Requesting program interpreter'; then
            needs=$(dynamic_members "$binary")
            for library in ${dlopened_libraries:-}; do needs+=" $(cached_library "$library")"; done
        fi
        make_archive "$archive" "$name=$binary" $input_members $needs
        binary=$archive
    fi
    local command_line="${LWK_ARGS:+$LWK_ARGS }lwk.env=GREETING=hello -- ${5:-$name one \"two words\"}"
    if [ "$runner" = vmm ]; then
        timeout 120 "$vmm" --kernel "$kernel" --module "$binary" --mem "${job_mem:-256M}" ${VMM_ARGS:-} --cmdline "$command_line" \
            </dev/null >"$console" 2>"$output.vmm-stderr"
        machine_status=$?
    else
        timeout 120 qemu-system-x86_64 -nodefaults -accel tcg -cpu max -smp "$qemu_cpus" -m "${job_mem:-256M}" -display none \
            -serial stdio -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4 \
            -kernel "$kernel" -initrd "$binary" -append "lwk.cpus=$qemu_cpus $command_line" </dev/null >"$console" 2>&1
        machine_status=$?
    fi
    grep -v '^\[lwk\] ' "$console" >"$output"
    grep '^\[lwk\] ' "$console" >"$output.kernel"
    local status
    status=$(sed -n 's/^\[lwk\] job exited with status \([0-9]*\)$/\1/p' "$console")
    if [ -z "$status" ]; then
        echo "no exit line (machine status $machine_status)"
        return
    fi
    # The line says 256 + N for a job killed by signal N (enclave-proto's KILLED_BY_SIGNAL); the
    # machine exits as a shell would, 128 + N, and so do the checks below.
    [ "$status" -ge 256 ] && status=$((status - 256 + 128))
    # QEMU's isa-debug-exit reports (status << 1) | 1; clowder-vmm the status itself.
    local expected_machine_status=$status
    [ "$runner" = qemu ] && expected_machine_status=$(( ((status << 1) | 1) & 255 ))
    if [ "$machine_status" != "$expected_machine_status" ]; then
        echo "machine status $machine_status does not match job status $status"
        return
    fi
    echo "$status"
}

failures=0

# The kernel denies unsafe code (main.rs) and only src/arch may allow it back.
allowed=$(grep -rln 'allow(unsafe_code)' "$here/src" | grep -v "^$here/src/arch/")
if grep -q '^#!\[deny(unsafe_code)\]' "$here/src/main.rs" && [ -z "$allowed" ]; then
    echo "ok   unsafe code only in src/arch"
else
    echo "FAIL unsafe code allowed outside src/arch (or no longer denied): ${allowed:-main.rs}"
    failures=$((failures + 1))
fi

# docs/lwk-syscalls.md must list exactly the system calls of the table.
table=$(sed -n 's/^    \([0-9]*\) => [a-z0-9_]*::\([a-z0-9_]*\)(.*),$/\1 \2/p' "$here/src/syscall/mod.rs" | sort)
documented=$(python3 - "$repo/docs/lwk-syscalls.md" <<'PYTHON'
import re, sys
for line in open(sys.argv[1]):
    match = re.match(r"\| ([0-9, ]+) \| ([a-z0-9_, ]+) \|", line)
    if match:
        for number, name in zip(match.group(1).split(","), match.group(2).split(",")):
            print(number.strip(), name.strip())
PYTHON
)
if [ "$table" = "$(echo "$documented" | sort)" ]; then
    echo "ok   docs/lwk-syscalls.md lists the $(echo "$table" | wc -l) system calls of the table"
else
    echo "FAIL docs/lwk-syscalls.md and src/syscall/mod.rs differ:"
    diff <(echo "$table") <(echo "$documented" | sort)
    failures=$((failures + 1))
fi

programs=("$@")
[ ${#programs[@]} -eq 0 ] && programs=($(cd "$here/tests/programs" && ls *.c *.cpp *.f90 | sed 's/\.\(c\|cpp\|f90\)$//'))
for program in "${programs[@]}"; do
    source_file=$(ls "$here/tests/programs/$program".{c,cpp,f90} 2>/dev/null | head -1)
    # A source may narrow its libcs, add flags and ask for more than 256M of machine memory:
    # "lwk-test: libcs=glibc flags=-fopenmp mem=1G".
    options=$(sed -n 's/.*lwk-test: \(.*\)$/\1/p' "$source_file" | sed 's|\*/||')
    program_libcs=$(echo "$options" | sed -n 's/.*libcs=\([a-z,]*\).*/\1/p' | tr , ' ')
    extra_flags=$(echo "$options" | sed -n 's/.*flags=\([^ ]*\).*/\1/p')
    job_mem=$(echo "$options" | sed -n 's/.*mem=\([0-9]*[MG]\).*/\1/p')
    # Libraries the program opens with dlopen (the archive of a dynamic build holds them).
    dlopened_libraries=$(echo "$options" | sed -n 's/.*libs=\([^ ]*\).*/\1/p' | tr , ' ')
    # A source may say why it cannot run under clowder-vmm: "lwk-test-skip-vmm: REASON".
    skip_vmm_reason=$(sed -n 's/.*lwk-test-skip-vmm: \(.*\)$/\1/p' "$source_file" | sed 's|\*/||; s/ *$//')
    for libc in $libcs; do
        # A dynamic build links glibc: it runs where the static glibc build does.
        if [ -n "$program_libcs" ] && ! echo " $program_libcs " | grep -q " \($libc\|${libc/dynamic/glibc}\) "; then
            continue
        fi
        if [ "$runner" = vmm ] && [ -n "$skip_vmm_reason" ]; then
            echo "skip $program ($libc) under clowder-vmm: $skip_vmm_reason"
            continue
        fi
        if [ $libc = dynamic ] && [[ $dynamic_programs != *" $program "* ]]; then
            continue
        fi
        binary="$work/$program-$libc"
        link=-static
        case $libc in
            musl) compiler=musl-gcc ;;
            glibc) compiler=gcc ;;
            dynamic) compiler=gcc link= ;;
        esac
        case $source_file in *.cpp) compiler=g++ ;; *.f90) compiler=gfortran ;; esac
        if ! $compiler $link -O2 -pthread $extra_flags -o "$binary" "$source_file" 2>"$binary.build-log"; then
            echo "FAIL $program ($libc): does not build"; cat "$binary.build-log"
            failures=$((failures + 1)); continue
        fi
        # (The group's stderr hides the shell's own "Segmentation fault" report.)
        host_status=$( { cd "$work" && env -i GREETING=hello bash -c 'exec -a "$0" "$@"' "$program" "$binary" \
            one "two words" </dev/null >"$binary.host" 2>&1; echo $?; } 2>/dev/null)
        lwk_status=$(run_in_lwk "$binary" "$program" "$binary.lwk")
        if [ "$lwk_status" = "$host_status" ] && cmp -s "$binary.host" "$binary.lwk"; then
            echo "ok   $program ($libc): status $host_status"
        else
            echo "FAIL $program ($libc): host status $host_status, lwk status $lwk_status"
            diff "$binary.host" "$binary.lwk" | head -20
            sed 's/^/     /' "$binary.lwk.kernel" | tail -5
            failures=$((failures + 1))
        fi
    done
done
# Debian's busybox-static: each line of tests/busybox-commands.txt is one command, run as
# `busybox COMMAND...` on the host and in the LWK (shell pipelines and scripts fork and execute
# busybox applets through /proc/self/exe).
if [ $# -eq 0 ] && file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then
    index=0
    while IFS= read -r command; do
        index=$((index + 1))
        eval "set -- $command"
        output="$work/busybox-$index"
        host_status=$( { cd "$work" && env -i GREETING=hello /bin/busybox "$@" </dev/null >"$output.host" 2>&1; echo $?; } 2>/dev/null)
        make_archive "$output.cpio" "bin/busybox=/bin/busybox" $input_members
        lwk_status=$(run_in_lwk "$output.cpio" busybox "$output.lwk" raw "/bin/busybox $command")
        if [ "$lwk_status" = "$host_status" ] && cmp -s "$output.host" "$output.lwk"; then
            echo "ok   busybox $command: status $host_status"
        else
            echo "FAIL busybox $command: host status $host_status, lwk status $lwk_status"
            diff "$output.host" "$output.lwk" | head -10
            failures=$((failures + 1))
        fi
    done <"$here/tests/busybox-commands.txt"
    set --
fi

# Under QEMU: a machine with no job says so and ends with a shell's "cannot execute" status
# 126; a kernel panic (asked for with lwk.crash=panic) is reported on the console and ends
# the VM with the panic status 254. QEMU's exit device shows both as 253, that is
# (status << 1 | 1) & 255, so the console line tells them apart. (clowder-vmm's statuses are
# checked in the containment tests.)
if [ "$runner" = qemu ] && [ $# -eq 0 ]; then
    qemu_bare() {
        timeout 60 qemu-system-x86_64 -nodefaults -accel tcg -cpu max -m 64M -display none -serial stdio \
            -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4 -kernel "$kernel" "$@" >"$work/bare.console" 2>&1
    }
    qemu_bare
    status=$?
    if [ $status = 253 ] && grep -q '^\[lwk\] cannot start the job: no job was given to the kernel' "$work/bare.console" &&
        ! grep -q 'panic' "$work/bare.console"; then
        echo "ok   no job: the kernel says so and stops (status 126)"
    else
        echo "FAIL no job: machine status $status"; cat "$work/bare.console"
        failures=$((failures + 1))
    fi
    qemu_bare -append "lwk.crash=panic"
    status=$?
    if [ $status = 253 ] && grep -q '^\[lwk\] panic: lwk.crash=panic asked for a kernel panic' "$work/bare.console"; then
        echo "ok   kernel panic: reported on the console, status 254"
    else
        echo "FAIL kernel panic: machine status $status"; cat "$work/bare.console"
        failures=$((failures + 1))
    fi
fi

# The test hook lwk.crash: a kernel panic and a kernel page fault are reported on the console
# and end the VM with status 254, whatever the runner.
if [ $# -eq 0 ]; then
    for crash in panic fault; do
        musl-gcc -static -O2 -o "$work/crash" "$here/tests/programs/hello.c"
        output="$work/crash-$crash.lwk"
        if [ "$runner" = vmm ]; then
            timeout 60 "$vmm" --kernel "$kernel" --module "$work/crash" --mem 64M ${VMM_ARGS:-} \
                --cmdline "lwk.crash=$crash -- crash" </dev/null >"$output" 2>/dev/null
            machine_status=$?
            expected=254
        else
            timeout 60 qemu-system-x86_64 -nodefaults -accel tcg -cpu max -m 64M -display none -serial stdio \
                -no-reboot -device isa-debug-exit,iobase=0xf4,iosize=4 -kernel "$kernel" -initrd "$work/crash" \
                -append "lwk.crash=$crash -- crash" </dev/null >"$output" 2>&1
            machine_status=$?
            expected=253
        fi
        report='^\[lwk\] panic: '
        [ $crash = fault ] && report='^\[lwk\] kernel fault: page fault'
        if [ $machine_status = $expected ] && grep -q "$report" "$output"; then
            echo "ok   lwk.crash=$crash reported: status 254"
        else
            echo "FAIL lwk.crash=$crash: machine status $machine_status"; cat "$output"
            failures=$((failures + 1))
        fi
    done
fi

# Runs $work/hello-raw as the bare module (no archive; machine size $job_mem), its output to
# OUTPUT, and counts CHECK as failed unless it ends with status 3 and the host run's output.
check_hello_raw() {
    local check=$1 output=$2 status
    status=$(run_in_lwk "$work/hello-raw" hello "$output" raw)
    if [ "$status" = 3 ] && cmp -s "$output" "$work/hello-musl.host"; then
        echo "ok   $check: status 3"
    else
        echo "FAIL $check: status $status"; cat "$output.console"
        failures=$((failures + 1))
    fi
}

# The executable itself as module 0, without an archive.
if [ $# -eq 0 ] && [ -f "$work/hello-musl.host" ]; then
    musl-gcc -static -O2 -o "$work/hello-raw" "$here/tests/programs/hello.c"
    check_hello_raw "bare executable as the module" "$work/hello-raw.lwk"
fi

# The default heap in 4 and 5 GiB machines: their largest free range (below the 3 GiB PCI
# hole) also holds the image and stack, so the heap is sized after they are placed.
if [ $# -eq 0 ] && [ -f "$work/hello-raw" ]; then
    for job_mem in 4G 5G; do
        check_hello_raw "default heap in a $job_mem machine" "$work/hello-$job_mem.lwk"
    done
    job_mem=
fi

# Programs the kernel cannot run, given as the module: the reason on the console, and a shell's
# status: 127 for a dynamically linked hello whose interpreter is not there (bash's words for
# execve's ENOENT), 126 ("cannot execute") for a static one whose first loadable segment claims
# memory past the end of user space. (QEMU's exit device shows (status << 1 | 1) & 255.) Then
# untrusted executables: 16 copies of hello with header and program-header fields corrupted
# (tests/elf_variants.py, fixed seed); each must end as a program does (refused with a reason,
# a signal, an exit), never with a kernel panic, a kernel fault or a hang.
if [ $# -eq 0 ] && [ -f "$work/hello-raw" ]; then
    gcc -O2 -o "$work/hello-dynamic" "$here/tests/programs/hello.c"
    python3 "$here/tests/elf_variants.py" "$work/hello-raw" "$work/hello"
    for case in "dynamic|cannot execute: required file not found (the interpreter /lib64/ld-linux-x86-64.so.2)|127" \
        "huge|the program has a malformed loadable segment|126"; do
        IFS='|' read -r name reason status <<<"$case"
        expected_status=$status
        [ "$runner" = qemu ] && expected_status=$(( ((status << 1) | 1) & 255 ))
        outcome=$(run_in_lwk "$work/hello-$name" hello "$work/hello-$name.lwk" raw)
        if grep -qF "[lwk] cannot start the job: $reason" "$work/hello-$name.lwk.console" &&
            [ "$outcome" = "no exit line (machine status $expected_status)" ]; then
            echo "ok   refused by the kernel: $reason (status $status)"
        else
            echo "FAIL refused by the kernel ($name): $outcome"; cat "$work/hello-$name.lwk.console"
            failures=$((failures + 1))
        fi
    done
    bad=0
    for image in "$work"/hello-corrupt-[0-9][0-9]; do
        outcome=$(run_in_lwk "$image" hello "$image.lwk" raw)
        if grep -q '^\[lwk\] \(panic\|kernel fault\)' "$image.lwk.console" ||
            ! grep -q '^\[lwk\] \(cannot start the job: \|job exited with status \)' "$image.lwk.console"; then
            bad=$((bad + 1))
            echo "     ${image##*/}: $outcome"; tail -3 "$image.lwk.console"
        fi
    done
    if [ $bad = 0 ]; then
        echo "ok   16 corrupted executables: each refused, signalled or exited; no kernel panic or hang"
    else
        echo "FAIL corrupted executables: $bad of 16 ended the kernel or hung"
        failures=$((failures + 1))
    fi
fi

# Dynamic linking's failures. A program linked against a library its archive lacks: the
# loader's message and status 127, as on the host (where the library is not on the search path
# either). Then a library corrupted 17 ways (tests/elf_variants.py on libclowderplugin.so), each
# opened with dlopen in a child of its own (tests/lwk-only/corrupt_libraries.c): each gets an
# error, loads, or kills its child; the job carries on to its end and the kernel does not fail.
if [ $# -eq 0 ] && [[ $libcs == *dynamic* ]]; then
    gcc -O2 -o "$work/missing-library" "$here/tests/programs/hello.c" -Wl,--no-as-needed -L"$work/files/lib" -lclowderplugin
    host_status=$( { cd "$work" && env -i bash -c 'exec -a "$0" "$@"' missing-library "$work/missing-library" </dev/null \
        >"$work/missing-library.host" 2>&1; echo $?; } 2>/dev/null)
    status=$(run_in_lwk "$work/missing-library" missing-library "$work/missing-library.lwk")
    if [ "$status" = 127 ] && [ "$host_status" = 127 ] && cmp -s "$work/missing-library.host" "$work/missing-library.lwk"; then
        echo "ok   missing library: $(cat "$work/missing-library.lwk") (status 127, as on the host)"
    else
        echo "FAIL missing library: host status $host_status, lwk status $status"
        diff "$work/missing-library.host" "$work/missing-library.lwk"
        failures=$((failures + 1))
    fi
    gcc -O2 -o "$work/corrupt_libraries" "$here/tests/lwk-only/corrupt_libraries.c"
    python3 "$here/tests/elf_variants.py" "$work/files/lib/libclowderplugin.so" "$work/libplugin"
    variants=$(cd "$work" && ls libplugin-huge libplugin-corrupt-[0-9][0-9])
    members=$(for variant in $variants; do echo "lib/$variant=$work/$variant"; done)
    make_archive "$work/corrupt_libraries.cpio" "corrupt_libraries=$work/corrupt_libraries" $members \
        $(dynamic_members "$work/corrupt_libraries")
    status=$(run_in_lwk "$work/corrupt_libraries.cpio" corrupt_libraries "$work/corrupt_libraries.lwk" raw \
        "corrupt_libraries $(echo "$variants" | sed 's|^|/lib/|' | tr '\n' ' ')")
    if [ "$status" = 0 ] && [ "$(tail -1 "$work/corrupt_libraries.lwk")" = survived ] &&
        [ "$(grep -c '^/lib/libplugin-' "$work/corrupt_libraries.lwk")" -ge 17 ] &&
        ! grep -q '^\[lwk\] \(panic\|kernel fault\)' "$work/corrupt_libraries.lwk.console"; then
        echo "ok   17 corrupted libraries: $(grep -c ': killed by signal' "$work/corrupt_libraries.lwk") killed their child, the rest an error or loaded; the job went on (status 0)"
    else
        echo "FAIL corrupted libraries: status $status"; tail -20 "$work/corrupt_libraries.lwk.console"
        failures=$((failures + 1))
    fi
fi

# A job whose threads all wait for each other (Linux would hang): the kernel reports the
# dead-lock and ends the job with status 137.
if [ $# -eq 0 ]; then
    musl-gcc -static -O2 -pthread -o "$work/deadlock" "$here/tests/lwk-only/deadlock.c"
    status=$(run_in_lwk "$work/deadlock" deadlock "$work/deadlock.lwk")
    if [ "$status" = 137 ] && grep -q 'dead-lock' "$work/deadlock.lwk.kernel"; then
        echo "ok   dead-lock reported: status 137"
    else
        echo "FAIL dead-lock: status $status"; cat "$work/deadlock.lwk.console"
        failures=$((failures + 1))
    fi
fi

# The ring-3 XSAVE stub page (lwk.fpu=ring3, clowder-vmm's default): a job that jumps into it,
# or points its save stub at another thread slot's area, is killed; one that unmaps it and the
# save areas goes on (the kernel maps them again); the kernel carries on.
if [ $# -eq 0 ]; then
    musl-gcc -static -O2 -o "$work/xstate_stub_page" "$here/tests/lwk-only/xstate_stub_page.c"
    status=$(LWK_ARGS="${LWK_ARGS:+$LWK_ARGS }lwk.fpu=ring3" run_in_lwk "$work/xstate_stub_page" xstate_stub_page "$work/xstate_stub_page.lwk")
    expected="ud2 of the stub page: killed by signal 4
save stub on another slot's area: killed by signal 11
read of another slot's area: killed by signal 11
handler ran 1
its child: exited 0
after unmapping the stub page and the save areas: exited 0"
    if [ "$status" = 0 ] && [ "$(cat "$work/xstate_stub_page.lwk")" = "$expected" ]; then
        echo "ok   xstate stub page: jumps into it and other slots' areas are refused, unmapping it is repaired: status 0"
    else
        echo "FAIL xstate stub page: status $status"; cat "$work/xstate_stub_page.lwk.console"
        failures=$((failures + 1))
    fi
fi

# The kernel's count of the job's entries at its end (src/syscall/census.rs): 1000 umask calls
# counted; 1000 getppid calls counted too unless SYSCALL stays in ring 3 (PVM), whose page
# answers them: then none reaches the kernel (tests/lwk-only/census.c).
if [ $# -eq 0 ]; then
    musl-gcc -static -O2 -o "$work/census" "$here/tests/lwk-only/census.c"
    status=$(run_in_lwk "$work/census" census "$work/census.lwk")
    calls=$(sed -n 's/^\[lwk\] job.s most frequent system calls://p' "$work/census.lwk.kernel")
    count_of() { echo "$calls" | tr ' ' '\n' | grep -A1 -x "$1" | sed -n 2p; }
    expected_getppid=1000
    grep -q 'SYSCALL stays in ring 3' "$work/census.lwk.kernel" && expected_getppid=
    if [ "$status" = 0 ] && [ "$(count_of umask)" = 1000 ] && [ "$(count_of getppid)" = "$expected_getppid" ]; then
        echo "ok   kernel entries counted: umask 1000, getppid ${expected_getppid:-0 (ring 3)}: status 0"
    else
        echo "FAIL kernel entries counted: status $status, umask '$(count_of umask)', getppid '$(count_of getppid)' (want 1000, '$expected_getppid')"
        cat "$work/census.lwk.console"
        failures=$((failures + 1))
    fi
fi

# Under clowder-vmm with two vCPUs, a process's threads ending on both CPUs at once, 100
# times (tests/lwk-only/exit_race.c): no kernel panic.
if [ "$runner" = vmm ] && [ $# -eq 0 ]; then
    musl-gcc -static -O2 -pthread -o "$work/exit_race" "$here/tests/lwk-only/exit_race.c"
    status=$(VMM_ARGS="--cpus 2" run_in_lwk "$work/exit_race" exit_race "$work/exit_race.lwk")
    if [ "$status" = 0 ] && [ "$(cat "$work/exit_race.lwk")" = "100 of 100 children ended with status 7" ]; then
        echo "ok   threads ending on two CPUs at once: status 0"
    else
        echo "FAIL threads ending on two CPUs at once: status $status"; cat "$work/exit_race.lwk.console"
        failures=$((failures + 1))
    fi
fi

# Under clowder-vmm, a forked process's XEMEM segment across enclaves: a host process attached
# to it must get SIGBUS before the process's frames are freed or reused
# (tests/xemem-exit-order.sh: a private clowderd, an LWK enclave, a host attacher; skipped
# without root or musl-gcc).
if [ "$runner" = vmm ] && [ $# -eq 0 ]; then
    KERNEL="$kernel" CLOWDER_VMM="$vmm" "$here/tests/xemem-exit-order.sh" || failures=$((failures + 1))
    # A time slice ending while the CPU waits for the host still ends (tests/tick-after-host-wait.sh).
    KERNEL="$kernel" CLOWDER_VMM="$vmm" "$here/tests/tick-after-host-wait.sh" || failures=$((failures + 1))
    # Waiters in poll and epoll_wait sleep until what they watch changes (tests/quiet-poll.sh).
    KERNEL="$kernel" CLOWDER_VMM="$vmm" "$here/tests/quiet-poll.sh" || failures=$((failures + 1))
    # A woken thread gets the CPU beside a spinner making system calls, and the stall notes
    # count only the time others waited (tests/slice-ticks.sh).
    KERNEL="$kernel" CLOWDER_VMM="$vmm" "$here/tests/slice-ticks.sh" || failures=$((failures + 1))
    # A thread waiting for a file call in a file slot or from ring 3 gives its CPU to one
    # waiting for it (tests/file-slot-waits.sh).
    KERNEL="$kernel" CLOWDER_VMM="$vmm" "$here/tests/file-slot-waits.sh" || failures=$((failures + 1))
    # Reads through another enclave's memory attached again and again cost what local reads
    # cost: no page fault per page (tests/xemem-attach-reread.sh: UCX's rendezvous pattern).
    KERNEL="$kernel" CLOWDER_VMM="$vmm" "$here/tests/xemem-attach-reread.sh" || failures=$((failures + 1))
fi

[ $failures -eq 0 ] && echo "all passed" || echo "$failures failed"
[ $failures -eq 0 ]
