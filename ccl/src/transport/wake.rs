//! A socket beside a rank's doorbell, for waking the rank while it sleeps
//! in `poll()` on its network sockets, which a futex cannot wake: a peer
//! that rings the doorbell while the rank polls also sends a byte to this
//! socket, which is among the descriptors polled. Without it a rank with
//! both memory and network peers had to nap in short polls, and a message
//! from a peer of its own host waited for the nap to end
//! (`bench/results/wake-socket.md`).
//! A datagram socket rather than a named pipe: sending to a socket nobody
//! reads any more fails quietly, where writing to such a pipe raises
//! SIGPIPE.

use super::doorbell::Doorbell;
use std::os::unix::io::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One rank's wake socket: bound by the rank that sleeps on it, or a
/// peer's handle (its sending socket made on the first wake-up it sends).
#[derive(Debug)]
pub struct WakeSocket {
    path: PathBuf,
    /// The owner's bound socket, or a peer's unbound one once made.
    sock: OnceLock<Option<UnixDatagram>>,
    owned: bool,
}

impl WakeSocket {
    /// Binds the socket at `path` (replacing a stale one), mode 0600
    /// whatever the umask, for the rank that sleeps on it; removed when
    /// dropped.
    pub fn bind(path: &Path) -> std::io::Result<Self> {
        let _ = std::fs::remove_file(path);
        let sock = UnixDatagram::bind(path)?;
        let removed = |e| {
            let _ = std::fs::remove_file(path);
            e
        };
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).map_err(removed)?;
        sock.set_nonblocking(true).map_err(removed)?;
        Ok(WakeSocket { path: path.to_path_buf(), sock: OnceLock::from(Some(sock)), owned: true })
    }

    /// A peer's handle on the socket at `path`; nothing is made yet.
    pub fn of_peer(path: PathBuf) -> Self {
        WakeSocket { path, sock: OnceLock::new(), owned: false }
    }

    /// The descriptor the owner polls (`None` for a peer's handle).
    pub fn fd(&self) -> Option<RawFd> {
        self.sock.get().filter(|_| self.owned)?.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// Wakes the owner if it polls: sends a byte. A full queue already
    /// holds a wake-up, and a socket gone has no one to wake.
    pub fn poke(&self) {
        let made = || UnixDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|()| s)).ok();
        if let Some(s) = self.sock.get_or_init(made) {
            let _ = s.send_to(&[1], &self.path);
        }
    }

    /// Empties the owner's socket after a poll, so the next poll sleeps
    /// until the next wake-up.
    pub fn drain(&self) {
        let Some(Some(s)) = self.sock.get().filter(|_| self.owned) else { return };
        let mut buf = [0u8; 16];
        while matches!(s.recv(&mut buf), Ok(n) if n > 0) {}
    }
}

/// Rings `bell`, and sends to its owner's `wake` socket too while the
/// owner sleeps in `poll()` ([`Doorbell::polling`]).
pub fn ring(bell: &Doorbell, wake: Option<&WakeSocket>) {
    bell.ring();
    if bell.polling() {
        wake.into_iter().for_each(WakeSocket::poke);
    }
}

impl Drop for WakeSocket {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd, ms: i32) -> bool {
        let mut p = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
        // SAFETY: one valid pollfd for the duration of the call.
        unsafe { libc::poll(p.as_mut_ptr(), 1, ms) == 1 }
    }

    #[test]
    fn a_peer_s_poke_makes_the_owner_s_socket_readable_until_drained() {
        let path = std::env::temp_dir().join(format!("ccl-test-wake-{}", std::process::id()));
        let own = WakeSocket::bind(&path).expect("bind");
        let fd = own.fd().expect("owner's fd");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "only its owner may send to it, whatever the umask");
        assert!(!readable(fd, 0), "nothing sent yet");
        let peer = WakeSocket::of_peer(path.clone());
        assert_eq!(peer.fd(), None);
        peer.poke();
        peer.poke();
        assert!(readable(fd, 1000), "poked");
        own.drain();
        assert!(!readable(fd, 0), "drained");
        drop(own);
        assert!(!path.exists(), "the owner removes the socket");
        peer.poke(); // nobody reads any more: nothing to wake, no error
    }
}
