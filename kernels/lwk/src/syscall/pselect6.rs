//! pselect6(nfds, readfds, writefds, exceptfds, timeout, sigmask): `select` with a
//! `struct timespec` timeout (NULL: no limit; nanoseconds outside 0..10^9 or negative seconds
//! EINVAL; the time left written back, as Linux's system call does: libc hides it) and, in the
//! sixth argument, the address of `{ const sigset_t *mask; size_t size; }` (NULL, or a NULL
//! mask: none; a size other than 8 EINVAL): the signal mask it waits under, as `ppoll`'s.

use super::clock_nanosleep::read_duration;
use super::select::{select, TimeFormat};
use super::{user, Call, Errno, SyscallResult};
use crate::{clock, signal};

pub fn call(call: &mut Call<'_>) -> SyscallResult {
    let [nfds, read, write, except, timeout, mask_argument] = call.args;
    let deadline = match timeout {
        0 => None,
        address => Some(clock::monotonic_ns().saturating_add(read_duration(address)?)),
    };
    let mask = match mask_argument {
        0 => 0,
        address => {
            let [mask, size] = user::read_words::<2>(address)?;
            if mask != 0 && size != 8 {
                return Err(Errno::EINVAL);
            }
            mask
        }
    };
    let sets = [read, write, except];
    if mask == 0 {
        return select(nfds, sets, deadline, (timeout, TimeFormat::Nano), false);
    }
    let [mask] = user::read_words::<1>(mask)?;
    signal::wait_under_mask(mask, |due| select(nfds, sets, deadline, (timeout, TimeFormat::Nano), due))
}
