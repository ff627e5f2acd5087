//! `clowder run` as a rank under a launcher (`mpirun`, `srun`, `mpiexec`): what it carries from
//! the launcher to the job, and how the job's end reaches the launcher.
//!
//! - The environment: every variable of the launchers' and MPI runtimes' families (Open MPI's
//!   `OMPI_*`, PMIx's `PMIX_*`, Slurm's `SLURM_*`, PMI's `PMI_*`, ...) goes to the job as it is
//!   here, so the rank finds its PMIx server, its rank and its peers; `--env` still overrides.
//! - The end: the LWK reports a job killed by signal N as status 128+N (as a shell does). A
//!   launcher tells a rank that crashed from one that exited with an error only by the signal,
//!   so `clowder run` ends by that signal itself, without a core file of its own.
//! - Being killed: the daemon ends a job whose `clowder run` hung up, so SIGINT, SIGTERM or
//!   SIGKILL from the launcher, which end this process by their default action, end the job.

use std::ffi::OsString;

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

/// The signal a job's status says killed it: 128+N for the signals whose default action ends a
/// process (so a launcher sees the rank die of it), else none.
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
    let number = i32::try_from(status.checked_sub(128)?).ok()?;
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

    #[test]
    fn statuses_above_128_name_terminating_signals_only() {
        assert_eq!(killing_signal(139), Some(libc::SIGSEGV));
        assert_eq!(killing_signal(137), Some(libc::SIGKILL));
        assert_eq!(killing_signal(143), Some(libc::SIGTERM));
        assert_eq!(killing_signal(128 + 17), None, "SIGCHLD ends nothing");
        assert_eq!(killing_signal(128), None);
        assert_eq!(killing_signal(1), None);
        assert_eq!(killing_signal(255), None);
    }
}
