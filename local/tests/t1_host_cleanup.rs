//! T1: the last-resort host cleanup of liteio-local: mounts below its directory (nested ones
//! first) and loop devices over files below it are undone; nothing outside is touched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

fn mounted_below(prefix: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(prefix))
        .collect()
}

#[test]
fn mounts_and_loop_devices_below_the_directory_are_released() {
    if !Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0"))
    {
        println!("SKIP host cleanup: needs root (mount, losetup)");
        return;
    }
    let base = std::env::temp_dir().join(format!("liteio-cleanup-{}", std::process::id()));
    let dir = base.join("state");
    let outside = base.join("outside");
    for d in [dir.join("a"), outside.clone()] {
        std::fs::create_dir_all(&d).unwrap();
    }
    let file = dir.join("vol.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let (a, nested) = (dir.join("a"), dir.join("a/b"));
    assert!(run("mount", &["-t", "tmpfs", "tmpfs", a.to_str().unwrap()]));
    std::fs::create_dir_all(&nested).unwrap();
    assert!(run(
        "mount",
        &["-t", "tmpfs", "tmpfs", nested.to_str().unwrap()]
    ));
    assert!(run(
        "mount",
        &["-t", "tmpfs", "tmpfs", outside.to_str().unwrap()]
    ));
    let dev = String::from_utf8(
        Command::new("losetup")
            .args(["--find", "--show", file.to_str().unwrap()])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    assert!(dev.starts_with("/dev/loop"), "{dev}");

    let done = liteio_local::release_host_resources(&dir);

    let prefix = format!("{}/", dir.display());
    let left = mounted_below(&prefix);
    let loops = String::from_utf8(
        Command::new("losetup")
            .arg("-j")
            .arg(&file)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let outside_still = !mounted_below(&outside.display().to_string()).is_empty();
    let _ = run("umount", &[outside.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&base);
    assert!(left.is_empty(), "still mounted: {left:?}");
    assert!(loops.trim().is_empty(), "still attached: {loops}");
    assert!(outside_still, "a mount outside the directory was touched");
    assert_eq!(done.len(), 3, "{done:?}");
    assert!(done[0].ends_with("a/b"), "nested mount first: {done:?}");
}
