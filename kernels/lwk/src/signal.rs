//! Signals of the job: actions (`rt_sigaction`), per-thread masks, pending sets and alternate
//! stacks, and delivery: a handler runs on the thread's stack (or its alternate stack) above
//! an `rt_sigframe` laid out as Linux's (return address = the restorer, `ucontext` with the
//! saved registers, then `siginfo`; above them `fpstate`: the XSAVE area with Linux's magic
//! numbers when the kernel uses XSAVE, else the FXSAVE image), and `rt_sigreturn` puts
//! everything back.
//!
//! When delivery happens: a fault is delivered at once; a signal sent with `kill`, `tkill` or
//! `tgkill`, or one that becomes unblocked, is pending until its thread next leaves the
//! kernel (any system call's return, a tick, a fault). A thread running in user mode on
//! another CPU is sent a tick IPI for it; a thread blocked in an interruptible wait (futex,
//! sleeps, `pause`, `rt_sigsuspend`, `rt_sigtimedwait`, pipes, `wait4`) is woken, and its call
//! returns one of Linux's restart codes, which delivery turns into EINTR or a restart of the
//! call (as Linux's `handle_signal` does). A thread that has not run yet takes it at its
//! first entry to the kernel.
//!
//! Actions and process-directed pending signals are per process (a forked child copies its
//! parent's actions and the forking thread's mask; `execve` resets caught signals to their
//! default action); masks, thread-directed pending signals and alternate stacks per thread.
//! A terminating signal ends its process (`crate::process`); the job's first process ending
//! ends the job.

use crate::arch::fpu;
use crate::arch::sync::SpinLock;
use crate::arch::trap::{self, copy_from_user, copy_words_to_user, TrapFrame, USER_FLAGS};
use crate::linux::uapi;
use crate::linux_consts;
use crate::{process, sched};
use alloc::collections::BTreeMap;

linux_consts!(pub u8: SIGKILL, SIGSEGV, SIGSTOP);
/// Neither blocked, caught nor ignored.
pub const UNCATCHABLE: u64 = bit(SIGKILL) | bit(SIGSTOP);

/// The `sa_flags` that change delivery. The handler always gets (signal, siginfo, ucontext),
/// with or without SA_SIGINFO, and always returns through `sa_restorer` (both libcs pass
/// SA_RESTORER).
pub const SIG_DFL: u64 = 0;
pub const SIG_IGN: u64 = 1;
linux_consts!(pub u64: SA_RESTART, SA_ONSTACK, SA_NODEFER, SA_RESETHAND, SS_ONSTACK, SS_DISABLE);

/// `si_code` values.
pub const SI_USER: i32 = uapi::SI_USER as i32;
pub const SI_TKILL: i32 = -6;
linux_consts!(i32: SI_KERNEL, SEGV_MAPERR, SEGV_ACCERR, FPE_INTDIV, ILL_ILLOPN, BUS_ADRALN, BUS_ADRERR, TRAP_BRKPT);
linux_consts!(u8: SIGBUS);

pub const fn bit(signal: u8) -> u64 {
    1 << (signal - 1)
}

/// What `rt_sigaction` sets, in the kernel's `struct sigaction` order.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Action {
    pub handler: u64,
    pub flags: u64,
    pub restorer: u64,
    pub mask: u64,
}

/// The default action Linux takes for a signal nobody catches.
#[derive(PartialEq, Eq)]
enum DefaultAction {
    Ignore,
    /// The stop signals: there is no job control (nobody could continue the job), so they
    /// are ignored.
    Stop,
    /// Terminate (with a core dump on Linux for some; the status is 128 + signal either way).
    Terminate,
}

fn default_action(signal: u8) -> DefaultAction {
    match signal {
        17 | 18 | 23 | 28 => DefaultAction::Ignore, // SIGCHLD, SIGCONT, SIGURG, SIGWINCH
        19..=22 => DefaultAction::Stop,             // SIGSTOP, SIGTSTP, SIGTTIN, SIGTTOU
        _ => DefaultAction::Terminate,
    }
}

/// What the handler finds in `siginfo`.
#[derive(Clone, Copy)]
struct Info {
    code: i32,
    /// `si_addr` for faults; for sent signals the sender's pid and uid words.
    address: u64,
}

impl Info {
    fn sent(code: i32) -> Info {
        Info { code, address: sched::current_pid() } // si_pid = the taker's process (senders are not recorded), si_uid = 0
    }

    /// The first three words of `siginfo` (si_signo, si_errno = 0, si_code, then si_addr or
    /// si_pid and si_uid); the rest of its 128 bytes is zero.
    fn head_words(&self, signal: u8) -> [u64; 3] {
        [signal as u64, self.code as u32 as u64, self.address]
    }
}

#[derive(Clone, Copy, Default)]
struct AltStack {
    base: u64,
    size: u64,
    enabled: bool,
}

impl AltStack {
    fn contains(&self, stack_pointer: u64) -> bool {
        self.enabled && stack_pointer.wrapping_sub(self.base) < self.size
    }
}

/// Pending signals, and which of them came from `tkill`/`tgkill` rather than `kill` (the
/// only difference in their `siginfo`: every sender is the job, as root). Kept small: the
/// scheduler's threads each have one.
#[derive(Clone, Copy, Default)]
struct PendingSet {
    signals: u64,
    sent_to_thread: u64,
}

impl PendingSet {
    fn add(&mut self, signal: u8, code: i32) {
        self.signals |= bit(signal);
        if code == SI_TKILL {
            self.sent_to_thread |= bit(signal);
        } else {
            self.sent_to_thread &= !bit(signal);
        }
    }

    fn take(&mut self, signal: u8) -> Info {
        self.signals &= !bit(signal);
        Info::sent(if self.sent_to_thread & bit(signal) != 0 { SI_TKILL } else { SI_USER })
    }

    fn drop_signal(&mut self, signal: u8) {
        self.signals &= !bit(signal);
    }
}

#[derive(Clone, Copy)]
struct ThreadSignals {
    pid: u64,
    blocked: u64,
    pending: PendingSet,
    alt_stack: AltStack,
    /// `rt_sigsuspend`'s caller: the mask its handler's frame records (and sigreturn puts
    /// back), or that comes back at once when no handler runs.
    saved_mask: Option<u64>,
    /// `rt_sigtimedwait`'s caller: the signals it waits for, which wake it though blocked.
    awaited: u64,
    /// A system call of this thread returned a restart code (`Restart`): its number, until
    /// the delivery on its way out decides between EINTR and running it again.
    interrupted_call: Option<u64>,
}

impl ThreadSignals {
    fn with_mask(pid: u64, blocked: u64) -> ThreadSignals {
        ThreadSignals {
            pid,
            blocked,
            pending: PendingSet::default(),
            alt_stack: AltStack::default(),
            saved_mask: None,
            awaited: 0,
            interrupted_call: None,
        }
    }

    /// The signals a thread waits for or would take, among `pending`: they end its
    /// interruptible waits.
    fn wanted(&self, pending: u64) -> u64 {
        pending & (!self.blocked | self.awaited)
    }
}
/// Linux's internal results of an interrupted system call (never seen by user code): the
/// delivery on the way out turns each into EINTR or a restart, by Linux's rules.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Restart {
    /// Restarted if the handler has SA_RESTART (or no handler runs), else EINTR.
    Always = 512,
    /// EINTR when a handler runs, else restarted.
    NoHandler = 514,
    /// As `NoHandler`; Linux continues such calls (timed sleeps and waits) with their remaining
    /// time, this kernel runs them again from the start.
    Block = 516,
}

impl Restart {
    pub fn errno(self) -> crate::syscall::Errno {
        crate::syscall::Errno(self as u64)
    }

    fn of_result(result: u64) -> Option<Restart> {
        match result.wrapping_neg() {
            512 => Some(Restart::Always),
            514 => Some(Restart::NoHandler),
            516 => Some(Restart::Block),
            _ => None,
        }
    }
}

/// Whether `errno` is one of the restart codes (`dispatch` then calls `call_interrupted`).
pub fn is_restart_code(errno: u64) -> bool {
    Restart::of_result(errno.wrapping_neg()).is_some()
}

#[derive(Clone, Copy)]
struct ProcessSignals {
    actions: [Action; 64],
    /// Sent to the process while every thread blocked them: the first thread to unblock one
    /// takes it.
    pending: PendingSet,
}

impl ProcessSignals {
    const fn new() -> ProcessSignals {
        ProcessSignals {
            actions: [Action { handler: 0, flags: 0, restorer: 0, mask: 0 }; 64],
            pending: PendingSet { signals: 0, sent_to_thread: 0 },
        }
    }
}

struct Signals {
    processes: BTreeMap<u64, ProcessSignals>,
    /// Live threads by tid (entries come with `clone` and go with `exit`).
    threads: BTreeMap<u64, ThreadSignals>,
}

static SIGNALS: SpinLock<Signals> = SpinLock::new(Signals { processes: BTreeMap::new(), threads: BTreeMap::new() });

impl Signals {
    fn thread(&mut self, tid: u64) -> &mut ThreadSignals {
        self.threads.entry(tid).or_insert_with(|| ThreadSignals::with_mask(sched::current_pid(), 0))
    }

    fn process(&mut self, pid: u64) -> &mut ProcessSignals {
        self.processes.entry(pid).or_insert_with(ProcessSignals::new)
    }

    fn action(&mut self, pid: u64, signal: u8) -> Action {
        self.process(pid).actions[signal as usize - 1]
    }

    /// Whether the signal would be thrown away if it arrived now at process `pid` (ignored,
    /// not blocked).
    fn discards(&mut self, pid: u64, signal: u8) -> bool {
        match self.action(pid, signal).handler {
            SIG_IGN => true,
            SIG_DFL => default_action(signal) != DefaultAction::Terminate,
            _ => false,
        }
    }

    fn process_pending(&self, pid: u64) -> u64 {
        self.processes.get(&pid).map_or(0, |process| process.pending.signals)
    }

    /// Tells the system-call exit path whether any thread has a signal it can take or wait
    /// for, or a call to restart or end with EINTR (or must end: `sched::doom_process`).
    fn update_check_request(&self) {
        let due = self.threads.values().any(|thread| {
            thread.wanted(thread.pending.signals | self.process_pending(thread.pid)) != 0 || thread.interrupted_call.is_some()
        });
        trap::request_signal_check(due || sched::doomed_threads_exist());
    }

    /// The thread of process `pid` the kernel gives a signal sent to the process, as Linux's
    /// `complete_signal`: its main thread (tid = pid) if it does not block it, else the first
    /// thread (in creation order) that does not; a thread waiting for it in
    /// `rt_sigtimedwait` counts as not blocking it.
    fn process_signal_target(&self, pid: u64, signal: u8) -> Option<u64> {
        self.threads.range(pid..).find(|(_, thread)| thread.pid == pid && thread.wanted(bit(signal)) != 0).map(|(&tid, _)| tid)
    }

    /// Takes the lowest pending signal of `set` for thread `tid` (its own first, then its
    /// process's), with its info.
    fn take_pending(&mut self, tid: u64, set: u64) -> Option<(u8, Info)> {
        let pid = self.thread(tid).pid;
        let thread = self.thread(tid);
        let own = thread.pending.signals & set;
        let taken = if own != 0 {
            let signal = own.trailing_zeros() as u8 + 1;
            (signal, thread.pending.take(signal))
        } else {
            let shared = self.process_pending(pid) & set;
            if shared == 0 {
                return None;
            }
            let signal = shared.trailing_zeros() as u8 + 1;
            (signal, self.process(pid).pending.take(signal))
        };
        self.update_check_request();
        Some(taken)
    }

    /// Takes the lowest deliverable (unblocked) signal of thread `tid`, with its info.
    fn take_deliverable(&mut self, tid: u64) -> Option<(u8, Info)> {
        let blocked = self.thread(tid).blocked;
        self.take_pending(tid, !blocked)
    }

    /// As `take_pending`, with the first words of the signal's `siginfo`.
    fn take_from(&mut self, tid: u64, set: u64) -> Option<[u64; 3]> {
        self.take_pending(tid, set).map(|(signal, info)| info.head_words(signal))
    }
}

/// A new job: its first process (whose main thread's tid is its pid) with default actions,
/// nothing blocked or pending.
pub fn reset(main_tid: u64) {
    let mut signals = SIGNALS.lock();
    signals.processes.clear();
    signals.processes.insert(main_tid, ProcessSignals::new());
    signals.threads.clear();
    signals.threads.insert(main_tid, ThreadSignals::with_mask(main_tid, 0));
    trap::request_signal_check(false);
}

/// The first process of a job launched beside running ones: default actions, nothing blocked
/// or pending.
pub fn job_leader_created(main_tid: u64) {
    let mut signals = SIGNALS.lock();
    signals.processes.insert(main_tid, ProcessSignals::new());
    signals.threads.insert(main_tid, ThreadSignals::with_mask(main_tid, 0));
}

/// A thread created by `parent`: it inherits the mask, not the pending signals nor the
/// alternate stack. (The child may already have set its own mask if it ran first.)
pub fn thread_created(parent: u64, child: u64) {
    let mut signals = SIGNALS.lock();
    let parent = *signals.thread(parent);
    signals.threads.entry(child).or_insert_with(|| ThreadSignals::with_mask(parent.pid, parent.blocked));
}

/// Process `pid` forked by thread `parent` (its first thread's tid is `pid`): it copies the
/// actions of the parent's process and the thread's mask and alternate stack; nothing is
/// pending.
pub fn process_created(parent: u64, pid: u64) {
    let mut signals = SIGNALS.lock();
    let parent = *signals.thread(parent);
    let actions = signals.process(parent.pid).actions;
    signals.processes.insert(pid, ProcessSignals { actions, pending: PendingSet::default() });
    signals.threads.insert(pid, ThreadSignals { alt_stack: parent.alt_stack, ..ThreadSignals::with_mask(pid, parent.blocked) });
}

/// Process `pid` ended: its actions and pending signals go.
pub fn process_exited(pid: u64) {
    let mut signals = SIGNALS.lock();
    signals.processes.remove(&pid);
    signals.threads.retain(|_, thread| thread.pid != pid);
    signals.update_check_request();
}

/// `execve` in process `pid`: caught signals go back to their default action (ignored ones
/// stay ignored), and the alternate stack is forgotten; masks and pending signals stay.
pub fn exec_reset(pid: u64) {
    let mut signals = SIGNALS.lock();
    for action in signals.process(pid).actions.iter_mut().filter(|action| action.handler != SIG_IGN) {
        *action = Action::default();
    }
    for thread in signals.threads.values_mut().filter(|thread| thread.pid == pid) {
        thread.alt_stack = AltStack::default();
    }
}

/// Thread `tid` ended: its pending signals die with it.
pub fn thread_exited(tid: u64) {
    let mut signals = SIGNALS.lock();
    signals.threads.remove(&tid);
    signals.update_check_request();
}

pub fn action(signal: u8) -> Action {
    SIGNALS.lock().action(sched::current_pid(), signal)
}

/// Installs `action` for `signal` (a valid, catchable signal); returns the old one. Setting
/// an ignoring action drops that signal where it is pending, as Linux does.
pub fn set_action(signal: u8, action: Action) -> Action {
    let pid = sched::current_pid();
    let mut signals = SIGNALS.lock();
    let old =
        core::mem::replace(&mut signals.process(pid).actions[signal as usize - 1], Action { mask: action.mask & !UNCATCHABLE, ..action });
    if signals.discards(pid, signal) {
        signals.process(pid).pending.drop_signal(signal);
        for thread in signals.threads.values_mut().filter(|thread| thread.pid == pid) {
            thread.pending.drop_signal(signal);
        }
        signals.update_check_request();
    }
    old
}

/// The calling thread's mask, changed by `change` (given the old mask); returns the old mask.
pub fn change_mask(change: impl FnOnce(u64) -> u64) -> u64 {
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let thread = signals.thread(tid);
    let old = thread.blocked;
    thread.blocked = change(old) & !UNCATCHABLE;
    signals.update_check_request();
    old
}

/// Signals pending for the calling thread (its own and the process's) that it blocks, as
/// Linux's `sigpending` reports them (an unblocked one is delivered before the call returns).
pub fn pending() -> u64 {
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let process_pending = signals.process_pending(sched::current_pid());
    let thread = signals.thread(tid);
    (thread.pending.signals | process_pending) & thread.blocked
}

/// Whether thread `tid` has a pending signal it would take or waits for.
fn has_wanted(signals: &mut Signals, tid: u64) -> bool {
    let pid = signals.thread(tid).pid;
    let process_pending = signals.process_pending(pid);
    let thread = signals.thread(tid);
    thread.wanted(thread.pending.signals | process_pending) != 0
}

/// `rt_sigsuspend`: replaces the calling thread's mask with `mask` until a signal it then
/// takes arrives; the old mask comes back when the handler returns (or at once if no handler
/// runs). Returns the restart code the call ends with.
pub fn suspend(mask: u64) -> Restart {
    let already_due = begin_wait_mask(mask);
    // A signal sent from now on interrupts the wait (`sched::interrupt`).
    if !already_due {
        sched::wait_for_signal();
    }
    Restart::NoHandler
}

/// `ppoll`'s, `pselect6`'s and `epoll_pwait`'s mask: `wait(due)` runs with the calling
/// thread blocking `mask`, `due` telling whether a signal the thread takes under it is pending
/// already (the wait must not begin). A signal that ends the wait (a restart code) is handled
/// under the mask, and the old mask comes back when its handler returns, as after
/// `rt_sigsuspend`; otherwise the old mask comes back now.
pub fn wait_under_mask(mask: u64, wait: impl FnOnce(bool) -> crate::syscall::SyscallResult) -> crate::syscall::SyscallResult {
    let result = wait(begin_wait_mask(mask));
    if !result.is_err_and(|errno| is_restart_code(errno.0)) {
        end_wait_mask();
    }
    result
}

fn begin_wait_mask(mask: u64) -> bool {
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let thread = signals.thread(tid);
    thread.saved_mask.get_or_insert(thread.blocked);
    thread.blocked = mask & !UNCATCHABLE;
    signals.update_check_request();
    has_wanted(&mut signals, tid)
}

/// The wait of `begin_wait_mask` ended without a signal: the old mask again.
fn end_wait_mask() {
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let thread = signals.thread(tid);
    if let Some(mask) = thread.saved_mask.take() {
        thread.blocked = mask;
    }
    signals.update_check_request();
}

/// How `rt_sigtimedwait` ended without one of the signals it waits for.
pub enum AwaitError {
    /// The timeout passed (EAGAIN).
    TimedOut,
    /// Another signal, which the thread takes, came first (EINTR).
    Interrupted,
}

/// `rt_sigtimedwait`: takes a pending signal of `set` (the thread's own first, then the
/// process's, lowest first), waiting for one until `deadline` (monotonic ns; `None`: no
/// limit). Returns it with the first words of its `siginfo`.
pub fn await_signal(set: u64, deadline: Option<u64>) -> Result<[u64; 3], AwaitError> {
    let set = set & !UNCATCHABLE;
    let tid = sched::current_tid();
    loop {
        {
            let mut signals = SIGNALS.lock();
            signals.thread(tid).awaited = 0;
            if let Some(taken) = signals.take_from(tid, set) {
                signals.update_check_request();
                return Ok(taken);
            }
            if has_wanted(&mut signals, tid) {
                signals.update_check_request();
                return Err(AwaitError::Interrupted);
            }
            if deadline.is_some_and(|deadline| deadline <= crate::clock::monotonic_ns()) {
                signals.update_check_request();
                return Err(AwaitError::TimedOut);
            }
            // In the same section as the look above: a signal of `set` sent from now on
            // wakes this thread (`send_to` sees it wanted).
            signals.thread(tid).awaited = set;
            signals.update_check_request();
        }
        // Woken by a signal, or the time is up: the look above decides (a wake whose
        // signal went meanwhile waits again). A thread whose process is being killed leaves.
        if sched::wait_interruptibly(deadline) == sched::WaitResult::Interrupted {
            SIGNALS.lock().thread(tid).awaited = 0;
            return Err(AwaitError::Interrupted);
        }
    }
}

#[derive(Debug)]
pub enum SendError {
    NoSuchThread,
}

/// Sends `signal` (1..=64) to thread `tid` of the caller's process, or to the process when
/// `tid` is `None` (`process_signal_target` picks the thread). A terminating default action
/// ends the process at once unless the target blocks the signal (or there is none); a target
/// that can take the signal is interrupted: woken from an interruptible wait, or sent a tick
/// IPI if it runs on another CPU.
pub fn send(tid: Option<u64>, signal: u8, code: i32) -> Result<(), SendError> {
    send_to(sched::current_pid(), tid, signal, code)
}

/// Sends `signal` to process `pid` (any of its threads that does not block it); nothing if
/// there is no such process.
pub fn send_to_process(pid: u64, signal: u8) {
    if SIGNALS.lock().processes.contains_key(&pid) {
        let _ = send_to(pid, None, signal, SI_USER);
    }
}

fn send_to(pid: u64, tid: Option<u64>, signal: u8, code: i32) -> Result<(), SendError> {
    let mut signals = SIGNALS.lock();
    if let Some(tid) = tid {
        if signals.threads.get(&tid).is_none_or(|thread| thread.pid != pid) {
            return Err(SendError::NoSuchThread);
        }
    }
    if signal == SIGKILL {
        drop(signals);
        process::kill(pid, signal);
        return Ok(());
    }
    if signals.discards(pid, signal) {
        return Ok(());
    }
    let target = tid.or_else(|| signals.process_signal_target(pid, signal));
    let taken_by_target = target.is_some_and(|tid| signals.thread(tid).wanted(bit(signal)) != 0);
    // A thread waiting for a blocked signal in rt_sigtimedwait takes it there, handler or not.
    let blocked_by_target = target.is_none_or(|tid| signals.thread(tid).blocked & bit(signal) != 0);
    if signals.action(pid, signal).handler == SIG_DFL && !blocked_by_target {
        drop(signals);
        process::kill(pid, signal);
        return Ok(());
    }
    match target {
        Some(tid) => signals.thread(tid).pending.add(signal, code),
        None => signals.process(pid).pending.add(signal, code),
    }
    signals.update_check_request();
    drop(signals);
    if let (Some(tid), true) = (target, taken_by_target) {
        // After the lock: the target, woken or told, looks at its signals again before it
        // blocks (`sched::interrupt`).
        sched::interrupt(tid);
    }
    Ok(())
}

/// A system call (`number`) of the calling thread returned a restart code: keeps the exit
/// path checking until this thread's delivery has settled it.
#[cold]
pub fn call_interrupted(number: u64) {
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    signals.thread(tid).interrupted_call = Some(number);
    signals.update_check_request();
}

/// Size of a system call instruction (`syscall`, 0f 05): a restarted call returns before it.
const SYSCALL_INSTRUCTION_SIZE: u64 = 2;

/// Settles an interrupted call (`frame` is its caller's context, RAX its result) as Linux's
/// `handle_signal` does: `handler` is the action of the signal whose handler runs now, if one
/// does.
fn settle_interrupted_call(frame: &mut TrapFrame, number: u64, handler: Option<&Action>) {
    let Some(restart) = Restart::of_result(frame.rax) else { return };
    let restarts = match handler {
        None => true,
        Some(action) => restart == Restart::Always && action.flags & SA_RESTART != 0,
    };
    if restarts {
        frame.rax = number;
        frame.rip -= SYSCALL_INSTRUCTION_SIZE;
    } else {
        frame.rax = crate::syscall::Errno::EINTR.0.wrapping_neg();
    }
}

/// Delivers the calling thread's deliverable signals into `frame`, its user context: each
/// handler gets a frame (a later one runs first, as on Linux), and a signal whose default
/// action terminates ends the process. An interrupted system call is settled by the first
/// handler (EINTR or restart) or, when none runs, restarted with the mask `rt_sigsuspend`
/// replaced put back.
pub fn deliver_pending(frame: &mut TrapFrame) {
    let tid = sched::current_tid();
    let pid = sched::current_pid();
    // Passing delivery settles any signal `sched::interrupt` announced to this thread.
    sched::clear_signal_interrupt();
    let mut interrupted_call = SIGNALS.lock().thread(tid).interrupted_call.take();
    loop {
        let mut signals = SIGNALS.lock();
        let Some((signal, info)) = signals.take_deliverable(tid) else {
            if let Some(number) = interrupted_call {
                settle_interrupted_call(frame, number, None);
                let thread = signals.thread(tid);
                if let Some(mask) = thread.saved_mask.take() {
                    thread.blocked = mask;
                }
                signals.update_check_request();
            }
            return;
        };
        let action = signals.action(pid, signal);
        match action.handler {
            SIG_IGN => continue,
            SIG_DFL => {
                if default_action(signal) != DefaultAction::Terminate {
                    continue;
                }
                drop(signals);
                process::die_of_signal_here(signal);
            }
            _ => {
                if let Some(number) = interrupted_call.take() {
                    settle_interrupted_call(frame, number, Some(&action));
                }
                if enter_handler(&mut signals, tid, frame, signal, info, action, (0, 0)).is_err() {
                    drop(signals);
                    process::die_of_signal_here(SIGSEGV);
                }
            }
        }
    }
}

/// A user-mode fault that raises `signal`: returns true when a handler now takes it in
/// `frame`, false when it ends the job (no handler, or the signal is blocked or ignored,
/// which Linux overrides for faults).
pub fn deliver_fault(frame: &mut TrapFrame, signal: u8, fault_address: u64) -> bool {
    let (code, address) = match frame.vector {
        // A page whose memory went away (XPMEM's, a truncated file's), as Linux says it.
        14 if signal == SIGBUS => (BUS_ADRERR, fault_address),
        14 if frame.error_code & 1 == 0 => (SEGV_MAPERR, fault_address),
        14 => (SEGV_ACCERR, fault_address),
        0 => (FPE_INTDIV, frame.rip),
        6 => (ILL_ILLOPN, frame.rip),
        17 => (BUS_ADRALN, fault_address),
        1 | 3 => (TRAP_BRKPT, 0),
        16 | 19 => (0, frame.rip),
        _ => (SI_KERNEL, 0),
    };
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let action = signals.action(sched::current_pid(), signal);
    if action.handler == SIG_DFL || action.handler == SIG_IGN || signals.thread(tid).blocked & bit(signal) != 0 {
        return false;
    }
    let fault = (frame.error_code, if frame.vector == 14 { fault_address } else { 0 });
    enter_handler(&mut signals, tid, frame, signal, Info { code, address }, action, fault).is_ok()
}

/// Byte offsets in the `rt_sigframe` (Linux x86-64): the return address, `ucontext` (flags,
/// link, `stack_t`, `sigcontext`, the 64-bit mask), then `siginfo`.
const UCONTEXT: usize = 8;
const UC_STACK: usize = UCONTEXT + 16;
const MCONTEXT: usize = UCONTEXT + 40;
const UC_SIGMASK: usize = MCONTEXT + 256;
const UCONTEXT_SIZE: usize = UC_SIGMASK + 8 - UCONTEXT;
const SIGINFO: usize = UCONTEXT + UCONTEXT_SIZE;
const FRAME_SIZE: usize = SIGINFO + 128;
/// Words of `sigcontext`: the general registers in this order, then RIP, RFLAGS, the segment
/// word, error code, trap number, old mask, CR2, the `fpstate` pointer.
const REGISTER_WORDS: usize = 16;
const FPSTATE_WORD: usize = 23;
/// `uc_flags`, as Linux sets them on x86-64: `fpstate` is an XSAVE area (with XSAVE), the
/// `sigcontext` holds SS, and sigreturn restores SS as saved.
const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;
/// Below the interrupted stack pointer: the red zone user code may be using.
const RED_ZONE: u64 = 128;

fn registers_of(frame: &TrapFrame) -> [u64; REGISTER_WORDS] {
    [
        frame.r8, frame.r9, frame.r10, frame.r11, frame.r12, frame.r13, frame.r14, frame.r15, frame.rdi, frame.rsi, frame.rbp, frame.rbx,
        frame.rdx, frame.rax, frame.rcx, frame.rsp,
    ]
}

fn set_registers(frame: &mut TrapFrame, words: &[u64]) {
    let registers = [
        &mut frame.r8,
        &mut frame.r9,
        &mut frame.r10,
        &mut frame.r11,
        &mut frame.r12,
        &mut frame.r13,
        &mut frame.r14,
        &mut frame.r15,
        &mut frame.rdi,
        &mut frame.rsi,
        &mut frame.rbp,
        &mut frame.rbx,
        &mut frame.rdx,
        &mut frame.rax,
        &mut frame.rcx,
        &mut frame.rsp,
    ];
    for (register, &value) in registers.into_iter().zip(words) {
        *register = value;
    }
}

struct FrameFault;

/// Builds the handler's frame on the thread's stack and points `frame` at the handler, with
/// its mask in force. `fault` is the error code and CR2 for the `sigcontext` of a fault.
fn enter_handler(
    signals: &mut Signals,
    tid: u64,
    frame: &mut TrapFrame,
    signal: u8,
    info: Info,
    action: Action,
    fault: (u64, u64),
) -> Result<(), FrameFault> {
    let thread = signals.thread(tid);
    let alt_stack = thread.alt_stack;
    let on_alt_stack = alt_stack.contains(frame.rsp);
    let mut stack_pointer = frame.rsp - RED_ZONE;
    if action.flags & SA_ONSTACK != 0 && alt_stack.enabled && !on_alt_stack {
        stack_pointer = alt_stack.base + alt_stack.size;
    }
    let fpstate = (stack_pointer - fpu::signal_frame_size()) & !63;
    let frame_address = ((fpstate - FRAME_SIZE as u64) & !15) - 8;

    let mut words = [0u64; FRAME_SIZE / 8];
    words[0] = action.restorer;
    words[UCONTEXT / 8] = if fpu::signal_frame_has_xstate() { UC_FP_XSTATE } else { 0 } | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS;
    let stack_flags = if !alt_stack.enabled {
        SS_DISABLE
    } else if on_alt_stack {
        SS_ONSTACK
    } else {
        0
    };
    words[UC_STACK / 8..UC_STACK / 8 + 3].copy_from_slice(&[alt_stack.base, stack_flags, alt_stack.size]);
    let context = MCONTEXT / 8;
    words[context..context + REGISTER_WORDS].copy_from_slice(&registers_of(frame));
    let segments = (frame.cs & 0xffff) | (frame.ss & 0xffff) << 48;
    // The mask sigreturn restores: the one rt_sigsuspend replaced, if the thread is in it.
    let restored_mask = thread.saved_mask.unwrap_or(thread.blocked);
    words[context + REGISTER_WORDS..context + FPSTATE_WORD + 1].copy_from_slice(&[
        frame.rip,
        frame.rflags,
        segments,
        fault.0,
        frame.vector.min(255),
        restored_mask,
        fault.1,
        fpstate,
    ]);
    words[UC_SIGMASK / 8] = restored_mask;
    words[SIGINFO / 8..SIGINFO / 8 + 3].copy_from_slice(&info.head_words(signal));

    copy_words_to_user(frame_address, &words).map_err(|_| FrameFault)?;
    // Last: the handler starts with the initial vector state once its frame holds the old one.
    fpu::save_to_signal_frame(fpstate).map_err(|_| FrameFault)?;

    thread.saved_mask = None;
    if action.flags & SA_NODEFER == 0 {
        thread.blocked |= bit(signal);
    }
    thread.blocked = (thread.blocked | action.mask) & !UNCATCHABLE;
    if action.flags & SA_RESETHAND != 0 {
        signals.process(sched::current_pid()).actions[signal as usize - 1] = Action::default();
    }
    signals.update_check_request();

    frame.rdi = signal as u64;
    frame.rsi = frame_address + SIGINFO as u64;
    frame.rdx = frame_address + UCONTEXT as u64;
    frame.rax = 0;
    frame.rip = action.handler;
    frame.rsp = frame_address;
    // The handler starts with DF and TF clear, as after a call from compiled code.
    frame.rflags &= !(1 << 10 | 1 << 8);
    Ok(())
}

/// `rt_sigreturn`: the handler returned (its `ret` popped the return address, so RSP points
/// at the `ucontext`). Restores the registers, the vector registers, the mask and the
/// alternate stack; returns RAX as it was. A frame that cannot be read kills the job with
/// SIGSEGV, as on Linux.
pub fn return_from_handler(frame: &mut TrapFrame) -> u64 {
    let context_address = frame.rsp;
    let mut bytes = [0u8; UCONTEXT_SIZE];
    if copy_from_user(&mut bytes, context_address).is_err() {
        process::die_of_signal_here(SIGSEGV);
    }
    let word = |offset: usize| u64::from_le_bytes(bytes[offset - UCONTEXT..offset - UCONTEXT + 8].try_into().unwrap());
    let context = MCONTEXT;
    let registers: [u64; REGISTER_WORDS] = core::array::from_fn(|index| word(context + 8 * index));
    set_registers(frame, &registers);
    frame.rip = word(context + 8 * REGISTER_WORDS);
    frame.rflags = (word(context + 8 * (REGISTER_WORDS + 1)) & USER_FLAGS) | 0x202;
    let fpstate = word(context + 8 * FPSTATE_WORD);
    if fpstate == 0 {
        fpu::load_initial_state();
    } else if fpu::restore_from_signal_frame(fpstate).is_err() {
        process::die_of_signal_here(SIGSEGV);
    }
    let (stack_base, stack_flags, stack_size) = (word(UC_STACK), word(UC_STACK + 8), word(UC_STACK + 16));
    let mask = word(UC_SIGMASK);
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let thread = signals.thread(tid);
    thread.blocked = mask & !UNCATCHABLE;
    // As Linux's restore_altstack: the handler may have changed `uc_stack`; errors are
    // ignored (the interrupted code may still be on the stack it names).
    if !thread.alt_stack.contains(frame.rsp) {
        thread.alt_stack = AltStack { base: stack_base, size: stack_size, enabled: stack_flags & SS_DISABLE == 0 && stack_size != 0 };
    }
    signals.update_check_request();
    frame.rax
}

pub enum AltStackError {
    /// Changing the stack the thread is running on (EPERM).
    OnStack,
    /// Smaller than MINSIGSTKSZ (ENOMEM).
    TooSmall,
    /// Unknown flags (EINVAL).
    BadFlags,
}

/// `sigaltstack`: the calling thread's alternate stack as (base, flags, size), replaced by
/// `new` when given; `stack_pointer` is the caller's.
pub fn alt_stack(new: Option<(u64, u64, u64)>, stack_pointer: u64) -> Result<(u64, u64, u64), AltStackError> {
    const MINSIGSTKSZ: u64 = 2048;
    const SS_AUTODISARM: u64 = 1 << 31;
    let tid = sched::current_tid();
    let mut signals = SIGNALS.lock();
    let thread = signals.thread(tid);
    let current = thread.alt_stack;
    let on_stack = current.contains(stack_pointer);
    let flags = if on_stack {
        SS_ONSTACK
    } else if !current.enabled {
        SS_DISABLE
    } else {
        0
    };
    let old = (if current.enabled { current.base } else { 0 }, flags, if current.enabled { current.size } else { 0 });
    if let Some((base, flags, size)) = new {
        if on_stack {
            return Err(AltStackError::OnStack);
        }
        match flags & !SS_AUTODISARM {
            SS_DISABLE => thread.alt_stack = AltStack::default(),
            0 if size < MINSIGSTKSZ => return Err(AltStackError::TooSmall),
            0 => thread.alt_stack = AltStack { base, size, enabled: true },
            _ => return Err(AltStackError::BadFlags),
        }
    }
    Ok(old)
}
