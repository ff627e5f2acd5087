use super::*;
use std::cell::RefCell;
use std::os::fd::OwnedFd;
use xemem::wire::AttachedPart;
use xemem_host::EnclaveRun;

/// Enclave RAM on 2 MiB pages: frame n is at byte n * 4 KiB of one file.
struct HugeRam(File);

impl FrameSource for HugeRam {
    fn file_range(&self, gpa: u64, _len: u64) -> Result<(File, u64), Error> {
        Ok((self.0.try_clone().map_err(|_| Error::Exhausted)?, gpa))
    }
    fn mappable_unit(&self) -> u64 {
        2 << 20
    }
}

#[test]
fn runs_of_hugepage_ram_must_be_whole_pages_for_a_host_process() {
    let ram = HugeRam(crate::sys::memfd("huge-ram-test").unwrap());
    let huge = 512; // 4 KiB frames per 2 MiB page
    let whole = [FrameRun { first: Some(2 * huge), frames: 2 * huge }, FrameRun { first: None, frames: 3 }];
    let runs = file_runs(&ram, &whole, false).unwrap();
    assert!(matches!(runs[0], FileRun::Memory { offset, len, .. } if offset == 4 << 20 && len == 4 << 20));
    for part in [FrameRun { first: Some(2 * huge + 1), frames: huge }, FrameRun { first: Some(2 * huge), frames: huge + 1 }] {
        assert_eq!(
            file_runs(&ram, &[part], false).err(),
            Some(Error::WholePagesOnly),
            "{part:?}: a process can map only whole 2 MiB pages"
        );
        // another enclave's VMM gives its guest the run alone (UCX's 12 KiB FIFO, issue 25)
        let runs = file_runs(&ram, &[part], true).unwrap();
        assert!(
            matches!(runs[0], FileRun::Memory { offset, len, .. } if offset == part.first.unwrap() * 4096 && len == part.frames * 4096)
        );
    }
}

/// A machine that places regions one after another from 4 GiB (or at `gpa_skew` past it,
/// to play a VMM that answers with a misaligned address) and remembers what is live and
/// which pieces each region joined; `no_pieces` plays one that joins none, `fail_at` one
/// whose nth add (from 0) fails.
#[derive(Default)]
struct FakeRegions {
    live: RefCell<Vec<u32>>,
    next: RefCell<u32>,
    gpa_skew: u64,
    pieces: RefCell<Vec<Vec<(u64, u64)>>>,
    no_pieces: bool,
    fail_at: Option<u32>,
}

impl FakeRegions {
    fn place(&self, len: u64) -> Result<SharedRegion, String> {
        let slot = *self.next.borrow();
        *self.next.borrow_mut() += 1;
        if self.fail_at == Some(slot) {
            return Err("no more slots".into());
        }
        self.live.borrow_mut().push(slot);
        Ok(SharedRegion { slot, gpa: (4 << 30) + slot as u64 * len + self.gpa_skew })
    }
}

impl GuestRegions for FakeRegions {
    fn add(&self, _file: &File, _offset: u64, len: u64, _access: RegionAccess) -> Result<SharedRegion, String> {
        self.place(len)
    }
    fn add_pieces(&self, _file: &File, pieces: &[clowder_api::vmm::Piece]) -> Option<Result<SharedRegion, String>> {
        if self.no_pieces {
            return None;
        }
        self.pieces.borrow_mut().push(pieces.iter().map(|piece| (piece.offset, piece.len)).collect());
        Some(self.place(pieces.iter().map(|piece| piece.len).sum()))
    }
    fn remove(&self, slot: u32) -> Result<(), String> {
        self.live.borrow_mut().retain(|live| *live != slot);
        Ok(())
    }
}

fn memfd() -> OwnedFd {
    crate::sys::memfd("xemem-bridge-test").unwrap().into()
}

fn memory(offset: u64, length: u64) -> EnclaveRun {
    EnclaveRun::Memory { file: memfd(), offset, length }
}

/// [`runs_into_regions`] as the bridge calls it, with the runs' identities.
fn into_regions(runs: &[EnclaveRun], regions: &FakeRegions) -> Result<(Vec<FrameRun>, Vec<SharedRegion>), Error> {
    runs_into_regions(runs, run_identities(runs).as_deref(), regions)
}

/// `pages` single pages of `file`, scattered: page i of the attach is page (i * 7) % pages.
fn scattered(file: &OwnedFd, pages: u64) -> Vec<EnclaveRun> {
    (0..pages).map(|i| EnclaveRun::Memory { file: file.try_clone().unwrap(), offset: i * 7 % pages * 4096, length: 4096 }).collect()
}

#[test]
fn scattered_pages_of_one_file_become_one_region_and_one_frame_run() {
    let (file, regions) = (memfd(), FakeRegions::default());
    let runs = scattered(&file, 1000);
    let (frames, added) = into_regions(&runs, &regions).unwrap();
    assert_eq!(added.len(), 1, "one region (one memory slot) for 1000 pages");
    assert_eq!(frames, vec![FrameRun { first: Some(added[0].gpa / 4096), frames: 1000 }]);
    let expected: Vec<(u64, u64)> = (0..1000).map(|i| (i * 7 % 1000 * 4096, 4096)).collect();
    assert_eq!(*regions.pieces.borrow(), vec![expected], "the pieces, in the answer's order");
    // Holes and another file's run end a region; holes stay holes.
    let regions = FakeRegions::default();
    let mut runs = scattered(&file, 300);
    runs.insert(100, EnclaveRun::Hole { length: 2 * 4096 });
    runs.insert(200, memory(0, 4096));
    let (frames, added) = into_regions(&runs, &regions).unwrap();
    assert_eq!(added.len(), 4);
    let counts: Vec<(bool, u64)> = frames.iter().map(|run| (run.first.is_some(), run.frames)).collect();
    assert_eq!(counts, vec![(true, 100), (false, 2), (true, 99), (true, 1), (true, 101)]);
    assert_eq!(regions.pieces.borrow().iter().map(Vec::len).collect::<Vec<_>>(), vec![100, 99, 101]);
}

#[test]
fn without_pieces_or_whole_large_pages_each_run_is_a_region_of_its_own() {
    let file = memfd();
    // A machine that joins no pieces (a daemon link's frames, a machine without a VMM).
    let regions = FakeRegions { no_pieces: true, ..FakeRegions::default() };
    let (frames, added) = into_regions(&scattered(&file, 50), &regions).unwrap();
    assert_eq!((frames.len(), added.len()), (50, 50));
    assert!(frames.iter().zip(&added).all(|(run, region)| *run == FrameRun { first: Some(region.gpa / 4096), frames: 1 }));
    // 4 KiB runs of a file on 2 MiB pages cannot be mapped side by side.
    let regions = FakeRegions::default();
    let runs = scattered(&file, 3);
    let huge: Vec<RunIdentity> = run_identities(&runs)
        .unwrap()
        .into_iter()
        .map(|run| match run {
            RunIdentity::Memory { device, inode, offset, length, .. } => {
                RunIdentity::Memory { device, inode, offset, length, unit: 2 << 20 }
            }
            hole => hole,
        })
        .collect();
    let (frames, added) = runs_into_regions(&runs, Some(&huge), &regions).unwrap();
    assert_eq!((frames.len(), added.len()), (3, 3));
    assert!(regions.pieces.borrow().is_empty());
}

#[test]
fn a_failure_midway_removes_every_region_added_before_it() {
    let file = memfd();
    let mut runs = scattered(&file, 100);
    runs.push(EnclaveRun::Hole { length: 4096 });
    runs.push(memory(0, 4096));
    runs.extend(scattered(&file, 10));
    for fail_at in 0..3 {
        let regions = FakeRegions { fail_at: Some(fail_at), ..FakeRegions::default() };
        assert_eq!(into_regions(&runs, &regions).err(), Some(Error::Exhausted));
        assert!(regions.live.borrow().is_empty(), "failing add {fail_at} left {:?}", regions.live.borrow());
        assert_eq!(*regions.next.borrow(), fail_at + 1, "nothing was added after the failure");
    }
    // A bad run after a joined region: refused, and the region goes.
    runs.push(memory(100, 4096));
    let regions = FakeRegions::default();
    assert_eq!(into_regions(&runs, &regions).err(), Some(Error::Invalid));
    assert!(regions.live.borrow().is_empty());
}

#[test]
fn owner_runs_become_regions_frame_for_frame() {
    let regions = FakeRegions::default();
    let runs = [memory(0, 2 * 4096), EnclaveRun::Hole { length: 4096 }, memory(8192, 4096)];
    let (frames, added) = into_regions(&runs, &regions).unwrap();
    assert_eq!(added.len(), 2);
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[0], FrameRun { first: Some(added[0].gpa / 4096), frames: 2 });
    assert_eq!(frames[1], FrameRun { first: None, frames: 1 });
    assert_eq!(frames[2], FrameRun { first: Some(added[1].gpa / 4096), frames: 1 });
    assert_eq!(regions.live.borrow().len(), 2);
}

#[test]
fn malformed_runs_are_refused_and_leave_no_region() {
    for runs in [
        vec![memory(0, 4096), memory(100, 4096)],      // misaligned offset, after a good run
        vec![memory(0, 4096), memory(4096, 4096 + 1)], // length not a page multiple
        vec![memory(0, 4096), memory(4096, 0)],        // empty run
        vec![EnclaveRun::Hole { length: 10 }],         // hole not a page multiple
        vec![],                                        // nothing at all
    ] {
        let regions = FakeRegions::default();
        assert_eq!(into_regions(&runs, &regions).err(), Some(Error::Invalid));
        assert!(regions.live.borrow().is_empty(), "a region stayed after a refused attach");
    }
    // Too many runs for one attach.
    let many: Vec<EnclaveRun> = (0..=xemem::wire::MAX_RUNS_PER_ATTACH).map(|_| EnclaveRun::Hole { length: 4096 }).collect();
    assert_eq!(into_regions(&many, &FakeRegions::default()).err(), Some(Error::Invalid));
    // A VMM answering with a misaligned guest-physical address.
    let skewed = FakeRegions { gpa_skew: 8, ..FakeRegions::default() };
    assert_eq!(into_regions(&[memory(0, 4096)], &skewed).err(), Some(Error::Invalid));
    assert!(skewed.live.borrow().is_empty());
}

/// A port whose enclave has been given an id by the name server, as a kernel would get one.
fn linked_port(links: &Arc<XememLinks>, token: u64) -> (XememPort, EnclaveId) {
    let (port, enclave, _) = linked_port_and_wake(links, token);
    (port, enclave)
}

/// [`linked_port`], with the eventfd its pump would sleep on.
fn linked_port_and_wake(links: &Arc<XememLinks>, token: u64) -> (XememPort, EnclaveId, File) {
    let file = crate::sys::memfd("xemem-links-test").unwrap();
    file.set_len(1 << 20).unwrap();
    let ram = GuestRam::map(&file, vec![crate::guest_ram::RamRange { gpa: 0, size: 1 << 20, file_offset: 0 }], (0xf0000, 4096)).unwrap();
    let wake = crate::sys::eventfd().unwrap();
    let port = links.join(Arc::new(ram), wake.try_clone().unwrap()).unwrap();
    let regions = FakeRegions::default();
    port.from_enclave(&Message::new(0, 0, 0, Body::EnclaveIdRequest { token }).to_bytes().unwrap(), &regions);
    let answers: Vec<Message> = port.to_enclave().iter().map(|bytes| Message::decode(bytes).unwrap()).collect();
    let enclave = answers
        .iter()
        .find_map(|m| match m.body {
            Body::EnclaveIdResponse { token: t, enclave } if t == token => Some(enclave),
            _ => None,
        })
        .expect("an enclave id");
    (port, enclave, wake)
}

fn lookup_from(origin: EnclaveId) -> Vec<u8> {
    Message::new(5, origin, NAME_SERVER_ENCLAVE, Body::Lookup { name: Name::new(b"nothing-here").unwrap() }).to_bytes().unwrap()
}

#[test]
fn an_enclave_speaks_only_for_itself_and_its_frames_go_only_to_the_name_server() {
    let links = XememLinks::new();
    let (a, a_id) = linked_port(&links, 1);
    let (b, b_id) = linked_port(&links, 2);
    let regions = FakeRegions::default();
    // Its own request is answered (the name is unknown: NotFound).
    a.from_enclave(&lookup_from(a_id), &regions);
    let answers = a.to_enclave();
    assert_eq!(answers.len(), 1);
    assert_eq!(Message::decode(&answers[0]).unwrap().body, Body::Failed { error: Error::NotFound });
    // The same request claiming to come from b, through a's link: dropped.
    a.from_enclave(&lookup_from(b_id), &regions);
    assert!(a.to_enclave().is_empty() && b.to_enclave().is_empty());
    // Frame runs from a addressed to b: dropped, never forwarded.
    let runs = vec![FrameRun { first: Some(16), frames: 1 }];
    let attached = Message::new(
        7,
        a_id,
        b_id,
        Body::Attached(AttachedPart {
            segment: SegmentId::new(a_id, 1).unwrap(),
            size: 4096,
            first_run: 0,
            total_runs: 1,
            runs,
            valid_while: None,
        }),
    );
    a.from_enclave(&attached.to_bytes().unwrap(), &regions);
    assert!(b.to_enclave().is_empty(), "b received a's frames");
    // An acknowledgement of a revoke nobody sent changes nothing.
    let access = AccessId::new(NAME_SERVER_ENCLAVE, FIRST_HOST_PERMIT).unwrap();
    a.from_enclave(&Message::new(99, a_id, NAME_SERVER_ENCLAVE, Body::Revoked { process: 1, access }).to_bytes().unwrap(), &regions);
    assert!(a.to_enclave().is_empty() && regions.live.borrow().is_empty());
}

#[test]
fn a_message_queued_by_a_host_caller_wakes_the_owner_enclaves_pump() {
    use xemem_host::Enclaves;
    let links = XememLinks::new();
    let (owner, owner_id, owner_wake) = linked_port_and_wake(&links, 1);
    let regions = FakeRegions::default();
    let make = Body::Make { process: 1, vaddr: 0x10_0000, size: 4096, uid: 0, gid: 0, mode: 0o600, name: None };
    owner.from_enclave(&Message::new(1, owner_id, NAME_SERVER_ENCLAVE, make).to_bytes().unwrap(), &regions);
    let Body::Made { segment } = Message::decode(&owner.to_enclave().pop().expect("an answer")).unwrap().body else {
        panic!("no segment made")
    };
    let root = Credentials { uid: 0, groups: Vec::new() };
    let (access, _) = links.get(7, root, segment, xemem::ACCESS_READ_WRITE).unwrap();
    crate::sys::drain_eventfd(&owner_wake);
    // A host process attaches: the name server's `Serve` for the owner is queued on the
    // caller's thread, and the owner's pump must hear of it at once.
    let caller = {
        let links = links.clone();
        std::thread::spawn(move || links.attach(7, access, 0, 4096))
    };
    assert!(crate::sys::wait_readable(&owner_wake, Duration::from_secs(2)).unwrap(), "the owner's pump was not woken");
    let serve = Message::decode(&owner.to_enclave().pop().expect("a Serve")).unwrap();
    assert!(matches!(serve.body, Body::Serve { .. }));
    let runs = vec![FrameRun { first: Some(16), frames: 1 }];
    let attached = Body::Attached(AttachedPart { segment, size: 4096, first_run: 0, total_runs: 1, runs, valid_while: None });
    owner.from_enclave(&Message::new(serve.header.request, owner_id, NAME_SERVER_ENCLAVE, attached).to_bytes().unwrap(), &regions);
    assert_eq!(caller.join().unwrap().map(|runs| runs.len()), Ok(1));
}

#[test]
fn an_enclaves_segments_and_gets_are_its_owners() {
    use xemem_host::Enclaves;
    let links = XememLinks::new();
    let user = |uid| EnclaveUser { uid, gid: uid };
    let port = |token, uid| {
        let (port, id) = linked_port(&links, token);
        (port.for_user(user(uid)), id)
    };
    let ((a, a_id), (b, b_id), (c, c_id)) = (port(1, 1000), port(2, 1000), port(3, 1001));
    let regions = FakeRegions::default();
    // The LWK says uid 0 (its jobs run as root): the segment is a's owner's all the same.
    let make = Body::Make { process: 1, vaddr: 0x10_0000, size: 4096, uid: 0, gid: 0, mode: 0o600, name: None };
    a.from_enclave(&Message::new(1, a_id, NAME_SERVER_ENCLAVE, make).to_bytes().unwrap(), &regions);
    let Body::Made { segment } = Message::decode(&a.to_enclave().pop().expect("an answer")).unwrap().body else {
        panic!("no segment made")
    };
    let get = |from: &XememPort, id| {
        let body = Body::Get { process: 1, segment, access: xemem::ACCESS_READ_WRITE, uid: 0, groups: Vec::new() };
        from.from_enclave(&Message::new(2, id, NAME_SERVER_ENCLAVE, body).to_bytes().unwrap(), &regions);
        Message::decode(&from.to_enclave().pop().expect("an answer")).unwrap().body
    };
    assert!(matches!(get(&b, b_id), Body::Granted { .. }), "another enclave of the same user may get a 0600 segment");
    assert_eq!(get(&c, c_id), Body::Failed { error: Error::Denied }, "another user's enclave may not");
    let owner = Credentials { uid: 1000, groups: vec![1000] };
    assert!(links.get(7, owner, segment, xemem::ACCESS_READ_WRITE).is_ok(), "nor may the user's host processes be refused");
    let stranger = Credentials { uid: 1001, groups: vec![1001] };
    assert_eq!(links.get(8, stranger, segment, xemem::ACCESS_READ_WRITE).err(), Some(Error::Denied));
}
