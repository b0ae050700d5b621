//! Ranks the launcher has given up on, for the ranks that wait on them.
//!
//! When cclrun loses its link to a host, the ranks on other hosts may not
//! notice for a long time: a receiver's TCP keepalive takes 16 s, and a
//! sender whose data is not acknowledged only sees its retransmissions
//! time out, minutes later. cclrun learns sooner (its own link to the host
//! is idle, so its keepalive runs first) and writes the host's ranks into
//! this file in each surviving host's shared memory, through the agent
//! there; ranks read it while they wait (`Registry::check_alive`).
//!
//! The file is `/dev/shm/ccl-<job>-lost-p<pid>`, `<pid>` being the process
//! that started this host's ranks (cclrun or its agent), which passes it as
//! `CCL_LAUNCHER_PID`. One line per lost rank: `<rank> <host> <why>`.

use crate::transport::shm::{Shm, DIR};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A rank the launcher gave up on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The lost rank.
    pub rank: usize,
    /// Its host, as the launcher names it.
    pub host: String,
    /// Why.
    pub why: String,
}

/// The notes file of job `job` whose ranks on this host process
/// `launcher_pid` started.
pub fn path(job: &str, launcher_pid: u32) -> PathBuf {
    PathBuf::from(format!("{DIR}/{}lost-p{launcher_pid}", Shm::file_prefix(job)))
}

/// Adds `ranks` of `host` to the notes at `at`, each lost because of
/// `why`. Readers see the whole file before or after, never part of it.
pub fn add(at: &Path, ranks: &[usize], host: &str, why: &str) -> std::io::Result<()> {
    let mut text = std::fs::read_to_string(at).unwrap_or_default();
    let (host, why) = (host.replace(char::is_whitespace, "_"), why.replace('\n', " "));
    for r in ranks {
        text.push_str(&format!("{r} {host} {why}\n"));
    }
    let mut tmp = at.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, at)
}

/// The notes at `at`; none when there is no file. Lines that do not parse
/// are skipped.
pub fn read(at: &Path) -> Vec<Note> {
    let Ok(text) = std::fs::read_to_string(at) else { return Vec::new() };
    text.lines()
        .filter_map(|l| {
            let mut w = l.splitn(3, ' ');
            let (rank, host, why) = (w.next()?.parse().ok()?, w.next()?, w.next()?);
            Some(Note { rank, host: host.to_string(), why: why.to_string() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_add_up_and_read_back() {
        let at = path(&format!("test{}", std::process::id()), std::process::id());
        assert!(read(&at).is_empty(), "no file: nobody lost");
        add(&at, &[4, 5], "host3", "cclrun lost its connection\n(timed out)").expect("add");
        add(&at, &[7], "host 4", "cclrun lost it").expect("add");
        // a line another writer garbled is skipped, not a panic
        let mut f = std::fs::OpenOptions::new().append(true).open(&at).expect("open");
        f.write_all(b"x host not a rank\n12 host\n").expect("write");
        let got = read(&at);
        std::fs::remove_file(&at).expect("remove");
        let note = |rank: usize, host: &str, why: &str| Note { rank, host: host.into(), why: why.into() };
        let why = "cclrun lost its connection (timed out)";
        assert_eq!(got, [note(4, "host3", why), note(5, "host3", why), note(7, "host_4", "cclrun lost it")]);
    }
}
