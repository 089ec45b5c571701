//! Streaming, mergeable prompt/response variance accumulators for the
//! variance-budget law.
//!
//! One pass over `(prompt key, loss)` rows, in any order, keeps for every
//! prompt its response count, mean loss and sum of squared deviations `M2`
//! (Welford). Two accumulators merge exactly with Chan et al.'s parallel
//! update, so shards processed by different workers combine into the same
//! statistics as a single pass (up to floating-point rounding).
//!
//! Rows whose key repeats the previous row's key (the usual layout: the
//! responses of a prompt stored together) are folded as a run: the run's own
//! mean and `M2` are computed (a vectorised corrected two-pass over the run,
//! which is in cache) and merged into the table once, so
//! the table is touched once per run rather than once per row; the index
//! lines and records of upcoming runs are prefetched so that cache misses
//! overlap. Grouped rows (a prompt's rows together) need no table at all:
//! their runs are appended to a log, and the log is read in the table's
//! order (see [`Accumulator`]).
//!
//! From the per-prompt statistics, [`Accumulator::summary`] gives the
//! estimators of the paper's decomposition `Var = V_x / Np + V_y|x / (Np K)`:
//!
//! * `V_y|x = mean_i s_i^2` over prompts with at least two responses, where
//!   `s_i^2 = M2_i / (K_i - 1)` is the unbiased within-prompt variance;
//! * `V_x = max(0, var_i(g_i) - mean_i(s_i^2 / K_i))`, where `g_i` is the mean
//!   loss of prompt `i` and `var_i` is the *unbiased* (ddof = 1) variance of the
//!   prompt means. With `K_i` independent of the prompt, each `g_i` has
//!   variance `V_x + sigma_i^2 / K_i` around the common mean, and for
//!   independent variables with a common mean the ddof = 1 sample variance is
//!   unbiased for the average of their variances, i.e. for
//!   `V_x + mean_i(sigma_i^2 / K_i)`; `s_i^2 / K_i` is unbiased for
//!   `sigma_i^2 / K_i`, so the difference is unbiased for `V_x` before the clip
//!   at 0, also when the `K_i` differ. (The population variance, ddof = 0,
//!   would be biased low by a factor `(P - 1) / P`.)
//!
//! Prompts with a single response carry no within-prompt information; they
//! are left out of both estimators and counted in
//! [`Summary::n_single_response_prompts`] so the caller can report them.

use crate::error::{invalid, Error, Result};

/// Per-prompt running statistics.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Stats {
    /// Number of responses (rows) seen.
    pub count: u64,
    /// Mean loss.
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
}

impl Stats {
    /// Statistics of a slice of finite values (two passes over the slice,
    /// which is in cache: more accurate than a one-pass update).
    pub fn of_slice(x: &[f64]) -> Stats {
        if x.is_empty() {
            return Stats::default();
        }
        let n = x.len() as f64;
        let mean = x.iter().sum::<f64>() / n;
        let m2 = x.iter().map(|&v| (v - mean) * (v - mean)).sum::<f64>();
        Stats { count: x.len() as u64, mean, m2 }
    }

    /// Welford update with one value.
    #[inline]
    pub fn push(&mut self, x: f64) {
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Chan et al.'s exact merge of two sets of statistics.
    #[inline]
    pub fn merge(&mut self, o: &Stats) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.count as f64, o.count as f64);
        let n = na + nb;
        let d = o.mean - self.mean;
        self.mean += d * (nb / n);
        self.m2 += o.m2 + d * d * (na * nb / n);
        self.count += o.count;
    }

    /// Unbiased variance `M2 / (count - 1)`; `None` below two values.
    pub fn sample_variance(&self) -> Option<f64> {
        (self.count >= 2).then(|| self.m2 / (self.count - 1) as f64)
    }
}

/// One prompt's record (or one run of an update): a key and its statistics.
/// 32 bytes, aligned so that a record never straddles two cache lines.
#[repr(C, align(32))]
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    key: u64,
    st: Stats,
}

/// Plain data for which all-zero bytes are a valid value.
///
/// # Safety
/// Implementors must be `Copy`, hold no pointers and accept all-zero bytes.
unsafe trait Zeroable: Copy {}
// SAFETY: all-zero bytes are key 0 with empty statistics.
unsafe impl Zeroable for Slot {}
// SAFETY: an integer.
unsafe impl Zeroable for u64 {}

/// A zero-filled array of `T` that can grow, keeping its contents. Arrays
/// of 2 MiB and up are anonymous memory mappings that ask for
/// transparent huge pages on Linux: the tables are accessed at random, and
/// with 4 KiB pages nearly every access would also miss the TLB; fresh
/// mappings are zero already and fault in a few large pages instead of many
/// small ones, and a mapping grows in place or is moved by the kernel
/// (`mremap`) without copying or touching its pages again. Fresh pages are
/// the dear part of a growing table (the kernel zeroes each one, and a
/// virtual machine may have to fetch it from its host first), so a table
/// that grows keeps the pages it has and only faults in the new part.
struct Buf<T: Zeroable> {
    ptr: std::ptr::NonNull<T>,
    n: usize,
    mapped: bool,
}

// SAFETY: Buf owns its memory exclusively, like a Vec<T>.
unsafe impl<T: Zeroable + Send> Send for Buf<T> {}
// SAFETY: shared access is read-only, like &[T].
unsafe impl<T: Zeroable + Sync> Sync for Buf<T> {}

const HUGE: usize = 2 << 20;

impl<T: Zeroable> Buf<T> {
    fn layout(n: usize) -> Option<std::alloc::Layout> {
        std::alloc::Layout::array::<T>(n).ok()
    }

    fn empty() -> Self {
        Buf { ptr: std::ptr::NonNull::dangling(), n: 0, mapped: false }
    }

    /// A zeroed array of `n` values, or None when the memory is not there.
    fn try_zeroed(n: usize) -> Option<Self> {
        if n == 0 {
            return Some(Self::empty());
        }
        let layout = Self::layout(n)?;
        #[cfg(target_os = "linux")]
        if layout.size() >= HUGE {
            // a fresh private anonymous mapping: zero-filled by the kernel,
            // page aligned, so aligned for T; all-zero bytes are a valid T
            let p = map_aligned(layout.size())?;
            // the mapping is whole huge pages: use all of it
            let n = map_len(layout.size())? / std::mem::size_of::<T>();
            return Some(Buf { ptr: p.cast(), n, mapped: true });
        }
        // SAFETY: the layout has a non-zero size; all-zero bytes are a valid T.
        let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
        Some(Buf { ptr: std::ptr::NonNull::new(p)?, n, mapped: false })
    }

    /// Write to every page from value `from` on once, so that fresh pages
    /// are faulted in by a write: a read first (a probe) would map the
    /// shared zero page, and the first write would then copy it and flush
    /// the other threads' TLBs.
    fn touch(&mut self, from: usize) {
        let step = (4096 / std::mem::size_of::<T>()).max(1);
        let p = self.ptr.as_ptr() as *mut u8;
        let mut i = from;
        while i < self.n {
            // SAFETY: i < n, in bounds; writing a zero byte over a zero byte
            unsafe { std::ptr::write_volatile(p.add(i * std::mem::size_of::<T>()), 0u8) };
            i += step;
        }
    }

    /// Grow to `n` values (the first `self.n` kept, the rest zero); None,
    /// with the array unchanged, when the memory is not there.
    fn try_grow(&mut self, n: usize) -> Option<()> {
        if n <= self.n {
            return Some(());
        }
        #[cfg(target_os = "linux")]
        if self.mapped {
            let (old, new) = (Self::layout(self.n)?.size(), Self::layout(n)?.size());
            self.ptr = remap_aligned(self.ptr.cast(), old, new)?.cast();
            let n = map_len(new)? / std::mem::size_of::<T>();
            self.n = n;
            return Some(());
        }
        let mut b = Self::try_zeroed(n)?;
        b[..self.n].copy_from_slice(self);
        *self = b;
        Some(())
    }
}

/// Bytes mapped for an array of `size` bytes (at least 2 MiB): whole huge
/// pages.
#[cfg(target_os = "linux")]
fn map_len(size: usize) -> Option<usize> {
    size.checked_next_multiple_of(HUGE)
}

/// `size` bytes of fresh zeroed memory at a 2 MiB-aligned address, asking
/// for transparent huge pages: a huge page needs an aligned 2 MiB range of
/// the mapping, and the kernel aligns only some mappings itself.
#[cfg(target_os = "linux")]
fn map_aligned(size: usize) -> Option<std::ptr::NonNull<u8>> {
    let size = map_len(size)?;
    let span = size.checked_add(HUGE)?;
    // SAFETY: a fresh private anonymous mapping of `span` bytes; the parts
    // before and after the aligned `size` bytes are unmapped again (page
    // aligned, inside the mapping).
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = p as usize;
        let a = start.next_multiple_of(HUGE);
        if a > start {
            libc::munmap(p, a - start);
        }
        let tail = start + span - (a + size);
        if tail > 0 {
            libc::munmap((a + size) as *mut libc::c_void, tail);
        }
        // a hint: failure only means small pages
        libc::madvise(a as *mut libc::c_void, size, libc::MADV_HUGEPAGE);
        std::ptr::NonNull::new(a as *mut u8)
    }
}

/// Grow the mapping at `p` (from [`map_aligned`]) from `old` to `new`
/// bytes, keeping its pages (moved, not copied) and its 2 MiB alignment:
/// in place where the addresses after it are free, otherwise moved to a
/// fresh aligned range. None, with the old mapping untouched, when the
/// memory is not there.
#[cfg(target_os = "linux")]
fn remap_aligned(p: std::ptr::NonNull<u8>, old: usize, new: usize) -> Option<std::ptr::NonNull<u8>> {
    let (old, new) = (map_len(old)?, map_len(new)?);
    if new == old {
        return Some(p);
    }
    // SAFETY: p/old describe a mapping of ours; mremap either grows it in
    // place, or moves its pages over the fresh range `dst` (which it
    // replaces), or fails and leaves both as they were.
    unsafe {
        let q = libc::mremap(p.as_ptr().cast(), old, new, 0);
        if q != libc::MAP_FAILED {
            libc::madvise(q, new, libc::MADV_HUGEPAGE);
            return std::ptr::NonNull::new(q.cast());
        }
        let dst = map_aligned(new)?;
        let q = libc::mremap(
            p.as_ptr().cast(),
            old,
            new,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst.as_ptr() as *mut libc::c_void,
        );
        if q == libc::MAP_FAILED {
            libc::munmap(dst.as_ptr().cast(), new);
            return None;
        }
        libc::madvise(q, new, libc::MADV_HUGEPAGE);
        std::ptr::NonNull::new(q.cast())
    }
}

impl<T: Zeroable> Default for Buf<T> {
    fn default() -> Self {
        Self::empty()
    }
}

impl<T: Zeroable> Drop for Buf<T> {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        let layout = Self::layout(self.n).expect("the layout was valid at allocation");
        // SAFETY: ptr/n/mapped describe the allocation made in `try_zeroed`/`try_grow`.
        unsafe {
            #[cfg(target_os = "linux")]
            if self.mapped {
                libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, map_len(layout.size()).expect("mapped"));
                return;
            }
            std::alloc::dealloc(self.ptr.as_ptr() as *mut u8, layout);
        }
    }
}

impl<T: Zeroable> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr points to n initialised values owned by self (or is
        // dangling with n = 0).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.n) }
    }
}

impl<T: Zeroable> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.n) }
    }
}

impl<T: Zeroable> std::fmt::Debug for Buf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buf({} x {} bytes)", self.n, std::mem::size_of::<T>())
    }
}

/// The prompts of one shard: their records, dense in insertion order, and
/// an open-addressing (linear probing) index over them.
///
/// An index entry is `tag << 32 | (record + 1)`, 0 when empty, where the
/// tag is the 32 hash bits after the shard bits and the home entry is the
/// top `bits` bits of the tag. A probe compares tags and reads a record
/// only when they match, so inserting a new prompt touches one index line
/// and appends its record; growing puts the index entries back at their
/// homes in a larger index (from the tags alone: no record is read), in the
/// same memory extended in place once the index is a mapping, and extends
/// the records without copying them. Eight entries share a cache line, so
/// probes stay short, and the index and the records together take about
/// half the memory of records kept in the table itself at the same load.
/// [`Table::merge_runs`] prefetches the index line of a run, and then its
/// record, a few runs ahead, so that cache misses overlap.
#[derive(Debug)]
struct Table {
    index: Buf<u64>,
    bits: u32,
    /// Records the table holds before it grows (load factor 0.7); the
    /// records array has this capacity.
    limit: usize,
    recs: Buf<Slot>,
    len: usize,
    /// Bumped whenever the index is rebuilt (entries move).
    gen: u32,
}

/// Key hash: an xorshift and a multiplication by an odd constant, each
/// invertible, so distinct keys have distinct hashes (the summary orders
/// prompts by it).
#[inline(always)]
fn hash(k: u64) -> u64 {
    (k ^ (k >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The 32 hash bits after the shard bits (the shard bits are the same for
/// every key of a table).
#[inline(always)]
fn tag_of(h: u64) -> u64 {
    (h << SHARD_BITS) >> 32
}

/// Home entry of a tag in an index of `2^bits` entries: its top bits.
#[inline(always)]
fn home_of(tag: u64, bits: u32) -> usize {
    (tag >> (32 - bits)) as usize
}

/// Most keys an index of `n` entries holds before it grows (load factor 0.7).
fn load_limit(n: usize) -> usize {
    n / 10 * 7 + (n % 10) * 7 / 10
}

thread_local! {
    /// The entries of an index that grows in place, while they are put back.
    static TAKEN: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a probe of the index found for a run.
#[derive(Debug, Clone, Copy, Default)]
enum Probe {
    #[default]
    None,
    /// The first record whose tag matches (its key may still differ).
    Record(usize),
    /// The empty entry that ended the probe.
    Empty(usize),
}

/// A run in [`Table::merge_runs`]'s pipeline.
#[derive(Debug, Clone, Copy, Default)]
struct Pending {
    run: Slot,
    h: u64,
    at: Probe,
    /// The index generation the probe saw ([`Table::gen`]).
    gen: u32,
}

/// The record an index entry points to.
#[inline(always)]
fn record_of(e: u64) -> usize {
    (e as u32 - 1) as usize
}

/// Largest index of one table: home entries come from the 32 tag bits.
const MAX_BITS: u32 = 32;

impl Default for Table {
    fn default() -> Self {
        let mut t = Table { index: Buf::empty(), bits: 0, limit: 0, recs: Buf::empty(), len: 0, gen: 0 };
        if t.try_reserve(load_limit(16)).is_none() {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u64; 16]>());
        }
        t
    }
}

impl Clone for Table {
    fn clone(&self) -> Self {
        fn oom<T>() -> T {
            std::alloc::handle_alloc_error(std::alloc::Layout::new::<Slot>())
        }
        let mut index = Buf::<u64>::try_zeroed(self.index.len()).unwrap_or_else(oom);
        index.copy_from_slice(&self.index);
        let mut recs = Buf::<Slot>::try_zeroed(self.limit).unwrap_or_else(oom);
        recs[..self.len].copy_from_slice(&self.recs[..self.len]);
        Table { index, bits: self.bits, limit: self.limit, recs, len: self.len, gen: self.gen }
    }
}

impl Table {
    /// Make room for `additional` more keys; None (and the table
    /// unchanged) when the memory for the larger table is not there.
    fn try_reserve(&mut self, additional: usize) -> Option<()> {
        let need = self.len.checked_add(additional)?;
        if need <= self.limit {
            return Some(());
        }
        let mut bits = self.bits.max(4);
        while need.checked_mul(10)? > (1usize << bits) * 7 {
            bits += 1;
            if bits > MAX_BITS || bits >= usize::BITS - 4 {
                return None;
            }
        }
        let n = 1usize << bits;
        let limit = load_limit(n);
        // records first: if the index then cannot grow, the table only has
        // more room for records than it uses
        self.recs.try_grow(limit)?;
        if self.index.mapped {
            // in place: the index keeps its pages and only the new part is
            // fresh; its entries are taken out and put back at their homes
            // in the larger index
            let old = self.index.len();
            self.index.try_grow(n)?;
            TAKEN.with(|t| {
                let mut taken = t.take();
                taken.clear();
                taken.extend(self.index[..old].iter().copied().filter(|&e| e != 0));
                self.index[..old].fill(0);
                self.index.touch(old);
                self.bits = bits;
                self.put_back(taken.iter().copied());
                // kept for this thread's next growth unless it is large
                if taken.capacity() * 8 <= HUGE {
                    t.replace(taken);
                }
            });
        } else {
            let mut index = Buf::<u64>::try_zeroed(n)?;
            index.touch(0);
            std::mem::swap(&mut self.index, &mut index);
            self.bits = bits;
            self.put_back(index.iter().copied().filter(|&e| e != 0));
        }
        self.limit = limit;
        self.gen = self.gen.wrapping_add(1);
        Some(())
    }

    /// The index entries in the order of their records' key hashes. The
    /// index is nearly in that order already: an entry sits at its home
    /// (the top bits of its tag) or a little after it, in the run of full
    /// entries that holds its home, so the entries are taken in address
    /// order (those at the start whose run wrapped round from the end go
    /// last) and an insertion sort puts the few that are out of place right
    /// in time linear in the entries and their displacements. Ties of the
    /// 32-bit tag (rare) are broken by the full hash.
    fn entries_in_hash_order(&self) -> Vec<u64> {
        let n = self.index.len();
        let mut v = Vec::with_capacity(self.len);
        // an index always has an empty entry (load <= 0.7)
        let gap = self.index.iter().position(|&e| e == 0).unwrap_or(n);
        let wrapped = |i: usize, e: u64| self.home(e >> 32) > i;
        v.extend(self.index[..gap].iter().enumerate().filter(|&(i, &e)| e != 0 && !wrapped(i, e)).map(|(_, &e)| e));
        v.extend(self.index[gap..].iter().copied().filter(|&e| e != 0));
        v.extend(self.index[..gap].iter().enumerate().filter(|&(i, &e)| e != 0 && wrapped(i, e)).map(|(_, &e)| e));
        let before = |a: u64, b: u64| {
            let (ta, tb) = (a >> 32, b >> 32);
            ta < tb || (ta == tb && hash(self.recs[record_of(a)].key) < hash(self.recs[record_of(b)].key))
        };
        for j in 1..v.len() {
            let e = v[j];
            let mut i = j;
            while i > 0 && before(e, v[i - 1]) {
                v[i] = v[i - 1];
                i -= 1;
            }
            v[i] = e;
        }
        v
    }

    /// Call `f` with every record's statistics in the order of its key hash
    /// (the records are read at random: they are prefetched a little ahead).
    fn for_each_in_hash_order(&self, mut f: impl FnMut(&Stats)) {
        let order = self.entries_in_hash_order();
        for (i, &e) in order.iter().enumerate() {
            if let Some(&a) = order.get(i + PREFETCH) {
                prefetch(self.recs.as_ptr().wrapping_add(record_of(a)));
            }
            f(&self.recs[record_of(e)].st);
        }
    }

    /// Put index entries into this index, which has none of their tags.
    fn put_back(&mut self, entries: impl Iterator<Item = u64>) {
        let mask = self.index.len() - 1;
        for e in entries {
            let mut i = home_of(e >> 32, self.bits);
            while self.index[i] != 0 {
                i = (i + 1) & mask;
            }
            self.index[i] = e;
        }
    }

    fn reserve(&mut self, additional: usize) {
        if self.try_reserve(additional).is_none() {
            panic!("out of memory growing the variance table past {} prompts", self.len);
        }
    }

    /// Home entry of a tag.
    #[inline(always)]
    fn home(&self, tag: u64) -> usize {
        home_of(tag, self.bits)
    }

    /// The record of `key`, or the empty index entry where it would go.
    #[inline(always)]
    fn find(&self, key: u64, h: u64) -> std::result::Result<usize, usize> {
        let mask = self.index.len() - 1;
        let tag = tag_of(h);
        let mut i = self.home(tag);
        loop {
            let e = self.index[i];
            if e == 0 {
                return Err(i);
            }
            if e >> 32 == tag {
                let r = record_of(e);
                if self.recs[r].key == key {
                    return Ok(r);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// Merge `st` into key's record (inserting it); true when the key was
    /// already present. Capacity must be reserved.
    #[inline(always)]
    fn merge_in(&mut self, key: u64, h: u64, st: &Stats) -> bool {
        match self.find(key, h) {
            Ok(r) => {
                self.recs[r].st.merge(st);
                true
            }
            Err(i) => {
                self.insert_at(i, key, h, st);
                false
            }
        }
    }

    /// Append a new record and point the empty index entry `i` at it.
    #[inline(always)]
    fn insert_at(&mut self, i: usize, key: u64, h: u64, st: &Stats) {
        self.recs[self.len] = Slot { key, st: *st };
        self.len += 1;
        self.index[i] = tag_of(h) << 32 | self.len as u64;
    }

    /// Merge one key's statistics (growing as needed); true when the key
    /// was present. (Updates merge runs through [`Table::merge_runs`].)
    #[cfg(test)]
    fn upsert(&mut self, key: u64, h: u64, st: &Stats) -> bool {
        if self.len >= self.limit {
            self.reserve(1);
        }
        self.merge_in(key, h, st)
    }

    /// Hint the CPU to fetch the home index line of hash `h`.
    #[inline(always)]
    fn prefetch_home(&self, h: u64) {
        let p = self.index.as_ptr().wrapping_add(self.home(tag_of(h)));
        prefetch(p);
        // at loads up to 0.7 a probe often runs into the next line
        prefetch(p.wrapping_add(8));
    }

    fn get(&self, key: u64) -> Option<&Stats> {
        self.find(key, hash(key)).ok().map(|r| &self.recs[r].st)
    }

    fn records(&self) -> &[Slot] {
        &self.recs[..self.len]
    }

    /// Forget every prompt, keeping the capacity.
    fn clear(&mut self) {
        self.index.fill(0);
        self.len = 0;
    }

    /// Merge runs in order, in a pipeline over a small ring of runs: the
    /// index line of a run is prefetched when it enters, its index is probed
    /// `PREFETCH` runs later (the line is in cache by then; a record found
    /// is prefetched), and it is merged `PREFETCH` runs after that, from
    /// what the probe found, so that each run is probed once and cache
    /// misses overlap. A probe's answer is checked when it is used: a record
    /// found must have the run's key (records never move), and an empty
    /// entry must still be empty in the same index (entries only fill up, so
    /// the key cannot have gone anywhere else); otherwise the run is merged
    /// by a full probe.
    fn merge_runs<'a>(&mut self, runs: impl Iterator<Item = &'a Slot>) {
        const N: usize = 2 * PREFETCH;
        let mut ring = [Pending::default(); N];
        let mut f = 0usize;
        for run in runs {
            // run f - N leaves the ring, run f takes its place
            if f >= N {
                self.commit(&ring[f % N]);
            }
            let h = hash(run.key);
            self.prefetch_home(h);
            ring[f % N] = Pending { run: *run, h, at: Probe::None, gen: 0 };
            if f >= PREFETCH {
                self.probe(&mut ring[(f - PREFETCH) % N]);
            }
            f += 1;
        }
        for k in f.saturating_sub(PREFETCH)..f {
            self.probe(&mut ring[k % N]);
        }
        for k in f.saturating_sub(N)..f {
            self.commit(&ring[k % N]);
        }
    }

    /// Look up a pending run (its index line should be in cache).
    #[inline(always)]
    fn probe(&self, p: &mut Pending) {
        let mask = self.index.len() - 1;
        let tag = tag_of(p.h);
        let mut i = self.home(tag);
        p.gen = self.gen;
        loop {
            let e = self.index[i];
            if e == 0 {
                p.at = Probe::Empty(i);
                return;
            }
            if e >> 32 == tag {
                let r = record_of(e);
                prefetch(self.recs.as_ptr().wrapping_add(r));
                p.at = Probe::Record(r);
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Merge a pending run, from its probe's answer where that still holds.
    #[inline(always)]
    fn commit(&mut self, p: &Pending) {
        if self.len >= self.limit {
            self.reserve(1);
        }
        let (key, st) = (p.run.key, &p.run.st);
        match p.at {
            Probe::Record(r) if self.recs[r].key == key => self.recs[r].st.merge(st),
            Probe::Empty(i) if p.gen == self.gen && self.index[i] == 0 => self.insert_at(i, key, p.h, st),
            _ => {
                self.merge_in(key, p.h, st);
            }
        }
    }
}

/// Hint the CPU to fetch the cache line at `p` (no effect on results).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint; it never faults, even on a bad address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p as *const i8, std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Rows per block of the run scan: run starts of a block are found first
/// (vector compares of neighbouring keys), then each run is folded.
const BLOCK: usize = 1 << 12;
/// How many runs ahead a run's record is prefetched (its index line twice
/// as far ahead).
const PREFETCH: usize = 32;
/// The table is split into `SHARDS` independent tables by the top
/// `SHARD_BITS` bits of the key hash, so that one update merges into all
/// shards in parallel. Every key lives in one shard and its runs are merged
/// there in row order, so the statistics do not depend on the thread count.
const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;
/// Rows per stretch of a large first update (a multiple of `BLOCK`, so
/// the runs are cut where a single pass cuts them).
pub const STRETCH: usize = 1 << 20;
/// Updates with fewer rows are scanned and merged on the calling thread.
const PAR_ROWS: usize = 1 << 16;

#[inline(always)]
fn shard_of(h: u64) -> usize {
    (h >> (64 - SHARD_BITS)) as usize
}

/// Runs of one stretch of rows, one list per shard, each in row order.
type Buckets = Vec<Vec<Slot>>;

fn buckets() -> Buckets {
    vec![Vec::new(); SHARDS]
}

/// Where the scan puts the runs it finds, each with its id and statistics.
trait RunSink<K> {
    fn put(&mut self, id: K, st: Stats);
}

impl<K: PromptIds> RunSink<K> for Buckets {
    #[inline(always)]
    fn put(&mut self, id: K, st: Stats) {
        let key = id.key();
        self[shard_of(hash(key))].push(Slot { key, st });
    }
}

/// The runs of a stretch of rows in row order, and whether their ids never
/// decrease (then no prompt can come back in the stretch: the only runs
/// of one id are its pieces that the scan cut at block boundaries, next to
/// each other).
#[derive(Debug, Clone, Default)]
struct Ordered {
    runs: Vec<Slot>,
    /// Order ([`PromptIds::order`]) of the first and of the last run's id.
    first: u64,
    last: u64,
    sorted: bool,
    /// Number of distinct ids (groups of neighbouring runs of one id).
    groups: usize,
    /// Number of runs of the first id.
    lead: usize,
}

impl Ordered {
    fn clear(&mut self) {
        self.runs.clear();
        self.sorted = true;
        self.groups = 0;
        self.lead = 0;
    }
}

impl<K: PromptIds> RunSink<K> for Ordered {
    #[inline(always)]
    fn put(&mut self, id: K, st: Stats) {
        let o = id.order();
        if self.runs.is_empty() {
            self.first = o;
            self.groups = 1;
            self.lead = 1;
        } else if o == self.last {
            self.lead += (self.groups == 1) as usize;
        } else {
            self.sorted &= o > self.last;
            self.groups += 1;
        }
        self.last = o;
        self.runs.push(Slot { key: id.key(), st });
    }
}

/// Statistics of a run of finite values by the corrected two-pass
/// algorithm: `mean = sum / n`, then `M2 = sum d^2 - (sum d)^2 / n` with
/// `d = x - mean` (the second term removes the rounding error of the
/// mean). Sums use 8 independent partial sums, so the loops vectorise.
/// Returns the plain sum as well: it is non-finite when a value is, and then
/// the statistics are not to be used.
#[inline(always)]
fn run_stats(x: &[f64]) -> (f64, Stats) {
    let n = x.len();
    if n == 1 {
        return (x[0], Stats { count: 1, mean: x[0], m2: 0.0 });
    }
    let ch = x.chunks_exact(8);
    let rem = ch.remainder();
    let mut a = [0.0f64; 8];
    for c in ch.clone() {
        for l in 0..8 {
            a[l] += c[l];
        }
    }
    for (l, v) in rem.iter().enumerate() {
        a[l] += v;
    }
    let sum = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    let nf = n as f64;
    let mean = sum / nf;
    let (mut q, mut c1) = ([0.0f64; 8], [0.0f64; 8]);
    for c in ch {
        for l in 0..8 {
            let d = c[l] - mean;
            q[l] += d * d;
            c1[l] += d;
        }
    }
    for (l, v) in rem.iter().enumerate() {
        let d = v - mean;
        q[l] += d * d;
        c1[l] += d;
    }
    let q = ((q[0] + q[4]) + (q[1] + q[5])) + ((q[2] + q[6]) + (q[3] + q[7]));
    let c1 = ((c1[0] + c1[4]) + (c1[1] + c1[5])) + ((c1[2] + c1[6]) + (c1[3] + c1[7]));
    let m2 = (q - c1 * c1 / nf).max(0.0);
    // a non-finite M2 (overflow of the squares) is reported like a bad sum
    (if m2.is_finite() { sum } else { f64::INFINITY }, Stats { count: n as u64, mean, m2 })
}

/// Prompt ids as the scan reads them: 64-bit keys as they are, or integer
/// ids, keyed once per run by [`crate::sampling::key_of_int`] (the keys the
/// rest of the library gives integer ids), so that a caller with integer
/// ids needs no pass of its own to key them.
pub trait PromptIds: Copy + PartialEq + Send + Sync {
    /// Which kind of id this is (ids of different kinds are not compared).
    const KIND: IdKind;
    /// The 64-bit key the accumulator files the id under.
    fn key(self) -> u64;
    /// The id's place in the ids' natural order, as an unsigned integer
    /// (distinct ids, distinct places): what a stream of ids that never
    /// decrease is checked by.
    fn order(self) -> u64;
}

/// The kinds of [`PromptIds`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdKind {
    /// 64-bit keys, taken as they are.
    #[default]
    Key,
    /// Signed integer ids.
    Int,
}

impl PromptIds for u64 {
    const KIND: IdKind = IdKind::Key;
    #[inline(always)]
    fn key(self) -> u64 {
        self
    }
    #[inline(always)]
    fn order(self) -> u64 {
        self
    }
}

impl PromptIds for i64 {
    const KIND: IdKind = IdKind::Int;
    #[inline(always)]
    fn key(self) -> u64 {
        crate::sampling::key_of_int(self)
    }
    #[inline(always)]
    fn order(self) -> u64 {
        (self as u64) ^ (1 << 63)
    }
}

/// Rows ahead of the scan that its two input streams are prefetched (the
/// run loop's data-dependent branches otherwise stall the hardware
/// prefetcher's stream at every page).
const SCAN_AHEAD: usize = 1024;

/// Prefetch the cache lines of `v` from row `from` up to row `to` (clipped
/// to the slice); returns the new high-water mark.
#[inline(always)]
fn prefetch_ahead<T>(v: &[T], from: usize, to: usize) -> usize {
    let to = to.min(v.len());
    let step = 64 / std::mem::size_of::<T>();
    let mut r = from;
    while r < to {
        prefetch(v.as_ptr().wrapping_add(r));
        r += step;
    }
    r.max(from)
}

/// Split `keys`/`x` into runs of equal keys and append each run's key and
/// statistics to `out`. Stops at the first run whose values are not all
/// finite (or whose statistics overflow) and returns the index of its first
/// row. Runs are cut at block boundaries (which only changes rounding).
#[inline(always)]
fn scan_runs<K: PromptIds, S: RunSink<K>>(keys: &[K], x: &[f64], out: &mut S) -> Option<usize> {
    let mut starts = [0u32; BLOCK + 1];
    let mut base = 0;
    // rows up to which the keys and the losses have been prefetched
    let (mut kpf, mut xpf) = (0usize, 0usize);
    for (kb, xb) in keys.chunks(BLOCK).zip(x.chunks(BLOCK)) {
        let n = kb.len();
        // run starts: row 0, and every row whose key differs from the previous
        starts[0] = 0;
        let mut ns = 1;
        let mut i = 1;
        while i < n {
            kpf = prefetch_ahead(keys, kpf, base + i + SCAN_AHEAD);
            let w = (n - i).min(64);
            let mut m = 0u64;
            if w == 64 {
                let (a, b) = (&kb[i..i + 64], &kb[i - 1..i + 63]);
                for l in 0..64 {
                    m |= ((a[l] != b[l]) as u64) << l;
                }
            } else {
                for l in 0..w {
                    m |= ((kb[i + l] != kb[i + l - 1]) as u64) << l;
                }
            }
            while m != 0 {
                starts[ns] = (i + m.trailing_zeros() as usize) as u32;
                ns += 1;
                m &= m - 1;
            }
            i += w;
        }
        starts[ns] = n as u32;
        for r in 0..ns {
            let (s, e) = (starts[r] as usize, starts[r + 1] as usize);
            xpf = prefetch_ahead(x, xpf, base + e + SCAN_AHEAD);
            let (sum, st) = run_stats(&xb[s..e]);
            if !sum.is_finite() {
                return Some(base + s);
            }
            out.put(kb[s], st);
        }
        base += n;
    }
    None
}

/// [`scan_runs`] compiled for AVX2 (same operations, so the same bits).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn scan_runs_avx2<K: PromptIds, S: RunSink<K>>(keys: &[K], x: &[f64], out: &mut S) -> Option<usize> {
    scan_runs(keys, x, out)
}

fn scan_runs_dispatch<K: PromptIds, S: RunSink<K>>(keys: &[K], x: &[f64], out: &mut S) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is available (checked just above).
            return unsafe { scan_runs_avx2(keys, x, out) };
        }
    }
    scan_runs(keys, x, out)
}

/// Scan the rows into `parts`, one sink per stretch of `per` rows (in
/// parallel when `parallel`); the first row of the first run that is not
/// finite, if any ([`scan_runs`]).
fn scan_parts<K: PromptIds, S: RunSink<K> + Send>(
    keys: &[K],
    losses: &[f64],
    parts: &mut [S],
    per: usize,
    parallel: bool,
) -> Option<usize> {
    let n = keys.len();
    let scan = |(i, out): (usize, &mut S)| {
        let (s, e) = ((i * per).min(n), ((i + 1) * per).min(n));
        scan_runs_dispatch(&keys[s..e], &losses[s..e], out).map(|r| s + r)
    };
    if parallel {
        use rayon::prelude::*;
        parts.par_iter_mut().enumerate().map(scan).collect::<Vec<_>>().into_iter().flatten().min()
    } else {
        parts.iter_mut().enumerate().filter_map(scan).min()
    }
}

/// Number of runs of equal neighbouring keys, counted in parallel.
fn count_runs<K: PromptIds>(keys: &[K]) -> usize {
    use rayon::prelude::*;
    if keys.is_empty() {
        return 0;
    }
    // pieces overlap by one key, so every neighbouring pair is compared once
    let starts: usize = (0..keys.len().div_ceil(PAR_ROWS))
        .into_par_iter()
        .map(|c| {
            let s = (c * PAR_ROWS).max(1);
            let e = ((c + 1) * PAR_ROWS).min(keys.len());
            keys[s - 1..e - 1].iter().zip(&keys[s..e]).map(|(a, b)| (a != b) as usize).sum::<usize>()
        })
        .sum();
    1 + starts
}

/// Scratch lists of runs kept between updates (not part of the state): one
/// [`Buckets`] (or one [`Ordered`] list) per stretch of rows scanned in
/// parallel.
#[derive(Default)]
struct Scratch {
    buckets: Vec<Buckets>,
    ordered: Vec<Ordered>,
}

impl Clone for Scratch {
    fn clone(&self) -> Self {
        Scratch::default()
    }
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Scratch")
    }
}

/// The prompts of a stream of grouped rows, with no index: records
/// appended in row order.
///
/// While the ids have never decreased (`sorted`), the stream cannot bring a
/// prompt back (its id would have to decrease): each new run is a new
/// prompt or the rest of the last one, and each record is a prompt of its
/// own. After that, the records are the runs as they come, and a prompt
/// that comes back has several, which every read merges in row order (the
/// order the tables merge them in, so the same bits). A sketch of the
/// number of distinct prompts tells when the runs are too many for the
/// prompts (rows that are not grouped): the tables are built then.
#[derive(Debug)]
struct Log {
    recs: Buf<Slot>,
    len: usize,
    sorted: bool,
    kind: IdKind,
    /// Order ([`PromptIds::order`]) of the first and of the last record's id
    /// (while sorted).
    first: u64,
    last: u64,
    /// Runs of one id next to each other, counted since the log was
    /// unsorted (with the records before it), and a sketch of the distinct
    /// keys among them.
    groups: usize,
    sketch: Option<Box<Sketch>>,
    /// The records in hash order, once asked for (cleared when the log grows).
    order: std::sync::OnceLock<HashOrder>,
}

impl Default for Log {
    fn default() -> Self {
        Log {
            recs: Buf::empty(),
            len: 0,
            sorted: true,
            kind: IdKind::Key,
            first: 0,
            last: 0,
            groups: 0,
            sketch: None,
            order: Default::default(),
        }
    }
}

/// The records of a log in the order the tables visit their prompts (key
/// hash): per shard, the records' positions sorted by hash (the records of
/// one key next to each other, in row order).
#[derive(Debug)]
struct HashOrder {
    /// Shard `s` has `idx[at[s]..at[s + 1]]`.
    at: Vec<usize>,
    idx: Vec<u32>,
    /// Distinct keys.
    distinct: usize,
}

/// HyperLogLog sketch of a set of keys: 2^14 registers, a relative error of
/// about 0.8%. Only decides when a log gives way to the tables.
#[derive(Debug, Clone)]
struct Sketch([u8; 1 << SKETCH_BITS]);

const SKETCH_BITS: u32 = 14;

impl Sketch {
    fn new() -> Box<Sketch> {
        Box::new(Sketch([0; 1 << SKETCH_BITS]))
    }

    #[inline(always)]
    fn add(&mut self, key: u64) {
        // splitmix64's finaliser: the table hash is not random enough in
        // its low bits for the ranks
        let mut z = key;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let i = (z >> (64 - SKETCH_BITS)) as usize;
        let rank = ((z << SKETCH_BITS) | (1 << (SKETCH_BITS - 1))).leading_zeros() as u8 + 1;
        self.0[i] = self.0[i].max(rank);
    }

    fn merge(&mut self, o: &Sketch) {
        self.0.iter_mut().zip(&o.0).for_each(|(a, b)| *a = (*a).max(*b));
    }

    /// Estimated number of distinct keys added.
    fn estimate(&self) -> f64 {
        let m = (1u64 << SKETCH_BITS) as f64;
        // 2^-r by table (ranks are at most 64 - SKETCH_BITS + 1)
        let pow: [f64; 66] = std::array::from_fn(|r| (-(r as f64)).exp2());
        let z: f64 = self.0.iter().map(|&r| pow[r as usize]).sum();
        let e = 0.7213 / (1.0 + 1.079 / m) * m * m / z;
        let zeros = self.0.iter().filter(|&&r| r == 0).count();
        if e <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            e
        }
    }
}

impl Clone for Log {
    fn clone(&self) -> Self {
        let mut recs = Buf::<Slot>::try_zeroed(self.len)
            .unwrap_or_else(|| std::alloc::handle_alloc_error(std::alloc::Layout::new::<Slot>()));
        recs[..self.len].copy_from_slice(self.records());
        Log {
            recs,
            len: self.len,
            sorted: self.sorted,
            kind: self.kind,
            first: self.first,
            last: self.last,
            groups: self.groups,
            sketch: self.sketch.clone(),
            order: Default::default(),
        }
    }
}

impl Log {
    fn records(&self) -> &[Slot] {
        &self.recs[..self.len]
    }

    /// The records' positions in hash order, shard by shard (sorted once,
    /// in parallel, and kept until the log grows): the positions are
    /// scattered to their shards in pieces, then each shard is put in order
    /// in a scratch list of (hash, position) by a counting sort on the 16
    /// hash bits after the shard bits (the hashes are uniform, so a bucket
    /// holds one or two records) and an insertion sort by the full hash.
    ///
    /// Callers that read it from parallel jobs ask for it first, outside
    /// them (see [`Accumulator::used_stats`]).
    fn hash_order(&self) -> &HashOrder {
        use rayon::prelude::*;
        const PIECE: usize = 1 << 16;
        const SUB: u32 = 16;
        self.order.get_or_init(|| {
            let recs = self.records();
            // (a log holds at most u32::MAX records: see update_log and merge)
            // records per shard of each piece
            let hist: Vec<[usize; SHARDS]> = recs
                .par_chunks(PIECE)
                .map(|c| {
                    let mut h = [0usize; SHARDS];
                    c.iter().for_each(|r| h[shard_of(hash(r.key))] += 1);
                    h
                })
                .collect();
            let mut at = vec![0usize; SHARDS + 1];
            for s in 0..SHARDS {
                at[s + 1] = at[s] + hist.iter().map(|h| h[s]).sum::<usize>();
            }
            // every piece's part of every shard: disjoint slices, in shard
            // order then piece order
            let mut idx = vec![0u32; recs.len()];
            let mut slots: Vec<Vec<&mut [u32]>> = (0..hist.len()).map(|_| Vec::with_capacity(SHARDS)).collect();
            let mut rest = &mut idx[..];
            for s in 0..SHARDS {
                for (p, h) in hist.iter().enumerate() {
                    let (a, b) = std::mem::take(&mut rest).split_at_mut(h[s]);
                    slots[p].push(a);
                    rest = b;
                }
            }
            slots.into_par_iter().enumerate().for_each(|(p, mut out)| {
                let mut fill = [0usize; SHARDS];
                for (i, r) in recs[p * PIECE..((p + 1) * PIECE).min(recs.len())].iter().enumerate() {
                    let s = shard_of(hash(r.key));
                    out[s][fill[s]] = (p * PIECE + i) as u32;
                    fill[s] += 1;
                }
            });
            let mut parts = Vec::with_capacity(SHARDS);
            let mut rest = &mut idx[..];
            for s in 0..SHARDS {
                let (a, b) = std::mem::take(&mut rest).split_at_mut(at[s + 1] - at[s]);
                parts.push(a);
                rest = b;
            }
            // (the scratch of a thread is reused from shard to shard)
            let init = || (Vec::<u32>::new(), Vec::<(u64, u32)>::new(), Vec::<(u64, u32)>::new());
            let distinct: usize = parts
                .into_par_iter()
                .map_init(init, |(count, pairs, tmp), idx| {
                    let sub = |h: u64| ((h << SHARD_BITS) >> (64 - SUB)) as usize;
                    // the positions are increasing: the records are read in
                    // address order
                    pairs.clear();
                    for (j, &i) in idx.iter().enumerate() {
                        if let Some(&n) = idx.get(j + PREFETCH) {
                            prefetch(recs.as_ptr().wrapping_add(n as usize));
                        }
                        pairs.push((hash(recs[i as usize].key), i));
                    }
                    count.clear();
                    count.resize((1 << SUB) + 1, 0);
                    pairs.iter().for_each(|e| count[sub(e.0) + 1] += 1);
                    for i in 0..1 << SUB {
                        count[i + 1] += count[i];
                    }
                    tmp.clear();
                    tmp.resize(pairs.len(), (0, 0));
                    for e in pairs.iter() {
                        let b = &mut count[sub(e.0)];
                        tmp[*b as usize] = *e;
                        *b += 1;
                    }
                    for j in 1..tmp.len() {
                        let e = tmp[j];
                        let mut i = j;
                        while i > 0 && e.0 < tmp[i - 1].0 {
                            tmp[i] = tmp[i - 1];
                            i -= 1;
                        }
                        tmp[i] = e;
                    }
                    idx.iter_mut().zip(tmp.iter()).for_each(|(d, e)| *d = e.1);
                    // (the hash is a bijection: equal hashes, equal keys)
                    tmp.windows(2).filter(|w| w[0].0 != w[1].0).count() + (!tmp.is_empty()) as usize
                })
                .sum();
            HashOrder { at, idx, distinct }
        })
    }

    /// Call `f` with the key and statistics of every prompt of shard `s`
    /// in hash order (a prompt's records merged in row order).
    fn for_each_in_shard(&self, s: usize, mut f: impl FnMut(u64, &Stats)) {
        let (o, recs) = (self.hash_order(), self.records());
        let idx = &o.idx[o.at[s]..o.at[s + 1]];
        let mut j = 0;
        while j < idx.len() {
            if let Some(&n) = idx.get(j + PREFETCH) {
                prefetch(recs.as_ptr().wrapping_add(n as usize));
            }
            let r = &recs[idx[j] as usize];
            j += 1;
            if self.sorted || idx.get(j).is_none_or(|&n| recs[n as usize].key != r.key) {
                f(r.key, &r.st);
                continue;
            }
            let mut st = r.st;
            while let Some(&n) = idx.get(j).filter(|&&n| recs[n as usize].key == r.key) {
                st.merge(&recs[n as usize].st);
                j += 1;
            }
            f(r.key, &st);
        }
    }

    /// Fold the prompts shard by shard in hash order, as
    /// [`Shards::fold_in_hash_order`] folds the tables: the same bits.
    fn fold_in_hash_order<A: Default + Send>(
        &self,
        add: impl Fn(&mut A, &Stats) + Sync,
        combine: impl Fn(&mut A, &A),
    ) -> A {
        use rayon::prelude::*;
        self.hash_order();
        let parts: Vec<A> = (0..SHARDS)
            .into_par_iter()
            .map(|s| {
                let mut a = A::default();
                self.for_each_in_shard(s, |_, st| add(&mut a, st));
                a
            })
            .collect();
        parts.iter().fold(A::default(), |mut a, p| {
            combine(&mut a, p);
            a
        })
    }

    /// Number of prompts.
    fn prompts(&self) -> usize {
        if self.sorted {
            self.len
        } else {
            self.hash_order().distinct
        }
    }

    /// The statistics of `key` (its records merged in row order): a binary
    /// search in a sorted log of keys, a linear one otherwise.
    fn get(&self, key: u64) -> Option<Stats> {
        if self.sorted && self.kind == IdKind::Key {
            let recs = self.records();
            return recs.binary_search_by_key(&key, |r| r.key).ok().map(|i| recs[i].st);
        }
        let mut it = self.records().iter().filter(|r| r.key == key);
        let mut st = it.next()?.st;
        it.for_each(|r| st.merge(&r.st));
        Some(st)
    }

    /// The ids are not sorted (any more): from now on the runs are
    /// appended as they come, and the distinct prompts are sketched.
    fn unsort(&mut self) {
        if !self.sorted {
            return;
        }
        self.sorted = false;
        let mut sk = Sketch::new();
        self.records().iter().for_each(|r| sk.add(r.key));
        self.sketch = Some(sk);
        self.groups = self.len;
    }

    /// The log's sketch with the runs of `parts` added, and the number of
    /// groups of runs then (the log made unsorted first).
    fn sketch_with(&mut self, parts: &[Ordered], parallel: bool) -> (Box<Sketch>, usize) {
        use rayon::prelude::*;
        self.unsort();
        let one = |p: &Ordered| {
            let mut sk = Sketch::new();
            p.runs.iter().for_each(|r| sk.add(r.key));
            sk
        };
        let parts_sk: Vec<Box<Sketch>> =
            if parallel { parts.par_iter().map(one).collect() } else { parts.iter().map(one).collect() };
        let mut sk = self.sketch.clone().unwrap_or_else(Sketch::new);
        parts_sk.iter().for_each(|s| sk.merge(s));
        (sk, self.groups + parts.iter().map(|p| p.groups).sum::<usize>())
    }

    /// Append the runs of consecutive stretches of rows as they are (a log
    /// that is not sorted), with the sketch and groups that
    /// [`Log::sketch_with`] gave; None, with no run added, when the memory
    /// is not there.
    fn append_runs(&mut self, parts: &[Ordered], parallel: bool, (sk, groups): (Box<Sketch>, usize)) -> Option<()> {
        use rayon::prelude::*;
        let total: usize = parts.iter().map(|p| p.runs.len()).sum();
        self.try_reserve(total)?;
        let mut jobs = Vec::with_capacity(parts.len());
        let mut rest = &mut self.recs[self.len..];
        for p in parts {
            let (dst, r) = std::mem::take(&mut rest).split_at_mut(p.runs.len());
            jobs.push((dst, &p.runs[..]));
            rest = r;
        }
        let copy = |(d, s): (&mut [Slot], &[Slot])| d.copy_from_slice(s);
        if parallel {
            jobs.into_par_iter().for_each(copy);
        } else {
            jobs.into_iter().for_each(copy);
        }
        (self.sketch, self.groups) = (Some(sk), groups);
        self.len += total;
        self.order.take();
        Some(())
    }

    /// Whether `groups` runs of ids are clearly more than the distinct keys
    /// the sketch saw (rows not grouped): then the tables hold the prompts
    /// in less memory than their runs.
    fn too_many(sk: &Sketch, groups: usize) -> bool {
        groups as f64 > 1.1 * sk.estimate() + 8192.0
    }

    /// About how many prompts the log holds (for sizing the tables).
    fn prompts_estimate(&self) -> usize {
        match &self.sketch {
            Some(sk) if !self.sorted => ((sk.estimate() * 1.03) as usize).min(self.len),
            _ => self.len,
        }
    }

    /// Room for `additional` more records (growing by at least half);
    /// None, with the log unchanged, when the memory is not there.
    fn try_reserve(&mut self, additional: usize) -> Option<()> {
        let need = self.len.checked_add(additional)?;
        if need <= self.recs.len() {
            return Some(());
        }
        let more = need.max(self.recs.len() + self.recs.len() / 2).max(1024);
        self.recs.try_grow(more).or_else(|| self.recs.try_grow(need))
    }

    /// Whether sorted runs of ids of kind `kind` from order `first` on can
    /// follow and keep the log sorted.
    fn takes(&self, kind: IdKind, first: u64) -> bool {
        self.sorted && (self.len == 0 || (self.kind == kind && first >= self.last))
    }

    /// Append the runs of consecutive stretches of rows, each sorted and
    /// following the log ([`Log::takes`]). Runs of one id become one
    /// record, merged in row order as the table merges them: each part
    /// writes its records in parallel, into its own range, and then the
    /// runs that continue the record before a part (a prompt cut between
    /// two stretches, or between two updates) are merged into it in order.
    /// None, with nothing appended, when the memory is not there.
    fn append(&mut self, parts: &[Ordered], kind: IdKind, parallel: bool) -> Option<()> {
        // per part: runs that continue the record before it, and records
        let mut tail = (self.len > 0).then_some(self.last);
        let mut plan = Vec::with_capacity(parts.len());
        for p in parts {
            if p.runs.is_empty() {
                plan.push((0, 0));
                continue;
            }
            let cont = tail == Some(p.first);
            plan.push(if cont { (p.lead, p.groups - 1) } else { (0, p.groups) });
            tail = Some(p.last);
        }
        let total: usize = plan.iter().map(|&(_, r)| r).sum();
        self.try_reserve(total)?;
        let mut jobs = Vec::with_capacity(parts.len());
        let mut rest = &mut self.recs[self.len..];
        for (p, &(skip, n)) in parts.iter().zip(&plan) {
            let (dst, r) = std::mem::take(&mut rest).split_at_mut(n);
            jobs.push((dst, &p.runs[skip..]));
            rest = r;
        }
        let compact = |(d, s): (&mut [Slot], &[Slot])| {
            let mut w = 0;
            for r in s {
                if w > 0 && d[w - 1].key == r.key {
                    d[w - 1].st.merge(&r.st);
                } else {
                    d[w] = *r;
                    w += 1;
                }
            }
            debug_assert_eq!(w, d.len());
        };
        if parallel {
            use rayon::prelude::*;
            jobs.into_par_iter().for_each(compact);
        } else {
            jobs.into_iter().for_each(compact);
        }
        // the continuing runs, in row order, into the record before them
        let mut end = self.len;
        for (p, &(skip, n)) in parts.iter().zip(&plan) {
            for r in &p.runs[..skip] {
                self.recs[end - 1].st.merge(&r.st);
            }
            end += n;
        }
        if let Some(p) = parts.iter().find(|p| !p.runs.is_empty()) {
            if self.len == 0 {
                self.first = p.first;
                self.kind = kind;
            }
        }
        if let Some(p) = parts.iter().rev().find(|p| !p.runs.is_empty()) {
            self.last = p.last;
        }
        self.len = end;
        self.order.take();
        Some(())
    }

    /// Append another log that follows this one ([`Log::takes`]).
    fn extend(&mut self, o: &Log) -> Option<()> {
        if o.len == 0 {
            return Some(());
        }
        self.try_reserve(o.len)?;
        let mut src = o.records();
        if self.len > 0 && self.last == o.first {
            self.recs[self.len - 1].st.merge(&src[0].st);
            src = &src[1..];
        } else if self.len == 0 {
            (self.first, self.kind) = (o.first, o.kind);
        }
        self.recs[self.len..self.len + src.len()].copy_from_slice(src);
        self.len += src.len();
        self.last = o.last;
        self.order.take();
        Some(())
    }
}

/// Streaming accumulator of per-prompt loss statistics.
///
/// While the rows are grouped (a prompt's rows next to each other: ids
/// sorted, or prompts in any order), the prompts are kept as a log in
/// row order, with no hash index at all. Rows that are not grouped (runs
/// clearly more than the prompts, by a sketch of the distinct keys), a
/// merge that needs it or [`Accumulator::build_index`] build the index
/// from the log, once, and the accumulator goes on with its hash tables.
/// Every result is the same bits either way.
#[derive(Debug, Clone, Default)]
pub struct Accumulator {
    shards: Shards,
    log: Log,
    /// The prompts are in `shards` (and the log is empty) for good.
    indexed: bool,
    /// Prompts the tables are sized for when they are built from the log.
    hint: usize,
    rows: u64,
    runs: Scratch,
}

/// The per-shard tables.
#[derive(Debug, Clone)]
struct Shards([Table; SHARDS]);

impl Default for Shards {
    fn default() -> Self {
        Shards(std::array::from_fn(|_| Table::default()))
    }
}

impl Shards {
    fn len(&self) -> usize {
        self.0.iter().map(|t| t.len).sum()
    }

    /// Forget every prompt, keeping the tables' capacity.
    fn clear(&mut self) {
        for t in &mut self.0 {
            t.clear();
        }
    }

    fn get(&self, key: u64) -> Option<&Stats> {
        self.0[shard_of(hash(key))].get(key)
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Stats)> {
        self.0.iter().flat_map(|t| t.records().iter().map(|s| (s.key, &s.st)))
    }

    /// The statistics of the prompts that `keep`, as columns in the order of
    /// their key hash.
    fn columns_in_hash_order(&self, keep: impl Fn(&Stats) -> bool + Sync) -> StatsColumns {
        columns_by_shard(
            |s| self.0[s].records().iter().filter(|r| keep(&r.st)).count(),
            |s, f| self.0[s].for_each_in_hash_order(|st| f(st)),
            &keep,
        )
    }

    /// Fold every prompt's statistics shard by shard in parallel (each in
    /// hash order) and combine the shards' results in shard order: so in
    /// hash order, whatever the thread count.
    fn fold_in_hash_order<A: Default + Send>(
        &self,
        add: impl Fn(&mut A, &Stats) + Sync,
        combine: impl Fn(&mut A, &A),
    ) -> A {
        use rayon::prelude::*;
        let parts: Vec<A> = self
            .0
            .par_iter()
            .map(|t| {
                let mut a = A::default();
                t.for_each_in_hash_order(|st| add(&mut a, st));
                a
            })
            .collect();
        parts.iter().fold(A::default(), |mut a, p| {
            combine(&mut a, p);
            a
        })
    }

    /// Merge the records of a log (in pieces, so the lists stay in cache).
    fn merge_log(&mut self, log: &Log) {
        let mut b = buckets();
        for piece in log.records().chunks(STRETCH) {
            b.iter_mut().for_each(Vec::clear);
            for r in piece {
                b[shard_of(hash(r.key))].push(*r);
            }
            self.merge_buckets(std::slice::from_ref(&b), piece.len() >= PAR_ROWS && rayon::current_num_threads() > 1);
        }
    }

    /// Merge the buckets of consecutive stretches of rows, in order.
    fn merge_buckets(&mut self, parts: &[Buckets], parallel: bool) {
        // one prefetch pipeline over the shard's lists of all stretches
        let one = |(s, t): (usize, &mut Table)| t.merge_runs(parts.iter().flat_map(|p| p[s].iter()));
        if parallel {
            use rayon::prelude::*;
            self.0.par_iter_mut().enumerate().for_each(one);
        } else {
            self.0.iter_mut().enumerate().for_each(one);
        }
    }
}

/// The statistics that `keep` of the prompts of [`SHARDS`] shards, as
/// columns in shard order: `kept(s)` says how many shard `s` keeps and
/// `visit(s, f)` calls `f` with its statistics in order. The shards are
/// written in parallel, each into its own part of the columns.
fn columns_by_shard(
    kept: impl Fn(usize) -> usize + Sync,
    visit: impl Fn(usize, &mut dyn FnMut(&Stats)) + Sync,
    keep: &(impl Fn(&Stats) -> bool + Sync),
) -> StatsColumns {
    use rayon::prelude::*;
    let kept: Vec<usize> = (0..SHARDS).into_par_iter().map(&kept).collect();
    let n: usize = kept.iter().sum();
    let (mut count, mut mean, mut m2) = (vec_to_fill::<u64>(n), vec_to_fill::<f64>(n), vec_to_fill::<f64>(n));
    let mut parts = Vec::with_capacity(SHARDS);
    let (mut c, mut u, mut q) =
        (&mut count.spare_capacity_mut()[..n], &mut mean.spare_capacity_mut()[..n], &mut m2.spare_capacity_mut()[..n]);
    for (s, &k) in kept.iter().enumerate() {
        let (c0, c1) = std::mem::take(&mut c).split_at_mut(k);
        let (u0, u1) = std::mem::take(&mut u).split_at_mut(k);
        let (q0, q1) = std::mem::take(&mut q).split_at_mut(k);
        parts.push((s, c0, u0, q0));
        (c, u, q) = (c1, u1, q1);
    }
    parts.into_par_iter().for_each(|(s, c, u, q)| {
        let mut i = 0;
        visit(s, &mut |st: &Stats| {
            if keep(st) {
                c[i].write(st.count);
                u[i].write(st.mean);
                q[i].write(st.m2);
                i += 1;
            }
        });
        assert_eq!(i, c.len(), "the records changed while read");
    });
    // SAFETY: every shard wrote all `kept` values of its part (asserted
    // above), and the parts cover the first `n` values of each column.
    unsafe {
        count.set_len(n);
        mean.set_len(n);
        m2.set_len(n);
    }
    StatsColumns { count, mean, m2 }
}

/// Per-prompt statistics as three columns of the same length.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StatsColumns {
    pub count: Vec<u64>,
    pub mean: Vec<f64>,
    pub m2: Vec<f64>,
}

impl StatsColumns {
    /// The columns of a list of statistics.
    pub fn of(stats: &[Stats]) -> StatsColumns {
        StatsColumns {
            count: stats.iter().map(|s| s.count).collect(),
            mean: stats.iter().map(|s| s.mean).collect(),
            m2: stats.iter().map(|s| s.m2).collect(),
        }
    }
}

/// Count, mean and covariance of 4-vectors, built one vector at a time
/// (Welford) and merged exactly (Chan et al.); `cov` holds the co-moments
/// (sums of products of deviations) until `finish` divides them
/// by `n - 1`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Moments {
    /// Number of vectors.
    pub n: u64,
    /// Their mean.
    pub mean: [f64; 4],
    /// Their covariance (co-moments before `finish`).
    pub cov: [[f64; 4]; 4],
}

impl Moments {
    fn push(&mut self, v: [f64; 4]) {
        self.n += 1;
        let inv = 1.0 / self.n as f64;
        let d: [f64; 4] = std::array::from_fn(|i| v[i] - self.mean[i]);
        for (m, di) in self.mean.iter_mut().zip(&d) {
            *m += di * inv;
        }
        let e: [f64; 4] = std::array::from_fn(|j| v[j] - self.mean[j]);
        for (row, di) in self.cov.iter_mut().zip(&d) {
            for (c, ej) in row.iter_mut().zip(&e) {
                *c += di * ej;
            }
        }
    }

    fn merge(&mut self, o: &Moments) {
        if o.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *o;
            return;
        }
        let (na, nb) = (self.n as f64, o.n as f64);
        let n = na + nb;
        let d: [f64; 4] = std::array::from_fn(|i| o.mean[i] - self.mean[i]);
        for (m, di) in self.mean.iter_mut().zip(&d) {
            *m += di * (nb / n);
        }
        for ((row, orow), di) in self.cov.iter_mut().zip(&o.cov).zip(&d) {
            for ((c, oc), dj) in row.iter_mut().zip(orow).zip(&d) {
                *c += oc + di * dj * (na * nb / n);
            }
        }
        self.n += o.n;
    }

    /// Co-moments divided by `n - 1` (the sample covariance).
    fn finish(mut self) -> Moments {
        let k = 1.0 / (self.n.max(2) - 1) as f64;
        self.cov.iter_mut().flatten().for_each(|c| *c *= k);
        self
    }
}

/// An empty vector with room for `n` values that are about to be written:
/// a large one asks for transparent huge pages first (its pages are fresh,
/// and faulting them in 2 MiB at a time is several times cheaper).
fn vec_to_fill<T>(n: usize) -> Vec<T> {
    let v = Vec::with_capacity(n);
    #[cfg(target_os = "linux")]
    {
        let (p, bytes) = (v.as_ptr() as usize, n * std::mem::size_of::<T>());
        let (a, e) = (p.next_multiple_of(HUGE), (p + bytes) & !(HUGE - 1));
        if e > a {
            // SAFETY: [a, e) lies inside the vector's allocation; the advice
            // changes how its pages are backed, not their contents.
            unsafe { libc::madvise(a as *mut libc::c_void, e - a, libc::MADV_HUGEPAGE) };
        }
    }
    v
}

/// The decomposition estimated from an accumulator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Total rows seen.
    pub n_rows: u64,
    /// Distinct prompts seen.
    pub n_prompts: u64,
    /// Prompts with exactly one response (left out of the estimators).
    pub n_single_response_prompts: u64,
    /// Prompts used by the estimators (two or more responses).
    pub n_used_prompts: u64,
    /// Rows of the prompts used.
    pub n_used_rows: u64,
    /// `mean_i s_i^2`.
    pub v_y_given_x: f64,
    /// Unbiased (ddof = 1) variance of the prompt means.
    pub var_of_means: f64,
    /// `mean_i s_i^2 / K_i`: the within-prompt noise in `var_of_means`.
    pub within_leak: f64,
    /// `var_of_means - within_leak`, before the clip at 0 (may be negative).
    pub v_x_raw: f64,
    /// `max(0, v_x_raw)`.
    pub v_x: f64,
    /// Mean of the prompt means.
    pub grand_mean: f64,
    /// Mean number of responses over the prompts used.
    pub mean_k: f64,
}

const MAGIC: &[u8; 8] = b"MRTVACC\0";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 4 + 8 + 8;
const ENTRY: usize = 32;

impl Accumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty accumulator sized for about `prompts` distinct prompts, so
    /// that streaming them in does not grow (rehash) the table on the way.
    pub fn with_capacity(prompts: usize) -> Result<Self> {
        let mut a = Self::default();
        a.reserve(prompts)?;
        Ok(a)
    }

    /// Make room for about `prompts` more distinct prompts (a hint: the
    /// table still grows when it has to; results do not depend on it).
    /// Errors (with the statistics unchanged) when the memory for that many
    /// prompts cannot be had.
    pub fn reserve(&mut self, prompts: usize) -> Result<()> {
        if !self.indexed {
            // a log needs room for records only; the tables, if they are
            // ever built, are sized then
            if self.log.try_reserve(prompts).is_none() {
                return invalid(format!(
                    "cannot reserve room for {prompts} prompts ({} bytes): not enough memory",
                    (prompts as u128) * std::mem::size_of::<Slot>() as u128
                ));
            }
            self.hint = self.hint.max(self.log.len.saturating_add(prompts));
            return Ok(());
        }
        self.reserve_tables(prompts)
    }

    fn reserve_tables(&mut self, prompts: usize) -> Result<()> {
        // keys spread over the shards binomially: add 4 standard deviations
        let per = prompts / SHARDS;
        let per = per + 4 * ((per as f64).sqrt() as usize) + 16;
        for t in &mut self.shards.0 {
            if t.try_reserve(per).is_none() {
                return invalid(format!(
                    "cannot reserve room for {prompts} prompts ({} bytes of table): not enough memory",
                    (prompts as u128) * 2 * std::mem::size_of::<Slot>() as u128
                ));
            }
        }
        Ok(())
    }

    /// Number of distinct prompts seen.
    pub fn len(&self) -> usize {
        if self.indexed {
            self.shards.len()
        } else {
            self.log.prompts()
        }
    }

    /// Whether the prompts are held in hash tables (false while they are a
    /// log: see [`Accumulator`]).
    pub fn is_indexed(&self) -> bool {
        self.indexed
    }

    /// Build the hash index from the log (once; a no-op when indexed),
    /// sizing the tables for the prompts reserved (the runs of the log are
    /// merged in row order: the bits of a stream into the tables). Until
    /// then a lookup by key ([`Accumulator::get`]) is a linear search (a
    /// binary one in a log of keys in increasing order, as
    /// [`Accumulator::from_bytes`] gives).
    pub fn build_index(&mut self) {
        if self.indexed {
            return;
        }
        self.indexed = true;
        let log = std::mem::take(&mut self.log);
        let _ = self.reserve_tables(self.hint.max(log.prompts_estimate()));
        self.shards.merge_log(&log);
    }

    /// Empty again, as new (keeping the tables' capacity).
    fn reset(&mut self) {
        self.shards.clear();
        let recs = std::mem::take(&mut self.log.recs);
        self.log = Log { recs, ..Log::default() };
        self.indexed = false;
        self.rows = 0;
    }

    /// Every prompt's key and statistics (in no particular order).
    fn records(&self) -> Box<dyn Iterator<Item = (u64, Stats)> + '_> {
        if self.indexed {
            Box::new(self.shards.iter().map(|(k, s)| (k, *s)))
        } else if self.log.sorted {
            Box::new(self.log.records().iter().map(|s| (s.key, s.st)))
        } else {
            let mut v = Vec::with_capacity(self.log.prompts());
            (0..SHARDS).for_each(|s| self.log.for_each_in_shard(s, |k, st| v.push((k, *st))));
            Box::new(v.into_iter())
        }
    }

    /// True when no row has been seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total rows seen.
    pub fn n_rows(&self) -> u64 {
        self.rows
    }

    /// Statistics of one prompt.
    pub fn get(&self, key: u64) -> Option<Stats> {
        if self.indexed {
            self.shards.get(key).copied()
        } else {
            self.log.get(key)
        }
    }

    /// Add rows `(keys[i], losses[i])`. All-or-nothing: a NaN or infinite loss
    /// is reported with its row index (counted from the first row this
    /// accumulator has seen, and within this call) and nothing is added.
    ///
    /// A large update into an accumulator that has seen no row yet is merged
    /// in stretches of [`STRETCH`] rows, so that the lists of runs stay in
    /// cache (same runs, same merge order: the same bits); on an error the
    /// accumulator is emptied again.
    pub fn update(&mut self, keys: &[u64], losses: &[f64]) -> Result<()> {
        self.update_any(keys, losses)
    }

    /// [`Accumulator::update`] with integer prompt ids: the same as
    /// updating with their keys ([`crate::sampling::keys_of_ints`]), without
    /// a separate pass to compute them (each run of equal ids is keyed once,
    /// in the scan).
    pub fn update_int_ids(&mut self, ids: &[i64], losses: &[f64]) -> Result<()> {
        self.update_any(ids, losses)
    }

    fn update_any<K: PromptIds>(&mut self, keys: &[K], losses: &[f64]) -> Result<()> {
        if keys.len() != losses.len() {
            return invalid(format!(
                "keys and losses must have the same length, got {} and {}",
                keys.len(),
                losses.len()
            ));
        }
        if keys.len() <= STRETCH || self.rows != 0 {
            return self.update_part(keys, losses, 0, None);
        }
        // grouped rows (two or more a run on average): the runs bound the
        // prompts, so the tables are sized for them once instead of growing
        // on the way (a hint only: the statistics do not depend on it)
        // (when ids that are not sorted make the accumulator build them)
        for s in (0..keys.len()).step_by(STRETCH) {
            let e = (s + STRETCH).min(keys.len());
            if let Err(err) = self.update_part(&keys[s..e], &losses[s..e], s, Some(keys)) {
                self.reset();
                return Err(err);
            }
        }
        Ok(())
    }

    /// [`Accumulator::update`] of one stretch starting at row `base` of the
    /// caller's update (for error messages); `whole`: all the ids of a large
    /// first update, whose runs size the tables if they are built.
    fn update_part<K: PromptIds>(
        &mut self,
        keys: &[K],
        losses: &[f64],
        base: usize,
        whole: Option<&[K]>,
    ) -> Result<()> {
        let n = keys.len();
        let parallel = n >= PAR_ROWS && rayon::current_num_threads() > 1;
        // stretches start at multiples of BLOCK, where the scan cuts runs
        // anyway: the runs do not depend on how many stretches there are
        let n_parts = if parallel { (2 * rayon::current_num_threads()).min(n.div_ceil(BLOCK)) } else { 1 };
        let per = n.div_ceil(BLOCK).div_ceil(n_parts) * BLOCK;
        if !self.indexed {
            return self.update_log(keys, losses, base, (n_parts, per, parallel), whole);
        }
        let mut parts = std::mem::take(&mut self.runs.buckets);
        parts.resize_with(n_parts, buckets);
        for b in parts.iter_mut().flatten() {
            b.clear();
        }
        if let Some(s) = scan_parts(keys, losses, &mut parts, per, parallel) {
            self.runs.buckets = parts;
            return Err(self.bad_rows(losses, s, base));
        }
        self.shards.merge_buckets(&parts, parallel);
        self.rows += n as u64;
        // keep the scratch lists for the next update, unless they are much
        // larger than both the tables and this update (at most 2^21 runs)
        let entries: usize = self.shards.0.iter().map(|t| t.index.len()).sum();
        let keep = (1 << 16).max(entries).max((2 * n).min(1 << 21));
        if parts.iter().flatten().map(|b| b.capacity()).sum::<usize>() <= keep {
            self.runs.buckets = parts;
        }
        Ok(())
    }

    /// The error for a scan that stopped at row `s` of this update's rows
    /// (a stretch starting at row `base` of the caller's update).
    fn bad_rows(&self, losses: &[f64], s: usize, base: usize) -> Error {
        let i = s + losses[s..].iter().position(|v| !v.is_finite()).unwrap_or(0);
        if !losses[i].is_finite() {
            return Error::Invalid(format!(
                "loss at row {} (row {} of this update) is {}: losses must be finite",
                self.rows + i as u64,
                base + i,
                losses[i]
            ));
        }
        Error::Invalid(format!(
            "losses from row {} (row {} of this update) are too large: their sum or squared deviations overflow f64",
            self.rows + s as u64,
            base + s
        ))
    }

    /// [`Accumulator::update_part`] of an accumulator that is still a log:
    /// the stretch is scanned into lists of runs in row order, which are
    /// appended to the log: merged into one record per prompt when their
    /// ids never decrease and follow the log's, as they come otherwise. When
    /// they are clearly more than the prompts (rows not grouped), or the log
    /// is full, the index is built and the runs are merged into it instead.
    fn update_log<K: PromptIds>(
        &mut self,
        keys: &[K],
        losses: &[f64],
        base: usize,
        (n_parts, per, parallel): (usize, usize, bool),
        whole: Option<&[K]>,
    ) -> Result<()> {
        let n = keys.len();
        let mut parts = std::mem::take(&mut self.runs.ordered);
        parts.resize_with(n_parts, Ordered::default);
        parts.iter_mut().for_each(Ordered::clear);
        if let Some(s) = scan_parts(keys, losses, &mut parts, per, parallel) {
            self.runs.ordered = parts;
            return Err(self.bad_rows(losses, s, base));
        }
        // sorted: each part on its own, and each part after the one before
        let mut follows = true;
        let mut last = (self.log.len > 0).then_some(self.log.last);
        for p in parts.iter().filter(|p| !p.runs.is_empty()) {
            follows &= p.sorted && last.is_none_or(|l| p.first >= l);
            last = Some(p.last);
        }
        let first = parts.iter().find(|p| !p.runs.is_empty()).map(|p| p.first);
        let more: usize = parts.iter().map(|p| p.runs.len()).sum();
        let kept = if self.log.len.saturating_add(more) > u32::MAX as usize {
            // (a log's hash order numbers its records with 32 bits)
            None
        } else if follows && first.is_none_or(|f| self.log.takes(K::KIND, f)) {
            Some(self.log.append(&parts, K::KIND, parallel))
        } else {
            // not sorted: the runs go to the log as they are, unless they
            // are clearly more than the prompts (the rows are not grouped)
            let (sk, groups) = self.log.sketch_with(&parts, parallel);
            if Log::too_many(&sk, groups) {
                None
            } else {
                Some(self.log.append_runs(&parts, parallel, (sk, groups)))
            }
        };
        if let Some(appended) = kept {
            if appended.is_none() {
                self.runs.ordered = parts;
                return invalid(format!("not enough memory to keep {more} more runs (after {})", self.log.len));
            }
        } else {
            if let Some(all) = whole {
                // grouped rows (two or more a run on average): the runs
                // bound the prompts, so the tables are sized for them once
                // instead of growing on the way
                let runs = count_runs(all);
                if runs.saturating_mul(2) <= all.len() {
                    self.hint = self.hint.max(runs);
                }
            }
            self.build_index();
            let mut b = buckets();
            for p in &parts {
                for r in &p.runs {
                    b[shard_of(hash(r.key))].push(*r);
                }
            }
            self.shards.merge_buckets(std::slice::from_ref(&b), parallel);
        }
        self.rows += n as u64;
        // the lists stay for the next update unless they are large
        if parts.iter().map(|p| p.runs.capacity()).sum::<usize>() <= (1 << 16).max((2 * n).min(1 << 21)) {
            self.runs.ordered = parts;
        }
        Ok(())
    }

    /// Fold another accumulator into this one (exact, order-free up to
    /// rounding). Two logs stay a log when the other's ids follow this
    /// one's (shards of a sorted stream merged in order); otherwise this
    /// one's index is built first.
    pub fn merge(&mut self, other: &Accumulator) {
        if other.is_empty() {
            self.rows += other.rows;
            return;
        }
        if !self.indexed
            && !other.indexed
            && other.log.sorted
            && self.log.takes(other.log.kind, other.log.first)
            && self.log.len + other.log.len <= u32::MAX as usize
        {
            if self.log.extend(&other.log).is_none() {
                panic!("out of memory merging {} prompts into {}", other.log.len, self.log.len);
            }
            self.rows += other.rows;
            return;
        }
        self.build_index();
        if !other.indexed {
            if other.log.sorted {
                self.shards.merge_log(&other.log);
            } else {
                // the other's prompts (its runs merged), shard by shard
                use rayon::prelude::*;
                let one = |(s, t): (usize, &mut Table)| {
                    let mut v = Vec::new();
                    other.log.for_each_in_shard(s, |key, st| v.push(Slot { key, st: *st }));
                    t.reserve(v.len());
                    t.merge_runs(v.iter());
                };
                other.log.hash_order();
                self.shards.0.par_iter_mut().enumerate().for_each(one);
            }
            self.rows += other.rows;
            return;
        }
        let one = |(a, b): (&mut Table, &Table)| {
            a.reserve(b.len);
            a.merge_runs(b.records().iter());
        };
        if other.len() >= PAR_ROWS && rayon::current_num_threads() > 1 {
            use rayon::prelude::*;
            self.shards.0.par_iter_mut().zip(&other.shards.0).for_each(one);
        } else {
            self.shards.0.iter_mut().zip(&other.shards.0).for_each(one);
        }
        self.rows += other.rows;
    }

    /// Per-prompt statistics sorted by key: `(keys, stats)`.
    pub fn per_prompt(&self) -> (Vec<u64>, Vec<Stats>) {
        use rayon::slice::ParallelSliceMut;
        let mut v: Vec<(u64, Stats)> = Vec::with_capacity(self.len());
        v.extend(self.records());
        v.par_sort_unstable_by_key(|e| e.0);
        v.into_iter().unzip()
    }

    /// The estimators of the decomposition. Deterministic for a given state:
    /// prompts are visited in the order of their key hash (a bijection of the
    /// key), whatever order they were inserted in. Errors when fewer than two
    /// prompts have at least two responses.
    pub fn summary(&self) -> Result<Summary> {
        self.fold(Partial::add, Partial::combine).finish(self.rows)
    }

    /// Fold every prompt's statistics in hash order, shard by shard
    /// (from the tables or from a log: the same bits).
    fn fold<A: Default + Send>(&self, add: impl Fn(&mut A, &Stats) + Sync, combine: impl Fn(&mut A, &A)) -> A {
        if self.indexed {
            self.shards.fold_in_hash_order(add, combine)
        } else {
            self.log.fold_in_hash_order(add, combine)
        }
    }

    /// The statistics of the prompts the estimators use (two or more
    /// responses), in the order [`Accumulator::summary`] visits them: the
    /// order of their key hash, whatever order they were inserted in (what a
    /// seeded bootstrap over prompts resamples).
    pub fn used_stats(&self) -> StatsColumns {
        if self.indexed {
            return self.shards.columns_in_hash_order(|s| s.count >= 2);
        }
        let keep = |s: &Stats| s.count >= 2;
        let log = &self.log;
        // sorted before the parallel part: a worker waiting inside the
        // sort's own parallel calls could otherwise pick up a shard's job
        // and ask for the order again from within its construction
        log.hash_order();
        let kept = |s: usize| {
            let mut n = 0;
            log.for_each_in_shard(s, |_, st| n += keep(st) as usize);
            n
        };
        columns_by_shard(kept, |s, f| log.for_each_in_shard(s, |_, st| f(st)), &keep)
    }

    /// Mean and covariance (ddof = 1) over the prompts the estimators use
    /// of the vector `(s^2, s^2 / K, g - gbar, (g - gbar)^2)` (`g` the
    /// prompt's mean loss, `gbar` the mean of `g`): all the normal
    /// bootstrap needs, in two passes over the prompts and no list of them.
    /// Errors like [`Accumulator::summary`].
    pub fn used_moments(&self) -> Result<Moments> {
        self.used_moments_about(self.summary()?.grand_mean)
    }

    /// [`Accumulator::used_moments`] with `gbar` given (the summary's
    /// `grand_mean`, for a caller that has it: one pass over the prompts).
    /// Errors when `gbar` is not finite.
    pub fn used_moments_about(&self, gbar: f64) -> Result<Moments> {
        if !gbar.is_finite() {
            return invalid(format!("the centre of the prompt means must be finite, got {gbar}"));
        }
        let m = self.fold(
            |m: &mut Moments, st| {
                if st.count >= 2 {
                    let s2 = st.m2 / (st.count - 1) as f64;
                    let d = st.mean - gbar;
                    m.push([s2, s2 / st.count as f64, d, d * d]);
                }
            },
            Moments::merge,
        );
        Ok(m.finish())
    }

    /// Serialise: magic `MRTVACC\0`, u32 version, u32 reserved, u64 rows,
    /// u64 entries, then per prompt in key order u64 key, u64 count, f64 mean,
    /// f64 m2; all little-endian. Equal states give equal bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let (keys, stats) = self.per_prompt();
        let mut out = Vec::with_capacity(HEADER + ENTRY * keys.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.rows.to_le_bytes());
        out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for (k, s) in keys.iter().zip(&stats) {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&s.count.to_le_bytes());
            out.extend_from_slice(&s.mean.to_le_bytes());
            out.extend_from_slice(&s.m2.to_le_bytes());
        }
        out
    }

    /// Inverse of [`Accumulator::to_bytes`]; every field is checked. The
    /// entries (in increasing key order) come back as a sorted log of keys:
    /// no table is built until something needs one.
    pub fn from_bytes(b: &[u8]) -> Result<Accumulator> {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if b.len() < HEADER || &b[..8] != MAGIC {
            return invalid("not a serialised variance accumulator (bad magic or too short)");
        }
        let ver = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if ver != VERSION {
            return invalid(format!(
                "unsupported variance accumulator format version {ver} (this build reads {VERSION})"
            ));
        }
        let rows = u64_at(16);
        let n = u64_at(24);
        let expect = (n as u128) * ENTRY as u128 + HEADER as u128;
        if expect != b.len() as u128 {
            return invalid(format!(
                "truncated or padded variance accumulator: header says {n} prompts ({expect} bytes), got {} bytes",
                b.len()
            ));
        }
        // entries in increasing key order are a sorted log of keys (no
        // table to build); past a log's size, the tables
        let as_log = n <= u32::MAX as u64;
        let mut log = Log::default();
        let mut runs = buckets();
        if as_log && log.try_reserve(n as usize).is_none() {
            return invalid(format!("cannot load {n} prompts: not enough memory"));
        }
        let mut total = 0u64;
        let mut last = None;
        for i in 0..n as usize {
            let o = HEADER + i * ENTRY;
            let key = u64_at(o);
            let count = u64_at(o + 8);
            let mean = f64::from_bits(u64_at(o + 16));
            let m2 = f64::from_bits(u64_at(o + 24));
            if count == 0 || !mean.is_finite() || !m2.is_finite() || m2 < 0.0 {
                return invalid(format!(
                    "corrupt variance accumulator: prompt entry {i} has count {count}, mean {mean}, m2 {m2}"
                ));
            }
            if last.is_some_and(|l| l >= key) {
                return invalid(format!(
                    "corrupt variance accumulator: prompt entry {i} has key {key}, not above the previous key {} \
                     (entries are in increasing key order, each key once)",
                    last.unwrap_or_default()
                ));
            }
            last = Some(key);
            total = total.saturating_add(count);
            let slot = Slot { key, st: Stats { count, mean, m2 } };
            if as_log {
                log.recs[i] = slot;
            } else {
                runs[shard_of(hash(key))].push(slot);
            }
        }
        if total != rows {
            return invalid(format!("corrupt variance accumulator: counts sum to {total}, header says {rows} rows"));
        }
        if as_log {
            log.len = n as usize;
            if n > 0 {
                (log.first, log.last) = (log.recs[0].key, log.recs[n as usize - 1].key);
            }
            return Ok(Accumulator { log, rows, ..Default::default() });
        }
        let mut shards = Shards::default();
        for (t, r) in shards.0.iter_mut().zip(&runs) {
            if t.try_reserve(r.len()).is_none() {
                return invalid(format!("cannot load {n} prompts: not enough memory"));
            }
        }
        shards.merge_buckets(std::slice::from_ref(&runs), true);
        Ok(Accumulator { shards, rows, indexed: true, ..Default::default() })
    }
}

/// Estimators from per-prompt statistics (in a fixed order).
pub fn summarize(stats: &[Stats], n_rows: u64) -> Result<Summary> {
    // in pieces, combined in order (the same grouping for any thread count)
    let mut all = Partial::default();
    for piece in stats.chunks(1 << 12) {
        let mut p = Partial::default();
        piece.iter().for_each(|s| p.add(s));
        all.combine(&p);
    }
    all.finish(n_rows)
}

/// The sums behind the estimators over a set of prompts; two sets combine
/// exactly (counts and sums add, the prompt means' statistics merge by
/// Chan et al.), so the prompts can be summed in pieces.
#[derive(Debug, Clone, Copy, Default)]
struct Partial {
    prompts: u64,
    single: u64,
    rows_used: u64,
    /// Sums over the prompts used (two or more responses) of `s^2`, `s^2 / K`
    /// and `K`.
    s2: f64,
    leak: f64,
    k: f64,
    /// Count, mean and M2 of the prompt means (prompts used only).
    g: Stats,
}

impl Partial {
    #[inline]
    fn add(&mut self, s: &Stats) {
        self.prompts += 1;
        if s.count == 1 {
            self.single += 1;
        } else if s.count >= 2 {
            let s2 = s.m2 / (s.count - 1) as f64;
            self.s2 += s2;
            self.leak += s2 / s.count as f64;
            self.k += s.count as f64;
            self.rows_used += s.count;
            self.g.push(s.mean);
        }
    }

    fn combine(&mut self, o: &Partial) {
        self.prompts += o.prompts;
        self.single += o.single;
        self.rows_used += o.rows_used;
        self.s2 += o.s2;
        self.leak += o.leak;
        self.k += o.k;
        self.g.merge(&o.g);
    }

    fn finish(&self, n_rows: u64) -> Result<Summary> {
        let p = self.g.count;
        if p < 2 {
            return invalid(format!(
                "need at least 2 prompts with >= 2 responses to separate V_x from V_y|x; got {p} \
                 ({} prompt(s), {} with a single response)",
                self.prompts, self.single
            ));
        }
        let pf = p as f64;
        let var_of_means = self.g.m2 / (pf - 1.0);
        let leak = self.leak / pf;
        let raw = var_of_means - leak;
        Ok(Summary {
            n_rows,
            n_prompts: self.prompts,
            n_single_response_prompts: self.single,
            n_used_prompts: p,
            n_used_rows: self.rows_used,
            v_y_given_x: self.s2 / pf,
            var_of_means,
            within_leak: leak,
            v_x_raw: raw,
            v_x: raw.max(0.0),
            grand_mean: self.g.mean,
            mean_k: self.k / pf,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * (1.0 + a.abs().max(b.abs()))
    }

    fn same(a: &Accumulator, b: &Accumulator) -> bool {
        if a.len() != b.len() || a.n_rows() != b.n_rows() {
            return false;
        }
        let ((ka, sa), (kb, sb)) = (a.per_prompt(), b.per_prompt());
        ka == kb
            && sa
                .iter()
                .zip(&sb)
                .all(|(s, t)| s.count == t.count && close(s.mean, t.mean, 1e-9) && close(s.m2, t.m2, 1e-7))
    }

    /// Two-pass reference per key.
    fn reference(keys: &[u64], x: &[f64]) -> HashMap<u64, Stats> {
        let mut groups: HashMap<u64, Vec<f64>> = HashMap::new();
        for (k, v) in keys.iter().zip(x) {
            groups.entry(*k).or_default().push(*v);
        }
        groups.into_iter().map(|(k, v)| (k, Stats::of_slice(&v))).collect()
    }

    #[test]
    fn welford_matches_two_pass() {
        let x = [1.0, 2.0, 4.0, 7.0, 11.0];
        let mut s = Stats::default();
        for v in x {
            s.push(v);
        }
        let r = Stats::of_slice(&x);
        assert_eq!(s.count, 5);
        assert!(close(s.mean, 5.0, 1e-12) && close(s.mean, r.mean, 1e-12));
        assert!(close(s.m2, 66.0, 1e-12) && close(s.m2, r.m2, 1e-12));
        assert!(close(s.sample_variance().unwrap(), 16.5, 1e-12));
    }

    #[test]
    fn summary_by_hand() {
        // prompt a: {1, 3} (mean 2, s2 2); prompt b: {5, 7, 9} (mean 7, s2 4); prompt c: {4}.
        let mut acc = Accumulator::new();
        acc.update(&[1, 1, 2, 3, 2, 2], &[1.0, 3.0, 5.0, 4.0, 7.0, 9.0]).unwrap();
        let s = acc.summary().unwrap();
        assert_eq!((s.n_rows, s.n_prompts, s.n_single_response_prompts, s.n_used_prompts), (6, 3, 1, 2));
        assert!(close(s.v_y_given_x, 3.0, 1e-12));
        assert!(close(s.var_of_means, 12.5, 1e-12)); // (2-4.5)^2+(7-4.5)^2 over 1
        assert!(close(s.within_leak, (2.0 / 2.0 + 4.0 / 3.0) / 2.0, 1e-12));
        assert!(close(s.v_x, 12.5 - 7.0 / 6.0, 1e-12));
    }

    #[test]
    fn clip_at_zero_and_raw_kept() {
        let mut acc = Accumulator::new();
        // equal means, large within variance -> raw negative
        acc.update(&[1, 1, 2, 2], &[0.0, 10.0, 10.0, 0.0]).unwrap();
        let s = acc.summary().unwrap();
        assert!(s.v_x_raw < 0.0);
        assert_eq!(s.v_x, 0.0);
    }

    #[test]
    fn errors() {
        let mut acc = Accumulator::new();
        acc.update(&[1, 2], &[0.5, 0.25]).unwrap();
        let e = acc.update(&[1, 2, 3], &[0.0, f64::NAN, 1.0]).unwrap_err().to_string();
        assert!(e.contains("row 3") && e.contains("NaN"), "{e}");
        assert_eq!(acc.n_rows(), 2, "failed update must add nothing");
        assert_eq!(acc.get(1).unwrap().count, 1);
        assert!(acc.update(&[1], &[f64::INFINITY]).is_err());
        assert!(acc.update(&[1, 2], &[1.0]).is_err());
        let e = acc.summary().unwrap_err().to_string();
        assert!(e.contains("at least 2 prompts"), "{e}");
    }

    #[test]
    fn a_large_first_update_in_stretches_has_the_bits_of_one_pass() {
        let n = 3 * STRETCH + 1234;
        // runs of 3 rows (so some run crosses a stretch boundary), each key
        // revisited in later stretches
        let keys: Vec<u64> = (0..n as u64).map(|i| (i / 3).wrapping_mul(2_654_435_761) % 100_003).collect();
        let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 37.0).collect();
        let mut a = Accumulator::new();
        a.update(&keys, &x).unwrap();
        // an accumulator that has seen a row takes the single pass
        let mut b = Accumulator::new();
        b.update(&[u64::MAX], &[0.0]).unwrap();
        b.update(&keys, &x).unwrap();
        assert_eq!(a.len() + 1, b.len());
        assert_eq!(a.n_rows() + 1, b.n_rows());
        assert!(a.is_indexed());
        for (k, s) in a.records() {
            let t = b.get(k).unwrap();
            assert_eq!((s.count, s.mean.to_bits(), s.m2.to_bits()), (t.count, t.mean.to_bits(), t.m2.to_bits()));
        }
        // the grouped first update sized its tables for its runs up front
        assert_eq!(count_runs(&keys), n.div_ceil(3));
        let mut sized = Accumulator::with_capacity(n.div_ceil(3)).unwrap();
        sized.build_index();
        let lens = |acc: &Accumulator| acc.shards.0.iter().map(|t| t.index.len()).collect::<Vec<_>>();
        assert_eq!(lens(&a), lens(&sized));
        // rows mostly in runs of one are not: their tables grow as they fill
        let single: Vec<u64> = (0..n as u64).map(|i| (i / 3 + (i % 3) * 7_777_777) % 100_003).collect();
        let mut d = Accumulator::new();
        d.update(&single, &x).unwrap();
        let mut e = Accumulator::new();
        e.update(&single[..1], &x[..1]).unwrap();
        e.update(&single[1..], &x[1..]).unwrap();
        assert!(count_runs(&single) * 2 > n);
        assert_eq!(lens(&d), lens(&e));
        assert!(lens(&d) < lens(&sized));
        // a bad loss in a later stretch: named by its row, nothing kept
        let mut bad = x.clone();
        bad[2 * STRETCH + 5] = f64::NAN;
        let mut c = Accumulator::with_capacity(1000).unwrap();
        let e = c.update(&keys, &bad).unwrap_err().to_string();
        assert!(e.contains(&format!("row {} of this update", 2 * STRETCH + 5)), "{e}");
        assert!(c.is_empty() && c.n_rows() == 0, "a failed update must add nothing");
        c.update(&keys[..10], &x[..10]).unwrap();
        assert_eq!(c.n_rows(), 10);
    }

    #[test]
    fn bytes_reject_garbage() {
        let mut acc = Accumulator::new();
        acc.update(&[3, 3, 9], &[1.0, 2.0, 3.0]).unwrap();
        let b = acc.to_bytes();
        assert!(Accumulator::from_bytes(&b[..b.len() - 1]).is_err());
        assert!(Accumulator::from_bytes(b"nonsense").is_err());
        let mut bad = b.clone();
        bad[8] = 7; // version
        assert!(Accumulator::from_bytes(&bad).unwrap_err().to_string().contains("version"));
        let mut bad = b.clone();
        bad[16] = 99; // rows
        assert!(Accumulator::from_bytes(&bad).is_err());
        // entries out of key order, or a key twice (the second entry's key
        // set to the first's, the counts still summing to the rows)
        let mut bad = b.clone();
        let (e0, e1) = (HEADER, HEADER + ENTRY);
        let (k0, k1) = (b[e0..e0 + 8].to_vec(), b[e1..e1 + 8].to_vec());
        bad[e0..e0 + 8].copy_from_slice(&k1);
        bad[e1..e1 + 8].copy_from_slice(&k0);
        assert!(Accumulator::from_bytes(&bad).unwrap_err().to_string().contains("increasing key order"));
        let mut bad = b.clone();
        bad[e1..e1 + 8].copy_from_slice(&k0);
        assert!(Accumulator::from_bytes(&bad).unwrap_err().to_string().contains("each key once"));
        let r = Accumulator::from_bytes(&b).unwrap();
        assert!(same(&acc, &r));
        assert_eq!(r.to_bytes(), b);
        // a large state round-trips (parallel load)
        let keys: Vec<u64> = (0..300_000u64).flat_map(|k| [k * 7919, k * 7919]).collect();
        let x: Vec<f64> = (0..keys.len()).map(|i| (i % 13) as f64).collect();
        let mut big = Accumulator::new();
        big.update(&keys, &x).unwrap();
        let bb = big.to_bytes();
        let r = Accumulator::from_bytes(&bb).unwrap();
        assert!(same(&big, &r));
        assert_eq!(r.to_bytes(), bb);
        // it comes back as a sorted log of keys, looked up by binary search,
        // with every result of the state it came from
        assert!(!r.is_indexed() && r.log.sorted);
        same_bits(&r, &big);
        for k in [0, 7919 * 5, 7919 * 299_999, 1, u64::MAX] {
            assert_eq!(r.get(k), big.get(k));
        }
        // loaded from tables: the same
        let mut t = indexed();
        t.update(&keys, &x).unwrap();
        let rt = Accumulator::from_bytes(&t.to_bytes()).unwrap();
        same_bits(&rt, &t);
        // and it goes on streaming: keys after its last stay a log
        let (mut r2, mut t2) = (r.clone(), t.clone());
        for a in [&mut r2, &mut t2] {
            a.update(&[u64::MAX, u64::MAX], &[1.0, 2.5]).unwrap();
        }
        assert!(!r2.is_indexed());
        same_bits(&r2, &t2);
        let (mut r3, mut t3) = (r.clone(), t.clone());
        for a in [&mut r3, &mut t3] {
            a.update(&[7919 * 3, 5, 5], &[1.0, 2.5, 0.5]).unwrap();
        }
        assert!(!r3.is_indexed() && !r3.log.sorted);
        same_bits(&r3, &t3);
    }

    #[test]
    fn buffers_grow_keeping_their_contents() {
        // from empty, through the heap, across the mapping threshold, and a
        // mapping grown again (in place or moved by the kernel)
        let mut b = Buf::<u64>::empty();
        let mut filled = 0;
        for n in [5usize, 1000, HUGE / 8 + 3, HUGE / 2, 3 * HUGE] {
            b.try_grow(n).unwrap();
            assert!(b.len() >= n);
            assert!(b[..filled].iter().enumerate().all(|(i, &v)| v == i as u64 * 3 + 1));
            assert!(b[filled..].iter().all(|&v| v == 0));
            for (i, v) in b.iter_mut().enumerate() {
                *v = i as u64 * 3 + 1;
            }
            filled = b.len();
            #[cfg(target_os = "linux")]
            {
                // mappings are whole huge pages at huge-page boundaries
                assert_eq!(b.mapped, n * 8 >= HUGE);
                if b.mapped {
                    assert_eq!((b.as_ptr() as usize % HUGE, b.len() * 8 % HUGE), (0, 0));
                } else {
                    assert_eq!(b.len(), n);
                }
            }
        }
        b.try_grow(10).unwrap(); // never shrinks
        assert_eq!(b.len(), 3 * HUGE);
        // an impossible size is refused, with the contents kept
        assert!(b.try_grow(usize::MAX / 4).is_none());
        assert_eq!((b.len(), b[7]), (3 * HUGE, 22));
    }

    #[test]
    fn tables_grow_and_find_every_key() {
        // many keys in one table, grown from the smallest size on the way
        let mut t = Table::default();
        let mut keys: Vec<u64> = (0..600_000u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 3).collect();
        // and keys whose homes are the last entries of an index of any size,
        // so that their runs of full entries wrap round to the start
        keys.extend((1u64 << 40..).filter(|&k| tag_of(hash(k)) >> 12 == 0xF_FFFF).take(12));
        for (i, &k) in keys.iter().enumerate() {
            assert!(!t.upsert(k, hash(k), &Stats { count: 1, mean: i as f64, m2: 0.0 }));
            assert!(t.len <= t.limit && t.limit <= t.recs.len());
        }
        for (i, &k) in keys.iter().enumerate() {
            assert_eq!(t.get(k).map(|s| s.mean), Some(i as f64));
            assert!(t.upsert(k, hash(k), &Stats { count: 1, mean: i as f64, m2: 0.0 }));
        }
        assert_eq!(t.get(u64::MAX - 1), None);
        // the last keys wrapped round: some sit at the start of the index
        let wrapped = |e: u64| e != 0 && (e as u32 as usize) > keys.len() - 12;
        assert!(t.index[..16].iter().any(|&e| wrapped(e)));
        // the index grew in place (a mapping) at least twice on the way
        assert!(t.index.mapped || !cfg!(target_os = "linux"));
        assert!(t.index.len() * 8 >= 4 * HUGE);
        let c = t.clone();
        assert!(keys.iter().all(|&k| c.get(k).map(|s| s.count) == Some(2)));
        t.clear();
        assert!(t.len == 0 && keys.iter().all(|&k| t.get(k).is_none()));
    }

    #[test]
    fn integer_ids_are_their_keys() {
        // grouped ids in a large first update (stretches, sizing), then
        // shuffled ones, then an update with a bad loss: the same bits and
        // the same errors as keying the ids first
        let n = STRETCH * 2 + 777;
        let mut ids: Vec<i64> = (0..n as i64).map(|i| i / 5 - 1000).collect();
        let x: Vec<f64> = (0..n).map(|i| ((i * 7919) % 101) as f64 * 0.25 - 3.0).collect();
        let (mut a, mut b) = (Accumulator::new(), Accumulator::new());
        a.update_int_ids(&ids, &x).unwrap();
        b.update(&crate::sampling::keys_of_ints(&ids), &x).unwrap();
        ids.reverse();
        ids[7] = i64::MIN;
        ids[8] = i64::MAX;
        a.update_int_ids(&ids[..5000], &x[..5000]).unwrap();
        b.update(&crate::sampling::keys_of_ints(&ids[..5000]), &x[..5000]).unwrap();
        assert_eq!(a.to_bytes(), b.to_bytes());
        assert_eq!(a.get(crate::sampling::key_of_int(i64::MIN)).map(|s| s.count), Some(1));
        let mut bad = x[..100].to_vec();
        bad[42] = f64::NAN;
        let ea = a.update_int_ids(&ids[..100], &bad).unwrap_err().to_string();
        let eb = b.update(&crate::sampling::keys_of_ints(&ids[..100]), &bad).unwrap_err().to_string();
        assert_eq!(ea, eb);
        assert!(ea.contains("row 42 of this update"), "{ea}");
        assert_eq!(a.to_bytes(), b.to_bytes());
        assert!(a.update_int_ids(&ids[..3], &x[..2]).is_err());
    }

    /// The key with hash `h` (the hash is a bijection).
    fn unhash(h: u64) -> u64 {
        const C: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut inv = C; // Newton: inv = inv * (2 - C * inv) doubles the good bits
        for _ in 0..6 {
            inv = inv.wrapping_mul(2u64.wrapping_sub(C.wrapping_mul(inv)));
        }
        let y = h.wrapping_mul(inv);
        y ^ (y >> 29) ^ (y >> 58)
    }

    #[test]
    fn merge_pipeline_with_tag_ties_repeats_and_growth() {
        // keys in trios that share their 32-bit tag (a probe stops at the
        // first tag match, which may be another key's record), each in many
        // short runs close together (a probe's empty entry gets taken before
        // its run is merged), into tables that grow from the smallest size
        let mut keys = Vec::new();
        for g in 0..3000u64 {
            let base = (g.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 26) << 26;
            let trio = [0u64, 1, 2].map(|j| unhash(base | (j * 0x1_2345 + 1)));
            for r in 0..4 {
                keys.push(trio[(r + g as usize) % 3]);
                keys.push(trio[(r + g as usize) % 3]);
                keys.push(trio[(r * 2 + 1) % 3]);
            }
        }
        let x: Vec<f64> = (0..keys.len()).map(|i| ((i * 37) % 23) as f64 - 11.0).collect();
        let want = reference(&keys, &x);
        let mut acc = Accumulator::new();
        for (k, v) in keys.chunks(5000).zip(x.chunks(5000)) {
            acc.update(k, v).unwrap();
        }
        assert_eq!(acc.len(), want.len());
        for (k, w) in &want {
            let got = acc.get(*k).unwrap();
            assert_eq!(got.count, w.count);
            assert!(close(got.mean, w.mean, 1e-12) && close(got.m2, w.m2, 1e-9), "{got:?} {w:?}");
        }
    }

    #[test]
    fn used_moments_match_two_passes_over_the_list() {
        // prompts with 1 to 6 responses, means spread wide and noise that
        // differs per prompt; the moments of (s2, s2/K, g - gbar, (g - gbar)^2)
        let (mut keys, mut x) = (Vec::new(), Vec::new());
        for p in 0..20_000u64 {
            let k = 1 + (p * 7) % 6;
            for j in 0..k {
                keys.push(p * 1_000_003);
                x.push(100.0 + (p % 97) as f64 * 0.5 + ((j * 13 + p) % 11) as f64 * (1.0 + (p % 3) as f64));
            }
        }
        let mut acc = Accumulator::new();
        acc.update(&keys, &x).unwrap();
        let m = acc.used_moments().unwrap();
        let about = acc.used_moments_about(acc.summary().unwrap().grand_mean).unwrap();
        assert_eq!(format!("{about:?}"), format!("{m:?}"));
        assert!(acc.used_moments_about(f64::NAN).is_err());
        let c = acc.used_stats();
        let p = c.count.len();
        let gbar = c.mean.iter().sum::<f64>() / p as f64;
        let v: Vec<[f64; 4]> = (0..p)
            .map(|i| {
                let s2 = c.m2[i] / (c.count[i] - 1) as f64;
                let d = c.mean[i] - gbar;
                [s2, s2 / c.count[i] as f64, d, d * d]
            })
            .collect();
        let mu: [f64; 4] = std::array::from_fn(|a| v.iter().map(|r| r[a]).sum::<f64>() / p as f64);
        assert_eq!(m.n, p as u64);
        for a in 0..4 {
            assert!(close(m.mean[a], mu[a], 1e-9), "{a}: {} {}", m.mean[a], mu[a]);
            for b in 0..4 {
                let cov = v.iter().map(|r| (r[a] - mu[a]) * (r[b] - mu[b])).sum::<f64>() / (p - 1) as f64;
                assert!(close(m.cov[a][b], cov, 1e-9), "{a}{b}: {} {cov}", m.cov[a][b]);
            }
        }
        // the same bits whatever order the prompts come in
        let mut rev = Accumulator::new();
        let starts: Vec<usize> = (0..keys.len()).filter(|&i| i == 0 || keys[i] != keys[i - 1]).collect();
        for (j, &a) in starts.iter().enumerate().rev() {
            let b = starts.get(j + 1).copied().unwrap_or(keys.len());
            rev.update(&keys[a..b], &x[a..b]).unwrap();
        }
        assert_eq!(format!("{:?}", rev.used_moments().unwrap()), format!("{m:?}"));
        // too few prompts: the summary's error
        let mut few = Accumulator::new();
        few.update(&[1, 1, 2], &[1.0, 2.0, 3.0]).unwrap();
        assert!(few.used_moments().is_err());
    }

    #[test]
    fn index_order_is_hash_order() {
        assert!((0..1000u64).all(|k| unhash(hash(k * 977 + 5)) == k * 977 + 5));
        // one shard's worth: random keys through several growths, groups of
        // keys with the same 32-bit tag (so the full hash breaks the tie), and
        // keys homed at the last entries (their runs wrap round to the start)
        let shard = 5u64 << (64 - SHARD_BITS);
        let low = |r: u64| (r >> SHARD_BITS) & ((1u64 << (64 - SHARD_BITS)) - 1);
        let mut hs: Vec<u64> = (0..150_000u64).map(|i| shard | low(i.wrapping_mul(0xD134_2543_DE82_EF95))).collect();
        for g in 0..200u64 {
            let base = shard | low(g.wrapping_mul(0xA076_1D64_78BD_642F)) & !((1u64 << 26) - 1);
            hs.extend((0..3u64).map(|j| base | (j * 0x3_7777 + g) & ((1 << 26) - 1)));
        }
        hs.extend((0..30u64).map(|j| shard | (((1u64 << 32) - 1) << 26) | j));
        hs.sort_unstable();
        hs.dedup();
        let mut order = hs.clone();
        // inserted in a scrambled order
        order.sort_unstable_by_key(|h| h.wrapping_mul(0x2545_F491_4F6C_DD1D));
        let mut t = Table::default();
        for (i, &h) in order.iter().enumerate() {
            let k = unhash(h);
            assert_eq!(shard_of(hash(k)), 5);
            t.upsert(k, hash(k), &Stats { count: 1, mean: i as f64, m2: 0.0 });
        }
        let got: Vec<u64> = t.entries_in_hash_order().iter().map(|&e| hash(t.recs[record_of(e)].key)).collect();
        assert_eq!(got, hs);
        // the wrapped runs were really there
        assert!(t.index[..64].iter().enumerate().any(|(i, &e)| e != 0 && t.home(e >> 32) > i));
    }

    /// Neumaier-compensated sum: an accurate reference.
    fn acc_sum(x: impl Iterator<Item = f64>) -> f64 {
        let (mut s, mut c) = (0.0f64, 0.0f64);
        for v in x {
            let t = s + v;
            c += if s.abs() >= v.abs() { (s - t) + v } else { (v - t) + s };
            s = t;
        }
        s + c
    }

    /// Per key: (accurate mean and M2, Welford's mean and M2 over the rows in order).
    fn references(keys: &[u64], x: &[f64]) -> HashMap<u64, ((f64, f64), Stats)> {
        let mut groups: HashMap<u64, Vec<f64>> = HashMap::new();
        for (k, v) in keys.iter().zip(x) {
            groups.entry(*k).or_default().push(*v);
        }
        groups
            .into_iter()
            .map(|(k, v)| {
                let mean = acc_sum(v.iter().copied()) / v.len() as f64;
                let m2 = acc_sum(v.iter().map(|&y| (y - mean) * (y - mean)));
                let mut w = Stats::default();
                v.iter().for_each(|&y| w.push(y));
                (k, ((mean, m2), w))
            })
            .collect()
    }

    /// Rows with adversarial runs: a large common offset plus small noise,
    /// single-row runs, short runs, and runs longer than a scan block.
    fn adversarial(seed: u64, offset: f64, noise: f64) -> (Vec<u64>, Vec<f64>) {
        let mut s = seed | 1;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut keys, mut x) = (Vec::new(), Vec::new());
        while keys.len() < 3 * BLOCK {
            let len = match rnd() % 8 {
                0..=2 => 1,
                3..=5 => 2 + (rnd() % 20) as usize,
                6 => 8 * (1 + (rnd() % 8) as usize),
                _ => 1 + (rnd() % (BLOCK as u64 + 500)) as usize,
            };
            let key = rnd() % 37; // keys come back in later runs
            for _ in 0..len {
                keys.push(key);
                let u = (rnd() >> 11) as f64 / (1u64 << 53) as f64;
                x.push(offset + noise * (u - 0.5) + noise * (key as f64));
            }
        }
        (keys, x)
    }

    #[test]
    fn fast_path_is_at_least_as_accurate_as_welford() {
        for (seed, offset, noise) in
            [(1, 0.0, 1.0), (2, 1e9, 1.0), (3, 1e9, 1e-3), (4, -3e7, 1e-2), (5, 1e12, 10.0), (6, 1.0, 1e-9)]
        {
            let (keys, x) = adversarial(seed, offset, noise);
            let mut acc = Accumulator::new();
            // in a few calls, so runs are also cut at call boundaries
            for (kc, xc) in keys.chunks(5000).zip(x.chunks(5000)) {
                acc.update(kc, xc).unwrap();
            }
            let refs = references(&keys, &x);
            assert_eq!(acc.len(), refs.len());
            let (mut err_fast, mut err_welford) = (0.0f64, 0.0f64);
            for (k, ((mean, m2), w)) in &refs {
                let t = acc.get(*k).unwrap();
                assert_eq!(t.count, w.count);
                // means: a few ulps of the offset
                assert!((t.mean - mean).abs() <= 1e-13 * (1.0 + mean.abs()), "{seed}: mean {} vs {mean}", t.mean);
                err_fast = err_fast.max((t.m2 - m2).abs() / m2);
                err_welford = err_welford.max((w.m2 - m2).abs() / m2);
            }
            assert!(
                err_fast <= 2.0 * err_welford + 1e-12,
                "seed {seed}: relative M2 error {err_fast:e} (Welford {err_welford:e})"
            );
        }
    }

    #[test]
    fn vector_and_portable_scans_agree_bit_for_bit() {
        let (keys, x) = adversarial(9, 1e9, 1.0);
        let (mut a, mut b) = (buckets(), buckets());
        assert_eq!(scan_runs(&keys, &x, &mut a), None);
        assert_eq!(scan_runs_dispatch(&keys, &x, &mut b), None);
        for (ba, bb) in a.iter().zip(&b) {
            assert_eq!(ba.len(), bb.len());
            for (p, q) in ba.iter().zip(bb) {
                assert_eq!(
                    (p.key, p.st.count, p.st.mean.to_bits(), p.st.m2.to_bits()),
                    (q.key, q.st.count, q.st.mean.to_bits(), q.st.m2.to_bits())
                );
            }
            assert!(ba.iter().all(|r| shard_of(hash(r.key)) == shard_of(hash(ba[0].key))));
        }
        // runs are maximal within a block: a run starts where the key changes or a block begins
        let starts = (0..keys.len()).filter(|&i| i % BLOCK == 0 || keys[i] != keys[i - 1]).count();
        assert_eq!(a.iter().map(|b| b.len()).sum::<usize>(), starts);
        assert_eq!(a.iter().flatten().map(|r| r.st.count as usize).sum::<usize>(), keys.len());
    }

    #[test]
    fn summary_does_not_depend_on_insertion_order() {
        // the same per-prompt statistics reached in opposite orders, and with
        // a table sized up front: the summary is the same to the bit
        let prompts: Vec<u64> = (0..5000u64).map(|p| p.wrapping_mul(0x2545_F491_4F6C_DD1D) >> (p % 40)).collect();
        let rows = |p: u64| [(p % 97) as f64, ((p * 7) % 13) as f64 + 0.25, 1.0 / (1 + p % 5) as f64];
        let mut fwd = Accumulator::new();
        for &p in &prompts {
            fwd.update(&[p; 3], &rows(p)).unwrap();
        }
        let mut rev = Accumulator::with_capacity(prompts.len()).unwrap();
        for &p in prompts.iter().rev() {
            rev.update(&[p; 3], &rows(p)).unwrap();
        }
        assert_eq!(fwd.to_bytes(), rev.to_bytes());
        let (a, b) = (fwd.summary().unwrap(), rev.summary().unwrap());
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!(a.v_x_raw.to_bits(), b.v_x_raw.to_bits());
        // the bootstrap's prompts: the same list in either order, only those
        // with two or more responses
        let mut one = fwd.clone();
        one.update(&[u64::MAX - 3], &[1.0]).unwrap();
        let (u, w) = (fwd.used_stats(), one.used_stats());
        assert_eq!(format!("{u:?}"), format!("{:?}", rev.used_stats()));
        assert_eq!(format!("{u:?}"), format!("{w:?}"));
        assert_eq!(u.count.len() as u64, a.n_used_prompts);
        // in key-hash order: the same as sorting the per-prompt list by hash
        let (keys, stats) = fwd.per_prompt();
        let mut by_hash: Vec<(u64, Stats)> =
            keys.iter().zip(&stats).filter(|(_, s)| s.count >= 2).map(|(&k, &s)| (hash(k), s)).collect();
        by_hash.sort_unstable_by_key(|e| e.0);
        assert_eq!(u.count, by_hash.iter().map(|e| e.1.count).collect::<Vec<_>>());
        assert_eq!(u.mean, by_hash.iter().map(|e| e.1.mean).collect::<Vec<_>>());
        assert_eq!(u.m2, by_hash.iter().map(|e| e.1.m2).collect::<Vec<_>>());
        // distinct keys never share a hash (spot check of the bijection)
        let mut h: Vec<u64> = prompts.iter().map(|&k| hash(k)).collect();
        h.sort_unstable();
        h.dedup();
        let mut k = prompts.clone();
        k.sort_unstable();
        k.dedup();
        assert_eq!(h.len(), k.len());
    }

    #[test]
    fn thread_count_does_not_change_a_bit() {
        // big enough for the parallel path, with runs cut by update and block boundaries
        let (mut keys2, mut x2) = (Vec::new(), Vec::new());
        for seed in 0..16u64 {
            let (k, x) = adversarial(21 + seed, 3.0, 1.0);
            keys2.extend(k.iter().map(|k| k + 40 * (seed % 5)));
            x2.extend(x);
        }
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let mut acc = Accumulator::new();
                for (kc, xc) in keys2.chunks(PAR_ROWS + 777).zip(x2.chunks(PAR_ROWS + 777)) {
                    acc.update(kc, xc).unwrap();
                }
                acc.to_bytes()
            })
        };
        assert!(keys2.len() > 2 * PAR_ROWS);
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(3));
    }

    #[test]
    fn bad_values_anywhere_are_named_and_nothing_is_added() {
        let (keys, x) = adversarial(11, 0.0, 1.0);
        let n = keys.len();
        for (pos, bad) in
            [(0, f64::NAN), (BLOCK + 3, f64::INFINITY), (n - 1, f64::NEG_INFINITY), (2 * BLOCK - 1, f64::NAN)]
        {
            let mut y = x.clone();
            y[pos] = bad;
            let mut acc = Accumulator::new();
            acc.update(&[5, 5], &[1.0, 2.0]).unwrap();
            let e = acc.update(&keys, &y).unwrap_err().to_string();
            assert!(e.contains(&format!("row {} (row {pos} of this update)", pos + 2)), "{e}");
            assert_eq!((acc.n_rows(), acc.len()), (2, 1));
        }
        // finite values whose sum or squared deviations overflow
        let mut acc = Accumulator::new();
        assert!(acc.update(&[1, 1], &[1e308, 1e308]).unwrap_err().to_string().contains("overflow"));
        assert!(acc.update(&[1, 1, 2], &[0.0, 1.0, 1e200]).is_ok());
        assert!(acc.update(&[3, 3], &[1e200, -1e200]).unwrap_err().to_string().contains("overflow"));
        assert_eq!(acc.n_rows(), 3);
    }

    #[test]
    fn large_tables_grow_and_clone() {
        // enough prompts for the table to use the large (mapped) buffer
        let n = 400_000u64;
        // (each prompt twice, far apart, so that the accumulator indexes them)
        let odd = 0x9E37_79B9_7F4A_7C15u64;
        let keys: Vec<u64> = (0..2 * n).map(|i| (i % n).wrapping_mul(odd)).collect();
        let x: Vec<f64> = (0..2 * n).map(|i| (i % 7) as f64).collect();
        let mut acc = Accumulator::with_capacity(4_000_000).unwrap();
        acc.update(&keys, &x).unwrap();
        let mut grown = Accumulator::new();
        grown.update(&keys, &x).unwrap();
        assert!(same(&acc, &grown));
        assert_eq!(acc.to_bytes(), grown.to_bytes());
        let mapped = |t: &Table| t.recs.mapped || !cfg!(target_os = "linux");
        assert!(acc.shards.0.iter().all(|t| mapped(t) && t.recs.len() * std::mem::size_of::<Slot>() >= HUGE));
        let c = acc.clone();
        assert!(same(&acc, &c));
        // two large shards, each with prompts of the other, merged in
        // parallel: the same as one pass
        let (mut a, mut b) = (Accumulator::new(), Accumulator::new());
        let h = keys.len() / 2 + 1; // odd split: prompt h/2 has a row in each
        a.update(&keys[..h], &x[..h]).unwrap();
        b.update(&keys[h..], &x[h..]).unwrap();
        assert!(a.len() >= PAR_ROWS && b.len() >= PAR_ROWS);
        a.merge(&b);
        assert!(same(&a, &grown));
        assert!(acc.is_indexed() && grown.is_indexed() && a.is_indexed());
        let s = acc.get(12345u64.wrapping_mul(odd)).unwrap();
        assert_eq!(s.count, 2);
        assert!(close(s.mean, (x[12345] + x[12345 + n as usize]) / 2.0, 1e-15));
    }

    /// An empty accumulator that files prompts in its hash tables from the
    /// first row (the reference for the log).
    fn indexed() -> Accumulator {
        let mut a = Accumulator::new();
        a.build_index();
        a
    }

    /// Everything a caller can read of two accumulators, bit for bit.
    #[track_caller]
    fn same_bits(a: &Accumulator, b: &Accumulator) {
        assert!(
            a.n_rows() == b.n_rows() && a.len() == b.len(),
            "{} {} {} {}",
            a.n_rows(),
            b.n_rows(),
            a.len(),
            b.len()
        );
        assert!(a.to_bytes() == b.to_bytes(), "the states differ");
        assert_eq!(format!("{:?}", a.summary()), format!("{:?}", b.summary()));
        assert_eq!(format!("{:?}", a.used_moments()), format!("{:?}", b.used_moments()));
        assert_eq!(format!("{:?}", a.used_stats()), format!("{:?}", b.used_stats()));
    }

    /// Sorted ids in runs of 1 to `max_run` rows (some runs far longer than a
    /// block), with values around a mean of their own.
    fn sorted_rows(seed: u64, n: usize, max_run: u64) -> (Vec<i64>, Vec<f64>) {
        let mut s = seed | 1;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let (mut ids, mut x) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut id = -(n as i64) / 3;
        while ids.len() < n {
            let len = if rnd() % 50 == 0 { 1 + rnd() % (3 * BLOCK as u64) } else { 1 + rnd() % max_run };
            for _ in 0..len.min((n - ids.len()) as u64) {
                ids.push(id);
                x.push((id % 17) as f64 + (rnd() >> 11) as f64 / (1u64 << 53) as f64);
            }
            id += 1 + (rnd() % 3) as i64;
        }
        (ids, x)
    }

    #[test]
    fn sorted_ids_keep_a_log_with_the_bits_of_the_tables() {
        let (ids, x) = sorted_rows(3, 5 * PAR_ROWS + 1234, 40);
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                // updates of many sizes: runs cut by blocks, by the parallel
                // parts of an update and by updates
                for chunk in [ids.len(), PAR_ROWS + 777, 5000, 17] {
                    let (mut log, mut tab) = (Accumulator::new(), indexed());
                    for (ic, xc) in ids.chunks(chunk).zip(x.chunks(chunk)) {
                        log.update_int_ids(ic, xc).unwrap();
                        tab.update_int_ids(ic, xc).unwrap();
                    }
                    assert!(!log.is_indexed() && tab.is_indexed());
                    assert_eq!(log.len(), tab.len());
                    same_bits(&log, &tab);
                    let k = crate::sampling::key_of_int(ids[777]);
                    assert_eq!(log.get(k), tab.get(k));
                    // an update whose ids come back: a log of runs, each
                    // prompt's merged in row order when read, same bits
                    let (mut log2, mut tab2) = (log.clone(), tab.clone());
                    log2.update_int_ids(&ids[..3000], &x[..3000]).unwrap();
                    tab2.update_int_ids(&ids[..3000], &x[..3000]).unwrap();
                    assert!(!log2.is_indexed() && !log2.log.sorted);
                    same_bits(&log2, &tab2);
                    assert_eq!(log2.get(k), tab2.get(k));
                    // and once its runs are clearly more than its prompts
                    // (rows not grouped), the tables
                    for _ in 0..8 {
                        log2.update_int_ids(&ids, &x).unwrap();
                        tab2.update_int_ids(&ids, &x).unwrap();
                        if log2.is_indexed() {
                            break;
                        }
                        // (runs: the prompts' once, and then every repeat's)
                        assert!(log2.log.groups < 2 * log2.len() + 8192);
                    }
                    assert!(log2.is_indexed());
                    same_bits(&log2, &tab2);
                    // merges of such logs and of tables
                    let (mut m, mut t) = (log.clone(), tab.clone());
                    let (mut u, mut v) = (Accumulator::new(), indexed());
                    u.update_int_ids(&ids[1000..][..5000], &x[1000..][..5000]).unwrap();
                    u.update_int_ids(&ids[..3000], &x[..3000]).unwrap();
                    v.update_int_ids(&ids[1000..][..5000], &x[1000..][..5000]).unwrap();
                    v.update_int_ids(&ids[..3000], &x[..3000]).unwrap();
                    assert!(!u.is_indexed() && !u.log.sorted);
                    m.merge(&u);
                    t.merge(&v);
                    same_bits(&m, &t);
                    let mut w = u.clone();
                    w.merge(&log);
                    let mut y = v.clone();
                    y.merge(&tab);
                    same_bits(&w, &y);
                    // the index built on request, same bits
                    log.build_index();
                    same_bits(&log, &tab);
                }
            });
        }
        // and the same as the reference per prompt
        let keys: Vec<u64> = ids.iter().map(|&i| crate::sampling::key_of_int(i)).collect();
        let mut log = Accumulator::new();
        log.update_int_ids(&ids, &x).unwrap();
        let r = reference(&keys, &x);
        assert_eq!(r.len(), log.len());
        for (k, s) in &r {
            let t = log.get(*k).unwrap();
            assert!(s.count == t.count && close(s.mean, t.mean, 1e-12) && close(s.m2, t.m2, 1e-9));
        }
    }

    #[test]
    fn a_log_leaves_for_the_tables_when_it_must() {
        let (ids, x) = sorted_rows(9, 3 * PAR_ROWS, 9);
        let keys: Vec<u64> = ids.iter().map(|&i| i as u64 ^ (1 << 63)).collect();
        let h = ids.len() / 2 + 1;
        let part = |ids: &[i64], x: &[f64], tables: bool| {
            let mut a = if tables { indexed() } else { Accumulator::new() };
            a.update_int_ids(ids, x).unwrap();
            a
        };
        // shards of a sorted stream merged in order stay a log (a prompt
        // cut between them merged), in another order they build the index:
        // the bits of the same merges of tables
        let (a, b) = (part(&ids[..h], &x[..h], false), part(&ids[h..], &x[h..], false));
        let (ta, tb) = (part(&ids[..h], &x[..h], true), part(&ids[h..], &x[h..], true));
        assert_eq!(ids[h - 1], ids[h]);
        let mut tab = ta.clone();
        tab.merge(&tb);
        let mut m = a.clone();
        m.merge(&b);
        assert!(!m.is_indexed());
        same_bits(&m, &tab);
        let (mut m, mut t) = (b.clone(), tb.clone());
        m.merge(&a);
        t.merge(&ta);
        assert!(m.is_indexed());
        same_bits(&m, &t);
        // a log into tables, tables into a log
        let mut m = indexed();
        m.merge(&a);
        m.merge(&b);
        same_bits(&m, &tab);
        let mut m = a.clone();
        m.merge(&tb);
        assert!(m.is_indexed());
        same_bits(&m, &tab);
        // the same numbers as 64-bit keys: a log of its own kind, which
        // does not take integer ids
        let mut k = Accumulator::new();
        k.update(&keys[..h], &x[..h]).unwrap();
        assert!(!k.is_indexed());
        k.update_int_ids(&ids[h..], &x[h..]).unwrap();
        assert!(!k.is_indexed() && !k.log.sorted && k.len() == tab.len() + 1);
        let mut kt = indexed();
        kt.update(&keys[..h], &x[..h]).unwrap();
        kt.update_int_ids(&ids[h..], &x[h..]).unwrap();
        same_bits(&k, &kt);
        let mut k2 = Accumulator::new();
        k2.update(&keys[..h], &x[..h]).unwrap();
        k2.merge(&b);
        assert!(k2.is_indexed() && k2.len() == tab.len() + 1);
        // a bad loss in a later stretch of a large first update: nothing
        // kept, and a log again
        let n = 2 * STRETCH + 99;
        let (big, mut y) = sorted_rows(4, n, 30);
        y[STRETCH + 5] = f64::INFINITY;
        let mut e = Accumulator::with_capacity(10).unwrap();
        let err = e.update_int_ids(&big, &y).unwrap_err().to_string();
        assert!(err.contains(&format!("row {} ", STRETCH + 5)), "{err}");
        assert!(e.is_empty() && e.n_rows() == 0 && !e.is_indexed());
        e.update_int_ids(&ids, &x).unwrap();
        same_bits(&e, &part(&ids, &x, true));
        // unsorted in its second stretch: still grouped, so a log of runs;
        // not grouped in its second stretch: the tables are sized for the
        // update's runs when they are built; the bits are the same
        let (mut big, y) = sorted_rows(5, n, 30);
        big[STRETCH + 7..].iter_mut().for_each(|v| *v = -*v);
        let mut a = Accumulator::new();
        a.update_int_ids(&big, &y).unwrap();
        let mut b = indexed();
        b.update_int_ids(&big, &y).unwrap();
        assert!(!a.is_indexed() && !a.log.sorted);
        same_bits(&a, &b);
        for (i, v) in big[STRETCH + 7..].iter_mut().enumerate() {
            *v = ((i / 5) % 1000) as i64;
        }
        let mut a = Accumulator::new();
        a.update_int_ids(&big, &y).unwrap();
        let mut b = indexed();
        b.update_int_ids(&big, &y).unwrap();
        assert!(a.is_indexed());
        same_bits(&a, &b);
        let runs = count_runs(&big);
        let mut sized = Accumulator::with_capacity(runs).unwrap();
        sized.build_index();
        let lens = |acc: &Accumulator| acc.shards.0.iter().map(|t| t.index.len()).collect::<Vec<_>>();
        assert!(runs * 2 <= n && lens(&a) == lens(&sized));
    }

    #[test]
    fn the_sketch_counts_distinct_keys_within_a_few_percent() {
        let odd = 0x9E37_79B9_7F4A_7C15u64;
        for n in [0u64, 1, 100, 5_000, 100_000, 2_000_000] {
            // sequential keys (the hard case for a weak hash) and mixed ones,
            // added in two orders and with repeats
            for keys in [(0..n).collect::<Vec<u64>>(), (0..n).map(|i| i.wrapping_mul(odd)).collect()] {
                let (mut a, mut b) = (Sketch::new(), Sketch::new());
                for (i, &k) in keys.iter().enumerate() {
                    a.add(k);
                    if i % 2 == 0 {
                        b.add(k);
                    }
                }
                keys.iter().for_each(|&k| b.add(k));
                keys.iter().for_each(|&k| a.add(k));
                let (ea, eb) = (a.estimate(), b.estimate());
                assert!((ea - n as f64).abs() <= 0.03 * n as f64 + 1.0, "{n}: {ea}");
                // a sketch does not depend on repeats or order; merges are exact
                assert_eq!(ea, eb);
                let mut c = Sketch::new();
                c.merge(&a);
                c.merge(&b);
                assert_eq!(c.estimate(), ea);
            }
        }
        // grouped rows stay a log, rows that repeat their prompts do not
        let (mut sk, groups) = (Sketch::new(), 200_000usize);
        (0..groups as u64).for_each(|k| sk.add(k));
        assert!(!Log::too_many(&sk, groups + 1000));
        assert!(Log::too_many(&sk, 2 * groups));
    }

    #[test]
    fn a_large_log_is_mapped_and_reserved_without_the_tables() {
        let n = 200_000usize;
        let mut a = Accumulator::with_capacity(n).unwrap();
        let ids: Vec<i64> = (0..2 * n as i64).map(|i| i / 2).collect();
        let x: Vec<f64> = (0..2 * n).map(|i| (i % 7) as f64).collect();
        a.update_int_ids(&ids, &x).unwrap();
        assert!(!a.is_indexed() && a.len() == n);
        assert!(a.log.recs.mapped || !cfg!(target_os = "linux"));
        // the tables were left at their first size, and are sized for the
        // prompts reserved when they are built
        assert!(a.shards.0.iter().all(|t| t.index.len() == 16));
        let mut b = a.clone();
        b.build_index();
        let mut sized = Accumulator::with_capacity(n).unwrap();
        sized.build_index();
        let lens = |acc: &Accumulator| acc.shards.0.iter().map(|t| t.index.len()).collect::<Vec<_>>();
        assert_eq!(lens(&b), lens(&sized));
        same_bits(&a, &b);
    }

    fn rows() -> impl Strategy<Value = (Vec<u64>, Vec<f64>)> {
        (1usize..300).prop_flat_map(|n| (prop::collection::vec(0u64..12, n), prop::collection::vec(-50.0f64..50.0, n)))
    }

    proptest! {
        #[test]
        fn any_split_and_merge_order_equals_one_pass(
            (keys, x) in rows(),
            cuts in prop::collection::vec(0usize..300, 0..6),
            perm_seed in any::<u64>(),
        ) {
            let mut one = Accumulator::new();
            one.update(&keys, &x).unwrap();
            // reference
            let r = reference(&keys, &x);
            prop_assert_eq!(one.len(), r.len());
            for (k, s) in &r {
                let t = one.get(*k).unwrap();
                prop_assert_eq!(s.count, t.count);
                prop_assert!(close(s.mean, t.mean, 1e-9) && close(s.m2, t.m2, 1e-7));
            }
            // shards
            let n = keys.len();
            let mut c: Vec<usize> = cuts.into_iter().map(|v| v % (n + 1)).collect();
            c.push(0); c.push(n); c.sort_unstable(); c.dedup();
            let mut shards: Vec<Accumulator> = c.windows(2).map(|w| {
                let mut a = Accumulator::new();
                a.update(&keys[w[0]..w[1]], &x[w[0]..w[1]]).unwrap();
                a
            }).collect();
            // merge in a scrambled order, as a tree
            let mut s = perm_seed;
            while shards.len() > 1 {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let i = (s >> 33) as usize % shards.len();
                let a = shards.swap_remove(i);
                let j = (s >> 17) as usize % shards.len();
                shards[j].merge(&a);
            }
            let merged = shards.pop().unwrap();
            prop_assert!(same(&one, &merged));
            // and a serialised round trip
            let back = Accumulator::from_bytes(&merged.to_bytes()).unwrap();
            prop_assert!(same(&merged, &back));
            if let (Ok(a), Ok(b)) = (one.summary(), merged.summary()) {
                prop_assert!(close(a.v_x_raw, b.v_x_raw, 1e-7) && close(a.v_y_given_x, b.v_y_given_x, 1e-7));
            }
        }

        #[test]
        fn a_log_has_the_bits_of_the_tables(
            runs in prop::collection::vec((0i64..40, 1usize..12), 1..80),
            sorted in any::<bool>(),
            cuts in prop::collection::vec(0usize..600, 0..6),
            vals in prop::collection::vec(-1e3f64..1e3, 600),
        ) {
            // runs of ids, in increasing order or as drawn (prompts that come
            // back), streamed in updates cut anywhere, then merged
            let mut runs = runs;
            if sorted {
                runs.sort_by_key(|r| r.0);
            }
            let ids: Vec<i64> = runs.iter().flat_map(|&(id, n)| std::iter::repeat_n(id, n)).collect();
            let x: Vec<f64> = (0..ids.len()).map(|i| vals[i % vals.len()] + i as f64 * 1e-3).collect();
            let n = ids.len();
            let mut c: Vec<usize> = cuts.into_iter().map(|v| v % (n + 1)).collect();
            c.push(0);
            c.push(n);
            c.sort_unstable();
            c.dedup();
            let (mut log, mut tab) = (Accumulator::new(), indexed());
            for w in c.windows(2) {
                log.update_int_ids(&ids[w[0]..w[1]], &x[w[0]..w[1]]).unwrap();
                tab.update_int_ids(&ids[w[0]..w[1]], &x[w[0]..w[1]]).unwrap();
            }
            prop_assert!(!log.is_indexed());
            prop_assert_eq!(log.log.sorted, sorted || ids.windows(2).all(|w| w[0] <= w[1]));
            prop_assert_eq!(log.len(), tab.len());
            prop_assert!(log.to_bytes() == tab.to_bytes());
            prop_assert_eq!(format!("{:?}", log.summary()), format!("{:?}", tab.summary()));
            prop_assert_eq!(format!("{:?}", log.used_moments()), format!("{:?}", tab.used_moments()));
            prop_assert_eq!(format!("{:?}", log.used_stats()), format!("{:?}", tab.used_stats()));
            for &id in ids.iter().take(5) {
                let k = crate::sampling::key_of_int(id);
                prop_assert_eq!(log.get(k), tab.get(k));
            }
            // merged into a copy of itself (the tables are built): the same
            let (mut l2, mut t2) = (log.clone(), tab.clone());
            l2.merge(&log);
            t2.merge(&tab);
            prop_assert!(l2.to_bytes() == t2.to_bytes());
        }

        #[test]
        fn row_order_does_not_matter((keys, x) in rows(), seed in any::<u64>()) {
            let mut idx: Vec<usize> = (0..keys.len()).collect();
            let mut s = seed;
            for i in (1..idx.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                idx.swap(i, (s >> 33) as usize % (i + 1));
            }
            let k2: Vec<u64> = idx.iter().map(|&i| keys[i]).collect();
            let x2: Vec<f64> = idx.iter().map(|&i| x[i]).collect();
            let mut a = Accumulator::new();
            a.update(&keys, &x).unwrap();
            let mut b = Accumulator::new();
            b.update(&k2, &x2).unwrap();
            prop_assert!(same(&a, &b));
        }
    }
}
