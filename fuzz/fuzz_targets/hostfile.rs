//! Hostfiles and -H lists: any text gives hosts or a line-numbered error.
#![no_main]
use cclrun::hostfile::{parse, parse_list};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(hosts) = parse(text, "fuzz") {
            assert!(!hosts.is_empty() && hosts.iter().all(|h| h.slots >= 1));
            let _ = cclrun::place::place(&hosts, 1 + data.len() % 64, cclrun::place::MapBy::Node, true);
        }
        let _ = parse_list(text);
    }
});
