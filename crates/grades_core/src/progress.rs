//! A process-wide count of facility-location picks, for a caller's progress
//! display while a long selection runs (one huge pool can take minutes).
//! Never part of a result: it only grows, and the caller reads differences.

use std::sync::atomic::{AtomicU64, Ordering};

static PICKS: AtomicU64 = AtomicU64::new(0);

/// One more pick made (by any pool, in any thread).
pub(crate) fn picked() {
    PICKS.fetch_add(1, Ordering::Relaxed);
}

/// Picks made by this process so far.
pub fn picks_made() -> u64 {
    PICKS.load(Ordering::Relaxed)
}
