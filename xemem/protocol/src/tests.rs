use crate::ids::*;
use crate::nameserver::*;
use crate::perm::*;
use crate::wire::*;
use crate::*;
use std::vec;
use std::vec::Vec;

/// A seeded generator: every failure reproduces from its seed.
pub(crate) struct Rng(fastrand::Rng);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.0.u64(..bound)
    }
    pub(crate) fn chance(&mut self, per_thousand: u64) -> bool {
        self.below(1000) < per_thousand
    }
}

// ---------------------------------------------------------------------------------------------
// ids

#[test]
fn ids_are_positive_distinct_and_round_trip() {
    let mut rng = Rng::new(7);
    for _ in 0..10_000 {
        let enclave = 1 + rng.below(MAX_ENCLAVE_ID as u64) as u32;
        let local = 1 + rng.below(MAX_LOCAL_ID as u64) as u32;
        let s = SegmentId::new(enclave, local).unwrap();
        let a = AccessId::new(enclave, local).unwrap();
        assert!(s.raw() > 0 && a.raw() > 0);
        assert_ne!(s.raw(), a.raw());
        assert_eq!((s.enclave(), s.local()), (enclave, local));
        assert_eq!((a.enclave(), a.local()), (enclave, local));
        assert_eq!(SegmentId::from_raw(s.raw()), Some(s));
        assert_eq!(AccessId::from_raw(a.raw()), Some(a));
        // One kind of id is never accepted as the other.
        assert_eq!(SegmentId::from_raw(a.raw()), None);
        assert_eq!(AccessId::from_raw(s.raw()), None);
    }
    for bad in [0i64, -1, i64::MIN, 12345, 1 << 32] {
        assert_eq!(SegmentId::from_raw(bad), None, "{bad}");
    }
    assert_eq!(SegmentId::new(0, 1), None);
    assert_eq!(SegmentId::new(1, 0), None);
    assert_eq!(SegmentId::new(MAX_ENCLAVE_ID + 1, 1), None);
}

// ---------------------------------------------------------------------------------------------
// permissions

#[test]
fn permission_matrix_matches_sysv_ipc() {
    let owner = |mode| Owner { uid: 1000, gid: 100, mode };
    let user = Credentials { uid: 1000, groups: vec![100] };
    let group_member = Credentials { uid: 2000, groups: vec![5, 100] };
    let other = Credentials { uid: 3000, groups: vec![300] };
    let root = Credentials { uid: 0, groups: vec![0] };
    // (mode, read-only allowed, read-write allowed) for the owner: the openucx gtest matrix.
    for (mode, ro, rw) in [(0o600, true, true), (0o400, true, false), (0o200, false, false), (0o000, false, false)] {
        assert_eq!(check(&owner(mode), &user, ACCESS_READ_ONLY).is_ok(), ro, "{mode:o} ro");
        assert_eq!(check(&owner(mode), &user, ACCESS_READ_WRITE).is_ok(), rw, "{mode:o} rw");
        assert!(check(&owner(mode), &root, ACCESS_READ_WRITE).is_ok());
        assert!(check(&owner(mode), &other, ACCESS_READ_ONLY).is_err());
    }
    assert!(check(&owner(0o640), &group_member, ACCESS_READ_ONLY).is_ok());
    assert_eq!(check(&owner(0o640), &group_member, ACCESS_READ_WRITE), Err(Error::Denied));
    assert!(check(&owner(0o604), &other, ACCESS_READ_ONLY).is_ok());
    // The owner's own bits win even when group or other bits would allow more.
    assert_eq!(check(&owner(0o066), &user, ACCESS_READ_ONLY), Err(Error::Denied));
    assert_eq!(check(&owner(0o600), &user, 3), Err(Error::Invalid));
    assert_eq!(check(&owner(0o600), &user, 9999), Err(Error::Invalid));
}

// ---------------------------------------------------------------------------------------------
// name server

pub(crate) fn me(process: u64) -> Principal {
    Principal { enclave: NAME_SERVER_ENCLAVE, process }
}
pub(crate) fn rooted() -> Credentials {
    Credentials { uid: 0, groups: vec![0] }
}
pub(crate) fn mode(mode: u32) -> Owner {
    Owner { uid: 1000, gid: 100, mode }
}

#[test]
fn make_validates_like_xpmem() {
    let mut ns = NameServer::new(0);
    assert_eq!(ns.make(me(1), 12, 4096, mode(0o600), None), Err(Error::Invalid));
    assert_eq!(ns.make(me(1), 4096, 0, mode(0o600), None), Err(Error::Invalid));
    assert_eq!(ns.make(me(1), 4096, 100, mode(0o600), None), Err(Error::Invalid));
    assert_eq!(ns.make(me(1), 4096, 4096, mode(0o1000), None), Err(Error::Invalid));
    assert_eq!(ns.make(me(1), u64::MAX - 4095, 8192, mode(0o600), None), Err(Error::Invalid));
    let whole = ns.make(me(1), 0, MAXADDR_SIZE, mode(0o600), None).unwrap();
    assert_eq!(ns.segment(whole).unwrap().size, USER_ADDRESS_LIMIT);
    // Overlapping segments are fine.
    let a = ns.make(me(1), 0x10000, 0x4000, mode(0o600), None).unwrap();
    let b = ns.make(me(1), 0x10000, 0x4000, mode(0o600), None).unwrap();
    assert_ne!(a, b);
    assert_eq!(a.enclave(), NAME_SERVER_ENCLAVE);
}

#[test]
fn remove_get_release_attach_errors() {
    let mut ns = NameServer::new(0);
    let seg = ns.make(me(1), 0x10000, 0x10000, mode(0o600), None).unwrap();
    assert_eq!(ns.remove(me(2), seg), Err(Error::Denied));
    let unknown = SegmentId::new(1, 12345).unwrap();
    assert_eq!(ns.remove(me(1), unknown), Err(Error::NotFound));
    assert_eq!(ns.get(me(2), &rooted(), unknown, ACCESS_READ_WRITE), Err(Error::NotFound));
    assert_eq!(ns.get(me(2), &rooted(), seg, 9999), Err(Error::Invalid));
    assert_eq!(ns.get(me(2), &rooted(), seg, 3), Err(Error::Invalid));
    let (ro, size) = ns.get(me(2), &rooted(), seg, ACCESS_READ_ONLY).unwrap();
    assert_eq!(size, 0x10000);
    // RDONLY permits cannot attach (XPMEM: EACCES).
    assert_eq!(ns.attach(me(2), ro, 0, 4096), Err(Error::Denied));
    let (rw, _) = ns.get(me(2), &rooted(), seg, ACCESS_READ_WRITE).unwrap();
    assert_eq!(ns.attach(me(3), rw, 0, 4096), Err(Error::Denied), "someone else's apid");
    assert_eq!(ns.attach(me(2), rw, 100, 4096), Err(Error::Invalid), "unaligned offset");
    assert_eq!(ns.attach(me(2), rw, 0, 0x10001), Err(Error::Invalid), "rounded up past the end");
    assert_eq!(ns.attach(me(2), rw, 0x10000, 4096), Err(Error::Invalid), "past the end");
    assert_eq!(ns.attach(me(2), rw, !4095, 4096), Err(Error::Invalid), "overflow");
    let plan = ns.attach(me(2), rw, 0x4000, 100).unwrap();
    assert_eq!(plan, AttachPlan { segment: seg, owner: me(1), vaddr: 0x14000, size: 4096 });
    assert_eq!(ns.release(me(3), rw), Err(Error::Denied));
    ns.release(me(2), rw).unwrap();
    assert_eq!(ns.release(me(2), rw), Err(Error::NotFound));
    // Remove drops the remaining permits; a second remove fails.
    assert_eq!(ns.remove(me(1), seg).unwrap(), vec![ro]);
    assert_eq!(ns.remove(me(1), seg), Err(Error::NotFound));
    assert_eq!(ns.attach(me(2), ro, 0, 4096), Err(Error::NotFound));
    assert_eq!(ns.permit_count(), 0);
}

#[test]
fn whole_address_space_attach_offset_is_the_owner_address() {
    let mut ns = NameServer::new(0);
    let seg = ns.make(me(1), 0, MAXADDR_SIZE, mode(0o600), None).unwrap();
    let (apid, _) = ns.get(me(2), &rooted(), seg, ACCESS_READ_WRITE).unwrap();
    let plan = ns.attach(me(2), apid, 0x7f00_1234_5000, 8192).unwrap();
    assert_eq!(plan.vaddr, 0x7f00_1234_5000);
}

#[test]
fn names_lookup_listing_and_signals() {
    let mut ns = NameServer::new(0);
    let name = Name::new(b"cg-solution").unwrap();
    let seg = ns.make(me(1), 0x10000, 0x1000, mode(0o600), Some(name.clone())).unwrap();
    assert_eq!(ns.make(me(1), 0x20000, 0x1000, mode(0o600), Some(name.clone())), Err(Error::NameTaken));
    assert_eq!(ns.lookup(&name), Ok(seg));
    assert_eq!(ns.lookup(&Name::new(b"nope").unwrap()), Err(Error::NotFound));
    let other = ns.make(me(1), 0x20000, 0x1000, mode(0o600), None).unwrap();
    let listing = ns.list(0, 10);
    assert_eq!(listing.len(), 2);
    assert_eq!(listing[0].name.as_ref(), Some(&name));
    assert_eq!(ns.list(seg.raw(), 10)[0].segment, other);
    let (apid, _) = ns.get(me(2), &rooted(), seg, ACCESS_READ_WRITE).unwrap();
    assert_eq!(ns.signal(me(2), apid), Ok((me(1), seg)));
    assert_eq!(ns.signal(me(3), apid), Err(Error::Denied));
    ns.remove(me(1), seg).unwrap();
    assert_eq!(ns.lookup(&name), Err(Error::NotFound), "the name goes with the segment");
    assert!(Name::new(b"").is_err() && Name::new(b"a b").is_err() && Name::new(&[b'x'; 64]).is_err());
}

#[test]
fn a_gone_process_takes_its_segments_and_permits() {
    let mut ns = NameServer::new(0);
    let seg = ns.make(me(1), 0x10000, 0x1000, mode(0o600), None).unwrap();
    let (apid, _) = ns.get(me(2), &rooted(), seg, ACCESS_READ_WRITE).unwrap();
    let other = ns.make(me(2), 0x10000, 0x1000, mode(0o600), None).unwrap();
    let (mine, _) = ns.get(me(1), &rooted(), other, ACCESS_READ_WRITE).unwrap();
    let gone = ns.forget(|p| *p == me(1));
    assert_eq!(gone.len(), 1);
    assert_eq!(ns.attach(me(2), apid, 0, 4096), Err(Error::NotFound));
    assert_eq!(ns.release(me(1), mine), Err(Error::NotFound));
    assert!(ns.segment(other).is_some());
}

#[test]
fn removing_an_owners_segments_keeps_the_permits_it_holds() {
    let mut ns = NameServer::new(0);
    let name = Name::new(b"job-output").unwrap();
    let seg = ns.make(me(1), 0x10000, 0x1000, mode(0o600), Some(name.clone())).unwrap();
    let (apid, _) = ns.get(me(2), &rooted(), seg, ACCESS_READ_WRITE).unwrap();
    let other = ns.make(me(2), 0x10000, 0x1000, mode(0o600), None).unwrap();
    let (mine, _) = ns.get(me(1), &rooted(), other, ACCESS_READ_WRITE).unwrap();
    let removed = ns.remove_owned(|p| *p == me(1));
    assert_eq!(removed.iter().map(|s| s.id).collect::<Vec<_>>(), vec![seg]);
    assert_eq!(ns.lookup(&name), Err(Error::NotFound), "the name goes with the segment");
    assert_eq!(ns.attach(me(2), apid, 0, 4096), Err(Error::NotFound), "permits on it go");
    assert!(ns.attach(me(1), mine, 0, 4096).is_ok(), "the owner's own permits stay");
}

#[test]
fn enclave_ids_are_unique_and_reused_only_after_release() {
    let mut ns = NameServer::new(0);
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..1000 {
        let id = ns.allocate_enclave().unwrap();
        assert!(id > NAME_SERVER_ENCLAVE);
        assert!(seen.insert(id));
    }
}

#[test]
fn name_servers_of_different_instances_hand_out_disjoint_ids_and_refuse_each_others() {
    let mut rng = Rng::new(29);
    for _ in 0..50 {
        let mut a = NameServer::new(rng.next());
        let mut b = NameServer::new(rng.next());
        // The same history on both, as a daemon before and after a restart would see it.
        let history = |ns: &mut NameServer| {
            let enclaves: Vec<EnclaveId> = (0..64).map(|_| ns.allocate_enclave().unwrap()).collect();
            let mut segments = Vec::new();
            let mut permits = Vec::new();
            for owner in [NAME_SERVER_ENCLAVE, enclaves[0]] {
                for process in 1..=32 {
                    let owner = Principal { enclave: owner, process };
                    let segment = ns.make(owner, 0x10000, 0x4000, mode(0o666), None).unwrap();
                    permits.push(ns.get(me(process), &rooted(), segment, ACCESS_READ_WRITE).unwrap().0);
                    segments.push(segment);
                }
            }
            (enclaves, segments, permits)
        };
        let (enclaves_a, segments_a, permits_a) = history(&mut a);
        let (enclaves_b, segments_b, permits_b) = history(&mut b);
        assert!(enclaves_a.iter().all(|e| *e > NAME_SERVER_ENCLAVE && *e <= MAX_ENCLAVE_ID));
        assert!(enclaves_a.iter().all(|e| !enclaves_b.contains(e)), "{enclaves_a:?} {enclaves_b:?}");
        assert!(segments_a.iter().all(|s| !segments_b.contains(s)));
        assert!(permits_a.iter().all(|p| !permits_b.contains(p)));
        assert!(permits_a.iter().chain(&permits_b).all(|p| p.local() <= MAX_NAME_SERVER_LOCAL));
        for segment in &segments_a {
            assert_eq!(b.get(me(1), &rooted(), *segment, ACCESS_READ_WRITE), Err(Error::NotFound));
            assert_eq!(b.remove(me(1), *segment), Err(Error::NotFound));
        }
        for (process, permit) in (1..=32).cycle().zip(&permits_a) {
            assert_eq!(b.attach(me(process), *permit, 0, 4096), Err(Error::NotFound));
            assert_eq!(b.release(me(process), *permit), Err(Error::NotFound));
        }
    }
}

#[test]
fn id_counters_wrap_within_their_range_from_any_start() {
    let mut rng = Rng::new(31);
    for _ in 0..1000 {
        let first = 1 + rng.below(100) as u32;
        let last = first + rng.below(100) as u32;
        let mut counter = IdCounter::new(first, last, rng.next());
        let ids: std::collections::BTreeSet<u32> = (first..=last).map(|_| counter.next_id()).collect();
        assert_eq!(ids, (first..=last).collect(), "each id once per round");
    }
    let mut full = IdCounter::new(1, MAX_LOCAL_ID, u64::MAX);
    assert!((0..1000).all(|_| (1..=MAX_LOCAL_ID).contains(&full.next_id())));
}

// ---------------------------------------------------------------------------------------------
// wire

fn random_name(rng: &mut Rng) -> Name {
    let len = 1 + rng.below(MAX_NAME_LEN as u64) as usize;
    Name::new(&(0..len).map(|_| 0x21 + rng.below(94) as u8).collect::<Vec<_>>()).unwrap()
}

fn random_body(rng: &mut Rng) -> Body {
    let seg = SegmentId::new(1 + rng.below(1000) as u32, 1 + rng.below(1 << 20) as u32).unwrap();
    let apid = AccessId::new(1, 1 + rng.below(1 << 20) as u32).unwrap();
    let page = |rng: &mut Rng| rng.below(1 << 30) * PAGE_SIZE;
    match rng.below(25) {
        0 => Body::PingNameServer,
        1 => Body::PongNameServer,
        2 => Body::EnclaveIdRequest { token: rng.next() },
        3 => Body::EnclaveIdResponse { token: rng.next(), enclave: 1 + rng.below(1000) as u32 },
        4 => Body::EnclaveGone { enclave: 2 },
        5 => Body::Make {
            process: rng.next(),
            vaddr: page(rng),
            size: if rng.chance(200) { MAXADDR_SIZE } else { page(rng) + PAGE_SIZE },
            uid: rng.next() as u32,
            gid: rng.next() as u32,
            mode: rng.below(0o1000) as u32,
            name: if rng.chance(500) { Some(random_name(rng)) } else { None },
        },
        6 => Body::Remove { process: rng.next(), segment: seg },
        7 => Body::Get {
            process: rng.next(),
            segment: seg,
            access: 1 + rng.below(2) as u32,
            uid: rng.next() as u32,
            groups: (0..rng.below(MAX_GROUPS as u64 + 1)).map(|_| rng.next() as u32).collect(),
        },
        8 => Body::Release { process: rng.next(), access: apid },
        9 => Body::Attach { process: rng.next(), access: apid, offset: page(rng), size: page(rng) + PAGE_SIZE },
        10 => Body::Detach { process: rng.next(), access: apid },
        11 => Body::Lookup { name: random_name(rng) },
        12 => Body::List { after: rng.next() as i64 },
        13 => Body::Signal { process: rng.next(), access: apid },
        14 => Body::Serve {
            requester: 1 + rng.below(100) as u32,
            owner_process: rng.next(),
            segment: seg,
            vaddr: page(rng),
            size: page(rng) + PAGE_SIZE,
        },
        15 => Body::Notify { owner_process: rng.next(), segment: seg },
        16 => Body::Made { segment: seg },
        17 => Body::Done,
        18 => Body::Granted { access: apid, size: page(rng) },
        19 => {
            let count = 1 + rng.below(MAX_RUNS_PER_MESSAGE as u64) as usize;
            let runs: Vec<FrameRun> = (0..count)
                .map(|_| FrameRun { first: if rng.chance(100) { None } else { Some(rng.below(1 << 30)) }, frames: 1 + rng.below(1000) })
                .collect();
            let size = runs.iter().map(|r| r.frames).sum::<u64>() * PAGE_SIZE;
            Body::Attached(AttachedPart { segment: seg, size, first_run: 0, total_runs: count as u32, runs, valid_while: None })
        }
        20 => Body::Found { segment: seg },
        21 => Body::Listed {
            more: rng.chance(500),
            entries: (0..rng.below(MAX_LIST_ENTRIES as u64 + 1))
                .map(|_| ListEntry {
                    segment: seg,
                    owner: 1 + rng.below(100) as u32,
                    size: page(rng),
                    name: if rng.chance(500) { Some(random_name(rng)) } else { None },
                })
                .collect(),
        },
        22 => Body::Revoke { process: rng.next(), access: apid },
        23 => Body::Revoked { process: rng.next(), access: apid },
        _ => Body::Failed { error: Error::from_code(1 + rng.below(8) as u16).unwrap() },
    }
}

#[test]
fn every_message_round_trips_and_every_truncation_or_extension_fails() {
    let mut rng = Rng::new(0x5eed);
    for _ in 0..3000 {
        let message = Message::new(rng.next(), rng.below(100) as u32, rng.below(100) as u32, random_body(&mut rng));
        let bytes = message.to_bytes().unwrap();
        assert_eq!(Message::decode(&bytes), Ok(message.clone()));
        // Cut anywhere, or one byte more: malformed.
        let cut = rng.below(bytes.len() as u64) as usize;
        assert_eq!(Message::decode(&bytes[..cut]), Err(Error::Malformed));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Message::decode(&longer), Err(Error::Malformed));
        // A fixed body length, but a byte of it lost and another one appended.
        let mut shifted = bytes.clone();
        if shifted.len() > HEADER_LEN {
            shifted.remove(HEADER_LEN);
            shifted.push(0);
            let _ = Message::decode(&shifted); // must not panic; may decode to something valid
        }
        // Random corruption never panics, and whatever decodes re-encodes to the same bytes.
        let mut corrupt = bytes.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(corrupt.len() as u64) as usize;
            corrupt[i] = rng.next() as u8;
        }
        if let Ok(decoded) = Message::decode(&corrupt) {
            assert_eq!(decoded.to_bytes().unwrap(), corrupt);
        }
    }
}

#[test]
fn decoder_rejects_out_of_range_fields() {
    let encode = |body: Body| Message::new(1, 2, 1, body).to_bytes().unwrap();
    let seg = SegmentId::new(2, 1).unwrap();
    let apid = AccessId::new(1, 1).unwrap();
    let mut bytes = encode(Body::Make { process: 1, vaddr: 4096, size: 4096, uid: 0, gid: 0, mode: 0o600, name: None });
    bytes[HEADER_LEN + 8] = 1; // vaddr 4097
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed));
    let mut bytes = encode(Body::Make { process: 1, vaddr: 4096, size: 4096, uid: 0, gid: 0, mode: 0o600, name: None });
    bytes[HEADER_LEN + 32..HEADER_LEN + 36].copy_from_slice(&0o1000u32.to_le_bytes());
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "mode beyond 0777");
    let mut bytes = encode(Body::Get { process: 1, segment: seg, access: 1, uid: 0, groups: vec![] });
    bytes[HEADER_LEN + 16] = 3; // RDONLY|RDWR
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed));
    let mut bytes = encode(Body::Remove { process: 1, segment: seg });
    bytes[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&apid.raw().to_le_bytes());
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "an apid where a segid belongs");
    let mut bytes = encode(Body::Remove { process: 1, segment: seg });
    bytes[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&(-1i64).to_le_bytes());
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed));
    // Frame runs: zero-length runs, overflowing runs, counts beyond the bytes present (the
    // runs end one byte before the message: the word's flag follows them).
    let run_body = |runs: Vec<FrameRun>, size: u64, total: u32| {
        encode(Body::Attached(AttachedPart { segment: seg, size, first_run: 0, total_runs: total, runs, valid_while: None }))
    };
    let mut bytes = run_body(vec![FrameRun { first: Some(5), frames: 1 }], 4096, 1);
    let at = bytes.len() - 9;
    bytes[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "empty run");
    let mut bytes = run_body(vec![FrameRun { first: Some(5), frames: 1 }], 4096, 1);
    let at = bytes.len() - 17;
    bytes[at..at + 8].copy_from_slice(&(MAX_FRAME - 1).to_le_bytes());
    bytes[at + 8..at + 16].copy_from_slice(&2u64.to_le_bytes());
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "run beyond the frame space");
    let mut bytes = run_body(vec![FrameRun { first: Some(5), frames: 1 }], 4096, 1);
    let count_at = bytes.len() - 21;
    bytes[count_at..count_at + 4].copy_from_slice(&1000u32.to_le_bytes());
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "count beyond the bytes");
    let bytes = run_body(vec![FrameRun { first: Some(5), frames: 1 }], 4096, 0);
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "zero total");
    // Header: wrong version, nonzero reserved bits, a length that disagrees.
    for (at, value) in [(0usize, 2u8), (2, 1), (4, 9)] {
        let mut bytes = encode(Body::Done);
        bytes[at] = value;
        assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "header byte {at}");
    }
    let mut bytes = encode(Body::Done);
    bytes[1] = 99;
    assert_eq!(Message::decode(&bytes), Err(Error::Malformed), "unknown kind");
}

#[test]
fn run_assembler_needs_every_part_in_order_and_the_right_total() {
    let seg = SegmentId::new(2, 1).unwrap();
    let runs: Vec<FrameRun> = (0..9000u64).map(|i| FrameRun { first: Some(i * 10), frames: 1 }).collect();
    let size = 9000 * PAGE_SIZE;
    let word = MappingWord { address: 0x1_0000_0008, value: 77 };
    let parts = attached_parts(seg, size, &runs, Some(word)).unwrap();
    assert_eq!(parts.len(), 3);
    let push = |asm: &mut RunAssembler, body: &Body| match body {
        Body::Attached(part) => asm.push(part.clone()),
        _ => unreachable!(),
    };
    let mut asm = RunAssembler::default();
    assert_eq!(push(&mut asm, &parts[0]), Ok(None));
    assert_eq!(push(&mut asm, &parts[2]), Err(Error::Malformed), "gap");
    let mut asm = RunAssembler::default();
    assert_eq!(push(&mut asm, &parts[0]), Ok(None));
    assert_eq!(push(&mut asm, &parts[0]), Err(Error::Malformed), "repeat");
    let mut asm = RunAssembler::default();
    assert_eq!(push(&mut asm, &parts[0]), Ok(None));
    assert_eq!(push(&mut asm, &parts[1]), Ok(None));
    assert_eq!(push(&mut asm, &parts[2]), Ok(Some((runs.clone(), Some(word)))), "the first part's word");
    assert!(matches!(parts[1], Body::Attached(AttachedPart { valid_while: None, .. })), "only the first part carries the word");
    let part =
        |size, first_run, total_runs, runs, valid_while| AttachedPart { segment: seg, size, first_run, total_runs, runs, valid_while };
    // Pages that do not add up to the size: refused.
    let mut asm = RunAssembler::default();
    assert_eq!(asm.push(part(3 * PAGE_SIZE, 0, 1, vec![FrameRun { first: Some(1), frames: 2 }], None)), Err(Error::Malformed));
    // A word on a later part: refused.
    let mut asm = RunAssembler::default();
    let first = FrameRun { first: Some(1), frames: 1 };
    assert_eq!(asm.push(part(2 * PAGE_SIZE, 0, 2, vec![first], None)), Ok(None));
    assert_eq!(asm.push(part(2 * PAGE_SIZE, 1, 2, vec![first], Some(word))), Err(Error::Malformed));
}

#[test]
fn an_attach_answers_word_travels_in_its_first_part_only() {
    let segment = SegmentId::new(2, 1).unwrap();
    let runs = vec![FrameRun { first: Some(5), frames: 2 }];
    let word = MappingWord { address: 0x2_0000_0010, value: u64::MAX };
    let body = |first_run, valid_while| {
        Body::Attached(AttachedPart { segment, size: 2 * PAGE_SIZE, first_run, total_runs: 3, runs: runs.clone(), valid_while })
    };
    let bytes = Message::new(3, 1, 2, body(0, Some(word))).to_bytes().unwrap();
    assert_eq!(Message::decode(&bytes).unwrap().body, body(0, Some(word)));
    assert_eq!(Message::new(3, 1, 2, body(1, Some(word))).to_bytes(), Err(Error::Invalid), "a later part's word is not sent");
    // The flag byte follows the runs; the word's address is 8-aligned, not 0, and physical.
    let flag_at = bytes.len() - 17;
    assert_eq!(bytes[flag_at], 1);
    for (what, patch) in [
        ("flag 2", vec![(flag_at, 2u8)]),
        ("address 0", (1..9).map(|i| (flag_at + i, 0u8)).collect()),
        ("address unaligned", vec![(flag_at + 1, 0x11)]),
        ("address beyond physical memory", vec![(flag_at + 8, 0xff)]),
    ] {
        let mut bad = bytes.clone();
        for (at, value) in patch {
            bad[at] = value;
        }
        assert_eq!(Message::decode(&bad), Err(Error::Malformed), "{what}");
    }
    // A word on a part other than the first: malformed.
    let later = Message::new(3, 1, 2, body(1, None)).to_bytes().unwrap();
    let mut with_word = later[..later.len() - 1].to_vec();
    with_word.push(1);
    with_word.extend_from_slice(&word.address.to_le_bytes());
    with_word.extend_from_slice(&word.value.to_le_bytes());
    assert_eq!(Message::decode(&with_word), Err(Error::Malformed));
}
