//! What the kernel says about this machine, read in one place: how much
//! memory it can lend (`meminfo`: MemAvailable and the room under this
//! process's cgroup), memory cgroups of either hierarchy (`cgroup`), and the
//! process settings a donor that backs swap needs (`process`).

pub mod cgroup;
pub mod meminfo;
pub mod process;
