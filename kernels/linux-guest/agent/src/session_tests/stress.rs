//! The host-files path under load, with no VM: the agent's FUSE file system and session
//! against the daemon's own file-call server (clowderd's `hio.rs`) over a real channel, the
//! file window in the same memfd-backed guest RAM the daemon uses. Several jobs at once (each
//! its own mount, so FUSE requests of different jobs interleave while binaries are copied out
//! of RAM) read files of known content at random offsets and sizes, beyond 4 GiB too, through
//! `pread` and `mmap`, from several threads; every byte is checked, and `sha256sum` of the
//! files must equal the host's.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::process::Command;
use std::sync::Arc;

use clowderd::guest_ram::{GuestRam, RamRange};
use clowderd::hio::{Identity, JobFiles, Scope};

use super::*;

/// Guest RAM: the binaries the "host" placed, and the file window.
const RAM: u64 = 64 << 20;
const PYTHON_GPA: u64 = 1 << 20;
const SHELL_GPA: u64 = 16 << 20;
const STRESS_WINDOW: FileWindow = FileWindow { gpa: 32 << 20, size: 256 << 10 };

/// Guest-physical memory as the agent's `/dev/mem` sees it: the daemon's own mapping of RAM.
struct Ram(Arc<GuestRam>);

impl PhysicalMemory for Ram {
    fn read(&self, gpa: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut data = vec![0; len as usize];
        self.0.read(gpa, &mut data).map_err(|e| format!("{e:?}"))?;
        Ok(data)
    }

    fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String> {
        self.0.write(gpa, data).map_err(|e| format!("{e:?}"))
    }
}

/// The daemon's side: each job's files served by `hio::JobFiles` as `owner`, into RAM.
struct Hio {
    ram: Arc<GuestRam>,
    cwd: PathBuf,
    owner: Identity,
    jobs: HashMap<u32, JobFiles>,
}

impl ServeFiles for Hio {
    fn serve(&mut self, job: u32, request: u32, op: &enclave_proto::FileOp<'_>) -> HostMessage<'static> {
        let (cwd, owner) = (&self.cwd, &self.owner);
        let files = self
            .jobs
            .entry(job)
            .or_insert_with(|| JobFiles::new(File::open(cwd).unwrap(), cwd.to_str().unwrap().to_string(), Scope::User, owner.clone()));
        files.serve(op, &self.ram).reply(job, request)
    }
}

/// File `k`'s bytes `[start, start + len)`: little-endian words `i * 2654435761 + k * 7919`
/// (i the word's index in the file), so a byte at the wrong offset or of another file shows.
fn pattern(k: u32, start: u64, len: usize) -> Vec<u8> {
    let (first, last) = (start / 4, (start + len as u64).div_ceil(4));
    let words: Vec<u8> = (first..last).flat_map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(k * 7919)).to_le_bytes()).collect();
    let skip = (start % 4) as usize;
    words[skip..skip + len].to_vec()
}

/// The job's checker (the formula above): `THREADS` threads, each `READS` random reads by
/// `pread` or through an `mmap`, of random length up to 300 KiB in the regions given as JSON.
const CHECKER: &str = r#"
import array, json, mmap, os, random, sys, threading
import email, http.client
regions = json.loads(sys.argv[1])
def pattern(k, a, n):
    words = array.array('I', ((i * 2654435761 + k * 7919) & 0xffffffff for i in range(a // 4, (a + n + 3) // 4)))
    return words.tobytes()[a % 4:a % 4 + n]
bad, done = [], []
def check(seed):
    rnd = random.Random(seed)
    for r in range(60):
        name, k, start, length = rnd.choice(regions)
        n = rnd.randint(1, min(length, 300000))
        a = start + rnd.randint(0, length - n)
        fd = os.open(name, os.O_RDONLY)
        if r % 3 == 2 and start == 0:
            with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
                got = m[a:a + n]
        else:
            got = os.pread(fd, n, a)
        os.close(fd)
        if got != pattern(k, a, n):
            bad.append((name, a, n, len(got)))
    done.append(seed)
threads = [threading.Thread(target=check, args=(int(sys.argv[2]) * 10 + t,)) for t in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps({"threads": len(done), "bad": bad[:5], "bad_count": len(bad)}))
"#;

/// Files of known content: three whole ones of awkward sizes, and a sparse one whose checked
/// region lies past 4 GiB. The regions to check, as the checker takes them.
fn make_files(work: &Path) -> String {
    let mut regions = Vec::new();
    for (k, size) in [(1u32, (3 << 20) + 4097), (2, (1 << 20) - 13), (3, 700_001)] {
        let name = format!("big{k}");
        std::fs::write(work.join(&name), pattern(k, 0, size)).unwrap();
        regions.push(format!("[\"{name}\", {k}, 0, {size}]"));
    }
    let (start, len) = ((4u64 << 30) + 12_293, 1usize << 20);
    let sparse = File::create(work.join("sparse")).unwrap();
    sparse.set_len(start + len as u64 + 77).unwrap();
    sparse.write_all_at(&pattern(4, start, len), start).unwrap();
    regions.push(format!("[\"sparse\", 4, {start}, {len}]"));
    format!("[{}]", regions.join(", "))
}

/// Whether this process may mount FUSE file systems (root, and /dev/fuse there).
fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && Path::new("/dev/fuse").exists()
}

#[test]
fn concurrent_jobs_read_the_hosts_files_exactly_through_the_daemons_server() {
    let python = Path::new("/usr/bin/python3");
    if !can_mount() || !python.exists() {
        eprintln!("skipped: needs root, /dev/fuse and /usr/bin/python3");
        return;
    }
    let memfd = clowderd::sys::memfd("stress-ram").unwrap();
    memfd.set_len(RAM).unwrap();
    let ram = Arc::new(GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: RAM, file_offset: 0 }], (0, 0)).unwrap());
    let (python_bytes, shell_bytes) = (std::fs::read(python).unwrap(), std::fs::read("/bin/sh").unwrap());
    ram.write(PYTHON_GPA, &python_bytes).unwrap();
    ram.write(SHELL_GPA, &shell_bytes).unwrap();
    let (mut host, mut session) = start_on("stress", Ram(ram.clone()), Some(STRESS_WINDOW));
    let work = host.directory.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let regions = make_files(&work);
    let root = Identity { uid: 0, gid: 0, groups: vec![] };
    let mut files = Hio { ram, cwd: work.clone(), owner: root, jobs: HashMap::new() };
    let cwd = work.to_str().unwrap().as_bytes().to_vec();
    let python_image = FileImage { name: b"/usr/bin/python3", gpa: PYTHON_GPA, len: python_bytes.len() as u64 };
    let shell_image = FileImage { name: b"/bin/sh", gpa: SHELL_GPA, len: shell_bytes.len() as u64 };
    let checker = |seed: &'static [u8]| -> [&[u8]; 5] { [b"python3", b"-c", CHECKER.as_bytes(), regions.as_bytes(), seed] };
    let (check_1, check_2) = (checker(b"1"), checker(b"2"));
    let sums: [&[u8]; 3] = [b"sh", b"-c", b"sha256sum big1 big2 big3; sha256sum big1"];
    host.send(&launch(1, &check_1, &cwd, python_image, &[]));
    host.send(&launch(2, &sums, &cwd, shell_image, &[]));
    host.send(&launch(3, &check_2, &cwd, python_image, &[]));
    let mut ended = std::collections::BTreeMap::new();
    let mut messages = Vec::new();
    while ended.len() < 3 {
        let got = host.serving(&mut session, Some(&mut files), Duration::from_secs(300), |m| {
            matches!(m, EnclaveMessage::JobExited { .. } | EnclaveMessage::LaunchFailed { .. })
        });
        for message in decoded(&got) {
            match message {
                EnclaveMessage::JobExited { job, status } => ended.insert(job, status),
                EnclaveMessage::LaunchFailed { job, .. } => ended.insert(job, 999),
                _ => None,
            };
        }
        messages.extend(got);
    }
    let messages = decoded(&messages);
    let of_job = |wanted: u32, stream: Stream| {
        let mut text = Vec::new();
        for message in &messages {
            if let EnclaveMessage::JobOutput { job, stream: s, data } = message {
                if *job == wanted && *s == stream {
                    text.extend_from_slice(data);
                }
            }
        }
        String::from_utf8_lossy(&text).into_owned()
    };
    let on_host = Command::new("sh").args(["-c", "sha256sum big1 big2 big3; sha256sum big1"]).current_dir(&work).output().unwrap();
    assert_eq!(of_job(2, Stream::Stdout), String::from_utf8_lossy(&on_host.stdout), "stderr: {}", of_job(2, Stream::Stderr));
    for job in [1, 3] {
        let report = of_job(job, Stream::Stdout);
        assert_eq!(report, "{\"threads\": 4, \"bad\": [], \"bad_count\": 0}\n", "job {job}; stderr: {}", of_job(job, Stream::Stderr));
    }
    assert_eq!(ended.values().copied().collect::<Vec<_>>(), [0, 0, 0], "{ended:?}");
}

/// A job's writes in its working directory land in the host's as its user's: a file created,
/// written (1.25 MiB, in window-sized pieces) and truncated, directories made and removed, a
/// file removed and one renamed;
/// a directory only root may write refuses it, whatever the guest's root may do in the guest.
#[test]
fn a_jobs_writes_land_in_the_hosts_directory_as_its_user() {
    use std::os::unix::fs::MetadataExt;
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let memfd = clowderd::sys::memfd("write-ram").unwrap();
    memfd.set_len(RAM).unwrap();
    let ram = Arc::new(GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: RAM, file_offset: 0 }], (0, 0)).unwrap());
    let shell = std::fs::read("/bin/sh").unwrap();
    ram.write(SHELL_GPA, &shell).unwrap();
    let (mut host, mut session) = start_on("writes", Ram(ram.clone()), Some(STRESS_WINDOW));
    let (work, closed) = (host.directory.join("work"), host.directory.join("closed"));
    for dir in [&work, &closed] {
        std::fs::create_dir_all(dir).unwrap();
    }
    let nobody = Identity { uid: 65534, gid: 65534, groups: vec![] };
    std::os::unix::fs::chown(&work, Some(nobody.uid), Some(nobody.gid)).unwrap();
    std::fs::set_permissions(&host.directory, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let script = "echo hello > out.txt && dd if=/dev/urandom of=blob bs=65536 count=20 2>/dev/null && cat blob blob >> blob2 \
        && truncate -s 1000000 blob2 && mkdir sub gone && echo x > sub/gone && rm sub/gone && rmdir gone \
        && echo moved > sub/a && mv sub/a renamed && sha256sum blob blob2; \
        echo no > ../closed/x || echo refused";
    let argv: [&[u8]; 3] = [b"sh", b"-c", script.as_bytes()];
    let cwd = work.to_str().unwrap().as_bytes().to_vec();
    let mut files = Hio { ram, cwd: work.clone(), owner: nobody, jobs: HashMap::new() };
    host.send(&launch(1, &argv, &cwd, FileImage { name: b"/bin/sh", gpa: SHELL_GPA, len: shell.len() as u64 }, &[]));
    let got = host.serving(&mut session, Some(&mut files), Duration::from_secs(120), |m| {
        matches!(m, EnclaveMessage::JobExited { .. } | EnclaveMessage::LaunchFailed { .. })
    });
    let messages = decoded(&got);
    let (stdout, stderr) = (output(&messages, Stream::Stdout), output(&messages, Stream::Stderr));
    assert_eq!(messages.last(), Some(&EnclaveMessage::JobExited { job: 1, status: 0 }), "{stdout}{stderr}");
    let on_host = Command::new("sha256sum").args(["blob", "blob2"]).current_dir(&work).output().unwrap();
    assert_eq!(stdout, format!("{}refused\n", String::from_utf8_lossy(&on_host.stdout)), "stderr: {stderr}");
    assert!(stderr.contains("Permission denied"), "{stderr}");
    assert_eq!(std::fs::read_to_string(work.join("out.txt")).unwrap(), "hello\n");
    assert_eq!(std::fs::metadata(work.join("blob")).unwrap().len(), 20 << 16);
    assert_eq!(std::fs::metadata(work.join("blob2")).unwrap().len(), 1_000_000);
    for made in ["out.txt", "blob", "sub"] {
        let metadata = std::fs::metadata(work.join(made)).unwrap();
        assert_eq!((metadata.uid(), metadata.gid()), (65534, 65534), "{made} is the user's");
    }
    assert_eq!(std::fs::read_to_string(work.join("renamed")).unwrap(), "moved\n");
    assert!(!work.join("sub/gone").exists() && !work.join("sub/a").exists() && !work.join("gone").exists() && !closed.join("x").exists());
}

/// Every byte of a host file a job reads through its mount is the host's, as each FUSE reply
/// brings it and as the kernel's page cache keeps it: fuse_reads.c (also run in a booted VM by
/// `make test-linux-enclave`) reads files on both sides of a page, of the readahead and of one
/// reply (the 256 KiB window) and one of many replies, by read(2) in awkward pieces, pread(2)
/// at boundaries and a mapping, and prints each file's checksum, which must equal its run on
/// the host's own files.
#[test]
fn a_host_files_bytes_come_through_the_mount_exactly_at_every_boundary() {
    if !can_mount() {
        eprintln!("skipped: needs root and /dev/fuse");
        return;
    }
    let memfd = clowderd::sys::memfd("fuse-reads-ram").unwrap();
    memfd.set_len(RAM).unwrap();
    let ram = Arc::new(GuestRam::map(&memfd, vec![RamRange { gpa: 0, size: RAM, file_offset: 0 }], (0, 0)).unwrap());
    let (mut host, mut session) = start_on("fuse-reads", Ram(ram.clone()), Some(STRESS_WINDOW));
    let work = host.directory.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let program = clowder_test_support::build_musl_program(&host.directory, "fuse_reads", include_str!("fuse_reads.c"));
    let bytes = std::fs::read(&program).unwrap();
    ram.write(SHELL_GPA, &bytes).unwrap();
    let on_host = |mode: &str| Command::new(&program).arg(mode).current_dir(&work).output().unwrap();
    assert!(on_host("write").status.success());
    let expected = on_host("check");
    assert!(expected.status.success(), "{}", String::from_utf8_lossy(&expected.stdout));
    let root = Identity { uid: 0, gid: 0, groups: vec![] };
    let mut files = Hio { ram, cwd: work.clone(), owner: root, jobs: HashMap::new() };
    let argv: [&[u8]; 2] = [b"fuse_reads", b"check"];
    let cwd = work.to_str().unwrap().as_bytes().to_vec();
    host.send(&launch(1, &argv, &cwd, FileImage { name: b"/fuse_reads", gpa: SHELL_GPA, len: bytes.len() as u64 }, &[]));
    let got = host.serving(&mut session, Some(&mut files), Duration::from_secs(120), |m| {
        matches!(m, EnclaveMessage::JobExited { .. } | EnclaveMessage::LaunchFailed { .. })
    });
    let messages = decoded(&got);
    let (stdout, stderr) = (output(&messages, Stream::Stdout), output(&messages, Stream::Stderr));
    assert_eq!(stdout, String::from_utf8_lossy(&expected.stdout), "stderr: {stderr}");
    assert_eq!(messages.last(), Some(&EnclaveMessage::JobExited { job: 1, status: 0 }), "{stderr}");
}
