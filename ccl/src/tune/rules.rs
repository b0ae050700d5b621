//! Measured choices: a tuning file (`CCL_TUNE_FILE`) that names the
//! algorithm for given calls, consulted before the cost model, like Open
//! MPI's tuned decision files. `bench/tuner --write FILE` writes one from
//! measurements of every forced algorithm. One rule a line:
//!
//! ```text
//! # collective  ranks  hosts  size-class-bytes  algorithm
//! all_reduce    2      1      4096              ring
//! ```
//! The size class is the call's bytes per rank rounded up to a power of
//! two. Every rank must read the same file.

use crate::algo::{Algo, Coll};
use crate::error::{Error, ErrorKind, Result};
use std::collections::HashMap;

/// The rules of a tuning file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    map: HashMap<(Coll, usize, usize, u32), Algo>,
}

impl Rules {
    /// Parses a file's text; `name` names it in errors, which give the line.
    pub fn parse(text: &str, name: &str) -> Result<Rules> {
        let mut map = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let body = line.split('#').next().unwrap_or("").trim();
            if body.is_empty() {
                continue;
            }
            let bad = |why: String| {
                Error::new(ErrorKind::Config { var: "CCL_TUNE_FILE", value: format!("{name}:{}", i + 1), why })
            };
            let w: Vec<&str> = body.split_whitespace().collect();
            let [coll, ranks, hosts, class, algo] = w[..] else {
                return Err(bad("expected: collective ranks hosts size-class-bytes algorithm".into()));
            };
            let coll = Coll::ALL
                .into_iter()
                .find(|c| c.name() == coll)
                .ok_or_else(|| bad(format!("no collective {coll:?}")))?;
            let num =
                |v: &str, what: &str| v.parse::<usize>().map_err(|_| bad(format!("{what} {v:?} is not a number")));
            let (ranks, hosts, bytes) = (num(ranks, "ranks")?, num(hosts, "hosts")?, num(class, "size class")?);
            if !bytes.is_power_of_two() {
                return Err(bad(format!("size class {bytes} is not a power of two")));
            }
            let algo: Algo = algo.parse().map_err(|e: String| bad(e))?;
            if !coll.algos().contains(&algo) {
                return Err(bad(format!("{algo} does not implement {coll}")));
            }
            map.insert((coll, ranks, hosts, bytes.trailing_zeros()), algo);
        }
        Ok(Rules { map })
    }

    /// Reads and parses `path`: a regular file of at most `MAX_BYTES`.
    pub fn load(path: &str) -> Result<Rules> {
        let text = crate::config::read_bounded(std::path::Path::new(path), MAX_BYTES)
            .map_err(|why| Error::new(ErrorKind::Config { var: "CCL_TUNE_FILE", value: path.to_string(), why }))?;
        Rules::parse(&text, path)
    }

    /// The algorithm the file names for this call, if any.
    pub fn get(&self, coll: Coll, ranks: usize, hosts: usize, class: u32) -> Option<Algo> {
        self.map.get(&(coll, ranks, hosts, class)).copied()
    }

    /// Rules in the file.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// No rules.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The largest tuning file read: a line per (collective, ranks, hosts,
/// size class) measured, far fewer than this.
pub const MAX_BYTES: u64 = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_errors_name_the_line() {
        let r = Rules::parse("# measured\nall_reduce 2 1 4096 ring\nbroadcast 4 2 8 tree # small\n", "f").expect("ok");
        assert_eq!(r.get(Coll::AllReduce, 2, 1, 12), Some(Algo::Ring));
        assert_eq!(r.get(Coll::Broadcast, 4, 2, 3), Some(Algo::Tree));
        assert_eq!(r.get(Coll::AllReduce, 3, 1, 12), None);
        for (text, want) in [
            ("all_reduce 2 1 4096", "f:1"),
            ("all_reduce 2 1 8 ring\nall_gather 2 1 4096 ring-ring", "f:2"),
            ("all_reduce 2 1 3000 ring", "not a power of two"),
            ("all_reduce two 1 4096 ring", "not a number"),
            ("all_reduce 2 1 4096 bogus", "f:1"),
            ("frobnicate 2 1 4096 ring", "no collective"),
        ] {
            let e = Rules::parse(text, "f").expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    #[test]
    fn devices_are_no_tuning_file() {
        let e = Rules::load("/dev/zero").expect_err("a device").to_string();
        assert!(e.contains("CCL_TUNE_FILE") && e.contains("not a regular file"), "{e}");
    }
}
