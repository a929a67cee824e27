//! Memory in use, from the host (`/proc/meminfo`) or a memory cgroup (v1 or
//! v2, for lab nodes and confined services), with the PSI averages as an
//! early signal. Parsers are pure functions over text; reading the files is
//! a thin shell, and its errors name the file.

pub use memlend_host::meminfo::{cgroup_dirs, parse_meminfo};
use std::path::{Path, PathBuf};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MonitorError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {what}")]
    Parse { path: PathBuf, what: String },
    #[error("{0} is not a memory cgroup (no memory.usage_in_bytes or memory.current)")]
    NotCgroup(PathBuf),
}

/// One reading of the node's memory.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    pub total_bytes: u64,
    pub used_bytes: u64,
    /// PSI "some" and "full" 10 s averages (percent); None where absent.
    pub psi_some_avg10: Option<f64>,
    pub psi_full_avg10: Option<f64>,
}

impl Sample {
    pub fn used_fraction(&self) -> f64 {
        if self.total_bytes == 0 {
            return 1.0;
        }
        self.used_bytes as f64 / self.total_bytes as f64
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// used = MemTotal - MemAvailable.
    Host,
    /// usage - inactive file cache, against the limit (capped at MemTotal).
    CgroupV1(PathBuf),
    /// memory.current - inactive_file, against memory.max.
    CgroupV2(PathBuf),
}

impl MemorySource {
    /// The cgroup at `dir`, v1 or v2 by the files it has.
    pub fn cgroup(dir: &Path) -> Result<MemorySource, MonitorError> {
        if dir.join("memory.usage_in_bytes").exists() {
            Ok(MemorySource::CgroupV1(dir.to_path_buf()))
        } else if dir.join("memory.current").exists() {
            Ok(MemorySource::CgroupV2(dir.to_path_buf()))
        } else {
            Err(MonitorError::NotCgroup(dir.to_path_buf()))
        }
    }

    /// This process's memory cgroup if it has a limit below the host's
    /// memory, else the host.
    pub fn detect() -> Result<MemorySource, MonitorError> {
        let host = host_total()?;
        let cg = read("/proc/self/cgroup".as_ref())?;
        for dir in cgroup_dirs(&cg) {
            if let Ok(src) = MemorySource::cgroup(&dir) {
                if src.read().is_ok_and(|s| s.total_bytes < host) {
                    return Ok(src);
                }
            }
        }
        Ok(MemorySource::Host)
    }

    pub fn read(&self) -> Result<Sample, MonitorError> {
        let host_psi = || read("/proc/pressure/memory".as_ref()).ok().map(|t| parse_psi(&t));
        let (total_bytes, used_bytes, psi) = match self {
            MemorySource::Host => {
                let p: &Path = "/proc/meminfo".as_ref();
                let (total, avail) = parse_meminfo(&read(p)?).map_err(|what| parse_err(p, what))?;
                (total, total.saturating_sub(avail), host_psi())
            }
            MemorySource::CgroupV1(dir) => {
                let usage = read_u64(&dir.join("memory.usage_in_bytes"))?;
                let limit = read_u64(&dir.join("memory.limit_in_bytes"))?.min(host_total()?);
                let inactive = stat_field(&dir.join("memory.stat"), "total_inactive_file")?;
                (limit, usage.saturating_sub(inactive), host_psi())
            }
            MemorySource::CgroupV2(dir) => {
                let usage = read_u64(&dir.join("memory.current"))?;
                let max = read(&dir.join("memory.max"))?;
                let limit = if max.trim() == "max" {
                    host_total()?
                } else {
                    parse_u64(&dir.join("memory.max"), &max)?
                };
                let inactive = stat_field(&dir.join("memory.stat"), "inactive_file")?;
                let psi = read(&dir.join("memory.pressure")).ok().map(|t| parse_psi(&t));
                (limit.min(host_total()?), usage.saturating_sub(inactive), psi)
            }
        };
        let (psi_some_avg10, psi_full_avg10) = psi.unwrap_or((None, None));
        Ok(Sample {
            total_bytes,
            used_bytes: used_bytes.min(total_bytes),
            psi_some_avg10,
            psi_full_avg10,
        })
    }
}

/// The "some" and "full" avg10 values of a PSI file.
pub fn parse_psi(text: &str) -> (Option<f64>, Option<f64>) {
    let avg10 = |kind: &str| {
        let line = text.lines().find(|l| l.starts_with(kind))?;
        line.split_whitespace().find_map(|f| f.strip_prefix("avg10="))?.parse().ok()
    };
    (avg10("some "), avg10("full "))
}

pub use memlend_host::charge::parse_stat_field;

fn host_total() -> Result<u64, MonitorError> {
    let p: &Path = "/proc/meminfo".as_ref();
    Ok(parse_meminfo(&read(p)?).map_err(|w| parse_err(p, w))?.0)
}

fn read(path: &Path) -> Result<String, MonitorError> {
    std::fs::read_to_string(path)
        .map_err(|source| MonitorError::Read { path: path.to_path_buf(), source })
}

fn read_u64(path: &Path) -> Result<u64, MonitorError> {
    parse_u64(path, &read(path)?)
}

fn parse_u64(path: &Path, text: &str) -> Result<u64, MonitorError> {
    text.trim().parse().map_err(|_| parse_err(path, format!("not a number: {:?}", text.trim())))
}

fn stat_field(path: &Path, name: &str) -> Result<u64, MonitorError> {
    Ok(parse_stat_field(&read(path)?, name))
}

fn parse_err(path: &Path, what: String) -> MonitorError {
    MonitorError::Parse { path: path.to_path_buf(), what }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsers_read_real_looking_text() {
        let mi =
            "MemTotal:       24000000 kB\nMemFree:         1000 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(parse_meminfo(mi).unwrap(), (24_000_000 * 1024, 20_000_000 * 1024));
        assert!(parse_meminfo("MemTotal: x kB\n").is_err());
        let psi = "some avg10=1.50 avg60=0.00 avg300=0.00 total=4\nfull avg10=0.25 avg60=0.00 avg300=0.00 total=4\n";
        assert_eq!(parse_psi(psi), (Some(1.5), Some(0.25)));
        assert_eq!(parse_psi(""), (None, None));
        let stat = "cache 100\ninactive_file 30\ntotal_inactive_file 40\n";
        assert_eq!(parse_stat_field(stat, "inactive_file"), 30);
        assert_eq!(parse_stat_field(stat, "total_inactive_file"), 40);
        assert_eq!(parse_stat_field(stat, "missing"), 0);
        let cg = "9:name=systemd:/\n4:memory:/lab/n1\n0::/x\n";
        assert_eq!(
            cgroup_dirs(cg),
            vec![PathBuf::from("/sys/fs/cgroup/memory/lab/n1"), PathBuf::from("/sys/fs/cgroup/x")]
        );
    }

    /// A v2 cgroup from recorded files (the kernel's own names and formats,
    /// as a v2 host shows them): usage less inactive file cache against
    /// memory.max, and the cgroup's own PSI; `max` is the host's memory.
    #[test]
    fn a_recorded_v2_cgroup_reads_like_the_kernels() {
        let dir = tempfile::tempdir().unwrap();
        let put = |name: &str, text: &str| std::fs::write(dir.path().join(name), text).unwrap();
        put("memory.current", "209715200\n");
        put("memory.max", "268435456\n");
        put("memory.stat", "anon 150000000\nfile 59715200\ninactive_file 20971520\n");
        put("memory.pressure", "some avg10=2.50 avg60=1.00 avg300=0.10 total=123\nfull avg10=0.75 avg60=0.20 avg300=0.01 total=45\n");
        let src = MemorySource::cgroup(dir.path()).unwrap();
        assert_eq!(src, MemorySource::CgroupV2(dir.path().to_path_buf()));
        let s = src.read().unwrap();
        assert_eq!(s.total_bytes, 256 << 20);
        assert_eq!(s.used_bytes, (200 << 20) - (20 << 20));
        assert_eq!((s.psi_some_avg10, s.psi_full_avg10), (Some(2.5), Some(0.75)));
        put("memory.max", "max\n");
        assert_eq!(src.read().unwrap().total_bytes, host_total().unwrap());
    }

    #[test]
    fn the_host_reads_sanely() {
        let s = MemorySource::Host.read().unwrap();
        assert!(s.total_bytes > 0 && s.used_bytes <= s.total_bytes);
    }

    /// A real v1 memory cgroup: its usage grows when a process in it touches
    /// memory. Removed on every exit path.
    #[test]
    fn a_real_v1_cgroup_sees_its_memory() {
        let root = Path::new("/sys/fs/cgroup/memory");
        if !root.join("memory.usage_in_bytes").exists() {
            return memlend_testskip::skip("no cgroup v1 memory controller here");
        }
        let dir = root.join(format!("memlend-monitor-test-{}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&dir) {
            return memlend_testskip::skip(&format!("cannot make a cgroup: {e}"));
        }
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir(&self.0);
            }
        }
        let _rm = Rm(dir.clone());
        std::fs::write(dir.join("memory.limit_in_bytes"), "268435456").unwrap();
        let src = MemorySource::cgroup(&dir).unwrap();
        let before = src.read().unwrap();
        assert_eq!(before.total_bytes, 256 << 20);
        // A child in the cgroup holds 64 MiB for a moment.
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("echo $$ > {}/cgroup.procs; exec python3 -c 'import time; b=bytearray(64<<20); time.sleep(3)'", dir.display()))
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        let during = src.read().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(during.used_bytes >= before.used_bytes + (60 << 20), "{before:?} -> {during:?}");
    }
}
