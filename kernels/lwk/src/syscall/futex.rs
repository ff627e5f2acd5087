//! futex(uaddr, op, val, timeout/val2, uaddr2, val3): WAIT, WAIT_BITSET, WAKE, WAKE_BITSET,
//! REQUEUE and CMP_REQUEUE, private or shared (one process: the same thing), timeouts on the
//! monotonic or (FUTEX_CLOCK_REALTIME) real-time clock; a signal interrupts the waits. PI and
//! WAKE_OP futexes: ENOSYS.

use super::{user, Call, Errno, SyscallResult};
use crate::arch::trap::copy_from_user;
use crate::clock;
use crate::sched::{self, WaitResult};
use crate::signal::Restart;

const FUTEX_WAIT: u64 = 0;
const FUTEX_WAKE: u64 = 1;
const FUTEX_REQUEUE: u64 = 3;
const FUTEX_CMP_REQUEUE: u64 = 4;
const FUTEX_WAIT_BITSET: u64 = 9;
const FUTEX_WAKE_BITSET: u64 = 10;
const FUTEX_PRIVATE_FLAG: u64 = 128;
const FUTEX_CLOCK_REALTIME: u64 = 256;
const BITSET_MATCH_ANY: u32 = u32::MAX;

fn read_word(address: u64) -> Result<u32, Errno> {
    let mut bytes = [0u8; 4];
    copy_from_user(&mut bytes, address).map_err(|_| Errno::EFAULT)?;
    Ok(u32::from_le_bytes(bytes))
}

/// A `struct timespec` at `address` in nanoseconds.
fn read_timespec(address: u64) -> Result<u64, Errno> {
    let [seconds, nanoseconds] = user::read_words::<2>(address)?;
    if nanoseconds >= 1_000_000_000 || (seconds as i64) < 0 {
        return Err(Errno::EINVAL);
    }
    Ok(seconds.saturating_mul(1_000_000_000).saturating_add(nanoseconds))
}

/// A signal ends the wait as on Linux: restarted after a handler installed with SA_RESTART
/// when there is no timeout, else EINTR once a handler runs (`crate::signal::Restart`).
fn wait(address: u64, expected: u32, bitset: u32, deadline: Option<u64>) -> SyscallResult {
    read_word(address)?;
    match sched::wait(address, bitset, deadline, || read_word(address) == Ok(expected)) {
        None => Err(Errno::EAGAIN),
        Some(WaitResult::Woken) => Ok(0),
        Some(WaitResult::TimedOut) => Err(Errno::ETIMEDOUT),
        // (A thread whose process is being killed ends on its way out, whatever it returns.)
        Some(WaitResult::Signal | WaitResult::Interrupted) if deadline.is_none() => Err(Restart::Always.errno()),
        Some(WaitResult::Signal | WaitResult::Interrupted) => Err(Restart::Block.errno()),
    }
}

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [address, operation, value, timeout, address2, value3] = call.args;
    if address % 4 != 0 {
        return Err(Errno::EINVAL);
    }
    let realtime = operation & FUTEX_CLOCK_REALTIME != 0;
    match operation & !(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME) {
        FUTEX_WAIT => {
            let deadline = match timeout {
                0 => None,
                relative => Some(clock::monotonic_ns().saturating_add(read_timespec(relative)?)),
            };
            wait(address, value as u32, BITSET_MATCH_ANY, deadline)
        }
        FUTEX_WAIT_BITSET => {
            if value3 as u32 == 0 {
                return Err(Errno::EINVAL);
            }
            let deadline = match timeout {
                0 => None,
                absolute => {
                    let absolute = read_timespec(absolute)?;
                    // Deadlines are kept on the monotonic clock.
                    Some(if realtime { absolute.saturating_sub(clock::realtime_ns() - clock::monotonic_ns()) } else { absolute })
                }
            };
            wait(address, value as u32, value3 as u32, deadline)
        }
        FUTEX_WAKE => Ok(sched::wake(address, value, BITSET_MATCH_ANY)),
        FUTEX_WAKE_BITSET => {
            if value3 as u32 == 0 {
                return Err(Errno::EINVAL);
            }
            Ok(sched::wake(address, value, value3 as u32))
        }
        FUTEX_REQUEUE => Ok(sched::requeue(address, address2, value, timeout)),
        FUTEX_CMP_REQUEUE => {
            if read_word(address)? != value3 as u32 {
                return Err(Errno::EAGAIN);
            }
            Ok(sched::requeue(address, address2, value, timeout))
        }
        _ => Err(Errno::ENOSYS),
    }
}
