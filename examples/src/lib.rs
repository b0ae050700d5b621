//! Runnable examples of ccl (see `src/bin`). Each binary is also run by
//! `tests/run_examples.rs`, so an example that breaks fails the tests.
//! [`plot`] draws the benchmarks' charts.

pub mod plot;

/// A size in bytes with an optional K, M or G suffix (powers of 1024).
pub fn parse_bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (n, m) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<usize>().ok().and_then(|v| v.checked_mul(m)).ok_or_else(|| format!("{s:?} is not a size"))
}

/// nccl-tests' bus-bandwidth factor of a collective (by name) on `n` ranks.
pub fn busbw_factor(coll: &str, n: usize) -> f64 {
    let n = n as f64;
    match coll {
        "all_reduce" => 2.0 * (n - 1.0) / n,
        "all_gather" | "reduce_scatter" | "all_to_all" => (n - 1.0) / n,
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_and_factors() {
        assert_eq!(super::parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(super::parse_bytes("8"), Ok(8));
        assert!(super::parse_bytes("x").is_err() && super::parse_bytes("99999999999999999G").is_err());
        assert_eq!(super::busbw_factor("all_reduce", 4), 1.5);
        assert_eq!(super::busbw_factor("broadcast", 4), 1.0);
    }
}
