//! Sizes as people and sysfs write them: `4096`, `64K`, `1M`, `2G`.

/// Bytes of `s`: a non-negative integer with an optional binary `K`, `M`
/// or `G` suffix (either case), or `None`.
pub(crate) fn bytes(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mul) = match s.to_ascii_uppercase().chars().last() {
        Some('K') => (&s[..s.len() - 1], 1 << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok().and_then(|v| v.checked_mul(mul))
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_with_their_suffixes() {
        assert_eq!(super::bytes("4096"), Some(4096));
        assert_eq!(super::bytes(" 32768K"), Some(32 << 20));
        assert_eq!(super::bytes("1m"), Some(1 << 20));
        assert_eq!(super::bytes("2G"), Some(2 << 30));
        assert_eq!(super::bytes("-1"), None);
        assert_eq!(super::bytes("K"), None);
        assert_eq!(super::bytes("99999999999999999999G"), None);
    }
}
