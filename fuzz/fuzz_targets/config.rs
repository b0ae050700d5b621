//! CCL_* values: any string is accepted with a valid result or rejected
//! with an error naming the variable.
#![no_main]
use ccl::config::{Config, KNOBS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let values: Vec<&str> = text.split('\n').collect();
        let r = Config::from_lookup(|var| {
            KNOBS.iter().position(|k| k.var == var).and_then(|i| values.get(i)).map(|v| v.to_string())
        });
        if let Err(e) = r {
            assert!(e.to_string().starts_with("CCL_"), "{e}");
        }
    }
});
