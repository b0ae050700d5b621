//! A local user attacking ccl jobs, for the adversary suite (run as
//! `nobody` through setpriv). Nothing here is ccl's: it only watches what
//! any user may see (`/dev/shm`, `/proc`) and acts on it.
//!
//! `adversary squat SECS VICTIM`: for SECS seconds, for every job and
//! process seen in `/dev/shm`, plants what the names of earlier ccl
//! versions invited: links to VICTIM where doorbells of later ranks would
//! go, forged lost-rank notes where the launcher's would go, and
//! pre-created files where connections' FIFOs would go; the same beside
//! every name seen, with its tag. Removes them at the end.
//!
//! `adversary flood SECS N`: for SECS seconds, opens N idle connections
//! to every TCP port that starts listening on a loopback address, and
//! holds them.
//!
//! `adversary junk SECS N`: creates N empty files in `/dev/shm` whose
//! names look like ccl's (`ccl-<tag>-b0-p<pid>`, of live and dead pids),
//! says so, holds them for SECS seconds or until its standard input
//! closes, and removes them.
//!
//! `adversary churn SECS`: for SECS seconds, or until its standard input
//! closes, opens connections to every TCP port that starts listening on a
//! loopback address, newest first, as fast as three threads can, and
//! closes each at once, but for one thread's last 300 per port, which it
//! holds (the idle holding what places they can, newcomers pushing out
//! the oldest of a listener's handshakes). `adversary churn SECS PORT`
//! also aims at 127.0.0.1:PORT from the start, before anything listens
//! there (a rendezvous at a port known in advance: `CCL_ROOT`).

use std::collections::HashSet;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(5);
    let end = Instant::now() + Duration::from_secs(secs);
    match args.first().map(String::as_str) {
        Some("squat") => squat(end, Path::new(args.get(2).map_or("/nonexistent", String::as_str))),
        Some("flood") => flood(end, args.get(2).and_then(|s| s.parse().ok()).unwrap_or(150)),
        Some("junk") => junk(end, args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000)),
        Some("churn") => churn(end, args.get(2).and_then(|s| s.parse().ok())),
        _ => eprintln!("usage: adversary squat SECS VICTIM | flood SECS N | junk SECS N | churn SECS [PORT]"),
    }
}

/// A ccl file name split: job tag, the middle, the tag before `-p` if any,
/// and the first owning pid.
fn parse(name: &str) -> Option<(String, String, Option<String>, u32)> {
    let rest = name.strip_prefix("ccl-")?;
    let (job, rest) = rest.split_once('-')?;
    let (mid, pids) = rest.rsplit_once("-p")?;
    let pid = pids.split('-').next()?.parse().ok()?;
    let tag = mid.rsplit_once('-').map(|(_, t)| t).filter(|t| t.len() == 16).map(str::to_string);
    Some((job.to_string(), mid.to_string(), tag, pid))
}

/// The parent of process `pid` (the launcher of a rank).
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split(' ').nth(1)?.parse().ok()
}

fn squat(end: Instant, victim: &Path) {
    let mut planted: Vec<PathBuf> = Vec::new();
    // (job, tag) pairs acted on: each once, from the first process seen
    let mut done: HashSet<(String, Option<String>)> = HashSet::new();
    let forged = b"0 forged-host forged\n1 forged-host forged\n2 forged-host forged\n3 forged-host forged\n";
    while Instant::now() < end {
        let names: Vec<String> = std::fs::read_dir("/dev/shm")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        for name in &names {
            let Some((job, _, tag, pid)) = parse(name) else { continue };
            if !done.insert((job.clone(), tag.clone())) {
                continue;
            }
            let t = tag.map(|t| format!("-{t}")).unwrap_or_default();
            let comm = u64::from_str_radix(&job, 16).unwrap_or(0);
            let mut plant = |path: String, how: u8| {
                let p = PathBuf::from(path);
                let made = match how {
                    0 => std::os::unix::fs::symlink(victim, &p).is_ok(),
                    1 => std::fs::write(&p, forged).is_ok(),
                    _ => std::fs::write(&p, []).is_ok(),
                };
                if made {
                    use std::os::unix::fs::PermissionsExt;
                    let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666));
                    planted.push(p);
                }
            };
            // the ranks started next get the next pids
            for d in 0..16u32 {
                for k in 0..8 {
                    plant(format!("/dev/shm/ccl-{job}-b{k}{t}-p{}", pid + d), 0);
                    plant(format!("/dev/shm/ccl-{job}-w{k}{t}-p{}", pid + d), 0);
                }
                for (a, b) in [(0, 1), (1, 2), (2, 3), (3, 0)] {
                    let (pa, pb) = (pid + d, pid + d + 1);
                    plant(format!("/dev/shm/ccl-{job}-{comm:016x}-{a}-{b}-0{t}-p{pa}-{pb}"), 2);
                    plant(format!("/dev/shm/ccl-{job}-{comm:016x}-{b}-{a}-0{t}-p{pb}-{pa}"), 2);
                }
            }
            if let Some(launcher) = parent(pid) {
                plant(format!("/dev/shm/ccl-{job}-lost{t}-p{launcher}"), 1);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for p in &planted {
        let _ = std::fs::remove_file(p);
    }
    println!("planted {} files for {} names", planted.len(), done.len());
}

/// Loopback addresses listening on TCP now (`/proc/net/tcp`, state 0A;
/// one bound to every address is reached at 127.0.0.1); others are no
/// target.
fn listening() -> HashSet<std::net::SocketAddrV4> {
    let mut found = HashSet::new();
    for line in std::fs::read_to_string("/proc/net/tcp").unwrap_or_default().lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some((ip, port)) = f.get(1).and_then(|a| a.split_once(':')) else { continue };
        let (Ok(ip), Ok(port)) = (u32::from_str_radix(ip, 16), u16::from_str_radix(port, 16)) else { continue };
        let ip = std::net::Ipv4Addr::from(u32::from_be(ip));
        let ip = if ip.is_unspecified() { std::net::Ipv4Addr::LOCALHOST } else { ip };
        if f.get(3) == Some(&"0A") && ip.is_loopback() {
            found.insert(std::net::SocketAddrV4::new(ip, port));
        }
    }
    found
}

fn flood(end: Instant, n: usize) {
    let before = listening();
    let mut held: Vec<TcpStream> = Vec::new();
    let mut hit = HashSet::new();
    while Instant::now() < end {
        for at in listening() {
            if before.contains(&at) || !hit.insert(at) {
                continue;
            }
            let to = std::net::SocketAddr::V4(at);
            held.extend((0..n).filter_map(|_| TcpStream::connect_timeout(&to, Duration::from_millis(200)).ok()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    println!("held {} idle connections to {} ports", held.len(), hit.len());
}

fn churn(end: Instant, port: Option<u16>) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    use std::sync::{Arc, Mutex};
    let before = listening();
    let stop = Arc::new(AtomicBool::new(false));
    let told = Arc::clone(&stop);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        told.store(true, Relaxed);
    });
    // the ports that started listening, newest first, kept fresh by a
    // thread of their own (reading /proc/net/tcp is slow once the churn's
    // closed connections fill it)
    let known: Vec<_> =
        port.map(|p| std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, p)).into_iter().collect();
    let targets: Arc<Mutex<Vec<std::net::SocketAddrV4>>> = Arc::new(Mutex::new(known.clone()));
    let ports = Arc::new(Mutex::new(HashSet::new()));
    {
        let (targets, ports, stop) = (Arc::clone(&targets), Arc::clone(&ports), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Relaxed) && Instant::now() < end {
                let now: Vec<_> = listening().into_iter().filter(|a| !before.contains(a)).collect();
                if let (Ok(mut t), Ok(mut p)) = (targets.lock(), ports.lock()) {
                    let new: Vec<_> = now.iter().filter(|a| !p.contains(*a)).copied().collect();
                    p.extend(new.iter().copied());
                    t.retain(|a| now.contains(a) || known.contains(a));
                    for a in new {
                        t.insert(0, a);
                    }
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        });
    }
    let opened = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (targets, stop, opened) = (Arc::clone(&targets), Arc::clone(&stop), Arc::clone(&opened));
            std::thread::spawn(move || {
                let mut held: std::collections::HashMap<_, std::collections::VecDeque<TcpStream>> = Default::default();
                while !stop.load(Relaxed) && Instant::now() < end {
                    let now = targets.lock().map(|t| t.clone()).unwrap_or_default();
                    if now.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    for at in now {
                        for _ in 0..50 {
                            let to = std::net::SocketAddr::V4(at);
                            let Ok(c) = TcpStream::connect_timeout(&to, Duration::from_millis(100)) else { break };
                            opened.fetch_add(1, Relaxed);
                            // one worker holds its last 300 per port; the others close at once
                            if w == 0 {
                                let kept = held.entry(at).or_default();
                                kept.push_back(c);
                                if kept.len() > 300 {
                                    kept.pop_front();
                                }
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    let n = ports.lock().map(|p| p.len()).unwrap_or(0);
    println!("opened {} connections to {n} ports", opened.load(Relaxed));
}

fn junk(end: Instant, n: usize) {
    let me = std::process::id();
    let names: Vec<PathBuf> = (0..n)
        .map(|i| PathBuf::from(format!("/dev/shm/ccl-{:016x}-b{}-p{}", i / 64, i % 64, me + (i % 2) as u32 * 7)))
        .filter(|p| std::fs::write(p, []).is_ok())
        .collect();
    println!("made {} junk names", names.len());
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(end.saturating_duration_since(Instant::now()));
    for p in &names {
        let _ = std::fs::remove_file(p);
    }
}
