//! futex(uaddr, op, val, timeout/val2, uaddr2, val3): WAIT, WAIT_BITSET, WAKE, WAKE_BITSET,
//! REQUEUE and CMP_REQUEUE, private or shared (one process: the same thing), timeouts on the
//! monotonic or (FUTEX_CLOCK_REALTIME) real-time clock; a signal interrupts the waits. PI and
//! WAKE_OP futexes: ENOSYS.

use super::time::{deadline_after, read_duration};
use super::{user, Errno, SyscallResult, UserAddr};
use crate::clock;
use crate::linux_consts;
use crate::sched::{self, WaitResult};
use crate::signal::Restart;

linux_consts!(i32: FUTEX_WAIT, FUTEX_WAKE, FUTEX_REQUEUE, FUTEX_CMP_REQUEUE, FUTEX_WAIT_BITSET, FUTEX_WAKE_BITSET, FUTEX_PRIVATE_FLAG, FUTEX_CLOCK_REALTIME);
const BITSET_MATCH_ANY: u32 = u32::MAX;

fn read_word(address: UserAddr) -> Result<u32, Errno> {
    let mut bytes = [0u8; 4];
    user::read_into(address, &mut bytes)?;
    Ok(u32::from_le_bytes(bytes))
}

/// A signal ends the wait as on Linux: restarted after a handler installed with SA_RESTART
/// when there is no timeout, else EINTR once a handler runs (`crate::signal::Restart`).
fn wait(address: UserAddr, expected: u32, bitset: u32, deadline: Option<u64>) -> SyscallResult {
    read_word(address)?;
    match sched::wait(address.0, bitset, deadline, || read_word(address) == Ok(expected)) {
        None => Err(Errno::EAGAIN),
        Some(WaitResult::Woken) => Ok(0),
        Some(WaitResult::TimedOut) => Err(Errno::ETIMEDOUT),
        // (A thread whose process is being killed ends on its way out, whatever it returns.)
        Some(WaitResult::Signal | WaitResult::Interrupted) if deadline.is_none() => Err(Restart::Always.errno()),
        Some(WaitResult::Signal | WaitResult::Interrupted) => Err(Restart::Block.errno()),
    }
}

/// `timeout` is a `struct timespec *` for the waits and the count to requeue (val2) for the
/// requeues, as Linux reads the fourth argument; `address` is also the wait queue's key.
pub fn futex(address: UserAddr, operation: i32, value: u32, timeout: u64, address2: UserAddr, value3: u32) -> SyscallResult {
    if !address.0.is_multiple_of(4) {
        return Err(Errno::EINVAL);
    }
    let realtime = operation & FUTEX_CLOCK_REALTIME != 0;
    match operation & !(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME) {
        FUTEX_WAIT => wait(address, value, BITSET_MATCH_ANY, deadline_after(UserAddr(timeout))?),
        FUTEX_WAIT_BITSET => {
            if value3 == 0 {
                return Err(Errno::EINVAL);
            }
            let deadline = match UserAddr(timeout).non_null() {
                None => None,
                Some(absolute) => {
                    let absolute = read_duration(absolute)?;
                    // Deadlines are kept on the monotonic clock.
                    Some(if realtime { absolute.saturating_sub(clock::realtime_ns() - clock::monotonic_ns()) } else { absolute })
                }
            };
            wait(address, value, value3, deadline)
        }
        FUTEX_WAKE => Ok(sched::wake(address.0, value as u64, BITSET_MATCH_ANY)),
        FUTEX_WAKE_BITSET => {
            if value3 == 0 {
                return Err(Errno::EINVAL);
            }
            Ok(sched::wake(address.0, value as u64, value3))
        }
        FUTEX_REQUEUE => Ok(sched::requeue(address.0, address2.0, value as u64, timeout)),
        FUTEX_CMP_REQUEUE => {
            if read_word(address)? != value3 {
                return Err(Errno::EAGAIN);
            }
            Ok(sched::requeue(address.0, address2.0, value as u64, timeout))
        }
        _ => Err(Errno::ENOSYS),
    }
}
