//! Linux system calls. The table below is the whole dispatch: one line per call, one module
//! per call (`syscall/<name>.rs`, each exporting `call`). A number without a line returns
//! ENOSYS and is logged once, by name.

use crate::arch::trap::TrapFrame;

mod names;
mod path;
/// Also used by `/dev/xpmem` (`crate::xpmem`) for its ioctl arguments, and by
/// `crate::process` and `crate::job::pipe`.
pub(crate) mod user;

use crate::console::log;
use core::sync::atomic::{AtomicU64, Ordering};

/// A Linux errno (positive); the caller sees `-errno` in RAX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub u64);

impl Errno {
    pub const EPERM: Errno = Errno(1);
    pub const ENOENT: Errno = Errno(2);
    pub const EINTR: Errno = Errno(4);
    pub const EBADF: Errno = Errno(9);
    pub const ENOMEM: Errno = Errno(12);
    pub const EFAULT: Errno = Errno(14);
    pub const ENODEV: Errno = Errno(19);
    pub const EAGAIN: Errno = Errno(11);
    pub const EINVAL: Errno = Errno(22);
    pub const ETIMEDOUT: Errno = Errno(110);
    pub const ENOTDIR: Errno = Errno(20);
    pub const EISDIR: Errno = Errno(21);
    pub const ENOTTY: Errno = Errno(25);
    pub const ESPIPE: Errno = Errno(29);
    pub const ERANGE: Errno = Errno(34);
    pub const ENOSYS: Errno = Errno(38);
}

pub type SyscallResult = Result<u64, Errno>;

/// One system call in progress: its six arguments and, for the calls the entry code gives a
/// full frame (`clone`, `rt_sigreturn`, `sigaltstack`), every register of the caller.
pub struct Call<'a> {
    pub args: [u64; 6],
    pub frame: Option<&'a mut TrapFrame>,
}

macro_rules! syscall_table {
    ($($number:literal => $name:ident),* $(,)?) => {
        $(mod $name;)*

        fn handler(number: u64) -> Option<fn(&mut Call<'_>) -> SyscallResult> {
            match number {
                $($number => Some($name::call),)*
                _ => None,
            }
        }
    };
}

syscall_table! {
    0 => read,
    1 => write,
    2 => open,
    3 => close,
    4 => stat,
    5 => fstat,
    6 => lstat,
    7 => poll,
    8 => lseek,
    9 => mmap,
    10 => mprotect,
    11 => munmap,
    12 => brk,
    13 => rt_sigaction,
    14 => rt_sigprocmask,
    15 => rt_sigreturn,
    16 => ioctl,
    17 => pread64,
    18 => pwrite64,
    19 => readv,
    20 => writev,
    21 => access,
    22 => pipe,
    23 => select,
    24 => sched_yield,
    25 => mremap,
    56 => clone,
    57 => fork,
    58 => vfork,
    59 => execve,
    28 => madvise,
    32 => dup,
    33 => dup2,
    34 => pause,
    35 => nanosleep,
    39 => getpid,
    60 => exit,
    61 => wait4,
    62 => kill,
    63 => uname,
    72 => fcntl,
    77 => ftruncate,
    79 => getcwd,
    83 => mkdir,
    87 => unlink,
    89 => readlink,
    95 => umask,
    96 => gettimeofday,
    97 => getrlimit,
    98 => getrusage,
    99 => sysinfo,
    100 => times,
    102 => getuid,
    104 => getgid,
    107 => geteuid,
    108 => getegid,
    109 => setpgid,
    110 => getppid,
    111 => getpgrp,
    112 => setsid,
    121 => getpgid,
    124 => getsid,
    127 => rt_sigpending,
    128 => rt_sigtimedwait,
    130 => rt_sigsuspend,
    131 => sigaltstack,
    158 => arch_prctl,
    186 => gettid,
    200 => tkill,
    201 => time,
    202 => futex,
    203 => sched_setaffinity,
    204 => sched_getaffinity,
    213 => epoll_create,
    217 => getdents64,
    218 => set_tid_address,
    228 => clock_gettime,
    229 => clock_getres,
    230 => clock_nanosleep,
    231 => exit_group,
    232 => epoll_wait,
    233 => epoll_ctl,
    234 => tgkill,
    247 => waitid,
    257 => openat,
    258 => mkdirat,
    262 => newfstatat,
    263 => unlinkat,
    267 => readlinkat,
    269 => faccessat,
    270 => pselect6,
    271 => ppoll,
    273 => set_robust_list,
    281 => epoll_pwait,
    291 => epoll_create1,
    292 => dup3,
    293 => pipe2,
    302 => prlimit64,
    309 => getcpu,
    318 => getrandom,
    441 => epoll_pwait2,
}

/// Which unimplemented numbers were already reported (numbers up to 511).
static REPORTED: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];

/// ENOSYS, reported the first time each number is seen (out of line: the dispatch path stays
/// short, every kernel instruction counts on PVM).
#[cold]
#[inline(never)]
fn unimplemented(number: u64) -> SyscallResult {
    let (word, bit) = ((number / 64) as usize % REPORTED.len(), number % 64);
    if REPORTED[word].fetch_or(1 << bit, Ordering::Relaxed) & (1 << bit) == 0 {
        log!("unimplemented system call {} ({}): returning ENOSYS", number, names::name_of(number));
    }
    Err(Errno::ENOSYS)
}

/// Runs system call `number`; returns what the caller finds in RAX.
pub fn dispatch(number: u64, call: &mut Call<'_>) -> u64 {
    let result = match handler(number) {
        Some(handler) => handler(call),
        None => unimplemented(number),
    };
    match result {
        Ok(value) => value,
        Err(Errno(errno)) => {
            if crate::signal::is_restart_code(errno) {
                crate::signal::call_interrupted(number);
            }
            errno.wrapping_neg()
        }
    }
}
