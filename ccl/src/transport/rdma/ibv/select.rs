//! Which devices and ports a process may use (`CCL_IB_HCA`, NCCL's
//! syntax) and which GID a RoCE port is addressed by (`CCL_IB_GID_INDEX`).

/// `CCL_IB_HCA`: a list of `device[:port]`; a leading `^` excludes them
/// instead, a leading `=` (after `^`, if any) matches names exactly
/// rather than as prefixes. Empty: every device.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HcaFilter {
    exclude: bool,
    exact: bool,
    list: Vec<(String, Option<u8>)>,
}

impl HcaFilter {
    /// The filter `s` spells, or why it spells none.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut s = s.trim();
        let exclude = s.starts_with('^');
        s = s.strip_prefix('^').unwrap_or(s);
        let exact = s.starts_with('=');
        s = s.strip_prefix('=').unwrap_or(s);
        let mut list = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, port) = match item.split_once(':') {
                Some((n, p)) => {
                    let p = p.parse::<u8>().ok().filter(|&p| p > 0).ok_or_else(|| format!("port {p:?} of {n}"))?;
                    (n, Some(p))
                }
                None => (item, None),
            };
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
                return Err(format!("device name {name:?}"));
            }
            list.push((name.to_string(), port));
        }
        if (exclude || exact) && list.is_empty() {
            return Err("no device after ^ or =".into());
        }
        Ok(HcaFilter { exclude, exact, list })
    }

    /// Whether it lets port `port` of device `dev` be used.
    pub fn allows(&self, dev: &str, port: u8) -> bool {
        if self.list.is_empty() {
            return true;
        }
        let named = self.list.iter().any(|(n, p)| {
            let name = if self.exact { dev == n } else { dev.starts_with(n.as_str()) };
            name && p.is_none_or(|p| p == port)
        });
        named != self.exclude
    }
}

/// A GID table entry as the choice sees it: its index, its bytes, and
/// whether sysfs calls it RoCE v2.
#[derive(Clone, Copy, Debug)]
pub struct Gid {
    /// Index in the port's table.
    pub index: usize,
    /// The GID.
    pub raw: [u8; 16],
    /// `RoCE v2` in the port's `gid_attrs/types`.
    pub v2: bool,
}

/// The GID a RoCE port is addressed by: index `forced` (`CCL_IB_GID_INDEX`,
/// which must hold a GID), else the first RoCE v2 GID of an IPv4 address,
/// else the first RoCE v2 one, else the first non-zero one.
pub fn choose_gid(table: &[Gid], forced: Option<usize>) -> Result<Gid, String> {
    let valid = |g: &&Gid| g.raw != [0; 16];
    if let Some(i) = forced {
        return table
            .iter()
            .filter(valid)
            .find(|g| g.index == i)
            .copied()
            .ok_or_else(|| format!("CCL_IB_GID_INDEX={i}: the port has no GID there ({} entries)", table.len()));
    }
    let v4 = |g: &&Gid| g.raw[..10] == [0; 10] && g.raw[10..12] == [0xff, 0xff];
    let pick = table.iter().filter(valid).filter(|g| g.v2).find(v4);
    pick.or_else(|| table.iter().filter(valid).find(|g| g.v2))
        .or_else(|| table.iter().find(valid))
        .copied()
        .ok_or_else(|| "the port has no valid GID (no address on its interface?)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hca_lists_select_as_nccl_s_do() {
        let all = HcaFilter::parse("").expect("empty");
        assert!(all.allows("mlx5_0", 1));
        let some = HcaFilter::parse("mlx5_0:1,mlx5_2").expect("list");
        assert!(some.allows("mlx5_0", 1) && !some.allows("mlx5_0", 2) && some.allows("mlx5_2", 2));
        assert!(some.allows("mlx5_20", 1), "a prefix, without =");
        assert!(!some.allows("mlx5_1", 1));
        let exact = HcaFilter::parse("=mlx5_1").expect("exact");
        assert!(exact.allows("mlx5_1", 1) && !exact.allows("mlx5_10", 1));
        let not = HcaFilter::parse("^=mlx5_1:1").expect("exclude");
        assert!(!not.allows("mlx5_1", 1) && not.allows("mlx5_1", 2) && not.allows("mlx5_10", 1));
        for bad in ["mlx5_0:0", "mlx5_0:x", "^", "=", "a b", "mlx5/0"] {
            assert!(HcaFilter::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn roce_v2_ipv4_gids_are_preferred_and_a_forced_index_must_hold_one() {
        let mut v4 = [0u8; 16];
        v4[10..12].copy_from_slice(&[0xff, 0xff]);
        v4[12..].copy_from_slice(&[10, 0, 0, 1]);
        let link_local = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let table = [
            Gid { index: 0, raw: link_local, v2: false },
            Gid { index: 1, raw: link_local, v2: true },
            Gid { index: 2, raw: v4, v2: false },
            Gid { index: 3, raw: v4, v2: true },
            Gid { index: 4, raw: [0; 16], v2: true },
        ];
        assert_eq!(choose_gid(&table, None).expect("auto").index, 3);
        assert_eq!(choose_gid(&table[..3], None).expect("v2").index, 1);
        assert_eq!(choose_gid(&table[..1], None).expect("any").index, 0);
        assert_eq!(choose_gid(&table, Some(2)).expect("forced").index, 2);
        let e = choose_gid(&table, Some(4)).expect_err("an empty entry");
        assert!(e.contains("CCL_IB_GID_INDEX=4"), "{e}");
        assert!(choose_gid(&table, Some(9)).is_err());
        assert!(choose_gid(&[], None).is_err());
    }
}
