//! `memlend run --mem` inside a memory cgroup whose limit binds: it follows
//! the cgroup's charge (`crates/preload/src/mem_limit.rs`), and the kernel
//! never has to kill the program for it.

use crate::common::*;
use memlend_host::cgroup::Hierarchy;
use std::process::Command;

/// A cgroup made for one test, removed however the test ends.
pub struct TestCgroup {
    hierarchy: Hierarchy,
    rel: String,
    pub dir: std::path::PathBuf,
}

/// For `sh -c JOIN_CGROUP <cgroup dir> <command...>`: the shell joins the
/// cgroup, then becomes the command.
pub const JOIN_CGROUP: &str = "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"";

impl TestCgroup {
    /// A cgroup of `limit_bytes`, or None (the test is skipped, and says
    /// why) without root or a memory cgroup hierarchy.
    pub fn try_make(name: &str, limit_bytes: u64) -> Option<TestCgroup> {
        // SAFETY: getuid has no preconditions and cannot fail.
        if unsafe { libc::getuid() } != 0 {
            memlend_testskip::skip("making a memory cgroup needs root");
            return None;
        }
        let Some(hierarchy) = Hierarchy::detect() else {
            memlend_testskip::skip("no memory cgroup hierarchy");
            return None;
        };
        let rel = format!("memlend-test-{name}-{}", std::process::id());
        let dir = hierarchy.make(&rel, limit_bytes).expect("make a memory cgroup");
        Some(TestCgroup { hierarchy, rel, dir })
    }

    /// OOM kills in the cgroup (v1 `memory.oom_control`, v2 `memory.events`).
    pub fn oom_kills(&self) -> u64 {
        let text = ["memory.oom_control", "memory.events"]
            .iter()
            .find_map(|f| std::fs::read_to_string(self.dir.join(f)).ok())
            .expect("an OOM count file");
        let line = text.lines().find(|l| l.starts_with("oom_kill ")).expect(&text);
        line["oom_kill ".len()..].trim().parse().unwrap()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = self.hierarchy.remove(&self.rel) {
            eprintln!("cannot remove {}: {e:#}", self.dir.display());
        }
    }
}

/// The program's memory outside far memory grows by 24 MiB in a 64 MiB
/// cgroup, with `--mem 64M`: the far budget follows what the cgroup is
/// charged, the run says so, every byte matches a plain run, and the
/// cgroup's OOM killer never fires.
#[test]
fn with_mem_in_a_binding_memory_cgroup_its_charge_is_followed() {
    let Some(cg) = TestCgroup::try_make("mem", 64 << 20) else { return };
    let donor = Donor::start("256M");
    let dir = tempfile::tempdir().unwrap();
    let prog = compile("far_grow", dir.path());
    let cmd = [prog.to_str().unwrap(), "96", "24"];
    let addr = donor.addr.to_string();
    let far = Command::new("sh")
        .args(["-c", JOIN_CGROUP, cg.dir.to_str().unwrap(), MEMLEND, "run", "--preload"])
        .arg(shim())
        .args(["--mem", "64M", "--donor", &addr, "--insecure", "--"])
        .args(cmd)
        .output()
        .unwrap();
    let err = text(&far.stderr);
    assert_eq!(cg.oom_kills(), 0, "the cgroup killed a process:\n{err}");
    assert_same_output_and_far(&far, &plain_run(&cmd));
    assert!(
        err.contains("--mem followed the charge of its memory cgroup, whose limit (64.0 MiB)"),
        "the run followed the cgroup:\n{err}"
    );
}
