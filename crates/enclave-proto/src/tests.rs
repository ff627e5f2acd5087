use super::*;
use std::vec;
use std::vec::Vec;

/// A small deterministic generator (xorshift64*), so the property tests need no extra crate
/// and every failure reproduces from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }
    /// Bytes without NUL, sometimes empty; `non_empty` for names and paths.
    fn c_string(&mut self, non_empty: bool) -> Vec<u8> {
        let length = self.below(40) as usize + non_empty as usize;
        (0..length).map(|_| 1 + self.below(255) as u8).collect()
    }
    fn data(&mut self, max: u64) -> Vec<u8> {
        let length = self.below(max) as usize;
        (0..length).map(|_| self.next() as u8).collect()
    }
}

fn encode_host(message: &HostMessage) -> Vec<u8> {
    let mut out = vec![0u8; MAX_MESSAGE_LEN];
    let length = message.encode(&mut out).unwrap();
    out.truncate(length);
    out
}

fn encode_enclave(message: &EnclaveMessage) -> Vec<u8> {
    let mut out = vec![0u8; MAX_MESSAGE_LEN];
    let length = message.encode(&mut out).unwrap();
    out.truncate(length);
    out
}

/// Sends `message` through the fragmenter in frames of `max_frame_len` and reassembles it.
fn through_frames(message: &[u8], max_frame_len: usize) -> Vec<u8> {
    let mut fragmenter = Fragmenter::new(message, max_frame_len).unwrap();
    let mut storage = vec![0u8; MAX_MESSAGE_LEN];
    let mut reassembler = Reassembler::new(&mut storage);
    let mut frame = vec![0u8; max_frame_len];
    let mut complete = None;
    while let Some(length) = fragmenter.next_frame(&mut frame) {
        assert!(length <= max_frame_len);
        assert!(complete.is_none(), "frames after the message was complete");
        if let Some(message) = reassembler.push(&frame[..length]).unwrap() {
            complete = Some(message.to_vec());
        }
    }
    complete.expect("the message was never completed")
}

fn sample_launch<'a>(argv: &'a [&'a [u8]], env: &'a [&'a [u8]], files: &'a [FileImage<'a>]) -> HostMessage<'a> {
    HostMessage::LaunchJob(LaunchJob {
        job: 7,
        argv: List::new(argv),
        env: List::new(env),
        cwd: b"/home/user/run",
        cores: 0b11,
        heap_size: 64 << 20,
        stack_size: 0,
        binary: FileImage { name: b"hello", gpa: 0x40_0000, len: 12345 },
        files: List::new(files),
        pid: 4242,
    })
}

#[test]
fn launch_job_round_trips_through_small_frames() {
    let argv: [&[u8]; 3] = [b"hello", b"one", b"two words"];
    let env: [&[u8]; 1] = [b"GREETING=hi"];
    let files = [FileImage { name: b"input.dat", gpa: 0x80_0000, len: 4096 }];
    let message = sample_launch(&argv, &env, &files);
    let bytes = encode_host(&message);
    for max_frame_len in [MIN_FRAME_LEN, 7, 64, 248, 4088] {
        let reassembled = through_frames(&bytes, max_frame_len);
        assert_eq!(HostMessage::decode(&reassembled).unwrap(), message);
    }
    let HostMessage::LaunchJob(decoded) = HostMessage::decode(&bytes).unwrap() else { panic!() };
    assert_eq!(decoded.argv.iter().collect::<Vec<_>>(), argv.to_vec());
    assert_eq!(decoded.pid, 4242);
    assert_eq!(decoded.files.iter().next().unwrap().name, b"input.dat");
}

#[test]
fn every_truncation_is_an_error() {
    let argv: [&[u8]; 2] = [b"a", b""];
    let files = [FileImage { name: b"f", gpa: 1, len: 2 }];
    let bytes = encode_host(&sample_launch(&argv, &[], &files));
    for length in 0..bytes.len() {
        assert!(matches!(HostMessage::decode(&bytes[..length]), Err(DecodeError::Truncated { .. })), "{length}");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(HostMessage::decode(&longer), Err(DecodeError::TrailingBytes { count: 1 }));
}

#[test]
fn malformed_messages_are_refused() {
    assert_eq!(HostMessage::decode(&[0x99, 0x99]), Err(DecodeError::UnknownKind(0x9999)));
    // A message for the other direction is unknown here.
    let pong = encode_enclave(&EnclaveMessage::Pong { nonce: 1 });
    assert_eq!(HostMessage::decode(&pong), Err(DecodeError::UnknownKind(kind::PONG)));
    // A list count far beyond the bytes present.
    let mut huge_list = Vec::new();
    huge_list.extend_from_slice(&kind::LAUNCH_JOB.to_le_bytes());
    huge_list.extend_from_slice(&1u32.to_le_bytes());
    huge_list.extend_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(HostMessage::decode(&huge_list), Err(DecodeError::Truncated { field: "string" }));
    // A byte-string length beyond the message.
    let mut long_text = Vec::new();
    long_text.extend_from_slice(&kind::LOG.to_le_bytes());
    long_text.extend_from_slice(&1000u32.to_le_bytes());
    long_text.extend_from_slice(b"short");
    assert_eq!(EnclaveMessage::decode(&long_text), Err(DecodeError::Truncated { field: "text" }));
    // NUL inside a path, an empty path, an unknown operation and stream.
    let open = |path: &[u8]| {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&kind::FILE_REQUEST.to_le_bytes());
        bytes.extend_from_slice(&[1, 0, 0, 0, 2, 0, 0, 0, 1]);
        bytes.extend_from_slice(&(path.len() as u32).to_le_bytes());
        bytes.extend_from_slice(path);
        bytes.extend_from_slice(&[0; 8]);
        bytes
    };
    assert!(EnclaveMessage::decode(&open(b"ok")).is_ok());
    assert_eq!(EnclaveMessage::decode(&open(b"a\0b")), Err(DecodeError::ContainsNul { field: "path" }));
    assert_eq!(EnclaveMessage::decode(&open(b"")), Err(DecodeError::Empty { field: "path" }));
    let mut bad_op = open(b"x");
    bad_op[10] = 99;
    assert_eq!(EnclaveMessage::decode(&bad_op), Err(DecodeError::UnknownFileOp(99)));
    let mut output = encode_enclave(&EnclaveMessage::JobOutput { job: 1, stream: Stream::Stderr, data: b"x" });
    output[6] = 3;
    assert_eq!(EnclaveMessage::decode(&output), Err(DecodeError::UnknownStream(3)));
}

#[test]
fn encoding_checks_its_input_and_its_buffer() {
    let argv: [&[u8]; 1] = [b"nul\0inside"];
    let mut out = vec![0u8; 1024];
    assert_eq!(sample_launch(&argv, &[], &[]).encode(&mut out), Err(EncodeError::ContainsNul { field: "string" }));
    let mut tiny = [0u8; 5];
    assert!(matches!(HostMessage::Ping { nonce: 1 }.encode(&mut tiny), Err(EncodeError::BufferTooSmall { .. })));
    let empty_name = [FileImage { name: b"", gpa: 0, len: 0 }];
    assert_eq!(sample_launch(&[], &[], &empty_name).encode(&mut out), Err(EncodeError::Empty { field: "file.name" }));
}

#[test]
fn output_chunk_fits_one_ring_message() {
    let data = [b'x'; 248];
    let chunk = &data[..max_output_chunk(248)];
    let bytes = encode_enclave(&EnclaveMessage::JobOutput { job: 1, stream: Stream::Stdout, data: chunk });
    assert_eq!(bytes.len() + 1, 248);
    let mut frame = [0u8; 248];
    let mut fragmenter = Fragmenter::new(&bytes, 248).unwrap();
    assert_eq!(fragmenter.next_frame(&mut frame), Some(248));
    assert_eq!(frame[0], FRAME_WHOLE);
    assert_eq!(fragmenter.next_frame(&mut frame), None);
}

#[test]
fn reassembler_refuses_broken_frame_sequences() {
    let mut storage = [0u8; 64];
    let mut reassembler = Reassembler::new(&mut storage);
    assert_eq!(reassembler.push(&[]), Err(FrameError::Empty));
    assert_eq!(reassembler.push(&[9, 1]), Err(FrameError::UnknownFrameKind(9)));
    assert_eq!(reassembler.push(&[FRAME_CONTINUATION, 1]), Err(FrameError::UnexpectedContinuation));
    assert_eq!(reassembler.push(&[FRAME_START, 1, 0]), Err(FrameError::Truncated));
    // Total no larger than the piece, and total beyond the buffer.
    assert!(matches!(reassembler.push(&[FRAME_START, 1, 0, 0, 0, 7]), Err(FrameError::BadTotal { .. })));
    assert!(matches!(reassembler.push(&[FRAME_START, 65, 0, 0, 0, 7]), Err(FrameError::BadTotal { .. })));
    assert_eq!(reassembler.push(&[FRAME_START, 3, 0, 0, 0, 7]), Ok(None));
    assert!(reassembler.in_progress());
    assert_eq!(reassembler.push(&[FRAME_WHOLE, 1]), Err(FrameError::Interrupted));
    assert!(!reassembler.in_progress(), "an error drops the partial message");
    assert_eq!(reassembler.push(&[FRAME_START, 3, 0, 0, 0, 7]), Ok(None));
    assert_eq!(reassembler.push(&[FRAME_CONTINUATION, 8, 9, 10]), Err(FrameError::Overrun));
    assert_eq!(reassembler.push(&[FRAME_START, 3, 0, 0, 0, 7]), Ok(None));
    assert_eq!(reassembler.push(&[FRAME_CONTINUATION]), Err(FrameError::Empty));
    assert_eq!(reassembler.push(&[FRAME_START, 3, 0, 0, 0, 7]), Ok(None));
    assert_eq!(reassembler.push(&[FRAME_CONTINUATION, 8]), Ok(None));
    assert_eq!(reassembler.push(&[FRAME_CONTINUATION, 9]), Ok(Some(&[7u8, 8, 9][..])));
    assert_eq!(reassembler.push(&[FRAME_WHOLE, 5]), Ok(Some(&[5u8][..])));
    assert!(matches!(Fragmenter::new(b"x", 5), Err(FrameError::FrameTooSmall { .. })));
    assert!(matches!(Fragmenter::new(&[0; MAX_MESSAGE_LEN + 1], 248), Err(FrameError::MessageTooLong { .. })));
}

/// Owned material for one random message.
struct Material {
    strings: Vec<Vec<u8>>,
    names: Vec<Vec<u8>>,
    data: Vec<u8>,
    numbers: [u64; 8],
}

impl Material {
    fn new(rng: &mut Rng) -> Material {
        let strings = (0..rng.below(6)).map(|_| rng.c_string(false)).collect();
        let names = (0..rng.below(4) + 1).map(|_| rng.c_string(true)).collect();
        let data = rng.data(600);
        let numbers = core::array::from_fn(|_| rng.next());
        Material { strings, names, data, numbers }
    }
}

fn random_host_message<'a>(choice: u64, m: &'a Material, strings: &'a [&'a [u8]], files: &'a [FileImage<'a>]) -> HostMessage<'a> {
    let n = m.numbers;
    match choice % 10 {
        9 => HostMessage::SharedFileTruncated { gpa: n[0], len: n[1] },
        8 => HostMessage::MemoryZeroed { request: n[0] as u32, result: n[1] as i32 },
        7 if !m.data.is_empty() => HostMessage::Xemem { message: &m.data },
        0 => HostMessage::Ping { nonce: n[0] },
        1 => HostMessage::LaunchJob(LaunchJob {
            job: n[0] as u32,
            argv: List::new(strings),
            env: List::new(&strings[strings.len() / 2..]),
            cwd: &m.names[0],
            cores: n[1],
            heap_size: n[2],
            stack_size: n[3],
            binary: files[0],
            files: List::new(&files[1..]),
            pid: n[4],
        }),
        2 => HostMessage::SignalJob { job: n[0] as u32, signal: n[1] as u32 },
        3 => HostMessage::KillJob { job: n[0] as u32 },
        4 => HostMessage::Shutdown,
        5 => HostMessage::FileResult { job: n[0] as u32, request: n[1] as u32, result: n[2] as i64 },
        _ => HostMessage::FileAttributes {
            job: n[0] as u32,
            request: n[1] as u32,
            attributes: FileAttributes {
                mode: n[2] as u32,
                size: n[3],
                inode: n[4],
                links: n[5],
                uid: n[6] as u32,
                gid: n[7] as u32,
                block_size: 4096,
                blocks: n[0] >> 3,
                accessed: Timestamp { seconds: n[1] as i64, nanoseconds: 5 },
                modified: Timestamp { seconds: -1, nanoseconds: 999_999_999 },
                changed: Timestamp::default(),
            },
        },
    }
}

fn random_enclave_message<'a>(choice: u64, m: &'a Material) -> EnclaveMessage<'a> {
    let n = m.numbers;
    let (job, request, handle, gpa, len) = (n[0] as u32, n[1] as u32, n[2] as u32, n[3], n[4] as u32);
    let path = &m.names[0][..];
    let op = match n[5] % 19 {
        0 => FileOp::Open { path, flags: n[6] as u32, mode: 0o644 },
        1 => FileOp::Close { handle },
        2 => FileOp::Read { handle, gpa, len },
        3 => FileOp::Write { handle, gpa, len },
        4 => FileOp::Pread { handle, gpa, len, offset: n[6] },
        5 => FileOp::Pwrite { handle, gpa, len, offset: n[6] },
        6 => FileOp::Lseek { handle, offset: n[6] as i64, whence: 2 },
        7 => FileOp::Fstat { handle },
        8 => FileOp::Stat { path },
        9 => FileOp::Unlink { path },
        10 => FileOp::Mkdir { path, mode: 0o755 },
        11 => FileOp::Ftruncate { handle, length: n[6] },
        12 => FileOp::MapShared { handle, offset: n[6], len: n[4], writable: n[6] % 2 == 1 },
        13 => FileOp::UnmapShared { gpa },
        14 => FileOp::Statfs { path, gpa },
        15 => FileOp::Fstatfs { handle, gpa },
        16 => FileOp::Rename { from: path, to: &m.names[m.names.len() - 1][..] },
        17 => FileOp::Rmdir { path },
        _ => FileOp::Getdents { handle, gpa, len },
    };
    match choice % 13 {
        12 => EnclaveMessage::FileSlots { gpa: n[3], count: n[1] as u16 },
        11 => EnclaveMessage::MappingCounter { gpa: n[4] },
        10 => EnclaveMessage::ZeroMemory { request, gpa, len: n[5] },
        0 => EnclaveMessage::Hello { version: n[0] as u16, vcpus: n[1] as u16, memory: n[2] },
        1 => EnclaveMessage::Pong { nonce: n[0] },
        2 => EnclaveMessage::JobStarted { job },
        3 => EnclaveMessage::JobOutput { job, stream: if n[1] & 1 == 0 { Stream::Stdout } else { Stream::Stderr }, data: &m.data },
        4 => EnclaveMessage::JobExited { job, status: n[1] as u32 },
        5 => EnclaveMessage::LaunchFailed { job, errno: n[1] as i32, reason: &m.data },
        6 => EnclaveMessage::Log { text: &m.data },
        7 => EnclaveMessage::Panic { text: &m.data },
        8 if !m.data.is_empty() => EnclaveMessage::Xemem { message: &m.data },
        _ => EnclaveMessage::FileRequest { job, request, op },
    }
}

/// Property: any message survives encode → frames of any legal size → reassembly → decode,
/// and every proper prefix of its encoding is refused.
#[test]
fn random_messages_round_trip() {
    let mut rng = Rng(0x5eed_c10d_e2ba_11a5);
    for _ in 0..3000 {
        let material = Material::new(&mut rng);
        let strings: Vec<&[u8]> = material.strings.iter().map(|s| &s[..]).collect();
        let files: Vec<FileImage> = material
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| FileImage { name, gpa: material.numbers[i], len: material.numbers[7 - i] })
            .collect();
        let max_frame_len = MIN_FRAME_LEN + rng.below(300) as usize;
        let choice = rng.next();

        let host = random_host_message(choice, &material, &strings, &files);
        let bytes = encode_host(&host);
        assert_eq!(HostMessage::decode(&through_frames(&bytes, max_frame_len)).unwrap(), host);
        let cut = rng.below(bytes.len() as u64) as usize;
        assert!(HostMessage::decode(&bytes[..cut]).is_err());

        let enclave = random_enclave_message(choice, &material);
        let bytes = encode_enclave(&enclave);
        assert_eq!(EnclaveMessage::decode(&through_frames(&bytes, max_frame_len)).unwrap(), enclave);
        let cut = rng.below(bytes.len() as u64) as usize;
        assert!(EnclaveMessage::decode(&bytes[..cut]).is_err());
    }
}

/// Property: arbitrary and mutated bytes never panic the decoders or the reassembler, and
/// whatever decodes re-encodes to the same bytes.
#[test]
fn mutated_bytes_never_panic() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let mut storage = vec![0u8; 512];
    for round in 0..20000 {
        let material = Material::new(&mut rng);
        let mut bytes = if round % 2 == 0 {
            encode_enclave(&random_enclave_message(rng.next(), &material))
        } else {
            let strings: Vec<&[u8]> = material.strings.iter().map(|s| &s[..]).collect();
            let files = [FileImage { name: &material.names[0], gpa: 0, len: 0 }];
            encode_host(&random_host_message(rng.next(), &material, &strings, &files))
        };
        for _ in 0..=rng.below(4) {
            if bytes.is_empty() {
                break;
            }
            let index = rng.below(bytes.len() as u64) as usize;
            bytes[index] = rng.next() as u8;
        }
        if let Ok(message) = EnclaveMessage::decode(&bytes) {
            assert_eq!(encode_enclave(&message), bytes);
        }
        if let Ok(message) = HostMessage::decode(&bytes) {
            assert_eq!(encode_host(&message), bytes);
        }
        let mut reassembler = Reassembler::new(&mut storage);
        for frame in bytes.chunks(1 + rng.below(40) as usize) {
            let _ = reassembler.push(frame);
        }
    }
}

#[test]
fn xemem_messages_are_carried_as_they_are_and_never_empty() {
    let message = [1u8, 2, 3, 4, 5];
    let to_host = encode_enclave(&EnclaveMessage::Xemem { message: &message });
    assert_eq!(EnclaveMessage::decode(&to_host), Ok(EnclaveMessage::Xemem { message: &message }));
    let to_enclave = encode_host(&HostMessage::Xemem { message: &message });
    assert_eq!(HostMessage::decode(&to_enclave), Ok(HostMessage::Xemem { message: &message }));
    // Each direction's kind is unknown to the other side.
    assert_eq!(HostMessage::decode(&to_host), Err(DecodeError::UnknownKind(kind::XEMEM_TO_HOST)));
    assert_eq!(EnclaveMessage::decode(&to_enclave), Err(DecodeError::UnknownKind(kind::XEMEM_TO_ENCLAVE)));
    // Empty: refused both ways.
    let mut out = [0u8; 16];
    assert_eq!(EnclaveMessage::Xemem { message: &[] }.encode(&mut out), Err(EncodeError::Empty { field: "xemem" }));
    let mut empty = kind::XEMEM_TO_HOST.to_le_bytes().to_vec();
    empty.extend_from_slice(&0u32.to_le_bytes());
    assert_eq!(EnclaveMessage::decode(&empty), Err(DecodeError::Empty { field: "xemem" }));
    // A length beyond the bytes present, and trailing bytes.
    let mut short = kind::XEMEM_TO_ENCLAVE.to_le_bytes().to_vec();
    short.extend_from_slice(&100u32.to_le_bytes());
    short.extend_from_slice(&[9; 10]);
    assert_eq!(HostMessage::decode(&short), Err(DecodeError::Truncated { field: "xemem" }));
    let mut longer = to_enclave.clone();
    longer.push(0);
    assert_eq!(HostMessage::decode(&longer), Err(DecodeError::TrailingBytes { count: 1 }));
}

#[test]
fn a_signal_death_is_told_from_an_exit_code() {
    assert_eq!(job_status_signal(KILLED_BY_SIGNAL + 9), Some(9));
    assert_eq!(job_status_signal(KILLED_BY_SIGNAL + 2), Some(2));
    assert_eq!(job_status_signal(128 + 2), None, "exit(130) is an exit code");
    assert_eq!(job_status_signal(255), None);
    assert_eq!(job_status_signal(KILLED_BY_SIGNAL), None, "no signal 0");
    assert_eq!(job_status_signal(2 * KILLED_BY_SIGNAL), None);
}
