//! Enclave memory sizes: checking them against what the host can give.

/// Smallest enclave: the LWK needs room for itself, the channel and a job.
pub const MIN_ENCLAVE_MEMORY: u64 = 16 << 20;
/// clowder-vmm's own limit.
pub const MAX_ENCLAVE_MEMORY: u64 = 1 << 40;
const HUGEPAGE: u64 = 2 << 20;

// Sizes are written as everywhere in clowder (flags, the API, clowder-vmm, the LWK).
pub use hwspec::{format_size, parse_size};

/// What the host has: its 2 MiB hugepage pool and available memory, from /sys and /proc.
#[derive(Clone, Copy, Debug)]
pub struct HostMemory {
    /// `vm.nr_hugepages`: the pool's size, free or not.
    pub hugepages: u64,
    pub free_hugepages: u64,
    pub available: u64,
}

impl HostMemory {
    pub fn read() -> HostMemory {
        let count = |name: &str| {
            std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{name}"))
                .ok()
                .and_then(|text| text.trim().parse().ok())
                .unwrap_or(0)
        };
        let (hugepages, free_hugepages) = (count("nr_hugepages"), count("free_hugepages"));
        let available = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find_map(|line| line.strip_prefix("MemAvailable:"))
                    .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
            .map_or(u64::MAX, |kib| kib * 1024);
        HostMemory { hugepages, free_hugepages, available }
    }
}

/// Checks a request for `bytes` of enclave memory (hugepage-backed or not) against the host.
pub fn check_request(bytes: u64, hugepages: bool, host: HostMemory) -> Result<(), String> {
    if !(MIN_ENCLAVE_MEMORY..=MAX_ENCLAVE_MEMORY).contains(&bytes) {
        return Err(format!(
            "memory {} is outside {}..={}",
            format_size(bytes),
            format_size(MIN_ENCLAVE_MEMORY),
            format_size(MAX_ENCLAVE_MEMORY)
        ));
    }
    if hugepages {
        if bytes % HUGEPAGE != 0 {
            return Err(format!("memory {} is not a multiple of 2M, as hugepages need", format_size(bytes)));
        }
        let needed = bytes / HUGEPAGE;
        if needed > host.free_hugepages {
            // The pages in use stay in use: the pool must grow by the shortfall, never shrink.
            let pool = host.hugepages.max(host.free_hugepages) + (needed - host.free_hugepages);
            return Err(format!(
                "{} of hugepages needs {needed} free 2 MiB hugepages, the host has {} (reserve more with: sysctl vm.nr_hugepages={pool}, or drop --hugepages)",
                format_size(bytes),
                host.free_hugepages,
            ));
        }
    } else if bytes > host.available {
        return Err(format!(
            "memory {} is more than the host has available ({})",
            format_size(bytes),
            format_size(host.available / (1 << 20) * (1 << 20))
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked_against_the_host() {
        let host = HostMemory { hugepages: 16, free_hugepages: 16, available: 1 << 30 };
        assert!(check_request(32 << 20, true, host).is_ok());
        let error = check_request(64 << 20, true, host).unwrap_err();
        assert!(error.contains("needs 32 free") && error.contains("sysctl vm.nr_hugepages=32,"), "{error}");
        assert!(check_request((32 << 20) + 4096, true, host).unwrap_err().contains("multiple of 2M"));
        assert!(check_request(2 << 30, false, host).unwrap_err().contains("available"));
        assert!(check_request(1 << 20, false, host).unwrap_err().contains("outside"));
    }

    /// Pages held by running enclaves are not free: the hint adds the shortfall to the whole
    /// pool, so following it gives enough pages and never takes reserved ones away.
    #[test]
    fn the_hugepage_hint_never_lowers_the_pool() {
        let host = HostMemory { hugepages: 600, free_hugepages: 88, available: 1 << 30 };
        let error = check_request(256 << 20, true, host).unwrap_err();
        assert!(error.contains("needs 128 free") && error.contains("sysctl vm.nr_hugepages=640,"), "{error}");
        let host = HostMemory { hugepages: 600, free_hugepages: 0, available: 1 << 30 };
        let error = check_request(16 << 20, true, host).unwrap_err();
        assert!(error.contains("sysctl vm.nr_hugepages=608,"), "{error}");
    }
}
