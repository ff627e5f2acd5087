//! `clowder run` as a rank under a launcher (`mpirun`, `srun`, `mpiexec`): what it carries from
//! the launcher to the job, and how the job's end reaches the launcher.
//!
//! - The environment: every variable of the launchers' and MPI runtimes' families (Open MPI's
//!   `OMPI_*`, PMIx's `PMIX_*`, Slurm's `SLURM_*`, PMI's `PMI_*`, ...) goes to the job as it is
//!   here, so the rank finds its PMIx server, its rank and its peers; `--env` still overrides.
//! - PMI-1's inherited socket (MPICH's Hydra: `PMI_FD`), relayed. Hydra's proxy hands each rank
//!   one end of a socketpair by descriptor number; that number means nothing in an enclave, and
//!   an unmodified rank can only be pointed elsewhere by `PMI_PORT=host:port`, where MPICH's
//!   simple PMI client connects by TCP (it has no Unix-path form). Without `PMI_ID` the client
//!   makes no handshake of its own on that connection and takes its rank and size from
//!   `PMI_RANK`/`PMI_SIZE` as with `PMI_FD`, so the bytes on the wire are the same and this
//!   process copies them both ways unchanged: it listens on 127.0.0.1 (an ephemeral port, in
//!   the network namespace the daemon's socket service shares with it), gives the job
//!   `PMI_PORT` instead of `PMI_FD` (and drops `PMI_ID`, which `PMI_FD`'s clients never read),
//!   and relays until either side closes. The client cannot send a secret first, so the
//!   listener authenticates by owner: the kernel's socket table (`/proc/self/net/tcp`) names
//!   the uid that made the connecting socket, and the daemon makes a job's sockets as the job's
//!   user, so a connection from any other uid is closed unread; the first one of this uid is
//!   taken and the listener closed, so no second connection reaches the proxy.
//! - The end: the enclave reports a job killed by signal N apart from any exit code
//!   (enclave-proto's `KILLED_BY_SIGNAL` + N; a job's `exit(130)` stays exit code 130). A
//!   launcher tells a rank that crashed from one that exited with an error only by the signal,
//!   so `clowder run` ends by that signal itself, without a core file of its own.
//! - Being killed: the daemon ends a job whose `clowder run` hung up, so SIGINT, SIGTERM or
//!   SIGKILL from the launcher, which end this process by their default action, end the job.

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// The variable families a launcher or an MPI runtime hands its ranks.
const LAUNCHER_PREFIXES: &[&str] =
    &["OMPI_", "OPAL_", "ORTE_", "PRTE_", "PMIX_", "SLURM_", "SLURMD_", "PMI_", "HYDRA_", "MPIR_", "MPICH_", "UCX_"];

/// The launcher's variables among `vars` as `NAME=VALUE`, leaving out those `explicit` (the
/// `--env` entries, which win) names, and any that are not UTF-8 (the API carries text).
pub fn launcher_env(vars: impl IntoIterator<Item = (OsString, OsString)>, explicit: &[String]) -> Vec<String> {
    let named_explicitly = |name: &str| explicit.iter().any(|entry| entry.split('=').next() == Some(name));
    vars.into_iter()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .filter(|(name, _)| LAUNCHER_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) && !named_explicitly(name))
        .map(|(name, value)| format!("{name}={value}"))
        .collect()
}

/// When `env` (the job's, from [`launcher_env`]) carries `PMI_FD`, starts relaying that
/// inherited socket to a loopback port only this user may connect to once, and gives the job
/// `PMI_PORT` instead (the module comment says why). The relay runs until either side closes.
pub fn relay_pmi(env: &mut Vec<String>) -> Result<(), String> {
    let Some(at) = env.iter().position(|entry| entry.starts_with("PMI_FD=")) else {
        return Ok(());
    };
    let upstream = inherited_socket(&env[at]["PMI_FD=".len()..])?;
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let port = start_relay(upstream, uid).map_err(|e| format!("cannot listen for the job's PMI connection: {e}"))?;
    env.retain(|entry| !entry.starts_with("PMI_FD=") && !entry.starts_with("PMI_ID="));
    env.push(format!("PMI_PORT={}:{port}", Ipv4Addr::LOCALHOST));
    Ok(())
}

/// The socket descriptor `PMI_FD` names, taken over by this process (Hydra's end of a
/// socketpair: a Unix stream socket).
fn inherited_socket(number: &str) -> Result<UnixStream, String> {
    let fd: i32 = number.parse().ok().filter(|fd| *fd > 2).ok_or_else(|| format!("PMI_FD={number} is not a descriptor number above 2"))?;
    // SAFETY: all-zero bytes are a valid `stat`.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `stat`.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 || stat.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("PMI_FD={fd} is not an open socket of this process"));
    }
    // SAFETY: the launcher handed this descriptor to this process for PMI alone; nothing else
    // here uses it, so this is its one owner from now on.
    Ok(UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Listens on 127.0.0.1, and in a thread takes the first connection whose socket `uid` made,
/// closes the listener and copies bytes between it and `upstream`. Returns the port.
fn start_relay(upstream: UnixStream, uid: u32) -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        let Some(job) = accept_from(&listener, uid) else { return };
        drop(listener);
        relay(job, upstream);
    });
    Ok(port)
}

/// The first connection to `listener` from a socket of `uid`; others are closed unread.
fn accept_from(listener: &TcpListener, uid: u32) -> Option<TcpStream> {
    loop {
        let (stream, peer) = listener.accept().ok()?;
        let tcp = std::fs::read_to_string("/proc/self/net/tcp").unwrap_or_default();
        let owner = listener.local_addr().ok().and_then(|local| socket_owner(&tcp, peer, local));
        if owner == Some(uid) {
            return Some(stream);
        }
        eprintln!("clowder: refused a PMI connection from {peer} (owner {owner:?}, not uid {uid})");
    }
}

/// The uid that owns the socket at `local` connected to `remote`, from the text of
/// `/proc/net/tcp` (IPv4 only: the relay listens on 127.0.0.1).
fn socket_owner(tcp: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    let hex = |addr: SocketAddr| match addr {
        // The kernel prints the address as the u32 it stores (network order) in host order.
        SocketAddr::V4(v4) => Some(format!("{:08X}:{:04X}", u32::from_ne_bytes(v4.ip().octets()), v4.port())),
        SocketAddr::V6(_) => None,
    };
    let (local, remote) = (hex(local)?, hex(remote)?);
    tcp.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.len() > 7 && fields[1] == local && fields[2] == remote).then(|| fields[7].parse().ok()).flatten()
    })
}

/// Copies both ways between the job's connection and the launcher's socket until either side
/// closes, then shuts both down so the other direction ends too.
fn relay(job: TcpStream, upstream: UnixStream) {
    let (Ok(job_in), Ok(upstream_out)) = (job.try_clone(), upstream.try_clone()) else { return };
    let up = std::thread::spawn(move || copy_then_close(job_in, upstream_out));
    copy_then_close(upstream, job);
    let _ = up.join();
}

/// A connected stream socket of the relay, either kind.
trait Socket: Read + Write {
    /// Shuts both directions down (for every descriptor of the socket, unlike a close).
    fn shut_down(&self);
}

impl Socket for TcpStream {
    fn shut_down(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

impl Socket for UnixStream {
    fn shut_down(&self) {
        let _ = self.shutdown(Shutdown::Both);
    }
}

/// Copies `from` to `to` until either fails or `from` ends, then shuts down both sockets (each
/// a descriptor of its own, so the other direction's blocked read wakes).
fn copy_then_close(mut from: impl Socket, mut to: impl Socket) {
    let _ = io::copy(&mut from, &mut to);
    from.shut_down();
    to.shut_down();
}

/// The signal a job's status says killed it, if its default action ends a process (so a
/// launcher sees the rank die of it); else none. An exit code (0..=255) is never a signal.
pub fn killing_signal(status: u32) -> Option<i32> {
    const TERMINATING: [i32; 15] = [
        libc::SIGHUP,
        libc::SIGINT,
        libc::SIGQUIT,
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGABRT,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGKILL,
        libc::SIGUSR1,
        libc::SIGSEGV,
        libc::SIGUSR2,
        libc::SIGPIPE,
        libc::SIGALRM,
        libc::SIGTERM,
    ];
    let number = i32::try_from(enclave_proto::job_status_signal(status)?).ok()?;
    TERMINATING.contains(&number).then_some(number)
}

/// Ends this process by `signal`, as the job ended. No core file: the crash was the job's, in
/// the enclave, not this client's. The default action first: Rust's runtime handles SIGSEGV
/// and SIGBUS (for stack overflows) and would return from a raised one.
pub fn die_of(signal: i32) -> ! {
    let no_core = libc::rlimit { rlim_cur: 0, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: plain system calls on this process; nothing else runs by now.
    unsafe {
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(signal, libc::SIG_DFL);
        libc::sigprocmask(libc::SIG_SETMASK, &std::mem::zeroed(), std::ptr::null_mut());
        libc::raise(signal);
    }
    std::process::exit(128 + signal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsRawFd;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(n, v)| (n.into(), v.into())).collect()
    }

    #[test]
    fn the_launchers_variables_pass_and_others_stay() {
        let here = vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("PMIX_SERVER_URI41", "pmix-server.7;tcp4://127.0.0.1:4000"),
            ("SLURM_PROCID", "3"),
            ("PMI_FD", "5"),
            ("HOME", "/root"),
            ("LD_PRELOAD", "x.so"),
            ("XOMPI_", "no"),
        ]);
        let passed = launcher_env(here, &[]);
        assert_eq!(
            passed,
            ["OMPI_COMM_WORLD_RANK=1", "PMIX_SERVER_URI41=pmix-server.7;tcp4://127.0.0.1:4000", "SLURM_PROCID=3", "PMI_FD=5"]
        );
    }

    #[test]
    fn an_explicit_env_entry_wins_over_the_launchers() {
        let here = vars(&[("SLURM_PROCID", "3"), ("OMPI_COMM_WORLD_SIZE", "2")]);
        assert_eq!(launcher_env(here, &["SLURM_PROCID=0".into()]), ["OMPI_COMM_WORLD_SIZE=2"]);
    }

    /// A relay of one end of a socketpair (the launcher's proxy holds the other), as this uid
    /// expects (`as_uid`), and the port it listens on.
    fn relay_for(as_uid: u32) -> (UnixStream, u16) {
        let (proxy, rank_end) = UnixStream::pair().unwrap();
        let port = start_relay(rank_end, as_uid).unwrap();
        (proxy, port)
    }

    fn my_uid() -> u32 {
        // SAFETY: getuid cannot fail.
        unsafe { libc::getuid() }
    }

    #[test]
    fn the_relay_carries_pmi_lines_both_ways_and_takes_one_connection() {
        let (mut proxy, port) = relay_for(my_uid());
        let mut job = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        job.write_all(b"cmd=init pmi_version=1 pmi_subversion=1\n").unwrap();
        let mut line = [0; 40];
        proxy.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"cmd=init pmi_version=1 pmi_subversion=1\n");
        proxy.write_all(b"cmd=response_to_init rc=0\n").unwrap();
        let mut reply = [0; 26];
        job.read_exact(&mut reply).unwrap();
        assert_eq!(&reply, b"cmd=response_to_init rc=0\n");
        // The listener is gone once the job's connection was taken.
        let second = TcpStream::connect((Ipv4Addr::LOCALHOST, port));
        assert_eq!(second.err().map(|e| e.kind()), Some(io::ErrorKind::ConnectionRefused));
        // The job's end closes the launcher's side.
        drop(job);
        let mut rest = Vec::new();
        assert_eq!(proxy.read_to_end(&mut rest).unwrap(), 0);
    }

    #[test]
    fn a_connection_of_another_uid_is_closed_unread() {
        let (mut proxy, port) = relay_for(my_uid().wrapping_add(1));
        let mut stranger = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        let _ = stranger.write_all(b"cmd=barrier_in\n");
        stranger.set_read_timeout(Some(std::time::Duration::from_secs(10))).unwrap();
        let mut byte = [0; 1];
        assert!(matches!(stranger.read(&mut byte), Ok(0) | Err(_)), "the stranger's connection is closed");
        proxy.set_read_timeout(Some(std::time::Duration::from_millis(300))).unwrap();
        let read = proxy.read(&mut byte);
        assert!(read.is_err(), "nothing reached the launcher: {read:?}");
    }

    #[test]
    fn the_owner_of_a_connection_comes_from_the_kernels_socket_table() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
                   0: 0100007F:9C40 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
                   1: 0100007F:D431 0100007F:9C40 01 00000000:00000000 00:00000000 00000000  1000        0 2 1\n";
        let listener: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let peer: SocketAddr = "127.0.0.1:54321".parse().unwrap();
        assert_eq!(socket_owner(tcp, peer, listener), Some(1000));
        assert_eq!(socket_owner(tcp, "127.0.0.1:54322".parse().unwrap(), listener), None);
        assert_eq!(socket_owner(tcp, "[::1]:54321".parse().unwrap(), listener), None);
    }

    #[test]
    fn pmi_fd_becomes_a_loopback_port_and_pmi_id_goes() {
        let (_proxy, rank_end) = UnixStream::pair().unwrap();
        let fd = OwnedFd::from(rank_end);
        let mut env = vec![format!("PMI_FD={}", fd.as_raw_fd()), "PMI_RANK=1".into(), "PMI_SIZE=2".into(), "PMI_ID=1".into()];
        std::mem::forget(fd); // relay_pmi takes the descriptor over, as from a launcher
        relay_pmi(&mut env).unwrap();
        assert_eq!(env[..2], ["PMI_RANK=1", "PMI_SIZE=2"]);
        assert_eq!(env.len(), 3);
        assert!(env[2].starts_with("PMI_PORT=127.0.0.1:"), "{env:?}");

        let mut untouched = vec!["PMI_RANK=0".to_string()];
        relay_pmi(&mut untouched).unwrap();
        assert_eq!(untouched, ["PMI_RANK=0"]);
    }

    #[test]
    fn a_pmi_fd_that_is_no_socket_is_refused_in_one_line() {
        let file = File::open("/dev/null").unwrap();
        let mut env = vec![format!("PMI_FD={}", file.as_raw_fd())];
        assert_eq!(relay_pmi(&mut env).unwrap_err(), format!("PMI_FD={} is not an open socket of this process", file.as_raw_fd()));
        assert_eq!(relay_pmi(&mut vec!["PMI_FD=x".into()]).unwrap_err(), "PMI_FD=x is not a descriptor number above 2");
        assert_eq!(relay_pmi(&mut vec!["PMI_FD=1".into()]).unwrap_err(), "PMI_FD=1 is not a descriptor number above 2");
    }

    #[test]
    fn signal_statuses_name_terminating_signals_only() {
        let killed = |signal: i32| enclave_proto::KILLED_BY_SIGNAL + signal as u32;
        assert_eq!(killing_signal(killed(libc::SIGSEGV)), Some(libc::SIGSEGV));
        assert_eq!(killing_signal(killed(libc::SIGKILL)), Some(libc::SIGKILL));
        assert_eq!(killing_signal(killed(libc::SIGTERM)), Some(libc::SIGTERM));
        assert_eq!(killing_signal(killed(libc::SIGINT)), Some(libc::SIGINT));
        assert_eq!(killing_signal(killed(libc::SIGCHLD)), None, "SIGCHLD ends nothing");
        for code in [0, 1, 128, 130, 137, 139, 255] {
            assert_eq!(killing_signal(code), None, "exit code {code}");
        }
    }
}
