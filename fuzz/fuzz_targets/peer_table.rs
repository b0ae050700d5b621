//! The rendezvous table decoder.
#![no_main]
use ccl::bootstrap::rendezvous::decode_table;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(t) = decode_table(data) {
        assert!(t.len() <= data.len());
    }
});
