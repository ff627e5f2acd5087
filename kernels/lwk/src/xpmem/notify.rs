//! XEMEM's signals and notification descriptors (`xemem_signal`, `xemem_notify_fd`).

use super::*;

/// XEMEM's signals: the owner's side. Each segment that was signalled or asked for a
/// notification descriptor has one counter (eventfd semantics: a read takes the count and
/// leaves 0; it waits, or fails with EAGAIN, while the count is 0); every descriptor of the
/// segment shares it.
pub struct Notifier {
    pending: AtomicU64,
    /// Signals received so far (an edge-triggered epoll reports the descriptor again after each).
    signals: AtomicU64,
    /// The process that owns the segment (its notifier goes when it ends).
    pub(super) owner: u64,
}

impl Notifier {
    /// The kernel key its readers wait on: its own address.
    fn key(&self) -> u64 {
        self as *const Notifier as u64
    }

    /// Whether a read would take a count now (`poll`).
    pub fn is_readable(&self) -> bool {
        self.pending.load(Ordering::Acquire) != 0
    }

    /// Signals received so far (epoll's edge-triggered mode).
    pub fn signals(&self) -> u64 {
        self.signals.load(Ordering::Acquire)
    }
}

/// Notifiers by segment (of any process of the job).
pub(super) static NOTIFIERS: SpinLock<BTreeMap<SegmentId, Arc<Notifier>>> = SpinLock::new(BTreeMap::new());

fn notifier(owner: u64, segment: SegmentId) -> Arc<Notifier> {
    NOTIFIERS
        .lock()
        .entry(segment)
        .or_insert_with(|| Arc::new(Notifier { pending: AtomicU64::new(0), signals: AtomicU64::new(0), owner }))
        .clone()
}

/// An attacher signalled `segment`, owned by process `owner` of the job (checked by the name
/// server: the local one, or the host's, whose `Notify` reaches the node). Wakes the readers.
pub fn notify(owner: u64, segment: SegmentId) {
    if !job::is_loaded() || !job::process_exists(owner) {
        return;
    }
    let notifier = notifier(owner, segment);
    notifier.pending.fetch_add(1, Ordering::AcqRel);
    notifier.signals.fetch_add(1, Ordering::AcqRel);
    crate::sched::wake_kernel_key(notifier.key());
}

/// `xemem_signal(apid)`: the caller's permit `apid` wakes the segment's owner.
pub fn signal(raw: i64) -> Result<(), Error> {
    let pid = caller();
    let apid = access_id(raw)?;
    let global = with_device(|device| device.global_permits.get(&apid.raw()).copied());
    match global {
        Some(permit) if permit.pid != pid => Err(Error::Denied),
        Some(_) => host_link::direct(Request::Signal { process: pid, access: apid }).map(drop),
        None => {
            let (owner, segment) = with_device(|device| device.names.signal(principal(pid), apid))?;
            notify(owner.process, segment);
            Ok(())
        }
    }
}

/// `xemem_notify_fd(segid)`: the notifier of the caller's own segment `raw` (ENOENT for any
/// other, as the host's library, which knows only its own).
pub fn notifier_of(raw: i64) -> Result<Arc<Notifier>, Error> {
    let pid = caller();
    let id = segment_id(raw)?;
    let owned = with_device(|device| match device.own_segments.get(&id) {
        Some(&(owner, _, _)) => owner == pid,
        None => device.names.segment(id).is_some_and(|segment| segment.owner == principal(pid)),
    });
    if !owned {
        return Err(Error::NotFound);
    }
    Ok(notifier(pid, id))
}

/// `read` of a notification descriptor: 8 bytes, the count since the last read. In a
/// persistent enclave the host's `Notify` may end the wait, so it never counts as part of a
/// dead-lock there (`sched::wait_for_host`; it once slept in 100 ms slices for that).
pub fn read_notifier(notifier: &Notifier, buffer: UserAddr, len: u64, non_blocking: bool) -> SyscallResult {
    if len < 8 {
        return Err(Errno::EINVAL);
    }
    let mut interrupted = false;
    loop {
        let count = notifier.pending.swap(0, Ordering::AcqRel);
        if count != 0 {
            if let Err(errno) = user::write_bytes(buffer, &count.to_le_bytes()) {
                notifier.pending.fetch_add(count, Ordering::AcqRel);
                return Err(errno);
            }
            return Ok(8);
        }
        if non_blocking {
            return Err(Errno::EAGAIN);
        }
        // A signal ends the wait as on Linux (EINTR, or restarted under SA_RESTART), once a
        // last look has found nothing.
        if interrupted {
            return Err(Restart::Always.errno());
        }
        let nothing = || notifier.pending.load(Ordering::Acquire) == 0;
        let result = match crate::enclave::is_active() {
            true => crate::sched::wait_for_host(notifier.key(), None, nothing),
            false => crate::sched::wait(notifier.key(), u32::MAX, None, nothing),
        };
        interrupted = matches!(result, Some(WaitResult::Interrupted | WaitResult::Signal));
    }
}
