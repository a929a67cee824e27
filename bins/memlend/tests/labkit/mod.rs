//! Shared by the tests that need the lab (root, iproute2, a memory cgroup
//! hierarchy, v1 or v2):
//! bringing a lab up and down, and running `memlend`.
#![allow(dead_code)]

use memlend_host::cgroup::{File, Hierarchy};
use std::process::{Command, Output};

pub const MEMLEND: &str = env!("CARGO_BIN_EXE_memlend");

/// Why the lab cannot run here, if it cannot.
pub fn skip_reason() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root =
        status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !root {
        return Some("not root".into());
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("no `ip` (iproute2)".into());
    }
    if Hierarchy::detect().is_none() {
        return Some("no memory cgroup hierarchy (v1 or v2)".into());
    }
    None
}

#[macro_export]
macro_rules! need_lab {
    () => {
        if let Some(why) = $crate::labkit::skip_reason() {
            return memlend_testskip::skip(&why);
        }
    };
}

pub fn memlend(args: &[&str]) -> Output {
    Command::new(MEMLEND).args(args).output().unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub fn ok(args: &[&str]) -> String {
    let out = memlend(args);
    assert!(
        out.status.success(),
        "memlend {args:?} failed: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A lab that is taken down when the test ends, however it ends.
pub struct Lab {
    pub prefix: &'static str,
}

impl Lab {
    pub fn up(prefix: &'static str, nodes: usize, mem: &str) -> Lab {
        Lab::up_in(prefix, nodes, mem, "10.77.0.0/24")
    }

    /// A lab on its own subnet, so that labs can run side by side.
    pub fn up_in(prefix: &'static str, nodes: usize, mem: &str, subnet: &str) -> Lab {
        let lab = Lab { prefix };
        let n = nodes.to_string();
        ok(&["lab", "up", &n, "--no-daemon", "--mem", mem, "--prefix", prefix, "--subnet", subnet]);
        lab
    }

    /// A lab whose nodes each run memlendd, as `memlend lab up` does by default.
    pub fn up_with_daemons(prefix: &'static str, nodes: usize, mem: &str, subnet: &str) -> Lab {
        let lab = Lab { prefix };
        let n = nodes.to_string();
        ok(&["lab", "up", &n, "--mem", mem, "--prefix", prefix, "--subnet", subnet]);
        lab
    }

    pub fn node(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    pub fn usage(&self, i: usize) -> u64 {
        cgroup_file(&self.node(i), File::Usage)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = memlend(&["lab", "down", "--prefix", self.prefix]);
    }
}

/// The lab cgroups' directory in this host's hierarchy.
pub fn cgroups_dir() -> std::path::PathBuf {
    Hierarchy::detect().expect("a memory cgroup hierarchy").dir("memlend-lab")
}

pub fn cgroup_file(node: &str, file: File) -> u64 {
    let h = Hierarchy::detect().expect("a memory cgroup hierarchy");
    let rel = format!("memlend-lab/{node}");
    h.read_u64(&rel, file).unwrap_or_else(|| panic!("{rel}: no {}", h.name(file)))
}
