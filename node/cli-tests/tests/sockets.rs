//! Sockets in a persistent LWK enclave's job, end to end through the CLI (issue 25, points 1
//! and 7): the host's network stack serves them in the job user's name, through the job's
//! socket helper. A dynamically linked C program (`sockets/job.c`) is a TCP client and a TCP
//! server of host processes, a UDP client, an IPv6 TCP client and UDP socket, uses stream and
//! datagram socketpairs and a Unix stream socket named by a relative path, waits with poll, epoll and select, is interrupted by a signal in a
//! blocking receive, passes a socket over a socket (SCM_RIGHTS), lists the
//! interfaces (getifaddrs over NETLINK_ROUTE, and the ioctls SIOCGIFCONF and SIOCGIF* on a
//! socket, with FIONBIO and FIONREAD; other requests ENOTTY), and meets ECONNREFUSED, EPIPE
//! and ECONNRESET (a host peer's reset); Debian's python3 resolves localhost and talks to the
//! host; and a job of an unprivileged user cannot bind port 80 and runs out of descriptors at
//! that user's own limit. Needs /dev/kvm, the LWK image, clowder-vmm and gcc (python3's case
//! /usr/bin/python3; the user's case setpriv and prlimit); skipped, with the reason, otherwise.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use clowder_test_support::{daemon_config, kernel_image, lwk_daemon, serve, TempDir};
use clowderd::daemon::Daemon;
use clowderd::enclave::Liveness;
use clowderd::machine::VmmLauncher;
use support::{skipped_without, text, vmm_binary};

mod support;

const JOB: &str = include_str!("sockets/job.c");

fn build_job(dir: &Path) -> PathBuf {
    let source = dir.join("job.c");
    std::fs::write(&source, JOB).unwrap();
    let binary = dir.join("job");
    let status = Command::new("gcc").args(["-O2", "-pthread", "-o"]).arg(&binary).arg(&source).status().unwrap();
    assert!(status.success(), "gcc failed for job.c");
    binary
}

fn clowder(socket: &Path, dir: &Path, args: &[&str]) -> Output {
    Command::new(support::clowder()).args(args).current_dir(dir).env("CLOWDER_SOCKET", socket).output().unwrap()
}

/// Runs `./job ARGS` in enclave `e`; its output, which must end with status 0.
fn job(socket: &Path, dir: &Path, args: &[&str]) -> String {
    let mut line = vec!["run", "--enclave", "e", "./job"];
    line.extend(args);
    let output = clowder(socket, dir, &line);
    assert!(
        output.status.success(),
        "job {args:?}: status {:?}, stdout {}stderr {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// A TCP echo server on the host at `address` (every connection served until it closes); its
/// port.
fn tcp_echo(address: &str) -> u16 {
    let listener = TcpListener::bind(address).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                let mut buffer = [0u8; 4096];
                while let Ok(count @ 1..) = stream.read(&mut buffer) {
                    if stream.write_all(&buffer[..count]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A TCP server on the host that reads one byte of its one connection and resets it (SO_LINGER
/// with a zero timeout: the close sends RST); its port.
fn tcp_resetter() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else { return };
        let _ = stream.read(&mut [0u8; 1]);
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: the option value is a live `linger` of the size given, on the stream's own socket.
        unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&stream),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
    });
    port
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The enclave job is the server: the host connects to the port it wrote, sends 200 KB,
/// reads them back and closes.
fn host_client_of(dir: &Path, port_file: &Path) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    let port: u16 = loop {
        if let Some(port) = std::fs::read_to_string(port_file).ok().and_then(|text| text.trim().parse().ok()) {
            break port;
        }
        assert!(Instant::now() < deadline, "the enclave's server never wrote its port in {}", dir.display());
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let mut writer = stream.try_clone().unwrap();
    let sent = data.clone();
    let sending = std::thread::spawn(move || {
        writer.write_all(&sent).unwrap();
        writer.shutdown(Shutdown::Write).unwrap();
    });
    let mut back = vec![0u8; data.len()];
    stream.read_exact(&mut back).unwrap();
    sending.join().unwrap();
    // Closed now: the job's next sends meet the closed connection.
    drop(stream);
    assert!(back == data, "the echo differs: {} bytes back of {}", back.len(), data.len());
    back.len()
}

#[test]
fn enclave_jobs_use_the_hosts_sockets() {
    if skipped_without("gcc", "to build the socket program") {
        return;
    }
    let dir = TempDir::new("clowder-sockets");
    let socket = serve(lwk_daemon(&dir.0, vmm_binary(), Liveness::default()), &dir.0);
    build_job(&dir.0);
    let created = clowder(&socket, &dir.0, &["enclave", "create", "--name", "e", "--cores", "1", "--mem", "512M"]);
    assert!(created.status.success(), "create: {}{}", text(&created.stdout), text(&created.stderr));
    let echo = tcp_echo("127.0.0.1:0");

    let client = job(&socket, &dir.0, &["tcp-client", &echo.to_string(), &closed_port().to_string()]);
    assert_eq!(client, "echo: hello from the enclave\npeer port matches: 1\nrefused: -1 ECONNREFUSED\n");

    let port_file = dir.0.join("port");
    let server = {
        let (socket, dir) = (socket.clone(), dir.0.clone());
        std::thread::spawn(move || job(&socket, &dir, &["tcp-server", "port"]))
    };
    assert_eq!(host_client_of(&dir.0, &port_file), 200_000);
    let served = server.join().unwrap();
    assert!(served.starts_with("echoed 200000 bytes\n"), "{served}");
    assert!(
        served.ends_with("send after the peer closed: EPIPE\n") || served.ends_with("send after the peer closed: ECONNRESET\n"),
        "{served}"
    );

    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buffer = [0u8; 64];
        if let Ok((count, from)) = udp.recv_from(&mut buffer) {
            let _ = udp.send_to(&buffer[..count], from);
        }
    });
    assert_eq!(job(&socket, &dir.0, &["udp", &udp_port.to_string()]), "udp: datagram from port 1\n");

    let listener = UnixListener::bind(dir.0.join("echo.sock")).unwrap();
    std::thread::spawn(move || {
        if let Ok((mut stream, _)) = listener.accept() {
            let mut buffer = [0u8; 64];
            if let Ok(count) = stream.read(&mut buffer) {
                let _ = stream.write_all(&buffer[..count]);
            }
        }
    });
    assert_eq!(job(&socket, &dir.0, &["unix", "echo.sock"]), "pair: pingpong\nunix echo: unix\n");

    assert_eq!(
        job(&socket, &dir.0, &["readiness", &echo.to_string()]),
        "connect: EINPROGRESS\nwritable: 1, SO_ERROR 0\nempty: -1 EAGAIN\nnothing yet: 0\nready: 1, the socket: 1\ngot: ready?\nblocking again: 1\n"
    );
    assert_eq!(
        job(&socket, &dir.0, &["six", &tcp_echo("[::1]:0").to_string()]),
        "tcp6 echo: six\nudp6: to itself\nunix datagrams: one, two\n"
    );
    assert_eq!(job(&socket, &dir.0, &["select", &echo.to_string()]), "select, nothing yet: 0\nselect: 1, the socket 1\n");
    assert_eq!(job(&socket, &dir.0, &["eintr", &echo.to_string()]), "recv: -1 EINTR\n");
    assert_eq!(job(&socket, &dir.0, &["reset", &tcp_resetter().to_string()]), "recv after a reset: -1 ECONNRESET\n");
    assert_eq!(job(&socket, &dir.0, &["rights"]), "passed: through, close-on-exec 1\na pipe: -1 EOPNOTSUPP\n");
    assert_eq!(job(&socket, &dir.0, &["interfaces"]), "lo: 127.0.0.1\naudit: -1 EPROTONOSUPPORT\n");
    assert_eq!(
        job(&socket, &dir.0, &["ioctls"]),
        "conf: lo 127.0.0.1\nlength query matches: 1\nshort buffer: 0\nflags: up 1 loopback 1\nindex: 1\nname of 1: lo\n\
         address: 127.0.0.1 netmask 255.0.0.0\nmtu above 1000: 1\nhardware: loopback 1\nnosuch0: -1 ENODEV\n\
         SIOCSIFFLAGS: -1 ENOTTY\nTCGETS: -1 ENOTTY\nbad pointer: -1 EFAULT\nFIONBIO on: O_NONBLOCK 1, recv -1 EAGAIN\n\
         FIONBIO off: O_NONBLOCK 0\nFIONREAD: 5\n"
    );

    if Path::new("/usr/bin/python3").is_file() {
        let script = format!(
            "import socket\n\
             address = socket.getaddrinfo('localhost', {echo}, socket.AF_INET, socket.SOCK_STREAM)[0][4]\n\
             with socket.create_connection(address) as connection:\n    \
                 connection.sendall(b'python')\n    \
                 print(address[0], connection.recv(64).decode())\n"
        );
        let output = clowder(&socket, &dir.0, &["run", "--enclave", "e", "/usr/bin/python3", "-c", &script]);
        assert_eq!(text(&output.stdout), "127.0.0.1 python\n", "python3: {}", text(&output.stderr));
    }
    clowder(&socket, &dir.0, &["enclave", "rm", "e"]);
}

const ADMINS: u32 = 4242;

/// An unprivileged user's job: its sockets are that user's on the host.
#[test]
fn a_jobs_sockets_are_its_users_own() {
    if skipped_without("gcc", "to build the socket program")
        || skipped_without("setpriv", "to act as an unprivileged user")
        || skipped_without("prlimit", "to lower the user's descriptor limit")
    {
        return;
    }
    let dir = TempDir::new("clowder-sockets-user");
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut config = daemon_config(vmm_binary(), kernel_image(), Liveness::default());
    config.admin_group = Some(ADMINS);
    let launcher = VmmLauncher { vmm: vmm_binary(), kernel: kernel_image(), runtime_dir: dir.0.clone() };
    let socket = serve(Daemon::new(config, Box::new(launcher)), &dir.0);
    build_job(&dir.0);
    let as_user = |limit: &str, args: &[&str]| {
        let output = Command::new("prlimit")
            .arg(format!("--nofile={limit}"))
            .args(["setpriv", "--reuid", "4001", "--regid", "4001", "--groups", &ADMINS.to_string()])
            .arg(support::clowder())
            .args(args)
            .env("CLOWDER_SOCKET", &socket)
            .current_dir(&dir.0)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {}{}", text(&output.stdout), text(&output.stderr));
        text(&output.stdout)
    };
    as_user("1024", &["enclave", "create", "--name", "e", "--cores", "1", "--mem", "256M"]);
    assert_eq!(as_user("1024", &["run", "--enclave", "e", "./job", "privileged"]), "bind 80: -1 EACCES\n");
    assert_eq!(as_user("64", &["run", "--enclave", "e", "./job", "many"]), "after many: EMFILE\n");
    assert_eq!(as_user("1024", &["run", "--enclave", "e", "./job", "many"]), "no limit after 901\n", "the user's own, larger limit");
    as_user("1024", &["enclave", "rm", "e"]);
}
