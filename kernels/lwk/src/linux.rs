//! Linux's ABI as the system calls see it, in one place: errno values, flag values (`uapi`)
//! and the layouts of the structures the kernel reads from and writes to the job, all from
//! `linux-raw-sys` (bindgen's rendering of Linux's UAPI headers). Structures are built as
//! bytes at the crate's field offsets (`linux_struct!`) and read back the same way
//! (`linux_field!`), so no layout is written twice and no unsafe code is needed. What the
//! crate lacks is here, with its source: `struct tms` and the fields of `siginfo_t` (a union
//! of unions there).

pub use linux_raw_sys::general::{
    __kernel_timespec as timespec, epoll_event, iovec, kernel_sigaction, linux_dirent64, pollfd, rlimit, rusage, sigaltstack, stat, timeval,
};
pub use linux_raw_sys::system::{new_utsname, sysinfo};

/// Linux's flag and command values (O_*, MAP_*, CLONE_*, FUTEX_*, ...), as handlers name them.
pub use linux_raw_sys::general as uapi;

/// A Linux errno (positive); the caller sees `-errno` in RAX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub u64);

/// The errnos the kernel returns, named as Linux names them.
macro_rules! errnos {
    ($($name:ident),* $(,)?) => {
        impl Errno {
            $(pub const $name: Errno = Errno(linux_raw_sys::errno::$name as u64);)*
        }
    };
}

errnos!(
    EPERM,
    ENOENT,
    ESRCH,
    EINTR,
    EIO,
    E2BIG,
    ENOEXEC,
    EBADF,
    ECHILD,
    EAGAIN,
    ENOMEM,
    EACCES,
    EFAULT,
    EEXIST,
    ENODEV,
    ENOTDIR,
    EISDIR,
    EINVAL,
    EMFILE,
    ENOTTY,
    ESPIPE,
    EROFS,
    EPIPE,
    ERANGE,
    ENAMETOOLONG,
    ENOSYS,
    ELOOP,
    ELIBBAD,
    ETIMEDOUT,
    ENOTSOCK,
    EMSGSIZE,
    EOPNOTSUPP,
    EAFNOSUPPORT,
    EINPROGRESS,
    ENOBUFS,
);

/// `struct tms` (Linux's include/uapi/linux/times.h): four `clock_t`s.
pub const TMS_SIZE: usize = 4 * 8;

/// `siginfo_t` (include/uapi/asm-generic/siginfo.h): 128 bytes; the offsets of the fields of
/// SIGCHLD's and of a signal sent by kill, on x86-64.
pub mod siginfo {
    pub const SIZE: usize = 128;
    pub const SIGNO: usize = 0;
    pub const CODE: usize = 8;
    pub const PID: usize = 16;
    pub const STATUS: usize = 24;
}

/// Linux's values (`uapi`) as typed constants where they are used, the C type each call
/// declares: `linux_consts!(u64: CLONE_VM, CLONE_VFORK; pub i32: SI_USER);`.
#[macro_export]
macro_rules! linux_consts {
    ($($vis:vis $type:ty : $($name:ident),+ $(,)?);+ $(;)?) => {
        $($($vis const $name: $type = $crate::linux::uapi::$name as $type;)+)+
    };
}

/// A scalar field of a Linux structure, stored little-endian.
pub trait Field: Copy {
    const SIZE: usize;
    fn store(self, bytes: &mut [u8]);
    fn load(bytes: &[u8]) -> Self;
}

macro_rules! fields {
    ($($type:ty),*) => {
        $(impl Field for $type {
            const SIZE: usize = core::mem::size_of::<$type>();
            fn store(self, bytes: &mut [u8]) {
                bytes.copy_from_slice(&self.to_le_bytes());
            }
            fn load(bytes: &[u8]) -> Self {
                <$type>::from_le_bytes(bytes.try_into().expect("the field's size"))
            }
        })*
    };
}
fields!(u8, u16, u32, u64, i16, i32, i64);

/// Stores `value` at `at`; `_field` names the structure's field (never called: it gives the
/// field's type, whose size must be the value's).
pub fn store<S, F, V: Field>(bytes: &mut [u8], at: usize, _field: fn(S) -> F, value: V) {
    const { assert!(core::mem::size_of::<F>() == V::SIZE, "the value's size is the field's") };
    value.store(&mut bytes[at..at + V::SIZE]);
}

/// Loads the field at `at` (named by `_field`, as for `store`) as a `V` of its size.
pub fn load<S, F, V: Field>(bytes: &[u8], at: usize, _field: fn(S) -> F) -> V {
    const { assert!(core::mem::size_of::<F>() == V::SIZE, "the value's size is the field's") };
    V::load(&bytes[at..at + V::SIZE])
}

/// A Linux structure as bytes, the fields named set and the rest zero:
/// `linux_struct!(stat { st_ino: 7u64, st_mode: 0o100644u32 })`. Nested fields are written
/// `ru_utime.tv_sec`; a field whose type is a pointer takes a `u64`.
#[macro_export]
macro_rules! linux_struct {
    ($type:ty { $($field:ident $(. $inner:ident)* : $value:expr),* $(,)? }) => {{
        let mut bytes = [0u8; core::mem::size_of::<$type>()];
        $($crate::linux::store(
            &mut bytes,
            core::mem::offset_of!($type, $field $(. $inner)*),
            |record: $type| record.$field $(. $inner)*,
            $value,
        );)*
        bytes
    }};
}

/// One field of a Linux structure read from `bytes`, as the integer type the caller expects
/// (of the field's size): `let events: u32 = linux_field!(bytes, epoll_event, events)`.
#[macro_export]
macro_rules! linux_field {
    ($bytes:expr, $type:ty, $field:ident) => {
        $crate::linux::load($bytes, core::mem::offset_of!($type, $field), |record: $type| record.$field)
    };
}
