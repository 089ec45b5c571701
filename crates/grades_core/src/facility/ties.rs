//! Ties and duplicates: how greedy chooses among gains that are equal, so
//! that no pick is decided by the position of a row.
//!
//! **Ties.** A gain is a sum whose order follows the rows, so two candidates
//! whose gains are equal in exact arithmetic can differ in the last bits.
//! Gains within [`TIE_RTOL`] times the pool's largest gain (its first pick's)
//! of the step's largest gain count as tied, all-zero gains included. Among
//! tied candidates greedy takes, in this order:
//!
//! 1. the higher quality (reward), when the pool has rewards;
//! 2. the higher pure-coverage gain (the alpha = 0 gain, with the cover of
//!    the kept set under weights 1), when the weights are not all equal;
//! 3. the smaller content key ([`crate::keys::content_key`]: a hash of the
//!    candidate's embedding and its text key; rewards were rule 1), or its position
//!    when the pool is already ordered by a `candidate_key` or when only a
//!    similarity is known;
//! 4. the higher reward (rows with one embedding whose qualities round to
//!    the same value), then the lower position (only rows equal in all of
//!    the above remain).
//!
//! **Duplicates.** Once a candidate is kept, every candidate with the same
//! embedding (value for value) or the same text key is set aside: it is picked
//! only when nothing else is left. Its gain is 0 in exact arithmetic unless
//! its weight exceeds its kept twin's, which greedy (by rule 1) never leaves
//! behind, so the objective is unchanged.
//!
//! Only ties are affected, so the objective and its certificate are those
//! of greedy.

/// Relative tolerance under which two gains count as equal (relative to the
/// pool's first, and largest, gain).
pub const TIE_RTOL: f64 = 1e-9;

use crate::embeddings::Embeddings;

/// Where a candidate's embedding is read.
#[derive(Clone, Copy)]
enum Rows<'a> {
    /// the caller's matrix, at the candidate's row
    Matrix(&'a Embeddings<'a>),
    /// the pool's own rows gathered in ground-set order (`d` columns)
    Block(&'a [f32], usize),
}

/// What greedy knows of the candidates' content, by ground-set position.
#[derive(Default)]
pub struct Content<'a> {
    /// the candidates' embeddings
    data: Option<Rows<'a>>,
    /// matrix row of each ground-set element (empty: no content known)
    rows: Vec<usize>,
    /// rewards and text keys, by matrix row
    rewards: Option<&'a [f64]>,
    text: Option<&'a [u64]>,
    /// the ground set is in the order of a caller's key: positions decide
    ordered: bool,
}

impl<'a> Content<'a> {
    /// No content known: ties after quality and coverage go to the lower position.
    pub fn none() -> Self {
        Content::default()
    }

    /// The rows `rows` (by ground-set position) of `data`.
    pub fn new(
        data: &'a Embeddings<'a>,
        rows: Vec<usize>,
        rewards: Option<&'a [f64]>,
        text: Option<&'a [u64]>,
        ordered: bool,
    ) -> Self {
        Content { data: Some(Rows::Matrix(data)), rows, rewards, text, ordered }
    }

    /// As [`Content::new`], with the embeddings read from `block` (row `j`
    /// holds ground-set element `j`, `d` columns) rather than the matrix.
    pub fn of_block(
        block: &'a [f32],
        d: usize,
        rows: Vec<usize>,
        rewards: Option<&'a [f64]>,
        text: Option<&'a [u64]>,
        ordered: bool,
    ) -> Self {
        Content { data: Some(Rows::Block(block, d)), rows, rewards, text, ordered }
    }

    fn known(&self) -> bool {
        !self.rows.is_empty() && self.data.is_some()
    }

    /// The content key of element `j` (rule 3).
    pub fn key(&self, j: usize) -> u64 {
        if self.rows.is_empty() || self.ordered {
            return j as u64;
        }
        let r = self.rows[j];
        let text = self.text.map(|t| t[r]);
        match self.data {
            Some(Rows::Matrix(m)) => m.content_key(r, None, text),
            Some(Rows::Block(x, d)) => crate::keys::content_key(&x[j * d..(j + 1) * d], None, text),
            None => j as u64,
        }
    }

    /// Whether `a` and `b` are duplicates: the same text key, or the same
    /// embedding bit for bit.
    pub fn same(&self, a: usize, b: usize) -> bool {
        if !self.known() {
            return false;
        }
        if let Some(t) = self.text {
            if t[self.rows[a]] == t[self.rows[b]] {
                return true;
            }
        }
        match self.data {
            Some(Rows::Matrix(m)) => m.same_rows(self.rows[a], self.rows[b]),
            Some(Rows::Block(x, d)) => x[a * d..(a + 1) * d] == x[b * d..(b + 1) * d],
            None => false,
        }
    }
}

/// How a pool's ties are decided: its qualities (by ground-set position)
/// and its content.
#[derive(Default)]
pub struct Ties<'a> {
    pub quality: Option<Vec<f64>>,
    pub content: Content<'a>,
}

impl Ties<'_> {
    pub fn none() -> Self {
        Ties::default()
    }
}

/// The running state of one greedy run: duplicates set aside, the pool's
/// first gain, and the counts of what happened.
pub(super) struct Picker<'t, 'a> {
    ties: &'t Ties<'a>,
    unit: bool,
    shadow: Vec<bool>,
    /// unchosen candidates not set aside; 0 lifts the setting aside
    live: usize,
    g0: Option<f64>,
    chosen: Vec<usize>,
    pub n_ties: usize,
    pub n_zero: usize,
    ones: Vec<f64>,
    c0: Vec<f64>,
    buf: Vec<f64>,
    tied: Vec<(usize, f64)>,
}

impl<'t, 'a> Picker<'t, 'a> {
    pub fn new(ties: &'t Ties<'a>, n: usize, w: &[f64]) -> Self {
        Picker {
            ties,
            // equal weights: every gain is the coverage gain times one factor
            unit: w[..n].iter().all(|&v| v == w[0]),
            shadow: vec![false; n],
            live: n,
            g0: None,
            chosen: Vec::new(),
            n_ties: 0,
            n_zero: 0,
            ones: Vec::new(),
            c0: Vec::new(),
            buf: Vec::new(),
            tied: Vec::new(),
        }
    }

    /// Whether `j` (unchosen) is set aside as a duplicate of a kept candidate.
    #[inline(always)]
    pub fn aside(&self, j: usize) -> bool {
        self.live > 0 && self.shadow[j]
    }

    /// The smallest gain tied with the step's largest eligible gain `gmax`.
    #[inline(always)]
    pub fn threshold(&self, gmax: f64) -> f64 {
        gmax - TIE_RTOL * self.g0.unwrap_or(0.0).max(gmax)
    }

    /// One of the tied candidates `tied` (element, gain), by the rules above.
    pub fn resolve<S: super::source::Source + ?Sized>(&mut self, src: &mut S, all: &[(usize, f64)]) -> (usize, f64) {
        if all.len() == 1 {
            return all[0];
        }
        let mut tied = std::mem::take(&mut self.tied);
        tied.clear();
        tied.extend_from_slice(all);
        let best = self.resolve_in(src, &mut tied);
        self.tied = tied;
        best
    }

    fn resolve_in<S: super::source::Source + ?Sized>(
        &mut self,
        src: &mut S,
        tied: &mut Vec<(usize, f64)>,
    ) -> (usize, f64) {
        if tied.len() > 1 {
            // a tie among exact duplicates only is no choice at all
            let c = &self.ties.content;
            let first = tied[0].0;
            if !c.known() || tied[1..].iter().any(|&(j, _)| !c.same(j, first)) {
                self.n_ties += 1;
            }
            if let Some(q) = &self.ties.quality {
                let qmax = tied.iter().fold(f64::NEG_INFINITY, |a, &(j, _)| a.max(q[j]));
                tied.retain(|&(j, _)| q[j] == qmax);
            }
        }
        if tied.len() > 1 && !self.unit {
            let n = src.n();
            self.ones.resize(n, 1.0);
            self.c0.clear();
            self.c0.resize(n, 0.0);
            for &j in &self.chosen {
                src.cover(j, &self.ones, &mut self.c0);
            }
            let js: Vec<usize> = tied.iter().map(|&(j, _)| j).collect();
            self.buf.resize(js.len(), 0.0);
            src.gains(&js, &self.ones, &self.c0, &mut self.buf);
            let cmax = self.buf.iter().fold(0.0f64, |a, &v| a.max(v));
            let thr = cmax - TIE_RTOL * cmax;
            let mut i = 0;
            tied.retain(|_| {
                i += 1;
                self.buf[i - 1] >= thr
            });
        }
        if tied.len() > 1 {
            let c = &self.ties.content;
            // the content key, then (rows with one embedding) the higher reward, then the position
            let reward = |j: usize| c.rewards.map_or(0.0, |r| r[c.rows[j]] + 0.0);
            let best = tied
                .iter()
                .map(|&(j, g)| (c.key(j), j, g))
                .min_by(|a, b| a.0.cmp(&b.0).then(reward(b.1).total_cmp(&reward(a.1))).then(a.1.cmp(&b.1)))
                .unwrap();
            return (best.1, best.2);
        }
        tied[0]
    }

    /// Record the pick of `j` with gain `g`; `chosen` marks the kept set
    /// (with `j` already in it). Sets aside the duplicates of `j`.
    pub fn picked(&mut self, j: usize, g: f64, chosen: &[bool]) {
        if self.g0.is_none() {
            self.g0 = Some(g);
        }
        if g <= TIE_RTOL * self.g0.unwrap_or(0.0) {
            self.n_zero += 1;
        }
        self.chosen.push(j);
        if !self.shadow[j] {
            self.live -= 1;
        }
        if self.ties.content.known() {
            for (i, &ch) in chosen.iter().enumerate() {
                if !ch && !self.shadow[i] && self.ties.content.same(i, j) {
                    self.shadow[i] = true;
                    self.live -= 1;
                }
            }
        }
    }

    /// Candidates set aside and never kept.
    pub fn n_skipped(&self, chosen: &[bool]) -> usize {
        self.shadow.iter().zip(chosen).filter(|&(&s, &c)| s && !c).count()
    }
}
