//! 2 MiB hugepages for a test's enclaves: reserved on top of what the pool has and given back
//! when dropped (by the same count, so a reservation of another test running meanwhile stays).

const POOL: &str = "/proc/sys/vm/nr_hugepages";
const FREE: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages";

fn count(path: &str) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0)
}

/// Hugepages added to the pool for as long as this lives.
pub struct Reservation {
    added: u64,
}

impl Reservation {
    /// Makes sure `pages` hugepages are free, growing the pool by what is missing; the reason
    /// when the kernel cannot (too little contiguous memory, or not root).
    pub fn free_pages(pages: u64) -> Result<Reservation, String> {
        let missing = pages.saturating_sub(count(FREE));
        let reservation = Reservation { added: missing };
        if missing > 0 {
            std::fs::write(POOL, (count(POOL) + missing).to_string()).map_err(|e| format!("growing {POOL}: {e}"))?;
        }
        match count(FREE) {
            free if free >= pages => Ok(reservation),
            free => Err(format!("the kernel gave {free} free 2 MiB hugepages of {pages}")),
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.added > 0 {
            let _ = std::fs::write(POOL, count(POOL).saturating_sub(self.added).to_string());
        }
    }
}
