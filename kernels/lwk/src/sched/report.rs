//! Where a killed job's threads were: no debugger reaches an enclave, so when the host kills a
//! job (a launcher's timeout, `clowder run` killed) the kernel logs each of its threads' state,
//! CPU time and user context to the enclave's log (`clowder logs`). A thread in the kernel
//! entered it from user mode through a trap, whose hardware frame (RIP, RSP) tops its kernel stack; the
//! words of its user stack that look like return addresses follow, for mapping with the
//! program's and its libraries' symbols (their load addresses: `LD_DEBUG=files`).

use super::{State, LOADED_ASPACE, SCHEDULER};
use crate::arch::tables;
use crate::arch::trap;
use crate::console::log;
use crate::syscall::user::{self, UserAddr};
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use core::sync::atomic::Ordering;

/// User-stack words scanned per thread, and return-address candidates logged at most.
const STACK_WORDS: usize = 64;
const CANDIDATES: usize = 16;

/// Where code is mapped in a job: the program at Linux's default base for a PIE, shared
/// libraries and the loader below the stack (this kernel's `mmap` hands out addresses there).
fn looks_like_code(word: u64) -> bool {
    (0x5555_5555_4000..0x5556_0000_0000).contains(&word) || (0x7f00_0000_0000..0x7fff_f000_0000).contains(&word)
}

/// Logs job `job`'s threads: state, user RIP and RSP, and return-address candidates from the
/// user stack where this CPU has the thread's address space loaded.
pub fn log_job_threads(job: u32) {
    let cpu = tables::current_cpu();
    let loaded = LOADED_ASPACE[cpu].load(Ordering::Relaxed);
    let threads: Vec<(u64, String, u64, u64, u64, bool)> = {
        let guard = SCHEDULER.lock();
        let Some(scheduler) = guard.as_ref() else { return };
        scheduler
            .threads
            .iter()
            .filter(|(_, thread)| thread.job == job)
            .map(|(&tid, thread)| {
                let running = scheduler.cpus[thread.cpu].current == Some(tid);
                let state = match thread.state {
                    State::Runnable if running => alloc::format!("running on cpu {}", thread.cpu),
                    State::Runnable => alloc::format!("runnable on cpu {}", thread.cpu),
                    State::Waiting { address, deadline, .. } => {
                        alloc::format!("waiting on {address:#x} (deadline {deadline:?} ns) on cpu {}", thread.cpu)
                    }
                };
                let (rip, rsp) = trap::user_context(thread.stack_top);
                (tid, state, thread.cpu_time_ns / 1_000_000, rip, rsp, thread.aspace.0 == loaded)
            })
            .collect()
    };
    for (tid, state, cpu_ms, rip, rsp, readable) in threads {
        let mut line = alloc::format!("job {job} thread {tid}: {state}, {cpu_ms} ms CPU time, user rip {rip:#x} rsp {rsp:#x}");
        if readable {
            if let Ok(words) = user::read_bytes(UserAddr(rsp), STACK_WORDS * 8) {
                let candidates = words
                    .chunks_exact(8)
                    .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")))
                    .filter(|&word| looks_like_code(word))
                    .take(CANDIDATES);
                let _ = write!(line, "; stack:");
                for word in candidates {
                    let _ = write!(line, " {word:#x}");
                }
            }
        }
        log!("{line}");
    }
}
