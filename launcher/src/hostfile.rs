//! Hostfiles and `-H` lists.
//!
//! Open MPI syntax, one host per line: `host [slots=N] [max_slots=M]`;
//! MPICH's `host:N` is accepted too; `#` starts a comment; blank lines are
//! ignored. Errors name the file and line.

use std::fmt;

/// One host and how many ranks it takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSlots {
    /// Host name or address.
    pub name: String,
    /// Ranks it takes before it counts as full.
    pub slots: usize,
    /// Ranks it may take at most, even when oversubscribing.
    pub max_slots: Option<usize>,
}

/// A hostfile problem, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// `file:line` or `-H`.
    pub at: String,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.what)
    }
}

/// The most ranks one host line may take.
pub const MAX_SLOTS: usize = 1 << 20;

fn number(v: &str, what: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(0) => Err(format!("{what} must be at least 1")),
        Ok(n) if n > MAX_SLOTS => Err(format!("{what}={n} is more than {MAX_SLOTS}")),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{what}={v:?} is not a number")),
    }
}

/// Parses one non-comment entry.
fn entry(text: &str) -> Result<HostSlots, String> {
    let mut words = text.split_whitespace();
    let first = words.next().ok_or("empty entry")?;
    let (name, mut slots) = match first.rsplit_once(':') {
        // MPICH host:N (but not a bare IPv6 address)
        Some((h, n)) if !h.contains(':') => (h.to_string(), Some(number(n, "slots")?)),
        _ => (first.to_string(), None),
    };
    let mut max_slots = None;
    for w in words {
        match w.split_once('=') {
            Some(("slots", v)) => slots = Some(number(v, "slots")?),
            Some(("max_slots" | "max-slots", v)) => max_slots = Some(number(v, "max_slots")?),
            _ => return Err(format!("unknown field {w:?} (expected slots=N or max_slots=M)")),
        }
    }
    let slots = slots.unwrap_or(1);
    if max_slots.is_some_and(|m| m < slots) {
        return Err("max_slots is smaller than slots".into());
    }
    Ok(HostSlots { name, slots, max_slots })
}

/// The largest hostfile read: far beyond any cluster's (a line a host),
/// small enough to parse in well under a second.
pub const MAX_BYTES: u64 = 16 << 20;

/// Reads and parses hostfile `path`, refusing one over [`MAX_BYTES`] (or
/// not a regular file) before reading it.
pub fn read(path: &std::path::Path) -> Result<Vec<HostSlots>, String> {
    let name = path.display().to_string();
    let text = ccl::config::read_bounded(path, MAX_BYTES).map_err(|e| format!("{name}: {e}"))?;
    parse(&text, &name).map_err(|e| e.to_string())
}

/// Parses a hostfile's text; `file` names it in errors. Duplicate hosts are
/// an error (Open MPI would merge them silently).
pub fn parse(text: &str, file: &str) -> Result<Vec<HostSlots>, ParseError> {
    let mut hosts: Vec<HostSlots> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let at = || format!("{file}:{}", i + 1);
        let body = line.split('#').next().unwrap_or("").trim();
        if body.is_empty() {
            continue;
        }
        let h = entry(body).map_err(|what| ParseError { at: at(), what })?;
        if !seen.insert(h.name.clone()) {
            return Err(ParseError { at: at(), what: format!("host {} is listed twice", h.name) });
        }
        hosts.push(h);
    }
    if hosts.is_empty() {
        return Err(ParseError { at: file.to_string(), what: "no hosts".into() });
    }
    Ok(hosts)
}

/// Parses `-H host[:slots],host[:slots],...`.
pub fn parse_list(list: &str) -> Result<Vec<HostSlots>, ParseError> {
    parse(&list.split(',').collect::<Vec<_>>().join("\n"), "-H")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_mpi_and_mpich_forms() {
        let h =
            parse("# cluster\nnode1 slots=4 max_slots=8\n\nnode2:2   # mpich\nnode3\n[::1]\n", "hosts").expect("ok");
        assert_eq!(h[0], HostSlots { name: "node1".into(), slots: 4, max_slots: Some(8) });
        assert_eq!(h[1], HostSlots { name: "node2".into(), slots: 2, max_slots: None });
        assert_eq!(h[2].slots, 1);
        assert_eq!(h[3].name, "[::1]");
        assert_eq!(parse_list("a:2,b").expect("list").len(), 2);
    }

    #[test]
    fn errors_name_the_line() {
        let cases = [
            ("a slots=x", "hosts:1: slots=\"x\" is not a number"),
            ("a\nb slots=0", "hosts:2: slots must be at least 1"),
            ("a\n\nb colour=red", "hosts:3: unknown field \"colour=red\" (expected slots=N or max_slots=M)"),
            ("a slots=4 max_slots=2", "hosts:1: max_slots is smaller than slots"),
            ("a\na:2", "hosts:2: host a is listed twice"),
            ("# nothing\n", "hosts: no hosts"),
            ("a:b", "hosts:1: slots=\"b\" is not a number"),
            ("a slots=99999999999999999999", "hosts:1: slots=\"99999999999999999999\" is not a number"),
            ("a slots=2000000", "hosts:1: slots=2000000 is more than 1048576"),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text, "hosts").expect_err(text).to_string(), want);
        }
    }

    #[test]
    fn a_million_hosts_parse_and_a_duplicate_among_them_is_found() {
        // linear: the quadratic check took over a minute on this many
        let mut text: String = (0..1_000_000).map(|i| format!("n{i} slots=2\n")).collect();
        assert_eq!(parse(&text, "hosts").expect("distinct").len(), 1_000_000);
        text.push_str("n17\n");
        let e = parse(&text, "hosts").expect_err("n17 twice").to_string();
        assert_eq!(e, "hosts:1000001: host n17 is listed twice");
    }

    #[test]
    fn files_too_large_or_not_regular_are_refused_before_reading() {
        let e = read(std::path::Path::new("/dev/zero")).expect_err("a device");
        assert!(e.contains("not a regular file"), "{e}");
        let dir = std::env::temp_dir().join(format!("ccl-hostfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let big = dir.join("big");
        let f = std::fs::File::create(&big).expect("create");
        f.set_len(MAX_BYTES + 1).expect("sparse file");
        let e = read(&big).expect_err("too large");
        assert!(e.contains("larger than 16384 KiB"), "{e}");
        std::fs::write(&big, "a slots=2\n").expect("write");
        assert_eq!(read(&big).expect("small").len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
