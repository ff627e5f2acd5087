//! Clocks and sleeps: clock_gettime, clock_getres, clock_nanosleep, nanosleep, gettimeofday,
//! time. REALTIME (and REALTIME_COARSE, TAI) is the RTC read at boot plus the TSC; a process's
//! CPU-time clock is the job's run time (as getrusage); a thread's, its own time on a CPU
//! (`sched::thread_cpu_time`); every other clock (MONOTONIC, BOOTTIME, ...) counts from boot;
//! other clock ids are EINVAL. Every clock's resolution is one nanosecond (the TSC is finer
//! still). The time zone is UTC.

use super::{user, Errno, SyscallResult, UserAddr};
use crate::linux::uapi;
use crate::linux::{timespec, timeval};
use crate::linux_consts;
use crate::signal::Restart;
use crate::{clock, job, sched};
use crate::{linux_field, linux_struct};
use core::mem::size_of;

linux_consts!(i32: CLOCK_REALTIME, CLOCK_REALTIME_COARSE, CLOCK_TAI, CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID);
/// clock_nanosleep's only flag; others are ignored, as on Linux.
const TIMER_ABSTIME: i32 = uapi::TIMER_ABSTIME as i32;
const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// The time on `clock`, in nanoseconds.
fn nanoseconds_of(clock: i32) -> Result<u64, Errno> {
    match clock {
        CLOCK_REALTIME | CLOCK_REALTIME_COARSE | CLOCK_TAI => Ok(clock::realtime_ns()),
        CLOCK_PROCESS_CPUTIME_ID => Ok(job::run_time_ns()),
        CLOCK_THREAD_CPUTIME_ID => Ok(current_thread_time()),
        0..=11 => Ok(clock::monotonic_ns()),
        i32::MIN..=-1 => cpu_clock_ns(clock),
        _ => Err(Errno::EINVAL),
    }
}

/// The calling thread's CPU time.
pub fn current_thread_time() -> u64 {
    sched::thread_cpu_time(sched::current_tid()).map_or(0, |(_, time)| time)
}

/// Whether `clock` is a thread's CPU-time clock (which cannot be slept on).
fn is_thread_clock(clock: i32) -> bool {
    clock == CLOCK_THREAD_CPUTIME_ID || (clock < 0 && clock & CPUCLOCK_PER_THREAD != 0)
}

/// A CPU-time clock of a thread or a process named by its id, as pthread_getcpuclockid and
/// clock_getcpuclockid make them (Linux's `~id << 3 | per_thread << 2 | which`; id 0 is the
/// caller): a thread of the caller's process, or any process of the job (its CPU time is the
/// job's); the three kinds (PROF, VIRT, SCHED) read the same. Others EINVAL, as on Linux.
fn cpu_clock_ns(clock: i32) -> Result<u64, Errno> {
    const CPUCLOCK_KIND_MASK: i32 = 3;
    if clock & CPUCLOCK_KIND_MASK == CPUCLOCK_KIND_MASK {
        return Err(Errno::EINVAL);
    }
    let id = !(clock >> 3) as u32 as u64;
    if clock & CPUCLOCK_PER_THREAD != 0 {
        let tid = if id == 0 { sched::current_tid() } else { id };
        match sched::thread_cpu_time(tid) {
            Some((pid, time)) if pid == sched::current_pid() => Ok(time),
            _ => Err(Errno::EINVAL),
        }
    } else if id == 0 || job::process_exists(id) {
        Ok(job::run_time_ns())
    } else {
        Err(Errno::EINVAL)
    }
}

/// The per-thread bit of a CPU-time clock id.
const CPUCLOCK_PER_THREAD: i32 = 4;

/// A `struct timespec` duration in nanoseconds (EINVAL for nanoseconds outside 0..10^9 or
/// negative seconds, as Linux).
pub fn read_duration(address: UserAddr) -> Result<u64, Errno> {
    let mut bytes = [0u8; size_of::<timespec>()];
    user::read_into(address, &mut bytes)?;
    let (seconds, nanoseconds): (i64, i64) = (linux_field!(&bytes, timespec, tv_sec), linux_field!(&bytes, timespec, tv_nsec));
    if !(0..NANOS_PER_SECOND as i64).contains(&nanoseconds) || seconds < 0 {
        return Err(Errno::EINVAL);
    }
    Ok((seconds as u64).saturating_mul(NANOS_PER_SECOND).saturating_add(nanoseconds as u64))
}

/// The monotonic deadline a relative `struct timespec` timeout sets (NULL: none).
pub fn deadline_after(timeout: UserAddr) -> Result<Option<u64>, Errno> {
    match timeout.non_null() {
        None => Ok(None),
        Some(address) => Ok(Some(clock::monotonic_ns().saturating_add(read_duration(address)?))),
    }
}

/// Writes `nanoseconds` as a `struct timespec`.
fn write_timespec(address: UserAddr, nanoseconds: u64) -> Result<(), Errno> {
    let (seconds, nanoseconds) = ((nanoseconds / NANOS_PER_SECOND) as i64, (nanoseconds % NANOS_PER_SECOND) as i64);
    user::write_bytes(address, &linux_struct!(timespec { tv_sec: seconds, tv_nsec: nanoseconds }))
}

/// Sleeps `duration` ns; if a signal ends the sleep first, writes the remaining time to
/// `remaining` (unless NULL) and returns the restart code Linux gives relative sleeps.
fn sleep_relative(duration: u64, remaining: UserAddr) -> SyscallResult {
    let deadline = clock::monotonic_ns().saturating_add(duration);
    if sched::sleep_until(deadline) {
        return Ok(0);
    }
    let left = deadline.saturating_sub(clock::monotonic_ns());
    if left == 0 {
        return Ok(0);
    }
    if let Some(remaining) = remaining.non_null() {
        write_timespec(remaining, left)?;
    }
    Err(Restart::Block.errno())
}

pub fn clock_gettime(clock: i32, time: UserAddr) -> SyscallResult {
    let nanoseconds = nanoseconds_of(clock)?;
    write_timespec(time, nanoseconds)?;
    Ok(0)
}

pub fn clock_getres(clock: i32, resolution: UserAddr) -> SyscallResult {
    nanoseconds_of(clock)?;
    if let Some(resolution) = resolution.non_null() {
        write_timespec(resolution, 1)?;
    }
    Ok(0)
}

/// clock_nanosleep(clock, flags, req, rem): relative or TIMER_ABSTIME sleeps. A signal ends a
/// sleep as on Linux: a relative one writes the remaining time to `rem` and returns EINTR once
/// a handler runs; an absolute one returns EINTR once a handler runs.
pub fn clock_nanosleep(clock: i32, flags: i32, request: UserAddr, remaining: UserAddr) -> SyscallResult {
    if is_thread_clock(clock) {
        return Err(Errno::EINVAL);
    }
    let now_on_clock = nanoseconds_of(clock)?;
    let time = read_duration(request)?;
    if flags & TIMER_ABSTIME == 0 {
        return sleep_relative(time, remaining);
    }
    // An absolute sleep leaves `rem` alone and is restarted only when no handler runs.
    if sched::sleep_until(clock::monotonic_ns().saturating_add(time.saturating_sub(now_on_clock))) {
        Ok(0)
    } else {
        Err(Restart::NoHandler.errno())
    }
}

/// nanosleep(req, rem): the thread waits (other threads of its CPU run meanwhile). A signal
/// it takes ends the sleep: the remaining time goes to `rem` (if given) and the call returns
/// EINTR once a handler runs (never restarted after one, SA_RESTART or not), as on Linux.
pub fn nanosleep(request: UserAddr, remaining: UserAddr) -> SyscallResult {
    let duration = read_duration(request)?;
    sleep_relative(duration, remaining)
}

/// gettimeofday(tv, tz): wall time in microseconds; the time zone is UTC.
pub fn gettimeofday(time: UserAddr, zone: UserAddr) -> SyscallResult {
    let nanoseconds = clock::realtime_ns();
    if let Some(time) = time.non_null() {
        let (seconds, micros) = ((nanoseconds / NANOS_PER_SECOND) as i64, (nanoseconds % NANOS_PER_SECOND / 1000) as i64);
        user::write_bytes(time, &linux_struct!(timeval { tv_sec: seconds, tv_usec: micros }))?;
    }
    if let Some(zone) = zone.non_null() {
        user::write_bytes(zone, &[0; 8])?;
    }
    Ok(0)
}

/// time(tloc): seconds since the epoch.
pub fn time(time: UserAddr) -> SyscallResult {
    let seconds = clock::realtime_ns() / NANOS_PER_SECOND;
    if let Some(time) = time.non_null() {
        user::write_words(time, &[seconds])?;
    }
    Ok(seconds)
}
