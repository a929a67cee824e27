//! Against recorded layouts in a temporary directory (plain files stand for
//! the kernel's), and against this host's real hierarchy where there is one.

use super::*;

fn fake_v2(root: &Path) {
    fs::write(root.join("cgroup.controllers"), "cpuset cpu io memory pids\n").unwrap();
    fs::write(root.join("cgroup.subtree_control"), "cpu\n").unwrap();
    fs::write(root.join("cgroup.procs"), "").unwrap();
}

#[test]
fn v2_hands_memory_down_each_level_and_writes_memory_max() {
    let tmp = tempfile::tempdir().unwrap();
    let h = Hierarchy::at(Version::V2, tmp.path());
    fake_v2(tmp.path());
    // The lab's parent, as the kernel would show it once made.
    let parent = tmp.path().join("memlend-lab");
    fs::create_dir(&parent).unwrap();
    fs::write(parent.join("cgroup.controllers"), "memory pids\n").unwrap();
    let dir = h.make("memlend-lab/ml-n1", 256 << 20).unwrap();
    assert_eq!(fs::read_to_string(tmp.path().join("cgroup.subtree_control")).unwrap(), "+memory");
    assert_eq!(fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap(), "+memory");
    assert_eq!(fs::read_to_string(dir.join("memory.max")).unwrap(), (256u64 << 20).to_string());
    fs::write(dir.join("memory.current"), "1048576\n").unwrap();
    assert_eq!(h.read_u64("memlend-lab/ml-n1", File::Usage), Some(1 << 20));
    fs::write(dir.join("memory.swap.max"), "max\n").unwrap();
    assert_eq!(h.read_u64("memlend-lab/ml-n1", File::SwapLimit), None, "max is no limit");
}

#[test]
fn v2_without_a_memory_controller_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("cgroup.controllers"), "cpu io pids\n").unwrap();
    let h = Hierarchy::at(Version::V2, tmp.path());
    let err = h.make("memlend-lab/ml-n1", 1 << 20).unwrap_err();
    assert!(format!("{err:#}").contains("no memory controller"), "{err:#}");
}

#[test]
fn v1_writes_limit_in_bytes_and_names_its_files() {
    let tmp = tempfile::tempdir().unwrap();
    let h = Hierarchy::at(Version::V1, tmp.path());
    let dir = h.make("memlend-lab/ml-n2", 64 << 20).unwrap();
    assert_eq!(fs::read_to_string(dir.join("memory.limit_in_bytes")).unwrap(), "67108864");
    assert_eq!(h.name(File::Peak), "memory.max_usage_in_bytes");
    assert_eq!(h.name(File::SwapLimit), "memory.memsw.limit_in_bytes");
    assert!(!tmp.path().join("cgroup.subtree_control").exists(), "v1 hands nothing down");
}

#[test]
fn remove_of_a_gone_cgroup_is_fine() {
    let tmp = tempfile::tempdir().unwrap();
    let h = Hierarchy::at(Version::V2, tmp.path());
    h.remove("memlend-lab/never").unwrap();
}

/// The real hierarchy of this host, where it has one and we are root: make
/// a cgroup with a limit, read it back through the same names, remove it.
#[test]
fn the_hosts_hierarchy_makes_reads_and_removes_a_cgroup() {
    let Some(h) = Hierarchy::detect() else {
        return memlend_testskip::skip("no memory cgroup hierarchy on this host");
    };
    if !is_root() {
        return memlend_testskip::skip("needs root to make a cgroup");
    }
    let rel = format!("memlend-cgtest-{}", std::process::id());
    h.make(&rel, 32 << 20).unwrap();
    let limit = h.read_u64(&rel, File::Limit);
    let usage = h.read_u64(&rel, File::Usage);
    h.remove(&rel).unwrap();
    assert_eq!(limit, Some(32 << 20), "{:?}", h.version);
    assert_eq!(usage, Some(0));
    assert!(!h.dir(&rel).exists());
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Unmounts and removes the mount point on every exit path.
struct Mounted(tempfile::TempDir);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(self.0.path()).status();
    }
}

/// A real cgroup2 mount (the unified hierarchy can be mounted beside v1):
/// where it offers the memory controller (a v2 host) a cgroup is made with
/// a real memory.max; where v1 holds the controller (as on these test
/// machines) making one fails with the reason, from the kernel's own files.
#[test]
fn a_real_cgroup2_mount_makes_a_cgroup_or_says_why_not() {
    if !is_root() {
        return memlend_testskip::skip("needs root to mount cgroup2");
    }
    let mnt = Mounted(tempfile::tempdir().unwrap());
    let path = mnt.0.path().to_str().unwrap();
    let mounted =
        std::process::Command::new("mount").args(["-t", "cgroup2", "none", path]).status();
    if !mounted.is_ok_and(|s| s.success()) {
        return memlend_testskip::skip("cannot mount cgroup2 here");
    }
    let h = Hierarchy::at(Version::V2, mnt.0.path());
    let rel = format!("memlend-cgtest2-{}", std::process::id());
    if h.offers_memory(&h.root) {
        h.make(&rel, 16 << 20).unwrap();
        let limit = h.read_u64(&rel, File::Limit);
        h.remove(&rel).unwrap();
        assert_eq!(limit, Some(16 << 20));
    } else {
        let err = h.make(&rel, 16 << 20).unwrap_err();
        assert!(format!("{err:#}").contains("no memory controller"), "{err:#}");
        let _ = fs::remove_dir(h.dir(&rel));
    }
}
