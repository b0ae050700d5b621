//! A namespace cluster for a test: `scripts/cluster.sh up` on creation,
//! `down` when dropped (so also when the test fails).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Hosts in network namespaces, each with its own sshd.
pub struct Cluster {
    /// Where the script keeps its files (hostfile, keys, known_hosts).
    pub dir: PathBuf,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh")
}

/// Tests that need something this machine may lack (root, sshd, mpirun)
/// skip with a message unless `CCL_TEST_REQUIRE_ALL=1`, as CI sets.
pub fn unavailable(what: &str, missing: bool) -> bool {
    if missing {
        assert!(std::env::var("CCL_TEST_REQUIRE_ALL").as_deref() != Ok("1"), "{what} is required here but missing");
        eprintln!("SKIPPED: {what} is missing (CCL_TEST_REQUIRE_ALL=1 makes this a failure)");
    }
    missing
}

impl Cluster {
    /// `hosts` hosts with `slots` slots each; `None` (after saying why)
    /// where this machine cannot make one.
    pub fn up(name: &str, hosts: usize, slots: usize) -> Option<Cluster> {
        Cluster::with_nics(name, hosts, slots, 1)
    }

    /// [`Cluster::up`] with `nics` interfaces a host (`eth0` ..), each on
    /// a network of its own.
    pub fn with_nics(name: &str, hosts: usize, slots: usize, nics: usize) -> Option<Cluster> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let tools = Path::new("/usr/sbin/sshd").exists() && Path::new("/usr/sbin/ip").exists()
            || Path::new("/sbin/ip").exists() && Path::new("/usr/sbin/sshd").exists();
        if unavailable("root, sshd and iproute2 (for a namespace cluster)", !(root && tools)) {
            return None;
        }
        let dir = std::env::temp_dir().join(format!("ccl-cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let c = Cluster { dir };
        let o = Command::new("bash")
            .arg(script())
            .args(["up", &c.dir.to_string_lossy(), &hosts.to_string(), &slots.to_string(), &nics.to_string()])
            .output()
            .expect("run cluster.sh");
        assert!(o.status.success(), "cluster.sh up: {}", String::from_utf8_lossy(&o.stderr));
        Some(c)
    }

    /// A file of the cluster's directory.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// cclrun's options to reach the hosts: hostfile, key, known_hosts.
    pub fn args(&self) -> Vec<String> {
        [
            "--hostfile",
            &self.file("hostfile"),
            "--ssh-key",
            &self.file("id"),
            "--known-hosts",
            &self.file("known_hosts"),
        ]
        .map(String::from)
        .to_vec()
    }

    /// Host addresses, in hostfile order.
    pub fn hosts(&self) -> Vec<String> {
        let text = std::fs::read_to_string(self.dir.join("hostfile")).unwrap_or_default();
        text.lines().filter_map(|l| l.split_whitespace().next()).map(String::from).collect()
    }

    /// Runs `cluster.sh shape` (a rate like `1gbit`, or `off`).
    pub fn shape(&self, rate: &str) {
        let o = Command::new("bash").arg(script()).args(["shape", &self.dir.to_string_lossy(), rate]).output();
        assert!(o.expect("run cluster.sh").status.success(), "cluster.sh shape {rate}");
    }

    /// Pids and command lines of processes in the hosts' namespaces other
    /// than their sshd listeners.
    pub fn strays(&self) -> Vec<String> {
        let list = std::fs::read_to_string(self.dir.join("namespaces")).unwrap_or_default();
        let mut out = Vec::new();
        for ns in list.lines() {
            let o = Command::new("ip").args(["netns", "pids", ns]).output().expect("ip netns pids");
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "));
                if !cmd.contains("sshd -D") && !cmd.is_empty() && !zombie {
                    out.push(format!("{pid} {cmd}"));
                }
            }
        }
        out
    }

    /// Takes host `i`'s (1-based) link down or up, at the bridge.
    pub fn link(&self, i: usize, up: bool) {
        let tag = std::fs::read_to_string(self.dir.join("tag")).unwrap_or_default();
        let dev = format!("cv{}h{i}", tag.trim());
        let st = Command::new("ip").args(["link", "set", &dev, if up { "up" } else { "down" }]).status();
        assert!(st.is_ok_and(|s| s.success()), "ip link set {dev}");
    }

    /// Host `i`'s (1-based) network namespace.
    fn namespace(&self, i: usize) -> String {
        let list = std::fs::read_to_string(self.dir.join("namespaces")).unwrap_or_default();
        list.lines().nth(i - 1).unwrap_or_default().to_string()
    }

    /// Takes interface `eth{k}` of host `i` (1-based) down or up, inside
    /// the host.
    pub fn nic(&self, i: usize, k: usize, up: bool) {
        let (ns, dev) = (self.namespace(i), format!("eth{k}"));
        let st = Command::new("ip").args(["-n", &ns, "link", "set", &dev, if up { "up" } else { "down" }]).status();
        assert!(st.is_ok_and(|s| s.success()), "ip -n {ns} link set {dev}");
    }

    /// Bytes interface `eth{k}` of host `i` (1-based) has sent so far.
    pub fn sent(&self, i: usize, k: usize) -> u64 {
        let stat = format!("/sys/class/net/eth{k}/statistics/tx_bytes");
        let o = Command::new("ip").args(["netns", "exec", &self.namespace(i), "cat", &stat]).output();
        let o = o.expect("ip netns exec");
        String::from_utf8_lossy(&o.stdout).trim().parse().unwrap_or_else(|_| panic!("{stat}: {o:?}"))
    }

    /// The sshd pid of host `i` (1-based).
    pub fn sshd_pid(&self, i: usize) -> i32 {
        let p = std::fs::read_to_string(self.dir.join(format!("h{i}/sshd.pid"))).unwrap_or_default();
        p.trim().parse().unwrap_or(0)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(script()).args(["down", &self.dir.to_string_lossy()]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
