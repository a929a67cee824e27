//! When the handler fails (a panic, or poll/read on the uffd failing), no
//! faulting thread may be left waiting for ever: every page not mapped at
//! that moment is poisoned (UFFDIO_POISON), so touching it raises SIGBUS,
//! and every waiter is woken to meet that. Mapped pages keep their bytes.
//! The handler then keeps reading messages until the region is dropped, so
//! that madvise and munmap of region memory (which wait for their event to
//! be read) do not hang either.

use crate::handler::Handler;
use crate::kernel::uffd::{self, Msg, Ready};
use crate::stats::Counters;
use memlend_store::PAGE_SIZE;
use std::io::PipeReader;

/// Rounds of "an event is queued: read it, give its thread a moment to
/// go on, try again" while poisoning; with the pause, about a second.
const EAGAIN_ROUNDS: usize = 1000;
const EAGAIN_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

impl Handler {
    pub(crate) fn failed(&mut self, reason: &str, stop: &PipeReader) {
        tracing::error!(
            "fault handler failed ({reason}): pages not mapped now raise SIGBUS when touched"
        );
        Counters::add(&self.core.counters.handler_failures, 1);
        let poisoned = self.poison_missing(self.core.base, self.core.pages as usize * PAGE_SIZE);
        Counters::add(&self.core.counters.pages_poisoned, poisoned);
        if let Err(e) = self.core.uffd.wake(self.core.base, self.core.pages as usize * PAGE_SIZE) {
            tracing::error!("fault handler: waking the region after failure failed: {e}");
        }
        self.drain(stop);
    }

    /// Poison every missing page in `start..start + len_bytes`, skipping
    /// mapped ones (POISON stops at them with EEXIST). The page table is not
    /// trusted here: a failure may have struck mid-eviction. Returns how
    /// many pages were poisoned.
    fn poison_missing(&mut self, start: usize, len_bytes: usize) -> u64 {
        let end = start + len_bytes;
        let (mut addr, mut poisoned, mut eagain_rounds) = (start, 0, 0);
        // Each round poisons up to the next mapped page and skips it, or
        // reads pending events; so this many rounds always suffice.
        for _ in 0..len_bytes / PAGE_SIZE + EAGAIN_ROUNDS + 1 {
            if addr >= end {
                break;
            }
            let (done, result) = self.core.uffd.poison_run(addr, end - addr);
            poisoned += (done / PAGE_SIZE) as u64;
            addr += done;
            match result.map_err(|e| e.raw_os_error()) {
                Ok(()) => break,
                Err(Some(libc::EAGAIN)) if eagain_rounds < EAGAIN_ROUNDS => {
                    eagain_rounds += 1;
                    self.drain_pending();
                    std::thread::sleep(EAGAIN_PAUSE);
                }
                Err(Some(libc::EEXIST)) => addr += PAGE_SIZE,
                Err(e) => {
                    tracing::error!("fault handler: poisoning {addr:#x} failed: errno {e:?}");
                    addr += PAGE_SIZE;
                }
            }
        }
        poisoned
    }

    /// Until the region is dropped: answer faults with poison (a page
    /// dropped since) or a wake (a page mapped), lift write protection for
    /// writers (the page is mapped and nothing will be written back), and
    /// read events so their threads go on.
    fn drain(&mut self, stop: &PipeReader) {
        loop {
            match uffd::wait(&self.core.uffd, stop, None, 1000) {
                Ok(Ready::Stop) => return,
                Ok(Ready::Faults) => self.drain_pending(),
                Ok(Ready::Nothing | Ready::Bell) => {}
                Err(e) => {
                    tracing::error!("fault handler: poll failed after failure: {e}");
                    return self.wait_for_stop(stop);
                }
            }
        }
    }

    fn drain_pending(&mut self) {
        let mut msgs = [Msg::default(); 16];
        let n = match self.core.uffd.read_msgs(&mut msgs) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!("fault handler: read failed after failure: {e}");
                return;
            }
        };
        for msg in &msgs[..n] {
            match *msg {
                Msg::Fault(fault) => {
                    // One try each: on EAGAIN (an event queued) the woken
                    // thread faults again and is seen after the event.
                    let page_addr = fault.addr & !(PAGE_SIZE - 1);
                    if fault.wp {
                        let _ = self.core.uffd.unprotect(page_addr, PAGE_SIZE);
                    } else if self.core.uffd.poison_run(page_addr, PAGE_SIZE).0 > 0 {
                        Counters::add(&self.core.counters.pages_poisoned, 1);
                    }
                    let _ = self.core.uffd.wake(page_addr, PAGE_SIZE);
                }
                Msg::Remove { start, end } | Msg::Unmap { start, end } => {
                    self.core.discards.settled(start, end)
                }
                Msg::Remap { .. } | Msg::Fork { .. } => {}
            }
        }
    }

    /// The uffd is unusable: nothing more can be done but wait for the
    /// region's drop, so that the handler's state outlives no user.
    fn wait_for_stop(&self, stop: &PipeReader) {
        use std::io::Read;
        let mut byte = [0u8; 1];
        let _ = (&*stop).read(&mut byte);
    }
}
