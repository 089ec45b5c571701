//! Streaming, mergeable prompt/response variance accumulators (see the
//! variance-budget law). Filled in by the diagnostics work.
