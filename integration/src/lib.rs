//! Programs run as ranks by the tests in `tests/` through `cclrun`:
//! `coll_matrix` (every collective, checked) and `fault` (ranks that fail
//! on purpose). The tests find `cclrun` next to their own build output.

pub mod cluster;

use std::path::PathBuf;

/// The `cclrun` binary of this build (`target/<profile>/cclrun`).
pub fn cclrun() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> → target/<profile>/cclrun
    exe.parent().and_then(|d| d.parent()).map(|d| d.join("cclrun")).unwrap_or_else(|| PathBuf::from("cclrun"))
}
