use super::*;
use std::os::fd::AsFd;

#[test]
fn eventfd_signals_and_drains() {
    let fd = eventfd().unwrap();
    assert!(!drain_eventfd(&fd));
    assert!(!wait_readable(&fd, Duration::from_millis(1)).unwrap());
    signal_eventfd(&fd).unwrap();
    assert!(wait_readable(&fd, Duration::from_millis(100)).unwrap());
    assert!(drain_eventfd(&fd));
    assert!(!drain_eventfd(&fd));
}

#[test]
fn packets_carry_descriptors_and_credentials() {
    let dir = std::env::temp_dir().join(format!("clowder-sys-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("socket");
    let listener = listen(&path).unwrap();
    let client = connect(&path).unwrap();
    let server = accept(&listener).unwrap();
    let me = peer(&server).unwrap();
    assert_eq!(me.pid, std::process::id());

    let file = memfd("clowder-sys-test").unwrap();
    file.set_len(12345).unwrap();
    send(&client, b"hello", &[file.as_fd()]).unwrap();
    let mut buffer = [0u8; 16];
    let (length, fds) = receive(&server, &mut buffer).unwrap();
    assert_eq!(&buffer[..length], b"hello");
    assert_eq!(fds.len(), 1);
    let info = file_info(&fds[0]).unwrap();
    assert!(info.regular);
    assert_eq!(info.size, 12345);
    truncate_to_zero(&fds[0]).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 0);

    // A packet longer than the buffer is refused, not cut short silently.
    send(&client, &[7u8; 64], &[]).unwrap();
    assert!(receive(&server, &mut buffer).is_err());
    drop(client);
    assert_eq!(receive(&server, &mut buffer).unwrap().0, 0, "a closed peer reads as an empty packet");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn open_at_beneath_stays_inside() {
    let dir = std::env::temp_dir().join(format!("clowder-sys-beneath-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("inside")).unwrap();
    let root = File::open(&dir).unwrap();
    mkdir_in(&root, "made", 0o755).unwrap();
    assert!(dir.join("made").is_dir());
    let open_beneath = |path, flags, mode| open_at(&root, path, flags, mode, true);
    open_beneath("inside/file", libc::O_CREAT | libc::O_WRONLY, 0o600).unwrap();
    assert!(open_beneath("../etc/passwd", libc::O_RDONLY, 0).is_err());
    assert!(open_beneath("/etc/passwd", libc::O_RDONLY, 0).is_err());
    assert!(open_at(&root, "/etc/passwd", libc::O_RDONLY, 0, false).is_ok(), "not beneath: as openat(2)");
    // A mode with O_DIRECTORY alone is ignored (openat2 refuses one unless creating).
    let inside = open_beneath("inside", libc::O_PATH | libc::O_DIRECTORY, 0o755).unwrap();
    unlink_in(&inside, "file").unwrap();
    assert!(!dir.join("inside/file").exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn signals_refuse_pid_zero() {
    assert!(send_signal(0, libc::SIGTERM).is_err());
    send_signal(std::process::id(), 0).unwrap_err(); // 0 is no named signal
}

#[test]
fn fs_identity_takes_on_the_groups_for_this_thread_only() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("skipped: needs root to act as another user");
        return;
    }
    let groups_now = || {
        let mut groups = vec![0; 256];
        // SAFETY: the buffer holds 256 ids.
        let count = unsafe { libc::getgroups(256, groups.as_mut_ptr()) };
        groups.truncate(count as usize);
        groups
    };
    let before = groups_now();
    // Started before the change: a new thread would inherit its creator's groups.
    let (ask, asked) = std::sync::mpsc::channel::<()>();
    let other = std::thread::spawn(move || asked.recv().map(|()| groups_now()));
    {
        let _identity = FsIdentity::assume(65534, 65534, &[4242, 4343]).unwrap();
        assert_eq!(groups_now(), vec![4242, 4343]);
        ask.send(()).unwrap();
        assert_eq!(other.join().unwrap().unwrap(), before, "another thread keeps its groups");
    }
    assert_eq!(groups_now(), before, "given back on drop");
}
