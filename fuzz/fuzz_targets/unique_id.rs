//! UniqueId text: parses or errs, and what parses round-trips.
#![no_main]
use ccl::bootstrap::UniqueId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(id) = UniqueId::parse(text) {
            assert_eq!(UniqueId::parse(&id.to_env_string()).ok(), Some(id));
        }
    }
});
