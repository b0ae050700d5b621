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
//! The file is `/dev/shm/ccl-<job>-lost-<tag>-p<pid>`, `<pid>` being the
//! process that started this host's ranks (cclrun or its agent), which
//! passes it as `CCL_LAUNCHER_PID`, and `<tag>` unguessable without the
//! job's secret ([`JobFiles`]). One line per lost rank: `<rank> <host>
//! <why>`. Only the launcher's notes count: a file that is a link, or is
//! not this user's own and closed to others, is not read.

use super::shm_file::{self, JobFiles};
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
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

/// The notes file of the job of `files` whose ranks on this host process
/// `launcher_pid` started.
pub fn path(files: &JobFiles, launcher_pid: u32) -> PathBuf {
    files.path("lost", &[launcher_pid])
}

/// The text of this user's file at `at`, opened without following a link
/// and only if no one else may write it.
fn read_own(at: &Path) -> Option<String> {
    let mut f = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(at).ok()?;
    let m = f.metadata().ok()?;
    if !m.file_type().is_file() || m.uid() != shm_file::euid() || m.mode() & 0o022 != 0 {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    Some(text)
}

/// Adds `ranks` of `host` to the notes at `at`, each lost because of
/// `why`. Readers see the whole file before or after, never part of it.
pub fn add(at: &Path, ranks: &[usize], host: &str, why: &str) -> std::io::Result<()> {
    let mut text = read_own(at).unwrap_or_default();
    let (host, why) = (host.replace(char::is_whitespace, "_"), why.replace('\n', " "));
    for r in ranks {
        text.push_str(&format!("{r} {host} {why}\n"));
    }
    let mut tmp = at.as_os_str().to_owned();
    tmp.push(".tmp");
    let _ = std::fs::remove_file(&tmp); // one an earlier writer left
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, at)
}

/// The notes at `at`; none when there is no file. Lines that do not parse
/// are skipped.
pub fn read(at: &Path) -> Vec<Note> {
    let Some(text) = read_own(at) else { return Vec::new() };
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
        let at = path(&JobFiles::fresh(), std::process::id());
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

    #[test]
    fn notes_anyone_else_could_have_written_do_not_count() {
        use std::os::unix::fs::PermissionsExt;
        let at = path(&JobFiles::fresh(), std::process::id());
        let forged = "1 forged-host forged\n";
        // a link to notes elsewhere
        let elsewhere = at.with_extension("elsewhere");
        std::fs::write(&elsewhere, forged).expect("write");
        std::os::unix::fs::symlink(&elsewhere, &at).expect("link");
        assert!(read(&at).is_empty(), "a link is not followed");
        std::fs::remove_file(&at).expect("remove link");
        // a file others may write
        std::fs::rename(&elsewhere, &at).expect("move");
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(read(&at).is_empty(), "a file open to others does not count");
        // another user's file (only root can make one)
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert_eq!(read(&at).len(), 1, "this user's own file counts");
        if shm_file::euid() == 0 {
            std::os::unix::fs::chown(&at, Some(65534), Some(65534)).expect("chown");
            assert!(read(&at).is_empty(), "another user's notes do not count");
        }
        std::fs::remove_file(&at).expect("remove");
    }
}
