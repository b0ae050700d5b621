//! Host identity: hostname plus kernel boot id, or `CCL_HOSTID`.

/// This host's identity. Processes with equal identities share memory.
pub fn host_id() -> String {
    if let Ok(id) = std::env::var("CCL_HOSTID") {
        if !id.is_empty() {
            return id;
        }
    }
    machine_id()
}

/// This machine: hostname plus kernel boot id, whatever `CCL_HOSTID` says.
/// Processes with equal machine ids share its cores.
pub fn machine_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let boot =
        std::fs::read_to_string("/proc/sys/kernel/random/boot_id").map(|s| s.trim().to_string()).unwrap_or_default();
    format!("{name}/{boot}")
}
