use crate::ids::*;
use crate::nameserver::*;
use crate::node::*;
use crate::perm::*;
use crate::wire::*;
use crate::*;
use std::collections::VecDeque;
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

fn me(process: u64) -> Principal {
    Principal { enclave: NAME_SERVER_ENCLAVE, process }
}
fn rooted() -> Credentials {
    Credentials { uid: 0, groups: vec![0] }
}
fn mode(mode: u32) -> Owner {
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

// ---------------------------------------------------------------------------------------------
// A network of nodes: random trees, lossy and reordering links.

/// Each enclave's memory: process p's page v is frame `enclave << 28 | p << 20 | v` (mod the
/// frame space), contiguous in runs of `run` pages; pages at or above `hole_from` are holes.
/// Any mix-up between enclaves, processes or offsets shows in the frame numbers.
struct ModelMemory {
    enclave: EnclaveId,
    run: u64,
    notified: Vec<(u64, SegmentId)>,
    revoked: Vec<(u64, AccessId)>,
}

const HOLE_FROM: u64 = 0x4000_0000;

fn expected_frame(enclave: EnclaveId, process: u64, page: u64) -> u64 {
    ((enclave as u64) << 28 | (process & 0xff) << 20 | (page & 0xfffff)) % MAX_FRAME
}

impl ModelMemory {
    fn expected(enclave: EnclaveId, run: u64, process: u64, vaddr: u64, size: u64) -> Vec<FrameRun> {
        let mut runs: Vec<FrameRun> = Vec::new();
        for page in vaddr / PAGE_SIZE..(vaddr + size) / PAGE_SIZE {
            let hole = page * PAGE_SIZE >= HOLE_FROM;
            let frame = expected_frame(enclave, process, page);
            let contiguous = page % run != 0;
            match runs.last_mut() {
                Some(last) if hole && last.first.is_none() => last.frames += 1,
                Some(last) if !hole && contiguous && last.first.is_some_and(|f| f + last.frames == frame) => last.frames += 1,
                _ => runs.push(FrameRun { first: if hole { None } else { Some(frame) }, frames: 1 }),
            }
        }
        runs
    }
}

impl LocalMemory for ModelMemory {
    fn resolve(&mut self, process: u64, vaddr: u64, size: u64) -> Result<Vec<FrameRun>, Error> {
        Ok(Self::expected(self.enclave, self.run, process, vaddr, size))
    }
    fn notify(&mut self, process: u64, segment: SegmentId) {
        self.notified.push((process, segment));
    }
    fn revoke(&mut self, process: u64, access: AccessId) {
        self.revoked.push((process, access));
    }
}

pub(crate) struct Net {
    pub(crate) nodes: Vec<Node>,
    memory: Vec<ModelMemory>,
    /// link endpoints: for node n, link l leads to (node, link at that node).
    peers: Vec<Vec<(usize, LinkId)>>,
    in_flight: VecDeque<(usize, LinkId, Vec<u8>)>,
    rng: Rng,
    drop_per_thousand: u64,
    reorder: bool,
    now: u64,
}

impl Net {
    /// A random tree of `n` enclaves; the name server sits at a random one of them.
    pub(crate) fn tree(n: usize, seed: u64, drop_per_thousand: u64, reorder: bool) -> Net {
        let mut rng = Rng::new(seed | 1);
        let ns_at = rng.below(n as u64) as usize;
        let mut peers: Vec<Vec<(usize, LinkId)>> = vec![Vec::new(); n];
        for child in 1..n {
            let parent = rng.below(child as u64) as usize;
            let child_link = peers[child].len() as LinkId;
            let parent_link = peers[parent].len() as LinkId;
            peers[child].push((parent, parent_link));
            peers[parent].push((child, child_link));
        }
        let timing = Timing { retry_after: 200, attempts: 8 };
        let nodes = (0..n).map(|i| Node::new(peers[i].len() as u32, (i == ns_at).then(|| NameServer::new(seed)), timing)).collect();
        let memory =
            (0..n).map(|_| ModelMemory { enclave: 0, run: 1 + rng.below(64), notified: Vec::new(), revoked: Vec::new() }).collect();
        Net { nodes, memory, peers, in_flight: VecDeque::new(), rng, drop_per_thousand, reorder, now: 0 }
    }

    /// A path of `n` enclaves, the name server (instance `seed`) at `name_server_at`; each
    /// enclave's memory a run of its own (enclave `i`'s frames start at `1 + i`).
    fn chain(n: usize, name_server_at: usize, timing: Timing, seed: u64) -> Net {
        let mut peers: Vec<Vec<(usize, LinkId)>> = vec![Vec::new(); n];
        for i in 1..n {
            let a = peers[i - 1].len() as LinkId;
            let b = peers[i].len() as LinkId;
            peers[i - 1].push((i, b));
            peers[i].push((i - 1, a));
        }
        let nodes =
            (0..n).map(|i| Node::new(peers[i].len() as u32, (i == name_server_at).then(|| NameServer::new(seed)), timing)).collect();
        let memory = (0..n).map(|i| ModelMemory { enclave: 0, run: 1 + i as u64, notified: Vec::new(), revoked: Vec::new() }).collect();
        Net { nodes, memory, peers, in_flight: VecDeque::new(), rng: Rng::new(seed | 1), drop_per_thousand: 0, reorder: false, now: 0 }
    }

    fn collect(&mut self, node: usize) {
        for (link, message) in self.nodes[node].outbox() {
            let bytes = message.to_bytes().expect("a node only sends encodable messages");
            let (peer, peer_link) = self.peers[node][link as usize];
            self.in_flight.push_back((peer, peer_link, bytes));
        }
    }

    /// Delivers (dropping and reordering as configured) until quiet, then advances time.
    fn step(&mut self) {
        let mut budget = 200_000;
        while let Some(item) = if self.reorder && !self.in_flight.is_empty() {
            let i = self.rng.below(self.in_flight.len() as u64) as usize;
            self.in_flight.swap_remove_back(i)
        } else {
            self.in_flight.pop_front()
        } {
            budget -= 1;
            assert!(budget > 0, "message storm");
            let (node, link, bytes) = item;
            if self.rng.chance(self.drop_per_thousand) {
                continue;
            }
            self.nodes[node].receive(link, &bytes, &mut self.memory[node]);
            self.memory[node].enclave = self.nodes[node].id().unwrap_or(0);
            self.collect(node);
        }
        self.now += 50;
        for node in 0..self.nodes.len() {
            self.nodes[node].tick(self.now, &mut self.memory[node]);
            self.collect(node);
        }
    }

    /// A settled lossless tree of `n` enclaves and the first of them the name server is not in,
    /// with that one's enclave id: the usual client of a test.
    fn settled_with_client(n: usize, seed: u64) -> (Net, usize, EnclaveId) {
        let mut net = Net::tree(n, seed, 0, false);
        net.settle_ids();
        let client = (0..n).find(|&i| net.nodes[i].name_server().is_none()).unwrap();
        let id = net.nodes[client].id().unwrap();
        (net, client, id)
    }

    pub(crate) fn settle_ids(&mut self) {
        for _ in 0..2000 {
            if self.nodes.iter().all(|n| n.id().is_some()) {
                for (memory, node) in self.memory.iter_mut().zip(&self.nodes) {
                    memory.enclave = node.id().unwrap_or(0);
                }
                return;
            }
            self.step();
        }
        panic!("not every enclave got an id");
    }

    /// A segment of `process`'s whole address space at `node`, root's with mode 0600.
    fn make_whole_space(&mut self, node: usize, process: u64) -> SegmentId {
        let owner = Owner { uid: 0, gid: 0, mode: 0o600 };
        match self.call(node, Request::Make { process, vaddr: 0, size: MAXADDR_SIZE, owner, name: None }) {
            Ok(Reply::Made(segment)) => segment,
            other => panic!("make at {node}: {other:?}"),
        }
    }

    /// A read-write permit for root's `process` at `node` to `segment`.
    fn get_read_write(&mut self, node: usize, process: u64, segment: SegmentId) -> AccessId {
        match self.call(node, Request::Get { process, segment, access: ACCESS_READ_WRITE, credentials: rooted() }) {
            Ok(Reply::Granted { access, .. }) => access,
            other => panic!("get of {segment:?} at {node}: {other:?}"),
        }
    }

    /// Runs one request at `node` to completion (or to its give-up).
    pub(crate) fn call(&mut self, node: usize, request: Request) -> Result<Reply, Error> {
        let id = self.nodes[node].request(request, &mut self.memory[node])?;
        self.collect(node);
        for _ in 0..5000 {
            // Completions of earlier, abandoned requests are dropped here.
            if let Some(c) = self.nodes[node].completions().into_iter().find(|c| c.request == id) {
                return c.result;
            }
            self.step();
        }
        panic!("request {id} at node {node} never completed nor gave up");
    }
}

impl Net {
    /// Sends `message` to `node` over its link towards the name server, as if from that hop.
    fn deliver_from_upstream(&mut self, node: usize, message: Message) {
        let link = self.nodes[node].link_towards_name_server().expect("the node has found the name server");
        self.in_flight.push_back((node, link, message.to_bytes().unwrap()));
    }

    /// Sends `message`, from `node`, to its next hop towards the name server.
    fn send_upstream(&mut self, node: usize, message: Message) {
        let link = self.nodes[node].link_towards_name_server().expect("the node has found the name server");
        let (peer, peer_link) = self.peers[node][link as usize];
        self.in_flight.push_back((peer, peer_link, message.to_bytes().unwrap()));
    }

    /// Runs `request` at `node` as its kernel does around the node (`DirectRequest`, the
    /// answers' changes to what it serves noted), on these lossless, in-order links.
    fn call_direct(&mut self, node: usize, sequence: u64, request: Request) -> Result<Reply, Error> {
        let origin = self.nodes[node].id().unwrap();
        let (mut direct, message) = DirectRequest::new(sequence, origin, request)?;
        self.send_upstream(node, message);
        for _ in 0..20 {
            self.step();
            let answers: Vec<Message> = self.nodes[node].drain_unclaimed().collect();
            for Message { header, body } in answers {
                assert_eq!(header.request, direct.id());
                if let Some(result) = direct.answer(header.origin, body) {
                    if let Some(change) = direct.served_change(&result) {
                        self.nodes[node].note_served(change);
                    }
                    return result;
                }
            }
        }
        panic!("direct request {sequence} at node {node} got no answer");
    }
}

fn check_tree(n: usize, seed: u64, drop_per_thousand: u64, reorder: bool, pairs: usize) {
    let mut net = Net::tree(n, seed, drop_per_thousand, reorder);
    net.settle_ids();
    let ids: Vec<EnclaveId> = net.nodes.iter().map(|n| n.id().unwrap()).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), n, "enclave ids are unique: {ids:?}");
    let lossless = drop_per_thousand == 0;
    let mut rng = Rng::new(seed ^ 0xabcdef);
    let mut completed = 0;
    for round in 0..pairs {
        let owner = rng.below(n as u64) as usize;
        let attacher = rng.below(n as u64) as usize;
        let process = 1 + rng.below(200);
        let vaddr = rng.below(0x1000) * PAGE_SIZE;
        let pages = 1 + rng.below(300);
        let name = Name::new(std::format!("seg-{seed:x}-{round}").as_bytes()).unwrap();
        let made = net.call(
            owner,
            Request::Make {
                process,
                vaddr,
                size: pages * PAGE_SIZE,
                owner: Owner { uid: 1000, gid: 100, mode: 0o600 },
                name: Some(name.clone()),
            },
        );
        let segment = match made {
            Ok(Reply::Made(s)) => s,
            Err(Error::Unreachable) if !lossless => continue,
            other => panic!("make: {other:?}"),
        };
        assert_eq!(segment.enclave(), ids[owner], "a segid names its owner enclave");
        match net.call(attacher, Request::Lookup { name: name.clone() }) {
            Ok(Reply::Found(s)) => assert_eq!(s, segment),
            Err(Error::Unreachable) if !lossless => {}
            other => panic!("lookup: {other:?}"),
        }
        let who = Credentials { uid: 1000, groups: vec![100] };
        let access = match net.call(attacher, Request::Get { process: 7, segment, access: ACCESS_READ_WRITE, credentials: who.clone() }) {
            Ok(Reply::Granted { access, size }) => {
                assert_eq!(size, pages * PAGE_SIZE);
                access
            }
            Err(Error::Unreachable) if !lossless => continue,
            other => panic!("get: {other:?}"),
        };
        // Someone else's credentials are refused.
        if lossless {
            let stranger = Credentials { uid: 4242, groups: vec![4242] };
            assert_eq!(
                net.call(attacher, Request::Get { process: 7, segment, access: ACCESS_READ_ONLY, credentials: stranger }),
                Err(Error::Denied)
            );
        }
        let offset_pages = rng.below(pages);
        let attach_pages = 1 + rng.below(pages - offset_pages);
        match net.call(attacher, Request::Attach { process: 7, access, offset: offset_pages * PAGE_SIZE, size: attach_pages * PAGE_SIZE }) {
            Ok(Reply::Attached { segment: s, runs, valid_while: None }) => {
                assert_eq!(s, segment);
                let expected = ModelMemory::expected(
                    ids[owner],
                    net.memory[owner].run,
                    process,
                    vaddr + offset_pages * PAGE_SIZE,
                    attach_pages * PAGE_SIZE,
                );
                assert_eq!(runs, expected, "the attach maps exactly the owner's frames");
                completed += 1;
            }
            Err(Error::Unreachable) if !lossless => {}
            other => panic!("attach: {other:?}"),
        }
        // Attaching beyond the segment is an argument error, not a mapping.
        if lossless {
            assert_eq!(
                net.call(attacher, Request::Attach { process: 7, access, offset: pages * PAGE_SIZE, size: PAGE_SIZE }),
                Err(Error::Invalid)
            );
            assert_eq!(net.call(attacher, Request::Signal { process: 7, access }), Ok(Reply::Done));
            net.step();
            assert!(net.memory[owner].notified.contains(&(process, segment)), "the owner got the signal");
        }
        for request in [Request::Detach { process: 7, access }, Request::Release { process: 7, access }] {
            match net.call(attacher, request) {
                Ok(Reply::Done) => {}
                Err(Error::Unreachable) if !lossless => {}
                // A retried release whose first answer was lost is answered from the cache.
                other => panic!("detach/release: {other:?}"),
            }
        }
        if lossless {
            // Only the owner process may remove.
            assert_eq!(net.call(owner, Request::Remove { process: process + 1, segment }), Err(Error::Denied));
        }
        match net.call(owner, Request::Remove { process, segment }) {
            Ok(Reply::Done) => {
                if lossless {
                    assert_eq!(net.call(owner, Request::Remove { process, segment }), Err(Error::NotFound));
                    assert_eq!(
                        net.call(attacher, Request::Attach { process: 7, access, offset: 0, size: PAGE_SIZE }),
                        Err(Error::NotFound)
                    );
                }
            }
            Err(Error::Unreachable) if !lossless => {}
            other => panic!("remove: {other:?}"),
        }
    }
    assert!(completed > 0, "some attaches went through");
    if lossless {
        assert_eq!(completed, pairs);
        let ns = net.nodes.iter().find_map(|n| n.name_server()).unwrap();
        assert_eq!(ns.segment_count(), 0);
        assert_eq!(ns.permit_count(), 0);
    }
}

#[test]
fn random_trees_every_pair_makes_gets_attaches_detaches_removes() {
    for (i, n) in [1usize, 2, 3, 5, 8, 17, 33, 64].into_iter().enumerate() {
        check_tree(n, 0x1000 + i as u64, 0, false, 24);
    }
}

#[test]
fn random_trees_with_reordering_links() {
    for (i, n) in [4usize, 16, 64].into_iter().enumerate() {
        check_tree(n, 0x2000 + i as u64, 0, true, 24);
    }
}

#[test]
fn random_trees_with_lossy_reordering_links_never_map_wrong_frames() {
    for (i, n) in [6usize, 24, 64].into_iter().enumerate() {
        check_tree(n, 0x3000 + i as u64, 30, true, 24);
    }
}

#[test]
#[allow(clippy::needless_range_loop)] // owner indexes nodes, memory and ids alike
fn every_pair_in_a_deep_chain() {
    // A path of 12 enclaves: the longest route in a tree of this size; all 144 ordered pairs.
    let n = 12;
    let mut net = Net::chain(n, n / 2, Timing { retry_after: 200, attempts: 8 }, 3);
    net.settle_ids();
    let ids: Vec<EnclaveId> = net.nodes.iter().map(|n| n.id().unwrap()).collect();
    for owner in 0..n {
        let segment = net.make_whole_space(owner, 1);
        for attacher in 0..n {
            let access = net.get_read_write(attacher, 2, segment);
            // Whole-address-space segment: the offset is the owner's virtual address, and
            // a range reaching past HOLE_FROM comes back with a hole.
            let offset = HOLE_FROM - 4 * PAGE_SIZE;
            let Ok(Reply::Attached { runs, .. }) = net.call(attacher, Request::Attach { process: 2, access, offset, size: 8 * PAGE_SIZE })
            else {
                panic!("attach")
            };
            assert_eq!(runs, ModelMemory::expected(ids[owner], net.memory[owner].run, 1, offset, 8 * PAGE_SIZE));
            assert_eq!(runs.last().unwrap().first, None);
            assert_eq!(net.call(attacher, Request::Release { process: 2, access }), Ok(Reply::Done));
        }
        assert_eq!(net.call(owner, Request::Remove { process: 1, segment }), Ok(Reply::Done));
    }
}

#[test]
fn request_ids_and_answers_are_told_from_the_header_alone() {
    let id = (1 << 63) | 5;
    let mut bytes =
        Message::new(id, 3, NAME_SERVER_ENCLAVE, Body::Detach { process: 1, access: AccessId::new(3, 1).unwrap() }).to_bytes().unwrap();
    assert_eq!(request_id(&bytes), Some(id));
    bytes.truncate(HEADER_LEN);
    assert_eq!(request_id(&bytes), Some(id), "the body is not needed");
    assert_eq!(request_id(&bytes[..15]), None, "too short for the id");
    assert_eq!(answered_request(&bytes), None, "a request, not an answer");
    let done = Message::new(id, NAME_SERVER_ENCLAVE, 3, Body::Done).to_bytes().unwrap();
    assert_eq!(answered_request(&done), Some(id));
}

#[test]
fn an_answer_to_a_request_sent_around_the_node_is_handed_out_unclaimed() {
    // The enclave's kernel asks the name server directly (an id the node never uses) to attach
    // a segment of its own enclave: the node serves it and the answer comes back through it.
    let (mut net, client, id) = Net::settled_with_client(2, 7);
    let made = net.call(client, Request::Make { process: 4, vaddr: 0x10000, size: 0x4000, owner: mode(0o600), name: None });
    let Ok(Reply::Made(segment)) = made else { panic!("make: {made:?}") };
    let credentials = Credentials { uid: 1000, groups: vec![100] };
    let granted = net.call(client, Request::Get { process: 5, segment, access: ACCESS_READ_WRITE, credentials });
    let Ok(Reply::Granted { access, .. }) = granted else { panic!("get: {granted:?}") };
    let request = FIRST_UNCLAIMED_ID + 3;
    let attach = Request::Attach { process: 5, access, offset: 0x1000, size: 0x2000 }.into_body().unwrap();
    net.send_upstream(client, Message::new(request, id, NAME_SERVER_ENCLAVE, attach));
    let mut answers = Vec::new();
    for _ in 0..20 {
        net.step();
        answers.extend(net.nodes[client].drain_unclaimed());
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].header.request, request);
    let Body::Attached(AttachedPart { segment: answered, size, ref runs, .. }) = answers[0].body else { panic!("{:?}", answers[0].body) };
    assert_eq!((answered, size), (segment, 0x2000));
    assert_eq!(*runs, ModelMemory::expected(id, net.memory[client].run, 4, 0x11000, 0x2000));
    assert!(net.nodes[client].completions().is_empty(), "not the node's own request");
}

#[test]
fn a_direct_attach_takes_only_its_own_answer_and_assembles_its_parts() {
    let segment = SegmentId::new(7, 3).unwrap();
    let access = AccessId::new(NAME_SERVER_ENCLAVE, 9).unwrap();
    let size = 5 * PAGE_SIZE;
    let (mut request, message) = DirectRequest::attach(4, 2, 11, access, segment, 0, size).unwrap();
    assert_eq!(request.id(), FIRST_UNCLAIMED_ID | 4);
    assert_eq!(message.header, Header { request: request.id(), origin: 2, destination: NAME_SERVER_ENCLAVE });
    assert_eq!(message.body, Body::Attach { process: 11, access, offset: 0, size });
    let part =
        |first_run, runs: Vec<FrameRun>| Body::Attached(AttachedPart { segment, size, first_run, total_runs: 3, runs, valid_while: None });
    let first = vec![FrameRun { first: Some(100), frames: 2 }, FrameRun { first: None, frames: 1 }];
    let last = vec![FrameRun { first: Some(300), frames: 2 }];
    // Not answers to it: another enclave, another segment or size, another kind.
    assert_eq!(request.answer(5, part(0, first.clone())), None);
    let other = SegmentId::new(7, 4).unwrap();
    assert_eq!(
        request.answer(
            1,
            Body::Attached(AttachedPart { segment: other, size, first_run: 0, total_runs: 3, runs: first.clone(), valid_while: None })
        ),
        None
    );
    assert_eq!(
        request.answer(
            1,
            Body::Attached(AttachedPart {
                segment,
                size: size + PAGE_SIZE,
                first_run: 0,
                total_runs: 3,
                runs: first.clone(),
                valid_while: None
            })
        ),
        None
    );
    assert_eq!(request.answer(1, Body::Done), None);
    // The owner (enclave 7) may answer as well as the name server; two parts make the runs.
    assert_eq!(request.answer(7, part(0, first.clone())), None);
    let whole = [first.clone(), last.clone()].concat();
    assert_eq!(request.answer(1, part(2, last.clone())), Some(Ok(Reply::Attached { segment, runs: whole, valid_while: None })));
    // A part out of place fails it (the channel neither loses nor reorders).
    let (mut request, _) = DirectRequest::attach(5, 2, 11, access, segment, 0, size).unwrap();
    assert_eq!(request.answer(1, part(2, last)), Some(Err(Error::Malformed)));
    // The name server's refusal is the result.
    let (mut request, _) = DirectRequest::attach(6, 2, 11, access, segment, 0, size).unwrap();
    assert_eq!(request.answer(1, Body::Failed { error: Error::Denied }), Some(Err(Error::Denied)));
    // Checked before it is sent.
    assert_eq!(DirectRequest::attach(7, 2, 11, access, segment, 1, size).err(), Some(Error::Invalid));
}

#[test]
fn other_direct_requests_take_their_kind_of_answer_from_the_name_server_alone() {
    let access = AccessId::new(NAME_SERVER_ENCLAVE, 9).unwrap();
    let segment = SegmentId::new(7, 3).unwrap();
    let (mut request, message) = DirectRequest::new(1, 2, Request::Detach { process: 11, access }).unwrap();
    assert_eq!(message.body, Body::Detach { process: 11, access });
    assert_eq!(request.answer(3, Body::Done), None, "only the name server answers a detach");
    assert_eq!(request.answer(1, Body::Granted { access, size: PAGE_SIZE }), None);
    assert_eq!(request.answer(1, Body::Done), Some(Ok(Reply::Done)));
    let credentials = Credentials { uid: 1000, groups: vec![100] };
    let (mut get, _) = DirectRequest::new(2, 2, Request::Get { process: 11, segment, access: ACCESS_READ_WRITE, credentials }).unwrap();
    assert_eq!(get.answer(1, Body::Done), None);
    assert_eq!(get.answer(7, Body::Granted { access, size: PAGE_SIZE }), None, "the owner does not grant");
    assert_eq!(get.answer(1, Body::Granted { access, size: PAGE_SIZE }), Some(Ok(Reply::Granted { access, size: PAGE_SIZE })));
    let name = Name::new(b"field").unwrap();
    let (mut lookup, _) = DirectRequest::new(3, 2, Request::Lookup { name }).unwrap();
    assert_eq!(lookup.answer(1, Body::Found { segment }), Some(Ok(Reply::Found(segment))));
    let (mut list, _) = DirectRequest::new(4, 2, Request::List { after: 0 }).unwrap();
    assert_eq!(list.answer(1, Body::Listed { more: false, entries: vec![] }), Some(Ok(Reply::Listed { more: false, entries: vec![] })));
    // A make takes a segment of the asking enclave only, and is checked before it is sent.
    let make = Request::Make { process: 11, vaddr: 0x1000, size: 0x1000, owner: mode(0o600), name: None };
    let (mut made, _) = DirectRequest::new(5, 2, make.clone()).unwrap();
    assert_eq!(made.answer(1, Body::Made { segment }), None, "a segment of enclave 7");
    let ours = SegmentId::new(2, 8).unwrap();
    assert_eq!(made.answer(1, Body::Made { segment: ours }), Some(Ok(Reply::Made(ours))));
    let unaligned = Request::Make { process: 11, vaddr: 0x1001, size: 0x1000, owner: mode(0o600), name: None };
    assert_eq!(DirectRequest::new(6, 2, unaligned).err(), Some(Error::Invalid));
    let (mut removed, _) = DirectRequest::new(7, 2, Request::Remove { process: 11, segment: ours }).unwrap();
    assert_eq!(removed.answer(1, Body::Made { segment: ours }), None);
    assert_eq!(removed.answer(1, Body::Done), Some(Ok(Reply::Done)));
    // What the answers change in the segments the asking node serves: a segment removed, or
    // found gone already, is not served any more; a refused remove changes nothing.
    assert_eq!(
        made.served_change(&Ok(Reply::Made(ours))),
        Some(ServedChange::Made { segment: ours, process: 11, vaddr: 0x1000, length: 0x1000 })
    );
    assert_eq!(removed.served_change(&Ok(Reply::Done)), Some(ServedChange::Removed { segment: ours }));
    assert_eq!(removed.served_change(&Err(Error::NotFound)), Some(ServedChange::Removed { segment: ours }));
    assert_eq!(removed.served_change(&Err(Error::Denied)), None);
    // An attach needs its permit's segment.
    assert_eq!(DirectRequest::new(8, 2, Request::Attach { process: 11, access, offset: 0, size: 0x1000 }).err(), Some(Error::Invalid));
}

#[test]
fn the_node_serves_segments_made_directly_until_they_are_removed_directly() {
    let (mut net, client, id) = Net::settled_with_client(3, 11);
    let other = (0..3).find(|&i| i != client).unwrap();
    let other_id = net.nodes[other].id().unwrap();
    let make = Request::Make { process: 4, vaddr: 0x10000, size: 0x4000, owner: mode(0o666), name: None };
    let made = net.call_direct(client, 1, make);
    let Ok(Reply::Made(segment)) = made else { panic!("make: {made:?}") };
    assert_eq!(segment.enclave(), id);
    // Another enclave attaches it through the name server: the client's node serves the frames.
    let credentials = Credentials { uid: 1000, groups: vec![100] };
    let granted = net.call(other, Request::Get { process: 9, segment, access: ACCESS_READ_WRITE, credentials });
    let Ok(Reply::Granted { access, .. }) = granted else { panic!("get: {granted:?}") };
    let runs = ModelMemory::expected(id, net.memory[client].run, 4, 0x11000, 0x2000);
    assert_eq!(
        net.call(other, Request::Attach { process: 9, access, offset: 0x1000, size: 0x2000 }),
        Ok(Reply::Attached { segment, runs, valid_while: None })
    );
    assert_eq!(net.call(other, Request::Detach { process: 9, access }), Ok(Reply::Done));
    assert_eq!(net.call_direct(client, 2, Request::Remove { process: 4, segment }), Ok(Reply::Done));
    // Removed: the node no longer serves it, even when asked as the name server would.
    let serve = Body::Serve { requester: other_id, owner_process: 4, segment, vaddr: 0x10000, size: 0x1000 };
    net.deliver_from_upstream(client, Message::new(FIRST_UNCLAIMED_ID | 50, NAME_SERVER_ENCLAVE, id, serve));
    let mut answers = Vec::new();
    for _ in 0..20 {
        net.step();
        answers.extend(net.nodes[other].drain_unclaimed());
    }
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0].body, Body::Failed { error: Error::NotFound });
}

#[test]
fn a_malformed_request_is_answered_with_an_error_and_the_node_keeps_working() {
    let mut net = Net::tree(3, 99, 0, false);
    net.settle_ids();
    let ns_node = (0..3).find(|&i| net.nodes[i].name_server().is_some()).unwrap();
    let client = (0..3).find(|&i| i != ns_node).unwrap();
    let client_id = net.nodes[client].id().unwrap();
    let mut bytes = Message::new(77, client_id, NAME_SERVER_ENCLAVE, Body::List { after: 0 }).to_bytes().unwrap();
    bytes.push(0xee); // trailing garbage, body length now wrong
    let link = net.nodes[ns_node].route(client_id).unwrap();
    net.nodes[ns_node].receive(link, &bytes, &mut net.memory[ns_node]);
    let out = net.nodes[ns_node].outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1.body, Body::Failed { error: Error::Malformed });
    assert_eq!(out[0].1.header.request, 77);
    assert_eq!(net.call(client, Request::List { after: 0 }), Ok(Reply::Listed { more: false, entries: vec![] }));
}

#[test]
fn answers_from_the_wrong_enclave_or_of_the_wrong_kind_are_ignored() {
    let (mut net, client, id) = Net::settled_with_client(3, 5);
    let request = net.nodes[client].request(Request::List { after: 0 }, &mut net.memory[client]).unwrap();
    let _ = net.nodes[client].outbox(); // lose the request
    let link = net.nodes[client].link_towards_name_server().unwrap();
    let seg = SegmentId::new(1, 1).unwrap();
    for forged in [
        Message::new(request, 9, id, Body::Listed { more: false, entries: vec![] }), // not the name server
        Message::new(request, 1, id, Body::Found { segment: seg }),                  // wrong kind
        Message::new(request + 1, 1, id, Body::Listed { more: false, entries: vec![] }), // unknown request
    ] {
        net.nodes[client].receive(link, &forged.to_bytes().unwrap(), &mut net.memory[client]);
        assert!(net.nodes[client].completions().is_empty(), "{forged:?}");
    }
    assert_eq!(net.nodes[client].pending_requests(), 1);
}

#[test]
fn a_lost_enclave_takes_its_segments_and_permits_and_a_stranger_cannot_declare_it_gone() {
    // A chain 0 - 1 - 2 - 3 with the name server at 0; enclave 3 owns a segment, 1 holds a permit.
    let n = 4;
    let mut net = Net::chain(n, 0, Timing { retry_after: 200, attempts: 4 }, 4);
    net.settle_ids();
    let gone_id = net.nodes[3].id().unwrap();
    let Ok(Reply::Made(segment)) = net.call(
        3,
        Request::Make {
            process: 1,
            vaddr: 0,
            size: 16 * PAGE_SIZE,
            owner: Owner { uid: 0, gid: 0, mode: 0o600 },
            name: Some(Name::new(b"leaf").unwrap()),
        },
    ) else {
        panic!("make")
    };
    let Ok(Reply::Granted { access, .. }) =
        net.call(1, Request::Get { process: 5, segment, access: ACCESS_READ_WRITE, credentials: rooted() })
    else {
        panic!("get")
    };
    // A forged notice: enclave 3 claims that enclave 1 is gone. Enclave 2 does not reach 1
    // through its link to 3, so it drops the notice.
    let forged = Message::new(0, 3, NAME_SERVER_ENCLAVE, Body::EnclaveGone { enclave: net.nodes[1].id().unwrap() });
    let link_to_3 = net.nodes[2].route(gone_id).unwrap();
    net.nodes[2].receive(link_to_3, &forged.to_bytes().unwrap(), &mut net.memory[2]);
    net.collect(2);
    net.step();
    assert_eq!(net.nodes[0].name_server().unwrap().permit_count(), 1, "the forged notice changed nothing");
    // Enclave 2 loses its link to 3.
    net.nodes[2].link_down(link_to_3, &mut net.memory[2]);
    net.collect(2);
    net.step();
    let ns = net.nodes[0].name_server().unwrap();
    assert_eq!(ns.segment_count(), 0, "the lost enclave's segments are gone");
    assert_eq!(ns.permit_count(), 0, "and so are the permits on them");
    assert_eq!(net.call(1, Request::Lookup { name: Name::new(b"leaf").unwrap() }), Err(Error::NotFound));
    assert_eq!(net.call(1, Request::Attach { process: 5, access, offset: 0, size: PAGE_SIZE }), Err(Error::NotFound));
    assert_eq!(net.nodes[2].route(gone_id), None);
}

#[test]
fn every_ordered_pair_of_a_random_64_enclave_tree() {
    let n = 64;
    let mut net = Net::tree(n, 0x6464, 0, false);
    net.settle_ids();
    let ids: Vec<EnclaveId> = net.nodes.iter().map(|n| n.id().unwrap()).collect();
    let mut segments = Vec::new();
    for owner in 0..n {
        segments.push(net.make_whole_space(owner, 3));
    }
    for (owner, &segment) in segments.iter().enumerate() {
        for attacher in 0..n {
            let access = net.get_read_write(attacher, 4, segment);
            let offset = (attacher as u64 + 1) * 64 * PAGE_SIZE;
            let Ok(Reply::Attached { runs, .. }) = net.call(attacher, Request::Attach { process: 4, access, offset, size: 16 * PAGE_SIZE })
            else {
                panic!("attach {owner} -> {attacher}")
            };
            assert_eq!(runs, ModelMemory::expected(ids[owner], net.memory[owner].run, 3, offset, 16 * PAGE_SIZE));
            assert_eq!(net.call(attacher, Request::Detach { process: 4, access }), Ok(Reply::Done));
            assert_eq!(net.call(attacher, Request::Release { process: 4, access }), Ok(Reply::Done));
        }
        assert_eq!(net.call(owner, Request::Remove { process: 3, segment }), Ok(Reply::Done));
    }
    let ns = net.nodes.iter().find_map(|n| n.name_server()).unwrap();
    assert_eq!((ns.segment_count(), ns.permit_count()), (0, 0));
}

#[test]
fn a_gone_enclave_s_cached_answers_are_dropped_so_a_reused_id_starts_clean() {
    // The name server keeps answers per (origin, request id) for retries. An enclave id is
    // reused once freed (after the allocator wraps), and its new holder numbers its requests
    // from 1 again: the old holder's cached answers must go when it does.
    let mut net = Net::tree(2, 3, 0, false);
    let ns_node = (0..2).find(|&i| net.nodes[i].name_server().is_some()).unwrap();
    let other = 1 - ns_node;
    net.settle_ids();
    let id = net.nodes[other].id().unwrap();
    let owner = Owner { uid: 0, gid: 0, mode: 0o600 };
    assert!(matches!(net.call(other, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }), Ok(Reply::Made(_))));
    assert_eq!(net.nodes[ns_node].cached_answers_for(id), 1);
    let link = net.nodes[ns_node].route(id).unwrap();
    net.nodes[ns_node].link_down(link, &mut net.memory[ns_node]);
    assert_eq!(net.nodes[ns_node].cached_answers_for(id), 0);
    assert_eq!(net.nodes[ns_node].name_server().unwrap().segment_count(), 0);
}

#[test]
fn a_revoke_from_the_name_server_unmaps_and_is_acknowledged_and_a_forged_one_is_ignored() {
    let (mut net, holder, id) = Net::settled_with_client(6, 21);
    let up = net.nodes[holder].link_towards_name_server().unwrap();
    let access = AccessId::new(NAME_SERVER_ENCLAVE, 0x6000_0001).unwrap();
    let forged = Message::new(5, 3, id, Body::Revoke { process: 7, access });
    net.nodes[holder].receive(up, &forged.to_bytes().unwrap(), &mut net.memory[holder]);
    assert!(net.memory[holder].revoked.is_empty(), "only the name server may revoke");
    assert!(net.nodes[holder].outbox().is_empty());
    let revoke = Message::new(77, NAME_SERVER_ENCLAVE, id, Body::Revoke { process: 7, access });
    net.nodes[holder].receive(up, &revoke.to_bytes().unwrap(), &mut net.memory[holder]);
    assert_eq!(net.memory[holder].revoked, vec![(7, access)]);
    let out = net.nodes[holder].outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, up, "the acknowledgement goes back towards the name server");
    assert_eq!(out[0].1, Message::new(77, id, NAME_SERVER_ENCLAVE, Body::Revoked { process: 7, access }));
    // A permit the node does not hold (never granted, or revoked) cannot attach: no segment's
    // frames could answer it, so it fails at once.
    let attach = Request::Attach { process: 7, access, offset: 0, size: PAGE_SIZE };
    assert_eq!(net.nodes[holder].request(attach, &mut net.memory[holder]), Err(Error::NotFound));
    assert_eq!(net.nodes[holder].pending_requests(), 0);
}

#[test]
fn ids_from_before_a_name_server_restart_are_not_found_after_it() {
    // An enclave keeps a segid and an apid across a restart of its name server; the new
    // instance hands out its own and refuses the old ones instead of finding its new ones.
    let mut net = Net::tree(2, 5, 0, false);
    net.peers = vec![vec![(1, 0)], vec![(0, 0)]];
    let timing = Timing { retry_after: 200, attempts: 8 };
    net.nodes = vec![Node::new(1, Some(NameServer::new(1)), timing), Node::new(1, None, timing)];
    net.settle_ids();
    let make = Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner: Owner { uid: 0, gid: 0, mode: 0o600 }, name: None };
    let get = |segment| Request::Get { process: 2, segment, access: ACCESS_READ_WRITE, credentials: rooted() };
    let attach = |access| Request::Attach { process: 2, access, offset: 0, size: PAGE_SIZE };
    let Ok(Reply::Made(old_segment)) = net.call(1, make.clone()) else { panic!("make") };
    let Ok(Reply::Granted { access: old_access, .. }) = net.call(1, get(old_segment)) else { panic!("get") };
    net.nodes[0] = Node::new(1, Some(NameServer::new(2)), timing);
    net.in_flight.clear();
    net.nodes[1].link_down(0, &mut net.memory[1]);
    net.nodes[1].rejoin();
    net.settle_ids();
    let Ok(Reply::Made(new_segment)) = net.call(1, make) else { panic!("make after the restart") };
    let Ok(Reply::Granted { access: new_access, .. }) = net.call(1, get(new_segment)) else { panic!("get after it") };
    assert!(new_segment != old_segment && new_access != old_access);
    assert_eq!(net.call(1, get(old_segment)), Err(Error::NotFound));
    assert_eq!(net.call(1, attach(old_access)), Err(Error::NotFound));
    assert!(matches!(net.call(1, attach(new_access)), Ok(Reply::Attached { segment, .. }) if segment == new_segment));
}

#[test]
fn a_node_that_lost_its_name_server_rejoins_a_new_one_with_a_new_id() {
    // A chain: name server - middle - leaf. The middle node's upstream goes away (its name
    // server restarted); it rejoins, and a fresh name server on the same link gives it an id.
    let mut net = Net::tree(3, 5, 0, false);
    net.peers = vec![vec![(1, 0)], vec![(0, 0), (2, 0)], vec![(1, 1)]];
    let timing = Timing { retry_after: 200, attempts: 8 };
    net.nodes = vec![Node::new(1, Some(NameServer::new(1)), timing), Node::new(2, None, timing), Node::new(1, None, timing)];
    net.settle_ids();
    let leaf = net.nodes[2].id().unwrap();
    let owner = Owner { uid: 0, gid: 0, mode: 0o600 };
    let Ok(Reply::Made(segment)) = net.call(1, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }) else {
        panic!("make")
    };
    // A request in flight when the name server goes: it fails at once on rejoin.
    let pending = net.nodes[1].request(Request::Lookup { name: Name::new(b"x").unwrap() }, &mut net.memory[1]).unwrap();
    net.nodes[1].outbox();
    net.nodes[1].link_down(0, &mut net.memory[1]);
    net.nodes[1].rejoin();
    assert_eq!(net.nodes[1].id(), None);
    assert_eq!(net.nodes[1].route(leaf), None, "the leaf's id was the old name server's");
    assert!(net.nodes[1].completions().iter().any(|c| c.request == pending && c.result == Err(Error::Unreachable)));
    // A name server's node ignores rejoin.
    net.nodes[0].rejoin();
    assert_eq!(net.nodes[0].id(), Some(NAME_SERVER_ENCLAVE));
    // The restarted name server.
    net.nodes[0] = Node::new(1, Some(NameServer::new(2)), timing);
    net.in_flight.clear();
    for _ in 0..200 {
        if net.nodes[1].id().is_some() {
            break;
        }
        net.step();
    }
    let again = net.nodes[1].id().expect("a new id");
    assert!(again >= 2);
    // The leaf was told its id went with the middle node's, rejoined, and has a new one.
    for _ in 0..200 {
        if net.nodes[2].id().is_some_and(|id| id != leaf) {
            break;
        }
        net.step();
    }
    let leaf_again = net.nodes[2].id().expect("the leaf has a new id");
    assert_ne!(leaf_again, again);
    assert_eq!(net.nodes[1].route(leaf_again), Some(1));
    let Ok(Reply::Made(from_leaf)) = net.call(2, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }) else {
        panic!("make from the leaf")
    };
    assert_eq!(from_leaf.enclave(), leaf_again);
    // The old segment is unknown to the new name server; segments made now work.
    assert_eq!(net.call(1, Request::Lookup { name: Name::new(b"x").unwrap() }), Err(Error::NotFound));
    assert_eq!(net.call(1, Request::Remove { process: 1, segment }), Err(Error::NotFound));
    let Ok(Reply::Made(fresh)) = net.call(1, Request::Make { process: 1, vaddr: 0, size: PAGE_SIZE, owner, name: None }) else {
        panic!("make again")
    };
    assert_eq!(fresh.enclave(), again);
}
