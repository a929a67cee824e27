//! Shared anonymous memory under `memlend run` (`crates/fault/src/shmem/`):
//! one copy seen by a process and every child it forks, far, within a
//! memory cgroup several times smaller: Python across forks, run as root
//! (the kernel follows the forks) and as another user (each child joins
//! the segment itself), and PostgreSQL's shared buffers under pgbench,
//! checked by pg_amcheck.

use super::common::*;
use super::mem_cgroup::{TestCgroup, JOIN_CGROUP};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The number before `what` in the summary's shared-memory line.
fn shared_count(err: &str, what: &str) -> u64 {
    let line = err.lines().find(|l| l.contains("shared anonymous mapping")).unwrap_or_default();
    let at = line.find(what).unwrap_or_else(|| panic!("no {what:?} in: {err}"));
    line[..at].split_whitespace().last().unwrap().parse().unwrap()
}

/// `memlend run --mem LIMIT` in a cgroup of LIMIT, as `user` if given.
fn run_in(cg: &TestCgroup, mem: &str, ssd: &Path, user: Option<&str>, cmd: &[&str]) -> Output {
    let mut c = Command::new("sh");
    c.args(["-c", JOIN_CGROUP, cg.dir.to_str().unwrap(), MEMLEND, "run", "--preload"])
        .arg(shim())
        .args(["--mem", mem, "--ssd", ssd.to_str().unwrap(), "--"]);
    if let Some(user) = user {
        c.args(["runuser", "-u", user, "--"]);
    }
    c.args(cmd).output().unwrap()
}

/// vm.unprivileged_userfaultfd set to 1 while any of these lives, then put
/// back as it was before the first: a user other than root may then use
/// userfaultfd (docs/run.md says so). Counted, since tests run at once: a
/// guard each saving and restoring the value left it at 1.
struct UnprivilegedUffd;

const UNPRIVILEGED: &str = "/proc/sys/vm/unprivileged_userfaultfd";
/// How many guards live, and the value before the first.
static ALLOWED: std::sync::Mutex<(usize, String)> = std::sync::Mutex::new((0, String::new()));

impl UnprivilegedUffd {
    fn allow() -> UnprivilegedUffd {
        let mut allowed = ALLOWED.lock().unwrap_or_else(|e| e.into_inner());
        if allowed.0 == 0 {
            allowed.1 = std::fs::read_to_string(UNPRIVILEGED).unwrap().trim().to_owned();
            std::fs::write(UNPRIVILEGED, "1").unwrap();
        }
        allowed.0 += 1;
        UnprivilegedUffd
    }
}

impl Drop for UnprivilegedUffd {
    fn drop(&mut self) {
        let mut allowed = ALLOWED.lock().unwrap_or_else(|e| e.into_inner());
        allowed.0 -= 1;
        if allowed.0 == 0 {
            let _ = std::fs::write(UNPRIVILEGED, &allowed.1);
        }
    }
}

/// A directory the `postgres` user owns, removed at the end.
struct UserDir(PathBuf);

impl UserDir {
    fn make(name: &str, user: &str) -> UserDir {
        let dir = std::env::temp_dir().join(format!("memlend-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ok = Command::new("chown").arg(user).arg(&dir).status().unwrap().success();
        assert!(ok, "chown {user} {}", dir.display());
        UserDir(dir)
    }
}

impl Drop for UserDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn has_user(user: &str) -> bool {
    Command::new("id").arg(user).output().is_ok_and(|o| o.status.success())
}

fn python_across_forks(user: Option<&str>) {
    let Some(cg) = TestCgroup::try_make(&format!("shm-{}", user.unwrap_or("root")), 64 << 20)
    else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/progs/shared_fork.py");
    let owner = user.unwrap_or("root");
    let dir = UserDir::make("shm", owner);
    let _uffd = user.map(|_| UnprivilegedUffd::allow());
    let cmd = ["python3", script.to_str().unwrap(), "192"];
    let far = run_in(&cg, "64M", &dir.0, user, &cmd);
    let err = text(&far.stderr);
    assert!(far.status.success(), "{err}");
    assert_eq!(
        text(&far.stdout).trim(),
        "192 MiB shared: children read every page, parent found 0 bad pages",
        "{err}"
    );
    assert_eq!(cg.oom_kills(), 0, "the cgroup killed a process:\n{err}");
    assert!(err.contains("192.0 MiB in 1 shared anonymous mapping"), "{err}");
    // 192 MiB through a 64 MiB cgroup: most of it went to the store and
    // came back, in the children too.
    assert!(shared_count(&err, "pages evicted") > 32 * 1024, "{err}");
    assert!(shared_count(&err, "faults from the store") > 3 * 32 * 1024, "{err}");
}

#[test]
fn shared_memory_across_forks_four_times_the_cgroup_keeps_every_byte() {
    python_across_forks(None);
}

#[test]
fn shared_memory_of_another_user_is_joined_by_each_child() {
    if !has_user("nobody") {
        memlend_testskip::skip("no user 'nobody' to run as");
        return;
    }
    python_across_forks(Some("nobody"));
}

/// PostgreSQL's binaries (Debian keeps them out of PATH).
fn pg_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| d.join("postgres").is_file())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// A command as the `postgres` user, with `bin` first in PATH.
fn as_postgres(bin: &Path, args: &[&str]) -> Output {
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    Command::new("runuser")
        .args(["-u", "postgres", "--", "env", &format!("PATH={path}")])
        .args(args)
        .output()
        .unwrap()
}

/// The postmaster under `memlend run`, stopped (and its run's summary
/// read) however the test ends.
struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    run: Option<std::process::Child>,
}

impl Postgres {
    fn stop(&mut self) -> Output {
        let data = self.data.to_str().unwrap().to_owned();
        as_postgres(&self.bin, &["pg_ctl", "-D", &data, "stop", "-m", "fast", "-w"]);
        self.run.take().unwrap().wait_with_output().unwrap()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some(mut run) = self.run.take() {
            let data = self.data.to_str().unwrap().to_owned();
            as_postgres(&self.bin, &["pg_ctl", "-D", &data, "stop", "-m", "immediate"]);
            let _ = run.kill();
            let _ = run.wait();
        }
    }
}

/// `pgbench ARGS` against the server in `sock`: its output, checked for
/// no failed transactions.
fn pgbench(bin: &Path, sock: &str, args: &[&str]) -> String {
    let out = as_postgres(bin, &[&["pgbench", "-h", sock], args, &["postgres"]].concat());
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "pgbench {args:?}: {all}");
    assert!(all.contains("number of failed transactions: 0 (0.000%)"), "{all}");
    all
}

/// PostgreSQL with shared_buffers 2.5 times its memory cgroup: a 150 MB
/// pgbench database, select-only and TPC-B-like runs with no failed
/// transaction, pg_amcheck clean, no OOM kill, and the buffers far.
#[test]
fn postgresql_with_shared_buffers_past_its_cgroup_runs_pgbench_and_checks_clean() {
    let Some(bin) = pg_bin() else {
        memlend_testskip::skip("PostgreSQL is not installed (scripts/setup.sh installs it)");
        return;
    };
    if !has_user("postgres") {
        memlend_testskip::skip("no user 'postgres'");
        return;
    }
    let Some(cg) = TestCgroup::try_make("pg", 96 << 20) else { return };
    let dir = UserDir::make("pg", "postgres");
    let _uffd = UnprivilegedUffd::allow();
    let data = dir.0.join("data");
    let sock = dir.0.to_str().unwrap().to_owned();
    let init = as_postgres(&bin, &["initdb", "-D", data.to_str().unwrap(), "-A", "trust"]);
    assert!(init.status.success(), "initdb: {}", text(&init.stderr));
    let conf = format!(
        "shared_buffers = 240MB\nlisten_addresses = ''\nunix_socket_directories = '{sock}'\n\
         max_connections = 20\nhuge_pages = off\n"
    );
    let conf_file = data.join("postgresql.conf");
    let old = std::fs::read_to_string(&conf_file).unwrap();
    std::fs::write(&conf_file, old + &conf).unwrap();
    let postgres = bin.join("postgres");
    let run = Command::new("sh")
        .args(["-c", JOIN_CGROUP, cg.dir.to_str().unwrap(), MEMLEND, "run", "--preload"])
        .arg(shim())
        .args(["--mem", "96M", "--ssd", &sock, "--", "runuser", "-u", "postgres", "--"])
        .args([postgres.to_str().unwrap(), "-D", data.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut pg = Postgres { bin: bin.clone(), data: data.clone(), run: Some(run) };
    let ready = (0..300).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        as_postgres(&bin, &["pg_isready", "-h", &sock]).status.success()
    });
    assert!(ready, "postgres did not start under memlend run");
    let init = as_postgres(&bin, &["pgbench", "-h", &sock, "-i", "-s", "10", "-q", "postgres"]);
    assert!(init.status.success(), "pgbench -i: {}", text(&init.stderr));
    pgbench(&bin, &sock, &["-S", "-c", "4", "-j", "2", "-T", "5"]);
    pgbench(&bin, &sock, &["-c", "4", "-j", "2", "-T", "5"]);
    let check = as_postgres(
        &bin,
        &["pg_amcheck", "-h", &sock, "--install-missing", "--heapallindexed", "postgres"],
    );
    assert!(check.status.success(), "pg_amcheck: {}{}", text(&check.stdout), text(&check.stderr));
    let out = pg.stop();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(cg.oom_kills(), 0, "the cgroup killed a process:\n{err}");
    let line = err.lines().find(|l| l.contains("shared anonymous mapping")).unwrap_or_default();
    assert!(line.contains("in 1 shared anonymous mapping"), "the buffers were made far: {err}");
    assert!(shared_count(&err, "pages evicted") > 0, "{err}");
    assert!(shared_count(&err, "faults from the store") > 0, "{err}");
}
