//! Reaching other hosts: one SSH session per host (libssh2, through the
//! `ssh2` crate), its host key checked against `known_hosts`, a
//! `cclrun agent` started on it, and the agent's messages relayed.

use crate::proto::{self, HostJob, Msg};
use ssh2::{Channel, CheckResult, KnownHostFileKind, Session};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Duration;

/// How cclrun logs in to other hosts.
#[derive(Clone, Debug)]
pub struct SshOpts {
    /// Login name, unless the host is written `user@host`.
    pub user: String,
    /// sshd's port.
    pub port: u16,
    /// Private key; without one: the agent, then `~/.ssh/id_{ed25519,ecdsa,rsa}`.
    pub key: Option<PathBuf>,
    /// `known_hosts` file; default `~/.ssh/known_hosts`.
    pub known_hosts: PathBuf,
    /// Add keys of hosts not yet known to `known_hosts` (never a changed key).
    pub accept_new: bool,
    /// Limit for connecting, the handshake and authentication.
    pub timeout: Duration,
}

impl SshOpts {
    /// Defaults from the environment: `$USER`, port 22, `~/.ssh/known_hosts`.
    pub fn from_env() -> Self {
        SshOpts {
            user: std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "root".into()),
            port: 22,
            key: None,
            known_hosts: home().join(".ssh/known_hosts"),
            accept_new: false,
            timeout: Duration::from_secs(15),
        }
    }
}

fn home() -> PathBuf {
    std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// An authenticated session to one host.
pub struct Conn {
    sess: Session,
    fd: RawFd,
    /// This side's address on the connection: reachable from that host.
    pub local_ip: std::net::IpAddr,
}

/// Splits `user@host`.
fn user_host<'a>(name: &'a str, o: &'a SshOpts) -> (&'a str, &'a str) {
    match name.split_once('@') {
        Some((u, h)) => (u, h),
        None => (o.user.as_str(), name),
    }
}

/// The host part of a hostfile name (`user@host` → `host`, `[::1]` → `::1`).
pub fn host_part(name: &str) -> &str {
    let h = name.rsplit_once('@').map_or(name, |(_, h)| h);
    h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h)
}

/// Connects to `name`, checks its host key and logs in.
pub fn connect(name: &str, o: &SshOpts) -> Result<Conn, String> {
    let (user, _) = user_host(name, o);
    let host = host_part(name);
    let addrs: Vec<_> = (host, o.port).to_socket_addrs().map_err(|e| format!("cannot resolve: {e}"))?.collect();
    let mut last = format!("no address for {host}");
    let tcp = addrs
        .iter()
        .find_map(|a| match TcpStream::connect_timeout(a, o.timeout) {
            Ok(s) => Some(s),
            Err(e) => {
                last = format!("cannot connect to {a}: {e}");
                None
            }
        })
        .ok_or(last)?;
    let local_ip = tcp.local_addr().map_err(|e| e.to_string())?.ip();
    let fd = tcp.as_raw_fd();
    // a dead link to the host ends the job instead of a silent wait
    ccl::launch::keepalive(&tcp).map_err(|e| format!("keepalive: {e}"))?;
    let mut sess = Session::new().map_err(|e| e.to_string())?;
    sess.set_tcp_stream(tcp);
    sess.set_timeout(o.timeout.as_millis().min(u32::MAX as u128) as u32);
    sess.handshake().map_err(|e| format!("SSH handshake: {}", e.message()))?;
    check_host_key(&sess, host, o)?;
    authenticate(&sess, user, o)?;
    Ok(Conn { sess, fd, local_ip })
}

fn check_host_key(sess: &Session, host: &str, o: &SshOpts) -> Result<(), String> {
    let (key, kind) = sess.host_key().ok_or("the server sent no host key")?;
    let mut kh = sess.known_hosts().map_err(|e| e.to_string())?;
    if o.known_hosts.exists() {
        kh.read_file(&o.known_hosts, KnownHostFileKind::OpenSSH)
            .map_err(|e| format!("{}: {}", o.known_hosts.display(), e.message()))?;
    }
    let name = if o.port == 22 { host.to_string() } else { format!("[{host}]:{}", o.port) };
    match kh.check_port(host, o.port, key) {
        CheckResult::Match => Ok(()),
        CheckResult::Mismatch => Err(format!(
            "HOST KEY MISMATCH: the key {name} offers differs from the one in {}; if the host was reinstalled, \
             remove its old key (ssh-keygen -R {name})",
            o.known_hosts.display()
        )),
        CheckResult::NotFound if o.accept_new => {
            kh.add(&name, key, "added by cclrun", kind.into()).map_err(|e| e.to_string())?;
            if let Some(dir) = o.known_hosts.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            kh.write_file(&o.known_hosts, KnownHostFileKind::OpenSSH)
                .map_err(|e| format!("{}: {}", o.known_hosts.display(), e.message()))?;
            eprintln!("cclrun: added the host key of {name} to {}", o.known_hosts.display());
            Ok(())
        }
        CheckResult::NotFound => Err(format!(
            "host key not in {}; connect once with ssh to check it, or pass --accept-new-host-keys",
            o.known_hosts.display()
        )),
        CheckResult::Failure => Err("could not check the host key".into()),
    }
}

fn authenticate(sess: &Session, user: &str, o: &SshOpts) -> Result<(), String> {
    let mut tried = Vec::new();
    let with_file = |k: &Path| sess.userauth_pubkey_file(user, None, k, None).is_ok() && sess.authenticated();
    if let Some(k) = &o.key {
        if !k.exists() {
            return Err(format!("--ssh-key {}: no such file", k.display()));
        }
        if with_file(k) {
            return Ok(());
        }
        tried.push(k.display().to_string());
    } else {
        if std::env::var_os("SSH_AUTH_SOCK").is_some() {
            if let Ok(mut agent) = sess.agent() {
                if agent.connect().is_ok() && agent.list_identities().is_ok() {
                    for id in agent.identities().unwrap_or_default() {
                        if agent.userauth(user, &id).is_ok() && sess.authenticated() {
                            return Ok(());
                        }
                    }
                }
            }
            tried.push("the ssh agent".into());
        }
        for name in ["id_ed25519", "id_ecdsa", "id_rsa"] {
            let k = home().join(".ssh").join(name);
            if k.exists() {
                if with_file(&k) {
                    return Ok(());
                }
                tried.push(k.display().to_string());
            }
        }
    }
    if tried.is_empty() {
        return Err(format!("no key to log in as {user}: no ssh agent, no ~/.ssh/id_* and no --ssh-key"));
    }
    Err(format!("authentication as {user} refused (tried {})", tried.join(", ")))
}

/// Quotes `s` for a POSIX shell.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A started agent, ready to start its ranks.
pub struct Agent {
    conn: Conn,
    ch: Channel,
    /// Bytes read past `READY`.
    buf: Vec<u8>,
}

/// Starts `cclrun agent` (at `remote_cclrun`) on `conn`'s host, hands it the
/// job and waits until it says the program is there.
pub fn start_agent(conn: Conn, remote_cclrun: &str, job: &HostJob) -> Result<Agent, String> {
    let fail = |e: ssh2::Error| format!("SSH channel: {}", e.message());
    let mut ch = conn.sess.channel_session().map_err(fail)?;
    ch.exec(&format!("exec {} agent", quote(remote_cclrun))).map_err(fail)?;
    let mut line = serde_json::to_vec(job).map_err(|e| e.to_string())?;
    line.push(b'\n');
    ch.write_all(&line).map_err(|e| format!("sending the job: {e}"))?;
    ch.flush().map_err(|e| format!("sending the job: {e}"))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(i) = buf.iter().position(|&b| b == b'\n') {
            let first: Vec<u8> = buf.drain(..=i).collect();
            return match proto::decode(&first) {
                Ok(Msg::Ready) => Ok(Agent { conn, ch, buf }),
                Ok(Msg::Fail(why)) => Err(why),
                _ => Err(format!("the agent said {:?}", String::from_utf8_lossy(&first).trim_end())),
            };
        }
        match ch.read(&mut chunk) {
            Ok(0) => {
                let mut err = String::new();
                let _ = ch.stderr().read_to_string(&mut err);
                let _ = ch.wait_close();
                let code = ch.exit_status().unwrap_or(-1);
                return Err(format!(
                    "cannot start `{remote_cclrun} agent` (exit status {code}: {}); install cclrun at that path there \
                     or pass --remote-cclrun PATH",
                    err.trim()
                ));
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("waiting for the agent: {e}")),
        }
    }
}

impl Agent {
    /// Tells the agent to start the ranks, then relays its messages to
    /// `on_msg` and passes it the orders from `orders` until it says `DONE`
    /// (`Ok`) or the connection ends first (`Err`, why).
    pub fn run(mut self, orders: Receiver<proto::Order>, mut on_msg: impl FnMut(Msg)) -> Result<(), String> {
        let mut pending = b"GO\n".to_vec();
        self.conn.sess.set_blocking(false);
        let mut chunk = vec![0u8; 64 << 10];
        let mut err_buf = Vec::new();
        let mut orders_open = true;
        loop {
            let mut moved = false;
            let mut closed = false;
            while orders_open {
                match orders.try_recv() {
                    Ok(o) => pending.extend_from_slice(&proto::encode_order(&o)),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => orders_open = false,
                }
            }
            if !pending.is_empty() {
                match self.ch.write(&pending) {
                    Ok(n) => {
                        pending.drain(..n);
                        moved |= n > 0;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => return Err(format!("connection lost: {e}")),
                }
            }
            match self.ch.read(&mut chunk) {
                Ok(n) if n > 0 => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    moved = true;
                }
                Ok(_) => closed = self.ch.eof(),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("connection lost: {e}")),
            }
            if let Ok(n) = self.ch.stderr().read(&mut chunk) {
                err_buf.extend_from_slice(&chunk[..n]);
                moved |= n > 0;
            }
            while let Some(i) = err_buf.iter().position(|&b| b == b'\n') {
                let l: Vec<u8> = err_buf.drain(..=i).collect();
                eprint!("cclrun: agent: {}", String::from_utf8_lossy(&l));
            }
            while let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let l: Vec<u8> = self.buf.drain(..=i).collect();
                match proto::decode(&l)? {
                    Msg::Done => return Ok(()),
                    m => on_msg(m),
                }
            }
            if closed {
                return Err("the connection closed before its ranks ended".into());
            }
            if !moved {
                let mut p = libc::pollfd { fd: self.conn.fd, events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd for a socket this session owns.
                unsafe { libc::poll(&mut p, 1, 20) };
            }
        }
    }
}
