//! The Python module (python/memlend, ctypes over libmemlend.so) under its
//! own tests, python/tests/test_memlend.py, with a real memlendd donor.
//! Uses $MEMLEND_PYTHON, else /usr/bin/python3, else python3 on PATH: the
//! first that imports numpy; without numpy the numpy tests are skipped, and
//! this says so loudly.

mod common;

use common::{libmemlend_so, repo, Donor};
use std::process::Command;

fn has(python: &str, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn python() -> String {
    let mut candidates: Vec<String> = std::env::var("MEMLEND_PYTHON").into_iter().collect();
    candidates.extend(["/usr/bin/python3".to_string(), "python3".to_string()]);
    let usable: Vec<&String> = candidates.iter().filter(|p| has(p, "ctypes")).collect();
    assert!(!usable.is_empty(), "no python3 found (tried {candidates:?}): set MEMLEND_PYTHON");
    match usable.iter().find(|p| has(p, "numpy")) {
        Some(p) => p.to_string(),
        None => {
            eprintln!(
                "WARNING: no python with numpy (tried {candidates:?}); the numpy tests are skipped"
            );
            usable[0].to_string()
        }
    }
}

#[test]
fn the_python_module_passes_its_tests() {
    let repo = repo();
    let donor = Donor::start("128M", None);
    let out = Command::new(python())
        .arg("-X")
        .arg("faulthandler")
        .arg(repo.join("python/tests/test_memlend.py"))
        .arg("-v")
        .env("MEMLEND_LIB", libmemlend_so())
        .env("MEMLEND_TEST_DONOR", donor.addr.to_string())
        .env("MEMLEND_LOG", "warn")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .expect("run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{}{stderr}", String::from_utf8_lossy(&out.stdout));
    assert!(out.status.success(), "python tests failed: {:?}", out.status);
    assert!(stderr.contains("OK"), "unittest did not report OK");
}
