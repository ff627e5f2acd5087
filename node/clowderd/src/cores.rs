//! Host cores: which exist and may be used, and the choice of cores for a new enclave.

use std::collections::{BTreeMap, BTreeSet};

// Core lists are written as everywhere in clowder (the API, clowder-vmm's --cores).
pub use hwspec::{format_cpu_list, parse_cpu_list};

/// Cores that are online and in this process's affinity mask.
pub fn usable_cores() -> Result<BTreeSet<usize>, String> {
    let online =
        std::fs::read_to_string("/sys/devices/system/cpu/online").map_err(|e| format!("reading /sys/devices/system/cpu/online: {e}"))?;
    let online = parse_cpu_list(&online).map_err(|e| format!("/sys/devices/system/cpu/online: {e}"))?;
    let allowed = allowed_cores()?;
    Ok(online.into_iter().filter(|core| allowed.contains(core)).collect())
}

fn allowed_cores() -> Result<BTreeSet<usize>, String> {
    // SAFETY: sched_getaffinity fills the zeroed set we own; CPU_ISSET only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Err(format!("sched_getaffinity: {}", std::io::Error::last_os_error()));
        }
        Ok((0..libc::CPU_SETSIZE as usize).filter(|&cpu| libc::CPU_ISSET(cpu, &set)).collect())
    }
}

/// What a client asked for: a number of cores, or particular ones (none twice, as
/// `parse_cpu_list` makes sure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoreRequest {
    Count(usize),
    Exactly(Vec<usize>),
}

/// Picks cores for an enclave. `taken` maps each core already given to an enclave to that
/// enclave's name. The error says what is free, so a person can ask again.
pub fn choose_cores(request: &CoreRequest, usable: &BTreeSet<usize>, taken: &BTreeMap<usize, String>) -> Result<Vec<usize>, String> {
    let free: Vec<usize> = usable.iter().copied().filter(|c| !taken.contains_key(c)).collect();
    let describe_free = || {
        let mut owners: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (core, owner) in taken {
            owners.entry(owner).or_default().push(*core);
        }
        let owners: Vec<String> =
            owners.iter().map(|(owner, cores)| format!("{} for {owner}", format_cpu_list(cores.iter().copied()))).collect();
        format!(
            "usable cores: {}; taken: {}; free: {}",
            format_cpu_list(usable.iter().copied()),
            if owners.is_empty() { "none".to_string() } else { owners.join(", ") },
            format_cpu_list(free.iter().copied())
        )
    };
    match request {
        CoreRequest::Count(0) => Err("an enclave needs at least one core".into()),
        CoreRequest::Count(count) if *count > free.len() => {
            Err(format!("asked for {count} core{}, only {} free ({})", if *count == 1 { "" } else { "s" }, free.len(), describe_free()))
        }
        // Take the highest free cores: core 0 usually carries the host's interrupts.
        CoreRequest::Count(count) => Ok(free[free.len() - count..].to_vec()),
        CoreRequest::Exactly(cores) => {
            for core in cores {
                if !usable.contains(core) {
                    return Err(format!("core {core} is not online or not allowed for clowderd ({})", describe_free()));
                }
                if let Some(owner) = taken.get(core) {
                    return Err(format!("core {core} already belongs to enclave {owner} ({})", describe_free()));
                }
            }
            let mut cores = cores.clone();
            cores.sort_unstable();
            Ok(cores)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_refuses_overlap_and_says_what_is_free() {
        let usable: BTreeSet<usize> = [0, 1, 2, 3].into();
        let taken: BTreeMap<usize, String> = [(3, "sim".to_string())].into();
        assert_eq!(choose_cores(&CoreRequest::Count(2), &usable, &taken).unwrap(), vec![1, 2]);
        let error = choose_cores(&CoreRequest::Count(4), &usable, &taken).unwrap_err();
        assert!(error.contains("only 3 free") && error.contains("3 for sim") && error.contains("free: 0-2"), "{error}");
        let error = choose_cores(&CoreRequest::Exactly([3].into()), &usable, &taken).unwrap_err();
        assert!(error.contains("already belongs to enclave sim"), "{error}");
        let error = choose_cores(&CoreRequest::Exactly([9].into()), &usable, &taken).unwrap_err();
        assert!(error.contains("not online"), "{error}");
        assert!(choose_cores(&CoreRequest::Count(0), &usable, &taken).is_err());
    }
}
