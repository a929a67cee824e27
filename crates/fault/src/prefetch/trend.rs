//! Access-trend detection for prefetch, after Leap (Al Maruf & Chowdhury,
//! ATC 2020): keep the last few deltas between faulting pages and look for
//! a majority delta. A fault that lands on the stride lattice of the last
//! prefetch window, inside it or just past it, continues the trend: its
//! reads of the prefetched pages raised no faults, so the history records
//! the stride for it rather than the jump. Only a fault that itself follows
//! the majority stride prefetches, so a trend that has just ended (the
//! history still holds it) costs nothing.
//!
//! Short runs are not trends. A program that reads a few pages of each
//! object along a stride (16-page objects, pages 0, 5, 10) shows a majority
//! delta in every object, and prefetched a window past the object for
//! each: 182 K pages mapped for 24 K touched, none used. So each window
//! that is replaced before any fault passed through it raises the run of
//! equal deltas a new trend must show first, up to the whole history; a
//! window passed through brings it back down.

/// Deltas remembered.
const HISTORY: usize = 8;
/// Fewest deltas before a majority counts.
const DELTAS_MIN: usize = 2;
/// Window of the first prefetch on a new trend, in pages.
pub const FIRST_WINDOW_PAGES: usize = 8;
/// Prefetch looks this many windows ahead of the fault for pages to read,
/// one window per read, with up to `fetch::IN_FLIGHT_MAX` (3) in flight,
/// so that the store reads the next windows while the handler maps the
/// last. One more than in flight: the marker fault that asks is halfway
/// through its window, so three whole windows reach four from it.
pub const REACH_WINDOWS: usize = 4;

/// The pages a prefetch may cover: `first + i * stride` for `i < count`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub first: i64,
    pub stride: i64,
    pub count: usize,
}

impl Window {
    /// How far along the window `page` is, if it lies on its lattice
    /// within `count + slack` steps.
    pub fn position(&self, page: i64, slack: usize) -> Option<usize> {
        let offset = page - self.first;
        if offset % self.stride != 0 || offset / self.stride < 0 {
            return None;
        }
        let step = (offset / self.stride) as usize;
        (step < self.count + slack).then_some(step)
    }

    pub fn page(&self, step: usize) -> i64 {
        self.first + step as i64 * self.stride
    }
}

/// What the trend says about a fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Advice {
    /// Prefetch `pages` pages along `stride`, of those within
    /// `REACH_WINDOWS * pages` steps after the faulting page.
    pub stride: i64,
    pub pages: usize,
    /// The fault continued the last window: its pages before step
    /// `passed` were read without faults (or skipped) by the stream.
    pub passed: Option<(Window, usize)>,
}

pub struct Trend {
    deltas: [i64; HISTORY],
    filled: usize,
    next: usize,
    last: Option<i64>,
    window: Option<Window>,
    /// Pages to prefetch next time; doubles while windows are consumed.
    size: usize,
    pages_max: usize,
    /// A fault passed through `window` (its pages were used).
    window_used: bool,
    /// Windows in a row dropped unused; each asks one more equal delta of
    /// a new trend.
    unused_windows: usize,
}

impl Trend {
    /// `pages_max` caps the window; 0 turns prefetch off.
    pub fn new(pages_max: usize) -> Trend {
        Trend {
            deltas: [0; HISTORY],
            filled: 0,
            next: 0,
            last: None,
            window: None,
            size: FIRST_WINDOW_PAGES.min(pages_max),
            pages_max,
            window_used: false,
            unused_windows: 0,
        }
    }

    /// Record a fault at `page` (any missing fault) and say whether, and
    /// how far, to prefetch after it.
    pub fn fault(&mut self, page: u32) -> Option<Advice> {
        if self.pages_max == 0 {
            return None;
        }
        let page = i64::from(page);
        let passed = self.window.and_then(|w| w.position(page, self.size).map(|step| (w, step)));
        self.window_used |= passed.is_some();
        let delta = match (passed, self.last) {
            (Some((w, _)), _) => w.stride,
            (None, Some(last)) => page - last,
            (None, None) => 0,
        };
        self.last = Some(page);
        if delta != 0 {
            self.push(delta);
        }
        let Some(stride) = self.majority() else {
            self.drop_window();
            self.size = FIRST_WINDOW_PAGES.min(self.pages_max);
            return None;
        };
        if delta != stride {
            // Off the trend (noise, or a new pattern starting): no prefetch
            // now; the history decides whether the trend is still there.
            return None;
        }
        if passed.is_some() {
            self.size = (self.size * 2).min(self.pages_max);
            self.unused_windows = 0;
        } else if self.run_of(stride) < DELTAS_MIN + self.unused_windows {
            return None;
        } else {
            self.drop_window();
        }
        let count = self.size * REACH_WINDOWS;
        self.window = Some(Window { first: page + stride, stride, count });
        self.window_used = false;
        Some(Advice { stride, pages: self.size, passed })
    }

    /// Forget the window; count it if no fault ever passed through it.
    fn drop_window(&mut self) {
        if self.window.take().is_some() && !self.window_used {
            self.unused_windows = (self.unused_windows + 1).min(HISTORY - DELTAS_MIN);
        }
    }

    /// How many of the latest deltas in a row are `stride`.
    fn run_of(&self, stride: i64) -> usize {
        (1..=self.filled)
            .take_while(|&back| self.deltas[(self.next + HISTORY - back) % HISTORY] == stride)
            .count()
    }

    fn push(&mut self, delta: i64) {
        self.deltas[self.next] = delta;
        self.next = (self.next + 1) % HISTORY;
        self.filled = (self.filled + 1).min(HISTORY);
    }

    /// Boyer-Moore majority vote over the remembered deltas, then checked.
    fn majority(&self) -> Option<i64> {
        if self.filled < DELTAS_MIN {
            return None;
        }
        let deltas = &self.deltas[..self.filled];
        let (mut candidate, mut votes) = (0, 0);
        for &d in deltas {
            if votes == 0 {
                candidate = d;
            }
            votes += if d == candidate { 1 } else { -1 };
        }
        let count = deltas.iter().filter(|&&d| d == candidate).count();
        (count * 2 > self.filled).then_some(candidate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy_tests::Rng;

    #[test]
    fn a_sequential_scan_prefetches_a_growing_window() {
        let mut trend = Trend::new(512);
        assert_eq!(trend.fault(100), None);
        assert_eq!(trend.fault(101), None, "one delta is not a trend");
        let advice = trend.fault(102).unwrap();
        assert_eq!((advice.stride, advice.pages), (1, 8));
        // The stream read 103..=110 without faults; it faults at 111.
        let mut next = 111;
        let mut sizes = vec![];
        for _ in 0..10 {
            let advice = trend.fault(next).unwrap();
            assert_eq!(advice.stride, 1);
            assert!(advice.passed.is_some());
            sizes.push(advice.pages);
            next += advice.pages as u32 + 1;
        }
        assert_eq!(sizes, [16, 32, 64, 128, 256, 512, 512, 512, 512, 512]);
    }

    #[test]
    fn strides_and_backward_scans_are_trends() {
        for stride in [3i64, -1, -7] {
            let mut trend = Trend::new(64);
            let mut page = 10_000i64;
            let mut last = None;
            for _ in 0..6 {
                last = trend.fault(page as u32);
                page += stride;
            }
            assert_eq!(last.unwrap().stride, stride);
        }
    }

    #[test]
    fn random_faults_show_no_trend() {
        let mut trend = Trend::new(512);
        let mut rng = Rng::new(3);
        let advised = (0..100_000)
            .filter(|_| trend.fault((rng.next_u64() % 1_000_000) as u32).is_some())
            .count();
        assert_eq!(advised, 0);
    }

    #[test]
    fn random_faults_right_after_a_scan_prefetch_nothing() {
        let mut trend = Trend::new(512);
        assert!((0..100).filter_map(|p| trend.fault(p)).count() > 90);
        let mut rng = Rng::new(5);
        let advised = (0..1000)
            .filter(|_| trend.fault((rng.next_u64() % 1_000_000) as u32).is_some())
            .count();
        assert_eq!(advised, 0);
    }

    #[test]
    fn a_few_pages_along_a_stride_in_each_object_stop_prefetching() {
        let mut trend = Trend::new(512);
        let mut rng = Rng::new(7);
        let mut advised = 0;
        for _ in 0..1000 {
            let base = (rng.next_u64() % 100_000) as u32 * 16;
            advised += [0, 5, 10].iter().filter(|&&k| trend.fault(base + k).is_some()).count();
        }
        assert!(advised < 20, "{advised} prefetches for 1000 objects");
        // A real scan after them still gets its windows within a history.
        let advised = (0..100).filter(|&p| trend.fault(5_000_000 + p).is_some()).count();
        assert!(advised > 90, "{advised}");
    }

    #[test]
    fn off_means_off() {
        let mut trend = Trend::new(0);
        assert!((0..100).all(|p| trend.fault(p).is_none()));
    }
}
