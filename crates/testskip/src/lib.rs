//! A test that cannot run here calls `skip(why)` and returns. cargo test
//! counts it as passed and captures its stderr, so the skip is also
//! appended to a log (`$MEMLEND_SKIP_LOG`, else target/skipped.log) that
//! scripts/test-summary.sh reads, to count it as skipped instead.

use std::io::Write;
use std::path::PathBuf;

/// The log's path when `MEMLEND_SKIP_LOG` is not set.
const DEFAULT_LOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/skipped.log");

/// Record that the running test is skipped, and why: the line
/// `SKIPPED: <binary>::<test>: <why>` to the log and to stderr.
pub fn skip(why: &str) {
    let line = format!("SKIPPED: {}: {why}\n", test_name());
    eprint!("{line}");
    let log = std::env::var_os("MEMLEND_SKIP_LOG")
        .map_or_else(|| PathBuf::from(DEFAULT_LOG), PathBuf::from);
    if let Some(dir) = log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of one short line: appends from parallel tests stay whole.
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&log);
    let written = file.as_mut().map(|f| f.write_all(line.as_bytes()));
    if !matches!(written, Ok(Ok(()))) {
        // A skip nobody can count would pass as a pass: refuse it.
        panic!("cannot record the skip in {}: {written:?}", log.display());
    }
}

/// `<binary>::<test>`: libtest names each test's thread after the test;
/// the binary's name loses cargo's `-<hash>`.
fn test_name() -> String {
    let exe = std::env::current_exe().ok();
    let stem = exe.as_ref().and_then(|p| p.file_stem()).map(|s| s.to_string_lossy().into_owned());
    let stem = stem.unwrap_or_default();
    let binary = stem.rsplit_once('-').map_or(stem.as_str(), |(b, _)| b);
    let thread = std::thread::current();
    format!("{binary}::{}", thread.name().unwrap_or("unknown test"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skip_is_one_line_naming_the_binary_and_the_test() {
        let log =
            std::env::temp_dir().join(format!("memlend-skip-test-{}.log", std::process::id()));
        std::env::set_var("MEMLEND_SKIP_LOG", &log);
        skip("no reason at all");
        let text = std::fs::read_to_string(&log).unwrap();
        let _ = std::fs::remove_file(&log);
        let want = "SKIPPED: memlend_testskip::tests::a_skip_is_one_line_naming_the_binary_and_the_test: no reason at all\n";
        assert_eq!(text, want);
    }
}
