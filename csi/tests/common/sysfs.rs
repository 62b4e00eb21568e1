//! The recorded sysfs tree of a host with two paths to one subsystem
//! (`tests/fixtures/multipath/sysfs-two-paths`), as a writable copy.
#![allow(clippy::unwrap_used)]

use std::path::Path;

/// Copies the recorded tree to `to` (created), without the controllers in `drop`.
pub fn copy_two_paths(to: &Path, drop: &[&str]) {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let dst = to.join(e.file_name());
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &dst);
            } else {
                std::fs::copy(e.path(), dst).unwrap();
            }
        }
    }
    let from =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/multipath/sysfs-two-paths");
    copy(&from, to);
    for c in drop {
        std::fs::remove_dir_all(to.join("class/nvme").join(c)).unwrap();
    }
}
