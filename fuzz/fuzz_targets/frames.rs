//! Length-prefixed frames and the hello decoder: garbage errs, never
//! allocates past the limit, never panics.
#![no_main]
use ccl::bootstrap::{rendezvous::decode_hello, wire::read_frame};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = data;
    while let Ok(f) = read_frame(&mut r, 1 << 16) {
        let _ = decode_hello(&f);
    }
    let _ = decode_hello(data);
});
