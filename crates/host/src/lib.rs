//! What the kernel says about this machine, read in one place: how much
//! memory it can lend (`meminfo`: MemAvailable and the room under this
//! process's cgroup), memory cgroups of either hierarchy (`cgroup`), what
//! this process's own cgroup charges (`charge`), and the process settings a
//! donor that backs swap needs (`process`).

pub mod cgroup;
pub mod charge;
pub mod meminfo;
pub mod process;
