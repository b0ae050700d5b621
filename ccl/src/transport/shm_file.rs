//! Files in `/dev/shm` that another local user can neither plant, nor
//! pre-create, nor forge, and that never turn a full `/dev/shm` into a
//! signal.
//!
//! `/dev/shm` is writable by every user, so three habits hold for every
//! file ccl puts there:
//! - **Unguessable names.** A name is `ccl-<job>-<what>-<tag>-p<pid>[-<pid>]`,
//!   `<tag>` a MAC of the rest under a key derived from the job's secret.
//!   Seeing one file of a job tells nothing of the names of the others.
//! - **Made exclusively, opened without following links, checked.** A file
//!   is created with `O_EXCL | O_NOFOLLOW`, mode 0600 whatever the umask;
//!   whoever opens it checks that it is a regular file with one link, owned
//!   by this user, closed to others, and sealed: its last [`SEAL`] bytes
//!   hold a MAC of its name that only the job's processes can compute.
//! - **Space reserved up front.** A file's bytes are allocated when it is
//!   made (`posix_fallocate`), so a `/dev/shm` too small for the job fails
//!   there with [`ErrorKind::ShmFull`], instead of with SIGBUS when a page
//!   is first touched.

use crate::error::{Error, ErrorKind, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions, Permissions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where the files live.
pub(crate) const DIR: &str = "/dev/shm";

/// Bytes at the end of every file that hold its seal.
pub const SEAL: u64 = 64;

/// How one job names and seals its files.
#[derive(Clone)]
pub struct JobFiles {
    job: String,
    key: [u8; 32],
}

impl std::fmt::Debug for JobFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobFiles({}, key hidden)", self.job)
    }
}

impl JobFiles {
    /// The files of the job tagged `job` (in file names) whose secret is
    /// `secret` ([`UniqueId::files`](crate::launch::UniqueId::files)).
    pub fn new(job: String, secret: &[u8]) -> Self {
        let key = Sha256::digest([b"ccl-files".as_slice(), secret].concat()).into();
        JobFiles { job, key }
    }

    /// The files of a process that joined no job (a lone process, ranks as
    /// threads): one random key for the whole process.
    pub fn of_process() -> &'static Self {
        static ME: OnceLock<JobFiles> = OnceLock::new();
        ME.get_or_init(Self::fresh)
    }

    /// Files under a fresh random key and job tag, shared with no one.
    pub fn fresh() -> Self {
        let secret: [u8; 16] = rand::random();
        let key = Sha256::digest([b"ccl-private".as_slice(), &secret].concat()).into();
        JobFiles { job: format!("x{:08x}", rand::random::<u32>()), key }
    }

    /// The job's tag, as in its file names.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The start of every file name of this job (for clean-up).
    pub fn prefix(&self) -> String {
        format!("ccl-{}-", self.job)
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        // HMAC takes a key of any length: the fallback (a keyed hash,
        // as deterministic) is never taken
        let Ok(mut m) = <Hmac<Sha256>>::new_from_slice(&self.key) else {
            let mut h = Sha256::new_with_prefix(self.key);
            parts.iter().for_each(|p| h.update(p));
            return h.finalize().into();
        };
        parts.iter().for_each(|p| m.update(p));
        m.finalize().into_bytes().into()
    }

    /// The path of file `what` owned by `pids` (the processes whose exit
    /// makes it stale).
    pub fn path(&self, what: &str, pids: &[u32]) -> PathBuf {
        let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
        let pids = pids.join("-");
        let tag = self.mac(&[b"name\0", what.as_bytes(), b"\0", pids.as_bytes()]);
        let tag: String = tag[..8].iter().map(|b| format!("{b:02x}")).collect();
        PathBuf::from(format!("{DIR}/ccl-{}-{what}-{tag}-p{pids}", self.job))
    }

    /// The seal of the file at `path`.
    fn seal(&self, path: &Path) -> [u8; SEAL as usize] {
        let mut s = [0u8; SEAL as usize];
        s[..32].copy_from_slice(&self.mac(&[b"seal\0", path.as_os_str().as_encoded_bytes()]));
        s[32..].copy_from_slice(&self.mac(&[b"seal2\0", path.as_os_str().as_encoded_bytes()]));
        s
    }

    /// Creates the file at `path` exclusively, mode 0600, with `len` bytes
    /// (zero) reserved and sealed after them. A file already there, or a
    /// link, is an error; so is a `/dev/shm` without the space
    /// ([`ErrorKind::ShmFull`]), and then nothing is left behind.
    pub fn create(&self, path: &Path, len: u64) -> Result<File> {
        self.try_create(path, len)?
            .ok_or_else(|| Error::transport(format!("create {}: something is there already", path.display())))
    }

    /// As [`create`](Self::create), but `None` where something (a file, a
    /// link) is at `path` already.
    pub fn try_create(&self, path: &Path, len: u64) -> Result<Option<File>> {
        let err = |e: std::io::Error| Error::transport(format!("create {}: {e}", path.display()));
        let f = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        let made = || -> Result<()> {
            f.set_permissions(Permissions::from_mode(0o600)).map_err(err)?;
            reserve(&f, path, len + SEAL)?;
            f.write_all_at(&self.seal(path), len).map_err(err)
        };
        made().inspect_err(|_| {
            let _ = std::fs::remove_file(path);
        })?;
        Ok(Some(f))
    }

    /// Opens the file at `path` that a process of this job made with
    /// [`create`](Self::create)`(path, len)`: `None` while it is not there
    /// or not sealed yet; an error if something else is there.
    pub fn open(&self, path: &Path, len: u64) -> Result<Option<File>> {
        let err = |why: String| Error::transport(format!("{}: {why}", path.display()));
        let f =
            match OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)
            {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                    return Err(err("is a symbolic link, not a file of this job: refusing to follow it".into()))
                }
                Err(e) => return Err(err(e.to_string())),
            };
        let m = f.metadata().map_err(|e| err(e.to_string()))?;
        let me = euid();
        if !m.file_type().is_file() || m.nlink() != 1 {
            return Err(err(format!("is not a plain file with one link (it has {}): not made by this job", m.nlink())));
        }
        if m.uid() != me || m.mode() & 0o077 != 0 {
            return Err(err(format!(
                "is owned by uid {} with mode {:o}, where this job's files are owned by uid {me} with mode 600: \
                 another user made it; refusing to use it",
                m.uid(),
                m.mode() & 0o7777
            )));
        }
        if m.len() != len + SEAL {
            return Ok(None); // its maker has not sized it yet
        }
        let mut seal = [0u8; SEAL as usize];
        f.read_exact_at(&mut seal, len).map_err(|e| err(e.to_string()))?;
        if seal == [0; SEAL as usize] {
            return Ok(None); // sized, not sealed yet
        }
        if seal != self.seal(path) {
            return Err(err("has no seal of this job: it is not the file its peer made; refusing to use it".into()));
        }
        Ok(Some(f))
    }
}

/// Allocates `len` bytes of `f` now, or says how much `/dev/shm` lacks.
fn reserve(f: &File, path: &Path, len: u64) -> Result<()> {
    let Ok(off) = libc::off_t::try_from(len) else {
        return Err(Error::invalid(format!("{}: {len} bytes is too large a file", path.display())));
    };
    // SAFETY: `f` is an open file descriptor for the duration of the call.
    let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, off) };
    match rc {
        0 => Ok(()),
        libc::ENOSPC | libc::EFBIG => {
            Err(Error::new(ErrorKind::ShmFull { path: path.display().to_string(), need: len, free: free_bytes(DIR) }))
        }
        e => Err(Error::transport(format!(
            "reserve {len} bytes for {}: {}",
            path.display(),
            std::io::Error::from_raw_os_error(e)
        ))),
    }
}

/// Bytes free to this user in the file system at `dir` (0 if unknown).
pub(crate) fn free_bytes(dir: &str) -> u64 {
    let Ok(c) = std::ffi::CString::new(dir) else { return 0 };
    // SAFETY: statvfs reads a NUL-terminated path and writes one struct,
    // which is zero-initialised plain data.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return 0;
    }
    #[allow(clippy::useless_conversion)] // fsblkcnt_t is 32 bits on some targets
    u64::from(s.f_bavail).saturating_mul(u64::from(s.f_frsize))
}

/// This process's effective user id: the owner of its files.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether the entry at `path` belongs to this user (`lstat`: a link is
/// judged by its own owner): a sweep removes only those.
pub(crate) fn ours(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.uid() == euid())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// The files of a new job: its own secret each time.
    fn files() -> JobFiles {
        static JOBS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = JOBS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let secret = [u64::from(std::process::id()).to_le_bytes(), n.to_le_bytes()].concat();
        JobFiles::new(format!("{:08x}", std::process::id()), &secret)
    }

    #[test]
    fn names_depend_on_the_secret_and_end_in_their_owners() {
        let (a, b) = (files(), files());
        let p = a.path("b3", &[41, 42]);
        assert!(p.to_string_lossy().starts_with(&format!("{DIR}/{}b3-", a.prefix())));
        assert!(p.to_string_lossy().ends_with("-p41-42"));
        assert_eq!(p, a.path("b3", &[41, 42]), "the same name on every rank");
        assert_ne!(p, a.path("b3", &[41, 43]));
        assert_ne!(p, a.path("b4", &[41, 42]));
        // another job (another secret) cannot tell the name from the rest
        let q = b.path("b3", &[41, 42]);
        assert_ne!(q.to_string_lossy().replace(b.job(), ""), p.to_string_lossy().replace(a.job(), ""));
    }

    #[test]
    fn made_exclusively_opened_sealed_and_never_through_a_link() {
        let jf = files();
        let pid = std::process::id();
        let path = jf.path("t0", &[pid]);
        assert!(jf.open(&path, 100).expect("absent is not an error").is_none());
        let f = jf.create(&path, 100).expect("create");
        assert_eq!(f.metadata().expect("stat").mode() & 0o777, 0o600);
        assert_eq!(f.metadata().expect("stat").len(), 100 + SEAL);
        assert!(jf.create(&path, 100).is_err(), "never twice");
        assert!(jf.open(&path, 100).expect("open").is_some());
        assert!(jf.open(&path, 99).expect("another size").is_none(), "not the size its maker gives it");
        // another job's key: the seal does not match
        assert!(files().open(&path, 100).is_err());
        std::fs::remove_file(&path).expect("remove");

        // a link planted where a file goes: neither written through nor opened
        let target = jf.path("t1", &[pid]);
        std::fs::write(&target, b"precious").expect("target");
        symlink(&target, &path).expect("plant");
        assert!(jf.create(&path, 100).is_err());
        let e = jf.open(&path, 100).expect_err("a link is refused").to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).expect("read"), b"precious");
        std::fs::remove_file(&path).expect("remove link");

        // a file with the right name but open to others, or unsealed
        std::fs::set_permissions(&target, Permissions::from_mode(0o666)).expect("chmod");
        std::fs::rename(&target, &path).expect("move");
        let e = jf.open(&path, 0).expect_err("mode 666 is refused").to_string();
        assert!(e.contains("another user made it"), "{e}");
        std::fs::remove_file(&path).expect("remove");
    }

    #[test]
    fn a_file_of_another_user_is_refused() {
        if euid() != 0 {
            return; // only root can give a file away (CI runs as root)
        }
        let jf = files();
        let path = jf.path("t2", &[std::process::id()]);
        drop(jf.create(&path, 64).expect("create"));
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).expect("chown");
        let e = jf.open(&path, 64).expect_err("refused").to_string();
        std::fs::remove_file(&path).expect("remove");
        assert!(e.contains("owned by uid 65534"), "{e}");
    }
}
