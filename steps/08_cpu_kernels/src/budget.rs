//! Where a decode step's time goes: the forward pass names the part each piece of work belongs to (`timed`), and
//! while a budget is being taken (`Engine.decode_budget`) each part's time and the bytes it reads add up, so that a
//! step's time is a sum of named parts (docs/steps/08_cpu_kernels/budget.md); the products also count their
//! multiply-adds (`timed_product`), which set a prompt read's pace. Otherwise `timed` only runs its work: one
//! thread-local flag read.
//!
//! A part's time is its own: work timed inside another part (a projection inside attention) counts for the inner
//! part only, and the time between the named parts of a pass — the views and small ops that glue them, the Rust
//! between — goes to `Part::Rest`. Every op here is synchronous on a CPU, so a clock read after it is its end.
use std::cell::RefCell;
use std::time::Instant;

use crate::cpu;

extern "C" {
    fn torchtpu_fma_limit(rounds: i64, tries: i32) -> f64; // peak.cpp
}

/// The parts of a decode step, in the order a step does them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The rows of `embed_tokens` and of the per-layer table one token gathers.
    Gathers,
    /// `per_layer_model_projection`: the context part of the per-layer inputs.
    PerLayerModelProjection,
    /// Placing the token in the caches (its slots and masks) and writing its keys and values.
    CacheWrite,
    QkvProjections,
    /// Scores, softmax and the weighted sum over the cached keys and values.
    Attention,
    OProjection,
    GateUpProjections,
    DownProjection,
    /// Each layer's `per_layer_input_gate` and `per_layer_projection`.
    PerLayerInput,
    /// The output head: 262,144 × 1536 at E2B.
    Head,
    /// The RMS norms, each in one call with what follows it: the rotary embedding of q and k, a branch's residual add,
    /// the layer scalar.
    Norms,
    /// `gelu_tanh(gate) · up` in a call of its own, where the product before it does not compute it on its way out
    /// (on this step's kernels it does: then it is gate/up's time, and the per-layer input gate's).
    Gelu,
    /// Picking the next token (argmax of the logits) and the step's own bookkeeping.
    Sampling,
    /// Everything else inside the pass: the views and small ops that glue the parts, the softcap, the Rust between.
    Rest,
}

impl Part {
    pub const ALL: [Part; 14] = [
        Part::Gathers,
        Part::PerLayerModelProjection,
        Part::CacheWrite,
        Part::QkvProjections,
        Part::Attention,
        Part::OProjection,
        Part::GateUpProjections,
        Part::DownProjection,
        Part::PerLayerInput,
        Part::Head,
        Part::Norms,
        Part::Gelu,
        Part::Sampling,
        Part::Rest,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Part::Gathers => "embedding gathers",
            Part::PerLayerModelProjection => "per-layer model projection",
            Part::CacheWrite => "cache write and masks",
            Part::QkvProjections => "q/k/v projections",
            Part::Attention => "attention over the cache",
            Part::OProjection => "o projection",
            Part::GateUpProjections => "gate/up projections",
            Part::DownProjection => "down projection",
            Part::PerLayerInput => "per-layer input gate and projection",
            Part::Head => "output head",
            Part::Norms => "norms (with rotary, residual adds)",
            Part::Gelu => "gelu(gate) times up, where not fused",
            Part::Sampling => "sampling (argmax)",
            Part::Rest => "the rest (views, the step's glue)",
        }
    }
}

/// Seconds, bytes read and multiply-adds of each part, over the steps a budget was taken for.
#[derive(Clone, Debug, Default)]
pub struct Budget {
    pub seconds: [f64; Part::ALL.len()],
    pub bytes: [i64; Part::ALL.len()],
    pub multiply_adds: [i64; Part::ALL.len()],
}

struct Taking {
    budget: Budget,
    /// The part running now, and since when its time has not been counted.
    current: Part,
    since: Instant,
}

thread_local! {
    static TAKING: RefCell<Option<Taking>> = const { RefCell::new(None) };
}

/// Counts the time since the current part's last count to it, makes `part` current, and returns the one before.
fn switch(part: Part) -> Option<Part> {
    TAKING.with_borrow_mut(|taking| {
        let t = taking.as_mut()?;
        let now = Instant::now();
        t.budget.seconds[t.current as usize] += (now - t.since).as_secs_f64();
        t.since = now;
        Some(std::mem::replace(&mut t.current, part))
    })
}

/// Whether a budget is being taken on this thread: for counts only a budget needs, kept off a decode step's path.
pub fn taking() -> bool {
    TAKING.with_borrow(Option::is_some)
}

// --8<-- [start:timed]
/// Runs `work` as part `part`, which reads `bytes` (as stored) to do it.
pub fn timed<T>(part: Part, bytes: i64, work: impl FnOnce() -> T) -> T {
    timed_product(part, bytes, || 0, work)
}

/// The same for a matrix product, which also counts its multiply-adds: `multiply_adds` is asked only while a budget
/// is taken, so a decode step's products pay nothing for the count.
pub fn timed_product<T>(part: Part, bytes: i64, multiply_adds: impl FnOnce() -> i64, work: impl FnOnce() -> T) -> T {
    let Some(outer) = switch(part) else { return work() };
    let out = work();
    switch(outer);
    TAKING.with_borrow_mut(|taking| {
        if let Some(t) = taking.as_mut() {
            t.budget.bytes[part as usize] += bytes;
            t.budget.multiply_adds[part as usize] += multiply_adds();
        }
    });
    out
}
// --8<-- [end:timed]

/// The limit a prompt read's products are set against where fma4 runs (None elsewhere): float32 GFLOP/s of AVX2's
/// 8-lane FMAs on all of torch's threads at once, `rounds` rounds of 12 independent FMAs on each, best of `tries`
/// (peak.cpp). fma4 and MKL's AVX2 product multiply with this instruction, so no product of theirs goes faster.
pub fn fma_limit(rounds: i64, tries: i32) -> Option<f64> {
    // SAFETY: fma4 runs here, so the CPU has the AVX2 and FMA the probe is compiled for; it touches nothing else.
    cpu::fma4_runs().then(|| unsafe { torchtpu_fma_limit(rounds, tries) })
}

/// Runs `steps` with a budget taken on this thread (time outside a named part counts as `Part::Rest`); returns it.
pub fn taken<T>(steps: impl FnOnce() -> T) -> (T, Budget) {
    TAKING.set(Some(Taking { budget: Budget::default(), current: Part::Rest, since: Instant::now() }));
    let out = steps();
    switch(Part::Rest);
    let budget = TAKING.take().map(|t| t.budget).unwrap_or_default();
    (out, budget)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sleep_ms(ms: u64) {
        std::thread::sleep(Duration::from_millis(ms));
    }

    #[test]
    fn a_part_counts_its_own_time_and_the_rest_is_rest() {
        let ((), budget) = taken(|| {
            sleep_ms(20); // rest
            timed(Part::Attention, 100, || {
                sleep_ms(20);
                timed(Part::QkvProjections, 7, || sleep_ms(40)); // inside attention, counted as q/k/v only
            });
        });
        let s = |p: Part| budget.seconds[p as usize];
        assert!((0.035..0.1).contains(&s(Part::QkvProjections)), "{budget:?}");
        assert!((0.015..0.035).contains(&s(Part::Attention)), "{budget:?}");
        assert!((0.015..0.035).contains(&s(Part::Rest)), "{budget:?}");
        assert_eq!((budget.bytes[Part::Attention as usize], budget.bytes[Part::QkvProjections as usize]), (100, 7));
    }

    #[test]
    fn multiply_adds_are_counted_only_while_a_budget_is_taken() {
        let unasked = || -> i64 { panic!("asked for a count with no budget taken") };
        assert_eq!(timed_product(Part::Head, 1, unasked, || 42), 42);
        let ((), budget) = taken(|| {
            timed_product(Part::Head, 1, || 3, || ());
            timed_product(Part::Head, 1, || 4, || ());
            timed(Part::Norms, 0, || ());
        });
        assert_eq!(budget.multiply_adds[Part::Head as usize], 7);
        assert_eq!(budget.multiply_adds.iter().sum::<i64>(), 7);
    }

    #[test]
    fn without_a_budget_timed_only_runs_the_work() {
        assert_eq!(timed(Part::Head, 1, || 42), 42);
        assert!(TAKING.with_borrow(Option::is_none));
    }
}
