//! How many ranks one host may be asked to start.
//!
//! As mpirun does, a job on this host alone (no hostfile, no `-H`) may not
//! ask for far more ranks than it has CPUs unless `--oversubscribe` says
//! so: `-np 100000` is a typo, and starting its ranks would take the
//! machine for the better part of an hour. Nor, oversubscribed or not,
//! for more processes than the kernel has process ids left (`pid_max`).

/// Ranks a job may have (as many as the rendezvous takes).
pub const MAX_RANKS: usize = 1 << 20;

/// Ranks per CPU that a job on this host alone may have without
/// `--oversubscribe`.
pub const RANKS_PER_CPU: usize = 64;

/// `Err` with the reason if `np` ranks of a job on this host alone may
/// not start; the CPU bound does not apply to an `oversubscribe`d job.
pub fn check_np(np: usize, oversubscribe: bool) -> Result<(), String> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    check(np, !oversubscribe, cpus, free_pids())
}

fn check(np: usize, by_cpus: bool, cpus: usize, free_pids: Option<usize>) -> Result<(), String> {
    let most = cpus.saturating_mul(RANKS_PER_CPU);
    if by_cpus && np > most {
        return Err(format!(
            "-np {np} is more than {RANKS_PER_CPU} ranks per CPU on this host ({cpus} CPU(s): at most {most}); \
             add --oversubscribe to start them anyway"
        ));
    }
    match free_pids {
        Some(free) if np >= free => Err(format!(
            "-np {np}: the kernel has only {free} process ids left (/proc/sys/kernel/pid_max, less the \
             processes running), and each rank needs at least one"
        )),
        _ => Ok(()),
    }
}

/// `--timeout SECS` as a duration: positive, finite, and small enough for
/// one (`1e20` is not).
pub fn timeout(secs: f64) -> Result<std::time::Duration, String> {
    match std::time::Duration::try_from_secs_f64(secs) {
        Ok(d) if secs > 0.0 => Ok(d),
        _ => Err(format!("--timeout {secs}: must be a positive number of seconds, at most {}", u64::MAX)),
    }
}

/// Process ids not in use: `pid_max` less the processes running now.
fn free_pids() -> Option<usize> {
    let max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok()?.trim().parse().ok()?;
    let running = std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .count();
    Some(max.saturating_sub(running))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_ranks_per_cpu_need_oversubscribe_and_none_may_pass_pid_max() {
        assert!(check(128, true, 2, Some(30_000)).is_ok());
        let e = check(129, true, 2, Some(30_000)).expect_err("over 64 per CPU");
        assert!(e.contains("--oversubscribe") && e.contains("at most 128"), "{e}");
        assert!(check(100_000, false, 2, None).is_ok(), "oversubscribed, pid_max unknown");
        let e = check(100_000, false, 2, Some(30_000)).expect_err("beyond pid_max");
        assert!(e.contains("pid_max"), "{e}");
        assert!(free_pids().is_some_and(|f| f > 0), "this machine's /proc");
    }

    #[test]
    fn timeouts_that_fit_no_duration_are_refused() {
        assert_eq!(timeout(1.5), Ok(std::time::Duration::from_millis(1500)));
        for bad in [0.0, -1.0, 1e20, f64::NAN, f64::INFINITY] {
            let e = timeout(bad).expect_err("refused");
            assert!(e.starts_with("--timeout") && e.contains("positive"), "{e}");
        }
    }
}
