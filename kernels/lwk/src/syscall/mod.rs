//! Linux system calls. The table below is the whole dispatch: one line per call naming its
//! handler and the handler's typed parameters in Linux's order (descriptors as `Fd`, pointers
//! the kernel reads or writes as `UserAddr`, integers as Linux declares them; addresses that
//! only name a place in the job's address space, as mmap's, stay `u64`). Related calls share a
//! module (`syscall/<family>.rs`). A number without a line returns ENOSYS and is logged once,
//! by name.

use crate::arch::trap::TrapFrame;

mod access;
/// Also used by `crate::trap` (ticks, faults) and `crate::job` (reset, report).
pub(crate) mod census;
mod clone;
mod close;
mod dup;
mod epoll;
mod execve;
mod exit;
mod fcntl;
mod ftruncate;
mod futex;
mod getcwd;
mod getdents64;
mod getrandom;
mod identity;
mod ioctl;
mod kill;
mod limits;
mod lseek;
mod memory;
mod mkdir;
mod names;
mod open;
mod path;
mod pipe;
mod poll;
mod read;
mod readlink;
mod scheduling;
mod select;
mod signals;
mod socket;
mod socket_io;
mod stat;
mod statfs;
mod thread;
mod time;
mod umask;
mod uname;
mod unlink;
mod usage;
/// Also used by `/dev/xpmem` (`crate::xpmem`) for its ioctl arguments, and by
/// `crate::process` and `crate::job::pipe`.
pub(crate) mod user;
mod wait;
mod write;

use crate::console::log;
pub use crate::job::descriptors::Fd;
pub use crate::linux::Errno;
use core::sync::atomic::{AtomicU64, Ordering};
pub use user::UserAddr;

pub type SyscallResult = Result<u64, Errno>;

/// One system call in progress: its six arguments and, for the calls the entry code gives a
/// full frame (`clone`, `rt_sigreturn`, `sigaltstack`, ...), every register of the caller.
pub struct Call<'a> {
    pub args: [u64; 6],
    pub frame: Option<&'a mut TrapFrame>,
}

/// The arguments of one call as its handler takes them: each parameter type takes the next
/// raw register (or, for `&mut TrapFrame`, the caller's frame).
pub struct Args<'a> {
    raw: [u64; 6],
    next: usize,
    frame: Option<&'a mut TrapFrame>,
}

/// A handler parameter type, converted once from the raw arguments by the table.
pub trait Arg<'a>: Sized {
    fn take(args: &mut Args<'a>) -> Result<Self, Errno>;
}

impl Args<'_> {
    fn next_raw(&mut self) -> u64 {
        let raw = self.raw[self.next];
        self.next += 1;
        raw
    }
}

/// Integers as Linux declares them: the register truncated to the C type (an `int` is the
/// low 32 bits, as the kernel reads it).
macro_rules! integer_args {
    ($($type:ty),*) => {
        $(impl Arg<'_> for $type {
            #[inline(always)]
            fn take(args: &mut Args<'_>) -> Result<Self, Errno> {
                Ok(args.next_raw() as $type)
            }
        })*
    };
}
integer_args!(u64, i64, usize, u32, i32);

impl Arg<'_> for Fd {
    #[inline(always)]
    fn take(args: &mut Args<'_>) -> Result<Self, Errno> {
        Ok(Fd(args.next_raw() as i32))
    }
}

impl Arg<'_> for UserAddr {
    #[inline(always)]
    fn take(args: &mut Args<'_>) -> Result<Self, Errno> {
        Ok(UserAddr(args.next_raw()))
    }
}

/// The caller's registers, for the calls the entry code gives a full frame (ENOSYS from the
/// fast entry, which has none).
impl<'a> Arg<'a> for &'a mut TrapFrame {
    #[inline(always)]
    fn take(args: &mut Args<'a>) -> Result<Self, Errno> {
        args.frame.take().ok_or(Errno::ENOSYS)
    }
}

/// The dispatch table: `number => module::handler(parameter: Type, ...)`, the parameters in
/// Linux's order; the macro converts each raw argument once (see `Arg`).
macro_rules! syscall_table {
    ($($number:literal => $module:ident :: $handler:ident ( $($parameter:ident : $type:ty),* $(,)? )),* $(,)?) => {
        fn run(number: u64, call: &mut Call<'_>) -> SyscallResult {
            let mut args = Args { raw: call.args, next: 0, frame: call.frame.as_deref_mut() };
            match number {
                $($number => {
                    const { assert!(<[&str]>::len(&[$(stringify!($parameter)),*]) <= 7, "at most six arguments and the frame") };
                    $(let $parameter = <$type as Arg<'_>>::take(&mut args)?;)*
                    $module::$handler($($parameter),*)
                })*
                _ => unimplemented(number),
            }
        }
    };
}

syscall_table! {
    0 => read::read(fd: Fd, buffer: UserAddr, count: usize),
    1 => write::write(fd: Fd, buffer: UserAddr, count: usize),
    2 => open::open(path: UserAddr, flags: i32, mode: u32),
    3 => close::close(fd: Fd),
    4 => stat::stat(path: UserAddr, statbuf: UserAddr),
    5 => stat::fstat(fd: Fd, statbuf: UserAddr),
    6 => stat::lstat(path: UserAddr, statbuf: UserAddr),
    7 => poll::poll(fds: UserAddr, nfds: u32, timeout: i32),
    8 => lseek::lseek(fd: Fd, offset: i64, whence: u32),
    9 => memory::mmap(addr: u64, len: usize, prot: u32, flags: u32, fd: Fd, offset: u64),
    10 => memory::mprotect(addr: u64, len: usize, prot: u32),
    11 => memory::munmap(addr: u64, len: usize),
    12 => memory::brk(addr: u64),
    13 => signals::rt_sigaction(signal: i32, action: UserAddr, old_action: UserAddr, set_size: usize),
    14 => signals::rt_sigprocmask(how: i32, set: UserAddr, old_set: UserAddr, set_size: usize),
    15 => signals::rt_sigreturn(frame: &mut TrapFrame),
    16 => ioctl::ioctl(fd: Fd, request: u32, argument: UserAddr),
    17 => read::pread64(fd: Fd, buffer: UserAddr, count: usize, offset: i64),
    18 => write::pwrite64(fd: Fd, buffer: UserAddr, count: usize, offset: i64),
    19 => read::readv(fd: Fd, iov: UserAddr, iovcnt: i32),
    20 => write::writev(fd: Fd, iov: UserAddr, iovcnt: i32),
    21 => access::access(path: UserAddr, mode: i32),
    22 => pipe::pipe(fds: UserAddr),
    23 => select::select(nfds: i32, read: UserAddr, write: UserAddr, except: UserAddr, timeout: UserAddr),
    24 => scheduling::sched_yield(),
    25 => memory::mremap(addr: u64, old_len: usize, new_len: usize, flags: u32),
    28 => memory::madvise(addr: u64, len: usize, advice: i32),
    32 => dup::dup(fd: Fd),
    33 => dup::dup2(from: Fd, to: Fd),
    34 => signals::pause(),
    35 => time::nanosleep(request: UserAddr, remaining: UserAddr),
    39 => identity::getpid(),
    41 => socket::socket(domain: i32, kind: i32, protocol: i32),
    42 => socket::connect(fd: Fd, address: UserAddr, len: u32),
    43 => socket::accept(fd: Fd, address: UserAddr, len: UserAddr),
    44 => socket_io::sendto(fd: Fd, buffer: UserAddr, len: usize, flags: u32, address: UserAddr, address_len: u32),
    45 => socket_io::recvfrom(fd: Fd, buffer: UserAddr, len: usize, flags: u32, address: UserAddr, address_len: UserAddr),
    46 => socket_io::sendmsg(fd: Fd, message: UserAddr, flags: u32),
    47 => socket_io::recvmsg(fd: Fd, message: UserAddr, flags: u32),
    48 => socket::shutdown(fd: Fd, how: i32),
    49 => socket::bind(fd: Fd, address: UserAddr, len: u32),
    50 => socket::listen(fd: Fd, backlog: i32),
    51 => socket::getsockname(fd: Fd, address: UserAddr, len: UserAddr),
    52 => socket::getpeername(fd: Fd, address: UserAddr, len: UserAddr),
    53 => socket::socketpair(domain: i32, kind: i32, protocol: i32, pair: UserAddr),
    54 => socket::setsockopt(fd: Fd, level: i32, option: i32, value: UserAddr, len: u32),
    55 => socket::getsockopt(fd: Fd, level: i32, option: i32, value: UserAddr, len: UserAddr),
    56 => clone::clone(frame: &mut TrapFrame, flags: u64, stack: u64, parent_tid: UserAddr, child_tid: UserAddr, tls: u64),
    57 => clone::fork(frame: &mut TrapFrame),
    58 => clone::vfork(frame: &mut TrapFrame),
    59 => execve::execve(frame: &mut TrapFrame, path: UserAddr, argv: UserAddr, envp: UserAddr),
    60 => exit::exit(status: i32),
    61 => wait::wait4(pid: i32, status: UserAddr, options: u32, rusage: UserAddr),
    62 => kill::kill(pid: i32, signal: i32),
    63 => uname::uname(buffer: UserAddr),
    72 => fcntl::fcntl(fd: Fd, command: u32, argument: u64),
    77 => ftruncate::ftruncate(fd: Fd, length: i64),
    79 => getcwd::getcwd(buffer: UserAddr, size: usize),
    83 => mkdir::mkdir(path: UserAddr, mode: u32),
    87 => unlink::unlink(path: UserAddr),
    89 => readlink::readlink(path: UserAddr, buffer: UserAddr, size: usize),
    95 => umask::umask(mask: u32),
    96 => time::gettimeofday(time: UserAddr, zone: UserAddr),
    97 => limits::getrlimit(resource: u32, limit: UserAddr),
    98 => usage::getrusage(who: i32, usage: UserAddr),
    99 => usage::sysinfo(info: UserAddr),
    100 => usage::times(buffer: UserAddr),
    102 => identity::getuid(),
    104 => identity::getgid(),
    107 => identity::geteuid(),
    108 => identity::getegid(),
    109 => identity::setpgid(pid: i32, group: i32),
    110 => identity::getppid(),
    111 => identity::getpgrp(),
    112 => identity::setsid(),
    118 => identity::getresuid(real: UserAddr, effective: UserAddr, saved: UserAddr),
    120 => identity::getresgid(real: UserAddr, effective: UserAddr, saved: UserAddr),
    121 => identity::getpgid(pid: i32),
    124 => identity::getsid(pid: i32),
    127 => signals::rt_sigpending(set: UserAddr, set_size: usize),
    128 => signals::rt_sigtimedwait(set: UserAddr, info: UserAddr, timeout: UserAddr, set_size: usize),
    130 => signals::rt_sigsuspend(mask: UserAddr, set_size: usize),
    131 => signals::sigaltstack(frame: &mut TrapFrame, stack: UserAddr, old_stack: UserAddr),
    137 => statfs::statfs(path: UserAddr, buffer: UserAddr),
    138 => statfs::fstatfs(fd: Fd, buffer: UserAddr),
    158 => thread::arch_prctl(code: i32, address: u64),
    186 => identity::gettid(),
    200 => kill::tkill(tid: i32, signal: i32),
    201 => time::time(time: UserAddr),
    202 => futex::futex(address: UserAddr, operation: i32, value: u32, timeout: u64, address2: UserAddr, value3: u32),
    203 => scheduling::sched_setaffinity(tid: i32, len: usize, mask: UserAddr),
    204 => scheduling::sched_getaffinity(pid: i32, len: usize, mask: UserAddr),
    213 => epoll::epoll_create(size: i32),
    217 => getdents64::getdents64(fd: Fd, buffer: UserAddr, count: usize),
    218 => thread::set_tid_address(address: u64),
    228 => time::clock_gettime(clock: i32, time: UserAddr),
    229 => time::clock_getres(clock: i32, resolution: UserAddr),
    230 => time::clock_nanosleep(clock: i32, flags: i32, request: UserAddr, remaining: UserAddr),
    231 => exit::exit_group(status: i32),
    232 => epoll::epoll_wait(epfd: Fd, events: UserAddr, max_events: i32, timeout: i32),
    233 => epoll::epoll_ctl(epfd: Fd, op: i32, fd: Fd, event: UserAddr),
    234 => kill::tgkill(group: i32, tid: i32, signal: i32),
    247 => wait::waitid(id_type: u32, id: i32, info: UserAddr, options: u32, rusage: UserAddr),
    257 => open::openat(directory: Fd, path: UserAddr, flags: i32, mode: u32),
    258 => mkdir::mkdirat(directory: Fd, path: UserAddr, mode: u32),
    262 => stat::newfstatat(directory: Fd, path: UserAddr, statbuf: UserAddr, flags: i32),
    263 => unlink::unlinkat(directory: Fd, path: UserAddr, flags: i32),
    267 => readlink::readlinkat(directory: Fd, path: UserAddr, buffer: UserAddr, size: usize),
    269 => access::faccessat(directory: Fd, path: UserAddr, mode: i32),
    270 => select::pselect6(nfds: i32, read: UserAddr, write: UserAddr, except: UserAddr, timeout: UserAddr, mask: UserAddr),
    271 => poll::ppoll(fds: UserAddr, nfds: u32, timeout: UserAddr, mask: UserAddr, set_size: usize),
    273 => thread::set_robust_list(head: UserAddr, len: usize),
    281 => epoll::epoll_pwait(epfd: Fd, events: UserAddr, max_events: i32, timeout: i32, mask: UserAddr, set_size: usize),
    288 => socket::accept4(fd: Fd, address: UserAddr, len: UserAddr, flags: i32),
    291 => epoll::epoll_create1(flags: i32),
    292 => dup::dup3(from: Fd, to: Fd, flags: i32),
    293 => pipe::pipe2(fds: UserAddr, flags: i32),
    302 => limits::prlimit64(pid: i32, resource: u32, new_limit: UserAddr, old_limit: UserAddr),
    309 => scheduling::getcpu(cpu: UserAddr, node: UserAddr),
    318 => getrandom::getrandom(buffer: UserAddr, len: usize, flags: u32),
    441 => epoll::epoll_pwait2(epfd: Fd, events: UserAddr, max_events: i32, timeout: UserAddr, mask: UserAddr, set_size: usize),
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
    census::count_call(number);
    match run(number, call) {
        Ok(value) => value,
        Err(Errno(errno)) => {
            if crate::signal::is_restart_code(errno) {
                crate::signal::call_interrupted(number);
            }
            errno.wrapping_neg()
        }
    }
}
