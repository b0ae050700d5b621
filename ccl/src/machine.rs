//! The facts of the machine a rank runs on, found once at `init` and
//! passed down to whatever needs them: the CPUs the job may use here, how
//! many of its ranks share them (so whether a rank has a core of its
//! own), and the last-level cache (its size and the CPUs sharing it, as
//! Linux describes it in sysfs). They set the slot memory and where
//! outputs start to bypass the cache ([`Config::on_machine`]), how long a
//! waiting rank spins, and the simulator's cores.
//!
//! [`Config::on_machine`]: crate::Config::on_machine

use std::path::Path;

/// This machine, as the job sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Machine {
    /// CPUs the job may use here: `CCL_HOST_CPUS` as cclrun sets it (the
    /// CPUs it may use here, which a rank pinned by `--bind-to core` no
    /// longer sees itself), else the CPUs this process may use.
    pub cpus: usize,
    /// Ranks of the job on this machine (hosts made with `CCL_HOSTID`
    /// may share one machine's cores).
    pub ranks: usize,
    /// One instance of the last-level cache, if sysfs describes it.
    pub llc: Option<SharedCache>,
}

impl Machine {
    /// This machine, shared by `ranks` ranks of the job.
    pub fn here(ranks: usize) -> Machine {
        let cpus = std::env::var("CCL_HOST_CPUS")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |c| c.get()));
        Machine { cpus, ranks: ranks.max(1), llc: last_level() }
    }

    /// Whether every rank here has a core of its own.
    pub fn own_core(&self) -> bool {
        self.ranks <= self.cpus
    }
}

/// One instance of the last-level cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedCache {
    /// Its size in bytes.
    pub bytes: usize,
    /// CPUs that share it.
    pub cpus: usize,
}

/// CPU 0's highest-level data or unified cache, if sysfs describes one.
fn last_level() -> Option<SharedCache> {
    from_sysfs(Path::new("/sys/devices/system/cpu/cpu0/cache"))
}

fn from_sysfs(dir: &Path) -> Option<SharedCache> {
    let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).ok().map(|s| s.trim().to_string());
    let mut best: Option<(u32, SharedCache)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let d = entry.path();
        if !entry.file_name().to_string_lossy().starts_with("index")
            || read(&d, "type").as_deref() == Some("Instruction")
        {
            continue;
        }
        let (Some(level), Some(bytes), Some(cpus)) = (
            read(&d, "level").and_then(|l| l.parse::<u32>().ok()),
            read(&d, "size").and_then(|s| size(&s)),
            read(&d, "shared_cpu_list").and_then(|l| cpu_count(&l)),
        ) else {
            continue;
        };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, SharedCache { bytes, cpus }));
        }
    }
    best.map(|(_, c)| c)
}

/// Bytes of a sysfs cache size (`32768K`, `1M`, or plain bytes), read as
/// a size knob is; 0 is no cache.
fn size(s: &str) -> Option<usize> {
    crate::units::bytes(s).filter(|&b| b > 0)
}

/// CPUs in a sysfs list such as `0-3,8-11` or `5`.
fn cpu_count(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_cpu_lists_parse_as_sysfs_writes_them() {
        assert_eq!(size("32768K"), Some(32 << 20));
        assert_eq!(size("1M"), Some(1 << 20));
        assert_eq!(size("4096"), Some(4096));
        assert_eq!(size("12Q"), None);
        assert_eq!(size("0K"), None);
        assert_eq!(cpu_count("0-1"), Some(2));
        assert_eq!(cpu_count("0-3,8-11"), Some(8));
        assert_eq!(cpu_count("5"), Some(1));
        assert_eq!(cpu_count("3-1"), None);
        assert_eq!(cpu_count(""), None);
    }

    #[test]
    fn the_highest_level_data_cache_is_the_last() {
        let dir = std::env::temp_dir().join(format!("ccl-llc-{}", std::process::id()));
        let index = |i: u32, level: &str, kind: &str, size: &str, cpus: &str| {
            let d = dir.join(format!("index{i}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            for (f, v) in [("level", level), ("type", kind), ("size", size), ("shared_cpu_list", cpus)] {
                std::fs::write(d.join(f), format!("{v}\n")).expect("write");
            }
        };
        index(0, "1", "Data", "32K", "0");
        index(1, "1", "Instruction", "32K", "0");
        index(2, "2", "Unified", "1024K", "0");
        assert_eq!(from_sysfs(&dir), Some(SharedCache { bytes: 1 << 20, cpus: 1 }));
        index(3, "3", "Unified", "32768K", "0-7");
        index(4, "4", "Instruction", "64M", "0-15");
        assert_eq!(from_sysfs(&dir), Some(SharedCache { bytes: 32 << 20, cpus: 8 }));
        std::fs::remove_dir_all(&dir).expect("clean up");
        assert_eq!(from_sysfs(&dir), None, "no sysfs: unknown");
    }
}
