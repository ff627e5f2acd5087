//! XEMEM between daemons: a second clowderd acting as a sub-manager (`--xemem-upstream PATH`)
//! links to the daemon whose socket PATH is, and that link is one more link of both daemons'
//! `xemem::node::Node`s (docs/xemem.md, "Across daemons"). The sub-manager's node is not the
//! name server: it finds it by the protocol's discovery (`PingNameServer` on the link), gets
//! its enclave id from it, and its host processes' and enclaves' requests route through it.
//!
//! Transport: a Unix SOCK_SEQPACKET connection, one encoded `xemem::wire::Message` per packet.
//! Both daemons run on the same host, so memory crosses the link as files, never as copies:
//! an `Attached` answer's frame runs are sent as runs of the files they live in, passed with
//! SCM_RIGHTS. On the link a memory run's first frame is `fd index << FD_SHIFT | page in that
//! file`. The receiver checks everything (the descriptors are regular files, every run lies
//! inside its file, at most `MAX_FDS` descriptors, the usual strict decoding) and renumbers
//! each run into its own frame space for that link ([`PeerFrames`]): a table of (file,
//! offset) ranges that the daemon's attach paths turn back into file ranges, exactly as they
//! turn an enclave's frames into ranges of its RAM memfd. A malformed `Attached` becomes a
//! `Failed` for the request it answers; a malformed request gets the node's `Failed`; nothing
//! a peer sends is acted on unchecked, and neither daemon stops for it.
//!
//! A sub-manager serves its own host processes' segments when the name server sends `Serve`:
//! its broker fetches the runs from the owner's library (`Broker::serve_for_name_server`).
//!
//! When the connection ends, the port drops: the node takes the link down (the name server
//! forgets every enclave behind it, with their segments and permits) and bridged permits are
//! revoked as for an enclave that went away. A sub-manager whose upstream link ends rejoins
//! (`Node::rejoin`: a new id, its old segments and permits gone), unlinks the daemons below
//! it, and links again with backoff ([`connect_upstream`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use xemem::ids::NAME_SERVER_ENCLAVE;
use xemem::wire::{AttachedPart, Body, FrameRun, Message};
use xemem::Error;

use super::{GuestRegions, XememLinks, XememPort};
use crate::guest_ram::GuestRam;
use crate::machine::{RegionAccess, SharedRegion};

/// A memory run's first frame on the link: the descriptor's index above this bit, the page
/// within the file below it (files up to 1 TiB; 250 descriptors stay below 2^40 frames).
pub const FD_SHIFT: u32 = 28;
const PAGE_MASK: u64 = (1 << FD_SHIFT) - 1;
/// At most this many descriptors travel with one packet (the broker's limit, below the
/// kernel's SCM_MAX_FD).
pub const MAX_FDS: usize = crate::sys::MAX_FDS;
/// How many file ranges one link's frame table keeps (oldest first out).
const MAX_FRAME_ENTRIES: usize = 16384;
/// Where renumbered frames start (anything non-zero and below 2^40 would do).
const FIRST_FRAME: u64 = 1 << 20;
/// How often the link's node is ticked when nothing arrives.
const ROUND: Duration = Duration::from_millis(20);

/// The memory behind a link's frame numbers: an enclave's RAM memfd, or the files a peer
/// daemon passed. Every range asked for must lie inside it.
pub trait FrameSource: Send + Sync {
    /// The file and byte offset behind `[gpa, gpa + len)`; EINVAL if any of it is not there.
    fn file_range(&self, gpa: u64, len: u64) -> Result<(File, u64), Error>;
    /// The smallest piece of the files behind the frames that can be mapped elsewhere: 4 KiB,
    /// or 2 MiB for an enclave whose RAM is on hugetlb pages.
    fn mappable_unit(&self) -> u64 {
        xemem::PAGE_SIZE
    }
    /// Whether these are a daemon link's frames (which leave this daemon only as files).
    fn is_peer(&self) -> bool {
        false
    }
    /// The owner kernel's count of page-table changes, where it publishes one: frames it
    /// resolved earlier are still mapped the same way while the count has not moved.
    fn mapping_changes(&self) -> Option<u64> {
        None
    }
    /// Where that count lies, to be mapped read-only into attaching enclaves.
    fn mapping_changes_block(&self) -> Option<CountBlock> {
        None
    }
}

impl FrameSource for GuestRam {
    fn file_range(&self, gpa: u64, len: u64) -> Result<(File, u64), Error> {
        let (file, offset) = GuestRam::file_range(self, gpa, len).map_err(|_| Error::Invalid)?;
        Ok((file.try_clone().map_err(|_| Error::Exhausted)?, offset))
    }
    fn mapping_changes(&self) -> Option<u64> {
        GuestRam::mapping_changes(self)
    }
    fn mappable_unit(&self) -> u64 {
        GuestRam::mappable_unit(self)
    }
    fn mapping_changes_block(&self) -> Option<CountBlock> {
        let (file, offset, len, word) = GuestRam::mapping_counter_piece(self)?;
        Some(CountBlock { file: file.try_clone().ok()?, offset, len, word })
    }
}

/// The piece of an owner enclave's RAM memfd that holds its kernel's count of page-table
/// changes (which the kernel keeps alone in the smallest piece its RAM can be shared in):
/// `len` bytes from `offset`, the count `word` bytes in.
pub struct CountBlock {
    pub file: File,
    pub offset: u64,
    pub len: u64,
    pub word: u64,
}

struct Entry {
    file: Arc<File>,
    offset: u64,
    frames: u64,
    /// Needed once: the first lookup of the whole range takes it (a range received from the
    /// peer, for the attach that asked for it; a served range, for the answer that carries
    /// it). Ranges the bridge added stay until their region is removed.
    once: bool,
}

#[derive(Default)]
struct Frames {
    entries: BTreeMap<u64, Entry>,
    order: VecDeque<u64>,
    next: u64,
    /// Regions the bridge added (`GuestRegions::add`): slot -> first frame.
    slots: HashMap<u32, u64>,
    next_slot: u32,
}

/// One daemon link's frame space: ranges of files, numbered as frames.
#[derive(Default)]
pub struct PeerFrames {
    frames: Mutex<Frames>,
}

impl PeerFrames {
    /// Numbers `[offset, offset + frames pages)` of `file`; returns its first frame.
    fn insert(&self, file: Arc<File>, offset: u64, frames: u64, once: bool) -> Result<u64, Error> {
        if frames == 0 || frames > xemem::wire::MAX_FRAME / 2 || offset % xemem::PAGE_SIZE != 0 {
            return Err(Error::Invalid);
        }
        let mut table = self.frames.lock().unwrap();
        while table.entries.len() >= MAX_FRAME_ENTRIES {
            let Some(oldest) = table.order.pop_front() else { break };
            table.entries.remove(&oldest);
        }
        let mut first = table.next.max(FIRST_FRAME);
        if first + frames > xemem::wire::MAX_FRAME {
            first = FIRST_FRAME;
        }
        // After a wrap, ranges still numbered there go.
        let overlapping: Vec<u64> =
            table.entries.range(..first + frames).filter(|(f, e)| **f + e.frames > first).map(|(f, _)| *f).collect();
        for old in overlapping {
            table.entries.remove(&old);
        }
        table.next = first + frames;
        table.entries.insert(first, Entry { file, offset, frames, once });
        table.order.push_back(first);
        Ok(first)
    }

    fn remove(&self, first: u64) {
        self.frames.lock().unwrap().entries.remove(&first);
    }

    pub fn len(&self) -> usize {
        self.frames.lock().unwrap().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl FrameSource for PeerFrames {
    fn is_peer(&self) -> bool {
        true
    }

    fn file_range(&self, gpa: u64, len: u64) -> Result<(File, u64), Error> {
        let page = xemem::PAGE_SIZE;
        if gpa % page != 0 || len % page != 0 || len == 0 {
            return Err(Error::Invalid);
        }
        let (frame, count) = (gpa / page, len / page);
        let mut table = self.frames.lock().unwrap();
        let (&first, entry) = table.entries.range(..=frame).next_back().ok_or(Error::Invalid)?;
        if frame.checked_add(count).is_none_or(|end| end > first + entry.frames) {
            return Err(Error::Invalid);
        }
        let file = entry.file.try_clone().map_err(|_| Error::Exhausted)?;
        let offset = entry.offset + (frame - first) * page;
        if entry.once && frame == first && count == entry.frames {
            table.entries.remove(&first);
        }
        Ok((file, offset))
    }
}

/// The bridge adds host memory for the peer's processes here: each region is a numbered range
/// of the owner's file, sent as that file when the answer crosses the link.
impl GuestRegions for PeerFrames {
    fn add(&self, file: &File, offset: u64, len: u64, access: RegionAccess) -> Result<SharedRegion, String> {
        // Published words are for enclave kernels (`MappingWord`); a daemon has no use for them.
        if access == RegionAccess::ReadOnly {
            return Err("a daemon link takes no read-only regions".into());
        }
        let file = file.try_clone().map_err(|e| e.to_string())?;
        let first = self.insert(Arc::new(file), offset, len / xemem::PAGE_SIZE, false).map_err(|e| format!("{e:?}"))?;
        let mut table = self.frames.lock().unwrap();
        table.next_slot = table.next_slot.wrapping_add(1);
        let slot = table.next_slot;
        table.slots.insert(slot, first);
        Ok(SharedRegion { slot, gpa: first * xemem::PAGE_SIZE })
    }

    fn remove(&self, slot: u32) -> Result<(), String> {
        let first = self.frames.lock().unwrap().slots.remove(&slot).ok_or("no such region")?;
        PeerFrames::remove(self, first);
        Ok(())
    }
}

/// Turns an `Attached` part the peer sent (frames relative to the descriptors that came with
/// it) into one in this daemon's frame space for the link, after checking every run.
pub fn renumber_incoming(message: &Message, fds: Vec<OwnedFd>, frames: &PeerFrames) -> Result<Message, Error> {
    let Body::Attached(part) = &message.body else { return Err(Error::Invalid) };
    if fds.len() > MAX_FDS {
        return Err(Error::Malformed);
    }
    let mut files = Vec::with_capacity(fds.len());
    for fd in fds {
        let info = crate::sys::file_info(&fd).map_err(|_| Error::Malformed)?;
        if !info.regular {
            return Err(Error::Malformed);
        }
        files.push((Arc::new(File::from(fd)), info.size));
    }
    let mut renumbered = Vec::with_capacity(part.runs.len());
    for run in &part.runs {
        let first = match run.first {
            None => None,
            Some(first) => {
                let (index, page) = ((first >> FD_SHIFT) as usize, first & PAGE_MASK);
                let (file, size) = files.get(index).ok_or(Error::Malformed)?;
                let end = page.checked_add(run.frames).and_then(|end| end.checked_mul(xemem::PAGE_SIZE)).ok_or(Error::Malformed)?;
                if end > *size {
                    return Err(Error::Malformed);
                }
                Some(frames.insert(file.clone(), page * xemem::PAGE_SIZE, run.frames, true)?)
            }
        };
        renumbered.push(FrameRun { first, frames: run.frames });
    }
    // A word in guest memory means nothing across daemons (see `MappingWord`): dropped.
    let body = Body::Attached(AttachedPart { runs: renumbered, valid_while: None, ..*part });
    Ok(Message { header: message.header, body })
}

/// Turns an `Attached` part of this daemon's (frames of `source`) into packets for the link:
/// each with its runs relative to the descriptors it carries (at most [`MAX_FDS`] each, so a
/// part may become several; the receiver assembles parts in order).
/// One packet for a daemon link: the encoded message and the files to pass with it.
pub type Packet = (Vec<u8>, Vec<File>);

pub fn files_outgoing(message: &Message, source: &dyn FrameSource) -> Result<Vec<Packet>, Error> {
    let Body::Attached(part) = &message.body else { return Err(Error::Invalid) };
    let mut packets = Vec::new();
    let mut files: Vec<File> = Vec::new();
    let mut known: HashMap<(u64, u64), u64> = HashMap::new();
    let mut chunk: Vec<FrameRun> = Vec::new();
    let mut chunk_start = part.first_run;
    let flush = |chunk: &mut Vec<FrameRun>,
                 files: &mut Vec<File>,
                 known: &mut HashMap<(u64, u64), u64>,
                 start: &mut u32,
                 packets: &mut Vec<Packet>|
     -> Result<(), Error> {
        let runs = std::mem::take(chunk);
        let count = runs.len() as u32;
        let body = Body::Attached(AttachedPart { first_run: *start, runs, valid_while: None, ..*part });
        let bytes = Message { header: message.header, body }.to_bytes()?;
        packets.push((bytes, std::mem::take(files)));
        known.clear();
        *start += count;
        Ok(())
    };
    for run in &part.runs {
        let first = match run.first {
            None => None,
            Some(first) => {
                let (file, offset) = source.file_range(first * xemem::PAGE_SIZE, run.frames * xemem::PAGE_SIZE)?;
                let page = offset / xemem::PAGE_SIZE;
                if offset % xemem::PAGE_SIZE != 0 || page + run.frames > PAGE_MASK {
                    return Err(Error::Invalid);
                }
                let info = file_identity(&file)?;
                if !known.contains_key(&info) && files.len() == MAX_FDS {
                    flush(&mut chunk, &mut files, &mut known, &mut chunk_start, &mut packets)?;
                }
                let index = match known.get(&info) {
                    Some(index) => *index,
                    None => {
                        files.push(file);
                        known.insert(info, files.len() as u64 - 1);
                        files.len() as u64 - 1
                    }
                };
                Some(index << FD_SHIFT | page)
            }
        };
        chunk.push(FrameRun { first, frames: run.frames });
    }
    if !chunk.is_empty() {
        flush(&mut chunk, &mut files, &mut known, &mut chunk_start, &mut packets)?;
    }
    Ok(packets)
}

fn file_identity(file: &File) -> Result<(u64, u64), Error> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|_| Error::Invalid)?;
    if !meta.file_type().is_file() {
        return Err(Error::Invalid);
    }
    Ok((meta.dev(), meta.ino()))
}

/// Accepts daemon links on `path` (mode 0600; only root or this daemon's own user may link)
/// and runs each on a thread of its own.
pub fn listen(path: &Path, links: Arc<XememLinks>, broker: Option<xemem_host::Broker>) -> Result<(), String> {
    let listener = crate::sys::listen(path).map_err(|e| format!("binding the XEMEM daemon-link socket {}: {e}", path.display()))?;
    set_private(path)?;
    std::thread::Builder::new()
        .name("xemem-peers".into())
        .spawn(move || loop {
            let connection = match crate::sys::accept(&listener) {
                Ok(connection) => connection,
                Err(e) => {
                    log::warn!("xemem: accepting a daemon link: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            match crate::sys::peer(&connection) {
                Ok(peer) if peer.uid == 0 || peer.uid == me => {}
                _ => continue,
            }
            let (links, broker) = (links.clone(), broker.clone());
            let _ = std::thread::Builder::new()
                .name("xemem-peer".into())
                .spawn(move || run_link(connection, links, broker, "a daemon below", false));
        })
        .map_err(|e| format!("starting the XEMEM daemon-link thread: {e}"))?;
    Ok(())
}

fn set_private(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| format!("{}: {e}", path.display()))
}

/// A sub-manager's link to the daemon above it (its daemon-link socket at `path`), on a
/// thread; it waits up to `patience` for that socket to accept. When the link goes down (the
/// upstream daemon stopped or restarted), the thread links again, waiting
/// [`FIRST_RELINK_WAIT`] between attempts at first and doubling up to [`LAST_RELINK_WAIT`];
/// the node then finds the name server and gets a new id (`Node::rejoin`).
pub fn connect_upstream(
    path: PathBuf,
    links: Arc<XememLinks>,
    broker: Option<xemem_host::Broker>,
    patience: Duration,
) -> Result<(), String> {
    let deadline = std::time::Instant::now() + patience;
    let connection = loop {
        match crate::sys::connect(&path) {
            Ok(connection) => break connection,
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(format!("linking to the upstream daemon at {}: {e}", path.display()))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    std::thread::Builder::new()
        .name("xemem-upstream".into())
        .spawn(move || {
            let mut connection = connection;
            loop {
                run_link(connection, links.clone(), broker.clone(), "the upstream daemon", true);
                let mut wait = FIRST_RELINK_WAIT;
                connection = loop {
                    std::thread::sleep(wait);
                    match crate::sys::connect(&path) {
                        Ok(connection) => break connection,
                        Err(_) => wait = (wait * 2).min(LAST_RELINK_WAIT),
                    }
                };
                log::info!("xemem: linking to the upstream daemon again");
            }
        })
        .map_err(|e| format!("starting the XEMEM upstream thread: {e}"))?;
    Ok(())
}

/// A sub-manager waits this long before it first tries to link to its upstream daemon again.
pub const FIRST_RELINK_WAIT: Duration = Duration::from_millis(100);
/// ... and at most this long between later attempts.
pub const LAST_RELINK_WAIT: Duration = Duration::from_secs(5);

/// One daemon link, until the peer closes it (or sends something the socket refuses).
fn run_link(connection: OwnedFd, links: Arc<XememLinks>, broker: Option<xemem_host::Broker>, who: &str, upstream: bool) {
    let frames = Arc::new(PeerFrames::default());
    // The node wakes a link's pump when it queues a message from another thread; this link
    // polls every round anyway, and drains the wake-ups.
    let Ok(wake) = crate::sys::eventfd() else { return };
    let Ok(woken) = wake.try_clone() else { return };
    let Some(port) = links.join_peer(frames.clone(), wake, upstream) else {
        log::warn!("xemem: no free link for {who}");
        return;
    };
    log::info!("xemem: linked to {who} (link {})", port.link());
    let losses = links.upstream_losses();
    let link = Link {
        connection,
        links,
        broker,
        frames,
        port,
        served: mpsc::channel(),
        announced: !upstream,
        woken,
        losses,
        notices: None,
        serving: Arc::default(),
    };
    link.run();
    log::warn!("xemem: the link to {who} is down");
}

struct Link {
    connection: OwnedFd,
    links: Arc<XememLinks>,
    broker: Option<xemem_host::Broker>,
    frames: Arc<PeerFrames>,
    port: XememPort,
    /// Answers of `Serve` requests served on threads of their own.
    served: (mpsc::Sender<Vec<Message>>, mpsc::Receiver<Vec<Message>>),
    /// Whether this daemon's id was logged (by its upstream link, once per id it gets).
    announced: bool,
    woken: File,
    /// This daemon's count of lost upstream links when this link came up (see `run`).
    losses: u64,
    /// Signals for this daemon's host owners, passed to their libraries one at a time.
    notices: Option<mpsc::SyncSender<(u64, xemem::SegmentId)>>,
    /// How many `Serve`s of the name server's are being served on threads.
    serving: Arc<AtomicUsize>,
}

/// How many `Serve`s one link serves at once; beyond that they are answered Exhausted.
const MAX_SERVING: usize = 32;

/// How many signals for host owners may wait for their libraries on one link.
const MAX_NOTICES_QUEUED: usize = 1024;

impl Link {
    fn run(mut self) {
        let mut buffer = vec![0u8; xemem::wire::MAX_MESSAGE_LEN + 1];
        loop {
            match crate::sys::wait_readable(&self.connection, ROUND) {
                Ok(true) => match crate::sys::receive(&self.connection, &mut buffer) {
                    Ok((0, _)) => break,
                    Ok((length, fds)) => self.on_packet(&buffer[..length], fds),
                    // Truncated bytes or descriptors: dropped (the descriptors that came are closed).
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {}
                    Err(_) => break,
                },
                Ok(false) => {}
                Err(_) => break,
            }
            // This daemon lost its name server since the daemon below linked: the ids it and
            // the enclaves behind it got are void. It is unlinked, and links again (as any
            // sub-manager whose upstream went away) to get new ones once this daemon has one.
            if self.losses != self.links.upstream_losses() && self.links.link_towards_name_server() != Some(self.port.link()) {
                log::warn!("xemem: unlinking a daemon below: this daemon's name server is gone");
                break;
            }
            crate::sys::drain_eventfd(&self.woken);
            let answers: Vec<Vec<Message>> = self.served.1.try_iter().collect();
            for message in answers.into_iter().flatten() {
                self.on_own_answer(message);
            }
            self.port.tick(&*self.frames);
            for bytes in self.port.to_enclave() {
                if self.to_peer(bytes).is_err() {
                    return;
                }
            }
            if !self.announced {
                if let Some(id) = self.links.id().filter(|id| *id != NAME_SERVER_ENCLAVE) {
                    log::info!("xemem: the name server gave this daemon enclave id {id}");
                    self.announced = true;
                }
            }
        }
    }

    /// A packet from the peer: checked, renumbered if it carries memory, then to the node.
    fn on_packet(&mut self, bytes: &[u8], fds: Vec<OwnedFd>) {
        let message = Message::decode(bytes);
        match message {
            Ok(message @ Message { body: Body::Attached(AttachedPart { .. }), .. }) => {
                let header = message.header;
                let renumbered = renumber_incoming(&message, fds, &self.frames).unwrap_or_else(|error| {
                    // The requester hears at once instead of waiting for its retries to run out.
                    let error = if error == Error::Exhausted { Error::Exhausted } else { Error::Malformed };
                    Message::new(header.request, header.origin, header.destination, Body::Failed { error })
                });
                if let Ok(bytes) = renumbered.to_bytes() {
                    self.port.from_enclave(&bytes, &*self.frames);
                }
            }
            Ok(Message { header, body: Body::Serve { requester, owner_process, segment, vaddr, size } })
                if self.broker.is_some()
                    && header.origin == NAME_SERVER_ENCLAVE
                    && Some(header.destination) == self.links.id()
                    && header.destination != NAME_SERVER_ENCLAVE
                    && self.links.link_towards_name_server() == Some(self.port.link()) =>
            {
                drop(fds);
                let me = header.destination;
                // A bounded number at once (beyond that the attach fails with Exhausted).
                if self.serving.fetch_add(1, Ordering::AcqRel) >= MAX_SERVING {
                    self.serving.fetch_sub(1, Ordering::AcqRel);
                    self.on_own_answer(Message::new(header.request, me, requester, Body::Failed { error: Error::Exhausted }));
                    return;
                }
                // The owner's library may take a while (it converts memory): not on this thread.
                let (broker, frames, answers, serving) =
                    (self.broker.clone().unwrap(), self.frames.clone(), self.served.0.clone(), self.serving.clone());
                let spawned = std::thread::Builder::new().name("xemem-serve".into()).spawn(move || {
                    let bodies =
                        serve(&broker, &frames, owner_process, segment, vaddr, size).unwrap_or_else(|error| vec![Body::Failed { error }]);
                    let _ = answers.send(bodies.into_iter().map(|body| Message::new(header.request, me, requester, body)).collect());
                    serving.fetch_sub(1, Ordering::AcqRel);
                });
                if spawned.is_err() {
                    self.serving.fetch_sub(1, Ordering::AcqRel);
                }
            }
            // The name server passes on a signal to one of this daemon's host processes' segments:
            // the owner's library counts it on its notify descriptors. Off this thread: the
            // library may take a while to answer. Nothing answers a Notify.
            Ok(Message { header, body: Body::Notify { owner_process, segment } })
                if self.broker.is_some()
                    && header.origin == NAME_SERVER_ENCLAVE
                    && Some(header.destination) == self.links.id()
                    && header.destination != NAME_SERVER_ENCLAVE
                    && segment.enclave() == header.destination
                    && self.links.link_towards_name_server() == Some(self.port.link()) =>
            {
                drop(fds);
                if self.notices.is_none() {
                    let (sender, receiver) = mpsc::sync_channel::<(u64, xemem::SegmentId)>(MAX_NOTICES_QUEUED);
                    let broker = self.broker.clone().unwrap();
                    let spawned = std::thread::Builder::new().name("xemem-notify".into()).spawn(move || {
                        for (process, segment) in receiver {
                            let _ = broker.notify_for_name_server(process, segment);
                        }
                    });
                    self.notices = spawned.ok().map(|_| sender);
                }
                // A flood beyond what the owners' libraries take in is dropped.
                if let Some(notices) = &self.notices {
                    let _ = notices.try_send((owner_process, segment));
                }
            }
            // The name server takes back a permit this daemon holds: enclaves here that attached
            // through it, or the host process that holds it, must let go before the
            // acknowledgement goes up (the owner's memory is truncated after it). Off this
            // thread: it waits for the enclaves and the host process's library.
            Ok(message @ Message { body: Body::Revoke { .. }, .. })
                if message.header.origin == NAME_SERVER_ENCLAVE
                    && Some(message.header.destination) == self.links.id()
                    && message.header.destination != NAME_SERVER_ENCLAVE
                    && self.links.link_towards_name_server() == Some(self.port.link()) =>
            {
                drop(fds);
                let Body::Revoke { process, access } = message.body else { return };
                let (links, answers, broker) = (self.links.clone(), self.served.0.clone(), self.broker.clone());
                std::thread::spawn(move || {
                    links.revoke_proxy_permit(process, access);
                    // Or a host process here holds it: its library lets go of the memory.
                    if let Some(broker) = broker {
                        broker.revoke_remote_permit(process, access);
                    }
                    // Now the node handles it as usual: it answers Revoked.
                    let _ = answers.send(vec![message]);
                });
            }
            _ => {
                drop(fds); // only memory answers carry descriptors
                self.port.from_enclave(bytes, &*self.frames);
            }
        }
    }

    /// An answer this daemon made itself (a served attach): to this node if it asked,
    /// otherwise over the link.
    fn on_own_answer(&mut self, message: Message) {
        let Ok(bytes) = message.to_bytes() else { return };
        if Some(message.header.destination) == self.links.id() {
            self.port.from_enclave(&bytes, &*self.frames);
        } else {
            let _ = self.to_peer(bytes);
        }
    }

    /// One message of the node's for the peer; memory answers go as files.
    fn to_peer(&self, bytes: Vec<u8>) -> io::Result<()> {
        let Ok(message @ Message { body: Body::Attached(AttachedPart { .. }), .. }) = Message::decode(&bytes) else {
            return crate::sys::send(&self.connection, &bytes, &[]);
        };
        let origin = message.header.origin;
        // This daemon's own answers (a served host segment; the bridge's, which speak for the
        // name server) carry frames of this link's table; others', frames of the link the
        // origin lies behind.
        let own = Some(origin) == self.links.id() || origin == NAME_SERVER_ENCLAVE;
        let source: Option<Arc<dyn FrameSource>> = if own { Some(self.frames.clone()) } else { self.links.frame_source(origin) };
        let packets = source.ok_or(Error::Unreachable).and_then(|source| files_outgoing(&message, &*source));
        match packets {
            Ok(packets) => {
                for (bytes, files) in packets {
                    let fds: Vec<_> = files.iter().map(|f| f.as_fd()).collect();
                    crate::sys::send(&self.connection, &bytes, &fds)?;
                }
                Ok(())
            }
            Err(error) => {
                let failed = Message::new(message.header.request, origin, message.header.destination, Body::Failed { error });
                match failed.to_bytes() {
                    Ok(bytes) => crate::sys::send(&self.connection, &bytes, &[]),
                    Err(_) => Ok(()),
                }
            }
        }
    }
}

/// The sub-manager's answer to the name server's `Serve` for one of its host processes'
/// segments: the owner's memfd runs, numbered in the link's frame space.
fn serve(
    broker: &xemem_host::Broker,
    frames: &PeerFrames,
    process: u64,
    segment: xemem::SegmentId,
    vaddr: u64,
    size: u64,
) -> Result<Vec<Body>, Error> {
    let runs = broker.serve_for_name_server(process, segment, vaddr, size)?;
    let page = xemem::PAGE_SIZE;
    let mut numbered = Vec::with_capacity(runs.len());
    for run in runs {
        match run {
            xemem_host::EnclaveRun::Hole { length } => numbered.push(FrameRun { first: None, frames: length / page }),
            xemem_host::EnclaveRun::Memory { file, offset, length } => {
                if length % page != 0 {
                    return Err(Error::Invalid);
                }
                let first = frames.insert(Arc::new(File::from(file)), offset, length / page, true)?;
                numbered.push(FrameRun { first: Some(first), frames: length / page });
            }
        }
    }
    xemem::wire::attached_parts(segment, size, &numbered, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfd(pages: u64) -> File {
        let mut file = crate::sys::memfd("xemem-peer-test").unwrap();
        file.set_len(pages * xemem::PAGE_SIZE).unwrap();
        file.write_all(b"x").unwrap();
        file
    }

    fn attached(runs: Vec<FrameRun>) -> Message {
        let pages: u64 = runs.iter().map(|r| r.frames).sum();
        let segment = xemem::SegmentId::new(2, 1).unwrap();
        let total_runs = runs.len() as u32;
        Message::new(
            3,
            2,
            1,
            Body::Attached(AttachedPart { segment, size: pages * xemem::PAGE_SIZE, first_run: 0, total_runs, runs, valid_while: None }),
        )
    }

    #[test]
    fn runs_cross_as_files_and_come_back_as_the_same_ranges() {
        let here = PeerFrames::default();
        let a = here.insert(Arc::new(memfd(8)), 2 * 4096, 4, false).unwrap();
        let b = here.insert(Arc::new(memfd(2)), 0, 2, false).unwrap();
        let message = attached(vec![
            FrameRun { first: Some(a + 1), frames: 2 },
            FrameRun { first: None, frames: 1 },
            FrameRun { first: Some(b), frames: 2 },
        ]);
        let packets = files_outgoing(&message, &here).unwrap();
        assert_eq!(packets.len(), 1);
        let (bytes, files) = &packets[0];
        assert_eq!(files.len(), 2);
        let sent = Message::decode(bytes).unwrap();
        let fds: Vec<OwnedFd> = files.iter().map(|f| f.try_clone().unwrap().into()).collect();
        let there = PeerFrames::default();
        let received = renumber_incoming(&sent, fds, &there).unwrap();
        let Body::Attached(AttachedPart { runs, .. }) = received.body else { panic!() };
        let (_, offset) = there.file_range(runs[0].first.unwrap() * 4096, 2 * 4096).unwrap();
        assert_eq!(offset, 3 * 4096);
        assert_eq!(runs[1], FrameRun { first: None, frames: 1 });
        // Taken by the attach that asked: a second lookup finds nothing.
        assert!(there.file_range(runs[0].first.unwrap() * 4096, 2 * 4096).is_err());
    }

    #[test]
    fn bogus_descriptors_and_runs_are_refused() {
        let frames = PeerFrames::default();
        let run = |index: u64, page: u64, count: u64| FrameRun { first: Some(index << FD_SHIFT | page), frames: count };
        let one = || -> Vec<OwnedFd> { vec![OwnedFd::from(memfd(4))] };
        // Beyond the file, no descriptor for the index, a pipe instead of a file.
        assert!(renumber_incoming(&attached(vec![run(0, 2, 3)]), one(), &frames).is_err());
        assert!(renumber_incoming(&attached(vec![run(1, 0, 1)]), one(), &frames).is_err());
        let (socket, _other) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(renumber_incoming(&attached(vec![run(0, 0, 1)]), vec![OwnedFd::from(socket)], &frames).is_err());
        assert!(renumber_incoming(&attached(vec![run(0, 0, 4)]), one(), &frames).is_ok());
    }

    #[test]
    fn more_files_than_one_packet_carries_split_into_parts_that_assemble() {
        let here = PeerFrames::default();
        let runs: Vec<FrameRun> = (0..(MAX_FDS as u64 + 10))
            .map(|_| FrameRun { first: Some(here.insert(Arc::new(memfd(1)), 0, 1, false).unwrap()), frames: 1 })
            .collect();
        let message = attached(runs);
        let packets = files_outgoing(&message, &here).unwrap();
        assert_eq!(packets.len(), 2);
        let mut assembler = xemem::wire::RunAssembler::default();
        let mut done = None;
        for (bytes, files) in &packets {
            assert!(files.len() <= MAX_FDS);
            let Body::Attached(part) = Message::decode(bytes).unwrap().body else { panic!() };
            done = assembler.push(part).unwrap();
        }
        assert_eq!(done.map(|(runs, _)| runs.len()), Some(MAX_FDS + 10));
    }
}
